//! The status page in a real browser: the discovery router served on 127.0.0.1 over a
//! fake cluster (fake-kube) holding Ready and not-Ready proxies and a ProviderHealth,
//! opened in headless Chromium. The DOM after its scripts ran must show each proxy's
//! readiness and ip:port and the provider targets; the screenshot must not be blank and
//! must show the Ready badge's colour. With auth on, the page carries no data until the
//! token (passed in the URL fragment) lets its script fetch the content.
//!
//! Needs the Debian package `chromium` (`cargo xtask test` installs it). Without it the
//! browser tests are skipped loudly; under `CI=true` they fail.

use crate::support;

use fake_kube::{AccessRule, FakeApi, UserInfo};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, Patch, PatchParams, PostParams};
use proxy_operator::api::{self, CloudInit, Placement, ProviderHealth, Proxy, ProxySpec};
use proxy_operator::discovery::status_page::READY_RGB;
use proxy_operator::discovery::{self, Auth, AuthSettings};
use proxy_operator::testing::browser::{self, Options};
use serde_json::json;
use std::net::SocketAddr;
use std::time::Duration;

const TOKEN: &str = "viewer-token-0123456789";
const WAIT: Duration = Duration::from_secs(10);

/// Chromium, or None (after saying so loudly); under `CI=true` its absence fails.
fn chromium_or_skip() -> bool {
    if browser::find().is_some() {
        return true;
    }
    let msg = "chromium is not installed (apt-get install chromium); the status page browser tests need it";
    if std::env::var("CI").is_ok_and(|v| v == "true") {
        panic!("{msg}");
    }
    eprintln!("\n!!! SKIPPING: {msg}\n");
    false
}

struct Env {
    addr: SocketAddr,
}

/// A fake cluster with three proxies (two Ready, one not), a ProviderHealth with two
/// targets, and the discovery router (auth on or off) serving the page.
async fn start(auth_on: bool) -> Env {
    let api = FakeApi::new();
    let client = api.client();
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    for (_, crd) in api::crds() {
        crds.create(&PostParams::default(), &crd).await.unwrap();
    }
    api.add_token(TOKEN, UserInfo::new("viewer"));
    api.allow(AccessRule::user("viewer", ["list"], ["proxies"]));
    let proxies: Api<Proxy> = Api::namespaced(client.clone(), "default");
    for (name, ready, ip) in [
        ("web-a", true, "203.0.113.10"),
        ("web-b", true, "203.0.113.11"),
        ("batch", false, "203.0.113.12"),
    ] {
        let p = Proxy::new(
            name,
            ProxySpec {
                provider: "hetzner".into(),
                placement: Placement::new("fsn1", "", "cx23", "debian-12"),
                cloud_init: CloudInit {
                    inline: Some("#cloud-config\n".into()),
                    secret_key_ref: None,
                },
                port: 3128,
                auth: Default::default(),
                ip_family: Default::default(),
            },
        );
        proxies.create(&PostParams::default(), &p).await.unwrap();
        let t = "2026-11-01T10:00:00Z";
        let status = if ready { "True" } else { "False" };
        proxies
            .patch_status(
                name,
                &PatchParams::apply("test").force(),
                &Patch::Apply(json!({
                    "apiVersion": "egress.proxy-operator.dev/v1alpha1",
                    "kind": "Proxy",
                    "status": {
                        "ip": ip, "port": 3128, "state": "Running", "providerID": format!("id-{name}"),
                        "conditions": [
                            {"type": "Healthy", "status": status, "reason": if ready {"ProbeSucceeded"} else {"ProbeFailed"}, "message": "", "lastTransitionTime": t},
                            {"type": "Ready", "status": status, "reason": if ready {"Ready"} else {"Unhealthy"},
                             "message": if ready {""} else {"CONNECT through the proxy timed out"}, "lastTransitionTime": t},
                        ],
                        "lastProbe": if ready { json!({"time": t, "latencyMs": 37}) } else { json!({"time": t, "error": "timeout"}) },
                    }
                })),
            )
            .await
            .unwrap();
    }
    let phs: Api<ProviderHealth> = Api::all(client.clone());
    phs.create(
        &PostParams::default(),
        &ProviderHealth::new("hetzner", Default::default()),
    )
    .await
    .unwrap();
    phs.patch_status(
        "hetzner",
        &PatchParams::apply("test").force(),
        &Patch::Apply(json!({
            "apiVersion": "egress.proxy-operator.dev/v1alpha1",
            "kind": "ProviderHealth",
            "status": {
                "type": "hetzner", "checkSupported": true, "lastCheckTime": "2026-11-01T10:00:00Z",
                "targets": [
                    {"target": "fsn1", "ready": true, "reason": "Reachable", "message": "", "lastTransitionTime": "2026-11-01T10:00:00Z"},
                    {"target": "hel1", "ready": false, "reason": "Timeout", "message": "no answer in 5s", "lastTransitionTime": "2026-11-01T10:00:00Z"},
                ]
            }
        })),
    )
    .await
    .unwrap();

    let (cache, reflect) = discovery::proxy_reflector(client.clone());
    let (health, reflect_health) = discovery::provider_health_reflector(client.clone());
    tokio::spawn(reflect);
    tokio::spawn(reflect_health);
    let auth = if auth_on {
        Auth::Kubernetes(client.clone(), AuthSettings::default())
    } else {
        Auth::DisabledInsecure
    };
    let router = discovery::router_with_providers(cache.clone(), Some(health.clone()), auth);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(discovery::serve(listener, router, std::future::pending()));
    // Both caches hold everything before the browser looks.
    let deadline = tokio::time::Instant::now() + WAIT;
    while cache.store.len() < 3 || health.state().iter().all(|h| h.status.is_none()) {
        assert!(
            tokio::time::Instant::now() < deadline,
            "caches did not fill"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    Env { addr }
}

/// The `<tr>` of the row whose data-name is `name`.
fn row<'a>(dom: &'a str, class: &str, name: &str) -> &'a str {
    let start = dom
        .find(&format!(r#"<tr class="{class}" data-name="{name}">"#))
        .unwrap_or_else(|| panic!("no {class} row {name} in the DOM:\n{dom}"));
    let end = dom[start..].find("</tr>").unwrap() + start;
    &dom[start..end]
}

fn check_dom(dom: &str) {
    for (name, ip) in [
        ("default/web-a", "203.0.113.10"),
        ("default/web-b", "203.0.113.11"),
    ] {
        let r = row(dom, "proxy", name);
        assert!(r.contains(r#"<span class="badge ok">Ready</span>"#), "{r}");
        assert!(r.contains(&format!("{ip}:3128")), "{r}");
        assert!(r.contains("37 ms"), "{r}");
    }
    let r = row(dom, "proxy", "default/batch");
    assert!(
        r.contains(r#"<span class="badge bad">Unhealthy</span>"#),
        "{r}"
    );
    assert!(r.contains("CONNECT through the proxy timed out"), "{r}");
    assert!(dom.contains("2 of 3 Ready"));
    assert!(dom.contains(r#"<td class="target">fsn1</td>"#), "{dom}");
    assert!(dom.contains(r#"<td class="target">hel1</td>"#));
    assert!(dom.contains("<td>Reachable</td>"));
    assert!(dom.contains("no answer in 5s"));
}

/// Pixels of exactly `rgb` and the number of distinct colours, from a PNG file.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn page_in_chromium_shows_ready_proxies_and_provider_targets() {
    if !chromium_or_skip() {
        return;
    }
    let env = start(false).await;
    let url = format!("http://{}/status", env.addr);

    let opts = Options::default();
    let dom = {
        let (url, opts) = (url.clone(), opts.clone());
        tokio::task::spawn_blocking(move || browser::dump_dom(&url, &opts))
            .await
            .unwrap()
            .unwrap()
    };
    check_dom(&dom);
    // The script ran and refreshed the content (the meta line says when).
    assert!(
        dom.contains("Updated "),
        "the page's script did not refresh:\n{dom}"
    );

    let dir = tempfile::tempdir().unwrap();
    let shot = dir.path().join("status.png");
    {
        let (url, shot, opts) = (url.clone(), shot.clone(), opts.clone());
        tokio::task::spawn_blocking(move || browser::screenshot(&url, &shot, &opts))
            .await
            .unwrap()
            .unwrap();
    }
    let browser::ColourStats {
        matching: ready_pixels,
        distinct: colours,
        size,
    } = browser::colour_stats(&shot, READY_RGB).unwrap();
    assert_eq!(size, opts.window, "screenshot size");
    assert!(
        colours > 10,
        "the screenshot is (nearly) blank: {colours} colours"
    );
    // Three Ready badges (two proxies, one target), each well over 100 pixels.
    assert!(
        ready_pixels > 300,
        "the Ready badge colour #{:02x}{:02x}{:02x} covers only {ready_pixels} pixels",
        READY_RGB[0],
        READY_RGB[1],
        READY_RGB[2]
    );
    if let Some(dir) = std::env::var_os("STATUS_PAGE_SCREENSHOT") {
        let _ = std::fs::copy(&shot, std::path::Path::new(&dir));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_auth_on_no_data_without_a_token() {
    let env = start(true).await;
    // The page itself carries no cluster data.
    let page = support::http::get(env.addr, "/status", None).await;
    assert_eq!(page.status, 200);
    assert!(
        page.headers["content-type"]
            .to_str()
            .unwrap()
            .starts_with("text/html")
    );
    let csp = page.headers["content-security-policy"].to_str().unwrap();
    assert!(
        csp.contains("default-src 'none'") && csp.contains("script-src 'sha256-"),
        "{csp}"
    );
    for secret in ["web-a", "203.0.113", "fsn1"] {
        assert!(
            !page.body.contains(secret),
            "the public page shows {secret}"
        );
    }
    // The content needs a token that may list proxies everywhere.
    let none = support::http::get(env.addr, "/status/fragment", None).await;
    assert_eq!(none.status, 401, "{none:?}");
    assert!(!none.body.contains("203.0.113"));
    let bad =
        support::http::get(env.addr, "/status/fragment", Some("wrong-token-0123456789")).await;
    assert_eq!(bad.status, 401, "{bad:?}");
    let ok = support::http::get(env.addr, "/status/fragment", Some(TOKEN)).await;
    assert_eq!(ok.status, 200, "{ok:?}");
    check_dom(&ok.body);

    // In the browser: without a token the form shows and no data; with the token in the
    // URL fragment the script fetches and shows everything.
    if !chromium_or_skip() {
        return;
    }
    let base = format!("http://{}/status", env.addr);
    let opts = Options::default();
    let (dom_without, dom_with) = tokio::task::spawn_blocking(move || {
        (
            browser::dump_dom(&base, &opts).unwrap(),
            browser::dump_dom(&format!("{base}#token={TOKEN}"), &opts).unwrap(),
        )
    })
    .await
    .unwrap();
    assert!(!dom_without.contains("203.0.113"), "{dom_without}");
    assert!(dom_without.contains("HTTP 401"), "{dom_without}");
    check_dom(&dom_with);
}
