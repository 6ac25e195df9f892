//! The topology spec file: a generated fabric's spec or an operator's inventory, with the
//! encoding its hosts use, parsed and checked.

use serde::Deserialize;
use sopa_topology::{Topology, inventory::Inventory, srv6::Encoding, topology::TopologySpec};

use super::{Fabric, FabricError};

/// The topology spec file the controller loads.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct SpecFile {
    /// How hosts carry the path: `ipv4-option` (the default) or `srv6`.
    #[serde(default)]
    encoding: Encoding,
    topology: TopologySpec,
}

impl Fabric {
    /// Parses a topology spec file:
    ///
    /// ```toml
    /// [topology]
    /// kind = "fat-tree"      # or "modric" with m, n, q, x, y [, s1_gbps, s2_gbps, [topology.bits]]
    /// k = 4
    /// ```
    pub fn parse_spec(text: &str, path: &str) -> Result<TopologySpec, FabricError> {
        Self::parse_spec_file(text, path).map(|(spec, _)| spec)
    }

    /// Parses a topology spec file with the fabric's encoding: an inventory
    /// (`sopa_topology::inventory`), or a generated fabric's spec:
    ///
    /// ```toml
    /// encoding = "srv6"      # or "ipv4-option", the default
    /// [topology]
    /// kind = "fat-tree"
    /// k = 4
    /// ```
    pub fn parse_spec_file(
        text: &str,
        path: &str,
    ) -> Result<(TopologySpec, Encoding), FabricError> {
        let syntax = |e: String| FabricError::Spec {
            path: path.to_owned(),
            message: e.trim().to_owned(),
        };
        let table: toml::Table = toml::from_str(text).map_err(|e| syntax(e.to_string()))?;
        // A file without a [topology] table is an operator's inventory.
        let file = if table.contains_key("topology") {
            toml::from_str::<SpecFile>(text).map_err(|e| syntax(e.to_string()))?
        } else {
            let inv = Inventory::from_toml(text).map_err(syntax)?;
            SpecFile {
                encoding: inv.encoding.unwrap_or_default(),
                topology: TopologySpec::Inventory(Box::new(inv)),
            }
        };
        // Building it is the consistency check.
        let topology = Topology::build(&file.topology).map_err(|e| FabricError::Spec {
            path: path.to_owned(),
            message: e.to_string(),
        })?;
        if file.encoding == Encoding::Srv6 {
            sopa_topology::srv6::Usids::of(&topology).map_err(|e| FabricError::Spec {
                path: path.to_owned(),
                message: format!("encoding \"srv6\": {e}"),
            })?;
        }
        if file.encoding == Encoding::Entropy {
            sopa_topology::entropy::check(&topology).map_err(|e| FabricError::Spec {
                path: path.to_owned(),
                message: e.to_string(),
            })?;
        }
        Ok((file.topology, file.encoding))
    }
}
