use super::{ModeSpec, flow_line};

#[test]
fn a_stray_packet_on_an_unused_core_link_counts_it_idle_not_in_the_ratio() {
    use super::{core_balance, core_balance_text};
    // Single path: one link carried everything, another one control packet, two nothing.
    let (r, idle) = core_balance(&[125_000_000, 70, 0, 0]);
    assert_eq!((r, idle), (1.0, 3));
    assert_eq!(core_balance_text(r, idle), "1.00 +3 idle");
    let (r, idle) = core_balance(&[104, 100, 98, 102]);
    assert!((r - 104.0 / 98.0).abs() < 1e-12 && idle == 0);
    assert_eq!(core_balance_text(r, idle), "1.06");
    // Just at the share a link is loaded; just under it, idle.
    assert_eq!(core_balance(&[1000, 10]), (100.0, 0));
    assert_eq!(core_balance(&[1000, 9]).1, 1);
    let (r, idle) = core_balance(&[0, 0]);
    assert!(r.is_infinite() && idle == 2);
    assert_eq!(core_balance_text(r, idle), "all idle");
    assert!(core_balance(&[]).0.is_infinite());
}

#[test]
fn jain_is_one_for_equal_shares_and_one_over_n_for_a_hog() {
    assert!((super::jain(&[0.5, 0.5, 0.5, 0.5]) - 1.0).abs() < 1e-12);
    assert!((super::jain(&[1.0, 0.0, 0.0, 0.0]) - 0.25).abs() < 1e-12);
    assert!((super::jain(&[0.6, 0.2]) - 0.8).abs() < 1e-12);
}

#[test]
fn spreads_overlap_only_when_they_meet_on_either_side() {
    use super::spreads_overlap;
    // Below, above, and either way round: apart.
    assert!(!spreads_overlap(&[0.41, 0.47], &[0.69, 0.70]));
    assert!(!spreads_overlap(&[0.69, 0.70], &[0.41, 0.47]));
    // Meeting, nested, touching.
    assert!(spreads_overlap(&[0.5, 0.7], &[0.6, 0.8]));
    assert!(spreads_overlap(&[0.6, 0.8], &[0.5, 0.7]));
    assert!(spreads_overlap(&[0.4, 0.9], &[0.6, 0.7]));
    assert!(spreads_overlap(&[0.5, 0.6], &[0.6, 0.7]));
}

#[test]
fn a_flow_line_carries_both_hashes() {
    let a = "ab".repeat(16);
    let line = |sent: &str, received: &str| {
        serde_json::json!({
            "index": 0, "bytes": 1000, "fct_s": 0.5, "intact": true,
            "sent_digest": sent, "received_digest": received, "total_retrans": 3,
        })
    };
    let t = flow_line(&line(&a, &a), 1000).unwrap();
    assert!(t.intact());
    assert_eq!(t.tcp.total_retrans, 3);
    // One byte changed on the way: not intact, whatever the tool's own verdict said.
    let mut b = a.clone();
    b.replace_range(0..2, "ac");
    assert!(!flow_line(&line(&a, &b), 1000).unwrap().intact());
    assert!(flow_line(&line(&a, "zz"), 1000).is_err());
    assert!(flow_line(&line(&a, &a), 999).is_err());
    assert!(flow_line(&serde_json::json!({"error": "refused"}), 1000).is_err());
}

#[test]
fn modes_and_ablations_parse() {
    let m: ModeSpec = "sopa+r3+norack".parse().unwrap();
    assert_eq!(
        (
            m.base.as_str(),
            m.reordering,
            m.rack,
            m.granularity.as_str()
        ),
        ("sopa", 3, false, "packet")
    );
    let m: ModeSpec = "rps+burst".parse().unwrap();
    assert!(m.granularity == "burst" && m.rack && m.reordering == 10);
    let m: ModeSpec = "sopa+cell8".parse().unwrap();
    assert_eq!(m.granularity, "flowcell:8");
    assert!(
        "sopa+cell0"
            .parse::<ModeSpec>()
            .unwrap_err()
            .contains("cellN")
    );
    assert_eq!("hedera".parse::<ModeSpec>().unwrap().base, "hedera");
    assert_eq!("mptcp".parse::<ModeSpec>().unwrap().base, "mptcp");
    assert_eq!("single".parse::<ModeSpec>().unwrap().base, "single");
    assert!(
        "quic"
            .parse::<ModeSpec>()
            .unwrap_err()
            .contains("mptcp, ideal, or in the entropy encoding random or rr-blind")
    );
    let random: ModeSpec = "random".parse().unwrap();
    assert_eq!(
        (random.labels(), random.entropy_only()),
        ("per-packet", true)
    );
    let blind: ModeSpec = "rr-blind+r3".parse().unwrap();
    assert_eq!((blind.labels(), blind.reordering), ("blind", 3));
    assert!(!"sopa".parse::<ModeSpec>().unwrap().entropy_only());
    assert!(
        "sopa+fast"
            .parse::<ModeSpec>()
            .unwrap_err()
            .contains("unknown ablation")
    );
}
