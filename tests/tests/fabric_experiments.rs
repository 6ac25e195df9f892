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
fn every_experiment_yields_a_row_per_mode() {
    let opts = FabricOptions::default();
    let mut f = Fabric::build(&TopologySpec::FatTree { k: 4 }, &opts).unwrap();
    f.start(&opts).unwrap();
    f.wait_ready(Duration::from_secs(60)).unwrap();
    let all: Vec<String> = ["sopa", "rps", "ecmp", "hedera", "single"]
        .map(String::from)
        .to_vec();
    let two: Vec<String> = ["sopa", "rps"].map(String::from).to_vec();
    // The ecmp column of the failure experiment is the switches' own routing around a0.
    let three: Vec<String> = ["sopa", "rps", "ecmp"].map(String::from).to_vec();
    for (experiment, flows, modes) in [
        ("sec4.2", 4, &all),
        ("permutation", 16, &all),
        ("production", 16 * 3, &two),
        ("failure", 16 * 3, &three),
    ] {
        let plan = Plan {
            experiment: experiment.into(),
            modes: modes.clone(),
            repeat: 1,
            rate_mbit: 100,
            mb: 1,
            seed: 7,
            flows_per_host: 3,
        };
        let report = experiment::run(&f, &plan);
        assert!(report.alone_fraction > 0.0);
        assert_eq!(
            report.results.len(),
            modes.len(),
            "{experiment}: one row per mode"
        );
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
                svg.starts_with("<svg") && modes.iter().all(|m| svg.contains(m.as_str())),
                "{}: a curve per mode",
                fig.display()
            );
        }
        let _ = std::fs::remove_dir_all(&dir);
        let json = serde_json::to_string(&report).unwrap();
        let back: serde_json::Value = serde_json::from_str(&json).unwrap();
        assert_eq!(back["results"].as_array().unwrap().len(), modes.len());
    }
}
