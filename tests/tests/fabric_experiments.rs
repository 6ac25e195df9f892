//! Short versions of the paper's experiments (1 MB flows) on Fat-Tree k=4: the machinery, not
//! the figures — every flow completes with equal sha256 (checked inside), every mode yields a
//! row, the report serializes to JSON that parses back. Needs root.

use std::time::Duration;

use sopa_testbed::{
    experiment::{self, Plan},
    fabric::{Fabric, FabricOptions},
};
use sopa_topology::topology::TopologySpec;

#[test]
fn sec42_and_permutation_yield_a_row_per_mode() {
    let opts = FabricOptions::default();
    let mut f = Fabric::build(&TopologySpec::FatTree { k: 4 }, &opts).unwrap();
    f.start(&opts).unwrap();
    f.wait_ready(Duration::from_secs(60)).unwrap();
    for (experiment, flows) in [("sec4.2", 4), ("permutation", 16)] {
        let plan = Plan {
            experiment: experiment.into(),
            modes: vec!["sopa".into(), "rps".into(), "ecmp".into(), "hedera".into()],
            repeat: 1,
            rate_mbit: 100,
            mb: 1,
            seed: 7,
        };
        let report = experiment::run(&f, &plan);
        assert!(report.alone_fraction > 0.0);
        assert_eq!(report.results.len(), 4, "{experiment}: one row per mode");
        for r in &report.results {
            assert_eq!(r.flows, flows, "{experiment} {}", r.mode);
            assert_eq!(r.per_flow.len(), flows);
            assert!(r.mean > 0.0 && r.min > 0.0 && r.min <= r.mean);
        }
        let dir = std::env::temp_dir().join(format!("sopa-figures-{}", std::process::id()));
        let figures = sopa_testbed::figures::write(&report, &dir, experiment).unwrap();
        for fig in &figures {
            let svg = std::fs::read_to_string(fig).unwrap();
            assert!(
                svg.starts_with("<svg") && svg.contains("sopa") && svg.contains("ecmp"),
                "{}",
                fig.display()
            );
        }
        let _ = std::fs::remove_dir_all(&dir);
        let json = serde_json::to_string(&report).unwrap();
        let back: serde_json::Value = serde_json::from_str(&json).unwrap();
        assert_eq!(back["results"].as_array().unwrap().len(), 4);
    }
}
