//! Fat-Tree k=4 in the IPv4 option encoding, in namespaces: 16 hosts, 20 software switches
//! running the switch role, a controller, host agents in `sopa` mode, every link shaped to
//! 100 Mbit/s. One fabric carries every phase below, one after another; each leaves the fabric
//! as it found it (a failing one takes the fabric with it and the next builds a fresh one).
//! Needs root.

mod bypass;
mod ecmp;
mod failover;
mod forwarding;
mod gray;
mod hedera;
mod hostile;
mod switch_agents;

use std::{process::ExitCode, time::Duration};

use sopa_testbed::{
    fabric::{Fabric, FabricOptions},
    phases::Suite,
    prometheus::free_port,
};
use sopa_topology::topology::TopologySpec;

/// The controller's first hold-down of a suspect link: short, so that the gray phase sees one
/// end.
pub const HOLD_MS: u64 = 4000;

fn build() -> Fabric {
    let opts = FabricOptions {
        rate_mbit: Some(100),
        ..FabricOptions::default()
    };
    let mut f = Fabric::build(&TopologySpec::FatTree { k: 4 }, &opts).expect("build the fabric");
    let metrics = format!("127.0.0.1:{}", free_port().expect("a free port"));
    f.controller_args.extend(
        [
            "--suspect-hold-ms",
            &HOLD_MS.to_string(),
            "--suspect-max-hold-ms",
            "60000",
            "--metrics-addr",
            &metrics,
            // A host whose agent stopped is untrusted after 3 s instead of 10 (the phase that
            // stops one waits for it); agents reconnect within a few heartbeats of 200 ms.
            "--agent-grace-ms",
            "3000",
        ]
        .map(String::from),
    );
    f.host_metrics = true;
    f.start(&opts).expect("start controller and agents");
    f.wait_settled(Duration::from_secs(60))
        .expect("every agent ready");
    f
}

fn main() -> ExitCode {
    Suite::new()
        .shared(
            "Fat-Tree k=4, IPv4 option",
            build,
            Some(Fabric::settled),
            vec![
                (
                    "fat_tree_k4_forwards_by_source_route",
                    forwarding::forwards_by_source_route,
                ),
                (
                    "ecmp_mode_puts_no_option_on_the_wire_and_spreads_flows",
                    ecmp::puts_no_option_on_the_wire_and_spreads_flows,
                ),
                (
                    "a_core_link_cut_mid_transfer_costs_only_the_packets_in_flight",
                    failover::a_core_link_cut_costs_only_the_packets_in_flight,
                ),
                (
                    "hedera_separates_two_elephants_that_collide_under_hashing",
                    hedera::separates_two_elephants_that_collide_under_hashing,
                ),
                (
                    "a_gray_core_link_is_found_drained_and_trusted_again",
                    gray::a_gray_core_link_is_found_drained_and_trusted_again,
                ),
                (
                    "a_host_inflating_its_sent_counters_drains_nothing_and_is_named",
                    hostile::a_host_inflating_its_sent_counters_drains_nothing_and_is_named,
                ),
                (
                    "an_agent_on_another_meter_period_is_refused_while_the_rest_are_judged",
                    hostile::an_agent_on_another_meter_period_is_refused_while_the_rest_are_judged,
                ),
                (
                    "switch_agents_restart_and_upgrade_in_place_without_losing_a_packet",
                    switch_agents::restart_and_upgrade_in_place_without_losing_a_packet,
                ),
                (
                    "a_stopped_switch_agent_removes_every_route_it_installed",
                    switch_agents::a_stopped_one_removes_every_route_it_installed,
                ),
                (
                    "a_raw_socket_cannot_send_around_the_stamp",
                    bypass::a_raw_socket_cannot_send_around_the_stamp,
                ),
                (
                    "a_host_without_a_live_agent_cannot_steer_the_fabric",
                    forwarding::a_host_without_a_live_agent_cannot_steer_the_fabric,
                ),
            ],
        )
        .run()
}
