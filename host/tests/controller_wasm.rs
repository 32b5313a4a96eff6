//! The Proxy controller with a real Wasm provider: the example plugin, through the plugin
//! runtime, against its emulated backend, with the controller against fake-kube. The same
//! path production takes, minus a real cluster and a real cloud.

mod support;

use egress_emulators::example::ExampleBackend;
use fake_kube::FakeApi;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use proxy_operator::api::{self, CloudInit, Placement, Proxy, ProxySpec, condition};
use proxy_operator::controller::{self, Context, Settings, Timings};
use proxy_operator::provider::{Instrumented, Provider, ProviderMetrics};
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn proxy_lifecycle_through_the_example_plugin() {
    let _dir = plugins_or_skip!();
    let backend = ExampleBackend::start("tok");
    let secrets = tempfile::tempdir().unwrap();
    let token = secrets.path().join("token");
    std::fs::write(&token, "tok").unwrap();
    let rt = support::runtime();
    let entry = format!(
        "name: ex\nplugin: example.wasm\nadditionalHosts: ['{url}']\nsecrets: {{token: {secret}}}\nconfig: {{endpoint: '{url}', regions: [r1, r2]}}",
        url = backend.url(),
        secret = token.display()
    );
    let wasm = support::provider(&rt, "example.wasm", &entry).await;
    let provider: Arc<dyn Provider> = Arc::new(Instrumented::new(wasm, ProviderMetrics::default()));
    let registry = ProviderRegistry::new([provider]);

    let fake = FakeApi::new();
    let client = fake.client();
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    for (_, crd) in api::crds() {
        crds.create(&PostParams::default(), &crd).await.unwrap();
    }
    let mut settings = Settings::new("install-wasm");
    settings.timings = Timings {
        provisioning_poll: Duration::from_millis(50),
        deletion_poll: Duration::from_millis(50),
        drift_poll: Duration::from_millis(300),
        requeue_now: Duration::from_millis(20),
        quota_retry: Duration::from_millis(300),
        input_retry: Duration::from_millis(100),
    };
    settings.backoff_base = Duration::from_millis(20);
    settings.backoff_max = Duration::from_millis(200);
    let ctx = Arc::new(Context::new(client.clone(), registry, settings));
    tokio::spawn(controller::run(ctx, std::future::pending::<()>()));

    let proxies: Api<Proxy> = Api::namespaced(client, "default");
    let cloud_init = "#cloud-config\npackages: [tinyproxy]\n";
    let mut p = Proxy::new(
        "p1",
        ProxySpec {
            provider: "ex".into(),
            placement: Placement {
                region: "r1".into(),
                zone: "z1".into(),
                machine_type: "small".into(),
                image: "img".into(),
            },
            cloud_init: CloudInit {
                inline: Some(cloud_init.into()),
                secret_key_ref: None,
            },
            port: 3128,
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
