//! Native tests of the pure parts: config, tags, IDs, classification, states, user data,
//! timestamps and the root password.

use super::*;
use crate::api::{LN, Paged};
use egress_guest_sdk::http::HttpError;
use egress_guest_sdk::{ErrorClass, Placement, PlacementField};
use serde_json::Value;

const MIN: &str = r#"{"regions":["us-east"],"types":["g6-nanode-1"],"images":["linode/debian12"]}"#;

fn patched(patch: &str) -> String {
    let mut v: Value = serde_json::from_str(MIN).unwrap();
    for (k, val) in serde_json::from_str::<Value>(patch).unwrap().as_object().unwrap() {
        v[k] = val.clone();
    }
    v.to_string()
}

#[test]
fn config_defaults_and_placement() {
    let c = config::parse(MIN).unwrap();
    assert_eq!(c.endpoint, config::DEFAULT_ENDPOINT);
    assert_eq!(c.images, ["linode/debian12"]);
    let c = config::parse(&patched(
        r#"{"endpoint":"http://127.0.0.1:9/v4/","images":["linode/debian12","linode/ubuntu24.04"],"firewallId":7,
            "authorizedKeys":["ssh-ed25519 AAAAC3Nza ops@example"]}"#,
    ))
    .unwrap();
    assert_eq!((c.endpoint.as_str(), c.firewall_id), ("http://127.0.0.1:9/v4", Some(7)));
    let p = Placement::new("us-east", "x", "g6-nanode-1", "linode/debian12");
    let r = c.resolve(&p).unwrap();
    assert_eq!((r.region, r.linode_type, r.image), ("us-east", "g6-nanode-1", "linode/debian12"));
    for (field, value, code) in [
        ("region", "mars-1", PlacementField::Region),
        ("machineType", "g6-huge", PlacementField::MachineType),
        ("image", "linode/debian11", PlacementField::Image),
    ] {
        let mut bad = p.clone();
        match field {
            "region" => bad.region = value.into(),
            "machineType" => bad.machine_type = value.into(),
            _ => bad.image = value.into(),
        }
        let e = c.resolve(&bad).unwrap_err();
        assert_eq!(e.code.as_deref(), Some(code.code()));
        assert!(e.message.contains(&format!("placement.{field} {value:?}")), "{}", e.message);
    }
}

/// Every rejected config names the field and the offending value.
#[test]
fn config_errors_name_field_and_value() {
    let cases: &[(&str, &[&str])] = &[
        (r#"{"endpoint":"https://api.linode.com/v3"}"#, &["config.endpoint", "api.linode.com/v3", "/v4"]),
        (r#"{"endpoint":"ftp://x/v4"}"#, &["config.endpoint", "ftp://x/v4"]),
        (r#"{"regions":[]}"#, &["config.regions", "empty"]),
        (r#"{"regions":["US-East"]}"#, &["config.regions", "\"US-East\""]),
        (r#"{"regions":["us/east"]}"#, &["config.regions", "\"us/east\""]),
        (r#"{"regions":["us-east","us-east"]}"#, &["config.regions", "\"us-east\" twice"]),
        (r#"{"types":["g6 nanode"]}"#, &["config.types", "\"g6 nanode\""]),
        (r#"{"types":[1]}"#, &["config.types[0]", "1"]),
        (r#"{"images":[]}"#, &["config.images", "empty"]),
        (r#"{"images":"linode/debian12"}"#, &["config.images", "linode/debian12"]),
        (r#"{"images":[7]}"#, &["config.images[0]", "7"]),
        (r#"{"images":["has space"]}"#, &["config.images entry", "\"has space\""]),
        (r#"{"images":["linode/debian12","linode/debian12"]}"#, &["config.images", "twice"]),
        (r#"{"firewallId":0}"#, &["config.firewallId", "0"]),
        (r#"{"firewallId":-1}"#, &["config.firewallId", "-1"]),
        (r#"{"authorizedKeys":["nospace"]}"#, &["config.authorizedKeys", "\"nospace\""]),
        (r#"{"rootPass":"x"}"#, &["rootPass"]),
    ];
    for (patch, want) in cases {
        let e = config::parse(&patched(patch)).err().unwrap_or_else(|| panic!("{patch} was accepted"));
        assert_eq!((e.class, e.code.as_deref()), (ErrorClass::Permanent, Some("InvalidConfig")), "{patch}");
        for w in *want {
            assert!(e.message.contains(w), "{patch}: {:?} lacks {w:?}", e.message);
        }
    }
}

#[test]
fn tags_fit_linode_and_read_back() {
    let uid = "3f1c2a4e-7b1d-4c8e-9a55-0d6f2b9e1c01";
    let tags = marks::create_tags(uid, "egress-conformance").unwrap();
    assert_eq!(tags, ["egress-managed", &format!("egress-uid:{uid}"), "egress-inst:egress-conformance"]);
    assert!(tags.iter().all(|t| (3..=50).contains(&t.len())), "{tags:?}");
    assert_eq!(marks::uid_of(&tags), uid);
    assert!(marks::is_gc_match(&tags, "egress-conformance") && !marks::is_gc_match(&tags, "other"));
    assert!(!marks::is_gc_match(&tags[1..], "egress-conformance"), "the managed tag is required");
    assert_eq!(marks::uid_of(&["egress-managed".to_string()]), "");
    // Too long or not lowercase: hashed, deterministically, and still a valid tag.
    for inst in ["Cluster/Prod", &"x".repeat(39), ""] {
        let v = marks::installation_value(inst);
        assert!(v.starts_with("sha256-") && v.len() == 31 && v == marks::installation_value(inst), "{v}");
    }
    assert_eq!(marks::installation_value("cluster/prod"), "sha256-2x5dphpyg63fkszwlmxq6ger");
    let e = marks::create_tags(&"a".repeat(40), "i").unwrap_err();
    assert_eq!(e.code.as_deref(), Some("InvalidUid"));
    let f: Value = serde_json::from_str(&marks::gc_filter("inst-a")).unwrap();
    assert_eq!(f, serde_json::json!({"+and": [{"tags": "egress-managed"}, {"tags": "egress-inst:inst-a"}]}));
}

#[test]
fn ids_are_parsed_strictly() {
    assert_eq!(parse_id("us-east/12345678").unwrap(), ("us-east", 12_345_678));
    for bad in ["", "12345678", "us-east/", "/1", "us-east/1/2", "us-east/01", "US-EAST/1", "us-east/1e3", "../1"] {
        let e = parse_id(bad).unwrap_err();
        assert_eq!((e.class, e.code.as_deref()), (ErrorClass::Permanent, Some("InvalidId")), "{bad:?}");
    }
}

fn answer(status: u16, body: &str) -> HttpError {
    HttpError::Status { status, body: body.as_bytes().to_vec(), retry_after: None }
}

/// Linode's error bodies as the API and issue reports show them.
#[test]
fn classify_table() {
    use ErrorClass::*;
    let err = |reason: &str| format!(r#"{{"errors":[{{"reason":"{reason}"}}]}}"#);
    let cases = [
        (answer(404, &err("Not found")), NotFound),
        (answer(404, "<html>404 Not Found</html>"), Permanent), // not Linode's verdict
        (answer(429, &err("Too Many Requests")), QuotaExceeded),
        (answer(400, &err("Account Limit reached. Please open a support ticket.")), QuotaExceeded),
        (answer(400, &err("Linode busy.")), Transient),
        (answer(408, &err("Please try again")), Transient),
        (answer(500, &err("Internal server error")), Transient),
        (answer(502, ""), Transient),
        (answer(401, &err("Invalid Token")), Permanent),
        (answer(403, &err("Unauthorized")), Permanent),
        (answer(400, r#"{"errors":[{"reason":"type is not valid","field":"type"}]}"#), Permanent),
        (HttpError::Transport(egress_guest_sdk::http::ErrorCode::ConnectionRefused), Transient),
    ];
    for (e, want) in cases {
        let shown = format!("{e:?}");
        assert_eq!(classify(e).class, want, "{shown}");
    }
    let e = classify(answer(400, r#"{"errors":[{"reason":"Account Limit reached. Please open a support ticket."}]}"#));
    assert_eq!(e.message, "Linode API answered HTTP 400 Account Limit reached. Please open a support ticket.");
    let taken = answer(400, r#"{"errors":[{"reason":"Label must be unique among your Linodes","field":"label"}]}"#);
    assert!(api::label_taken(&taken) && !api::label_taken(&answer(400, &err("Linode busy."))));
    assert!(LN.is_gone(&answer(404, &err("Not found"))) && !LN.is_gone(&answer(404, "")));
    // A missing collection is a wrong endpoint, never "gone".
    assert_eq!(api::not_gone(answer(404, &err("Not found")), "x").class, Permanent);
}

#[test]
fn states_never_stop_a_linode_on_its_way_up() {
    let cases = [
        ("provisioning", false, None, State::Provisioning),
        ("booting", true, Some(10), State::Provisioning),
        ("running", true, Some(10), State::Running),
        ("running", false, Some(10), State::Provisioning),
        ("rebooting", true, None, State::Provisioning),
        ("busy", true, None, State::Provisioning),
        ("migrating", true, None, State::Provisioning),
        ("deleting", true, None, State::Terminated),
        ("offline", true, Some(10), State::Provisioning),
        ("offline", true, Some(START_GRACE_SECS), State::Stopped),
        ("offline", true, None, State::Stopped),
        ("shutting_down", true, Some(10), State::Stopped),
        ("stopped", true, Some(10), State::Stopped),
        ("billing_suspension", true, None, State::Stopped),
        ("exploded", true, Some(10), State::Stopped),
    ];
    for (status, ip, age, want) in cases {
        assert_eq!(state_of(status, ip, age), want, "{status} ip={ip} age={age:?}");
    }
}

#[test]
fn linodes_read_everything_back() {
    let l: Linode = serde_json::from_value(serde_json::json!({
        "id": 123, "label": "proxy-x", "status": "running", "region": "us-east", "created": "2024-05-01T12:00:00",
        "ipv4": ["192.168.130.7", "203.0.113.10"], "tags": ["egress-managed", "egress-uid:u-1"], "ipv6": null,
        "specs": {"disk": 25600}, "type": "g6-nanode-1",
    }))
    .unwrap();
    let i = to_instance(&l, "us-east/123".into());
    assert_eq!((i.state, i.ip.as_str(), i.uid.as_str()), (State::Running, "203.0.113.10", "u-1"));
    assert_eq!(i.created_at.map(|t| t.seconds), Some(1_714_564_800));
    assert_eq!(api::created_rfc3339("2024-05-01T12:00:00Z"), "2024-05-01T12:00:00Z");
    assert_eq!(api::created_rfc3339("2024-05-01T12:00:00+02:00"), "2024-05-01T12:00:00+02:00");
    let nulls: Linode = serde_json::from_str(r#"{"id":1,"ipv4":null,"tags":null}"#).unwrap();
    assert_eq!((nulls.public_ipv4(), marks::uid_of(&nulls.tags)), ("", ""));
    let p: Paged = serde_json::from_str(r#"{"data":[],"page":1,"pages":0,"results":0}"#).unwrap();
    assert_eq!((p.page, p.pages, p.data.len()), (1, 0, 0));
}

#[test]
fn user_data_is_base64_and_bounded() {
    assert_eq!(user_data(b"").unwrap(), None);
    let raw = b"#cloud-config\n\xff\x00binary too\n";
    assert_eq!(BASE64.decode(user_data(raw).unwrap().unwrap().as_bytes()).unwrap(), raw);
    assert!(user_data(&vec![b'a'; USER_DATA_MAX]).is_ok());
    let e = user_data(&vec![b'a'; USER_DATA_MAX + 1]).unwrap_err();
    assert_eq!((e.class, e.code.as_deref()), (ErrorClass::Permanent, Some("UserDataTooLarge")));
}

#[test]
fn root_passwords_are_long_random_and_fresh() {
    let (a, b) = (root_pass(), root_pass());
    assert_eq!(a.len(), 40);
    assert_ne!(a, b);
    assert!(a.bytes().all(|c| c.is_ascii_alphanumeric() || c == b'-' || c == b'_'));
}

#[test]
fn profile_answers_every_axis_once() {
    let info = PluginInfo::new("linode", "0").with_profile(PROFILE);
    assert_eq!(info.profile.len(), 19);
    let mut axes: Vec<&str> = info.profile.iter().map(|(a, _)| a.as_str()).collect();
    axes.dedup();
    assert_eq!(axes.len(), 19);
}
