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

use egress_emulators::control::Emulator;
use egress_emulators::hetzner::{HetznerConfig, HetznerEmulator};
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
        &ProvidersFile { providers: vec![] },
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
    if let Some(path) = json_out {
        let json = serde_json::json!({
            "calls": CALLS,
            "plugin_get_p50_ms": ms(pp),
            "native_get_p50_ms": ms(np),
            "plugin_no_request_p50_ms": ms(fp),
            "ratio": ratio,
        });
        std::fs::write(&path, serde_json::to_string_pretty(&json).unwrap()).unwrap();
    }
}
