//! What leaves the sandbox through telemetry: scrubbed log lines and error strings, and
//! the trace tree of provider operations and their HTTP requests.
//!
//! A binary of its own: `tracing` caches per-callsite interest process-wide, so a test
//! that captures spans must not share its process with tests that run plugins without a
//! subscriber (their first hit on a callsite would be cached as "not interested").

mod support;

use egress_plugin_host::config::Limits;
use egress_plugin_host::provider::{CreateRequest, Placement, Provider};

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
    let p = egress_plugin_host::provider::Instrumented::new(p, Default::default());
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
        ip_family: Default::default(),
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
    let metrics = egress_plugin_host::provider::ProviderMetrics::default();
    let p = egress_plugin_host::provider::Instrumented::new(p, metrics.clone());
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
    let p = egress_plugin_host::provider::Instrumented::new(p, Default::default());
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

/// OTLP export to an https collector trusted through `OTEL_EXPORTER_OTLP_CERTIFICATE`: the
/// real binary, one provider call, and a TLS server on 127.0.0.1 that must receive the
/// trace as `POST /v1/traces`. The CA and the server certificate are made with openssl.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn traces_are_exported_to_an_https_collector() {
    use std::process::Command;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let plugin_dir = plugins_or_skip!();
    let dir = tempfile::tempdir().unwrap();
    let d = |f: &str| dir.path().join(f);
    let openssl = |args: &[&str]| {
        let out = Command::new("openssl")
            .args(args)
            .current_dir(dir.path())
            .output()
            .expect("openssl (Debian's openssl package) is needed for this test");
        assert!(
            out.status.success(),
            "openssl {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    };
    openssl(&[
        "req",
        "-x509",
        "-newkey",
        "rsa:2048",
        "-nodes",
        "-keyout",
        "ca.key",
        "-out",
        "ca.pem",
        "-days",
        "1",
        "-subj",
        "/CN=egress-test-ca",
    ]);
    openssl(&[
        "req",
        "-newkey",
        "rsa:2048",
        "-nodes",
        "-keyout",
        "leaf.key",
        "-out",
        "leaf.csr",
        "-subj",
        "/CN=127.0.0.1",
    ]);
    std::fs::write(
        d("leaf.ext"),
        "subjectAltName=IP:127.0.0.1\nbasicConstraints=CA:FALSE\n",
    )
    .unwrap();
    openssl(&[
        "x509",
        "-req",
        "-in",
        "leaf.csr",
        "-CA",
        "ca.pem",
        "-CAkey",
        "ca.key",
        "-CAcreateserial",
        "-out",
        "leaf.pem",
        "-days",
        "1",
        "-extfile",
        "leaf.ext",
    ]);

    // The collector: TLS on loopback, records each request's first line, answers 200.
    let certs: Vec<_> =
        rustls_pemfile::certs(&mut std::fs::read(d("leaf.pem")).unwrap().as_slice())
            .collect::<Result<_, _>>()
            .unwrap();
    let key = rustls_pemfile::private_key(&mut std::fs::read(d("leaf.key")).unwrap().as_slice())
        .unwrap()
        .unwrap();
    let config = rustls::ServerConfig::builder_with_provider(std::sync::Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .unwrap()
    .with_no_client_auth()
    .with_single_cert(certs, key)
    .unwrap();
    let acceptor = tokio_rustls::TlsAcceptor::from(std::sync::Arc::new(config));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let (seen_tx, mut seen_rx) = tokio::sync::mpsc::unbounded_channel::<String>();
    let server = tokio::spawn(async move {
        loop {
            let (tcp, _) = listener.accept().await.unwrap();
            let (acceptor, seen) = (acceptor.clone(), seen_tx.clone());
            tokio::spawn(async move {
                let Ok(mut tls) = acceptor.accept(tcp).await else {
                    return;
                };
                let mut buf = vec![0u8; 64 * 1024];
                let n = tls.read(&mut buf).await.unwrap_or(0);
                let head = String::from_utf8_lossy(&buf[..n]);
                let _ = seen.send(head.lines().next().unwrap_or("").to_string());
                let _ = tls.write_all(b"HTTP/1.1 200 OK\r\ncontent-type: application/x-protobuf\r\ncontent-length: 0\r\nconnection: close\r\n\r\n").await;
                let _ = tls.shutdown().await;
            });
        }
    });

    let backend = egress_emulators::example::ExampleBackend::start("tok");
    std::fs::write(d("token"), "tok").unwrap();
    std::fs::write(
        d("providers.yaml"),
        format!(
            "providers:\n- name: ex\n  plugin: example.wasm\n  additionalHosts: ['{url}']\n  allowPrivateAddresses: true\n  \
             secrets: {{token: {token}}}\n  config: {{endpoint: '{url}', regions: [r1]}}\n",
            url = backend.url(),
            token = d("token").display()
        ),
    )
    .unwrap();
    let out = tokio::task::spawn_blocking({
        let (plugin_dir, dir) = (plugin_dir.clone(), dir.path().to_path_buf());
        move || {
            Command::new(env!("CARGO_BIN_EXE_proxy-operator"))
                .args(["provider", "call", "--provider", "ex"])
                .arg("--config")
                .arg(dir.join("providers.yaml"))
                .arg("--plugin-dir")
                .arg(plugin_dir)
                .arg("--plugin-cache-dir")
                .arg(support::cache_dir())
                .arg("--plugin-scratch-dir")
                .arg(dir.join("scratch"))
                .arg("list")
                .env(
                    "OTEL_EXPORTER_OTLP_ENDPOINT",
                    format!("https://127.0.0.1:{port}"),
                )
                .env("OTEL_EXPORTER_OTLP_CERTIFICATE", dir.join("ca.pem"))
                .output()
                .unwrap()
        }
    })
    .await
    .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "provider call failed: {stderr}");
    let first = tokio::time::timeout(std::time::Duration::from_secs(5), seen_rx.recv())
        .await
        .unwrap_or_else(|_| {
            panic!("no export reached the https collector; operator log:\n{stderr}")
        })
        .unwrap();
    assert_eq!(first, "POST /v1/traces HTTP/1.1", "{stderr}");
    assert!(!stderr.contains("ERROR"), "{stderr}");
    server.abort();
}
