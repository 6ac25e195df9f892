use std::collections::BTreeMap;

use crate::netlink::Netlink;

use super::{process::process_state, *};

fn record(node: &str) -> Record {
    Record {
        node: node.into(),
        pid: std::process::id(),
        start_time: None,
        iface: "eth0".into(),
        ifindex: 2,
        paths_file: None,
        granularity: "packet".into(),
        xdp_mode: "generic".into(),
        started_unix: 0,
        changes: Vec::new(),
        controller: None,
        netns: None,
        kept_attached: false,
        adopted: None,
        programs: None,
        reloads_on_sighup: false,
        usid: None,
        attach: None,
        fallbacks: BTreeMap::new(),
    }
}

fn scratch() -> tempfile::TempDir {
    tempfile::Builder::new()
        .prefix("sopa-journal-")
        .tempdir()
        .unwrap()
}

#[test]
fn a_record_of_another_namespace_is_refused_unless_that_namespace_is_gone() {
    let mut r = record("h0");
    assert_eq!(r.namespace(None).unwrap(), RecordNamespace::Same);
    r.netns = Some("sopa-no-such-namespace-here".into());
    assert_eq!(
        r.namespace(None).unwrap(),
        RecordNamespace::Gone,
        "its namespace is gone: nothing of it left to undo"
    );
    assert_eq!(
        r.namespace(Some("sopa-no-such-namespace-here")).unwrap(),
        RecordNamespace::Same
    );
    // A record of the namespace the agent was started in, read from another: refused,
    // since undoing it there would change that namespace's settings.
    r.netns = None;
    let err = r.namespace(Some("s1")).unwrap_err().to_string();
    assert!(
        err.contains("\"s1\"") && err.contains("detach --node h0"),
        "{err}"
    );
}

#[test]
fn every_change_is_on_disk_before_the_next() {
    let tmp = scratch();
    let dir = tmp.path().join("h0");
    let mut j = Journal::create(&dir, record("h0")).unwrap();
    assert_eq!(Journal::read(&dir).unwrap().unwrap().changes, []);
    let sysctl = Change::Sysctl {
        key: "net.ipv4.tcp_reordering".into(),
        old: "3".into(),
        new: "10".into(),
    };
    j.push(sysctl.clone()).unwrap();
    // A crash now leaves exactly this change for the next agent to undo.
    assert_eq!(
        Journal::read(&dir).unwrap().unwrap().changes,
        std::slice::from_ref(&sysctl)
    );
    let pins = Change::Pins {
        dir: tmp.path().join("pins"),
    };
    j.push(pins.clone()).unwrap();
    let back = Journal::read(&dir).unwrap().unwrap();
    assert_eq!(back.changes, [sysctl, pins]);
    assert_eq!(back.node, "h0");
    // No temporary file is left behind by the atomic rewrite.
    let names: Vec<_> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(names, [JOURNAL_FILE]);
}

#[test]
fn no_record_is_none_and_a_damaged_one_is_refused_by_name() {
    let tmp = scratch();
    assert!(Journal::read(tmp.path()).unwrap().is_none());
    std::fs::write(Journal::path_in(tmp.path()), b"{\"node\": ").unwrap();
    let err = Journal::read(tmp.path()).unwrap_err().to_string();
    assert!(
        err.contains("state.json") && err.contains("remove it if no agent runs"),
        "{err}"
    );
}

#[test]
fn liveness_is_the_pid_and_its_start_time_not_a_command_line() {
    // An unrelated process whose command line says sopa-agent.
    let mut child = std::process::Command::new("sh")
        .args(["-c", "sleep 30; true", "sopa-agent"])
        .spawn()
        .unwrap();
    let mut r = record("h1");
    r.pid = child.id();
    // Until the child has exec'd sh, its command line is this test's.
    let cmdline = || std::fs::read(format!("/proc/{}/cmdline", r.pid)).unwrap_or_default();
    while !String::from_utf8_lossy(&cmdline()).contains("sopa-agent") {
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
    let started = process_start_time(r.pid).expect("a start time");
    r.start_time = Some(started + 1);
    assert!(
        !r.is_live(),
        "same PID, another start time: another process"
    );
    assert!(
        signal_agent(&r, libc::SIGUSR1).is_err(),
        "never signalled as the agent"
    );
    assert!(child.try_wait().unwrap().is_none(), "still running");
    r.start_time = Some(started);
    assert!(r.is_live());
    r.start_time = None;
    assert!(r.is_live(), "an older record: the command line decides");
    r.start_time = Some(started);
    child.kill().unwrap();
    // Exited but not reaped: a zombie keeps its PID and start time, and is not running.
    while process_state(r.pid) != Some('Z') {
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
    assert!(!r.is_live(), "a zombie is not a live agent");
    child.wait().unwrap();
}

#[test]
fn a_record_of_a_dead_process_is_not_live() {
    let mut r = record("h1");
    // PID 1 runs, but it is not an agent.
    r.pid = 1;
    assert!(!r.is_live());
    r.pid = u32::MAX;
    assert!(!r.is_live());
}

#[tokio::test]
async fn undo_goes_on_past_a_failure_and_removes_the_journal() {
    let tmp = scratch();
    let dir = tmp.path().join("run");
    let (older, newer) = (tmp.path().join("older"), tmp.path().join("older/newer"));
    std::fs::create_dir_all(&newer).unwrap();
    std::fs::write(newer.join("map"), b"x").unwrap();
    // A change that cannot be undone: "unpinning" a path that is a file.
    let blocked = tmp.path().join("not-a-folder");
    std::fs::write(&blocked, b"x").unwrap();
    let mut j = Journal::create(&dir, record("h2")).unwrap();
    for d in [&older, &blocked, &newer] {
        j.push(Change::Pins { dir: d.clone() }).unwrap();
    }
    let netlink = Netlink::connect().unwrap();
    let errors = j.undo(&netlink).await;
    assert_eq!(errors.len(), 1, "{errors:?}");
    assert!(errors[0].to_string().contains("not-a-folder"), "{errors:?}");
    assert!(!older.exists() && !newer.exists(), "the rest was undone");
    assert!(blocked.exists());
    assert!(!Journal::path_in(&dir).exists(), "the journal is removed");
    assert!(!dir.exists(), "and its empty folder");
}
