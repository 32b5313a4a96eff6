//! The DigitalOcean plugin through the host, against the DigitalOcean emulator: the
//! conformance suite, then what is DigitalOcean's own: the marks as tags (charset, case,
//! length), public IPv4 only, `links.pages` paging, names that are not unique, the 422s
//! that mean quota or a running action, the rate limit and its headers, plain-text user
//! data, config errors that name the field and value.
//!
//! The last test runs the lifecycle against the real API and is ignored unless asked for
//! (docs/providers/digitalocean.md, "Testing").

use crate::support;

use egress_emulators::control::{Emulator, Fault, FaultKind, FaultOp, Plant, RateLimit};
use egress_emulators::digitalocean::{
    DigitalOceanConfig, DigitalOceanEmulator, DoError, SizeOffer,
};
use egress_emulators::{MARK_INSTALLATION, MARK_MANAGED, MARK_UID};
use egress_plugin_host::plugin::WasmProvider;
use egress_plugin_host::provider::{Class, CreateRequest, Placement, Provider, State};
use std::io::{Read, Write};
use std::path::Path;

const TOKEN: &str = "do-test-token";
const INST: &str = "inst-a";

struct Do {
    emu: DigitalOceanEmulator,
    p: WasmProvider,
    _secrets: tempfile::TempDir,
}

fn entry(url: &str, token: &Path, extra: &str) -> String {
    format!(
        "name: do\nplugin: digitalocean.wasm\nadditionalHosts: ['{url}']\nallowPrivateAddresses: true\n\
         limits: {{timeout: 3s}}\nsecrets: {{token: {token}}}\n\
         config: {{endpoint: '{url}/v2', regions: [nyc3, ams3], sizes: [s-1vcpu-1gb], \
         images: {{debian: debian-12-x64, ubuntu: 165064077}}, tags: ['fw:egress-proxies']}}{extra}",
        token = token.display()
    )
}

async fn setup_with(cfg: DigitalOceanConfig, extra: &str) -> Do {
    let secrets = tempfile::tempdir().unwrap();
    let token = secrets.path().join("token");
    std::fs::write(&token, format!("{}\n", cfg.token)).unwrap();
    let emu = DigitalOceanEmulator::start(cfg);
    let p = support::provider(
        &support::runtime(),
        "digitalocean.wasm",
        &entry(&emu.url(), &token, extra),
    )
    .await;
    Do {
        emu,
        p,
        _secrets: secrets,
    }
}

async fn setup() -> Do {
    setup_with(DigitalOceanConfig::new(TOKEN), "").await
}

fn request(uid: &str, region: &str) -> CreateRequest {
    CreateRequest {
        proxy_name: "p1".into(),
        cloud_init: b"#cloud-config\nruncmd: [echo hello]\n".to_vec(),
        ..CreateRequest::new(
            uid,
            INST,
            Placement::new(region, "ignored", "s-1vcpu-1gb", "debian"),
        )
    }
}

fn plant(
    emu: &DigitalOceanEmulator,
    name: &str,
    uid: Option<&str>,
    installation: Option<&str>,
) -> String {
    let id = emu.plant(Plant {
        name: name.into(),
        scope: "ams3".into(),
        managed: true,
        uid: uid.map(Into::into),
        installation: installation.map(Into::into),
        created_at: None,
    });
    format!("ams3/{id}")
}

fn label<'a>(labels: &'a [(String, String)], key: &str) -> Option<&'a str> {
    labels
        .iter()
        .find(|(k, _)| k == key)
        .map(|(_, v)| v.as_str())
}

/// A raw API call, for what the plugin never does itself (a second Droplet of one name).
fn raw(emu: &DigitalOceanEmulator, method: &str, path: &str, body: &str) -> String {
    let mut s = std::net::TcpStream::connect(emu.addr()).unwrap();
    write!(
        s,
        "{method} {path} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {TOKEN}\r\nConnection: close\r\n\
         Content-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).unwrap();
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn digitalocean_passes_the_suite() {
    let _dir = plugins_or_skip!();
    let d = setup().await;
    let placement = Placement::new("nyc3", "", "s-1vcpu-1gb", "debian");
    support::suite::assert_passes(&d.p, &d.emu, placement).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lifecycle_with_tags_user_data_and_only_a_public_address() {
    let _dir = plugins_or_skip!();
    let d = setup().await;
    let (p, emu) = (&d.p, &d.emu);
    let req = request("3f1c2a4e-7b1d-4c8e-9a55-0d6f2b9e1c01", "ams3");

    let id = p.create(&req).await.unwrap();
    assert!(id.starts_with("ams3/"), "{id}");
    let first = p.get(&id).await.unwrap();
    assert_eq!(
        (first.state, first.ip.as_str()),
        (State::Provisioning, ""),
        "new, with only a private address"
    );
    assert_eq!(
        p.create(&req).await.unwrap(),
        id,
        "create is idempotent by name"
    );
    let dump = emu.dump();
    assert_eq!(dump.instances.len(), 1);
    let droplet = &dump.instances[0];
    assert_eq!(
        droplet.user_data, req.cloud_init,
        "user data as plain text, byte for byte"
    );
    assert_eq!(label(&droplet.labels, MARK_MANAGED), Some("true"));
    assert_eq!(label(&droplet.labels, MARK_UID), Some(req.uid.as_str()));
    assert_eq!(label(&droplet.labels, MARK_INSTALLATION), Some(INST));
    let raw = emu.droplet(&id).unwrap();
    assert_eq!(
        raw["tags"],
        serde_json::json!([
            "egress:managed:true",
            "egress:uid:3f1c2a4e-7b1d-4c8e-9a55-0d6f2b9e1c01",
            "egress:installation:inst-a",
            "fw:egress-proxies"
        ])
    );
    assert_eq!(
        (raw["size_slug"].as_str(), raw["image"]["slug"].as_str()),
        (Some("s-1vcpu-1gb"), Some("debian-12-x64"))
    );

    let running = p.get(&id).await.unwrap();
    assert_eq!(running.state, State::Running);
    assert!(
        running.ip.starts_with("203.0.113."),
        "the public IPv4, not the private one: {}",
        running.ip
    );
    assert!(running.created_at.is_some());

    // Active, but the public address is gone: provisioning, and never the private address.
    emu.set_address(&id, None);
    let no_ip = p.get(&id).await.unwrap();
    assert_eq!((no_ip.state, no_ip.ip.as_str()), (State::Provisioning, ""));
    emu.set_address(&id, Some("203.0.113.99"));

    let listed = p.list_by_tag(INST).await.unwrap();
    assert_eq!(
        listed
            .iter()
            .map(|i| (i.id.as_str(), i.uid.as_str()))
            .collect::<Vec<_>>(),
        [(id.as_str(), req.uid.as_str())]
    );
    assert!(p.list_by_tag("inst-b").await.unwrap().is_empty());

    // An image catalogue entry that is a numeric ID reaches DigitalOcean as a number.
    let mut by_id = request("uid-image-id", "nyc3");
    by_id.placement.image = "ubuntu".into();
    let other = p.create(&by_id).await.unwrap();
    assert_eq!(
        emu.droplet(&other).unwrap()["image"]["slug"],
        "ubuntu-24-04-x64"
    );

    for i in [&id, &other] {
        p.delete(i).await.unwrap();
        p.delete(i).await.unwrap();
        assert_eq!(p.get(i).await.unwrap_err().class, Class::NotFound);
    }
    let dump = emu.dump();
    assert!(
        dump.instances.is_empty() && dump.secondary.is_empty(),
        "{dump:?}"
    );
}

/// Marks go through DigitalOcean's tag charset (`[A-Za-z0-9:_-]`, 255 long, case stable)
/// and come back exact: uppercase, `/`, `:`, spaces, and an installation too long for a tag.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn marks_survive_the_tag_charset() {
    let _dir = plugins_or_skip!();
    let d = setup().await;
    let (p, emu) = (&d.p, &d.emu);
    let long = format!("cluster/{}", "X".repeat(300));
    for (uid, installation) in [
        ("UID/Upper:Case_1.x", "cluster/Prod:eu west"),
        ("uid-long", long.as_str()),
    ] {
        let mut req = request(uid, "nyc3");
        req.installation = installation.into();
        let id = p.create(&req).await.unwrap();
        assert_eq!(p.get(&id).await.unwrap().uid, uid);
        let tags = emu.droplet(&id).unwrap()["tags"].clone();
        assert!(
            tags.as_array().unwrap().iter().all(|t| {
                let t = t.as_str().unwrap();
                t.len() <= 255
                    && t.bytes()
                        .all(|b| b.is_ascii_alphanumeric() || b":-_".contains(&b))
            }),
            "{tags}"
        );
        let listed = p.list_by_tag(installation).await.unwrap();
        assert_eq!(
            listed
                .iter()
                .map(|i| (i.id.as_str(), i.uid.as_str()))
                .collect::<Vec<_>>(),
            [(id.as_str(), uid)]
        );
    }
    assert_eq!(
        emu.droplet(&p.create(&request("u", "nyc3")).await.unwrap())
            .unwrap()["tags"][1],
        "egress:uid:u",
        "a plain UID stays readable"
    );
    // Another installation whose escaped form is a prefix of this one's is not listed.
    let mut req = request("uid-prefix", "nyc3");
    req.installation = "cluster/Prod:eu".into();
    p.create(&req).await.unwrap();
    assert_eq!(
        p.list_by_tag("cluster/Prod:eu west").await.unwrap().len(),
        1
    );

    // A UID that cannot fit in a tag is refused before any call.
    let before = emu.requests().len();
    let err = p
        .create(&request(&"u/".repeat(100), "nyc3"))
        .await
        .unwrap_err();
    assert_eq!(
        (err.class, err.code.as_deref()),
        (Class::Permanent, Some("InvalidUid")),
        "{err}"
    );
    assert_eq!(emu.requests().len(), before);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn list_follows_pages_and_fails_whole() {
    let _dir = plugins_or_skip!();
    let d = setup().await;
    let (p, emu) = (&d.p, &d.emu);
    for n in 0..205 {
        plant(
            emu,
            &format!("bulk-{n}"),
            Some(&format!("bulk-{n}")),
            Some("inst-bulk"),
        );
    }
    plant(emu, "empty-uid", Some(""), Some("inst-bulk"));
    plant(emu, "no-uid", None, Some("inst-bulk"));
    plant(emu, "other", Some("x"), Some("inst-other"));
    emu.plant(Plant {
        name: "unmanaged".into(),
        scope: "ams3".into(),
        managed: false,
        uid: Some("y".into()),
        installation: Some("inst-bulk".into()),
        created_at: None,
    });
    let listed = p.list_by_tag("inst-bulk").await.unwrap();
    assert_eq!(listed.len(), 207);
    assert_eq!(listed.iter().filter(|i| i.uid.is_empty()).count(), 2);
    let requests = emu.requests();
    assert!(
        requests.iter().any(|r| r.contains("per_page=200&page=2")),
        "{requests:?}"
    );
    assert!(
        requests
            .iter()
            .any(|r| r.contains("tag_name=egress%3Ainstallation%3Ainst-bulk")),
        "{requests:?}"
    );

    emu.fail_scope("ams3", true);
    let err = p.list_by_tag("inst-bulk").await.unwrap_err();
    assert_eq!(
        (err.class, err.code.as_deref()),
        (Class::Transient, Some("server_error")),
        "{err}"
    );
}

/// DigitalOcean names are not unique: racing creates both succeed, and every create
/// settles on the oldest Droplet of its Proxy and deletes the others.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn duplicate_names_settle_on_the_oldest() {
    let _dir = plugins_or_skip!();
    let d = setup().await;
    let (p, emu) = (&d.p, &d.emu);
    let req = request("uid-race", "nyc3");
    let (a, b) = tokio::join!(p.create(&req), p.create(&req));
    assert_eq!(a.unwrap(), b.unwrap());
    assert_eq!(emu.dump().instances.len(), 1);

    let req = request("uid-dup", "nyc3");
    let body = format!(
        r#"{{"name":"{}","region":"nyc3","size":"s-1vcpu-1gb","image":"debian-12-x64","tags":["egress:managed:true","egress:uid:uid-dup","egress:installation:inst-a"]}}"#,
        req.name
    );
    for _ in 0..2 {
        assert!(raw(emu, "POST", "/v2/droplets", &body).starts_with("HTTP/1.1 202"));
    }
    let ids: Vec<String> = emu
        .dump()
        .instances
        .iter()
        .filter(|i| i.name == req.name)
        .map(|i| i.id.clone())
        .collect();
    assert_eq!(ids.len(), 2);
    assert_eq!(
        p.create(&req).await.unwrap(),
        format!("nyc3/{}", ids[0]),
        "the oldest is adopted"
    );
    assert_eq!(
        emu.dump()
            .instances
            .iter()
            .filter(|i| i.name == req.name)
            .count(),
        1,
        "the duplicate is deleted"
    );

    let req = request("uid-mine", "nyc3");
    plant(emu, &req.name, Some("uid-theirs"), Some(INST));
    let err = p.create(&req).await.unwrap_err();
    assert_eq!(
        (err.class, err.code.as_deref()),
        (Class::Permanent, Some("NameTaken")),
        "{err}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn quota_rate_limit_and_other_answers_get_their_class() {
    let _dir = plugins_or_skip!();
    let mut cfg = DigitalOceanConfig::new(TOKEN);
    cfg.droplet_limit = Some(1);
    let d = setup_with(cfg, "").await;
    let (p, emu) = (&d.p, &d.emu);
    let id = p.create(&request("uid-q1", "nyc3")).await.unwrap();
    let err = p.create(&request("uid-q2", "nyc3")).await.unwrap_err();
    assert_eq!(
        (err.class, err.code.as_deref()),
        (Class::QuotaExceeded, Some("unprocessable_entity")),
        "{err}"
    );
    assert!(err.message.contains("droplet limit"), "{err}");

    let cases = [
        (
            DoError::new(
                422,
                "unprocessable_entity",
                "Size is not available in this region.",
            ),
            Class::QuotaExceeded,
        ),
        (
            DoError::new(
                422,
                "unprocessable_entity",
                "You specified an invalid image for Droplet creation.",
            ),
            Class::Permanent,
        ),
        (
            DoError::new(
                403,
                "forbidden",
                "You do not have permission to perform this action.",
            ),
            Class::Permanent,
        ),
        (
            DoError::new(503, "service_unavailable", "Service is unavailable"),
            Class::Transient,
        ),
    ];
    for (error, class) in cases {
        emu.inject_error(FaultOp::Create, error.clone(), 1);
        let err = p.create(&request("uid-q3", "nyc3")).await.unwrap_err();
        assert_eq!(
            (err.class, err.code.as_deref()),
            (class, Some(error.id.as_str())),
            "{err}"
        );
    }

    // DigitalOcean's own limit: 429 too_many_requests, no Retry-After; its ratelimit-reset
    // says when, and the plugin reports it.
    emu.set_rate_limit(Some(RateLimit {
        per_hour: 5000,
        burst: 1,
    }));
    p.get(&id).await.unwrap();
    let err = p.get(&id).await.unwrap_err();
    assert_eq!(
        (err.class, err.code.as_deref()),
        (Class::QuotaExceeded, Some("too_many_requests")),
        "{err}"
    );
    assert!(err.message.contains("(retry after "), "{err}");
    assert!(emu.stats().rate_limited >= 1);
    emu.set_rate_limit(None);

    emu.inject(Fault {
        op: FaultOp::Get,
        kind: FaultKind::Auth,
        count: 1,
    });
    assert_eq!(p.get(&id).await.unwrap_err().class, Class::Permanent);
}

/// A placement's price from DigitalOcean's size catalogue (`GET /v2/sizes`, followed to its
/// second page): the size's `price_hourly` in US dollars, exactly; none where the catalogue
/// does not offer the size; a failed catalogue read classified as any other call.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn quote_reads_the_size_catalogue() {
    let _dir = plugins_or_skip!();
    let mut cfg = DigitalOceanConfig::new(TOKEN);
    // 250 other sizes first (slug order), so the one asked for is on the second page of 200.
    cfg.catalogue = (0..250)
        .map(|n| SizeOffer::new(&format!("c-{n:03}"), 0.5, &["nyc3", "ams3"]))
        .chain([SizeOffer::new("s-1vcpu-1gb", 0.0105, &["nyc3"])])
        .collect();
    let d = setup_with(cfg.clone(), "").await;
    let at = |region: &str| Placement::new(region, "", "s-1vcpu-1gb", "debian");
    let usd = |micros_per_hour| {
        Some(egress_plugin_host::provider::Price {
            currency: "USD".into(),
            micros_per_hour,
        })
    };
    assert_eq!(d.p.quote(&at("nyc3")).await.unwrap(), usd(10_500));
    let sizes = |s: &egress_emulators::control::RequestStats| {
        s.by_call.get("GET /v2/sizes").copied().unwrap_or(0)
    };
    assert_eq!(sizes(&d.emu.stats()), 2, "both pages read");
    // The catalogue lists the size for nyc3 only.
    assert_eq!(d.p.quote(&at("ams3")).await.unwrap(), None);
    let e = d.p.quote(&at("sfo3")).await.unwrap_err();
    assert_eq!(e.class, Class::Permanent, "{e}");
    assert!(e.message.contains("sfo3"), "{e}");

    let failing = setup_with(cfg, "").await;
    failing.emu.inject(Fault {
        op: FaultOp::Any,
        kind: FaultKind::ServerError,
        count: 1,
    });
    let e = failing.p.quote(&at("nyc3")).await.unwrap_err();
    assert_eq!(
        (e.class, e.code.as_deref()),
        (Class::Transient, Some("server_error")),
        "{e}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn locked_and_dying_droplets() {
    let _dir = plugins_or_skip!();
    let d = setup().await;
    let (p, emu) = (&d.p, &d.emu);
    let req = request("uid-lock", "nyc3");
    let id = p.create(&req).await.unwrap();
    p.get(&id).await.unwrap();
    emu.set_locked(&id, true);
    assert_eq!(
        p.get(&id).await.unwrap().state,
        State::Running,
        "a lock keeps the state"
    );
    let err = p.delete(&id).await.unwrap_err();
    assert_eq!(
        (err.class, err.code.as_deref()),
        (Class::Transient, Some("locked")),
        "{err}"
    );
    emu.set_locked(&id, false);

    emu.start_slow_delete(&id);
    for _ in 0..2 {
        let dying = p.get(&id).await.unwrap();
        assert_eq!(
            (dying.state, dying.uid.as_str()),
            (State::Terminated, "uid-lock")
        );
        p.delete(&id).await.unwrap();
    }
    let err = p.create(&req).await.unwrap_err();
    assert_eq!(
        (err.class, err.code.as_deref()),
        (Class::Transient, Some("NameBeingDeleted")),
        "{err}"
    );
    emu.finish_deletes();
    assert_eq!(p.get(&id).await.unwrap_err().class, Class::NotFound);
    assert_ne!(p.create(&req).await.unwrap(), id);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_placement_and_user_data_are_refused_before_any_call() {
    let _dir = plugins_or_skip!();
    let d = setup().await;
    let cases: [(&str, &str, &str); 3] = [
        ("region", "mars1", "placement.region \"mars1\""),
        ("size", "huge", "placement.machineType \"huge\""),
        (
            "image",
            "debian-12-x64",
            "placement.image \"debian-12-x64\"",
        ),
    ];
    for (field, value, text) in cases {
        let mut req = request("uid-p", "nyc3");
        match field {
            "region" => req.placement.region = value.into(),
            "size" => req.placement.machine_type = value.into(),
            _ => req.placement.image = value.into(),
        }
        let err = d.p.create(&req).await.unwrap_err();
        assert_eq!(err.class, Class::Permanent, "{err}");
        assert!(err.message.contains(text), "{err}");
    }
    for (data, code) in [
        (b"\x1f\x8b\x08\x00\xff".to_vec(), "UserDataNotText"),
        (vec![b'x'; 64 * 1024 + 1], "UserDataTooLarge"),
    ] {
        let mut req = request("uid-u", "nyc3");
        req.cloud_init = data;
        let err = d.p.create(&req).await.unwrap_err();
        assert_eq!(
            (err.class, err.code.as_deref()),
            (Class::Permanent, Some(code)),
            "{err}"
        );
    }
    for bad in [
        "", "3164444", "nyc3/", "nyc3/abc", "nyc3/01", "NYC3/1", "nyc3/1/2",
    ] {
        assert_eq!(
            d.p.get(bad).await.unwrap_err().code.as_deref(),
            Some("InvalidId"),
            "{bad:?}"
        );
        assert_eq!(
            d.p.delete(bad).await.unwrap_err().class,
            Class::Permanent,
            "{bad:?}"
        );
    }
    assert!(d.emu.requests().is_empty(), "{:?}", d.emu.requests());
}

/// A config the plugin refuses stops the provider at load, with the field and the value.
#[tokio::test]
async fn config_errors_name_the_field_and_value() {
    let _dir = plugins_or_skip!();
    let rt = support::runtime();
    let plugin = support::load(&rt, "digitalocean.wasm").await;
    let base = "name: do\nplugin: digitalocean.wasm\nsecrets: {token: /nonexistent}\nconfig: ";
    let cases: [(&str, &[&str]); 7] = [
        (
            "{regions: [NYC3], sizes: [s-1vcpu-1gb], images: [debian-12-x64]}",
            &["config.regions", "\"NYC3\""],
        ),
        (
            "{regions: [nyc3], sizes: [], images: [debian-12-x64]}",
            &["config.sizes", "empty"],
        ),
        (
            "{regions: [nyc3], sizes: [s-1vcpu-1gb], images: {debian: 0}}",
            &["config.images[\"debian\"]", "0"],
        ),
        (
            "{endpoint: 'https://api.digitalocean.com', regions: [nyc3], sizes: [a], images: [b]}",
            &["config.endpoint", "/v2"],
        ),
        (
            "{regions: [nyc3], sizes: [a], images: [b], tags: ['egress:x']}",
            &["config.tags", "\"egress:x\""],
        ),
        (
            "{regions: [nyc3], sizes: [a], images: [b], firewall: 1}",
            &["unknown field `firewall`"],
        ),
        ("{sizes: [a], images: [b]}", &["missing field `regions`"]),
    ];
    for (config, want) in cases {
        let err = match rt
            .provider(plugin.clone(), &support::entry(&format!("{base}{config}")))
            .await
        {
            Ok(_) => panic!("{config} was accepted"),
            Err(e) => e.to_string(),
        };
        for w in want {
            assert!(err.contains(w), "{config}: {err:?} lacks {w:?}");
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn check_reports_the_api_with_rate_limit_details() {
    let _dir = plugins_or_skip!();
    let d = setup().await;
    d.p.create(&request("uid-c", "nyc3")).await.unwrap();
    let targets = d.p.check().await.expect("digitalocean has a check");
    assert_eq!(targets.len(), 1);
    let t = &targets[0];
    assert_eq!(
        (t.target.as_str(), t.ready, t.reason.as_str()),
        ("api", true, "Reachable"),
        "{t:?}"
    );
    let detail = |k: &str| {
        t.details
            .iter()
            .find(|(n, _)| n == k)
            .map(|(_, v)| v.as_str())
    };
    assert_eq!(
        (detail("managedDroplets"), detail("rateLimitRemaining")),
        (Some("1"), Some("5000"))
    );
    d.emu.inject(Fault {
        op: FaultOp::List,
        kind: FaultKind::Auth,
        count: 1,
    });
    let t = &d.p.check().await.unwrap()[0];
    assert_eq!(
        (t.ready, t.reason.as_str()),
        (false, "Unauthorized"),
        "{t:?}"
    );
}

/// A cloud-init sentinel and a token sentinel never reach an error, a log line or a span,
/// and the host had nothing to redact.
#[tokio::test]
async fn sentinels_never_leave_the_plugin() {
    let _dir = plugins_or_skip!();
    const CI_SENTINEL: &str = "CLOUDINIT-SENTINEL-do-7f2c";
    const TOKEN_SENTINEL: &str = "TOKEN-SENTINEL-do-31aa";
    let (_guard, captured) = proxy_operator::testing::capture();
    let d = setup_with(DigitalOceanConfig::new(TOKEN_SENTINEL), "").await;
    let p = egress_plugin_host::provider::Instrumented::new(d.p, Default::default());
    let mut req = request("uid-s", "nyc3");
    req.cloud_init = support::sentinels::cloud_init_with(CI_SENTINEL);
    let bad = CreateRequest {
        cloud_init: req.cloud_init.clone(),
        ..request("uid-s2", "nyc3")
    };
    let refuse = || {
        let e = DoError::new(422, "unprocessable_entity", "user_data is invalid");
        d.emu.inject_error(FaultOp::Create, e, 1)
    };
    let seen = support::sentinels::exercise(&p, &d.emu, &req, &bad, refuse).await;
    support::sentinels::assert_nothing_leaked(
        &seen,
        &captured,
        &[CI_SENTINEL, TOKEN_SENTINEL],
        "digitalocean create",
    );
}

/// The whole lifecycle against the real API (`backend-test=integration-tag`): one Droplet
/// for a minute or two in `DIGITALOCEAN_REGION` (default ams3), size
/// `DIGITALOCEAN_SIZE` (default s-1vcpu-512mb-10gb), image debian-12-x64, deleted again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs DIGITALOCEAN_TOKEN (a read-write token of a team to create a Droplet in); run with --ignored"]
async fn real_digitalocean_lifecycle() {
    let _dir = plugins_or_skip!();
    let Ok(token) = std::env::var("DIGITALOCEAN_TOKEN") else {
        eprintln!("SKIPPING real_digitalocean_lifecycle: DIGITALOCEAN_TOKEN is not set");
        return;
    };
    let region = std::env::var("DIGITALOCEAN_REGION").unwrap_or_else(|_| "ams3".into());
    let size = std::env::var("DIGITALOCEAN_SIZE").unwrap_or_else(|_| "s-1vcpu-512mb-10gb".into());
    let secrets = tempfile::tempdir().unwrap();
    let path = secrets.path().join("token");
    std::fs::write(&path, token).unwrap();
    let yaml = format!(
        "name: do-real\nplugin: digitalocean.wasm\nsecrets: {{token: {}}}\n\
         config: {{regions: [{region}], sizes: [{size}], images: [debian-12-x64]}}",
        path.display()
    );
    let p = support::provider(&support::runtime(), "digitalocean.wasm", &yaml).await;
    let uid = support::real_cloud::unique_uid();
    let req = CreateRequest {
        placement: Placement::new(&region, "", &size, "debian-12-x64"),
        installation: support::real_cloud::INSTALLATION.into(),
        ..request(&uid, &region)
    };
    support::real_cloud::lifecycle(&p, &req, support::real_cloud::Pace::default()).await;
}
