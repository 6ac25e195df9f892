//! A real Prometheus (the distribution's `prometheus` package) scraping the testbed's
//! endpoints every second with the project's own rules (`deploy/prometheus/sopa-rules.yml`),
//! queried over its HTTP API. Stopped and its data removed on drop.

use std::{
    io::{Read as _, Write as _},
    net::TcpStream,
    path::{Path, PathBuf},
    time::{Duration, Instant},
};

use crate::{Error, NetNs, Process, Result};

pub struct Prometheus<'a> {
    process: Option<Process>,
    /// Where it listens: 127.0.0.1 of `ns` (`None`: this namespace).
    ns: Option<&'a NetNs>,
    pub addr: String,
    dir: PathBuf,
}

/// The value of the sample `series` (its name and labels, as exposed) in a Prometheus text
/// exposition, as scraped from an endpoint.
pub fn sample(text: &str, series: &str) -> Option<u64> {
    text.lines().find_map(|l| {
        l.strip_prefix(series)
            .and_then(|rest| rest.strip_prefix(' '))
            .and_then(|v| v.trim().parse().ok())
    })
}

/// A TCP port free on 127.0.0.1 of the calling thread's namespace now.
pub fn free_port() -> Result<u16> {
    let l =
        std::net::TcpListener::bind("127.0.0.1:0").map_err(|e| Error::io("binding a port", e))?;
    Ok(l.local_addr()
        .map_err(|e| Error::io("a bound port", e))?
        .port())
}

/// The rules file deploy/ ships.
pub fn rules_file() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/prometheus/sopa-rules.yml")
}

impl<'a> Prometheus<'a> {
    /// Starts Prometheus in `ns` (the root namespace: `None`), scraping each `(job, address)`
    /// every second, the project's rules evaluated every second; `dir` (created, and removed
    /// on drop) holds its configuration, log and data.
    pub fn start(ns: Option<&'a NetNs>, dir: &Path, targets: &[(&str, String)]) -> Result<Self> {
        let dir = dir.to_owned();
        std::fs::create_dir_all(&dir).map_err(|e| Error::io("creating Prometheus' folder", e))?;
        let port = match ns {
            Some(ns) => ns.run(free_port)??,
            None => free_port()?,
        };
        let jobs: String = targets
            .iter()
            .map(|(job, addr)| {
                format!("  - job_name: {job}\n    static_configs:\n      - targets: [\"{addr}\"]\n")
            })
            .collect();
        let config = format!(
            "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\nrule_files:\n  - {}\nscrape_configs:\n{jobs}",
            rules_file().display()
        );
        let file = dir.join("prometheus.yml");
        std::fs::write(&file, config).map_err(|e| Error::io("writing prometheus.yml", e))?;
        let addr = format!("127.0.0.1:{port}");
        let process = Process::spawn(
            ns,
            Path::new("prometheus"),
            &[
                &format!("--config.file={}", file.display()),
                &format!("--storage.tsdb.path={}", dir.join("data").display()),
                &format!("--web.listen-address={addr}"),
            ],
            &dir.join("prometheus.log"),
        )?;
        let p = Self {
            process: Some(process),
            ns,
            addr,
            dir,
        };
        p.wait(Duration::from_secs(30), "Prometheus ready", |p| {
            Ok(p.get("/-/ready")?.starts_with("Prometheus Server is Ready"))
        })?;
        Ok(p)
    }

    /// The body of `GET path`, asked from Prometheus' namespace.
    fn get(&self, path: &str) -> Result<String> {
        match self.ns {
            Some(ns) => ns.run(|| self.get_here(path))?,
            None => self.get_here(path),
        }
    }

    fn get_here(&self, path: &str) -> Result<String> {
        let mut s =
            TcpStream::connect(&self.addr).map_err(|e| Error::io("connecting to Prometheus", e))?;
        write!(s, "GET {path} HTTP/1.0\r\nHost: {}\r\n\r\n", self.addr)
            .map_err(|e| Error::io("asking Prometheus", e))?;
        let mut out = String::new();
        s.read_to_string(&mut out)
            .map_err(|e| Error::io("reading Prometheus' answer", e))?;
        Ok(out
            .split_once("\r\n\r\n")
            .map_or(String::new(), |(_, b)| b.to_owned()))
    }

    /// The result vector of an instant query.
    pub fn query(&self, expr: &str) -> Result<Vec<serde_json::Value>> {
        let encoded: String = expr
            .bytes()
            .map(|b| match b {
                b'a'..=b'z' | b'A'..=b'Z' | b'0'..=b'9' | b'_' | b'.' | b'-' => {
                    (b as char).to_string()
                }
                _ => format!("%{b:02X}"),
            })
            .collect();
        let body = self.get(&format!("/api/v1/query?query={encoded}"))?;
        let v: serde_json::Value = serde_json::from_str(&body)
            .map_err(|e| Error::Failed(format!("Prometheus answered {body:?}: {e}")))?;
        if v["status"] != "success" {
            return Err(Error::Failed(format!("query {expr}: {v}")));
        }
        Ok(v["data"]["result"].as_array().cloned().unwrap_or_default())
    }

    /// Polls until `done` holds (each poll a query or two, a scrape a second).
    pub fn wait(
        &self,
        within: Duration,
        what: &str,
        done: impl Fn(&Self) -> Result<bool>,
    ) -> Result<()> {
        let start = Instant::now();
        loop {
            if let Ok(true) = done(self) {
                return Ok(());
            }
            if start.elapsed() > within {
                let log = self
                    .process
                    .as_ref()
                    .and_then(|p| std::fs::read_to_string(&p.log).ok())
                    .unwrap_or_default();
                let tail: Vec<&str> = log.lines().rev().take(10).collect();
                return Err(Error::Failed(format!(
                    "{what}: not within {within:?}; Prometheus' log ends: {}",
                    tail.into_iter().rev().collect::<Vec<_>>().join("\n")
                )));
            }
            std::thread::sleep(Duration::from_millis(200));
        }
    }
}

impl Drop for Prometheus<'_> {
    fn drop(&mut self) {
        // Stopped first (the guard), then its data removed.
        drop(self.process.take());
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
