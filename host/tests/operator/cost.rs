//! What the fleet costs, end to end: a ProxyPool over two Hetzner placements whose prices
//! only the plugin's `quote` knows (the server type catalogue, no `prices` in the providers
//! file), the Proxy reconciler and the pool controller against fake-kube. Each running
//! Proxy shows its placement's catalogue price, the pool the sum, the metric the sum per
//! placement; one catalogue request per placement pays for all of it.

use crate::support;

use egress_emulators::hetzner::{HetznerConfig, HetznerEmulator};
use egress_plugin_host::provider::Provider;
use fake_kube::FakeApi;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, PostParams};
use proxy_operator::api::{
    self, CloudInit, HourlyPrice, Placement, PoolPlacement, Proxy, ProxyPool, ProxyPoolSpec,
    ProxySpec,
};
use proxy_operator::controller::Context;
use proxy_operator::metrics::OperatorMetrics;
use proxy_operator::registry::ProviderRegistry;
use std::sync::Arc;
use std::time::{Duration, Instant};

const TOKEN: &str = "cost-token";

fn entry(url: &str, token: &std::path::Path) -> String {
    format!(
        "name: hz\nplugin: hetzner.wasm\nadditionalHosts: ['{url}']\nallowPrivateAddresses: true\n\
         secrets: {{token: {token}}}\n\
         config: {{endpoint: '{url}/v1', locations: [fsn1, nbg1], serverTypes: [cpx11, cx23], \
         images: {{ubuntu: ubuntu-24.04}}}}",
        token = token.display()
    )
}

fn eur(per_hour: &str) -> HourlyPrice {
    HourlyPrice {
        currency: "EUR".into(),
        per_hour: per_hour.into(),
    }
}

/// 5 Proxies over fsn1/cpx11 (0.008 EUR an hour in the emulator's catalogue) and nbg1/cx23
/// (0.012): each shows its price, the pool 3 x 0.008 + 2 x 0.012 = 0.048 EUR, the cost
/// metric the same per placement. The drift poll is an hour, so the prices cannot come
/// from a periodic pass: the background quote must wake the Proxies it priced. Every
/// reconcile of the five asked at once; one catalogue request per placement answered.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_fleet_costs_the_sum_of_its_quoted_prices() {
    if support::plugin_dir().is_none() {
        return;
    }
    let api = FakeApi::new();
    let client = api.client();
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    for (_, crd) in api::crds() {
        crds.create(&PostParams::default(), &crd).await.unwrap();
    }
    let mut cfg = HetznerConfig::new(TOKEN);
    for t in &mut cfg.server_types {
        t.price_hourly_net = match t.name.as_str() {
            "cpx11" => "0.0080000000".into(),
            _ => "0.0120000000".into(),
        };
    }
    let emu = HetznerEmulator::start(cfg);
    let secrets = tempfile::tempdir().unwrap();
    let token = secrets.path().join("token");
    std::fs::write(&token, TOKEN).unwrap();
    let provider: Arc<dyn Provider> = Arc::new(
        support::provider(
            &support::runtime(),
            "hetzner.wasm",
            &entry(&emu.url(), &token),
        )
        .await,
    );
    let (cache, _feed, reflect) = proxy_operator::proxy_cache::watch_proxies(client.clone());
    tokio::spawn(reflect);
    let metrics = OperatorMetrics::new(cache.store.clone());
    let ctx = Context::new(
        client.clone(),
        ProviderRegistry::new([provider]),
        support::fast_settings("install-cost", 3_600_000, 300),
    );
    let _echo =
        support::run_reconciler_and_pools(client.clone(), ctx, Duration::from_secs(60)).await;

    let template = ProxySpec {
        provider: "hz".into(),
        placement: Placement::new("fsn1", "", "cpx11", "ubuntu"),
        cloud_init: CloudInit {
            inline: Some("#cloud-config\n".into()),
            secret_key_ref: None,
        },
        port: 3128,
        auth: Default::default(),
        ip_family: Default::default(),
    };
    let at = |region: &str, machine_type: &str, weight: i32| PoolPlacement {
        region: Some(region.into()),
        machine_type: Some(machine_type.into()),
        weight: Some(weight),
        ..Default::default()
    };
    let pools: Api<ProxyPool> = Api::namespaced(client.clone(), "default");
    let proxies: Api<Proxy> = Api::namespaced(client.clone(), "default");
    let mut pool = ProxyPool::new(
        "fleet",
        ProxyPoolSpec {
            placements: vec![at("fsn1", "cpx11", 3), at("nbg1", "cx23", 2)],
            ..ProxyPoolSpec::new(5, template)
        },
    );
    pool.metadata.namespace = Some("default".into());
    pools.create(&PostParams::default(), &pool).await.unwrap();

    let deadline = Instant::now() + Duration::from_secs(60);
    let children = loop {
        let list = proxies.list(&Default::default()).await.unwrap().items;
        let priced = list
            .iter()
            .filter(|p| p.status.as_ref().is_some_and(|s| s.hourly_price.is_some()))
            .count();
        if list.len() == 5 && priced == 5 {
            break list;
        }
        assert!(
            Instant::now() < deadline,
            "5 priced Proxies: {:#?}",
            list.iter().map(|p| &p.status).collect::<Vec<_>>()
        );
        tokio::time::sleep(Duration::from_millis(25)).await;
    };
    for p in &children {
        let want = match p.spec.placement.machine_type.as_str() {
            "cpx11" => eur("0.008"),
            _ => eur("0.012"),
        };
        let got = p.status.as_ref().unwrap().hourly_price.clone().unwrap();
        assert_eq!(got, want, "{}", p.spec.placement.machine_type);
    }
    let by_type = |t: &str| {
        children
            .iter()
            .filter(|p| p.spec.placement.machine_type == t)
            .count()
    };
    assert_eq!((by_type("cpx11"), by_type("cx23")), (3, 2), "the weights");

    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let pool = pools.get("fleet").await.unwrap();
        let sums = pool.status.map(|s| s.hourly_prices).unwrap_or_default();
        if sums == [eur("0.048")] {
            break;
        }
        assert!(Instant::now() < deadline, "pool hourlyPrices: {sums:?}");
        tokio::time::sleep(Duration::from_millis(25)).await;
    }

    let deadline = Instant::now() + Duration::from_secs(30);
    let want = [
        "proxy_operator_cost_per_hour{provider=\"hz\",placement=\"fsn1//cpx11\",capacity=\"OnDemand\",currency=\"EUR\"} 0.024",
        "proxy_operator_cost_per_hour{provider=\"hz\",placement=\"nbg1//cx23\",capacity=\"OnDemand\",currency=\"EUR\"} 0.024",
    ];
    loop {
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &metrics.registry).unwrap();
        if want.iter().all(|w| text.contains(w)) {
            break;
        }
        assert!(Instant::now() < deadline, "{text}");
        tokio::time::sleep(Duration::from_millis(25)).await;
    }

    let catalogue = emu
        .requests()
        .iter()
        .filter(|r| r.contains("server_types"))
        .count();
    assert!(
        catalogue <= 2,
        "one catalogue request per placement, not one per Proxy: {catalogue}"
    );
}
