use sopa_channel::proto::LinkRef;
use sopa_topology::topology::TopologySpec;

use super::*;
use sopa_channel::view::FabricView;

fn fabric() -> Fabric {
    Fabric::new(TopologySpec::FatTree { k: 4 }, 7).unwrap()
}

#[test]
fn every_change_is_a_version() {
    let mut f = fabric();
    assert_eq!(f.version(), 1);
    let d = f.set_link("e0", "a0", true).unwrap().unwrap();
    assert_eq!((d.base_version, d.version, d.epoch), (1, 2, 7));
    assert!(
        f.set_link("a0", "e0", true).unwrap().is_none(),
        "already down, either order"
    );
    let d = f.set_switch("c0", true).unwrap().unwrap();
    assert_eq!(d.version, 3);
    assert_eq!(
        f.snapshot().down_links,
        vec![LinkRef {
            a: "a0".into(),
            b: "e0".into()
        }]
    );
    assert_eq!(f.snapshot().down_switches, vec!["c0".to_owned()]);
    f.set_link("e0", "a0", false).unwrap().unwrap();
    assert!(f.snapshot().down_links.is_empty());
}

#[test]
fn bad_changes_are_refused_and_change_nothing() {
    let mut f = fabric();
    assert_eq!(
        f.set_link("e0", "c0", true),
        Err(FabricError::NoLink("e0".into(), "c0".into()))
    );
    assert_eq!(
        f.set_link("e0", "zz", true),
        Err(FabricError::UnknownNode("zz".into()))
    );
    assert_eq!(
        f.set_switch("h0", true),
        Err(FabricError::NotASwitch("h0".into()))
    );
    assert_eq!(f.version(), 1);
}

#[test]
fn a_port_up_again_ends_only_its_switchs_report_never_a_drain() {
    let mut f = fabric();
    let down = |f: &Fabric| f.down_links().len();
    // Reported down, then up: two versions.
    assert!(f.report_link("e0", "a0", "e0", true).unwrap().is_some());
    assert!(f.report_link("a0", "e0", "e0", false).unwrap().is_some());
    assert_eq!((f.version(), down(&f)), (3, 0));
    // Drained, then reported down and up: the link stays down, no version for the reports.
    assert!(f.set_link("e0", "a0", true).unwrap().is_some());
    assert!(f.report_link("e0", "a0", "e0", true).unwrap().is_none());
    assert!(f.report_link("e0", "a0", "e0", false).unwrap().is_none());
    assert_eq!((f.version(), down(&f)), (4, 1));
    // Reported down while drained: ending the drain leaves it down.
    f.report_link("e0", "a0", "e0", true).unwrap();
    assert!(f.set_link("e0", "a0", false).unwrap().is_none());
    assert_eq!((f.version(), down(&f)), (4, 1));
    assert!(f.drained_links().is_empty());
    assert!(f.report_link("e0", "a0", "e0", false).unwrap().is_some());
    assert_eq!((f.version(), down(&f)), (5, 0));
}

#[test]
fn a_link_is_up_only_when_no_end_reports_it_down() {
    let mut f = fabric();
    assert!(f.report_link("e0", "a0", "e0", true).unwrap().is_some());
    // a0 (restarted) reports its ports: its end is up, e0's is not.
    assert!(f.report_link("a0", "e0", "a0", false).unwrap().is_none());
    assert!(f.is_link_down("a0", "e0"));
    assert!(f.report_link("a0", "e0", "a0", true).unwrap().is_none());
    assert!(f.report_link("e0", "a0", "e0", false).unwrap().is_none());
    assert_eq!(f.reporters("a0", "e0"), ["a0"]);
    assert!(f.report_link("a0", "e0", "a0", false).unwrap().is_some());
    assert!(!f.is_link_down("a0", "e0"));
    // Only an end reports.
    assert!(matches!(
        f.report_link("a0", "e0", "c0", true),
        Err(FabricError::NotAnEnd { .. })
    ));
    // Both ends survive a store and a restore; a state stored before ends were named is
    // ended by either end.
    f.report_link("a0", "e0", "a0", true).unwrap();
    f.report_link("a0", "e0", "e0", true).unwrap();
    let stored = f.persisted();
    assert_eq!(stored.reported_by.len(), 2);
    let mut legacy = stored.clone();
    legacy.reported_by.clear();
    let mut g = Fabric::restore(TopologySpec::FatTree { k: 4 }, &legacy).unwrap();
    assert!(g.report_link("a0", "e0", "e0", false).unwrap().is_some());
    let mut h = Fabric::restore(TopologySpec::FatTree { k: 4 }, &stored).unwrap();
    assert!(h.report_link("a0", "e0", "e0", false).unwrap().is_none());
    assert_eq!(h.reporters("a0", "e0"), ["a0"]);
}

#[test]
fn a_rollback_returns_to_the_checkpoint_and_a_restore_to_the_stored_state() {
    let mut f = fabric();
    f.set_link("e0", "a0", true).unwrap();
    let stored = f.persisted();
    let before = f.checkpoint();
    f.report_link("e1", "a1", "e1", true).unwrap();
    f.set_switch("c0", true).unwrap();
    assert!(f.changed_since(&before));
    f.rollback(before);
    assert_eq!(f.persisted(), stored);
    assert_eq!(
        f.deltas_since(7, 1).unwrap().len(),
        1,
        "the rolled-back deltas are gone"
    );
    let g = Fabric::restore(TopologySpec::FatTree { k: 4 }, &stored).unwrap();
    assert_eq!(g.persisted(), stored);
    let other = Fabric::restore(TopologySpec::FatTree { k: 6 }, &stored);
    assert!(matches!(other, Err(FabricError::StoredForAnother { .. })));
}

#[test]
fn deltas_since_or_snapshot() {
    let mut f = fabric();
    for (a, b) in [("e0", "a0"), ("e0", "a1"), ("a0", "c0")] {
        f.set_link(a, b, true).unwrap();
    }
    assert_eq!(f.deltas_since(7, 4).unwrap().len(), 0);
    let catch_up = f.deltas_since(7, 2).unwrap();
    assert_eq!(
        catch_up.iter().map(|d| d.version).collect::<Vec<_>>(),
        [3, 4]
    );
    assert!(f.deltas_since(8, 2).is_none(), "another epoch: snapshot");
    assert!(f.deltas_since(7, 9).is_none(), "ahead of us: snapshot");
    assert!(f.deltas_since(7, 0).is_none(), "nothing applied: snapshot");
}

#[test]
fn the_encoding_is_read_from_the_spec_file_and_pushed_with_every_snapshot() {
    let (spec, enc) = Fabric::parse_spec_file(
        "encoding = \"srv6\"\n[topology]\nkind = \"fat-tree\"\nk = 4\n",
        "t.toml",
    )
    .unwrap();
    assert_eq!(enc, Encoding::Srv6);
    let mut f = Fabric::new(spec, 1).unwrap();
    assert_eq!(f.snapshot().encoding, "ipv4-option", "the default");
    f.set_encoding(enc);
    assert_eq!(f.snapshot().encoding, "srv6");
    let view = FabricView::from_snapshot(&f.snapshot()).unwrap();
    assert_eq!(view.encoding, Encoding::Srv6);
    let e = Fabric::parse_spec_file(
        "encoding = \"mpls\"\n[topology]\nkind = \"fat-tree\"\nk = 4\n",
        "t.toml",
    )
    .unwrap_err()
    .to_string();
    assert!(e.contains("t.toml") && e.contains("mpls"), "{e}");
    // A controller older than the encoding sends none: the option.
    let old = Snapshot {
        encoding: String::new(),
        ..f.snapshot()
    };
    assert_eq!(
        FabricView::from_snapshot(&old).unwrap().encoding,
        Encoding::Ipv4Option
    );
}

#[test]
fn the_shipped_specs_parse() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/controller");
    let mut seen = 0;
    for entry in std::fs::read_dir(&dir).unwrap() {
        let path = entry.unwrap().path();
        let text = std::fs::read_to_string(&path).unwrap();
        Fabric::parse_spec_file(&text, &path.display().to_string())
            .unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        seen += 1;
    }
    assert!(seen >= 3, "{seen} specs in {}", dir.display());
}

#[test]
fn an_inventory_is_a_spec_file_with_its_encoding() {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../deploy/controller/leaf-spine-inventory.toml"
    );
    let text = std::fs::read_to_string(path).unwrap();
    let (spec, enc) = Fabric::parse_spec_file(&text, "dc1.toml").unwrap();
    assert_eq!(enc, Encoding::Ipv4Option);
    let TopologySpec::Inventory(inv) = &spec else {
        panic!("{spec:?}")
    };
    assert_eq!(inv.name.as_deref(), Some("dc1-leaf-spine"));
    let six = text.replace("encoding = \"ipv4-option\"", "encoding = \"srv6\"");
    assert_eq!(
        Fabric::parse_spec_file(&six, "dc1.toml").unwrap().1,
        Encoding::Srv6
    );
    // It travels to agents as JSON and comes back the same fabric.
    let f = Fabric::new(spec.clone(), 1).unwrap();
    let view = FabricView::from_snapshot(&f.snapshot()).unwrap();
    assert_eq!(view.spec, spec);
    assert!(view.topology.resolve_host("d-2").is_ok());
    // A refused inventory names the file and every fault.
    let bad = text
        .replace("tor = \"rack-b\"", "tor = \"rack-q\"")
        .replace("b = \"sp-1:swp1\"", "b = \"sp-1:swp2\"");
    let e = Fabric::parse_spec_file(&bad, "dc1.toml")
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("dc1.toml") && e.contains("rack-q") && e.contains("sp-1:swp2 is cabled twice"),
        "{e}"
    );
}

#[test]
fn spec_files_parse_and_are_checked() {
    let ft = Fabric::parse_spec("[topology]\nkind = \"fat-tree\"\nk = 4\n", "t.toml").unwrap();
    assert_eq!(ft, TopologySpec::FatTree { k: 4 });
    let m = Fabric::parse_spec(
        "[topology]\nkind = \"modric\"\nm = 2\nn = 2\nq = 1\nx = 2\ny = 4\n[topology.bits]\nrow = 4\ncol = 4\naccess = 8\nhost = 8\n",
        "m.toml",
    )
    .unwrap();
    assert!(matches!(m, TopologySpec::Modric(p) if p.bits.access == 8));
    for (text, needle) in [
        ("[topology]\nkind = \"fat-tree\"\nk = 5\n", "k must be even"),
        ("[topology]\nkind = \"torus\"\n", "torus"),
        (
            "[topology]\nkind = \"fat-tree\"\nk = 4\nextra = 1\n",
            "extra",
        ),
        ("[topology\n", "line 1"),
        (
            "[topology]\nkind = \"modric\"\nm = 2\nn = 2\nq = 1\nx = 2\ny = 70\n",
            "host bits",
        ),
    ] {
        let err = Fabric::parse_spec(text, "bad.toml")
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("bad.toml") && err.contains(needle),
            "{text:?}: {err}"
        );
    }
}
