//! The sandbox's price on one backend read: `cargo xtask scale` runs it (or `cargo bench -p
//! proxy-operator --bench sandbox` after `cargo xtask build-plugins`).
//!
//! One `get` of a running server through the Hetzner plugin (fresh Store, fresh `/tmp`,
//! instantiate, the guest's HTTP through the host's hooks: allow-list, budget, timeouts,
//! then the guest parses the JSON) against the same request made natively: a fresh TCP
//! connection, hyper's HTTP/1 client (the stack the host's hook sends with), the same
//! `GET /v1/servers/{id}` with the same token, the body read and parsed as JSON. Both hit
//! the same in-process Hetzner emulator, interleaved call by call so load on the machine
//! falls on both alike. Prints one line; `--json FILE` also writes the figures.
//!
//! Then the same `get` against a backend 20 ms away over TLS: the emulator behind a TLS
//! terminator (a [`TestCa`]'s certificate, trusted through `tls.caFile`) behind a delay
//! line on 127.0.0.1 that holds every byte 10 ms each way, so every round trip, the TCP and
//! TLS handshakes included, pays 20 ms. The plugin (its provider's kept-alive connection
//! pool) against a native keep-alive client (hyper's HTTP/1 over tokio-rustls, one
//! connection reused): one `get` (p50), and 50 sequential `get`s in a row (total).
//!
//! Then the same over HTTP/2: a front that offers only `h2` by ALPN and passes each stream
//! to the emulator, behind the same delay line. The plugin's host negotiates HTTP/2 and
//! keeps the one connection in its pool; the native client is hyper's HTTP/2 over
//! tokio-rustls, one connection reused.

use egress_emulators::control::Emulator;
use egress_emulators::hetzner::{HetznerConfig, HetznerEmulator};
use egress_emulators::tls::TestCa;
use egress_plugin_host::config::ProvidersFile;
use egress_plugin_host::plugin::{Runtime, RuntimeOptions};
use egress_plugin_host::provider::{CreateRequest, Placement, Provider, State};
use http_body_util::{BodyExt, Empty};
use std::path::PathBuf;
use std::time::{Duration, Instant};

const CALLS: usize = 2000;
const WARMUP: usize = 100;
const TOKEN: &str = "sandbox-bench-token";

fn plugin_dir() -> PathBuf {
    std::env::var_os("EGRESS_PLUGIN_DIR")
        .map(PathBuf::from)
        .expect("EGRESS_PLUGIN_DIR (cargo xtask scale sets it)")
}

/// `GET url` natively: new connection, HTTP/1 handshake, bearer token, whole body, JSON.
async fn native_get(addr: std::net::SocketAddr, path: &str) -> serde_json::Value {
    let stream = tokio::net::TcpStream::connect(addr).await.unwrap();
    let (mut sender, conn) = hyper::client::conn::http1::Builder::new()
        .handshake(hyper_util::rt::TokioIo::new(stream))
        .await
        .unwrap();
    let conn = tokio::spawn(conn);
    let req = http::Request::get(path)
        .header("host", addr.to_string())
        .header("authorization", format!("Bearer {TOKEN}"))
        .header("user-agent", "sandbox-bench")
        .body(Empty::<bytes::Bytes>::new())
        .unwrap();
    let resp = sender.send_request(req).await.unwrap();
    assert_eq!(resp.status(), 200);
    let body = resp.into_body().collect().await.unwrap().to_bytes();
    conn.abort();
    serde_json::from_slice(&body).unwrap()
}

/// One way of the delay line: every chunk read from `from` is written to `to` `delay` later
/// (in order, without holding back the chunks behind it).
async fn delayed(
    mut from: tokio::net::tcp::OwnedReadHalf,
    mut to: tokio::net::tcp::OwnedWriteHalf,
    delay: Duration,
) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<(tokio::time::Instant, Vec<u8>)>();
    let writer = tokio::spawn(async move {
        while let Some((due, bytes)) = rx.recv().await {
            tokio::time::sleep_until(due).await;
            if to.write_all(&bytes).await.is_err() {
                return;
            }
        }
        let _ = to.shutdown().await;
    });
    let mut buf = vec![0u8; 64 * 1024];
    while let Ok(n) = from.read(&mut buf).await {
        if n == 0
            || tx
                .send((tokio::time::Instant::now() + delay, buf[..n].to_vec()))
                .is_err()
        {
            break;
        }
    }
    drop(tx);
    let _ = writer.await;
}

/// A listener on 127.0.0.1 that forwards every connection to `to`, `delay` each way.
async fn delay_line(to: std::net::SocketAddr, delay: Duration) -> std::net::SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((client, _)) = listener.accept().await {
            let _ = client.set_nodelay(true);
            tokio::spawn(async move {
                let Ok(server) = tokio::net::TcpStream::connect(to).await else {
                    return;
                };
                let _ = server.set_nodelay(true);
                let (cr, cw) = client.into_split();
                let (sr, sw) = server.into_split();
                tokio::join!(delayed(cr, sw, delay), delayed(sr, cw, delay));
            });
        }
    });
    addr
}

/// A listener on 127.0.0.1 that terminates TLS with `ca`'s server certificate and
/// forwards the plaintext to `to`.
async fn tls_terminator(to: std::net::SocketAddr, ca: &TestCa) -> std::net::SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let acceptor = tokio_rustls::TlsAcceptor::from(ca.server_config());
    tokio::spawn(async move {
        while let Ok((client, _)) = listener.accept().await {
            let acceptor = acceptor.clone();
            tokio::spawn(async move {
                let _ = client.set_nodelay(true);
                let Ok(mut tls) = acceptor.accept(client).await else {
                    return;
                };
                let Ok(mut server) = tokio::net::TcpStream::connect(to).await else {
                    return;
                };
                let _ = server.set_nodelay(true);
                let _ = tokio::io::copy_bidirectional(&mut tls, &mut server).await;
            });
        }
    });
    addr
}

/// A native keep-alive HTTPS client: one HTTP/1.1 connection over tokio-rustls, reused
/// for every request (a new one only if the server closed it).
struct KeepAlive {
    addr: std::net::SocketAddr,
    tls: std::sync::Arc<rustls::ClientConfig>,
    sender: Option<hyper::client::conn::http1::SendRequest<Empty<bytes::Bytes>>>,
}

impl KeepAlive {
    fn new(addr: std::net::SocketAddr, ca_pem: &str) -> KeepAlive {
        let mut roots = rustls::RootCertStore::empty();
        for cert in rustls_pemfile::certs(&mut ca_pem.as_bytes()) {
            roots.add(cert.unwrap()).unwrap();
        }
        let provider = std::sync::Arc::new(rustls::crypto::ring::default_provider());
        let tls = rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_root_certificates(roots)
            .with_no_client_auth();
        KeepAlive {
            addr,
            tls: std::sync::Arc::new(tls),
            sender: None,
        }
    }

    async fn get(&mut self, path: &str) -> serde_json::Value {
        if self.sender.as_ref().is_none_or(|s| s.is_closed()) {
            let tls = tls_connect(self.addr, &self.tls).await;
            let (sender, conn) = hyper::client::conn::http1::Builder::new()
                .handshake(hyper_util::rt::TokioIo::new(tls))
                .await
                .unwrap();
            tokio::spawn(conn);
            self.sender = Some(sender);
        }
        let sender = self.sender.as_mut().unwrap();
        sender.ready().await.unwrap();
        let req = http::Request::get(path)
            .header("host", self.addr.to_string())
            .header("authorization", format!("Bearer {TOKEN}"))
            .header("user-agent", "sandbox-bench")
            .body(Empty::<bytes::Bytes>::new())
            .unwrap();
        json_of(sender.send_request(req).await.unwrap()).await
    }
}

/// A listener on 127.0.0.1 that terminates TLS offering only `h2`, and answers every
/// stream by sending its request to `to` over HTTP/1.1 (a fresh loopback connection each:
/// nothing next to the delay line's 20 ms).
async fn h2_front(to: std::net::SocketAddr, ca: &TestCa) -> std::net::SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let mut config = (*ca.server_config()).clone();
    config.alpn_protocols = vec![b"h2".to_vec()];
    let acceptor = tokio_rustls::TlsAcceptor::from(std::sync::Arc::new(config));
    tokio::spawn(async move {
        while let Ok((client, _)) = listener.accept().await {
            let acceptor = acceptor.clone();
            tokio::spawn(async move {
                let _ = client.set_nodelay(true);
                let Ok(tls) = acceptor.accept(client).await else {
                    return;
                };
                let service = hyper::service::service_fn(move |req| forward(to, req));
                let _ =
                    hyper::server::conn::http2::Builder::new(hyper_util::rt::TokioExecutor::new())
                        .serve_connection(hyper_util::rt::TokioIo::new(tls), service)
                        .await;
            });
        }
    });
    addr
}

/// One HTTP/2 stream's request, sent to `to` over HTTP/1.1; its answer, whole.
async fn forward(
    to: std::net::SocketAddr,
    req: http::Request<hyper::body::Incoming>,
) -> Result<http::Response<http_body_util::Full<bytes::Bytes>>, hyper::Error> {
    let stream = tokio::net::TcpStream::connect(to).await.unwrap();
    let (mut sender, conn) = hyper::client::conn::http1::Builder::new()
        .handshake(hyper_util::rt::TokioIo::new(stream))
        .await?;
    tokio::spawn(conn);
    let (mut parts, body) = req.into_parts();
    let body = body.collect().await?.to_bytes();
    parts.uri = parts
        .uri
        .path_and_query()
        .map_or("/", |p| p.as_str())
        .parse()
        .unwrap();
    parts.version = http::Version::HTTP_11;
    parts
        .headers
        .insert("host", to.to_string().parse().unwrap());
    let resp = sender
        .send_request(http::Request::from_parts(
            parts,
            http_body_util::Full::new(body),
        ))
        .await?;
    let (mut parts, body) = resp.into_parts();
    let body = body.collect().await?.to_bytes();
    parts.version = http::Version::HTTP_2;
    // Connection-specific headers have no place in HTTP/2.
    for h in ["connection", "keep-alive", "transfer-encoding"] {
        parts.headers.remove(h);
    }
    Ok(http::Response::from_parts(
        parts,
        http_body_util::Full::new(body),
    ))
}

/// A native keep-alive HTTP/2 client: one connection over tokio-rustls (ALPN `h2`),
/// reused for every request.
struct H2KeepAlive {
    addr: std::net::SocketAddr,
    tls: std::sync::Arc<rustls::ClientConfig>,
    sender: Option<hyper::client::conn::http2::SendRequest<Empty<bytes::Bytes>>>,
}

impl H2KeepAlive {
    fn new(addr: std::net::SocketAddr, ca_pem: &str) -> H2KeepAlive {
        let mut tls = (*KeepAlive::new(addr, ca_pem).tls).clone();
        tls.alpn_protocols = vec![b"h2".to_vec()];
        H2KeepAlive {
            addr,
            tls: std::sync::Arc::new(tls),
            sender: None,
        }
    }

    async fn get(&mut self, path: &str) -> serde_json::Value {
        if self.sender.as_ref().is_none_or(|s| s.is_closed()) {
            let tls = tls_connect(self.addr, &self.tls).await;
            assert_eq!(tls.get_ref().1.alpn_protocol(), Some(&b"h2"[..]));
            let (sender, conn) =
                hyper::client::conn::http2::Builder::new(hyper_util::rt::TokioExecutor::new())
                    .handshake(hyper_util::rt::TokioIo::new(tls))
                    .await
                    .unwrap();
            tokio::spawn(conn);
            self.sender = Some(sender);
        }
        let sender = self.sender.as_mut().unwrap();
        sender.ready().await.unwrap();
        let req = http::Request::get(format!("https://{}{path}", self.addr))
            .header("authorization", format!("Bearer {TOKEN}"))
            .header("user-agent", "sandbox-bench")
            .body(Empty::<bytes::Bytes>::new())
            .unwrap();
        json_of(sender.send_request(req).await.unwrap()).await
    }
}

/// The native client of a remote case.
enum Native {
    Http1(KeepAlive),
    Http2(H2KeepAlive),
}

impl Native {
    async fn get(&mut self, path: &str) -> serde_json::Value {
        match self {
            Native::Http1(c) => c.get(path).await,
            Native::Http2(c) => c.get(path).await,
        }
    }
}

/// A remote case's figures: one `get` p50 (plugin, native) and `SEQUENCE` in a row.
struct Far {
    plugin_p50: Duration,
    native_p50: Duration,
    plugin_sequence: Duration,
    native_sequence: Duration,
}

impl Far {
    fn get_ratio(&self) -> f64 {
        self.plugin_p50.as_secs_f64() / self.native_p50.as_secs_f64()
    }
    fn sequence_ratio(&self) -> f64 {
        self.plugin_sequence.as_secs_f64() / self.native_sequence.as_secs_f64()
    }
    fn print(&self, how: &str) {
        println!(
            "{how} with {} ms round trips: plugin get p50 {:.1} ms, native keep-alive GET p50 {:.1} ms, ratio {:.2}x ({FAR_CALLS} interleaved calls each); {SEQUENCE} sequential gets: plugin {:.0} ms, native {:.0} ms, ratio {:.2}x",
            RTT.as_millis(),
            ms(self.plugin_p50),
            ms(self.native_p50),
            self.get_ratio(),
            ms(self.plugin_sequence),
            ms(self.native_sequence),
            self.sequence_ratio()
        );
    }
}

/// Round trip of the delay line.
const RTT: Duration = Duration::from_millis(20);
const FAR_CALLS: usize = 40;
const SEQUENCE: usize = 50;

fn p50(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let args: Vec<String> = std::env::args().collect();
    let json_out = args
        .iter()
        .position(|a| a == "--json")
        .and_then(|i| args.get(i + 1))
        .map(PathBuf::from);

    let emu = HetznerEmulator::start(HetznerConfig::new(TOKEN));
    let secrets = tempfile::tempdir().unwrap();
    let token = secrets.path().join("token");
    std::fs::write(&token, TOKEN).unwrap();
    let url = emu.url();
    let entry = ProvidersFile::parse(&format!(
        "providers: [{{name: hz, plugin: hetzner.wasm, additionalHosts: ['{url}'], allowPrivateAddresses: true, \
         secrets: {{token: '{}'}}, config: {{endpoint: '{url}/v1', locations: [fsn1], serverTypes: [cpx11], \
         images: {{ubuntu: ubuntu-24.04}}}}}}]",
        token.display()
    ))
    .unwrap()
    .providers
    .remove(0);
    let scratch = tempfile::tempdir().unwrap();
    let mut opts = RuntimeOptions::for_providers(
        &ProvidersFile::default(),
        None,
        scratch.path().to_path_buf(),
    );
    // The emulator is no real backend: no shipped 3,600/h budget in the way.
    opts.default_budgets = false;
    let rt = Runtime::new(opts).expect("runtime");
    let plugin = rt
        .load_plugin(&plugin_dir().join("hetzner.wasm"))
        .await
        .expect("hetzner.wasm loads");
    let p = rt.provider(plugin, &entry).await.expect("hetzner provider");

    let uid = "0b0e2f5e-5ca1-4e00-8000-000000000001";
    let id = p
        .create(&CreateRequest {
            namespace: "bench".into(),
            proxy_name: "bench".into(),
            cloud_init: b"#cloud-config\n".to_vec(),
            ..CreateRequest::new(
                uid,
                "sandbox-bench",
                Placement::new("fsn1", "fsn1-dc14", "cpx11", "ubuntu"),
            )
        })
        .await
        .expect("create");
    // The emulator runs a server after the first read that sees it.
    let mut running = false;
    for _ in 0..10 {
        if p.get(&id).await.expect("get").state == State::Running {
            running = true;
            break;
        }
    }
    assert!(running, "server {id} never ran");

    // What one plugin `get` sends, so the native side sends exactly that.
    let before = emu.stats();
    p.get(&id).await.unwrap();
    let sent = emu.stats().since(&before);
    assert_eq!(
        sent.total, 1,
        "one get is one backend request: {:?}",
        sent.by_call
    );
    let server_id = id.rsplit('/').next().unwrap().to_string();
    let path = format!("/v1/servers/{server_id}");
    let addr: std::net::SocketAddr = url.trim_start_matches("http://").parse().unwrap();
    assert_eq!(
        native_get(addr, &path).await["server"]["id"].to_string(),
        server_id
    );

    // The sandbox's fixed cost: a call that sends nothing (an ID the plugin refuses
    // before any request), the same Store, instance and teardown as a `get`.
    let malformed = "fsn1/not-a-number";
    let before = emu.stats();
    p.get(malformed)
        .await
        .expect_err("a malformed ID is refused");
    assert_eq!(emu.stats().since(&before).total, 0, "no request for it");

    let (mut plugin_t, mut native_t, mut fixed_t) = (Vec::new(), Vec::new(), Vec::new());
    for i in 0..WARMUP + CALLS {
        let t = Instant::now();
        let inst = p.get(&id).await.unwrap();
        let dp = t.elapsed();
        assert_eq!(inst.state, State::Running);
        let t = Instant::now();
        let v = native_get(addr, &path).await;
        let dn = t.elapsed();
        assert_eq!(v["server"]["status"], "running");
        let t = Instant::now();
        p.get(malformed).await.unwrap_err();
        let df = t.elapsed();
        if i >= WARMUP {
            plugin_t.push(dp);
            native_t.push(dn);
            fixed_t.push(df);
        }
    }
    let (pp, np, fp) = (p50(plugin_t), p50(native_t), p50(fixed_t));
    let ratio = pp.as_secs_f64() / np.as_secs_f64();
    println!(
        "plugin get p50 {:.3} ms, native GET p50 {:.3} ms, ratio {ratio:.2}x; a plugin call that sends nothing p50 {:.3} ms ({CALLS} interleaved calls each)",
        ms(pp),
        ms(np),
        ms(fp)
    );

    // The same backend 20 ms away over TLS.
    let ca = TestCa::new();
    let terminator = tls_terminator(addr, &ca).await;
    let far = delay_line(terminator, RTT / 2).await;
    let far_url = format!("https://{far}");
    let ca_file = ca.write_ca_file(secrets.path()).unwrap();
    let fp_ = remote_provider(&rt, "hzfar", &far_url, &ca_file, &token).await;
    let h1 = measure_far(
        &fp_,
        &id,
        &path,
        Native::Http1(KeepAlive::new(far, ca.ca_pem())),
    )
    .await;
    h1.print("over TLS");

    // The same over HTTP/2: a front offering only h2, behind its own delay line.
    let front = h2_front(addr, &ca).await;
    let far2 = delay_line(front, RTT / 2).await;
    let far2_url = format!("https://{far2}");
    let hp = remote_provider(&rt, "hzh2", &far2_url, &ca_file, &token).await;
    let h2 = measure_far(
        &hp,
        &id,
        &path,
        Native::Http2(H2KeepAlive::new(far2, ca.ca_pem())),
    )
    .await;
    h2.print("over HTTP/2");
    if let Some(path) = json_out {
        let json = serde_json::json!({
            "calls": CALLS,
            "plugin_get_p50_ms": ms(pp),
            "native_get_p50_ms": ms(np),
            "plugin_no_request_p50_ms": ms(fp),
            "ratio": ratio,
            "tls_rtt_ms": RTT.as_millis() as u64,
            "tls_plugin_get_p50_ms": ms(h1.plugin_p50),
            "tls_native_keepalive_get_p50_ms": ms(h1.native_p50),
            "tls_get_ratio": h1.get_ratio(),
            "tls_sequence": SEQUENCE,
            "tls_plugin_sequence_ms": ms(h1.plugin_sequence),
            "tls_native_sequence_ms": ms(h1.native_sequence),
            "tls_sequence_ratio": h1.sequence_ratio(),
            "h2_plugin_get_p50_ms": ms(h2.plugin_p50),
            "h2_native_keepalive_get_p50_ms": ms(h2.native_p50),
            "h2_get_ratio": h2.get_ratio(),
            "h2_plugin_sequence_ms": ms(h2.plugin_sequence),
            "h2_native_sequence_ms": ms(h2.native_sequence),
            "h2_sequence_ratio": h2.sequence_ratio(),
        });
        std::fs::write(&path, serde_json::to_string_pretty(&json).unwrap()).unwrap();
    }
}

/// One remote case: both warmed (connections made, sessions cached), then `FAR_CALLS`
/// interleaved `get`s (p50 each), then `SEQUENCE` in a row each.
async fn measure_far(p: &dyn Provider, id: &str, path: &str, mut native: Native) -> Far {
    for _ in 0..3 {
        assert_eq!(p.get(id).await.unwrap().state, State::Running);
        native.get(path).await;
    }
    let (mut plugin_t, mut native_t) = (Vec::new(), Vec::new());
    for _ in 0..FAR_CALLS {
        let t = Instant::now();
        p.get(id).await.unwrap();
        plugin_t.push(t.elapsed());
        let t = Instant::now();
        native.get(path).await;
        native_t.push(t.elapsed());
    }
    let t = Instant::now();
    for _ in 0..SEQUENCE {
        p.get(id).await.unwrap();
    }
    let plugin_sequence = t.elapsed();
    let t = Instant::now();
    for _ in 0..SEQUENCE {
        native.get(path).await;
    }
    let native_sequence = t.elapsed();
    Far {
        plugin_p50: p50(plugin_t),
        native_p50: p50(native_t),
        plugin_sequence,
        native_sequence,
    }
}

/// A Hetzner provider named `name` on the backend at `url`, over TLS trusting `ca_file`.
async fn remote_provider(
    rt: &std::sync::Arc<Runtime>,
    name: &str,
    url: &str,
    ca_file: &std::path::Path,
    token: &std::path::Path,
) -> egress_plugin_host::plugin::WasmProvider {
    let entry = ProvidersFile::parse(&format!(
        "providers: [{{name: {name}, plugin: hetzner.wasm, additionalHosts: ['{url}'], allowPrivateAddresses: true, \
         tls: {{caFile: '{}'}}, secrets: {{token: '{}'}}, config: {{endpoint: '{url}/v1', locations: [fsn1], serverTypes: [cpx11], \
         images: {{ubuntu: ubuntu-24.04}}}}}}]",
        ca_file.display(),
        token.display()
    ))
    .unwrap()
    .providers
    .remove(0);
    let plugin = rt
        .load_plugin(&plugin_dir().join("hetzner.wasm"))
        .await
        .expect("hetzner.wasm loads");
    rt.provider(plugin, &entry).await.expect("remote provider")
}

/// A TLS connection to `addr` (its certificate names the IP address).
async fn tls_connect(
    addr: std::net::SocketAddr,
    tls: &std::sync::Arc<rustls::ClientConfig>,
) -> tokio_rustls::client::TlsStream<tokio::net::TcpStream> {
    let tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
    let _ = tcp.set_nodelay(true);
    let name = rustls::pki_types::ServerName::IpAddress(addr.ip().into());
    tokio_rustls::TlsConnector::from(tls.clone())
        .connect(name, tcp)
        .await
        .unwrap()
}

/// A 200 answer's body as JSON.
async fn json_of(resp: http::Response<hyper::body::Incoming>) -> serde_json::Value {
    assert_eq!(resp.status(), 200);
    let body = resp.into_body().collect().await.unwrap().to_bytes();
    serde_json::from_slice(&body).unwrap()
}
