//! Cloud-init never reaches the controller's logs or span fields.
//!
//! It shares its binary with the other operator tests: `testing::capture` installs one
//! process-wide subscriber that wants every callsite and routes each thread's events to
//! that thread's recorder, so tests running in parallel neither hide events from it nor
//! leak theirs into it.

use egress_plugin_host::provider::Provider;
use fake_kube::FakeApi;
use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, PostParams};
use proxy_operator::api::{self, CloudInit, Placement, Proxy, ProxySpec, SecretKeyRef, condition};
use proxy_operator::controller::{self, Context, Settings, Timings};
use proxy_operator::registry::ProviderRegistry;
use proxy_operator::testing::fake_provider::FakeProvider;
use std::sync::Arc;
use std::time::Duration;

// Single-threaded, so every task of the controller logs to this thread's subscriber.
#[tokio::test(flavor = "current_thread")]
async fn cloud_init_from_a_secret_never_reaches_logs() {
    let (_guard, logs) = proxy_operator::testing::capture();
    let sentinel = "SENTINEL-proxy-password-5d2c";
    let api = FakeApi::new();
    let client = api.client();
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    for (_, crd) in api::crds() {
        crds.create(&PostParams::default(), &crd).await.unwrap();
    }
    let secrets: Api<Secret> = Api::namespaced(client.clone(), "default");
    let mut secret = Secret::default();
    secret.metadata.name = Some("ci".into());
    secret.metadata.labels = Some(
        [(
            "egress.proxy-operator.dev/cloud-init".to_string(),
            "true".to_string(),
        )]
        .into(),
    );
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

    let fake = Arc::new(FakeProvider::new("fake"));
    let registry = ProviderRegistry::new([fake.clone() as Arc<dyn Provider>]);
    let mut settings = Settings::new("install-test");
    settings.timings = Timings {
        provisioning_poll: Duration::from_millis(20),
        requeue_now: Duration::from_millis(20),
        ..Timings::default()
    };
    let ctx = Arc::new(Context::new(client.clone(), registry, settings));
    tokio::spawn(controller::run(ctx, std::future::pending::<()>()));

    let proxies: Api<Proxy> = Api::namespaced(client, "default");
    let mut p = Proxy::new(
        "p1",
        ProxySpec {
            provider: "fake".into(),
            placement: Placement::default(),
            cloud_init: CloudInit {
                inline: None,
                secret_key_ref: Some(SecretKeyRef {
                    name: "ci".into(),
                    key: "user-data".into(),
                }),
            },
            port: 3128,
            auth: Default::default(),
            ip_family: Default::default(),
        },
    );
    p.metadata.namespace = Some("default".into());
    proxies.create(&PostParams::default(), &p).await.unwrap();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(15);
    loop {
        let p = proxies.get("p1").await.unwrap();
        if p.condition(condition::PROVISIONED)
            .is_some_and(|c| c.status == "True")
        {
            break;
        }
        assert!(tokio::time::Instant::now() < deadline, "{:?}", p.status);
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(
        String::from_utf8_lossy(&fake.last_create_request().unwrap().cloud_init).contains(sentinel),
        "the provider got the Secret's content"
    );
    let text = logs.all_text();
    assert!(
        text.contains("reconcile") && text.contains("decided") && text.contains("Created"),
        "the capture saw the controller's spans, logs and events"
    );
    assert!(!text.contains(sentinel), "cloud-init leaked into logs");
}
