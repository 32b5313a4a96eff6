//! Logging and tracing setup shared by the binary and the tests.
//!
//! Log lines go to stderr as human text ([`LogFormat::Text`], the default; colour only when
//! stderr is a terminal, so a file or a pod log holds no escape codes) or as one JSON object
//! per line ([`LogFormat::Json`], what the shipped Deployment sets), which log pipelines
//! index without parsing: the event's fields sit at the top level next to `timestamp`,
//! `level` and `target`, the innermost span's fields under `span` and every open span's
//! under `spans`, so a reconcile's `proxy.name` or `trace_id` is on each of its lines.
//!
//! Traces go to an OTLP collector only when the standard variables ask for it
//! (`OTEL_EXPORTER_OTLP_ENDPOINT`, `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`, or
//! `OTEL_TRACES_EXPORTER=otlp`; `OTEL_SDK_DISABLED=true` or `OTEL_TRACES_EXPORTER=none` turn
//! it off). Without them no OpenTelemetry layer is installed and spans cost what `tracing`
//! costs. The exporter reads the rest of `OTEL_*` itself (headers, timeout). It speaks
//! OTLP over HTTP (protobuf), http or https; for https the system roots are trusted, or the
//! PEM bundle named by `OTEL_EXPORTER_OTLP_TRACES_CERTIFICATE` / `OTEL_EXPORTER_OTLP_CERTIFICATE`.
//!
//! The wasmtime crates log guest I/O at debug and trace level — including the bytes a plugin
//! writes to stdout and the arguments of host calls. Those bytes can hold a plugin's secrets
//! or a Proxy's cloud-init before our redaction sees them, so their levels are capped here
//! whatever `RUST_LOG` asks for. The sentinel tests run with this same filter.

use opentelemetry::trace::{TraceContextExt, TracerProvider as _};
use opentelemetry_sdk::trace::SdkTracerProvider;
use tracing_opentelemetry::OpenTelemetrySpanExt;
use tracing_subscriber::EnvFilter;
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;

/// Crates whose debug/trace output can carry guest data.
const CAPPED: &[&str] = &[
    "wasmtime",
    "wasmtime_wasi",
    "wasmtime_wasi_http",
    "wasmtime_wasi_io",
    "cranelift",
    "wasmtime_internal",
];

/// Builds the log filter from a `RUST_LOG`-style string, dropping any directive that would
/// open the capped crates and capping them at `warn`.
pub fn env_filter(spec: &str) -> EnvFilter {
    let kept: Vec<&str> = spec
        .split(',')
        .map(str::trim)
        .filter(|d| !d.is_empty() && !CAPPED.iter().any(|c| d.starts_with(c)))
        .collect();
    let mut directives = kept.join(",");
    for c in CAPPED {
        if !directives.is_empty() {
            directives.push(',');
        }
        directives.push_str(c);
        directives.push_str("=warn");
    }
    EnvFilter::new(directives)
}

/// Whether the `OTEL_*` variables (read through `var`) ask for an OTLP trace exporter.
pub fn otlp_wanted(var: impl Fn(&str) -> Option<String>) -> bool {
    let set = |k: &str| var(k).is_some_and(|v| !v.trim().is_empty());
    if var("OTEL_SDK_DISABLED").is_some_and(|v| v.eq_ignore_ascii_case("true")) {
        return false;
    }
    match var("OTEL_TRACES_EXPORTER").map(|v| v.to_ascii_lowercase()) {
        Some(v) if v == "none" => false,
        Some(v) if v == "otlp" => true,
        _ => set("OTEL_EXPORTER_OTLP_ENDPOINT") || set("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"),
    }
}

/// The exporter's HTTP client: rustls with ring and the trust the `OTEL_*` variables ask
/// for, and their timeout (default 10 s). Built on a thread of its own, because a blocking
/// reqwest client must not be created inside the async runtime.
fn otlp_http_client(
    var: impl Fn(&str) -> Option<String>,
) -> anyhow::Result<reqwest::blocking::Client> {
    let first = |keys: [&str; 2]| {
        keys.iter()
            .find_map(|k| var(k).filter(|v| !v.trim().is_empty()))
    };
    let ca = first([
        "OTEL_EXPORTER_OTLP_TRACES_CERTIFICATE",
        "OTEL_EXPORTER_OTLP_CERTIFICATE",
    ])
    .map(std::path::PathBuf::from);
    let timeout = match first([
        "OTEL_EXPORTER_OTLP_TRACES_TIMEOUT",
        "OTEL_EXPORTER_OTLP_TIMEOUT",
    ]) {
        None => std::time::Duration::from_secs(10),
        Some(ms) => std::time::Duration::from_millis(ms.trim().parse().map_err(|_| {
            anyhow::anyhow!("OTEL_EXPORTER_OTLP_TIMEOUT: {ms:?} is not a number of milliseconds")
        })?),
    };
    let tls = egress_plugin_host::plugin::tls_config(ca.as_deref(), false)
        .map_err(|e| anyhow::anyhow!("OTEL_EXPORTER_OTLP_CERTIFICATE: {e}"))?;
    let tls = (*tls).clone();
    std::thread::spawn(move || {
        reqwest::blocking::Client::builder()
            .tls_backend_preconfigured(tls)
            .timeout(timeout)
            .build()
    })
    .join()
    .map_err(|_| anyhow::anyhow!("building the OTLP HTTP client panicked"))?
    .map_err(|e| anyhow::anyhow!("building the OTLP HTTP client: {e}"))
}

/// How log lines are written (`--log-format`, `LOG_FORMAT`): `Text`, human-readable lines
/// with ANSI colour only on a terminal and never with `NO_COLOR` set; or `Json`, one JSON
/// object per line with the fields of every span the event happened in. (The variants
/// carry no doc comments of their own: clap would turn them into a long help page.)
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum LogFormat {
    #[default]
    Text,
    Json,
}

/// Whether text logs on stderr get ANSI colour: only on a terminal, and not when
/// `NO_COLOR` (<https://no-color.org>) is set to something.
fn colour(stderr_is_terminal: bool, no_color: Option<std::ffi::OsString>) -> bool {
    stderr_is_terminal && no_color.is_none_or(|v| v.is_empty())
}

/// The stderr log layer for `format`.
fn log_layer<S>(format: LogFormat) -> Box<dyn tracing_subscriber::Layer<S> + Send + Sync>
where
    S: tracing::Subscriber + for<'a> tracing_subscriber::registry::LookupSpan<'a>,
{
    use std::io::IsTerminal;
    let layer = tracing_subscriber::fmt::layer().with_writer(std::io::stderr);
    match format {
        LogFormat::Text => Box::new(layer.with_ansi(colour(
            std::io::stderr().is_terminal(),
            std::env::var_os("NO_COLOR"),
        ))),
        LogFormat::Json => Box::new(
            layer
                .json()
                .flatten_event(true)
                .with_current_span(true)
                .with_span_list(true),
        ),
    }
}

/// Flushes and stops the trace exporter when dropped (at the end of `main`).
pub struct Telemetry {
    provider: Option<SdkTracerProvider>,
}

impl Drop for Telemetry {
    fn drop(&mut self) {
        if let Some(p) = self.provider.take() {
            let _ = p.shutdown();
        }
    }
}

/// Installs the global subscriber: log lines to stderr in `format`, filtered by
/// `log_filter` (see [`env_filter`]), and an OpenTelemetry layer when [`otlp_wanted`].
pub fn init(log_filter: &str, format: LogFormat) -> anyhow::Result<Telemetry> {
    let provider = if otlp_wanted(|k| std::env::var(k).ok()) {
        use opentelemetry_otlp::WithHttpConfig;
        let exporter = opentelemetry_otlp::SpanExporter::builder()
            .with_http()
            .with_http_client(otlp_http_client(|k| std::env::var(k).ok())?)
            .build()?;
        Some(
            SdkTracerProvider::builder()
                .with_batch_exporter(exporter)
                .with_resource(
                    opentelemetry_sdk::Resource::builder()
                        .with_service_name("proxy-operator")
                        .build(),
                )
                .build(),
        )
    } else {
        None
    };
    let otel = provider
        .as_ref()
        .map(|p| tracing_opentelemetry::layer().with_tracer(p.tracer("proxy-operator")));
    tracing_subscriber::registry()
        .with(env_filter(log_filter))
        .with(log_layer(format))
        .with(otel)
        .try_init()?;
    if provider.is_some() {
        tracing::info!("exporting traces over OTLP");
    }
    Ok(Telemetry { provider })
}

/// The OpenTelemetry trace id of `span`, when an OpenTelemetry layer records it: written
/// into the reconcile span's `trace_id` field, so every log line of a reconcile can be
/// looked up in the tracing backend.
pub fn trace_id(span: &tracing::Span) -> Option<String> {
    let cx = span.context();
    let sc = cx.span().span_context().clone();
    sc.is_valid().then(|| sc.trace_id().to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn otlp_is_opt_in_through_the_standard_variables() {
        let cases: &[(&[(&str, &str)], bool)] = &[
            (&[], false),
            (
                &[("OTEL_EXPORTER_OTLP_ENDPOINT", "http://collector:4318")],
                true,
            ),
            (
                &[(
                    "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
                    "http://c:4318/v1/traces",
                )],
                true,
            ),
            (&[("OTEL_TRACES_EXPORTER", "otlp")], true),
            (
                &[
                    ("OTEL_TRACES_EXPORTER", "none"),
                    ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://c"),
                ],
                false,
            ),
            (
                &[
                    ("OTEL_SDK_DISABLED", "true"),
                    ("OTEL_TRACES_EXPORTER", "otlp"),
                ],
                false,
            ),
            (&[("OTEL_EXPORTER_OTLP_ENDPOINT", " ")], false),
        ];
        for (vars, want) in cases {
            let get = |k: &str| {
                vars.iter()
                    .find(|(n, _)| *n == k)
                    .map(|(_, v)| v.to_string())
            };
            assert_eq!(otlp_wanted(get), *want, "{vars:?}");
        }
    }

    #[test]
    fn colour_only_on_a_terminal_without_no_color() {
        let cases = [
            (true, None, true),
            (false, None, false),
            (true, Some("1"), false),
            (true, Some(""), true),
            (false, Some("1"), false),
        ];
        for (terminal, no_color, want) in cases {
            assert_eq!(
                colour(terminal, no_color.map(Into::into)),
                want,
                "terminal={terminal} NO_COLOR={no_color:?}"
            );
        }
    }

    #[test]
    fn caps_wasmtime_whatever_the_user_asks() {
        let f = env_filter("debug,wasmtime_wasi=trace,proxy_operator=trace").to_string();
        assert!(!f.contains("wasmtime_wasi=trace"), "{f}");
        assert!(
            f.contains("wasmtime_wasi=warn")
                && f.contains("proxy_operator=trace")
                && f.contains("debug"),
            "{f}"
        );
    }
}
