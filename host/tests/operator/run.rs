//! `proxy-operator run`, the real binary, against the in-memory API served on 127.0.0.1:
//! what an operator's user and their monitoring see of a running replica — `/readyz`,
//! `/metrics`, ProviderHealth when a reload fails, its log lines as a log pipeline reads
//! them — and that SIGTERM ends it within the shutdown grace period even when a plugin
//! call is stuck on a backend that never answers.

use crate::support;

use super::harness::{
    fake_cluster, providers_yaml, start_operator, start_operator_with_env, wait_for,
};
use egress_emulators::example::ExampleBackend;
use kube::api::{Api, PostParams};
use proxy_operator::api::{ProviderHealth, Proxy};
use std::process::Command;
use std::time::{Duration, Instant};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_running_replica_reports_readiness_metrics_reload_errors_and_stops_within_its_grace() {
    let plugin_dir = plugins_or_skip!();
    let dir = tempfile::tempdir().unwrap();
    let (_fake, client, kubeconfig) = fake_cluster(dir.path()).await;
    let token = dir.path().join("token");
    std::fs::write(&token, "tok").unwrap();
    let backend = ExampleBackend::start("tok");
    let providers = dir.path().join("providers.yaml");
    std::fs::write(&providers, providers_yaml(&backend, &token, "")).unwrap();

    let op = start_operator(
        &plugin_dir,
        &providers,
        &kubeconfig,
        dir.path(),
        &["--probe-target", "127.0.0.1:9", "--shutdown-grace", "1s"],
    );

    // Ready once the cache synced and the plugins loaded; /healthz answers throughout.
    let body = wait_for(
        "/readyz to answer 200",
        Duration::from_secs(60),
        async || {
            let (code, body) = op.get("/readyz").await;
            (code == 200).then_some(body)
        },
    )
    .await;
    assert!(body.contains("1 provider(s) serving (ex)"), "{body}");
    assert_eq!(op.get("/healthz").await.0, 200);

    // A Proxy runs; the gauges (read off the cache) and the plugin-call histograms show it.
    let proxies: Api<Proxy> = Api::namespaced(client.clone(), "default");
    let proxy: Proxy = serde_json::from_value(serde_json::json!({
        "apiVersion": "egress.proxy-operator.dev/v1alpha1",
        "kind": "Proxy",
        "metadata": {"name": "p1", "namespace": "default"},
        "spec": {"provider": "ex", "placement": {"region": "r1"},
                 "cloudInit": {"inline": "#cloud-config\n"}, "port": 3128},
    }))
    .unwrap();
    proxies
        .create(&PostParams::default(), &proxy)
        .await
        .unwrap();
    let metrics = wait_for("the Proxy to run", Duration::from_secs(30), async || {
        let (_, text) = op.get("/metrics").await;
        text.contains(r#"proxy_operator_proxies{provider="ex",state="Running",ready="false"} 1"#)
            .then_some(text)
    })
    .await;
    for sample in [
        r#"proxy_operator_plugin_call_duration_seconds_count{provider="ex",op="create"} 1"#,
        r#"proxy_operator_plugin_call_fuel_count{provider="ex",op="create"} 1"#,
        r#"proxy_operator_provider_requests_total{provider="ex",op="create",result="ok"} 1"#,
        r#"proxy_operator_reconciles_total{result="ok"}"#,
        r#"proxy_operator_provider_reloads_total{provider="ex"} 1"#,
    ] {
        assert!(metrics.contains(sample), "{sample} not in:\n{metrics}");
    }

    // A second provider whose plugin is missing: ex keeps serving, readiness says why
    // without failing, and the provider's ProviderHealth carries the error.
    let broken = "- name: broken\n  plugin: missing.wasm\n  config: {}\n";
    std::fs::write(&providers, providers_yaml(&backend, &token, broken)).unwrap();
    let body = wait_for(
        "/readyz to report the broken provider",
        Duration::from_secs(20),
        async || {
            let (code, body) = op.get("/readyz").await;
            (code == 200 && body.contains("provider broken failed to load")).then_some(body)
        },
    )
    .await;
    assert!(body.contains("missing.wasm"), "{body}");
    let health: Api<ProviderHealth> = Api::all(client.clone());
    let status = wait_for(
        "ProviderHealth broken",
        Duration::from_secs(20),
        async || {
            health
                .get_opt("broken")
                .await
                .ok()
                .flatten()
                .and_then(|h| h.status)
                .filter(|s| s.load_error.is_some())
        },
    )
    .await;
    assert!(
        status
            .load_error
            .as_deref()
            .unwrap()
            .contains("missing.wasm"),
        "{status:?}"
    );
    let ex = health.get("ex").await.unwrap().status.unwrap();
    assert_eq!(ex.load_error, None, "ex loaded fine: {ex:?}");
    assert_eq!(
        ex.type_.as_deref(),
        Some("example"),
        "its plugin type, from the registry: {ex:?}"
    );

    // Every backend call now hangs (60 s, inside limits.timeout). SIGTERM: the delete in
    // flight gets the 1 s grace, then is cancelled, and the process exits.
    backend.inject_delay(Duration::from_secs(60), 1000);
    proxies
        .delete("p1", &Default::default())
        .await
        .expect("deleting the Proxy");
    tokio::time::sleep(Duration::from_millis(500)).await;
    let mut op = op;
    let pid = op.child.id().to_string();
    let stopped_at = Instant::now();
    let ok = Command::new("kill")
        .args(["-TERM", &pid])
        .status()
        .unwrap()
        .success();
    assert!(ok, "kill -TERM {pid}");
    let status = wait_for(
        "the operator to exit",
        Duration::from_secs(15),
        async || op.child.try_wait().unwrap(),
    )
    .await;
    let took = stopped_at.elapsed();
    assert!(status.success(), "exit status {status}");
    assert!(
        took < Duration::from_secs(5),
        "SIGTERM to exit took {took:?} with a 1 s grace period"
    );
    assert_eq!(
        op.get("/healthz").await.0,
        0,
        "the port is closed after exit"
    );
}

/// `run` refuses a providers file that cannot fit the pod before it starts anything (it
/// never reaches the API server here), and `providers` says the same to an admin before
/// deploying; both exit non-zero naming the provider, the fields and the numbers.
#[test]
fn refuses_to_start_when_the_providers_do_not_fit_the_pod() {
    let plugin_dir = plugins_or_skip!();
    let dir = tempfile::tempdir().unwrap();
    let providers = dir.path().join("providers.yaml");
    std::fs::write(
        &providers,
        "providers:\n- name: big\n  plugin: example.wasm\n  limits: {memoryMib: 512, concurrency: 8}\n  \
         config: {endpoint: 'http://127.0.0.1:1', regions: [r1]}\n",
    )
    .unwrap();
    let common = |cmd: &mut Command| {
        cmd.arg("--plugin-dir")
            .arg(&plugin_dir)
            .arg("--providers")
            .arg(&providers)
            .arg("--plugin-cache-dir")
            .arg(support::cache_dir())
            .arg("--plugin-scratch-dir")
            .arg(dir.path().join("scratch"))
            .args(["--memory-limit", "328Mi", "--scratch-limit", "64Mi"])
            .env("KUBECONFIG", dir.path().join("no-such-kubeconfig"))
            .env("NO_COLOR", "1");
    };
    let want = [
        "providers need up to",
        "big: limits.concurrency 8 x (limits.memoryMib 512 + ",
        "the pod's memory limit 328 MiB minus the operator's reserve 96 MiB leaves 232 MiB",
        "big: limits.concurrency 8 x limits.tmpMib 8 = 64 MiB",
        "but the scratch space is 64 MiB",
    ];

    let mut run = Command::new(env!("CARGO_BIN_EXE_proxy-operator"));
    run.args([
        "run",
        "--installation",
        "fit-test",
        "--leader-election=false",
    ]);
    common(&mut run);
    let out = run.output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "run must refuse: {stderr}");
    for w in want {
        assert!(stderr.contains(w), "run's error lacks {w:?}: {stderr}");
    }
    assert!(
        !stderr.contains("Kubernetes"),
        "refused before connecting: {stderr}"
    );

    let mut check = Command::new(env!("CARGO_BIN_EXE_proxy-operator"));
    check.args(["providers", "--check"]);
    common(&mut check);
    let out = check.output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        !out.status.success(),
        "providers --check must fail: {stdout}"
    );
    assert!(stdout.contains("failed  providers need up to"), "{stdout}");
    for w in want {
        assert!(
            stdout.contains(w),
            "providers' report lacks {w:?}: {stdout}"
        );
    }
}

/// One hostile provider inside a running operator, its Proxies' every reconcile an attack
/// on the host's descriptors, memory and /tmp: the operator stays within its descriptor and
/// memory bounds, keeps answering /healthz, and the other provider's Proxy stays Ready (a
/// real CONNECT through tinyproxy keeps passing) all along. The hostile Proxies' status
/// says which limit stopped each call.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hostile_provider_cannot_starve_the_operator_or_the_other_providers() {
    let plugin_dir = plugins_or_skip!();
    let Some(tinyproxy) = support::tinyproxy::tinyproxy_bin() else {
        return;
    };
    let (echo, _echo) = support::tinyproxy::echo_server().await;
    let proxy =
        support::tinyproxy::Tinyproxy::start(&tinyproxy, &format!("ConnectPort {echo}")).await;
    let dir = tempfile::tempdir().unwrap();
    // The operator loads the *.wasm of one directory; the hostile plugin lives in testing/.
    let plugins = dir.path().join("plugins");
    std::fs::create_dir(&plugins).unwrap();
    for (from, name) in [
        (plugin_dir.join("example.wasm"), "example.wasm"),
        (
            plugin_dir.join("testing").join("hostile.wasm"),
            "hostile.wasm",
        ),
    ] {
        std::fs::copy(&from, plugins.join(name))
            .unwrap_or_else(|e| panic!("{}: {e}", from.display()));
    }
    let (_fake, client, kubeconfig) = fake_cluster(dir.path()).await;
    let token = dir.path().join("token");
    std::fs::write(&token, "tok").unwrap();
    let backend = ExampleBackend::start("tok");
    let providers = dir.path().join("providers.yaml");
    // The hostile provider runs at the default limits (concurrency 2, openFiles 32,
    // handles 256, memoryMib 32, tmpMib 8).
    std::fs::write(
        &providers,
        providers_yaml(
            &backend,
            &token,
            "- name: hostile\n  plugin: hostile.wasm\n",
        ),
    )
    .unwrap();
    let op = start_operator(
        &plugins,
        &providers,
        &kubeconfig,
        dir.path(),
        &[
            "--probe-target",
            &format!("127.0.0.1:{echo}"),
            "--probe-interval",
            "300ms",
        ],
    );
    let pid = op.child.id();
    let body = wait_for("/readyz", Duration::from_secs(60), async || {
        let (code, body) = op.get("/readyz").await;
        (code == 200).then_some(body)
    })
    .await;
    assert!(body.contains("2 provider(s) serving"), "{body}");

    let proxies: Api<Proxy> = Api::namespaced(client.clone(), "default");
    let spec = |name: &str, provider: &str, machine: &str, port: u16| -> Proxy {
        serde_json::from_value(serde_json::json!({
            "apiVersion": "egress.proxy-operator.dev/v1alpha1",
            "kind": "Proxy",
            "metadata": {"name": name, "namespace": "default"},
            "spec": {"provider": provider,
                     "placement": {"region": "r1", "machineType": machine},
                     "cloudInit": {"inline": "#cloud-config\n"}, "port": port},
        }))
        .unwrap()
    };
    // The good Proxy's instance is 127.0.0.1 (the example backend); tinyproxy is its proxy.
    proxies
        .create(
            &PostParams::default(),
            &spec("good", "ex", "small", proxy.addr.port()),
        )
        .await
        .unwrap();
    let ready = |p: &Proxy| {
        p.status.as_ref().is_some_and(|s| {
            s.conditions
                .iter()
                .any(|c| c.type_ == "Ready" && c.status == "True")
        })
    };
    wait_for(
        "the good Proxy to be Ready",
        Duration::from_secs(60),
        async || {
            proxies
                .get("good")
                .await
                .ok()
                .filter(|p| ready(p))
                .map(|_| ())
        },
    )
    .await;
    let (fds_before, rss_before) = (
        support::process::descriptors(pid),
        support::process::resident_bytes(pid),
    );

    let attacks = [
        ("files", "get:open-files", "limits.openFiles = 32"),
        ("fields", "get:fields-flood:15000", "limits.handles = 256"),
        ("memory", "get:memory", "limits.memoryMib = 32"),
        ("dirs", "get:many-dirs", "limits.tmpMib = 8"),
    ];
    for (name, machine, _) in attacks {
        proxies
            .create(
                &PostParams::default(),
                &spec(name, "hostile", machine, 3128),
            )
            .await
            .unwrap();
    }
    // Every reconcile of each hostile Proxy repeats its attack (backoff from 1 s); watch
    // for 15 s: the good Proxy stays Ready, /healthz answers, the process stays bounded.
    let until = Instant::now() + Duration::from_secs(15);
    let (mut fds_peak, mut rss_peak) = (fds_before, rss_before);
    while Instant::now() < until {
        let (fds, rss) = (
            support::process::descriptors(pid),
            support::process::resident_bytes(pid),
        );
        fds_peak = fds_peak.max(fds);
        rss_peak = rss_peak.max(rss);
        assert_eq!(
            op.get("/healthz").await.0,
            200,
            "/healthz stopped answering"
        );
        let good = proxies.get("good").await.unwrap();
        assert!(ready(&good), "the good Proxy lost Ready: {:?}", good.status);
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // Descriptors: two hostile calls at a time, each at most openFiles + maxInFlight + its
    // /tmp; plus the probes', kube client's and reconciles' own sockets.
    let fds_grew = fds_peak.saturating_sub(fds_before);
    eprintln!(
        "under attack: descriptors +{fds_grew}, RSS +{} MiB (peak over the 15 s)",
        rss_peak.saturating_sub(rss_before) >> 20
    );
    assert!(
        fds_grew <= 2 * (32 + 4 + 1) + 40,
        "the operator's descriptors grew by {fds_grew} under attack"
    );
    // Memory: two hostile calls at a time, each at most memoryMib (32) + its host-side
    // worst case (about 10 MiB): 84 MiB; the rest is allocator slack. Before the caps,
    // the fields flood alone took the process to 840 MB.
    let rss_grew = rss_peak.saturating_sub(rss_before);
    assert!(
        rss_grew < 128 << 20,
        "the operator's resident memory grew by {} MiB under attack",
        rss_grew >> 20
    );
    // Each hostile Proxy's reconcile fails naming the limit that stopped its call.
    let log = std::fs::read_to_string(&op.log).unwrap();
    for (name, _, limit) in attacks {
        assert!(
            log.lines()
                .any(|l| l.contains(&format!("proxy.name=\"{name}\"")) && l.contains(limit)),
            "{name}: no reconcile error naming {limit:?} in the operator log"
        );
    }
}

/// An OTLP/HTTP collector on 127.0.0.1 that accepts every export and keeps nothing: with
/// it, the operator records trace ids without a real collector. Its URL.
async fn null_collector() -> String {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move {
        while let Ok((mut tcp, _)) = listener.accept().await {
            tokio::spawn(async move {
                let mut buf = vec![0u8; 64 * 1024];
                let _ = tcp.read(&mut buf).await;
                let _ = tcp.write_all(b"HTTP/1.1 200 OK\r\ncontent-type: application/x-protobuf\r\ncontent-length: 0\r\nconnection: close\r\n\r\n").await;
            });
        }
    });
    url
}

/// `--log-format json`, as the shipped Deployment runs: every line on stderr is one JSON
/// object with the time, level, target and the event's own fields; a line written inside a
/// reconcile also carries the reconcile span's fields (the Proxy, its provider, the trace
/// id) under `span`, and every open span's under `spans`, so a log pipeline can select a
/// Proxy's lines or jump to its trace.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn json_logs_are_one_object_per_line_with_the_span_fields() {
    let plugin_dir = plugins_or_skip!();
    let dir = tempfile::tempdir().unwrap();
    let (_fake, client, kubeconfig) = fake_cluster(dir.path()).await;
    let token = dir.path().join("token");
    std::fs::write(&token, "tok").unwrap();
    let backend = ExampleBackend::start("tok");
    let providers = dir.path().join("providers.yaml");
    std::fs::write(&providers, providers_yaml(&backend, &token, "")).unwrap();
    let collector = null_collector().await;
    let op = start_operator_with_env(
        &plugin_dir,
        &providers,
        &kubeconfig,
        dir.path(),
        &["--log-format", "json", "--probe-target", "127.0.0.1:9"],
        &[("OTEL_EXPORTER_OTLP_ENDPOINT", collector.as_str())],
    );
    wait_for(
        "/readyz to answer 200",
        Duration::from_secs(60),
        async || (op.get("/readyz").await.0 == 200).then_some(()),
    )
    .await;
    let proxies: Api<Proxy> = Api::namespaced(client.clone(), "default");
    let proxy: Proxy = serde_json::from_value(serde_json::json!({
        "apiVersion": "egress.proxy-operator.dev/v1alpha1",
        "kind": "Proxy",
        "metadata": {"name": "p1", "namespace": "default"},
        "spec": {"provider": "ex", "placement": {"region": "r1"},
                 "cloudInit": {"inline": "#cloud-config\n"}, "port": 3128},
    }))
    .unwrap();
    proxies
        .create(&PostParams::default(), &proxy)
        .await
        .unwrap();
    // The probe target refuses, so the reconciles keep logging inside their span.
    wait_for(
        "a log line inside p1's reconcile",
        Duration::from_secs(30),
        async || {
            let log = std::fs::read_to_string(&op.log).unwrap_or_default();
            log.lines()
                .any(|l| l.contains(r#""name":"reconcile""#) && l.contains(r#""proxy.name":"p1""#))
                .then_some(())
        },
    )
    .await;
    let mut op = op;
    let pid = op.child.id().to_string();
    assert!(
        Command::new("kill")
            .args(["-TERM", &pid])
            .status()
            .unwrap()
            .success()
    );
    wait_for(
        "the operator to exit",
        Duration::from_secs(15),
        async || op.child.try_wait().unwrap(),
    )
    .await;

    let log = std::fs::read_to_string(&op.log).unwrap();
    let lines: Vec<serde_json::Value> = log
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("not a JSON line ({e}): {l:?}")))
        .collect();
    assert!(lines.len() >= 5, "too few lines:\n{log}");
    for (line, text) in lines.iter().zip(log.lines()) {
        let field = |k: &str| line.get(k).and_then(|v| v.as_str()).unwrap_or_default();
        assert!(
            ["TRACE", "DEBUG", "INFO", "WARN", "ERROR"].contains(&field("level")),
            "level in {text}"
        );
        assert!(
            !field("target").is_empty() && !field("timestamp").is_empty(),
            "target and timestamp in {text}"
        );
        assert!(
            humantime::parse_rfc3339_weak(&field("timestamp")[..19]).is_ok(),
            "an RFC 3339 timestamp in {text}"
        );
        // The event's own fields (its message, usually), flattened next to those.
        let own = line.as_object().unwrap().keys().any(|k| {
            ![
                "timestamp",
                "level",
                "target",
                "span",
                "spans",
                "threadName",
                "threadId",
            ]
            .contains(&k.as_str())
        });
        assert!(own, "the event's fields in {text}");
    }
    // The event's own fields sit next to the message.
    let starting = lines
        .iter()
        .find(|l| l["message"] == "starting")
        .unwrap_or_else(|| panic!("no `starting` line in\n{log}"));
    assert_eq!(starting["installation"], "run-test", "{starting}");
    // Inside a reconcile: the span's fields, the trace id among them.
    let inside = lines
        .iter()
        .find(|l| l["span"]["name"] == "reconcile" && l["span"]["proxy.name"] == "p1")
        .unwrap_or_else(|| panic!("no line inside p1's reconcile in\n{log}"));
    eprintln!("a line inside a reconcile: {inside}");
    let span = &inside["span"];
    assert_eq!(span["proxy.namespace"], "default", "{inside}");
    assert_eq!(span["provider.name"], "ex", "{inside}");
    assert!(
        span["proxy.uid"].as_str().is_some_and(|u| !u.is_empty()),
        "{inside}"
    );
    let trace_id = span["trace_id"].as_str().unwrap_or_default();
    assert!(
        trace_id.len() == 32 && trace_id.chars().all(|c| c.is_ascii_hexdigit()),
        "a trace id in {inside}"
    );
    assert!(
        inside["spans"]
            .as_array()
            .is_some_and(|s| s.iter().any(|s| s["name"] == "reconcile")),
        "the span list in {inside}"
    );
    // A provider call's lines carry both the reconcile's and the call's fields.
    assert!(
        lines.iter().any(|l| {
            l["spans"].as_array().is_some_and(|s| {
                s.iter().any(|s| s["proxy.name"] == "p1")
                    && s.iter()
                        .any(|s| s["name"] == "provider.create" && s["provider.name"] == "ex")
            })
        }),
        "no line inside p1's provider.create in\n{log}"
    );
}

/// Text logs written to a file or a pipe (a pod log, `2> file`) hold no ANSI escape codes,
/// even without `NO_COLOR`: colour is for terminals only.
#[test]
fn text_logs_off_a_terminal_have_no_colour_codes() {
    let plugin_dir = plugins_or_skip!();
    let dir = tempfile::tempdir().unwrap();
    let providers = dir.path().join("providers.yaml");
    std::fs::write(
        &providers,
        "providers:\n- name: ex\n  plugin: example.wasm\n  \
         config: {endpoint: 'http://127.0.0.1:1', regions: [r1]}\n\
         - name: broken\n  plugin: missing.wasm\n",
    )
    .unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_proxy-operator"))
        .arg("providers")
        .arg("--plugin-dir")
        .arg(&plugin_dir)
        .arg("--providers")
        .arg(&providers)
        .arg("--plugin-cache-dir")
        .arg(support::cache_dir())
        .arg("--plugin-scratch-dir")
        .arg(dir.path().join("scratch"))
        .env("RUST_LOG", "debug")
        .env_remove("NO_COLOR")
        .env_remove("LOG_FORMAT")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.lines().filter(|l| l.contains("DEBUG")).count() >= 1
            && stderr.lines().filter(|l| l.contains("INFO")).count() >= 1,
        "expected debug and info lines on stderr:\n{stderr}"
    );
    assert!(
        !stderr.contains("\x1b["),
        "ANSI escape codes on a non-terminal stderr:\n{stderr:?}"
    );
}
