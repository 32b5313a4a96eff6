//! Native tests of the pure parts in lib.rs: user data, states and instances, and the profile. Module tests cover the
//! config, labels, IDs, tokens and the classify table.

use super::*;

fn vm(status: &str, nat_ip: Option<&str>, labels: serde_json::Value) -> Vm {
    let access = match nat_ip {
        Some(ip) => json!([{"type": "ONE_TO_ONE_NAT", "natIP": ip}]),
        None => json!([{"type": "ONE_TO_ONE_NAT"}]),
    };
    serde_json::from_value(json!({
        "name": "proxy-x", "zone": "https://compute.googleapis.com/compute/v1/projects/p/zones/europe-west1-b",
        "status": status, "creationTimestamp": "2024-06-26T11:42:22.006-07:00", "labels": labels,
        "networkInterfaces": [{"networkIP": "10.132.0.2", "accessConfigs": access}],
    }))
    .unwrap()
}

#[test]
fn user_data_is_text_up_to_256_kib() {
    let text = "#cloud-config\nruncmd: [echo ünïcødé]\n";
    assert_eq!(user_data(text.as_bytes()).unwrap(), text);
    assert!(user_data(&vec![b'a'; USER_DATA_MAX]).is_ok());
    let e = user_data(&vec![b'a'; USER_DATA_MAX + 1]).unwrap_err();
    assert_eq!(e.code.as_deref(), Some("UserDataTooLarge"));
    let e = user_data(b"\x1f\x8b\x08\x00gzip\xff").unwrap_err();
    assert_eq!((e.class, e.code.as_deref()), (sdk::ErrorClass::Permanent, Some("UserDataNotText")));
    assert!(!e.message.contains("gzip"), "never the contents: {}", e.message);
}

/// Status and the external address -> state; only RUNNING with a natIP is Running, the internal address never counts.
#[test]
fn states_and_addresses() {
    let cases = [
        ("PROVISIONING", None, State::Provisioning),
        ("STAGING", Some("203.0.113.7"), State::Provisioning),
        ("RUNNING", Some("203.0.113.7"), State::Running),
        ("RUNNING", None, State::Provisioning),
        ("REPAIRING", Some("203.0.113.7"), State::Provisioning),
        ("STOPPING", Some("203.0.113.7"), State::Stopped),
        ("SUSPENDING", None, State::Stopped),
        ("SUSPENDED", None, State::Stopped),
        ("TERMINATED", None, State::Stopped),
        ("STOPPED", None, State::Stopped),
        ("EXPLODED", Some("203.0.113.7"), State::Stopped),
    ];
    for (status, ip, want) in cases {
        let i = to_instance(&vm(status, ip, json!({})), "p/z/n".into(), false);
        assert_eq!((i.state, i.ip.as_str()), (want, ip.unwrap_or("")), "{status}");
    }
}

#[test]
fn instances_read_uid_and_created_at_back() {
    let i = to_instance(
        &vm("RUNNING", None, json!({"egress-managed": "true", "egress-uid": "u-1_2fx"})),
        "id".into(),
        false,
    );
    assert_eq!(i.uid, "u-1/x");
    // 2024-06-26T18:42:22Z
    assert_eq!(i.created_at.map(|t| t.seconds), Some(1_719_427_342));
    let mut v = vm("RUNNING", None, json!(null));
    v.creation_timestamp = "yesterday".into();
    let i = to_instance(&v, "id".into(), false);
    assert_eq!((i.uid.as_str(), i.created_at.is_none()), ("", true));
}

#[test]
fn info_names_the_type_hosts_and_check() {
    let info = <Gce as Provider>::info();
    assert_eq!(info.type_name, "gce");
    assert!(info.has_check);
    assert_eq!(info.default_hosts, ["https://compute.googleapis.com:443", "https://oauth2.googleapis.com:443"]);
    assert!(!info.default_hosts.iter().any(|h| h.contains("169.254")), "the metadata server is never a default");
    assert_eq!(info.profile.len(), 19);
}

/// A Spot insert's scheduling is the one the Scheduling schema requires of a Spot VM, deleted when preempted.
#[test]
fn spot_scheduling_is_what_a_spot_vm_needs() {
    let s: serde_json::Value = serde_json::from_str(SPOT_SCHEDULING).unwrap();
    assert_eq!(
        s,
        json!({"provisioningModel": "SPOT", "instanceTerminationAction": "DELETE", "automaticRestart": false,
               "onHostMaintenance": "TERMINATE"})
    );
}

/// Stockouts of a Spot insert are SpotCapacityUnavailable naming GCE's code; any other failure keeps its own.
#[test]
fn spot_stockouts_are_quota_with_their_own_code() {
    for code in STOCKOUTS {
        let op = Operation {
            name: "operation-1-a".into(),
            status: "DONE".into(),
            error: json!({"errors": [{"code": code, "message": "The zone 'projects/p/zones/z' does not have enough resources"}]}),
            ..Operation::default()
        };
        let e = spot_stockout(op.failure("insert of p/z/n").unwrap());
        assert_eq!((e.class, e.code.as_deref()), (sdk::ErrorClass::QuotaExceeded, Some(SPOT_CAPACITY_UNAVAILABLE)));
        assert!(e.message.contains(code) && e.message.contains("placement.capacity Spot"), "{}", e.message);
    }
    let other = ProviderError::permanent("bad image").with_code("RESOURCE_NOT_FOUND");
    let e = spot_stockout(other);
    assert_eq!((e.class, e.code.as_deref()), (sdk::ErrorClass::Permanent, Some("RESOURCE_NOT_FOUND")));
}

/// Only a stopped or stopping Spot VM is asked about, and `interrupted` only ever comes with Stopped.
#[test]
fn preemption_is_asked_about_stopped_spot_vms_only() {
    let spot = |status: &str, scheduling: serde_json::Value| {
        let mut v = vm(status, None, json!({}));
        v.scheduling = scheduling;
        v
    };
    let model = |m: &str| json!({"provisioningModel": m});
    assert!(may_be_preempted(&spot("STOPPING", model("SPOT"))));
    assert!(may_be_preempted(&spot("TERMINATED", json!({"preemptible": true}))));
    assert!(!may_be_preempted(&spot("RUNNING", model("SPOT"))));
    assert!(!may_be_preempted(&spot("TERMINATED", model("STANDARD"))));
    assert!(!may_be_preempted(&spot("TERMINATED", serde_json::Value::Null)));
    let i = to_instance(&spot("TERMINATED", model("SPOT")), "p/z/n".into(), true);
    assert_eq!((i.state, i.interrupted), (State::Stopped, true));
    let i = to_instance(&vm("RUNNING", Some("203.0.113.7"), json!({})), "p/z/n".into(), true);
    assert_eq!((i.state, i.interrupted), (State::Running, false), "never interrupted while running");
    let op = Operation {
        target_link: "https://www.googleapis.com/compute/v1/projects/p/zones/europe-west1-b/instances/proxy-x".into(),
        ..Operation::default()
    };
    assert!(op.targets("/projects/p/zones/europe-west1-b/instances/proxy-x"), "whatever the host");
    assert!(!op.targets("/projects/p/zones/europe-west1-b/instances/x"));
}
