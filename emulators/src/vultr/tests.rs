//! The Vultr emulator over plain HTTP, as a plugin meets it: paths, statuses, Vultr's
//! error envelope, cursor paging, the `pending` / `0.0.0.0` window, tags and labels, the
//! 429 rate limit, and the shared control surface's effects on what the API shows.

use super::*;
use crate::control::{Emulator, Fault};
use std::io::{Read, Write};
use std::net::TcpStream;

const TOKEN: &str = "vultr-test-token";

fn emu() -> VultrEmulator {
    VultrEmulator::start(VultrConfig::new(TOKEN))
}

/// One request with `Connection: close`; the status and the JSON body (`Null` if none).
fn call(
    e: &VultrEmulator,
    method: &str,
    path: &str,
    token: Option<&str>,
    body: Option<&str>,
) -> (u16, Value) {
    let mut s = TcpStream::connect(e.addr()).unwrap();
    let body = body.unwrap_or("");
    let auth = token.map(|t| format!("Authorization: Bearer {t}\r\n")).unwrap_or_default();
    write!(
        s,
        "{method} {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n{auth}\
         Content-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    let mut raw = String::new();
    s.read_to_string(&mut raw).unwrap();
    let status: u16 = raw[9..12].parse().unwrap();
    let (head, mut rest) = raw.split_once("\r\n\r\n").unwrap();
    let mut text = String::new();
    if head.to_ascii_lowercase().contains("transfer-encoding: chunked") {
        loop {
            let (size, more) = rest.split_once("\r\n").unwrap();
            let n = usize::from_str_radix(size.trim(), 16).unwrap();
            if n == 0 {
                break;
            }
            text.push_str(&more[..n]);
            rest = &more[n + 2..];
        }
    } else {
        text = rest.to_string();
    }
    (status, serde_json::from_str(&text).unwrap_or(Value::Null))
}

fn api(e: &VultrEmulator, method: &str, path: &str, body: Option<Value>) -> (u16, Value) {
    call(e, method, path, Some(TOKEN), body.map(|b| b.to_string()).as_deref())
}

fn create(e: &VultrEmulator, label: &str, tags: &[&str]) -> (u16, Value) {
    let body = json!({
        "region": "ewr", "plan": "vc2-1c-1gb", "os_id": 2136, "label": label, "hostname": label,
        "tags": tags, "user_data": BASE64.encode(b"#cloud-config\n"),
    });
    api(e, "POST", "/v2/instances", Some(body))
}

#[test]
fn create_is_pending_without_an_address_then_active() {
    let e = emu();
    let (st, body) = create(&e, "proxy-a", &["egress.proxy-operator.dev/uid=u1", "plain tag"]);
    assert_eq!(st, 202, "{body}");
    let i = &body["instance"];
    let id = i["id"].as_str().unwrap().to_string();
    assert_eq!(id.len(), 36, "UUID-shaped: {id}");
    assert_eq!((i["status"].as_str(), i["main_ip"].as_str()), (Some("pending"), Some("0.0.0.0")));
    assert_eq!(
        (i["power_status"].as_str(), i["server_status"].as_str()),
        (Some("running"), Some("none"))
    );
    assert_eq!(i["label"], "proxy-a");
    assert_eq!(i["tags"], json!(["egress.proxy-operator.dev/uid=u1", "plain tag"]));
    assert!(i["date_created"].as_str().unwrap().ends_with("+00:00"));
    assert!(i.get("user_data").is_none(), "user data is not part of the instance");

    let (st, first) = api(&e, "GET", &format!("/v2/instances/{id}"), None);
    assert_eq!((st, first["instance"]["status"].as_str()), (200, Some("pending")));
    let (_, second) = api(&e, "GET", &format!("/v2/instances/{id}"), None);
    let i = &second["instance"];
    assert_eq!((i["status"].as_str(), i["server_status"].as_str()), (Some("active"), Some("ok")));
    assert!(i["main_ip"].as_str().unwrap().starts_with("203.0.113."), "{i}");

    let (st, ud) = api(&e, "GET", &format!("/v2/instances/{id}/user-data"), None);
    assert_eq!(
        (st, ud["user_data"]["data"].as_str()),
        (200, Some(BASE64.encode(b"#cloud-config\n").as_str()))
    );
    let dump = e.dump();
    assert_eq!(dump.instances[0].user_data, b"#cloud-config\n");
    assert!(
        dump.instances[0].labels.contains(&("egress.proxy-operator.dev/uid".into(), "u1".into()))
    );
}

#[test]
fn labels_are_not_unique_and_filters_all_match() {
    let e = emu();
    assert_eq!(create(&e, "twin", &["k=a"]).0, 202);
    assert_eq!(create(&e, "twin", &["k=b"]).0, 202, "Vultr takes a second instance with one label");
    assert_eq!(create(&e, "other", &["k=a"]).0, 202);
    let count =
        |q: &str| api(&e, "GET", &format!("/v2/instances?{q}"), None).1["meta"]["total"].as_u64();
    assert_eq!(count("label=twin"), Some(2));
    assert_eq!(count("tag=k%3Da"), Some(3), "deprecated in the reference: ignored");
    assert_eq!(count("label=twin&tag=k%3Da"), Some(2));
    assert_eq!(count("label=twin&region=ewr"), Some(2));
    assert_eq!(count("region=fra"), Some(0));
    assert_eq!(count("unknown=x"), Some(3), "unknown parameters are ignored");
}

#[test]
fn cursor_paging_walks_every_instance_once() {
    let e = emu();
    for n in 0..7 {
        create(&e, &format!("p{n}"), &[]);
    }
    let (mut seen, mut cursor, mut pages) = (Vec::new(), String::new(), 0);
    loop {
        let (st, page) = api(&e, "GET", &format!("/v2/instances?per_page=3&cursor={cursor}"), None);
        assert_eq!(st, 200);
        pages += 1;
        assert_eq!(page["meta"]["total"], 7);
        for i in page["instances"].as_array().unwrap() {
            seen.push(i["label"].as_str().unwrap().to_string());
        }
        cursor = page["meta"]["links"]["next"].as_str().unwrap().to_string();
        if cursor.is_empty() {
            break;
        }
    }
    assert_eq!((pages, seen.len()), (3, 7));
    seen.dedup();
    assert_eq!(seen.len(), 7);
    assert_eq!(api(&e, "GET", "/v2/instances?cursor=%21%21", None).0, 400);
    assert_eq!(api(&e, "GET", "/v2/instances?per_page=0", None).0, 400);
    let (_, big) = api(&e, "GET", "/v2/instances?per_page=100000", None);
    assert_eq!(
        big["instances"].as_array().unwrap().len(),
        7,
        "per_page is capped at 500, not refused"
    );
}

#[test]
fn errors_are_vultrs_envelope() {
    let e = emu();
    let (st, body) = call(&e, "GET", "/v2/instances", None, None);
    assert_eq!((st, body.clone()), (401, json!({"error": "Invalid API token.", "status": 401})));
    let (st, body) = api(&e, "GET", "/v2/instances/00000000-0000-4000-8000-0000000000ff", None);
    assert_eq!((st, body), (404, json!({"error": "instance not found", "status": 404})));
    let (st, _) = api(&e, "DELETE", "/v2/instances/00000000-0000-4000-8000-0000000000ff", None);
    assert_eq!(st, 404);
    let bad = |body: Value| api(&e, "POST", "/v2/instances", Some(body)).0;
    assert_eq!(bad(json!({"region": "mars", "plan": "p", "os_id": 1})), 400);
    assert_eq!(bad(json!({"region": "ewr", "plan": "", "os_id": 1})), 400);
    assert_eq!(bad(json!({"region": "ewr", "plan": "p"})), 400, "no image source");
    assert_eq!(bad(json!({"region": "ewr", "plan": "p", "os_id": 1, "user_data": "%%%"})), 400);
    assert!(e.dump().instances.is_empty());
}

#[test]
fn delete_answers_204_and_refuses_while_locked() {
    let e = emu();
    let id = create(&e, "d", &[]).1["instance"]["id"].as_str().unwrap().to_string();
    assert!(e.set_locked(&id, true));
    let (_, i) = api(&e, "GET", &format!("/v2/instances/{id}"), None);
    assert_eq!(i["instance"]["server_status"], "locked");
    let (st, body) = api(&e, "DELETE", &format!("/v2/instances/{id}"), None);
    assert_eq!((st, body["status"].as_u64()), (400, Some(400)));
    e.set_locked(&id, false);
    assert_eq!(api(&e, "DELETE", &format!("/v2/instances/{id}"), None).0, 204);
    assert_eq!(api(&e, "GET", &format!("/v2/instances/{id}"), None).0, 404);
}

#[test]
fn a_slow_delete_shows_the_instance_halted_until_it_goes() {
    let e = emu();
    let id = create(&e, "s", &[]).1["instance"]["id"].as_str().unwrap().to_string();
    assert!(e.start_slow_delete(&id));
    let (st, i) = api(&e, "GET", &format!("/v2/instances/{id}"), None);
    assert_eq!(st, 200);
    assert_eq!(
        (i["instance"]["power_status"].as_str(), i["instance"]["server_status"].as_str()),
        (Some("stopped"), Some("locked"))
    );
    assert_eq!(
        api(&e, "DELETE", &format!("/v2/instances/{id}"), None).0,
        204,
        "again while it runs"
    );
    e.finish_deletes();
    assert_eq!(api(&e, "GET", &format!("/v2/instances/{id}"), None).0, 404);
}

#[test]
fn faults_and_the_rate_limit_answer_as_vultr() {
    let e = emu();
    let cases = [
        (FaultKind::ServerError, 500),
        (FaultKind::Quota, 400),
        (FaultKind::RateLimit, 429),
        (FaultKind::Auth, 401),
    ];
    for (kind, want) in cases {
        e.inject(Fault { op: FaultOp::List, kind: kind.clone(), count: 1 });
        let (st, body) = api(&e, "GET", "/v2/instances", None);
        assert_eq!((st, body["status"].as_u64()), (want, Some(u64::from(want))), "{kind:?}");
        assert_eq!(api(&e, "GET", "/v2/instances", None).0, 200, "{kind:?} hit one call");
    }
    e.inject(Fault { op: FaultOp::Create, kind: FaultKind::Quota, count: 1 });
    assert_eq!(create(&e, "q", &[]).1["error"], INSTANCE_LIMIT);

    e.set_rate_limit(Some(RateLimit { per_hour: 108_000, burst: 2 }));
    let statuses: Vec<u16> = (0..3).map(|_| api(&e, "GET", "/v2/instances", None).0).collect();
    assert_eq!(statuses, [200, 200, 429]);
    assert_eq!(e.stats().rate_limited, 2, "one injected, one enforced");
    e.set_rate_limit(None);
}

#[test]
fn control_surface_states_and_plants_show_in_the_api() {
    let e = emu();
    let planted = e.plant(Plant {
        name: "proxy-planted".into(),
        scope: "fra".into(),
        managed: true,
        uid: Some("u-9".into()),
        installation: Some("inst".into()),
        created_at: Some(1_600_000_000),
    });
    let (_, i) = api(&e, "GET", &format!("/v2/instances/{planted}"), None);
    let i = &i["instance"];
    assert_eq!((i["status"].as_str(), i["region"].as_str()), (Some("active"), Some("fra")));
    assert_eq!(i["date_created"], "2020-09-13T12:26:40+00:00");
    let tags: Vec<&str> =
        i["tags"].as_array().unwrap().iter().map(|t| t.as_str().unwrap()).collect();
    assert!(
        tags.contains(&"egress.proxy-operator.dev/uid=u-9")
            && tags.contains(&"egress.proxy-operator.dev/managed=true")
    );
    assert!(
        e.try_plant(Plant { name: "x".into(), scope: "mars".into(), ..Plant::default() }).is_err()
    );

    assert!(e.set_address(&planted, None));
    let (_, i) = api(&e, "GET", &format!("/v2/instances/{planted}"), None);
    assert_eq!(i["instance"]["main_ip"], "0.0.0.0");
    assert!(e.set_backend_state(&planted, "suspended"));
    let (_, i) = api(&e, "GET", &format!("/v2/instances/{planted}"), None);
    assert_eq!(i["instance"]["status"], "suspended");
    assert!(e.hold_provisioning(&planted, true));
    let (_, i) = api(&e, "GET", &format!("/v2/instances/{planted}"), None);
    assert_eq!(
        (i["instance"]["status"].as_str(), i["instance"]["main_ip"].as_str()),
        (Some("pending"), Some("0.0.0.0"))
    );

    e.fail_scope("fra", true);
    assert_eq!(api(&e, "GET", "/v2/instances", None).0, 500);
    assert_eq!(api(&e, "GET", "/v2/instances?region=ewr", None).0, 200, "other regions answer");
    let stats = e.stats();
    assert_eq!(stats.by_call.get("GET /v2/instances/{id}"), Some(&4));
}

#[test]
fn a_create_can_fail_after_making_its_instance() {
    let e = emu();
    e.fail_creates_after_making(1);
    let (st, body) = create(&e, "proxy-lost", &["k=v"]);
    assert_eq!((st, body), (500, json!({"error": "Internal server error", "status": 500})));
    let made = e.dump().instances;
    assert_eq!(made.iter().map(|i| i.name.as_str()).collect::<Vec<_>>(), ["proxy-lost"]);
    assert_eq!(create(&e, "proxy-next", &[]).0, 202, "only the next create");
}

/// `GET /v2/plans` as the reference's `list-plans` has it: the catalogue with the `plans`
/// schema's fields, a whole `monthly_cost` as an integer, `type` filtering, cursor paging
/// to the end, and no hourly field (the reference has none).
#[test]
fn plans_are_the_catalogue_with_monthly_prices() {
    let mut cfg = VultrConfig::new(TOKEN);
    cfg.plans = vec![
        PlanOffer::new("vhf-1c-1gb", 6.0, &["ewr"]),
        PlanOffer::new("vc2-1c-1gb", 5.0, &["ewr", "fra"]),
        PlanOffer::new("vc2-1c-0.5gb", 2.5, &["ewr"]),
        PlanOffer::new("vcg-a16-2c-8g", 43.0, &["fra"]),
    ];
    let e = VultrEmulator::start(cfg);
    let (status, all) = api(&e, "GET", "/v2/plans", None);
    assert_eq!((status, all["meta"]["total"].as_u64()), (200, Some(4)), "{all}");
    let ids: Vec<&str> =
        all["plans"].as_array().unwrap().iter().map(|p| p["id"].as_str().unwrap()).collect();
    assert_eq!(ids, ["vc2-1c-0.5gb", "vc2-1c-1gb", "vcg-a16-2c-8g", "vhf-1c-1gb"]);
    let vc2 = &all["plans"][1];
    for k in [
        "id",
        "vcpu_count",
        "ram",
        "disk",
        "disk_count",
        "bandwidth",
        "monthly_cost",
        "type",
        "locations",
    ] {
        assert!(vc2.get(k).is_some(), "{k} missing: {vc2}");
    }
    assert!(vc2.get("hourly_cost").is_none(), "{vc2}");
    assert_eq!((vc2["monthly_cost"].as_u64(), vc2["type"].as_str()), (Some(5), Some("vc2")));
    assert_eq!(vc2["locations"], json!(["ewr", "fra"]));
    assert_eq!(all["plans"][0]["monthly_cost"].as_f64(), Some(2.5));
    assert_eq!(all["plans"][2]["type"], "vcg");

    let (_, vc2s) = api(&e, "GET", "/v2/plans?type=vc2", None);
    assert_eq!(vc2s["meta"]["total"], 2);
    assert_eq!(api(&e, "GET", "/v2/plans?type=all", None).1["meta"]["total"], 4);

    let (mut seen, mut cursor) = (Vec::new(), String::new());
    for _ in 0..4 {
        let (status, page) = api(&e, "GET", &format!("/v2/plans?per_page=3&cursor={cursor}"), None);
        assert_eq!(status, 200, "{page}");
        seen.extend(
            page["plans"].as_array().unwrap().iter().map(|p| p["id"].as_str().unwrap().to_string()),
        );
        cursor = page["meta"]["links"]["next"].as_str().unwrap().to_string();
        if cursor.is_empty() {
            break;
        }
    }
    assert_eq!(seen, ids);
    assert_eq!(api(&e, "GET", "/v2/plans?cursor=%%%", None).0, 400);
}
