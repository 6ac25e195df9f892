//! The inventory file's fields, as the operator writes them.

use std::{
    fmt,
    net::{Ipv4Addr, Ipv6Addr},
};

use serde::{Deserialize, Serialize};

use crate::{prefix::Prefix, prefix6::Prefix6, srv6::Encoding};

/// A fabric as built. Field order is the file's; `check` gives it meaning.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Inventory {
    /// The fabric's name, shown in status and logs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// How hosts carry the path; the option where not given.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub encoding: Option<Encoding>,
    /// The SRv6 uSID block, a /32 every path address begins with; `fcbb:bb00::/32` where not
    /// given.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub usid_block: Option<Prefix6>,
    #[serde(default, rename = "switch", skip_serializing_if = "Vec::is_empty")]
    pub switches: Vec<SwitchEntry>,
    #[serde(default, rename = "link", skip_serializing_if = "Vec::is_empty")]
    pub links: Vec<LinkEntry>,
    #[serde(default, rename = "rack", skip_serializing_if = "Vec::is_empty")]
    pub racks: Vec<RackEntry>,
}

/// Where a switch sits in the Clos: the tier it forwards up from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Tier {
    /// Top of rack: hosts below, spines above.
    #[serde(alias = "tor")]
    Leaf,
    /// Aggregation: leaves below, super-spines (if any) above.
    #[serde(alias = "aggregation")]
    Spine,
    /// Core: spines below, nothing above.
    #[serde(alias = "core")]
    SuperSpine,
}

impl Tier {
    /// 1 for leaves, 2 for spines, 3 for super-spines (hosts are 0).
    pub fn level(self) -> u8 {
        match self {
            Tier::Leaf => 1,
            Tier::Spine => 2,
            Tier::SuperSpine => 3,
        }
    }
}

impl fmt::Display for Tier {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Tier::Leaf => "leaf",
            Tier::Spine => "spine",
            Tier::SuperSpine => "super-spine",
        })
    }
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SwitchEntry {
    pub name: String,
    pub tier: Tier,
    /// The pod (or plane) the switch belongs to, as the operator names it; shown, not needed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pod: Option<String>,
    /// Its SRv6 uSID; numbered in file order from 1 where not given.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub usid: Option<u16>,
}

/// A cable between two switch ports, `SWITCH:PORT`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LinkEntry {
    pub a: String,
    pub b: String,
    /// The link's IPv4 subnet: the `a` end takes its first address (of a /31; the first usable
    /// one of a shorter prefix), the `b` end the next.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ipv4: Option<Prefix>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ipv6: Option<Prefix6>,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RackEntry {
    /// The rack's leaf (top-of-rack) switch.
    pub tor: String,
    pub ipv4: Prefix,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ipv6: Option<Prefix6>,
    /// The address the ToR answers its hosts on; the prefix's first address where not given.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gateway: Option<Ipv4Addr>,
    #[serde(default)]
    pub hosts: Vec<HostEntry>,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HostEntry {
    pub name: String,
    pub ipv4: Ipv4Addr,
    /// Where not given and the rack has an IPv6 prefix: that prefix plus the host's offset in
    /// its IPv4 prefix.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ipv6: Option<Ipv6Addr>,
    /// The ToR port the host is cabled to.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub port: Option<String>,
}

impl Inventory {
    /// Parses an inventory file's text (TOML): the syntax and the fields, not their meaning
    /// (that is [`super::check::build`]).
    pub fn from_toml(text: &str) -> Result<Self, String> {
        toml::from_str(text).map_err(|e| e.to_string().trim().to_owned())
    }

    pub fn to_toml(&self) -> String {
        toml::to_string(self).expect("inventories serialize")
    }
}
