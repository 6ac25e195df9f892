//! A Fat-Tree k=4 of switches that only hash, in the entropy encoding: every switch a plain
//! Linux router with multipath routes, its own hash seed, no agent and no program
//! (`sopa_testbed::routers`). Each host's agent probes every destination host for the labels
//! that take each path, and sprays its flows round robin over them. A fabric of its own: no
//! other suite's switches run without agents. Links unshaped (packet counts, not rates). Needs
//! root.

mod spraying;

use std::{process::ExitCode, time::Duration};

use sopa_testbed::{
    fabric::{Fabric, FabricOptions},
    phases::Suite,
};
use sopa_topology::{srv6::Encoding, topology::TopologySpec};

fn entropy_fabric() -> Fabric {
    let opts = FabricOptions {
        encoding: Encoding::Entropy,
        // Native XDP on the hosts' veths: `xdp_strip` runs before GRO, as on a NIC with a
        // driver for it (generic XDP runs after), which the receiver's phase measures.
        host_args: vec!["--xdp-mode".into(), "native".into()],
        ..FabricOptions::default()
    };
    let mut f = Fabric::build(&TopologySpec::FatTree { k: 4 }, &opts).expect("build the fabric");
    f.start(&opts)
        .expect("start the controller and the host agents");
    f.wait_settled(Duration::from_secs(60))
        .expect("every agent ready");
    f
}

fn main() -> ExitCode {
    Suite::new()
        .shared(
            "Fat-Tree k=4 of hashing routers, entropy",
            entropy_fabric,
            Some(Fabric::settled),
            vec![
                (
                    "entropy_discovery_finds_every_path_to_every_host",
                    spraying::discovery_finds_every_path_to_every_host,
                ),
                (
                    "entropy_one_flow_spreads_evenly_over_the_cores",
                    spraying::one_flow_spreads_evenly_over_the_cores,
                ),
                (
                    "entropy_every_pair_reaches_over_ipv4_and_ipv6",
                    spraying::every_pair_reaches_over_ipv4_and_ipv6,
                ),
                (
                    "entropy_the_baselines_take_their_labels_at_run_time",
                    spraying::the_baselines_take_their_labels_at_run_time,
                ),
                (
                    "entropy_the_receiver_merges_as_without_sopa",
                    spraying::the_receiver_merges_as_without_sopa,
                ),
                (
                    "entropy_a_silent_black_hole_is_probed_around",
                    spraying::a_silent_black_hole_is_probed_around,
                ),
                (
                    "entropy_a_core_link_cut_mid_transfer_is_probed_around",
                    spraying::a_core_link_cut_mid_transfer_is_probed_around,
                ),
            ],
        )
        .run()
}
