//! HTTP/2 to a plugin's backends: offered by ALPN on `https` connections only (no h2c on
//! plain `http`), used when the server picks it, and bounded here.
//!
//! An HTTP/2 connection lives in the provider's pool ([`super::pool`]) and carries several
//! requests of that provider at once. Every request on it still passes every rule of
//! [`super::http`] first (allow-list, budget, lookup and vetting, in-flight cap), and its
//! response goes through the same checks (header bytes, body cap, first-byte and
//! between-bytes timeouts) as an HTTP/1.1 response: only the framing differs.
//!
//! What a hostile server can make the host hold, and what bounds it:
//!
//! * response header blocks: decoded fields are counted against
//!   [`max_header_list_size`] (h2 stops keeping fields past it and resets the stream);
//!   HPACK's dynamic table is [`HEADER_TABLE_SIZE`] (a larger size update from the server
//!   is a connection error); CONTINUATION frames after a HEADERS frame are counted (at
//!   most `max(5, 1.25 x list size / frame size)`, then GOAWAY `ENHANCE_YOUR_CALM`), and
//!   the raw bytes of a block already over the size are capped at the list size (then
//!   GOAWAY `COMPRESSION_ERROR`). h2 applies our list size once the server has
//!   acknowledged our SETTINGS; before that it uses its own default (16 MiB);
//! * frames: at most [`MAX_FRAME_SIZE`] each, a larger one is a connection error;
//! * unread response bodies: [`STREAM_WINDOW`] per request, [`CONNECTION_WINDOW`] per
//!   connection (flow control: the server may not send more until the guest reads);
//! * SETTINGS: fixed-size values, applied one frame at a time. A large
//!   `MAX_CONCURRENT_STREAMS` does not raise [`MAX_STREAMS`]; a large initial window
//!   or frame size only lets us send the guest's body faster, and the guest's body is
//!   taken 64 KiB at a time ([`super::http::OUTGOING_CHUNK_BYTES`]);
//! * PING: one pong pending at a time; server push is refused (hyper's client turns it
//!   off); streams the server makes us reset are bounded by h2 (1024 per connection,
//!   then GOAWAY).

use super::pool::{AbortOnDrop, H2Conn, Key};
use crate::config::HttpLimits;
use hyper_util::rt::TokioExecutor;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use wasmtime_wasi_http::io::TokioIo;
use wasmtime_wasi_http::{Error, WasiBody};

/// ALPN protocols offered on `https` connections, preferred first.
pub const ALPN: [&[u8]; 2] = [b"h2", b"http/1.1"];

/// Requests one HTTP/2 connection carries at once (fewer if the server says so). Each is
/// still counted in its call's `limits.http.maxInFlight`; this keeps one socket from
/// carrying all of a provider's traffic, so that one stalled or closed connection fails
/// few requests; past it, a request gets a new connection.
pub const MAX_STREAMS: usize = 16;

/// Response body bytes the server may send on one request before the guest reads them.
/// Hyper's default is 2 MiB; this keeps a request within the fit's 512 KiB of response
/// buffers per request in flight (`config::fit::RESPONSE_BUFFER_BYTES`), with room for
/// the TLS record and the frames already handed to the guest.
pub const STREAM_WINDOW: u32 = 256 * 1024;

/// Unread response body bytes on one connection: every stream's window full, no more.
pub const CONNECTION_WINDOW: u32 = STREAM_WINDOW * MAX_STREAMS as u32;

/// The largest frame we accept: the protocol's default and minimum (hyper's default too).
/// Kept small so that one frame is small, and stated because the CONTINUATION bound
/// above is computed from it.
pub const MAX_FRAME_SIZE: u32 = 16 * 1024;

/// HPACK's dynamic table the server may make us keep: the protocol's default.
pub const HEADER_TABLE_SIZE: u32 = 4096;

/// Header fields allowed for in [`max_header_list_size`]: as many as hyper's HTTP/1.1
/// client accepts in a response (100).
pub const HEADER_FIELDS: u32 = 100;

/// HTTP/2 counts each header field as its name, its value and 32 bytes.
const FIELD_OVERHEAD: u32 = 32;

/// The largest response header block h2 decodes: `limits.http.maxHeaderBytes` (16 KiB)
/// plus HTTP/2's 32 bytes for each of up to [`HEADER_FIELDS`] fields. A header section
/// HTTP/1.1 would let through (at most 100 fields, names and values within
/// `maxHeaderBytes`) gets through; the same check as for HTTP/1.1
/// (`maxHeaderBytes` over names and values, in [`super::http`]) then applies, so both
/// refuse the same answers; anything larger is refused while it is decoded, never held.
pub fn max_header_list_size(limits: &HttpLimits) -> u32 {
    limits
        .max_header_bytes
        .saturating_add(FIELD_OVERHEAD * HEADER_FIELDS)
}

/// The provider's TLS config, offering [`ALPN`]. A clone: it shares the provider's
/// resumption cache. The shared `tls_config` is left without ALPN, since its other users
/// (OTLP export, registry pulls, the health probe) speak HTTP/1.1 only.
pub fn with_alpn(base: &Arc<rustls::ClientConfig>) -> Arc<rustls::ClientConfig> {
    let mut config = (**base).clone();
    config.alpn_protocols = ALPN.iter().map(|p| p.to_vec()).collect();
    Arc::new(config)
}

/// Whether the TLS handshake chose HTTP/2.
pub fn chosen<IO>(tls: &tokio_rustls::client::TlsStream<IO>) -> bool {
    tls.get_ref().1.alpn_protocol() == Some(ALPN[0])
}

/// The HTTP/2 handshake on `io` (TLS, ALPN `h2`), with the bounds above; the connection's
/// task spawned.
pub async fn handshake<IO>(
    io: IO,
    limits: &HttpLimits,
    key: Key,
    addr: SocketAddr,
) -> Result<H2Conn, hyper::Error>
where
    IO: tokio::io::AsyncRead + tokio::io::AsyncWrite + Send + Unpin + 'static,
{
    let (sender, conn) = hyper::client::conn::http2::Builder::new(TokioExecutor::new())
        .initial_stream_window_size(STREAM_WINDOW)
        .initial_connection_window_size(CONNECTION_WINDOW)
        .adaptive_window(false)
        .max_frame_size(MAX_FRAME_SIZE)
        .header_table_size(HEADER_TABLE_SIZE)
        .max_header_list_size(max_header_list_size(limits))
        .max_send_buf_size(super::http::OUTGOING_CHUNK_BYTES)
        // No keep-alive pings: a connection unused for `idleTimeout` is closed by the
        // pool's reaper, and a dead one shows on the next request (first-byte timeout).
        .keep_alive_interval(None)
        .handshake::<_, WasiBody>(TokioIo::new(io))
        .await?;
    // The server's own stream limit (its SETTINGS), read each time the connection is
    // driven, so that the pool opens another connection rather than queue past it.
    let server_streams = Arc::new(AtomicUsize::new(MAX_STREAMS));
    let seen = server_streams.clone();
    let mut conn = Box::pin(conn);
    let task = std::future::poll_fn(move |cx| {
        let polled = conn.as_mut().poll(cx);
        seen.store(conn.current_max_send_streams(), Ordering::Relaxed);
        polled
    });
    Ok(H2Conn {
        sender,
        _task: AbortOnDrop(tokio::spawn(task)),
        key,
        addr,
        server_streams,
    })
}

/// The h2 error under a hyper error, if any.
fn h2_error(e: &hyper::Error) -> Option<&::h2::Error> {
    let mut source: Option<&(dyn std::error::Error + 'static)> = std::error::Error::source(e);
    while let Some(s) = source {
        if let Some(h2) = s.downcast_ref::<::h2::Error>() {
            return Some(h2);
        }
        source = s.source();
    }
    None
}

/// An HTTP/2 request that failed before its response head: when h2 itself refused what
/// the server sent as the head (a header block over [`max_header_list_size`], too many
/// CONTINUATION frames, a block that cannot be decoded, or a malformed head), the error
/// the plugin sees is `HttpResponseHeaderSectionSize` and the operator's log says why.
pub fn refused_head(e: &hyper::Error, limits: &HttpLimits) -> Option<(Error, String)> {
    use ::h2::Reason;
    let h2 = h2_error(e)?;
    if !h2.is_library() {
        return None;
    }
    let reason = h2.reason()?;
    let ours = (h2.is_reset() && reason == Reason::PROTOCOL_ERROR)
        || (h2.is_go_away()
            && (reason == Reason::ENHANCE_YOUR_CALM || reason == Reason::COMPRESSION_ERROR));
    ours.then(|| {
        (
            Error::HttpResponseHeaderSectionSize(None),
            format!(
                "the response header block is over {} bytes, or malformed (h2: {reason:?})",
                max_header_list_size(limits)
            ),
        )
    })
}

#[cfg(test)]
pub(super) mod tests {
    //! Test backends on 127.0.0.1 over TLS with a throwaway CA: a well-behaved one that
    //! offers `h2` (or only `http/1.1`), and a hostile one writing raw HTTP/2 frames.

    use super::*;
    use bytes::Bytes;
    use http_body_util::Full;
    use hyper_util::rt::TokioIo as HyperIo;
    use std::sync::atomic::AtomicU32;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    /// A TLS backend answering `ok`; `/slow` after 300 ms, `/headers/N` with an `x-big`
    /// header of N bytes, `/big/N` with N bytes of body.
    pub(crate) struct TlsServer {
        pub addr: SocketAddr,
        pub accepted: Arc<AtomicU32>,
        pub requests: Arc<AtomicU32>,
        /// The most requests it was answering at once.
        pub max_active: Arc<AtomicU32>,
        pub ca_file: std::path::PathBuf,
        _dir: tempfile::TempDir,
        task: tokio::task::JoinHandle<()>,
    }

    impl Drop for TlsServer {
        fn drop(&mut self) {
            self.task.abort();
        }
    }

    /// A throwaway CA (its PEM written to a file) and a server config for 127.0.0.1.
    fn test_ca(
        alpn: &[&[u8]],
    ) -> (
        tempfile::TempDir,
        std::path::PathBuf,
        Arc<rustls::ServerConfig>,
    ) {
        use rcgen::{BasicConstraints, CertificateParams, CertifiedIssuer, IsCa, KeyPair};
        let mut ca_params = CertificateParams::new(Vec::<String>::new()).unwrap();
        ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        let ca = CertifiedIssuer::self_signed(ca_params, KeyPair::generate().unwrap()).unwrap();
        let key = KeyPair::generate().unwrap();
        let params = CertificateParams::new(vec!["127.0.0.1".into()]).unwrap();
        let cert = params.signed_by(&key, &ca).unwrap();
        let key = rustls::pki_types::PrivateKeyDer::Pkcs8(key.serialize_der().into());
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let mut server = rustls::ServerConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_no_client_auth()
            .with_single_cert(vec![cert.der().clone()], key)
            .unwrap();
        server.alpn_protocols = alpn.iter().map(|p| p.to_vec()).collect();
        let dir = tempfile::tempdir().unwrap();
        let ca_file = dir.path().join("ca.pem");
        std::fs::write(&ca_file, ca.pem()).unwrap();
        (dir, ca_file, Arc::new(server))
    }

    /// A backend offering `h2` and `http/1.1` (`h2`), or `http/1.1` only.
    pub(crate) async fn tls_server(h2: bool) -> TlsServer {
        let alpn: &[&[u8]] = if h2 { &ALPN } else { &ALPN[1..] };
        let (dir, ca_file, config) = test_ca(alpn);
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let accepted = Arc::new(AtomicU32::new(0));
        let requests = Arc::new(AtomicU32::new(0));
        let max_active = Arc::new(AtomicU32::new(0));
        let active = Arc::new(AtomicU32::new(0));
        let (a, r, m) = (accepted.clone(), requests.clone(), max_active.clone());
        let acceptor = tokio_rustls::TlsAcceptor::from(config);
        let task = tokio::spawn(async move {
            while let Ok((s, _)) = listener.accept().await {
                a.fetch_add(1, Ordering::SeqCst);
                let (r, m, active, acceptor) =
                    (r.clone(), m.clone(), active.clone(), acceptor.clone());
                tokio::spawn(async move {
                    let Ok(tls) = acceptor.accept(s).await else {
                        return;
                    };
                    let h2 = tls.get_ref().1.alpn_protocol() == Some(ALPN[0]);
                    let service = hyper::service::service_fn(move |req| {
                        answer(req, r.clone(), m.clone(), active.clone())
                    });
                    let io = HyperIo::new(tls);
                    if h2 {
                        let _ = hyper::server::conn::http2::Builder::new(TokioExecutor::new())
                            .serve_connection(io, service)
                            .await;
                    } else {
                        let _ = hyper::server::conn::http1::Builder::new()
                            .serve_connection(io, service)
                            .await;
                    }
                });
            }
        });
        TlsServer {
            addr,
            accepted,
            requests,
            max_active,
            ca_file,
            _dir: dir,
            task,
        }
    }

    async fn answer(
        req: http::Request<hyper::body::Incoming>,
        requests: Arc<AtomicU32>,
        max_active: Arc<AtomicU32>,
        active: Arc<AtomicU32>,
    ) -> Result<http::Response<Full<Bytes>>, std::convert::Infallible> {
        requests.fetch_add(1, Ordering::SeqCst);
        let now = active.fetch_add(1, Ordering::SeqCst) + 1;
        max_active.fetch_max(now, Ordering::SeqCst);
        let path = req.uri().path().to_string();
        if path == "/slow" {
            tokio::time::sleep(std::time::Duration::from_millis(300)).await;
        }
        let number = |prefix: &str| {
            path.strip_prefix(prefix)
                .and_then(|n| n.parse::<usize>().ok())
        };
        let mut resp = http::Response::builder().status(200);
        if let Some(n) = number("/headers/") {
            resp = resp.header("x-big", "a".repeat(n));
        }
        let body = match number("/big/") {
            Some(n) => vec![b'b'; n],
            None => b"ok".to_vec(),
        };
        active.fetch_sub(1, Ordering::SeqCst);
        Ok(resp.body(Full::new(Bytes::from(body))).unwrap())
    }

    /// What a hostile HTTP/2 backend answers its first request with.
    #[derive(Clone, Copy)]
    pub(crate) enum Hostile {
        /// One header field put in HPACK's dynamic table, then referenced 10,000 times
        /// (about 14 KB on the wire, 40 MB decoded).
        HpackBomb,
        /// A HEADERS frame, then CONTINUATION frames of 16 KB of header fields, without
        /// end.
        EndlessContinuation,
    }

    /// A raw HTTP/2 backend (TLS, ALPN `h2`): acknowledges the client's SETTINGS, waits for
    /// its first request, answers with `kind`. `written` counts the bytes of that answer
    /// it got out; `ended` is set when it can write no more (the client closed).
    pub(crate) struct HostileServer {
        pub addr: SocketAddr,
        pub ca_file: std::path::PathBuf,
        pub written: Arc<std::sync::atomic::AtomicU64>,
        pub ended: Arc<std::sync::atomic::AtomicBool>,
        _dir: tempfile::TempDir,
        task: tokio::task::JoinHandle<()>,
    }

    impl Drop for HostileServer {
        fn drop(&mut self) {
            self.task.abort();
        }
    }

    fn frame(kind: u8, flags: u8, stream: u32, payload: &[u8]) -> Vec<u8> {
        let len = payload.len() as u32;
        let mut f = vec![(len >> 16) as u8, (len >> 8) as u8, len as u8, kind, flags];
        f.extend_from_slice(&stream.to_be_bytes());
        f.extend_from_slice(payload);
        f
    }

    /// An HPACK integer with a `prefix`-bit prefix, its first byte or-ed with `first`.
    fn hpack_int(first: u8, prefix: u32, n: usize, out: &mut Vec<u8>) {
        let max = (1usize << prefix) - 1;
        if n < max {
            out.push(first | n as u8);
            return;
        }
        out.push(first | max as u8);
        let mut n = n - max;
        while n >= 128 {
            out.push((n % 128) as u8 | 0x80);
            n /= 128;
        }
        out.push(n as u8);
    }

    /// A literal header field, `first` its representation (0x00: not indexed, 0x40:
    /// indexed), new name.
    fn literal(first: u8, name: &[u8], value: &[u8], out: &mut Vec<u8>) {
        out.push(first);
        hpack_int(0, 7, name.len(), out);
        out.extend_from_slice(name);
        hpack_int(0, 7, value.len(), out);
        out.extend_from_slice(value);
    }

    pub(crate) async fn hostile_server(kind: Hostile) -> HostileServer {
        let (dir, ca_file, config) = test_ca(&ALPN[..1]);
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let written = Arc::new(std::sync::atomic::AtomicU64::new(0));
        let ended = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let (w, e) = (written.clone(), ended.clone());
        let acceptor = tokio_rustls::TlsAcceptor::from(config);
        let task = tokio::spawn(async move {
            let Ok((s, _)) = listener.accept().await else {
                return;
            };
            let Ok(tls) = acceptor.accept(s).await else {
                return;
            };
            let (mut rd, mut wr) = tokio::io::split(tls);
            // The preface, then frames until the first HEADERS (the request).
            let mut preface = [0u8; 24];
            rd.read_exact(&mut preface).await.unwrap();
            let mut settings_acked = false;
            loop {
                let mut head = [0u8; 9];
                rd.read_exact(&mut head).await.unwrap();
                let len = (usize::from(head[0]) << 16)
                    | (usize::from(head[1]) << 8)
                    | usize::from(head[2]);
                let mut payload = vec![0u8; len];
                rd.read_exact(&mut payload).await.unwrap();
                if head[3] == 4 && head[4] & 1 == 0 && !settings_acked {
                    // Ours (none), and the ACK of the client's: its limits now apply.
                    wr.write_all(&frame(4, 0, 0, &[])).await.unwrap();
                    wr.write_all(&frame(4, 1, 0, &[])).await.unwrap();
                    settings_acked = true;
                }
                if head[3] == 1 {
                    break;
                }
            }
            // Keep reading (the client's ACK, window updates) so it never blocks.
            tokio::spawn(async move {
                let mut sink = [0u8; 4096];
                while matches!(rd.read(&mut sink).await, Ok(n) if n > 0) {}
            });
            match kind {
                Hostile::HpackBomb => {
                    let mut block = vec![0x88]; // :status 200
                    literal(0x40, b"x", &[b'a'; 4000], &mut block);
                    block.extend(std::iter::repeat_n(0x80 | 62, 10_000));
                    let f = frame(1, 0x4, 1, &block); // END_HEADERS
                    if wr.write_all(&f).await.is_ok() {
                        w.fetch_add(f.len() as u64, Ordering::SeqCst);
                    }
                    // Then hold the connection open until the client closes it.
                    while wr.write_all(&frame(6, 0, 0, &[0; 8])).await.is_ok() {
                        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                    }
                    e.store(true, Ordering::SeqCst);
                }
                Hostile::EndlessContinuation => {
                    let mut first = vec![0x88];
                    literal(0x00, b"x-first", b"1", &mut first);
                    let mut f = frame(1, 0, 1, &first); // no END_HEADERS
                    loop {
                        if wr.write_all(&f).await.is_err() || wr.flush().await.is_err() {
                            break;
                        }
                        w.fetch_add(f.len() as u64, Ordering::SeqCst);
                        let mut block = Vec::new();
                        literal(0x00, b"x-more", &[b'c'; 16_000], &mut block);
                        f = frame(9, 0, 1, &block); // CONTINUATION
                    }
                    e.store(true, Ordering::SeqCst);
                }
            }
        });
        HostileServer {
            addr,
            ca_file,
            written,
            ended,
            _dir: dir,
            task,
        }
    }

    /// An HTTP/2 connection to `s` made for `key`, as `open` makes it.
    pub(crate) async fn h2_conn(
        s: &TlsServer,
        key: Key,
        pool: &super::super::pool::Pool,
    ) -> H2Conn {
        let base = super::super::http::tls_config(Some(&s.ca_file), false).unwrap();
        let connector = tokio_rustls::TlsConnector::from(pool.alpn_tls(&base));
        let tcp = tokio::net::TcpStream::connect(s.addr).await.unwrap();
        let name = rustls::pki_types::ServerName::IpAddress(s.addr.ip().into());
        let tls = connector.connect(name, tcp).await.unwrap();
        assert!(chosen(&tls), "the server chose h2");
        handshake(tls, &HttpLimits::default(), key, s.addr)
            .await
            .unwrap()
    }

    fn key(port: u16) -> Key {
        Key {
            https: true,
            host: "127.0.0.1".into(),
            port,
        }
    }

    /// An HTTP/2 connection in the pool is lent only for its own key and to a request
    /// whose vetted addresses include the one it was dialled to; lending it keeps it in
    /// the pool, its stream counted.
    #[tokio::test]
    async fn a_shared_connection_serves_only_its_key_and_a_still_vetted_address() {
        use super::super::pool::{Found, Pool};
        let s = tls_server(true).await;
        let pool = Pool::new(4, std::time::Duration::from_secs(30));
        drop(pool.add_shared(h2_conn(&s, key(s.addr.port()), &pool).await));
        assert_eq!(pool.streams(), vec![0]);
        let other: SocketAddr = "127.0.0.2:1".parse().unwrap();
        let port = s.addr.port();
        assert!(pool.take(&key(port), &[other]).is_none(), "DNS moved");
        let mut k = key(port);
        k.https = false;
        assert!(pool.take(&k, &[s.addr]).is_none(), "another scheme");
        let mut k = key(port);
        k.host = "localhost".into();
        assert!(pool.take(&k, &[s.addr]).is_none(), "another host name");
        let a = pool.take(&key(port), &[other, s.addr]);
        let b = pool.take(&key(port), &[s.addr]);
        assert!(matches!(
            (&a, &b),
            (Some(Found::Http2(_)), Some(Found::Http2(_)))
        ));
        assert_eq!(pool.streams(), vec![2], "lent twice at once, held once");
        assert_eq!(pool.idle(), 1);
        assert_eq!(s.accepted.load(Ordering::SeqCst), 1);
    }

    /// The reaper closes an HTTP/2 connection after the idle timeout only once no request
    /// is in flight on it.
    #[tokio::test]
    async fn a_shared_connection_is_reaped_only_when_unused() {
        use super::super::pool::Pool;
        let s = tls_server(true).await;
        let pool = Pool::new(4, std::time::Duration::from_millis(200));
        let conn = h2_conn(&s, key(s.addr.port()), &pool).await;
        let probe = conn.sender.clone();
        let lease = pool.add_shared(conn);
        tokio::time::sleep(std::time::Duration::from_millis(500)).await;
        assert_eq!(pool.streams(), vec![1], "in flight: kept");
        drop(lease);
        tokio::time::sleep(std::time::Duration::from_millis(500)).await;
        assert_eq!(pool.idle(), 0, "unused past the timeout: reaped");
        assert!(probe.is_closed(), "and its socket closed");
    }
}
