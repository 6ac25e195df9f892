use sopa_channel::{
    proto::{LinkRef, Snapshot, change},
    view::{FabricView, ViewError},
};
use sopa_topology::topology::TopologySpec;

use super::Fabric;

#[test]
fn snapshot_then_deltas_track_the_controller() {
    let mut f = Fabric::new(TopologySpec::FatTree { k: 4 }, 3).unwrap();
    f.set_link("e0", "a0", true).unwrap();
    let mut view = FabricView::from_snapshot(&f.snapshot()).unwrap();
    assert_eq!(view.version, 2);
    let g = view.topology.graph();
    let link = g
        .links_between(g.find("e0").unwrap(), g.find("a0").unwrap())
        .next()
        .unwrap();
    assert!(!view.failures.usable(g, link));
    let d = f.set_link("e0", "a0", false).unwrap().unwrap();
    let changed = view.apply_delta(&d).unwrap();
    assert_eq!(changed, vec![link]);
    assert!(view.failures.usable(view.topology.graph(), link));
    let d = f.set_switch("a1", true).unwrap().unwrap();
    assert_eq!(
        view.apply_delta(&d).unwrap().len(),
        4,
        "a switch of a k=4 Fat-Tree has 4 ports"
    );
}

#[test]
fn bad_deltas_change_nothing() {
    let mut f = Fabric::new(TopologySpec::FatTree { k: 4 }, 3).unwrap();
    let mut view = FabricView::from_snapshot(&f.snapshot()).unwrap();
    let good = f.set_link("e0", "a0", true).unwrap().unwrap();
    let mut unknown = good.clone();
    if let Some(change::Kind::Link(l)) = &mut unknown.changes[0].kind {
        l.link = Some(LinkRef {
            a: "e0".into(),
            b: "c0".into(),
        });
    }
    // One good change and one unknown link: the whole delta is refused.
    let mut mixed = good.clone();
    mixed.changes.push(unknown.changes[0].clone());
    assert_eq!(
        view.apply_delta(&mixed),
        Err(ViewError::UnknownLink("e0".into(), "c0".into()))
    );
    assert_eq!(view.version, 1);
    assert!(view.failures.down_links().next().is_none());
    let mut other_epoch = good.clone();
    other_epoch.epoch = 4;
    assert!(view.apply_delta(&other_epoch).unwrap_err().needs_resync());
    let mut gap = good.clone();
    gap.base_version = 5;
    gap.version = 6;
    assert!(view.apply_delta(&gap).unwrap_err().needs_resync());
    view.apply_delta(&good).unwrap();
    assert_eq!(
        view.apply_delta(&good),
        Err(ViewError::Stale {
            have: 2,
            version: 2
        }),
        "duplicate"
    );
    let bad_spec = Snapshot {
        topology: "{\"kind\":\"torus\"}".into(),
        ..f.snapshot()
    };
    assert!(matches!(
        FabricView::from_snapshot(&bad_spec),
        Err(ViewError::BadSpec(_))
    ));
}
