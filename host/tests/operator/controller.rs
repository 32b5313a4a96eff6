//! The Proxy controller end to end: the real kube-runtime Controller, finalizer and status
//! code against the in-memory Kubernetes API (fake-kube) and the in-memory fake provider.
//! Poll intervals are shrunk to tens of milliseconds; everything else is production code.

use crate::support;

use egress_plugin_host::provider::{Class, Op, Provider, State, name_from_uid};
use fake_kube::FakeApi;
use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use kube::{Resource, ResourceExt};
use proxy_operator::api::{
    self, ANNOTATION_SKIP_CLEANUP, CloudInit, Proxy, ProxySpec, SecretKeyRef, condition,
};
use proxy_operator::controller::decide::{event, reason};
use proxy_operator::controller::secret_cache::SecretCache;
use proxy_operator::controller::{self, Context, FINALIZER, HealthHook, Settings};
use proxy_operator::inventory::Inventory;
use proxy_operator::probe::{EngineConfig, ProbeEngine, Thresholds};
use proxy_operator::proxy_cache::{ProxyCache, ProxyFeed};
use proxy_operator::registry::ProviderRegistry;
use proxy_operator::testing::fake_provider::{Behaviour, FakeProvider};
use serde_json::json;
use std::sync::Arc;
use std::time::Duration;
use tokio::task::JoinHandle;

const INSTALLATION: &str = "install-test";
const WAIT: Duration = Duration::from_secs(15);

fn settings() -> Settings {
    support::fast_settings(INSTALLATION, 200, 300)
}

struct Env {
    api: FakeApi,
    proxies: Api<Proxy>,
    fake: Arc<FakeProvider>,
    registry: ProviderRegistry,
    controller: Option<JoinHandle<()>>,
    /// Probes running proxies when set (see [`Env::with_health`]).
    health: Option<HealthHook>,
    /// Reconcile counters, registered in `registry`.
    metrics: prometheus_client::registry::Registry,
    reconcile_metrics: controller::ReconcileMetrics,
    /// Drift detection by list, as in production (`None`: one Get per drift poll).
    inventory: Option<Arc<Inventory>>,
    /// The running controller's cloud-init Secret cache.
    secret_cache: Option<Arc<SecretCache>>,
    /// The controller's drift poll (`settings()`'s unless a test changes it).
    drift: Duration,
    /// The process's shared Proxy cache, as `run` wires it; `None`: the controller's own.
    shared: Option<(ProxyCache, Arc<ProxyFeed>)>,
    /// Reconciles at once (`settings()`'s unless a test changes it).
    concurrency: u16,
}

impl Env {
    /// A fake cluster with the CRDs installed, the fake provider registered as `fake`, and
    /// a running controller.
    async fn start() -> Env {
        let fake = Arc::new(FakeProvider::new("fake"));
        Self::start_with(
            fake.clone(),
            ProviderRegistry::new([fake as Arc<dyn Provider>]),
        )
        .await
    }

    async fn start_with(fake: Arc<FakeProvider>, registry: ProviderRegistry) -> Env {
        let api = FakeApi::new();
        let client = api.client();
        let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
        for (_, crd) in api::crds() {
            crds.create(&PostParams::default(), &crd).await.unwrap();
        }
        let mut env = Env {
            proxies: Api::namespaced(client, "default"),
            api,
            fake,
            registry,
            controller: None,
            health: None,
            metrics: Default::default(),
            reconcile_metrics: Default::default(),
            // Production uses two drift polls; three here, so that a loaded test machine
            // delaying a 200 ms list does not make the inventory stale.
            inventory: Some(Arc::new(Inventory::new(settings().timings.drift_poll * 3))),
            secret_cache: None,
            drift: settings().timings.drift_poll,
            shared: None,
            concurrency: settings().concurrency,
        };
        env.reconcile_metrics = controller::ReconcileMetrics::register(&mut env.metrics);
        env.start_controller();
        env
    }

    fn start_controller(&mut self) {
        let mut settings = settings();
        settings.timings.drift_poll = self.drift;
        settings.concurrency = self.concurrency;
        let mut ctx = Context::new(self.api.client(), self.registry.clone(), settings)
            .with_metrics(self.reconcile_metrics.clone());
        if let Some(hook) = &self.health {
            ctx = ctx.with_health(hook.clone());
        }
        if let Some(inventory) = &self.inventory {
            ctx = ctx.with_inventory(inventory.clone());
        }
        if let Some((cache, feed)) = &self.shared {
            ctx = ctx.with_proxy_cache(cache.clone(), feed.clone());
        }
        let ctx = Arc::new(ctx);
        self.secret_cache = Some(ctx.secret_cache());
        self.controller = Some(tokio::spawn(controller::run(
            ctx,
            std::future::pending::<()>(),
        )));
    }

    /// Restarts the controller with a health engine probing every running proxy through
    /// `target` every 50 ms, and makes the fake provider put every instance on 127.0.0.1
    /// (where the test runs a real proxy).
    async fn with_health(&mut self, target: &str, failure_threshold: u32) -> Arc<ProbeEngine> {
        self.with_health_refresh(target, failure_threshold, Duration::from_secs(300))
            .await
    }

    /// [`Env::with_health`] with `lastProbe` refreshed at most every `probe_refresh`.
    async fn with_health_refresh(
        &mut self,
        target: &str,
        failure_threshold: u32,
        probe_refresh: Duration,
    ) -> Arc<ProbeEngine> {
        let engine = ProbeEngine::new(
            EngineConfig {
                interval: Duration::from_millis(50),
                concurrency: 16,
                thresholds: Thresholds {
                    failure: failure_threshold,
                    success: 1,
                },
            },
            None,
        );
        self.fake.set_fixed_ip("127.0.0.1");
        self.health = Some(HealthHook {
            engine: engine.clone(),
            target: target.to_string(),
            egress_echo: None,
            timeout: Duration::from_secs(2),
            tls: None,
            probe_refresh,
        });
        self.crash_controller().await;
        self.start_controller();
        engine
    }

    async fn wait_ready(&self, name: &str, want: &str) -> Proxy {
        self.wait(name, &format!("Ready {want}"), |p| {
            p.and_then(|p| p.condition(condition::READY))
                .is_some_and(|c| c.status == want)
        })
        .await
        .unwrap()
    }

    /// Kills the controller mid-flight, as a crash would: reconciles in progress are
    /// dropped wherever they are.
    async fn crash_controller(&mut self) {
        if let Some(h) = self.controller.take() {
            h.abort();
            let _ = h.await;
        }
    }

    async fn create(&self, name: &str, spec: ProxySpec) -> Proxy {
        let mut p = Proxy::new(name, spec);
        p.metadata.namespace = Some("default".into());
        self.proxies
            .create(&PostParams::default(), &p)
            .await
            .unwrap()
    }

    /// Polls until `f` accepts the Proxy (None: it is gone), or panics after [`WAIT`].
    async fn wait(
        &self,
        name: &str,
        what: &str,
        f: impl Fn(Option<&Proxy>) -> bool,
    ) -> Option<Proxy> {
        let deadline = tokio::time::Instant::now() + WAIT;
        loop {
            let p = self.proxies.get_opt(name).await.unwrap();
            if f(p.as_ref()) {
                return p;
            }
            if tokio::time::Instant::now() > deadline {
                panic!(
                    "timed out waiting for {what}; last seen: {:#?}\nprovider calls: {:?}",
                    p.map(|p| p.status),
                    self.fake.calls()
                );
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    async fn wait_running(&self, name: &str) -> Proxy {
        self.wait(name, "Running", |p| {
            p.is_some_and(|p| {
                provisioned(p) == Some(("True".into(), reason::RUNNING.into()))
                    && p.status.as_ref().unwrap().state.as_deref() == Some("Running")
            })
        })
        .await
        .unwrap()
    }

    async fn wait_reason(&self, name: &str, want: &str) -> Proxy {
        self.wait(name, want, |p| {
            p.and_then(provisioned).is_some_and(|(_, r)| r == want)
        })
        .await
        .unwrap()
    }

    /// Event reasons published on the Proxy, oldest first.
    fn events(&self, name: &str) -> Vec<String> {
        let mut events: Vec<_> = self
            .api
            .objects("events.events.k8s.io")
            .into_iter()
            .filter(|e| e["regarding"]["name"] == name)
            .collect();
        events.sort_by_key(|e| e["eventTime"].as_str().unwrap_or_default().to_string());
        events
            .iter()
            .map(|e| e["reason"].as_str().unwrap_or_default().to_string())
            .collect()
    }

    /// The Event objects with `reason` published on the Proxy.
    fn events_of(&self, name: &str, reason: &str) -> Vec<serde_json::Value> {
        self.api
            .objects("events.events.k8s.io")
            .into_iter()
            .filter(|e| e["regarding"]["name"] == name && e["reason"] == reason)
            .collect()
    }

    /// Waits until `op` was called `n` more times than now (each a retry of a reconcile).
    async fn wait_calls(&self, op: Op, n: usize) {
        let want = self.fake.count_calls(op) + n;
        let deadline = tokio::time::Instant::now() + WAIT;
        while self.fake.count_calls(op) < want {
            assert!(
                tokio::time::Instant::now() < deadline,
                "timed out waiting for {n} more {op} calls"
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }
}

/// The one `reason` Event on `name`: a Warning, published once (no series: not one per
/// retry), its note the condition's `message`.
fn said_once(env: &Env, name: &str, reason: &str, message: &str) {
    let events = env.events_of(name, reason);
    assert_eq!(events.len(), 1, "{events:#?}");
    let e = &events[0];
    assert_eq!(e["type"], "Warning", "{e:#}");
    assert!(e["series"].is_null(), "published on every retry: {e:#}");
    assert_eq!(e["note"].as_str(), Some(message), "{e:#}");
}

fn provisioned(p: &Proxy) -> Option<(String, String)> {
    p.condition(condition::PROVISIONED)
        .map(|c| (c.status.clone(), c.reason.clone()))
}

use support::fake_spec as spec;

#[tokio::test]
async fn proxy_goes_provisioned_and_running() {
    let env = Env::start().await;
    let created = env.create("p1", spec("z1")).await;
    let p = env.wait_running("p1").await;

    let status = p.status.clone().unwrap();
    let uid = created.uid().unwrap();
    let id = format!("fake/{}", name_from_uid(&uid));
    assert_eq!(status.provider_id.as_deref(), Some(id.as_str()));
    assert_eq!(status.port, Some(3128));
    assert!(
        status
            .ip
            .as_deref()
            .is_some_and(|ip| ip.starts_with("192.0.2."))
    );
    assert_eq!(status.observed_generation, Some(1));
    assert_eq!(status.spec_hash.as_ref().map(String::len), Some(64));
    assert_eq!(p.finalizers(), [FINALIZER]);
    // Healthy comes from the health engine; until it has probed, Ready says so.
    let ready = p.condition(condition::READY).unwrap();
    assert_eq!(
        (ready.status.as_str(), ready.reason.as_str()),
        ("False", "HealthUnknown")
    );

    let req = env.fake.last_create_request().unwrap();
    assert_eq!(req.name, name_from_uid(&uid));
    assert_eq!(req.uid, uid);
    assert_eq!(req.installation, INSTALLATION);
    assert_eq!(
        (req.namespace.as_str(), req.proxy_name.as_str()),
        ("default", "p1")
    );
    assert_eq!(req.placement.zone, "z1");
    assert_eq!(req.cloud_init, b"#cloud-config\npackages: [tinyproxy]\n");
    assert_eq!(env.fake.created(), 1);
    let events = env.events("p1");
    assert!(
        events.contains(&event::CREATED.to_string())
            && events.contains(&event::PROVISIONED.to_string()),
        "{events:?}"
    );

    // The finalizer was in place before the first Create reached the provider.
    let requests = env.api.requests();
    let finalizer_patch = requests
        .iter()
        .position(|r| {
            r.verb == "patch" && r.subresource.is_none() && r.resource.as_deref() == Some("proxies")
        })
        .expect("finalizer patch");
    let first_status = requests
        .iter()
        .position(|r| r.subresource.as_deref() == Some("status"))
        .expect("status write");
    assert!(finalizer_patch < first_status);
    // Every status write is a server-side apply under the one field manager.
    for r in requests
        .iter()
        .filter(|r| r.subresource.as_deref() == Some("status"))
    {
        assert_eq!(
            r.field_manager.as_deref(),
            Some(controller::FIELD_MANAGER),
            "{r:?}"
        );
    }
}

// Also on the multi-threaded runtime the operator runs on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn spec_edit_replaces_the_instance_under_the_same_name() {
    let env = Env::start().await;
    env.fake.set_behaviour(Behaviour {
        deleting_gets: 3,
        ..Behaviour::default()
    });
    env.create("p1", spec("z1")).await;
    let before = env.wait_running("p1").await.status.unwrap();

    env.proxies
        .patch(
            "p1",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"placement": {"zone": "z2"}}})),
        )
        .await
        .unwrap();
    let p = env
        .wait("p1", "replacement running", |p| {
            p.is_some_and(|p| {
                let s = p.status.as_ref().unwrap();
                s.spec_hash != before.spec_hash
                    && s.observed_generation == Some(2)
                    && s.state.as_deref() == Some("Running")
            })
        })
        .await
        .unwrap();
    let after = p.status.unwrap();

    // Same name, hence the same ID from this provider; a second real creation.
    assert_eq!(after.provider_id, before.provider_id);
    assert_eq!(env.fake.created(), 2);
    let instances = env.fake.instances();
    assert_eq!(instances.len(), 1);
    assert_eq!(instances[0].state, State::Running);
    assert_eq!(env.fake.last_create_request().unwrap().placement.zone, "z2");
    // The new Create came only after Get answered NotFound for the old instance: the fake
    // would otherwise have adopted the dying one instead of creating (created() == 2).
    let calls = env.fake.calls();
    let first_delete = calls.iter().position(|(op, _)| *op == Op::Delete).unwrap();
    let second_create = calls
        .iter()
        .enumerate()
        .filter(|(_, (op, _))| *op == Op::Create)
        .nth(1)
        .unwrap()
        .0;
    assert!(first_delete < second_create, "{calls:?}");
    let events = env.events("p1");
    assert!(events.contains(&event::REPLACING.to_string()), "{events:?}");
}

#[tokio::test]
async fn deletion_releases_the_finalizer_only_after_not_found() {
    let env = Env::start().await;
    env.fake.set_behaviour(Behaviour {
        deleting_gets: 5,
        ..Behaviour::default()
    });
    env.create("p1", spec("z1")).await;
    env.wait_running("p1").await;

    env.proxies
        .delete("p1", &DeleteParams::default())
        .await
        .unwrap();
    let deadline = tokio::time::Instant::now() + WAIT;
    let mut saw_deleting = false;
    loop {
        // Proxy first, then the backend: the release must come after the instance is gone.
        let proxy = env.proxies.get_opt("p1").await.unwrap();
        let instances = env.fake.instances();
        match proxy {
            None => {
                assert!(instances.is_empty(), "released while {instances:?} remains");
                break;
            }
            Some(p) => {
                assert!(p.metadata.deletion_timestamp.is_some());
                saw_deleting |= !instances.is_empty();
            }
        }
        assert!(tokio::time::Instant::now() < deadline, "never released");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    assert!(
        saw_deleting,
        "the Proxy waited while the instance was deleting"
    );
    assert!(env.fake.count_calls(Op::Delete) >= 1);
    assert!(env.events("p1").contains(&event::DELETED.to_string()));
}

/// A Proxy with more finalizers than the cache keeps (`watched::MAX_FINALIZERS`): the
/// operator adds and releases its own from the server's list, so it drops none of the
/// others' (its merge patch writes the whole list).
#[tokio::test]
async fn finalizers_beyond_the_caches_bound_are_all_kept() {
    let env = Env::start().await;
    let others: Vec<String> = (0..proxy_operator::watched::MAX_FINALIZERS + 4)
        .map(|i| format!("other.example/f{i}"))
        .collect();
    let mut p = Proxy::new("p1", spec("z1"));
    p.metadata.namespace = Some("default".into());
    p.metadata.finalizers = Some(others.clone());
    env.proxies
        .create(&PostParams::default(), &p)
        .await
        .unwrap();
    env.wait_running("p1").await;
    let server = env.proxies.get("p1").await.unwrap();
    let mut want = others.clone();
    want.push(controller::FINALIZER.to_string());
    assert_eq!(
        server.finalizers(),
        want,
        "the operator's added to all the others"
    );

    env.proxies
        .delete("p1", &DeleteParams::default())
        .await
        .unwrap();
    let released = env
        .wait("p1", "our finalizer released", |p| {
            p.is_some_and(|p| !p.finalizers().iter().any(|f| f == controller::FINALIZER))
        })
        .await
        .unwrap();
    assert_eq!(released.finalizers(), others, "only the operator's went");
    assert!(
        env.fake.instances().is_empty(),
        "the instance was deleted first"
    );
}

#[tokio::test]
async fn quota_is_a_condition_and_a_slow_retry() {
    let env = Env::start().await;
    env.fake.fail_next(Op::Create, Class::QuotaExceeded, 2);
    env.create("p1", spec("z1")).await;
    let p = env.wait_reason("p1", reason::QUOTA_EXCEEDED).await;
    assert_eq!(provisioned(&p).unwrap().0, "False");
    let message = &p.condition(condition::PROVISIONED).unwrap().message;
    assert!(message.contains("injected fault"), "{message}");
    env.wait_running("p1").await;
    assert_eq!(env.fake.created(), 1);
    assert!(
        env.events("p1")
            .contains(&event::QUOTA_EXCEEDED.to_string())
    );
}

#[tokio::test]
async fn permanent_error_latches_until_the_spec_changes() {
    let env = Env::start().await;
    env.fake.fail_next(Op::Create, Class::Permanent, 1);
    env.create("p1", spec("z1")).await;
    env.wait_reason("p1", reason::PERMANENT_ERROR).await;
    let creates = env.fake.count_calls(Op::Create);

    // Latched: no provider call, also not when the Proxy is touched without a spec change
    // (an annotation does not change metadata.generation).
    env.proxies
        .patch(
            "p1",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"annotations": {"touched": "yes"}}})),
        )
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(600)).await;
    assert_eq!(env.fake.count_calls(Op::Create), creates);
    // (Lists are the inventory's, per provider, not per Proxy.)
    assert!(
        env.fake
            .calls()
            .iter()
            .all(|(op, _)| matches!(op, Op::Create | Op::List))
    );
    assert!(
        env.events("p1")
            .contains(&event::PERMANENT_ERROR.to_string())
    );

    env.proxies
        .patch(
            "p1",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"placement": {"machineType": "medium"}}})),
        )
        .await
        .unwrap();
    let p = env.wait_running("p1").await;
    assert_eq!(p.status.unwrap().observed_generation, Some(2));
}

#[tokio::test]
async fn transient_errors_back_off_and_recover() {
    let env = Env::start().await;
    env.fake.fail_next(Op::Create, Class::Transient, 3);
    env.fake.fail_next(Op::Get, Class::Transient, 2);
    env.create("p1", spec("z1")).await;
    let p = env.wait_running("p1").await;
    assert_eq!(env.fake.created(), 1);
    assert!(env.fake.count_calls(Op::Create) >= 4);
    // Transient failures were said on the way; the last condition set is the instance's.
    assert_eq!(provisioned(&p).unwrap().1, reason::RUNNING);

    // Each failed reconcile is counted by what failed, each good one as ok.
    let mut text = String::new();
    prometheus_client::encoding::text::encode(&mut text, &env.metrics).unwrap();
    let count = |result: &str| -> u64 {
        let prefix = format!("proxy_operator_reconciles_total{{result=\"{result}\"}} ");
        text.lines()
            .find_map(|l| l.strip_prefix(prefix.as_str()))
            .map(|v| v.trim().parse().unwrap())
            .unwrap_or(0)
    };
    assert!(count("provider_transient") >= 3, "{text}");
    assert!(count("ok") >= 1, "{text}");
    assert!(
        text.contains(
            "proxy_operator_reconcile_duration_seconds_bucket{le=\"0.005\",result=\"ok\"}"
        ),
        "{text}"
    );
}

/// Issue 27: a Proxy whose create keeps failing Transient says why on the object, not
/// only in the operator's log: `Provisioned=False ProviderError` (and so `Ready`) with the
/// operation and the provider's message, and one Warning Event. The retries go on with
/// backoff but write nothing and publish nothing new; once the provider answers, the Proxy
/// goes Running and the condition says so.
#[tokio::test]
async fn a_create_failing_transient_is_said_on_the_proxy_once_until_it_clears() {
    let env = Env::start().await;
    env.fake.fail_next(Op::Create, Class::Transient, 1_000_000);
    let started = std::time::Instant::now();
    env.create("p1", spec("z1")).await;
    env.wait_reason("p1", reason::PROVIDER_ERROR).await;
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "said after {:?}",
        started.elapsed()
    );
    // Retried (a few backoffs), and said once.
    env.wait_calls(Op::Create, 3).await;
    let p = env.proxies.get("p1").await.unwrap();
    let c = p.condition(condition::PROVISIONED).unwrap().clone();
    assert_eq!(c.status, "False");
    assert!(
        c.message.contains("provider \"fake\" create")
            && c.message.contains("injected fault")
            && c.message.contains("retrying with backoff"),
        "{c:?}"
    );
    let ready = p.condition(condition::READY).unwrap();
    assert_eq!(
        (ready.status.as_str(), ready.reason.as_str()),
        ("False", reason::PROVIDER_ERROR)
    );
    assert_eq!(p.status.as_ref().unwrap().provider_id, None);
    said_once(&env, "p1", event::PROVIDER_ERROR, &c.message);
    // More retries write no status.
    env.wait_calls(Op::Create, 3).await;
    let again = env.proxies.get("p1").await.unwrap();
    assert_eq!(
        again.resource_version(),
        p.resource_version(),
        "status rewritten"
    );
    said_once(&env, "p1", event::PROVIDER_ERROR, &c.message);

    env.fake.clear_faults();
    let p = env.wait_running("p1").await;
    let c = p.condition(condition::PROVISIONED).unwrap();
    assert!(
        c.message.contains("running at") && !c.message.contains("injected fault"),
        "{c:?}"
    );
    assert_eq!(env.fake.created(), 1);
    assert!(env.events("p1").contains(&event::PROVISIONED.to_string()));
    assert_eq!(env.events_of("p1", event::PROVIDER_ERROR).len(), 1);
}

/// Issue 27: a Running Proxy whose drift-check Get fails Transient keeps its address and
/// stays Ready (the failure says nothing about the instance); the failure is said in the
/// `Provisioned` message and one Warning Event, and the message clears with the next good
/// answer. (Drift checks by Get: no inventory; health probes through a real tinyproxy.)
#[tokio::test]
async fn a_drift_check_failing_transient_is_said_and_the_proxy_stays_ready() {
    let Some(bin) = support::tinyproxy::tinyproxy_bin() else {
        return;
    };
    let (echo, _echo) = support::tinyproxy::echo_server().await;
    let tp = support::tinyproxy::Tinyproxy::start(&bin, &format!("ConnectPort {echo}")).await;
    let mut env = Env::start().await;
    env.inventory = None;
    env.with_health(&format!("127.0.0.1:{echo}"), 1).await;
    let mut s = spec("z1");
    s.port = i32::from(tp.addr.port());
    env.create("p1", s).await;
    let p = env.wait_ready("p1", "True").await;
    let address = |p: &Proxy| {
        let s = p.status.clone().unwrap();
        (s.ip, s.port)
    };
    let published = address(&p);
    assert!(published.0.is_some());

    env.fake.fail_next(Op::Get, Class::Transient, 1_000_000);
    let p = env
        .wait("p1", "the drift check's failure said", |p| {
            p.and_then(|p| p.condition(condition::PROVISIONED))
                .is_some_and(|c| c.message.contains("injected fault"))
        })
        .await
        .unwrap();
    env.wait_calls(Op::Get, 3).await;
    let p2 = env.proxies.get("p1").await.unwrap();
    for p in [&p, &p2] {
        let c = p.condition(condition::PROVISIONED).unwrap();
        assert_eq!(
            (c.status.as_str(), c.reason.as_str()),
            ("True", reason::RUNNING),
            "{c:?}"
        );
        assert!(c.message.contains("provider \"fake\" get"), "{c:?}");
        assert_eq!(address(p), published, "the address stays published");
        assert_eq!(p.condition(condition::READY).unwrap().status, "True");
    }
    let c = p2.condition(condition::PROVISIONED).unwrap();
    said_once(&env, "p1", event::PROVIDER_ERROR, &c.message);

    env.fake.clear_faults();
    let p = env
        .wait("p1", "the failure cleared", |p| {
            p.and_then(|p| p.condition(condition::PROVISIONED))
                .is_some_and(|c| c.status == "True" && !c.message.contains("failed"))
        })
        .await
        .unwrap();
    assert_eq!(address(&p), published);
    assert_eq!(p.condition(condition::READY).unwrap().status, "True");
    assert_eq!(env.events_of("p1", event::PROVIDER_ERROR).len(), 1);
    drop(tp);
}

/// Issue 27: a Proxy whose instance cannot be deleted (Transient) says so in its
/// `Deleting` condition and one Warning Event while the finalizer holds it; once Delete
/// works it is released.
#[tokio::test]
async fn a_delete_failing_transient_while_finalizing_is_said_once() {
    let env = Env::start().await;
    env.create("p1", spec("z1")).await;
    env.wait_running("p1").await;
    env.fake.fail_next(Op::Delete, Class::Transient, 1_000_000);
    env.proxies
        .delete("p1", &DeleteParams::default())
        .await
        .unwrap();
    env.wait("p1", "the failed Delete said", |p| {
        p.and_then(|p| p.condition(condition::PROVISIONED))
            .is_some_and(|c| c.reason == reason::DELETING && c.message.contains("injected fault"))
    })
    .await;
    env.wait_calls(Op::Delete, 3).await;
    let p = env.proxies.get("p1").await.unwrap();
    let c = p.condition(condition::PROVISIONED).unwrap();
    assert!(
        c.status == "False" && c.message.contains("provider \"fake\" delete"),
        "{c:?}"
    );
    said_once(&env, "p1", event::PROVIDER_ERROR, &c.message);
    env.fake.clear_faults();
    env.wait("p1", "released", |p| p.is_none()).await;
    assert!(env.fake.instances().is_empty());
}

#[tokio::test]
async fn crash_between_create_and_status_write_makes_no_duplicate() {
    let mut env = Env::start().await;
    env.fake.hold_after_create(true);
    env.create("p1", spec("z1")).await;
    // The instance exists on the backend, but Create has not returned: no ID in status.
    let deadline = tokio::time::Instant::now() + WAIT;
    while env.fake.instances().is_empty() {
        assert!(tokio::time::Instant::now() < deadline);
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    env.crash_controller().await;
    let p = env.proxies.get("p1").await.unwrap();
    assert_eq!(p.status.and_then(|s| s.provider_id), None);

    env.fake.hold_after_create(false);
    env.start_controller();
    env.wait_running("p1").await;
    assert_eq!(env.fake.created(), 1, "Create was repeated, not duplicated");
    assert_eq!(env.fake.instances().len(), 1);
    assert!(env.fake.count_calls(Op::Create) >= 2);
}

/// A watch that lags the server (an informer under load) hands reconciles a copy older
/// than the status the last one wrote. Such a copy shows no instance ID for a Proxy that has
/// one: acting on it would send the Create again (the backend answers it by name, at the
/// cost of a request, and the Hetzner plugin's two).
#[tokio::test]
async fn a_lagging_watch_sends_no_second_create() {
    let env = Env::start().await;
    // Longer than the provisioning poll and every retry, so each requeue finds the cache
    // behind the status the last reconcile wrote.
    env.api
        .delay("watch-event", "proxies", Duration::from_millis(400));
    env.create("p1", spec("z1")).await;
    env.wait_running("p1").await;
    assert_eq!(
        env.fake.count_calls(Op::Create),
        1,
        "{:?}",
        env.fake.calls()
    );
    assert_eq!(env.fake.instances().len(), 1);
}

#[tokio::test]
async fn provider_configured_later_is_picked_up_without_a_spec_change() {
    let fake = Arc::new(FakeProvider::new("fake"));
    let env = Env::start_with(fake.clone(), ProviderRegistry::new([])).await;
    env.create("p1", spec("z1")).await;
    let p = env.wait_reason("p1", reason::PROVIDER_NOT_CONFIGURED).await;
    assert!(
        p.condition(condition::PROVISIONED)
            .unwrap()
            .message
            .contains("\"fake\"")
    );
    assert!(p.finalizers().contains(&FINALIZER.to_string()));
    assert!(fake.calls().is_empty());

    env.registry.replace([fake.clone() as Arc<dyn Provider>]);
    let p = env.wait_running("p1").await;
    assert_eq!(p.metadata.generation, Some(1));
    assert_eq!(fake.created(), 1);
}

#[tokio::test]
async fn missing_secret_is_a_condition_then_the_secret_is_used() {
    let env = Env::start().await;
    let sentinel = "SENTINEL-proxy-password-93f1";
    let mut s = spec("z1");
    s.cloud_init = CloudInit {
        inline: None,
        secret_key_ref: Some(SecretKeyRef {
            name: "ci".into(),
            key: "user-data".into(),
        }),
    };
    env.create("p1", s).await;
    let p = env.wait_reason("p1", reason::CLOUD_INIT_UNAVAILABLE).await;
    assert!(
        p.condition(condition::PROVISIONED)
            .unwrap()
            .message
            .contains("default/ci not found")
    );
    assert!(
        env.fake.calls().iter().all(|(op, _)| *op == Op::List),
        "no Create without cloud-init (lists are the inventory's)"
    );

    let secrets: Api<Secret> = Api::namespaced(env.api.client(), "default");
    let mut secret = Secret::default();
    secret.metadata.name = Some("ci".into());
    secret.string_data = Some(
        [(
            "user-data".to_string(),
            format!("#cloud-config\npassword: {sentinel}\n"),
        )]
        .into(),
    );
    secrets
        .create(&PostParams::default(), &secret)
        .await
        .unwrap();
    // Not labelled as meant for cloud-init: a user who may create Proxies but not read
    // Secrets must not render any Secret of the namespace into an instance's user data.
    env.wait("p1", "the missing label named", |p| {
        p.and_then(|p| p.condition(condition::PROVISIONED))
            .is_some_and(|c| {
                c.reason == reason::CLOUD_INIT_UNAVAILABLE
                    && c.message
                        .contains("lacks the label egress.proxy-operator.dev/cloud-init: \"true\"")
            })
    })
    .await;
    assert!(
        env.fake.calls().iter().all(|(op, _)| *op == Op::List),
        "no Create from a Secret not meant for cloud-init"
    );
    secret.metadata.labels = Some(
        [(
            "egress.proxy-operator.dev/cloud-init".to_string(),
            "true".to_string(),
        )]
        .into(),
    );
    secret.metadata.resource_version = None;
    secrets
        .replace("ci", &PostParams::default(), &secret)
        .await
        .unwrap();
    let p = env.wait_running("p1").await;
    let req = env.fake.last_create_request().unwrap();
    assert_eq!(
        req.cloud_init,
        format!("#cloud-config\npassword: {sentinel}\n").into_bytes()
    );
    // The cloud-init content never reaches status or events (logs: controller_logs.rs).
    let status = serde_json::to_string(&p.status).unwrap();
    let events = serde_json::to_string(&env.api.objects("events.events.k8s.io")).unwrap();
    assert!(!status.contains(sentinel) && !events.contains(sentinel));
}

#[tokio::test]
async fn stopped_or_vanished_instances_are_recreated_under_the_same_name() {
    let env = Env::start().await;
    env.create("p1", spec("z1")).await;
    let id = env
        .wait_running("p1")
        .await
        .status
        .unwrap()
        .provider_id
        .unwrap();

    env.fake.stop(&id);
    // The stopped phase can be too short to observe; the events record it.
    env.wait("p1", "recreated after stopping", |_| {
        env.fake.created() == 2
    })
    .await;
    env.wait_running("p1").await;
    assert!(
        env.events("p1")
            .contains(&event::INSTANCE_STOPPED.to_string())
    );

    env.fake.vanish(&id);
    env.wait("p1", "recreated after vanishing", |_| {
        env.fake.created() == 3
    })
    .await;
    let p = env.wait_running("p1").await;
    assert_eq!(p.status.unwrap().provider_id.as_deref(), Some(id.as_str()));
    assert_eq!(env.fake.instances().len(), 1);
    assert!(env.events("p1").contains(&event::INSTANCE_LOST.to_string()));
}

#[tokio::test]
async fn skip_cleanup_releases_without_deleting() {
    let env = Env::start().await;
    env.create("p1", spec("z1")).await;
    env.wait_running("p1").await;
    env.proxies
        .patch(
            "p1",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"annotations": {ANNOTATION_SKIP_CLEANUP: "true"}}})),
        )
        .await
        .unwrap();
    env.proxies
        .delete("p1", &DeleteParams::default())
        .await
        .unwrap();
    env.wait("p1", "released", |p| p.is_none()).await;
    assert_eq!(env.fake.instances().len(), 1, "the instance stays");
    assert_eq!(env.fake.count_calls(Op::Delete), 0);
}

#[tokio::test]
async fn permanent_get_while_deleting_still_deletes_and_releases() {
    let mut env = Env::start().await;
    env.create("p1", spec("z1")).await;
    env.wait_running("p1").await;
    // Stopped while the fault is armed, so that the first Get after the restart is the
    // deletion's (a drift poll would otherwise take the fault and latch).
    env.crash_controller().await;
    env.fake.fail_next(Op::Get, Class::Permanent, 1);
    env.proxies
        .delete("p1", &DeleteParams::default())
        .await
        .unwrap();
    env.start_controller();
    env.wait("p1", "released", |p| p.is_none()).await;
    assert_eq!(env.fake.count_calls(Op::Delete), 1);
    // The fake keeps a deleted instance visible for a Get; the release did not wait for it,
    // because after a permanent Get nothing else could be learned about it.
    assert!(
        env.fake
            .instances()
            .iter()
            .all(|i| i.state == State::Terminated)
    );
}

#[tokio::test]
async fn the_object_reference_of_events_is_the_proxy() {
    let env = Env::start().await;
    let p = env.create("p1", spec("z1")).await;
    env.wait_running("p1").await;
    let ev = env
        .api
        .objects("events.events.k8s.io")
        .into_iter()
        .find(|e| e["reason"] == event::CREATED)
        .unwrap();
    let r = p.object_ref(&());
    assert_eq!(ev["regarding"]["uid"], json!(r.uid));
    assert_eq!(ev["regarding"]["kind"], "Proxy");
    assert_eq!(ev["reportingController"], "proxy-operator");
}

/// The leak GC exists for: the operator crashes between Create and the status write, and the
/// Proxy is deleted before it comes back, so the instance has no owner anywhere. GC removes
/// it once it is past MinAge, and touches nothing else: the live Proxy's instance, a young
/// orphan, an instance without a UID, another installation's instance.
#[tokio::test]
async fn gc_collects_the_orphan_of_a_crash_and_nothing_else() {
    use proxy_operator::gc::{GcMetrics, GcSettings, Sweeper};
    use std::time::SystemTime;

    let mut env = Env::start().await;
    env.fake.set_behaviour(Behaviour {
        deleting_gets: 0,
        ..Behaviour::default()
    });
    env.create("live", spec("z1")).await;
    let live_id = env
        .wait_running("live")
        .await
        .status
        .unwrap()
        .provider_id
        .unwrap();

    env.fake.hold_after_create(true);
    env.create("doomed", spec("z1")).await;
    let deadline = tokio::time::Instant::now() + WAIT;
    while env.fake.instances().len() < 2 {
        assert!(tokio::time::Instant::now() < deadline);
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    env.crash_controller().await;
    env.fake.hold_after_create(false);
    env.proxies
        .delete("doomed", &DeleteParams::default())
        .await
        .unwrap();
    env.start_controller();
    env.wait("doomed", "released", |p| p.is_none()).await;
    let orphan = env
        .fake
        .instances()
        .into_iter()
        .find(|i| i.id != live_id)
        .expect("the crash left an instance behind")
        .id;

    let hour_ago = SystemTime::now() - Duration::from_secs(3600);
    // Stamped a minute ahead, so it stays younger than MinAge for the whole test.
    let young = env.fake.insert(
        "proxy-young",
        "uid-young",
        INSTALLATION,
        Some(SystemTime::now() + Duration::from_secs(60)),
    );
    let no_uid = env
        .fake
        .insert("proxy-nouid", "", INSTALLATION, Some(hour_ago));
    let foreign = env
        .fake
        .insert("proxy-foreign", "uid-x", "another-install", Some(hour_ago));

    let settings = GcSettings {
        interval: Duration::from_millis(100),
        min_age: Duration::from_millis(300),
        installation: INSTALLATION.into(),
    };
    let sweeper = Sweeper::new(
        env.api.client(),
        env.registry.clone(),
        settings,
        GcMetrics::default(),
    );
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let gc = tokio::spawn(sweeper.run(async {
        let _ = stopped.await;
    }));
    let deadline = tokio::time::Instant::now() + WAIT;
    while env.fake.instance(&orphan).is_some() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "orphan never collected"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // A few more rounds: nothing else goes.
    tokio::time::sleep(Duration::from_millis(400)).await;
    let _ = stop.send(());
    gc.await.unwrap();
    let mut left: Vec<String> = env.fake.instances().into_iter().map(|i| i.id).collect();
    left.sort();
    let mut want = vec![live_id, young, no_uid, foreign];
    want.sort();
    assert_eq!(left, want);
    let deletes: Vec<String> = env
        .fake
        .calls()
        .into_iter()
        .filter(|(op, _)| *op == Op::Delete)
        .map(|(_, id)| id)
        .collect();
    assert!(deletes.iter().all(|id| *id == orphan), "{deletes:?}");
}

/// The acceptance run: 50 Proxies against a provider failing 20% of its calls (transient
/// and quota), slow answers, and a controller killed and restarted at pseudo-random points.
/// At the end every Proxy runs, the backend holds exactly 50 instances (no duplicates),
/// and after the Proxies are deleted and GC has run, it holds none.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fault_injection_run() {
    use proxy_operator::gc::{GcMetrics, GcSettings, Sweeper};
    const N: usize = 50;
    // Every instance is a real proxy: 127.0.0.1, where tinyproxy listens, so "Ready" means
    // a CONNECT through it worked, as in production.
    let Some(bin) = support::tinyproxy::tinyproxy_bin() else {
        return;
    };
    let (echo, _echo) = support::tinyproxy::echo_server().await;
    let tp = support::tinyproxy::Tinyproxy::start(&bin, &format!("ConnectPort {echo}")).await;
    let started = std::time::Instant::now();
    let mut env = Env::start().await;
    env.with_health(&format!("127.0.0.1:{echo}"), 3).await;
    let mut proxy_spec = spec("z1");
    proxy_spec.port = i32::from(tp.addr.port());
    env.fake.set_behaviour(Behaviour {
        provisioning_gets: 2,
        deleting_gets: 2,
        latency: Duration::from_millis(3),
        ..Behaviour::default()
    });
    env.fake.set_random_faults(
        0.2,
        &[Class::Transient, Class::QuotaExceeded, Class::Transient],
        0x5eed,
    );
    let mut rng: u64 = 0x9e3779b97f4a7c15;
    let mut next = move |lo: u64, hi: u64| {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        lo + rng % (hi - lo)
    };
    let mut restarts = 0;
    for i in 0..N {
        env.create(&format!("p{i:02}"), proxy_spec.clone()).await;
    }
    let all_running = |list: &[Proxy]| {
        list.len() == N
            && list.iter().all(|p| {
                provisioned(p) == Some(("True".into(), reason::RUNNING.into()))
                    && p.status.as_ref().unwrap().state.as_deref() == Some("Running")
                    && p.condition(condition::READY)
                        .is_some_and(|c| c.status == "True")
            })
    };
    let deadline = tokio::time::Instant::now() + Duration::from_secs(120);
    loop {
        let list = env.proxies.list(&Default::default()).await.unwrap().items;
        if all_running(&list) {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "not all Running and Ready: {:#?}",
            list.iter()
                .filter(
                    |p| !(provisioned(p) == Some(("True".into(), reason::RUNNING.into()))
                        && p.condition(condition::READY)
                            .is_some_and(|c| c.status == "True"))
                )
                .map(|p| (p.name_any(), p.status.clone()))
                .collect::<Vec<_>>()
        );
        if restarts < 8 {
            tokio::time::sleep(Duration::from_millis(next(50, 400))).await;
            env.crash_controller().await;
            env.start_controller();
            restarts += 1;
        } else {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
    let converged = started.elapsed();
    assert_eq!(
        env.fake.instances().len(),
        N,
        "exactly one instance per Proxy"
    );
    assert_eq!(env.fake.created(), N, "no duplicate was ever created");
    let creates = env.fake.count_calls(Op::Create);
    let injected_up = env.fake.injected();

    for i in 0..N {
        env.proxies
            .delete(&format!("p{i:02}"), &DeleteParams::default())
            .await
            .unwrap();
    }
    let deadline = tokio::time::Instant::now() + Duration::from_secs(120);
    let mut delete_restarts = 0;
    while !env
        .proxies
        .list(&Default::default())
        .await
        .unwrap()
        .items
        .is_empty()
    {
        if tokio::time::Instant::now() > deadline {
            let left = env.proxies.list(&Default::default()).await.unwrap().items;
            panic!(
                "{} not released, e.g. {:#?}\nlast calls: {:?}",
                left.len(),
                left.first().map(|p| (&p.metadata.finalizers, &p.status)),
                env.fake.calls().iter().rev().take(10).collect::<Vec<_>>()
            );
        }
        if delete_restarts < 3 {
            tokio::time::sleep(Duration::from_millis(next(50, 300))).await;
            env.crash_controller().await;
            env.start_controller();
            delete_restarts += 1;
        } else {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
    let left_after_release = env.fake.instances().len();

    // GC with MinAge zero (the test cannot wait ten minutes), faults still on.
    let sweeper = Sweeper::new(
        env.api.client(),
        env.registry.clone(),
        GcSettings {
            interval: Duration::from_millis(50),
            min_age: Duration::ZERO,
            installation: INSTALLATION.into(),
        },
        GcMetrics::default(),
    );
    let mut sweeps = 0;
    while !env.fake.instances().is_empty() {
        assert!(sweeps < 200, "GC did not empty the backend");
        let _ = sweeper.sweep().await;
        sweeps += 1;
    }
    println!(
        "fault-injection run: {N} Proxies, {restarts}+{delete_restarts} controller restarts, \
         all Running and Ready (CONNECT through a real proxy) after {:.1}s; {} provider calls ({creates} Create, {} instances created), \
         {injected_up} failed by injection while converging, {} in total; \
         {left_after_release} instance(s) left after every Proxy was released, \
         0 after {sweeps} GC sweep(s)",
        converged.as_secs_f64(),
        env.fake.calls().len(),
        env.fake.created(),
        env.fake.injected(),
    );
}

/// Ready needs a real CONNECT through the proxy: a Running instance whose proxy tunnels is
/// Ready with a lastProbe; when the proxy stops answering, Healthy and Ready go False with
/// the probe's reason, and come back when it answers again.
#[tokio::test]
async fn ready_follows_real_connect_probes() {
    let Some(bin) = support::tinyproxy::tinyproxy_bin() else {
        return;
    };
    let (echo, _echo) = support::tinyproxy::echo_server().await;
    let tp = support::tinyproxy::Tinyproxy::start(&bin, &format!("ConnectPort {echo}")).await;
    let mut env = Env::start().await;
    env.with_health(&format!("127.0.0.1:{echo}"), 1).await;
    let mut s = spec("z1");
    s.port = i32::from(tp.addr.port());
    env.create("p1", s).await;
    let p = env.wait_ready("p1", "True").await;
    let status = p.status.unwrap();
    let probe = status.last_probe.expect("lastProbe written");
    assert!(
        probe.error.is_none() && probe.latency_ms.is_some(),
        "{probe:?}"
    );
    let healthy = p_cond(&status.conditions, condition::HEALTHY);
    assert_eq!(
        (healthy.0.as_str(), healthy.1.as_str()),
        ("True", "Healthy")
    );

    let port = tp.addr.port();
    drop(tp);
    let p = env.wait_ready("p1", "False").await;
    let status = p.status.unwrap();
    assert_eq!(
        p_cond(&status.conditions, condition::HEALTHY),
        ("False".to_string(), "ConnectFailed".to_string())
    );
    assert_eq!(
        p_cond(&status.conditions, condition::READY).1,
        controller::status::ready_reason::UNHEALTHY
    );
    assert!(status.last_probe.unwrap().error.is_some());

    // The proxy comes back on the same address.
    let _tp =
        support::tinyproxy::Tinyproxy::start_on(&bin, port, &format!("ConnectPort {echo}")).await;
    env.wait_ready("p1", "True").await;

    // Deleting a probed Proxy still deletes its instance and releases it.
    env.proxies
        .delete("p1", &DeleteParams::default())
        .await
        .unwrap();
    env.wait("p1", "released", |p| p.is_none()).await;
    assert!(env.fake.instances().is_empty());
}

fn p_cond(
    conditions: &[k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition],
    t: &str,
) -> (String, String) {
    conditions
        .iter()
        .find(|c| c.type_ == t)
        .map(|c| (c.status.clone(), c.reason.clone()))
        .unwrap_or_default()
}

/// What N Running, healthy Proxies cost while nothing changes.
#[derive(Debug)]
struct AtRest {
    proxies: usize,
    intervals: f64,
    gets: usize,
    lists: usize,
    /// Requests to the API server that change something (create, update, patch, delete).
    writes: usize,
    /// API reads (get, list; not watch).
    reads: usize,
}

impl AtRest {
    fn per_proxy_per_interval(&self, n: usize) -> f64 {
        n as f64 / self.proxies as f64 / self.intervals
    }
}

/// Starts `n` Proxies behind a real tinyproxy with probing on, waits until all are Ready
/// and settled, then counts provider calls and API writes over `intervals` drift polls.
async fn at_rest(
    n: usize,
    intervals: u32,
    probe_refresh: Duration,
    inventory: bool,
) -> Option<AtRest> {
    let bin = support::tinyproxy::tinyproxy_bin()?;
    let (echo, _echo) = support::tinyproxy::echo_server().await;
    let tp = support::tinyproxy::Tinyproxy::start(&bin, &format!("ConnectPort {echo}")).await;
    let mut env = Env::start().await;
    if !inventory {
        env.inventory = None;
    }
    env.with_health_refresh(&format!("127.0.0.1:{echo}"), 1, probe_refresh)
        .await;
    for i in 0..n {
        let mut s = spec("z1");
        s.port = i32::from(tp.addr.port());
        env.create(&format!("p{i}"), s).await;
    }
    for i in 0..n {
        env.wait_ready(&format!("p{i}"), "True").await;
    }
    let drift = settings().timings.drift_poll;
    // Settle: every Proxy has had a drift poll since it became Ready.
    tokio::time::sleep(drift * 2).await;
    let calls_before = env.fake.calls().len();
    env.api.clear_requests();
    let started = tokio::time::Instant::now();
    tokio::time::sleep(drift * intervals).await;
    let elapsed = started.elapsed();
    let calls = env.fake.calls()[calls_before..].to_vec();
    let requests = env.api.requests();
    let writes = requests
        .iter()
        .filter(|r| !matches!(r.verb.as_str(), "get" | "list" | "watch"))
        .count();
    let at_rest = AtRest {
        proxies: n,
        intervals: elapsed.as_secs_f64() / drift.as_secs_f64(),
        gets: calls.iter().filter(|(op, _)| *op == Op::Get).count(),
        lists: calls.iter().filter(|(op, _)| *op == Op::List).count(),
        writes,
        reads: requests
            .iter()
            .filter(|r| matches!(r.verb.as_str(), "get" | "list"))
            .count(),
    };
    assert_eq!(
        calls.len(),
        at_rest.gets + at_rest.lists,
        "at rest only Get or List: {calls:?}"
    );
    eprintln!("{at_rest:?}");
    drop(tp);
    Some(at_rest)
}

/// Issue 12, item 3: a status write of the operator's own does not come back as another
/// reconcile (with another Get). Even with `lastProbe` refreshed on every drift poll, the
/// previous default, each Proxy costs one Get per drift interval, not two (drift detection
/// by Get here, without the inventory; before this change: 2.14).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn own_status_writes_do_not_trigger_reconciles() {
    let drift = settings().timings.drift_poll;
    let Some(r) = at_rest(8, 6, drift, false).await else {
        return;
    };
    let gets = r.per_proxy_per_interval(r.gets);
    let writes = r.per_proxy_per_interval(r.writes);
    assert!(
        writes > 0.5,
        "lastProbe is refreshed about once per interval here: {r:?}"
    );
    assert!(
        gets <= 1.2,
        "one Get per Proxy per drift interval, none for our own writes: {gets:.2} ({r:?})"
    );
}

/// Issue 29: a Running Proxy the lists confirm keeps no timer of its own (a requeue per
/// Proxy was most of kube's scheduler at 10,000), yet its `lastProbe` is still refreshed
/// once it is due: the list that finds it due sends it back. Here the refresh is due every
/// drift interval: about one status write per Proxy per interval, and no Get.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn proxies_the_lists_confirm_still_refresh_last_probe() {
    let drift = settings().timings.drift_poll;
    let Some(r) = at_rest(4, 6, drift, true).await else {
        return;
    };
    let writes = r.per_proxy_per_interval(r.writes);
    assert!(
        writes > 0.5,
        "lastProbe is refreshed about once per interval: {writes:.2} ({r:?})"
    );
    assert_eq!(r.gets, 0, "the lists answer for them: {r:?}");
}

/// Issue 29, contract 0.3.0: a provider whose plugin lists recent instances confirms a
/// rollout with lists of the instances made since its oldest Proxy in transition, never of
/// the fleet already Running, and without a Get per Proxy.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rollout_is_confirmed_by_lists_of_the_recent_instances() {
    let env = Env::start().await;
    env.fake.set_behaviour(Behaviour {
        lists_recent: true,
        ..Behaviour::default()
    });
    let batch = 30;
    for i in 0..batch {
        env.create(&format!("old{i}"), spec("z1")).await;
    }
    for i in 0..batch {
        env.wait_running(&format!("old{i}")).await;
    }
    // The next batch is made well after the first (a second here; its slowest Proxy is
    // in transition for half of that on a loaded machine): a list covering it cannot
    // reach back.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let (lists_before, gets_before) = (
        env.fake.recent_list_sizes().len(),
        env.fake.count_calls(Op::Get),
    );
    for i in 0..batch {
        env.create(&format!("new{i}"), spec("z1")).await;
    }
    for i in 0..batch {
        env.wait_running(&format!("new{i}")).await;
    }
    let sizes = env.fake.recent_list_sizes()[lists_before..].to_vec();
    let gets = env.fake.count_calls(Op::Get) - gets_before;
    eprintln!("lists of recent instances: {sizes:?}; Gets: {gets}");
    assert!(
        !sizes.is_empty(),
        "the rollout was confirmed by lists of recent instances"
    );
    assert!(
        sizes.iter().all(|n| *n <= batch),
        "a list of recent instances never shows the {batch} Running before: {sizes:?}"
    );
    // No Proxy Gets before a provisioning poll has passed since its create; by then the
    // list loop has counted the batch (it wakes every poll), and lists answer. 0 of 30 in
    // 8 runs here; a Proxy whose poll came before the loop's count Gets. Before the
    // first Get waited, the reconcile that each create's status write set off Got at once,
    // and 10 to 22 of 30 did, by how far the loop's last wake lay behind the batch.
    assert!(
        gets <= batch / 5,
        "lists, not a Get per Proxy, confirmed the rollout: {gets} Gets for {batch}"
    );
}

/// A plugin whose lists fail at once is asked again at the pace of its lists, not at every
/// turn of the list loop. Paced only by the last success, a failing list of recent
/// instances (or a failing whole list confirming a rollout) was retried as fast as it
/// failed for as long as a Proxy of the provider was in transition: a plugin, or a
/// backend answering 500, could keep a core busy and flood the log. Both ways of
/// confirming, one Proxy batch each.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failing_confirmation_lists_are_retried_at_their_pace_not_at_once() {
    for lists_recent in [true, false] {
        let env = Env::start().await;
        env.fake.set_behaviour(Behaviour {
            lists_recent,
            // Booting for as long as the test runs: every Proxy stays in transition.
            provisioning_gets: 1_000_000,
            ..Behaviour::default()
        });
        env.fake.fail_next(Op::List, Class::Transient, usize::MAX);
        let batch = 30;
        for i in 0..batch {
            env.create(&format!("p{i}"), spec("z1")).await;
        }
        let deadline = std::time::Instant::now() + Duration::from_secs(30);
        while env.fake.count_calls(Op::Create) < batch {
            assert!(
                std::time::Instant::now() < deadline,
                "{} of {batch} created",
                env.fake.count_calls(Op::Create)
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let before = env.fake.count_calls(Op::List);
        let window = Duration::from_secs(2);
        tokio::time::sleep(window).await;
        let lists = env.fake.count_calls(Op::List) - before;
        // At most one confirming list per provisioning poll (their interval when the
        // budget does not call for more), plus the drift lists, twice over for timers.
        let timings = settings().timings;
        let paced = window.as_millis() / timings.provisioning_poll.as_millis()
            + window.as_millis() / timings.drift_poll.as_millis();
        eprintln!("lists_recent {lists_recent}: {lists} failed lists in {window:?}");
        assert!(
            lists as u128 <= 2 * paced + 5,
            "lists_recent {lists_recent}: {lists} lists in {window:?}, paced at most {paced}"
        );
        assert!(lists > 0, "the lists are still tried");
    }
}

/// Issue 12, items 2 and 3, as in production: with `lastProbe` refreshed at most every 30
/// minutes (the default), a Proxy whose facts do not change costs no API write, and drift
/// detection costs one ListByTag per provider per drift interval and no Get at all.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn at_rest_one_list_per_interval_no_get_no_write() {
    let Some(r) = at_rest(8, 6, Duration::from_secs(1800), true).await else {
        return;
    };
    assert_eq!(r.writes, 0, "{r:?}");
    // Inline cloud-init here: no API read either (a secretKeyRef costs none at rest too:
    // `secret_cloud_init_costs_no_get_at_rest_and_one_get_per_change`).
    assert_eq!(r.reads, 0, "{r:?}");
    assert_eq!(r.gets, 0, "{r:?}");
    let lists = r.lists as f64 / r.intervals;
    assert!(
        (0.8..=1.2).contains(&lists),
        "one list per provider per interval: {lists:.2} ({r:?})"
    );
}

/// Issue 12, item 2: an instance deleted behind the operator's back is noticed by the next
/// list (missing from it: reconciled at once, and Get says NotFound) and recreated, within
/// one drift interval plus one list; the other Running Proxies cost no Get meanwhile.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn drift_by_list_notices_a_vanished_instance_within_one_interval() {
    let env = Env::start().await;
    for i in 0..5 {
        env.create(&format!("p{i}"), spec("z1")).await;
    }
    let mut ids = Vec::new();
    for i in 0..5 {
        let p = env.wait_running(&format!("p{i}")).await;
        ids.push(p.status.unwrap().provider_id.unwrap());
    }
    let drift = settings().timings.drift_poll;
    // Settle: the inventory has listed since all are Running.
    tokio::time::sleep(drift * 2).await;
    let before = env.fake.calls().len();
    env.fake.vanish(&ids[0]);
    let vanished = tokio::time::Instant::now();
    env.wait("p0", "recreated", |_| env.fake.created() == 6)
        .await;
    let noticed = vanished.elapsed();
    env.wait_running("p0").await;
    assert!(
        noticed <= drift + Duration::from_millis(150),
        "noticed after {noticed:?} (drift interval {drift:?})"
    );
    let calls = env.fake.calls()[before..].to_vec();
    let gets: Vec<&String> = calls
        .iter()
        .filter(|(op, _)| *op == Op::Get)
        .map(|(_, id)| id)
        .collect();
    // The vanished instance is asked for. The others are not, unless a list came late on a
    // loaded machine (the inventory then ages out and each Running Proxy falls back to
    // one Get); that no Get is made at rest is `at_rest_one_list_per_interval_no_get_no_write`.
    assert!(
        gets.contains(&&ids[0]),
        "the vanished instance was asked for: {calls:?}"
    );
    for other in &ids[1..] {
        let n = gets.iter().filter(|id| ***id == *other).count();
        assert!(n <= 1, "{other} asked for {n} times: {calls:?}");
    }
    assert!(env.events("p0").contains(&event::INSTANCE_LOST.to_string()));
}

/// A failing list leaves the inventory stale: after two drift intervals it is no longer
/// used, and Running Proxies fall back to one Get per drift poll; when lists work again,
/// the Gets stop.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stale_inventory_falls_back_to_get() {
    let env = Env::start().await;
    env.create_running(3).await;
    let drift = settings().timings.drift_poll;
    tokio::time::sleep(drift * 2).await;
    let gets = || env.fake.count_calls(Op::Get);
    let g0 = gets();
    tokio::time::sleep(drift * 2).await;
    assert_eq!(gets(), g0, "fresh lists: no Get");
    env.fake.fail_next(Op::List, Class::Transient, 1000);
    // Stale after three intervals; then about one Get per Proxy per interval.
    tokio::time::sleep(drift * 8).await;
    let g1 = gets();
    assert!(g1 - g0 >= 3, "fell back to Get: {} Gets", g1 - g0);
    env.fake.clear_faults();
    tokio::time::sleep(drift * 2).await;
    let g2 = gets();
    tokio::time::sleep(drift * 3).await;
    assert_eq!(gets(), g2, "lists work again: no Get");
}

/// Issue 12: a restart costs one list per provider, not one Get per Running Proxy (at
/// 10,000 Proxies that would be hours of a 3,600/h budget): the reconciles of the start
/// wait for the first list, which confirms them all.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restart_lists_once_instead_of_a_get_per_proxy() {
    let mut env = Env::start().await;
    env.create_running(6).await;
    env.crash_controller().await;
    // A new process: nothing listed yet.
    let drift = settings().timings.drift_poll;
    env.inventory = Some(Arc::new(Inventory::new(drift * 3)));
    // A backend that takes its time: the first list is still under way when the start's
    // reconciles run.
    env.fake.set_behaviour(Behaviour {
        latency: drift / 2,
        ..Default::default()
    });
    let before = env.fake.calls().len();
    env.start_controller();
    tokio::time::sleep(drift * 3).await;
    let calls = env.fake.calls()[before..].to_vec();
    let count = |op| calls.iter().filter(|(o, _)| *o == op).count();
    assert_eq!(count(Op::Get), 0, "{calls:?}");
    assert!(count(Op::List) >= 1, "{calls:?}");
    for i in 0..6 {
        let p = env.wait_running(&format!("p{i}")).await;
        assert!(p.status.unwrap().ip.is_some());
    }
}

/// Issue 12: a reload that rebuilds a provider (new configuration or plugin) costs one
/// list, not one Get per Running Proxy, although the reload re-runs every Proxy: the
/// reconciles wait for the rebuilt provider's first list, and nothing its predecessor
/// listed is used.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reload_lists_the_rebuilt_provider_instead_of_a_get_per_proxy() {
    let env = Env::start().await;
    env.create_running(6).await;
    let drift = settings().timings.drift_poll;
    tokio::time::sleep(drift * 2).await;
    // A backend that takes its time: the rebuilt provider's first list is still under way
    // when the reload's reconciles run.
    env.fake.set_behaviour(Behaviour {
        latency: drift / 2,
        ..Default::default()
    });
    let before = env.fake.calls().len();
    let reconciled = env.reconciles("ok");
    env.registry
        .replace([Arc::new(env.fake.rebuilt()) as Arc<dyn Provider>]);
    tokio::time::sleep(drift * 3).await;
    assert!(
        env.reconciles("ok") >= reconciled + 6,
        "the reload re-ran every Proxy"
    );
    let calls = env.fake.calls()[before..].to_vec();
    let count = |op| calls.iter().filter(|(o, _)| *o == op).count();
    assert_eq!(count(Op::Get), 0, "{calls:?}");
    assert!(count(Op::List) >= 1, "{calls:?}");
}

impl Env {
    /// Creates Proxies `p0`..`p{n-1}` in zone z1 and waits until all are Running.
    async fn create_running(&self, n: usize) {
        for i in 0..n {
            self.create(&format!("p{i}"), spec("z1")).await;
        }
        for i in 0..n {
            self.wait_running(&format!("p{i}")).await;
        }
    }

    fn secret_cache(&self) -> Arc<SecretCache> {
        self.secret_cache.clone().expect("a controller was started")
    }

    /// `proxy_operator_reconciles_total{result}` so far.
    fn reconciles(&self, result: &str) -> u64 {
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &self.metrics).unwrap();
        let prefix = format!("proxy_operator_reconciles_total{{result=\"{result}\"}} ");
        text.lines()
            .find_map(|l| l.strip_prefix(prefix.as_str()))
            .map(|v| v.trim().parse().unwrap())
            .unwrap_or(0)
    }

    /// The names of the Secrets the operator read one by one (GET) since the request log
    /// was last cleared.
    fn secret_gets(&self) -> Vec<String> {
        let mut names: Vec<String> = self
            .api
            .requests()
            .into_iter()
            .filter(|r| r.resource.as_deref() == Some("secrets") && r.verb == "get")
            .map(|r| r.name.unwrap_or_default())
            .collect();
        names.sort();
        names
    }

    async fn put_secret(&self, name: &str, cloud_init: &str) {
        let secrets: Api<Secret> = Api::namespaced(self.api.client(), "default");
        let s: Secret = serde_json::from_value(json!({
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": {"name": name,
                         "labels": {"egress.proxy-operator.dev/cloud-init": "true"}},
            "stringData": {"user-data": cloud_init},
        }))
        .unwrap();
        secrets
            .patch(name, &PatchParams::apply("test").force(), &Patch::Apply(&s))
            .await
            .unwrap();
    }
}

/// A spec whose cloud-init is the key `user-data` of the Secret `name`. Without
/// credentials: their Secrets go through the same cache (held, read once per change), and
/// the tests of cloud-init Secrets count cloud-init Secrets only; credentials.rs covers them.
fn from_secret(name: &str) -> ProxySpec {
    let mut s = spec("z1");
    s.cloud_init = CloudInit {
        inline: None,
        secret_key_ref: Some(SecretKeyRef {
            name: name.into(),
            key: "user-data".into(),
        }),
    };
    s.auth = api::ProxyAuth {
        type_: api::AuthType::None,
        ..Default::default()
    };
    s
}

/// Issue 12, item 4: cloud-init Secrets are known from a metadata-only watch, not read on
/// every reconcile. At rest, eight Proxies (six sharing one Secret, two with their own)
/// cost no Secret GET, also when each is reconciled. An edit of a Secret costs one GET of that Secret, whatever the number of Proxies
/// referencing it, and replaces the instances of exactly those Proxies (the spec hash
/// covers the resolved cloud-init), at once rather than at the next drift poll.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn secret_cloud_init_costs_no_get_at_rest_and_one_get_per_change() {
    let env = Env::start().await;
    env.put_secret("shared", "#cloud-config\n# shared v1\n")
        .await;
    env.put_secret("own-6", "#cloud-config\n# own-6 v1\n").await;
    env.put_secret("own-7", "#cloud-config\n# own-7 v1\n").await;
    let secret_of = |i: usize| match i {
        0..6 => "shared".to_string(),
        i => format!("own-{i}"),
    };
    for i in 0..8 {
        env.create(&format!("p{i}"), from_secret(&secret_of(i)))
            .await;
    }
    let mut hashes = Vec::new();
    for i in 0..8 {
        let p = env.wait_running(&format!("p{i}")).await;
        hashes.push(p.status.unwrap().spec_hash.unwrap());
    }
    assert_eq!(env.fake.created(), 8);
    let drift = settings().timings.drift_poll;
    tokio::time::sleep(drift * 2).await;

    // At rest: the lists answer for every Proxy, and a reconcile (here: each Proxy's
    // skip-cleanup annotation changed, twice, to values that do not skip) reads no Secret.
    // An annotation the operator does not read would not do: the cache drops it, so its
    // change triggers nothing.
    env.api.clear_requests();
    let ok_before = env.reconciles("ok");
    for value in ["false", "no"] {
        for i in 0..8 {
            env.proxies
                .patch(
                    &format!("p{i}"),
                    &PatchParams::default(),
                    &Patch::Merge(
                        json!({"metadata": {"annotations": {api::ANNOTATION_SKIP_CLEANUP: value}}}),
                    ),
                )
                .await
                .unwrap();
        }
        tokio::time::sleep(drift * 2).await;
    }
    let reconciled = env.reconciles("ok") - ok_before;
    assert!(
        reconciled >= 8 * 2,
        "the Proxies were reconciled: {reconciled} reconciles"
    );
    assert_eq!(env.secret_gets(), Vec::<String>::new());
    assert_eq!(env.fake.created(), 8);

    // The shared Secret changes: one GET, the six Proxies referencing it are replaced.
    // GETs of Secrets are slowed down, so that the Proxies' reconciles (three at a time)
    // overlap while the first one reads: they wait for it instead of reading too.
    env.api.delay("get", "secrets", Duration::from_millis(300));
    env.api.clear_requests();
    let changed = tokio::time::Instant::now();
    env.put_secret("shared", "#cloud-config\n# shared v2\n")
        .await;
    for (i, hash) in hashes.iter_mut().enumerate().take(6) {
        let before = hash.clone();
        let p = env
            .wait(&format!("p{i}"), "replaced", |p| {
                p.and_then(|p| p.status.as_ref()).is_some_and(|s| {
                    s.spec_hash.as_ref() != Some(&before) && s.state.as_deref() == Some("Running")
                })
            })
            .await
            .unwrap();
        *hash = p.status.unwrap().spec_hash.unwrap();
    }
    let replaced_after = changed.elapsed();
    tokio::time::sleep(drift * 3).await;
    assert_eq!(env.secret_gets(), ["shared"]);
    assert_eq!(env.fake.created(), 8 + 6);
    assert!(
        env.fake
            .last_create_request()
            .is_some_and(|r| r.cloud_init == b"#cloud-config\n# shared v2\n"),
    );
    for (i, hash) in hashes.iter().enumerate().skip(6) {
        let p = env.proxies.get(&format!("p{i}")).await.unwrap();
        assert_eq!(p.status.unwrap().spec_hash.as_ref(), Some(hash), "p{i}");
    }
    eprintln!("six Proxies replaced {replaced_after:?} after the Secret changed");

    // One Proxy's own Secret changes: one GET of it, that one Proxy replaced.
    env.api.clear_requests();
    env.put_secret("own-6", "#cloud-config\n# own-6 v2\n").await;
    let before = hashes[6].clone();
    env.wait("p6", "replaced", |p| {
        p.and_then(|p| p.status.as_ref()).is_some_and(|s| {
            s.spec_hash.as_ref() != Some(&before) && s.state.as_deref() == Some("Running")
        })
    })
    .await;
    tokio::time::sleep(drift * 3).await;
    assert_eq!(env.secret_gets(), ["own-6"]);
    assert_eq!(env.fake.created(), 8 + 6 + 1);
    for i in (0..6).chain([7]) {
        let p = env.proxies.get(&format!("p{i}")).await.unwrap();
        assert_eq!(
            p.status.unwrap().spec_hash.as_ref(),
            Some(&hashes[i]),
            "p{i}"
        );
    }
    // What the operator holds: the data of the three referenced Secrets, nothing else.
    assert_eq!(env.secret_cache().held(), 3);
}

/// A referenced Secret that is deleted is a condition at once (the watch re-runs its
/// Proxies; no GET, and the copy held goes), its re-creation with the same data brings the
/// Proxy back without replacing the instance, and the copy of a Secret no Proxy references
/// any more is dropped at the next prune.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deleted_secret_is_a_condition_and_unreferenced_data_is_dropped() {
    let env = Env::start().await;
    env.put_secret("ci", "#cloud-config\n").await;
    env.create("p0", from_secret("ci")).await;
    let hash = env.wait_running("p0").await.status.unwrap().spec_hash;
    assert_eq!(env.secret_cache().held(), 1);

    env.api.clear_requests();
    let secrets: Api<Secret> = Api::namespaced(env.api.client(), "default");
    secrets
        .delete("ci", &DeleteParams::default())
        .await
        .unwrap();
    let p = env.wait_reason("p0", reason::CLOUD_INIT_UNAVAILABLE).await;
    assert!(
        p.condition(condition::PROVISIONED)
            .unwrap()
            .message
            .contains("default/ci not found"),
        "{:?}",
        p.status
    );
    assert_eq!(env.secret_gets(), Vec::<String>::new());
    assert_eq!(env.secret_cache().held(), 0);

    env.put_secret("ci", "#cloud-config\n").await;
    let p = env.wait_reason("p0", reason::RUNNING).await;
    assert_eq!(
        p.status.unwrap().spec_hash,
        hash,
        "same cloud-init: same instance"
    );
    assert_eq!(env.fake.created(), 1);
    assert_eq!(env.secret_gets(), ["ci"]);

    // p0 switches to inline cloud-init: the Secret is referenced no more.
    env.proxies
        .patch(
            "p0",
            &PatchParams::default(),
            &Patch::Merge(
                json!({"spec": {"cloudInit": {"secretKeyRef": null, "inline": "#cloud-config\n"}}}),
            ),
        )
        .await
        .unwrap();
    let drift = settings().timings.drift_poll;
    let deadline = tokio::time::Instant::now() + WAIT;
    while env.secret_cache().held() != 0 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the copy was never dropped"
        );
        tokio::time::sleep(drift / 4).await;
    }
}

/// A Secret change reaches the Proxies referencing it through the watch, not through
/// their next drift poll: with a drift poll of a minute, an edit still replaces the
/// instance and a deletion still shows as a condition within seconds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_secret_change_reaches_its_proxies_without_waiting_for_the_drift_poll() {
    let mut env = Env::start().await;
    env.drift = Duration::from_secs(60);
    env.crash_controller().await;
    env.start_controller();
    env.put_secret("ci", "#cloud-config\n# v1\n").await;
    env.create("p0", from_secret("ci")).await;
    let hash = env.wait_running("p0").await.status.unwrap().spec_hash;
    // Past the provisioning polls: p0 now waits for its drift poll, a minute away.
    tokio::time::sleep(Duration::from_millis(300)).await;

    let changed = tokio::time::Instant::now();
    env.put_secret("ci", "#cloud-config\n# v2\n").await;
    env.wait("p0", "replaced", |p| {
        p.and_then(|p| p.status.as_ref())
            .is_some_and(|s| s.spec_hash != hash && s.state.as_deref() == Some("Running"))
    })
    .await;
    assert_eq!(env.fake.created(), 2);
    assert_eq!(
        env.fake.last_create_request().unwrap().cloud_init,
        b"#cloud-config\n# v2\n"
    );
    tokio::time::sleep(Duration::from_millis(300)).await;

    let secrets: Api<Secret> = Api::namespaced(env.api.client(), "default");
    secrets
        .delete("ci", &DeleteParams::default())
        .await
        .unwrap();
    env.wait_reason("p0", reason::CLOUD_INIT_UNAVAILABLE).await;
    assert!(
        changed.elapsed() < Duration::from_secs(30),
        "{:?}",
        changed.elapsed()
    );
}

/// Issue 12, item 4: one Proxy watch and one cache for the whole process. The controller
/// reconciles from the shared cache and subscribes to its feed for each term of
/// leadership: a new term watches nothing of its own, reconciles what is already there,
/// and sees every change after.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_controller_runs_on_the_shared_proxy_cache_across_terms() {
    let mut env = Env::start().await;
    env.crash_controller().await;
    let (cache, feed, reflect) = proxy_operator::proxy_cache::watch_proxies(env.api.client());
    let reflect = tokio::spawn(reflect);
    env.shared = Some((cache.clone(), feed));
    env.start_controller();
    env.create("p0", spec("z1")).await;
    let first = env.wait_running("p0").await.status.unwrap().spec_hash;

    // A new term: no watch of Proxies of its own, and p0 is still looked after.
    env.crash_controller().await;
    env.api.clear_requests();
    env.start_controller();
    env.create("p1", spec("z1")).await;
    env.wait_running("p1").await;
    env.proxies
        .patch(
            "p0",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"placement": {"zone": "z2"}}})),
        )
        .await
        .unwrap();
    let replaced = env
        .wait("p0", "replaced", |p| {
            p.and_then(|p| p.status.as_ref())
                .is_some_and(|st| st.spec_hash != first && st.state.as_deref() == Some("Running"))
        })
        .await;
    assert!(replaced.is_some());
    assert_eq!(env.fake.created(), 3, "p0, p1, and p0's replacement");
    let proxy_reads: Vec<_> = env
        .api
        .requests()
        .into_iter()
        .filter(|r| {
            r.resource.as_deref() == Some("proxies") && matches!(r.verb.as_str(), "list" | "watch")
        })
        .collect();
    assert_eq!(proxy_reads.len(), 0, "{proxy_reads:?}");
    assert_eq!(cache.store.state().len(), 2);
    reflect.abort();
}

/// A saturated controller still serves every Proxy in turn. With more work due than the
/// workers can take (here: 30 instances that stay provisioning, each polled every 50 ms,
/// on one worker, every provider call 5 ms), kube-runtime's runner parks due requests in a
/// hash set and takes the first it iterates: the same few ran again and again while others
/// waited without end (at 10,000 Proxies, 1,344 had their finalizer and no instance for
/// 40 minutes). New Proxies must get their instance within a few rounds of the queue.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_saturated_controller_starves_no_proxy() {
    let mut env = Env::start().await;
    env.crash_controller().await;
    env.concurrency = 1;
    env.fake.set_behaviour(Behaviour {
        provisioning_gets: u32::MAX,
        deleting_gets: 1,
        latency: Duration::from_millis(5),
        ..Behaviour::default()
    });
    env.start_controller();
    let hot = 30;
    for i in 0..hot {
        env.create(&format!("hot{i}"), spec("z1")).await;
    }
    // Let the hot ones fill the queue: every one of them is due again every 50 ms.
    let deadline = tokio::time::Instant::now() + WAIT;
    while env.fake.created() < hot {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the hot Proxies were not all created: {} of {hot}",
            env.fake.created()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let new = 10;
    let started = tokio::time::Instant::now();
    let mut waiting = std::collections::BTreeMap::new();
    for i in 0..new {
        let p = env.create(&format!("new{i}"), spec("z1")).await;
        waiting.insert(p.uid().unwrap(), p.name_any());
    }
    // A full turn of the queue is about 40 Proxies x (a 5 ms Get + a status write): under
    // a second even on a loaded machine. Two turns (finalizer, then Create) and margin.
    let bound = Duration::from_secs(8);
    loop {
        let created: std::collections::BTreeSet<String> =
            env.fake.instances().into_iter().map(|i| i.uid).collect();
        let missing: Vec<&String> = waiting
            .iter()
            .filter(|(uid, _)| !created.contains(*uid))
            .map(|(_, name)| name)
            .collect();
        if missing.is_empty() {
            break;
        }
        assert!(
            started.elapsed() < bound,
            "after {:?}, {} of {new} new Proxies still have no instance: {missing:?}",
            started.elapsed(),
            missing.len()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// A Proxy created while the controller's watch was down arrives in the re-list that
/// follows (after a `410 Gone`), and is reconciled, with the shared cache or without.
/// (The ordering this depends on, triggers only for objects the cache holds, is tested in
/// `cache::tests`; a list this small does not show it end to end.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_proxy_created_while_the_watch_was_down_is_reconciled_after_the_relist() {
    for shared in [false, true] {
        let mut env = Env::start().await;
        if shared {
            env.crash_controller().await;
            let (cache, feed, watch) = proxy_operator::proxy_cache::watch_proxies(env.api.client());
            tokio::spawn(watch);
            env.shared = Some((cache, feed));
            env.start_controller();
        }
        env.create_running(1).await;
        // The watch breaks and cannot come back for a while (the watcher backs off);
        // meanwhile a Proxy is created and the history compacted, so the watcher has to
        // list again rather than resume.
        env.api.inject_error(
            "watch",
            "proxies",
            fake_kube::ApiError::new(503, "ServiceUnavailable", "down for the test"),
            1,
        );
        env.api.close_watches();
        tokio::time::sleep(Duration::from_millis(100)).await;
        env.create("gap", spec("z1")).await;
        env.api.compact();
        let p = env.wait_running("gap").await;
        assert_eq!(p.finalizers(), [FINALIZER], "shared cache: {shared}");
    }
}

/// A price only the provider's quote knows: asked in the background, so a slow catalogue
/// holds no reconcile (a second Proxy goes Running while the quote hangs), asked once for
/// the two Proxies of the placement, and written when it comes without waiting for the
/// drift poll. The largest amount a plugin can give fits the CRD: a plugin quoting it must
/// not get every status write of its Proxies refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_quoted_price_is_asked_once_in_the_background_and_written_whole() {
    let fake = Arc::new(FakeProvider::new("fake"));
    fake.set_quote(
        "z1",
        egress_plugin_host::provider::Price {
            currency: "IDR".into(),
            micros_per_hour: u64::MAX,
        },
    );
    fake.hold_quotes(true);
    let mut env = Env::start_with(
        fake.clone(),
        ProviderRegistry::new([fake.clone() as Arc<dyn Provider>]),
    )
    .await;
    env.crash_controller().await;
    env.drift = Duration::from_secs(3600);
    // One reconcile at a time: a reconcile waiting on the quote would hold p2 back.
    env.concurrency = 1;
    env.start_controller();
    env.create("p1", spec("z1")).await;
    env.create("p2", spec("z1")).await;
    for name in ["p1", "p2"] {
        let p = env.wait_running(name).await;
        assert_eq!(p.status.unwrap().hourly_price, None, "not known yet");
    }
    fake.hold_quotes(false);
    for name in ["p1", "p2"] {
        let p = env
            .wait(name, "a price", |p| {
                p.is_some_and(|p| p.status.as_ref().unwrap().hourly_price.is_some())
            })
            .await
            .unwrap();
        let price = p.status.unwrap().hourly_price.unwrap();
        assert_eq!(
            (price.currency.as_str(), price.per_hour.as_str()),
            ("IDR", "18446744073709.551615")
        );
        assert!(price.per_hour.len() <= proxy_operator::api::PER_HOUR_MAX);
    }
    assert_eq!(fake.quote_calls(), 1, "one quote for the placement");
}
