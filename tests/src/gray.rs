//! What the gray-link phases of both encodings share: transfers from pod 0 running back to back
//! while a core link loses packets with its carrier up, and the controller's view of the path
//! meter (suspects, link loss, drains) read from `sopactl status --json`.

use std::{
    sync::{
        Arc, Condvar, Mutex,
        atomic::{AtomicBool, Ordering},
    },
    thread::{Scope, ScopedJoinHandle},
    time::{Duration, Instant},
};

use crate::{
    fabric::Fabric,
    traffic::{SendOptions, tcp_transfer},
};

/// Flows from pod 0 to other pods: each sprays over a0 and a1 and all four cores, which they
/// load to about half their rate (a link near its rate is not judged: its queue's drops would
/// read as gray).
pub const FLOWS: [(&str, &str, &str); 2] = [("h0", "h4", "10.1.0.2"), ("h2", "h12", "10.3.0.2")];

/// Packets the meter must have seen on a0 -> c0 in its shortest window (one second) before a
/// phase starts: proof that the link carries metered traffic. Usually 2,000-3,000 here; a CI
/// run on a machine losing a fifth of its time to the hypervisor (steal) saw 1,242.
pub const METERED: u64 = 600;

/// Transfers of 4 MiB on each of [`FLOWS`], back to back until dropped or finished, each
/// checked whole.
pub struct Load<'scope> {
    stop: Arc<AtomicBool>,
    /// Transfers completed per flow, signalled at each.
    done: Arc<(Mutex<[u64; FLOWS.len()]>, Condvar)>,
    threads: Vec<ScopedJoinHandle<'scope, ()>>,
}

impl<'scope> Load<'scope> {
    /// Starts the flows in `scope`; `port` is the first flow's first port (each flow counts up
    /// from its own hundred).
    pub fn start<'env>(s: &'scope Scope<'scope, 'env>, f: &'env Fabric, port: u16) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let done = Arc::new((Mutex::new([0; FLOWS.len()]), Condvar::new()));
        let threads = FLOWS
            .iter()
            .enumerate()
            .map(|(i, &(src, dst, addr))| {
                let (stop, done) = (Arc::clone(&stop), Arc::clone(&done));
                s.spawn(move || {
                    let mut port = port + 100 * i as u16;
                    while !stop.load(Ordering::Relaxed) {
                        // Ended early, whole, when the load stops (a failed phase's too).
                        let opts = SendOptions {
                            stop: Some(Arc::clone(&stop)),
                            ..SendOptions::default()
                        };
                        let t = tcp_transfer(
                            f.ns(src),
                            f.ns(dst),
                            addr.parse().unwrap(),
                            port,
                            4 << 20,
                            &opts,
                        )
                        .unwrap_or_else(|e| panic!("{src} -> {dst}: {e}"));
                        assert!(t.intact(), "{src} -> {dst}: digest differs");
                        done.0.lock().unwrap()[i] += 1;
                        done.1.notify_all();
                        port = port.wrapping_add(1);
                    }
                })
            })
            .collect();
        Self {
            stop,
            done,
            threads,
        }
    }

    /// Stops the flows after their transfers in progress; returns the transfers each
    /// completed.
    pub fn finish(mut self) -> [u64; FLOWS.len()] {
        self.stop.store(true, Ordering::Relaxed);
        for t in std::mem::take(&mut self.threads) {
            t.join().expect("a transfer failed");
        }
        *self.done.0.lock().unwrap()
    }

    /// Waits until every flow has completed one more transfer than it had when called: each
    /// one crossed what the fabric is now. Panics after `within`, naming `what`.
    pub fn wait_each_next(&self, within: Duration, what: &str) {
        let (count, completed) = &*self.done;
        let count = count.lock().unwrap();
        let before = *count;
        let (count, wait) = completed
            .wait_timeout_while(count, within, |n| {
                n.iter().zip(&before).any(|(n, b)| n <= b)
            })
            .unwrap();
        assert!(
            !wait.timed_out(),
            "{what}: transfers per flow {:?}, {before:?} when the wait began",
            *count
        );
    }
}

/// A failing phase stops its transfers too, so that its scope can end (and the fabric be
/// rebuilt for the next phase).
impl Drop for Load<'_> {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

/// `sopactl status --json`.
pub fn status(f: &Fabric) -> serde_json::Value {
    serde_json::from_str(&f.sopactl(&["status", "--json"]).expect("sopactl status"))
        .expect("status JSON")
}

/// The links the controller holds suspect.
pub fn suspects(s: &serde_json::Value) -> Vec<String> {
    s["suspect_links"]
        .as_array()
        .unwrap()
        .iter()
        .map(|x| x["link"].as_str().unwrap().to_owned())
        .collect()
}

/// The metered (sent, lost) of a0 -> c0 in the controller's shortest window.
pub fn a0_c0(s: &serde_json::Value) -> (u64, u64) {
    s["link_loss"]
        .as_array()
        .unwrap()
        .iter()
        .find(|x| x["from"] == "a0" && x["to"] == "c0")
        .map_or((0, 0), |x| {
            (x["sent"].as_u64().unwrap(), x["lost"].as_u64().unwrap())
        })
}

/// Polls the controller's status until `done` holds; panics after `within`.
pub fn wait_status(
    f: &Fabric,
    within: Duration,
    what: &str,
    done: impl Fn(&serde_json::Value) -> bool,
) -> serde_json::Value {
    let start = Instant::now();
    loop {
        let s = status(f);
        if done(&s) {
            return s;
        }
        assert!(
            start.elapsed() < within,
            "{what}: not within {within:?}; status: {}",
            serde_json::to_string_pretty(&s).unwrap()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// What a failure to explain a conviction prints: the suspects with their evidence, the
/// worst links now, and the controller's log lines of the path meter's verdicts.
pub fn evidence(f: &Fabric, s: &serde_json::Value) -> String {
    let verdicts: Vec<String> = f
        .controller_log()
        .lines()
        .filter(|l| l.contains("path meter") || l.contains("fabric changed"))
        .map(str::to_owned)
        .collect();
    format!(
        "suspects {}; link loss {}; the controller's verdicts and changes:\n{}",
        s["suspect_links"],
        s["link_loss"],
        verdicts.join("\n")
    )
}

/// a0:c0 suspect, and its drain stored and in force (the suspicion shows as soon as it is made).
pub fn drained(s: &serde_json::Value) -> bool {
    suspects(s) == ["a0:c0"]
        && s["down_links"]
            .as_array()
            .unwrap()
            .iter()
            .any(|l| l == "a0:c0")
}

/// `tc_lossy` dropped `percent` of what it saw (binomial, within 5 standard deviations).
pub fn assert_injected(seen: u64, dropped: u64, percent: f64) {
    let p = percent / 100.0;
    let sd = (seen as f64 * p * (1.0 - p)).sqrt();
    assert!(
        (dropped as f64 - seen as f64 * p).abs() <= 5.0 * sd + 1.0,
        "tc_lossy dropped {dropped} of {seen}, not {percent}%"
    );
}

/// Once every agent applied the drain, a0's port to c0 carries only what was queued: under 50
/// packets while every flow from pod 0 completes one more transfer of 4 MiB (traffic that
/// sprayed over every path before the drain), and every flow does complete one.
pub fn assert_drained_port_idle(f: &Fabric, load: &Load) {
    f.wait_applied(|down| down >= 1, "every agent applied the drain")
        .unwrap();
    let port = f.link_iface("a0", "c0");
    let before = f.ns("a0").tx_packets(&port).unwrap();
    load.wait_each_next(
        Duration::from_secs(60),
        "a flow from pod 0 completed no transfer after the drain",
    );
    let after = f.ns("a0").tx_packets(&port).unwrap();
    assert!(
        after - before < 50,
        "{} packets sent onto the drained link",
        after - before
    );
}
