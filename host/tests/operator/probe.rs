//! The health probe and engine against a real tinyproxy on 127.0.0.1: an open proxy, one
//! that refuses to tunnel to the target port, one that wants credentials, a dead address
//! and a black hole. tinyproxy is installed by `cargo xtask test`; without it these tests
//! skip loudly (and fail under CI=true).

use crate::support;
use proxy_operator::probe::{
    EngineConfig, ProbeEngine, ProbeError, ProbeMetrics, ProbeSpec, Thresholds, connect::probe,
};

use std::net::SocketAddr;
use std::time::{Duration, Instant};
use support::tinyproxy::{Tinyproxy, echo_server, free_port, tinyproxy_bin};
use tokio::net::TcpListener;

fn spec(proxy: SocketAddr, target_port: u16, echo: bool) -> ProbeSpec {
    ProbeSpec {
        proxy,
        // The proxies of these tests run on loopback, as a lab provider's would.
        allow_internal: true,
        target: format!("127.0.0.1:{target_port}"),
        auth: None,
        egress_echo: echo.then(|| {
            format!("http://127.0.0.1:{target_port}/ip")
                .parse()
                .unwrap()
        }),
        timeout: Duration::from_secs(2),
        tls: None,
    }
}

/// The probe over IPv6: the CONNECT goes to `[::1]:port`, and the egress check compares
/// the echo's answer with the Proxy's IPv6 address.
#[tokio::test]
async fn connect_and_egress_check_over_ipv6() {
    let Some(bin) = tinyproxy_bin() else { return };
    if !support::ipv6_loopback() {
        return;
    }
    let v6: std::net::IpAddr = std::net::Ipv6Addr::LOCALHOST.into();
    let (echo, _e) = egress_emulators::echo::start_at(v6, 0).await.unwrap();
    let tp = Tinyproxy::start_at(&bin, v6, free_port(), &format!("ConnectPort {echo}")).await;
    assert_eq!(tp.addr.to_string(), format!("[::1]:{}", tp.addr.port()));
    let spec = ProbeSpec {
        target: format!("[::1]:{echo}"),
        egress_echo: Some(format!("http://[::1]:{echo}/ip").parse().unwrap()),
        ..spec(tp.addr, echo, true)
    };
    let ok = probe(&spec, "::1").await.unwrap();
    assert_eq!(ok.egress_ip.as_deref(), Some("::1"));
    let err = probe(&spec, "2001:db8::7").await.unwrap_err();
    assert_eq!(
        err,
        ProbeError::EgressMismatch {
            got: "::1".into(),
            want: "2001:db8::7".into()
        }
    );
}

#[tokio::test]
async fn connect_and_egress_check_through_an_open_proxy() {
    let Some(bin) = tinyproxy_bin() else { return };
    let (echo, _e) = echo_server().await;
    let tp = Tinyproxy::start(&bin, &format!("ConnectPort {echo}")).await;

    let ok = probe(&spec(tp.addr, echo, false), "127.0.0.1")
        .await
        .unwrap();
    assert_eq!(ok.egress_ip, None);
    assert!(ok.latency < Duration::from_secs(2));

    let ok = probe(&spec(tp.addr, echo, true), "127.0.0.1")
        .await
        .unwrap();
    assert_eq!(ok.egress_ip.as_deref(), Some("127.0.0.1"));

    // The proxy works, but traffic does not leave from the instance's address.
    let err = probe(&spec(tp.addr, echo, true), "203.0.113.7")
        .await
        .unwrap_err();
    assert_eq!(
        err,
        ProbeError::EgressMismatch {
            got: "127.0.0.1".into(),
            want: "203.0.113.7".into()
        }
    );
    assert_eq!(err.reason(), "EgressMismatch");
}

#[tokio::test]
async fn a_proxy_that_refuses_the_tunnel_is_unhealthy() {
    let Some(bin) = tinyproxy_bin() else { return };
    let (echo, _e) = echo_server().await;
    // It accepts connections, but tunnels only to 443.
    let tp = Tinyproxy::start(&bin, "ConnectPort 443").await;
    let err = probe(&spec(tp.addr, echo, false), "127.0.0.1")
        .await
        .unwrap_err();
    assert!(
        matches!(&err, ProbeError::Refused { status: 403, .. }),
        "{err:?}"
    );
    assert_eq!(err.reason(), "TunnelRefused");
}

#[tokio::test]
async fn a_proxy_with_basic_auth() {
    let Some(bin) = tinyproxy_bin() else { return };
    let (echo, _e) = echo_server().await;
    let password = "sentinel-proxy-password-9f3";
    let tp = Tinyproxy::start(
        &bin,
        &format!("ConnectPort {echo}\nBasicAuth egress {password}"),
    )
    .await;

    let mut s = spec(tp.addr, echo, true);
    let err = probe(&s, "127.0.0.1").await.unwrap_err();
    assert_eq!(err, ProbeError::AuthRequired { status: 407 });
    assert_eq!(err.reason(), "ProxyAuthRequired");

    s.auth = Some(("egress".into(), "wrong".into()));
    let err = probe(&s, "127.0.0.1").await.unwrap_err();
    assert!(matches!(err, ProbeError::AuthRequired { .. }), "{err:?}");

    s.auth = Some(("egress".into(), password.into()));
    let ok = probe(&s, "127.0.0.1").await.unwrap();
    assert_eq!(ok.egress_ip.as_deref(), Some("127.0.0.1"));
    assert!(!format!("{s:?}").contains(password));
}

/// A plugin that reports an internal IP for its instance must not make the operator connect
/// there: without `allowPrivateAddresses` the probe refuses before any connection.
#[tokio::test]
async fn internal_addresses_are_not_probed_unless_allowed() {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let accepted = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let count = accepted.clone();
    let _srv = tokio::spawn(async move {
        while let Ok((_s, _)) = listener.accept().await {
            count.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        }
    });
    let mut s = spec(addr, 443, false);
    s.allow_internal = false;
    for target in [
        addr,
        "169.254.169.254:80".parse().unwrap(),
        "[::1]:3128".parse().unwrap(),
        "[::ffff:10.0.0.1]:3128".parse().unwrap(),
    ] {
        s.proxy = target;
        let err = probe(&s, "127.0.0.1").await.unwrap_err();
        assert_eq!(err.reason(), "InternalAddress", "{target}: {err}");
        assert!(err.to_string().contains("allowPrivateAddresses"), "{err}");
    }
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert_eq!(accepted.load(std::sync::atomic::Ordering::SeqCst), 0);
}

#[tokio::test]
async fn nothing_listening_and_a_black_hole() {
    let dead: SocketAddr = format!("127.0.0.1:{}", free_port()).parse().unwrap();
    let err = probe(&spec(dead, 443, false), "127.0.0.1")
        .await
        .unwrap_err();
    assert_eq!(err.reason(), "ConnectFailed", "{err}");

    // Accepts, never answers: the probe gives up at its timeout, not later.
    let hole = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = hole.local_addr().unwrap();
    let _held = tokio::spawn(async move {
        let mut conns = Vec::new();
        while let Ok((s, _)) = hole.accept().await {
            conns.push(s);
        }
    });
    let mut s = spec(addr, 443, false);
    s.timeout = Duration::from_millis(300);
    let started = Instant::now();
    let err = probe(&s, "127.0.0.1").await.unwrap_err();
    assert_eq!(err, ProbeError::Timeout(Duration::from_millis(300)));
    assert!(
        started.elapsed() < Duration::from_millis(800),
        "{:?}",
        started.elapsed()
    );
}

#[tokio::test]
async fn the_engine_holds_a_verdict_until_the_failure_threshold() {
    let Some(bin) = tinyproxy_bin() else { return };
    let (echo, _e) = echo_server().await;
    let good = Tinyproxy::start(&bin, &format!("ConnectPort {echo}")).await;
    let refusing = Tinyproxy::start(&bin, "ConnectPort 443").await;
    let mut registry = prometheus_client::registry::Registry::default();
    let metrics = ProbeMetrics::register(&mut registry);
    let engine = ProbeEngine::new(
        EngineConfig {
            interval: Duration::from_millis(50),
            concurrency: 4,
            thresholds: Thresholds {
                failure: 3,
                success: 1,
            },
        },
        Some(metrics.clone()),
    );
    engine.upsert("default/good", spec(good.addr, echo, true), "127.0.0.1");
    engine.upsert(
        "default/refusing",
        spec(refusing.addr, echo, false),
        "127.0.0.1",
    );

    let r = engine.round().await;
    let summary: Vec<(&str, bool, &str, bool)> = r
        .iter()
        .map(|r| {
            (
                r.key.as_str(),
                r.verdict.healthy,
                r.verdict.reason.as_str(),
                r.changed,
            )
        })
        .collect();
    assert_eq!(
        summary,
        [
            ("default/good", true, "Healthy", true),
            ("default/refusing", false, "TunnelRefused", true),
        ]
    );

    // The good proxy dies: two failed rounds hold the verdict, the third flips it.
    let dead_addr = good.addr;
    drop(good);
    for round in 1..=3 {
        let r = engine.round().await;
        let g = r.iter().find(|r| r.key == "default/good").unwrap();
        assert_eq!(
            g.verdict.healthy,
            round < 3,
            "round {round}: {:?}",
            g.verdict
        );
        assert_eq!(g.changed, round == 3);
    }
    assert_eq!(
        engine.verdict("default/good").unwrap().reason,
        "ConnectFailed"
    );

    // A replacement instance at a new address starts from scratch.
    let replacement = Tinyproxy::start(&bin, &format!("ConnectPort {echo}")).await;
    assert_ne!(replacement.addr, dead_addr);
    engine.upsert(
        "default/good",
        spec(replacement.addr, echo, true),
        "127.0.0.1",
    );
    assert_eq!(engine.verdict("default/good").unwrap().reason, "NotProbed");
    engine.remove("default/refusing");

    // run() keeps probing until cancelled.
    let cancel = tokio_util::sync::CancellationToken::new();
    let seen = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let task = {
        let (engine, cancel, seen) = (engine.clone(), cancel.clone(), seen.clone());
        tokio::spawn(async move {
            engine
                .run(cancel, move |r| {
                    seen.lock().unwrap().push((r.key, r.verdict.healthy))
                })
                .await
        })
    };
    tokio::time::sleep(Duration::from_millis(300)).await;
    cancel.cancel();
    tokio::time::timeout(Duration::from_secs(3), task)
        .await
        .unwrap()
        .unwrap();
    let seen = seen.lock().unwrap();
    assert!(seen.len() >= 2, "{seen:?}");
    assert!(
        seen.iter()
            .all(|(k, healthy)| k == "default/good" && *healthy),
        "{seen:?}"
    );

    assert_eq!(metrics.probes("TunnelRefused"), 4);
    assert_eq!(metrics.probes("ConnectFailed"), 3);
    assert!(metrics.probes("Healthy") >= 3);
    let mut text = String::new();
    prometheus_client::encoding::text::encode(&mut text, &registry).unwrap();
    assert!(
        text.contains("proxy_operator_health_probes_total{result=\"TunnelRefused\"} 4"),
        "{text}"
    );
}

/// A round over many proxies holds at most `concurrency` probes at once: one task per
/// proxy spawned up front held every probe's state for the whole round (12 MiB at 2,800
/// proxies, the largest growth of the operator's memory with the fleet).
#[tokio::test(flavor = "current_thread")]
async fn a_round_holds_no_more_probes_than_its_concurrency() {
    // Accepts and never answers: every probe waits for its timeout.
    let hole = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = hole.local_addr().unwrap();
    let _accept = tokio::spawn(async move {
        let mut held = Vec::new();
        while let Ok((s, _)) = hole.accept().await {
            held.push(s);
        }
    });
    let engine = ProbeEngine::new(
        EngineConfig {
            interval: Duration::from_secs(60),
            concurrency: 3,
            thresholds: Thresholds {
                failure: 1,
                success: 1,
            },
        },
        None,
    );
    for i in 0..200 {
        let mut s = spec(addr, 9, false);
        s.timeout = Duration::from_millis(20);
        engine.upsert(&format!("p{i}"), s, "127.0.0.1");
    }
    let rt = tokio::runtime::Handle::current();
    let base = rt.metrics().num_alive_tasks();
    let round = engine.round();
    tokio::pin!(round);
    let mut most = 0;
    let reports = loop {
        tokio::select! {
            reports = &mut round => break reports,
            _ = tokio::time::sleep(Duration::from_millis(5)) => {
                most = most.max(rt.metrics().num_alive_tasks() - base);
            }
        }
    };
    assert_eq!(reports.len(), 200);
    assert!(most >= 1, "probes were seen running");
    assert!(
        most <= 3,
        "{most} probe tasks alive at once (concurrency 3)"
    );
}
