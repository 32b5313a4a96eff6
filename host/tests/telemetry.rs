//! What leaves the sandbox through telemetry: scrubbed log lines and error strings, and
//! the trace tree of provider operations and their HTTP requests.
//!
//! A binary of its own: `tracing` caches per-callsite interest process-wide, so a test
//! that captures spans must not share its process with tests that run plugins without a
//! subscriber (their first hit on a callsite would be cached as "not interested").

mod support;

use proxy_operator::config::Limits;
use proxy_operator::provider::{CreateRequest, Placement, Provider};

/// One cloud-init sentinel and one secret sentinel, leaked by the plugin every way it can;
/// neither reaches a log line, an error string or a span attribute.
#[tokio::test]
async fn sentinels_never_leave_the_sandbox() {
    let _dir = plugins_or_skip!();
    const CI_SENTINEL: &str = "CLOUDINIT-SENTINEL-7f3a9c";
    const SECRET_SENTINEL: &str = "SECRET-SENTINEL-c41d2e";
    let secrets = tempfile::tempdir().unwrap();
    let token = secrets.path().join("token");
    std::fs::write(&token, format!("{SECRET_SENTINEL}\n")).unwrap();
    let (_guard, captured) = proxy_operator::testing::capture();
    let rt = support::runtime();
    let p = support::provider(
        &rt,
        "hostile.wasm",
        &format!(
            "name: leaky\nplugin: hostile.wasm\nsecrets: {{token: {}}}",
            token.display()
        ),
    )
    .await;
    let p = proxy_operator::provider::Instrumented::new(p, Default::default());
    let req = CreateRequest {
        name: "proxy-aaaaaaaaaaaaaaaa".into(),
        uid: "uid-1".into(),
        namespace: "ns".into(),
        proxy_name: "px".into(),
        installation: "test".into(),
        placement: Placement::default(),
        cloud_init: format!("#cloud-config\nwrite_files:\n  - content: {CI_SENTINEL}\n")
            .into_bytes(),
        port: 3128,
    };
    let err = p.create(&req).await.expect_err("the leaky create fails");
    let targets = p.check().await.expect("has a check");
    let mut seen = format!("{err}\n{err:?}\n{:?}\n{}", targets, captured.all_text());
    seen.push_str(&format!("{req:?}"));
    for sentinel in [CI_SENTINEL, SECRET_SENTINEL] {
        assert!(!seen.contains(sentinel), "{sentinel} leaked:\n{seen}");
    }
    assert!(
        err.message.contains("[REDACTED]"),
        "the error kept its shape: {err}"
    );
    assert!(
        captured
            .events()
            .iter()
            .any(|e| e.target == "plugin" && e.message().contains("[REDACTED]")),
        "the plugin's log lines were kept, scrubbed"
    );
    assert_eq!(Limits::default().log_lines, 200);
}

/// The provider operation span is the parent of one child span per HTTP request, which
/// carries method, host, status and duration.
#[tokio::test]
async fn http_requests_are_child_spans_of_the_operation() {
    let _dir = plugins_or_skip!();
    let server = support::TestServer::start().await;
    let (_guard, captured) = proxy_operator::testing::capture();
    let rt = support::runtime();
    let p = support::provider(
        &rt,
        "hostile.wasm",
        &support::hostile_yaml(server.port, "logLines: 10"),
    )
    .await;
    let metrics = proxy_operator::provider::ProviderMetrics::default();
    let p = proxy_operator::provider::Instrumented::new(p, metrics.clone());
    p.get(&format!("http:{}", server.url("/ok"))).await.unwrap();
    let denied = p.get("http:http://example.invalid/").await.unwrap_err();
    assert_eq!(denied.code.as_deref(), Some("HttpRequestDenied"));

    let spans = captured.spans();
    let ops: Vec<_> = spans.iter().filter(|s| s.name == "provider.get").collect();
    assert_eq!(ops.len(), 2, "{spans:#?}");
    let http: Vec<_> = spans.iter().filter(|s| s.name == "http.request").collect();
    assert_eq!(http.len(), 2, "{spans:#?}");
    for (op, child) in ops.iter().zip(&http) {
        assert_eq!(
            child.parent,
            Some(op.id),
            "http span is a child of its operation"
        );
        assert_eq!(child.fields["http.request.method"], "GET");
        assert!(child.fields.contains_key("duration_ms"));
    }
    assert_eq!(http[0].fields["http.response.status_code"], "200");
    assert_eq!(http[0].fields["server.address"], "127.0.0.1");
    assert_eq!(http[1].fields["error.type"], "HttpRequestDenied");
    assert_eq!(ops[0].fields["provider.result"], "ok");
    assert_eq!(ops[1].fields["provider.result"], "transient");
    assert_eq!(ops[0].fields["provider.name"], "hostile");

    let mut text = String::new();
    let mut reg = prometheus_client::registry::Registry::default();
    reg.register(
        "proxy_operator_provider_requests",
        "",
        metrics.requests.clone(),
    );
    prometheus_client::encoding::text::encode(&mut text, &reg).unwrap();
    assert!(
        text.contains(
            r#"proxy_operator_provider_requests_total{provider="hostile",op="get",result="ok"} 1"#
        ),
        "{text}"
    );
    assert!(text.contains(r#"proxy_operator_provider_requests_total{provider="hostile",op="get",result="transient"} 1"#), "{text}");
}
