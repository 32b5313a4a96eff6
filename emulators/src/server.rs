//! The thread every emulator serves from.
//!
//! Each emulator runs on its own thread and single-threaded runtime, so it works from sync
//! and async tests alike and keeps answering while a test's runtime is blocked in a
//! synchronous plugin call. Dropping the handle stops it and closes open connections.
//! Plain HTTP by default; HTTPS with a server configuration (a [`TestCa`](crate::tls::TestCa)'s).

use std::net::SocketAddr;
use std::sync::Arc;

pub(crate) struct ServerThread {
    addr: SocketAddr,
    shutdown: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl ServerThread {
    pub(crate) fn spawn(
        name: &str,
        listener: std::net::TcpListener,
        app: axum::Router,
        tls: Option<Arc<rustls::ServerConfig>>,
    ) -> ServerThread {
        let addr = listener.local_addr().expect("local addr");
        let (tx, rx) = tokio::sync::oneshot::channel::<()>();
        let thread = std::thread::Builder::new()
            .name(name.into())
            .spawn(move || {
                let rt = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                    .expect("emulator runtime");
                rt.block_on(async move {
                    let listener =
                        tokio::net::TcpListener::from_std(listener).expect("tokio listener");
                    match tls {
                        None => {
                            let server =
                                std::future::IntoFuture::into_future(axum::serve(listener, app));
                            tokio::select! {
                                _ = server => {}
                                _ = rx => {}
                            }
                        }
                        Some(config) => tokio::select! {
                            _ = serve_tls(listener, app, config) => {}
                            _ = rx => {}
                        },
                    }
                });
                // Dropping the runtime aborts open keep-alive connections, which a
                // graceful shutdown would wait for.
            })
            .expect("spawn emulator thread");
        ServerThread { addr, shutdown: Some(tx), thread: Some(thread) }
    }

    pub(crate) fn addr(&self) -> SocketAddr {
        self.addr
    }
}

/// Accepts TCP connections, completes the TLS handshake of each on its own task (a client
/// that never finishes its handshake must not stall the others), and serves HTTP/1 over it.
/// A failed handshake (an untrusting client aborts it) only ends that connection.
async fn serve_tls(
    listener: tokio::net::TcpListener,
    app: axum::Router,
    config: Arc<rustls::ServerConfig>,
) {
    let acceptor = tokio_rustls::TlsAcceptor::from(config);
    loop {
        let Ok((tcp, _)) = listener.accept().await else { continue };
        let (acceptor, app) = (acceptor.clone(), app.clone());
        tokio::spawn(async move {
            let Ok(stream) = acceptor.accept(tcp).await else { return };
            let service = hyper_util::service::TowerToHyperService::new(app);
            let _ = hyper::server::conn::http1::Builder::new()
                .serve_connection(hyper_util::rt::TokioIo::new(stream), service)
                .await;
        });
    }
}

impl Drop for ServerThread {
    fn drop(&mut self) {
        if let Some(tx) = self.shutdown.take() {
            let _ = tx.send(());
        }
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}
