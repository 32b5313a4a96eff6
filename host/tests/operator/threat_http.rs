//! The operator's HTTP port against a caller who never finishes a request: anyone on the
//! pod network can reach it before any token is checked. A flood of connections that each
//! send a large, never-ending request head must neither take the operator past the
//! Deployment's memory limit nor keep `/healthz` from answering (the kubelet would restart
//! a pod that is only under attack), and connections that send nothing are closed after the
//! header timeout (threat model: caller -> HTTP port).

use super::harness::{example_operator, fake_cluster, wait_for};
use crate::support;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::time::{Duration, Instant};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// Client addresses of the flood: loopback addresses other than 127.0.0.1, which the
/// test's own `/healthz` checks use (as the kubelet's probes come from the node's own
/// address, not the attacker's).
fn attacker(i: usize) -> IpAddr {
    IpAddr::V4(Ipv4Addr::new(127, 0, 1, 1 + (i % 20) as u8))
}

/// Opens a connection from `from` and sends `head_bytes` of one header line that never
/// ends; then holds the connection, reading until the server closes it. Returns how long
/// after the last byte sent the server closed it (`None`: still open at `hold`).
async fn slow_head(
    to: SocketAddr,
    from: IpAddr,
    head_bytes: usize,
    hold: Duration,
) -> Option<Duration> {
    let sock = tokio::net::TcpSocket::new_v4().ok()?;
    sock.bind(SocketAddr::new(from, 0)).ok()?;
    let mut s = sock.connect(to).await.ok()?;
    let mut head = b"GET /v1/proxies HTTP/1.1\r\nHost: x\r\nX-Pad: ".to_vec();
    head.resize(head_bytes.max(head.len()), b'a');
    // Refused or closed early: the write fails, which is what a bounded server does.
    let _ = s.write_all(&head).await;
    let sent = Instant::now();
    let mut buf = [0u8; 4096];
    let closed = tokio::time::timeout(hold, async {
        loop {
            match s.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(_) => {}
            }
        }
    })
    .await;
    closed.ok().map(|()| sent.elapsed())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flood_of_unfinished_requests_neither_kills_the_operator_nor_stops_its_probes() {
    let plugin_dir = plugins_or_skip!();
    let dir = tempfile::tempdir().unwrap();
    let (_fake, _client, kubeconfig) = fake_cluster(dir.path()).await;
    let Some((_backend, mut op)) = example_operator(
        &plugin_dir,
        dir.path(),
        &kubeconfig,
        "",
        &["--http-header-timeout", "2s"],
    ) else {
        return;
    };
    wait_for(
        "/readyz to answer 200",
        Duration::from_secs(60),
        async || (op.get("/readyz").await.0 == 200).then_some(()),
    )
    .await;

    // 2,000 connections from 20 addresses, each sending 300 KiB of a head that never ends:
    // 600 MiB if the server buffered them all (an unbounded server buffers ~400 KiB each).
    let to = op.addr;
    let flood: Vec<_> = (0..2000)
        .map(|i| {
            tokio::spawn(slow_head(
                to,
                attacker(i),
                300 * 1024,
                Duration::from_secs(15),
            ))
        })
        .collect();

    // The kubelet's view while the flood lasts: /healthz answers within the liveness probe's
    // `timeoutSeconds` (3 s, config/manager/manager.yaml: the kubelet gives up no sooner;
    // a 1 s bound failed now and then in the first instant of the 2,000-connection burst on
    // 2 cores), asked every quarter of a second. Asked from a thread of its own with blocking sockets, so that the
    // flood's 2,000 tasks in this test's runtime cannot delay the asking (a kubelet is not
    // in the attacker's process either).
    let addr = op.addr;
    let checker = std::thread::spawn(move || {
        let started = Instant::now();
        let mut answers = vec![];
        while started.elapsed() < Duration::from_secs(8) {
            let asked = Instant::now();
            let status = healthz_within(addr, LIVENESS_TIMEOUT);
            answers.push((asked - started, asked.elapsed(), status));
            std::thread::sleep(Duration::from_millis(250));
        }
        answers
    });
    while !checker.is_finished() {
        op.assert_alive("under the connection flood");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let answers = checker.join().unwrap();
    for (at, took, status) in &answers {
        assert_eq!(
            *status,
            Some(200),
            "/healthz during the flood, {took:?} in (asked {at:?} after it started)"
        );
    }
    let checks = answers.len();
    assert!(checks >= 8, "{checks} checks");

    // Every flood connection was closed by the server: refused over a cap, answered 431
    // past the head limit, or timed out, long before the clients gave up.
    let mut open_at_end = 0;
    for f in flood {
        if f.await.unwrap().is_none() {
            open_at_end += 1;
        }
    }
    assert_eq!(
        open_at_end, 0,
        "connections the server still held after 15 s"
    );
    op.assert_alive("after the flood");
    let cgroup = op.cgroup.as_ref().unwrap();
    assert_eq!(cgroup.oom_kills(), 0, "OOM kills in the operator's cgroup");
    eprintln!(
        "peak memory of the operator's cgroup during the flood: {} MiB",
        cgroup.peak() >> 20
    );

    // A connection that sends nothing at all is closed after the header timeout (2 s).
    let idle = slow_head(to, attacker(0), 0, Duration::from_secs(10))
        .await
        .expect("an idle connection is closed");
    assert!(
        idle < Duration::from_secs(5),
        "an idle connection was closed after {idle:?} (header timeout 2 s)"
    );
    assert_eq!(op.get("/healthz").await.0, 200);
}

/// The status of `GET /healthz` on a blocking socket, `None` unless it answers within a
/// second (the kubelet's default probe timeout).
/// The Deployment's liveness probe `timeoutSeconds`.
const LIVENESS_TIMEOUT: Duration = Duration::from_secs(3);

fn healthz_within(addr: std::net::SocketAddr, timeout: Duration) -> Option<u16> {
    use std::io::{Read, Write};
    let deadline = Instant::now() + timeout;
    let mut s = std::net::TcpStream::connect_timeout(&addr, timeout).ok()?;
    s.set_write_timeout(Some(timeout)).ok()?;
    s.write_all(b"GET /healthz HTTP/1.1\r\nHost: operator\r\nConnection: close\r\n\r\n")
        .ok()?;
    let mut head = Vec::new();
    let mut buf = [0u8; 512];
    while !head.windows(2).any(|w| w == b"\r\n") {
        let left = deadline.checked_duration_since(Instant::now())?;
        s.set_read_timeout(Some(left.max(Duration::from_millis(1))))
            .ok()?;
        let n = s.read(&mut buf).ok()?;
        if n == 0 {
            return None;
        }
        head.extend_from_slice(&buf[..n]);
    }
    let line = String::from_utf8_lossy(&head);
    line.split_whitespace().nth(1)?.parse().ok()
}
