//! What a path report must be before anything of it is kept: well formed, within what links
//! can carry, and consistent with the sender's own spraying. The paths themselves are checked
//! against the topology by the tomography (`Tomography::check`).

use std::collections::HashSet;

use sopa_channel::proto::{self, PathReport, PeerPaths};

use super::Refused;

/// The most bytes a counted packet may take on the wire: a jumbo frame with every header the
/// encodings add, and room to spare. A sender counts each segment of a GSO packet.
pub const MAX_FRAME_BYTES: u64 = 16_384;

/// The fewest bytes a frame takes on the wire (without its FCS), and what each frame takes
/// besides (preamble, delimiter, FCS, gap): a link of `bps` carries at most `bps / 8 / 84`
/// packets a second.
const MIN_WIRE_BYTES: u64 = 60 + 24;

/// How many links' worth one host may claim to send or receive in a period: hosts' links may
/// be faster than the fabric's.
const HOST_LINKS: u64 = 4;

/// A path's packets may reach [`BALANCE_TIMES`] the host's lower median path to the same rack
/// and this many packets besides: every flow goes round robin over all paths of its rack, so
/// each path gets the same share, give or take one unit of spraying per flow (a packet, or a
/// flowcell: 44 full packets of 64 KB), which a period of few slow flows does not even out.
pub const BALANCE_SLACK: u64 = 64;
pub const BALANCE_TIMES: u64 = 2;

/// The most a report may claim, from the fabric's link rate and the period.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Bounds {
    /// Packets one host may send, or receive, in a period (on all paths together).
    pub packets: u64,
}

impl Bounds {
    pub fn new(link_bps: f64, period_ms: u32) -> Self {
        let per_link = link_bps / 8.0 * f64::from(period_ms) / 1e3 / MIN_WIRE_BYTES as f64;
        Self {
            packets: (per_link.ceil() as u64).max(1).saturating_mul(HOST_LINKS),
        }
    }
}

/// Why a report is malformed or claims more than links carry: arrays that disagree, a rack or
/// a path named twice, counts past [`Bounds`].
pub fn check(report: &PathReport, bounds: Bounds) -> Result<(), Refused> {
    let malformed = |s: String| Err(Refused::Malformed(s));
    if report.sent.len() > proto::MAX_REPORT_RACKS
        || report.received.len() > proto::MAX_REPORT_RACKS
    {
        return malformed(format!(
            "more than {} racks in one direction",
            proto::MAX_REPORT_RACKS
        ));
    }
    for (list, sent) in [(&report.sent, true), (&report.received, false)] {
        let mut racks = HashSet::with_capacity(list.len());
        let mut total: u64 = 0;
        for p in list.iter() {
            let rack = std::net::Ipv4Addr::from(p.rack);
            if p.hops.len() != p.packets.len() {
                return malformed(format!(
                    "rack {rack}: {} paths but {} counts",
                    p.hops.len(),
                    p.packets.len()
                ));
            }
            // Bytes for every path sent on, or none (an agent older than the byte count).
            if sent && !p.bytes.is_empty() && p.bytes.len() != p.packets.len() {
                return malformed(format!(
                    "rack {rack}: {} paths but {} byte counts",
                    p.hops.len(),
                    p.bytes.len()
                ));
            }
            if !racks.insert(p.rack) {
                return malformed(format!("rack {rack} named twice"));
            }
            let mut hops = HashSet::with_capacity(p.hops.len());
            if let Some(h) = p.hops.iter().find(|h| !hops.insert(**h)) {
                return malformed(format!("rack {rack}: path {} named twice", path_name(*h)));
            }
            for (i, &n) in p.packets.iter().enumerate() {
                total = total.saturating_add(n);
                if let Some(&b) = p.bytes.get(i)
                    && b > n.saturating_mul(MAX_FRAME_BYTES)
                {
                    return Err(Refused::Implausible(format!(
                        "rack {rack}, path {}: {b} bytes in {n} packets, more than {MAX_FRAME_BYTES} a packet",
                        path_name(p.hops[i])
                    )));
                }
            }
        }
        if total > bounds.packets {
            return Err(Refused::Implausible(format!(
                "{total} packets {} in one period of {} ms, more than {HOST_LINKS} fabric links carry ({})",
                if sent { "sent" } else { "received" },
                report.period_ms,
                bounds.packets
            )));
        }
    }
    Ok(())
}

/// Why a host's sent counts contradict its own spraying: every flow goes round robin over all
/// paths of its rack, so no path gets much more than the others. A host that claims to have
/// sent on some paths what it did not (to make them look lossy) shows as such a path.
pub fn unbalanced(report: &PathReport) -> Option<String> {
    report.sent.iter().find_map(unbalanced_rack)
}

fn unbalanced_rack(p: &PeerPaths) -> Option<String> {
    if p.packets.len() < 2 {
        return None;
    }
    let mut sorted = p.packets.clone();
    sorted.sort_unstable();
    // The lower median: a host that inflates fewer than half its paths cannot move it.
    let median = sorted[(sorted.len() - 1) / 2];
    let most = median
        .saturating_mul(BALANCE_TIMES)
        .saturating_add(BALANCE_SLACK);
    let (i, &n) = p
        .packets
        .iter()
        .enumerate()
        .max_by_key(|(_, n)| **n)
        .expect("two or more");
    (n > most).then(|| {
        format!(
            "it says it sent {n} packets on path {} to rack {}, where its median path took {median}: per-flow round robin gives every path of a rack the same share",
            path_name(p.hops[i]),
            std::net::Ipv4Addr::from(p.rack)
        )
    })
}

/// A path as `hop0.hop1`.
pub fn path_name(hops: u32) -> String {
    format!("{}.{}", hops & 0xff, (hops >> 8) & 0xff)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn report(packets: Vec<u64>, bytes: Vec<u64>) -> PathReport {
        PathReport {
            period: 1,
            period_ms: 250,
            sent: vec![PeerPaths {
                rack: u32::from(std::net::Ipv4Addr::new(10, 1, 0, 0)),
                hops: (0..packets.len() as u32).collect(),
                packets,
                bytes,
            }],
            ..PathReport::default()
        }
    }

    const BOUNDS: Bounds = Bounds { packets: 1_000_000 };

    #[test]
    fn arrays_that_disagree_or_name_a_path_twice_are_refused_naming_the_rack() {
        assert_eq!(check(&report(vec![1, 1], vec![100, 100]), BOUNDS), Ok(()));
        assert_eq!(
            check(&report(vec![1, 1], vec![]), BOUNDS),
            Ok(()),
            "no bytes: an older agent"
        );
        let mut r = report(vec![1, 1], vec![]);
        r.sent[0].packets.pop();
        let why = check(&r, BOUNDS).unwrap_err().to_string();
        assert!(why.contains("10.1.0.0: 2 paths but 1 counts"), "{why}");
        let why = check(&report(vec![1, 1], vec![100]), BOUNDS)
            .unwrap_err()
            .to_string();
        assert!(why.contains("10.1.0.0: 2 paths but 1 byte counts"), "{why}");
        let mut r = report(vec![1, 1], vec![]);
        r.sent[0].hops[1] = 0;
        let why = check(&r, BOUNDS).unwrap_err().to_string();
        assert!(why.contains("path 0.0 named twice"), "{why}");
        let mut r = report(vec![1], vec![]);
        r.sent.push(r.sent[0].clone());
        assert!(
            check(&r, BOUNDS)
                .unwrap_err()
                .to_string()
                .contains("named twice")
        );
    }

    #[test]
    fn counts_past_what_links_carry_are_refused_without_overflow() {
        // Two entries of one rack and path with u64::MAX packets each.
        let mut r = report(vec![u64::MAX], vec![]);
        r.sent.push(r.sent[0].clone());
        assert!(check(&r, BOUNDS).is_err());
        // Apart: still past the bound, summed without overflow.
        let mut r = report(vec![u64::MAX, u64::MAX], vec![u64::MAX, u64::MAX]);
        r.received = r.sent.clone();
        let why = check(&r, BOUNDS).unwrap_err();
        assert_eq!(why.reason(), "implausible");
        let why = check(&report(vec![10], vec![10 * MAX_FRAME_BYTES + 1]), BOUNDS).unwrap_err();
        assert!(
            why.to_string().contains("more than 16384 a packet"),
            "{why}"
        );
        // 10 Gbit/s for 250 ms: 3.72 M minimum-size frames a link, four links a host.
        let b = Bounds::new(10e9, 250);
        assert_eq!(b.packets, 4 * 3_720_239);
    }

    #[test]
    fn a_path_past_its_siblings_share_is_unbalanced() {
        assert_eq!(unbalanced(&report(vec![200, 204, 199, 230], vec![])), None);
        assert_eq!(unbalanced(&report(vec![3, 0, 1, 20], vec![])), None, "few");
        // Three slow flows in flowcells of 44: two cells on one path in the period.
        assert_eq!(
            unbalanced(&report(vec![88, 44, 12], vec![])),
            None,
            "flowcells"
        );
        assert!(unbalanced(&report(vec![200, 200, 465, 200], vec![])).is_some());
        let why = unbalanced(&report(vec![200, 200, 10_200, 200], vec![])).unwrap();
        assert!(
            why.contains(
                "10200 packets on path 2.0 to rack 10.1.0.0, where its median path took 200"
            ),
            "{why}"
        );
        // Half its paths inflated: the lower median is still an honest one.
        assert!(unbalanced(&report(vec![200, 10_200, 10_200, 200], vec![])).is_some());
        assert_eq!(unbalanced(&report(vec![10_200], vec![])), None, "one path");
    }
}
