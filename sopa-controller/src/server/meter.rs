//! The controller's side of the path meter: hosts' period reports go to the tomography
//! (`crate::tomography`), its convictions become suspect links drained for a hold-down
//! (`crate::suspicion`), made durable and pushed like any change, and released when the
//! hold-down ends. One task makes these changes, in order.

use std::{
    collections::BTreeSet,
    sync::{
        Arc, Mutex,
        atomic::{AtomicU64, Ordering::Relaxed},
    },
    time::{Duration, Instant},
};

use prost::Message as _;
use sopa_channel::proto::{
    self, ChangeReply, LinkLoss, LinkRef, PathReport, PeerPaths, SuspectLink,
};
use tokio::sync::mpsc;
use tracing::{debug, info, warn};

use super::Controller;
use crate::{
    fabric::FabricError,
    suspicion::{LinkKey, Spared, Suspicions, key},
    tomography::{Tomography, Verdict},
};

/// How often hold-downs are checked.
const RELEASE_TICK: Duration = Duration::from_millis(100);

/// The most links `sopactl status` lists with their loss.
const STATUS_LINKS: usize = 64;

/// A conviction on its way to the task that drains: the link's ends as measured, the verdict.
type Conviction = (String, String, Verdict);
/// The convictions of one judged period, with the fabric's version they were judged against.
type Convictions = (u64, Vec<Conviction>);

pub(crate) struct MeterState {
    pub tomography: Mutex<Tomography>,
    pub suspicions: Mutex<Suspicions>,
    convictions: mpsc::Sender<Convictions>,
    receiver: Mutex<Option<mpsc::Receiver<Convictions>>>,
    /// Reports taken, their encoded bytes, and those refused as malformed.
    pub reports: AtomicU64,
    pub report_bytes: AtomicU64,
    pub refused: AtomicU64,
}

impl MeterState {
    pub fn new(tomography: Tomography, suspicions: Suspicions) -> Self {
        let (convictions, receiver) = mpsc::channel(64);
        Self {
            tomography: Mutex::new(tomography),
            suspicions: Mutex::new(suspicions),
            convictions,
            receiver: Mutex::new(Some(receiver)),
            reports: AtomicU64::new(0),
            report_bytes: AtomicU64::new(0),
            refused: AtomicU64::new(0),
        }
    }

    pub fn suspect_links(&self) -> Vec<SuspectLink> {
        let now = Instant::now();
        self.suspicions
            .lock()
            .expect("suspicions lock")
            .suspects()
            .iter()
            .map(|((a, b), s)| SuspectLink {
                link: Some(LinkRef {
                    a: a.clone(),
                    b: b.clone(),
                }),
                loss: s.loss,
                lost: s.lost,
                sent: s.sent,
                remaining_ms: s.until.saturating_duration_since(now).as_millis() as u64,
                strikes: s.strikes,
            })
            .collect()
    }

    pub fn trusted_links(&self) -> Vec<LinkRef> {
        self.suspicions
            .lock()
            .expect("suspicions lock")
            .trusted()
            .iter()
            .map(|(a, b)| LinkRef {
                a: a.clone(),
                b: b.clone(),
            })
            .collect()
    }

    /// Every directed link's packets, losses and load over the shortest judged window.
    pub fn all_link_loss(&self) -> Vec<LinkLoss> {
        let mut t = self.tomography.lock().expect("tomography lock");
        let window = t.config.windows.iter().copied().min().unwrap_or(1);
        let max_load = t.config.max_load;
        t.link_loss(window)
            .into_iter()
            .map(|l| {
                let (a, b) = t.names(l.link);
                LinkLoss {
                    link: Some(LinkRef { a, b }),
                    sent: l.sent,
                    lost: l.lost,
                    load: l.load,
                    over_load: l.load > max_load,
                }
            })
            .collect()
    }

    /// [`MeterState::all_link_loss`], the worst [`STATUS_LINKS`] with packets.
    pub fn link_loss(&self) -> Vec<LinkLoss> {
        let mut all = self.all_link_loss();
        all.retain(|l| l.sent > 0);
        all.truncate(STATUS_LINKS);
        all
    }
}

/// How far from this controller's clock a report's period may be, in periods: reports come
/// half a period after their period, and a reconnecting agent's few queued ones later still.
const MAX_PERIOD_SKEW: u64 = 64;

/// TAI nanoseconds, the clock the agents number their periods by.
fn tai_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: a valid timespec to write to.
    unsafe { libc::clock_gettime(libc::CLOCK_TAI, &mut ts) };
    (ts.tv_sec as u64)
        .saturating_mul(1_000_000_000)
        .saturating_add(ts.tv_nsec as u64)
}

/// Why a report whose period is far from this controller's clock (`now_ns`, TAI) is refused: a
/// host clock that far off would mislabel every period, and one period number far ahead would
/// hold the meter's evidence back after every change.
fn off_clock(report: &PathReport, now_ns: u64) -> Option<String> {
    let now = now_ns / (u64::from(report.period_ms.max(1)) * 1_000_000);
    (report.period.abs_diff(now) > MAX_PERIOD_SKEW).then(|| {
        format!(
            "period {} of {} ms is more than {MAX_PERIOD_SKEW} periods from this controller's TAI clock (period {now}): the host's clock is off",
            report.period, report.period_ms
        )
    })
}

/// Why a path report is refused.
fn malformed(report: &PathReport) -> Option<String> {
    if report.period_ms == 0 {
        return Some("a period of 0 ms".into());
    }
    if report.sent.len() > proto::MAX_REPORT_RACKS
        || report.received.len() > proto::MAX_REPORT_RACKS
    {
        return Some(format!(
            "more than {} racks in one direction",
            proto::MAX_REPORT_RACKS
        ));
    }
    let disagree = |p: &PeerPaths, n: usize, what: &str| {
        let rack = std::net::Ipv4Addr::from(p.rack);
        format!("rack {rack}: {} paths but {n} {what}", p.hops.len())
    };
    let counts = report
        .sent
        .iter()
        .chain(&report.received)
        .find(|p| p.hops.len() != p.packets.len())
        .map(|p| disagree(p, p.packets.len(), "counts"));
    // Bytes for every path sent on, or none (an agent older than the byte count).
    let bytes = || {
        report
            .sent
            .iter()
            .find(|p| !p.bytes.is_empty() && p.bytes.len() != p.packets.len())
            .map(|p| disagree(p, p.bytes.len(), "byte counts"))
    };
    counts.or_else(bytes)
}

impl Controller {
    /// A host agent's path report: judged once every connected host's report of its period is
    /// in; convictions go to [`Controller::run_suspicions`].
    pub(super) fn accept_paths(&self, host: &str, report: PathReport) {
        if let Some(why) = malformed(&report).or_else(|| off_clock(&report, tai_ns())) {
            self.meter.refused.fetch_add(1, Relaxed);
            warn!(host, why, "a path report refused");
            return;
        }
        self.meter.reports.fetch_add(1, Relaxed);
        self.meter
            .report_bytes
            .fetch_add(report.encoded_len() as u64, Relaxed);
        let expected: BTreeSet<String> = self
            .hosts
            .lock()
            .expect("hosts lock")
            .iter()
            .filter(|(_, h)| h.left.is_none())
            .map(|(n, _)| n.clone())
            .collect();
        if !self
            .meter
            .tomography
            .lock()
            .expect("tomography lock")
            .accept(host, report, &expected)
        {
            return;
        }
        // A period closed: judged against the failures of now (the fabric's lock is never
        // taken under the tomography's: a change takes them in the other order).
        let (topology, failures, version) = {
            let f = self.fabric.lock().expect("fabric lock");
            (f.shared_topology(), f.failures(), f.version())
        };
        let convictions: Vec<Conviction> = {
            let mut t = self.meter.tomography.lock().expect("tomography lock");
            t.judge(|l| !failures.usable(topology.graph(), l))
                .into_iter()
                .map(|v| {
                    let (a, b) = t.names(v.link);
                    (a, b, v)
                })
                .collect()
        };
        if !convictions.is_empty()
            && self
                .meter
                .convictions
                .try_send((version, convictions))
                .is_err()
        {
            warn!(
                "convictions queue full; this period's are dropped (the next period's repeat them)"
            );
        }
    }

    /// The path meter's evidence starts again once every connected agent has applied the
    /// fabric's version, or refused it ([`crate::tomography::Tomography::settled`]): until then
    /// hosts may send on a path a switch still detours. Called at each ack, refusal, connection
    /// and disconnection.
    pub(super) fn settle_meter(&self) {
        let Some(version) = self
            .meter
            .tomography
            .lock()
            .expect("tomography lock")
            .settling()
        else {
            return;
        };
        let applied = self
            .agents
            .lock()
            .expect("agents lock")
            .values()
            .all(|r| !r.connected || r.applied_version >= version || r.last_nack >= version);
        if applied {
            self.meter
                .tomography
                .lock()
                .expect("tomography lock")
                .settled(version);
        }
    }

    /// Drains the links the meter convicts, and trusts them again when their hold-down ends.
    /// Suspects a previous run stored are held for a first hold-down from now.
    pub async fn run_suspicions(self: Arc<Self>) {
        let Some(mut rx) = self.meter.receiver.lock().expect("receiver lock").take() else {
            return;
        };
        {
            let stored = self.fabric.lock().expect("fabric lock").suspect_links();
            let mut s = self.meter.suspicions.lock().expect("suspicions lock");
            for k in stored {
                s.adopt(&k, Instant::now());
            }
        }
        let mut tick = tokio::time::interval(RELEASE_TICK);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                Some((version, convictions)) = rx.recv() => {
                    // Judged before the fabric last changed: the change forgot the evidence
                    // (a link released from its hold-down must not be convicted again on the
                    // losses that drained it).
                    if version < self.fabric.lock().expect("fabric lock").version() {
                        debug!(
                            judged = version,
                            convictions = convictions.len(),
                            "path meter: verdicts judged before the fabric's last change, dropped"
                        );
                        continue;
                    }
                    for (from, to, verdict) in convictions {
                        self.convict(&from, &to, &verdict).await;
                    }
                }
                _ = tick.tick() => {
                    let due = self
                        .meter
                        .suspicions
                        .lock()
                        .expect("suspicions lock")
                        .due(Instant::now());
                    for k in due {
                        self.release(&k).await;
                    }
                }
            }
        }
    }

    async fn convict(&self, from: &str, to: &str, v: &Verdict) {
        let k = key(from, to);
        if self
            .fabric
            .lock()
            .expect("fabric lock")
            .is_link_down(&k.0, &k.1)
        {
            // Down for another reason already (drained, reported, suspect): nothing to add.
            return;
        }
        let held = self
            .meter
            .suspicions
            .lock()
            .expect("suspicions lock")
            .convict(&k, (v.loss(), v.lost, v.sent), Instant::now());
        match held {
            Ok(hold) => {
                warn!(
                    link = %format!("{from}:{to}"),
                    loss = v.loss(),
                    lost = v.lost,
                    sent = v.sent,
                    window_periods = v.window,
                    hold_s = hold.as_secs_f64(),
                    "path meter: a link loses packets; drained as suspect"
                );
                if let Err(e) = self.change(|f| f.set_suspect(&k.0, &k.1, true)).await {
                    warn!(error = %e, link = %format!("{from}:{to}"), "draining a suspect link failed; it stays in use");
                    self.meter
                        .suspicions
                        .lock()
                        .expect("suspicions lock")
                        .forget(&k);
                }
            }
            Err(Spared::AlreadySuspect) => {}
            Err(Spared::Trusted) => info!(
                link = %format!("{from}:{to}"),
                loss = v.loss(),
                "path meter: a link the operator trusts loses packets; not drained"
            ),
            Err(Spared::Adjacent) => warn!(
                link = %format!("{from}:{to}"),
                loss = v.loss(),
                "path meter: a link loses packets, but a link of the same switch is suspect already; not drained"
            ),
            Err(Spared::TooMany) => warn!(
                link = %format!("{from}:{to}"),
                loss = v.loss(),
                "path meter: a link loses packets, but the most suspects allowed are drained already; not drained"
            ),
        }
    }

    /// A hold-down is over: the link is trusted again (the change, like every change, starts
    /// the meter's evidence again: what was gathered while it was drained says nothing of it).
    async fn release(&self, k: &LinkKey) {
        self.meter
            .suspicions
            .lock()
            .expect("suspicions lock")
            .release(k, Instant::now());
        match self.change(|f| f.set_suspect(&k.0, &k.1, false)).await {
            Ok(_) => {
                info!(link = %format!("{}:{}", k.0, k.1), "path meter: hold-down over; the link is trusted again")
            }
            Err(e) => {
                warn!(error = %e, link = %format!("{}:{}", k.0, k.1), "ending a suspect link's drain failed; tried again after a hold-down");
                self.meter
                    .suspicions
                    .lock()
                    .expect("suspicions lock")
                    .adopt(k, Instant::now());
            }
        }
    }

    /// An operator trusts a link (a suspicion ends now, and the meter drains it no more) or
    /// hands it back to the meter.
    pub async fn set_trust(
        &self,
        a: &str,
        b: &str,
        trust: bool,
    ) -> Result<ChangeReply, FabricError> {
        self.fabric.lock().expect("fabric lock").check_link(a, b)?;
        let k = key(a, b);
        let was_suspect = self
            .meter
            .suspicions
            .lock()
            .expect("suspicions lock")
            .set_trusted(&k, trust, Instant::now());
        info!(link = %format!("{a}:{b}"), trust, "operator: path meter trust set");
        if was_suspect {
            self.change(|f| f.set_suspect(&k.0, &k.1, false)).await
        } else {
            Ok(ChangeReply {
                version: self.version(),
                changed: false,
            })
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn report(hops: usize, packets: usize, bytes: usize) -> PathReport {
        PathReport {
            period: 1,
            period_ms: 250,
            sent: vec![PeerPaths {
                rack: u32::from(std::net::Ipv4Addr::new(10, 1, 0, 0)),
                hops: vec![0; hops],
                packets: vec![1; packets],
                bytes: vec![100; bytes],
            }],
            ..PathReport::default()
        }
    }

    #[test]
    fn a_report_far_from_the_controllers_clock_is_refused() {
        let at = |period| PathReport {
            period,
            ..report(1, 1, 1)
        };
        let now = 1_000 * 250 * 1_000_000 + 100_000_000;
        assert_eq!(off_clock(&at(999), now), None);
        assert_eq!(off_clock(&at(1_000 - MAX_PERIOD_SKEW), now), None);
        let why = off_clock(&at(u64::MAX), now).unwrap();
        assert!(why.contains("clock is off"), "{why}");
        assert!(off_clock(&at(1_000 + MAX_PERIOD_SKEW + 1), now).is_some());
        assert!(off_clock(&at(1), now).is_some());
    }

    #[test]
    fn a_report_whose_arrays_disagree_is_refused_naming_the_rack() {
        assert_eq!(malformed(&report(2, 2, 2)), None);
        assert_eq!(
            malformed(&report(2, 2, 0)),
            None,
            "no bytes: an older agent"
        );
        let why = malformed(&report(2, 1, 0)).unwrap();
        assert!(why.contains("10.1.0.0: 2 paths but 1 counts"), "{why}");
        let why = malformed(&report(2, 2, 1)).unwrap();
        assert!(why.contains("10.1.0.0: 2 paths but 1 byte counts"), "{why}");
    }
}
