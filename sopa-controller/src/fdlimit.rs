//! The file descriptors the controller needs: one per connection it takes (`--max-connections`)
//! and some for itself (the store, etcd, its listeners, files). A process starts with the
//! soft limit its supervisor gives (1,024 by default): the controller raises it to what it
//! needs, within the hard limit (or the hard limit too, where it may), or refuses to start
//! saying what to change, rather than refuse connections with "too many open files" later.

/// Descriptors beyond the connections: the store, etcd's client, the listeners, logs.
pub const HEADROOM: u64 = 256;

/// The limit in force now: (soft, hard).
pub fn current() -> std::io::Result<(u64, u64)> {
    let mut r = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: a valid rlimit to fill.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut r) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok((r.rlim_cur, r.rlim_max))
}

fn set(soft: u64, hard: u64) -> std::io::Result<()> {
    let r = libc::rlimit {
        rlim_cur: soft,
        rlim_max: hard,
    };
    // SAFETY: a valid rlimit.
    if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &r) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

/// Makes the soft limit at least what `max_connections` connections need; returns the soft
/// limit now. An error says what the limit is, what is needed, and what to change.
pub fn ensure(max_connections: usize) -> Result<u64, String> {
    let need = max_connections as u64 + HEADROOM;
    let (soft, hard) = current().map_err(|e| format!("reading RLIMIT_NOFILE: {e}"))?;
    if soft >= need {
        return Ok(soft);
    }
    let raised = if hard >= need {
        set(need, hard)
    } else {
        set(need, need)
    };
    match raised {
        Ok(()) => Ok(need),
        Err(e) => Err(format!(
            "--max-connections {max_connections} needs {need} file descriptors, and the limit is \
             {soft} (hard {hard}), which this process may not raise ({e}): raise it where the \
             controller is started (LimitNOFILE= in its systemd unit, ulimit -n) or lower \
             --max-connections"
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_soft_limit_is_raised_to_what_the_connections_need_or_the_start_says_why() {
        let (soft, _) = current().unwrap();
        // What is there already is kept.
        assert_eq!(ensure(0).unwrap(), soft.max(HEADROOM));
        // More than any kernel allows (fs.nr_open is at most 2^30): refused, saying why.
        let err = ensure(1 << 31).unwrap_err();
        assert!(
            err.contains("--max-connections 2147483648") && err.contains("LimitNOFILE"),
            "{err}"
        );
        assert_eq!(current().unwrap().0, soft, "a refusal changes nothing");
        // A need above the soft limit, within the hard one: raised.
        let (_, hard) = current().unwrap();
        set(hard - 100, hard).unwrap();
        let need = hard - 50;
        assert_eq!(ensure((need - HEADROOM) as usize).unwrap(), need);
        assert_eq!(current().unwrap(), (need, hard));
        set(soft, hard).unwrap();
    }
}
