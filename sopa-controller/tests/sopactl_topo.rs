//! `sopactl topo` as an operator runs it: output, JSON, and errors on bad input.

mod binaries;

use binaries::{Running, Scratch, free_port, sopactl};

#[test]
fn describe_prints_graph_beside_paper() {
    let (code, out, err) = sopactl(&["topo", "describe", "--fat-tree", "4"]);
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("k^3/4 = 16"), "{out}");
    let (code, out, _) = sopactl(&[
        "topo", "describe", "--modric", "2", "2", "--q", "1", "--x", "2", "--y", "4", "--json",
    ]);
    assert_eq!(code, 0);
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["counts"]["hosts"], 32);
    let rows = v["rows"].as_array().unwrap();
    let diameter = rows
        .iter()
        .find(|r| r["property"].as_str().unwrap().starts_with("diameter"))
        .unwrap();
    assert_eq!(diameter["graph"], "6");
    assert_eq!(diameter["paper"], "9");
}

#[test]
fn paths_lists_hops_nodes_and_failures() {
    let (code, out, err) = sopactl(&[
        "topo",
        "paths",
        "--fat-tree",
        "4",
        "--src",
        "10.0.0.2",
        "--dst",
        "h4",
        "--fail",
        "e0:a0",
    ]);
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("4 candidate paths, 2 alive"), "{out}");
    assert!(out.contains("DEAD (e0:a0)"), "{out}");
    let (code, out, _) = sopactl(&[
        "topo",
        "paths",
        "--fat-tree",
        "4",
        "--src",
        "h0",
        "--dst",
        "h2",
        "--json",
    ]);
    assert_eq!(code, 0);
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v.as_array().unwrap().len(), 2, "same pod: k/2 paths");
    let (code, out, _) = sopactl(&[
        "topo",
        "paths",
        "--fat-tree",
        "4",
        "--src",
        "h0",
        "--dst",
        "h1",
    ]);
    assert_eq!(code, 0);
    assert!(
        out.contains("1 candidate paths"),
        "same edge: one path: {out}"
    );
    let (code, out, _) = sopactl(&[
        "topo",
        "paths",
        "--modric",
        "2",
        "2",
        "--x",
        "2",
        "--y",
        "2",
        "--src",
        "h.0.0.0.0",
        "--dst",
        "h.1.1.1.1",
        "--fail-switch",
        "eps.0.1.0.0",
    ]);
    assert_eq!(code, 0);
    assert!(out.contains("8 candidate paths, 7 alive"), "{out}");
}

#[test]
fn compare_reproduces_the_paper_tables() {
    let (code, out, err) = sopactl(&["topo", "compare", "--paper-tables"]);
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("Table III") && out.contains("Table V"));
    assert!(out.contains("72000|72000"), "{out}");
    assert!(
        out.contains("the printed total 144.814 is not its switches + cables = 143.814"),
        "{out}"
    );
}

/// A script tells "try again" from "the controller said no" from "fix what you gave" by the
/// exit code alone, and `--help` lists them.
#[test]
fn exit_codes_say_the_cause() {
    let dir = std::env::temp_dir().join(format!("sopactl-exit-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    // No controller listens on the socket: 75, try again.
    let nobody = format!("unix:{}", dir.join("none.sock").display());
    let (code, _, err) = sopactl(&["status", "--controller", &nobody, "--timeout", "2s"]);
    assert_eq!(code, 75, "{err}");
    assert!(err.contains("no controller answered"), "{err}");
    // The old flag in milliseconds still reads; a duration without sense is usage.
    let (code, _, err) = sopactl(&["status", "--controller", &nobody, "--timeout-ms", "500"]);
    assert_eq!(code, 75, "{err}");
    let (code, _, err) = sopactl(&["status", "--controller", &nobody, "--timeout", "soon"]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("\"soon\" is not a duration"), "{err}");
    // Certificates for a plaintext address: the connection's settings are refused, 78.
    let (code, _, err) = sopactl(&[
        "status",
        "--controller",
        &nobody,
        "--certs",
        dir.to_str().unwrap(),
    ]);
    assert_eq!(code, 78, "{err}");
    assert!(err.contains("--certs"), "{err}");
    // An inventory file that is not there: what was given, 78.
    let missing = dir.join("missing.toml");
    let (code, _, err) = sopactl(&["fabric", "check", missing.to_str().unwrap()]);
    assert_eq!(code, 78, "{err}");
    assert!(err.contains("missing.toml"), "{err}");
    // Addresses that are none: what was given, 78, before any is tried.
    for bad in ["https://[bad", "http://", "ftp://host:1"] {
        let (code, _, err) = sopactl(&["status", "--controller", bad]);
        assert_eq!(code, 78, "{bad}: {err}");
        assert!(err.contains(bad), "{bad}: {err}");
    }
    // A switch is not trusted: the request makes no sense, 78.
    let (code, _, err) = sopactl(&["switch", "trust", "a0", "--controller", &nobody]);
    assert_eq!(code, 78, "{err}");
    // A flag clap refuses: usage, 2.
    assert_eq!(sopactl(&["status", "--no-such-flag"]).0, 2);
    let (code, out, _) = sopactl(&["--help"]);
    assert_eq!(code, 0);
    for needle in [" 65  ", " 75  ", " 77  ", " 78  "] {
        assert!(out.contains(needle), "--help lists {needle:?}: {out}");
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

/// A handshake that fails over a certificate is not a controller away: trying again cannot
/// cure it. The controller's certificate not the one expected: 78.
#[test]
fn a_certificate_refused_in_the_handshake_is_not_a_controller_away() {
    let scratch = Scratch::new("sopactl-certs");
    let d = |p: &str| scratch.path(p);
    scratch.issue(
        &["ca", "other"],
        &[
            ("ca", "controller", "ctl", "srv"),
            ("ca", "operator", "alice", "alice"),
            ("other", "operator", "mallory", "mallory"),
        ],
    );
    // Mallory trusts the fabric's CA, but her own certificate is another CA's.
    std::fs::copy(d("ca/ca.pem"), d("mallory/ca.pem")).unwrap();
    let port = free_port();
    let _controller = Running(
        binaries::controller(&[
            "--listen",
            &format!("127.0.0.1:{port}"),
            "--certs",
            &d("srv"),
        ])
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap(),
    );
    let url = format!("https://127.0.0.1:{port}");
    // Alice is served once the controller listens.
    let start = std::time::Instant::now();
    loop {
        let (code, _, err) = sopactl(&["status", "--controller", &url, "--certs", &d("alice")]);
        if code == 0 {
            break;
        }
        assert!(
            start.elapsed() < std::time::Duration::from_secs(20),
            "the controller never answered alice: {code} {err}"
        );
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    let (code, _, err) = sopactl(&[
        "status",
        "--controller",
        &url,
        "--certs",
        &d("alice"),
        "--controller-name",
        "elsewhere.example",
    ]);
    assert_eq!(code, 78, "{err}");
    assert!(err.contains("--controller-name"), "{err}");
    // Mallory's certificate (another CA's) is refused by the controller after the handshake
    // (TLS 1.3): its alert reaches sopactl as the alert, or as a connection closed or a broken
    // pipe, as the race goes; never as a controller that answered.
    let (code, _, err) = sopactl(&["status", "--controller", &url, "--certs", &d("mallory")]);
    assert!(code == 77 || code == 75, "{code}: {err}");
}

#[test]
fn bad_input_names_what_is_wrong() {
    for (args, needle) in [
        (
            vec!["topo", "describe", "--fat-tree", "5"],
            "k must be even",
        ),
        (
            vec!["topo", "describe", "--modric", "2", "2", "--x", "70"],
            "AS bits",
        ),
        (
            vec!["topo", "describe", "--modric", "2", "2", "--bits", "6,6,6"],
            "four numbers",
        ),
        (
            vec![
                "topo",
                "paths",
                "--fat-tree",
                "4",
                "--src",
                "h0",
                "--dst",
                "h99",
            ],
            "h99",
        ),
        (
            vec![
                "topo",
                "paths",
                "--fat-tree",
                "4",
                "--src",
                "e0",
                "--dst",
                "h1",
            ],
            "not a host",
        ),
        (
            vec![
                "topo",
                "paths",
                "--fat-tree",
                "4",
                "--src",
                "h0",
                "--dst",
                "h4",
                "--fail",
                "e0:c0",
            ],
            "no link between e0 and c0",
        ),
        (
            vec![
                "topo",
                "paths",
                "--fat-tree",
                "4",
                "--src",
                "h0",
                "--dst",
                "h4",
                "--fail",
                "e0",
            ],
            "NODE:NODE",
        ),
    ] {
        let (code, _, err) = sopactl(&args);
        // What was given is refused: the configuration's code (EX_CONFIG).
        assert_eq!(code, 78, "{args:?}: {err}");
        assert!(
            err.contains(needle),
            "{args:?}: expected {needle:?} in {err}"
        );
    }
}

/// `sopactl fabric generate` writes what `fabric check` accepts, with the encoding and uSID
/// block asked for; never over a file; a block that holds the racks' addresses is refused,
/// named.
#[test]
fn fabric_generate_and_check_an_srv6_leaf_spine_in_its_own_block() {
    let dir = std::env::temp_dir().join(format!("sopactl-fabric-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("dc1.toml");
    let _ = std::fs::remove_file(&file);
    let generate = |block: &str| {
        sopactl(&[
            "fabric",
            "generate",
            "leaf-spine",
            "--leaves",
            "4",
            "--spines",
            "2",
            "--hosts-per-leaf",
            "3",
            "--prefix6",
            "2001:db8::/48",
            "--encoding",
            "srv6",
            "--usid-block",
            block,
            "--out",
            file.to_str().unwrap(),
        ])
    };
    let (code, _, err) = generate("fd5e:a::/32");
    assert_eq!(code, 0, "{err}");
    let (code, out, err) = sopactl(&["fabric", "check", file.to_str().unwrap()]);
    assert_eq!(code, 0, "{err}");
    assert!(
        out.contains("2 paths between every two racks; encoding srv6 (uSID block fd5e:a::/32)"),
        "{out}"
    );
    let (code, _, err) = generate("fd5e:a::/32");
    assert_ne!(code, 0);
    assert!(err.contains("dc1.toml"), "{err}");
    std::fs::remove_file(&file).unwrap();
    let (code, _, err) = generate("2001:db8::/32");
    assert_ne!(code, 0);
    assert!(
        err.contains("usid_block 2001:db8::/32 overlaps 2001:db8::/64 of the rack of leaf1"),
        "{err}"
    );
    assert!(!file.exists(), "nothing written");
    let _ = std::fs::remove_dir_all(&dir);
}
