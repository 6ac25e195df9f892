//! The inventory: an operator's fabric as it is built, in a TOML file. Switches with the
//! operator's names and their tier, links between named ports (with their addresses where the
//! operator has them), racks with their prefixes and hosts. [`check`] turns a file into a
//! [`crate::clos::Clos`] model or refuses it naming every fault; [`generate`] writes the
//! inventories of the fabrics SOPA used to build for itself (Fat-Tree, leaf-spine).
//!
//! ```toml
//! name = "lab"
//! encoding = "ipv4-option"          # or "srv6"
//! usid_block = "fd5e:a::/32"          # optional, SRv6: fcbb:bb00::/32 where not given
//!
//! [[switch]]
//! name = "sp-1"
//! tier = "spine"                     # leaf (tor), spine (aggregation), super-spine (core)
//!
//! [[switch]]
//! name = "rack-a"
//! tier = "leaf"
//!
//! [[link]]
//! a = "rack-a:swp49"                 # SWITCH:PORT, the lower tier first or not
//! b = "sp-1:swp1"
//! ipv4 = "100.127.0.0/31"            # optional: the a end takes the first address
//! ipv6 = "2001:db8:ffff::/127"
//!
//! [[rack]]
//! tor = "rack-a"
//! ipv4 = "100.64.0.0/26"
//! ipv6 = "2001:db8:0:1::/64"         # optional
//! gateway = "100.64.0.1"             # optional: the prefix's first address
//! hosts = [{ name = "a-1", ipv4 = "100.64.0.2", port = "swp1" }]
//! ```

pub mod check;
pub mod generate;
pub mod schema;

pub use check::{Refusal, Refusals};
pub use schema::{HostEntry, Inventory, LinkEntry, RackEntry, SwitchEntry, Tier};
