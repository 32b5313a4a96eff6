//! Keep-alive connections to one provider's backends.
//!
//! A request that [`super::http`] has let out (allow-list, budget, DNS answered and every
//! address vetted) first asks the provider's pool for a connection to the same scheme,
//! host and port **made to one of the addresses this request's own lookup vetted**; only
//! if there is none is a new one dialled. Nothing is decided here: the pool never resolves
//! a name, and a connection to an address the latest lookup no longer vets (DNS moved, the
//! address became the operator's own) is never handed out again.
//!
//! Two kinds of connection. An HTTP/1.1 connection carries one request at a time: it is
//! taken out of the pool while it serves, and goes back only when its response body was
//! read to the end (a response dropped half-read closes its socket). An HTTP/2 connection
//! (an `https` backend that chose `h2` by ALPN, see [`super::h2`]) stays in the pool while
//! it serves, and is lent to up to [`super::h2::MAX_STREAMS`] requests at once (fewer if
//! the server allows fewer); a response dropped half-read only resets its stream.
//!
//! Bounded in number (`limits.http.maxIdle`: an HTTP/2 connection counts once, whatever
//! its streams; the oldest connection, an unused one first, is let go to make room) and in
//! time (`limits.http.idleTimeout`: a reaper closes connections with no request in flight
//! for longer, and a checkout never returns one).
//!
//! One pool per provider, held next to its [`super::http::HttpPolicy`] and dropped with
//! it (a reload builds new policies, so the old pools and their sockets go with the old
//! providers; an HTTP/2 connection still serving a response of the old provider closes
//! when that response is dropped): a connection is never shared by two providers, even
//! for the same host.

use hyper::body::Incoming;
use hyper::client::conn::{TrySendError, http1, http2};
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock, Weak};
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
    pub(super) sender: http1::SendRequest<WasiBody>,
    pub(super) _task: AbortOnDrop<Result<(), hyper::Error>>,
    pub key: Key,
    /// The vetted address it was dialled to.
    pub addr: SocketAddr,
}

/// One HTTP/2 connection, shared by the requests it carries: the pool holds one
/// reference, each request one more; the socket closes when the last is dropped.
pub struct H2Conn {
    pub(super) sender: http2::SendRequest<WasiBody>,
    pub(super) _task: AbortOnDrop<Result<(), hyper::Error>>,
    pub key: Key,
    /// The vetted address it was dialled to.
    pub addr: SocketAddr,
    /// The server's limit on streams at once (its SETTINGS), as last seen.
    pub(super) server_streams: Arc<std::sync::atomic::AtomicUsize>,
}

impl H2Conn {
    /// Requests it may carry at once: ours, or the server's own lower limit.
    fn max_streams(&self) -> usize {
        super::h2::MAX_STREAMS.min(self.server_streams.load(Ordering::Relaxed))
    }
}

struct Idle {
    conn: Conn,
    since: Instant,
}

/// An HTTP/2 connection in the pool.
struct Shared {
    conn: Arc<H2Conn>,
    /// Requests it carries now (their responses not yet dropped).
    streams: usize,
    /// When its last request ended (or when it was made).
    since: Instant,
}

/// What a checkout found.
pub enum Found {
    Http1(Conn),
    /// A stream of an HTTP/2 connection: counted as in flight on it already.
    Http2(Arc<H2Conn>),
}

/// A provider's kept-alive connections.
pub struct Pool {
    max_idle: usize,
    idle_timeout: Duration,
    inner: Mutex<Inner>,
    opened: AtomicU64,
    reused: AtomicU64,
    /// The provider's TLS config with ALPN (`h2`, `http/1.1`), made on its first `https`
    /// connection; it shares the provider's session cache.
    alpn: OnceLock<Arc<rustls::ClientConfig>>,
}

#[derive(Default)]
struct Inner {
    idle: Vec<Idle>,
    shared: Vec<Shared>,
    /// A reaper task runs while the pool holds connections.
    reaping: bool,
}

impl Inner {
    /// Connections the pool holds (an HTTP/2 one once, whatever its streams).
    fn held(&self) -> usize {
        self.idle.len() + self.shared.len()
    }

    /// Drops expired and closed connections: an HTTP/2 connection expires only when no
    /// request is in flight on it.
    fn prune(&mut self, now: Instant, idle_timeout: Duration) {
        self.idle
            .retain(|i| now.duration_since(i.since) < idle_timeout && !i.conn.sender.is_closed());
        self.shared.retain(|s| {
            !s.conn.sender.is_closed()
                && (s.streams > 0 || now.duration_since(s.since) < idle_timeout)
        });
    }

    /// Lets the oldest connection go, an unused one first (an HTTP/2 connection let go
    /// while it carries requests closes when they end).
    fn evict_one(&mut self) {
        let h1 = self.idle.first().map(|i| i.since);
        let h2 = self
            .shared
            .iter()
            .enumerate()
            .filter(|(_, s)| s.streams == 0)
            .min_by_key(|(_, s)| s.since)
            .map(|(at, s)| (at, s.since));
        match (h1, h2) {
            (Some(a), Some((at, b))) if b < a => {
                self.shared.remove(at);
            }
            (Some(_), _) => {
                self.idle.remove(0);
            }
            (None, Some((at, _))) => {
                self.shared.remove(at);
            }
            (None, None) if !self.shared.is_empty() => {
                self.shared.remove(0);
            }
            (None, None) => {}
        }
    }
}

impl Pool {
    pub fn new(max_idle: u32, idle_timeout: Duration) -> Arc<Pool> {
        Arc::new(Pool {
            max_idle: max_idle as usize,
            idle_timeout,
            inner: Mutex::default(),
            opened: AtomicU64::new(0),
            reused: AtomicU64::new(0),
            alpn: OnceLock::new(),
        })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The provider's TLS config offering `h2` and `http/1.1` by ALPN.
    pub(super) fn alpn_tls(&self, base: &Arc<rustls::ClientConfig>) -> Arc<rustls::ClientConfig> {
        self.alpn.get_or_init(|| super::h2::with_alpn(base)).clone()
    }

    /// A connection for `key` made to one of `vetted`: an HTTP/2 connection with a free
    /// stream (it stays in the pool, the stream counted), else the most recently used idle
    /// HTTP/1.1 connection (removed from the pool). Expired and closed connections are
    /// dropped on the way.
    pub fn take(&self, key: &Key, vetted: &[SocketAddr]) -> Option<Found> {
        let now = Instant::now();
        let mut inner = self.lock();
        inner.prune(now, self.idle_timeout);
        let usable = |c: &H2Conn| c.key == *key && vetted.contains(&c.addr);
        if let Some(s) = inner.shared.iter_mut().rev().find(|s| {
            usable(&s.conn) && s.streams < s.conn.max_streams() && s.conn.sender.is_ready()
        }) {
            s.streams += 1;
            return Some(Found::Http2(s.conn.clone()));
        }
        let at = inner
            .idle
            .iter()
            .rposition(|i| i.conn.key == *key && vetted.contains(&i.conn.addr))?;
        Some(Found::Http1(inner.idle.remove(at).conn))
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
        while inner.held() >= self.max_idle {
            inner.evict_one();
        }
        inner.idle.push(Idle {
            conn,
            since: Instant::now(),
        });
        self.reap_later(&mut inner);
    }

    /// A new HTTP/2 connection, with the stream of the request it was made for: kept
    /// while there is room (`maxIdle`, making room as [`Pool::put`] does), lent to that
    /// request either way.
    pub fn add_shared(self: &Arc<Self>, conn: H2Conn) -> Lease {
        let conn = Arc::new(conn);
        if self.max_idle > 0 {
            let mut inner = self.lock();
            while inner.held() >= self.max_idle {
                inner.evict_one();
            }
            inner.shared.push(Shared {
                conn: conn.clone(),
                streams: 1,
                since: Instant::now(),
            });
            self.reap_later(&mut inner);
        }
        Lease::shared(conn, self)
    }

    /// A request on an HTTP/2 connection ended (its response dropped).
    fn release(&self, conn: &Arc<H2Conn>) {
        let mut inner = self.lock();
        if let Some(s) = inner.shared.iter_mut().find(|s| Arc::ptr_eq(&s.conn, conn)) {
            s.streams = s.streams.saturating_sub(1);
            s.since = Instant::now();
        }
    }

    fn reap_later(self: &Arc<Self>, inner: &mut Inner) {
        if !inner.reaping
            && let Ok(rt) = tokio::runtime::Handle::try_current()
        {
            inner.reaping = true;
            rt.spawn(reap(Arc::downgrade(self), self.idle_timeout));
        }
    }

    /// Connections held now (an HTTP/2 one once).
    #[cfg(test)]
    pub fn idle(&self) -> usize {
        self.lock().held()
    }

    /// HTTP/2 connections held now, and the requests in flight on each.
    #[cfg(test)]
    pub fn streams(&self) -> Vec<usize> {
        self.lock().shared.iter().map(|s| s.streams).collect()
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

/// Closes connections with no request in flight for longer than `idle_timeout`, checking
/// a few times per timeout; ends with the pool or when it holds no connection (the next
/// `put` or `add_shared` starts another).
async fn reap(pool: Weak<Pool>, idle_timeout: Duration) {
    let period = (idle_timeout / 4).clamp(Duration::from_millis(10), Duration::from_secs(5));
    loop {
        tokio::time::sleep(period).await;
        let Some(pool) = pool.upgrade() else {
            return;
        };
        let mut inner = pool.lock();
        inner.prune(Instant::now(), idle_timeout);
        if inner.held() == 0 {
            inner.reaping = false;
            return;
        }
    }
}

enum Lent {
    Http1(Conn),
    /// The connection, and this request's own handle on it.
    Http2(Arc<H2Conn>, http2::SendRequest<WasiBody>),
}

/// A connection lent to one request. HTTP/1.1: back to its pool when dropped if the
/// response was read to the end ([`Lease::done`]), closed otherwise. HTTP/2: the stream
/// is given back to the pool when dropped, read to the end or not (hyper resets a stream
/// whose response is dropped half-read; the connection serves on).
pub struct Lease {
    conn: Option<Lent>,
    pool: Weak<Pool>,
    done: bool,
}

impl Lease {
    pub fn new(conn: Conn, pool: &Arc<Pool>) -> Lease {
        Lease {
            conn: Some(Lent::Http1(conn)),
            pool: Arc::downgrade(pool),
            done: false,
        }
    }

    /// A stream of `conn`, already counted in flight on it by the pool.
    pub fn shared(conn: Arc<H2Conn>, pool: &Arc<Pool>) -> Lease {
        let sender = conn.sender.clone();
        Lease {
            conn: Some(Lent::Http2(conn, sender)),
            pool: Arc::downgrade(pool),
            done: false,
        }
    }

    /// What checkout found, lent.
    pub fn found(found: Found, pool: &Arc<Pool>) -> Lease {
        match found {
            Found::Http1(c) => Lease::new(c, pool),
            Found::Http2(c) => Lease::shared(c, pool),
        }
    }

    fn lent(&mut self) -> &mut Lent {
        self.conn
            .as_mut()
            .expect("a lease holds its connection until dropped")
    }

    /// Whether it speaks HTTP/2.
    pub fn is_h2(&self) -> bool {
        matches!(self.conn, Some(Lent::Http2(..)))
    }

    /// Waits until the connection can take a request; `Err`: it is closed.
    pub(super) async fn ready(&mut self) -> hyper::Result<()> {
        match self.lent() {
            Lent::Http1(c) => c.sender.ready().await,
            Lent::Http2(_, s) => s.ready().await,
        }
    }

    /// Sends `request` on the connection; the request comes back in the error if the
    /// connection was closed before it went out.
    pub(super) async fn send(
        &mut self,
        request: http::Request<WasiBody>,
    ) -> Result<http::Response<Incoming>, TrySendError<http::Request<WasiBody>>> {
        match self.lent() {
            Lent::Http1(c) => c.sender.try_send_request(request).await,
            Lent::Http2(_, s) => s.try_send_request(request).await,
        }
    }

    /// The response was read to the end: the connection may serve another request.
    pub fn done(&mut self) {
        self.done = true;
    }
}

impl Drop for Lease {
    fn drop(&mut self) {
        let Some(pool) = self.pool.upgrade() else {
            return;
        };
        match self.conn.take() {
            Some(Lent::Http1(conn)) if self.done => pool.put(conn),
            Some(Lent::Http2(conn, _)) => pool.release(&conn),
            _ => {}
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
