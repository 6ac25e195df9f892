//! The controller's flags, checked whole before anything starts.

use std::{path::PathBuf, time::Duration};

use anyhow::{Result, bail};
use clap::Parser;
use sopa_controller::{
    damping::DampingConfig,
    hedera::HederaConfig,
    server::{self, Options},
    store::{Store, StoreSpec},
    suspicion::SuspicionConfig,
    tomography::JudgeConfig,
    transport::Limits,
};

/// SOPA controller: serves the topology, every link and switch state, and each change as a
/// new version over an mTLS gRPC stream to every agent.
#[derive(Parser)]
#[command(version, about)]
pub struct Args {
    /// Topology spec (TOML: `[topology] kind = "fat-tree", k = 4` or `kind = "modric", ...`).
    #[arg(long, env = "SOPA_TOPOLOGY")]
    pub topology: PathBuf,
    /// Address to serve agents and operators on: HOST:PORT, or unix:PATH for a Unix socket.
    #[arg(long, env = "SOPA_LISTEN", default_value = "0.0.0.0:7470")]
    pub listen: String,
    /// The controller's certificate folder (ca.pem, node.pem, node.key), from `sopactl certs
    /// issue --role controller`.
    #[arg(long, env = "SOPA_CERTS", required_unless_present = "insecure")]
    pub certs: Option<PathBuf>,
    /// Deny list: certificate serials (one per line, hex, as `sopactl certs issue` prints
    /// them) refused at their next handshake; reloaded within a second of every change, which
    /// also closes the revoked certificates' open streams.
    #[arg(long, env = "SOPA_REVOKED", requires = "certs")]
    pub revoked: Option<PathBuf>,
    /// Agents' streams served at once (default: twice the topology's nodes, at least 64).
    #[arg(long, env = "SOPA_MAX_SESSIONS")]
    max_sessions: Option<usize>,
    /// Connections open at once, handshakes included.
    #[arg(long, env = "SOPA_MAX_CONNECTIONS", default_value_t = Limits::default().max_connections)]
    max_connections: usize,
    /// How long a client has to finish its TLS handshake.
    #[arg(long, env = "SOPA_HANDSHAKE_TIMEOUT_MS", default_value_t = Limits::default().handshake_timeout.as_millis() as u64)]
    handshake_timeout_ms: u64,
    /// TLS handshakes one source address may have in progress at once.
    #[arg(long, env = "SOPA_HANDSHAKES_PER_SOURCE", default_value_t = Limits::default().handshakes_per_source)]
    handshakes_per_source: usize,
    /// Serve plaintext, accepting any client. For tests only.
    #[arg(long, env = "SOPA_INSECURE", conflicts_with = "certs")]
    pub insecure: bool,
    /// Serve the stored state even though agents applied newer versions of it (a state file
    /// restored from a backup): it is served under a new epoch, so every agent takes it as a
    /// fresh snapshot. Without it, an agent ahead of the state stops the controller, which says
    /// so, rather than roll the agents back.
    #[arg(long, env = "SOPA_ACCEPT_ROLLBACK")]
    pub accept_rollback: bool,
    /// Where the state (every drain and reported failure, the version) is kept, durable before
    /// any change is announced: file:PATH (one controller; written atomically),
    /// etcd:HOST:PORT[,HOST:PORT...] (two or three replicas: one leads, elected through an
    /// etcd lease, the others wait and serve nothing), or memory (lost on exit).
    #[arg(
        long,
        env = "SOPA_STORE",
        default_value = "file:/var/lib/sopa/controller-state.json"
    )]
    pub store: StoreSpec,
    /// With an etcd store: etcd's CA, to verify its members over TLS (as etcdctl's --cacert).
    #[arg(long, env = "SOPA_ETCD_CA", requires_all = ["etcd_cert", "etcd_key"])]
    pub etcd_ca: Option<PathBuf>,
    /// With an etcd store: this controller's client certificate for etcd (as etcdctl's --cert).
    #[arg(long, env = "SOPA_ETCD_CERT", requires = "etcd_ca")]
    pub etcd_cert: Option<PathBuf>,
    /// With an etcd store: the key of --etcd-cert (as etcdctl's --key).
    #[arg(long, env = "SOPA_ETCD_KEY", requires = "etcd_ca")]
    pub etcd_key: Option<PathBuf>,
    /// With an etcd store: the key prefix of this fabric's state and leader keys.
    #[arg(long, env = "SOPA_ETCD_PREFIX", default_value = "/sopa")]
    pub etcd_prefix: String,
    /// With an etcd store: how long a leader that stopped renewing its lease (dead, hung, cut
    /// off) keeps the leadership; etcd raises values below its minimum (1.5 election timeouts).
    #[arg(long, env = "SOPA_LEASE_TTL_S", default_value_t = 2)]
    pub lease_ttl_s: u64,
    /// With an etcd store: this replica's name in the leader key (default: host name and
    /// --listen).
    #[arg(long, env = "SOPA_NAME")]
    pub name: Option<String>,
    /// Flap damping: a port its switch reports down this many times within
    /// --flap-window-ms is held down (0: no damping).
    #[arg(long, env = "SOPA_FLAP_LIMIT", default_value_t = DampingConfig::default().limit)]
    flap_limit: usize,
    #[arg(long, env = "SOPA_FLAP_WINDOW_MS", default_value_t = DampingConfig::default().window.as_millis() as u64)]
    flap_window_ms: u64,
    /// The first hold of a flapping port; each next one within the window doubles, up to
    /// --flap-max-hold-ms.
    #[arg(long, env = "SOPA_FLAP_HOLD_MS", default_value_t = DampingConfig::default().hold.as_millis() as u64)]
    flap_hold_ms: u64,
    #[arg(long, env = "SOPA_FLAP_MAX_HOLD_MS", default_value_t = DampingConfig::default().max_hold.as_millis() as u64)]
    flap_max_hold_ms: u64,
    /// Heartbeat interval, stated in the first heartbeat of each session: agents consider the
    /// controller gone after three silent ones (or three of their own, if longer).
    #[arg(long, env = "SOPA_HEARTBEAT_MS", default_value_t = 1000)]
    heartbeat_ms: u64,
    /// Hedera's scheduling interval (the paper used 5 s).
    #[arg(long, env = "SOPA_HEDERA_INTERVAL_MS", default_value_t = 1000)]
    hedera_interval_ms: u64,
    /// How long a Hedera pin holds without a newer pin set from this controller.
    #[arg(long, env = "SOPA_PIN_LIFETIME_MS", default_value_t = 5000)]
    pin_lifetime_ms: u64,
    /// How long a host whose agent disconnected stays trusted: switches honour its option for
    /// this long, so a restarting agent (which keeps its datapath) goes unnoticed; after it,
    /// its edge switch neutralizes any option from that host.
    #[arg(long, env = "SOPA_AGENT_GRACE_MS", default_value_t = server::DEFAULT_AGENT_GRACE.as_millis() as u64)]
    agent_grace_ms: u64,
    /// Serve Prometheus metrics (GET /metrics) on this address, e.g. 127.0.0.1:9471 (default:
    /// none).
    #[arg(long, env = "SOPA_METRICS_ADDR")]
    pub metrics_addr: Option<std::net::SocketAddr>,
    /// The path meter: a link whose paths lose more than this fraction of their packets (and
    /// clearly more than their rack pairs' other paths) is drained as suspect.
    #[arg(long, env = "SOPA_LOSS_THRESHOLD", default_value_t = JudgeConfig::default().threshold)]
    loss_threshold: f64,
    /// The path meter: fewer packets lost than this over a window convict no link.
    #[arg(long, env = "SOPA_LOSS_MIN_PACKETS", default_value_t = JudgeConfig::default().min_lost)]
    loss_min_packets: u64,
    /// The path meter's windows, in periods of the hosts' meter (a short one finds heavy loss
    /// fast, a long one light loss surely).
    #[arg(long, env = "SOPA_LOSS_WINDOWS", value_delimiter = ',', default_values_t = JudgeConfig::default().windows)]
    loss_windows: Vec<u32>,
    /// The fabric links' rate: a link whose metered load passes --max-load of it is not judged
    /// (its queue's congestion drops would read as a gray link's).
    #[arg(long, env = "SOPA_LINK_RATE_MBIT", default_value_t = (JudgeConfig::default().link_bps / 1e6) as u64)]
    link_rate_mbit: u64,
    #[arg(long, env = "SOPA_MAX_LOAD", default_value_t = JudgeConfig::default().max_load)]
    max_load: f64,
    /// The path meter's period of alternate marking: every host agent adopts it (and the
    /// epoch its periods are numbered from) from this controller's snapshot; a report for
    /// another period length is refused.
    #[arg(long, env = "SOPA_CONTROLLER_METER_PERIOD_MS", default_value_t = server::DEFAULT_METER_PERIOD.as_millis() as u64)]
    meter_period_ms: u64,
    /// How long a suspect link stays drained the first time; each conviction soon after its
    /// release doubles it, up to --suspect-max-hold-ms.
    #[arg(long, env = "SOPA_SUSPECT_HOLD_MS", default_value_t = SuspicionConfig::default().hold.as_millis() as u64)]
    suspect_hold_ms: u64,
    #[arg(long, env = "SOPA_SUSPECT_MAX_HOLD_MS", default_value_t = SuspicionConfig::default().max_hold.as_millis() as u64)]
    suspect_max_hold_ms: u64,
    /// The most links the path meter drains at once (0: the meter drains nothing, it only
    /// reports).
    #[arg(long, env = "SOPA_MAX_SUSPECTS", default_value_t = SuspicionConfig::default().max_suspects)]
    max_suspects: usize,
}

impl Args {
    /// How the controller runs, from every flag; an error names the bad flag.
    pub fn options(&self) -> Result<Options> {
        if self.heartbeat_ms == 0 {
            bail!("--heartbeat-ms must be at least 1");
        }
        if self.hedera_interval_ms == 0 || self.pin_lifetime_ms <= self.hedera_interval_ms {
            bail!(
                "--hedera-interval-ms {} and --pin-lifetime-ms {}: the interval must be at least 1 and pins must outlive it",
                self.hedera_interval_ms,
                self.pin_lifetime_ms
            );
        }
        if self.flap_limit > 0
            && (self.flap_hold_ms == 0 || self.flap_max_hold_ms < self.flap_hold_ms)
        {
            bail!(
                "--flap-hold-ms {} and --flap-max-hold-ms {}: a hold must be at least 1 ms and the maximum at least the first hold",
                self.flap_hold_ms,
                self.flap_max_hold_ms
            );
        }
        if !(self.loss_threshold > 0.0 && self.loss_threshold < 1.0) {
            bail!(
                "--loss-threshold {}: give a fraction between 0 and 1 (0.003 is 0.3%)",
                self.loss_threshold
            );
        }
        if self.loss_windows.is_empty() || self.loss_windows.iter().any(|w| !(1..=240).contains(w))
        {
            bail!(
                "--loss-windows {:?}: give one or more window lengths of 1 to 240 periods, e.g. 4,16",
                self.loss_windows
            );
        }
        if self.link_rate_mbit == 0 || !(self.max_load > 0.0 && self.max_load <= 1.0) {
            bail!(
                "--link-rate-mbit {} and --max-load {}: give the links' rate in Mbit/s and a share of it between 0 and 1",
                self.link_rate_mbit,
                self.max_load
            );
        }
        if !(10..=60_000).contains(&self.meter_period_ms) {
            bail!(
                "--meter-period-ms {}: give 10 to 60000 (the hosts' periods of alternate marking; 250 by default)",
                self.meter_period_ms
            );
        }
        if self.suspect_hold_ms == 0 || self.suspect_max_hold_ms < self.suspect_hold_ms {
            bail!(
                "--suspect-hold-ms {} and --suspect-max-hold-ms {}: a hold must be at least 1 ms and the maximum at least the first hold",
                self.suspect_hold_ms,
                self.suspect_max_hold_ms
            );
        }
        if self.lease_ttl_s == 0 {
            bail!("--lease-ttl-s must be at least 1");
        }
        if self.max_connections == 0
            || self.handshakes_per_source == 0
            || self.handshake_timeout_ms == 0
            || self.max_sessions == Some(0)
        {
            bail!(
                "--max-connections, --handshakes-per-source, --handshake-timeout-ms and --max-sessions must be at least 1"
            );
        }
        Ok(Options {
            heartbeat: Duration::from_millis(self.heartbeat_ms),
            hedera: HederaConfig {
                interval: Duration::from_millis(self.hedera_interval_ms),
                pin_lifetime: Duration::from_millis(self.pin_lifetime_ms),
                ..HederaConfig::default()
            },
            agent_grace: Duration::from_millis(self.agent_grace_ms),
            max_sessions: self.max_sessions,
            limits: Limits {
                max_connections: self.max_connections,
                handshake_timeout: Duration::from_millis(self.handshake_timeout_ms),
                handshakes_per_source: self.handshakes_per_source,
            },
            // Opened (and for etcd, elected) by the start, once every flag is checked.
            store: Store::Memory,
            damping: DampingConfig {
                limit: self.flap_limit,
                window: Duration::from_millis(self.flap_window_ms),
                hold: Duration::from_millis(self.flap_hold_ms),
                max_hold: Duration::from_millis(self.flap_max_hold_ms),
            },
            judge: JudgeConfig {
                threshold: self.loss_threshold,
                min_lost: self.loss_min_packets,
                windows: self.loss_windows.clone(),
                link_bps: self.link_rate_mbit as f64 * 1e6,
                max_load: self.max_load,
                ..JudgeConfig::default()
            },
            meter_period: Duration::from_millis(self.meter_period_ms),
            suspicion: SuspicionConfig {
                hold: Duration::from_millis(self.suspect_hold_ms),
                max_hold: Duration::from_millis(self.suspect_max_hold_ms),
                max_suspects: self.max_suspects,
            },
        })
    }
}

impl Args {
    /// This replica's name in the leader key.
    pub fn replica_name(&self) -> String {
        self.name.clone().unwrap_or_else(|| {
            let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
                .map(|h| h.trim().to_owned())
                .unwrap_or_else(|_| "controller".into());
            format!("{host}/{}", self.listen)
        })
    }
}
