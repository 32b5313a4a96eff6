//! Hostile plugins against the sandbox: every attack ends in a classified error that names
//! the limit (or in a scrubbed log), within its limit, while a well-behaved provider keeps
//! answering, and the host process survives them all in one run.

mod support;

use egress_plugin_host::plugin::limits::LimitHit;
use egress_plugin_host::plugin::{PluginMetrics, TrapKind};
use egress_plugin_host::provider::{Class, CreateRequest, Placement, Provider, ProviderError};
use std::time::{Duration, Instant};

/// What an attack must end in.
enum Expect {
    /// A Transient error whose message contains this text.
    Limit(&'static str),
    /// A guest-reported error with one of these codes (the wasi:http error or the
    /// plugin's own) or, for errors that wasi:http reports mid-body without a code, with
    /// one of these texts in its message.
    Code(&'static [&'static str]),
    /// Success, with this ID prefix (the hostile plugin reports its findings there).
    Ok(&'static str),
    /// The host refused the plugin's reply: Transient, naming the field and rule.
    Rejected(&'static str),
}

struct Case {
    attack: String,
    limits: &'static str,
    expect: Expect,
    within: Duration,
    /// What `proxy_operator_plugin_traps_total` counts the call as, if anything.
    trap: Option<TrapKind>,
}

/// The tests of this file run one at a time: one of them measures the whole process's
/// descriptors and memory, which the others' attacks would disturb.
static ONE_AT_A_TIME: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_attack_is_contained_while_a_good_provider_keeps_working() {
    let _dir = plugins_or_skip!();
    let _one = ONE_AT_A_TIME.lock().await;
    let server = support::TestServer::start().await;
    let rt = support::runtime();
    let metrics = PluginMetrics::register(&mut prometheus_client::registry::Registry::default());
    rt.set_metrics(metrics.clone());
    let u = |p: &str| server.url(p);
    let s = Duration::from_secs;
    let ms = Duration::from_millis;
    let cases = vec![
        Case {
            attack: "loop".into(),
            limits: "fuel: 200000000",
            expect: Expect::Limit("fuel budget (limits.fuel = 200000000)"),
            within: s(3),
            trap: Some(TrapKind::Limit(LimitHit::Fuel)),
        },
        Case {
            attack: "loop".into(),
            limits: "fuel: 1000000000000, timeout: 1s",
            expect: Expect::Limit("wall-clock budget (limits.timeout = 1s)"),
            within: s(3),
            trap: Some(TrapKind::Limit(LimitHit::Deadline)),
        },
        Case {
            attack: "sleep:60000".into(),
            limits: "timeout: 1s",
            expect: Expect::Limit("wall-clock budget (limits.timeout = 1s)"),
            within: s(3),
            trap: Some(TrapKind::Limit(LimitHit::Deadline)),
        },
        Case {
            attack: "memory".into(),
            limits: "memoryMib: 16",
            expect: Expect::Limit("memory cap (limits.memoryMib = 16)"),
            within: s(3),
            trap: Some(TrapKind::Limit(LimitHit::Memory)),
        },
        Case {
            attack: "recurse".into(),
            limits: "fuel: 100000000000",
            expect: Expect::Limit("stack overflow"),
            within: s(3),
            trap: Some(TrapKind::Stack),
        },
        Case {
            attack: "panic".into(),
            limits: "logLines: 10",
            expect: Expect::Limit("hostile panic"),
            within: s(2),
            trap: Some(TrapKind::Panic),
        },
        Case {
            attack: "http:http://example.invalid/".into(),
            limits: "logLines: 10",
            expect: Expect::Code(&["HttpRequestDenied"]),
            within: s(2),
            trap: None,
        },
        Case {
            attack: format!("http:http://127.0.0.1:{}/ok", server.port + 1),
            limits: "logLines: 10",
            expect: Expect::Code(&["HttpRequestDenied"]),
            within: s(2),
            trap: None,
        },
        Case {
            attack: format!("http:{}", u("/ok").replace("127.0.0.1", "localhost")),
            limits: "logLines: 10",
            expect: Expect::Code(&["DestinationIpProhibited"]),
            within: s(2),
            trap: None,
        },
        Case {
            attack: format!("http:{}", u("/ok")),
            limits: "logLines: 10",
            expect: Expect::Ok("200"),
            within: s(2),
            trap: None,
        },
        Case {
            attack: format!("host-header:{}", u("/ok")),
            limits: "logLines: 10",
            expect: Expect::Code(&["HeaderForbidden", "HttpRequestDenied"]),
            within: s(2),
            trap: None,
        },
        Case {
            attack: "read:/etc/passwd".into(),
            limits: "logLines: 10",
            expect: Expect::Code(&["IoError"]),
            within: s(2),
            trap: None,
        },
        Case {
            attack: "read:/tmp/../etc/passwd".into(),
            limits: "logLines: 10",
            expect: Expect::Code(&["IoError"]),
            within: s(2),
            trap: None,
        },
        Case {
            attack: "write:/etc/evil".into(),
            limits: "logLines: 10",
            expect: Expect::Code(&["IoError"]),
            within: s(2),
            trap: None,
        },
        Case {
            attack: "write:/evil".into(),
            limits: "logLines: 10",
            expect: Expect::Code(&["IoError"]),
            within: s(2),
            trap: None,
        },
        Case {
            attack: "write:/tmp/fine".into(),
            limits: "logLines: 10",
            expect: Expect::Ok("wrote"),
            within: s(2),
            trap: None,
        },
        Case {
            attack: "symlink:/etc/passwd".into(),
            limits: "logLines: 10",
            expect: Expect::Code(&["SymlinkError", "IoError"]),
            within: s(2),
            trap: None,
        },
        Case {
            attack: "symlink:../../../../etc/passwd".into(),
            limits: "logLines: 10",
            expect: Expect::Code(&["SymlinkError", "IoError"]),
            within: s(2),
            trap: None,
        },
        Case {
            attack: "fill-tmp:33554432".into(),
            limits: "tmpMib: 1",
            expect: Expect::Limit("/tmp cap (limits.tmpMib = 1)"),
            within: s(4),
            trap: Some(TrapKind::Limit(LimitHit::Tmp)),
        },
        // Host resources: every one below is held by the host for the guest, so linear
        // memory and fuel do not bound it; each has its own cap and trap kind.
        Case {
            // 256 fields of 15 KB each fit under maxHeaderBytes; the table cap stops them.
            attack: "fields-flood:15000".into(),
            limits: "logLines: 10",
            expect: Expect::Limit(
                "host handles (HTTP fields, requests, bodies, streams, pollables, files) than its cap (limits.handles = 256)",
            ),
            within: s(3),
            trap: Some(TrapKind::Limit(LimitHit::Handles)),
        },
        Case {
            // One header set bigger than maxHeaderBytes: wasmtime-wasi-http traps.
            attack: "fields-flood:200000".into(),
            limits: "logLines: 10",
            expect: Expect::Limit(
                "header set larger than its cap (limits.http.maxHeaderBytes = 16384)",
            ),
            within: s(2),
            trap: Some(TrapKind::Limit(LimitHit::Headers)),
        },
        Case {
            attack: format!("hold-requests:{}", u("/slow")),
            limits: "timeout: 20s",
            expect: Expect::Limit(
                "HTTP requests in flight than its cap (limits.http.maxInFlight = 4)",
            ),
            within: s(3),
            trap: Some(TrapKind::Limit(LimitHit::Requests)),
        },
        Case {
            // One request after the other never trips the cap, even at its tightest.
            attack: format!("http-seq:{}", u("/ok")),
            limits: "http: {maxInFlight: 1}",
            expect: Expect::Ok("50_requests"),
            within: s(5),
            trap: None,
        },
        Case {
            attack: "open-files".into(),
            limits: "logLines: 10",
            expect: Expect::Limit("more files open than its cap (limits.openFiles = 32)"),
            within: s(3),
            trap: Some(TrapKind::Limit(LimitHit::Files)),
        },
        Case {
            attack: "unlink-write:33554432".into(),
            limits: "tmpMib: 1",
            expect: Expect::Limit("/tmp cap (limits.tmpMib = 1)"),
            within: s(3),
            trap: Some(TrapKind::Limit(LimitHit::Tmp)),
        },
        Case {
            // 50 levels of 100-byte names: the file is 5 KB of path deep, past PATH_MAX.
            attack: "deep-tmp:50:33554432".into(),
            limits: "tmpMib: 1",
            expect: Expect::Limit("/tmp cap (limits.tmpMib = 1)"),
            within: s(3),
            trap: Some(TrapKind::Limit(LimitHit::Tmp)),
        },
        Case {
            // The chain itself: 4 KiB per directory, 4096 levels at the default cap.
            attack: "deep-tmp:1000000:0".into(),
            limits: "tmpMib: 16, timeout: 20s",
            expect: Expect::Limit("/tmp cap (limits.tmpMib = 16)"),
            within: s(8),
            trap: Some(TrapKind::Limit(LimitHit::Tmp)),
        },
        Case {
            // 16k directories: counted, and removed after the call without delaying it.
            attack: "many-dirs".into(),
            limits: "tmpMib: 64, timeout: 20s",
            expect: Expect::Limit("/tmp cap (limits.tmpMib = 64)"),
            within: s(10),
            trap: Some(TrapKind::Limit(LimitHit::Tmp)),
        },
        Case {
            attack: "grow-tmp:1099511627776".into(),
            limits: "tmpMib: 1",
            expect: Expect::Limit("/tmp cap (limits.tmpMib = 1)"),
            within: s(3),
            trap: Some(TrapKind::Limit(LimitHit::Tmp)),
        },
        Case {
            attack: format!("http:{}", u("/big")),
            limits: "http: {maxResponseBytes: 1048576}",
            expect: Expect::Code(&["HttpResponseBodySize", "body size exceeds limit"]),
            within: s(3),
            trap: None,
        },
        Case {
            attack: format!("http:{}", u("/big-chunked")),
            limits: "http: {maxResponseBytes: 1048576}",
            expect: Expect::Code(&["HttpResponseBodySize", "body size exceeds limit"]),
            within: s(3),
            trap: None,
        },
        Case {
            attack: format!("http:{}", u("/slow")),
            limits: "http: {firstByteTimeout: 500ms}",
            expect: Expect::Code(&["ConnectionReadTimeout", "HttpResponseTimeout"]),
            within: ms(2500),
            trap: None,
        },
        Case {
            attack: format!("http:{}", u("/drip")),
            limits: "http: {betweenBytesTimeout: 500ms}",
            expect: Expect::Code(&[
                "ConnectionReadTimeout",
                "HttpResponseTimeout",
                "connection read timeout",
            ]),
            within: ms(4500),
            trap: None,
        },
        Case {
            attack: "log-flood".into(),
            limits: "fuel: 100000000000, timeout: 20s",
            expect: Expect::Ok("flooded"),
            within: s(20),
            trap: None,
        },
        // Replies the operator would otherwise act on: each is refused whole.
        Case {
            attack: "ip:127.0.0.1".into(),
            limits: "",
            expect: Expect::Rejected("instance.ip 127.0.0.1 is a loopback address"),
            within: s(2),
            trap: None,
        },
        Case {
            attack: "ip:169.254.169.254".into(),
            limits: "",
            expect: Expect::Rejected("link-local (cloud metadata)"),
            within: s(2),
            trap: None,
        },
        Case {
            attack: "ip:::ffff:10.0.0.1".into(),
            limits: "",
            expect: Expect::Rejected("IPv4-mapped internal"),
            within: s(2),
            trap: None,
        },
        Case {
            attack: "ip:fd00:ec2::254".into(),
            limits: "",
            expect: Expect::Rejected("unique local"),
            within: s(2),
            trap: None,
        },
        Case {
            attack: "ip:localhost".into(),
            limits: "",
            expect: Expect::Rejected("is not an IPv4 or IPv6 address"),
            within: s(2),
            trap: None,
        },
        Case {
            attack: "created-at:18446744073709551615".into(),
            limits: "",
            expect: Expect::Rejected("created-at"),
            within: s(2),
            trap: None,
        },
        Case {
            attack: "huge-id:1048576".into(),
            limits: "fuel: 100000000000",
            expect: Expect::Rejected("instance.id is 1048576 bytes long, more than 256"),
            within: s(5),
            trap: None,
        },
        Case {
            // Past what the host copies out of a guest at all: refused before the copy.
            attack: "huge-id:8388608".into(),
            limits: "fuel: 100000000000",
            expect: Expect::Limit("MAX_LIFT_BYTES = 3 MiB"),
            within: s(5),
            trap: None,
        },
    ];

    // The well-behaved example plugin, against its backend, answering all along.
    let backend = egress_emulators::example::ExampleBackend::start("tok");
    let secrets = tempfile::tempdir().unwrap();
    std::fs::write(secrets.path().join("token"), "tok").unwrap();
    let good = support::provider(
        &rt,
        "example.wasm",
        &format!(
            "name: good\nplugin: example.wasm\nadditionalHosts: ['{url}']\nallowPrivateAddresses: true\nsecrets: {{token: {}}}\nconfig: {{endpoint: '{url}', regions: [r1]}}",
            secrets.path().join("token").display(),
            url = backend.url()
        ),
    )
    .await;
    let req = CreateRequest {
        namespace: "ns".into(),
        proxy_name: "good".into(),
        ..CreateRequest::new(
            "good-uid",
            "test",
            Placement {
                region: "r1".into(),
                ..Placement::default()
            },
        )
    };
    let good_id = good.create(&req).await.expect("the good provider creates");
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let good_calls = {
        let stop = stop.clone();
        let good = good.clone();
        tokio::spawn(async move {
            let mut n = 0u32;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                let i = good
                    .get(&good_id)
                    .await
                    .unwrap_or_else(|e| panic!("good provider failed during attacks: {e}"));
                assert_eq!(i.uid, "good-uid");
                n += 1;
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            n
        })
    };

    let mut handles = Vec::new();
    for (i, case) in cases.into_iter().enumerate() {
        let yaml = support::hostile_yaml(server.port, case.limits)
            .replace("name: hostile", &format!("name: hostile-{i}"));
        let p = support::provider(&rt, "hostile.wasm", &yaml).await;
        handles.push(tokio::spawn(async move {
            let start = Instant::now();
            let result = p.get(&case.attack).await;
            let took = start.elapsed();
            (i, case, result, took)
        }));
    }
    let mut failures = Vec::new();
    for h in handles {
        let (i, case, result, took) = h.await.expect("the host survives every attack");
        if let Err(why) = check(&case, &result, took) {
            failures.push(format!("{}: {why}", case.attack));
        }
        // Each call is counted once, under its own kind only.
        let provider = format!("hostile-{i}");
        for kind in TrapKind::all() {
            let want = u64::from(case.trap == Some(kind));
            let got = metrics.traps(&provider, "get", kind);
            if got != want {
                failures.push(format!(
                    "{}: traps_total{{kind={}}} = {got}, want {want}",
                    case.attack,
                    kind.as_str()
                ));
            }
        }
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let n = good_calls.await.expect("good provider task");
    assert!(
        n >= 5,
        "the good provider answered only {n} times during the attacks"
    );
    assert!(
        failures.is_empty(),
        "attacks not contained:\n{}",
        failures.join("\n")
    );
}

/// A plugin that sends requests to its backend for ever is held to its provider's request
/// budget (`budget` in the providers file) and stopped when the budget has no token before
/// the call's deadline: the backend sees at most the burst plus the budget's rate over the
/// call's time (its own `limits.timeout` and the waits the host allows on top, 10x that).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_flood_is_held_to_the_budget_and_stopped() {
    let _dir = plugins_or_skip!();
    let _one = ONE_AT_A_TIME.lock().await;
    let server = support::TestServer::start().await;
    let rt = support::runtime();
    let metrics = PluginMetrics::register(&mut prometheus_client::registry::Registry::default());
    rt.set_metrics(metrics.clone());
    // 36,000/h: one token every 100 ms. limits.timeout 300ms: at most 3 s of waits.
    let yaml = format!(
        "{}\nbudget: {{requestsPerHour: 36000, burst: 3}}",
        support::hostile_yaml(server.port, "timeout: 300ms")
    );
    let p = support::provider(&rt, "hostile.wasm", &yaml).await;
    let started = Instant::now();
    let err = p
        .get(&format!("http-flood:{}", server.url("/ok")))
        .await
        .expect_err("a flood never ends by itself");
    let took = started.elapsed();
    let sent = server.hits.load(std::sync::atomic::Ordering::SeqCst);
    assert_eq!(err.class, Class::Transient, "{err:?}");
    assert!(
        err.message
            .contains("request budget (budget.requestsPerHour = 36000, burst = 3)"),
        "{err:?}"
    );
    assert_eq!(
        metrics.traps("hostile", "get", TrapKind::Limit(LimitHit::Budget)),
        1
    );
    // Burst 3, then one every 100 ms over at most 0.3 s + 3 s: 36 at most.
    assert!(sent <= 3 + 34, "{sent} requests reached the backend");
    assert!(sent >= 3, "the burst was let through: {sent}");
    assert!(took < Duration::from_secs(5), "stopped after {took:?}");
}

/// `/tmp` is private to each call: what one call writes there (a file, an empty file, a
/// directory) is gone for the next call of the same provider, although an untouched
/// directory is handed to the next call again (`plugin/scratch.rs`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nothing_written_to_tmp_reaches_the_next_call() {
    let _dir = plugins_or_skip!();
    let _one = ONE_AT_A_TIME.lock().await;
    let server = support::TestServer::start().await;
    let rt = support::runtime();
    // One call at a time: the next call gets the directory the last one left, if any.
    let yaml = support::hostile_yaml(server.port, "concurrency: 1, tmpMib: 1");
    let p = support::provider(&rt, "hostile.wasm", &yaml).await;
    for (write, read) in [
        ("write:/tmp/kept", "read:/tmp/kept"),
        ("symlink:kept", "read:/tmp/link"),
        ("ok", "read:/tmp/kept"),
    ] {
        // Twice each: the second round starts from a directory the pool handed back.
        for _ in 0..2 {
            let wrote = p.get(write).await;
            assert!(
                wrote.is_ok() || write.starts_with("symlink"),
                "{write}: {wrote:?}"
            );
            let err = p
                .get(read)
                .await
                .expect_err("the last call's /tmp is not this one's");
            assert_eq!(
                err.code.as_deref(),
                Some("IoError"),
                "{read} after {write}: {err:?}"
            );
        }
    }
}

fn check(
    case: &Case,
    result: &Result<egress_plugin_host::provider::Instance, ProviderError>,
    took: Duration,
) -> Result<(), String> {
    if took > case.within {
        return Err(format!(
            "took {took:?}, limit {:?} (result {result:?})",
            case.within
        ));
    }
    match (&case.expect, result) {
        (Expect::Limit(text), Err(e))
            if e.class == Class::Transient && e.message.contains(text) =>
        {
            Ok(())
        }
        (Expect::Code(codes), Err(e))
            if e.code.as_deref().is_some_and(|c| codes.contains(&c))
                || codes.iter().any(|c| e.message.contains(c)) =>
        {
            Ok(())
        }
        (Expect::Ok(prefix), Ok(i)) if i.id.starts_with(prefix) => Ok(()),
        (Expect::Rejected(text), Err(e))
            if e.class == Class::Transient
                && e.message.starts_with("plugin reply rejected: ")
                && e.message.contains(text) =>
        {
            Ok(())
        }
        _ => Err(format!("unexpected result {result:?}")),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn validate_config_cannot_hang_or_dial() {
    let _dir = plugins_or_skip!();
    let _one = ONE_AT_A_TIME.lock().await;
    let rt = support::runtime();
    let plugin = support::load(&rt, "hostile.wasm").await;
    let cases = [
        ("{validate: loop}", "fuel budget"),
        ("{validate: sleep}", "load-time wall-clock budget (5s)"),
        (
            "{validate: http, url: 'http://127.0.0.1:9/'}",
            "HttpRequestDenied",
        ),
    ];
    for (config, want) in cases {
        let entry = support::entry(&format!(
            "name: v\nplugin: hostile.wasm\nadditionalHosts: ['http://127.0.0.1:9']\nconfig: {config}"
        ));
        let start = Instant::now();
        let err = rt
            .provider(plugin.clone(), &entry)
            .await
            .err()
            .unwrap_or_else(|| panic!("{config}: loaded"));
        let text = err.to_string();
        assert!(text.contains(want), "{config}: {text}");
        assert!(
            text.contains("provider \"v\""),
            "{config}: names the provider: {text}"
        );
        assert!(
            start.elapsed() < Duration::from_secs(8),
            "{config}: took {:?}",
            start.elapsed()
        );
    }
    // The good config still loads on the same runtime.
    rt.provider(plugin, &support::entry("name: v\nplugin: hostile.wasm"))
        .await
        .unwrap();
}

/// The end of the shutdown grace period: a call stuck in a plugin stops at once (instead
/// of holding the pod for its whole `limits.timeout`), and no new call starts.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancelling_calls_ends_the_ones_in_flight_and_refuses_new_ones() {
    let _dir = plugins_or_skip!();
    let _one = ONE_AT_A_TIME.lock().await;
    let server = support::TestServer::start().await;
    let rt = support::runtime();
    let metrics = PluginMetrics::register(&mut prometheus_client::registry::Registry::default());
    rt.set_metrics(metrics.clone());
    let yaml = support::hostile_yaml(server.port, "timeout: 60s");
    let p = support::provider(&rt, "hostile.wasm", &yaml).await;
    let in_flight = {
        let p = p.clone();
        tokio::spawn(async move {
            let start = Instant::now();
            (p.get("sleep:60000").await, start.elapsed())
        })
    };
    tokio::time::sleep(Duration::from_millis(500)).await;
    let cancelled_at = Instant::now();
    rt.cancel_calls();
    let (result, took) = in_flight.await.expect("the call's task");
    let e = result.expect_err("a cancelled call fails");
    assert_eq!(e.class, Class::Transient, "{e}");
    assert!(e.message.contains("shutting down"), "{e}");
    assert!(
        cancelled_at.elapsed() < Duration::from_secs(1),
        "the call ended {:?} after the cancel (it ran {took:?})",
        cancelled_at.elapsed()
    );
    assert_eq!(metrics.traps("hostile", "get", TrapKind::Shutdown), 1);

    let start = Instant::now();
    let e = p
        .get("sleep:1")
        .await
        .expect_err("no call starts after cancel_calls");
    assert!(e.message.contains("call not started"), "{e}");
    assert!(start.elapsed() < Duration::from_millis(100));
}

/// Nothing sensitive leaves a hostile plugin, whatever channel it tries: replies (ID, UID),
/// errors and codes, host log calls, stdout and stderr, the host's own log and span fields
/// about its HTTP requests, and text it claims to have read back from the backend. The
/// cloud-init it sees in one Proxy's `create` stays secret in every later call, and so does
/// the cloud-init of a Proxy it never saw (the operator tells the provider about every
/// Proxy). Current-thread runtime: the log capture is per thread.
#[tokio::test]
async fn nothing_sensitive_leaves_through_any_channel() {
    let _dir = plugins_or_skip!();
    const PASSWORD: &str = "Hunter2Sentinel";
    const SHORT: &str = "kx9q";
    const LINE_VALUE: &str = "SENTINEL-RUN-7731";
    const KEY_LINE: &str = "MIIEvQIBADANBgkqhkiG9w0SENTINELKEYLINE";
    const APIKEY: &str = "apikeysentinel4242";
    const OTHER_PROXY: &str = "OTHERPROXY-SENTINEL-55";
    let cloud_init = format!(
        "#cloud-config\nwrite_files:\n  - path: /etc/tinyproxy/auth\n    content: |\n      BasicAuth proxyuser {PASSWORD}\n      pw={SHORT}\nruncmd:\n  - echo {LINE_VALUE} > /etc/x\n"
    );
    let pem = format!(
        "-----BEGIN PRIVATE KEY-----\n{KEY_LINE}\nAAAABBBBCCCCDDDDEEEEFFFFsentinelpem\n-----END PRIVATE KEY-----\n"
    );
    let secrets = tempfile::tempdir().unwrap();
    std::fs::write(secrets.path().join("token"), &pem).unwrap();
    std::fs::write(secrets.path().join("apikey"), APIKEY).unwrap();
    let yaml = format!(
        "name: hostile\nplugin: hostile.wasm\nsecrets: {{token: {}, apikey: {}}}\nlimits: {{timeout: 5s}}",
        secrets.path().join("token").display(),
        secrets.path().join("apikey").display(),
    );
    let rt = support::runtime();
    let (_guard, captured) = proxy_operator::testing::capture();
    let p = egress_plugin_host::provider::Instrumented::new(
        support::provider(&rt, "hostile.wasm", &yaml).await,
        Default::default(),
    );
    let mut seen = String::new();
    let mut req = CreateRequest {
        namespace: "ns".into(),
        proxy_name: "p".into(),
        cloud_init: cloud_init.clone().into_bytes(),
        ..CreateRequest::new(
            "uid-1",
            "test",
            Placement {
                machine_type: "stash".into(),
                ..Placement::default()
            },
        )
    };
    // Create stashes the document; every later call is a different Proxy's or none.
    seen.push_str(&format!("{:?}\n", p.create(&req).await));
    req.placement.machine_type = "id-cloud-init".into();
    seen.push_str(&format!("{:?}\n", p.create(&req).await));
    req.placement.machine_type = "leak".into();
    seen.push_str(&format!("{:?}\n", p.create(&req).await));
    // A Proxy whose create never ran: the plugin "reads its user data back".
    let other = format!("#cloud-config\nruncmd:\n  - echo {OTHER_PROXY}\n");
    p.remember_cloud_init("uid-of-another-proxy", other.as_bytes())
        .unwrap();
    let hex = |t: &str| t.bytes().map(|b| format!("{b:02x}")).collect::<String>();
    let mut attacks = vec![
        "stash-leak".to_string(),
        "id-stash".into(),
        "id-secret".into(),
        "uid-secret".into(),
        "secret-print".into(),
        "log-forge".into(),
        "secret-host".into(),
        format!("echo-hex:{}", hex(&other)),
        format!("echo-hex:{}", hex(&format!("runpass: {OTHER_PROXY}"))),
        format!(
            "echo-hex:{}",
            hex(&data_encoding::BASE64.encode(format!("{{\"ud\":{other:?}}}").as_bytes()))
        ),
    ];
    attacks.push("ok".into());
    for attack in &attacks {
        let r = p.get(attack).await;
        seen.push_str(&format!("{attack}: {r:?}\n"));
        if attack.starts_with("id-") || attack == "uid-secret" {
            let e = r.expect_err(attack);
            assert!(
                e.message.starts_with("plugin reply rejected")
                    && e.message.contains("value withheld"),
                "{attack}: {e}"
            );
        }
    }
    seen.push_str(&format!("{:?}\n", p.check().await));
    let logs = captured.all_text();
    seen.push_str(&logs);
    for sentinel in [
        PASSWORD,
        SHORT,
        LINE_VALUE,
        KEY_LINE,
        "sentinelpem",
        APIKEY,
        &APIKEY.to_uppercase(),
        OTHER_PROXY,
        "BasicAuth proxyuser",
    ] {
        assert!(!seen.contains(sentinel), "{sentinel} leaked:\n{seen}");
    }
    // Encoded forms: base64 of the document and of the key line at any alignment.
    for encoded in [
        data_encoding::BASE64.encode(cloud_init.as_bytes()),
        data_encoding::BASE64.encode(KEY_LINE.as_bytes()),
    ] {
        assert!(
            !seen.contains(&encoded[4..encoded.len() - 4]),
            "{encoded} leaked"
        );
    }
    assert!(seen.contains("[REDACTED]"), "the scrubber ran:\n{seen}");
    // A plugin's newline never starts a log line of its own.
    for line in logs.lines() {
        assert!(
            !line
                .trim_start()
                .starts_with("2026-12-01T00:00:00Z ERROR FORGED"),
            "{line}"
        );
    }
    assert!(
        logs.contains("FORGED-LINE"),
        "the forged text is logged, escaped:\n{logs}"
    );
    assert!(!logs.contains('\u{1b}'), "terminal escapes are escaped");
}

/// Runs `attack` while sampling `measure` every 2 ms; returns the error and the largest
/// sample above the one taken before.
async fn peak_during(
    p: &egress_plugin_host::plugin::WasmProvider,
    attack: &str,
    measure: fn() -> u64,
) -> (ProviderError, u64) {
    let (result, peak) = peak_while(p.get(attack), measure).await;
    (result.expect_err("the attack is stopped"), peak)
}

/// Awaits `work` while sampling `measure` every 2 ms; returns its output and the largest
/// sample above the one taken before.
async fn peak_while<T>(
    work: impl std::future::Future<Output = T>,
    measure: fn() -> u64,
) -> (T, u64) {
    let before = measure();
    let done = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let sampler = {
        let done = done.clone();
        tokio::task::spawn_blocking(move || {
            let mut peak = 0;
            while !done.load(std::sync::atomic::Ordering::Relaxed) {
                peak = peak.max(measure());
                std::thread::sleep(Duration::from_millis(2));
            }
            peak.max(measure())
        })
    };
    let result = work.await;
    done.store(true, std::sync::atomic::Ordering::Relaxed);
    let peak = sampler.await.unwrap();
    (result, peak.saturating_sub(before))
}

/// What the sandbox's caps promise about the host process itself: a plugin cannot take
/// more descriptors than `limits.openFiles` (the attack once reached EMFILE and starved
/// the operator), nor hold more host memory in `wasi:http` fields than
/// `limits.handles x limits.http.maxHeaderBytes` (once 840 MB from 1 MiB of guest memory).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn descriptors_and_memory_of_the_host_stay_bounded_under_attack() {
    let _dir = plugins_or_skip!();
    let _one = ONE_AT_A_TIME.lock().await;
    let server = support::TestServer::start().await;
    let rt = support::runtime();
    let p = support::provider(
        &rt,
        "hostile.wasm",
        &support::hostile_yaml(server.port, "openFiles: 32"),
    )
    .await;
    // Warm up: the first call sets up what every call shares (pool slot, caches).
    p.get("ok").await.unwrap();

    let (e, grew) = peak_during(&p, "open-files", || {
        support::process::descriptors(std::process::id())
    })
    .await;
    assert!(e.message.contains("limits.openFiles = 32"), "{e}");
    // 32 files, the call's /tmp preopen, and a few for the runtime's own threads.
    assert!(
        grew <= 32 + 1 + 8,
        "descriptors grew by {grew} during the open-files attack"
    );
    // ...and they are all given back.
    tokio::time::sleep(Duration::from_millis(200)).await;
    p.get("ok").await.unwrap();

    let (e, grew) = peak_during(&p, "fields-flood:15000", || {
        support::process::resident_bytes(std::process::id())
    })
    .await;
    assert!(e.message.contains("limits.handles = 256"), "{e}");
    // The fields hold at most handles x maxHeaderBytes = 256 x 16 KiB = 4 MiB; the guest's
    // own memory is capped at memoryMib (32 here) and the flood touches under 2 MiB of
    // it; the rest is allocator slack. Without the caps the same attack took 800+ MB.
    assert!(
        grew < 64 << 20,
        "resident memory grew by {} MiB during the fields flood",
        grew >> 20
    );
}

/// A `list-by-tag` reply whose strings all point at the same 64 KiB of guest memory: 2,000
/// instances ask the host to copy 3 x 2,000 x 64 KiB = 375 MiB. The host stops copying at
/// `MAX_LIFT_BYTES` and fails the call naming that bound, and the process grows by less
/// than the host side the fit counts for one call (before the bound it grew by 96 to
/// 128 MiB: wasmtime's default hostcall fuel, 128 MiB, was the only limit).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reply_cannot_make_the_host_copy_more_than_the_lift_bound() {
    let _dir = plugins_or_skip!();
    let _one = ONE_AT_A_TIME.lock().await;
    let server = support::TestServer::start().await;
    let rt = support::runtime();
    let p = support::provider(&rt, "hostile.wasm", &support::hostile_yaml(server.port, "")).await;
    // Warm up: the first calls set up what every call shares (pool slot, caches). A list
    // of the same length with 8-byte strings passes the lift (the reply rules then refuse
    // its "IP addresses").
    p.get("ok").await.unwrap();
    let small = p.list_by_tag("alias-list:2000:8").await;
    if let Err(e) = &small {
        assert!(
            !e.message.contains("MAX_LIFT_BYTES"),
            "2,000 x 3 x 8 bytes: {e}"
        );
    }

    let (result, grew) = peak_while(p.list_by_tag("alias-list:2000:65536"), || {
        support::process::resident_bytes(std::process::id())
    })
    .await;
    let e = result.expect_err("the aliased list is refused");
    assert_eq!(e.class, Class::Transient, "{e}");
    assert!(e.message.contains("MAX_LIFT_BYTES = 3 MiB"), "{e}");
    let fit = p.limits().host_bytes_per_call();
    eprintln!(
        "aliased list: resident memory grew by {:.1} MiB at its peak (bound {:.1} MiB, fit's host side per call {:.1} MiB)",
        grew as f64 / (1 << 20) as f64,
        egress_plugin_host::plugin::MAX_LIFT_BYTES as f64 / (1 << 20) as f64,
        fit as f64 / (1 << 20) as f64
    );
    assert!(
        grew < fit,
        "resident memory grew by {grew} bytes during one call, more than the {fit} bytes of host side the fit counts for it"
    );
    // The provider keeps answering.
    p.get("ok").await.unwrap();
    // Contract 0.3.0: a list of recent instances is lifted and checked like a whole one.
    assert!(p.lists_recent(), "the hostile plugin declares lists-recent");
    let (result, grew) = peak_while(
        p.list_recent_at(
            "alias-list:2000:65536",
            std::time::SystemTime::now(),
            egress_plugin_host::provider::Priority::Transition,
        ),
        || support::process::resident_bytes(std::process::id()),
    )
    .await;
    let e = result.expect_err("the aliased list of recent instances is refused");
    assert!(e.message.contains("MAX_LIFT_BYTES = 3 MiB"), "{e}");
    assert!(
        grew < fit,
        "a list of recent instances grew the process by {grew} bytes"
    );
    p.get("ok").await.unwrap();
}

/// What contract 0.2.0 lets a plugin hand the host, each bounded (threat model: plugin ->
/// host, contract 0.2.0): a value it marks sensitive is scrubbed from its own error, code and
/// log at once and refused in a later call's ID; a value too long to hold ends the call; a
/// rate limit it reports pauses only its own provider's budget, for at most an hour; and the
/// new reply fields are checked like the old ones.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn contract_0_2_0_inputs_are_checked_and_bounded() {
    let _dir = plugins_or_skip!();
    let _one = ONE_AT_A_TIME.lock().await;
    let server = support::TestServer::start().await;
    let rt = support::runtime();
    let metrics = PluginMetrics::register(&mut prometheus_client::registry::Registry::default());
    rt.set_metrics(metrics.clone());
    let (_guard, captured) = proxy_operator::testing::capture();
    let p = support::provider(&rt, "hostile.wasm", &support::hostile_yaml(server.port, "")).await;
    assert_eq!(p.plugin().version().as_str(), "0.3.0");

    // mark-sensitive: scrubbed in the very call that marks it, and in every later one.
    const TOKEN: &str = "derived-access-token-77ab";
    let e = p
        .get(&format!("mark:{TOKEN}"))
        .await
        .expect_err("mark fails");
    let logs = captured.all_text();
    // (The call's ID is the caller's own text, this test's: only the plugin's output counts.)
    assert!(
        !e.message.contains(TOKEN) && !e.code.as_deref().unwrap_or_default().contains(TOKEN),
        "{e:?}"
    );
    assert!(!logs.contains(TOKEN), "{logs}");
    assert!(e.message.contains("[REDACTED]"), "{e:?}");
    let e = p
        .get(&format!("id:{TOKEN}"))
        .await
        .expect_err("an ID holding it");
    assert!(
        e.message.contains("instance.id holds a secret") && !e.message.contains(TOKEN),
        "{e}"
    );
    // A short value is not a secret (it would match ordinary text), so an ID may hold it.
    p.get("mark:short").await.expect_err("mark fails");
    assert_eq!(p.get("id:short").await.unwrap().id, "short");
    // Too long to hold: the call ends, naming the bound; the value is never shown.
    let e = p.get("mark-huge:5000").await.expect_err("too long");
    assert_eq!(e.class, Class::Transient);
    assert!(e.message.contains("5000 bytes, more than the 2048"), "{e}");

    // New reply fields: an interrupted instance must be stopped or terminated, a price
    // must name an ISO 4217 currency, an IPv6 address must be one and public.
    let e = p.get("interrupted:running").await.expect_err("running");
    assert!(
        e.message
            .contains("instance.interrupted is set on a Running instance"),
        "{e}"
    );
    let i = p.get("interrupted:gone").await.unwrap();
    assert!(i.interrupted);
    let e = p.get("price:euro").await.expect_err("bad currency");
    assert!(
        e.message
            .contains("instance.hourly-price.currency \"euro\""),
        "{e}"
    );
    let i = p.get("price:EUR").await.unwrap();
    assert_eq!(i.hourly_price.unwrap().micros_per_hour, 12_500);
    let e = p.get("ipv6:::1").await.expect_err("loopback");
    assert!(e.message.contains("instance.ipv6 ::1 is a loopback"), "{e}");
    let e = p.get("ipv6:203.0.113.9").await.expect_err("not v6");
    assert!(
        e.message
            .contains("instance.ipv6 203.0.113.9 is not an IPv6"),
        "{e}"
    );
    let i = p.get("ipv6:2001:db8::7").await.unwrap();
    assert_eq!(
        (i.ip.as_str(), i.ipv6.as_str(), i.state),
        (
            "",
            "2001:db8::7",
            egress_plugin_host::provider::State::Running
        ),
        "an IPv6-only instance is running"
    );
    let e = p
        .quote(&Placement::new("euro", "", "", ""))
        .await
        .expect_err("bad currency");
    assert!(e.message.contains("quote.currency \"euro\""), "{e}");
    let q = p.quote(&Placement::new("CHF", "", "", "")).await.unwrap();
    assert_eq!(q.map(|p| p.currency).as_deref(), Some("CHF"));

    // A rate limit the plugin reports pauses its own budget: its next request waits (and
    // its call ends by the budget, sending nothing); another provider's is untouched.
    let yaml = |name: &str| {
        format!(
            "{}\nbudget: {{requestsPerHour: 36000, burst: 3}}",
            support::hostile_yaml(server.port, "timeout: 300ms")
        )
        .replace("name: hostile", &format!("name: {name}"))
    };
    let slowed = support::provider(&rt, "hostile.wasm", &yaml("slowed")).await;
    let other = support::provider(&rt, "hostile.wasm", &yaml("other")).await;
    let e = slowed
        .get(&format!("rate-limited:{}", u32::MAX))
        .await
        .expect_err("rate limited");
    assert_eq!(e.class, Class::QuotaExceeded, "{e}");
    let before = server.hits.load(std::sync::atomic::Ordering::SeqCst);
    let e = slowed
        .get(&format!("http:{}", server.url("/ok")))
        .await
        .expect_err("paused");
    assert!(e.message.contains("request budget"), "{e}");
    assert_eq!(
        metrics.traps("slowed", "get", TrapKind::Limit(LimitHit::Budget)),
        1
    );
    assert_eq!(
        server.hits.load(std::sync::atomic::Ordering::SeqCst),
        before
    );
    other
        .get(&format!("http:{}", server.url("/ok")))
        .await
        .expect("another provider's budget is its own");
    assert_eq!(
        server.hits.load(std::sync::atomic::Ordering::SeqCst),
        before + 1
    );
}
