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

/// Through OpenTelemetry (an in-memory exporter standing in for a collector): a reconcile
/// span holds the provider operation span, which holds the plugin's HTTP request span, all
/// in one trace; and the trace id reaches the reconcile span's `trace_id` field, so log
/// lines can be matched to the trace.
#[tokio::test]
async fn the_otel_trace_nests_http_under_the_operation_under_the_reconcile() {
    use opentelemetry::trace::TracerProvider as _;
    use opentelemetry_sdk::trace::{InMemorySpanExporter, SdkTracerProvider};
    use tracing::Instrument;
    use tracing_subscriber::layer::SubscriberExt;
    let _dir = plugins_or_skip!();
    let server = support::TestServer::start().await;
    let exporter = InMemorySpanExporter::default();
    let provider = SdkTracerProvider::builder()
        .with_simple_exporter(exporter.clone())
        .build();
    let (layer, captured) = proxy_operator::testing::CaptureLayer::new();
    let subscriber = tracing_subscriber::registry()
        .with(proxy_operator::telemetry::env_filter("info"))
        .with(tracing_opentelemetry::layer().with_tracer(provider.tracer("test")))
        .with(layer);
    let _guard = tracing::subscriber::set_default(subscriber);

    let rt = support::runtime();
    let p = support::provider(
        &rt,
        "hostile.wasm",
        &support::hostile_yaml(server.port, "logLines: 10"),
    )
    .await;
    let p = proxy_operator::provider::Instrumented::new(p, Default::default());
    let span = tracing::info_span!("reconcile", trace_id = tracing::field::Empty);
    let id = proxy_operator::telemetry::trace_id(&span).expect("an OpenTelemetry trace id");
    span.record("trace_id", id.as_str());
    p.get(&format!("http:{}", server.url("/ok")))
        .instrument(span)
        .await
        .unwrap();
    provider.force_flush().unwrap();

    let spans = exporter.get_finished_spans().unwrap();
    let find = |name: &str| {
        spans
            .iter()
            .find(|s| s.name == name)
            .unwrap_or_else(|| panic!("no {name} span in {spans:#?}"))
    };
    let (reconcile, op, http) = (
        find("reconcile"),
        find("provider.get"),
        find("http.request"),
    );
    assert_eq!(op.parent_span_id, reconcile.span_context.span_id());
    assert_eq!(http.parent_span_id, op.span_context.span_id());
    for s in [op, http] {
        assert_eq!(s.span_context.trace_id(), reconcile.span_context.trace_id());
    }
    assert_eq!(reconcile.span_context.trace_id().to_string(), id);
    let recorded = captured
        .spans()
        .into_iter()
        .find(|s| s.name == "reconcile")
        .unwrap();
    assert_eq!(recorded.fields["trace_id"], id);
}
