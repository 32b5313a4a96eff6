//! The operator's RBAC rules (host/src/rbac.rs) against what it really does: every loop of
//! the operator runs against the in-memory API server (fake-kube), which records each
//! request, and the test checks both directions: every request is allowed by a rule, and
//! every verb of every rule was used. Plus the drift test of config/rbac/role.yaml.
//!
//! The operator's client has no credentials (its requests record no user); the test's
//! own setup goes through a client whose token maps to `test-admin`, so the two are told
//! apart.

use crate::support;

use egress_plugin_host::provider::Provider;
use fake_kube::{AccessRule, FakeApi, RequestRecord, UserInfo};
use k8s_openapi::api::core::v1::{Namespace, Secret};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::ResourceExt;
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use proxy_operator::api::{
    self, CloudInit, Proxy, ProxyPool, ProxyPoolSpec, ProxySpec, SecretKeyRef,
};
use proxy_operator::controller::{self, Context, HealthHook};
use proxy_operator::discovery::{self, Auth, AuthSettings};
use proxy_operator::gc::{GcMetrics, GcSettings, Sweeper};
use proxy_operator::leader::{Leadership, LeaseSettings};
use proxy_operator::probe::{EngineConfig, ProbeEngine, Thresholds};
use proxy_operator::provider_check::{Monitor, MonitorMetrics, publish};
use proxy_operator::rbac::{self, Call, RULES, Scope};
use proxy_operator::registry::ProviderRegistry;
use proxy_operator::testing::fake_provider::FakeProvider;
use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

const NS: &str = "egress-system";
const ADMIN_TOKEN: &str = "test-admin-token-0123456789";
const READER_TOKEN: &str = "reader-token-0123456789";
const INSTALLATION: &str = "install-rbac";
const WAIT: Duration = Duration::from_secs(20);

#[test]
fn committed_rbac_matches_the_rules() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let path = root.join(rbac::COMMITTED_PATH);
    let want = rbac::yaml().unwrap();
    if std::env::var_os("UPDATE_RBAC").is_some() {
        std::fs::write(&path, &want).unwrap();
    }
    let have = std::fs::read_to_string(&path).unwrap_or_default();
    assert!(
        have == want,
        "{} is out of date with host/src/rbac.rs; regenerate with {}",
        rbac::COMMITTED_PATH,
        rbac::REGENERATE
    );
}

/// A client of the served fake API with `token` as its bearer token.
async fn client_with_token(api: &FakeApi, addr: std::net::SocketAddr, token: &str) -> kube::Client {
    let mut kc = serde_json::to_value(api.kubeconfig(addr)).unwrap();
    kc["users"][0]["user"] = serde_json::json!({ "token": token });
    let kc: kube::config::Kubeconfig = serde_json::from_value(kc).unwrap();
    let config = kube::Config::from_custom_kubeconfig(kc, &Default::default())
        .await
        .unwrap();
    kube::Client::try_from(config).unwrap()
}

fn spec(cloud_init: CloudInit) -> ProxySpec {
    ProxySpec {
        cloud_init,
        ..support::fake_spec("z")
    }
}

async fn eventually<F, Fut>(what: &str, mut f: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = tokio::time::Instant::now() + WAIT;
    while !f().await {
        assert!(
            tokio::time::Instant::now() < deadline,
            "gave up waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

fn operator_requests(api: &FakeApi) -> Vec<RequestRecord> {
    api.requests()
        .into_iter()
        .filter(|r| r.user.is_none())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_api_call_is_allowed_and_every_rule_is_used() {
    let api = FakeApi::new();
    let addr = api.serve("127.0.0.1:0").await.unwrap();
    api.add_token(ADMIN_TOKEN, UserInfo::new("test-admin"));
    api.add_token(READER_TOKEN, UserInfo::new("reader"));
    api.allow(AccessRule::user("reader", ["get", "list"], ["proxies"]));
    // The reader may use the proxies too, so discovery reads a credentials Secret.
    api.allow(AccessRule::user("reader", ["get"], ["proxies/credentials"]));
    let admin = client_with_token(&api, addr, ADMIN_TOKEN).await;

    // The cluster as installed: CRDs, the operator's namespace, a cloud-init Secret that
    // shows up late (so the reconciler reads it missing, then present).
    let crds: Api<CustomResourceDefinition> = Api::all(admin.clone());
    for (_, crd) in api::crds() {
        crds.create(&PostParams::default(), &crd).await.unwrap();
    }
    let nss: Api<Namespace> = Api::all(admin.clone());
    let ns: Namespace =
        serde_json::from_value(serde_json::json!({"metadata": {"name": NS}})).unwrap();
    nss.create(&PostParams::default(), &ns).await.unwrap();

    // The operator: one client, every loop.
    let op = api.client();
    proxy_operator::installation::default_identity(op.clone(), NS)
        .await
        .unwrap();

    let leadership = Leadership::new(
        op.clone(),
        LeaseSettings {
            namespace: NS.into(),
            lease_name: "proxy-operator-leader".into(),
            identity: "pod-a".into(),
            duration: Duration::from_secs(2),
            renew: Duration::from_secs(1),
        },
    )
    .unwrap();
    let mut leader = leadership.subscribe();
    tokio::time::timeout(WAIT, leader.wait_for(|l| *l))
        .await
        .expect("leadership within the wait")
        .unwrap();

    let fake = Arc::new(FakeProvider::new("fake"));
    fake.set_fixed_ip("127.0.0.1");
    let registry = ProviderRegistry::new([fake.clone() as Arc<dyn Provider>]);
    let mut settings = support::fast_settings(INSTALLATION, 200, 300);
    settings.instance_name = Some("pod-a".into());
    let engine = ProbeEngine::new(
        EngineConfig {
            interval: Duration::from_millis(50),
            concurrency: 4,
            thresholds: Thresholds {
                failure: 1,
                success: 1,
            },
        },
        None,
    );
    // Probes go to 127.0.0.1:3128, where nothing listens: Healthy False, written to status.
    let ctx = Context::new(op.clone(), registry.clone(), settings).with_health(HealthHook {
        engine,
        target: "example.com:443".into(),
        egress_echo: None,
        timeout: Duration::from_millis(500),
        tls: None,
        probe_refresh: Duration::from_secs(300),
    });
    let controller = tokio::spawn(controller::run(Arc::new(ctx), std::future::pending::<()>()));

    let (cache, reflect) = discovery::proxy_reflector(op.clone());
    let (health_store, reflect_health) = discovery::provider_health_reflector(op.clone());
    let reflectors = [tokio::spawn(reflect), tokio::spawn(reflect_health)];
    let router = discovery::router_with_providers(
        cache,
        Some(health_store),
        Auth::Kubernetes(op.clone(), AuthSettings::default()),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let discovery_addr = listener.local_addr().unwrap();
    tokio::spawn(discovery::serve(listener, router, std::future::pending()));

    // Users' Proxies: one with inline cloud-init, one from a Secret that is missing first.
    let proxies: Api<Proxy> = Api::namespaced(admin.clone(), "default");
    let inline = Proxy::new(
        "inline",
        spec(CloudInit {
            inline: Some("#cloud-config\n".into()),
            secret_key_ref: None,
        }),
    );
    let from_secret = Proxy::new(
        "from-secret",
        spec(CloudInit {
            inline: None,
            secret_key_ref: Some(SecretKeyRef {
                name: "user-data".into(),
                key: "cloud-init".into(),
            }),
        }),
    );
    for p in [&inline, &from_secret] {
        proxies.create(&PostParams::default(), p).await.unwrap();
    }
    // The reconciler finds the Secret missing (from its metadata watch, or by a GET that
    // answers 404 when the watch has not listed yet).
    eventually("the missing Secret as a condition", || async {
        api.objects_of::<Proxy>().iter().any(|p| {
            p.metadata.name.as_deref() == Some("from-secret")
                && p.condition(api::condition::PROVISIONED)
                    .is_some_and(|c| c.reason == "CloudInitUnavailable")
        })
    })
    .await;
    let secrets: Api<Secret> = Api::namespaced(admin.clone(), "default");
    let secret: Secret = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "user-data",
                     "labels": {"egress.proxy-operator.dev/cloud-init": "true"}},
        "stringData": {"cloud-init": "#cloud-config\n"},
    }))
    .unwrap();
    secrets
        .create(&PostParams::default(), &secret)
        .await
        .unwrap();
    eventually("both proxies provisioned", || async {
        let list = api.objects_of::<Proxy>();
        list.len() == 2
            && list.iter().all(|p| {
                p.status
                    .as_ref()
                    .is_some_and(|s| s.ip.is_some() && s.last_probe.is_some())
            })
    })
    .await;

    // A spec edit replaces the instance: a second Created event on the same Proxy, which
    // the event recorder sends as a patch of the first.
    proxies
        .patch(
            "inline",
            &PatchParams::default(),
            &Patch::Merge(serde_json::json!({"spec": {"placement": {"zone": "z2"}}})),
        )
        .await
        .unwrap();
    eventually("a repeated event (patch)", || async {
        operator_requests(&api)
            .iter()
            .any(|r| r.resource.as_deref() == Some("events") && r.verb == "patch")
    })
    .await;

    // A ProxyPool of one: the pool controller creates its Proxy, writes the pool's status,
    // and deletes the Proxy again on a scale to zero.
    let (pool_cache, feed, pool_reflect) = proxy_operator::proxy_cache::watch_proxies(op.clone());
    let pool_reflect = tokio::spawn(pool_reflect);
    let pool_controller = tokio::spawn(proxy_operator::pool::run(
        op.clone(),
        pool_cache,
        feed,
        Default::default(),
        std::future::pending::<()>(),
    ));
    let pools: Api<ProxyPool> = Api::namespaced(admin.clone(), "default");
    let pool = ProxyPool::new(
        "pool",
        ProxyPoolSpec::new(
            1,
            spec(CloudInit {
                inline: Some("#cloud-config\n".into()),
                secret_key_ref: None,
            }),
        ),
    );
    pools.create(&PostParams::default(), &pool).await.unwrap();
    let of_pool = |p: &Proxy| p.labels().get(api::LABEL_POOL).map(String::as_str) == Some("pool");
    eventually("the pool's Proxy and the pool's status", || async {
        api.objects_of::<Proxy>().iter().any(of_pool)
            && api
                .objects_of::<ProxyPool>()
                .iter()
                .any(|p| p.status.as_ref().is_some_and(|s| s.replicas == 1))
    })
    .await;
    pools
        .patch(
            "pool",
            &PatchParams::default(),
            &Patch::Merge(serde_json::json!({"spec": {"replicas": 0}})),
        )
        .await
        .unwrap();
    eventually(
        "the pool's Proxy deleted, its instance and Secret with it",
        || async { !api.objects_of::<Proxy>().iter().any(of_pool) },
    )
    .await;
    pool_controller.abort();
    pool_reflect.abort();

    // Orphan GC, one sweep; the provider health monitor, one round and its publication.
    let mut registry_metrics = prometheus_client::registry::Registry::default();
    let sweeper = Sweeper::new(
        op.clone(),
        registry.clone(),
        GcSettings::new(INSTALLATION),
        GcMetrics::register(&mut registry_metrics),
    );
    sweeper.sweep().await.unwrap();
    let monitor = Monitor::new(
        Duration::from_secs(5),
        MonitorMetrics::register(&mut registry_metrics),
    );
    let checks = monitor.round(&[fake.clone() as Arc<dyn Provider>]).await;
    let types = BTreeMap::from([("fake".to_string(), "fake".to_string())]);
    let load_errors = BTreeMap::from([(
        "unloadable".to_string(),
        "unloadable.wasm: no such file".to_string(),
    )]);
    let plugins = BTreeMap::from([(
        "fake".to_string(),
        "oci://registry.example/fake@sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef".to_string(),
    )]);
    publish(&op, &checks, &types, &load_errors, &plugins).await;
    // A second round reads the first one's object back (get of an existing object).
    publish(&op, &checks, &types, &load_errors, &plugins).await;

    // The discovery API and the status page with a reader's token.
    eventually("the status page shows the provider", || async {
        let a = support::http::get(discovery_addr, "/status/fragment", Some(READER_TOKEN)).await;
        a.status == 200 && a.body.contains(r#"<td class="target">fake</td>"#)
    })
    .await;
    let a = support::http::get(discovery_addr, "/v1/proxies", Some(READER_TOKEN)).await;
    assert_eq!(a.status, 200, "{a:?}");
    let a = support::http::get(
        discovery_addr,
        "/v1/proxies/default/from-secret",
        Some(READER_TOKEN),
    )
    .await;
    assert!(
        a.status == 200 && a.body.contains(r#""credentials":{"username""#),
        "{a:?}"
    );

    // Deletion: the finalizer comes off once the instance is gone.
    proxies
        .delete("inline", &DeleteParams::default())
        .await
        .unwrap();
    eventually("the deleted Proxy gone", || async {
        api.object("proxies", Some("default"), "inline").is_none()
    })
    .await;

    leadership.stop().await;
    controller.abort();
    for r in reflectors {
        r.abort();
    }

    // Every request the operator made is allowed...
    let mut used: BTreeSet<(usize, &str)> = BTreeSet::new();
    let mut denied = Vec::new();
    let mut non_resource = BTreeSet::new();
    for r in operator_requests(&api) {
        let Some(resource) = r.rbac_resource() else {
            non_resource.insert(r.path.clone());
            continue;
        };
        let call = Call {
            group: r.group.as_deref().unwrap_or(""),
            resource: &resource,
            verb: &r.verb,
            namespace: r.namespace.as_deref(),
            name: r.name.as_deref(),
        };
        match rbac::allowing(RULES, &call, NS) {
            Some(rule) => {
                let i = RULES.iter().position(|x| std::ptr::eq(x, rule)).unwrap();
                let verb = rule.verbs.iter().find(|v| **v == r.verb).unwrap();
                used.insert((i, verb));
            }
            None => denied.push(format!(
                "{} {} {}{} ({} {})",
                r.verb,
                if call.group.is_empty() {
                    "core"
                } else {
                    call.group
                },
                resource,
                r.namespace
                    .as_deref()
                    .map(|n| format!(" in {n}"))
                    .unwrap_or_default(),
                r.method,
                r.path
            )),
        }
    }
    denied.sort();
    denied.dedup();
    assert!(
        denied.is_empty(),
        "the operator made calls its RBAC rules do not allow (add them to host/src/rbac.rs):\n{}",
        denied.join("\n")
    );
    // ...apart from discovery, which the built-in ClusterRole system:discovery grants
    // every authenticated user.
    for path in &non_resource {
        assert!(
            ["/api", "/apis", "/version", "/openapi"]
                .iter()
                .any(|p| path == p || path.starts_with(&format!("{p}/"))),
            "non-resource request {path} is not discovery"
        );
    }

    // ...and every permission is used.
    let unused: Vec<String> = RULES
        .iter()
        .enumerate()
        .flat_map(|(i, r)| {
            let used = &used;
            r.verbs
                .iter()
                .filter(move |v| !used.contains(&(i, **v)))
                .map(move |v| format!("{v} {} ({})", r.resource, r.why))
        })
        .collect();
    assert!(
        unused.is_empty(),
        "RBAC rules nothing used (remove them from host/src/rbac.rs, or exercise them here):\n{}",
        unused.join("\n")
    );

    // Secrets are listed and watched for their metadata only (no values), and read one by
    // one only where a Proxy references them (cloud-init, credentials); the operator
    // creates the Secrets of generated credentials and deletes the one of the Proxy deleted.
    let generated = ["inline-credentials", "from-secret-credentials"];
    // The pool's Proxy (`pool-<5 characters>`) has generated credentials too.
    let pooled = |n: &str| n.starts_with("pool-") && n.ends_with("-credentials");
    for r in operator_requests(&api)
        .iter()
        .filter(|r| r.resource.as_deref() == Some("secrets"))
    {
        let name = r.name.as_deref().unwrap_or_default();
        match r.verb.as_str() {
            "list" | "watch" => assert!(r.metadata_only, "{r:?}"),
            "get" => assert!(
                r.namespace.as_deref() == Some("default")
                    && (name == "user-data" || generated.contains(&name) || pooled(name)),
                "{r:?}"
            ),
            // A create is a POST to the collection: the name is in the body.
            "create" => assert_eq!(r.namespace.as_deref(), Some("default"), "{r:?}"),
            "delete" => assert!(
                r.namespace.as_deref() == Some("default")
                    && (name == "inline-credentials" || pooled(name)),
                "{r:?}"
            ),
            _ => panic!("{r:?}"),
        }
    }
    assert_eq!(
        api.objects("secrets")
            .iter()
            .filter_map(|s| s["metadata"]["name"].as_str().map(String::from))
            .collect::<BTreeSet<_>>(),
        BTreeSet::from([
            "from-secret-credentials".to_string(),
            "user-data".to_string()
        ]),
        "one generated Secret per Proxy, the deleted Proxy's gone"
    );

    // The Role (namespaced) really is only used in the operator's namespace.
    for r in RULES.iter().filter(|r| r.scope == Scope::OperatorNamespace) {
        assert!(
            operator_requests(&api)
                .iter()
                .filter(|q| q.rbac_resource().as_deref() == Some(r.resource))
                .all(|q| q.namespace.as_deref() == Some(NS))
        );
    }
}
