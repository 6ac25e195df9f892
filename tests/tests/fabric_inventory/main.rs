//! Operators' fabrics from inventory files, in namespaces: the leaf-spine of
//! `deploy/controller/leaf-spine-inventory.toml` (4 leaves, 4 spines, 2 hosts per rack, the
//! operator's names, a /26 and a /64 per rack, link addresses given) in the IPv4 option and in
//! SRv6, and an unequal three-tier Clos. Each is a fabric of its own: the suites of the
//! generated Fat-Tree cannot carry another shape. Links unshaped (no rate is measured here:
//! reachability, paths and packet counts). Needs root.

mod clos;
mod leaf_spine;

use std::{process::ExitCode, time::Duration};

use sopa_testbed::{
    fabric::{Fabric, FabricOptions},
    phases::Suite,
};
use sopa_topology::{inventory::Inventory, srv6::Encoding, topology::TopologySpec};

/// The shipped example inventory.
pub fn shipped_leaf_spine() -> Inventory {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../deploy/controller/leaf-spine-inventory.toml"
    );
    let text = std::fs::read_to_string(path).expect("the shipped inventory");
    Inventory::from_toml(&text).expect("it parses")
}

pub fn fabric(inv: Inventory, encoding: Encoding) -> Fabric {
    let opts = FabricOptions {
        encoding,
        // LLDP every second: a swapped cable is named within a second or two.
        switch_args: vec!["--lldp-interval-ms".into(), "1000".into()],
        ..FabricOptions::default()
    };
    let spec = TopologySpec::Inventory(Box::new(inv));
    let mut f = Fabric::build(&spec, &opts).expect("build the fabric");
    f.start(&opts).expect("start controller and agents");
    f.wait_settled(Duration::from_secs(60))
        .expect("every agent ready");
    f
}

fn main() -> ExitCode {
    Suite::new()
        .shared(
            "dc1 leaf-spine (inventory), IPv4 option",
            || fabric(shipped_leaf_spine(), Encoding::Ipv4Option),
            Some(Fabric::settled),
            vec![
                (
                    "inventory_leaf_spine_reaches_every_pair_over_ipv4_and_ipv6",
                    leaf_spine::reaches_every_pair,
                ),
                (
                    "inventory_leaf_spine_spreads_one_flow_evenly_over_the_spines",
                    leaf_spine::spreads_one_flow_evenly_over_the_spines,
                ),
                (
                    "inventory_leaf_spine_a_failed_spine_link_carries_nothing",
                    leaf_spine::a_failed_spine_link_carries_nothing,
                ),
                (
                    "inventory_swapped_cables_are_named_and_kept_out_until_put_back",
                    leaf_spine::swapped_cables_are_named_and_kept_out_until_put_back,
                ),
                (
                    "inventory_a_host_finds_itself_by_its_address",
                    leaf_spine::a_host_finds_itself_in_the_inventory_by_its_address,
                ),
                (
                    "inventory_discover_drafts_the_fabric_back_from_lldp",
                    leaf_spine::discover_drafts_the_fabric_back,
                ),
            ],
        )
        .shared(
            "dc1 leaf-spine (inventory), SRv6",
            || fabric(shipped_leaf_spine(), Encoding::Srv6),
            Some(Fabric::settled),
            vec![
                (
                    "inventory_leaf_spine_srv6_reaches_every_pair_over_ipv4_and_ipv6",
                    leaf_spine::reaches_every_pair,
                ),
                (
                    "inventory_leaf_spine_srv6_spreads_one_flow_evenly_over_the_spines",
                    leaf_spine::srv6_spreads_one_flow_evenly_over_the_spines,
                ),
            ],
        )
        .shared(
            "unequal three-tier Clos (inventory), IPv4 option",
            || fabric(clos::unequal(), Encoding::Ipv4Option),
            Some(Fabric::settled),
            vec![(
                "inventory_unequal_clos_has_exactly_its_up_down_paths_balanced",
                clos::has_exactly_its_up_down_paths_balanced,
            )],
        )
        .run()
}
