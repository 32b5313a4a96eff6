//! ProxyPools end to end (issue 15, item 2): the pool controller and the Proxy reconciler
//! against fake-kube, the Hetzner plugin against its emulators in real-proxy mode (each
//! instance a real forward proxy on its own loopback address, all on the pool's one port,
//! requiring the credentials the operator generated for it), and the health engine probing
//! through each proxy. Ready means a CONNECT with the Proxy's credentials went through.

use crate::support;

use egress_emulators::hetzner::{HetznerConfig, HetznerEmulator};
use egress_emulators::real_proxy::{ProxyKind, RealProxies};
use egress_plugin_host::provider::Provider;
use fake_kube::FakeApi;
use k8s_openapi::api::events::v1::Event;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::ResourceExt;
use kube::api::{Api, Patch, PatchParams, PostParams};
use proxy_operator::api::{
    self, LABEL_POOL, PoolPlacement, Proxy, ProxyPool, ProxyPoolSpec, ProxyPoolStatus, condition,
    pool_condition,
};
use proxy_operator::controller::Context;
use proxy_operator::registry::ProviderRegistry;
use serde_json::json;
use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::{Duration, Instant};

const TOKEN: &str = "hz-pool-token";
const NS: &str = "default";

/// The template the samples use, reduced to what the emulator reads.
const CLOUD_INIT: &str = "#cloud-config\nwrite_files:\n  - path: /etc/tinyproxy/tinyproxy.conf\n    content: |\n      Port {{egress.port}}\n      BasicAuth {{egress.username}} {{egress.password}}\n";

struct Env {
    api: FakeApi,
    pools: Api<ProxyPool>,
    port: u16,
    _emulators: Vec<HetznerEmulator>,
    _echo: tokio::task::JoinHandle<()>,
    _token: tempfile::TempDir,
    _real: Arc<RealProxies>,
}

impl Env {
    /// One Hetzner emulator per `(provider name, server limit)`, all behind one operator.
    /// None (the test is skipped) when the plugins are not built.
    async fn start(providers: &[(&str, Option<usize>)]) -> Option<Env> {
        support::plugin_dir()?;
        let api = FakeApi::new();
        let client = api.client();
        let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
        for (_, crd) in api::crds() {
            crds.create(&PostParams::default(), &crd).await.unwrap();
        }
        let real = RealProxies::with_own_addresses(ProxyKind::Builtin);
        let token_dir = tempfile::tempdir().unwrap();
        let token = token_dir.path().join("token");
        std::fs::write(&token, TOKEN).unwrap();
        let rt = support::runtime();
        let mut emulators = Vec::new();
        let mut registered: Vec<Arc<dyn Provider>> = Vec::new();
        for (name, limit) in providers {
            let hz = HetznerEmulator::start(HetznerConfig {
                real_proxies: Some(real.clone()),
                server_limit: *limit,
                ..HetznerConfig::new(TOKEN)
            });
            let url = hz.url();
            let entry = format!(
                "name: {name}\nplugin: hetzner.wasm\nadditionalHosts: ['{url}']\nallowPrivateAddresses: true\nsecrets: {{token: {}}}\n\
                 config: {{endpoint: '{url}/v1', locations: [fsn1, nbg1], serverTypes: [cpx11], images: {{ubuntu: ubuntu-24.04}}}}",
                token.display()
            );
            registered.push(Arc::new(
                support::provider(&rt, "hetzner.wasm", &entry).await,
            ));
            emulators.push(hz);
        }
        let ctx = Context::new(
            client.clone(),
            ProviderRegistry::new(registered),
            support::fast_settings("install-pool", 1000, 300),
        );
        let echo_task =
            support::run_reconciler_and_pools(client.clone(), ctx, Duration::from_millis(200))
                .await;
        Some(Env {
            pools: Api::namespaced(client, NS),
            api,
            port: support::tinyproxy::free_port(),
            _emulators: emulators,
            _echo: echo_task,
            _token: token_dir,
            _real: real,
        })
    }

    fn spec(&self, replicas: i32, placements: Vec<PoolPlacement>) -> ProxyPoolSpec {
        ProxyPoolSpec {
            placements,
            ..ProxyPoolSpec::new(replicas, support::hetzner_spec(CLOUD_INIT, self.port))
        }
    }

    /// The pool's Proxies not being deleted.
    fn members(&self, pool: &str) -> Vec<Proxy> {
        self.api
            .objects_of::<Proxy>()
            .into_iter()
            .filter(|p| p.labels().get(LABEL_POOL).map(String::as_str) == Some(pool))
            .filter(|p| p.metadata.deletion_timestamp.is_none())
            .collect()
    }

    fn ready(&self, pool: &str) -> Vec<Proxy> {
        self.members(pool)
            .into_iter()
            .filter(|p| {
                p.condition(condition::READY)
                    .is_some_and(|c| c.status == "True")
            })
            .collect()
    }

    fn pool(&self, name: &str) -> ProxyPool {
        self.api
            .objects_of::<ProxyPool>()
            .into_iter()
            .find(|p| p.name_any() == name)
            .expect("the pool exists")
    }

    /// Waits (up to 10 s) until the pool's status counts `n` Ready Proxies, and returns it.
    async fn status_at(&self, pool: &str, n: usize) -> ProxyPoolStatus {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let status = self.pool(pool).status.unwrap_or_default();
            if status.ready_replicas == n as i32 {
                return status;
            }
            assert!(
                Instant::now() < deadline,
                "pool {pool}: status not at {n} Ready: {status:?}"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Waits (up to `within`) for exactly `n` members, all Ready.
    async fn settled(&self, pool: &str, n: usize, within: Duration) {
        let deadline = Instant::now() + within;
        loop {
            let (members, ready) = (self.members(pool).len(), self.ready(pool).len());
            if members == n && ready == n {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "pool {pool}: {ready} Ready of {members}, not {n} of {n} within {within:?}; status {:?}",
                self.pool(pool).status
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
}

fn placement(name: &str, provider: Option<&str>, region: Option<&str>) -> PoolPlacement {
    PoolPlacement {
        name: Some(name.into()),
        provider: provider.map(Into::into),
        region: region.map(Into::into),
        ..Default::default()
    }
}

/// kubectl against the served fake API; None (skipped loudly, failing under CI) without it.
fn kubectl() -> Option<std::path::PathBuf> {
    let found = std::env::var_os("PATH").and_then(|path| {
        std::env::split_paths(&path)
            .map(|d| d.join("kubectl"))
            .find(|p| p.is_file())
    });
    if found.is_none() {
        let msg = "kubectl is not installed: `kubectl scale proxypool` is not run";
        assert!(std::env::var("CI").as_deref() != Ok("true"), "{msg}");
        eprintln!("\n!!! SKIPPING the kubectl part: {msg}\n");
    }
    found
}

async fn kubectl_scale(kubeconfig: &std::path::Path, bin: &std::path::Path, n: usize) {
    let out = tokio::process::Command::new(bin)
        .arg("--kubeconfig")
        .arg(kubeconfig)
        .args([
            "scale",
            "proxypool/web",
            &format!("--replicas={n}"),
            "-n",
            NS,
        ])
        .output()
        .await
        .unwrap();
    assert!(
        out.status.success(),
        "kubectl scale failed: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A pool of 20 rotating every ~30 s keeps at least 20 Ready (its default `minReady`)
/// through a full rotation, sampled every second; every original Proxy is replaced and
/// none lives past `maxAge` plus the time a replacement takes; then `kubectl scale` to 5
/// and back to 20.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_pool_rotates_without_dropping_below_min_ready_and_scales() {
    let Some(env) = Env::start(&[("hz", None)]).await else {
        return;
    };
    const MAX_AGE: Duration = Duration::from_secs(30);
    // How long a replacement may take to be Ready (and the old one to be deleted).
    const SURGE_TIME: Duration = Duration::from_secs(15);
    let mut spec = env.spec(
        20,
        vec![
            placement("fsn1", None, Some("fsn1")),
            placement("nbg1", None, Some("nbg1")),
        ],
    );
    spec.max_age = Some(MAX_AGE);
    env.pools
        .create(&PostParams::default(), &ProxyPool::new("web", spec))
        .await
        .unwrap();
    env.settled("web", 20, Duration::from_secs(90)).await;
    // The pool's status follows its Proxies' a pass later.
    let status = env.status_at("web", 20).await;
    assert_eq!(
        (
            status.replicas,
            status.ready_replicas,
            status.updated_replicas
        ),
        (20, 20, 20),
        "{status:?}"
    );
    let spread: Vec<(String, i32)> = status
        .placements
        .iter()
        .map(|p| (p.name.clone(), p.replicas))
        .collect();
    assert_eq!(
        spread,
        [("fsn1".into(), 10), ("nbg1".into(), 10)],
        "spread by weight"
    );

    // A full rotation, sampled every second.
    let original: BTreeSet<String> = env.members("web").iter().map(|p| p.name_any()).collect();
    let deadline = Instant::now() + Duration::from_secs(150);
    let mut lowest = usize::MAX;
    loop {
        let ready = env.ready("web").len();
        lowest = lowest.min(ready);
        assert!(
            ready >= 20,
            "only {ready} Ready during rotation (minReady 20); pool status {:?}",
            env.pool("web").status
        );
        let left = env
            .members("web")
            .iter()
            .filter(|p| original.contains(&p.name_any()))
            .count();
        if left == 0 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "{left} original Proxies still there after 150 s"
        );
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    // Stop rotating, then check the ages: nobody outlived maxAge by more than a surge.
    env.pools
        .patch(
            "web",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"maxAge": null}})),
        )
        .await
        .unwrap();
    env.settled("web", 20, Duration::from_secs(60)).await;
    let now = k8s_openapi::jiff::Timestamp::now();
    for p in env.members("web") {
        let created = p.metadata.creation_timestamp.clone().unwrap().0;
        let age = Duration::try_from(now.duration_since(created)).unwrap_or_default();
        assert!(
            age <= MAX_AGE + SURGE_TIME + Duration::from_secs(60),
            "{} is {age:?} old",
            p.name_any()
        );
    }
    eprintln!("rotation of 20: lowest Ready count sampled {lowest}");

    // Scale down and up again, the way a user does.
    let dir = tempfile::tempdir().unwrap();
    let kubeconfig = dir.path().join("kubeconfig");
    let addr = env.api.serve("127.0.0.1:0").await.unwrap();
    env.api.write_kubeconfig(addr, &kubeconfig).unwrap();
    let bin = kubectl();
    for n in [5usize, 20] {
        match &bin {
            Some(bin) => kubectl_scale(&kubeconfig, bin, n).await,
            None => {
                env.pools
                    .patch_scale(
                        "web",
                        &PatchParams::default(),
                        &Patch::Merge(json!({"spec": {"replicas": n}})),
                    )
                    .await
                    .unwrap();
            }
        }
        env.settled("web", n, Duration::from_secs(60)).await;
        env.status_at("web", n).await;
    }
}

/// A placement whose backend answers every create with a quota error is skipped: the pool
/// fills from the other one, and its status and an Event say which placement fails and why.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_placement_with_quota_errors_is_skipped_and_the_pool_fills_elsewhere() {
    let Some(env) = Env::start(&[("hz", Some(0)), ("hz-b", None)]).await else {
        return;
    };
    let spec = env.spec(
        3,
        vec![
            placement("full", Some("hz"), None),
            placement("spare", Some("hz-b"), None),
        ],
    );
    env.pools
        .create(&PostParams::default(), &ProxyPool::new("web", spec))
        .await
        .unwrap();
    env.settled("web", 3, Duration::from_secs(60)).await;
    let status = env.status_at("web", 3).await;
    for p in env.members("web") {
        assert_eq!(
            p.spec.provider,
            "hz-b",
            "{} on the full placement",
            p.name_any()
        );
    }
    let full = status.placements.iter().find(|p| p.name == "full").unwrap();
    let failing = full
        .failing
        .as_ref()
        .unwrap_or_else(|| panic!("the full placement is not marked failing: {status:?}"));
    assert_eq!(failing.reason, "QuotaExceeded", "{failing:?}");
    let cond = status
        .conditions
        .iter()
        .find(|c| c.type_ == pool_condition::PLACEMENTS_FAILING)
        .unwrap();
    assert_eq!(
        (cond.status.as_str(), cond.reason.as_str()),
        ("True", "PlacementsSkipped")
    );
    assert!(
        cond.message.starts_with("full: QuotaExceeded until "),
        "{}",
        cond.message
    );
    let warned = env.api.objects_of::<Event>().into_iter().any(|e| {
        e.reason.as_deref() == Some("PlacementFailing")
            && e.regarding.as_ref().and_then(|r| r.kind.as_deref()) == Some("ProxyPool")
    });
    assert!(warned, "a PlacementFailing Event on the pool");
}

/// The ProxyPool CRD with every `maximum` and `maxLength` taken out: about the schema a
/// cluster had before issue 27, whose `format: int32` alone let `maxSurge: 4294967295`
/// through.
fn without_maximums(crd: CustomResourceDefinition) -> CustomResourceDefinition {
    fn strip(v: &mut serde_json::Value) {
        match v {
            serde_json::Value::Object(m) => {
                m.remove("maximum");
                m.remove("maxLength");
                m.values_mut().for_each(strip);
            }
            serde_json::Value::Array(a) => a.iter_mut().for_each(strip),
            _ => {}
        }
    }
    let mut crd = serde_json::to_value(crd).unwrap();
    strip(&mut crd);
    serde_json::from_value(crd).unwrap()
}

/// A pool as the API server stores it: `replicas` of the fake provider, `extra` merged into
/// its spec.
fn raw_pool(name: &str, replicas: u64, extra: serde_json::Value) -> serde_json::Value {
    let mut spec = json!({
        "replicas": replicas,
        "template": {"spec": {
            "provider": "fake",
            "placement": {"region": "r"},
            "cloudInit": {"inline": "#cloud-config\n"},
            "port": 3128,
        }},
    });
    spec.as_object_mut()
        .unwrap()
        .extend(extra.as_object().unwrap().clone());
    json!({
        "apiVersion": "egress.proxy-operator.dev/v1alpha1",
        "kind": "ProxyPool",
        "metadata": {"name": name, "namespace": NS},
        "spec": spec,
    })
}

/// The pool's Progressing condition, read untyped (a pool whose spec does not deserialize
/// cannot be read as a `ProxyPool`).
fn progressing(api: &FakeApi, pool: &str) -> Option<(String, String, String)> {
    let p = api.object("proxypools.egress.proxy-operator.dev", Some(NS), pool)?;
    let c = p
        .pointer("/status/conditions")?
        .as_array()?
        .iter()
        .find(|c| c["type"] == pool_condition::PROGRESSING)?;
    let s = |k: &str| c[k].as_str().unwrap_or_default().to_string();
    Some((s("status"), s("reason"), s("message")))
}

/// Issue 27: `maxSurge: 4294967295` is refused by the CRD, naming the field; and a pool the
/// planner cannot work from, let through by an older CRD, is reported: Progressing=False
/// with reason InvalidSpec naming the field, its value and its limit, a Warning Event and a
/// log line. It used to be silently ignored (its spec is not an `int32`, so the typed watch
/// failed on it), and, present when the operator started, it stopped every other pool of the
/// cluster: here a good pool next to it is still served.
// Single-threaded, so the pool controller logs to this thread's capture.
#[tokio::test(flavor = "current_thread")]
async fn a_pool_spec_out_of_bounds_is_refused_by_the_crd_and_reported_by_the_operator() {
    use kube::api::{ApiResource, DynamicObject};
    let (_guard, logs) = proxy_operator::testing::capture();
    let resource = ApiResource::erase::<ProxyPool>(&());
    let surge = json!({"maxSurge": 4_294_967_295u64});

    // The CRD of today refuses it, naming the field.
    let api = FakeApi::new();
    let crds: Api<CustomResourceDefinition> = Api::all(api.client());
    for (_, crd) in api::crds() {
        crds.create(&PostParams::default(), &crd).await.unwrap();
    }
    let raw: Api<DynamicObject> = Api::namespaced_with(api.client(), NS, &resource);
    let bad: DynamicObject = serde_json::from_value(raw_pool("bad", 1, surge.clone())).unwrap();
    match raw.create(&PostParams::default(), &bad).await {
        Err(kube::Error::Api(e)) => {
            assert_eq!(e.code, 422, "{e:?}");
            assert!(e.message.contains("spec.maxSurge"), "{}", e.message);
        }
        other => panic!("the CRD let maxSurge 4294967295 through: {other:?}"),
    }

    // An older CRD lets it through: the operator reports it, and serves the other pools.
    let api = FakeApi::new();
    let client = api.client();
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    for (file, crd) in api::crds() {
        let crd = if file.contains("proxypools") {
            without_maximums(crd)
        } else {
            crd
        };
        crds.create(&PostParams::default(), &crd).await.unwrap();
    }
    // Stored before the operator starts: it is in the first list.
    api.create(raw_pool("bad", 1, surge)).unwrap();
    let (cache, feed, reflect) = proxy_operator::proxy_cache::watch_proxies(client.clone());
    tokio::spawn(reflect);
    tokio::spawn(proxy_operator::pool::run(
        client.clone(),
        cache,
        feed,
        Default::default(),
        std::future::pending::<()>(),
    ));
    // One that reads as an int32 but is over the limit, through the watch.
    let raw: Api<DynamicObject> = Api::namespaced_with(client.clone(), NS, &resource);
    let over: DynamicObject =
        serde_json::from_value(raw_pool("over", 1, json!({"minReady": 20_000}))).unwrap();
    raw.create(&PostParams::default(), &over).await.unwrap();
    let good: DynamicObject = serde_json::from_value(raw_pool("good", 2, json!({}))).unwrap();
    raw.create(&PostParams::default(), &good).await.unwrap();
    // A template whose Proxies the API server refuses (the Proxy CRD bounds the region).
    let mut long = raw_pool("long", 1, json!({}));
    long["spec"]["template"]["spec"]["placement"]["region"] = json!("r".repeat(300));
    let long: DynamicObject = serde_json::from_value(long).unwrap();
    raw.create(&PostParams::default(), &long).await.unwrap();

    let want = [
        (
            "bad",
            "spec.maxSurge: 4294967295 cannot be read: invalid value: integer `4294967295`, expected i32 (it takes an integer from 0 to 10000)",
        ),
        (
            "over",
            "spec.minReady: 20000 is out of range: it must be from 0 to 10000",
        ),
    ];
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let reported = want.iter().all(|(pool, message)| {
            progressing(&api, pool)
                == Some(("False".into(), "InvalidSpec".into(), (*message).into()))
        });
        let served = env_members(&api, "good") == 2;
        let refused = progressing(&api, "long").is_some_and(|(status, reason, message)| {
            status == "False"
                && reason == "InvalidSpec"
                && message.starts_with("spec.template: the API server refused the Proxy long-")
                && message.contains("spec.placement.region")
        });
        if reported && served && refused {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "bad: {:?}; over: {:?}; long: {:?}; good has {} Proxies",
            progressing(&api, "bad"),
            progressing(&api, "over"),
            progressing(&api, "long"),
            env_members(&api, "good")
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let good = api
        .object("proxypools.egress.proxy-operator.dev", Some(NS), "good")
        .unwrap();
    assert_eq!(good.pointer("/status/replicas"), Some(&json!(2)), "{good}");

    // A Warning Event on each refused pool, with the same words.
    let events = api.objects_of::<Event>();
    for (pool, message) in want {
        let warned = events.iter().any(|e| {
            e.type_.as_deref() == Some("Warning")
                && e.reason.as_deref() == Some("InvalidSpec")
                && e.note.as_deref() == Some(message)
                && e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some(pool)
        });
        assert!(warned, "no InvalidSpec Warning Event on {pool}: {events:?}");
        // And a log line.
        assert!(
            logs.all_text().contains(message),
            "no log line for {pool}: {}",
            logs.all_text()
        );
    }
    assert!(
        events
            .iter()
            .any(|e| e.reason.as_deref() == Some("InvalidSpec")
                && e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some("long")),
        "no InvalidSpec Warning Event on long"
    );
    // No Proxy for the refused pools.
    let none = ["bad", "over", "long"].map(|p| env_members(&api, p));
    assert_eq!(none, [0, 0, 0]);
}

/// The Proxies labelled with `pool`.
fn env_members(api: &FakeApi, pool: &str) -> usize {
    api.objects_of::<Proxy>()
        .iter()
        .filter(|p| p.labels().get(LABEL_POOL).map(String::as_str) == Some(pool))
        .count()
}
