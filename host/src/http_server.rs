//! The operator's one HTTP port (discovery API, status page, `/metrics`, `/healthz`,
//! `/readyz`), served with a bound on what any client can make it hold.
//!
//! Anyone who can reach the port can open connections, authenticated or not: the pod
//! network is flat, and the bearer token is only read once a request's headers are in. A
//! plain `axum::serve` buffers up to ~400 KiB of unfinished headers per connection, has no
//! header timeout (hyper applies one only when given a timer) and no connection limit: a
//! few hundred connections that dribble header bytes and never finish take the operator
//! past its memory limit, and the kubelet's restarts cannot help while the attacker stays.
//! Here:
//!
//! | bound | default | flag |
//! |---|---|---|
//! | connections open at once | 512 | `--http-max-connections` |
//! | connections open at once from one client address | 64 | `--http-max-connections-per-client` |
//! | time to send a request's headers (also the idle time between requests) | 10 s | `--http-header-timeout` |
//! | bytes of one request head | 16 KiB | [`MAX_HEADER_BYTES`] |
//! | age of a connection | 5 min | [`MAX_CONNECTION_AGE`] |
//!
//! The per-client cap is what keeps the port answering the kubelet's probes (from the node's
//! address) and Prometheus while one pod floods it. The last sixteenth of the total (32 at
//! the defaults, [`Limits::reserve`]) is kept for clients with no connection open, so that a
//! flood from many addresses cannot shut a probe out either: to fill the port an attacker
//! needs `max_connections / max_per_client` addresses for the shared part and one more per
//! reserved place (8 + 32 at the defaults, against 8 without the reserve). A connection over
//! a cap is accepted and closed at once, so it never waits in the kernel's backlog holding a
//! client's hopes. The
//! worst case the port can hold is `max_connections x (MAX_HEADER_BYTES + a few KiB of
//! connection state)`, about 12 MiB at the defaults, which the operator's `--memory-reserve`
//! covers.

use axum::Router;
use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// Largest request head (request line and headers) read from a client. A Kubernetes
/// bearer token is 1-2 KiB; browsers send 1-4 KiB of headers.
pub const MAX_HEADER_BYTES: usize = 16 * 1024;
/// A connection is closed (gracefully, after the request in flight) at this age, so one
/// that reads its answers slowly cannot hold its slot for ever.
pub const MAX_CONNECTION_AGE: Duration = Duration::from_secs(300);

/// How many connections, from whom, and for how long.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    pub max_connections: usize,
    pub max_per_client: usize,
    pub header_timeout: Duration,
}

impl Limits {
    /// Places of the total kept for clients with no connection open: a new client (the
    /// kubelet, Prometheus) still gets in while the rest is full.
    pub fn reserve(&self) -> usize {
        self.max_connections / 16
    }
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_connections: 512,
            max_per_client: 64,
            header_timeout: Duration::from_secs(10),
        }
    }
}

/// Why a connection was closed at once.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refused {
    /// `max_connections` are open.
    Full,
    /// `max_per_client` are open from this address.
    ClientFull,
}

/// The connections open, by client address: whether one more may be served. Pure
/// bookkeeping, shared by the accept loop and the connections' tickets.
#[derive(Debug, Default)]
struct Counts {
    total: usize,
    by_client: HashMap<IpAddr, usize>,
}

/// Admits connections under [`Limits`]; each admitted one holds a [`Ticket`] until it
/// closes.
#[derive(Debug, Clone)]
pub struct Admission {
    limits: Limits,
    counts: Arc<Mutex<Counts>>,
}

/// One admitted connection; dropping it frees its place.
#[derive(Debug)]
pub struct Ticket {
    client: IpAddr,
    counts: Arc<Mutex<Counts>>,
}

impl Admission {
    pub fn new(limits: Limits) -> Self {
        Admission {
            limits,
            counts: Arc::default(),
        }
    }

    /// A ticket for one more connection from `client`, or why not.
    pub fn admit(&self, client: IpAddr) -> Result<Ticket, Refused> {
        let mut c = self.counts.lock().unwrap_or_else(|e| e.into_inner());
        let holds_some = c.by_client.get(&client).is_some_and(|n| *n > 0);
        let cap = if holds_some {
            self.limits.max_connections - self.limits.reserve()
        } else {
            self.limits.max_connections
        };
        if c.total >= cap {
            return Err(Refused::Full);
        }
        let mine = c.by_client.entry(client).or_insert(0);
        if *mine >= self.limits.max_per_client {
            return Err(Refused::ClientFull);
        }
        *mine += 1;
        c.total += 1;
        Ok(Ticket {
            client,
            counts: self.counts.clone(),
        })
    }

    /// Connections open now (tests, logs).
    pub fn open(&self) -> usize {
        self.counts.lock().unwrap_or_else(|e| e.into_inner()).total
    }
}

impl Drop for Ticket {
    fn drop(&mut self) {
        let mut c = self.counts.lock().unwrap_or_else(|e| e.into_inner());
        c.total -= 1;
        if let Some(n) = c.by_client.get_mut(&self.client) {
            *n -= 1;
            if *n == 0 {
                // The map holds only clients with connections open: its size is bounded
                // by `max_connections`, whatever addresses come and go.
                c.by_client.remove(&self.client);
            }
        }
    }
}

/// Serves `router` on `listener` (HTTP/1.1, TCP_NODELAY) under `limits` until `shutdown`
/// completes; then stops accepting, lets each connection finish the request it is
/// answering, and returns once all are closed.
pub async fn serve(
    listener: tokio::net::TcpListener,
    router: Router,
    shutdown: impl Future<Output = ()> + Send + 'static,
    limits: Limits,
) -> std::io::Result<()> {
    use hyper_util::rt::{TokioIo, TokioTimer};
    use hyper_util::service::TowerToHyperService;

    let admission = Admission::new(limits);
    let stop = tokio_util::sync::CancellationToken::new();
    let mut connections = tokio::task::JoinSet::new();
    let mut shutdown = std::pin::pin!(shutdown);
    let mut refused_logged = tokio::time::Instant::now() - Duration::from_secs(60);
    loop {
        let (tcp, peer) = tokio::select! {
            _ = &mut shutdown => break,
            accepted = listener.accept() => match accepted {
                Ok(a) => a,
                Err(e) => {
                    // Out of descriptors or a connection reset before accept: wait a
                    // moment instead of spinning (what axum::serve does too).
                    tracing::debug!(error = %e, "accepting a connection failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
            // Reap finished connections as they end, so the set stays as small as the
            // connections open.
            Some(_) = connections.join_next(), if !connections.is_empty() => continue,
        };
        let ticket = match admission.admit(peer.ip()) {
            Ok(t) => t,
            Err(why) => {
                // Closed at once. Logged at most once a minute: a flood must not become a
                // log flood.
                if refused_logged.elapsed() >= Duration::from_secs(60) {
                    refused_logged = tokio::time::Instant::now();
                    tracing::warn!(client = %peer.ip(), reason = ?why, open = admission.open(),
                        max_connections = limits.max_connections, max_per_client = limits.max_per_client,
                        "refusing HTTP connections over the limit (said once a minute)");
                }
                drop(tcp);
                continue;
            }
        };
        let _ = tcp.set_nodelay(true);
        let service = TowerToHyperService::new(router.clone());
        let stop = stop.clone();
        connections.spawn(async move {
            let _ticket = ticket;
            let mut builder = hyper::server::conn::http1::Builder::new();
            builder
                .timer(TokioTimer::new())
                .header_read_timeout(limits.header_timeout)
                .max_buf_size(MAX_HEADER_BYTES);
            let conn = builder.serve_connection(TokioIo::new(tcp), service);
            let mut conn = std::pin::pin!(conn);
            let age = tokio::time::sleep(MAX_CONNECTION_AGE);
            let mut age = std::pin::pin!(age);
            let mut closing = false;
            loop {
                tokio::select! {
                    _ = conn.as_mut() => break,
                    _ = stop.cancelled(), if !closing => {
                        closing = true;
                        conn.as_mut().graceful_shutdown();
                    }
                    _ = &mut age, if !closing => {
                        closing = true;
                        conn.as_mut().graceful_shutdown();
                    }
                }
            }
        });
    }
    stop.cancel();
    drop(listener);
    while connections.join_next().await.is_some() {}
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    /// A flood from more addresses than the shared part needs still leaves a place for a
    /// client that holds none (the kubelet's probe), but never a second one for it.
    #[test]
    fn the_reserve_is_for_clients_with_nothing_open() {
        let a = Admission::new(Limits {
            max_connections: 32,
            max_per_client: 8,
            header_timeout: Duration::from_secs(1),
        });
        assert_eq!(a.limits.reserve(), 2);
        // Five attackers: 30 places at most, the last 2 kept.
        let mut held = vec![];
        let mut refused = 0;
        for i in 0..40 {
            match a.admit(ip(&format!("10.0.1.{}", i % 5))) {
                Ok(t) => held.push(t),
                Err(r) => {
                    assert_eq!(r, Refused::Full, "attempt {i}");
                    refused += 1;
                }
            }
        }
        assert_eq!((held.len(), refused), (30, 10));
        let probe = a
            .admit(ip("10.0.0.9"))
            .expect("a client with nothing open gets in");
        assert_eq!(
            a.admit(ip("10.0.0.9")).unwrap_err(),
            Refused::Full,
            "but not a second place from the reserve"
        );
        let _other = a.admit(ip("10.0.0.10")).expect("the second reserved place");
        assert_eq!(a.admit(ip("10.0.0.11")).unwrap_err(), Refused::Full);
        drop(probe);
        a.admit(ip("10.0.0.11"))
            .expect("a reserved place freed goes to the next new client");
    }

    #[test]
    fn admission_caps_the_total_and_each_client_and_frees_on_close() {
        let a = Admission::new(Limits {
            max_connections: 4,
            max_per_client: 2,
            header_timeout: Duration::from_secs(1),
        });
        let x1 = a.admit(ip("10.0.0.1")).unwrap();
        let x2 = a.admit(ip("10.0.0.1")).unwrap();
        assert_eq!(
            a.admit(ip("10.0.0.1")).unwrap_err(),
            Refused::ClientFull,
            "a third from one client"
        );
        let y1 = a.admit(ip("10.0.0.2")).unwrap();
        let _z1 = a.admit(ip("10.0.0.3")).unwrap();
        assert_eq!(
            a.admit(ip("10.0.0.4")).unwrap_err(),
            Refused::Full,
            "a fifth in all"
        );
        drop(y1);
        let _w1 = a.admit(ip("10.0.0.4")).expect("a place was freed");
        drop((x1, x2));
        assert_eq!(a.open(), 2);
        let counts = a.counts.lock().unwrap();
        assert!(
            !counts.by_client.contains_key(&ip("10.0.0.1")),
            "clients with nothing open are forgotten"
        );
    }
}
