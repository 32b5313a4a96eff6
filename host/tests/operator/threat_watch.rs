//! The "what a user writes into the metadata of watched objects" row of
//! docs/threat-model.md, against the real binary under the Deployment's memory limit.
//!
//! A tenant who may create Proxies and Secrets puts 250 KiB of annotations on each (the API
//! server allows 256 KiB an object) before the operator starts: 300 Proxies and 800
//! Secrets, 269 MiB in all. kube's default list page (500 objects) read the Secrets in two
//! pages of up to 122 MiB, each held twice while read, and the Proxy cache kept every
//! annotation: the operator was OOM-killed under the Deployment's limit (328 MiB then). The operator
//! stays up (no OOM kill), lists everything in small pages (its watches, and the orphan
//! GC's list of live Proxies, which read the 300 Proxies in one page of 75 MiB before),
//! keeps its memory far below what the tenant wrote, and runs the tenant's Proxies.

use crate::support;

use super::harness::{example_operator, fake_cluster, sample};
use fake_kube::FakeApi;
use serde_json::json;
use std::time::{Duration, Instant};

const PROXIES: usize = 300;
const SECRETS: usize = 800;
const ANNOTATION: usize = 250 * 1024;

fn seed(fake: &FakeApi) {
    let note = "n".repeat(ANNOTATION);
    fake.create(json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "tenant"}}))
        .unwrap();
    for i in 0..SECRETS {
        fake.create(json!({
            "apiVersion": "v1", "kind": "Secret",
            "metadata": {"name": format!("s{i}"), "namespace": "tenant",
                         "annotations": {"tenant.example/note": note}},
            "data": {"k": "dg=="},
        }))
        .unwrap();
    }
    for i in 0..PROXIES {
        fake.create(json!({
            "apiVersion": "egress.proxy-operator.dev/v1alpha1", "kind": "Proxy",
            "metadata": {"name": format!("p{i}"), "namespace": "default",
                         "annotations": {"tenant.example/note": note}},
            "spec": {"provider": "ex", "placement": {"region": "r1"},
                     "cloudInit": {"inline": "#cloud-config\n"}, "port": 3128},
        }))
        .unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn large_annotations_on_a_tenants_proxies_and_secrets_do_not_take_the_operator_down() {
    let plugin_dir = plugins_or_skip!();
    let dir = tempfile::tempdir().unwrap();
    let (fake, _client, kubeconfig) = fake_cluster(dir.path()).await;
    seed(&fake);
    let Some((backend, mut op)) = example_operator(
        &plugin_dir,
        dir.path(),
        &kubeconfig,
        "  budget: {requestsPerHour: 3600000, burst: 1000}\n",
        // The orphan GC lists every Proxy for its live set: each second here.
        &["--drift-poll", "2s", "--gc-interval", "1s"],
    ) else {
        return;
    };
    // Instances boot in half a second, seen by lists and Gets alike.
    backend.set_boot_time(Duration::from_millis(500));
    let started = Instant::now();
    let pid = op.child.id();
    let mut peak_rss = 0;
    while op.get("/readyz").await.0 != 200 {
        op.assert_alive("while listing the tenant's objects");
        peak_rss = peak_rss.max(support::process::resident_bytes(pid));
        assert!(
            started.elapsed() < Duration::from_secs(120),
            "not ready 120 s after the start"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    let running = r#"proxy_operator_proxies{provider="ex",state="Running",ready="false"} "#;
    loop {
        op.assert_alive("while running the tenant's Proxies");
        peak_rss = peak_rss.max(support::process::resident_bytes(pid));
        let (_, text) = op.get("/metrics").await;
        if sample(&text, running) as usize == PROXIES {
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(240),
            "{} of {PROXIES} Running after 240 s",
            sample(&text, running)
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let rss = support::process::resident_bytes(pid);
    let oom = op.cgroup.as_ref().map_or(0, |c| c.oom_kills());
    let cgroup_peak = op.cgroup.as_ref().map_or(0, |c| c.peak());
    let mib = |b: u64| b as f64 / (1 << 20) as f64;
    let written = ((PROXIES + SECRETS) * ANNOTATION) as u64;
    eprintln!(
        "{PROXIES} Proxies Running in {:.1} s beside {} MiB of annotations; operator RSS {:.1} MiB now, {:.1} MiB at most; cgroup peak {:.1} MiB of {} MiB",
        started.elapsed().as_secs_f64(),
        written >> 20,
        mib(rss),
        mib(peak_rss),
        mib(cgroup_peak),
        super::harness::DEPLOYMENT_MEMORY_LIMIT >> 20,
    );
    assert_eq!(oom, 0, "OOM kills in the operator's cgroup");
    // The cache keeps none of the annotations: the Proxies' alone are 73 MiB.
    assert!(
        rss < (PROXIES * ANNOTATION) as u64,
        "operator RSS {:.1} MiB with the tenant's Proxies cached",
        mib(rss)
    );
    // The Secrets' metadata was listed too, and the Proxies by the watch and by the GC's
    // sweeps, all in pages: every list asked for a small page.
    let lists = |resource: &str| -> Vec<_> {
        fake.requests()
            .into_iter()
            .filter(|r| r.verb == "list" && r.resource.as_deref() == Some(resource))
            .collect()
    };
    let (secret_lists, proxy_lists) = (lists("secrets"), lists("proxies"));
    assert!(
        secret_lists.len() >= SECRETS / 16,
        "the Secret watch listed {SECRETS} Secrets in {} requests",
        secret_lists.len()
    );
    // The watch's first list and at least one sweep's.
    assert!(
        proxy_lists.len() >= 2 * PROXIES / 16,
        "{PROXIES} Proxies listed in {} requests: no GC sweep ran",
        proxy_lists.len()
    );
    for r in secret_lists.iter().chain(&proxy_lists) {
        assert!(
            r.query.contains("limit=16"),
            "a list without a small page: {:?} {}",
            r.resource,
            r.query
        );
    }
    op.assert_alive("after the rollout");
}

/// The "a referenced Secret's size" row: a tenant points each of 300 Proxies at its own
/// cloud-init Secret of 1 MiB (the API server's limit), labelled for cloud-init. Holding
/// each referenced Secret's data between reads kept them all in the leader: 356 MiB
/// resident, over the Deployment's limit (328 MiB then). Secrets over the render limit are read at
/// each use and never held, so the operator stays up (52 MiB) and refuses each Proxy's
/// cloud-init by its size.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tenants_megabyte_cloud_init_secrets_are_not_held() {
    const COUNT: usize = 300;
    let plugin_dir = plugins_or_skip!();
    let dir = tempfile::tempdir().unwrap();
    let (fake, client, kubeconfig) = fake_cluster(dir.path()).await;
    let body = format!("#cloud-config\n# {}\n", "x".repeat((1 << 20) - 64));
    let data = data_encoding::BASE64.encode(body.as_bytes());
    for i in 0..COUNT {
        fake.create(json!({
            "apiVersion": "v1", "kind": "Secret",
            "metadata": {"name": format!("big{i}"), "namespace": "default",
                         "labels": {"egress.proxy-operator.dev/cloud-init": "true"}},
            "data": {"user-data": data},
        }))
        .unwrap();
        fake.create(json!({
            "apiVersion": "egress.proxy-operator.dev/v1alpha1", "kind": "Proxy",
            "metadata": {"name": format!("p{i}"), "namespace": "default"},
            "spec": {"provider": "ex", "placement": {"region": "r1"},
                     "cloudInit": {"secretKeyRef": {"name": format!("big{i}"), "key": "user-data"}},
                     "port": 3128},
        }))
        .unwrap();
    }
    drop(data);
    let Some((backend, mut op)) = example_operator(
        &plugin_dir,
        dir.path(),
        &kubeconfig,
        "",
        &["--drift-poll", "2s"],
    ) else {
        return;
    };
    let started = Instant::now();
    let pid = op.child.id();
    let proxies: kube::Api<proxy_operator::api::Proxy> = kube::Api::namespaced(client, "default");
    let mut peak_rss = 0;
    loop {
        op.assert_alive("while reading the tenant's Secrets");
        peak_rss = peak_rss.max(support::process::resident_bytes(pid));
        let list = proxies.list(&Default::default()).await.unwrap();
        let refused = list
            .items
            .iter()
            .filter(|p| {
                p.condition(proxy_operator::api::condition::PROVISIONED)
                    .is_some_and(|c| c.reason == "InvalidSpec" && c.message.contains("16384"))
            })
            .count();
        if refused == COUNT {
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(180),
            "{refused} of {COUNT} Proxies refused for their cloud-init's size after 180 s; one: {:?}",
            list.items.first().and_then(|p| p.status.as_ref())
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    // A few reconciles later (each reads its Secret again), still up and holding none.
    tokio::time::sleep(Duration::from_secs(3)).await;
    op.assert_alive("after the reads");
    let rss = support::process::resident_bytes(pid);
    let oom = op.cgroup.as_ref().map_or(0, |c| c.oom_kills());
    let mib = |b: u64| b as f64 / (1 << 20) as f64;
    eprintln!(
        "{COUNT} Proxies with 1 MiB cloud-init Secrets refused in {:.1} s; operator RSS {:.1} MiB now, {:.1} MiB at most",
        started.elapsed().as_secs_f64(),
        mib(rss),
        mib(peak_rss),
    );
    assert_eq!(oom, 0, "OOM kills in the operator's cgroup");
    assert!(
        rss < 100 << 20,
        "operator RSS {:.1} MiB: the Secrets are held",
        mib(rss)
    );
    assert!(backend.instances().is_empty(), "nothing was created");
}
