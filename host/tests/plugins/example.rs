//! The well-behaved example plugin through the host, against its emulated backend: the
//! whole provider surface, secrets read on every call, and error classes.

use crate::support;

use egress_emulators::example::ExampleBackend;
use egress_plugin_host::provider::{Class, CreateRequest, Placement, Provider, State};

fn entry(backend: &ExampleBackend, secret: &std::path::Path) -> String {
    format!(
        "name: ex\nplugin: example.wasm\nadditionalHosts: ['{url}']\nallowPrivateAddresses: true\nsecrets: {{token: {secret}}}\nconfig: {{endpoint: '{url}', regions: [r1, r2]}}",
        url = backend.url(),
        secret = secret.display()
    )
}

fn request(uid: &str, region: &str) -> CreateRequest {
    CreateRequest {
        proxy_name: "p1".into(),
        cloud_init: b"#cloud-config\n\x00\xffbytes kept as they are\n".to_vec(),
        ..CreateRequest::new(uid, "inst-a", Placement::new(region, "z", "small", "img"))
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lifecycle_through_the_host() {
    let _dir = plugins_or_skip!();
    let backend = ExampleBackend::start("tok");
    let secrets = tempfile::tempdir().unwrap();
    let token = secrets.path().join("token");
    std::fs::write(&token, "tok").unwrap();
    let rt = support::runtime();
    let p = support::provider(&rt, "example.wasm", &entry(&backend, &token)).await;

    let req = request("uid-1", "r1");
    let id = p.create(&req).await.unwrap();
    assert_eq!(
        p.create(&req).await.unwrap(),
        id,
        "create is idempotent by name"
    );
    assert_eq!(backend.instances().len(), 1);
    assert_eq!(
        backend.instances()[0].user_data_bytes(),
        req.cloud_init,
        "user data byte for byte"
    );

    let first = p.get(&id).await.unwrap();
    assert_eq!(first.uid, "uid-1");
    assert!(first.created_at.is_some());
    let running = p.get(&id).await.unwrap();
    assert_eq!(running.state, State::Running);
    assert!(!running.ip.is_empty());

    let listed = p.list_by_tag("inst-a").await.unwrap();
    assert_eq!(
        listed.iter().map(|i| i.id.as_str()).collect::<Vec<_>>(),
        [id.as_str()]
    );
    assert!(
        p.list_by_tag("inst-b").await.unwrap().is_empty(),
        "other installations are not listed"
    );

    p.delete(&id).await.unwrap();
    p.delete(&id).await.unwrap();
    assert_eq!(p.get(&id).await.unwrap_err().class, Class::NotFound);
    assert_eq!(p.get("no-slash").await.unwrap_err().class, Class::Permanent);

    // Unknown placement: permanent, naming field and value, without calling the backend.
    let before = backend.requests().len();
    let err = p.create(&request("uid-2", "mars-1")).await.unwrap_err();
    assert_eq!(err.class, Class::Permanent);
    assert!(
        err.message.contains("placement.region") && err.message.contains("mars-1"),
        "{err}"
    );
    assert_eq!(backend.requests().len(), before);

    let targets = p.check().await.expect("example has a check");
    assert_eq!(
        targets
            .iter()
            .map(|t| t.target.as_str())
            .collect::<Vec<_>>(),
        ["r1", "r2"]
    );
    assert!(targets.iter().all(|t| t.ready), "{targets:?}");
}

/// Secrets are read on every call: a wrong token is Permanent, a missing file Transient,
/// and fixing the file takes effect at the next call without reloading anything.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn secrets_rotate_without_restart_and_errors_are_classified() {
    let _dir = plugins_or_skip!();
    let backend = ExampleBackend::start("right");
    let secrets = tempfile::tempdir().unwrap();
    let token = secrets.path().join("token");
    let rt = support::runtime();
    let p = support::provider(&rt, "example.wasm", &entry(&backend, &token)).await;
    let req = request("uid-3", "r2");

    let missing = p.create(&req).await.unwrap_err();
    assert_eq!(missing.class, Class::Transient, "{missing}");
    assert!(missing.message.contains("token"), "{missing}");

    std::fs::write(&token, "wrong").unwrap();
    let denied = p.create(&req).await.unwrap_err();
    assert_eq!(denied.class, Class::Permanent, "{denied}");

    std::fs::write(&token, "right").unwrap();
    let id = p.create(&req).await.unwrap();

    backend.inject_fault(503, 1);
    assert_eq!(p.get(&id).await.unwrap_err().class, Class::Transient);
    backend.inject_fault(429, 1);
    assert_eq!(p.get(&id).await.unwrap_err().class, Class::QuotaExceeded);
    assert!(p.get(&id).await.is_ok());
}
