//! Fabrics of Linux SRv6 routers in namespaces: the controller pushes `encoding = "srv6"`,
//! every switch agent installs IPv6 routes and its `seg6local` End (NEXT-C-SID) locator through
//! rtnetlink, hosts put each packet's path in an outer IPv6 header. The switches' `tc_forward`
//! rewrites lists around a dead port, and consumes the switch's own uSID where the kernel
//! cannot (no seg6local); otherwise the kernel forwards alone.
//! One Fat-Tree k=4 (links at 100 Mbit/s) carries its phases one after another; MODRIC 2x2,
//! another topology, is a fabric of its own. Each switch's own uSID is consumed by the kernel's
//! `seg6local` End route where the kernel has it, by `tc_forward` where it has not
//! (`--usid auto`); on a kernel with both, a second Fat-Tree with every switch told `--usid
//! ebpf` runs the phases that route and repair, so both ways are covered on one machine (its
//! own fabric: the switches choose once, at start). Needs root.

mod forwarding;
mod gray;
mod hostile;

use std::{process::ExitCode, time::Duration};

use sopa_testbed::{
    fabric::{Fabric, FabricOptions},
    phases::Suite,
};
use sopa_topology::{modric::ModricParams, srv6::Encoding, topology::TopologySpec};

/// The controller's first hold-down of a suspect link: short, so that a phase after the gray
/// one finds the link back.
const HOLD_MS: u64 = 4000;

fn srv6_fabric(spec: &TopologySpec, rate_mbit: Option<u32>, usid: &str) -> Fabric {
    let opts = FabricOptions {
        rate_mbit,
        encoding: Encoding::Srv6,
        switch_args: vec!["--usid".into(), usid.into()],
        ..FabricOptions::default()
    };
    let mut f = Fabric::build(spec, &opts).expect("build the fabric");
    f.controller_args
        .extend(["--suspect-hold-ms".to_owned(), HOLD_MS.to_string()]);
    // The forged-marks phase reads h0's agent's counters.
    f.host_metrics = true;
    f.start(&opts).expect("start controller and agents");
    f.wait_settled(Duration::from_secs(60))
        .expect("every agent ready");
    f
}

fn main() -> ExitCode {
    let fat_tree = || TopologySpec::FatTree { k: 4 };
    let suite = Suite::new().shared(
        "Fat-Tree k=4, SRv6",
        move || srv6_fabric(&fat_tree(), Some(100), "auto"),
        Some(Fabric::settled),
        vec![
            (
                "fat_tree_k4_of_linux_srv6_routers_carries_the_round_robin_exactly",
                forwarding::carries_the_round_robin_exactly,
            ),
            (
                "a_gray_core_link_is_found_and_drained_in_the_srv6_encoding",
                gray::a_gray_core_link_is_found_and_drained,
            ),
            (
                "forged_marks_leave_a_hosts_meter_bounded_and_its_periods_complete",
                hostile::forged_marks_leave_a_hosts_meter_bounded_and_its_periods_complete,
            ),
            (
                "a_core_link_cut_mid_transfer_is_repaired_by_the_switches_at_both_ends",
                forwarding::a_core_link_cut_mid_transfer_is_repaired_by_the_switches_at_both_ends,
            ),
        ],
    );
    // Where the kernel consumes the uSID above, tc_forward's uN runs here too.
    let suite = if sopa_testbed::kernel::has_seg6local() {
        suite.shared(
            "Fat-Tree k=4, SRv6, uN in eBPF",
            move || srv6_fabric(&fat_tree(), Some(100), "ebpf"),
            Some(Fabric::settled),
            vec![
                (
                    "usid_ebpf_fat_tree_carries_the_round_robin_exactly",
                    forwarding::carries_the_round_robin_exactly,
                ),
                (
                    "usid_ebpf_a_core_link_cut_mid_transfer_is_repaired",
                    forwarding::a_core_link_cut_mid_transfer_is_repaired_by_the_switches_at_both_ends,
                ),
            ],
        )
    } else {
        suite.skip(
            "usid_kernel_fat_tree_carries_the_round_robin_exactly",
            "the kernel has no seg6local (CONFIG_IPV6_SEG6_LWTUNNEL is not set): every switch \
             consumed its uSID in tc_forward, the kernel's End route was not tested"
                .into(),
        )
    };
    suite
        .shared(
            "MODRIC 2x2, SRv6",
            || {
                srv6_fabric(
                    &TopologySpec::Modric(ModricParams::new(2, 2, 1, 2, 2)),
                    None,
                    "auto",
                )
            },
            None,
            vec![(
                "modric_2x2_of_linux_srv6_routers_reaches_every_pair",
                forwarding::modric_reaches_every_pair,
            )],
        )
        .run()
}
