//! Network namespaces and veth pairs that remove themselves on drop.

use std::{
    os::fd::AsRawFd as _,
    process::Command,
    sync::atomic::{AtomicU32, Ordering},
};

use crate::{Error, Result};

/// Every testbed object of this process carries a prefix `sopa-t<pid>-<n>`-like, unique per run
/// and per call, so parallel tests never collide and leftovers are recognisable.
pub fn run_name(tag: &str) -> String {
    static N: AtomicU32 = AtomicU32::new(0);
    format!(
        "st{}{}{}",
        std::process::id() % 100_000,
        tag,
        N.fetch_add(1, Ordering::Relaxed)
    )
}

/// Runs `ip` with `args`; the error names the command and what it printed.
pub fn ip(args: &[&str]) -> Result<String> {
    run("ip", args)
}

pub fn run(program: &str, args: &[&str]) -> Result<String> {
    let out = Command::new(program)
        .args(args)
        .output()
        .map_err(|err| Error::io(format!("running {program}"), err))?;
    if !out.status.success() {
        return Err(Error::Command {
            command: format!("{program} {}", args.join(" ")),
            stderr: String::from_utf8_lossy(&out.stderr).trim().to_owned(),
        });
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// A network namespace, deleted (with every interface in it) on drop.
#[derive(Debug)]
pub struct NetNs {
    name: String,
}

impl NetNs {
    pub fn new(name: &str) -> Result<Self> {
        ip(&["netns", "add", name])?;
        let ns = Self {
            name: name.to_owned(),
        };
        ns.ip(&["link", "set", "lo", "up"])?;
        Ok(ns)
    }

    /// Keeps the namespace after this guard goes; returns its name.
    pub fn leak(self) -> String {
        let this = std::mem::ManuallyDrop::new(self);
        this.name.clone()
    }

    /// A handle on a namespace owned elsewhere: it is not deleted when this one drops.
    pub fn adopt(name: &str) -> Adopted {
        Adopted(std::mem::ManuallyDrop::new(Self {
            name: name.to_owned(),
        }))
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    /// `ip -n NAME args...`
    pub fn ip(&self, args: &[&str]) -> Result<String> {
        let mut full = vec!["-n", self.name.as_str()];
        full.extend_from_slice(args);
        ip(&full)
    }

    /// Bytes interface `dev` of this namespace has sent (`ip -s -j link`: sysfs would show the
    /// namespace of whoever mounted it).
    pub fn tx_bytes(&self, dev: &str) -> Result<u64> {
        let out = self.ip(&["-s", "-j", "link", "show", dev])?;
        let v: serde_json::Value = serde_json::from_str(&out)
            .map_err(|e| Error::Failed(format!("ip -s -j link show {dev}: {e}")))?;
        Ok(v[0]["stats64"]["tx"]["bytes"].as_u64().unwrap_or(0))
    }

    /// Packets interface `dev` of this namespace has sent.
    pub fn tx_packets(&self, dev: &str) -> Result<u64> {
        let out = self.ip(&["-s", "-j", "link", "show", dev])?;
        let v: serde_json::Value = serde_json::from_str(&out)
            .map_err(|e| Error::Failed(format!("ip -s -j link show {dev}: {e}")))?;
        Ok(v[0]["stats64"]["tx"]["packets"].as_u64().unwrap_or(0))
    }

    /// Sets interface `dev` administratively up or down with one `SIOCSIFFLAGS` from a thread
    /// inside the namespace (no process started: the change happens within microseconds of
    /// the returned time, taken just before the call).
    pub fn set_up(&self, dev: &str, up: bool) -> Result<std::time::SystemTime> {
        self.set_up_timed(dev, up).map(|(before, _)| before)
    }

    /// [`NetNs::set_up`], also returning when the call returned (taking an interface down waits
    /// for the kernel's teardown of it: its queues, an RCU grace period).
    pub fn set_up_timed(
        &self,
        dev: &str,
        up: bool,
    ) -> Result<(std::time::SystemTime, std::time::SystemTime)> {
        let name = dev.to_owned();
        self.run(
            move || -> Result<(std::time::SystemTime, std::time::SystemTime)> {
                // SAFETY: plain socket and ioctl calls on an ifreq we own; the fd is closed below.
                unsafe {
                    let fd = libc::socket(libc::AF_INET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0);
                    if fd < 0 {
                        return Err(Error::io("socket", std::io::Error::last_os_error()));
                    }
                    let mut ifr: libc::ifreq = std::mem::zeroed();
                    for (d, b) in ifr
                        .ifr_name
                        .iter_mut()
                        .zip(name.bytes().take(libc::IFNAMSIZ - 1))
                    {
                        *d = b as libc::c_char;
                    }
                    let result = (|| {
                        if libc::ioctl(fd, libc::SIOCGIFFLAGS, &mut ifr) != 0 {
                            return Err(Error::io(
                                format!("SIOCGIFFLAGS {name}"),
                                std::io::Error::last_os_error(),
                            ));
                        }
                        let flags = ifr.ifr_ifru.ifru_flags;
                        ifr.ifr_ifru.ifru_flags = if up {
                            flags | libc::IFF_UP as libc::c_short
                        } else {
                            flags & !(libc::IFF_UP as libc::c_short)
                        };
                        let at = std::time::SystemTime::now();
                        if libc::ioctl(fd, libc::SIOCSIFFLAGS, &ifr) != 0 {
                            return Err(Error::io(
                                format!("SIOCSIFFLAGS {name}"),
                                std::io::Error::last_os_error(),
                            ));
                        }
                        Ok((at, std::time::SystemTime::now()))
                    })();
                    libc::close(fd);
                    result
                }
            },
        )?
    }

    /// `tc ARGS` inside the namespace.
    pub fn tc(&self, args: &[&str]) -> Result<String> {
        let mut full = vec!["netns", "exec", self.name.as_str(), "tc"];
        full.extend_from_slice(args);
        ip(&full)
    }

    /// Sets a sysctl inside the namespace.
    pub fn sysctl(&self, key: &str, value: &str) -> Result<()> {
        self.run(|| {
            let path = format!("/proc/sys/{}", key.replace('.', "/"));
            std::fs::write(&path, value).map_err(|err| Error::io(format!("writing {path}"), err))
        })?
    }

    pub fn read_sysctl(&self, key: &str) -> Result<String> {
        self.run(|| {
            let path = format!("/proc/sys/{}", key.replace('.', "/"));
            std::fs::read_to_string(&path)
                .map(|v| v.trim().to_owned())
                .map_err(|err| Error::io(format!("reading {path}"), err))
        })?
    }

    /// Whether a TCP socket listens on `port` in this namespace (IPv4 or IPv6), from the
    /// kernel's socket tables: a server is waited for by this, not by a sleep.
    pub fn tcp_listening(&self, port: u16) -> Result<bool> {
        self.tcp_in_state(port, "0A")
    }

    /// Whether a connection to local `port` is established in this namespace (the kernel
    /// completes it even while the server is stopped: it waits in the accept queue).
    pub fn tcp_established(&self, port: u16) -> Result<bool> {
        self.tcp_in_state(port, "01")
    }

    /// Whether a TCP socket of local `port` is in `state` (the kernel's hex code).
    fn tcp_in_state(&self, port: u16, state: &str) -> Result<bool> {
        let suffix = format!(":{port:04X}");
        self.run(|| {
            ["tcp", "tcp6"].iter().any(|t| {
                std::fs::read_to_string(format!("/proc/thread-self/net/{t}"))
                    .unwrap_or_default()
                    .lines()
                    .skip(1)
                    .any(|l| {
                        let f: Vec<&str> = l.split_whitespace().collect();
                        // local_address, remote_address, then the state.
                        f.len() > 3 && f[1].ends_with(&suffix) && f[3] == state
                    })
            })
        })
    }

    /// Runs `f` on a thread that has entered this namespace (only the network namespace: the
    /// mount namespace, and so bpffs, stay shared).
    pub fn run<T: Send>(&self, f: impl FnOnce() -> T + Send) -> Result<T> {
        let path = format!("/run/netns/{}", self.name);
        std::thread::scope(|scope| {
            scope
                .spawn(|| {
                    enter(&path)?;
                    Ok(f())
                })
                .join()
                .map_err(|_| Error::Failed(format!("a thread in netns {} panicked", self.name)))?
        })
    }

    /// `GET path` from `addr` in this namespace (a process's metrics and health endpoints):
    /// the status code and the body.
    pub fn http_get(&self, addr: &str, path: &str) -> Result<(u16, String)> {
        use std::io::{Read as _, Write as _};
        let addr: std::net::SocketAddr = addr
            .parse()
            .map_err(|e| Error::Failed(format!("{addr:?}: {e}")))?;
        self.run(|| {
            let mut conn =
                std::net::TcpStream::connect_timeout(&addr, std::time::Duration::from_secs(2))
                    .map_err(|e| Error::io(format!("connecting to {addr}"), e))?;
            write!(conn, "GET {path} HTTP/1.1\r\nHost: {addr}\r\n\r\n")
                .map_err(|e| Error::io(format!("asking {addr}"), e))?;
            let mut out = String::new();
            conn.read_to_string(&mut out)
                .map_err(|e| Error::io(format!("reading {addr}'s answer"), e))?;
            let code = out
                .split_ascii_whitespace()
                .nth(1)
                .and_then(|c| c.parse().ok())
                .unwrap_or(0);
            let body = out.split_once("\r\n\r\n").map_or("", |(_, b)| b).to_owned();
            Ok((code, body))
        })?
    }

    /// Like [`NetNs::run`], on a detached thread (for servers and captures).
    pub fn spawn<T: Send + 'static>(
        &self,
        f: impl FnOnce() -> T + Send + 'static,
    ) -> std::thread::JoinHandle<Result<T>> {
        let path = format!("/run/netns/{}", self.name);
        std::thread::spawn(move || {
            enter(&path)?;
            Ok(f())
        })
    }
}

/// Moves the calling thread into the network namespace at `path`.
pub fn enter(path: &str) -> Result<()> {
    let file =
        std::fs::File::open(path).map_err(|err| Error::io(format!("opening {path}"), err))?;
    // SAFETY: setns on an open namespace fd; affects only the calling thread.
    if unsafe { libc::setns(file.as_raw_fd(), libc::CLONE_NEWNET) } != 0 {
        return Err(Error::io(
            format!("entering {path}"),
            std::io::Error::last_os_error(),
        ));
    }
    Ok(())
}

/// A [`NetNs`] that another guard deletes.
pub struct Adopted(std::mem::ManuallyDrop<NetNs>);

impl std::ops::Deref for Adopted {
    type Target = NetNs;

    fn deref(&self) -> &NetNs {
        &self.0
    }
}

impl Drop for NetNs {
    fn drop(&mut self) {
        if let Err(err) = ip(&["netns", "del", &self.name]) {
            eprintln!("testbed: could not delete netns {}: {err}", self.name);
        }
    }
}

/// Joins `a` (interface `a_if`) and `b` (interface `b_if`) with a veth pair, both ends up.
/// The pair goes away with either namespace.
pub fn veth(a: &NetNs, a_if: &str, b: &NetNs, b_if: &str) -> Result<()> {
    ip(&[
        "link",
        "add",
        a_if,
        "netns",
        a.name(),
        "type",
        "veth",
        "peer",
        "name",
        b_if,
        "netns",
        b.name(),
    ])?;
    a.ip(&["link", "set", a_if, "up"])?;
    b.ip(&["link", "set", b_if, "up"])?;
    Ok(())
}
