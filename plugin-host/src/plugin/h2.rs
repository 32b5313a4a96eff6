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
//!   GOAWAY `COMPRESSION_ERROR`);
//! * header blocks before the server has acknowledged our SETTINGS: h2 applies our list
//!   size only from that ACK on, and until then its own default (16 MiB, per stream).
//!   So no header block is let through before it: `AckGuard` reads the server's bytes
//!   as frame headers ([`FrameScan`]) on their way to h2, and a HEADERS, PUSH_PROMISE or
//!   CONTINUATION frame before the ACK fails the read, which closes the connection
//!   before h2 decodes a byte of the block. [`handshake`] returns the connection only
//!   once the ACK was read, so no request is sent before it (any header block before it
//!   is unsolicited: refusing it breaks no honest server). A server that does not ACK
//!   within the request's connect timeout gets no request, and its connection is closed;
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
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::task::{Context, Poll, ready};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::sync::watch;
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

/// Frame types (RFC 9113, section 6) the scan tells apart.
const HEADERS: u8 = 0x1;
const SETTINGS: u8 = 0x4;
const PUSH_PROMISE: u8 = 0x5;
const CONTINUATION: u8 = 0x9;
/// SETTINGS' ACK flag.
const ACK: u8 = 0x1;
/// A frame header: 24-bit length, type, flags, 31-bit stream id.
const FRAME_HEADER: usize = 9;

/// A frame carrying a header block, read before the server acknowledged our SETTINGS.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EarlyHeaderBlock {
    /// Its frame type: HEADERS, PUSH_PROMISE or CONTINUATION.
    pub kind: u8,
    pub stream: u32,
}

impl std::fmt::Display for EarlyHeaderBlock {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let name = match self.kind {
            HEADERS => "HEADERS",
            PUSH_PROMISE => "PUSH_PROMISE",
            _ => "CONTINUATION",
        };
        write!(
            f,
            "the server sent a {name} frame (stream {}) before acknowledging our SETTINGS, \
             so before our header size limit applies; refused unread, connection closed",
            self.stream
        )
    }
}

impl std::error::Error for EarlyHeaderBlock {}

/// Where [`FrameScan`] is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Scan {
    /// Reading frames, waiting for the server's ACK of our SETTINGS.
    Waiting,
    /// The ACK was read: nothing more is looked at.
    Acked,
    /// A header block came first: every later read fails too.
    Refused(EarlyHeaderBlock),
}

/// The server's byte stream read as HTTP/2 frames until the server acknowledges our
/// SETTINGS: frame headers are collected (across reads), payloads skipped by count, never
/// copied. A SETTINGS frame with the ACK flag, empty and on stream 0 (the only ACK h2
/// applies our settings on), is the ACK; a header block before it is refused.
#[derive(Debug)]
pub struct FrameScan {
    head: [u8; FRAME_HEADER],
    /// Bytes of `head` read so far.
    have: usize,
    /// Payload bytes of the current frame still to skip.
    skip: usize,
    state: Scan,
}

impl Default for FrameScan {
    fn default() -> Self {
        FrameScan {
            head: [0; FRAME_HEADER],
            have: 0,
            skip: 0,
            state: Scan::Waiting,
        }
    }
}

impl FrameScan {
    /// Reads the next bytes the server sent. `Err`: a header block came before the ACK
    /// (and every call after that fails the same way).
    pub fn feed(&mut self, mut bytes: &[u8]) -> Result<(), EarlyHeaderBlock> {
        loop {
            match self.state {
                Scan::Waiting => {}
                Scan::Acked => return Ok(()),
                Scan::Refused(early) => return Err(early),
            }
            let skipped = bytes.len().min(self.skip);
            self.skip -= skipped;
            bytes = &bytes[skipped..];
            if bytes.is_empty() {
                return Ok(());
            }
            let n = (FRAME_HEADER - self.have).min(bytes.len());
            self.head[self.have..self.have + n].copy_from_slice(&bytes[..n]);
            self.have += n;
            bytes = &bytes[n..];
            if self.have < FRAME_HEADER {
                return Ok(());
            }
            self.have = 0;
            let h = self.head;
            let len = usize::from(h[0]) << 16 | usize::from(h[1]) << 8 | usize::from(h[2]);
            let (kind, flags) = (h[3], h[4]);
            let stream = u32::from_be_bytes([h[5], h[6], h[7], h[8]]) & 0x7fff_ffff;
            match kind {
                SETTINGS if flags & ACK != 0 && len == 0 && stream == 0 => {
                    self.state = Scan::Acked;
                }
                HEADERS | PUSH_PROMISE | CONTINUATION => {
                    self.state = Scan::Refused(EarlyHeaderBlock { kind, stream });
                }
                _ => self.skip = len,
            }
        }
    }

    /// Whether the server's ACK of our SETTINGS was read.
    pub fn acked(&self) -> bool {
        self.state == Scan::Acked
    }
}

/// What [`AckGuard`] has seen, for [`handshake`] to wait on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Ack {
    Waiting,
    Seen,
    Refused(EarlyHeaderBlock),
}

/// An HTTP/2 connection's IO, its reads passed through [`FrameScan`] until the server's
/// ACK of our SETTINGS (then passed on untouched). A header block before it fails the
/// read, its bytes not handed on: h2 never decodes it, and hyper closes the connection.
/// Writes pass through.
struct AckGuard<IO> {
    io: IO,
    scan: FrameScan,
    ack: watch::Sender<Ack>,
}

impl<IO: AsyncRead + Unpin> AsyncRead for AckGuard<IO> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let this = self.get_mut();
        if this.scan.acked() {
            return Pin::new(&mut this.io).poll_read(cx, buf);
        }
        let before = buf.filled().len();
        ready!(Pin::new(&mut this.io).poll_read(cx, buf))?;
        match this.scan.feed(&buf.filled()[before..]) {
            Ok(()) => {
                if this.scan.acked() {
                    this.ack.send_replace(Ack::Seen);
                }
                Poll::Ready(Ok(()))
            }
            Err(early) => {
                buf.set_filled(before);
                this.ack.send_replace(Ack::Refused(early));
                Poll::Ready(Err(std::io::Error::new(
                    std::io::ErrorKind::InvalidData,
                    early,
                )))
            }
        }
    }
}

impl<IO: AsyncWrite + Unpin> AsyncWrite for AckGuard<IO> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.get_mut().io).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.get_mut().io).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_shutdown(cx)
    }
}

/// Why [`handshake`] made no connection.
#[derive(Debug)]
pub enum Failed {
    /// Hyper's handshake failed.
    Handshake(hyper::Error),
    /// Hyper's handshake did not end before the deadline.
    HandshakeTimeout,
    /// The server did not acknowledge our SETTINGS before the deadline.
    NoAck,
    /// The server sent a header block before acknowledging our SETTINGS.
    Refused(EarlyHeaderBlock),
    /// The connection ended before the server acknowledged our SETTINGS.
    Closed,
}

impl std::fmt::Display for Failed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Failed::Handshake(e) => write!(f, "the HTTP/2 handshake failed: {e}"),
            Failed::HandshakeTimeout => {
                write!(
                    f,
                    "the HTTP/2 handshake did not end within the connect timeout"
                )
            }
            Failed::NoAck => write!(
                f,
                "the server did not acknowledge our HTTP/2 SETTINGS within the connect \
                 timeout; no request is sent before it does, the connection is closed"
            ),
            Failed::Refused(early) => early.fmt(f),
            Failed::Closed => write!(
                f,
                "the HTTP/2 connection ended before the server acknowledged our SETTINGS"
            ),
        }
    }
}

impl Failed {
    /// The error the plugin sees (a connect failure), and why, for the operator's log
    /// (none for hyper's own error, which the error carries).
    pub fn into_error(self) -> (Error, Option<String>) {
        let why = match &self {
            Failed::Handshake(_) => None,
            other => Some(other.to_string()),
        };
        let error = match self {
            Failed::Handshake(e) => Error::from(e),
            Failed::HandshakeTimeout | Failed::NoAck => Error::ConnectionTimeout,
            Failed::Refused(_) => Error::HttpProtocolError,
            Failed::Closed => Error::ConnectionTerminated,
        };
        (error, why)
    }
}

/// The HTTP/2 handshake on `io` (TLS, ALPN `h2`), with the bounds above, the connection's
/// task spawned; returns once the server has acknowledged our SETTINGS (so that our
/// header list size applies), before `deadline`. The connection is dropped (its socket
/// closed) on any failure.
pub async fn handshake<IO>(
    io: IO,
    limits: &HttpLimits,
    key: Key,
    addr: SocketAddr,
    deadline: tokio::time::Instant,
) -> Result<H2Conn, Failed>
where
    IO: AsyncRead + AsyncWrite + Send + Unpin + 'static,
{
    let (ack, mut acked) = watch::channel(Ack::Waiting);
    let io = AckGuard {
        io,
        scan: FrameScan::default(),
        ack,
    };
    let handshake = hyper::client::conn::http2::Builder::new(TokioExecutor::new())
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
        .handshake::<_, WasiBody>(TokioIo::new(io));
    let (sender, conn) = tokio::time::timeout_at(deadline, handshake)
        .await
        .map_err(|_| Failed::HandshakeTimeout)?
        .map_err(Failed::Handshake)?;
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
    let conn = H2Conn {
        sender,
        _task: AbortOnDrop(tokio::spawn(task)),
        key,
        addr,
        server_streams,
    };
    // h2 reads the server's frames from now on (its own task, spawned by hyper).
    let ack = tokio::time::timeout_at(deadline, acked.wait_for(|a| *a != Ack::Waiting))
        .await
        .map_err(|_| Failed::NoAck)?
        .map(|a| *a);
    match ack {
        Ok(Ack::Seen) => Ok(conn),
        Ok(Ack::Refused(early)) => Err(Failed::Refused(early)),
        Ok(Ack::Waiting) | Err(_) => Err(Failed::Closed),
    }
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
        /// Sends its SETTINGS and never acknowledges the client's (nor answers).
        NoAck,
        /// Sends its SETTINGS, then at once (no request came) the HPACK bomb on stream 1;
        /// never acknowledges the client's SETTINGS.
        BombNoAck,
        /// Sends its SETTINGS, the HPACK bomb on stream 1, then the ACK of the client's
        /// SETTINGS: h2 alone would decode the bomb under its default 16 MiB.
        BombThenAck,
    }

    impl Hostile {
        /// Whether it writes before any request (and so waits for none).
        fn early(self) -> bool {
            matches!(
                self,
                Hostile::NoAck | Hostile::BombNoAck | Hostile::BombThenAck
            )
        }
    }

    /// A raw HTTP/2 backend (TLS, ALPN `h2`) on one connection: acknowledges the client's
    /// SETTINGS, waits for its first request, answers with `kind`. `written` counts the
    /// bytes of that answer it got out; `ended` is set when it can write no more (the
    /// client closed). The `early` kinds write before any request instead, then read
    /// until the client closes (`ended`), counting the requests (HEADERS) it got.
    pub(crate) struct HostileServer {
        pub addr: SocketAddr,
        pub ca_file: std::path::PathBuf,
        pub written: Arc<std::sync::atomic::AtomicU64>,
        pub ended: Arc<std::sync::atomic::AtomicBool>,
        pub requests: Arc<AtomicU32>,
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

    /// One header field put in HPACK's dynamic table, then referenced 10,000 times: a
    /// HEADERS frame (END_HEADERS) on stream 1 of about 14 KB, 40 MB decoded.
    fn hpack_bomb() -> Vec<u8> {
        let mut block = vec![0x88]; // :status 200
        literal(0x40, b"x", &[b'a'; 4000], &mut block);
        block.extend(std::iter::repeat_n(0x80 | 62, 10_000));
        frame(1, 0x4, 1, &block)
    }

    /// Reads the client's frames until it closes, counting its HEADERS in `requests`.
    async fn read_to_end<R: tokio::io::AsyncRead + Unpin>(mut rd: R, requests: Arc<AtomicU32>) {
        loop {
            let mut head = [0u8; 9];
            if rd.read_exact(&mut head).await.is_err() {
                return;
            }
            let len =
                (usize::from(head[0]) << 16) | (usize::from(head[1]) << 8) | usize::from(head[2]);
            if head[3] == 1 {
                requests.fetch_add(1, Ordering::SeqCst);
            }
            let mut payload = vec![0u8; len];
            if rd.read_exact(&mut payload).await.is_err() {
                return;
            }
        }
    }

    pub(crate) async fn hostile_server(kind: Hostile) -> HostileServer {
        let (dir, ca_file, config) = test_ca(&ALPN[..1]);
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let written = Arc::new(std::sync::atomic::AtomicU64::new(0));
        let ended = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let requests = Arc::new(AtomicU32::new(0));
        let (w, e, r) = (written.clone(), ended.clone(), requests.clone());
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
            if kind.early() {
                let mut out = frame(4, 0, 0, &[]); // its SETTINGS (none)
                if matches!(kind, Hostile::BombNoAck | Hostile::BombThenAck) {
                    out.extend(hpack_bomb());
                }
                if matches!(kind, Hostile::BombThenAck) {
                    out.extend(frame(4, 1, 0, &[]));
                }
                if wr.write_all(&out).await.is_ok() && wr.flush().await.is_ok() {
                    w.fetch_add(out.len() as u64, Ordering::SeqCst);
                }
                read_to_end(rd, r).await;
                e.store(true, Ordering::SeqCst);
                return;
            }
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
                    let f = hpack_bomb();
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
                Hostile::NoAck | Hostile::BombNoAck | Hostile::BombThenAck => {
                    unreachable!("answered above")
                }
            }
        });
        HostileServer {
            addr,
            ca_file,
            written,
            ended,
            requests,
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
        let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(5);
        handshake(tls, &HttpLimits::default(), key, s.addr, deadline)
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

    /// What [`FrameScan`] makes of `pieces`, fed in turn: whether the ACK was read, or
    /// the header block it refused.
    fn scan(pieces: &[&[u8]]) -> Result<bool, EarlyHeaderBlock> {
        let mut scan = FrameScan::default();
        for piece in pieces {
            scan.feed(piece)?;
        }
        Ok(scan.acked())
    }

    /// The frame-header scan, table-driven: each stream is fed whole, one byte at a time,
    /// and split in two at every byte boundary, always with the same outcome.
    #[test]
    fn the_frame_scan_finds_the_settings_ack_and_early_header_blocks() {
        let settings = frame(4, 0, 0, &[0, 3, 0, 0, 0, 100]);
        let ack = frame(4, 1, 0, &[]);
        let headers = frame(1, 0x4, 1, &[0x88]);
        let push = frame(5, 0x4, 1, &[0, 0, 0, 2, 0x82]);
        let continuation = frame(9, 0x4, 1, &[0x88]);
        // A DATA frame whose 16 KiB payload looks like frame headers: skipped unread.
        let data = frame(
            0,
            0,
            1,
            &headers.repeat(16 * 1024 / headers.len() + 1)[..16 * 1024],
        );
        let window = frame(8, 0, 0, &[0, 0, 0x10, 0]);
        let empty = frame(6, 0, 0, &[]); // zero-length (a PING h2 would refuse; not ours)
        let bogus_ack = frame(4, 1, 0, &[0, 3, 0, 0, 0, 1]); // not empty: not an ACK
        type Case<'a> = (&'a str, Vec<&'a [u8]>, Result<bool, EarlyHeaderBlock>);
        let early = |kind, stream| Err(EarlyHeaderBlock { kind, stream });
        let cases: Vec<Case> = vec![
            ("settings, then the ACK", vec![&settings, &ack], Ok(true)),
            ("the ACK alone", vec![&ack], Ok(true)),
            ("no ACK yet", vec![&settings, &window], Ok(false)),
            (
                "HEADERS before the ACK",
                vec![&settings, &headers, &ack],
                early(1, 1),
            ),
            (
                "PUSH_PROMISE before the ACK",
                vec![&settings, &push],
                early(5, 1),
            ),
            (
                "CONTINUATION before the ACK",
                vec![&continuation],
                early(9, 1),
            ),
            (
                "HEADERS after the ACK",
                vec![&settings, &ack, &headers],
                Ok(true),
            ),
            (
                "a 16 KiB DATA payload skipped",
                vec![&settings, &data, &ack],
                Ok(true),
            ),
            (
                "a zero-length frame",
                vec![&settings, &empty, &ack, &headers],
                Ok(true),
            ),
            ("a zero-length frame, no ACK", vec![&empty], Ok(false)),
            (
                "an ACK with a payload",
                vec![&bogus_ack, &headers],
                early(1, 1),
            ),
        ];
        for (name, frames, want) in cases {
            let bytes = frames.concat();
            assert_eq!(scan(&[&bytes]), want, "{name}: whole");
            let bytes_one: Vec<&[u8]> = bytes.chunks(1).collect();
            assert_eq!(scan(&bytes_one), want, "{name}: a byte at a time");
            for at in 0..=bytes.len() {
                let (a, b) = bytes.split_at(at);
                assert_eq!(scan(&[a, b]), want, "{name}: split at {at}");
            }
        }
        // The ACK split across reads is seen once its last byte is read, not before.
        let mut s = FrameScan::default();
        s.feed(&ack[..8]).unwrap();
        assert!(!s.acked());
        s.feed(&ack[8..]).unwrap();
        assert!(s.acked());
        // A refusal sticks: later reads fail the same way.
        let mut s = FrameScan::default();
        assert_eq!(s.feed(&headers), early(1, 1).map(|_| ()));
        assert_eq!(s.feed(&ack), early(1, 1).map(|_| ()));
        assert!(!s.acked());
    }

    /// An HTTP/2 connection to `s`, as `open` makes it, with `deadline` for the server's
    /// ACK.
    async fn h2_conn_to(
        s: &HostileServer,
        deadline: std::time::Duration,
    ) -> Result<H2Conn, Failed> {
        let pool = super::super::pool::Pool::new(4, std::time::Duration::from_secs(30));
        let base = super::super::http::tls_config(Some(&s.ca_file), false).unwrap();
        let connector = tokio_rustls::TlsConnector::from(pool.alpn_tls(&base));
        let tcp = tokio::net::TcpStream::connect(s.addr).await.unwrap();
        let name = rustls::pki_types::ServerName::IpAddress(s.addr.ip().into());
        let tls = connector.connect(name, tcp).await.unwrap();
        assert!(chosen(&tls), "the server chose h2");
        let deadline = tokio::time::Instant::now() + deadline;
        handshake(
            tls,
            &HttpLimits::default(),
            key(s.addr.port()),
            s.addr,
            deadline,
        )
        .await
    }

    /// Waits up to 5 s for the hostile server to see its connection closed.
    async fn closed_by_the_host(s: &HostileServer) -> bool {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
        while !s.ended.load(Ordering::SeqCst) && std::time::Instant::now() < deadline {
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        }
        s.ended.load(Ordering::SeqCst)
    }

    /// A server that never acknowledges our SETTINGS (so our header list size never
    /// applies) is sent no request: the request fails as a connect failure once its
    /// connect timeout is past, and the connection is closed. One that sends an HPACK bomb
    /// meanwhile has it refused unread at once (the refusal is the guard's, not h2's
    /// reset of an over-size block).
    #[tokio::test]
    async fn a_server_that_never_acks_our_settings_is_sent_no_request() {
        use super::super::http::tests::{call, get, tls_policy};
        use std::time::{Duration, Instant};
        let timeout = Duration::from_millis(300);
        let limits = HttpLimits {
            connect_timeout: timeout,
            first_byte_timeout: Duration::from_secs(3),
            ..HttpLimits::default()
        };

        let s = hostile_server(Hostile::NoAck).await;
        match h2_conn_to(&s, timeout).await {
            Err(e @ Failed::NoAck) => {
                assert!(
                    e.to_string()
                        .contains("did not acknowledge our HTTP/2 SETTINGS"),
                    "{e}"
                );
                assert!(matches!(e.into_error().0, Error::ConnectionTimeout));
            }
            other => panic!("want no ACK, got {:?}", other.map(|_| ())),
        }
        assert!(closed_by_the_host(&s).await, "the connection was closed");
        assert_eq!(s.requests.load(Ordering::SeqCst), 0);

        let s = hostile_server(Hostile::NoAck).await;
        let p = tls_policy("a", &s.addr, &s.ca_file, limits.clone());
        let start = Instant::now();
        match get(
            &p,
            &format!("https://127.0.0.1:{}/", s.addr.port()),
            &call(),
        )
        .await
        {
            Err(Error::ConnectionTimeout) => {}
            other => panic!("want a connect timeout, got {other:?}"),
        }
        let took = start.elapsed();
        assert!(
            took >= timeout && took < timeout + Duration::from_secs(2),
            "{took:?}"
        );
        assert!(closed_by_the_host(&s).await, "the connection was closed");
        assert_eq!(s.requests.load(Ordering::SeqCst), 0, "no request was sent");
        assert_eq!(p.pool.idle(), 0, "nor was it pooled");

        let s = hostile_server(Hostile::BombNoAck).await;
        let p = tls_policy("a", &s.addr, &s.ca_file, limits);
        let start = Instant::now();
        match get(
            &p,
            &format!("https://127.0.0.1:{}/", s.addr.port()),
            &call(),
        )
        .await
        {
            Err(Error::HttpProtocolError) => {}
            other => panic!("want the bomb refused by the guard, got {other:?}"),
        }
        assert!(
            start.elapsed() < timeout,
            "refused at once: {:?}",
            start.elapsed()
        );
        assert!(closed_by_the_host(&s).await, "the connection was closed");
        assert_eq!(s.requests.load(Ordering::SeqCst), 0, "no request was sent");
        assert_eq!(p.pool.idle(), 0);
    }

    /// A server that sends a header block (an HPACK bomb, 40 MB decoded) before it
    /// acknowledges our SETTINGS, while h2 would still decode up to 16 MiB of it: the
    /// guard refuses its HEADERS frame before h2 reads a byte of it, the connection is
    /// closed, and the request fails with a protocol error (not h2's header-size reset,
    /// which would come only after decoding).
    #[tokio::test]
    async fn a_header_block_before_the_settings_ack_is_refused_unread() {
        use super::super::http::tests::{call, get, tls_policy};
        let s = hostile_server(Hostile::BombThenAck).await;
        match h2_conn_to(&s, std::time::Duration::from_secs(5)).await {
            Err(Failed::Refused(early)) => {
                assert_eq!(
                    early,
                    EarlyHeaderBlock {
                        kind: HEADERS,
                        stream: 1
                    }
                );
                assert!(
                    early
                        .to_string()
                        .contains("HEADERS frame (stream 1) before")
                );
            }
            other => panic!("want the HEADERS refused, got {:?}", other.map(|_| ())),
        }
        assert!(closed_by_the_host(&s).await, "the connection was closed");
        assert_eq!(s.requests.load(Ordering::SeqCst), 0);

        let s = hostile_server(Hostile::BombThenAck).await;
        let p = tls_policy("a", &s.addr, &s.ca_file, HttpLimits::default());
        match get(
            &p,
            &format!("https://127.0.0.1:{}/", s.addr.port()),
            &call(),
        )
        .await
        {
            Err(Error::HttpProtocolError) => {}
            other => panic!("want the bomb refused by the guard, got {other:?}"),
        }
        assert!(closed_by_the_host(&s).await, "the connection was closed");
        assert_eq!(s.requests.load(Ordering::SeqCst), 0, "no request was sent");
        assert_eq!(p.pool.idle(), 0);
    }
}
