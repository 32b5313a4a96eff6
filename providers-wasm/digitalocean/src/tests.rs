//! Native tests of the pure parts in lib.rs: user data, states and instances, and the
//! profile. Module tests cover the config, tags, IDs and the classify table.

use super::*;

fn droplet(status: &str, v4: serde_json::Value, tags: &[&str]) -> Droplet {
    serde_json::from_value(json!({
        "id": 3_164_444, "name": "proxy-x", "status": status, "locked": false,
        "created_at": "2020-07-21T18:37:44Z", "networks": {"v4": v4, "v6": []},
        "region": {"slug": "ams3"}, "tags": tags,
    }))
    .unwrap()
}

#[test]
fn user_data_is_plain_text_up_to_64_kib() {
    assert_eq!(user_data(b"").unwrap(), "");
    let text = "#cloud-config\nruncmd: [echo ünïcødé]\n";
    assert_eq!(user_data(text.as_bytes()).unwrap(), text);
    assert!(user_data(&vec![b'a'; USER_DATA_MAX]).is_ok());
    let e = user_data(&vec![b'a'; USER_DATA_MAX + 1]).unwrap_err();
    assert_eq!((e.class, e.code.as_deref()), (sdk::ErrorClass::Permanent, Some("UserDataTooLarge")));
    let e = user_data(b"\x1f\x8b\x08\x00gzip\xff").unwrap_err();
    assert_eq!((e.class, e.code.as_deref()), (sdk::ErrorClass::Permanent, Some("UserDataNotText")));
    assert!(!e.message.contains("gzip"), "never the contents: {}", e.message);
}

/// Status and networks -> state; only a public IPv4 makes a Droplet Running.
#[test]
fn states_and_addresses() {
    let public =
        json!([{"ip_address": "10.110.0.2", "type": "private"}, {"ip_address": "203.0.113.7", "type": "public"}]);
    let private = json!([{"ip_address": "10.110.0.2", "type": "private"}]);
    let cases = [
        ("new", json!([]), State::Provisioning, ""),
        ("new", public.clone(), State::Provisioning, "203.0.113.7"),
        ("active", public.clone(), State::Running, "203.0.113.7"),
        ("active", private.clone(), State::Provisioning, ""),
        ("active", json!(null), State::Provisioning, ""),
        ("off", public.clone(), State::Stopped, "203.0.113.7"),
        ("archive", private, State::Terminated, ""),
        ("exploded", public, State::Stopped, "203.0.113.7"),
    ];
    for (status, v4, want, ip) in cases {
        let i = to_instance(&droplet(status, v4.clone(), &[]), "ams3/3164444".into());
        assert_eq!((i.state, i.ip.as_str()), (want, ip), "{status} {v4}");
    }
}

#[test]
fn instances_read_uid_and_created_at_back() {
    let d = droplet("active", json!([]), &["web", "egress:managed:true", "egress:uid:u-1_2fx"]);
    let i = to_instance(&d, id_of(&d, "nyc3"));
    assert_eq!((i.id.as_str(), i.uid.as_str()), ("ams3/3164444", "u-1/x"));
    assert_eq!(i.created_at.map(|t| t.seconds), Some(1_595_356_664));
    let mut d = droplet("active", json!([]), &[]);
    d.region = serde_json::Value::Null;
    d.created_at = "yesterday".into();
    let i = to_instance(&d, id_of(&d, "nyc3"));
    assert_eq!((i.id.as_str(), i.uid.as_str(), i.created_at.is_none()), ("nyc3/3164444", "", true));
}

#[test]
fn info_names_the_type_hosts_and_check() {
    let info = <DigitalOcean as Provider>::info();
    assert_eq!(info.type_name, "digitalocean");
    assert!(info.has_check);
    assert_eq!(info.default_hosts, ["https://api.digitalocean.com:443"]);
    // Every axis once; the conformance suite checks the values (`profile-answers-every-axis`).
    assert_eq!(info.profile.len(), 19);
}

/// A size is priced only where it can be created: listed for the region and available.
#[test]
fn size_prices_by_region_and_availability() {
    let base = json!({"slug": "s-1vcpu-1gb", "price_hourly": 0.00893, "regions": ["nyc3", "ams3"], "available": true});
    let price = |patch: serde_json::Value| {
        let mut size = base.clone();
        for (k, v) in patch.as_object().unwrap() {
            size[k] = v.clone();
        }
        ["nyc3", "ams3", "sgp1"].map(|r| api::hourly_micros(&size, r))
    };
    let cases = [
        (json!({}), [Some(8_930), Some(8_930), None]),
        (json!({"available": false}), [None; 3]),
        // `available` is true by default in the specification.
        (json!({"available": null}), [Some(8_930), Some(8_930), None]),
        (json!({"price_hourly": null}), [None; 3]),
        (json!({"price_hourly": "0.00893"}), [None; 3]),
        (json!({"regions": null}), [None; 3]),
        (json!({"regions": ["sgp1"]}), [None, None, Some(8_930)]),
    ];
    for (patch, want) in cases {
        assert_eq!(price(patch.clone()), want, "{patch}");
    }
}
