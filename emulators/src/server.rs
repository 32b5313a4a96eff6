//! The thread every emulator serves from.
//!
//! Each emulator runs on its own thread and single-threaded runtime, so it works from sync
//! and async tests alike and keeps answering while a test's runtime is blocked in a
//! synchronous plugin call. Dropping the handle stops it and closes open connections.

use std::net::SocketAddr;

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
                    let server = std::future::IntoFuture::into_future(axum::serve(listener, app));
                    tokio::select! {
                        _ = server => {}
                        _ = rx => {}
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
