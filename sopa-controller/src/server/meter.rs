//! The controller's side of the path meter: hosts' period reports go to the tomography
//! (`crate::tomography`), its convictions become suspect links drained for a hold-down
//! (`crate::suspicion`), made durable and pushed like any change, and released when the
//! hold-down ends. One task makes these changes, in order.

use std::{
    collections::BTreeSet,
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use prost::Message as _;
use sopa_channel::proto::{ChangeReply, LinkLoss, LinkRef, MeterHost, PathReport, SuspectLink};
use tokio::sync::mpsc;
use tracing::{debug, info, warn};

use super::Controller;
use crate::{
    audit::Actor,
    fabric::FabricError,
    meter::{Meter, MeterClock, Reporter},
    suspicion::{LinkKey, Spared, Suspicions, key},
    tomography::Verdict,
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
    /// The intake and the tomography behind it.
    pub evidence: Mutex<Meter>,
    /// Its clock, which never changes while the controller runs (snapshots carry it).
    pub clock: MeterClock,
    /// Every directed link's packets, losses and load over the shortest judged window, as of
    /// the last judged period: what status and metrics show, computed once a period, not per
    /// viewer (and never under the fabric's lock).
    view: Mutex<Arc<Vec<LinkLoss>>>,
    pub suspicions: Mutex<Suspicions>,
    convictions: mpsc::Sender<Convictions>,
    receiver: Mutex<Option<mpsc::Receiver<Convictions>>>,
}

/// What the meter's counters say, for metrics.
pub(crate) struct MeterCounts {
    pub judged: u64,
    pub partial: u64,
    pub reports: u64,
    pub report_bytes: u64,
    pub refused: Vec<(&'static str, u64)>,
    pub inconsistent: u64,
}

impl MeterState {
    pub fn new(meter: Meter, suspicions: Suspicions) -> Self {
        let (convictions, receiver) = mpsc::channel(64);
        Self {
            clock: meter.clock,
            evidence: Mutex::new(meter),
            view: Mutex::new(Arc::default()),
            suspicions: Mutex::new(suspicions),
            convictions,
            receiver: Mutex::new(Some(receiver)),
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

    /// Every directed link's packets, losses and load over the shortest judged window, as of
    /// the last judged period.
    pub fn all_link_loss(&self) -> Arc<Vec<LinkLoss>> {
        Arc::clone(&self.view.lock().expect("view lock"))
    }

    /// [`MeterState::all_link_loss`], the worst [`STATUS_LINKS`].
    pub fn link_loss(&self) -> Vec<LinkLoss> {
        self.all_link_loss()
            .iter()
            .take(STATUS_LINKS)
            .cloned()
            .collect()
    }

    /// Hosts whose reports were set aside lately.
    pub fn named_hosts(&self) -> Vec<MeterHost> {
        self.evidence
            .lock()
            .expect("meter lock")
            .named(Instant::now())
    }

    pub fn counts(&self) -> MeterCounts {
        let m = self.evidence.lock().expect("meter lock");
        MeterCounts {
            judged: m.tomography.periods_judged,
            partial: m.tomography.periods_partial,
            reports: m.reports,
            report_bytes: m.report_bytes,
            refused: m.refused(),
            inconsistent: m.inconsistent,
        }
    }
}

/// The links of `meter`'s shortest window with packets, worst first.
fn view(meter: &mut Meter) -> Vec<LinkLoss> {
    let t = &mut meter.tomography;
    let window = t.config.windows.iter().copied().min().unwrap_or(1);
    let max_load = t.config.max_load;
    t.link_loss(window)
        .into_iter()
        .filter(|l| l.sent > 0)
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

/// TAI nanoseconds, the clock the agents number their periods by.
pub(crate) fn tai_ns() -> u64 {
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

impl Controller {
    /// A host agent's path report: refused (counted by reason, its host named) or taken,
    /// judged once every connected host's report of its period is in; convictions go to
    /// [`Controller::run_suspicions`].
    pub(super) fn accept_paths(&self, from: Reporter<'_>, report: PathReport) {
        let host = from.host;
        let encoded = report.encoded_len();
        let connected: BTreeSet<String> = self
            .hosts
            .lock()
            .expect("hosts lock")
            .iter()
            .filter(|(_, h)| h.left.is_none())
            .map(|(n, _)| n.clone())
            .collect();
        let taken = self.meter.evidence.lock().expect("meter lock").accept(
            from,
            report,
            encoded,
            tai_ns(),
            Instant::now(),
            &connected,
        );
        match taken {
            Err(r) if r.news => {
                warn!(host, reason = r.why.reason(), why = %r.why, "path meter: a report refused (its next ones for this reason at debug level)");
                return;
            }
            Err(r) => {
                debug!(host, reason = r.why.reason(), why = %r.why, "path meter: a report refused");
                return;
            }
            Ok(t) => {
                match t.inconsistent {
                    Some((why, true)) => warn!(
                        host,
                        why, "path meter: a report set aside; its host is inconsistent"
                    ),
                    Some((why, false)) => debug!(
                        host,
                        why, "path meter: a report set aside; its host is inconsistent"
                    ),
                    None => {}
                }
                if !t.closed {
                    return;
                }
            }
        }
        // A period closed: judged against the failures of now (the fabric's lock is never
        // taken under the meter's: a change takes them in the other order).
        let (topology, failures, version) = {
            let f = self.fabric.lock().expect("fabric lock");
            (f.shared_topology(), f.failures(), f.version())
        };
        let (convictions, links): (Vec<Conviction>, _) = {
            let mut m = self.meter.evidence.lock().expect("meter lock");
            let t = &mut m.tomography;
            let convictions = t
                .judge(|l| !failures.usable(topology.graph(), l))
                .into_iter()
                .map(|v| {
                    let (a, b) = t.names(v.link);
                    (a, b, v)
                })
                .collect();
            (convictions, view(&mut m))
        };
        *self.meter.view.lock().expect("view lock") = Arc::new(links);
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
    /// The fabric version the path meter's evidence waits for every agent to apply, if any.
    pub fn meter_settling(&self) -> Option<u64> {
        self.meter
            .evidence
            .lock()
            .expect("meter lock")
            .tomography
            .settling()
    }

    pub(super) fn settle_meter(&self) {
        self.settle_meter_at(tai_ns());
    }

    /// [`Self::settle_meter`] at `now_tai_ns`: connected agents that neither acknowledged nor
    /// refused the version within [`crate::meter::MAX_SETTLE_PERIODS`] periods are counted as
    /// lagging and not waited for (nor for any version after, until they acknowledge one), so
    /// one silent agent cannot stop every judgement.
    pub(crate) fn settle_meter_at(&self, now_tai_ns: u64) {
        let mut evidence = self.meter.evidence.lock().expect("meter lock");
        let Some(version) = evidence.tomography.settling() else {
            return;
        };
        let mut agents = self.agents.lock().expect("agents lock");
        let behind: Vec<&String> = agents
            .iter()
            .filter(|(_, r)| {
                r.connected
                    && r.applied_version < version
                    && r.last_nack < version
                    && r.lagging.is_none()
            })
            .map(|(node, _)| node)
            .collect();
        if !behind.is_empty() {
            if !evidence.settle_overdue(now_tai_ns) {
                return;
            }
            let behind: Vec<String> = behind.into_iter().cloned().collect();
            warn!(
                version,
                agents = ?behind,
                "path meter: agents that have not acknowledged the fabric's version within {} periods are counted as lagging; judging without waiting for them",
                crate::meter::MAX_SETTLE_PERIODS
            );
            for node in &behind {
                if let Some(r) = agents.get_mut(node) {
                    r.lagging = Some(version);
                }
            }
        }
        evidence.tomography.settled(version);
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
                    self.settle_meter();
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
                let actor = Actor::meter(format!(
                    "{:.2}% of {} packets lost",
                    100.0 * v.loss(),
                    v.sent
                ));
                if let Err(e) = self
                    .change_as(&actor, |f| f.set_suspect(&k.0, &k.1, true))
                    .await
                {
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
    /// A release that cannot be stored leaves the suspicion as it was, to be tried again.
    async fn release(&self, k: &LinkKey) {
        let result = self
            .suspicion_change(&Actor::meter("hold-down over"), k, |f, s| {
                s.release(k, Instant::now());
                f.set_suspect(&k.0, &k.1, false)
            })
            .await;
        match result {
            Ok(_) => {
                info!(link = %format!("{}:{}", k.0, k.1), "path meter: hold-down over; the link is trusted again")
            }
            Err(e) => {
                warn!(error = %e, link = %format!("{}:{}", k.0, k.1), "ending a suspect link's drain failed; tried again after a hold-down");
                self.meter
                    .suspicions
                    .lock()
                    .expect("suspicions lock")
                    .postpone(k, Instant::now());
            }
        }
    }

    /// [`Controller::change_or_undo`] made of what is decided about link `k`'s suspicion: if the
    /// change is not made, the suspicion is put back as it was.
    async fn suspicion_change(
        &self,
        actor: &Actor,
        k: &LinkKey,
        op: impl FnOnce(
            &mut crate::fabric::Fabric,
            &mut crate::suspicion::Suspicions,
        ) -> Result<Option<sopa_channel::proto::Delta>, FabricError>,
    ) -> Result<ChangeReply, FabricError> {
        let saved = std::sync::Mutex::new(None);
        self.change_or_undo(
            actor,
            |f| {
                let mut s = self.meter.suspicions.lock().expect("suspicions lock");
                *saved.lock().expect("saved lock") = Some(s.save(k));
                op(f, &mut s)
            },
            || {
                if let Some(saved) = saved.lock().expect("saved lock").take() {
                    self.meter
                        .suspicions
                        .lock()
                        .expect("suspicions lock")
                        .restore(k, saved);
                }
            },
        )
        .await
    }

    /// An operator trusts a link (a suspicion ends now, and the meter drains it no more) or
    /// hands it back to the meter. A trust whose change cannot be stored is not taken: the
    /// suspicion, and its drain, stay as they were.
    pub async fn set_trust(
        &self,
        a: &str,
        b: &str,
        trust: bool,
    ) -> Result<ChangeReply, FabricError> {
        self.set_trust_as(&Actor::local(), a, b, trust).await
    }

    /// [`Self::set_trust`], kept with who asked and why.
    pub async fn set_trust_as(
        &self,
        actor: &Actor,
        a: &str,
        b: &str,
        trust: bool,
    ) -> Result<ChangeReply, FabricError> {
        self.fabric.lock().expect("fabric lock").check_link(a, b)?;
        let k = key(a, b);
        let reply = self
            .suspicion_change(actor, &k, |f, s| {
                if s.set_trusted(&k, trust, Instant::now()) {
                    f.set_suspect(&k.0, &k.1, false)
                } else {
                    Ok(None)
                }
            })
            .await?;
        info!(link = %format!("{a}:{b}"), trust, "operator: path meter trust set");
        Ok(reply)
    }
}
