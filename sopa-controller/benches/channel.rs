//! `cargo xtask bench channel`: one `sopa-controller` process and N simulated agents on
//! loopback, each on its own connection (N = 16, 432, 3456: the hosts of Fat-Tree k = 4, 12,
//! 24). A link failure is pushed through the operator API; the table gives p50 / p99 / max of
//! the time from that call until each agent has applied the new version (the moment before it
//! sends its ACK), over several rounds, and the controller's memory. Every ACK is then
//! confirmed at the controller, untimed.
//!
//! The failover row: two controller replicas on a cluster of three etcd members (the
//! distribution's `etcd`), mutual TLS throughout as deployed (the fabric's CA, the
//! controller's certificate, one per agent), every agent given both replicas; the leader is
//! killed (SIGKILL: its lease runs out, nothing resigns), and the row gives p50 / p99 / max of
//! the time from the kill until each agent's stream to the new leader was open again (its TLS
//! handshake included; up to date, it needs no snapshot), and the time until the new leader
//! served. A change through the new leader then reaches every agent, untimed. Then etcd's own
//! leader is killed: the row after gives the time until a change through the controller was
//! stored again, and until every agent had applied it.

use std::{
    process::{Child, Command, Stdio},
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use sopa_channel::{
    client::{self, Applier, ClientConfig},
    identity::{Identity, Role as IdRole},
    proto::{
        Delta, LinkChange, LinkRef, Role, Snapshot, StatusRequest,
        control::control_client::ControlClient,
    },
    tls,
};
use sopa_controller::certs::{self, IssueOptions};
use tokio::sync::watch;

/// A simulated agent: checks version continuity like a real one and records when it applied.
struct Sim {
    epoch: u64,
    version: u64,
    index: usize,
    applied: Arc<Mutex<Vec<(u64, Instant)>>>,
    /// When each agent's stream last opened.
    connected: Arc<Mutex<Vec<Option<Instant>>>>,
}

impl Applier for Sim {
    async fn snapshot(&mut self, s: &Snapshot) -> Result<(), String> {
        self.epoch = s.epoch;
        self.version = s.version;
        self.applied.lock().unwrap()[self.index] = (s.version, Instant::now());
        Ok(())
    }

    async fn delta(&mut self, d: &Delta) -> Result<(), (String, bool)> {
        if d.epoch != self.epoch || d.base_version != self.version {
            return Err(("gap".into(), true));
        }
        self.version = d.version;
        self.applied.lock().unwrap()[self.index] = (d.version, Instant::now());
        Ok(())
    }

    fn position(&self) -> (u64, u64) {
        (self.epoch, self.version)
    }

    fn connected(&mut self, up: bool) {
        if up {
            self.connected.lock().unwrap()[self.index] = Some(Instant::now());
        }
    }
}

struct ControllerProcess(Child);

impl Drop for ControllerProcess {
    fn drop(&mut self) {
        // SAFETY: signalling the child we started, by its PID.
        unsafe { libc::kill(self.0.id() as i32, libc::SIGTERM) };
        let _ = self.0.wait();
    }
}

fn status_kib(pid: u32, field: &str) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap_or_default()
        .lines()
        .find_map(|l| {
            l.strip_prefix(field)
                .map(|v| v.trim().trim_end_matches(" kB").trim().parse().unwrap_or(0))
        })
        .unwrap_or(0)
}

/// The CPU time process `pid` has used (user and system), in milliseconds.
fn cpu_ms(pid: u32) -> f64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    // The fields after the command name, which ends at the last ')'.
    let fields: Vec<&str> = stat
        .rsplit_once(')')
        .map(|(_, rest)| rest.split_whitespace().collect())
        .unwrap_or_default();
    // utime and stime are fields 14 and 15 of the line, 12 and 13 after the name.
    let ticks: u64 = [11, 12]
        .iter()
        .filter_map(|&i| fields.get(i).and_then(|v| v.parse::<u64>().ok()))
        .sum();
    // SAFETY: sysconf reads a constant of the system.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as f64;
    ticks as f64 * 1e3 / hz
}

fn raise_fd_limit() {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: get/setrlimit on a struct we own.
    unsafe {
        libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim);
        lim.rlim_cur = lim.rlim_max;
        libc::setrlimit(libc::RLIMIT_NOFILE, &lim);
    }
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i.min(sorted.len() - 1)]
}

/// The command line (`cargo xtask bench channel -- --help`).
#[derive(clap::Parser)]
#[command(
    name = "bench channel",
    about = "A change pushed to every agent of a fabric: latency, the controller's memory and CPU, and a leader's failover"
)]
struct Cli {
    /// Link failures pushed per fabric size.
    #[arg(long, default_value_t = 5)]
    rounds: usize,
    /// The smallest fabric only, to check the benchmark runs.
    #[arg(long)]
    smoke: bool,
    /// The failover's etcd lease, seconds.
    #[arg(long, default_value_t = 2)]
    lease_ttl_s: u64,
    /// Passed by `cargo bench`.
    #[arg(long, hide = true)]
    bench: bool,
}

fn main() {
    let cli = <Cli as clap::Parser>::parse();
    raise_fd_limit();
    let rounds = cli.rounds;
    let bin = std::env::current_exe()
        .unwrap()
        .parent()
        .unwrap()
        .parent()
        .unwrap()
        .join("sopa-controller");
    assert!(
        bin.exists(),
        "{} is missing (cargo bench builds it)",
        bin.display()
    );
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    println!(
        "{:<14} {:>6} {:>8} {:>10} {:>10} {:>10} {:>12} {:>12} {:>14} {:>12}",
        "fabric",
        "agents",
        "rounds",
        "p50 ms",
        "p99 ms",
        "max ms",
        "ctl RSS MiB",
        "ctl peak MiB",
        "ctl CPU ms/chg",
        "all in s"
    );
    // `--smoke`: the smallest fabric only, to check the benchmark runs.
    let sizes: &[u32] = if cli.smoke { &[4] } else { &[4, 12, 24] };
    for &k in sizes {
        runtime.block_on(run(&bin, k, rounds));
    }
    println!(
        "(time from the operator's link-down call until each agent had applied the delta, just before its ACK; every ACK then confirmed at the controller, untimed. ctl CPU: the controller's CPU time per change, with what it spends as long without changes taken off (heartbeats); all in: until every agent's stream first opened)"
    );
    let k = *sizes.last().unwrap();
    let ttl = cli.lease_ttl_s;
    println!();
    println!(
        "{:<14} {:>6} {:>8} {:>12} {:>10} {:>10} {:>10}",
        "failover", "agents", "lease s", "leader ms", "p50 ms", "p99 ms", "max ms"
    );
    runtime.block_on(failover(&bin, k, ttl));
    println!(
        "(two replicas on a cluster of three etcd members, mutual TLS throughout (a certificate per agent); the leading replica SIGKILLed; times from the kill until the new leader served, and until each agent's stream to it was open again, its TLS handshake included; a change then reached every agent, untimed)"
    );
    println!();
    println!(
        "{:<14} {:>6} {:>8} {:>12} {:>10} {:>10} {:>10}",
        "etcd leader", "agents", "members", "stored ms", "p50 ms", "p99 ms", "max ms"
    );
    if let Some(row) = ETCD_ROW.lock().unwrap().take() {
        println!("{row}");
    }
    println!(
        "(then etcd's own leader SIGKILLed while the controller serves: times from the kill until a change through the controller was stored (tried again until the two members left elected a leader), and until each agent had applied it)"
    );
}

/// What the simulated agents applied, when each last connected, and their stop switch.
type Agents = (
    Arc<Mutex<Vec<(u64, Instant)>>>,
    Arc<Mutex<Vec<Option<Instant>>>>,
    watch::Sender<bool>,
);

/// Starts `n` simulated agents (h0, h1, ...) on `controllers`, each on its own connection
/// (with its own certificate, where `tls` gives them).
fn spawn_agents(n: usize, controllers: &str, tls: Option<Vec<tls::ClientTls>>) -> Agents {
    let applied = Arc::new(Mutex::new(vec![(0u64, Instant::now()); n]));
    let connected = Arc::new(Mutex::new(vec![None; n]));
    let (stop, stopped) = watch::channel(false);
    let mut tls = tls.map(Vec::into_iter);
    for i in 0..n {
        let mut cfg = ClientConfig::new(controllers, format!("h{i}"), Role::Host);
        cfg.tls = tls.as_mut().and_then(Iterator::next);
        cfg.heartbeat = Duration::from_secs(1);
        let mut sim = Sim {
            epoch: 0,
            version: 0,
            index: i,
            applied: Arc::clone(&applied),
            connected: Arc::clone(&connected),
        };
        let stopped = stopped.clone();
        tokio::spawn(async move { client::run(cfg, &mut sim, stopped).await });
    }
    (applied, connected, stop)
}

/// A run's folder, removed when the run ends, failed runs included.
struct RemoveOnDrop(std::path::PathBuf);

impl Drop for RemoveOnDrop {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// The child processes of a run, killed on drop.
struct Children(Vec<Child>);

impl Drop for Children {
    fn drop(&mut self) {
        for c in &mut self.0 {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// One etcd member of the bench's cluster: its client port, and its process.
struct Member {
    name: String,
    client: u16,
    log: std::path::PathBuf,
}

/// Starts a cluster of `n` etcd members in `dir`; returns them, their processes pushed onto
/// `children`, once each serves.
async fn etcd_cluster(dir: &std::path::Path, n: usize, children: &mut Children) -> Vec<Member> {
    let ports: Vec<(u16, u16)> = (0..n).map(|_| (free_port(), free_port())).collect();
    let cluster = ports
        .iter()
        .enumerate()
        .map(|(i, (_, peer))| format!("m{i}=http://127.0.0.1:{peer}"))
        .collect::<Vec<_>>()
        .join(",");
    let mut members = Vec::new();
    for (i, (client, peer)) in ports.iter().enumerate() {
        let log = dir.join(format!("etcd-m{i}.log"));
        let child = Command::new("etcd")
            .args([
                "--name",
                &format!("m{i}"),
                "--data-dir",
                dir.join(format!("etcd-m{i}")).to_str().unwrap(),
                "--listen-client-urls",
                &format!("http://127.0.0.1:{client}"),
                "--advertise-client-urls",
                &format!("http://127.0.0.1:{client}"),
                "--listen-peer-urls",
                &format!("http://127.0.0.1:{peer}"),
                "--initial-advertise-peer-urls",
                &format!("http://127.0.0.1:{peer}"),
                "--initial-cluster",
                &cluster,
                "--initial-cluster-state",
                "new",
                "--logger",
                "zap",
            ])
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).unwrap())
            .spawn()
            .expect("etcd is missing: `cargo xtask setup` installs it (Debian's etcd-server)");
        children.0.push(child);
        members.push(Member {
            name: format!("m{i}"),
            client: *client,
            log,
        });
    }
    let t = Instant::now();
    while !members.iter().all(|m| {
        std::fs::read_to_string(&m.log)
            .unwrap_or_default()
            .contains("serving client traffic")
    }) {
        assert!(t.elapsed() < Duration::from_secs(60), "etcd did not serve");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    members
}

/// The index in `members` of the cluster's leader now.
async fn etcd_leader(members: &[Member]) -> usize {
    let t = Instant::now();
    loop {
        for (i, m) in members.iter().enumerate() {
            let Ok(mut c) =
                etcd_client::Client::connect([format!("127.0.0.1:{}", m.client)], None).await
            else {
                continue;
            };
            if let Ok(s) = c.status().await
                && s.leader() != 0
                && s.header().is_some_and(|h| h.member_id() == s.leader())
            {
                return i;
            }
        }
        assert!(t.elapsed() < Duration::from_secs(30), "etcd has no leader");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// A certificate folder of `role`/`node` under `dir`, issued by the CA in `dir/ca`.
fn issue(dir: &std::path::Path, role: IdRole, node: &str) -> std::path::PathBuf {
    let out = dir.join(format!("{role}-{node}"));
    certs::issue(
        &dir.join("ca"),
        &Identity::new(role, node).unwrap(),
        &out,
        &IssueOptions::default(),
    )
    .unwrap();
    out
}

async fn failover(bin: &std::path::Path, k: u32, ttl: u64) {
    let n = (k * k * k / 4) as usize;
    let dir = std::env::temp_dir().join(format!("sopa-bench-failover-{}", std::process::id()));
    let _remove = RemoveOnDrop(dir.clone());
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let spec = dir.join(format!("k{k}.toml"));
    std::fs::write(&spec, format!("[topology]\nkind = \"fat-tree\"\nk = {k}\n")).unwrap();
    // Mutual TLS as deployed: the fabric's CA, the controllers' certificate, one per agent.
    certs::init(&dir.join("ca"), certs::CA_DAYS).unwrap();
    let ctl = issue(&dir, IdRole::Controller, "sopa-controller");
    let operator =
        tls::client_config(&issue(&dir, IdRole::Operator, "bench"), "localhost").unwrap();
    let agents_tls: Vec<tls::ClientTls> = (0..n)
        .map(|i| {
            tls::client_config(&issue(&dir, IdRole::Host, &format!("h{i}")), "localhost").unwrap()
        })
        .collect();
    let mut children = Children(Vec::new());
    let members = etcd_cluster(&dir, 3, &mut children).await;
    let store = format!(
        "etcd:{}",
        members
            .iter()
            .map(|m| format!("127.0.0.1:{}", m.client))
            .collect::<Vec<_>>()
            .join(",")
    );
    let listens = [free_port(), free_port()].map(|p| format!("127.0.0.1:{p}"));
    let replica = |i: usize| {
        Command::new(bin)
            .args([
                "--topology",
                spec.to_str().unwrap(),
                "--listen",
                &listens[i],
                "--certs",
                ctl.to_str().unwrap(),
                "--store",
                &store,
                "--name",
                &format!("r{i}"),
                "--lease-ttl-s",
                &ttl.to_string(),
            ])
            .env("SOPA_LOG", "warn")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap()
    };
    let urls: Vec<String> = listens.iter().map(|l| format!("https://{l}")).collect();
    let control_of = |url: String| {
        let operator = operator.clone();
        async move {
            loop {
                if let Ok(c) = client::connect(&url, Some(&operator)).await {
                    break ControlClient::new(c);
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }
    };
    // r0 first: it leads once it serves; then r1, which waits.
    let r0 = children.0.len();
    children.0.push(replica(0));
    let mut control = control_of(urls[0].clone()).await;
    children.0.push(replica(1));
    let list = urls.join(",");
    let (applied, connected, stop) = spawn_agents(n, &list, Some(agents_tls));
    let all_at = |v: u64| applied.lock().unwrap().iter().all(|(ver, _)| *ver >= v);
    let t = Instant::now();
    while !all_at(1) {
        assert!(
            t.elapsed() < Duration::from_secs(300),
            "agents did not all connect"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let link = |down: bool| LinkChange {
        link: Some(LinkRef {
            a: "e0".into(),
            b: "a0".into(),
        }),
        down,
        ..Default::default()
    };
    let version = control
        .set_link(link(true))
        .await
        .unwrap()
        .into_inner()
        .version;
    while !all_at(version) {
        assert!(
            t.elapsed() < Duration::from_secs(300),
            "not every agent got version {version}"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    // The leader dies without a word.
    let _ = children.0[r0].kill();
    let _ = children.0[r0].wait();
    let killed = Instant::now();
    let mut control = {
        let url = urls[1].clone();
        let operator = operator.clone();
        loop {
            if let Ok(c) = client::connect(&url, Some(&operator)).await {
                let mut c = ControlClient::new(c);
                if c.status(StatusRequest {}).await.is_ok() {
                    break c;
                }
            }
            assert!(
                killed.elapsed() < Duration::from_secs(60),
                "no replica took over"
            );
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    };
    let served = killed.elapsed().as_secs_f64() * 1e3;
    let back = |c: &Vec<Option<Instant>>| c.iter().all(|t| t.is_some_and(|t| t > killed));
    while !back(&connected.lock().unwrap()) {
        assert!(
            killed.elapsed() < Duration::from_secs(300),
            "not every agent came back"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let mut times: Vec<f64> = connected
        .lock()
        .unwrap()
        .iter()
        .map(|t| t.unwrap().duration_since(killed).as_secs_f64() * 1e3)
        .collect();
    times.sort_by(f64::total_cmp);
    // Up to date across the failover, and the new leader's next change reaches everyone.
    let next = control
        .set_link(link(false))
        .await
        .unwrap()
        .into_inner()
        .version;
    assert_eq!(next, version + 1, "the versions continue across leaders");
    let t = Instant::now();
    while !all_at(next) {
        assert!(
            t.elapsed() < Duration::from_secs(120),
            "not every agent got version {next}"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    println!(
        "{:<14} {:>6} {:>8} {:>12.0} {:>10.0} {:>10.0} {:>10.0}",
        format!("Fat-Tree k={k}"),
        n,
        ttl,
        served,
        percentile(&times, 0.5),
        percentile(&times, 0.99),
        times.last().copied().unwrap_or(0.0),
    );

    // etcd's own leader dies: the next change is stored once the other two members elect
    // one. The first replica, killed above, is back as the standby: a replica whose lease
    // ran out meanwhile (a short lease can, while etcd elects) hands over to it, as in
    // production under its supervisor. Changes are tried on either until one is stored.
    children.0.push(replica(0));
    let leader = etcd_leader(&members).await;
    let _ = children.0[leader].kill();
    let _ = children.0[leader].wait();
    let killed = Instant::now();
    let mut tries = 0u32;
    let mut last = String::new();
    let (version, by) = 'stored: loop {
        for (i, url) in urls.iter().enumerate() {
            tries += 1;
            if let Ok(c) = client::connect(url, Some(&operator)).await {
                match ControlClient::new(c).set_link(link(true)).await {
                    Ok(r) => break 'stored (r.into_inner().version, i),
                    Err(e) => last = e.message().to_owned(),
                }
            }
        }
        assert!(
            killed.elapsed() < Duration::from_secs(60),
            "no change stored within 60 s of etcd's leader dying: {last}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    drop(control);
    let stored = killed.elapsed().as_secs_f64() * 1e3;
    while !all_at(version) {
        assert!(
            killed.elapsed() < Duration::from_secs(120),
            "not every agent got version {version} after etcd's leader died"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let mut times: Vec<f64> = applied
        .lock()
        .unwrap()
        .iter()
        .map(|(_, at)| at.duration_since(killed).as_secs_f64() * 1e3)
        .collect();
    times.sort_by(f64::total_cmp);
    ETCD_ROW.lock().unwrap().replace(format!(
        "{:<14} {:>6} {:>8} {:>12.0} {:>10.0} {:>10.0} {:>10.0}   ({} killed; stored through r{by} after {tries} tries)",
        format!("Fat-Tree k={k}"),
        n,
        3,
        stored,
        percentile(&times, 0.5),
        percentile(&times, 0.99),
        times.last().copied().unwrap_or(0.0),
        members[leader].name,
    ));
    let _ = stop.send(true);
    drop(children);
    tokio::time::sleep(Duration::from_millis(300)).await;
    let _ = std::fs::remove_dir_all(&dir);
}

/// The row of etcd's leader killed, printed under its own header after the failover row.
static ETCD_ROW: Mutex<Option<String>> = Mutex::new(None);

async fn run(bin: &std::path::Path, k: u32, rounds: usize) {
    let n = (k * k * k / 4) as usize;
    let dir = std::env::temp_dir().join(format!("sopa-bench-channel-{}", std::process::id()));
    let _remove = RemoveOnDrop(dir.clone());
    std::fs::create_dir_all(&dir).unwrap();
    let spec = dir.join(format!("k{k}.toml"));
    std::fs::write(&spec, format!("[topology]\nkind = \"fat-tree\"\nk = {k}\n")).unwrap();
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let listen = format!("127.0.0.1:{port}");
    // Every change is made durable before it is pushed, as in production.
    let store = format!("file:{}", dir.join(format!("k{k}-state.json")).display());
    let _ = std::fs::remove_file(dir.join(format!("k{k}-state.json")));
    let child = Command::new(bin)
        .args([
            "--topology",
            spec.to_str().unwrap(),
            "--listen",
            &listen,
            "--insecure",
            "--store",
            &store,
        ])
        .env("SOPA_LOG", "warn")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let controller = ControllerProcess(child);
    let url = format!("http://{listen}");
    let mut control = loop {
        match ControlClient::connect(url.clone()).await {
            Ok(c) => break c,
            Err(_) => tokio::time::sleep(Duration::from_millis(50)).await,
        }
    };
    let pid = controller.0.id();
    let start = Instant::now();
    let (applied, connected, stop) = spawn_agents(n, &url, None);
    let all_at = |v: u64| applied.lock().unwrap().iter().all(|(ver, _)| *ver >= v);
    while !all_at(1) {
        assert!(
            start.elapsed() < Duration::from_secs(120),
            "agents did not all connect"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let all_in = connected
        .lock()
        .unwrap()
        .iter()
        .map(|t| t.expect("connected").duration_since(start).as_secs_f64())
        .fold(0.0, f64::max);
    let (cpu0, t_rounds) = (cpu_ms(pid), Instant::now());
    let mut latencies = Vec::new();
    let mut version = 1;
    for round in 0..rounds * 2 {
        let down = round % 2 == 0;
        let t0 = Instant::now();
        let reply = control
            .set_link(LinkChange {
                link: Some(LinkRef {
                    a: "e0".into(),
                    b: "a0".into(),
                }),
                down,
                ..Default::default()
            })
            .await
            .unwrap()
            .into_inner();
        version = reply.version;
        while !all_at(version) {
            assert!(
                t0.elapsed() < Duration::from_secs(60),
                "not every agent got version {version}"
            );
            tokio::time::sleep(Duration::from_micros(500)).await;
        }
        if down {
            latencies.extend(
                applied
                    .lock()
                    .unwrap()
                    .iter()
                    .map(|(_, at)| at.duration_since(t0).as_secs_f64() * 1e3),
            );
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    // The controller's CPU for the rounds, less what it spends in as long a time without a
    // change (every agent's heartbeats).
    let (busy, span) = (cpu_ms(pid) - cpu0, t_rounds.elapsed());
    let quiet0 = cpu_ms(pid);
    tokio::time::sleep(span).await;
    let quiet = cpu_ms(pid) - quiet0;
    let per_change = (busy - quiet).max(0.0) / (rounds * 2) as f64;
    // Every ACK arrived at the controller.
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let status = control.status(StatusRequest {}).await.unwrap().into_inner();
        if status.agents.len() == n && status.agents.iter().all(|a| a.last_ack == version) {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the controller did not record every ACK"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let (rss, peak) = (status_kib(pid, "VmRSS:"), status_kib(pid, "VmHWM:"));
    latencies.sort_by(f64::total_cmp);
    println!(
        "{:<14} {:>6} {:>8} {:>10.1} {:>10.1} {:>10.1} {:>12.1} {:>12.1} {:>14.1} {:>12.2}",
        format!("Fat-Tree k={k}"),
        n,
        rounds,
        percentile(&latencies, 0.5),
        percentile(&latencies, 0.99),
        latencies.last().copied().unwrap_or(0.0),
        rss as f64 / 1024.0,
        peak as f64 / 1024.0,
        per_change,
        all_in
    );
    let _ = stop.send(true);
    drop(controller);
    tokio::time::sleep(Duration::from_millis(300)).await;
    let _ = std::fs::remove_dir_all(&dir);
}
