//! Issue 27, items 4 and 5: compile bombs. A plugin whose compile takes minutes of CPU and
//! gigabytes (a function of 20,000 `call_indirect`s, 160 KB: more than 280 s and 8.5 GiB
//! without limits; see `support/bomb.rs`) used to be compiled with no limit at all, and
//! the wait for it blocked the task that also served `/healthz` and `/readyz`.
//!
//! Here, the real operator under the Deployment's limits (a 512Mi memory cgroup): provider
//! `ex` serves a Running Proxy, and provider `other` another. Then `ex`'s plugin file is
//! replaced, first by a slow compile (tens of seconds of CPU: the CPU-time limit ends it),
//! then by the bomb (the memory limit, or the pod's memory, ends it). Throughout, `/healthz`
//! answers every second within a second, `other`'s Proxy stays Running, each new version is
//! refused naming its limit (log and `/readyz`), the old version keeps serving (a new
//! Proxy on `ex` runs), and the operator is never killed.

use crate::support;

use super::harness::{Limits, Operator, fake_cluster, start_operator_limited, wait_for};
use egress_emulators::example::ExampleBackend;
use kube::api::{Api, PostParams};
use proxy_operator::api::Proxy;
use std::path::Path;
use std::time::{Duration, Instant};

/// One provider entry of `plugin` against `backend`.
fn entry(name: &str, plugin: &str, backend: &ExampleBackend, token: &Path) -> String {
    format!(
        "- name: {name}\n  plugin: {plugin}\n  additionalHosts: ['{url}']\n  allowPrivateAddresses: true\n  \
         limits: {{timeout: 30s}}\n  secrets: {{token: {secret}}}\n  \
         config: {{endpoint: '{url}', regions: [r1]}}\n",
        url = backend.url(),
        secret = token.display()
    )
}

fn proxy(name: &str, provider: &str) -> Proxy {
    serde_json::from_value(serde_json::json!({
        "apiVersion": "egress.proxy-operator.dev/v1alpha1",
        "kind": "Proxy",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {"provider": provider, "placement": {"region": "r1"},
                 "cloudInit": {"inline": "#cloud-config\n"}, "port": 3128},
    }))
    .unwrap()
}

async fn state(proxies: &Api<Proxy>, name: &str) -> Option<String> {
    proxies.get(name).await.ok()?.status?.state
}

async fn wait_running(proxies: &Api<Proxy>, name: &str, within: Duration) {
    wait_for(&format!("Proxy {name} to run"), within, async || {
        (state(proxies, name).await.as_deref() == Some("Running")).then_some(())
    })
    .await;
}

/// Replaces `path` whole (write and rename, as a ConfigMap update swaps its files).
fn replace(path: &Path, bytes: &[u8]) {
    let tmp = path.with_extension("partial");
    std::fs::write(&tmp, bytes).unwrap();
    std::fs::rename(&tmp, path).unwrap();
}

/// Watches the operator while `ex`'s new plugin compiles: every second, `/healthz` must
/// answer 200 within a second, `other`'s Proxy must still be Running and the operator
/// alive; until `/readyz` reports `ex`'s load error, which is returned.
async fn watch_until_refused(op: &mut Operator, proxies: &Api<Proxy>, within: Duration) -> String {
    let started = Instant::now();
    let mut answers = 0;
    let mut slowest = Duration::ZERO;
    loop {
        let asked = Instant::now();
        let health = tokio::time::timeout(Duration::from_secs(1), op.get("/healthz")).await;
        let took = asked.elapsed();
        slowest = slowest.max(took);
        match health {
            Ok((200, _)) => answers += 1,
            Ok((code, body)) => panic!("/healthz answered {code} during the compile: {body}"),
            Err(_) => panic!(
                "/healthz did not answer within 1 s, {:?} into the compile",
                started.elapsed()
            ),
        }
        op.assert_alive("during the compile");
        assert_eq!(
            state(proxies, "o1").await.as_deref(),
            Some("Running"),
            "the other provider's Proxy during the compile"
        );
        let (_, readyz) = op.get("/readyz").await;
        if let Some(line) = readyz
            .lines()
            .find(|l| l.starts_with("[!] provider ex failed"))
        {
            eprintln!(
                "refused {:?} after the change; /healthz answered {answers} time(s) meanwhile, the slowest in {slowest:?}: {line}",
                started.elapsed()
            );
            return line.to_string();
        }
        assert!(
            started.elapsed() < within,
            "ex's new version not refused within {within:?}; /readyz: {readyz}"
        );
        tokio::time::sleep(Duration::from_secs(1).saturating_sub(took)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_compile_bomb_is_refused_within_its_limits_while_everything_else_serves() {
    let shipped = plugins_or_skip!();
    let dir = tempfile::tempdir().unwrap();
    let (_fake, client, kubeconfig) = fake_cluster(dir.path()).await;
    let token = dir.path().join("token");
    std::fs::write(&token, "tok").unwrap();
    // The test's own plugin directory: `ex`'s file is replaced, `other` has a copy.
    let plugins = dir.path().join("plugins");
    std::fs::create_dir(&plugins).unwrap();
    let example = std::fs::read(shipped.join("example.wasm")).unwrap();
    std::fs::write(plugins.join("example.wasm"), &example).unwrap();
    std::fs::write(plugins.join("other.wasm"), &example).unwrap();
    let ex_backend = ExampleBackend::start("tok");
    let other_backend = ExampleBackend::start("tok");
    let providers = dir.path().join("providers.yaml");
    std::fs::write(
        &providers,
        format!(
            "providers:\n{}{}",
            entry("ex", "example.wasm", &ex_backend, &token),
            entry("other", "other.wasm", &other_backend, &token)
        ),
    )
    .unwrap();
    // The compile's memory asked for is more than the pod has: the operator takes what the
    // pod leaves (its limit minus the 96 MiB reserve), so the slow compile below meets its
    // CPU-time limit (the default, 20 s) before any memory limit.
    let Some(mut op) = start_operator_limited(
        &plugins,
        &providers,
        &kubeconfig,
        dir.path(),
        &[
            "--probe-target",
            "127.0.0.1:9",
            "--plugin-compile-memory=1Gi",
        ],
        &[],
        Limits::Deployment,
    ) else {
        return;
    };
    let body = wait_for(
        "/readyz to answer 200",
        Duration::from_secs(30),
        async || {
            let (code, body) = op.get("/readyz").await;
            (code == 200).then_some(body)
        },
    )
    .await;
    assert!(body.contains("2 provider(s) serving (ex, other)"), "{body}");
    let log = op.log();
    // The pod's limit less the 96 MiB reserve.
    let cap_mib = (super::harness::DEPLOYMENT_MEMORY_LIMIT >> 20) - 96;
    let capped = format!("memory={cap_mib} MiB");
    let cap_refused = format!("memory limit of {cap_mib} MiB");
    assert!(
        log.lines().any(|l| l.contains("plugin compile limits")
            && l.contains(&capped)
            && l.contains("memory_capped_by_the_pod=true")),
        "the compile's memory is capped by the pod: {log}"
    );

    let proxies: Api<Proxy> = Api::namespaced(client.clone(), "default");
    for (name, provider) in [("e1", "ex"), ("o1", "other")] {
        proxies
            .create(&PostParams::default(), &proxy(name, provider))
            .await
            .unwrap();
    }
    wait_running(&proxies, "e1", Duration::from_secs(20)).await;
    wait_running(&proxies, "o1", Duration::from_secs(20)).await;

    // 1. A slow compile: 44 s of CPU without limits.
    replace(
        &plugins.join("example.wasm"),
        &support::bomb::slow(&example),
    );
    let refused = watch_until_refused(&mut op, &proxies, Duration::from_secs(45)).await;
    assert!(
        refused.contains("compile exceeded its CPU-time limit of 20s (--plugin-compile-cpu)")
            // On a machine too busy to give it 20 s of CPU in 40 s.
            || refused.contains("compile exceeded its wall-time limit of 40s (--plugin-compile-timeout)")
            // Its memory grows with its CPU time: near 20 s it can reach the pod's cap first.
            || refused.contains(&format!("compile exceeded its {cap_refused} (--plugin-compile-memory)")),
        "{refused}"
    );
    let log = op.log();
    assert!(
        log.lines().any(|l| l.contains("provider not reloaded")
            && l.contains("provider=ex")
            && l.contains("compile exceeded its")
            && l.contains("previous_version_serving=true")),
        "the refusal in the log: {log}"
    );

    // The old version serves: a new Proxy on `ex` runs.
    proxies
        .create(&PostParams::default(), &proxy("e2", "ex"))
        .await
        .unwrap();
    wait_running(&proxies, "e2", Duration::from_secs(20)).await;

    // 2. The bomb: its memory grows by hundreds of MiB a second. The compile's own limit
    // (the pod's limit less the reserve here) or, if the pod's memory runs out first, the OOM killer (whose first
    // choice the compile is) ends it.
    replace(
        &plugins.join("example.wasm"),
        &support::bomb::bomb(&example),
    );
    let bombed = wait_for(
        "the bomb's refusal in /readyz",
        Duration::from_secs(30),
        async || {
            let (code, _) = tokio::time::timeout(Duration::from_secs(1), op.get("/healthz"))
                .await
                .expect("/healthz answers within 1 s");
            assert_eq!(code, 200);
            let (_, readyz) = op.get("/readyz").await;
            let line = readyz
                .lines()
                .find(|l| l.starts_with("[!] provider ex failed"))?;
            (line.contains(&cap_refused) || line.contains("out-of-memory killer"))
                .then(|| line.to_string())
        },
    )
    .await;
    eprintln!("the bomb: {bombed}");
    proxies
        .create(&PostParams::default(), &proxy("e3", "ex"))
        .await
        .unwrap();
    wait_running(&proxies, "e3", Duration::from_secs(20)).await;
    assert_eq!(state(&proxies, "o1").await.as_deref(), Some("Running"));

    let (_, readyz) = op.get("/readyz").await;
    assert!(
        readyz.contains("2 provider(s) serving (ex, other)"),
        "{readyz}"
    );
    op.assert_alive("after both compiles were refused");
    let cgroup = op
        .cgroup
        .as_ref()
        .expect("started under the Deployment's limits");
    eprintln!(
        "the pod's memory peaked at {} MiB of {}; OOM kills in it: {} (never the operator's)",
        cgroup.peak() >> 20,
        super::harness::DEPLOYMENT_MEMORY_LIMIT >> 20,
        cgroup.oom_kills()
    );
}

/// At start, the plugins compile before anything is loaded: a slow one must not keep
/// `/healthz` from answering (the liveness probe would restart the pod, which would
/// compile it again: a crash loop). `/readyz` says the plugins are not loaded yet, then
/// reports the refusal; the other provider serves.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_compile_at_start_keeps_the_probes_answering() {
    let shipped = plugins_or_skip!();
    let dir = tempfile::tempdir().unwrap();
    let (_fake, _client, kubeconfig) = fake_cluster(dir.path()).await;
    let token = dir.path().join("token");
    std::fs::write(&token, "tok").unwrap();
    let plugins = dir.path().join("plugins");
    std::fs::create_dir(&plugins).unwrap();
    let example = std::fs::read(shipped.join("example.wasm")).unwrap();
    std::fs::write(plugins.join("example.wasm"), support::bomb::slow(&example)).unwrap();
    std::fs::write(plugins.join("other.wasm"), &example).unwrap();
    let backend = ExampleBackend::start("tok");
    let providers = dir.path().join("providers.yaml");
    std::fs::write(
        &providers,
        format!(
            "providers:\n{}{}",
            entry("ex", "example.wasm", &backend, &token),
            entry("other", "other.wasm", &backend, &token)
        ),
    )
    .unwrap();
    let Some(mut op) = start_operator_limited(
        &plugins,
        &providers,
        &kubeconfig,
        dir.path(),
        &["--plugin-compile-memory=1Gi"],
        &[],
        Limits::Deployment,
    ) else {
        return;
    };
    wait_for("/healthz to answer", Duration::from_secs(10), async || {
        (op.get("/healthz").await.0 == 200).then_some(())
    })
    .await;
    let started = Instant::now();
    let mut loading = 0;
    let readyz = loop {
        let asked = Instant::now();
        let (code, _) = tokio::time::timeout(Duration::from_secs(1), op.get("/healthz"))
            .await
            .unwrap_or_else(|_| {
                panic!(
                    "/healthz did not answer within 1 s, {:?} into the first load",
                    started.elapsed()
                )
            });
        assert_eq!(code, 200);
        op.assert_alive("during the first load");
        let (code, readyz) = op.get("/readyz").await;
        if readyz.contains("[-] plugins not loaded yet") {
            assert_eq!(code, 503, "{readyz}");
            loading += 1;
        } else if readyz.contains("[+] plugins loaded") {
            break readyz;
        }
        assert!(
            started.elapsed() < Duration::from_secs(45),
            "the first load did not end: {readyz}"
        );
        tokio::time::sleep(Duration::from_secs(1).saturating_sub(asked.elapsed())).await;
    };
    eprintln!(
        "first load done {:?} after /healthz first answered ({loading} answer(s) of /readyz while loading):\n{readyz}",
        started.elapsed()
    );
    assert!(
        loading >= 3,
        "the slow compile ran while /readyz answered: {loading}"
    );
    assert!(readyz.contains("1 provider(s) serving (other)"), "{readyz}");
    assert!(
        readyz
            .lines()
            .any(|l| l.starts_with("[!] provider ex failed") && l.contains("compile exceeded its")),
        "{readyz}"
    );
    op.assert_alive("after the first load");
}
