//! Spot capacity end to end: a ProxyPool of spot Proxies over two zones, the EC2 plugin
//! against its emulator in real-proxy mode (each instance a real forward proxy on its own
//! loopback address, requiring the credentials the operator generated for it), the health
//! engine probing through each, the Proxy reconciler and the pool controller against
//! fake-kube. The emulator reclaims instances as EC2 does; the pool must be whole again
//! within a probe interval and a create, each reclaim said and counted.

use crate::support;

use egress_emulators::control::Emulator;
use egress_emulators::ec2::{EXAMPLE_ACCESS_KEY, EXAMPLE_SECRET_KEY, Ec2Config, Ec2Emulator};
use egress_emulators::real_proxy::{ProxyKind, RealProxies};
use egress_plugin_host::provider::Provider;
use fake_kube::FakeApi;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, PostParams};
use proxy_operator::api::{
    self, Capacity, CloudInit, Placement, PoolPlacement, Proxy, ProxyPool, ProxyPoolSpec, ProxySpec,
};
use proxy_operator::controller::{Context, ReconcileMetrics};
use proxy_operator::registry::ProviderRegistry;
use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// The template the samples use, reduced to what the emulator reads.
const CLOUD_INIT: &str = "#cloud-config\nwrite_files:\n  - path: /etc/tinyproxy/tinyproxy.conf\n    content: |\n      Port {{egress.port}}\n      BasicAuth {{egress.username}} {{egress.password}}\n";
/// How often every proxy is probed: the detection time the test allows for.
const PROBE_INTERVAL: Duration = Duration::from_millis(500);

fn entry(url: &str, secrets: &std::path::Path) -> String {
    let s = |k: &str| secrets.join(k).display().to_string();
    format!(
        r#"name: aws
plugin: ec2.wasm
additionalHosts: ['{url}']
allowPrivateAddresses: true
secrets: {{accessKeyId: {ak}, secretAccessKey: {sk}}}
config:
  regions:
    eu-west-1:
      endpoint: '{url}'
      zones:
        eu-west-1a: {{}}
        eu-west-1b: {{}}
      images: {{debian: ami-0fedcba9876543210}}
  instanceTypes: [t3.micro]"#,
        ak = s("accessKeyId"),
        sk = s("secretAccessKey"),
    )
}

async fn wait_for<T>(what: &str, within: Duration, mut f: impl AsyncFnMut() -> Option<T>) -> T {
    let deadline = Instant::now() + within;
    loop {
        if let Some(v) = f().await {
            return v;
        }
        assert!(
            Instant::now() < deadline,
            "timed out after {within:?} waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
}

/// The operator's loops against fake-kube and the EC2 emulator in real-proxy mode.
struct Stack {
    api: FakeApi,
    client: kube::Client,
    emu: Ec2Emulator,
    registry: prometheus_client::registry::Registry,
    _echo: tokio::task::JoinHandle<()>,
    _real: Arc<RealProxies>,
    /// The credentials the plugin reads on every call.
    _secrets: tempfile::TempDir,
}

impl Stack {
    async fn start(installation: &str) -> Stack {
        let api = FakeApi::new();
        let client = api.client();
        let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
        for (_, crd) in api::crds() {
            crds.create(&PostParams::default(), &crd).await.unwrap();
        }
        let real = RealProxies::with_own_addresses(ProxyKind::Builtin);
        let emu = Ec2Emulator::start(Ec2Config {
            real_proxies: Some(real.clone()),
            ..Ec2Config::default()
        });
        let secrets = tempfile::tempdir().unwrap();
        std::fs::write(secrets.path().join("accessKeyId"), EXAMPLE_ACCESS_KEY).unwrap();
        std::fs::write(secrets.path().join("secretAccessKey"), EXAMPLE_SECRET_KEY).unwrap();
        let provider: Arc<dyn Provider> = Arc::new(
            support::provider(
                &support::runtime(),
                "ec2.wasm",
                &entry(&emu.url(), secrets.path()),
            )
            .await,
        );
        let mut registry = prometheus_client::registry::Registry::default();
        let metrics = ReconcileMetrics::register(&mut registry);
        let ctx = Context::new(
            client.clone(),
            ProviderRegistry::new([provider]),
            support::fast_settings(installation, 3_600_000, 300),
        )
        .with_metrics(metrics);
        let echo = support::run_reconciler_and_pools(client.clone(), ctx, PROBE_INTERVAL).await;
        Stack {
            api,
            client,
            emu,
            registry,
            _echo: echo,
            _real: real,
            _secrets: secrets,
        }
    }
}

fn template(capacity: Capacity) -> ProxySpec {
    ProxySpec {
        provider: "aws".into(),
        placement: Placement {
            capacity,
            ..Placement::new("eu-west-1", "", "t3.micro", "debian")
        },
        cloud_init: CloudInit {
            inline: Some(CLOUD_INIT.into()),
            secret_key_ref: None,
        },
        port: i32::from(support::tinyproxy::free_port()),
        auth: Default::default(),
        ip_family: Default::default(),
    }
}

/// The provider IDs of the Ready Proxies.
async fn ready_ids(proxies: &Api<Proxy>) -> Option<BTreeSet<String>> {
    let list = proxies.list(&Default::default()).await.ok()?;
    Some(
        list.items
            .iter()
            .filter(|p| {
                p.condition(api::condition::READY)
                    .is_some_and(|c| c.status == "True")
            })
            .filter_map(|p| p.status.as_ref()?.provider_id.clone())
            .collect(),
    )
}

/// The emulator's own ID of a provider ID (`region/instance`).
fn backend(id: &str) -> String {
    id.split_once('/').map_or(id, |(_, b)| b).to_string()
}

/// 10 spot Proxies over eu-west-1a and eu-west-1b go Ready; EC2 reclaims 3 of them; within
/// one probe interval and one create (measured, with a margin for this 2-core machine) the
/// pool has 10 Ready Proxies again on other instances, with 3 `Interrupted` Events and
/// `proxy_operator_instance_interruptions_total{provider="aws"}` at 3. The drift poll is an
/// hour: only the failed probes can have found the reclaimed instances.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_spot_pool_replaces_what_the_cloud_reclaims() {
    if support::plugin_dir().is_none() {
        return;
    }
    let Stack {
        api,
        client,
        emu,
        registry,
        _echo,
        _real,
        _secrets,
    } = Stack::start("install-spot").await;
    let template = template(Capacity::Spot);
    let zone = |z: &str| PoolPlacement {
        zone: Some(z.into()),
        ..Default::default()
    };
    let pools: Api<ProxyPool> = Api::namespaced(client.clone(), "default");
    let proxies: Api<Proxy> = Api::namespaced(client.clone(), "default");
    let mut pool = ProxyPool::new(
        "spot",
        ProxyPoolSpec {
            placements: vec![zone("eu-west-1a"), zone("eu-west-1b")],
            ..ProxyPoolSpec::new(10, template)
        },
    );
    pool.metadata.namespace = Some("default".into());
    pools.create(&PostParams::default(), &pool).await.unwrap();

    // Ready: every Proxy's CONNECT went through its own instance.
    let ready_ids = async || ready_ids(&proxies).await.filter(|r| r.len() == 10);
    let before = wait_for("10 Ready spot Proxies", Duration::from_secs(60), ready_ids).await;
    let spot = emu.spot_instances();
    assert_eq!(spot.len(), 10, "every instance is a spot one: {spot:?}");

    // EC2 takes three back.
    let reclaimed: Vec<String> = before.iter().take(3).cloned().collect();
    let started = Instant::now();
    for id in &reclaimed {
        assert_eq!(emu.reclaim(&backend(id)), Ok(true), "{id}");
    }
    let after = wait_for(
        "10 Ready Proxies on other instances",
        Duration::from_secs(60),
        async || {
            let ids = ready_ids().await?;
            reclaimed.iter().all(|r| !ids.contains(r)).then_some(ids)
        },
    )
    .await;
    let took = started.elapsed();
    assert_eq!(after.len(), 10);
    // One probe interval to notice, one create to replace (the emulator boots at once);
    // the margin covers this machine's 2 cores running the whole operator and 10 proxies.
    assert!(
        took < PROBE_INTERVAL * 2 + Duration::from_secs(10),
        "back to 10 Ready after {took:?}"
    );
    eprintln!("spot: 3 reclaimed instances replaced, 10 Ready again after {took:?}");

    let interrupted = api
        .objects("events.events.k8s.io")
        .iter()
        .filter(|e| e["reason"] == "Interrupted")
        .count();
    assert_eq!(
        interrupted, 3,
        "one Interrupted Event per reclaimed instance"
    );
    let mut text = String::new();
    prometheus_client::encoding::text::encode(&mut text, &registry).unwrap();
    assert!(
        text.contains("proxy_operator_instance_interruptions_total{provider=\"aws\"} 3"),
        "{text}"
    );
}

/// No spot capacity: a pool of 3 with a spot placement and its on-demand fallback fills on
/// demand; once spot capacity is back and the spot placement's back-off is over, its
/// Proxies move back to spot, never fewer than `minReady` (3) Ready on the way.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pool_falls_back_to_on_demand_without_spot_capacity_and_returns() {
    if support::plugin_dir().is_none() {
        return;
    }
    let Stack {
        client,
        emu,
        _echo,
        _real,
        _secrets,
        ..
    } = Stack::start("install-fallback").await;
    assert!(emu.set_spot_capacity(false));
    let at = |capacity, fallback| PoolPlacement {
        zone: Some("eu-west-1a".into()),
        capacity: Some(capacity),
        fallback,
        ..Default::default()
    };
    let pools: Api<ProxyPool> = Api::namespaced(client.clone(), "default");
    let proxies: Api<Proxy> = Api::namespaced(client.clone(), "default");
    let mut pool = ProxyPool::new(
        "fallback",
        ProxyPoolSpec {
            placements: vec![at(Capacity::Spot, None), at(Capacity::OnDemand, Some(true))],
            min_ready: Some(3),
            max_surge: Some(3),
            placement_backoff: Some(Duration::from_secs(3)),
            ..ProxyPoolSpec::new(3, template(Capacity::OnDemand))
        },
    );
    pool.metadata.namespace = Some("default".into());
    pools.create(&PostParams::default(), &pool).await.unwrap();

    let on_demand = wait_for("3 Ready on demand", Duration::from_secs(60), async || {
        ready_ids(&proxies).await.filter(|r| r.len() == 3)
    })
    .await;
    let spot = emu.spot_instances();
    assert!(
        on_demand.iter().all(|id| !spot.contains(&backend(id))),
        "no spot capacity, so none is spot: {on_demand:?} {spot:?}"
    );

    assert!(emu.set_spot_capacity(true));
    let mut fewest = usize::MAX;
    let back = wait_for("3 Ready on spot", Duration::from_secs(60), async || {
        let ready = ready_ids(&proxies).await?;
        fewest = fewest.min(ready.len());
        let spot = emu.spot_instances();
        (ready.len() == 3 && ready.iter().all(|id| spot.contains(&backend(id)))).then_some(ready)
    })
    .await;
    assert!(fewest >= 3, "Ready went down to {fewest} on the way back");
    assert!(back.is_disjoint(&on_demand), "{back:?} {on_demand:?}");
}
