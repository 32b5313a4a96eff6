//! The EC2 plugin through the host, against the EC2 emulator: the contract cases of the
//! provider contract (reference section 11), EC2's own failure modes, and secret hygiene.
//!
//! Each test starts its own emulator and provider, so they run in parallel without
//! sharing instances, tokens or injected faults.

use crate::support;

use egress_emulators::control::{Emulator, Fault, FaultKind, FaultOp, Plant};
use egress_emulators::ec2::{
    EXAMPLE_ACCESS_KEY, EXAMPLE_SECRET_KEY, Ec2Config, Ec2Emulator, Transition, ZoneSpotPrice,
};
use egress_plugin_host::plugin::WasmProvider;
use egress_plugin_host::provider::{
    Capacity, Class, CreateRequest, Instance, MARK_INSTALLATION, MARK_MANAGED, MARK_UID, Placement,
    Provider, ProviderError, State, name_from_uid,
};
use std::path::Path;
use std::time::{Duration, Instant, SystemTime};

const SUBNET: &str = "subnet-0123456789abcdef0";
const SG: &str = "sg-0123456789abcdef0";

/// A running emulator, the secret files the provider reads, and the provider itself.
struct Fixture {
    emu: Ec2Emulator,
    secrets: tempfile::TempDir,
    p: WasmProvider,
}

impl Fixture {
    fn secret(&self, key: &str) -> std::path::PathBuf {
        self.secrets.path().join(key)
    }

    /// The emulator's own id of a plugin ID.
    fn backend_id(id: &str) -> &str {
        id.split_once('/').expect("region/instance-id").1
    }
}

/// The providers-file entry: both emulated regions point at the emulator, which is
/// allow-listed explicitly (it is loopback, refused unless named).
fn entry(url: &str, secrets: &Path, extra: &str) -> String {
    let s = |k: &str| secrets.join(k).display().to_string();
    format!(
        r#"name: aws
plugin: ec2.wasm
additionalHosts: ['{url}']
allowPrivateAddresses: true
secrets: {{accessKeyId: {ak}, secretAccessKey: {sk}, sessionToken: {st}}}
{extra}
config:
  regions:
    eu-west-1:
      endpoint: '{url}'
      zones:
        eu-west-1a: {{subnetId: {SUBNET}, securityGroupIds: [{SG}]}}
        eu-west-1b: {{}}
      images: {{debian: ami-0fedcba9876543210}}
    us-east-1:
      endpoint: '{url}'
      zones: {{us-east-1a: {{}}}}
      images: {{debian: ami-0abcdef1234567890}}
  instanceTypes: [t3.micro, t3.small]
  tags: {{team: net}}"#,
        ak = s("accessKeyId"),
        sk = s("secretAccessKey"),
        st = s("sessionToken"),
    )
}

async fn fixture_with(cfg: Ec2Config, extra: &str) -> Fixture {
    let emu = Ec2Emulator::start(cfg);
    let secrets = tempfile::tempdir().unwrap();
    std::fs::write(secrets.path().join("accessKeyId"), EXAMPLE_ACCESS_KEY).unwrap();
    // A trailing newline, as `kubectl create secret --from-file` often leaves one.
    std::fs::write(
        secrets.path().join("secretAccessKey"),
        format!("{EXAMPLE_SECRET_KEY}\n"),
    )
    .unwrap();
    let rt = support::runtime();
    let p = support::provider(&rt, "ec2.wasm", &entry(&emu.url(), secrets.path(), extra)).await;
    Fixture { emu, secrets, p }
}

async fn fixture(cfg: Ec2Config) -> Fixture {
    fixture_with(cfg, "").await
}

fn request(uid: &str, region: &str, zone: &str) -> CreateRequest {
    CreateRequest {
        proxy_name: "p1".into(),
        cloud_init: b"#cloud-config\n\x00\xff bytes kept as they are\n".to_vec(),
        ..CreateRequest::new(
            uid,
            "inst-a",
            Placement::new(region, zone, "t3.micro", "debian"),
        )
    }
}

fn eu(uid: &str) -> CreateRequest {
    request(uid, "eu-west-1", "eu-west-1a")
}

/// Poll `get` until `done` holds (the emulator moves on each Describe or by time).
async fn get_until(
    p: &WasmProvider,
    id: &str,
    done: impl Fn(&Result<Instance, ProviderError>) -> bool,
) -> Result<Instance, ProviderError> {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let r = p.get(id).await;
        if done(&r) || Instant::now() > deadline {
            return r;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

fn not_found(r: &Result<Instance, ProviderError>) -> bool {
    matches!(r, Err(e) if e.class == Class::NotFound)
}

fn live_instances(emu: &Ec2Emulator) -> usize {
    emu.dump().instances.len()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lifecycle_through_the_host() {
    let _dir = plugins_or_skip!();
    let f = fixture(Ec2Config::default()).await;
    let req = eu("uid-1");

    let id = f.p.create(&req).await.unwrap();
    assert!(id.starts_with("eu-west-1/i-"), "{id}");
    assert_eq!(
        f.p.create(&req).await.unwrap(),
        id,
        "create is idempotent by name"
    );
    let dump = f.emu.dump();
    assert_eq!(dump.instances.len(), 1, "one instance: {dump:?}");
    let inst = &dump.instances[0];
    assert_eq!(inst.user_data, req.cloud_init, "user data byte for byte");
    let tag = |k: &str| {
        inst.labels
            .iter()
            .find(|(key, _)| key == k)
            .map(|(_, v)| v.as_str())
    };
    assert_eq!(tag("Name"), Some(req.name.as_str()));
    assert_eq!(tag(MARK_MANAGED), Some("true"));
    assert_eq!(tag(MARK_UID), Some("uid-1"));
    assert_eq!(tag(MARK_INSTALLATION), Some("inst-a"));
    assert_eq!(tag("team"), Some("net"));
    assert_eq!(dump.secondary.len(), 1, "the root volume: {dump:?}");
    assert_eq!(
        dump.secondary[0].attached_to.as_deref(),
        Some(Fixture::backend_id(&id))
    );

    let running = get_until(
        &f.p,
        &id,
        |r| matches!(r, Ok(i) if i.state == State::Running),
    )
    .await
    .unwrap();
    assert_eq!(running.ip, "127.0.0.1");
    assert_eq!(running.uid, "uid-1", "uid read back from the tag");
    let age = SystemTime::now()
        .duration_since(running.created_at.expect("launchTime read back"))
        .unwrap_or_default();
    assert!(
        age < Duration::from_secs(60),
        "created_at is recent: {age:?}"
    );

    let listed = f.p.list_by_tag("inst-a").await.unwrap();
    assert_eq!(listed.len(), 1);
    assert_eq!(
        (listed[0].id.as_str(), listed[0].uid.as_str()),
        (id.as_str(), "uid-1")
    );
    assert!(
        f.p.list_by_tag("inst-b").await.unwrap().is_empty(),
        "other installations are not listed"
    );

    f.p.delete(&id).await.unwrap();
    f.p.delete(&id).await.unwrap();
    let gone = get_until(&f.p, &id, not_found).await;
    assert!(not_found(&gone), "get after delete: {gone:?}");
    f.p.delete(&id).await.unwrap();
    let dump = f.emu.dump();
    assert!(
        dump.instances.is_empty() && dump.secondary.is_empty(),
        "nothing left, no volume leaked: {dump:?}"
    );

    let targets = f.p.check().await.expect("ec2 has a check");
    let names: Vec<&str> = targets.iter().map(|t| t.target.as_str()).collect();
    assert_eq!(
        names,
        ["eu-west-1", "us-east-1"],
        "one per region, in order"
    );
    assert!(
        targets.iter().all(|t| t.ready && t.reason == "Reachable"),
        "{targets:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn get_during_a_delete_in_progress_returns_the_instance() {
    let _dir = plugins_or_skip!();
    let f = fixture(Ec2Config::default()).await;
    let id = f.p.create(&eu("uid-2")).await.unwrap();
    f.emu.start_slow_delete(Fixture::backend_id(&id));
    for _ in 0..3 {
        let i = f.p.get(&id).await.unwrap();
        assert_eq!(
            i.state,
            State::Terminated,
            "still shown while shutting down"
        );
        assert_eq!(i.uid, "uid-2");
    }
    f.p.delete(&id)
        .await
        .expect("deleting a dying instance succeeds");
    f.emu.finish_deletes();
    assert!(not_found(&f.p.get(&id).await));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn delete_through_the_plugin_shows_terminated_until_gone() {
    let _dir = plugins_or_skip!();
    let cfg = Ec2Config {
        shutdown: Transition::Manual,
        ..Ec2Config::default()
    };
    let f = fixture(cfg).await;
    let id = f.p.create(&eu("uid-3")).await.unwrap();
    f.p.delete(&id).await.unwrap();
    assert_eq!(f.p.get(&id).await.unwrap().state, State::Terminated);
    f.p.delete(&id)
        .await
        .expect("repeat delete is cheap and fine");
    assert_eq!(f.p.get(&id).await.unwrap().state, State::Terminated);
    f.emu
        .set_backend_state(Fixture::backend_id(&id), "terminated");
    assert!(not_found(&f.p.get(&id).await));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malformed_or_unconfigured_ids_are_permanent() {
    let _dir = plugins_or_skip!();
    let f = fixture(Ec2Config::default()).await;
    for bad in [
        "nope",
        "eu-west-1/i-xyz",
        "eu-west-1/vol-0123456789abcdef0",
        "eu-west-1/i-0123456789abcdef0/x",
        "mars-1/i-0123456789abcdef0",
        // Well-formed, but the region is not (or no longer) configured.
        "ap-south-1/i-0123456789abcdef0",
    ] {
        let e = f.p.get(bad).await.unwrap_err();
        assert_eq!(e.class, Class::Permanent, "get {bad}: {e}");
        let e = f.p.delete(bad).await.unwrap_err();
        assert_eq!(e.class, Class::Permanent, "delete {bad}: {e}");
    }
    assert!(f.emu.requests().is_empty(), "{:?}", f.emu.requests());
    // Well-formed but unknown to EC2: gone, and deleting it is a success.
    let unknown = "eu-west-1/i-0123456789abcdef0";
    assert!(not_found(&f.p.get(unknown).await));
    f.p.delete(unknown).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn states_unknown_is_stopped_never_started_is_provisioning() {
    let _dir = plugins_or_skip!();
    let cfg = Ec2Config {
        launch: Transition::Manual,
        ..Ec2Config::default()
    };
    let f = fixture(cfg).await;
    let id = f.p.create(&eu("uid-4")).await.unwrap();
    let backend = Fixture::backend_id(&id);
    for _ in 0..3 {
        let i = f.p.get(&id).await.unwrap();
        assert_eq!(
            (i.state, i.ip.as_str()),
            (State::Provisioning, ""),
            "created but not started is never Stopped"
        );
    }
    f.emu.set_backend_state(backend, "running");
    let i = f.p.get(&id).await.unwrap();
    assert_eq!((i.state, i.ip.as_str()), (State::Running, "127.0.0.1"));
    for (raw, want) in [
        ("stopping", State::Stopped),
        ("stopped", State::Stopped),
        ("exploded", State::Stopped),
        ("shutting-down", State::Terminated),
        ("pending", State::Provisioning),
    ] {
        f.emu.set_backend_state(backend, raw);
        assert_eq!(f.p.get(&id).await.unwrap().state, want, "{raw}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn running_without_an_address_is_provisioning() {
    let _dir = plugins_or_skip!();
    let cfg = Ec2Config {
        public_ip: String::new(),
        ..Ec2Config::default()
    };
    let f = fixture(cfg).await;
    let id = f.p.create(&eu("uid-5")).await.unwrap();
    f.emu.set_backend_state(Fixture::backend_id(&id), "running");
    let i = f.p.get(&id).await.unwrap();
    assert_eq!((i.state, i.ip.as_str()), (State::Provisioning, ""));

    // With `ipAddress: private` the same instance is running at its private address.
    let f2 = fixture(Ec2Config {
        public_ip: String::new(),
        ..Ec2Config::default()
    })
    .await;
    let rt = support::runtime();
    let yaml = entry(&f2.emu.url(), f2.secrets.path(), "").replace(
        "  tags: {team: net}",
        "  tags: {team: net}\n  ipAddress: private",
    );
    let private = support::provider(&rt, "ec2.wasm", &yaml).await;
    let id = private.create(&eu("uid-5")).await.unwrap();
    f2.emu
        .set_backend_state(Fixture::backend_id(&id), "running");
    let i = private.get(&id).await.unwrap();
    assert_eq!(i.state, State::Running);
    assert!(i.ip.starts_with("10.0."), "{i:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn uid_and_created_at_are_read_back_and_adoption_is_verified() {
    let _dir = plugins_or_skip!();
    let f = fixture(Ec2Config::default()).await;
    let req = eu("uid-6");
    let planted = f.emu.plant(Plant {
        name: req.name.clone(),
        scope: "eu-west-1".into(),
        managed: true,
        uid: Some("uid-6".into()),
        installation: Some("inst-a".into()),
        created_at: Some(1_700_000_000),
    });
    let before = f.emu.requests().len();
    let id = f.p.create(&req).await.unwrap();
    assert_eq!(id, format!("eu-west-1/{planted}"), "adopted");
    assert!(
        !f.emu.requests()[before..].contains(&"RunInstances".to_string()),
        "nothing launched"
    );
    let i = f.p.get(&id).await.unwrap();
    assert_eq!(i.uid, "uid-6");
    assert_eq!(
        i.created_at,
        Some(SystemTime::UNIX_EPOCH + Duration::from_secs(1_700_000_000)),
        "the backend's launchTime, not the time of the call"
    );

    // Same name, someone else's uid: not adopted, and nothing is created.
    let mut other = eu("uid-7");
    other.name = req.name.clone();
    let e = f.p.create(&other).await.unwrap_err();
    assert_eq!(e.class, Class::Permanent, "{e}");
    assert_eq!(e.code.as_deref(), Some("NameTaken"));
    assert!(e.message.contains(&planted), "{e}");
    assert_eq!(live_instances(&f.emu), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn list_returns_only_marked_instances_of_the_installation_in_every_region() {
    let _dir = plugins_or_skip!();
    let f = fixture(Ec2Config::default()).await;
    let plant = |name: &str, scope: &str, managed, uid: Option<&str>, inst: &str| {
        f.emu.plant(Plant {
            name: name.into(),
            scope: scope.into(),
            managed,
            uid: uid.map(str::to_string),
            installation: Some(inst.into()),
            created_at: Some(1_700_000_000),
        })
    };
    let ours = plant("a", "eu-west-1", true, Some("u-a"), "inst-a");
    let empty_uid = plant("b", "eu-west-1", true, Some(""), "inst-a");
    let no_uid = plant("c", "eu-west-1", true, None, "inst-a");
    let other_region = plant("d", "us-east-1", true, Some("u-d"), "inst-a");
    plant("e", "eu-west-1", false, Some("u-e"), "inst-a");
    plant("f", "eu-west-1", true, Some("u-f"), "inst-b");
    let terminated = plant("g", "eu-west-1", true, Some("u-g"), "inst-a");
    f.emu.set_backend_state(&terminated, "terminated");

    let mut listed: Vec<(String, String)> =
        f.p.list_by_tag("inst-a")
            .await
            .unwrap()
            .into_iter()
            .map(|i| {
                assert_eq!(
                    i.created_at,
                    Some(SystemTime::UNIX_EPOCH + Duration::from_secs(1_700_000_000))
                );
                (i.id, i.uid)
            })
            .collect();
    listed.sort();
    let mut want = vec![
        (format!("eu-west-1/{ours}"), "u-a".to_string()),
        (format!("eu-west-1/{empty_uid}"), String::new()),
        (format!("eu-west-1/{no_uid}"), String::new()),
        (format!("us-east-1/{other_region}"), "u-d".to_string()),
    ];
    want.sort();
    assert_eq!(listed, want);

    // Every listed ID is one delete accepts.
    for (id, _) in &listed {
        f.p.delete(id).await.unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn list_pages_through_next_token() {
    let _dir = plugins_or_skip!();
    let f = fixture(Ec2Config::default()).await;
    for n in 0..1005 {
        f.emu.plant(Plant {
            name: format!("n{n}"),
            scope: "us-east-1".into(),
            managed: true,
            uid: Some(format!("u{n}")),
            installation: Some("inst-a".into()),
            created_at: None,
        });
    }
    let listed = f.p.list_by_tag("inst-a").await.unwrap();
    assert_eq!(listed.len(), 1005);
    let describes = f
        .emu
        .requests()
        .iter()
        .filter(|a| *a == "DescribeInstances")
        .count();
    assert_eq!(describes, 3, "eu-west-1 once, us-east-1 in two pages");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_locked_instance_keeps_its_state_and_delete_is_transient() {
    let _dir = plugins_or_skip!();
    let f = fixture(Ec2Config::default()).await;
    let id = f.p.create(&eu("uid-8")).await.unwrap();
    let before = get_until(
        &f.p,
        &id,
        |r| matches!(r, Ok(i) if i.state == State::Running),
    )
    .await
    .unwrap();
    f.emu.set_locked(Fixture::backend_id(&id), true);
    assert_eq!(
        f.p.get(&id).await.unwrap().state,
        before.state,
        "last state"
    );
    let e = f.p.delete(&id).await.unwrap_err();
    assert_eq!(e.class, Class::Transient, "{e}");
    assert_eq!(e.code.as_deref(), Some("IncorrectInstanceState"));
    f.emu.set_locked(Fixture::backend_id(&id), false);
    f.p.delete(&id).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_creates_for_one_name_make_one_instance() {
    let _dir = plugins_or_skip!();
    let f = fixture(Ec2Config::default()).await;
    let req = eu("uid-9");
    let (a, b, c, d) = tokio::join!(
        f.p.create(&req),
        f.p.create(&req),
        f.p.create(&req),
        f.p.create(&req)
    );
    let ids = [a.unwrap(), b.unwrap(), c.unwrap(), d.unwrap()];
    assert!(ids.iter().all(|i| *i == ids[0]), "{ids:?}");
    assert_eq!(live_instances(&f.emu), 1, "{:?}", f.emu.dump());
}

/// The Proxy's next instance keeps the name. EC2 remembers client tokens for a day after
/// termination; a plugin that reused the token would get the dead instance back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn recreating_a_name_after_delete_launches_a_new_instance() {
    let _dir = plugins_or_skip!();
    let f = fixture(Ec2Config::default()).await;
    let req = eu("uid-10");
    let mut seen = Vec::new();
    for round in 0..3 {
        let id = f.p.create(&req).await.unwrap();
        assert!(
            !seen.contains(&id),
            "round {round}: got a dead instance {id}"
        );
        let i = f.p.get(&id).await.unwrap();
        assert_ne!(i.state, State::Terminated, "round {round}");
        f.p.delete(&id).await.unwrap();
        assert!(not_found(&get_until(&f.p, &id, not_found).await));
        seen.push(id);
    }
    // A changed spec with the same name (a replacement) also gets a new instance.
    let mut changed = req.clone();
    changed.cloud_init = b"#cloud-config\nchanged\n".to_vec();
    let id = f.p.create(&changed).await.unwrap();
    assert!(!seen.contains(&id));
    assert_eq!(live_instances(&f.emu), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn read_after_write_waits_out_eventual_consistency() {
    let _dir = plugins_or_skip!();
    let cfg = Ec2Config {
        eventual_consistency: Duration::from_millis(1500),
        ..Ec2Config::default()
    };
    let f = fixture(cfg).await;
    let start = Instant::now();
    let id = f.p.create(&eu("uid-11")).await.unwrap();
    assert!(
        start.elapsed() >= Duration::from_millis(1400),
        "create waited for visibility: {:?}",
        start.elapsed()
    );
    let i = f.p.get(&id).await.expect("never not-found after create");
    assert_eq!(i.uid, "uid-11");
}

/// Longer than the plugin waits: create fails transiently, and the retry finds the same
/// instance instead of launching a second one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_instance_invisible_for_too_long_is_transient_then_found_again() {
    let _dir = plugins_or_skip!();
    let cfg = Ec2Config {
        eventual_consistency: Duration::from_secs(11),
        ..Ec2Config::default()
    };
    let f = fixture(cfg).await;
    let req = eu("uid-12");
    let e = f.p.create(&req).await.unwrap_err();
    assert_eq!(e.class, Class::Transient, "{e}");
    assert_eq!(e.code.as_deref(), Some("NotYetVisible"));
    // Still invisible: the retry relaunches with the same client token, gets the same
    // instance back, and waits again until it shows.
    let id = f.p.create(&req).await.unwrap();
    assert!(f.p.get(&id).await.is_ok());
    assert_eq!(live_instances(&f.emu), 1, "{:?}", f.emu.dump());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unusable_placement_is_permanent_before_any_call() {
    let _dir = plugins_or_skip!();
    let f = fixture(Ec2Config::default()).await;
    let cases = [
        ("region", "mars-1", "eu-west-1a", "t3.micro", "debian"),
        ("zone", "eu-west-1", "eu-west-1c", "t3.micro", "debian"),
        ("zone", "eu-west-1", "", "t3.micro", "debian"),
        (
            "machineType",
            "eu-west-1",
            "eu-west-1a",
            "m5.large",
            "debian",
        ),
        ("image", "eu-west-1", "eu-west-1a", "t3.micro", "arch"),
        ("image", "eu-west-1", "eu-west-1a", "t3.micro", "ami-zz"),
    ];
    for (field, region, zone, machine, image) in cases {
        let mut req = request("uid-13", region, zone);
        req.placement.machine_type = machine.into();
        req.placement.image = image.into();
        let e = f.p.create(&req).await.unwrap_err();
        assert_eq!(e.class, Class::Permanent, "{field}: {e}");
        let value = match field {
            "region" => region,
            "zone" => zone,
            "machineType" => machine,
            _ => image,
        };
        assert!(
            e.message.contains(&format!("placement.{field}"))
                && e.message.contains(&format!("{value:?}")),
            "{e}"
        );
    }
    let mut big = eu("uid-13");
    big.cloud_init = vec![b'#'; 16 * 1024 + 1];
    let e = f.p.create(&big).await.unwrap_err();
    assert_eq!(
        (e.class, e.code.as_deref()),
        (Class::Permanent, Some("UserDataTooLarge"))
    );
    assert!(f.emu.requests().is_empty(), "{:?}", f.emu.requests());

    // Well-formed, but EC2 does not know the AMI: EC2's own code, still permanent.
    let mut req = eu("uid-13");
    req.placement.image = "ami-0123456789abcdef0".into();
    let e = f.p.create(&req).await.unwrap_err();
    assert_eq!(
        (e.class, e.code.as_deref()),
        (Class::Permanent, Some("InvalidAMIID.NotFound"))
    );
    assert_eq!(live_instances(&f.emu), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_fault_kind_maps_to_its_class() {
    let _dir = plugins_or_skip!();
    let f = fixture(Ec2Config::default()).await;
    let id = f.p.create(&eu("uid-14")).await.unwrap();
    let fault = |op, kind| Fault { op, kind, count: 1 };

    for (kind, class, code) in [
        (FaultKind::ServerError, Class::Transient, "InternalError"),
        (FaultKind::ServerError, Class::Transient, "InternalError"),
        (
            FaultKind::RateLimit,
            Class::QuotaExceeded,
            "RequestLimitExceeded",
        ),
        (FaultKind::Auth, Class::Permanent, "AuthFailure"),
    ] {
        f.emu.inject(fault(FaultOp::Get, kind.clone()));
        let e = f.p.get(&id).await.unwrap_err();
        assert_eq!(
            (e.class, e.code.as_deref()),
            (class, Some(code)),
            "{kind:?}: {e}"
        );
    }
    // The second server error of one fault answers 503 Unavailable.
    f.emu.inject(Fault {
        op: FaultOp::Get,
        kind: FaultKind::ServerError,
        count: 2,
    });
    assert_eq!(
        f.p.get(&id).await.unwrap_err().code.as_deref(),
        Some("InternalError")
    );
    assert_eq!(
        f.p.get(&id).await.unwrap_err().code.as_deref(),
        Some("Unavailable")
    );
    assert!(f.p.get(&id).await.is_ok(), "faults are used up");

    f.emu.inject(fault(FaultOp::Create, FaultKind::Quota));
    let e = f.p.create(&eu("uid-15")).await.unwrap_err();
    assert_eq!(
        (e.class, e.code.as_deref()),
        (Class::QuotaExceeded, Some("InstanceLimitExceeded"))
    );
    f.emu.inject(fault(FaultOp::Delete, FaultKind::ServerError));
    assert_eq!(f.p.delete(&id).await.unwrap_err().class, Class::Transient);
    f.emu.inject(fault(FaultOp::List, FaultKind::RateLimit));
    assert_eq!(
        f.p.list_by_tag("inst-a").await.unwrap_err().class,
        Class::QuotaExceeded
    );

    // One failing region fails the whole list (fail-whole), and only its check target.
    f.emu.fail_scope("us-east-1", true);
    let e = f.p.list_by_tag("inst-a").await.unwrap_err();
    assert_eq!(e.class, Class::Transient, "{e}");
    assert!(e.message.contains("us-east-1"), "{e}");
    let targets = f.p.check().await.unwrap();
    assert!(targets[0].ready, "{targets:?}");
    assert_eq!(
        (
            targets[1].target.as_str(),
            targets[1].ready,
            targets[1].reason.as_str()
        ),
        ("us-east-1", false, "APIError")
    );
    f.emu.fail_scope("us-east-1", false);
    assert_eq!(f.p.list_by_tag("inst-a").await.unwrap().len(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_backend_is_a_transient_timeout() {
    let _dir = plugins_or_skip!();
    let f = fixture_with(
        Ec2Config::default(),
        "limits: {http: {firstByteTimeout: 1s}}",
    )
    .await;
    let id = f.p.create(&eu("uid-16")).await.unwrap();
    f.emu
        .inject(Fault::slow(FaultOp::Get, Duration::from_secs(5), 1));
    let start = Instant::now();
    let e = f.p.get(&id).await.unwrap_err();
    assert_eq!(e.class, Class::Transient, "{e}");
    assert!(
        start.elapsed() < Duration::from_secs(4),
        "{:?}",
        start.elapsed()
    );
    f.emu
        .inject(Fault::slow(FaultOp::List, Duration::from_secs(5), 1));
    let targets = f.p.check().await.unwrap();
    assert_eq!(targets[0].reason, "Timeout", "{targets:?}");
}

/// Credentials are read on every call: a wrong key is permanent, a missing file transient,
/// and fixing the file works at the next call. Session credentials send their token.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn credentials_rotate_and_are_classified() {
    let _dir = plugins_or_skip!();
    let cfg = Ec2Config::default().with_session_credential(
        "ASIAEXAMPLESESSION01",
        "session/secret/key",
        "session-token-value",
    );
    let f = fixture(cfg).await;
    let req = eu("uid-17");
    let sk = f.secret("secretAccessKey");

    std::fs::write(&sk, "wrong").unwrap();
    let e = f.p.create(&req).await.unwrap_err();
    assert_eq!(
        (e.class, e.code.as_deref()),
        (Class::Permanent, Some("AuthFailure"))
    );
    let targets = f.p.check().await.unwrap();
    assert!(
        targets
            .iter()
            .all(|t| !t.ready && t.reason == "Unauthorized"),
        "{targets:?}"
    );

    std::fs::remove_file(&sk).unwrap();
    let e = f.p.create(&req).await.unwrap_err();
    assert_eq!(e.class, Class::Transient, "a Secret not mounted yet: {e}");
    assert!(e.message.contains("secretAccessKey"), "{e}");

    std::fs::write(&sk, EXAMPLE_SECRET_KEY).unwrap();
    let id = f.p.create(&req).await.unwrap();

    // Rotate to session credentials: all three files, picked up at the next call.
    std::fs::write(f.secret("accessKeyId"), "ASIAEXAMPLESESSION01").unwrap();
    std::fs::write(&sk, "session/secret/key").unwrap();
    let e = f.p.get(&id).await.unwrap_err();
    assert_eq!(e.code.as_deref(), Some("AuthFailure"), "token missing: {e}");
    std::fs::write(f.secret("sessionToken"), "session-token-value\n").unwrap();
    assert_eq!(f.p.get(&id).await.unwrap().uid, "uid-17");
}

/// A cloud-init sentinel and a secret-key sentinel, through every operation and the
/// failures that echo the most, never reach an error, a log line or a span.
#[tokio::test]
async fn sentinels_never_leave_the_sandbox() {
    let _dir = plugins_or_skip!();
    const CI_SENTINEL: &str = "CLOUDINIT-SENTINEL-5e8d21";
    const SECRET_SENTINEL: &str = "SECRET-SENTINEL-93bc0f";
    let (_guard, captured) = proxy_operator::testing::capture();
    let cfg = Ec2Config::default().with_credential("AKIASENTINELKEY00001", SECRET_SENTINEL);
    let Fixture { emu, secrets, p } = fixture(cfg).await;
    let secret = |k: &str| secrets.path().join(k);
    std::fs::write(secret("accessKeyId"), "AKIASENTINELKEY00001").unwrap();
    std::fs::write(secret("secretAccessKey"), SECRET_SENTINEL).unwrap();
    let p = egress_plugin_host::provider::Instrumented::new(p, Default::default());

    let mut req = eu("uid-18");
    req.cloud_init =
        format!("#cloud-config\nwrite_files:\n  - content: {CI_SENTINEL}\n").into_bytes();
    let mut seen = String::new();
    let id = p.create(&req).await.unwrap();
    seen += &format!("{:?}\n", p.get(&id).await);
    seen += &format!("{:?}\n", p.list_by_tag("inst-a").await);
    seen += &format!("{:?}\n", p.check().await);

    let mut big = req.clone();
    big.name = name_from_uid("uid-19");
    big.cloud_init = format!("{CI_SENTINEL}\n").repeat(1000).into_bytes();
    seen += &format!("{:?}\n", p.create(&big).await.unwrap_err());
    let mut bad_image = req.clone();
    bad_image.name = name_from_uid("uid-20");
    bad_image.placement.image = "ami-0123456789abcdef0".into();
    seen += &format!("{:?}\n", p.create(&bad_image).await.unwrap_err());
    emu.inject(Fault {
        op: FaultOp::Any,
        kind: FaultKind::Auth,
        count: 1,
    });
    seen += &format!("{:?}\n", p.get(&id).await.unwrap_err());
    std::fs::write(secret("secretAccessKey"), format!("{SECRET_SENTINEL}x")).unwrap();
    seen += &format!("{:?}\n", p.delete(&id).await.unwrap_err());
    seen += &format!("{:?}\n", p.check().await);
    std::fs::write(secret("secretAccessKey"), SECRET_SENTINEL).unwrap();
    p.delete(&id).await.unwrap();

    seen += &captured.all_text();
    for sentinel in [CI_SENTINEL, SECRET_SENTINEL] {
        assert!(!seen.contains(sentinel), "{sentinel} leaked:\n{seen}");
    }
    assert!(
        captured
            .events()
            .iter()
            .any(|e| e.target == "plugin" && e.message().contains("created eu-west-1/i-")),
        "the plugin's own log lines were captured, so the check above means something"
    );
}

/// The same lifecycle against an external EC2 endpoint (moto, or real AWS, where it costs
/// a few minutes of one instance): `EGRESS_EC2_IT_ENTRY` is a providers-file entry for
/// `ec2.wasm` (name, hosts, secrets, config) and `EGRESS_EC2_IT_PLACEMENT` is
/// `region/zone/instance-type/image`. Run with `--ignored`; skipped (loudly) without them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs EGRESS_EC2_IT_ENTRY and EGRESS_EC2_IT_PLACEMENT (moto or AWS)"]
async fn real_ec2_lifecycle() {
    let _dir = plugins_or_skip!();
    let (Ok(yaml), Ok(placement)) = (
        std::env::var("EGRESS_EC2_IT_ENTRY"),
        std::env::var("EGRESS_EC2_IT_PLACEMENT"),
    ) else {
        eprintln!(
            "\n!!! SKIPPING: set EGRESS_EC2_IT_ENTRY and EGRESS_EC2_IT_PLACEMENT to run the EC2 \
             lifecycle against moto or AWS\n"
        );
        return;
    };
    let rt = support::runtime();
    let p = support::provider(&rt, "ec2.wasm", &yaml).await;
    lifecycle(&p, &placement, Duration::from_secs(5)).await;
}

/// The body of [`real_ec2_lifecycle`], run here against the emulator so that the code the
/// lead runs against moto or AWS is known to work.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_integration_lifecycle_passes_against_the_emulator() {
    let _dir = plugins_or_skip!();
    let f = fixture(Ec2Config {
        launch: Transition::After(Duration::from_millis(300)),
        shutdown: Transition::After(Duration::from_millis(300)),
        ..Ec2Config::default()
    })
    .await;
    lifecycle(
        &f.p,
        "eu-west-1/eu-west-1b/t3.small/ami-0fedcba9876543210",
        Duration::from_millis(50),
    )
    .await;
    let dump = f.emu.dump();
    assert!(
        dump.instances.is_empty() && dump.secondary.is_empty(),
        "{dump:?}"
    );
}

/// Create, create again, poll until Running, list, delete twice, poll until gone.
async fn lifecycle(p: &WasmProvider, placement: &str, poll: Duration) {
    let parts: Vec<&str> = placement.split('/').collect();
    assert_eq!(
        parts.len(),
        4,
        "region/zone/instance-type/image: {placement}"
    );
    let uid = format!("it-{}", std::process::id());
    let mut req = request(&uid, parts[0], parts[1]);
    req.installation = "egress-integration-test".into();
    req.placement.machine_type = parts[2].into();
    req.placement.image = parts[3].into();

    let id = p.create(&req).await.unwrap();
    assert_eq!(p.create(&req).await.unwrap(), id);
    let deadline = Instant::now() + Duration::from_secs(600);
    loop {
        let i = p.get(&id).await.unwrap();
        assert_eq!(i.uid, uid);
        if i.state == State::Running {
            assert!(!i.ip.is_empty());
            break;
        }
        assert_eq!(i.state, State::Provisioning, "{i:?}");
        assert!(Instant::now() < deadline, "not running after 10 minutes");
        tokio::time::sleep(poll).await;
    }
    let listed = p.list_by_tag(&req.installation).await.unwrap();
    assert!(listed.iter().any(|i| i.id == id), "{listed:?}");
    p.delete(&id).await.unwrap();
    p.delete(&id).await.unwrap();
    let deadline = Instant::now() + Duration::from_secs(600);
    while !not_found(&p.get(&id).await) {
        assert!(Instant::now() < deadline, "not gone after 10 minutes");
        tokio::time::sleep(poll).await;
    }
    p.delete(&id).await.unwrap();
}

fn spot(req: CreateRequest) -> CreateRequest {
    CreateRequest {
        placement: Placement {
            capacity: Capacity::Spot,
            ..req.placement
        },
        ..req
    }
}

/// A spot create makes a one-time Spot Instance (the emulator refuses any other market
/// options with EC2's errors); an on-demand create sends none, so the instance is not spot.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn spot_creates_a_spot_instance_and_on_demand_does_not() {
    let _dir = plugins_or_skip!();
    let f = fixture(Ec2Config::default()).await;
    let on_demand = f.p.create(&eu("uid-od")).await.unwrap();
    assert!(
        f.emu.spot_instances().is_empty(),
        "on-demand: no market options"
    );
    let id = f.p.create(&spot(eu("uid-spot"))).await.unwrap();
    assert_eq!(f.emu.spot_instances(), [Fixture::backend_id(&id)]);
    assert_eq!(
        f.p.create(&spot(eu("uid-spot"))).await.unwrap(),
        id,
        "idempotent by name, spot or not"
    );
    let running = get_until(
        &f.p,
        &id,
        |r| matches!(r, Ok(i) if i.state == State::Running),
    )
    .await
    .unwrap();
    assert!(!running.interrupted);
    get_until(
        &f.p,
        &on_demand,
        |r| matches!(r, Ok(i) if i.state == State::Running),
    )
    .await
    .unwrap();
    // A user's delete of a Spot Instance is no interruption.
    f.p.delete(&id).await.unwrap();
    let r = get_until(&f.p, &id, not_found).await;
    assert!(
        matches!(&r, Err(e) if e.code.as_deref() == Some("Terminated")),
        "{r:?}"
    );
}

/// EC2 reclaims a Spot Instance: Terminated and interrupted while it shuts down (Get and
/// ListByTag), then NotFound with code Interrupted, and Delete still succeeds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reclaimed_spot_instance_is_interrupted_then_not_found() {
    let _dir = plugins_or_skip!();
    let cfg = Ec2Config {
        shutdown: Transition::Manual,
        ..Ec2Config::default()
    };
    let f = fixture(cfg).await;
    let id = f.p.create(&spot(eu("uid-r"))).await.unwrap();
    get_until(
        &f.p,
        &id,
        |r| matches!(r, Ok(i) if i.state == State::Running),
    )
    .await
    .unwrap();
    let bid = Fixture::backend_id(&id);
    assert_eq!(f.emu.reclaim(bid), Ok(true));
    let i = f.p.get(&id).await.unwrap();
    assert_eq!((i.state, i.interrupted), (State::Terminated, true));
    let listed = f.p.list_by_tag("inst-a").await.unwrap();
    let l = listed
        .iter()
        .find(|l| l.id == id)
        .expect("listed while shutting down");
    assert_eq!((l.state, l.interrupted), (State::Terminated, true));

    f.emu.set_backend_state(bid, "terminated");
    let e = f.p.get(&id).await.unwrap_err();
    assert_eq!(
        (e.class, e.code.as_deref()),
        (Class::NotFound, Some("Interrupted")),
        "{e}"
    );
    assert!(e.message.contains("Server.SpotInstanceTermination"), "{e}");
    f.p.delete(&id)
        .await
        .expect("deleting a reclaimed instance succeeds");
    assert!(f.p.list_by_tag("inst-a").await.unwrap().is_empty());
}

/// No spot capacity: QuotaExceeded with code SpotCapacityUnavailable naming EC2's code,
/// nothing launched; on-demand is untouched, and spot works again once capacity is back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_spot_capacity_is_quota_exceeded_and_leaves_nothing() {
    let _dir = plugins_or_skip!();
    let f = fixture(Ec2Config::default()).await;
    assert!(f.emu.set_spot_capacity(false));
    let req = spot(eu("uid-c"));
    let e = f.p.create(&req).await.unwrap_err();
    assert_eq!(
        (e.class, e.code.as_deref()),
        (Class::QuotaExceeded, Some("SpotCapacityUnavailable")),
        "{e}"
    );
    assert!(e.message.contains("InsufficientInstanceCapacity"), "{e}");
    assert_eq!(live_instances(&f.emu), 0);
    assert!(f.emu.dump().secondary.is_empty(), "no volume either");
    f.p.create(&eu("uid-c2")).await.unwrap();
    assert_eq!(live_instances(&f.emu), 1, "on-demand still launches");
    f.emu.set_spot_capacity(true);
    let id = f.p.create(&req).await.unwrap();
    assert_eq!(f.emu.spot_instances(), [Fixture::backend_id(&id)]);
}

/// A spot placement's price from EC2's spot price history (DescribeSpotPriceHistory for the
/// type in its zone, Linux/UNIX, from now): the zone's own price exactly, in US dollars;
/// none for a type the region has no spot price for; a failed call classified as any other.
/// An on-demand placement has no price from the plugin, and costs no request: EC2 serves
/// on-demand prices only from the Price List API, and the providers file's `prices` carry
/// them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn quote_reads_the_spot_price_history() {
    let _dir = plugins_or_skip!();
    let mut cfg = Ec2Config {
        spot_price: "0.0035".into(),
        spot_prices: vec![ZoneSpotPrice::new("t3.micro", "eu-west-1a", "0.003100")],
        ..Ec2Config::default()
    };
    // us-east-1 offers no t3.small: it has no spot price there.
    cfg.regions[0].instance_types.retain(|t| t != "t3.small");
    let f = fixture(cfg).await;
    let at = |region: &str, zone: &str, machine: &str| Placement {
        capacity: Capacity::Spot,
        ..Placement::new(region, zone, machine, "debian")
    };
    let usd = |micros_per_hour| {
        Some(egress_plugin_host::provider::Price {
            currency: "USD".into(),
            micros_per_hour,
        })
    };
    let asked = |f: &Fixture| {
        f.emu
            .stats()
            .by_call
            .get("DescribeSpotPriceHistory")
            .copied()
            .unwrap_or(0)
    };
    let q = |placement| {
        let p = &f.p;
        async move { p.quote(&placement).await }
    };
    assert_eq!(
        q(at("eu-west-1", "eu-west-1a", "t3.micro")).await.unwrap(),
        usd(3_100)
    );
    assert_eq!(
        q(at("eu-west-1", "eu-west-1b", "t3.micro")).await.unwrap(),
        usd(3_500)
    );
    assert_eq!(
        q(at("us-east-1", "us-east-1a", "t3.small")).await.unwrap(),
        None
    );
    assert_eq!(asked(&f), 3);
    let on_demand = Placement::new("eu-west-1", "eu-west-1a", "t3.small", "debian");
    assert_eq!(q(on_demand).await.unwrap(), None);
    assert_eq!(asked(&f), 3, "on-demand: no request");
    let e = q(at("eu-west-1", "eu-west-1c", "t3.micro"))
        .await
        .unwrap_err();
    assert_eq!(e.class, Class::Permanent, "{e}");
    assert!(e.message.contains("eu-west-1c"), "{e}");

    f.emu.inject(Fault {
        op: FaultOp::Any,
        kind: FaultKind::ServerError,
        count: 1,
    });
    let e = q(at("eu-west-1", "eu-west-1b", "t3.small"))
        .await
        .unwrap_err();
    assert_eq!(
        (e.class, e.code.as_deref()),
        (Class::Transient, Some("InternalError")),
        "{e}"
    );
}
