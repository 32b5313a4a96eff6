//! Native tests of the pure parts: classification, state mapping, the server JSON, config,
//! placement, tags and IDs. The operations themselves run against the emulator in
//! host/tests/plugins/provider_scaleway.rs.

use super::*;
use egress_guest_sdk::http::HttpError;

fn answer(status: u16, body: &str) -> HttpError {
    HttpError::Status { status, body: body.as_bytes().to_vec(), retry_after: None }
}

/// Captured bodies where the source has one (the SDK's recorded cassettes and reported
/// issues), the SDK's documented error types for the rest.
#[test]
fn classify_table() {
    use ErrorClass::*;
    let cases = [
        // Captured (scaleway-sdk-go cassettes).
        (
            answer(
                404,
                r#"{"type": "not_found", "message": "resource is not found", "resource": "instance_server", "resource_id": "4f70120c-36f1-49d4-90c2-8850e0896970"}"#,
            ),
            NotFound,
            "not_found",
        ),
        (answer(404, r#"{"message": "\"x\" not found", "type": "unknown_resource"}"#), NotFound, "unknown_resource"),
        // Captured: DELETE of a running server.
        (
            answer(400, r#"{"type": "invalid_request_error", "message": "instance should be powered off"}"#),
            Permanent,
            "invalid_request_error",
        ),
        // Captured: poweron of a server that is not stopped.
        (
            answer(412, r#"{"message": "server should be stopped", "type": "precondition_failed"}"#),
            Transient,
            "precondition_failed",
        ),
        (
            answer(
                400,
                r#"{"type": "invalid_arguments", "message": "invalid argument(s)", "details": [{"argument_name": "commercial_type", "reason": "required"}]}"#,
            ),
            Permanent,
            "invalid_arguments",
        ),
        (
            answer(
                403,
                r#"{"type": "quotas_exceeded", "message": "quota(s) exceeded for this resource", "details": [{"resource": "compute_instances", "quota": 10, "current": 10}]}"#,
            ),
            QuotaExceeded,
            "quotas_exceeded",
        ),
        (
            answer(503, r#"{"type": "out_of_stock", "message": "out of stock", "resource": "DEV1-S"}"#),
            QuotaExceeded,
            "out_of_stock",
        ),
        (
            answer(
                401,
                r#"{"type": "denied_authentication", "message": "authentication is denied", "method": "api_key", "reason": "not_found"}"#,
            ),
            Permanent,
            "denied_authentication",
        ),
        (
            answer(
                403,
                r#"{"type": "permissions_denied", "message": "insufficient permissions", "details": [{"resource": "instance_server", "action": "create"}]}"#,
            ),
            Permanent,
            "permissions_denied",
        ),
        (
            answer(409, r#"{"type": "locked", "message": "resource is locked", "resource": "instance_server"}"#),
            Transient,
            "locked",
        ),
        (
            answer(
                409,
                r#"{"type": "transient_state", "message": "resource is in a transient state", "current_state": "starting"}"#,
            ),
            Transient,
            "transient_state",
        ),
        (
            answer(500, r#"{"type": "internal_error", "message": "an internal error occurred"}"#),
            Transient,
            "internal_error",
        ),
        (answer(429, ""), QuotaExceeded, "HTTP429"),
        (
            answer(429, r#"{"type": "too_many_requests", "message": "rate limit exceeded"}"#),
            QuotaExceeded,
            "too_many_requests",
        ),
        // Not the API's envelope: a 404 is "cannot tell", never "gone".
        (answer(404, "<html>Not Found</html>"), Transient, "HTTP404"),
        (answer(502, "<html>Bad Gateway</html>"), Transient, "HTTP502"),
        (answer(401, ""), Permanent, "HTTP401"),
        (HttpError::Transport(http::ErrorCode::ConnectionRefused), Transient, "ConnectionRefused"),
    ];
    for (e, class, code) in cases {
        let shown = format!("{e:?}");
        let got = classify(e);
        assert_eq!((got.class, got.code.as_deref()), (class, Some(code)), "{shown}: {}", got.message);
    }
}

fn server(state: &str, created: &str, ips: serde_json::Value) -> Server {
    serde_json::from_value(json!({"id": "0f1e2d3c-4b5a-4978-8695-a4b3c2d1e0f9", "name": "proxy-x", "state": state,
        "creation_date": created, "public_ips": ips, "tags": ["egress.proxy-operator.dev/uid=u-1"]}))
    .unwrap()
}

#[test]
fn states_lean_to_provisioning_while_starting() {
    let now = 1_800_000_000u64;
    let young = "2027-01-15T08:00:00.000000+00:00"; // now - 0 s
    let old = "2027-01-15T07:00:00.000000+00:00"; // an hour earlier
    assert_eq!(parse_rfc3339(young).unwrap().seconds, now);
    let ip = json!([{"id": "ip-1", "address": "51.15.0.1", "dynamic": false, "family": "inet"}]);
    let cases = [
        ("running", young, ip.clone(), State::Running),
        ("running", old, json!([]), State::Provisioning),
        ("running", old, json!(null), State::Provisioning),
        ("starting", old, ip.clone(), State::Provisioning),
        ("stopped", young, ip.clone(), State::Provisioning),
        ("stopped in place", young, ip.clone(), State::Provisioning),
        ("stopped", old, ip.clone(), State::Stopped),
        ("stopped in place", old, ip.clone(), State::Stopped),
        ("stopping", young, ip.clone(), State::Stopped),
        ("exploded", young, ip.clone(), State::Stopped),
        ("stopped", "not a date", ip.clone(), State::Stopped),
    ];
    for (state, created, ips, want) in cases {
        assert_eq!(state_of(&server(state, created, ips.clone()), now), want, "{state} {created} {ips}");
    }
    let s = server("locked", young, ip);
    assert_eq!(locked(&s).unwrap_err().class, ErrorClass::Transient);
    assert!(locked(&server("running", young, json!([]))).is_ok());
}

/// A server as the API answered it (scaleway-sdk-go's recorded `ListServers`, trimmed).
#[test]
fn captured_server_json() {
    let s: Server = serde_json::from_str(
        r#"{"id": "a941bd74-da1a-4b67-9c71-d81d9e822598", "name": "cli-srv-focused-booth", "commercial_type": "BASIC3-X2C-4G",
        "volumes": {"0": {"boot": false, "volume_type": "sbs_volume", "id": "28016e62-690d-4b8f-b04b-8f77190daba7", "state": "available"}},
        "tags": [], "state": "running", "state_detail": "booted",
        "public_ip": {"id": "cd4d0181-f200-4dda-819d-3173e11685ab", "address": "151.115.165.238", "dynamic": false, "family": "inet"},
        "public_ips": [{"id": "cd4d0181-f200-4dda-819d-3173e11685ab", "address": "151.115.165.238", "dynamic": false, "gateway": "62.210.0.1",
          "netmask": "32", "family": "inet", "provisioning_mode": "dhcp", "tags": [], "state": "attached"}],
        "ipv6": null, "private_ip": null, "creation_date": "2026-02-24T11:29:06.723007+00:00", "zone": "it-mil-1"}"#,
    )
    .unwrap();
    assert_eq!(s.ipv4(), "151.115.165.238");
    assert_eq!(s.flexible_ips(), ["cd4d0181-f200-4dda-819d-3173e11685ab"]);
    assert!(s.local_volumes().is_empty(), "a Block Storage volume is not local");
    assert_eq!(parse_rfc3339(&s.creation_date).unwrap().seconds, 1_771_932_546);

    let v6_and_dynamic = server(
        "running",
        "",
        json!([{"id": "v6", "address": "2001:db8::1", "family": "inet6"}, {"id": "d", "address": "51.15.0.9", "dynamic": true}]),
    );
    assert_eq!(v6_and_dynamic.ipv4(), "51.15.0.9");
    assert_eq!(v6_and_dynamic.flexible_ips(), ["v6"], "a dynamic IP goes with the server");
    let local: Server =
        serde_json::from_value(json!({"volumes": {"0": {"id": "v-1", "volume_type": "l_ssd"}}})).unwrap();
    assert_eq!(local.local_volumes(), ["v-1"]);
    let old_shape: Server = serde_json::from_value(json!({"public_ip": {"id": "ip", "address": "51.15.0.2"}})).unwrap();
    assert_eq!((old_shape.ipv4(), old_shape.flexible_ips()), ("51.15.0.2", vec!["ip".to_string()]));
}

const MIN: &str = r#"{"projectId":"11111111-2222-4333-8444-555555555555","zones":["fr-par-1","nl-ams-1"],
    "commercialTypes":["DEV1-S"],"images":["ubuntu_noble"]}"#;

#[test]
fn config_defaults_and_placement() {
    let c = config::parse(MIN).unwrap();
    assert_eq!(c.endpoint, config::DEFAULT_ENDPOINT);
    assert_eq!(c.security_group_id, None);
    let p = |region: &str, zone: &str, mt: &str, image: &str| Placement::new(region, zone, mt, image);
    assert_eq!(
        c.resolve(&p("", "nl-ams-1", "DEV1-S", "ubuntu_noble")).unwrap(),
        ("nl-ams-1", "DEV1-S", "ubuntu_noble")
    );
    assert!(c.resolve(&p("nl-ams", "nl-ams-1", "DEV1-S", "ubuntu_noble")).is_ok());
    let bad = [
        (p("", "fr-par-2", "DEV1-S", "ubuntu_noble"), "InvalidZone"),
        (p("fr-par", "nl-ams-1", "DEV1-S", "ubuntu_noble"), "InvalidRegion"),
        (p("", "nl-ams-1", "dev1-s", "ubuntu_noble"), "InvalidMachineType"),
        (p("", "nl-ams-1", "DEV1-S", "debian_bookworm"), "InvalidImage"),
    ];
    for (placement, code) in bad {
        assert_eq!(c.resolve(&placement).unwrap_err().code.as_deref(), Some(code), "{placement:?}");
    }
}

#[test]
fn zones_uuids_and_ids() {
    for (z, ok) in [
        ("fr-par-1", true),
        ("pl-waw-3", true),
        ("fr-par", false),
        ("FR-PAR-1", false),
        ("fr/par-1", false),
        ("fr-par-10", false),
    ] {
        assert_eq!(config::is_zone(z), ok, "{z}");
    }
    assert!(config::is_uuid("0f1e2d3c-4b5a-4978-8695-a4b3c2d1e0f9"));
    assert!(!config::is_uuid("0F1E2D3C-4B5A-4978-8695-A4B3C2D1E0F9") && !config::is_uuid("../../etc/passwd"));
    let id = "fr-par-1/0f1e2d3c-4b5a-4978-8695-a4b3c2d1e0f9";
    assert_eq!(ID.parse(id).unwrap(), ("fr-par-1", "0f1e2d3c-4b5a-4978-8695-a4b3c2d1e0f9"));
    for bad in ["", "fr-par-1", "fr-par-1/", "fr-par-1/x", "x/0f1e2d3c-4b5a-4978-8695-a4b3c2d1e0f9", "fr-par-1/a/b"] {
        assert_eq!(ID.parse(bad).unwrap_err().code.as_deref(), Some("InvalidId"), "{bad:?}");
    }
}

#[test]
fn tags_carry_the_marks() {
    let tags = config::create_tags("3f1c2a4e-7b1d-4c8e-9a55-0d6f2b9e1c01", "inst-a").unwrap();
    assert_eq!(
        tags,
        [
            "egress.proxy-operator.dev/managed=true",
            "egress.proxy-operator.dev/uid=3f1c2a4e-7b1d-4c8e-9a55-0d6f2b9e1c01",
            "egress.proxy-operator.dev/installation=inst-a",
        ]
    );
    assert_eq!(mark(&tags, MARK_UID), Some("3f1c2a4e-7b1d-4c8e-9a55-0d6f2b9e1c01"));
    assert_eq!(mark(&tags, "egress.proxy-operator.dev/u"), None, "whole keys only");
    assert_eq!(mark(&["egress.proxy-operator.dev/uid=".to_string()], MARK_UID), Some(""));
    // A value a tag filter cannot carry is hashed, the same way every time.
    let odd = config::installation_tag("team a, prod");
    assert!(odd.starts_with("egress.proxy-operator.dev/installation=sha256-") && !odd[10..].contains([',', ' ']));
    assert_eq!(odd, config::installation_tag("team a, prod"));
    assert_ne!(odd, config::installation_tag("team b, prod"));
    assert_eq!(config::create_tags("a,b", "i").unwrap_err().code.as_deref(), Some("InvalidUid"));
}

#[test]
fn profile_answers_every_axis() {
    let info = Scaleway::info();
    assert_eq!(info.profile.len(), 19, "{:?}", info.profile);
    assert_eq!(info.default_hosts, ["https://api.scaleway.com:443"]);
    let get = |axis: &str| info.profile.iter().find(|(a, _)| a == axis).map(|(_, v)| v.as_str());
    assert_eq!(get("secondary-resources"), Some("explicit"));
    assert_eq!(get("provisioning-state"), Some("create-blocks"));
}
