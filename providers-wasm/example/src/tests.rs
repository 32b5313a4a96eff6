//! Native tests of the pure parts: classify table, state mapping, ID and config parsing.

use super::*;
use egress_guest_sdk::http::ErrorCode;

fn class(e: HttpError) -> ErrorClass {
    classify(e).class
}

fn status(s: u16) -> HttpError {
    HttpError::Status { status: s, body: br#"{"error":"x"}"#.to_vec(), retry_after: None }
}

fn coded(s: u16, code: &str) -> HttpError {
    HttpError::Status { status: s, body: format!(r#"{{"error":"x","code":"{code}"}}"#).into_bytes(), retry_after: None }
}

#[test]
fn classify_table() {
    let cases = [
        (coded(404, "not_found"), ErrorClass::NotFound),
        // A 404 without the backend's code is a wrong URL, not a gone instance.
        (status(404), ErrorClass::Permanent),
        (status(429), ErrorClass::QuotaExceeded),
        (coded(429, "rate_limited"), ErrorClass::QuotaExceeded),
        (coded(403, "quota_exceeded"), ErrorClass::QuotaExceeded),
        (coded(401, "unauthorized"), ErrorClass::Permanent),
        (coded(409, "locked"), ErrorClass::Transient),
        (status(400), ErrorClass::Permanent),
        (status(401), ErrorClass::Permanent),
        (status(403), ErrorClass::Permanent),
        (status(409), ErrorClass::Transient),
        (status(500), ErrorClass::Transient),
        (status(503), ErrorClass::Transient),
        (HttpError::Transport(ErrorCode::ConnectionRefused), ErrorClass::Transient),
        (HttpError::Transport(ErrorCode::HttpRequestDenied), ErrorClass::Transient),
        (HttpError::Json("eof".into()), ErrorClass::Transient),
    ];
    for (e, want) in cases {
        let name = e.to_string();
        assert_eq!(class(e), want, "{name}");
    }
    let e = classify(HttpError::Transport(ErrorCode::ConnectionReadTimeout));
    assert_eq!(e.code.as_deref(), Some("ConnectionReadTimeout"));
    assert_eq!(classify(coded(403, "quota_exceeded")).code.as_deref(), Some("quota_exceeded"));
    assert_eq!(classify(status(503)).code.as_deref(), Some("HTTP503"));
}

fn wire(status: &str, ip: &str) -> Wire {
    Wire {
        id: "i-00000001".into(),
        name: "proxy-x".into(),
        ip: ip.into(),
        status: status.into(),
        region: "r1".into(),
        labels: BTreeMap::from([(MARK_UID.to_string(), "u-1".to_string())]),
        created_at: "2024-05-01T12:00:00Z".into(),
    }
}

#[test]
fn state_mapping() {
    let state = |s, ip| to_instance(wire(s, ip)).state;
    assert_eq!(state("starting", ""), State::Provisioning);
    assert_eq!(state("running", "127.0.0.1"), State::Running);
    assert_eq!(state("running", ""), State::Provisioning);
    assert_eq!(state("stopping", ""), State::Stopped);
    assert_eq!(state("stopped", ""), State::Stopped);
    assert_eq!(state("exploded", ""), State::Stopped);
    assert_eq!(state("deleting", "127.0.0.1"), State::Terminated);

    let i = to_instance(wire("running", "127.0.0.1"));
    assert_eq!(i.id, "r1/i-00000001");
    assert_eq!(i.uid, "u-1");
    assert_eq!(i.created_at.map(|t| t.seconds), Some(1_714_564_800));
    let mut w = wire("running", "");
    w.created_at = "yesterday".into();
    assert!(to_instance(w).created_at.is_none());
}

#[test]
fn ids_are_parsed_strictly() {
    assert_eq!(ID.parse("r1/i-00000001").unwrap(), ("r1", "i-00000001"));
    for bad in ["", "i-1", "r1/", "/i-1", "r1/i-1/x", "r1/../x", "r 1/i-1"] {
        let e = ID.parse(bad).unwrap_err();
        assert_eq!((e.class, e.code.as_deref()), (ErrorClass::Permanent, Some("InvalidId")), "{bad:?}");
    }
}

#[test]
fn config_errors_name_field_and_value() {
    assert!(parse_config(r#"{"endpoint":"http://127.0.0.1:1","regions":[]}"#).is_ok());
    let e = parse_config(r#"{"endpoint":"ftp://x","regions":[]}"#).err().unwrap();
    assert!(e.message.contains("config.endpoint") && e.message.contains("ftp://x"), "{}", e.message);
    let e = parse_config(r#"{"endpoint":"http://x","regions":["ok","b@d"]}"#).err().unwrap();
    assert!(e.message.contains("config.regions") && e.message.contains("b@d"), "{}", e.message);
    let e = parse_config(r#"{"endpoint":"http://x","regions":[],"extra":1}"#).err().unwrap();
    assert!(e.message.contains("extra"), "{}", e.message);
    assert!(parse_config("{}").is_err());
}
