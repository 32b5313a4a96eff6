//! Tests through real HTTP, the way a plugin sees the emulator.

use super::*;
use crate::control::{Dump, Emulator, Fault, FaultKind, FaultOp, Plant};
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper_util::rt::TokioIo;
use serde_json::{Value, json};
use std::sync::Mutex;
use std::time::Instant;

const TOKEN: &str = "hcloud-test-token";
const MANAGED: &str = crate::MARK_MANAGED;
const UID: &str = crate::MARK_UID;

struct Resp {
    status: u16,
    headers: axum::http::HeaderMap,
    body: Value,
}

impl Resp {
    fn code(&self) -> &str {
        self.body["error"]["code"].as_str().unwrap_or("")
    }
}

async fn raw(
    emu: &HetznerEmulator,
    method: &str,
    path: &str,
    token: Option<&str>,
    body: &str,
) -> Resp {
    let stream = tokio::net::TcpStream::connect(emu.addr()).await.unwrap();
    let (mut sender, conn) =
        hyper::client::conn::http1::handshake(TokioIo::new(stream)).await.unwrap();
    tokio::spawn(conn);
    let mut req = hyper::Request::builder()
        .method(method)
        .uri(path)
        .header("host", "api.hetzner.cloud")
        .header("content-type", "application/json");
    if let Some(t) = token {
        req = req.header("authorization", format!("Bearer {t}"));
    }
    let req = req.body(Full::new(Bytes::from(body.to_string()))).unwrap();
    let resp = sender.send_request(req).await.unwrap();
    let status = resp.status().as_u16();
    let headers = resp.headers().clone();
    let bytes = resp.into_body().collect().await.unwrap().to_bytes();
    let body = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
    Resp { status, headers, body }
}

async fn api(emu: &HetznerEmulator, method: &str, path: &str, body: Option<Value>) -> Resp {
    let body = body.map(|b| b.to_string()).unwrap_or_default();
    raw(emu, method, path, Some(TOKEN), &body).await
}

async fn get(emu: &HetznerEmulator, path: &str) -> Resp {
    api(emu, "GET", path, None).await
}

fn start() -> HetznerEmulator {
    HetznerEmulator::start(HetznerConfig::new(TOKEN))
}

fn body(name: &str, labels: Value) -> Value {
    json!({
        "name": name, "server_type": "cpx11", "image": "ubuntu-24.04", "location": "fsn1",
        "labels": labels, "user_data": "#cloud-config\nruncmd: [echo hi]\n",
    })
}

async fn create(emu: &HetznerEmulator, name: &str, labels: Value) -> Resp {
    api(emu, "POST", "/v1/servers", Some(body(name, labels))).await
}

/// Create and return the server ID as a string.
async fn create_id(emu: &HetznerEmulator, name: &str, labels: Value) -> String {
    let r = create(emu, name, labels).await;
    assert_eq!(r.status, 201, "{}", r.body);
    r.body["server"]["id"].as_u64().unwrap().to_string()
}

fn names(r: &Resp) -> Vec<String> {
    r.body["servers"]
        .as_array()
        .unwrap_or_else(|| panic!("no servers in {}", r.body))
        .iter()
        .map(|s| s["name"].as_str().unwrap().to_string())
        .collect()
}

fn plant(emu: &HetznerEmulator, name: &str, scope: &str) -> String {
    emu.plant(Plant {
        name: name.into(),
        scope: scope.into(),
        managed: true,
        uid: Some(format!("uid-{name}")),
        installation: Some("inst".into()),
        created_at: None,
    })
}

#[tokio::test]
async fn bearer_token_is_required() {
    let emu = start();
    for token in [None, Some("wrong")] {
        let r = raw(&emu, "GET", "/v1/servers", token, "").await;
        assert_eq!(r.status, 401);
        assert_eq!(r.body["error"]["code"], "unauthorized");
        assert_eq!(r.body["error"]["message"], "unable to authenticate");
        assert!(r.body["error"].get("details").is_some());
    }
    // Authentication comes before routing, as on the real API.
    assert_eq!(raw(&emu, "GET", "/v1/nothing", None, "").await.status, 401);
    let r = get(&emu, "/v1/servers").await;
    assert_eq!(r.status, 200);
    assert_eq!(r.headers["ratelimit-limit"], "3600");
    assert!(r.headers.contains_key("ratelimit-remaining"));
    assert!(r.headers.contains_key("ratelimit-reset"));
    // The control surface needs no token.
    assert_eq!(raw(&emu, "GET", "/_emulator/dump", None, "").await.status, 200);
}

#[tokio::test]
async fn unknown_routes_and_methods_answer_in_hetzner_shape() {
    let emu = start();
    let r = get(&emu, "/v1/nothing").await;
    assert_eq!((r.status, r.code()), (404, "not_found"));
    let r = api(&emu, "PATCH", "/v1/servers", None).await;
    assert_eq!((r.status, r.code()), (405, "method_not_allowed"));
    let r = get(&emu, "/v1/servers/not-a-number").await;
    assert_eq!((r.status, r.code()), (404, "not_found"));
}

#[tokio::test]
async fn create_get_list_delete_lifecycle() {
    let emu = start();
    let labels = json!({MANAGED: "true", UID: "3f6c5a4e-1b2c-4d5e-8f90-a1b2c3d4e5f6"});
    let r = create(&emu, "proxy-abc", labels.clone()).await;
    assert_eq!(r.status, 201, "{}", r.body);
    let server = &r.body["server"];
    let id = server["id"].as_u64().unwrap();
    assert_eq!(server["name"], "proxy-abc");
    assert_eq!(server["status"], "initializing");
    assert_eq!(server["labels"], labels);
    assert_eq!(server["server_type"]["name"], "cpx11");
    assert_eq!(server["image"]["name"], "ubuntu-24.04");
    assert_eq!(server["location"]["name"], "fsn1");
    assert_eq!(server["locked"], false);
    let created = server["created"].as_str().unwrap();
    assert!(created.ends_with("+00:00"), "{created}");
    assert!(crate::time::parse_rfc3339(created).is_some());
    // The address is there before the server runs, as on Hetzner.
    let ip = server["public_net"]["ipv4"]["ip"].as_str().unwrap().to_string();
    let ipv4_id = server["public_net"]["ipv4"]["id"].as_u64().unwrap();
    assert!(ip.parse::<std::net::Ipv4Addr>().is_ok());
    assert!(server["public_net"]["ipv6"]["ip"].as_str().unwrap().ends_with("::/64"));
    let action = &r.body["action"];
    assert_eq!(
        (action["command"].as_str(), action["status"].as_str()),
        (Some("create_server"), Some("running"))
    );
    assert_eq!(action["resources"], json!([{"id": id, "type": "server"}]));
    assert_eq!(action["finished"], Value::Null);
    let next = &r.body["next_actions"][0];
    assert_eq!(next["command"], "start_server");
    assert_eq!(r.body["root_password"].as_str().unwrap().len(), 20);
    let create_action = action["id"].as_u64().unwrap();
    let start_action = next["id"].as_u64().unwrap();

    // The Primary IPs are resources of their own, deleted with the server.
    let ips = get(&emu, "/v1/primary_ips").await;
    assert_eq!(ips.status, 200);
    let list = ips.body["primary_ips"].as_array().unwrap();
    assert_eq!(list.len(), 2);
    let v4 = list.iter().find(|i| i["type"] == "ipv4").unwrap();
    assert_eq!(v4["id"], ipv4_id);
    assert_eq!(v4["ip"], ip.as_str());
    assert_eq!(v4["auto_delete"], true);
    assert_eq!(v4["assignee_type"], "server");
    assert_eq!(v4["assignee_id"], id);
    assert_eq!(v4["name"], format!("primary_ip-{ipv4_id}"));
    let by_ip = get(&emu, &format!("/v1/primary_ips?ip={ip}")).await;
    assert_eq!(by_ip.body["primary_ips"].as_array().unwrap().len(), 1);
    assert_eq!(
        get(&emu, &format!("/v1/primary_ips/{ipv4_id}")).await.body["primary_ip"]["ip"],
        ip.as_str()
    );

    // First read sees initializing, the next one running.
    let path = format!("/v1/servers/{id}");
    assert_eq!(get(&emu, &path).await.body["server"]["status"], "initializing");
    let r = get(&emu, &path).await;
    assert_eq!(r.body["server"]["status"], "running");
    assert_eq!(r.body["server"]["public_net"]["ipv4"]["ip"], ip.as_str());
    let a = get(&emu, &format!("/v1/actions/{create_action}")).await;
    assert_eq!(a.body["action"]["status"], "success");
    assert_eq!(a.body["action"]["progress"], 100);
    assert!(a.body["action"]["finished"].is_string());
    let a = get(&emu, &format!("/v1/servers/{id}/actions/{start_action}")).await;
    assert_eq!(a.body["action"]["status"], "success");
    // An action of another resource is not found under this server.
    assert_eq!(
        get(&emu, &format!("/v1/servers/{}/actions/{start_action}", id + 1)).await.status,
        404
    );
    assert_eq!(get(&emu, "/v1/actions/1").await.code(), "not_found");

    let r = get(&emu, "/v1/servers?name=proxy-abc").await;
    assert_eq!(names(&r), ["proxy-abc"]);
    assert!(names(&get(&emu, "/v1/servers?name=proxy-ab").await).is_empty());

    let r = api(&emu, "DELETE", &path, None).await;
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(r.body["action"]["command"], "delete_server");
    assert_eq!(r.body["action"]["status"], "running");
    let delete_action = r.body["action"]["id"].as_u64().unwrap();
    let r = get(&emu, &path).await;
    assert_eq!((r.status, r.code()), (404, "not_found"));
    assert_eq!(
        get(&emu, &format!("/v1/actions/{delete_action}")).await.body["action"]["status"],
        "success"
    );
    assert!(get(&emu, "/v1/primary_ips").await.body["primary_ips"].as_array().unwrap().is_empty());
    assert_eq!(api(&emu, "DELETE", &path, None).await.code(), "not_found");
    assert_eq!(emu.dump(), Dump::default());
}

#[tokio::test]
async fn duplicate_names_are_a_uniqueness_error_even_while_deleting() {
    let emu = start();
    let id = create_id(&emu, "proxy-a", json!({})).await;
    let r = create(&emu, "proxy-a", json!({})).await;
    assert_eq!((r.status, r.code()), (409, "uniqueness_error"));
    assert_eq!(r.body["error"]["message"], "server name is already used");
    assert_eq!(r.body["error"]["details"]["fields"][0]["name"], "name");
    emu.start_slow_delete(&id);
    assert_eq!(create(&emu, "proxy-a", json!({})).await.code(), "uniqueness_error");
    emu.finish_deletes();
    assert_eq!(create(&emu, "proxy-a", json!({})).await.status, 201);
}

#[tokio::test]
async fn create_validation_answers_as_hetzner_does() {
    let mut cfg = HetznerConfig::new(TOKEN);
    cfg.locations[5].available = false; // sin
    cfg.server_limit = Some(1);
    let emu = HetznerEmulator::start(cfg);
    let post = |b: Value| api(&emu, "POST", "/v1/servers", Some(b));

    let r = raw(&emu, "POST", "/v1/servers", Some(TOKEN), "{not json").await;
    assert_eq!((r.status, r.code()), (400, "json_error"));

    let r = post(json!({"labels": "x"})).await;
    assert_eq!((r.status, r.code()), (422, "invalid_input"));
    let fields: Vec<&str> = r.body["error"]["details"]["fields"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| f["name"].as_str().unwrap())
        .collect();
    for f in ["name", "server_type", "image", "labels"] {
        assert!(fields.contains(&f), "{f} missing from {fields:?}");
    }

    let base = body("proxy-v", json!({}));
    let with = |k: &str, v: Value| {
        let mut b = base.clone();
        b[k] = v;
        b
    };
    let cases: Vec<(Value, u16, &str, &str)> = vec![
        (with("server_type", json!("cx99")), 422, "invalid_input", "server type not found"),
        (with("image", json!("templeos")), 422, "invalid_input", "image not found"),
        (with("location", json!("mars1")), 422, "invalid_input", "location not found"),
        (
            json!({"name": "proxy-v", "server_type": "cx23", "image": "ubuntu-24.04", "location": "ash"}),
            422,
            "invalid_input",
            "unsupported location for server type",
        ),
        (with("location", json!("sin")), 412, "resource_unavailable", "server location disabled"),
        (
            with("name", json!("not a hostname")),
            422,
            "invalid_input",
            "invalid input in field 'name': is not a valid hostname",
        ),
        (
            with("name", json!("-bad")),
            422,
            "invalid_input",
            "invalid input in field 'name': is not a valid hostname",
        ),
        (with("labels", json!({"hetzner.cloud/x": "y"})), 422, "invalid_input", ""),
        (with("labels", json!({"k": "-v"})), 422, "invalid_input", ""),
        (with("labels", json!({"k": 1})), 422, "invalid_input", ""),
        (
            with("user_data", json!("x".repeat(32 * 1024 + 1))),
            422,
            "invalid_input",
            "invalid input in field 'user_data': is too long",
        ),
        (with("start_after_create", json!("yes")), 422, "invalid_input", ""),
        (
            with("datacenter", json!("fsn1-dc14")),
            422,
            "invalid_input",
            "invalid input in fields 'location', 'datacenter'",
        ),
    ];
    for (b, status, code, message) in cases {
        let r = post(b.clone()).await;
        assert_eq!((r.status, r.code()), (status, code), "{b} -> {}", r.body);
        if !message.is_empty() {
            assert_eq!(r.body["error"]["message"], message, "{b}");
        }
    }
    assert!(emu.dump().instances.is_empty());

    // IDs work where names do; no location means the default one.
    let r = post(json!({"name": "proxy-ok", "server_type": 1, "image": "161547269"})).await;
    assert_eq!(r.status, 201, "{}", r.body);
    assert_eq!(r.body["server"]["location"]["name"], "fsn1");
    let r = post(with("name", json!("proxy-two"))).await;
    assert_eq!((r.status, r.code()), (403, "resource_limit_exceeded"));
    assert_eq!(r.body["error"]["details"]["limits"][0]["name"], "server_limit");
}

#[tokio::test]
async fn datacenter_ssh_keys_and_dns_prefixed_labels_are_accepted() {
    let emu = start();
    let b = json!({
        "name": "proxy-dc", "server_type": "cpx11", "image": "debian-12", "datacenter": "hel1-dc2",
        "ssh_keys": ["me"], "labels": {MANAGED: "true", UID: "", "example.com/my": "label"},
    });
    let r = api(&emu, "POST", "/v1/servers", Some(b)).await;
    assert_eq!(r.status, 201, "{}", r.body);
    assert_eq!(r.body["server"]["location"]["name"], "hel1", "the datacenter's location");
    assert_eq!(r.body["server"]["labels"][UID], "");
    assert_eq!(r.body["root_password"], Value::Null);
}

#[tokio::test]
async fn label_selectors() {
    let emu = start();
    for (name, labels) in [
        ("a", json!({MANAGED: "true", UID: "u1", "env": "prod"})),
        ("b", json!({MANAGED: "true", UID: "u2", "env": "dev"})),
        ("c", json!({MANAGED: "false", "env": "prod"})),
        ("d", json!({})),
    ] {
        create_id(&emu, name, labels).await;
    }
    let m = MANAGED;
    let table: Vec<(String, Vec<&str>)> = vec![
        (format!("{m}=true"), vec!["a", "b"]),
        (format!("{m}==true"), vec!["a", "b"]),
        (format!("{m}!=true"), vec!["c", "d"]),
        (m.to_string(), vec!["a", "b", "c"]),
        (format!("!{m}"), vec!["d"]),
        (UID.to_string(), vec!["a", "b"]),
        ("env in (prod,dev)".into(), vec!["a", "b", "c"]),
        ("env in ( dev )".into(), vec!["b"]),
        ("env notin (prod)".into(), vec!["b", "d"]),
        (format!("{m}=true,env=prod"), vec!["a"]),
        (format!("{m}=true, env notin (prod,staging)"), vec!["b"]),
        (format!("env,!{UID}"), vec!["c"]),
        ("env=staging".into(), vec![]),
        ("".into(), vec!["a", "b", "c", "d"]),
    ];
    for (selector, want) in table {
        let q = encode_query(&selector);
        let r = get(&emu, &format!("/v1/servers?label_selector={q}")).await;
        assert_eq!(r.status, 200, "{selector}: {}", r.body);
        assert_eq!(names(&r), want, "{selector}");
    }
    for bad in ["env in (a", "env ~ x", "a=b,", "hetzner.cloud/x"] {
        let r = get(&emu, &format!("/v1/servers?label_selector={}", encode_query(bad))).await;
        assert_eq!((r.status, r.code()), (422, "invalid_input"), "{bad}");
        assert_eq!(r.body["error"]["details"]["fields"][0]["name"], "label_selector");
    }
}

fn encode_query(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'a'..=b'z' | b'A'..=b'Z' | b'0'..=b'9' | b'-' | b'_' | b'.' => (b as char).to_string(),
            _ => format!("%{b:02X}"),
        })
        .collect()
}

#[tokio::test]
async fn pagination_follows_the_reference() {
    let emu = start();
    for i in 0..60 {
        plant(&emu, &format!("p{i:02}"), "");
    }
    let page = |q: &'static str| get(&emu, q);

    let r = page("/v1/servers").await;
    let meta = &r.body["meta"]["pagination"];
    assert_eq!(names(&r).len(), 25);
    assert_eq!(
        meta,
        &json!({"page": 1, "per_page": 25, "previous_page": null, "next_page": 2, "last_page": 3, "total_entries": 60})
    );
    let link = r.headers["link"].to_str().unwrap();
    assert!(link.contains("page=2&per_page=25>; rel=\"next\""), "{link}");
    assert!(link.contains("page=3&per_page=25>; rel=\"last\""), "{link}");
    assert!(!link.contains("rel=\"prev\""), "{link}");

    let r = page("/v1/servers?page=2&per_page=50").await;
    assert_eq!(names(&r).len(), 10);
    assert_eq!(names(&r)[0], "p50");
    assert_eq!(
        r.body["meta"]["pagination"],
        json!({"page": 2, "per_page": 50, "previous_page": 1, "next_page": null, "last_page": 2, "total_entries": 60})
    );
    assert!(r.headers["link"].to_str().unwrap().contains("rel=\"prev\""));

    let r = page("/v1/servers?per_page=500").await;
    assert_eq!(r.body["meta"]["pagination"]["per_page"], 50);
    assert_eq!(names(&r).len(), 50);

    let r = page("/v1/servers?page=9").await;
    assert!(names(&r).is_empty());
    assert_eq!(r.body["meta"]["pagination"]["page"], 9);
    assert_eq!(r.body["meta"]["pagination"]["next_page"], Value::Null);

    // Walking next_page visits every server once.
    let mut seen = Vec::new();
    let mut p = 1;
    loop {
        let r = get(&emu, &format!("/v1/servers?per_page=7&page={p}")).await;
        seen.extend(names(&r));
        match r.body["meta"]["pagination"]["next_page"].as_u64() {
            Some(n) => p = n,
            None => break,
        }
    }
    let want: Vec<String> = (0..60).map(|i| format!("p{i:02}")).collect();
    assert_eq!(seen, want);

    let r = page("/v1/servers?sort=name:desc&per_page=2").await;
    assert_eq!(names(&r), ["p59", "p58"]);
    for bad in [
        "/v1/servers?page=0",
        "/v1/servers?per_page=x",
        "/v1/servers?sort=ip",
        "/v1/servers?status=up",
    ] {
        assert_eq!(page(bad).await.code(), "invalid_input", "{bad}");
    }
    let r = page("/v1/servers?status=running&per_page=1").await;
    assert_eq!(r.body["meta"]["pagination"]["total_entries"], 60);
}

#[tokio::test]
async fn each_fault_kind_answers_like_hetzner() {
    let emu = start();
    let id = create_id(&emu, "proxy-f", json!({})).await;
    let server = format!("/v1/servers/{id}");

    emu.inject(Fault { op: FaultOp::Create, kind: FaultKind::ServerError, count: 1 });
    let r = create(&emu, "proxy-g", json!({})).await;
    assert_eq!((r.status, r.code()), (500, "server_error"));
    assert_eq!(create(&emu, "proxy-g", json!({})).await.status, 201);

    emu.inject(Fault { op: FaultOp::Create, kind: FaultKind::Quota, count: 1 });
    let r = create(&emu, "proxy-h", json!({})).await;
    assert_eq!((r.status, r.code()), (403, "resource_limit_exceeded"));

    emu.inject(Fault { op: FaultOp::List, kind: FaultKind::RateLimit, count: 2 });
    // A fault for one operation leaves the others alone.
    assert_eq!(get(&emu, &server).await.status, 200);
    for _ in 0..2 {
        let r = get(&emu, "/v1/servers").await;
        assert_eq!((r.status, r.code()), (429, "rate_limit_exceeded"));
        assert_eq!(r.body["error"]["message"], "limit of 3600 requests per hour reached");
        assert_eq!(r.headers["ratelimit-remaining"], "0");
    }
    assert_eq!(get(&emu, "/v1/servers").await.status, 200);

    emu.inject(Fault { op: FaultOp::Get, kind: FaultKind::Auth, count: 1 });
    let r = get(&emu, &server).await;
    assert_eq!((r.status, r.code()), (401, "unauthorized"));

    emu.inject(Fault::slow(FaultOp::Delete, Duration::from_millis(200), 1));
    let t = Instant::now();
    let r = api(&emu, "DELETE", &server, None).await;
    assert_eq!(r.status, 200);
    assert!(t.elapsed() >= Duration::from_millis(200));

    emu.inject(Fault { op: FaultOp::Any, kind: FaultKind::ServerError, count: 2 });
    assert_eq!(get(&emu, "/v1/primary_ips").await.status, 500);
    assert_eq!(get(&emu, "/v1/actions/1").await.status, 500);
    assert_eq!(get(&emu, "/v1/actions/1").await.status, 404);

    emu.inject_error(
        FaultOp::Create,
        HetznerError::new(
            409,
            "conflict",
            "The resource has changed during the request, please retry",
        ),
        1,
    );
    assert_eq!(create(&emu, "proxy-i", json!({})).await.code(), "conflict");
    emu.inject_error(
        FaultOp::Delete,
        HetznerError::new(403, "forbidden", "insufficient permissions"),
        1,
    );
    let other = create_id(&emu, "proxy-j", json!({})).await;
    let r = api(&emu, "DELETE", &format!("/v1/servers/{other}"), None).await;
    assert_eq!((r.status, r.code()), (403, "forbidden"));

    // Over HTTP, in the shared control types' JSON.
    let f = json!({"op": "list", "kind": "server-error", "count": 1}).to_string();
    assert_eq!(raw(&emu, "POST", "/_emulator/faults", None, &f).await.status, 204);
    assert_eq!(get(&emu, "/v1/servers").await.status, 500);
    let e = json!({"op": "get", "status": 503, "code": "unavailable", "message": "m", "count": 1})
        .to_string();
    assert_eq!(raw(&emu, "POST", "/_emulator/errors", None, &e).await.status, 204);
    assert_eq!(get(&emu, &format!("/v1/servers/{other}")).await.code(), "unavailable");
}

#[tokio::test]
async fn slow_delete_keeps_the_server_visible_until_finished() {
    let emu = start();
    let id = create_id(&emu, "proxy-s", json!({MANAGED: "true"})).await;
    let path = format!("/v1/servers/{id}");
    emu.start_slow_delete(&id);
    for _ in 0..3 {
        let r = get(&emu, &path).await;
        assert_eq!(r.body["server"]["status"], "deleting");
    }
    assert_eq!(names(&get(&emu, "/v1/servers").await), ["proxy-s"]);
    let r = api(&emu, "DELETE", &path, None).await;
    assert_eq!((r.status, r.code()), (423, "locked"));
    let d = emu.dump();
    assert_eq!(d.instances[0].state, "deleting");
    assert_eq!(d.secondary.len(), 2);
    emu.finish_deletes();
    assert_eq!(get(&emu, &path).await.status, 404);
    assert_eq!(emu.dump(), Dump::default());
}

#[tokio::test]
async fn delete_schedules() {
    let mut cfg = HetznerConfig::new(TOKEN);
    cfg.delete_schedule = DeleteSchedule::AfterReads(2);
    let emu = HetznerEmulator::start(cfg);
    let id = create_id(&emu, "proxy-r", json!({})).await;
    let path = format!("/v1/servers/{id}");
    let action = api(&emu, "DELETE", &path, None).await.body["action"]["id"].as_u64().unwrap();
    assert_eq!(get(&emu, &path).await.body["server"]["status"], "deleting");
    assert_eq!(
        get(&emu, &format!("/v1/actions/{action}")).await.body["action"]["status"],
        "running"
    );
    assert_eq!(get(&emu, &path).await.body["server"]["status"], "deleting");
    assert_eq!(get(&emu, &path).await.status, 404);
    assert_eq!(
        get(&emu, &format!("/v1/actions/{action}")).await.body["action"]["status"],
        "success"
    );

    let mut cfg = HetznerConfig::new(TOKEN);
    cfg.delete_schedule = DeleteSchedule::Manual;
    let emu = HetznerEmulator::start(cfg);
    let id = create_id(&emu, "proxy-m", json!({})).await;
    let path = format!("/v1/servers/{id}");
    assert_eq!(api(&emu, "DELETE", &path, None).await.status, 200);
    assert_eq!(get(&emu, &path).await.body["server"]["status"], "deleting");
    emu.finish_deletes();
    assert_eq!(get(&emu, &path).await.status, 404);

    let mut cfg = HetznerConfig::new(TOKEN);
    cfg.delete_schedule = DeleteSchedule::After(Duration::from_millis(100));
    let emu = HetznerEmulator::start(cfg);
    let id = create_id(&emu, "proxy-t", json!({})).await;
    let path = format!("/v1/servers/{id}");
    api(&emu, "DELETE", &path, None).await;
    assert_eq!(get(&emu, &path).await.body["server"]["status"], "deleting");
    tokio::time::sleep(Duration::from_millis(150)).await;
    assert_eq!(get(&emu, &path).await.status, 404);
}

#[tokio::test]
async fn a_locked_server_refuses_deletes_but_reads() {
    let emu = start();
    let id = create_id(&emu, "proxy-l", json!({})).await;
    let path = format!("/v1/servers/{id}");
    emu.set_locked(&format!("fsn1/{id}"), true);
    let r = get(&emu, &path).await;
    assert_eq!((r.status, &r.body["server"]["locked"]), (200, &json!(true)));
    let r = api(&emu, "DELETE", &path, None).await;
    assert_eq!((r.status, r.code()), (423, "locked"));
    assert_eq!(emu.dump().instances.len(), 1);
    emu.set_locked(&id, false);
    assert_eq!(api(&emu, "DELETE", &path, None).await.status, 200);
}

#[tokio::test]
async fn planted_servers_carry_exactly_the_marks_asked_for() {
    let emu = start();
    let unmarked =
        emu.plant(Plant { name: "stranger".into(), managed: false, uid: None, ..Plant::default() });
    let empty_uid = emu.plant(Plant {
        name: "orphan".into(),
        scope: "hel1".into(),
        managed: true,
        uid: Some(String::new()),
        installation: None,
        created_at: Some(1_600_000_000),
    });
    let r = get(&emu, &format!("/v1/servers/{unmarked}")).await;
    assert_eq!(r.body["server"]["labels"], json!({}));
    assert_eq!(r.body["server"]["status"], "running");
    let r = get(&emu, &format!("/v1/servers/{empty_uid}")).await;
    assert_eq!(r.body["server"]["labels"], json!({MANAGED: "true", UID: ""}));
    assert_eq!(r.body["server"]["created"], "2020-09-13T12:26:40+00:00");
    assert_eq!(r.body["server"]["location"]["name"], "hel1");
    let q = encode_query(&format!("{MANAGED}=true"));
    assert_eq!(names(&get(&emu, &format!("/v1/servers?label_selector={q}")).await), ["orphan"]);
}

#[tokio::test]
#[should_panic(expected = "server name is already used")]
async fn planting_a_taken_name_panics() {
    let emu = start();
    plant(&emu, "twin", "");
    plant(&emu, "twin", "");
}

#[tokio::test]
async fn a_failed_scope_fails_every_list_that_touches_it() {
    let emu = start();
    let fsn = plant(&emu, "in-fsn", "fsn1");
    plant(&emu, "in-nbg", "nbg1");
    emu.fail_scope("nbg1", true);
    let r = get(&emu, "/v1/servers").await;
    assert_eq!((r.status, r.code()), (503, "unavailable"));
    assert_eq!(get(&emu, "/v1/primary_ips").await.status, 503);
    // Lists that never touch the location, and reads by ID, still answer.
    assert_eq!(names(&get(&emu, "/v1/servers?name=in-fsn").await), ["in-fsn"]);
    let q = encode_query(&format!("{UID}=uid-in-fsn"));
    assert_eq!(names(&get(&emu, &format!("/v1/servers?label_selector={q}")).await), ["in-fsn"]);
    assert_eq!(get(&emu, &format!("/v1/servers/{fsn}")).await.status, 200);
    // Not even a later page escapes: the total needs every location.
    assert_eq!(get(&emu, "/v1/servers?page=2&per_page=1").await.status, 503);
    emu.fail_scope("nbg1", false);
    assert_eq!(names(&get(&emu, "/v1/servers").await), ["in-fsn", "in-nbg"]);
}

#[tokio::test]
async fn dump_shows_servers_being_deleted_and_primary_ips() {
    let emu = start();
    let a = create_id(&emu, "proxy-d1", json!({MANAGED: "true"})).await;
    let b = plant(&emu, "proxy-d2", "ash");
    emu.start_slow_delete(&b);
    let d = emu.dump();
    assert_eq!(d.instances.len(), 2);
    let first = &d.instances[0];
    assert_eq!(
        (first.id.as_str(), first.name.as_str(), first.scope.as_str()),
        (a.as_str(), "proxy-d1", "fsn1")
    );
    assert_eq!(first.state, "initializing");
    assert_eq!(first.labels, vec![(MANAGED.to_string(), "true".to_string())]);
    assert_eq!(first.user_data, b"#cloud-config\nruncmd: [echo hi]\n");
    assert!(!first.ip.is_empty());
    assert_eq!(d.instances[1].state, "deleting");
    assert_eq!(d.instances[1].scope, "ash");
    assert_eq!(d.secondary.len(), 4);
    assert!(d.secondary.iter().all(|s| s.kind == "primary_ip"));
    assert_eq!(
        d.secondary.iter().filter(|s| s.attached_to.as_deref() == Some(a.as_str())).count(),
        2
    );
}

#[tokio::test]
async fn hold_and_raw_states() {
    let emu = start();
    let id = create_id(&emu, "proxy-h", json!({})).await;
    let path = format!("/v1/servers/{id}");
    emu.hold_provisioning(&id, true);
    for _ in 0..3 {
        let r = get(&emu, &path).await;
        assert_eq!(r.body["server"]["status"], "initializing");
        assert!(r.body["server"]["public_net"]["ipv4"]["ip"].is_string());
    }
    emu.hold_provisioning(&id, false);
    assert_eq!(get(&emu, &path).await.body["server"]["status"], "initializing");
    assert_eq!(get(&emu, &path).await.body["server"]["status"], "running");
    emu.set_backend_state(&id, "exploded");
    assert_eq!(get(&emu, &path).await.body["server"]["status"], "exploded");

    // Stopping a server whose power-on is still running fails that action.
    let r = create(&emu, "proxy-o", json!({})).await;
    let other = r.body["server"]["id"].as_u64().unwrap().to_string();
    let start_action = r.body["next_actions"][0]["id"].as_u64().unwrap();
    emu.set_backend_state(&other, "off");
    let a = get(&emu, &format!("/v1/actions/{start_action}")).await;
    assert_eq!(a.body["action"]["status"], "error");
    assert_eq!(a.body["action"]["error"]["code"], "action_failed");
    // Unknown IDs are ignored by the Rust surface and 404 over HTTP.
    emu.set_backend_state("999", "off");
    let r = raw(
        &emu,
        "POST",
        "/_emulator/state",
        None,
        &json!({"id": "999", "state": "off"}).to_string(),
    )
    .await;
    assert_eq!(r.status, 404);
}

#[tokio::test]
async fn run_schedules_power_and_ipv4_options() {
    let mut cfg = HetznerConfig::new(TOKEN);
    cfg.run_schedule = RunSchedule::Manual;
    let emu = HetznerEmulator::start(cfg);
    let id = create_id(&emu, "proxy-x", json!({})).await;
    for _ in 0..3 {
        assert_eq!(
            get(&emu, &format!("/v1/servers/{id}")).await.body["server"]["status"],
            "initializing"
        );
    }

    let mut cfg = HetznerConfig::new(TOKEN);
    cfg.run_schedule = RunSchedule::After(Duration::from_millis(100));
    let emu = HetznerEmulator::start(cfg);
    let id = create_id(&emu, "proxy-y", json!({})).await;
    let path = format!("/v1/servers/{id}");
    assert_eq!(get(&emu, &path).await.body["server"]["status"], "initializing");
    tokio::time::sleep(Duration::from_millis(150)).await;
    assert_eq!(get(&emu, &path).await.body["server"]["status"], "running");

    let emu = start();
    let mut b = body("proxy-z", json!({}));
    b["start_after_create"] = json!(false);
    b["public_net"] = json!({"enable_ipv4": false, "enable_ipv6": true, "ipv4": null});
    let r = api(&emu, "POST", "/v1/servers", Some(b)).await;
    assert_eq!(r.status, 201, "{}", r.body);
    assert_eq!(r.body["next_actions"], json!([]));
    assert_eq!(r.body["server"]["public_net"]["ipv4"], Value::Null);
    let path = format!("/v1/servers/{}", r.body["server"]["id"]);
    get(&emu, &path).await;
    assert_eq!(get(&emu, &path).await.body["server"]["status"], "off");
    let id = r.body["server"]["id"].as_u64().unwrap().to_string();
    emu.set_backend_state(&id, "running");
    let s = get(&emu, &path).await;
    assert_eq!(
        (s.body["server"]["status"].as_str(), &s.body["server"]["public_net"]["ipv4"]),
        (Some("running"), &Value::Null)
    );
}

#[tokio::test]
async fn the_running_hook_can_replace_the_address() {
    let mut cfg = HetznerConfig::new(TOKEN);
    let seen = Arc::new(Mutex::new(Vec::new()));
    let log = seen.clone();
    cfg.on_running = Some(Arc::new(move |s: &RunningServer| {
        log.lock().unwrap().push((s.name.clone(), s.user_data.clone()));
        Some(Ipv4Addr::LOCALHOST)
    }));
    let emu = HetznerEmulator::start(cfg);
    let id = create_id(&emu, "proxy-k", json!({})).await;
    let path = format!("/v1/servers/{id}");
    assert_ne!(get(&emu, &path).await.body["server"]["public_net"]["ipv4"]["ip"], "127.0.0.1");
    assert_eq!(get(&emu, &path).await.body["server"]["public_net"]["ipv4"]["ip"], "127.0.0.1");
    assert_eq!(
        *seen.lock().unwrap(),
        vec![("proxy-k".to_string(), Some("#cloud-config\nruncmd: [echo hi]\n".to_string()))]
    );
    assert_eq!(emu.dump().instances[0].ip, "127.0.0.1");
}

#[tokio::test]
async fn a_failed_create_fails_its_action_and_removes_the_server() {
    let emu = start();
    let r = create(&emu, "proxy-e", json!({})).await;
    let id = r.body["server"]["id"].as_u64().unwrap().to_string();
    let action = r.body["action"]["id"].as_u64().unwrap();
    assert!(emu.fail_create(&id));
    let a = get(&emu, &format!("/v1/servers/{id}/actions/{action}")).await;
    assert_eq!(a.body["action"]["status"], "error");
    assert_eq!(get(&emu, &format!("/v1/servers/{id}")).await.status, 404);
    assert_eq!(emu.dump(), Dump::default());
    assert!(!emu.fail_create(&id));
}

#[tokio::test]
async fn primary_ips_outlive_their_server_unless_auto_delete() {
    let emu = start();
    let own = emu.plant_primary_ip("fsn1", false).unwrap();
    let other_loc = emu.plant_primary_ip("nbg1", false).unwrap();
    let v6 = emu.plant_primary_ip("fsn1", true).unwrap();
    let with_ip = |name: &str, ip: &str| {
        let mut b = body(name, json!({}));
        b["public_net"] = json!({"ipv4": ip.parse::<u64>().unwrap()});
        b
    };
    let r = api(&emu, "POST", "/v1/servers", Some(with_ip("proxy-n", &other_loc))).await;
    assert_eq!((r.status, r.code()), (422, "primary_ip_datacenter_mismatch"));
    let r = api(&emu, "POST", "/v1/servers", Some(with_ip("proxy-n", &v6))).await;
    assert_eq!((r.status, r.code()), (412, "primary_ip_version_mismatch"));
    let r = api(&emu, "POST", "/v1/servers", Some(with_ip("proxy-n", &own))).await;
    assert_eq!(r.status, 201, "{}", r.body);
    assert_eq!(r.body["server"]["public_net"]["ipv4"]["id"].to_string(), own);
    let id = r.body["server"]["id"].as_u64().unwrap().to_string();
    let r = api(&emu, "POST", "/v1/servers", Some(with_ip("proxy-q", &own))).await;
    assert_eq!((r.status, r.code()), (422, "primary_ip_assigned"));

    // An assigned IP of a running server cannot be deleted; of a stopped one it can.
    let r = api(&emu, "DELETE", &format!("/v1/primary_ips/{own}"), None).await;
    assert_eq!((r.status, r.code()), (422, "server_not_stopped"));
    api(&emu, "DELETE", &format!("/v1/servers/{id}"), None).await;
    let ips = get(&emu, "/v1/primary_ips").await.body["primary_ips"].clone();
    let kept =
        ips.as_array().unwrap().iter().find(|i| i["id"].as_u64() == own.parse().ok()).unwrap();
    assert_eq!(
        (kept["assignee_id"].clone(), kept["auto_delete"].clone()),
        (Value::Null, json!(false))
    );
    assert_eq!(ips.as_array().unwrap().len(), 3, "the auto-delete IPv6 went with the server");
    let r = api(&emu, "DELETE", &format!("/v1/primary_ips/{own}"), None).await;
    assert_eq!(r.status, 204);
    assert_eq!(
        api(&emu, "DELETE", &format!("/v1/primary_ips/{own}"), None).await.code(),
        "not_found"
    );

    let id = create_id(&emu, "proxy-p", json!({})).await;
    let ip = emu.server(&id).unwrap()["public_net"]["ipv4"]["id"].to_string();
    emu.set_backend_state(&id, "off");
    assert_eq!(api(&emu, "DELETE", &format!("/v1/primary_ips/{ip}"), None).await.status, 204);
    assert_eq!(emu.server(&id).unwrap()["public_net"]["ipv4"], Value::Null);
}

#[tokio::test]
async fn the_http_control_surface_drives_the_same_state() {
    let emu = start();
    let post = |path: &'static str, b: Value| {
        let emu = &emu;
        async move { raw(emu, "POST", path, None, &b.to_string()).await }
    };
    let r = post(
        "/_emulator/plant",
        json!({"name": "ctl", "scope": "nbg1", "managed": true, "uid": "u"}),
    )
    .await;
    let id = r.body["id"].as_str().unwrap().to_string();
    assert_eq!(post("/_emulator/hold", json!({"id": id, "hold": true})).await.status, 204);
    assert_eq!(emu.dump().instances[0].state, "initializing");
    assert_eq!(post("/_emulator/state", json!({"id": id, "state": "running"})).await.status, 204);
    assert_eq!(post("/_emulator/lock", json!({"id": id, "locked": true})).await.status, 204);
    assert_eq!(emu.server(&id).unwrap()["locked"], true);
    assert_eq!(post("/_emulator/lock", json!({"id": id, "locked": false})).await.status, 204);
    assert_eq!(post("/_emulator/scope", json!({"scope": "nbg1", "fail": true})).await.status, 204);
    assert_eq!(get(&emu, "/v1/servers").await.status, 503);
    assert_eq!(post("/_emulator/scope", json!({"scope": "nbg1", "fail": false})).await.status, 204);
    assert_eq!(post("/_emulator/deleting", json!({"id": id})).await.status, 204);
    let dump: Dump =
        serde_json::from_value(raw(&emu, "GET", "/_emulator/dump", None, "").await.body).unwrap();
    assert_eq!(dump.instances[0].state, "deleting");
    assert_eq!(post("/_emulator/finish-deletes", json!({})).await.status, 204);
    assert!(emu.dump().instances.is_empty());
    let r = raw(&emu, "GET", "/_emulator/requests", None, "").await;
    assert_eq!(r.body["requests"], json!(["GET /v1/servers"]));
    let bad =
        post("/_emulator/plant", json!({"name": "bad name", "managed": false, "uid": null})).await;
    assert_eq!(bad.code(), "invalid_input");
    plant(&emu, "again", "");
    assert_eq!(post("/_emulator/reset", json!({})).await.status, 204);
    assert_eq!(emu.dump(), Dump::default());
    assert!(emu.requests().is_empty());
}

#[tokio::test]
async fn reset_forgets_everything_but_ids_keep_counting() {
    let emu = start();
    let first = create_id(&emu, "proxy-1", json!({})).await;
    emu.inject(Fault { op: FaultOp::Any, kind: FaultKind::ServerError, count: 5 });
    emu.fail_scope("fsn1", true);
    emu.reset();
    let second = create_id(&emu, "proxy-1", json!({})).await;
    assert!(second.parse::<u64>().unwrap() > first.parse::<u64>().unwrap());
    assert_eq!(get(&emu, "/v1/servers").await.status, 200);
    assert_eq!(get(&emu, &format!("/v1/servers/{first}")).await.status, 404);
    assert_eq!(
        emu.requests(),
        ["POST /v1/servers", "GET /v1/servers", format!("GET /v1/servers/{first}").as_str()]
    );
}

#[test]
fn drop_stops_the_server() {
    let emu = start();
    let addr = emu.addr();
    assert!(Emulator::url(&emu).starts_with("http://127.0.0.1:"));
    assert_eq!(emu.allow_entry(), emu.url());
    drop(emu);
    assert!(std::net::TcpStream::connect(addr).is_err());
}

/// Real-proxy mode: the server's user data names the port; running starts the proxy at
/// 127.0.0.1 (the server's IPv4 address), DELETE stops it, a server without a `Port` line
/// runs without one, and the rest stop when the emulator is dropped.
#[tokio::test(flavor = "multi_thread")]
async fn real_proxy_mode_runs_a_proxy_per_running_server() {
    use crate::real_proxy::tests::{closed, echo_server, free_port, get_through_tunnel};
    use crate::real_proxy::{ProxyKind, RealProxies};
    let echo = echo_server().await;
    let proxies = RealProxies::new(ProxyKind::Builtin);
    let emu = HetznerEmulator::start(HetznerConfig {
        real_proxies: Some(proxies.clone()),
        ..HetznerConfig::new(TOKEN)
    });
    let (p1, p2) = (free_port(), free_port());
    let mut ids = Vec::new();
    for (name, port) in [("px-1", p1), ("px-2", p2)] {
        let mut b = body(name, json!({}));
        b["user_data"] = json!(format!(
            "#cloud-config\nwrite_files:\n  - path: /etc/tinyproxy/tinyproxy.conf\n    content: |\n      Port {port}\n      Allow 0.0.0.0/0\n"
        ));
        let r = api(&emu, "POST", "/v1/servers", Some(b)).await;
        assert_eq!(r.status, 201, "{}", r.body);
        ids.push(r.body["server"]["id"].as_u64().unwrap());
    }
    let no_port = create_id(&emu, "px-3", json!({})).await;
    assert!(closed(p1), "no proxy while initializing");
    let first = get(&emu, &format!("/v1/servers/{}", ids[0])).await;
    assert_eq!(first.body["server"]["status"], "initializing");
    let running = get(&emu, &format!("/v1/servers/{}", ids[0])).await;
    assert_eq!(running.body["server"]["status"], "running");
    assert_eq!(running.body["server"]["public_net"]["ipv4"]["ip"], "127.0.0.1", "{}", running.body);
    let body = get_through_tunnel(p1, echo).await;
    assert!(body.starts_with("hello from 127.0.0.1"), "{body}");
    for id in [ids[1].to_string(), no_port.clone()] {
        get(&emu, &format!("/v1/servers/{id}")).await;
        let r = get(&emu, &format!("/v1/servers/{id}")).await;
        assert_eq!(r.body["server"]["status"], "running");
    }
    assert_eq!(proxies.port_of(&no_port), None, "no Port line, no proxy");
    assert_eq!(proxies.listening().len(), 2, "{:?}", proxies.listening());

    let r = api(&emu, "DELETE", &format!("/v1/servers/{}", ids[0]), None).await;
    assert_eq!(r.status, 200, "{}", r.body);
    assert!(closed(p1), "DELETE stops the proxy");
    assert!(!closed(p2), "the other server keeps its proxy");
    drop(emu);
    assert!(closed(p2), "dropping the emulator stops its proxies");
    assert!(proxies.listening().is_empty());
}

/// Off by default: never limited, and the headers show Hetzner's default with a full
/// bucket.
#[tokio::test]
async fn rate_limit_is_off_by_default() {
    let emu = start();
    for _ in 0..20 {
        let r = get(&emu, "/v1/servers").await;
        assert_eq!(r.status, 200);
        assert_eq!(r.headers["ratelimit-limit"], "3600");
        assert_eq!(r.headers["ratelimit-remaining"], "3600");
    }
}

/// With a limit, every call takes a token, authenticated or not; past the burst the answer
/// is Hetzner's 429 with its body, and the headers follow the bucket on every answer.
#[tokio::test]
async fn rate_limit_answers_like_hetzner() {
    let emu = HetznerEmulator::start(HetznerConfig {
        rate_limit: Some(crate::rate_limit::RateLimit { per_hour: 120, burst: 3 }),
        ..HetznerConfig::new(TOKEN)
    });
    let before = state::now_secs();
    let r = get(&emu, "/v1/servers").await;
    assert_eq!(r.status, 200);
    assert_eq!(r.headers["ratelimit-limit"], "120");
    assert_eq!(r.headers["ratelimit-remaining"], "2");
    // One token short of full at 120/h: 30 s.
    let reset: u64 = r.headers["ratelimit-reset"].to_str().unwrap().parse().unwrap();
    assert!((before + 30..=before + 31).contains(&reset), "{reset}");
    assert_eq!(raw(&emu, "GET", "/v1/servers", None, "").await.status, 401);
    let r = create(&emu, "proxy-a", json!({})).await;
    assert_eq!(r.status, 201);
    assert_eq!(r.headers["ratelimit-remaining"], "0");
    let r = create(&emu, "proxy-b", json!({})).await;
    assert_eq!((r.status, r.code()), (429, "rate_limit_exceeded"));
    assert_eq!(r.body["error"]["message"], "limit of 120 requests per hour reached");
    assert_eq!(r.body["error"]["details"], Value::Null);
    assert_eq!(r.headers["ratelimit-remaining"], "0");
    assert_eq!(r.headers["ratelimit-limit"], "120");
    // A limited call does nothing.
    assert_eq!(emu.dump().instances.len(), 1);
    // Every call is counted, the limited one as such, and so is the control surface's view.
    let stats = emu.stats();
    assert_eq!((stats.total, stats.rate_limited), (4, 1));
    assert_eq!(stats.by_op["list"], 2);
    assert_eq!(stats.by_call["POST /v1/servers"], 2);
    let r = get(&emu, "/_emulator/stats").await;
    assert_eq!(r.body["rate_limited"], 1);
    assert_eq!(r.body["by_op"]["create"], 2);

    // Turned off (and on) through the control surface; a reset keeps it, refilled.
    let r = raw(&emu, "POST", "/_emulator/rate-limit", None, "null").await;
    assert_eq!(r.status, 204);
    assert_eq!(get(&emu, "/v1/servers").await.status, 200);
    let on = json!({"per_hour": 3600, "burst": 1}).to_string();
    assert_eq!(raw(&emu, "POST", "/_emulator/rate-limit", None, &on).await.status, 204);
    assert_eq!(get(&emu, "/v1/servers").await.status, 200);
    assert_eq!(get(&emu, "/v1/servers").await.status, 429);
    emu.reset();
    assert_eq!(get(&emu, "/v1/servers").await.status, 200);
    assert_eq!(get(&emu, "/v1/servers").await.status, 429);
    // The bucket refills: one token a second at 3600/h.
    tokio::time::sleep(std::time::Duration::from_millis(1050)).await;
    assert_eq!(get(&emu, "/v1/servers").await.status, 200);
}

/// Hetzner deprecated `datacenter` on Servers and Primary IPs on 16 December 2025 in favour
/// of a top-level `location`, and removed it after 1 July 2026 (hcloud-go v2.45.0:
/// `schema.Server` and `schema.PrimaryIP` carry `Location`, no `Datacenter`). The emulator
/// answers that shape, and the old one (`datacenter.location`, no `location`) on request.
#[tokio::test]
async fn servers_and_primary_ips_name_their_location_not_a_datacenter() {
    for legacy in [false, true] {
        let emu = HetznerEmulator::start(HetznerConfig {
            legacy_datacenter: legacy,
            ..HetznerConfig::new(TOKEN)
        });
        let id = create_id(&emu, "proxy-loc", json!({MANAGED: "true"})).await;
        let server = get(&emu, &format!("/v1/servers/{id}")).await.body["server"].clone();
        let ip_id = server["public_net"]["ipv4"]["id"].as_u64().unwrap();
        let listed = get(&emu, "/v1/servers").await.body["servers"][0].clone();
        let ip = get(&emu, &format!("/v1/primary_ips/{ip_id}")).await.body["primary_ip"].clone();
        let ips = get(&emu, "/v1/primary_ips").await.body["primary_ips"][0].clone();
        for (what, v) in [("server", &server), ("listed", &listed), ("ip", &ip), ("ips", &ips)] {
            let (location, datacenter) = (v.get("location"), v.get("datacenter"));
            if legacy {
                assert_eq!(
                    (location, v["datacenter"]["location"]["name"].as_str()),
                    (None, Some("fsn1")),
                    "{what}: {v}"
                );
                assert_eq!(v["datacenter"]["name"], "fsn1-dc14", "{what}");
                continue;
            }
            assert_eq!(datacenter, None, "{what}: {v}");
            let want = json!({"id": 1, "name": "fsn1", "description": "Falkenstein DC Park 1",
                "country": "DE", "city": "Falkenstein", "latitude": 50.47612, "longitude": 12.370071,
                "network_zone": "eu-central"});
            assert_eq!(location, Some(&want), "{what}");
        }
    }
}

/// What `tick` and the create's name check look at instead of every server (the boot,
/// delete and name indexes): a server held before the others does not hold up their
/// boot, one held and released boots, and a deleted server's name is free again while a
/// live one's is not.
#[tokio::test]
async fn servers_boot_past_a_held_one_and_names_free_when_deleted() {
    let mut cfg = HetznerConfig::new(TOKEN);
    cfg.run_schedule = RunSchedule::After(Duration::from_millis(50));
    let emu = HetznerEmulator::start(cfg);
    let held = create_id(&emu, "proxy-held", json!({})).await;
    assert!(emu.hold_provisioning(&held, true));
    let later = create_id(&emu, "proxy-later", json!({})).await;
    tokio::time::sleep(Duration::from_millis(120)).await;
    let status = |id: String| {
        let emu = &emu;
        async move { get(emu, &format!("/v1/servers/{id}")).await.body["server"]["status"].clone() }
    };
    assert_eq!(status(later.clone()).await, "running");
    assert_eq!(status(held.clone()).await, "initializing", "held");
    assert!(emu.hold_provisioning(&held, false));
    tokio::time::sleep(Duration::from_millis(10)).await;
    assert_eq!(status(held.clone()).await, "running", "released after its boot time");

    assert_eq!(create(&emu, "proxy-later", json!({})).await.code(), "uniqueness_error");
    let r = api(&emu, "DELETE", &format!("/v1/servers/{later}"), None).await;
    assert_eq!(r.status, 200, "{}", r.body);
    let again = create_id(&emu, "proxy-later", json!({})).await;
    assert_ne!(again, later);
}
