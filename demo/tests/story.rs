//! The whole demo, as `cargo xtask demo --keep-running --clouds all` runs it, then Ctrl-C:
//! the story must complete with a Proxy Ready on each of the nine shipped providers, and
//! SIGINT must stop the operator and every proxy and exit 0.
//!
//! Needs the plugins (`EGRESS_PLUGIN_DIR`, set by `cargo xtask test`) and the operator
//! binary next to the demo's (built by the same `cargo test --workspace`); skipped with a
//! message without them, failed under `CI=true`.

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

mod support;

/// The Proxies Ready when the story ends: one on each of the nine providers (the samples'
/// second Hetzner Proxy is the one the story deletes).
const READY_AT_THE_END: [&str; 9] = [
    "ec2-eu-west-1",
    "hetzner-fsn1",
    "digitalocean-demo",
    "vultr-demo",
    "linode-demo",
    "scaleway-demo",
    "gce-demo",
    "proxmox-demo",
    "azure-demo",
];

use support::skip;

/// Whether something answers at `addr` (`ip:port`).
fn open(addr: &str) -> bool {
    let addr: std::net::SocketAddr = addr.parse().unwrap_or_else(|e| panic!("{addr}: {e}"));
    std::net::TcpStream::connect_timeout(&addr, Duration::from_millis(300)).is_ok()
}

/// The `ip:port` the closing line gives the Proxy `name`.
fn address_of(closing: &str, name: &str) -> String {
    closing
        .split(&format!("demo/{name} at "))
        .nth(1)
        .and_then(|s| s.split([',', ' ']).next())
        .map(String::from)
        .unwrap_or_else(|| panic!("no address of {name} in: {closing}"))
}

/// Sends the demo SIGINT when the test ends before it does (a failed assertion), so the
/// demo still stops its operator, emulators and their proxies: a killed demo would leave
/// tinyproxy processes on the ports the next run needs.
struct InterruptOnDrop(Option<u32>);

impl InterruptOnDrop {
    /// Ctrl-C, as a terminal sends it to the driver; once.
    fn interrupt(&mut self) {
        if let Some(pid) = self.0.take() {
            // SAFETY: a plain syscall on our own child's PID, not yet reaped.
            unsafe {
                libc::kill(pid as i32, libc::SIGINT);
            }
        }
    }
}

impl Drop for InterruptOnDrop {
    fn drop(&mut self) {
        self.interrupt();
    }
}

#[test]
fn the_story_completes_and_ctrl_c_stops_everything() {
    let Some((mut demo, work)) =
        support::driver(env!("CARGO_BIN_EXE_egress-demo"), "egress-demo-story")
    else {
        return;
    };
    let mut child = demo
        .arg("--keep-running")
        .args(["--clouds", "all"])
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut guard = InterruptOnDrop(Some(child.id()));
    let started = Instant::now();
    let stdout = child.stdout.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel::<String>();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            println!("{line}");
            if tx.send(line).is_err() {
                return;
            }
        }
    });
    let mut seen = Vec::new();
    let wait_for = |what: &str, seen: &mut Vec<String>| loop {
        let left = Duration::from_secs(180).saturating_sub(started.elapsed());
        match rx.recv_timeout(left) {
            Ok(line) => {
                let hit = line.contains(what);
                seen.push(line);
                if hit {
                    return;
                }
            }
            Err(e) => {
                panic!(
                    "no line with {what:?} ({e}); output so far:\n{}",
                    seen.join("\n")
                );
            }
        }
    };
    wait_for("running until Ctrl-C", &mut seen);
    let all = seen.join("\n");
    let operator_pid: i32 = all
        .split("(pid ")
        .nth(1)
        .and_then(|s| s.split(')').next())
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("no operator pid in:\n{all}"));
    for phase in [
        "Provisioning",
        "Running",
        "Healthy",
        "Ready",
        "Replacing",
        "Deleted",
    ] {
        assert!(all.contains(phase), "no {phase} line in:\n{all}");
    }
    assert!(all.contains("GC deleted the orphan"), "{all}");
    // The pool of two is Ready, and the request goes through one of its proxies.
    assert!(all.contains("ProxyPool demo/edge: 2 of 2 Ready"), "{all}");
    assert!(
        all.contains("Send one real request through a proxy of the pool demo/edge"),
        "{all}"
    );
    // The closing line names every Proxy left Ready: one on each cloud of `--clouds all`.
    let ready = all
        .lines()
        .find(|l| l.starts_with("the whole story took"))
        .unwrap_or_else(|| panic!("no closing line in:\n{all}"));
    for name in READY_AT_THE_END {
        assert!(
            // Each instance has a loopback address of its own (127.0.0.2, ...).
            ready.contains(&format!("demo/{name} at 127.0.0.")),
            "{name} is not Ready at the end: {ready}"
        );
    }
    let listening = [
        address_of(ready, "ec2-eu-west-1"),
        address_of(ready, "hetzner-fsn1"),
    ];
    assert!(
        listening.iter().all(|a| open(a)),
        "the Ready proxies listen: {listening:?}"
    );
    // The kubectl line the demo prints works against its control plane, READY column included.
    match Command::new("kubectl")
        .arg("--kubeconfig")
        .arg(work.join("kubeconfig"))
        .args(["get", "proxies", "-A"])
        .output()
    {
        Ok(out) => {
            let table = String::from_utf8_lossy(&out.stdout);
            assert!(
                out.status.success(),
                "kubectl: {}",
                String::from_utf8_lossy(&out.stderr)
            );
            for name in READY_AT_THE_END {
                let row = table
                    .lines()
                    .find(|l| l.split_whitespace().nth(1) == Some(name))
                    .unwrap_or_else(|| panic!("kubectl does not list {name}:\n{table}"));
                assert!(
                    row.split_whitespace().any(|c| c == "True"),
                    "{name} not shown Ready by kubectl:\n{table}"
                );
            }
        }
        Err(e) => skip(&format!(
            "kubectl could not run ({e}): the demo's kubectl line is untested"
        )),
    }

    guard.interrupt();
    let deadline = Instant::now() + Duration::from_secs(30);
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break s;
        }
        assert!(
            Instant::now() < deadline,
            "the demo did not stop after SIGINT"
        );
        std::thread::sleep(Duration::from_millis(100));
    };
    while let Ok(line) = rx.recv_timeout(Duration::from_secs(1)) {
        seen.push(line);
    }
    let _ = std::fs::remove_dir_all(&work);
    assert!(
        status.success(),
        "exit {status} after Ctrl-C:\n{}",
        seen.join("\n")
    );
    assert!(
        !std::path::Path::new(&format!("/proc/{operator_pid}")).exists(),
        "the operator (pid {operator_pid}) still runs"
    );
    assert!(
        !listening.iter().any(|a| open(a)),
        "proxies still listen after the demo stopped: {listening:?}"
    );
}
