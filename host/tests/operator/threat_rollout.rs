//! The "how many Proxies a user applies at once" row of docs/threat-model.md, against the
//! real binary under the Deployment's memory limit: 600 Proxies applied at once to one
//! provider whose budget allows them all. The operator stays up (no OOM kill in its
//! cgroup), creates each instance once (a Proxy reconciled from a lagging cache copy does
//! not send its Create again), keeps its provider checks within their deadline while the
//! creates queue, and runs every Proxy.

use crate::support;

use super::harness::{example_operator, fake_cluster, sample, wait_for};
use kube::api::{Api, PostParams};
use proxy_operator::api::{ProviderHealth, Proxy};
use std::time::{Duration, Instant};

const PROXIES: usize = 600;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rollout_of_600_proxies_runs_within_the_deployments_memory_and_creates_each_once() {
    let plugin_dir = plugins_or_skip!();
    let dir = tempfile::tempdir().unwrap();
    let (_fake, client, kubeconfig) = fake_cluster(dir.path()).await;
    // A budget the rollout does not exhaust: what queues is the provider's two call slots.
    let Some((backend, mut op)) = example_operator(
        &plugin_dir,
        dir.path(),
        &kubeconfig,
        "  budget: {requestsPerHour: 3600000, burst: 1000}\n",
        &["--drift-poll", "2s"],
    ) else {
        return;
    };
    // Instances boot in half a second, as a cloud's do, seen by lists and Gets alike.
    backend.set_boot_time(Duration::from_millis(500));
    wait_for("/readyz", Duration::from_secs(60), async || {
        (op.get("/readyz").await.0 == 200).then_some(())
    })
    .await;

    let proxies: Api<Proxy> = Api::namespaced(client.clone(), "default");
    let started = Instant::now();
    let mut creates = tokio::task::JoinSet::new();
    for i in 0..PROXIES {
        let proxies = proxies.clone();
        creates.spawn(async move {
            let p: Proxy = serde_json::from_value(serde_json::json!({
                "apiVersion": "egress.proxy-operator.dev/v1alpha1",
                "kind": "Proxy",
                "metadata": {"name": format!("p{i}"), "namespace": "default"},
                "spec": {"provider": "ex", "placement": {"region": "r1"},
                         "cloudInit": {"inline": "#cloud-config\n"}, "port": 3128},
            }))
            .unwrap();
            proxies.create(&PostParams::default(), &p).await.unwrap();
        });
    }
    while let Some(r) = creates.join_next().await {
        r.unwrap();
    }

    // Every Proxy runs; meanwhile the provider's checks (every 300 ms) never time out.
    let health: Api<ProviderHealth> = Api::all(client.clone());
    let running = r#"proxy_operator_proxies{provider="ex",state="Running",ready="false"} "#;
    let mut timed_out = Vec::new();
    let mut peak_rss = 0;
    let pid = op.child.id();
    let metrics = loop {
        op.assert_alive("during the rollout");
        peak_rss = peak_rss.max(support::process::resident_bytes(pid));
        if let Some(s) = health.get_opt("ex").await.unwrap().and_then(|h| h.status) {
            let text = serde_json::to_string(&s).unwrap();
            if text.contains("CheckTimeout") {
                timed_out.push(text);
            }
        }
        let (_, text) = op.get("/metrics").await;
        if sample(&text, running) as usize == PROXIES {
            break text;
        }
        assert!(
            started.elapsed() < Duration::from_secs(180),
            "{} of {PROXIES} Running after 180 s",
            sample(&text, running)
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    let took = started.elapsed();
    let oom = op.cgroup.as_ref().map_or(0, |c| c.oom_kills());
    let cgroup_peak = op.cgroup.as_ref().map_or(0, |c| c.peak());
    eprintln!(
        "{PROXIES} Proxies Running in {:.1} s; operator RSS peak {:.1} MiB, cgroup peak {:.1} MiB of {} MiB",
        took.as_secs_f64(),
        peak_rss as f64 / (1 << 20) as f64,
        cgroup_peak as f64 / (1 << 20) as f64,
        super::harness::DEPLOYMENT_MEMORY_LIMIT >> 20,
    );
    assert_eq!(oom, 0, "OOM kills in the operator's cgroup");
    assert!(
        timed_out.is_empty(),
        "provider checks timed out: {timed_out:?}"
    );
    let sent = sample(
        &metrics,
        r#"proxy_operator_provider_requests_total{provider="ex",op="create",result="ok"} "#,
    );
    assert_eq!(sent as usize, PROXIES, "creates sent for {PROXIES} Proxies");
    assert_eq!(backend.instances().len(), PROXIES);
    op.assert_alive("after the rollout");
}
