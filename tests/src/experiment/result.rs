//! One mode's results as the benchmark prints them and writes them to JSON.

use serde::Serialize;

#[derive(Serialize, serde::Deserialize)]
pub struct ModeResult {
    pub mode: String,
    pub flows: usize,
    pub mean: f64,
    pub min: f64,
    pub p5: f64,
    pub p99: f64,
    /// Jain's fairness index over every flow's throughput (1: all equal).
    #[serde(default)]
    pub jain: f64,
    /// The mean of each round (seed): their spread says which differences are noise.
    #[serde(default)]
    pub round_means: Vec<f64>,
    pub fct_mean_s: f64,
    pub fct_p99_s: f64,
    /// Flows of at most [`super::SHORT_FLOW_BYTES`]: how many, and their mean and p99 FCT.
    #[serde(default)]
    pub short_flows: usize,
    #[serde(default)]
    pub short_fct_mean_s: f64,
    #[serde(default)]
    pub short_fct_p99_s: f64,
    pub reordered_pct: f64,
    pub fast_retransmits: u64,
    pub timeouts: u64,
    pub retrans_segs: u64,
    /// Packets dropped by the links' queues (every switch and host interface).
    pub queue_drops: u64,
    /// Bytes each measured core link carried upward during the mode (packets per path).
    pub core_links: Vec<(String, u64)>,
    /// The busiest core link's bytes over the least busy loaded one's ([`super::core_balance`]);
    /// infinite when none carried load (JSON writes it as null).
    #[serde(deserialize_with = "null_is_infinite")]
    pub core_links_max_over_min: f64,
    /// Core links that carried no load ([`super::core_balance`]): a single-path mode's unused links.
    #[serde(default)]
    pub core_links_idle: usize,
    /// The CPUs' idle time while the mode ran, in %: the headroom the fidelity check asks for.
    /// Time the hypervisor took (steal) is not headroom: the machine wanted it and did not get it.
    pub idle_cpu_pct: f64,
    /// The share of the CPUs the hypervisor took while the mode ran, in %.
    #[serde(default)]
    pub steal_cpu_pct: f64,
    /// Busy CPU-seconds of the whole machine (every namespace: senders, switches, shapers,
    /// receivers, agents) per GB the flows moved, while the mode ran.
    #[serde(default)]
    pub cpu_s_per_gb: f64,
    /// MPTCP modes: the mean number of subflows added beside the first, per flow.
    #[serde(default)]
    pub mptcp_subflows_mean: Option<f64>,
    pub per_flow: Vec<(String, String, f64, f64, u32)>,
}

fn null_is_infinite<'de, D: serde::Deserializer<'de>>(d: D) -> std::result::Result<f64, D::Error> {
    use serde::Deserialize as _;
    Ok(Option::<f64>::deserialize(d)?.unwrap_or(f64::INFINITY))
}
