//! Keep-alive connections to one provider's backends.
//!
//! A request that [`super::http`] has let out (allow-list, budget, DNS answered and every
//! address vetted) first asks the provider's pool for an idle connection to the same
//! scheme, host and port **made to one of the addresses this request's own lookup
//! vetted**; only if there is none is a new one dialled. Nothing is decided here: the pool
//! never resolves a name, and a connection to an address the latest lookup no longer
//! vets (DNS moved, the address became the operator's own) is never handed out again.
//!
//! Bounded in number (`limits.http.maxIdle`: the oldest idle connection is closed to make
//! room) and in time (`limits.http.idleTimeout`: a reaper closes connections idle longer,
//! and a checkout never returns one). A connection goes back only when its response body
//! was read to the end; a response dropped half-read closes its socket.
//!
//! One pool per provider, held next to its [`super::http::HttpPolicy`] and dropped with
//! it (a reload builds new policies, so the old pools and their sockets go with the old
//! providers): a connection is never shared by two providers, even for the same host.

use hyper::client::conn::http1::SendRequest;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::task::{Context, Poll};
use std::time::Duration;
use tokio::time::Instant;
use wasmtime_wasi_http::WasiBody;

/// What a connection was made for: a connection serves only requests with the same key
/// (and one of whose vetted addresses is [`Conn::addr`]).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Key {
    pub https: bool,
    /// The URL's host, lower-cased: the TLS server name the connection was verified for.
    pub host: String,
    pub port: u16,
}

/// A task aborted when its handle is dropped (tokio's own handle detaches).
pub(super) struct AbortOnDrop<T>(pub tokio::task::JoinHandle<T>);

impl<T> Drop for AbortOnDrop<T> {
    fn drop(&mut self) {
        self.0.abort();
    }
}

impl<T> Future for AbortOnDrop<T> {
    type Output = Result<T, tokio::task::JoinError>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        Pin::new(&mut self.0).poll(cx)
    }
}

/// One HTTP/1.1 connection: its sender, and the task that drives its socket (aborted,
/// and the socket closed, when the connection is dropped).
pub struct Conn {
    pub(super) sender: SendRequest<WasiBody>,
    pub(super) _task: AbortOnDrop<Result<(), hyper::Error>>,
    pub key: Key,
    /// The vetted address it was dialled to.
    pub addr: SocketAddr,
}

struct Idle {
    conn: Conn,
    since: Instant,
}

/// A provider's idle connections.
pub struct Pool {
    max_idle: usize,
    idle_timeout: Duration,
    inner: Mutex<Inner>,
    opened: AtomicU64,
    reused: AtomicU64,
}

#[derive(Default)]
struct Inner {
    idle: Vec<Idle>,
    /// A reaper task runs while there are idle connections.
    reaping: bool,
}

impl Pool {
    pub fn new(max_idle: u32, idle_timeout: Duration) -> Arc<Pool> {
        Arc::new(Pool {
            max_idle: max_idle as usize,
            idle_timeout,
            inner: Mutex::default(),
            opened: AtomicU64::new(0),
            reused: AtomicU64::new(0),
        })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The most recently used idle connection for `key` made to one of `vetted`, removed
    /// from the pool. Expired and closed connections are dropped on the way.
    pub fn take(&self, key: &Key, vetted: &[SocketAddr]) -> Option<Conn> {
        let now = Instant::now();
        let mut inner = self.lock();
        inner.idle.retain(|i| {
            now.duration_since(i.since) < self.idle_timeout && !i.conn.sender.is_closed()
        });
        let at = inner
            .idle
            .iter()
            .rposition(|i| i.conn.key == *key && vetted.contains(&i.conn.addr))?;
        Some(inner.idle.remove(at).conn)
    }

    /// Counts a connection handed out again (the caller found it ready).
    pub(super) fn note_reused(&self) {
        self.reused.fetch_add(1, Ordering::Relaxed);
    }

    /// Counts a new connection.
    pub(super) fn note_opened(&self) {
        self.opened.fetch_add(1, Ordering::Relaxed);
    }

    /// Takes back a connection whose response was read to the end: closed connections and
    /// everything past `maxIdle` (the oldest first) are dropped.
    pub fn put(self: &Arc<Self>, conn: Conn) {
        if self.max_idle == 0 || conn.sender.is_closed() {
            return;
        }
        let mut inner = self.lock();
        while inner.idle.len() >= self.max_idle {
            inner.idle.remove(0);
        }
        inner.idle.push(Idle {
            conn,
            since: Instant::now(),
        });
        if !inner.reaping
            && let Ok(rt) = tokio::runtime::Handle::try_current()
        {
            inner.reaping = true;
            rt.spawn(reap(Arc::downgrade(self), self.idle_timeout));
        }
    }

    /// Idle connections now.
    #[cfg(test)]
    pub fn idle(&self) -> usize {
        self.lock().idle.len()
    }

    /// Connections opened and reused since the pool was made.
    #[cfg(test)]
    pub fn counts(&self) -> (u64, u64) {
        (
            self.opened.load(Ordering::Relaxed),
            self.reused.load(Ordering::Relaxed),
        )
    }
}

/// Closes connections idle past `idle_timeout`, checking a few times per timeout; ends
/// with the pool or when it holds no idle connection (the next `put` starts another).
async fn reap(pool: Weak<Pool>, idle_timeout: Duration) {
    let period = (idle_timeout / 4).clamp(Duration::from_millis(10), Duration::from_secs(5));
    loop {
        tokio::time::sleep(period).await;
        let Some(pool) = pool.upgrade() else {
            return;
        };
        let now = Instant::now();
        let mut inner = pool.lock();
        inner
            .idle
            .retain(|i| now.duration_since(i.since) < idle_timeout && !i.conn.sender.is_closed());
        if inner.idle.is_empty() {
            inner.reaping = false;
            return;
        }
    }
}

/// A connection lent to one request: back to its pool when dropped if the response was
/// read to the end ([`Lease::done`]), closed otherwise.
pub struct Lease {
    conn: Option<Conn>,
    pool: Weak<Pool>,
    done: bool,
}

impl Lease {
    pub fn new(conn: Conn, pool: &Arc<Pool>) -> Lease {
        Lease {
            conn: Some(conn),
            pool: Arc::downgrade(pool),
            done: false,
        }
    }

    pub(super) fn conn(&mut self) -> &mut Conn {
        self.conn
            .as_mut()
            .expect("a lease holds its connection until dropped")
    }

    /// The response was read to the end: the connection may serve another request.
    pub fn done(&mut self) {
        self.done = true;
    }
}

impl Drop for Lease {
    fn drop(&mut self) {
        if let (true, Some(conn), Some(pool)) = (self.done, self.conn.take(), self.pool.upgrade()) {
            pool.put(conn);
        }
    }
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;
    use std::sync::atomic::AtomicU32;

    /// A local HTTP/1.1 server answering `ok` with keep-alive; counts accepted connections
    /// and closed ones.
    pub(crate) struct Server {
        pub addr: SocketAddr,
        pub accepted: Arc<AtomicU32>,
        pub closed: Arc<AtomicU32>,
        pub requests: Arc<AtomicU32>,
        task: tokio::task::JoinHandle<()>,
    }

    impl Drop for Server {
        fn drop(&mut self) {
            self.task.abort();
        }
    }

    pub(crate) async fn server() -> Server {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let accepted = Arc::new(AtomicU32::new(0));
        let closed = Arc::new(AtomicU32::new(0));
        let requests = Arc::new(AtomicU32::new(0));
        let (a, c, r) = (accepted.clone(), closed.clone(), requests.clone());
        let task = tokio::spawn(async move {
            while let Ok((s, _)) = listener.accept().await {
                a.fetch_add(1, Ordering::SeqCst);
                let (c, r) = (c.clone(), r.clone());
                tokio::spawn(async move {
                    serve(s, &r).await;
                    c.fetch_add(1, Ordering::SeqCst);
                });
            }
        });
        Server {
            addr,
            accepted,
            closed,
            requests,
            task,
        }
    }

    /// Answers every request head on `s` with `ok`, keeping the connection, until EOF.
    async fn serve(mut s: tokio::net::TcpStream, requests: &AtomicU32) {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let mut buf = Vec::new();
        let mut chunk = [0u8; 4096];
        loop {
            while let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
                buf.drain(..end + 4);
                requests.fetch_add(1, Ordering::SeqCst);
                let reply = b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok";
                if s.write_all(reply).await.is_err() {
                    return;
                }
            }
            match s.read(&mut chunk).await {
                Ok(0) | Err(_) => return,
                Ok(n) => buf.extend_from_slice(&chunk[..n]),
            }
        }
    }

    fn key(port: u16) -> Key {
        Key {
            https: false,
            host: "127.0.0.1".into(),
            port,
        }
    }

    async fn conn(addr: SocketAddr) -> Conn {
        let s = tokio::net::TcpStream::connect(addr).await.unwrap();
        let (sender, c) = hyper::client::conn::http1::Builder::new()
            .handshake(wasmtime_wasi_http::io::TokioIo::new(s))
            .await
            .unwrap();
        Conn {
            sender,
            _task: AbortOnDrop(tokio::spawn(c)),
            key: key(addr.port()),
            addr,
        }
    }

    async fn settle() {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    #[tokio::test]
    async fn idle_connections_are_bounded_and_the_oldest_goes_first() {
        let s = server().await;
        let pool = Pool::new(2, Duration::from_secs(30));
        for _ in 0..3 {
            pool.put(conn(s.addr).await);
        }
        assert_eq!(pool.idle(), 2);
        settle().await;
        assert_eq!(s.accepted.load(Ordering::SeqCst), 3);
        assert_eq!(s.closed.load(Ordering::SeqCst), 1, "the oldest was closed");
        // maxIdle 0: nothing is kept.
        let none = Pool::new(0, Duration::from_secs(30));
        none.put(conn(s.addr).await);
        assert_eq!(none.idle(), 0);
    }

    #[tokio::test]
    async fn idle_connections_are_closed_after_the_idle_timeout() {
        let s = server().await;
        let pool = Pool::new(4, Duration::from_millis(200));
        pool.put(conn(s.addr).await);
        assert_eq!(pool.idle(), 1);
        tokio::time::sleep(Duration::from_millis(500)).await;
        assert_eq!(pool.idle(), 0, "the reaper closed it");
        assert_eq!(s.closed.load(Ordering::SeqCst), 1, "and its socket");
        // A checkout never returns an expired one, reaper or not.
        let pool = Pool::new(4, Duration::from_millis(50));
        pool.put(conn(s.addr).await);
        tokio::time::sleep(Duration::from_millis(60)).await;
        assert!(pool.take(&key(s.addr.port()), &[s.addr]).is_none());
    }

    /// A connection is handed out only for its own key and to a request whose vetted
    /// addresses include the one it was dialled to.
    #[tokio::test]
    async fn a_connection_serves_only_its_key_and_a_still_vetted_address() {
        let s = server().await;
        let pool = Pool::new(4, Duration::from_secs(30));
        pool.put(conn(s.addr).await);
        let other: SocketAddr = "127.0.0.2:1".parse().unwrap();
        assert!(
            pool.take(&key(s.addr.port()), &[other]).is_none(),
            "DNS moved"
        );
        let mut k = key(s.addr.port());
        k.https = true;
        assert!(pool.take(&k, &[s.addr]).is_none(), "another scheme");
        let mut k = key(s.addr.port());
        k.host = "localhost".into();
        assert!(pool.take(&k, &[s.addr]).is_none(), "another host name");
        assert!(pool.take(&key(s.addr.port()), &[other, s.addr]).is_some());
    }

    #[tokio::test]
    async fn a_lease_goes_back_only_when_its_response_was_read() {
        let s = server().await;
        let pool = Pool::new(4, Duration::from_secs(30));
        drop(Lease::new(conn(s.addr).await, &pool));
        assert_eq!(pool.idle(), 0, "not read to the end: closed");
        let mut lease = Lease::new(conn(s.addr).await, &pool);
        lease.done();
        drop(lease);
        assert_eq!(pool.idle(), 1);
        // The pool gone, a lease's connection is closed.
        let mut lease = Lease::new(conn(s.addr).await, &pool);
        drop(pool);
        lease.done();
        drop(lease);
        settle().await;
        assert_eq!(
            s.closed.load(Ordering::SeqCst),
            3,
            "every connection closed"
        );
    }
}
