//! Gray failure in the SRv6 encoding, on the shared SRv6 Fat-Tree: a0 -> c0 drops packets with
//! its carrier up while transfers from pod 0 run; the hosts' meters read the path from RFC
//! 9343's mark behind the outer header, and the controller finds and drains the link.

use std::time::{Duration, Instant};

use sopa_testbed::{
    fabric::Fabric,
    gray::{
        Load, METERED, a0_c0, assert_drained_port_idle, assert_injected, drained, suspects,
        wait_status,
    },
    lossy::LossyLink,
};

/// The same gray link in the SRv6 encoding: the hosts' meters read the path from RFC 9343's mark
/// behind the outer header (switches are plain Linux uSID routers that forward it untouched),
/// and the controller finds, drains and stops the use of a0 -> c0 as it does for the option.
pub fn a_gray_core_link_is_found_and_drained(f: &mut Fabric) {
    // The path meter's evidence starts from nothing here.
    f.restart_controller().unwrap();
    let f = &*f;
    let mut lossy = LossyLink::attach(f.ns("a0"), &f.link_iface("a0", "c0")).unwrap();
    std::thread::scope(|scope| {
        let load = Load::start(scope, f, 7400);
        let s = wait_status(
            f,
            Duration::from_secs(30),
            "metered packets on a0 -> c0",
            |s| a0_c0(s).0 >= METERED,
        );
        let (sent, lost) = a0_c0(&s);
        eprintln!("srv6, healthy: a0 -> c0 {sent} sent, {lost} lost");
        // The receivers count what the senders do (read from the mark): a receiver that missed
        // the mark would read every path as lost.
        assert!(
            lost * 20 <= sent,
            "a healthy a0 -> c0 lost {lost} of {sent}"
        );
        assert_eq!(suspects(&s), Vec::<String>::new(), "a healthy link drained");

        let (seen0, dropped0) = lossy.counts().unwrap();
        lossy.set_loss(2.0).unwrap();
        let onset = Instant::now();
        let s = wait_status(f, Duration::from_secs(20), "a0:c0 suspect at 2%", drained);
        let (seen, dropped) = lossy.counts().unwrap();
        let (seen, dropped) = (seen - seen0, dropped - dropped0);
        eprintln!(
            "srv6, 2%: a0:c0 suspect {:.2} s after the onset; tc_lossy dropped {dropped} of {seen} \
         ({:.2}%); {}",
            onset.elapsed().as_secs_f64(),
            100.0 * dropped as f64 / seen.max(1) as f64,
            s["suspect_links"]
        );
        assert_injected(seen, dropped, 2.0);
        let x = &s["suspect_links"][0];
        assert!(
            x["lost"].as_u64().unwrap() <= dropped,
            "convicted on more lost than dropped: {x}"
        );
        // Drained: the hosts' uSID lists no longer name c0 from a0.
        assert_drained_port_idle(f, &load);
        let transfers = load.finish();
        eprintln!("srv6: {transfers:?} transfers of 4 MiB per flow completed, every one whole");
    });
    // Back as it was: the lossy program gone and the link trusted again (the operator's
    // override ends the suspicion at once), every link up.
    drop(lossy);
    f.sopactl(&["link", "trust", "a0", "c0"]).unwrap();
    f.sopactl(&["link", "untrust", "a0", "c0"]).unwrap();
    f.wait_applied(|down| down == 0, "every link up again")
        .unwrap();
}
