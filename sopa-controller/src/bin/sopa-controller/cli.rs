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
use sopa_ops::{allow::AllowList, duration::Dur};

/// SOPA controller: serves the topology, every link and switch state, and each change as a
/// new version over an mTLS gRPC stream to every agent.
#[derive(Parser)]
#[command(version, about, after_help = sopa_ops::exit::help())]
pub struct Args {
    #[command(flatten)]
    pub log: sopa_ops::logging::LogArgs,
    /// Print a shell completion script and exit (e.g. `sopa-controller --completions bash >
    /// /usr/share/bash-completion/completions/sopa-controller`).
    #[arg(long, value_enum)]
    pub completions: Option<sopa_ops::cli::Shell>,
    /// Write the man page into DIR and exit (the packages' build).
    #[arg(long, hide = true)]
    pub man_dir: Option<PathBuf>,
    /// Topology spec (TOML: `[topology] kind = "fat-tree", k = 4` or `kind = "modric", ...`).
    #[arg(long, env = "SOPA_TOPOLOGY", required_unless_present_any = ["completions", "man_dir"])]
    pub topology: Option<PathBuf>,
    /// Address to serve agents and operators on: HOST:PORT, or unix:PATH for a Unix socket.
    #[arg(long, env = "SOPA_LISTEN", default_value = "0.0.0.0:7470")]
    pub listen: String,
    /// The controller's certificate folder (ca.pem, node.pem, node.key), from `sopactl certs
    /// issue --role controller`.
    #[arg(long, env = "SOPA_CERTS", required_unless_present_any = ["insecure", "completions", "man_dir"])]
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
    #[arg(long, env = "SOPA_HANDSHAKE_TIMEOUT", alias = "handshake-timeout-ms", default_value_t = Dur(Limits::default().handshake_timeout))]
    handshake_timeout: Dur,
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
    /// --flap-window is held down (0: no damping).
    #[arg(long, env = "SOPA_FLAP_LIMIT", default_value_t = DampingConfig::default().limit)]
    flap_limit: usize,
    /// Flap damping: the window --flap-limit counts a port's downs in (30s, 1m; a bare number
    /// is milliseconds).
    #[arg(long, env = "SOPA_FLAP_WINDOW", alias = "flap-window-ms", default_value_t = Dur(DampingConfig::default().window))]
    flap_window: Dur,
    /// The first hold of a flapping port; each next one within the window doubles, up to
    /// --flap-max-hold.
    #[arg(long, env = "SOPA_FLAP_HOLD", alias = "flap-hold-ms", default_value_t = Dur(DampingConfig::default().hold))]
    flap_hold: Dur,
    /// Flap damping: the longest hold of a flapping port.
    #[arg(long, env = "SOPA_FLAP_MAX_HOLD", alias = "flap-max-hold-ms", default_value_t = Dur(DampingConfig::default().max_hold))]
    flap_max_hold: Dur,
    /// Heartbeat interval, stated in the first heartbeat of each session: agents consider the
    /// controller gone after three silent ones (or three of their own, if longer).
    #[arg(long, env = "SOPA_HEARTBEAT", alias = "heartbeat-ms", default_value_t = Dur::ms(1000))]
    heartbeat: Dur,
    /// Hedera's scheduling interval (the paper used 5 s).
    #[arg(long, env = "SOPA_HEDERA_INTERVAL", alias = "hedera-interval-ms", default_value_t = Dur::ms(1000))]
    hedera_interval: Dur,
    /// How long a Hedera pin holds without a newer pin set from this controller.
    #[arg(long, env = "SOPA_PIN_LIFETIME", alias = "pin-lifetime-ms", default_value_t = Dur::ms(5000))]
    pin_lifetime: Dur,
    /// How long a host whose agent disconnected stays trusted: switches honour its option for
    /// this long, so a restarting agent (which keeps its datapath) goes unnoticed; after it,
    /// its edge switch neutralizes any option from that host.
    #[arg(long, env = "SOPA_AGENT_GRACE", alias = "agent-grace-ms", default_value_t = Dur(server::DEFAULT_AGENT_GRACE))]
    agent_grace: Dur,
    /// Serve the metrics and health endpoints (GET /metrics, /healthz, /readyz) on this
    /// address, e.g. 127.0.0.1:9471 (default: none). A standby replica serves them too (ready
    /// only once it leads). Off loopback it needs --metrics-allow or --metrics-client-ca.
    #[arg(long, env = "SOPA_METRICS_ADDR")]
    pub metrics_addr: Option<std::net::SocketAddr>,
    /// Who may reach the endpoints besides loopback: networks, comma-separated
    /// (10.0.0.0/8,2001:db8::/32). Others are answered 403 (over TLS: closed unanswered).
    #[arg(long, env = "SOPA_METRICS_ALLOW", default_value = "")]
    pub metrics_allow: AllowList,
    #[command(flatten)]
    pub metrics_tls: sopa_ops::tls::TlsFlags,
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
    /// The share of --link-rate-mbit (0 to 1) past which a link's metered load leaves it
    /// unjudged.
    #[arg(long, env = "SOPA_MAX_LOAD", default_value_t = JudgeConfig::default().max_load)]
    max_load: f64,
    /// The path meter's period of alternate marking: every host agent adopts it (and the
    /// epoch its periods are numbered from) from this controller's snapshot; a report for
    /// another period length is refused.
    #[arg(long, env = "SOPA_CONTROLLER_METER_PERIOD", alias = "meter-period-ms", default_value_t = Dur(server::DEFAULT_METER_PERIOD))]
    meter_period: Dur,
    /// How long a suspect link stays drained the first time; each conviction soon after its
    /// release doubles it, up to --suspect-max-hold.
    #[arg(long, env = "SOPA_SUSPECT_HOLD", alias = "suspect-hold-ms", default_value_t = Dur(SuspicionConfig::default().hold))]
    suspect_hold: Dur,
    /// The longest a suspect link stays drained.
    #[arg(long, env = "SOPA_SUSPECT_MAX_HOLD", alias = "suspect-max-hold-ms", default_value_t = Dur(SuspicionConfig::default().max_hold))]
    suspect_max_hold: Dur,
    /// The most links the path meter drains at once (0: the meter drains nothing, it only
    /// reports).
    #[arg(long, env = "SOPA_MAX_SUSPECTS", default_value_t = SuspicionConfig::default().max_suspects)]
    max_suspects: usize,
}

impl Args {
    /// How the controller runs, from every flag; an error names the bad flag.
    pub fn options(&self) -> Result<Options> {
        if self.heartbeat.0 < Duration::from_millis(1) {
            bail!("--heartbeat {}: give at least 1ms", self.heartbeat);
        }
        if self.hedera_interval.0.is_zero() || self.pin_lifetime <= self.hedera_interval {
            bail!(
                "--hedera-interval {} and --pin-lifetime {}: the interval must be at least 1 and pins must outlive it",
                self.hedera_interval,
                self.pin_lifetime
            );
        }
        if self.flap_limit > 0
            && (self.flap_hold.0.is_zero() || self.flap_max_hold < self.flap_hold)
        {
            bail!(
                "--flap-hold {} and --flap-max-hold {}: a hold must be at least 1 ms and the maximum at least the first hold",
                self.flap_hold,
                self.flap_max_hold
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
        if !(Dur::ms(10)..=Dur::ms(60_000)).contains(&self.meter_period)
            || !self.meter_period.is_whole_ms()
        {
            bail!(
                "--meter-period {}: give whole milliseconds from 10ms to 60s (the hosts' periods of alternate marking; 250ms by default)",
                self.meter_period
            );
        }
        if self.suspect_hold.0.is_zero() || self.suspect_max_hold < self.suspect_hold {
            bail!(
                "--suspect-hold {} and --suspect-max-hold {}: a hold must be at least 1 ms and the maximum at least the first hold",
                self.suspect_hold,
                self.suspect_max_hold
            );
        }
        if self.lease_ttl_s == 0 {
            bail!("--lease-ttl-s must be at least 1");
        }
        if self.max_connections == 0
            || self.handshakes_per_source == 0
            || self.handshake_timeout.0.is_zero()
            || self.max_sessions == Some(0)
        {
            bail!(
                "--max-connections, --handshakes-per-source, --handshake-timeout and --max-sessions must be at least 1"
            );
        }
        Ok(Options {
            heartbeat: self.heartbeat.0,
            hedera: HederaConfig {
                interval: self.hedera_interval.0,
                pin_lifetime: self.pin_lifetime.0,
                ..HederaConfig::default()
            },
            agent_grace: self.agent_grace.0,
            max_sessions: self.max_sessions,
            limits: Limits {
                max_connections: self.max_connections,
                handshake_timeout: self.handshake_timeout.0,
                handshakes_per_source: self.handshakes_per_source,
            },
            // Opened (and for etcd, elected) by the start, once every flag is checked.
            store: Store::Memory,
            damping: DampingConfig {
                limit: self.flap_limit,
                window: self.flap_window.0,
                hold: self.flap_hold.0,
                max_hold: self.flap_max_hold.0,
            },
            judge: JudgeConfig {
                threshold: self.loss_threshold,
                min_lost: self.loss_min_packets,
                windows: self.loss_windows.clone(),
                link_bps: self.link_rate_mbit as f64 * 1e6,
                max_load: self.max_load,
                ..JudgeConfig::default()
            },
            meter_period: self.meter_period.0,
            suspicion: SuspicionConfig {
                hold: self.suspect_hold.0,
                max_hold: self.suspect_max_hold.0,
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

#[cfg(test)]
mod tests {
    use clap::CommandFactory as _;

    use super::*;

    #[test]
    fn the_command_line_is_consistent_and_every_flag_has_help() {
        Args::command().debug_assert();
        assert_eq!(
            sopa_ops::cli::undocumented(&Args::command()),
            Vec::<String>::new()
        );
    }

    #[test]
    fn completions_and_man_pages_need_no_other_flag() {
        for args in [
            &["sopa-controller", "--completions", "bash"][..],
            &["sopa-controller", "--man-dir", "/tmp/x"][..],
        ] {
            Args::try_parse_from(args).unwrap_or_else(|e| panic!("{args:?}: {e}"));
        }
    }

    #[test]
    fn durations_take_units_and_the_old_flags_milliseconds() {
        let args = Args::try_parse_from([
            "sopa-controller",
            "--topology",
            "t.toml",
            "--insecure",
            "--heartbeat-ms",
            "250",
            "--flap-window",
            "1m",
        ])
        .unwrap();
        assert_eq!(args.heartbeat, Dur::ms(250));
        assert_eq!(args.flap_window, Dur::ms(60_000));
        let o = args.options().unwrap();
        assert_eq!(o.heartbeat, Duration::from_millis(250));
    }
}
