//! Tests through real HTTP, the way a plugin sees the emulator.

use super::*;
use crate::control::{Emulator, Fault, FaultKind, FaultOp, Plant};
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper_util::rt::TokioIo;
use serde_json::{Value, json};

const KEY: &str = "scw-emulator-test-key";
const Z: &str = "/instance/v1/zones/fr-par-1";

struct Resp {
    status: u16,
    headers: axum::http::HeaderMap,
    body: Value,
    text: String,
}

impl Resp {
    fn kind(&self) -> &str {
        self.body["type"].as_str().unwrap_or("")
    }
}

async fn call(
    emu: &ScalewayEmulator,
    method: &str,
    path: &str,
    key: Option<&str>,
    body: &str,
    ctype: &str,
) -> Resp {
    let stream = tokio::net::TcpStream::connect(emu.addr()).await.unwrap();
    let (mut sender, conn) =
        hyper::client::conn::http1::handshake(TokioIo::new(stream)).await.unwrap();
    tokio::spawn(conn);
    let mut req = hyper::Request::builder()
        .method(method)
        .uri(path)
        .header("host", "api.scaleway.com")
        .header("content-type", ctype);
    if let Some(k) = key {
        req = req.header("x-auth-token", k);
    }
    let resp = sender
        .send_request(req.body(Full::new(Bytes::from(body.to_string()))).unwrap())
        .await
        .unwrap();
    let (status, headers) = (resp.status().as_u16(), resp.headers().clone());
    let bytes = resp.into_body().collect().await.unwrap().to_bytes();
    let text = String::from_utf8_lossy(&bytes).into_owned();
    Resp { status, headers, body: serde_json::from_slice(&bytes).unwrap_or(Value::Null), text }
}

async fn api(emu: &ScalewayEmulator, method: &str, path: &str, body: Value) -> Resp {
    let body = if body.is_null() { String::new() } else { body.to_string() };
    call(emu, method, &format!("{Z}{path}"), Some(KEY), &body, "application/json").await
}

async fn new_ip(emu: &ScalewayEmulator, tags: Value) -> String {
    let r = api(
        emu,
        "POST",
        "/ips",
        json!({"project": EMULATOR_PROJECT, "type": "routed_ipv4", "tags": tags}),
    )
    .await;
    assert_eq!(r.status, 201, "{}", r.text);
    assert_eq!(r.body["ip"]["state"], "detached");
    r.body["ip"]["id"].as_str().unwrap().to_string()
}

async fn new_server(emu: &ScalewayEmulator, name: &str, ip: Option<&str>) -> Value {
    let body = json!({"name": name, "project": EMULATOR_PROJECT, "commercial_type": "DEV1-S", "image": "ubuntu_noble",
                      "tags": ["egress.proxy-operator.dev/managed=true", "plain"], "public_ips": ip.into_iter().collect::<Vec<_>>(),
                      "dynamic_ip_required": false});
    let r = api(emu, "POST", "/servers", body).await;
    assert_eq!(r.status, 201, "{}", r.text);
    r.body["server"].clone()
}

#[tokio::test]
async fn created_stopped_then_powered_on_with_user_data() {
    let emu = ScalewayEmulator::start(ScalewayConfig::new(KEY));
    let ip = new_ip(&emu, json!(["t=1"])).await;
    let s = new_server(&emu, "proxy-a", Some(&ip)).await;
    let id = s["id"].as_str().unwrap();
    assert_eq!(s["state"], "stopped", "created powered off");
    assert_eq!(s["public_ips"][0]["id"], ip.as_str());
    assert_eq!(s["tags"], json!(["egress.proxy-operator.dev/managed=true", "plain"]));
    assert!(s["creation_date"].as_str().unwrap().ends_with(".000000+00:00"));
    assert_eq!(emu.ips()[0].server.as_deref(), Some(id));

    let path = format!("{Z}/servers/{id}/user_data/cloud-init");
    let r = call(&emu, "PATCH", &path, Some(KEY), "#cloud-config\n", "text/plain").await;
    assert_eq!(r.status, 204, "{}", r.text);
    let r = call(&emu, "GET", &path, Some(KEY), "", "text/plain").await;
    assert_eq!((r.status, r.text.as_str()), (200, "#cloud-config\n"));

    let r = api(&emu, "POST", &format!("/servers/{id}/action"), json!({"action": "poweron"})).await;
    assert_eq!((r.status, r.body["task"]["status"].as_str()), (202, Some("pending")));
    let r = api(&emu, "POST", &format!("/servers/{id}/action"), json!({"action": "poweron"})).await;
    assert_eq!(
        (r.status, r.kind(), r.body["message"].as_str()),
        (412, "precondition_failed", Some("server should be stopped"))
    );
    let first = api(&emu, "GET", &format!("/servers/{id}"), Value::Null).await;
    assert_eq!(first.body["server"]["state"], "starting");
    let second = api(&emu, "GET", &format!("/servers/{id}"), Value::Null).await;
    assert_eq!(second.body["server"]["state"], "running");
    assert_eq!(second.body["server"]["public_ips"][0]["address"], emu.ips()[0].address.as_str());
    assert_eq!(emu.dump().instances[0].user_data, b"#cloud-config\n");

    // Another zone does not show it.
    let r = call(
        &emu,
        "GET",
        &format!("/instance/v1/zones/nl-ams-1/servers/{id}"),
        Some(KEY),
        "",
        "application/json",
    )
    .await;
    assert_eq!(
        (r.status, r.kind(), r.body["resource"].as_str()),
        (404, "not_found", Some("instance_server"))
    );
}

#[tokio::test]
async fn deletes_keep_ips_and_volumes_unless_released() {
    let emu = ScalewayEmulator::start(ScalewayConfig::new(KEY));
    // Running: DELETE is refused as the real API refuses it; terminate takes the volume.
    let ip = new_ip(&emu, json!([])).await;
    let id = new_server(&emu, "a", Some(&ip)).await["id"].as_str().unwrap().to_string();
    api(&emu, "POST", &format!("/servers/{id}/action"), json!({"action": "poweron"})).await;
    let r = api(&emu, "DELETE", &format!("/servers/{id}"), Value::Null).await;
    assert_eq!(
        (r.status, r.kind(), r.body["message"].as_str()),
        (400, "invalid_request_error", Some("instance should be powered off"))
    );
    let r =
        api(&emu, "POST", &format!("/servers/{id}/action"), json!({"action": "terminate"})).await;
    assert_eq!(r.status, 202, "{}", r.text);
    assert!(emu.dump().instances.is_empty() && emu.volumes().is_empty());
    let left = emu.ips();
    assert_eq!(
        (left.len(), left[0].server.clone()),
        (1, None),
        "the flexible IP outlives its server"
    );
    assert_eq!(emu.dump().secondary.len(), 1, "and the dump shows the leak");
    assert_eq!(api(&emu, "DELETE", &format!("/ips/{ip}"), Value::Null).await.status, 204);
    assert_eq!(api(&emu, "DELETE", &format!("/ips/{ip}"), Value::Null).await.status, 404);

    // Stopped: DELETE works and keeps the local volume, which can then be deleted.
    let id = new_server(&emu, "b", None).await["id"].as_str().unwrap().to_string();
    let vol = emu.volumes()[0].clone();
    let r = api(&emu, "DELETE", &format!("/volumes/{vol}"), Value::Null).await;
    assert_eq!((r.status, r.kind()), (400, "invalid_request_error"), "attached");
    let r =
        api(&emu, "POST", &format!("/servers/{id}/action"), json!({"action": "terminate"})).await;
    assert_eq!(r.status, 400, "terminate needs a running server");
    assert_eq!(api(&emu, "DELETE", &format!("/servers/{id}"), Value::Null).await.status, 204);
    assert_eq!(
        emu.dump().secondary,
        vec![crate::control::DumpSecondary {
            kind: "volume".into(),
            id: vol.clone(),
            attached_to: None
        }]
    );
    assert_eq!(api(&emu, "DELETE", &format!("/volumes/{vol}"), Value::Null).await.status, 204);
    assert!(emu.dump().secondary.is_empty());

    // Releasing an attached IP detaches it from its server first.
    let ip = new_ip(&emu, json!([])).await;
    let id = new_server(&emu, "c", Some(&ip)).await["id"].as_str().unwrap().to_string();
    assert_eq!(api(&emu, "DELETE", &format!("/ips/{ip}"), Value::Null).await.status, 204);
    assert_eq!(emu.server(&id).unwrap()["public_ips"], json!([]));
}

#[tokio::test]
async fn names_are_not_unique_and_lists_page() {
    let emu = ScalewayEmulator::start(ScalewayConfig::new(KEY));
    new_server(&emu, "proxy-a", None).await;
    new_server(&emu, "proxy-a", None).await;
    new_server(&emu, "proxy-ab", None).await;
    for n in 0..5 {
        emu.plant(Plant {
            name: format!("p{n}"),
            scope: "fr-par-1".into(),
            managed: false,
            ..Plant::default()
        });
    }
    let r = api(&emu, "GET", "/servers?name=proxy-a", Value::Null).await;
    assert_eq!(r.body["servers"].as_array().unwrap().len(), 3, "substring match, duplicates kept");
    let r = api(&emu, "GET", "/servers?per_page=3&page=2", Value::Null).await;
    assert_eq!(r.body["servers"].as_array().unwrap().len(), 3);
    assert_eq!(r.headers["x-total-count"], "8");
    assert!(r.headers["link"].to_str().unwrap().contains("page=3&per_page=3>; rel=\"next\""));
    let r = api(&emu, "GET", "/servers?per_page=3&page=3", Value::Null).await;
    assert_eq!(r.body["servers"].as_array().unwrap().len(), 2);
    let tagged = api(
        &emu,
        "GET",
        "/servers?tags=egress.proxy-operator.dev%2Fmanaged%3Dtrue,plain",
        Value::Null,
    )
    .await;
    assert_eq!(tagged.body["total_count"], 3);
    for bad in ["per_page=101", "per_page=0", "page=0", "page=x"] {
        let r = api(&emu, "GET", &format!("/servers?{bad}"), Value::Null).await;
        assert_eq!((r.status, r.kind()), (400, "invalid_arguments"), "{bad}");
    }
    let r =
        call(&emu, "GET", "/instance/v1/zones/xx-yyy-9/servers", Some(KEY), "", "application/json")
            .await;
    assert_eq!(r.status, 400);
}

#[tokio::test]
async fn auth_faults_locks_scopes_and_rate_limit() {
    let emu = ScalewayEmulator::start(ScalewayConfig::new(KEY));
    let r = call(&emu, "GET", &format!("{Z}/servers"), None, "", "application/json").await;
    assert_eq!((r.status, r.kind()), (401, "denied_authentication"));
    let r = call(&emu, "GET", &format!("{Z}/servers"), Some("wrong"), "", "application/json").await;
    assert_eq!(r.status, 401);
    let bad_project = json!({"name": "x", "project": "other", "commercial_type": "DEV1-S", "image": "ubuntu_noble"});
    assert_eq!(api(&emu, "POST", "/servers", bad_project).await.kind(), "permissions_denied");
    let bad_type = json!({"name": "x", "project": EMULATOR_PROJECT, "commercial_type": "GP9", "image": "ubuntu_noble"});
    assert_eq!(api(&emu, "POST", "/servers", bad_type).await.kind(), "invalid_arguments");
    let bad_image = json!({"name": "x", "project": EMULATOR_PROJECT, "commercial_type": "DEV1-S", "image": "nope"});
    assert_eq!(api(&emu, "POST", "/servers", bad_image).await.status, 404);

    for (kind, status, code) in [
        (FaultKind::Quota, 403, "quotas_exceeded"),
        (FaultKind::RateLimit, 429, "too_many_requests"),
        (FaultKind::Auth, 401, "denied_authentication"),
        (FaultKind::ServerError, 500, "internal_error"),
    ] {
        emu.inject(Fault { op: FaultOp::Create, kind, count: 1 });
        let r = api(&emu, "POST", "/ips", json!({"project": EMULATOR_PROJECT})).await;
        assert_eq!((r.status, r.kind()), (status, code));
        if status == 429 {
            assert_eq!(r.headers["retry-after"], "1");
        }
    }
    assert!(emu.ips().is_empty(), "faulted creates create nothing");

    let id = new_server(&emu, "a", None).await["id"].as_str().unwrap().to_string();
    assert!(emu.set_locked(&id, true));
    assert_eq!(
        api(&emu, "GET", &format!("/servers/{id}"), Value::Null).await.body["server"]["state"],
        "locked"
    );
    let r = api(&emu, "POST", &format!("/servers/{id}/action"), json!({"action": "poweron"})).await;
    assert_eq!((r.status, r.kind()), (409, "locked"));
    assert!(emu.set_locked(&id, false));

    emu.fail_scope("fr-par-1", true);
    assert_eq!(api(&emu, "GET", "/servers", Value::Null).await.status, 503);
    emu.fail_scope("fr-par-1", false);

    emu.set_rate_limit(Some(RateLimit { per_hour: 3600, burst: 1 }));
    assert_eq!(api(&emu, "GET", "/servers", Value::Null).await.status, 200);
    let r = api(&emu, "GET", "/servers", Value::Null).await;
    assert_eq!((r.status, r.kind()), (429, "too_many_requests"));
    // The injected rate-limit fault above counts too.
    assert_eq!(emu.stats().rate_limited, 2);
    emu.set_rate_limit(None);

    emu.reset();
    let dump = emu.dump();
    assert!(
        dump.instances.is_empty() && dump.secondary.is_empty(),
        "reset forgets IPs and volumes too"
    );
}

/// `GET /products/servers` as `ListServersTypes` reads it: a map of the zone's commercial
/// types with the configured `hourly_price` exactly, `total_count` and `X-Total-Count`,
/// pages from 1; a type the zone does not sell is absent.
#[tokio::test]
async fn the_catalogue_maps_commercial_types_to_prices() {
    let mut cfg = ScalewayConfig::new(KEY);
    cfg.catalogue = vec![
        ServerTypeOffer::new("PRO2-XXS", 0.055, &["fr-par-1"]),
        ServerTypeOffer::new("DEV1-S", 0.0105, &["fr-par-1", "nl-ams-1"]),
        ServerTypeOffer::new("GP1-XS", 0.091, &["nl-ams-1"]),
    ];
    let emu = ScalewayEmulator::start(cfg);
    let all = api(&emu, "GET", "/products/servers", Value::Null).await;
    assert_eq!(all.status, 200, "{}", all.text);
    assert_eq!(all.body["total_count"], 2);
    assert_eq!(all.headers["x-total-count"], "2");
    let names: Vec<&String> = all.body["servers"].as_object().unwrap().keys().collect();
    assert_eq!(names, ["DEV1-S", "PRO2-XXS"]);
    let dev1 = &all.body["servers"]["DEV1-S"];
    assert_eq!(dev1["hourly_price"].as_f64(), Some(0.0105));
    for k in [
        "monthly_price",
        "alt_names",
        "ncpus",
        "ram",
        "arch",
        "volumes_constraint",
        "end_of_service",
    ] {
        assert!(dev1.get(k).is_some(), "{k}: {dev1}");
    }

    let p2 = api(&emu, "GET", "/products/servers?per_page=1&page=2", Value::Null).await;
    let names: Vec<&str> =
        p2.body["servers"].as_object().unwrap().keys().map(String::as_str).collect();
    assert_eq!((names, p2.body["total_count"].as_u64()), (vec!["PRO2-XXS"], Some(2)));
    assert!(!p2.headers["link"].to_str().unwrap().contains("rel=\"next\""));
    let ams =
        call(&emu, "GET", "/instance/v1/zones/nl-ams-1/products/servers", Some(KEY), "", "").await;
    assert_eq!(ams.body["servers"]["GP1-XS"]["hourly_price"].as_f64(), Some(0.091));
    assert!(ams.body["servers"].get("PRO2-XXS").is_none());
    let bad = api(&emu, "GET", "/products/servers?per_page=101", Value::Null).await;
    assert_eq!((bad.status, bad.kind()), (400, "invalid_arguments"));
    let unknown =
        call(&emu, "GET", "/instance/v1/zones/xx-nope-9/products/servers", Some(KEY), "", "").await;
    assert_eq!(unknown.status, 400, "{}", unknown.text);
    let anonymous = call(&emu, "GET", &format!("{Z}/products/servers"), None, "", "").await;
    assert_eq!(anonymous.status, 401);
}
