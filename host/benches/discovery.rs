//! Discovery API benchmark: latency and throughput over real HTTP on 127.0.0.1.
//!
//! 1,000 Ready proxies (10 namespaces, mixed providers, regions and labels) are created in
//! the in-memory Kubernetes API (fake-kube) and reach the API's store through the real
//! reflector. Two servers share that store: one with auth on (TokenReview +
//! SubjectAccessReview against fake-kube, default 10 s cache, warmed before measuring) and
//! one with auth off. For each scenario, 32 clients on keep-alive HTTP/1.1 connections send
//! requests back to back for a fixed time; every answer must be 200 and is read in full.
//! Latency is measured per request from send to the last byte of the body.
//!
//! `cargo bench --workspace --bench discovery` (release). Environment:
//! `DISCOVERY_BENCH_SECS` (measured seconds per scenario and auth mode, default 6),
//! `DISCOVERY_BENCH_ROUNDS` (the seconds are split into this many rounds, alternating auth
//! on and off, default 3), `DISCOVERY_BENCH_CONCURRENCY` (default 32). Clients and servers
//! share the machine's cores, so figures are a lower bound for the server alone.

use bytes::Bytes;
use fake_kube::{AccessRule, FakeApi, UserInfo};
use http_body_util::{BodyExt, Empty};
use hyper_util::rt::TokioIo;
use k8s_openapi::api::core::v1::Namespace;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, Patch, PatchParams, PostParams};
use proxy_operator::api::{self, CloudInit, Placement, Proxy, ProxySpec};
use proxy_operator::discovery::{self, Auth, AuthSettings};
use serde_json::json;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

const PROXIES: usize = 1000;
const NAMESPACES: usize = 10;
const TOKEN: &str = "bench-token-0123456789abcdef";

fn env_or(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

async fn seed(client: &kube::Client) {
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    for (_, crd) in api::crds() {
        crds.create(&PostParams::default(), &crd).await.unwrap();
    }
    let nss: Api<Namespace> = Api::all(client.clone());
    for i in 0..NAMESPACES {
        let n: Namespace =
            serde_json::from_value(json!({"metadata": {"name": format!("ns-{i}")}})).unwrap();
        nss.create(&PostParams::default(), &n).await.unwrap();
    }
    let tiers = ["gold", "silver", "bronze"];
    let places = [
        ("hetzner", "eu", "fsn1"),
        ("hetzner", "eu", "nbg1"),
        ("ec2", "us-east-1", "us-east-1a"),
        ("ec2", "eu-west-1", "eu-west-1b"),
    ];
    for i in 0..PROXIES {
        let ns = format!("ns-{}", i % NAMESPACES);
        let (provider, region, zone) = places[i % places.len()];
        let name = format!("proxy-{i:04}");
        let api: Api<Proxy> = Api::namespaced(client.clone(), &ns);
        let mut p = Proxy::new(
            &name,
            ProxySpec {
                provider: provider.into(),
                placement: Placement::new(region, zone, "small", "debian-12"),
                cloud_init: CloudInit {
                    inline: Some("#cloud-config\n".into()),
                    secret_key_ref: None,
                },
                port: 3128,
                auth: Default::default(),
                ip_family: Default::default(),
            },
        );
        p.metadata.namespace = Some(ns.clone());
        p.metadata.labels = Some(
            [
                ("tier".to_string(), tiers[i % tiers.len()].to_string()),
                ("pool".to_string(), format!("pool-{}", i % 7)),
            ]
            .into(),
        );
        api.create(&PostParams::default(), &p).await.unwrap();
        let t = "2026-11-01T10:00:00Z";
        let cond = |ty: &str| {
            json!({"type": ty, "status": "True", "reason": ty, "message": "",
                   "lastTransitionTime": t, "observedGeneration": 1})
        };
        let status = json!({
            "providerID": format!("id-{i}"),
            "ip": format!("198.51.{}.{}", i / 250, i % 250 + 1),
            "port": 3128,
            "state": "Running",
            "conditions": [cond("Provisioned"), cond("Healthy"), cond("Ready")],
            "lastProbe": {"time": t, "latencyMs": 20 + (i % 50)},
        });
        api.patch_status(
            &name,
            &PatchParams::apply("bench").force(),
            &Patch::Apply(json!({
                "apiVersion": "egress.proxy-operator.dev/v1alpha1",
                "kind": "Proxy",
                "status": status,
            })),
        )
        .await
        .unwrap();
    }
}

async fn start(router: axum::Router) -> SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(discovery::serve(listener, router, std::future::pending()));
    addr
}

type Sender = hyper::client::conn::http1::SendRequest<Empty<Bytes>>;

async fn connect(addr: SocketAddr) -> Sender {
    let stream = tokio::net::TcpStream::connect(addr).await.unwrap();
    stream.set_nodelay(true).unwrap();
    let (sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .unwrap();
    tokio::spawn(conn);
    sender
}

/// One request; returns the body size.
async fn once(sender: &mut Sender, path: &str, token: Option<&str>) -> usize {
    sender.ready().await.unwrap();
    let mut req = http::Request::get(path).header(http::header::HOST, "127.0.0.1");
    if let Some(t) = token {
        req = req.header(http::header::AUTHORIZATION, format!("Bearer {t}"));
    }
    let resp = sender
        .send_request(req.body(Empty::new()).unwrap())
        .await
        .unwrap();
    let status = resp.status();
    let body = resp.into_body().collect().await.unwrap().to_bytes();
    assert_eq!(
        status,
        200,
        "{path}: {}",
        String::from_utf8_lossy(&body[..body.len().min(300)])
    );
    body.len()
}

struct Figures {
    requests: usize,
    rps: f64,
    p50_ms: f64,
    p99_ms: f64,
    max_ms: f64,
    bytes: usize,
}

/// One measured round: `concurrency` clients for `secs` after a short warm-up; returns
/// every latency and the answer size.
async fn round(
    addr: SocketAddr,
    path: &'static str,
    token: Option<&'static str>,
    concurrency: usize,
    secs: f64,
) -> (Vec<Duration>, usize) {
    let warmup = Duration::from_millis(300);
    let start = Instant::now();
    let (measure_from, until) = (
        start + warmup,
        start + warmup + Duration::from_secs_f64(secs),
    );
    let mut tasks = Vec::new();
    for _ in 0..concurrency {
        tasks.push(tokio::spawn(async move {
            let mut sender = connect(addr).await;
            let mut lat = Vec::with_capacity(16_384);
            let mut bytes = 0;
            loop {
                let t = Instant::now();
                if t >= until {
                    break;
                }
                bytes = once(&mut sender, path, token).await;
                if t >= measure_from {
                    lat.push(t.elapsed());
                }
            }
            (lat, bytes)
        }));
    }
    let mut all = Vec::new();
    let mut bytes = 0;
    for t in tasks {
        let (lat, b) = t.await.unwrap();
        all.extend(lat);
        bytes = b;
    }
    (all, bytes)
}

fn figures(mut all: Vec<Duration>, bytes: usize, measured_secs: f64) -> Figures {
    all.sort_unstable();
    let pct = |q: f64| {
        let i = ((all.len() as f64 * q).ceil() as usize).clamp(1, all.len()) - 1;
        all[i].as_secs_f64() * 1e3
    };
    Figures {
        requests: all.len(),
        rps: all.len() as f64 / measured_secs,
        p50_ms: pct(0.50),
        p99_ms: pct(0.99),
        max_ms: all.last().unwrap().as_secs_f64() * 1e3,
        bytes,
    }
}

fn load_average() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|s| s.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_else(|_| "unknown".into())
}

fn main() {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(run());
}

async fn run() {
    let secs = env_or("DISCOVERY_BENCH_SECS", 6) as f64;
    let rounds = env_or("DISCOVERY_BENCH_ROUNDS", 3) as usize;
    let concurrency = env_or("DISCOVERY_BENCH_CONCURRENCY", 32) as usize;
    let fake = FakeApi::new();
    let client = fake.client();
    let t = Instant::now();
    seed(&client).await;
    let (cache, reflect) = discovery::proxy_reflector(client.clone());
    tokio::spawn(reflect);
    fake.add_token(TOKEN, UserInfo::new("bench"));
    fake.allow(AccessRule::user("bench", ["get", "list"], ["proxies"]));

    let on = start(discovery::router(
        cache.clone(),
        Auth::Kubernetes(client.clone(), AuthSettings::default()),
    ))
    .await;
    let off = start(discovery::router(cache.clone(), Auth::DisabledInsecure)).await;
    // Wait for the store, then warm the auth caches.
    let mut s = connect(on).await;
    loop {
        let ready = cache.store.state().len() == PROXIES;
        if ready && once(&mut s, "/v1/proxies", Some(TOKEN)).await > 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    eprintln!(
        "seeded {PROXIES} Ready proxies through fake-kube in {:.1} s",
        t.elapsed().as_secs_f64()
    );

    let scenarios: [(&str, &'static str); 4] = [
        ("list all (1000)", "/v1/proxies"),
        (
            "list filtered",
            "/v1/proxies?namespace=ns-3&labelSelector=tier%20in%20(gold)",
        ),
        ("pick", "/v1/proxies:pick?region=eu"),
        ("get one", "/v1/proxies/ns-3/proxy-0003"),
    ];
    for path in scenarios.iter().map(|(_, p)| *p) {
        once(&mut s, path, Some(TOKEN)).await;
    }
    let reviews_before = fake.requests().len();

    println!(
        "\nDiscovery API, {PROXIES} Ready proxies, {concurrency} concurrent keep-alive clients, \
         {secs} s per scenario and auth mode in {rounds} alternating rounds ({} cores, load \
         average before: {})\n",
        std::thread::available_parallelism().map_or(0, |n| n.get()),
        load_average()
    );
    println!(
        "| scenario | auth | answer (bytes) | requests | req/s | p50 (ms) | p99 (ms) | max (ms) |"
    );
    println!("|---|---|---|---|---|---|---|---|");
    let mut ratios = Vec::new();
    let mut raw = Vec::new();
    let modes = [("on", on, Some(TOKEN)), ("off", off, None)];
    for (label, path) in scenarios {
        // Alternate the modes in short rounds so that load from elsewhere on the machine
        // hits both alike.
        let mut lat: [Vec<Duration>; 2] = [Vec::new(), Vec::new()];
        let mut bytes = [0; 2];
        for _ in 0..rounds {
            for (i, (_, addr, token)) in modes.iter().enumerate() {
                let (l, b) = round(*addr, path, *token, concurrency, secs / rounds as f64).await;
                lat[i].extend(l);
                bytes[i] = b;
            }
        }
        let mut pair = Vec::new();
        for (i, l) in lat.into_iter().enumerate() {
            let f = figures(l, bytes[i], secs);
            let mode = modes[i].0;
            println!(
                "| {label} | {mode} | {} | {} | {:.0} | {:.3} | {:.3} | {:.2} |",
                f.bytes, f.requests, f.rps, f.p50_ms, f.p99_ms, f.max_ms
            );
            raw.push(json!({"scenario": label, "path": path, "auth": mode, "bytes": f.bytes,
                "requests": f.requests, "rps": f.rps, "p50_ms": f.p50_ms, "p99_ms": f.p99_ms, "max_ms": f.max_ms}));
            pair.push(f);
        }
        ratios.push((
            label,
            pair[0].rps / pair[1].rps,
            pair[0].p50_ms / pair[1].p50_ms,
            pair[0].p99_ms / pair[1].p99_ms,
        ));
    }
    println!("\n| scenario | req/s auth on / off | p50 auth on / off | p99 auth on / off |");
    println!("|---|---|---|---|");
    for (label, rps, p50, p99) in ratios {
        println!("| {label} | {rps:.2} | {p50:.2} | {p99:.2} |");
    }
    let reviews = fake
        .requests()
        .iter()
        .skip(reviews_before)
        .filter(|r| {
            matches!(
                r.resource.as_deref(),
                Some("tokenreviews" | "subjectaccessreviews")
            )
        })
        .count();
    println!(
        "\nAuth reviews sent to the API server while measuring: {reviews} (cache TTL {} s)",
        AuthSettings::default().ttl.as_secs()
    );
    println!("Load average after: {}", load_average());
    println!("\nraw: {}", serde_json::Value::Array(raw));
}
