//! The static path table: destination prefix -> candidate paths, from a TOML file.
//!
//! ```toml
//! version = 1
//!
//! [[destination]]
//! prefix = "10.1.0.0/24"        # the hosts under one edge switch
//! paths = [[0, 0], [0, 1], [1, 0], [1, 1]]   # (hop0, hop1) per path
//!
//! [[destination]]
//! prefix = "10.0.1.0/24"
//! paths = [[0], [1]]            # one decision: hop1 is "none" (0xFF on the wire)
//! ```
//!
//! In the SRv6 encoding (`crate::srv6`) every destination also names, per path, the uSIDs of
//! the switches the path chooses, and the uSIDs after them up to its rack switch:
//!
//! ```toml
//! encoding = "srv6"             # or "ipv4-option", the default
//! [srv6]
//! source = "fd00:5a::a65:102"   # the outer source address: this host's IPv6 address
//! receive = "fcbb:bb00:e002::"  # the outer destination this host receives on
//! fabric6 = "fd00:5a::/96"      # optional: IPv6 to this /96 (whose last 32 bits are the
//!                               # host's IPv4 address) takes that IPv4 address's paths
//!
//! [[destination]]
//! prefix = "10.101.2.0/24"
//! paths = [[0], [1]]
//! segments = [[0x0100], [0x0101]]   # per path
//! tail = []                         # after them (the destination's rack switch)
//! ```
//!
//! The entropy encoding names, per destination host, the flow label each path takes
//! (`crate::entropy` has the file's section).
//!
//! The controller replaces this file in production; it stays as the offline mode.

use std::{collections::BTreeMap, net::Ipv6Addr, path::Path};

use serde::Deserialize;
use sopa_common::{maps::MAX_PATHS, wire::HOP_NONE};
pub use sopa_topology::{Hops, Prefix};

use crate::{
    entropy::{EntropyTable, EntropyV1},
    error::{Error, Result},
    srv6::{Srv6Paths, Srv6Table},
};

/// Highest hop value a path may name (0xFF means "no second decision").
pub const MAX_HOP: u8 = HOP_NONE - 1;

/// The validated path table, ordered by prefix.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PathTable {
    pub destinations: BTreeMap<Prefix, Vec<Hops>>,
    /// The SRv6 encoding's uSIDs; `None`: another encoding.
    pub srv6: Option<Srv6Table>,
    /// The entropy encoding's labels; `None`: another encoding.
    pub entropy: Option<EntropyTable>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct FileV1 {
    version: Option<i64>,
    encoding: Option<String>,
    srv6: Option<Srv6V1>,
    entropy: Option<EntropyV1>,
    #[serde(default)]
    destination: Vec<DestinationV1>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Srv6V1 {
    source: String,
    receive: String,
    fabric6: Option<String>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct DestinationV1 {
    prefix: String,
    paths: Vec<Vec<i64>>,
    segments: Option<Vec<Vec<i64>>>,
    tail: Option<Vec<i64>>,
}

/// A uSID of a path table file.
fn usid(v: i64, at: &str) -> Result<u16, String> {
    u16::try_from(v)
        .ok()
        .filter(|v| *v != 0)
        .ok_or_else(|| format!("{at}: uSID {v} is out of range (1 to 0xFFFF)"))
}

impl PathTable {
    /// Reads and validates a path table file.
    pub fn load(path: &Path) -> Result<Self> {
        let text = std::fs::read_to_string(path).map_err(|err| Error::PathTable {
            path: path.to_owned(),
            message: format!("cannot read it: {err}"),
        })?;
        Self::parse(&text).map_err(|message| Error::PathTable {
            path: path.to_owned(),
            message,
        })
    }

    /// Parses and validates the text of a path table; the error names the bad input.
    pub fn parse(text: &str) -> Result<Self, String> {
        let file: FileV1 = toml::from_str(text).map_err(|err| err.to_string().trim().to_owned())?;
        if let Some(version) = file.version
            && version != 1
        {
            return Err(format!(
                "version {version} is not supported; this agent reads version 1"
            ));
        }
        let srv6 = match file.encoding.as_deref() {
            None | Some("ipv4-option") | Some("entropy") => None,
            Some("srv6") => {
                let Some(s) = &file.srv6 else {
                    return Err("encoding \"srv6\" needs an [srv6] table with this host's \
                                source and receive addresses"
                        .into());
                };
                let addr = |name: &str, v: &str| {
                    v.parse::<Ipv6Addr>()
                        .map_err(|_| format!("[srv6] {name} = {v:?} is not an IPv6 address"))
                };
                let fabric6 = match &s.fabric6 {
                    None => None,
                    Some(v) => Some(
                        v.strip_suffix("/96")
                            .and_then(|a| a.parse::<Ipv6Addr>().ok())
                            .ok_or_else(|| {
                                format!(
                                    "[srv6] fabric6 = {v:?} is not an IPv6 /96 (the hosts' \
                                     addresses embed their IPv4 ones in its last 32 bits)"
                                )
                            })?,
                    ),
                };
                Some(Srv6Table {
                    source: addr("source", &s.source)?,
                    receive: addr("receive", &s.receive)?,
                    fabric6,
                    destinations: BTreeMap::new(),
                })
            }
            Some(other) => {
                return Err(format!(
                    "encoding {other:?} is not known: use \"ipv4-option\", \"srv6\" or \
                     \"entropy\""
                ));
            }
        };
        if srv6.is_none() && file.srv6.is_some() {
            return Err(
                "an [srv6] table without encoding = \"srv6\": add the encoding, or \
                        remove the table"
                    .into(),
            );
        }
        let mut srv6 = srv6;
        let mut destinations = BTreeMap::new();
        for (i, entry) in file.destination.iter().enumerate() {
            let at = format!("destination {} ({:?})", i + 1, entry.prefix);
            let prefix: Prefix = entry.prefix.parse().map_err(|err| format!("{at}: {err}"))?;
            if entry.paths.is_empty() {
                return Err(format!("{at}: lists no paths; give at least one"));
            }
            if entry.paths.len() > MAX_PATHS {
                return Err(format!(
                    "{at}: {} paths, more than the datapath's {MAX_PATHS}",
                    entry.paths.len()
                ));
            }
            let mut paths = Vec::with_capacity(entry.paths.len());
            for (j, path) in entry.paths.iter().enumerate() {
                let at = format!("{at}, path {}", j + 1);
                let hop = |v: i64| {
                    u8::try_from(v)
                        .ok()
                        .filter(|v| *v <= MAX_HOP)
                        .ok_or_else(|| {
                            format!("{at}: hop value {v} is out of range (0 to {MAX_HOP})")
                        })
                };
                let hops = match path.as_slice() {
                    [h0] => Hops {
                        hop0: hop(*h0)?,
                        hop1: HOP_NONE,
                    },
                    [h0, h1] => Hops {
                        hop0: hop(*h0)?,
                        hop1: hop(*h1)?,
                    },
                    other => {
                        return Err(format!(
                            "{at}: has {} hop values; a path is [hop0] or [hop0, hop1]",
                            other.len()
                        ));
                    }
                };
                if paths.contains(&hops) {
                    return Err(format!("{at}: {hops} is listed twice"));
                }
                paths.push(hops);
            }
            match (&mut srv6, &entry.segments) {
                (Some(table), Some(segments)) => {
                    if segments.len() != paths.len() {
                        return Err(format!(
                            "{at}: {} segment lists for {} paths; give one per path",
                            segments.len(),
                            paths.len()
                        ));
                    }
                    let mut s = Srv6Paths::default();
                    for (j, (hops, list)) in paths.iter().zip(segments).enumerate() {
                        let at = format!("{at}, segments {}", j + 1);
                        let list = list
                            .iter()
                            .map(|v| usid(*v, &at))
                            .collect::<Result<Vec<_>, _>>()?;
                        s.chosen.insert(*hops, list);
                    }
                    for v in entry.tail.iter().flatten() {
                        s.tail.push(usid(*v, &format!("{at}, tail"))?);
                    }
                    table.destinations.insert(prefix, s);
                }
                (Some(_), None) => {
                    return Err(format!(
                        "{at}: encoding \"srv6\" needs the uSIDs of every path: add segments"
                    ));
                }
                (None, Some(_)) => {
                    return Err(format!(
                        "{at}: segments are uSIDs of the \"srv6\" encoding; set encoding = \"srv6\""
                    ));
                }
                (None, None) => {}
            }
            if destinations.insert(prefix, paths).is_some() {
                return Err(format!("{at}: prefix {prefix} is listed twice"));
            }
        }
        if let Some(t) = &srv6 {
            t.validate()?;
        }
        let entropy = match (file.encoding.as_deref(), &file.entropy) {
            (Some("entropy"), Some(e)) => Some(EntropyTable::parse(e, &destinations)?),
            (Some("entropy"), None) => {
                return Err(
                    "encoding \"entropy\" needs an [entropy] table with this host's \
                            address and the fabric's /96"
                        .into(),
                );
            }
            (_, Some(_)) => {
                return Err(
                    "an [entropy] table without encoding = \"entropy\": add the \
                            encoding, or remove the table"
                        .into(),
                );
            }
            (_, None) => None,
        };
        Ok(Self {
            destinations,
            srv6,
            entropy,
        })
    }

    pub fn len(&self) -> usize {
        self.destinations.len()
    }

    pub fn is_empty(&self) -> bool {
        self.destinations.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn err(text: &str) -> String {
        PathTable::parse(text).expect_err("must be refused")
    }

    #[test]
    fn parses_both_path_shapes() {
        let table = PathTable::parse(
            r#"
            version = 1
            [[destination]]
            prefix = "10.1.0.0/24"
            paths = [[0, 0], [0, 1], [1, 0], [1, 1]]
            [[destination]]
            prefix = "10.0.1.0/24"
            paths = [[0], [1]]
            "#,
        )
        .unwrap();
        assert_eq!(table.len(), 2);
        let p: Prefix = "10.0.1.0/24".parse().unwrap();
        assert_eq!(
            table.destinations[&p],
            vec![
                Hops {
                    hop0: 0,
                    hop1: HOP_NONE
                },
                Hops {
                    hop0: 1,
                    hop1: HOP_NONE
                }
            ]
        );
    }

    #[test]
    fn an_srv6_table_parses_and_its_mistakes_are_named() {
        let table = PathTable::parse(
            r#"
            encoding = "srv6"
            [srv6]
            source = "fd00:101:1::2"
            receive = "fcbb:bb00:e002::"
            [[destination]]
            prefix = "10.101.2.0/24"
            paths = [[0], [1]]
            segments = [[0x0100], [0x0101]]
            tail = [0x0200]
            "#,
        )
        .unwrap();
        let s = table.srv6.unwrap();
        let p: Prefix = "10.101.2.0/24".parse().unwrap();
        let one = Hops {
            hop0: 1,
            hop1: HOP_NONE,
        };
        assert_eq!(s.destinations[&p].chosen[&one], vec![0x0101]);
        assert_eq!(s.destinations[&p].tail, vec![0x0200]);
        let base = "[srv6]\nsource = \"fd00::2\"\nreceive = \"fcbb:bb00:e002::\"\n\
                    [[destination]]\nprefix = \"10.1.0.0/24\"\npaths = [[0], [1]]\n";
        for (text, needle) in [
            (format!("encoding = \"srv6\"\n{base}"), "add segments"),
            (
                format!("encoding = \"srv6\"\n{base}segments = [[1]]"),
                "1 segment lists for 2 paths",
            ),
            (
                format!("encoding = \"srv6\"\n{base}segments = [[1], [70000]]"),
                "uSID 70000 is out of range",
            ),
            (format!("{base}segments = [[1], [2]]"), "without encoding"),
            (
                format!("encoding = \"mpls\"\n{base}"),
                "encoding \"mpls\" is not known",
            ),
            ("encoding = \"srv6\"".to_owned(), "needs an [srv6] table"),
        ] {
            let e = err(&text);
            assert!(e.contains(needle), "{text}: {e}");
        }
    }

    #[test]
    fn empty_table_is_valid() {
        assert!(PathTable::parse("").unwrap().is_empty());
    }

    #[test]
    fn syntax_error_names_line() {
        let e = err("[[destination]]\nprefix = \"10.1.0.0/24\npaths = []");
        assert!(e.contains("line 2"), "{e}");
    }

    #[test]
    fn unknown_field_is_named() {
        let e = err("[[destination]]\nprefix = \"10.1.0.0/24\"\npath = [[0]]");
        assert!(e.contains("path"), "{e}");
    }

    #[test]
    fn bad_prefixes_are_named() {
        for (prefix, needle) in [
            ("10.1.0.0", "has no length"),
            ("10.1.0/24", "is not an IPv4 address"),
            ("10.1.0.0/33", "not a number from 0 to 32"),
            ("10.1.0.7/24", "did you mean 10.1.0.0/24"),
        ] {
            let e = err(&format!(
                "[[destination]]\nprefix = \"{prefix}\"\npaths = [[0]]"
            ));
            assert!(e.contains(needle), "{prefix}: {e}");
            assert!(e.contains("destination 1"), "{e}");
        }
    }

    #[test]
    fn hop_out_of_range_is_named() {
        for v in ["255", "256", "-1"] {
            let e = err(&format!(
                "[[destination]]\nprefix = \"10.1.0.0/24\"\npaths = [[0], [1, {v}]]"
            ));
            assert!(e.contains(&format!("hop value {v} is out of range")), "{e}");
            assert!(e.contains("path 2"), "{e}");
        }
    }

    #[test]
    fn shape_and_duplicates_are_refused() {
        let bad_shape = err("[[destination]]\nprefix = \"10.1.0.0/24\"\npaths = [[0, 1, 2]]");
        assert!(bad_shape.contains("has 3 hop values"), "{bad_shape}");
        let empty_path = err("[[destination]]\nprefix = \"10.1.0.0/24\"\npaths = [[]]");
        assert!(empty_path.contains("has 0 hop values"), "{empty_path}");
        let no_paths = err("[[destination]]\nprefix = \"10.1.0.0/24\"\npaths = []");
        assert!(no_paths.contains("lists no paths"), "{no_paths}");
        let dup_path = err("[[destination]]\nprefix = \"10.1.0.0/24\"\npaths = [[1], [1]]");
        assert!(dup_path.contains("listed twice"), "{dup_path}");
        let dup_prefix = err("[[destination]]\nprefix = \"10.1.0.0/24\"\npaths = [[1]]\n\
             [[destination]]\nprefix = \"10.1.0.0/24\"\npaths = [[0]]");
        assert!(
            dup_prefix.contains("prefix 10.1.0.0/24 is listed twice"),
            "{dup_prefix}"
        );
        let version = err("version = 2");
        assert!(version.contains("version 2 is not supported"), "{version}");
    }

    #[test]
    fn too_many_paths_is_refused() {
        let paths: Vec<String> = (0..=MAX_PATHS)
            .map(|i| format!("[{}, {}]", i / 200, i % 200))
            .collect();
        let e = err(&format!(
            "[[destination]]\nprefix = \"10.1.0.0/24\"\npaths = [{}]",
            paths.join(",")
        ));
        assert!(e.contains("more than the datapath's"), "{e}");
    }

    #[test]
    fn load_names_the_file() {
        let e = PathTable::load(Path::new("/nonexistent/sopa-paths.toml")).unwrap_err();
        assert!(
            e.to_string().contains("/nonexistent/sopa-paths.toml"),
            "{e}"
        );
        assert_eq!(e.exit_code(), sopa_ops::exit::CONFIG);
    }

    #[test]
    fn prefix_containment() {
        let p8: Prefix = "10.0.0.0/8".parse().unwrap();
        let p24: Prefix = "10.1.2.0/24".parse().unwrap();
        let other: Prefix = "11.1.2.0/24".parse().unwrap();
        assert!(p8.contains(&p24));
        assert!(!p24.contains(&p8));
        assert!(!p8.contains(&other));
        assert!("0.0.0.0/0".parse::<Prefix>().unwrap().contains(&other));
    }
}
