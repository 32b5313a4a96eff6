//! Native tests of the pure parts: classify table (Vultr's answers as its reference and
//! clients show them), state mapping, IP filtering, marks, IDs and config validation.

use super::*;
use egress_guest_sdk::http::{ErrorCode, HttpError};

/// Vultr's error envelope: `{"error": message, "status": code}`.
fn vultr(status: u16, message: &str) -> HttpError {
    let body = json!({"error": message, "status": status}).to_string().into_bytes();
    HttpError::Status { status, body, retry_after: None }
}

fn bare(status: u16, body: &str) -> HttpError {
    HttpError::Status { status, body: body.as_bytes().to_vec(), retry_after: None }
}

#[test]
fn classify_table() {
    use ErrorClass::*;
    let cases = [
        (vultr(404, "instance not found"), NotFound),
        // Not Vultr's verdict: cannot tell, so never "gone".
        (bare(404, "<html>Not Found</html>"), Transient),
        (bare(404, ""), Transient),
        (vultr(429, "Rate limit exceeded"), QuotaExceeded),
        (bare(429, ""), QuotaExceeded),
        (
            vultr(400, "Server add failed: You have reached the maximum number of active instances for this account."),
            QuotaExceeded,
        ),
        (vultr(400, "Invalid plan ID"), Permanent),
        (vultr(401, "Invalid API token."), Permanent),
        (vultr(403, "Unauthorized IP address"), Permanent),
        (vultr(409, "conflict"), Transient),
        (vultr(500, "Internal server error"), Transient),
        (vultr(503, "Service unavailable"), Transient),
        (bare(502, "<html>Bad Gateway</html>"), Transient),
        (HttpError::Transport(ErrorCode::ConnectionRefused), Transient),
        (HttpError::Json("eof".into()), Transient),
    ];
    for (e, want) in cases {
        let shown = e.to_string();
        assert_eq!(classify(e).class, want, "{shown}");
    }
    let e = classify(vultr(404, "instance not found"));
    assert_eq!(e.code.as_deref(), Some("HTTP404"));
    assert_eq!(e.message, "Vultr API answered HTTP 404 instance not found");
}

fn wire(status: &str, power: &str, server: &str, ip: &str) -> Wire {
    Wire {
        id: "cb676a46-66fd-4dfb-b839-443f2e6c0b60".into(),
        status: status.into(),
        power_status: power.into(),
        server_status: server.into(),
        main_ip: ip.into(),
        ..Wire::default()
    }
}

#[test]
fn state_table() {
    let ip = "203.0.113.7";
    let cases = [
        (wire("pending", "running", "none", "0.0.0.0"), State::Provisioning, ""),
        (wire("pending", "stopped", "none", "0.0.0.0"), State::Provisioning, ""),
        (wire("active", "running", "installingbooting", ip), State::Provisioning, ""),
        (wire("active", "running", "none", ip), State::Provisioning, ""),
        (wire("active", "running", "ok", ip), State::Running, ip),
        (wire("active", "running", "locked", ip), State::Running, ip),
        // Running is never reported with 0.0.0.0, a private or an empty address.
        (wire("active", "running", "ok", "0.0.0.0"), State::Provisioning, ""),
        (wire("active", "running", "ok", "10.1.2.3"), State::Provisioning, ""),
        (wire("active", "running", "ok", "192.168.0.9"), State::Provisioning, ""),
        (wire("active", "running", "ok", "169.254.1.1"), State::Provisioning, ""),
        (wire("active", "running", "ok", ""), State::Provisioning, ""),
        (wire("active", "running", "ok", "not an ip"), State::Provisioning, ""),
        (wire("resizing", "running", "locked", ip), State::Provisioning, ""),
        (wire("active", "stopped", "ok", ip), State::Stopped, ""),
        (wire("active", "stopped", "locked", ip), State::Stopped, ""),
        (wire("suspended", "stopped", "ok", ip), State::Stopped, ""),
        (wire("exploded", "running", "ok", ip), State::Stopped, ""),
        (wire("", "", "", ""), State::Stopped, ""),
    ];
    for (w, want, want_ip) in cases {
        let i = to_instance(&w, "ewr/x".into());
        assert_eq!((i.state, i.ip.as_str()), (want, want_ip), "{w:?}");
    }
}

#[test]
fn marks_round_trip_through_tags() {
    let uid = "3f1c2a4e-7b1d-4c8e-9a55-0d6f2b9e1c01";
    let w = Wire {
        tags: vec![
            "a tag".into(),
            tag(MARK_MANAGED, MARK_MANAGED_YES),
            tag(MARK_UID, uid),
            tag(MARK_INSTALLATION, "inst=with=equals"),
            format!("{MARK_UID}x=nope"),
        ],
        date_created: "2020-10-10T01:56:20+00:00".into(),
        ..wire("active", "running", "ok", "203.0.113.1")
    };
    assert_eq!(w.mark(MARK_MANAGED), Some("true"));
    assert_eq!(w.mark(MARK_UID), Some(uid));
    assert_eq!(w.mark(MARK_INSTALLATION), Some("inst=with=equals"));
    assert_eq!(w.mark("egress.proxy-operator.dev/other"), None);
    let i = to_instance(&w, "ewr/x".into());
    assert_eq!(i.uid, uid);
    assert_eq!(i.created_at.map(|d| d.seconds), Some(1_602_294_980));
    assert_eq!(to_instance(&Wire::default(), "ewr/x".into()).uid, "");
}

#[test]
fn twins_keep_the_oldest_then_lowest_id() {
    let at = |id: &str, t: &str| Wire { id: id.into(), date_created: t.into(), ..Wire::default() };
    let mut twins = [
        at("b0", "2024-01-01T00:00:01+00:00"),
        at("a9", "2024-01-01T00:00:01+00:00"),
        at("00", "2024-01-01T00:00:02+00:00"),
    ];
    twins.sort_by_key(age_key);
    assert_eq!(twins.iter().map(|w| w.id.as_str()).collect::<Vec<_>>(), ["a9", "b0", "00"]);
}

#[test]
fn ids_parse_strictly() {
    let good = "ewr/cb676a46-66fd-4dfb-b839-443f2e6c0b60";
    assert_eq!(ID.parse(good).unwrap(), ("ewr", "cb676a46-66fd-4dfb-b839-443f2e6c0b60"));
    for bad in ["", "ewr", "ewr/", "/x", "EWR/abc", "ewr/ABC", "ewr/../x", "ewr/a/b", "ewr/a?b", "ewr/zz"] {
        let e = ID.parse(bad).unwrap_err();
        assert_eq!((e.class, e.code.as_deref()), (ErrorClass::Permanent, Some("InvalidId")), "{bad:?}");
    }
}

const GOOD: &str = r#"{"regions":["ewr","fra"],"plans":["vc2-1c-1gb"],"images":{"debian":2136}}"#;

#[test]
fn config_validation_names_field_and_value() {
    let cfg = config::parse(GOOD).unwrap();
    assert_eq!(cfg.endpoint, "https://api.vultr.com/v2");
    let cases = [
        (r#"{"regions":["EWR"],"plans":["p"],"images":{"d":1}}"#, r#"config.regions entry "EWR" is invalid"#),
        (r#"{"regions":[],"plans":["p"],"images":{"d":1}}"#, "config.regions is empty"),
        (r#"{"regions":["ewr","ewr"],"plans":["p"],"images":{"d":1}}"#, r#"config.regions lists "ewr" twice"#),
        (r#"{"regions":["ewr"],"plans":["p q"],"images":{"d":1}}"#, r#"config.plans entry "p q" is invalid"#),
        (r#"{"regions":["ewr"],"plans":["p"],"images":{}}"#, "config.images is empty"),
        (r#"{"regions":["ewr"],"plans":["p"],"images":{"d":0}}"#, "config.images.d 0 is invalid"),
        (r#"{"regions":["ewr"],"plans":["p"],"images":{"d/x":1}}"#, r#"config.images key "d/x" is invalid"#),
        (r#"{"regions":["ewr"],"plans":["p"],"images":{"d":"debian"}}"#, "config.images.d:"),
        (
            r#"{"regions":["ewr"],"plans":["p"],"images":{"d":1},"sshKeyIds":["k!"]}"#,
            r#"config.sshKeyIds entry "k!" is invalid"#,
        ),
        (
            r#"{"regions":["ewr"],"plans":["p"],"images":{"d":1},"firewallGroupId":"FW"}"#,
            r#"config.firewallGroupId "FW" is invalid"#,
        ),
        (r#"{"regions":["ewr"],"plans":["p"],"images":{"d":1},"endpoint":"https://api.vultr.com"}"#, "config.endpoint"),
        (r#"{"regions":["ewr"],"plans":["p"],"images":{"d":1},"zones":[]}"#, "unknown field `zones`"),
    ];
    for (json, want) in cases {
        let e = config::parse(json).unwrap_err();
        assert_eq!(e.code.as_deref(), Some("InvalidConfig"), "{json}");
        assert!(e.message.contains(want), "{json}: {:?} lacks {want:?}", e.message);
    }
}

#[test]
fn placement_is_checked_against_the_catalogue() {
    let cfg = config::parse(GOOD).unwrap();
    let p = |r: &str, m: &str, i: &str| Placement::new(r, "ignored", m, i);
    let place = cfg.resolve(&p("fra", "vc2-1c-1gb", "debian")).unwrap();
    assert_eq!((place.region, place.plan, place.os_id), ("fra", "vc2-1c-1gb", 2136));
    let cases = [
        (p("mars", "vc2-1c-1gb", "debian"), "InvalidRegion", r#"placement.region "mars""#),
        (p("ewr", "big", "debian"), "InvalidMachineType", r#"placement.machineType "big""#),
        (p("ewr", "vc2-1c-1gb", "2136"), "InvalidImage", r#"placement.image "2136""#),
    ];
    for (placement, code, want) in cases {
        let e = cfg.resolve(&placement).err().unwrap();
        assert_eq!(e.code.as_deref(), Some(code));
        assert!(e.message.contains(want), "{}", e.message);
    }
}

#[test]
fn profile_names_every_axis_once() {
    let info = Vultr::info();
    assert_eq!(info.profile.len(), 19);
    assert_eq!(info.default_hosts, ["https://api.vultr.com:443"]);
}

/// Monthly price (a JSON number) -> hourly micros: the monthly price over 672 hours (730 for
/// Cloud GPU), half up, only in the plan's locations.
#[test]
fn plan_prices_in_micros() {
    let plan = |kind: &str, monthly: serde_json::Value| json!({"id": "p", "type": kind, "monthly_cost": monthly, "locations": ["ewr", "fra"]});
    let cases = [
        // 5 / 672 = 0.0074404..., 10 / 672 = 0.0148809...
        ("vc2", json!(5), Some(7_440)),
        ("vc2", json!(10), Some(14_881)),
        ("vc2", json!(2.5), Some(3_720)),
        // Vultr's Go client reads it as a float32: 3.5 and 192 survive as they are.
        ("vhf", json!(3.5), Some(5_208)),
        ("vhf", json!(192), Some(285_714)),
        ("vcg", json!(730), Some(1_000_000)),
        ("vcg", json!(1), Some(1_370)),
        ("vc2", json!(0), Some(0)),
        ("vc2", json!(-5), None),
        ("vc2", json!(null), None),
        ("vc2", json!("5"), None),
        ("vc2", json!(1e6), None),
    ];
    for (kind, monthly, want) in cases {
        assert_eq!(api::hourly_micros(&plan(kind, monthly.clone()), "ewr"), want, "{kind} {monthly}");
    }
    assert_eq!(api::hourly_micros(&plan("vc2", json!(5)), "sgp"), None, "not valid for use in sgp");
    assert_eq!(api::hourly_micros(&json!({"type": "vc2", "monthly_cost": 5}), "ewr"), None, "no locations");
}
