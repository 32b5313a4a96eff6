//! The emulator over HTTP, as a plugin meets it: routes, status codes and bodies, paging,
//! filters, rate-limit headers, and the control surface's effects on the wire.

use super::*;
use crate::control::{Emulator, Fault};
use std::io::{Read, Write};
use std::net::TcpStream;

const TOKEN: &str = "do-t0ken";

struct Answer {
    status: u16,
    headers: String,
    json: Value,
}

/// A minimal HTTP/1.1 client (the crate has no client dependency; the server runs on its
/// own thread, so a blocking socket is fine).
fn call(
    e: &DigitalOceanEmulator,
    method: &str,
    path: &str,
    token: Option<&str>,
    body: Option<Value>,
) -> Answer {
    let mut s = TcpStream::connect(e.addr()).unwrap();
    let body = body.map(|b| b.to_string()).unwrap_or_default();
    let auth = token.map(|t| format!("Authorization: Bearer {t}\r\n")).unwrap_or_default();
    write!(
        s,
        "{method} {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n{auth}Content-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    let mut raw = String::new();
    s.read_to_string(&mut raw).unwrap();
    let (head, rest) = raw.split_once("\r\n\r\n").unwrap();
    let head = head.to_ascii_lowercase();
    let text =
        if head.contains("transfer-encoding: chunked") { dechunk(rest) } else { rest.to_string() };
    Answer {
        status: raw[9..12].parse().unwrap(),
        headers: head,
        json: serde_json::from_str(&text).unwrap_or(Value::Null),
    }
}

fn dechunk(mut s: &str) -> String {
    let mut out = String::new();
    loop {
        let (size, rest) = s.split_once("\r\n").unwrap();
        let n = usize::from_str_radix(size.trim(), 16).unwrap();
        if n == 0 {
            return out;
        }
        out.push_str(&rest[..n]);
        s = &rest[n + 2..];
    }
}

fn api(e: &DigitalOceanEmulator, method: &str, path: &str, body: Option<Value>) -> Answer {
    call(e, method, path, Some(TOKEN), body)
}

fn start() -> DigitalOceanEmulator {
    DigitalOceanEmulator::start(DigitalOceanConfig::new(TOKEN))
}

fn create(e: &DigitalOceanEmulator, name: &str, tags: &[&str]) -> Answer {
    let body = json!({"name": name, "region": "ams3", "size": "s-1vcpu-1gb", "image": "debian-12-x64",
                      "user_data": "#cloud-config\n", "tags": tags});
    api(e, "POST", "/v2/droplets", Some(body))
}

#[test]
fn create_get_delete_as_the_reference_says() {
    let e = start();
    let a = create(&e, "proxy-a", &["egress:managed:true", "egress:uid:u-1_2fx"]);
    assert_eq!(a.status, 202, "{}", a.json);
    let d = &a.json["droplet"];
    assert_eq!((d["status"].as_str(), d["region"]["slug"].as_str()), (Some("new"), Some("ams3")));
    assert!(a.json["links"]["actions"][0]["href"].as_str().unwrap().contains("/v2/actions/"));
    let v4 = d["networks"]["v4"].as_array().unwrap();
    assert_eq!((v4.len(), v4[0]["type"].as_str()), (1, Some("private")), "no public address yet");
    let id = d["id"].as_u64().unwrap();

    let first = api(&e, "GET", &format!("/v2/droplets/{id}"), None);
    assert_eq!((first.status, first.json["droplet"]["status"].as_str()), (200, Some("new")));
    let second = api(&e, "GET", &format!("/v2/droplets/{id}"), None);
    let d = &second.json["droplet"];
    assert_eq!(d["status"], "active");
    assert_eq!(d["networks"]["v4"][1]["type"], "public");
    assert!(d["networks"]["v4"][1]["ip_address"].as_str().unwrap().starts_with("203.0.113."));
    assert_eq!(d["tags"], json!(["egress:managed:true", "egress:uid:u-1_2fx"]));

    let dump = e.dump();
    let labels: Vec<(&str, &str)> =
        dump.instances[0].labels.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
    assert_eq!(
        labels,
        [(crate::MARK_MANAGED, "true"), (crate::MARK_UID, "u-1/x")],
        "marks decoded from tags"
    );
    assert_eq!(dump.instances[0].user_data, b"#cloud-config\n");

    let gone = api(&e, "DELETE", &format!("/v2/droplets/{id}"), None);
    assert_eq!((gone.status, &gone.json), (204, &Value::Null));
    for (method, path) in [
        ("GET", format!("/v2/droplets/{id}")),
        ("DELETE", format!("/v2/droplets/{id}")),
        ("GET", "/v2/droplets/x1".into()),
    ] {
        let a = api(&e, method, &path, None);
        assert_eq!((a.status, a.json["id"].as_str()), (404, Some("not_found")), "{method} {path}");
    }
}

#[test]
fn creates_are_checked_and_names_are_not_unique() {
    let mut cfg = DigitalOceanConfig::new(TOKEN);
    cfg.droplet_limit = Some(2);
    let e = DigitalOceanEmulator::start(cfg);
    assert_eq!(create(&e, "dup", &[]).status, 202);
    assert_eq!(create(&e, "dup", &[]).status, 202, "DigitalOcean names are not unique");
    let full = create(&e, "third", &[]);
    assert_eq!((full.status, full.json["message"].as_str()), (422, Some(DROPLET_LIMIT)));
    let cases = [
        (json!({"name": "-bad-", "size": "s-1vcpu-1gb", "image": "debian-12-x64"}), "hostname"),
        (
            json!({"name": "a", "region": "mars1", "size": "s-1vcpu-1gb", "image": "debian-12-x64"}),
            "invalid region",
        ),
        (json!({"name": "a", "size": "huge", "image": "debian-12-x64"}), "invalid size"),
        (json!({"name": "a", "size": "s-1vcpu-1gb", "image": 1}), "invalid image"),
        (
            json!({"name": "a", "size": "s-1vcpu-1gb", "image": "debian-12-x64", "tags": ["a b"]}),
            "tag name",
        ),
        (
            json!({"name": "a", "size": "s-1vcpu-1gb", "image": 165_064_040, "user_data": "x".repeat(USER_DATA_MAX + 1)}),
            "64 KiB",
        ),
    ];
    let e = start();
    for (body, text) in cases {
        let a = api(&e, "POST", "/v2/droplets", Some(body.clone()));
        assert_eq!(
            (a.status, a.json["id"].as_str()),
            (422, Some("unprocessable_entity")),
            "{body}"
        );
        assert!(a.json["message"].as_str().unwrap().contains(text), "{body}: {}", a.json);
    }
    let bad = call(&e, "POST", "/v2/droplets", Some(TOKEN), None);
    assert_eq!((bad.status, bad.json["id"].as_str()), (400, Some("bad_request")));
    assert!(e.dump().instances.is_empty());
}

#[test]
fn lists_page_with_links_and_total_and_filter() {
    let e = start();
    for n in 0..5 {
        let tags: &[&str] = if n % 2 == 0 { &["egress:installation:a"] } else { &["web"] };
        create(&e, &format!("d{n}"), tags);
    }
    let page = |q: &str| api(&e, "GET", &format!("/v2/droplets?{q}"), None);
    let p1 = page("per_page=2");
    assert_eq!(
        (p1.json["droplets"].as_array().unwrap().len(), p1.json["meta"]["total"].as_u64()),
        (2, Some(5))
    );
    let next = p1.json["links"]["pages"]["next"].as_str().unwrap();
    assert!(
        next.starts_with(&e.url()) && next.ends_with("/v2/droplets?page=2&per_page=2"),
        "{next}"
    );
    assert!(p1.json["links"]["pages"]["last"].as_str().unwrap().contains("page=3"));
    assert!(p1.json["links"]["pages"].get("prev").is_none());
    let p3 = page("per_page=2&page=3");
    assert_eq!(p3.json["droplets"].as_array().unwrap().len(), 1);
    assert!(
        p3.json["links"]["pages"].get("next").is_none()
            && p3.json["links"]["pages"]["prev"].is_string()
    );

    let tagged = page("tag_name=EGRESS:installation:A&per_page=200");
    let names: Vec<&str> = tagged.json["droplets"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| d["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["d0", "d2", "d4"], "tags compare without regard to case");
    assert_eq!(page("name=D3").json["meta"]["total"], 1);
    assert_eq!(page("per_page=500").json["droplets"].as_array().unwrap().len(), 5, "capped at 200");
    assert_eq!(page("type=gpus").json["meta"]["total"], 0);
    for bad in ["tag_name=a&name=b", "page=0", "per_page=x"] {
        assert_eq!(page(bad).status, 400, "{bad}");
    }

    e.fail_scope("ams3", true);
    let down = page("per_page=200");
    assert_eq!((down.status, down.json["id"].as_str()), (500, Some("server_error")));
    assert_eq!(
        page("tag_name=nothing").status,
        200,
        "a list that touches no failing region answers"
    );
}

#[test]
fn auth_rate_limit_and_headers() {
    let e = start();
    let a = call(&e, "GET", "/v2/droplets", Some("wrong"), None);
    assert_eq!((a.status, a.json["id"].as_str()), (401, Some("unauthorized")));
    assert!(
        a.headers.contains("ratelimit-limit: 5000")
            && a.headers.contains("ratelimit-remaining: 5000"),
        "{}",
        a.headers
    );
    assert!(a.headers.contains("ratelimit-reset: "));

    e.set_rate_limit(Some(RateLimit { per_hour: 5000, burst: 2 }));
    assert!(api(&e, "GET", "/v2/droplets", None).headers.contains("ratelimit-remaining: 1"));
    api(&e, "GET", "/v2/droplets", None);
    let limited = api(&e, "GET", "/v2/droplets", None);
    assert_eq!((limited.status, limited.json["id"].as_str()), (429, Some("too_many_requests")));
    assert!(limited.headers.contains("ratelimit-remaining: 0"), "{}", limited.headers);
    assert!(!limited.headers.contains("retry-after"), "DigitalOcean sends none");
    assert_eq!(e.stats().rate_limited, 1);
    assert_eq!(documented_rate_limit(), RateLimit { per_hour: 5000, burst: 250 });
}

#[test]
fn control_surface_on_the_wire() {
    let e = start();
    let id = e.plant(Plant {
        name: "planted".into(),
        scope: "fra1".into(),
        managed: true,
        uid: Some("U/1".into()),
        installation: Some("inst".into()),
        created_at: Some(1_700_000_000),
    });
    let d = e.droplet(&id).unwrap();
    assert_eq!(
        d["tags"],
        json!(["egress:managed:true", "egress:uid:_55_2f1", "egress:installation:inst"])
    );
    assert_eq!(
        (d["status"].as_str(), d["created_at"].as_str()),
        (Some("active"), Some("2023-11-14T22:13:20Z"))
    );
    assert!(
        e.try_plant(Plant { name: "x".into(), scope: "mars1".into(), ..Plant::default() }).is_err()
    );

    e.set_address(&id, None);
    assert_eq!(e.droplet(&id).unwrap()["networks"]["v4"].as_array().unwrap().len(), 1);
    e.set_locked(&id, true);
    let locked = api(&e, "DELETE", &format!("/v2/droplets/{id}"), None);
    assert_eq!((locked.status, locked.json["message"].as_str()), (422, Some(PENDING_EVENT)));
    assert_eq!(api(&e, "GET", &format!("/v2/droplets/{id}"), None).json["droplet"]["locked"], true);
    e.set_locked(&id, false);
    e.start_slow_delete(&id);
    assert_eq!(e.droplet(&id).unwrap()["status"], "archive");
    assert_eq!(api(&e, "DELETE", &format!("/v2/droplets/{id}"), None).status, 422);
    e.finish_deletes();
    assert!(e.droplet(&id).is_none());

    for (kind, status, code) in [
        (FaultKind::Quota, 422, "unprocessable_entity"),
        (FaultKind::RateLimit, 429, "too_many_requests"),
        (FaultKind::Auth, 401, "unauthorized"),
        (FaultKind::ServerError, 500, "server_error"),
    ] {
        e.inject(Fault { op: FaultOp::Create, kind, count: 1 });
        let a = create(&e, "f", &[]);
        assert_eq!((a.status, a.json["id"].as_str()), (status, Some(code)));
    }
    e.inject_error(
        FaultOp::List,
        DoError::new(403, "forbidden", "You do not have permission to perform this action."),
        1,
    );
    assert_eq!(api(&e, "GET", "/v2/droplets", None).status, 403);
    assert_eq!(api(&e, "GET", "/v2/nothing", None).status, 404);
}

#[test]
fn tags_round_trip_marks() {
    for (k, v) in [
        (crate::MARK_UID, "3f1c2a4e-7b1d"),
        (crate::MARK_INSTALLATION, "cluster/Prod"),
        (crate::MARK_UID, ""),
    ] {
        let t = tags::encode(k, v).unwrap();
        assert!(is_tag(&t) || v.is_empty(), "{t}");
        assert_eq!(tags::decode(&t), Some((k.to_string(), v.to_string())));
    }
    assert_eq!(
        tags::encode(crate::MARK_INSTALLATION, "cluster/Prod").unwrap(),
        "egress:installation:cluster_2f_50rod"
    );
    assert_eq!(tags::decode("web"), None);
}

/// What DigitalOcean's published OpenAPI specification (github.com/digitalocean/openapi,
/// `specification/`, read at 7c1300c) requires of a Droplet, as a JSON type per required
/// field: `resources/droplets/models/droplet.yml`, its `size` (`resources/sizes/models/
/// size.yml`) and `region` (`resources/regions/models/region.yml`).
const DROPLET_REQUIRED: [(&str, &str); 19] = [
    ("id", "integer"),
    ("name", "string"),
    ("memory", "integer"),
    ("vcpus", "integer"),
    ("disk", "integer"),
    ("locked", "boolean"),
    ("status", "string"),
    ("created_at", "string"),
    ("features", "array"),
    ("backup_ids", "array"),
    ("next_backup_window", "object-or-null"),
    ("snapshot_ids", "array"),
    ("image", "object"),
    ("volume_ids", "array"),
    ("size", "object"),
    ("size_slug", "string"),
    ("networks", "object"),
    ("region", "object"),
    ("tags", "array"),
];
const SIZE_REQUIRED: [(&str, &str); 10] = [
    ("available", "boolean"),
    ("disk", "integer"),
    ("memory", "integer"),
    ("price_hourly", "number"),
    ("price_monthly", "number"),
    ("regions", "array"),
    ("slug", "string"),
    ("transfer", "number"),
    ("vcpus", "integer"),
    ("description", "string"),
];
const REGION_REQUIRED: [(&str, &str); 5] = [
    ("available", "boolean"),
    ("features", "array"),
    ("name", "string"),
    ("sizes", "array"),
    ("slug", "string"),
];
/// `shared/attributes/distribution.yml`.
const DISTRIBUTIONS: [&str; 13] = [
    "Arch Linux",
    "CentOS",
    "CoreOS",
    "Debian",
    "Fedora",
    "Fedora Atomic",
    "FreeBSD",
    "Gentoo",
    "openSUSE",
    "RancherOS",
    "Rocky Linux",
    "Ubuntu",
    "Unknown",
];

/// The required fields of `object` missing or of another JSON type, as `what.field`.
fn off_spec(what: &str, object: &Value, required: &[(&str, &str)]) -> Vec<String> {
    let is = |v: &Value, kind: &str| match kind {
        "integer" => v.is_i64() || v.is_u64(),
        "number" => v.is_number(),
        "string" => v.is_string(),
        "boolean" => v.is_boolean(),
        "array" => v.is_array(),
        "object" => v.is_object(),
        _ => v.is_object() || v.is_null(),
    };
    let bad = required.iter().filter(|(k, kind)| !object.get(*k).is_some_and(|v| is(v, kind)));
    bad.map(|(k, kind)| format!("{what}.{k} ({kind}): {}", object.get(*k).unwrap_or(&Value::Null)))
        .collect()
}

/// Every Droplet answer (create, get, list), for every size and image of the catalogue,
/// carries what the specification requires, of the type it says, and values from its enums.
#[test]
fn droplets_carry_what_the_specification_requires() {
    let e = start();
    let mut answers = Vec::new();
    for (n, size) in ["s-1vcpu-512mb-10gb", "s-1vcpu-1gb", "s-2vcpu-2gb"].iter().enumerate() {
        let image = if n % 2 == 0 { json!("debian-12-x64") } else { json!(165_064_077) };
        let body =
            json!({"name": format!("proxy-{n}"), "region": "fra1", "size": size, "image": image});
        let created = api(&e, "POST", "/v2/droplets", Some(body));
        assert_eq!(created.status, 202, "{}", created.json);
        let id = created.json["droplet"]["id"].as_u64().unwrap();
        answers.push(created.json["droplet"].clone());
        answers.push(api(&e, "GET", &format!("/v2/droplets/{id}"), None).json["droplet"].clone());
    }
    answers
        .extend(api(&e, "GET", "/v2/droplets", None).json["droplets"].as_array().unwrap().clone());
    assert_eq!(answers.len(), 9);
    for d in &answers {
        let mut off = off_spec("droplet", d, &DROPLET_REQUIRED);
        off.extend(off_spec("droplet.size", &d["size"], &SIZE_REQUIRED));
        off.extend(off_spec("droplet.region", &d["region"], &REGION_REQUIRED));
        assert!(off.is_empty(), "{off:#?}\n{d:#}");
        assert!(["new", "active", "off", "archive"].contains(&d["status"].as_str().unwrap()));
        let image = &d["image"];
        let distribution = image["distribution"].as_str().unwrap_or_default();
        assert!(DISTRIBUTIONS.contains(&distribution), "image.distribution {distribution:?}");
        assert!(
            ["base", "snapshot", "backup", "custom", "admin"]
                .contains(&image["type"].as_str().unwrap())
        );
        assert!(
            ["NEW", "available", "pending", "deleted", "retired"]
                .contains(&image["status"].as_str().unwrap())
        );
        for v4 in d["networks"]["v4"].as_array().unwrap() {
            assert!(["public", "private"].contains(&v4["type"].as_str().unwrap()), "{v4}");
        }
        let size = &d["size"];
        // size.memory: `multipleOf: 8`, `minimum: 8`; the Droplet's own figures are its size's.
        let memory = size["memory"].as_u64().unwrap();
        assert!(memory >= 8 && memory % 8 == 0, "{size}");
        assert_eq!(size["slug"], d["size_slug"]);
        for k in ["memory", "vcpus", "disk"] {
            assert_eq!(d[k], size[k], "droplet.{k} is its size's");
        }
        assert!(size["price_hourly"].as_f64().unwrap() > 0.0, "{size}");
    }
    let distributions: Vec<&str> =
        answers.iter().map(|d| d["image"]["distribution"].as_str().unwrap()).collect();
    assert!(
        distributions.contains(&"Debian") && distributions.contains(&"Ubuntu"),
        "{distributions:?}"
    );
}

/// `GET /v2/sizes` as `sizes_list.yml` and `all_sizes.yml` describe it: the catalogue in slug
/// order, paged like the Droplet list, every size with what `size.yml` requires, the
/// configured prices exactly; a create of a size where the catalogue does not offer it is
/// refused as DigitalOcean refuses it.
#[test]
fn sizes_are_the_catalogue_paged_and_priced() {
    let mut cfg = DigitalOceanConfig::new(TOKEN);
    cfg.catalogue = vec![
        SizeOffer::new("s-1vcpu-1gb", 0.0105, &["ams3", "nyc3"]),
        SizeOffer::new("s-2vcpu-2gb", 0.02679, &["nyc3"]),
        SizeOffer { available: false, ..SizeOffer::new("s-1vcpu-512mb-10gb", 0.00595, &["ams3"]) },
    ];
    let e = DigitalOceanEmulator::start(cfg);
    let all = api(&e, "GET", "/v2/sizes", None);
    assert_eq!((all.status, all.json["meta"]["total"].as_u64()), (200, Some(3)), "{}", all.json);
    let sizes = all.json["sizes"].as_array().unwrap();
    let slugs: Vec<&str> = sizes.iter().map(|s| s["slug"].as_str().unwrap()).collect();
    assert_eq!(slugs, ["s-1vcpu-1gb", "s-1vcpu-512mb-10gb", "s-2vcpu-2gb"]);
    for s in sizes {
        let off = off_spec("size", s, &SIZE_REQUIRED);
        assert!(off.is_empty(), "{off:#?}\n{s:#}");
    }
    assert_eq!(sizes[0]["price_hourly"].as_f64(), Some(0.0105));
    assert_eq!(sizes[0]["regions"], json!(["ams3", "nyc3"]));
    assert_eq!(
        (sizes[1]["available"].as_bool(), sizes[2]["price_hourly"].as_f64()),
        (Some(false), Some(0.02679))
    );

    let p1 = api(&e, "GET", "/v2/sizes?per_page=2", None);
    assert_eq!(p1.json["sizes"].as_array().unwrap().len(), 2);
    let next = p1.json["links"]["pages"]["next"].as_str().unwrap();
    assert!(next.ends_with("/v2/sizes?page=2&per_page=2"), "{next}");
    let p2 = api(&e, "GET", "/v2/sizes?per_page=2&page=2", None);
    assert_eq!(p2.json["sizes"][0]["slug"], "s-2vcpu-2gb");
    assert!(p2.json["links"]["pages"].get("next").is_none());
    assert_eq!(api(&e, "GET", "/v2/sizes?page=0", None).status, 400);
    assert_eq!(call(&e, "GET", "/v2/sizes", None, None).status, 401);

    // Offered in nyc3 only; unavailable everywhere; offered and available.
    let body = |size: &str, region: &str| json!({"name": "p", "region": region, "size": size, "image": "debian-12-x64"});
    for (size, region) in [("s-2vcpu-2gb", "ams3"), ("s-1vcpu-512mb-10gb", "ams3")] {
        let a = api(&e, "POST", "/v2/droplets", Some(body(size, region)));
        assert_eq!(a.status, 422, "{size} in {region}: {}", a.json);
        assert_eq!(a.json["message"], "Size is not available in this region.");
    }
    let ok = api(&e, "POST", "/v2/droplets", Some(body("s-2vcpu-2gb", "nyc3")));
    assert_eq!(ok.status, 202, "{}", ok.json);
    assert_eq!(ok.json["droplet"]["size"]["price_hourly"].as_f64(), Some(0.02679));
    assert_eq!(ok.json["droplet"]["size"]["regions"], json!(["nyc3"]));
}
