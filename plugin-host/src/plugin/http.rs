//! Outbound HTTP for plugins: the only way out of the sandbox.
//!
//! wasmtime-wasi-http parses the guest's request; this module decides whether it may be
//! sent and sends it itself, so that every rule holds in one place:
//! the URL must match the provider's allow-list ([`crate::policy`]); every address the
//! name resolves to is checked again and the connection goes to a vetted address (never to
//! whatever a header says); connect, first-byte and between-bytes timeouts are clamped to
//! the provider's limits; response bodies are capped; TLS uses the provider's trust. Each
//! request is a child span of the provider operation that made it, with method, host,
//! status and duration, and never headers or bodies.
//!
//! What one call may hold in the host is bounded here too: at most
//! `limits.http.maxInFlight` requests at once (each a socket and hyper's buffers), and at
//! most [`OUTGOING_CHUNK_BYTES`] buffered per outgoing body.

use super::limits::{LimitHit, Tripwire};
use crate::config::HttpLimits;
use crate::policy::{AllowList, Decision, Target, address_problem};
use bytes::Bytes;
use http_body_util::BodyExt;
use hyper::body::{Body, Frame, SizeHint};
use std::future::Future;
use std::net::{IpAddr, SocketAddr};
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};
use tokio::net::TcpStream;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tracing::{Instrument, field};
use wasmtime_wasi_http::io::TokioIo;
use wasmtime_wasi_http::{Error, RequestOptions, WasiBody, WasiHttpHooks};

type SendResult = Result<
    (
        http::Response<WasiBody>,
        Box<dyn Future<Output = Result<(), Error>> + Send>,
    ),
    Error,
>;

/// Per-provider HTTP settings, shared by its calls.
pub struct HttpPolicy {
    pub provider: String,
    pub allow: AllowList,
    pub limits: HttpLimits,
    pub tls: Arc<rustls::ClientConfig>,
    /// What this provider must never show: request fields the host logs pass through it.
    pub sensitive: Arc<crate::sensitive::Sensitive>,
    /// The provider's request budget (shared by all its calls); `None`: unlimited.
    pub budget: Option<Arc<crate::rate::Budget>>,
    /// Its kept-alive connections (see [`super::pool`]): dropped with the policy, so a
    /// reload's new providers never see the old connections, and never shared by two
    /// providers.
    pub pool: Arc<super::pool::Pool>,
}

impl HttpPolicy {
    /// A request's host as the host's own logs and spans show it: the plugin chose it, so
    /// it is scrubbed, escaped and cut like any plugin output.
    fn shown_host(&self, host: &str) -> String {
        super::reply::text(host, 253, &self.sensitive.redactor())
    }
}

/// A request's method as logs and spans show it: a standard method, or `_OTHER` (as
/// OpenTelemetry's HTTP conventions say) for anything a plugin made up.
fn shown_method(m: &http::Method) -> &'static str {
    const KNOWN: [&str; 9] = [
        "GET", "HEAD", "POST", "PUT", "DELETE", "PATCH", "OPTIONS", "CONNECT", "TRACE",
    ];
    KNOWN
        .into_iter()
        .find(|k| *k == m.as_str())
        .unwrap_or("_OTHER")
}

/// Largest write into an outgoing body, and (with one chunk buffered) the most one
/// outgoing body holds in the host before the server reads it.
pub const OUTGOING_CHUNK_BYTES: usize = 64 * 1024;

/// How long a request past `limits.http.maxInFlight` waits for a slot before the call is
/// stopped. A finished request frees its slot when its connection task ends, a moment
/// after the guest drops the response; this keeps a plugin making one request after
/// another from ever tripping on that moment.
pub const IN_FLIGHT_GRACE: Duration = Duration::from_millis(500);

/// What one call's requests need of the provider's request budget.
pub struct CallBudget {
    /// The call's priority, read from the caller's task when the call started.
    pub priority: crate::rate::Priority,
    /// The call's clock: a token that would come after its last useful moment is not
    /// waited for, and time spent waiting moves its deadline back.
    pub clock: Arc<super::clock::CallClock>,
    pub metrics: Option<super::metrics::PluginMetrics>,
    /// Requests sent, for the call's stats (the inventory paces its lists by them).
    sent: std::sync::atomic::AtomicU32,
}

impl CallBudget {
    pub fn new(
        priority: crate::rate::Priority,
        clock: Arc<super::clock::CallClock>,
        metrics: Option<super::metrics::PluginMetrics>,
    ) -> Self {
        CallBudget {
            priority,
            clock,
            metrics,
            sent: Default::default(),
        }
    }

    /// Requests the call sent so far.
    pub fn sent(&self) -> u32 {
        self.sent.load(std::sync::atomic::Ordering::Relaxed)
    }
}

/// The hooks one call's Store uses.
pub struct HttpHooks {
    pub policy: Arc<HttpPolicy>,
    /// Set while `validate-config` runs: a constructor must not dial.
    pub deny_all: bool,
    /// The provider operation's span: every request is its child, whatever spans the
    /// runtime's own instrumentation opens in between.
    pub parent: tracing::Span,
    /// One permit per request in flight, `limits.http.maxInFlight` in all.
    pub in_flight: Arc<Semaphore>,
    /// The call's tripwire: a request past the cap stops the call.
    pub stop: Arc<Tripwire>,
    pub budget: Arc<CallBudget>,
}

impl HttpHooks {
    pub fn new(
        policy: Arc<HttpPolicy>,
        deny_all: bool,
        parent: tracing::Span,
        stop: Arc<Tripwire>,
        budget: CallBudget,
    ) -> Self {
        let slots = policy.limits.max_in_flight as usize;
        HttpHooks {
            policy,
            deny_all,
            parent,
            in_flight: Arc::new(Semaphore::new(slots)),
            stop,
            budget: Arc::new(budget),
        }
    }
}

/// A request's slot, held by its connection task and by its response body: released when
/// both are gone, that is when the guest has dropped the response (or its pending future)
/// and the socket is closed.
type Slot = Arc<OwnedSemaphorePermit>;

impl WasiHttpHooks for HttpHooks {
    fn p2_outgoing_body_chunk_size(&mut self) -> usize {
        OUTGOING_CHUNK_BYTES
    }

    fn p2_outgoing_body_buffer_chunks(&mut self) -> usize {
        1
    }

    fn send_request(
        &mut self,
        request: http::Request<WasiBody>,
        options: Option<RequestOptions>,
        _fut: Box<dyn Future<Output = Result<(), Error>> + Send>,
    ) -> Box<dyn Future<Output = SendResult> + Send> {
        // Taken here, in the Store, so requests are counted in the order the guest made them.
        let slot = self.in_flight.clone().try_acquire_owned();
        let in_flight = self.in_flight.clone();
        let stop = self.stop.clone();
        let policy = self.policy.clone();
        let method = shown_method(request.method());
        let host = policy.shown_host(request.uri().host().unwrap_or_default());
        // wasmtime runs the request in a task of its own: the parent is set explicitly.
        let span = tracing::info_span!(
            parent: &self.parent,
            "http.request",
            otel.kind = "client",
            provider.name = policy.provider.as_str(),
            http.request.method = method,
            server.address = %host,
            server.port = field::Empty,
            http.response.status_code = field::Empty,
            error.type = field::Empty,
            duration_ms = field::Empty,
        );
        let deny_all = self.deny_all;
        let call = self.budget.clone();
        Box::new(
            async move {
                let start = Instant::now();
                let result = if deny_all {
                    tracing::warn!(target: "plugin", provider = policy.provider.as_str(), host = %host, "HTTP request refused: validate-config must not dial the backend");
                    Err(Error::HttpRequestDenied)
                } else {
                    let slot = match slot {
                        Ok(p) => Some(p),
                        Err(_) => tokio::time::timeout(IN_FLIGHT_GRACE, in_flight.acquire_owned())
                            .await
                            .ok()
                            .and_then(Result::ok),
                    };
                    match slot {
                        Some(slot) => {
                            let call = Call {
                                budget: &call,
                                stop: &stop,
                                shown_host: &host,
                            };
                            let pool = policy.pool.clone();
                            send(&policy, &pool, request, options, Arc::new(slot), call).await
                        }
                        None => {
                            stop.trip(LimitHit::Requests);
                            tracing::warn!(target: "plugin", provider = policy.provider.as_str(), limit = policy.limits.max_in_flight, "HTTP request refused: too many requests in flight (limits.http.maxInFlight); the call is stopped");
                            Err(Error::HttpRequestDenied)
                        }
                    }
                };
                let span = tracing::Span::current();
                span.record("duration_ms", start.elapsed().as_secs_f64() * 1000.0);
                match &result {
                    Ok((resp, _)) => {
                        span.record("http.response.status_code", resp.status().as_u16());
                    }
                    Err(e) => {
                        span.record("error.type", error_name(e));
                    }
                }
                result
            }
            .instrument(span),
        )
    }
}

/// Waits for a token of the provider's budget, in the call's priority order (no budget:
/// at once). `Err`: none before the call's deadline.
async fn take_token(policy: &HttpPolicy, call: &CallBudget) -> Result<(), ()> {
    call.sent.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let Some(budget) = &policy.budget else {
        return Ok(());
    };
    let waited = {
        let _waiting = call.clock.wait();
        budget
            .acquire(call.priority, call.clock.last_token_at())
            .await
    };
    let waited = waited.map_err(|_| {
        call.sent.fetch_sub(1, std::sync::atomic::Ordering::Relaxed);
    })?;
    if let Some(m) = &call.metrics {
        m.budget().granted(
            &policy.provider,
            call.priority.as_str(),
            waited,
            budget.tokens(),
        );
    }
    Ok(())
}

/// Tells the provider's budget what the backend said about its rate limit: `Retry-After`
/// on a 429 or 503, the `RateLimit-*` headers (or ARM's `x-ms-ratelimit-remaining-*`) on
/// any answer. Also counts the 429s.
fn feedback<B>(policy: &HttpPolicy, call: &CallBudget, resp: &http::Response<B>) {
    let status = resp.status().as_u16();
    if status == 429
        && let Some(m) = &call.metrics
    {
        m.budget().rate_limited(&policy.provider);
    }
    let Some(budget) = &policy.budget else {
        return;
    };
    let h = resp.headers();
    let text = |name: &str| h.get(name).and_then(|v| v.to_str().ok());
    let number = |name: &str| text(name).and_then(|v| v.trim().parse::<u64>().ok());
    let now_unix = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let fb = crate::rate::Feedback {
        status,
        retry_after: text("retry-after").and_then(|v| crate::rate::parse_retry_after(v, now_unix)),
        limit: number("ratelimit-limit"),
        remaining: crate::rate::remaining(
            h.iter()
                .filter_map(|(k, v)| Some((k.as_str(), v.to_str().ok()?))),
        ),
    };
    if fb
        == (crate::rate::Feedback {
            status,
            ..Default::default()
        })
        && status != 429
    {
        return;
    }
    budget.observe(&fb);
    if let Some(m) = &call.metrics {
        m.budget().tokens(&policy.provider, budget.tokens());
    }
}

/// A short, stable name for an error: the span attribute and the log field.
pub fn error_name(e: &Error) -> String {
    let s = format!("{e:?}");
    s.split(['(', ' ', '{'])
        .next()
        .unwrap_or_default()
        .to_string()
}

fn min_opt(configured: Duration, requested: Option<Duration>) -> Duration {
    requested.map_or(configured, |r| r.min(configured))
}

/// What [`send`] needs of the call the request belongs to.
struct Call<'a> {
    budget: &'a CallBudget,
    stop: &'a Tripwire,
    /// The request's host as logs show it (scrubbed once, in `send_request`).
    shown_host: &'a str,
}

async fn send(
    policy: &HttpPolicy,
    pool: &Arc<super::pool::Pool>,
    mut request: http::Request<WasiBody>,
    options: Option<RequestOptions>,
    slot: Slot,
    call: Call<'_>,
) -> SendResult {
    let uri = request.uri().clone();
    let scheme = uri.scheme_str().unwrap_or_default();
    let host = uri.host().unwrap_or_default();
    let Some(target) = Target::from_parts(scheme, host, uri.port_u16()) else {
        return Err(Error::HttpRequestUriInvalid);
    };
    tracing::Span::current().record("server.port", target.port);
    let shown = call.shown_host;
    let (explicit, absolute) = match policy.allow.decide(&target) {
        Decision::Denied => {
            tracing::warn!(target: "plugin", provider = policy.provider.as_str(), scheme = ?target.scheme, host = %shown, port = target.port, "HTTP request refused: not on the provider's allow-list");
            return Err(Error::HttpRequestDenied);
        }
        Decision::Allowed { explicit, absolute } => (explicit, absolute),
    };
    // The guest cannot set Host (a forbidden header), so it always equals the URL's
    // authority; refuse anything else rather than trust that.
    if let Some(h) = request.headers().get(http::header::HOST) {
        let authority = uri.authority().map(|a| a.as_str()).unwrap_or_default();
        if !h.as_bytes().eq_ignore_ascii_case(authority.as_bytes()) {
            tracing::warn!(target: "plugin", provider = policy.provider.as_str(), host = %shown, "HTTP request refused: Host header differs from the URL");
            return Err(Error::HttpRequestDenied);
        }
    }
    // Only a request that may go out costs a token of the provider's budget.
    if take_token(policy, call.budget).await.is_err() {
        call.stop.trip(LimitHit::Budget);
        tracing::warn!(target: "plugin", provider = policy.provider.as_str(), priority = call.budget.priority.as_str(), "HTTP request not sent: the provider's request budget has no token for it before the call's deadline; the call is stopped");
        return Err(Error::HttpRequestDenied);
    }

    let connect_timeout = min_opt(
        policy.limits.connect_timeout,
        options.and_then(|o| o.connect_timeout),
    );
    let first_byte_timeout = min_opt(
        policy.limits.first_byte_timeout,
        options.and_then(|o| o.first_byte_timeout),
    );
    let between_bytes_timeout = min_opt(
        policy.limits.between_bytes_timeout,
        options.and_then(|o| o.between_bytes_timeout),
    )
    .max(Duration::from_millis(1));

    let connect_deadline = tokio::time::Instant::now() + connect_timeout;
    let own = super::interfaces::own_addresses().map_err(|e| {
        tracing::warn!(target: "plugin", provider = policy.provider.as_str(), host = %shown, error = %e, "HTTP request refused: the operator's own addresses could not be listed, so the connect-time check cannot be made");
        Error::DestinationIpProhibited
    })?;
    let lookup = crate::policy::lookup_name(host, absolute);
    // Resolved and vetted for every request, pooled connection or not.
    let vetted = match vet(&lookup, target.port, &explicit, &own, connect_deadline).await {
        Ok(v) => v,
        Err(Dial::Refused(refused)) => {
            let refused: Vec<String> = refused
                .iter()
                .map(|(a, why)| format!("{}: {why}", a.ip()))
                .collect();
            tracing::warn!(target: "plugin", provider = policy.provider.as_str(), host = %shown, refused = ?refused, "HTTP request refused: the name resolves only to the operator's own or internal addresses, which the allow-list does not name");
            return Err(Error::DestinationIpProhibited);
        }
        Err(Dial::Failed(e)) => return Err(e),
    };

    // Origin-form on the wire: scheme and authority only belong in requests to a proxy.
    *request.uri_mut() = http::Uri::builder()
        .path_and_query(uri.path_and_query().map(|p| p.as_str()).unwrap_or("/"))
        .build()
        .map_err(|_| Error::HttpRequestUriInvalid)?;

    // A kept-alive connection of this provider's, for the same scheme, host and port, made
    // to an address this request's own lookup just vetted; else a new one to a vetted
    // address. An HTTP/1.1 connection is this request's alone until its response body is
    // dropped: read to the end, it goes back to the pool, otherwise (the guest dropped the
    // response, the call ended, a cap tripped) its socket is closed. An HTTP/2 connection
    // stays in the pool and carries other requests of this provider meanwhile, under the
    // same rules (see `pool.rs`).
    let key = super::pool::Key {
        https: target.scheme == crate::policy::Scheme::Https,
        host: host.to_ascii_lowercase(),
        port: target.port,
    };
    let mut pooled = None;
    while let Some(found) = pool.take(&key, &vetted) {
        let mut lease = super::pool::Lease::found(found, pool);
        if let Ok(Ok(())) = tokio::time::timeout_at(connect_deadline, lease.ready()).await {
            pool.note_reused();
            pooled = Some(lease);
            break;
        }
    }
    let (response, lease) = loop {
        let reused = pooled.is_some();
        let mut lease = match pooled.take() {
            Some(l) => l,
            None => {
                let lease =
                    open(policy, pool, key.clone(), &vetted, shown, connect_deadline).await?;
                pool.note_opened();
                lease
            }
        };
        let sent = tokio::time::timeout(first_byte_timeout, lease.send(request))
            .await
            .map_err(|_| Error::ConnectionReadTimeout)?;
        match sent {
            Ok(response) => break (response, lease),
            // The kept-alive connection was closed by the server before the request went
            // out: the same request on a new connection (it was not sent, so not repeated).
            Err(mut e) if reused && e.message().is_some() => {
                request = e.take_message().expect("checked just above");
            }
            Err(e) => {
                let e = e.into_error();
                if lease.is_h2()
                    && let Some((refused, why)) = super::h2::refused_head(&e, &policy.limits)
                {
                    tracing::warn!(target: "plugin", provider = policy.provider.as_str(), host = %shown, "HTTP/2 response refused: {why}");
                    return Err(refused);
                }
                return Err(Error::from(e));
            }
        }
    };
    feedback(policy, call.budget, &response);

    // Response headers live in the host as long as the guest holds the response, after
    // its request has left the in-flight count: they get the same cap as the guest's own.
    let header_bytes: usize = response
        .headers()
        .iter()
        .map(|(k, v)| k.as_str().len() + v.len())
        .sum();
    if header_bytes > policy.limits.max_header_bytes as usize {
        return Err(Error::HttpResponseHeaderSectionSize(
            u32::try_from(header_bytes).ok(),
        ));
    }
    let max = policy.limits.max_response_bytes;
    if let Some(len) = response.body().size_hint().exact()
        && len > max
    {
        return Err(Error::HttpResponseBodySize(Some(len)));
    }
    let response = response.map(|incoming| {
        CappedBody {
            inner: incoming,
            max,
            seen: 0,
            between_bytes: between_bytes_timeout,
            timer: Box::pin(tokio::time::sleep(between_bytes_timeout)),
            lease,
            _slot: slot,
        }
        .boxed_unsync()
    });
    // The connection's task is the pool's (or the lease's), not the response's: nothing
    // is left for wasmtime to drive.
    Ok((response, Box::new(async { Ok(()) })))
}

/// A new connection for `key` to the first of `vetted` that answers, lent to one request:
/// TCP, then for an `https` URL TLS with the provider's trust offering `h2` and
/// `http/1.1` by ALPN; the HTTP/2 handshake if the server chose `h2` (the connection joins
/// the provider's pool once the server has acknowledged our SETTINGS, see [`super::h2`]),
/// else the HTTP/1.1 handshake; its task spawned. All of it before `connect_deadline`.
async fn open(
    policy: &HttpPolicy,
    pool: &Arc<super::pool::Pool>,
    key: super::pool::Key,
    vetted: &[SocketAddr],
    shown: &str,
    connect_deadline: tokio::time::Instant,
) -> Result<super::pool::Lease, Error> {
    let stream = connect(vetted, connect_deadline).await?;
    let addr = stream.peer_addr().map_err(Error::Connect)?;
    let io: Box<dyn IoStream> = if key.https {
        let host = key.host.as_str();
        let name = match host
            .trim_start_matches('[')
            .trim_end_matches(']')
            .parse::<IpAddr>()
        {
            Ok(ip) => rustls::pki_types::ServerName::IpAddress(ip.into()),
            Err(_) => rustls::pki_types::ServerName::try_from(host.to_string())
                .map_err(Error::InvalidDnsNameError)?,
        };
        let connector = tokio_rustls::TlsConnector::from(pool.alpn_tls(&policy.tls));
        let tls = tokio::time::timeout_at(connect_deadline, connector.connect(name, stream))
            .await
            .map_err(|_| Error::ConnectionTimeout)?
            .map_err(|e| {
                // The plugin sees only an error code; the operator needs the reason, and a
                // private backend's self-signed certificate is the usual one.
                tracing::warn!(target: "plugin", provider = policy.provider.as_str(), host = %shown, error = %e, "TLS handshake with the backend failed; a backend with a private or self-signed certificate needs its CA in the provider's tls.caFile");
                Error::Tls(e)
            })?;
        if super::h2::chosen(&tls) {
            // Returned once the server acknowledged our SETTINGS (see `h2.rs`): only then
            // does the connection join the pool, and this request go out on it.
            let conn = super::h2::handshake(tls, &policy.limits, key, addr, connect_deadline)
                .await
                .map_err(|failed| {
                    let (error, why) = failed.into_error();
                    if let Some(why) = why {
                        tracing::warn!(target: "plugin", provider = policy.provider.as_str(), host = %shown, "HTTP/2 connection to the backend not used: {why}");
                    }
                    error
                })?;
            return Ok(pool.add_shared(conn));
        }
        Box::new(tls)
    } else {
        Box::new(stream)
    };
    let (sender, conn) = tokio::time::timeout_at(
        connect_deadline,
        hyper::client::conn::http1::Builder::new().handshake(TokioIo::new(io)),
    )
    .await
    .map_err(|_| Error::ConnectionTimeout)??;
    let conn = super::pool::Conn {
        sender,
        _task: super::pool::AbortOnDrop(tokio::spawn(conn)),
        key,
        addr,
    };
    Ok(super::pool::Lease::new(conn, pool))
}

trait IoStream: tokio::io::AsyncRead + tokio::io::AsyncWrite + Send + Unpin + 'static {}
impl<T: tokio::io::AsyncRead + tokio::io::AsyncWrite + Send + Unpin + 'static> IoStream for T {}

async fn resolve(
    host: &str,
    port: u16,
    deadline: tokio::time::Instant,
) -> Result<Vec<SocketAddr>, Error> {
    let bare = host.trim_start_matches('[').trim_end_matches(']');
    if let Ok(ip) = bare.parse::<IpAddr>() {
        return Ok(vec![SocketAddr::new(ip, port)]);
    }
    #[cfg(test)]
    if let Some(ips) = tests::dns::answer(bare) {
        return Ok(ips
            .into_iter()
            .map(|ip| SocketAddr::new(ip, port))
            .collect());
    }
    let found = tokio::time::timeout_at(deadline, tokio::net::lookup_host((bare, port)))
        .await
        .map_err(|_| Error::DnsTimeout)?
        .map_err(|e| Error::DnsError {
            rcode: Some(e.kind().to_string()),
            info_code: None,
        })?;
    let addrs: Vec<SocketAddr> = found.collect();
    if addrs.is_empty() {
        return Err(Error::DestinationNotFound);
    }
    Ok(addrs)
}

/// Why [`dial`] made no connection.
#[derive(Debug)]
enum Dial {
    /// Every address the name resolved to was refused, each with the reason; nothing was
    /// dialled.
    Refused(Vec<(SocketAddr, &'static str)>),
    /// Resolving or connecting failed.
    Failed(Error),
}

/// Resolves `host` and connects to the first address [`address_problem`] allows (given the
/// allow-list's literal entries and the operator's own addresses) that answers. Addresses
/// it refuses are never dialled.
#[cfg(test)]
async fn dial(
    host: &str,
    port: u16,
    explicit: &[IpAddr],
    own: &[IpAddr],
    deadline: tokio::time::Instant,
) -> Result<TcpStream, Dial> {
    let vetted = vet(host, port, explicit, own, deadline).await?;
    connect(&vetted, deadline).await.map_err(Dial::Failed)
}

/// Resolves `host` and keeps the addresses [`address_problem`] allows (given the
/// allow-list's literal entries and the operator's own addresses), in the resolver's
/// order; only these are ever dialled, or served by a pooled connection.
async fn vet(
    host: &str,
    port: u16,
    explicit: &[IpAddr],
    own: &[IpAddr],
    deadline: tokio::time::Instant,
) -> Result<Vec<SocketAddr>, Dial> {
    let addrs = resolve(host, port, deadline).await.map_err(Dial::Failed)?;
    let (vetted, refused): (Vec<_>, Vec<_>) = addrs
        .into_iter()
        .map(|a| (a, address_problem(a.ip(), explicit, own)))
        .partition(|(_, why)| why.is_none());
    if vetted.is_empty() {
        return Err(Dial::Refused(
            refused
                .into_iter()
                .map(|(a, why)| (a, why.unwrap_or_default()))
                .collect(),
        ));
    }
    Ok(vetted.into_iter().map(|(a, _)| a).collect())
}

async fn connect(addrs: &[SocketAddr], deadline: tokio::time::Instant) -> Result<TcpStream, Error> {
    let mut last = Error::ConnectionRefused;
    for addr in addrs {
        match tokio::time::timeout_at(deadline, TcpStream::connect(addr)).await {
            Ok(Ok(s)) => {
                let _ = s.set_nodelay(true);
                return Ok(s);
            }
            Ok(Err(e)) => last = Error::Connect(e),
            Err(_) => return Err(Error::ConnectionTimeout),
        }
    }
    Err(last)
}

/// A response body with a size cap and a between-bytes timeout.
struct CappedBody {
    inner: hyper::body::Incoming,
    max: u64,
    seen: u64,
    between_bytes: Duration,
    timer: Pin<Box<tokio::time::Sleep>>,
    /// The connection: back to the provider's pool if the body was read to the end.
    lease: super::pool::Lease,
    /// The request's in-flight slot, held while the guest holds the body.
    _slot: Slot,
}

impl Drop for CappedBody {
    fn drop(&mut self) {
        // A body with nothing left (a 204, a HEAD, a zero length) the guest never read.
        if self.inner.is_end_stream() {
            self.lease.done();
        }
    }
}

impl Body for CappedBody {
    type Data = Bytes;
    type Error = Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Error>>> {
        match Pin::new(&mut self.inner).poll_frame(cx) {
            Poll::Ready(Some(Ok(frame))) => {
                if let Some(data) = frame.data_ref() {
                    self.seen += data.len() as u64;
                    if self.seen > self.max {
                        return Poll::Ready(Some(Err(Error::HttpResponseBodySize(None))));
                    }
                }
                let next = tokio::time::Instant::now() + self.between_bytes;
                self.timer.as_mut().reset(next);
                Poll::Ready(Some(Ok(frame)))
            }
            Poll::Ready(Some(Err(e))) => Poll::Ready(Some(Err(Error::from(e)))),
            Poll::Ready(None) => {
                self.lease.done();
                Poll::Ready(None)
            }
            Poll::Pending => match self.timer.as_mut().poll(cx) {
                Poll::Ready(()) => Poll::Ready(Some(Err(Error::ConnectionReadTimeout))),
                Poll::Pending => Poll::Pending,
            },
        }
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

/// TLS trust for one provider: its CA file, or the system roots, or (insecure) none.
pub fn tls_config(
    ca_file: Option<&std::path::Path>,
    insecure: bool,
) -> Result<Arc<rustls::ClientConfig>, String> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = rustls::ClientConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .map_err(|e| e.to_string())?;
    if insecure {
        let mut config = builder
            .dangerous()
            .with_custom_certificate_verifier(Arc::new(AcceptAnyCert(provider)))
            .with_no_client_auth();
        config.resumption = rustls::client::Resumption::in_memory_sessions(TLS_SESSION_SERVERS);
        return Ok(Arc::new(config));
    }
    let mut roots = rustls::RootCertStore::empty();
    match ca_file {
        Some(path) => {
            let pem =
                std::fs::read(path).map_err(|e| format!("tls.caFile {}: {e}", path.display()))?;
            let mut added = 0;
            for cert in rustls_pemfile::certs(&mut pem.as_slice()) {
                let cert = cert.map_err(|e| format!("tls.caFile {}: {e}", path.display()))?;
                roots
                    .add(cert)
                    .map_err(|e| format!("tls.caFile {}: {e}", path.display()))?;
                added += 1;
            }
            if added == 0 {
                return Err(format!(
                    "tls.caFile {}: no PEM certificates in it",
                    path.display()
                ));
            }
        }
        None => roots = system_roots().clone(),
    }
    let mut config = builder.with_root_certificates(roots).with_no_client_auth();
    config.resumption = rustls::client::Resumption::in_memory_sessions(TLS_SESSION_SERVERS);
    Ok(Arc::new(config))
}

/// Server names whose TLS sessions a provider's config keeps for resumption (rustls'
/// in-memory cache, per provider as its config is): a new connection to a backend it
/// spoke to resumes instead of a full handshake. Counted in the fit as
/// `config::fit::TLS_SESSION_CACHE_BYTES`.
pub const TLS_SESSION_SERVERS: usize = 4;

/// The system's CA roots, loaded once; the Mozilla set when the system has none (a
/// distroless image may ship only the bundle rustls-native-certs does not find).
fn system_roots() -> &'static rustls::RootCertStore {
    static ROOTS: std::sync::OnceLock<rustls::RootCertStore> = std::sync::OnceLock::new();
    ROOTS.get_or_init(|| {
        let mut roots = rustls::RootCertStore::empty();
        let native = rustls_native_certs::load_native_certs();
        for cert in native.certs {
            let _ = roots.add(cert);
        }
        if roots.is_empty() {
            roots.extend(webpki_roots::TLS_SERVER_ROOTS.iter().cloned());
        }
        roots
    })
}

#[derive(Debug)]
struct AcceptAnyCert(Arc<rustls::crypto::CryptoProvider>);

impl rustls::client::danger::ServerCertVerifier for AcceptAnyCert {
    fn verify_server_cert(
        &self,
        _: &rustls::pki_types::CertificateDer<'_>,
        _: &[rustls::pki_types::CertificateDer<'_>],
        _: &rustls::pki_types::ServerName<'_>,
        _: &[u8],
        _: rustls::pki_types::UnixTime,
    ) -> Result<rustls::client::danger::ServerCertVerified, rustls::Error> {
        Ok(rustls::client::danger::ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &rustls::pki_types::CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &rustls::pki_types::CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<rustls::SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;
    use crate::rate::{Budget, Priority, Spec};
    use std::sync::atomic::Ordering;

    /// The resolver's test seam: names ending in `.pool.test` answer what a test set.
    pub(super) mod dns {
        use std::collections::HashMap;
        use std::net::IpAddr;
        use std::sync::Mutex;

        static ANSWERS: Mutex<Option<HashMap<String, Vec<IpAddr>>>> = Mutex::new(None);

        pub fn set(name: &str, ips: &[IpAddr]) {
            let mut a = ANSWERS.lock().unwrap();
            a.get_or_insert_default().insert(name.into(), ips.to_vec());
        }

        pub fn answer(name: &str) -> Option<Vec<IpAddr>> {
            let name = name.strip_suffix('.').unwrap_or(name);
            ANSWERS.lock().unwrap().as_ref()?.get(name).cloned()
        }
    }

    fn policy(
        name: &str,
        port: u16,
        limits: crate::config::HttpLimits,
        budget: Option<Spec>,
    ) -> Arc<HttpPolicy> {
        let rules = [
            format!("http://127.0.0.1:{port}"),
            format!("http://moved.pool.test:{port}"),
        ];
        Arc::new(HttpPolicy {
            provider: name.into(),
            allow: AllowList::new(rules.iter().map(|r| r.parse().unwrap()).collect()),
            pool: super::super::pool::Pool::new(limits.max_idle, limits.idle_timeout),
            limits,
            tls: tls_config(None, false).unwrap(),
            sensitive: Arc::default(),
            budget: budget.map(|b| Arc::new(Budget::new(b))),
        })
    }

    pub(crate) fn call() -> CallBudget {
        let clock = super::super::clock::CallClock::new(
            std::time::Instant::now(),
            Duration::from_secs(60),
            Duration::from_secs(60),
        );
        CallBudget::new(Priority::Urgent, Arc::new(clock), None)
    }

    /// One request through [`send`], as a plugin's `wasi:http` call makes it; the body
    /// read to the end.
    pub(crate) async fn get(
        policy: &Arc<HttpPolicy>,
        url: &str,
        call: &CallBudget,
    ) -> Result<String, Error> {
        let pool = policy.pool.clone();
        let slot = Arc::new(Semaphore::new(1)).try_acquire_owned().unwrap();
        let stop = Tripwire::default();
        let body = http_body_util::Empty::<Bytes>::new()
            .map_err(|never| match never {})
            .boxed_unsync();
        let request = http::Request::get(url).body(body).unwrap();
        let c = Call {
            budget: call,
            stop: &stop,
            shown_host: "test",
        };
        let (resp, _io) = send(policy, &pool, request, None, Arc::new(slot), c).await?;
        let body = resp.into_body().collect().await?.to_bytes();
        Ok(String::from_utf8_lossy(&body).into_owned())
    }

    async fn settle() {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    /// A second request of a call, and the requests of the next call, go over the first
    /// request's connection; every one of them still costs a token of the budget.
    #[tokio::test]
    async fn requests_reuse_the_connection_and_each_costs_a_token() {
        let s = super::super::pool::tests::server().await;
        let url = format!("http://127.0.0.1:{}/x", s.addr.port());
        let spec = Spec {
            per_hour: 1,
            burst: 10,
        };
        let p = policy("a", s.addr.port(), Default::default(), Some(spec));
        let first = call();
        assert_eq!(get(&p, &url, &first).await.unwrap(), "ok");
        assert_eq!(get(&p, &url, &first).await.unwrap(), "ok");
        let next = call();
        assert_eq!(get(&p, &url, &next).await.unwrap(), "ok");
        assert_eq!(s.accepted.load(Ordering::SeqCst), 1, "one connection");
        assert_eq!(s.requests.load(Ordering::SeqCst), 3);
        assert_eq!((first.sent(), next.sent()), (2, 1));
        let left = p.budget.as_ref().unwrap().tokens();
        assert!((6.9..7.1).contains(&left), "3 tokens of 10 taken: {left}");
        let pool = p.pool.clone();
        assert_eq!(pool.counts(), (1, 2), "opened once, reused twice");
    }

    /// Two providers calling the same host never share a connection; maxIdle 0 keeps
    /// none.
    #[tokio::test]
    async fn providers_never_share_a_connection() {
        let s = super::super::pool::tests::server().await;
        let url = format!("http://127.0.0.1:{}/", s.addr.port());
        let a = policy("a", s.addr.port(), Default::default(), None);
        let b = policy("b", s.addr.port(), Default::default(), None);
        for _ in 0..2 {
            get(&a, &url, &call()).await.unwrap();
            get(&b, &url, &call()).await.unwrap();
        }
        assert_eq!(s.accepted.load(Ordering::SeqCst), 2, "one each");
        let none = crate::config::HttpLimits {
            max_idle: 0,
            ..Default::default()
        };
        let c = policy("c", s.addr.port(), none, None);
        get(&c, &url, &call()).await.unwrap();
        get(&c, &url, &call()).await.unwrap();
        assert_eq!(
            s.accepted.load(Ordering::SeqCst),
            4,
            "maxIdle 0: one per request"
        );
    }

    /// A provider dropped (what a reload does to the old ones) closes its idle
    /// connections; its successor opens its own.
    #[tokio::test]
    async fn dropping_the_policy_closes_its_pool() {
        let s = super::super::pool::tests::server().await;
        let url = format!("http://127.0.0.1:{}/", s.addr.port());
        let old = policy("a", s.addr.port(), Default::default(), None);
        get(&old, &url, &call()).await.unwrap();
        let pool = Arc::downgrade(&old.pool);
        drop(old);
        settle().await;
        assert!(pool.upgrade().is_none(), "the pool went with its provider");
        assert_eq!(s.closed.load(Ordering::SeqCst), 1, "and its socket");
        let new = policy("a", s.addr.port(), Default::default(), None);
        get(&new, &url, &call()).await.unwrap();
        assert_eq!(s.accepted.load(Ordering::SeqCst), 2);
    }

    /// A host with a kept-alive connection whose name now resolves to an address the
    /// vetting refuses (internal, and not named literally) is refused: the pooled
    /// connection is not used, because the lookup and the vetting run for every request.
    #[tokio::test]
    async fn a_pooled_connection_never_bypasses_the_address_vetting() {
        let s = super::super::pool::tests::server().await;
        let port = s.addr.port();
        let p = policy("a", port, Default::default(), None);
        // A connection made for moved.pool.test when it resolved to a vetted address.
        let stream = TcpStream::connect(s.addr).await.unwrap();
        let (sender, conn) = hyper::client::conn::http1::Builder::new()
            .handshake(TokioIo::new(stream))
            .await
            .unwrap();
        let key = super::super::pool::Key {
            https: false,
            host: "moved.pool.test".into(),
            port,
        };
        let pool = p.pool.clone();
        pool.put(super::super::pool::Conn {
            sender,
            _task: super::super::pool::AbortOnDrop(tokio::spawn(conn)),
            key,
            addr: s.addr,
        });
        let url = format!("http://moved.pool.test:{port}/");
        for now in ["10.9.8.7", "127.0.0.1"] {
            dns::set("moved.pool.test", &[now.parse().unwrap()]);
            match get(&p, &url, &call()).await {
                Err(Error::DestinationIpProhibited) => {}
                other => panic!("resolving to {now}: want refused, got {other:?}"),
            }
        }
        assert_eq!(s.requests.load(Ordering::SeqCst), 0, "nothing sent on it");
        assert_eq!(pool.counts(), (0, 0));
    }

    /// A request whose allowed name resolves to one of this machine's own addresses (not
    /// loopback: a pod's address, public on IPv6 clusters) is never dialled, while a server
    /// listens there; the same address named literally by the operator is.
    #[tokio::test]
    async fn an_own_address_is_never_dialled_unless_named_literally() {
        let own = super::super::interfaces::read().unwrap();
        let Some(addr) = own.iter().copied().find(|a| !a.is_loopback()) else {
            eprintln!(
                "!!! SKIPPING an_own_address_is_never_dialled_unless_named_literally: this machine has no non-loopback address ({own:?})"
            );
            return;
        };
        let listener = match tokio::net::TcpListener::bind((addr, 0)).await {
            Ok(l) => l,
            Err(e) => {
                eprintln!(
                    "!!! SKIPPING an_own_address_is_never_dialled_unless_named_literally: cannot listen on {addr}: {e}"
                );
                return;
            }
        };
        let port = listener.local_addr().unwrap().port();
        let accepted = Arc::new(std::sync::atomic::AtomicU32::new(0));
        let server = {
            let accepted = accepted.clone();
            tokio::spawn(async move {
                while listener.accept().await.is_ok() {
                    accepted.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                }
            })
        };
        let deadline = || tokio::time::Instant::now() + Duration::from_secs(5);
        let host = match addr {
            IpAddr::V6(v6) => format!("[{v6}]"),
            IpAddr::V4(v4) => v4.to_string(),
        };
        // What an allowed name resolving to it yields: no literal entry.
        match dial(&host, port, &[], &own, deadline()).await {
            Err(Dial::Refused(r)) => {
                assert_eq!(
                    r,
                    vec![(SocketAddr::new(addr, port), crate::policy::OWN_ADDRESS)]
                );
            }
            other => panic!("{addr}: want Refused, got {other:?}"),
        }
        // The machine's host name, where it resolves to that address (a pod's /etc/hosts).
        let name = hostname();
        let by_name: Vec<IpAddr> = tokio::net::lookup_host((name.as_str(), port))
            .await
            .map(|a| a.map(|a| a.ip()).collect())
            .unwrap_or_default();
        if by_name.iter().any(|a| !a.is_loopback() && own.contains(a)) {
            match dial(&name, port, &[], &own, deadline()).await {
                Err(Dial::Refused(_)) => {}
                other => panic!("{name}: want Refused, got {other:?}"),
            }
        } else {
            eprintln!(
                "!!! by-name variant skipped: host name {name:?} resolves to {by_name:?}, none of them a non-loopback address of this machine"
            );
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert_eq!(
            accepted.load(std::sync::atomic::Ordering::SeqCst),
            0,
            "a refused address was dialled"
        );
        // The operator's literal entry opens it, as it opens 127.0.0.1 for emulators.
        dial(&host, port, &[addr], &own, deadline())
            .await
            .unwrap_or_else(|e| panic!("{addr} named literally: {e:?}"));
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert_eq!(accepted.load(std::sync::atomic::Ordering::SeqCst), 1);
        server.abort();
    }

    /// A provider allowed to call `s` over HTTPS, trusting its CA.
    pub(crate) fn tls_policy(
        name: &str,
        s: &std::net::SocketAddr,
        ca: &std::path::Path,
        limits: crate::config::HttpLimits,
    ) -> Arc<HttpPolicy> {
        let port = s.port();
        let rules = [
            format!("https://127.0.0.1:{port}"),
            format!("https://moved-h2.pool.test:{port}"),
        ];
        Arc::new(HttpPolicy {
            provider: name.into(),
            allow: AllowList::new(rules.iter().map(|r| r.parse().unwrap()).collect()),
            pool: super::super::pool::Pool::new(limits.max_idle, limits.idle_timeout),
            limits,
            tls: tls_config(Some(ca), false).unwrap(),
            sensitive: Arc::default(),
            budget: None,
        })
    }

    /// What a connection idle in the pool holds, measured against what the fit counts
    /// for it ([`crate::config::fit::IDLE_CONNECTION_BYTES`]): the heap this thread holds
    /// with `maxIdle` connections idle, each after a response of 4 MiB (which grows the
    /// read buffers as far as they go), against the same after the pool is dropped. The
    /// backend runs on a thread of its own, so only the client side is counted: the
    /// connections, their TLS state, buffers and driver tasks.
    #[tokio::test]
    async fn an_idle_connection_holds_less_than_the_fit_counts() {
        use crate::config::fit::IDLE_CONNECTION_BYTES;
        use crate::thread_heap::live;
        for h2 in [false, true] {
            let (tx, rx) = std::sync::mpsc::channel();
            let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
            let backend = std::thread::spawn(move || {
                let rt = tokio::runtime::Runtime::new().unwrap();
                rt.block_on(async {
                    let s = super::super::h2::tests::tls_server(h2).await;
                    tx.send((s.addr, s.ca_file.clone())).unwrap();
                    let _ = stop_rx.await;
                });
            });
            let (addr, ca_file) = rx.recv().unwrap();
            let limits = crate::config::HttpLimits::default();
            let idle = limits.max_idle as usize;
            let p = tls_policy("a", &addr, &ca_file, limits);
            let tls = p.tls.clone();
            let url = format!("https://127.0.0.1:{}/big/{}", addr.port(), 4 << 20);
            // Warm up what stays with the provider, not its connections: the TLS
            // config's session cache, the lookup, the budget's first entries.
            get(&p, &url, &call()).await.unwrap();
            let calls: Vec<CallBudget> = (0..idle).map(|_| call()).collect();
            let answers = futures::future::join_all(calls.iter().map(|c| get(&p, &url, c))).await;
            for a in answers {
                assert_eq!(a.unwrap().len(), 4 << 20);
            }
            settle().await;
            let opened = if h2 { 1 } else { idle };
            assert_eq!(p.pool.idle(), opened, "h2 {h2}: connections idle");
            let with = live();
            drop(p);
            settle().await;
            let without = live();
            drop(tls);
            let per = (with - without) / opened as isize;
            eprintln!(
                "h2 {h2}: {opened} idle connection(s) held {} KiB, {} KiB each (the fit counts {} KiB)",
                (with - without) >> 10,
                per >> 10,
                IDLE_CONNECTION_BYTES >> 10
            );
            assert!(per > 0, "h2 {h2}: nothing measured");
            assert!(
                per <= IDLE_CONNECTION_BYTES as isize,
                "h2 {h2}: {per} bytes per idle connection"
            );
            stop_tx.send(()).unwrap();
            backend.join().unwrap();
        }
    }

    /// Requests of one provider to a backend that offers `h2` share one connection, one
    /// after another and at once.
    #[tokio::test]
    async fn h2_requests_of_a_provider_share_one_connection_also_at_once() {
        let s = super::super::h2::tests::tls_server(true).await;
        let p = tls_policy("a", &s.addr, &s.ca_file, Default::default());
        let url = |path: &str| format!("https://127.0.0.1:{}{path}", s.addr.port());
        assert_eq!(get(&p, &url("/x"), &call()).await.unwrap(), "ok");
        assert_eq!(get(&p, &url("/x"), &call()).await.unwrap(), "ok");
        let calls: Vec<CallBudget> = (0..8).map(|_| call()).collect();
        let slow = url("/slow");
        let answers = futures::future::join_all(calls.iter().map(|c| get(&p, &slow, c))).await;
        for a in answers {
            assert_eq!(a.unwrap(), "ok");
        }
        assert_eq!(s.accepted.load(Ordering::SeqCst), 1, "one connection");
        assert_eq!(s.requests.load(Ordering::SeqCst), 10);
        let most = s.max_active.load(Ordering::SeqCst);
        assert!(most >= 2, "requests were carried at once: at most {most}");
        settle().await;
        assert_eq!(p.pool.streams(), vec![0], "held once, nothing in flight");
        assert_eq!(p.pool.counts(), (1, 9), "opened once, reused 9 times");
    }

    /// A backend offering only `http/1.1` over TLS: one request per connection at a time,
    /// as before; a connection is reused once its response was read.
    #[tokio::test]
    async fn an_http1_only_tls_backend_gets_one_request_per_connection() {
        let s = super::super::h2::tests::tls_server(false).await;
        let p = tls_policy("a", &s.addr, &s.ca_file, Default::default());
        let url = |path: &str| format!("https://127.0.0.1:{}{path}", s.addr.port());
        assert_eq!(get(&p, &url("/x"), &call()).await.unwrap(), "ok");
        assert_eq!(get(&p, &url("/x"), &call()).await.unwrap(), "ok");
        assert_eq!(
            s.accepted.load(Ordering::SeqCst),
            1,
            "reused one after another"
        );
        let calls: Vec<CallBudget> = (0..3).map(|_| call()).collect();
        let slow = url("/slow");
        for a in futures::future::join_all(calls.iter().map(|c| get(&p, &slow, c))).await {
            assert_eq!(a.unwrap(), "ok");
        }
        assert_eq!(
            s.accepted.load(Ordering::SeqCst),
            3,
            "at once: the idle one and two new"
        );
        assert!(p.pool.streams().is_empty(), "no HTTP/2 connection");
        assert_eq!(p.pool.idle(), 3);
    }

    /// Two providers calling the same HTTP/2 backend never share a connection.
    #[tokio::test]
    async fn providers_never_share_an_h2_connection() {
        let s = super::super::h2::tests::tls_server(true).await;
        let url = format!("https://127.0.0.1:{}/", s.addr.port());
        let a = tls_policy("a", &s.addr, &s.ca_file, Default::default());
        let b = tls_policy("b", &s.addr, &s.ca_file, Default::default());
        for _ in 0..2 {
            get(&a, &url, &call()).await.unwrap();
            get(&b, &url, &call()).await.unwrap();
        }
        assert_eq!(s.accepted.load(Ordering::SeqCst), 2, "one each");
        assert_eq!((a.pool.streams(), b.pool.streams()), (vec![0], vec![0]));
        // A reload drops the old provider: its connection goes, its successor dials anew.
        drop(a);
        let a = tls_policy("a", &s.addr, &s.ca_file, Default::default());
        get(&a, &url, &call()).await.unwrap();
        assert_eq!(s.accepted.load(Ordering::SeqCst), 3);
    }

    /// An HTTP/2 connection made for a name when it resolved to a vetted address is not
    /// used once the name resolves to an address the vetting refuses.
    #[tokio::test]
    async fn a_pooled_h2_connection_never_bypasses_the_address_vetting() {
        let s = super::super::h2::tests::tls_server(true).await;
        let port = s.addr.port();
        let p = tls_policy("a", &s.addr, &s.ca_file, Default::default());
        let key = super::super::pool::Key {
            https: true,
            host: "moved-h2.pool.test".into(),
            port,
        };
        let pool = p.pool.clone();
        let conn = super::super::h2::tests::h2_conn(&s, key, &pool).await;
        drop(pool.add_shared(conn));
        assert_eq!(pool.streams(), vec![0]);
        let url = format!("https://moved-h2.pool.test:{port}/");
        for now in ["10.9.8.7", "127.0.0.1"] {
            dns::set("moved-h2.pool.test", &[now.parse().unwrap()]);
            match get(&p, &url, &call()).await {
                Err(Error::DestinationIpProhibited) => {}
                other => panic!("resolving to {now}: want refused, got {other:?}"),
            }
        }
        assert_eq!(s.requests.load(Ordering::SeqCst), 0, "nothing sent on it");
        assert_eq!(pool.counts(), (0, 0));
    }

    /// The response checks hold the same over HTTP/2 as over HTTP/1.1: header bytes, body
    /// size; and a header block over HTTP/2's decoding bound is refused as it is decoded,
    /// the connection serving on.
    #[tokio::test]
    async fn h2_responses_get_the_same_checks_as_http1() {
        let limits = crate::config::HttpLimits {
            max_response_bytes: 1000,
            ..Default::default()
        };
        let mut seen = Vec::new();
        for h2 in [true, false] {
            let s = super::super::h2::tests::tls_server(h2).await;
            let p = tls_policy("a", &s.addr, &s.ca_file, limits.clone());
            let url = |path: &str| format!("https://127.0.0.1:{}{path}", s.addr.port());
            // Over maxHeaderBytes (16 KiB), within what HTTP/2 decodes: the same refusal.
            match get(&p, &url("/headers/17000"), &call()).await {
                Err(Error::HttpResponseHeaderSectionSize(Some(n))) => seen.push(n),
                other => panic!("h2 {h2}: want the header section refused, got {other:?}"),
            }
            match get(&p, &url("/big/5000"), &call()).await {
                Err(Error::HttpResponseBodySize(Some(5000))) => {}
                other => panic!("h2 {h2}: want the body refused, got {other:?}"),
            }
            assert_eq!(
                get(&p, &url("/big/1000"), &call()).await.unwrap().len(),
                1000
            );
            if h2 {
                // Over the decoding bound: refused by h2 while decoding, the stream reset.
                match get(&p, &url("/headers/40000"), &call()).await {
                    Err(Error::HttpResponseHeaderSectionSize(None)) => {}
                    other => panic!("want the header block refused, got {other:?}"),
                }
                assert_eq!(get(&p, &url("/"), &call()).await.unwrap(), "ok");
                assert_eq!(
                    s.accepted.load(Ordering::SeqCst),
                    1,
                    "one connection throughout"
                );
            }
        }
        // `x-big` (17,005 bytes) and the server's `date` and `content-length`, both ways.
        assert_eq!(seen, vec![17053, 17053]);
    }

    /// A hostile HTTP/2 backend's header block (an HPACK bomb, endless CONTINUATION
    /// frames) is refused with the header-size error, at once, and the host stops
    /// reading the endless one.
    #[tokio::test]
    async fn a_hostile_h2_header_block_is_refused_and_never_held() {
        use super::super::h2::tests::{Hostile, hostile_server};
        for kind in [Hostile::HpackBomb, Hostile::EndlessContinuation] {
            let s = hostile_server(kind).await;
            let p = tls_policy("a", &s.addr, &s.ca_file, Default::default());
            let url = format!("https://127.0.0.1:{}/", s.addr.port());
            let start = Instant::now();
            match get(&p, &url, &call()).await {
                Err(Error::HttpResponseHeaderSectionSize(None)) => {}
                other => panic!("want the header block refused, got {other:?}"),
            }
            assert!(
                start.elapsed() < Duration::from_secs(5),
                "{:?}",
                start.elapsed()
            );
            drop(p);
            let deadline = Instant::now() + Duration::from_secs(5);
            while !s.ended.load(Ordering::SeqCst) && Instant::now() < deadline {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            assert!(s.ended.load(Ordering::SeqCst), "the host stopped reading");
            let written = s.written.load(Ordering::SeqCst);
            assert!(written < 8 << 20, "the host took {written} bytes of it");
        }
    }

    fn hostname() -> String {
        let mut buf = [0u8; 256];
        // SAFETY: the buffer is writable for its length; gethostname NUL-terminates it
        // when the name fits.
        let r = unsafe { libc::gethostname(buf.as_mut_ptr().cast(), buf.len()) };
        assert_eq!(r, 0, "gethostname");
        let end = buf.iter().position(|b| *b == 0).unwrap_or(buf.len());
        String::from_utf8_lossy(&buf[..end]).into_owned()
    }
}
