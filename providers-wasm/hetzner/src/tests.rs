//! Native tests of the pure parts that live in lib.rs: user data, instance building,
//! adoption, the create answer's actions and the profile. Module tests cover the config,
//! marks, classify and state tables.

use super::*;
use egress_guest_sdk::Placement;
use std::collections::BTreeMap;

fn server(status: &str, ip: &str, uid: Option<&str>) -> Server {
    let mut labels = BTreeMap::new();
    if let Some(uid) = uid {
        labels.insert(MARK_UID.to_string(), uid.to_string());
    }
    serde_json::from_value(json!({
        "id": 4_200_001,
        "name": "proxy-x",
        "status": status,
        "created": "2024-05-01T12:00:00+00:00",
        "public_net": {"ipv4": if ip.is_empty() { json!(null) } else { json!({"id": 8_700_001, "ip": ip}) }},
        "datacenter": {"location": {"name": "nbg1"}},
        "labels": labels,
    }))
    .unwrap()
}

fn request(uid: &str) -> CreateRequest {
    CreateRequest {
        name: "proxy-x".into(),
        uid: uid.into(),
        namespace: "ns".into(),
        proxy_name: "p".into(),
        installation: "inst".into(),
        placement: Placement::new("", "", "", ""),
        cloud_init: Vec::new(),
        port: 3128,
        ip_family: egress_guest_sdk::IpFamily::Ipv4,
    }
}

#[test]
fn user_data_is_sent_as_is_or_base64_when_binary() {
    assert_eq!(user_data(b"").unwrap(), None);
    let text = "#cloud-config\nruncmd: [echo ünïcødé]\n";
    assert_eq!(user_data(text.as_bytes()).unwrap().as_deref(), Some(text));
    let binary = b"\x1f\x8b\x08\x00gzip\xff\x00";
    let sent = user_data(binary).unwrap().unwrap();
    assert_eq!(BASE64.decode(sent.as_bytes()).unwrap(), binary);

    assert!(user_data(&vec![b'a'; USER_DATA_MAX]).is_ok());
    let e = user_data(&vec![b'a'; USER_DATA_MAX + 1]).unwrap_err();
    assert_eq!(
        (e.class, e.code.as_deref()),
        (ErrorClass::Permanent, Some("UserDataTooLarge"))
    );
    // Binary data counts with its encoding: 3/4 of the limit raw is over it encoded.
    let e = user_data(&vec![0xff; USER_DATA_MAX * 3 / 4 + 3]).unwrap_err();
    assert!(e.message.contains("base64"), "{}", e.message);
}

#[test]
fn instances_read_everything_back() {
    let i = to_instance(
        &server("running", "203.0.113.10", Some("u-1")),
        "nbg1/4200001".into(),
    );
    assert_eq!(i.id, "nbg1/4200001");
    assert_eq!(
        (i.state, i.ip.as_str(), i.uid.as_str()),
        (State::Running, "203.0.113.10", "u-1")
    );
    assert_eq!(i.created_at.map(|t| t.seconds), Some(1_714_564_800));

    let i = to_instance(&server("running", "", None), "x".into());
    assert_eq!((i.state, i.uid.as_str()), (State::Provisioning, ""));
    let mut s = server("initializing", "203.0.113.10", Some(""));
    assert_eq!(
        to_instance(&s, "x".into()).state,
        State::Provisioning,
        "an address is not readiness"
    );
    s.created = "yesterday".into();
    assert!(to_instance(&s, "x".into()).created_at.is_none());
}

#[test]
fn adoption_verifies_the_uid() {
    let id = adopt(
        &server("running", "1.2.3.4", Some("u-1")),
        &request("u-1"),
        "fsn1",
    )
    .unwrap();
    assert_eq!(id, "nbg1/4200001", "the server's own location wins");

    let e = adopt(&server("running", "", Some("u-2")), &request("u-1"), "fsn1").unwrap_err();
    assert_eq!(
        (e.class, e.code.as_deref()),
        (ErrorClass::Permanent, Some("NameTaken"))
    );
    assert!(
        e.message.contains("u-2") && e.message.contains("proxy-x"),
        "{}",
        e.message
    );
    let e = adopt(&server("running", "", None), &request("u-1"), "fsn1").unwrap_err();
    assert_eq!(e.code.as_deref(), Some("NameTaken"));

    let e = adopt(
        &server("deleting", "", Some("u-1")),
        &request("u-1"),
        "fsn1",
    )
    .unwrap_err();
    assert_eq!(
        (e.class, e.code.as_deref()),
        (ErrorClass::Transient, Some("NameBeingDeleted"))
    );
}

#[test]
fn actions_of_the_create_answer() {
    let answer = |action: &str, next: &str| -> api::Created {
        serde_json::from_str(&format!(
            r#"{{"server":{{"id":7,"name":"proxy-x","status":"initializing"}},"action":{action},"next_actions":{next},"root_password":null}}"#
        ))
        .unwrap()
    };
    let running = r#"{"id":1,"command":"create_server","status":"running","error":null}"#;
    let start = r#"[{"id":2,"command":"start_server","status":"running","error":null}]"#;
    assert!(failed_action(&answer(running, start)).is_none());
    assert!(failed_action(&answer("null", "null")).is_none());

    let failed = r#"[{"id":2,"command":"start_server","status":"error","error":{"code":"action_failed","message":"Action failed"}}]"#;
    let e = failed_action(&answer(running, failed)).unwrap();
    assert_eq!(
        (e.class, e.code.as_deref()),
        (ErrorClass::Transient, Some("action_failed"))
    );
    assert!(
        e.message.contains("start_server") && e.message.contains("server 7"),
        "{}",
        e.message
    );

    let no_capacity = r#"{"id":1,"command":"create_server","status":"error","error":{"code":"resource_unavailable","message":"x"}}"#;
    let e = failed_action(&answer(no_capacity, "[]")).unwrap();
    assert_eq!(e.class, ErrorClass::QuotaExceeded);
}

#[test]
fn info_names_the_type_hosts_and_check() {
    let info = <Hetzner as Provider>::info();
    assert_eq!(info.type_name, "hetzner");
    assert!(info.has_check);
    assert_eq!(
        info.default_hosts,
        vec!["https://api.hetzner.cloud:443".to_string()]
    );
    // The profile itself is checked, axis by axis, by the conformance suite
    // (`profile-answers-every-axis`).
    assert!(!info.profile.is_empty());
}
