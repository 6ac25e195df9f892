//! `cargo xtask bench channel`: one `sopa-controller` process and N simulated agents on
//! loopback, each on its own connection (N = 16, 432, 3456: the hosts of Fat-Tree k = 4, 12,
//! 24). A link failure is pushed through the operator API; the table gives p50 / p99 / max of
//! the time from that call until each agent has applied the new version (the moment before it
//! sends its ACK), over several rounds, and the controller's memory. Every ACK is then
//! confirmed at the controller, untimed.
//!
//! The failover row: two controller replicas on one etcd (the distribution's `etcd`), every
//! agent given both; the leader is killed (SIGKILL: its lease runs out, nothing resigns), and
//! the row gives p50 / p99 / max of the time from the kill until each agent's stream to the
//! new leader was open again (up to date, it needs no snapshot), and the time until the new
//! leader served. A change through the new leader then reaches every agent, untimed.

use std::{
    process::{Child, Command, Stdio},
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use sopa_channel::{
    client::{self, Applier, ClientConfig},
    proto::{
        Delta, LinkChange, LinkRef, Role, Snapshot, StatusRequest,
        control::control_client::ControlClient,
    },
};
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

fn main() {
    raise_fd_limit();
    let rounds: usize = std::env::args()
        .skip_while(|a| a != "--rounds")
        .nth(1)
        .and_then(|v| v.parse().ok())
        .unwrap_or(5);
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
    let sizes: &[u32] = if std::env::args().any(|a| a == "--smoke") {
        &[4]
    } else {
        &[4, 12, 24]
    };
    for &k in sizes {
        runtime.block_on(run(&bin, k, rounds));
    }
    println!(
        "(time from the operator's link-down call until each agent had applied the delta, just before its ACK; every ACK then confirmed at the controller, untimed. ctl CPU: the controller's CPU time per change, with what it spends as long without changes taken off (heartbeats); all in: until every agent's stream first opened)"
    );
    let k = *sizes.last().unwrap();
    let ttl: u64 = std::env::args()
        .skip_while(|a| a != "--lease-ttl-s")
        .nth(1)
        .and_then(|v| v.parse().ok())
        .unwrap_or(2);
    println!();
    println!(
        "{:<14} {:>6} {:>8} {:>12} {:>10} {:>10} {:>10}",
        "failover", "agents", "lease s", "leader ms", "p50 ms", "p99 ms", "max ms"
    );
    runtime.block_on(failover(&bin, k, ttl));
    println!(
        "(two replicas on one etcd member; the leader SIGKILLed; times from the kill until the new leader served, and until each agent's stream to it was open again; a change then reached every agent, untimed)"
    );
}

/// What the simulated agents applied, when each last connected, and their stop switch.
type Agents = (
    Arc<Mutex<Vec<(u64, Instant)>>>,
    Arc<Mutex<Vec<Option<Instant>>>>,
    watch::Sender<bool>,
);

/// Starts `n` simulated agents (h0, h1, ...) on `controllers`, each on its own connection.
fn spawn_agents(n: usize, controllers: &str) -> Agents {
    let applied = Arc::new(Mutex::new(vec![(0u64, Instant::now()); n]));
    let connected = Arc::new(Mutex::new(vec![None; n]));
    let (stop, stopped) = watch::channel(false);
    for i in 0..n {
        let mut cfg = ClientConfig::new(controllers, format!("h{i}"), Role::Host);
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

async fn failover(bin: &std::path::Path, k: u32, ttl: u64) {
    let n = (k * k * k / 4) as usize;
    let dir = std::env::temp_dir().join(format!("sopa-bench-failover-{}", std::process::id()));
    let _remove = RemoveOnDrop(dir.clone());
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let spec = dir.join(format!("k{k}.toml"));
    std::fs::write(&spec, format!("[topology]\nkind = \"fat-tree\"\nk = {k}\n")).unwrap();
    let (client, peer) = (free_port(), free_port());
    let etcd_log = dir.join("etcd.log");
    let etcd = Command::new("etcd")
        .args([
            "--name",
            "m0",
            "--data-dir",
            dir.join("etcd").to_str().unwrap(),
            "--listen-client-urls",
            &format!("http://127.0.0.1:{client}"),
            "--advertise-client-urls",
            &format!("http://127.0.0.1:{client}"),
            "--listen-peer-urls",
            &format!("http://127.0.0.1:{peer}"),
            "--initial-advertise-peer-urls",
            &format!("http://127.0.0.1:{peer}"),
            "--initial-cluster",
            &format!("m0=http://127.0.0.1:{peer}"),
            "--logger",
            "zap",
        ])
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&etcd_log).unwrap())
        .spawn()
        .expect("etcd is missing: `cargo xtask setup` installs it (Debian's etcd-server)");
    let mut children = Children(vec![etcd]);
    let t = Instant::now();
    while !std::fs::read_to_string(&etcd_log)
        .unwrap_or_default()
        .contains("serving client traffic")
    {
        assert!(t.elapsed() < Duration::from_secs(30), "etcd did not serve");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let store = format!("etcd:127.0.0.1:{client}");
    let listens = [free_port(), free_port()].map(|p| format!("127.0.0.1:{p}"));
    let replica = |i: usize| {
        Command::new(bin)
            .args([
                "--topology",
                spec.to_str().unwrap(),
                "--listen",
                &listens[i],
                "--insecure",
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
    let urls: Vec<String> = listens.iter().map(|l| format!("http://{l}")).collect();
    // r0 first: it leads once it serves; then r1, which waits.
    children.0.push(replica(0));
    let mut control = loop {
        match ControlClient::connect(urls[0].clone()).await {
            Ok(c) => break c,
            Err(_) => tokio::time::sleep(Duration::from_millis(50)).await,
        }
    };
    children.0.push(replica(1));
    let list = urls.join(",");
    let (applied, connected, stop) = spawn_agents(n, &list);
    let all_at = |v: u64| applied.lock().unwrap().iter().all(|(ver, _)| *ver >= v);
    let t = Instant::now();
    while !all_at(1) {
        assert!(
            t.elapsed() < Duration::from_secs(120),
            "agents did not all connect"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let version = control
        .set_link(LinkChange {
            link: Some(LinkRef {
                a: "e0".into(),
                b: "a0".into(),
            }),
            down: true,
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner()
        .version;
    while !all_at(version) {
        assert!(
            t.elapsed() < Duration::from_secs(120),
            "not every agent got version {version}"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    // The leader dies without a word.
    let _ = children.0[1].kill();
    let _ = children.0[1].wait();
    let killed = Instant::now();
    let mut control = loop {
        match ControlClient::connect(urls[1].clone()).await {
            Ok(c) => break c,
            Err(_) => {
                assert!(
                    killed.elapsed() < Duration::from_secs(60),
                    "no replica took over"
                );
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        }
    };
    let served = killed.elapsed().as_secs_f64() * 1e3;
    let back = |c: &Vec<Option<Instant>>| c.iter().all(|t| t.is_some_and(|t| t > killed));
    while !back(&connected.lock().unwrap()) {
        assert!(
            killed.elapsed() < Duration::from_secs(120),
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
        .set_link(LinkChange {
            link: Some(LinkRef {
                a: "e0".into(),
                b: "a0".into(),
            }),
            down: false,
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner()
        .version;
    assert_eq!(next, version + 1, "the versions continue across leaders");
    let t = Instant::now();
    while !all_at(next) {
        assert!(
            t.elapsed() < Duration::from_secs(60),
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
    let _ = stop.send(true);
    drop(children);
    tokio::time::sleep(Duration::from_millis(300)).await;
    let _ = std::fs::remove_dir_all(&dir);
}

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
    let (applied, connected, stop) = spawn_agents(n, &url);
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
