//! The emulator over HTTP, as a plugin meets it: the token endpoint's checks of a signed
//! JWT, the metadata server, instances and their operations, failed inserts, the
//! aggregated list's label filter, paging and unreachable zones, and expired tokens.

use super::*;
use crate::control::{Emulator, Fault};
use rsa::pkcs1v15::SigningKey;
use rsa::signature::{SignatureEncoding, Signer};
use std::io::{Read, Write};
use std::net::TcpStream;

const ZONE: &str = "europe-west1-b";

struct Answer {
    status: u16,
    json: Value,
}

/// A minimal HTTP/1.1 client over a blocking socket (the server has its own thread).
fn call(e: &GceEmulator, method: &str, path: &str, headers: &str, body: &str) -> Answer {
    let mut s = TcpStream::connect(e.addr()).unwrap();
    write!(
        s,
        "{method} {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n{headers}Content-Length: {}\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    let mut raw = String::new();
    s.read_to_string(&mut raw).unwrap();
    let (head, mut rest) = raw.split_once("\r\n\r\n").unwrap();
    let mut text = String::new();
    if head.to_ascii_lowercase().contains("transfer-encoding: chunked") {
        loop {
            let (size, tail) = rest.split_once("\r\n").unwrap();
            let n = usize::from_str_radix(size.trim(), 16).unwrap();
            if n == 0 {
                break;
            }
            text.push_str(&tail[..n]);
            rest = &tail[n + 2..];
        }
    } else {
        text = rest.to_string();
    }
    Answer {
        status: raw[9..12].parse().unwrap(),
        json: serde_json::from_str(&text).unwrap_or(Value::Null),
    }
}

fn jwt(e: &GceEmulator, pem: &str, claims: Value) -> String {
    let b64 = |v: &Value| data_encoding::BASE64URL_NOPAD.encode(v.to_string().as_bytes());
    let mut c = json!({"iss": test_keys::TEST_CLIENT_EMAIL, "scope": "https://www.googleapis.com/auth/compute",
                       "aud": format!("{}/token", e.url()), "iat": crate::time::now_secs(), "exp": crate::time::now_secs() + 3600});
    for (k, v) in claims.as_object().unwrap() {
        c[k] = v.clone();
    }
    let signing = format!("{}.{}", b64(&json!({"alg": "RS256", "typ": "JWT"})), b64(&c));
    let key = SigningKey::<Sha256>::new(rsa::RsaPrivateKey::from_pkcs8_pem(pem).unwrap());
    let sig = key.sign(signing.as_bytes()).to_bytes();
    format!("{signing}.{}", data_encoding::BASE64URL_NOPAD.encode(&sig))
}

fn exchange(e: &GceEmulator, assertion: &str) -> Answer {
    let body = format!(
        "grant_type=urn%3Aietf%3Aparams%3Aoauth%3Agrant-type%3Ajwt-bearer&assertion={assertion}"
    );
    call(e, "POST", "/token", "Content-Type: application/x-www-form-urlencoded\r\n", &body)
}

fn token(e: &GceEmulator) -> String {
    let a = exchange(e, &jwt(e, test_keys::TEST_KEY_PEM, json!({})));
    assert_eq!(a.status, 200, "{}", a.json);
    a.json["access_token"].as_str().unwrap().to_string()
}

fn api(e: &GceEmulator, t: &str, method: &str, path: &str, body: Option<Value>) -> Answer {
    let headers = format!("Authorization: Bearer {t}\r\nContent-Type: application/json\r\n");
    let path = format!("/compute/v1/projects/{EMULATOR_PROJECT}{path}");
    call(e, method, &path, &headers, &body.map(|b| b.to_string()).unwrap_or_default())
}

fn insert(e: &GceEmulator, t: &str, name: &str, image: &str, labels: Value) -> Answer {
    let body = json!({"name": name, "machineType": format!("zones/{ZONE}/machineTypes/e2-micro"), "labels": labels,
        "metadata": {"items": [{"key": "user-data", "value": "#cloud-config\n"}]},
        "disks": [{"boot": true, "autoDelete": true, "initializeParams": {"sourceImage": image}}],
        "networkInterfaces": [{"network": "global/networks/default", "accessConfigs": [{"type": "ONE_TO_ONE_NAT"}]}]});
    api(e, t, "POST", &format!("/zones/{ZONE}/instances"), Some(body))
}

const DEBIAN: &str = "projects/debian-cloud/global/images/family/debian-12";

#[test]
fn token_endpoint_checks_the_signed_jwt() {
    let e = GceEmulator::start(GceConfig::default());
    let t = token(&e);
    assert!(t.starts_with("ya29."), "{t}");
    assert_eq!(e.grants(), 1);
    let now = crate::time::now_secs();
    let cases = [
        (jwt(&e, test_keys::WRONG_KEY_PEM, json!({})), "Invalid JWT Signature."),
        (
            jwt(
                &e,
                test_keys::TEST_KEY_PEM,
                json!({"iss": "someone@else.iam.gserviceaccount.com"}),
            ),
            "account not found",
        ),
        (
            jwt(&e, test_keys::TEST_KEY_PEM, json!({"aud": "https://oauth2.googleapis.com/token"})),
            "audience",
        ),
        (
            jwt(&e, test_keys::TEST_KEY_PEM, json!({"iat": now - 7200, "exp": now - 3600})),
            "short-lived",
        ),
        (jwt(&e, test_keys::TEST_KEY_PEM, json!({"scope": "email"})), "scope"),
        ("a.b".to_string(), "malformed"),
    ];
    for (assertion, want) in cases {
        let a = exchange(&e, &assertion);
        assert_eq!((a.status, a.json["error"].as_str()), (400, Some("invalid_grant")), "{want}");
        assert!(a.json["error_description"].as_str().unwrap().contains(want), "{}", a.json);
    }
    // A tampered payload fails the signature too.
    let good = jwt(&e, test_keys::TEST_KEY_PEM, json!({}));
    let parts: Vec<&str> = good.split('.').collect();
    let forged = data_encoding::BASE64URL_NOPAD.encode(br#"{"iss":"x"}"#);
    let a = exchange(&e, &format!("{}.{forged}.{}", parts[0], parts[2]));
    assert_eq!(a.json["error"], "invalid_grant");
    assert_eq!(e.grants(), 1, "no token for a refused assertion");
}

#[test]
fn metadata_server_and_expired_tokens() {
    let e = GceEmulator::start(GceConfig::default());
    let path = "/computeMetadata/v1/instance/service-accounts/default/token";
    assert_eq!(call(&e, "GET", path, "", "").status, 403, "Metadata-Flavor is required");
    let a = call(&e, "GET", path, "Metadata-Flavor: Google\r\n", "");
    assert_eq!(
        (a.status, a.json["token_type"].as_str(), a.json["expires_in"].as_u64()),
        (200, Some("Bearer"), Some(3599))
    );
    let t = a.json["access_token"].as_str().unwrap();
    assert_eq!(api(&e, t, "GET", &format!("/zones/{ZONE}"), None).json["status"], "UP");
    e.expire_tokens();
    let a = api(&e, t, "GET", &format!("/zones/{ZONE}"), None);
    assert_eq!(
        (a.status, a.json["error"]["errors"][0]["reason"].as_str()),
        (401, Some("authError"))
    );
    assert_eq!(a.json["error"]["status"], "UNAUTHENTICATED");
    assert_eq!(api(&e, "nonsense", "GET", &format!("/zones/{ZONE}"), None).status, 401);
}

#[test]
fn instances_operations_and_failed_inserts() {
    let e = GceEmulator::start(GceConfig::default());
    let t = token(&e);
    let a = insert(
        &e,
        &t,
        "proxy-a",
        DEBIAN,
        json!({"egress-managed": "true", "egress-uid": "u-1_2fx"}),
    );
    assert_eq!(
        (a.status, a.json["status"].as_str(), a.json["operationType"].as_str()),
        (200, Some("RUNNING"), Some("insert"))
    );
    let op = a.json["name"].as_str().unwrap().to_string();
    let done = api(&e, &t, "GET", &format!("/zones/{ZONE}/operations/{op}"), None);
    assert_eq!((done.json["status"].as_str(), done.json.get("error")), (Some("DONE"), None));
    let path = format!("/zones/{ZONE}/instances/proxy-a");
    let first = api(&e, &t, "GET", &path, None).json;
    assert_eq!(
        (first["status"].as_str(), first.pointer("/networkInterfaces/0/accessConfigs/0/natIP")),
        (Some("PROVISIONING"), None)
    );
    let running = api(&e, &t, "GET", &path, None).json;
    assert_eq!(running["status"], "RUNNING");
    assert!(
        running["networkInterfaces"][0]["accessConfigs"][0]["natIP"]
            .as_str()
            .unwrap()
            .starts_with("203.0.113.")
    );
    assert_eq!(running["metadata"]["items"][0]["value"], "#cloud-config\n");
    let dump = e.dump();
    assert_eq!(
        dump.instances[0].labels,
        [(crate::MARK_MANAGED.into(), "true".into()), (crate::MARK_UID.into(), "u-1/x".into())]
    );

    let again = insert(&e, &t, "proxy-a", DEBIAN, json!({}));
    assert_eq!(
        (again.status, again.json["error"]["errors"][0]["reason"].as_str()),
        (409, Some("alreadyExists"))
    );
    let bad_type = api(
        &e,
        &t,
        "POST",
        &format!("/zones/{ZONE}/instances"),
        Some(json!({"name": "b", "machineType": "zones/x/machineTypes/huge"})),
    );
    assert_eq!(
        (bad_type.status, bad_type.json["error"]["errors"][0]["reason"].as_str()),
        (400, Some("invalid"))
    );

    // Capacity: no instance, the operation runs one more read, then fails with GCE's code.
    e.fail_next_insert(
        "ZONE_RESOURCE_POOL_EXHAUSTED",
        "The zone does not have enough resources",
        1,
    );
    let op =
        insert(&e, &t, "proxy-b", DEBIAN, json!({})).json["name"].as_str().unwrap().to_string();
    let op_path = format!("/zones/{ZONE}/operations/{op}");
    assert_eq!(api(&e, &t, "GET", &op_path, None).json["status"], "RUNNING");
    let failed = api(&e, &t, "GET", &op_path, None).json;
    assert_eq!(
        (failed["status"].as_str(), failed["error"]["errors"][0]["code"].as_str()),
        (Some("DONE"), Some("ZONE_RESOURCE_POOL_EXHAUSTED"))
    );
    assert_eq!(api(&e, &t, "GET", "/zones/europe-west1-b/instances/proxy-b", None).status, 404);
    // An unknown image fails the operation at once.
    let op = insert(&e, &t, "proxy-c", "projects/x/global/images/nope", json!({})).json["name"]
        .as_str()
        .unwrap()
        .to_string();
    let failed = api(&e, &t, "GET", &format!("/zones/{ZONE}/operations/{op}"), None).json;
    assert_eq!(failed["error"]["errors"][0]["code"], "RESOURCE_NOT_FOUND");

    let id = e.dump().instances[0].id.clone();
    e.set_locked(&id, true);
    let locked = api(&e, &t, "DELETE", &path, None);
    assert_eq!(
        (locked.status, locked.json["error"]["errors"][0]["reason"].as_str()),
        (400, Some("resourceNotReady"))
    );
    e.set_locked(&id, false);
    assert_eq!(api(&e, &t, "DELETE", &path, None).json["operationType"], "delete");
    let gone = api(&e, &t, "DELETE", &path, None);
    assert_eq!(
        (gone.status, gone.json["error"]["errors"][0]["reason"].as_str()),
        (404, Some("notFound"))
    );
}

#[test]
fn aggregated_list_filters_pages_and_reports_unreachable_zones() {
    let e = GceEmulator::start(GceConfig::default());
    let t = token(&e);
    for n in 0..5 {
        e.plant(Plant {
            name: format!("p{n}"),
            scope: "us-central1-a".into(),
            managed: true,
            uid: Some(format!("u{n}")),
            installation: Some("inst".into()),
            created_at: None,
        });
    }
    e.plant(Plant {
        name: "other".into(),
        scope: ZONE.into(),
        managed: true,
        uid: None,
        installation: Some("x".into()),
        created_at: None,
    });
    let filter = "%28labels.egress-managed%20%3D%20%22true%22%29%20%28labels.egress-installation%20%3D%20%22inst%22%29";
    let mut names = Vec::new();
    let mut token_q = String::new();
    for _ in 0..5 {
        let page = api(
            &e,
            &t,
            "GET",
            &format!("/aggregated/instances?filter={filter}&maxResults=2{token_q}"),
            None,
        )
        .json;
        assert_eq!(page["items"]["zones/europe-west1-b"]["warning"]["code"], "NO_RESULTS_ON_PAGE");
        for i in page["items"]["zones/us-central1-a"]["instances"].as_array().unwrap() {
            names.push(i["name"].as_str().unwrap().to_string());
        }
        match page["nextPageToken"].as_str() {
            Some(next) => token_q = format!("&pageToken={next}"),
            None => break,
        }
    }
    assert_eq!(names, ["p0", "p1", "p2", "p3", "p4"]);
    e.fail_scope("us-central1-a", true);
    let page = api(&e, &t, "GET", &format!("/aggregated/instances?filter={filter}"), None).json;
    assert_eq!(page["unreachables"], json!(["zones/us-central1-a"]));
    assert_eq!(page["items"]["zones/us-central1-a"]["warning"]["code"], "UNREACHABLE");
    let bad = api(&e, &t, "GET", "/aggregated/instances?filter=name%3Dx", None);
    assert_eq!(bad.status, 400);
    e.inject(Fault { op: FaultOp::List, kind: FaultKind::Quota, count: 1 });
    let q = api(&e, &t, "GET", &format!("/aggregated/instances?filter={filter}"), None);
    assert_eq!(
        (q.status, q.json["error"]["errors"][0]["reason"].as_str()),
        (403, Some("quotaExceeded"))
    );
}

#[test]
fn labels_round_trip_as_the_plugin_writes_them() {
    let (k, v) = labels::encode(crate::MARK_UID, "UID/Up:x_1").unwrap();
    assert_eq!((k.as_str(), v.as_str()), ("egress-uid", "_55_49_44_2f_55p_3ax_5f1"));
    assert_eq!(
        labels::decode(&k, &v),
        Some((crate::MARK_UID.to_string(), "UID/Up:x_1".to_string()))
    );
    let (_, hashed) = labels::encode(crate::MARK_INSTALLATION, &"x/".repeat(100)).unwrap();
    assert_eq!(hashed, "__fpopsbjmy5mwua65ni7zs3kpoid2dt3a", "the plugin's fixed vector");
    assert_eq!(labels::decode("other", "v"), None);
}

/// An insert with `scheduling` as the body's, of the debian image in [`ZONE`].
fn insert_scheduled(e: &GceEmulator, t: &str, name: &str, scheduling: Value) -> Answer {
    let body = json!({"name": name, "machineType": format!("zones/{ZONE}/machineTypes/e2-micro"),
        "disks": [{"boot": true, "autoDelete": true, "initializeParams": {"sourceImage": DEBIAN}}],
        "networkInterfaces": [{"network": "global/networks/default"}], "scheduling": scheduling});
    api(e, t, "POST", &format!("/zones/{ZONE}/instances"), Some(body))
}

fn spot_scheduling(action: &str) -> Value {
    json!({"provisioningModel": "SPOT", "instanceTerminationAction": action,
           "automaticRestart": false, "onHostMaintenance": "TERMINATE"})
}

/// The preemption operations of `zone` that name `name`, through `zoneOperations.list`
/// with the filter Google's preemption-history sample uses.
fn preemptions(e: &GceEmulator, t: &str, name: &str) -> Vec<Value> {
    let filter = "operationType%3D%22compute.instances.preempted%22";
    let a = api(e, t, "GET", &format!("/zones/{ZONE}/operations?filter={filter}"), None);
    assert_eq!(a.status, 200, "{}", a.json);
    let ops = a.json["items"].as_array().cloned().unwrap_or_default();
    let suffix = format!("/zones/{ZONE}/instances/{name}");
    ops.into_iter().filter(|o| o["targetLink"].as_str().unwrap().ends_with(&suffix)).collect()
}

#[test]
fn spot_scheduling_is_checked_and_kept_with_its_defaults() {
    let e = GceEmulator::start(GceConfig::default());
    let t = token(&e);
    assert_eq!(insert_scheduled(&e, &t, "s1", spot_scheduling("DELETE")).status, 200);
    let vm = api(&e, &t, "GET", &format!("/zones/{ZONE}/instances/s1"), None).json;
    assert_eq!(
        vm["scheduling"],
        json!({"provisioningModel": "SPOT", "instanceTerminationAction": "DELETE",
        "automaticRestart": false, "onHostMaintenance": "TERMINATE", "preemptible": false})
    );
    // SPOT alone takes the defaults a Spot VM must have; standard VMs keep theirs.
    assert_eq!(insert_scheduled(&e, &t, "s2", json!({"provisioningModel": "SPOT"})).status, 200);
    let vm = api(&e, &t, "GET", &format!("/zones/{ZONE}/instances/s2"), None).json;
    assert_eq!(
        (
            vm["scheduling"]["instanceTerminationAction"].as_str(),
            vm["scheduling"]["automaticRestart"].as_bool()
        ),
        (Some("STOP"), Some(false))
    );
    assert_eq!(insert_scheduled(&e, &t, "d1", Value::Null).status, 200);
    let vm = api(&e, &t, "GET", &format!("/zones/{ZONE}/instances/d1"), None).json;
    assert_eq!(
        (
            vm["scheduling"]["provisioningModel"].as_str(),
            vm["scheduling"]["onHostMaintenance"].as_str()
        ),
        (Some("STANDARD"), Some("MIGRATE"))
    );
    let mut spot: Vec<String> = e.spot_instances();
    spot.sort();
    let ids: Vec<String> =
        ["s1", "s2"].map(|n| e.instance(n).unwrap()["id"].as_str().unwrap().into()).into();
    assert_eq!(spot, ids);

    for (scheduling, field) in [
        (json!({"provisioningModel": "CHEAP"}), "provisioningModel"),
        (json!({"provisioningModel": "SPOT", "onHostMaintenance": "MIGRATE"}), "onHostMaintenance"),
        (json!({"provisioningModel": "SPOT", "automaticRestart": true}), "automaticRestart"),
        (
            json!({"provisioningModel": "SPOT", "instanceTerminationAction": "EXPLODE"}),
            "instanceTerminationAction",
        ),
        (json!({"instanceTerminationAction": "DELETE"}), "instanceTerminationAction"),
    ] {
        let a = insert_scheduled(&e, &t, "bad", scheduling.clone());
        assert_eq!(
            (a.status, a.json["error"]["errors"][0]["reason"].as_str()),
            (400, Some("invalid")),
            "{scheduling}"
        );
        let message = a.json["error"]["message"].as_str().unwrap();
        assert!(
            message.contains(&format!("'resource.scheduling.{field}'")),
            "{scheduling}: {message}"
        );
    }
    assert!(e.instance("bad").is_none());
}

#[test]
fn reclaim_records_a_preemption_and_stops_or_deletes() {
    let e = GceEmulator::start(GceConfig::default());
    let t = token(&e);
    insert_scheduled(&e, &t, "gone", spot_scheduling("DELETE"));
    insert_scheduled(&e, &t, "kept", spot_scheduling("STOP"));
    insert_scheduled(&e, &t, "standard", Value::Null);
    let id = |n: &str| e.instance(n).unwrap()["id"].as_str().unwrap().to_string();
    let (gone, kept, standard) = (id("gone"), id("kept"), id("standard"));
    for n in ["gone", "kept"] {
        for _ in 0..2 {
            api(&e, &t, "GET", &format!("/zones/{ZONE}/instances/{n}"), None);
        }
    }
    assert!(preemptions(&e, &t, "gone").is_empty());

    let refused = e.reclaim(&standard).unwrap_err();
    assert_eq!(refused.status, 409);
    assert!(refused.body["error"].as_str().unwrap().contains("not a Spot VM"), "{}", refused.body);
    assert_eq!(e.reclaim("4200000000000999999"), Ok(false));

    assert_eq!(e.reclaim(&gone), Ok(true));
    let a = api(&e, &t, "GET", &format!("/zones/{ZONE}/instances/gone"), None);
    assert_eq!(a.status, 404, "DELETE: the VM is gone after its preemption");
    let ops = preemptions(&e, &t, "gone");
    assert_eq!(ops.len(), 1, "{ops:?}");
    assert_eq!(
        (ops[0]["status"].as_str(), ops[0]["statusMessage"].as_str(), ops[0]["targetId"].as_str()),
        (Some("DONE"), Some("Instance was preempted."), Some(gone.as_str()))
    );
    assert!(ops[0]["name"].as_str().unwrap().starts_with("systemevent-"));

    assert_eq!(e.reclaim(&kept), Ok(true));
    let vm = api(&e, &t, "GET", &format!("/zones/{ZONE}/instances/kept"), None).json;
    assert_eq!(vm["status"], "TERMINATED", "STOP: stopped, not deleted");
    assert!(vm.pointer("/networkInterfaces/0/accessConfigs/0/natIP").is_none(), "{vm}");
    assert_eq!(preemptions(&e, &t, "kept").len(), 1);
    assert!(preemptions(&e, &t, "standard").is_empty());

    // The filter's other forms, and what the emulator does not understand.
    let list = |q: &str| api(&e, &t, "GET", &format!("/zones/{ZONE}/operations?{q}"), None);
    let both = "filter=%28operationType%20%3D%20%22compute.instances.preempted%22%29%20%28targetId%20%3D%20%22".to_string()
        + &kept + "%22%29";
    assert_eq!(list(&both).json["items"].as_array().unwrap().len(), 1);
    let inserts = list(
        "filter=operationType%20%21%3D%20%22compute.instances.preempted%22&orderBy=creationTimestamp%20desc",
    );
    assert_eq!(inserts.json["items"].as_array().unwrap().len(), 3, "{}", inserts.json);
    let none = list("filter=operationType%3D%22compute.instances.stopped%22");
    assert_eq!((none.status, none.json.get("items")), (200, None), "no items when none match");
    let paged = list("maxResults=2");
    assert_eq!(paged.json["items"].as_array().unwrap().len(), 2);
    assert!(paged.json["nextPageToken"].is_string());
    for q in ["filter=operationType%20eq%20.%2A", "filter=zone%3Dx", "orderBy=status"] {
        assert_eq!(list(q).status, 400, "{q}");
    }
}

#[test]
fn without_spot_capacity_a_spot_insert_fails_in_its_operation() {
    let e = GceEmulator::start(GceConfig::default());
    let t = token(&e);
    assert!(e.set_spot_capacity(false));
    let a = insert_scheduled(&e, &t, "s", spot_scheduling("DELETE"));
    assert_eq!(a.json["status"], "RUNNING", "the insert itself is accepted");
    let op = a.json["name"].as_str().unwrap().to_string();
    let done = api(&e, &t, "GET", &format!("/zones/{ZONE}/operations/{op}"), None).json;
    assert_eq!(
        (done["status"].as_str(), done["error"]["errors"][0]["code"].as_str()),
        (Some("DONE"), Some("ZONE_RESOURCE_POOL_EXHAUSTED"))
    );
    assert!(
        done["error"]["errors"][0]["message"]
            .as_str()
            .unwrap()
            .contains("does not have enough resources")
    );
    assert!(e.dump().instances.is_empty(), "nothing was created");
    assert_eq!(insert_scheduled(&e, &t, "d", Value::Null).status, 200);
    assert_eq!(e.dump().instances.len(), 1, "standard inserts are untouched");
    e.reset();
    insert_scheduled(&e, &t, "s", spot_scheduling("DELETE"));
    assert_eq!(e.spot_instances().len(), 1, "a reset brings the capacity back");
}
