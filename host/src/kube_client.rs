//! The operator's Kubernetes client: kube's own stack (TLS, authentication, timeouts,
//! retries, headers), with the connection pool bounded.
//!
//! kube builds its hyper pool with hyper's defaults: every idle connection kept for 90 s,
//! as many as were ever open at once. A rollout opens one per status write in flight, and
//! each keeps the read buffer it grew to (up to about 400 KiB for a list page): after
//! 10,000 Proxies the leader held 23 connections to the API server at rest (heaptrack put
//! 6.8 MB in their buffers at the peak). Here at most [`MAX_IDLE`] stay idle, for
//! [`IDLE_FOR`], and a buffer grows to [`MAX_BUFFER`] at most (a larger answer streams
//! through it): 8 connections at rest, watches included. The RSS this saves at 10,000 was
//! within the run-to-run spread (docs/benchmarks.md); the sockets, and against a real API
//! server their TLS state, are what it bounds for sure. Watches hold their own connection
//! for as long as they run, as before.
//!
//! A cluster reached through a proxy (`proxy_url` in the kubeconfig) gets kube's default
//! client: its tunnel connectors are not rebuilt here.

use kube::client::ConfigExt;
use std::time::Duration;
use tower::{BoxError, ServiceBuilder};

/// Idle connections to the API server kept for reuse.
pub const MAX_IDLE: usize = 4;
/// How long an idle connection is kept.
pub const IDLE_FOR: Duration = Duration::from_secs(30);
/// The most a connection's read buffer grows to (hyper's floor is 8 KiB).
pub const MAX_BUFFER: usize = 64 << 10;

/// A client for `config`, as `kube::Client::try_from` builds it but for the pool bounds.
pub fn client(config: kube::Config) -> Result<kube::Client, kube::Error> {
    if config.proxy_url.is_some() {
        return kube::Client::try_from(config);
    }
    let mut http = hyper_util::client::legacy::connect::HttpConnector::new();
    http.enforce_http(false);
    let https = config.rustls_https_connector_with_connector(http)?;
    let mut connector = hyper_timeout::TimeoutConnector::new(https);
    connector.set_connect_timeout(config.connect_timeout);
    connector.set_read_timeout(config.read_timeout);
    connector.set_write_timeout(config.write_timeout);
    connector.set_reset_reader_on_write(config.reset_reader_on_write);
    let pool = hyper_util::client::legacy::Builder::new(hyper_util::rt::TokioExecutor::new())
        .pool_max_idle_per_host(MAX_IDLE)
        .pool_idle_timeout(IDLE_FOR)
        .http1_max_buf_size(MAX_BUFFER)
        .build(connector);
    let retry = config
        .default_retry
        .then(|| tower::retry::RetryLayer::new(kube::client::retry::RetryPolicy::server_retry()));
    let service = ServiceBuilder::new()
        .layer(config.base_uri_layer())
        .option_layer(retry)
        .option_layer(config.auth_layer()?)
        .layer(config.extra_headers_layer()?)
        .map_err(BoxError::from)
        .service(pool);
    Ok(kube::Client::new(service, config.default_namespace))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};

    /// An API server on loopback that answers `/version` after 50 ms and counts the
    /// connections open to it.
    async fn server() -> (std::net::SocketAddr, Arc<AtomicUsize>, Arc<AtomicUsize>) {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let open = Arc::new(AtomicUsize::new(0));
        let accepted = Arc::new(AtomicUsize::new(0));
        let (o, a) = (open.clone(), accepted.clone());
        tokio::spawn(async move {
            loop {
                let (tcp, _) = listener.accept().await.unwrap();
                o.fetch_add(1, Ordering::SeqCst);
                a.fetch_add(1, Ordering::SeqCst);
                let o = o.clone();
                tokio::spawn(async move {
                    let svc = hyper::service::service_fn(|_req| async {
                        tokio::time::sleep(Duration::from_millis(50)).await;
                        Ok::<_, std::convert::Infallible>(hyper::Response::new(
                            http_body_util::Full::new(bytes::Bytes::from_static(
                                br#"{"major":"1","minor":"31","gitVersion":"v1.31.0","gitCommit":"","gitTreeState":"","buildDate":"2024-01-01T00:00:00Z","goVersion":"","compiler":"","platform":""}"#,
                            )),
                        ))
                    });
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(hyper_util::rt::TokioIo::new(tcp), svc)
                        .await;
                    o.fetch_sub(1, Ordering::SeqCst);
                });
            }
        });
        (addr, open, accepted)
    }

    /// 32 requests at once open 32 connections; once they are answered, at most
    /// `MAX_IDLE` stay open (kube's default pool kept all 32 for 90 s).
    #[tokio::test]
    async fn idle_connections_to_the_api_server_are_bounded() {
        let (addr, open, accepted) = server().await;
        let config = kube::Config::new(format!("http://{addr}").parse().unwrap());
        let client = client(config).unwrap();
        let calls: Vec<_> = (0..32)
            .map(|_| {
                let c = client.clone();
                tokio::spawn(async move { c.apiserver_version().await })
            })
            .collect();
        for c in calls {
            assert_eq!(c.await.unwrap().unwrap().minor, "31");
        }
        assert!(
            accepted.load(Ordering::SeqCst) > MAX_IDLE,
            "the calls ran at once"
        );
        let deadline = std::time::Instant::now() + Duration::from_secs(5);
        while open.load(Ordering::SeqCst) > MAX_IDLE {
            assert!(
                std::time::Instant::now() < deadline,
                "{} connections still open, at most {MAX_IDLE} kept",
                open.load(Ordering::SeqCst)
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        // The kept ones serve the next calls.
        let before = accepted.load(Ordering::SeqCst);
        client.apiserver_version().await.unwrap();
        assert_eq!(
            accepted.load(Ordering::SeqCst),
            before,
            "an idle connection was reused"
        );
    }
}
