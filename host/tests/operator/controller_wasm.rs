//! The Proxy controller with a real Wasm provider: the example plugin, through the plugin
//! runtime, against its emulated backend, with the controller against fake-kube. The same
//! path production takes, minus a real cluster and a real cloud.

use crate::support;

use egress_emulators::example::ExampleBackend;
use egress_plugin_host::provider::{Instrumented, Provider, ProviderMetrics};
use fake_kube::FakeApi;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use proxy_operator::api::{self, CloudInit, Placement, Proxy, ProxyAuth, ProxySpec, condition};
use proxy_operator::controller::{self, Context};
use proxy_operator::registry::ProviderRegistry;
use serde_json::json;
use std::sync::Arc;
use std::time::Duration;

async fn wait(proxies: &Api<Proxy>, what: &str, f: impl Fn(Option<&Proxy>) -> bool) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    loop {
        let p = proxies.get_opt("p1").await.unwrap();
        if f(p.as_ref()) {
            return;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out waiting for {what}: {:#?}",
            p.map(|p| p.status)
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

fn running_with(p: Option<&Proxy>, zone: &str) -> bool {
    p.is_some_and(|p| {
        p.condition(condition::PROVISIONED)
            .is_some_and(|c| c.status == "True")
            && p.spec.placement.zone == zone
            && p.status.as_ref().unwrap().observed_generation == p.metadata.generation
    })
}

/// The example plugin against `backend`, instrumented, as the only provider (`ex`).
/// `extra` is spliced into the providers-file entry (e.g. limits).
async fn example_registry(
    backend: &ExampleBackend,
    extra: &str,
    regions: &str,
) -> (tempfile::TempDir, ProviderRegistry) {
    let secrets = tempfile::tempdir().unwrap();
    let token = secrets.path().join("token");
    std::fs::write(&token, "tok").unwrap();
    let entry = format!(
        "name: ex\nplugin: example.wasm\nadditionalHosts: ['{url}']\nallowPrivateAddresses: true\n{extra}\
         secrets: {{token: {secret}}}\nconfig: {{endpoint: '{url}', regions: [{regions}]}}",
        url = backend.url(),
        secret = token.display()
    );
    let wasm = support::provider(&support::runtime(), "example.wasm", &entry).await;
    let provider: Arc<dyn Provider> = Arc::new(Instrumented::new(wasm, ProviderMetrics::default()));
    (secrets, ProviderRegistry::new([provider]))
}

/// An in-memory cluster with the CRDs installed.
async fn cluster() -> (FakeApi, kube::Client) {
    let fake = FakeApi::new();
    let client = fake.client();
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    for (_, crd) in api::crds() {
        crds.create(&PostParams::default(), &crd).await.unwrap();
    }
    (fake, client)
}

/// The controller running over the example plugin against `backend` (the provider `ex`,
/// its `regions`), in an in-memory cluster; the Proxies of namespace `default`. Keep the
/// first value for the test's length: it holds the secrets directory and the cluster.
async fn controller_on(
    backend: &ExampleBackend,
    regions: &str,
    installation: &str,
) -> ((tempfile::TempDir, FakeApi), Api<Proxy>) {
    controller_with(backend, "", regions, installation).await
}

/// [`controller_on`] with `extra` spliced into the providers-file entry.
async fn controller_with(
    backend: &ExampleBackend,
    extra: &str,
    regions: &str,
    installation: &str,
) -> ((tempfile::TempDir, FakeApi), Api<Proxy>) {
    let (secrets, registry) = example_registry(backend, extra, regions).await;
    let (fake, client) = cluster().await;
    let settings = support::fast_settings(installation, 300, 300);
    let ctx = Arc::new(Context::new(client.clone(), registry, settings));
    tokio::spawn(controller::run(ctx, std::future::pending::<()>()));
    ((secrets, fake), Api::namespaced(client, "default"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn proxy_lifecycle_through_the_example_plugin() {
    let _dir = plugins_or_skip!();
    let backend = ExampleBackend::start("tok");
    let (_running, proxies) = controller_on(&backend, "r1, r2", "install-wasm").await;
    let cloud_init = "#cloud-config\npackages: [tinyproxy]\n";
    let mut p = Proxy::new(
        "p1",
        ProxySpec {
            provider: "ex".into(),
            placement: Placement::new("r1", "z1", "small", "img"),
            cloud_init: CloudInit {
                inline: Some(cloud_init.into()),
                secret_key_ref: None,
            },
            port: 3128,
            auth: Default::default(),
            ip_family: Default::default(),
        },
    );
    p.metadata.namespace = Some("default".into());
    // A few 5xx answers on the way: Transient, backed off, recovered.
    backend.inject_fault(503, 3);
    proxies.create(&PostParams::default(), &p).await.unwrap();
    wait(&proxies, "running in z1", |p| running_with(p, "z1")).await;
    let instances = backend.instances();
    assert_eq!(instances.len(), 1, "{instances:?}");
    assert_eq!(instances[0].user_data_bytes(), cloud_init.as_bytes());
    assert_eq!(instances[0].zone, "z1");
    let status = proxies.get("p1").await.unwrap().status.unwrap();
    assert_eq!(status.ip.as_deref(), Some(instances[0].ip.as_str()));

    // A spec edit replaces the instance under the same name.
    proxies
        .patch(
            "p1",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"placement": {"zone": "z2"}}})),
        )
        .await
        .unwrap();
    wait(&proxies, "running in z2", |p| running_with(p, "z2")).await;
    let live: Vec<_> = backend
        .instances()
        .into_iter()
        .filter(|i| i.status != "deleted" && i.status != "terminated")
        .collect();
    assert_eq!(live.len(), 1, "{live:?}");
    assert_eq!(live[0].zone, "z2");
    assert_eq!(live[0].name, instances[0].name);

    proxies
        .delete("p1", &DeleteParams::default())
        .await
        .unwrap();
    wait(&proxies, "released", |p| p.is_none()).await;
    let left: Vec<_> = backend
        .instances()
        .into_iter()
        .filter(|i| i.status != "deleted" && i.status != "terminated")
        .collect();
    assert!(left.is_empty(), "{left:?}");
}

/// The acceptance fault-injection run through the real path: 50 Proxies, the example
/// plugin in the Wasm runtime, its HTTP backend failing about 20% of calls (503, 429 and
/// answers slower than the plugin's time limit), the controller killed and restarted at
/// random points, and health probes through a real tinyproxy deciding Ready. At the end
/// every Proxy is Ready and the backend holds exactly 50 instances; after the Proxies are
/// deleted and GC has run it holds none.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fault_injection_run_through_the_wasm_plugin() {
    use proxy_operator::controller::HealthHook;
    use proxy_operator::gc::{GcMetrics, GcSettings, Sweeper};
    use proxy_operator::probe::{EngineConfig, ProbeEngine, Thresholds};
    const N: usize = 50;
    let _dir = plugins_or_skip!();
    let Some(bin) = support::tinyproxy::tinyproxy_bin() else {
        return;
    };
    let (echo, _echo) = support::tinyproxy::echo_server().await;
    let tp = support::tinyproxy::Tinyproxy::start(&bin, &format!("ConnectPort {echo}")).await;

    let backend = Arc::new(ExampleBackend::start("tok"));
    let (_secrets, registry) =
        example_registry(&backend, "limits: {timeout: 500ms, concurrency: 8}\n", "r1").await;
    let (_fake, client) = cluster().await;
    let settings = support::fast_settings("install-chaos", 500, 200);
    let engine = ProbeEngine::new(
        EngineConfig {
            interval: Duration::from_millis(100),
            concurrency: 16,
            thresholds: Thresholds::default(),
        },
        None,
    );
    let hook = HealthHook {
        engine,
        target: format!("127.0.0.1:{echo}"),
        egress_echo: None,
        timeout: Duration::from_secs(2),
        tls: None,
        probe_refresh: Duration::from_secs(60),
    };
    let start = || {
        let ctx = Context::new(client.clone(), registry.clone(), settings.clone())
            .with_health(hook.clone());
        tokio::spawn(controller::run(Arc::new(ctx), std::future::pending::<()>()))
    };

    // One call in five fails: every fifth call the backend sees is a 503, a 429 or an
    // answer 700 ms late (past the plugin's 500 ms limit), in turn (503, 429, 503, 429,
    // late). Counted by the backend, so the rate holds however the calls bunch up.
    {
        use egress_emulators::example::Injected::{Delay, Status};
        let late = Delay(Duration::from_millis(700));
        backend.inject_every(
            5,
            &[Status(503), Status(429), Status(503), Status(429), late],
        );
    }

    let proxies: Api<Proxy> = Api::namespaced(client.clone(), "default");
    let started = std::time::Instant::now();
    let mut controller = start();
    for i in 0..N {
        let mut p = Proxy::new(
            &format!("p{i:02}"),
            ProxySpec {
                provider: "ex".into(),
                placement: Placement::new("r1", "z1", "small", "img"),
                cloud_init: CloudInit {
                    inline: Some("#cloud-config\n".into()),
                    secret_key_ref: None,
                },
                port: i32::from(tp.addr.port()),
                auth: Default::default(),
                ip_family: Default::default(),
            },
        );
        p.metadata.namespace = Some("default".into());
        proxies.create(&PostParams::default(), &p).await.unwrap();
    }
    let live = |b: &ExampleBackend| {
        b.instances()
            .into_iter()
            .filter(|i| i.status != "deleted" && i.status != "terminated")
            .count()
    };
    let mut rng: u64 = 0x2545f4914f6cdd1d;
    let mut next = move |lo: u64, hi: u64| {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        lo + rng % (hi - lo)
    };
    let (mut restarts, deadline) = (0, tokio::time::Instant::now() + Duration::from_secs(180));
    loop {
        let list = proxies.list(&Default::default()).await.unwrap().items;
        let ready = list
            .iter()
            .filter(|p| {
                p.condition(condition::READY)
                    .is_some_and(|c| c.status == "True")
            })
            .count();
        if ready == N {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "{ready} of {N} Ready"
        );
        if restarts < 8 {
            tokio::time::sleep(Duration::from_millis(next(100, 600))).await;
            controller.abort();
            let _ = controller.await;
            controller = start();
            restarts += 1;
        } else {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
    let converged = started.elapsed();
    let calls_up = backend.requests().len();
    let faults_up = backend.every_hits() as usize;
    assert!(
        faults_up * 100 >= calls_up * 17,
        "{faults_up} faults in {calls_up} calls is not about 20%"
    );
    assert_eq!(live(&backend), N, "exactly one instance per Proxy");

    for i in 0..N {
        proxies
            .delete(&format!("p{i:02}"), &DeleteParams::default())
            .await
            .unwrap();
    }
    let mut delete_restarts = 0;
    while !proxies
        .list(&Default::default())
        .await
        .unwrap()
        .items
        .is_empty()
    {
        assert!(tokio::time::Instant::now() < deadline, "not all released");
        if delete_restarts < 3 {
            tokio::time::sleep(Duration::from_millis(next(100, 400))).await;
            controller.abort();
            let _ = controller.await;
            controller = start();
            delete_restarts += 1;
        } else {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
    let left_after_release = live(&backend);
    let sweeper = Sweeper::new(
        client.clone(),
        registry.clone(),
        GcSettings {
            interval: Duration::from_millis(50),
            min_age: Duration::ZERO,
            installation: "install-chaos".into(),
        },
        GcMetrics::default(),
    );
    let mut sweeps = 0;
    while live(&backend) > 0 {
        assert!(sweeps < 200, "GC did not empty the backend");
        let _ = sweeper.sweep().await;
        sweeps += 1;
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    controller.abort();
    println!(
        "wasm fault-injection run: {N} Proxies through example.wasm, {faults_up} of \
         {calls_up} backend calls failed (503/429/late) while converging, \
         {restarts}+{delete_restarts} controller restarts; all Ready (CONNECT through \
         tinyproxy) after {:.1}s; {N} live instances then; {left_after_release} left after \
         every Proxy was released, 0 after {sweeps} GC sweep(s)",
        converged.as_secs_f64(),
    );
}

/// An IPv6 Proxy on a provider that cannot give IPv6 (the example plugin declares none):
/// the SDK refuses the create before the plugin runs, the Proxy says why naming the field
/// and the provider, and the backend never holds an IPv4-only instance for it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_ipv6_proxy_on_a_provider_without_ipv6_is_refused_by_name() {
    let _dir = plugins_or_skip!();
    let backend = ExampleBackend::start("tok");
    let (_running, proxies) = controller_on(&backend, "r1", "install-v6").await;
    let mut p = Proxy::new(
        "p1",
        ProxySpec {
            provider: "ex".into(),
            placement: Placement::new("r1", "z1", "small", "img"),
            cloud_init: CloudInit {
                inline: Some("#cloud-config\n".into()),
                secret_key_ref: None,
            },
            port: 3128,
            auth: ProxyAuth {
                type_: api::AuthType::None,
                ..Default::default()
            },
            ip_family: api::IpFamily::IPv6,
        },
    );
    p.metadata.namespace = Some("default".into());
    proxies.create(&PostParams::default(), &p).await.unwrap();
    wait(&proxies, "refused", |p| {
        p.and_then(|p| p.condition(condition::PROVISIONED))
            .is_some_and(|c| c.reason == "PermanentError")
    })
    .await;
    let p = proxies.get("p1").await.unwrap();
    let c = p.condition(condition::PROVISIONED).unwrap();
    assert!(
        c.message.contains("ipFamily IPv6") && c.message.contains("example"),
        "{}",
        c.message
    );
    assert!(backend.instances().is_empty(), "{:?}", backend.instances());
}

/// A running Proxy says what its instance costs: here from the providers file's `prices`
/// (the example backend publishes none), the most specific rule for its placement; a
/// placement no rule prices has no price rather than a wrong one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_running_proxy_shows_what_it_costs() {
    let _dir = plugins_or_skip!();
    let backend = ExampleBackend::start("tok");
    let prices = "prices: [{machineType: small, currency: EUR, perHour: '0.0125'}, \
                  {machineType: small, region: r1, currency: EUR, perHour: '0.011'}]\n";
    let (_running, proxies) = controller_with(&backend, prices, "r1, r2", "install-cost").await;
    for (name, region, machine_type) in [
        ("p1", "r1", "small"),
        ("p2", "r2", "small"),
        ("p3", "r1", "large"),
    ] {
        let mut p = Proxy::new(
            name,
            ProxySpec {
                provider: "ex".into(),
                placement: Placement::new(region, "z1", machine_type, "img"),
                cloud_init: CloudInit {
                    inline: Some("#cloud-config\n".into()),
                    secret_key_ref: None,
                },
                port: 3128,
                auth: ProxyAuth {
                    type_: api::AuthType::None,
                    ..Default::default()
                },
                ip_family: Default::default(),
            },
        );
        p.metadata.namespace = Some("default".into());
        proxies.create(&PostParams::default(), &p).await.unwrap();
    }
    let price = |p: &Proxy| {
        p.status
            .as_ref()
            .and_then(|s| s.hourly_price.as_ref())
            .map(|h| format!("{} {}", h.per_hour, h.currency))
    };
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    loop {
        let mut all = Vec::new();
        for name in ["p1", "p2", "p3"] {
            all.push(proxies.get(name).await.unwrap());
        }
        let running = all.iter().all(|p| running_with(Some(p), "z1"));
        if running && price(&all[0]).is_some() && price(&all[1]).is_some() {
            assert_eq!(
                price(&all[0]).as_deref(),
                Some("0.011 EUR"),
                "the region's rule"
            );
            assert_eq!(
                price(&all[1]).as_deref(),
                Some("0.0125 EUR"),
                "every region's rule"
            );
            assert_eq!(price(&all[2]), None, "no rule for large");
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "{:#?}",
            all.iter().map(|p| &p.status).collect::<Vec<_>>()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}
