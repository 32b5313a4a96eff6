//! The Linode emulator over plain HTTP, as a plugin sees it.

use super::*;
use crate::control::{Emulator, Fault};
use std::io::{Read, Write};
use std::net::TcpStream;

const TOKEN: &str = "ln-token";

struct Answer {
    status: u16,
    head: String,
    body: serde_json::Value,
}

impl Answer {
    fn header(&self, name: &str) -> Option<String> {
        self.head.lines().find_map(|l| {
            let (k, v) = l.split_once(':')?;
            k.eq_ignore_ascii_case(name).then(|| v.trim().to_string())
        })
    }
}

fn call(e: &LinodeEmulator, method: &str, path: &str, extra: &str, body: Option<&str>) -> Answer {
    let mut s = TcpStream::connect(e.addr()).unwrap();
    let body = body.unwrap_or("");
    write!(
        s,
        "{method} {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\nAuthorization: Bearer {TOKEN}\r\n{extra}\
         Content-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    let mut raw = String::new();
    s.read_to_string(&mut raw).unwrap();
    let (head, rest) = raw.split_once("\r\n\r\n").unwrap();
    let text = if head.to_ascii_lowercase().contains("transfer-encoding: chunked") {
        let (mut out, mut s) = (String::new(), rest);
        loop {
            let (size, r) = s.split_once("\r\n").unwrap();
            let n = usize::from_str_radix(size.trim(), 16).unwrap();
            if n == 0 {
                break out;
            }
            out.push_str(&r[..n]);
            s = &r[n + 2..];
        }
    } else {
        rest.to_string()
    };
    Answer {
        status: head[9..12].parse().unwrap(),
        head: head.to_string(),
        body: serde_json::from_str(&text).unwrap_or(serde_json::Value::Null),
    }
}

fn create_body(label: &str, region: &str, tags: &[&str]) -> String {
    json!({
        "label": label, "region": region, "type": "g6-nanode-1", "image": "linode/debian12",
        "root_pass": "s3cure-Random-Pass", "booted": true, "tags": tags,
        "metadata": {"user_data": data_encoding::BASE64.encode(b"#cloud-config\n")},
    })
    .to_string()
}

fn create(e: &LinodeEmulator, label: &str) -> Answer {
    let body =
        create_body(label, "us-east", &["egress-managed", "egress-uid:u-1", "egress-inst:i"]);
    call(e, "POST", "/v4/linode/instances", "", Some(&body))
}

#[test]
fn create_boots_through_provisioning_and_booting_to_running() {
    let e = LinodeEmulator::start(LinodeConfig::new(TOKEN));
    let a = create(&e, "proxy-a");
    assert_eq!(a.status, 200, "{}", a.body);
    assert_eq!(a.body["status"], "provisioning");
    assert!(a.header("x-ratelimit-limit").is_some() && a.header("x-ratelimit-reset").is_some());
    let id = a.body["id"].as_u64().unwrap();
    let created = a.body["created"].as_str().unwrap();
    assert!(!created.ends_with('Z') && created.len() == 19, "{created}");
    let path = format!("/v4/linode/instances/{id}");
    let seen: Vec<String> = (0..3)
        .map(|_| call(&e, "GET", &path, "", None).body["status"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(seen, ["provisioning", "booting", "running"]);
    let running = call(&e, "GET", &path, "", None).body;
    assert_eq!(running["ipv4"].as_array().unwrap().len(), 1);
    assert_eq!(running["has_user_data"], true);
    let dump = e.dump().instances;
    assert_eq!(dump[0].user_data, b"#cloud-config\n");
    assert!(dump[0].labels.contains(&(crate::MARK_UID.into(), "u-1".into())));

    // Labels are unique; the answer says which field.
    let again = create(&e, "proxy-a");
    assert_eq!(again.status, 400);
    assert_eq!(again.body["errors"][0]["field"], "label");
    assert_eq!(again.body["errors"][0]["reason"], "Label must be unique among your Linodes");

    assert_eq!(call(&e, "DELETE", &path, "", None).status, 200);
    let gone = call(&e, "GET", &path, "", None);
    assert_eq!((gone.status, &gone.body), (404, &json!({"errors": [{"reason": "Not found"}]})));
    assert_eq!(call(&e, "DELETE", &path, "", None).status, 404);
}

#[test]
fn create_validates_like_the_api() {
    let e = LinodeEmulator::start(LinodeConfig::new(TOKEN));
    let base: serde_json::Value =
        serde_json::from_str(&create_body("proxy-v", "us-east", &[])).unwrap();
    let cases = [
        (json!({"region": "mars"}), "region"),
        (json!({"type": "g9-huge"}), "type"),
        (json!({"root_pass": null}), "root_pass"),
        (json!({"root_pass": "short"}), "root_pass"),
        (json!({"root_pass": "alllowercaseletters"}), "root_pass"),
        (json!({"label": "-bad"}), "label"),
        (json!({"tags": ["ab"]}), "tags"),
        (json!({"tags": ["x".repeat(51)]}), "tags"),
        (json!({"metadata": {"user_data": "not base64!"}}), "metadata.user_data"),
        (json!({"region": "us-southeast"}), "metadata.user_data"),
        (
            json!({"metadata": {"user_data": data_encoding::BASE64.encode(&vec![b'a'; USER_DATA_MAX + 1])}}),
            "metadata.user_data",
        ),
    ];
    for (patch, field) in cases {
        let mut body = base.clone();
        for (k, v) in patch.as_object().unwrap() {
            body[k] = v.clone();
        }
        let a = call(&e, "POST", "/v4/linode/instances", "", Some(&body.to_string()));
        assert_eq!(
            (a.status, a.body["errors"][0]["field"].as_str()),
            (400, Some(field)),
            "{patch}"
        );
    }
    assert!(e.dump().instances.is_empty());
    // No user data is fine in a region without Metadata.
    let mut body = base.clone();
    body["region"] = json!("us-southeast");
    body.as_object_mut().unwrap().remove("metadata");
    assert_eq!(call(&e, "POST", "/v4/linode/instances", "", Some(&body.to_string())).status, 200);
}

#[test]
fn lists_page_and_filter() {
    let e = LinodeEmulator::start(LinodeConfig::new(TOKEN));
    for n in 0..30 {
        let tags: &[&str] =
            if n % 3 == 0 { &["egress-managed", "egress-inst:a"] } else { &["other"] };
        let body = create_body(&format!("proxy-{n}"), "eu-central", tags);
        assert_eq!(call(&e, "POST", "/v4/linode/instances", "", Some(&body)).status, 200);
    }
    let all = call(&e, "GET", "/v4/linode/instances?page=2&page_size=25", "", None).body;
    assert_eq!(
        (all["page"].as_u64(), all["pages"].as_u64(), all["results"].as_u64()),
        (Some(2), Some(2), Some(30))
    );
    assert_eq!(all["data"].as_array().unwrap().len(), 5);
    let filter = r#"X-Filter: {"+and": [{"tags": "egress-managed"}, {"tags": "egress-inst:a"}]}"#;
    let managed = call(&e, "GET", "/v4/linode/instances", &format!("{filter}\r\n"), None).body;
    assert_eq!(managed["results"], 10);
    let by_label =
        call(&e, "GET", "/v4/linode/instances", "X-Filter: {\"label\": \"proxy-7\"}\r\n", None)
            .body;
    assert_eq!(by_label["data"][0]["label"], "proxy-7");
    let or = r#"X-Filter: {"+or": [{"label": "proxy-1"}, {"label": {"+contains": "y-2"}}]}"#;
    assert_eq!(
        call(&e, "GET", "/v4/linode/instances", &format!("{or}\r\n"), None).body["results"],
        12
    );
    for (query, header, field) in [
        ("?page_size=10", "", "page_size"),
        ("?page_size=501", "", "page_size"),
        ("?page=0", "", "page"),
        ("", "X-Filter: {\"status\": \"running\"}\r\n", "X-Filter"),
        ("", "X-Filter: not json\r\n", "X-Filter"),
    ] {
        let a = call(&e, "GET", &format!("/v4/linode/instances{query}"), header, None);
        assert_eq!(
            (a.status, a.body["errors"][0]["field"].as_str()),
            (400, Some(field)),
            "{query} {header}"
        );
    }
    e.fail_scope("eu-central", true);
    assert_eq!(call(&e, "GET", "/v4/linode/instances", "", None).status, 500);
}

#[test]
fn faults_locks_and_auth_answer_as_linode_does() {
    let e = LinodeEmulator::start(LinodeConfig::new(TOKEN));
    let id = create(&e, "proxy-f").body["id"].as_u64().unwrap().to_string();
    let path = format!("/v4/linode/instances/{id}");
    let fault = |op, kind| Fault { op, kind, count: 1 };
    let cases = [
        (FaultKind::Quota, 400, "Account Limit reached. Please open a support ticket."),
        (FaultKind::RateLimit, 429, "Too Many Requests"),
        (FaultKind::Auth, 401, "Invalid Token"),
        (FaultKind::ServerError, 500, "Internal server error"),
    ];
    for (kind, status, reason) in cases {
        e.inject(fault(FaultOp::Get, kind));
        let a = call(&e, "GET", &path, "", None);
        assert_eq!((a.status, a.body["errors"][0]["reason"].as_str()), (status, Some(reason)));
        if status == 429 {
            assert_eq!(a.header("retry-after").as_deref(), Some("1"));
            assert_eq!(a.header("x-ratelimit-remaining").as_deref(), Some("0"));
        }
    }
    e.set_locked(&id, true);
    let busy = call(&e, "DELETE", &path, "", None);
    assert_eq!(
        (busy.status, busy.body["errors"][0]["reason"].as_str()),
        (400, Some("Linode busy."))
    );
    e.set_locked(&id, false);
    e.start_slow_delete(&id);
    assert_eq!(call(&e, "GET", &path, "", None).body["status"], "deleting");
    assert_eq!(call(&e, "DELETE", &path, "", None).status, 200);
    let mut s = TcpStream::connect(e.addr()).unwrap();
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\nAuthorization: Bearer wrong\r\n\r\n"
    )
    .unwrap();
    let mut raw = String::new();
    s.read_to_string(&mut raw).unwrap();
    assert!(raw.starts_with("HTTP/1.1 401") && raw.contains("Invalid Token"), "{raw}");
}

#[test]
fn the_create_limit_is_20_per_15_seconds() {
    let cfg = LinodeConfig { create_limit: true, ..LinodeConfig::new(TOKEN) };
    let e = LinodeEmulator::start(cfg);
    for n in 0..20 {
        let a = create(&e, &format!("proxy-l{n}"));
        assert_eq!(a.status, 200, "{n}: {}", a.body);
        assert_eq!(a.header("x-ratelimit-limit").as_deref(), Some("20"));
    }
    let over = create(&e, "proxy-l20");
    assert_eq!(
        (over.status, over.body["errors"][0]["reason"].as_str()),
        (429, Some("Too Many Requests"))
    );
    let retry: u64 = over.header("retry-after").unwrap().parse().unwrap();
    assert!((1..=15).contains(&retry), "{retry}");
    assert_eq!(over.header("x-ratelimit-remaining").as_deref(), Some("0"));
    assert!(e.create_refill().unwrap() <= Duration::from_secs(15));
    // Reads are not held back by the create limit.
    assert_eq!(call(&e, "GET", "/v4/linode/instances", "", None).status, 200);
}

#[test]
fn plants_carry_the_marks_as_tags() {
    let e = LinodeEmulator::start(LinodeConfig::new(TOKEN));
    let id = e.plant(Plant {
        name: "proxy-p".into(),
        scope: String::new(),
        managed: true,
        uid: Some(String::new()),
        installation: Some("Cluster/Prod".into()),
        created_at: Some(1_700_000_000),
    });
    let l = e.linode(&id).unwrap();
    assert_eq!(l["region"], "us-east");
    assert_eq!(l["created"], "2023-11-14T22:13:20");
    let inst = format!("egress-inst:{}", installation_value("Cluster/Prod"));
    assert_eq!(l["tags"], json!(["egress-managed", "egress-uid:", inst]));
    assert_eq!(installation_value("inst-a"), "inst-a");
    assert_eq!(installation_value("cluster/prod"), "sha256-2x5dphpyg63fkszwlmxq6ger");
    let uid: (String, String) = (crate::MARK_UID.into(), "u".into());
    assert_eq!(tag_marks(&mark_tags(std::slice::from_ref(&uid))), [uid]);
}
