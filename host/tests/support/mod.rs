//! Shared helpers for the host's integration tests: finding the built plugins, a runtime
//! with a shared compile cache, and a tiny HTTP server on 127.0.0.1.
#![allow(dead_code)]

pub mod bomb;
pub mod http;
pub mod process;
pub mod real_cloud;
pub mod registry;
pub mod sentinels;
pub mod suite;
pub mod tinyproxy;

use egress_plugin_host::config::{ProviderEntry, ProvidersFile};
use egress_plugin_host::plugin::{LoadedPlugin, Runtime, RuntimeOptions, WasmProvider};
use std::path::PathBuf;
use std::sync::{Arc, OnceLock};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;

/// The directory `cargo xtask build-plugins` fills. `None` (after saying so loudly) when
/// the plugins were not built; under `CI=true` that is a failure instead.
pub fn plugin_dir() -> Option<PathBuf> {
    let dir = match std::env::var_os("EGRESS_PLUGIN_DIR") {
        Some(d) => PathBuf::from(d),
        None => {
            let target = std::env::var_os("CARGO_TARGET_DIR")
                .map(PathBuf::from)
                .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../target"));
            target.join("plugins")
        }
    };
    if dir.join("example.wasm").is_file() && dir.join("testing/hostile.wasm").is_file() {
        return Some(dir);
    }
    let msg = format!(
        "plugins not built in {} — run `cargo xtask build-plugins` (or `cargo xtask test`)",
        dir.display()
    );
    if std::env::var("CI").is_ok_and(|v| v == "true") {
        panic!("{msg}");
    }
    eprintln!("\n!!! SKIPPING: {msg}\n");
    None
}

/// Whether this machine has the IPv6 loopback address (`::1`) for the IPv6 tests.
///
/// A kernel setting, not a tool we can install: `cargo xtask test` turns it on when it can
/// (`net.ipv6.conf.lo.disable_ipv6=0`, as root) and otherwise sets
/// `EGRESS_NO_IPV6_LOOPBACK=1` after saying so, loudly and once. Only then do these tests
/// skip; anywhere else, under `CI=true`, a missing `::1` fails them.
pub fn ipv6_loopback() -> bool {
    if std::net::TcpListener::bind("[::1]:0").is_ok() {
        return true;
    }
    let msg = "this machine has no IPv6 loopback address (::1): the IPv6 tests cannot run";
    let excused = std::env::var("EGRESS_NO_IPV6_LOOPBACK").is_ok_and(|v| v == "1");
    if std::env::var("CI").is_ok_and(|v| v == "true") && !excused {
        panic!("{msg}");
    }
    eprintln!("\n!!! SKIPPING: {msg}\n");
    false
}

/// Skips the test (loudly) when the plugins are not built.
#[macro_export]
macro_rules! plugins_or_skip {
    () => {
        match support::plugin_dir() {
            Some(d) => d,
            None => return,
        }
    };
}

/// The plugin compile cache of the tests: one directory for every test binary and run (in
/// the target directory when there is one), so each plugin version compiles once, not once
/// per binary. It used to be a temporary directory per binary that was never removed (a
/// `static` is not dropped): 4 MB left in /tmp by every test binary run. Artifacts are
/// written atomically, so binaries running at once share it safely; those not used for a
/// day are removed.
pub fn cache_dir() -> PathBuf {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        use std::os::unix::fs::PermissionsExt;
        let base = std::env::var_os("CARGO_TARGET_DIR")
            .map(PathBuf::from)
            .unwrap_or_else(std::env::temp_dir)
            .join("test-plugin-cache");
        std::fs::create_dir_all(&base).unwrap();
        // The runtime refuses a cache directory others can write to.
        std::fs::set_permissions(&base, std::fs::Permissions::from_mode(0o700)).unwrap();
        let dir = base.join("cache");
        let day = std::time::Duration::from_secs(24 * 3600);
        for entry in std::fs::read_dir(&dir).into_iter().flatten().flatten() {
            let old = entry
                .metadata()
                .and_then(|m| m.accessed().or_else(|_| m.modified()))
                .ok()
                .and_then(|t| t.elapsed().ok())
                .is_some_and(|age| age > day);
            if old {
                let _ = std::fs::remove_file(entry.path());
            }
        }
        dir
    })
    .clone()
}

pub fn runtime() -> Arc<Runtime> {
    runtime_with(true)
}

pub fn runtime_with(pooling: bool) -> Arc<Runtime> {
    let file = ProvidersFile::default();
    let mut opts = RuntimeOptions::for_providers(
        &file,
        Some(cache_dir()),
        std::env::temp_dir().join("egress-test-scratch"),
    );
    opts.engine.max_instances = 64;
    opts.engine.max_memory_bytes = 256 << 20;
    opts.engine.pooling = pooling;
    // Emulators answer far faster than a real backend allows: the tests set a budget where
    // they test one.
    opts.default_budgets = false;
    Runtime::new(opts).unwrap()
}

/// Parses one providers-file entry from YAML.
pub fn entry(yaml: &str) -> ProviderEntry {
    let file = ProvidersFile::parse(&format!(
        "providers:\n- {}",
        yaml.trim().replace('\n', "\n  ")
    ))
    .unwrap();
    file.providers.into_iter().next().unwrap()
}

pub async fn load(rt: &Arc<Runtime>, file: &str) -> Arc<LoadedPlugin> {
    let dir = plugin_dir().expect("plugin dir checked by caller");
    let path = [dir.join(file), dir.join("testing").join(file)]
        .into_iter()
        .find(|p| p.is_file())
        .unwrap_or_else(|| panic!("{file} is not in {}", dir.display()));
    rt.load_plugin(&path)
        .await
        .unwrap_or_else(|e| panic!("{e}"))
}

pub async fn provider(rt: &Arc<Runtime>, file: &str, yaml: &str) -> WasmProvider {
    let plugin = load(rt, file).await;
    rt.provider(plugin, &entry(yaml))
        .await
        .unwrap_or_else(|e| panic!("{e}"))
}

/// A minimal HTTP/1.1 server on 127.0.0.1 with a few fixed routes:
/// `/ok` (200, "hello"), `/big` (200, 20 MiB), `/slow` (no answer for 30 s),
/// `/drip` (headers at once, then one byte every 2 s), `/second` (200 after a second,
/// counted in [`TestServer::most_at_once`]). Stops when dropped.
pub struct TestServer {
    pub port: u16,
    /// Requests received so far.
    pub hits: std::sync::Arc<std::sync::atomic::AtomicUsize>,
    /// The most `/second` requests waiting at once so far.
    pub most_at_once: std::sync::Arc<std::sync::atomic::AtomicUsize>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for TestServer {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl TestServer {
    pub async fn start() -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let hits = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let counter = hits.clone();
        let most_at_once = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let (most, at_once) = (
            most_at_once.clone(),
            std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0)),
        );
        let task = tokio::spawn(async move {
            loop {
                let Ok((mut sock, _)) = listener.accept().await else {
                    return;
                };
                let counter = counter.clone();
                let (most, at_once) = (most.clone(), at_once.clone());
                tokio::spawn(async move {
                    let mut buf = vec![0u8; 8192];
                    let mut got = Vec::new();
                    while !got.windows(4).any(|w| w == b"\r\n\r\n") {
                        match sock.read(&mut buf).await {
                            Ok(0) | Err(_) => return,
                            Ok(n) => got.extend_from_slice(&buf[..n]),
                        }
                    }
                    counter.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                    let head = String::from_utf8_lossy(&got);
                    let path = head.split_whitespace().nth(1).unwrap_or("/").to_string();
                    match path.as_str() {
                        "/ok" => {
                            let _ = sock
                                .write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 5\r\nconnection: close\r\n\r\nhello")
                                .await;
                        }
                        "/big" | "/big-chunked" => {
                            let total = 20usize << 20;
                            let header = if path == "/big" {
                                format!(
                                    "HTTP/1.1 200 OK\r\ncontent-length: {total}\r\nconnection: close\r\n\r\n"
                                )
                            } else {
                                "HTTP/1.1 200 OK\r\nconnection: close\r\n\r\n".to_string()
                            };
                            if sock.write_all(header.as_bytes()).await.is_err() {
                                return;
                            }
                            let chunk = vec![b'x'; 64 << 10];
                            for _ in 0..total / chunk.len() {
                                if sock.write_all(&chunk).await.is_err() {
                                    return;
                                }
                            }
                        }
                        "/slow" => tokio::time::sleep(std::time::Duration::from_secs(30)).await,
                        "/second" => {
                            use std::sync::atomic::Ordering::SeqCst;
                            let now = at_once.fetch_add(1, SeqCst) + 1;
                            most.fetch_max(now, SeqCst);
                            tokio::time::sleep(std::time::Duration::from_secs(1)).await;
                            at_once.fetch_sub(1, SeqCst);
                            let _ = sock
                                .write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 5\r\nconnection: close\r\n\r\nhello")
                                .await;
                        }
                        "/drip" => {
                            let _ = sock
                                .write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 100\r\nconnection: close\r\n\r\n")
                                .await;
                            for _ in 0..100 {
                                tokio::time::sleep(std::time::Duration::from_secs(2)).await;
                                if sock.write_all(b"x").await.is_err() {
                                    return;
                                }
                            }
                        }
                        _ => {
                            let _ = sock
                                .write_all(b"HTTP/1.1 404 Not Found\r\ncontent-length: 0\r\nconnection: close\r\n\r\n")
                                .await;
                        }
                    }
                });
            }
        });
        TestServer {
            port,
            hits,
            most_at_once,
            task,
        }
    }

    pub fn url(&self, path: &str) -> String {
        format!("http://127.0.0.1:{}{path}", self.port)
    }
}

/// The hostile provider's entry: defaults for every limit the case does not set.
pub fn hostile_yaml(port: u16, limits: &str) -> String {
    let mut all: Vec<String> = limits
        .split(", ")
        .filter(|l| !l.is_empty())
        .map(String::from)
        .collect();
    for default in [
        "timeout: 5s",
        "fuel: 500000000",
        "memoryMib: 32",
        "tmpMib: 1",
    ] {
        let key = default.split(':').next().unwrap();
        if !limits.contains(&format!("{key}:")) {
            all.push(default.to_string());
        }
    }
    format!(
        r#"name: hostile
plugin: hostile.wasm
additionalHosts: ["http://127.0.0.1:{port}", "http://localhost:{port}"]
limits: {{{}}}"#,
        all.join(", ")
    )
}

/// A Proxy spec for `testing::fake_provider`'s "fake" provider in zone `zone`: the loops'
/// tests only care about the provider name, the zone and the port.
pub fn fake_spec(zone: &str) -> proxy_operator::api::ProxySpec {
    use proxy_operator::api::{CloudInit, Placement, ProxySpec};
    ProxySpec {
        provider: "fake".into(),
        placement: Placement::new("r1", zone, "small", "debian"),
        cloud_init: CloudInit {
            inline: Some("#cloud-config\npackages: [tinyproxy]\n".into()),
            secret_key_ref: None,
        },
        port: 3128,
        auth: Default::default(),
        ip_family: Default::default(),
    }
}

/// A Proxy spec for the Hetzner plugin registered as `hz` against its emulator (location
/// fsn1, cpx11, ubuntu), with inline `cloud_init` and `port`: the end-to-end tests' Proxy.
pub fn hetzner_spec(cloud_init: &str, port: u16) -> proxy_operator::api::ProxySpec {
    use proxy_operator::api::{CloudInit, Placement, ProxySpec};
    ProxySpec {
        provider: "hz".into(),
        placement: Placement::new("fsn1", "", "cpx11", "ubuntu"),
        cloud_init: CloudInit {
            inline: Some(cloud_init.into()),
            secret_key_ref: None,
        },
        port: i32::from(port),
        auth: Default::default(),
        ip_family: Default::default(),
    }
}

/// Controller settings with polls and backoff shrunk to tens of milliseconds, so the
/// loops' tests converge in seconds.
pub fn fast_settings(
    installation: &str,
    drift_ms: u64,
    quota_ms: u64,
) -> proxy_operator::controller::Settings {
    use std::time::Duration;
    let mut settings = proxy_operator::controller::Settings::new(installation);
    settings.timings = proxy_operator::controller::Timings {
        provisioning_poll: Duration::from_millis(50),
        deletion_poll: Duration::from_millis(50),
        drift_poll: Duration::from_millis(drift_ms),
        requeue_now: Duration::from_millis(20),
        quota_retry: Duration::from_millis(quota_ms),
        input_retry: Duration::from_millis(100),
    };
    settings.backoff_base = Duration::from_millis(20);
    settings.backoff_max = Duration::from_millis(200);
    settings
}

/// The Proxy reconciler of `ctx` with a health engine (a CONNECT through every proxy each
/// `probe_interval`, unhealthy after 3 failures in a row, to an echo server on 127.0.0.1)
/// and the pool controller, over one Proxy cache, as `run` wires them. Returns the echo
/// server's task: keep it for the test's length.
pub async fn run_reconciler_and_pools(
    client: kube::Client,
    ctx: proxy_operator::controller::Context,
    probe_interval: std::time::Duration,
) -> tokio::task::JoinHandle<()> {
    use proxy_operator::probe::{EngineConfig, ProbeEngine, Thresholds};
    use std::time::Duration;
    let (echo, echo_task) = tinyproxy::echo_server().await;
    let engine = ProbeEngine::new(
        EngineConfig {
            interval: probe_interval,
            concurrency: 16,
            thresholds: Thresholds {
                failure: 3,
                success: 1,
            },
        },
        None,
    );
    let ctx = ctx.with_health(proxy_operator::controller::HealthHook {
        engine,
        target: format!("127.0.0.1:{echo}"),
        egress_echo: None,
        timeout: Duration::from_secs(2),
        tls: None,
        probe_refresh: Duration::from_secs(60),
    });
    let (cache, feed, reflect) = proxy_operator::proxy_cache::watch_proxies(client.clone());
    tokio::spawn(reflect);
    let ctx = ctx.with_proxy_cache(cache.clone(), feed.clone());
    tokio::spawn(proxy_operator::controller::run(
        std::sync::Arc::new(ctx),
        std::future::pending::<()>(),
    ));
    tokio::spawn(proxy_operator::pool::run(
        client,
        cache,
        feed,
        Default::default(),
        std::future::pending::<()>(),
    ));
    echo_task
}
