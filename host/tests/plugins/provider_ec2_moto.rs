//! The EC2 plugin through the host, against a real moto server (not our own emulator):
//! the lifecycle, refused credentials, and refused AMIs and instance types.
//!
//! `cargo xtask test` starts moto (xtask/src/moto.rs) with signature checking, AMI
//! validation and instance-type validation on, and passes it in `EGRESS_MOTO_*`. Without
//! those the tests skip loudly; under `CI=true` they fail instead. To run only these:
//!
//! ```sh
//! cargo xtask build-plugins
//! cargo xtask moto      # in another terminal; prints `export EGRESS_MOTO_...` lines
//! # paste those here, then:
//! cargo test --workspace --test plugins provider_ec2_moto::
//! ```
//!
//! moto differs from EC2 in ways the tests allow for: it ignores `ClientToken` (a repeated
//! create is idempotent here only through the plugin's lookup by name), it goes straight to
//! `running`, and it keeps terminated instances listed (the plugin reads them as gone).
//! `xtask/moto_server.py` corrects one difference that would refuse every launch: moto
//! wants a size for a block device mapping of the AMI's root device, which EC2 does not.

use crate::support;

use egress_plugin_host::plugin::WasmProvider;
use egress_plugin_host::provider::{
    Capacity, Class, CreateRequest, Instance, MARK_INSTALLATION, MARK_MANAGED, MARK_UID, Placement,
    Price, Provider, ProviderError, State,
};
use sha2::{Digest, Sha256};
use std::path::Path;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant, SystemTime};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// What `cargo xtask test` (or `cargo xtask moto`) hands over.
struct Moto {
    url: String,
    access_key_id: String,
    secret_access_key: String,
    region: String,
    zone: String,
    image: String,
    instance_type: String,
}

const VARS: [&str; 7] = [
    "EGRESS_MOTO_URL",
    "EGRESS_MOTO_ACCESS_KEY_ID",
    "EGRESS_MOTO_SECRET_ACCESS_KEY",
    "EGRESS_MOTO_REGION",
    "EGRESS_MOTO_ZONE",
    "EGRESS_MOTO_IMAGE",
    "EGRESS_MOTO_INSTANCE_TYPE",
];

/// The server from the environment; `None` (after saying so loudly) when it is not set,
/// and a failure instead under `CI=true`.
fn moto() -> Option<Moto> {
    let vals: Vec<Option<String>> = VARS
        .iter()
        .map(|k| std::env::var(k).ok().filter(|v| !v.is_empty()))
        .collect();
    let missing: Vec<&str> = VARS
        .iter()
        .zip(&vals)
        .filter(|(_, v)| v.is_none())
        .map(|(k, _)| *k)
        .collect();
    if !missing.is_empty() {
        let msg = format!(
            "no moto server: {} not set — run `cargo xtask test`, or `cargo xtask moto` and \
             export what it prints",
            missing.join(", ")
        );
        if std::env::var("CI").is_ok_and(|v| v == "true") {
            panic!("{msg}");
        }
        eprintln!("\n!!! SKIPPING: {msg}\n");
        return None;
    }
    let mut v = vals.into_iter().map(Option::unwrap);
    let mut next = || v.next().unwrap();
    Some(Moto {
        url: next(),
        access_key_id: next(),
        secret_access_key: next(),
        region: next(),
        zone: next(),
        image: next(),
        instance_type: next(),
    })
}

macro_rules! moto_or_skip {
    () => {
        match moto() {
            Some(m) => m,
            None => return,
        }
    };
}

/// A name no other test or run shares (moto's state outlives a test, and keeps
/// terminated instances).
fn unique(prefix: &str) -> String {
    static N: AtomicU32 = AtomicU32::new(0);
    let nanos = SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .unwrap()
        .subsec_nanos();
    format!(
        "{prefix}-{}-{nanos}-{}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    )
}

/// The providers-file entry: the region's endpoint is moto, allow-listed explicitly (it
/// is loopback, refused unless named). `extra_types` are allowed by the plugin's config
/// so that moto is the one to judge them.
fn entry(m: &Moto, secrets: &Path, extra_types: &[&str]) -> String {
    let s = |k: &str| secrets.join(k).display().to_string();
    let mut types = vec![m.instance_type.as_str()];
    types.extend(extra_types);
    format!(
        r#"name: aws-moto
plugin: ec2.wasm
additionalHosts: ['{url}']
allowPrivateAddresses: true
secrets: {{accessKeyId: {ak}, secretAccessKey: {sk}}}
config:
  regions:
    {region}:
      endpoint: '{url}'
      zones: {{{zone}: {{}}}}
      images: {{amzn2: {image}}}
  instanceTypes: [{types}]
  tags: {{team: net}}"#,
        url = m.url,
        ak = s("accessKeyId"),
        sk = s("secretAccessKey"),
        region = m.region,
        zone = m.zone,
        image = m.image,
        types = types.join(", "),
    )
}

struct Fixture {
    _secrets: tempfile::TempDir,
    p: WasmProvider,
}

async fn fixture(m: &Moto, secret_access_key: &str, extra_types: &[&str]) -> Fixture {
    let secrets = tempfile::tempdir().unwrap();
    std::fs::write(secrets.path().join("accessKeyId"), &m.access_key_id).unwrap();
    // A trailing newline, as `kubectl create secret --from-file` often leaves one.
    std::fs::write(
        secrets.path().join("secretAccessKey"),
        format!("{secret_access_key}\n"),
    )
    .unwrap();
    let rt = support::runtime();
    let p = support::provider(&rt, "ec2.wasm", &entry(m, secrets.path(), extra_types)).await;
    Fixture {
        _secrets: secrets,
        p,
    }
}

fn request(m: &Moto, uid: &str, installation: &str) -> CreateRequest {
    CreateRequest {
        proxy_name: "p1".into(),
        cloud_init: b"#cloud-config\n\x00\xff bytes kept as they are\n".to_vec(),
        ..CreateRequest::new(
            uid,
            installation,
            Placement::new(&m.region, &m.zone, &m.instance_type, "amzn2"),
        )
    }
}

fn not_found(r: &Result<Instance, ProviderError>) -> bool {
    matches!(r, Err(e) if e.class == Class::NotFound)
}

/// One EC2 Query API call to moto, signed (SigV4) with the test user's key by the test
/// itself: what moto holds, seen the way any EC2 client sees it, independent of the
/// plugin's client, filters and parsing. Returns the XML of a 200 answer.
async fn ec2_call(m: &Moto, action: &str, params: &[(&str, &str)]) -> String {
    let authority = m.url.strip_prefix("http://").expect("moto URL is http");
    let mut body = format!("Action={action}&Version=2016-11-15");
    for (k, v) in params {
        body += &format!("&{}={}", form_encode(k), form_encode(v));
    }
    let content_type = "application/x-www-form-urlencoded; charset=utf-8";
    let stamp = humantime::format_rfc3339_seconds(SystemTime::now())
        .to_string()
        .replace(['-', ':'], "");
    let day = &stamp[..8];
    let scope = format!("{day}/{}/ec2/aws4_request", m.region);
    let signed_headers = "content-type;host;x-amz-date";
    let canonical = format!(
        "POST\n/\n\ncontent-type:{content_type}\nhost:{authority}\nx-amz-date:{stamp}\n\n\
         {signed_headers}\n{}",
        hex::encode(Sha256::digest(&body))
    );
    let to_sign = format!(
        "AWS4-HMAC-SHA256\n{stamp}\n{scope}\n{}",
        hex::encode(Sha256::digest(&canonical))
    );
    let mut key = hmac(format!("AWS4{}", m.secret_access_key).as_bytes(), day);
    for part in [m.region.as_str(), "ec2", "aws4_request"] {
        key = hmac(&key, part);
    }
    let signature = hex::encode(hmac(&key, &to_sign));
    let req = format!(
        "POST / HTTP/1.0\r\nHost: {authority}\r\nContent-Type: {content_type}\r\n\
         X-Amz-Date: {stamp}\r\nAuthorization: AWS4-HMAC-SHA256 Credential={}/{scope}, \
         SignedHeaders={signed_headers}, Signature={signature}\r\nContent-Length: {}\r\n\r\n{body}",
        m.access_key_id,
        body.len()
    );
    let mut s = tokio::net::TcpStream::connect(authority).await.unwrap();
    s.write_all(req.as_bytes()).await.unwrap();
    let mut answer = String::new();
    s.read_to_string(&mut answer).await.unwrap();
    let (head, xml) = answer.split_once("\r\n\r\n").expect("an HTTP answer");
    assert!(
        head.starts_with("HTTP/1.0 200") || head.starts_with("HTTP/1.1 200"),
        "{action}: {answer}"
    );
    xml.to_string()
}

/// RFC 3986 percent-encoding of everything but the unreserved characters.
fn form_encode(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// The text of every `<tag>...</tag>` in `xml`, in order. EC2's answers are small,
/// regular and unindented, so this is all the XML reading the checks need.
fn texts<'a>(xml: &'a str, tag: &str) -> Vec<&'a str> {
    let (open, close) = (format!("<{tag}>"), format!("</{tag}>"));
    let mut out = Vec::new();
    let mut rest = xml;
    while let Some(i) = rest.find(&open) {
        let after = &rest[i + open.len()..];
        let Some(j) = after.find(&close) else { break };
        out.push(&after[..j]);
        rest = &after[j + close.len()..];
    }
    out
}

/// Every instance moto holds named `name` (terminated ones included: moto keeps them),
/// as the XML of each. The plugin launches one instance per RunInstances, so each
/// reservation's `instancesSet` is one instance.
async fn instances_named(m: &Moto, name: &str) -> Vec<String> {
    let xml = ec2_call(
        m,
        "DescribeInstances",
        &[("Filter.1.Name", "tag:Name"), ("Filter.1.Value.1", name)],
    )
    .await;
    let sets = texts(&xml, "instancesSet");
    for set in &sets {
        assert_eq!(
            texts(set, "instanceId").len(),
            1,
            "one per reservation: {set}"
        );
    }
    sets.into_iter().map(str::to_string).collect()
}

/// The value of tag `key` in one instance's XML.
fn tag<'a>(item: &'a str, key: &str) -> Option<&'a str> {
    let set = texts(item, "tagSet").into_iter().next()?;
    texts(set, "key")
        .into_iter()
        .zip(texts(set, "value"))
        .find(|(k, _)| *k == key)
        .map(|(_, v)| v)
}

/// How many volumes moto holds tagged `Name=name` (deleted ones are gone from it).
async fn volumes_named(m: &Moto, name: &str) -> usize {
    let xml = ec2_call(
        m,
        "DescribeVolumes",
        &[("Filter.1.Name", "tag:Name"), ("Filter.1.Value.1", name)],
    )
    .await;
    texts(&xml, "size").len()
}

/// HMAC-SHA256 (RFC 2104), for the signature above.
fn hmac(key: &[u8], msg: &str) -> Vec<u8> {
    let mut k = [0u8; 64];
    if key.len() > 64 {
        k[..32].copy_from_slice(&Sha256::digest(key));
    } else {
        k[..key.len()].copy_from_slice(key);
    }
    let pad = |x: u8| k.iter().map(|b| b ^ x).collect::<Vec<u8>>();
    let inner = Sha256::new()
        .chain_update(pad(0x36))
        .chain_update(msg)
        .finalize();
    Sha256::new()
        .chain_update(pad(0x5c))
        .chain_update(inner)
        .finalize()
        .to_vec()
}

fn backend_id(id: &str) -> &str {
    id.split_once('/').expect("region/instance-id").1
}

/// Create, create again, poll until Running, list, delete twice, poll until gone, delete
/// again; with moto's own state checked at each step.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lifecycle_against_moto() {
    let _dir = plugins_or_skip!();
    let m = moto_or_skip!();
    let f = fixture(&m, &m.secret_access_key, &[]).await;
    let (uid, installation) = (unique("uid"), unique("inst"));
    let req = request(&m, &uid, &installation);

    let id = f.p.create(&req).await.unwrap();
    assert!(id.starts_with(&format!("{}/i-", m.region)), "{id}");
    assert_eq!(
        f.p.create(&req).await.unwrap(),
        id,
        "create again: the same instance (found by name; moto ignores ClientToken)"
    );

    let named = instances_named(&m, &req.name).await;
    assert_eq!(
        named.len(),
        1,
        "moto holds exactly one {}: {named:?}",
        req.name
    );
    let inst = named[0].as_str();
    assert_eq!(texts(inst, "instanceId"), [backend_id(&id)]);
    assert_eq!(texts(inst, "imageId"), [m.image.as_str()]);
    assert_eq!(texts(inst, "instanceType"), [m.instance_type.as_str()]);
    assert_eq!(texts(inst, "availabilityZone"), [m.zone.as_str()]);
    assert_eq!(tag(inst, MARK_MANAGED), Some("true"));
    assert_eq!(tag(inst, MARK_UID), Some(uid.as_str()));
    assert_eq!(tag(inst, MARK_INSTALLATION), Some(installation.as_str()));
    assert_eq!(tag(inst, "team"), Some("net"));
    assert_eq!(
        volumes_named(&m, &req.name).await,
        1,
        "the root volume, tagged in the same call"
    );

    let deadline = Instant::now() + Duration::from_secs(60);
    let running = loop {
        let i = f.p.get(&id).await.unwrap();
        assert_eq!(i.uid, uid, "uid read back from the tag");
        if i.state == State::Running {
            break i;
        }
        assert_eq!(i.state, State::Provisioning, "{i:?}");
        assert!(Instant::now() < deadline, "not running after 60 s: {i:?}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    assert!(
        running.ip.parse::<std::net::Ipv4Addr>().is_ok(),
        "a public IPv4: {running:?}"
    );
    let age = SystemTime::now()
        .duration_since(running.created_at.expect("launchTime read back"))
        .unwrap_or_default();
    assert!(
        age < Duration::from_secs(600),
        "created_at is recent: {age:?}"
    );

    let listed = f.p.list_by_tag(&installation).await.unwrap();
    assert_eq!(
        listed.iter().map(|i| i.id.as_str()).collect::<Vec<_>>(),
        [id.as_str()],
        "{listed:?}"
    );
    assert_eq!(listed[0].uid, uid);
    assert!(
        !f.p.list_by_tag(&unique("other"))
            .await
            .unwrap()
            .iter()
            .any(|i| i.id == id),
        "other installations do not list it"
    );

    f.p.delete(&id).await.unwrap();
    f.p.delete(&id).await.unwrap();
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let r = f.p.get(&id).await;
        if not_found(&r) {
            break;
        }
        let i = r.unwrap();
        assert_eq!(i.state, State::Terminated, "while it goes: {i:?}");
        assert!(Instant::now() < deadline, "not gone after 60 s: {i:?}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    f.p.delete(&id).await.unwrap();
    assert!(
        !f.p.list_by_tag(&installation)
            .await
            .unwrap()
            .iter()
            .any(|i| i.id == id),
        "a terminated instance is not listed"
    );

    let named = instances_named(&m, &req.name).await;
    assert_eq!(named.len(), 1, "{named:?}");
    let state = texts(&named[0], "instanceState");
    assert_eq!(
        texts(state[0], "name"),
        ["terminated"],
        "moto keeps it, terminated"
    );
    assert_eq!(
        volumes_named(&m, &req.name).await,
        0,
        "the root volume went with the instance"
    );

    let targets = f.p.check().await.expect("ec2 has a check");
    assert_eq!(targets.len(), 1, "{targets:?}");
    assert_eq!(targets[0].target, m.region);
    assert!(
        targets[0].ready && targets[0].reason == "Reachable",
        "{targets:?}"
    );
}

/// moto checks signatures: a wrong secret key is refused, and the plugin reports that as
/// permanent (never as "gone"), and its health check as Unauthorized.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wrong_secret_key_is_refused_permanently() {
    let _dir = plugins_or_skip!();
    let m = moto_or_skip!();
    let mut wrong = m.secret_access_key.clone();
    let last = wrong.pop().unwrap();
    wrong.push(if last == 'A' { 'B' } else { 'A' });
    let f = fixture(&m, &wrong, &[]).await;
    let req = request(&m, &unique("uid"), &unique("inst"));

    // EC2's answer (and moto's, for EC2) to a bad signature: AuthFailure, HTTP 401.
    let auth =
        |e: &ProviderError| e.class == Class::Permanent && e.code.as_deref() == Some("AuthFailure");
    let e = f.p.create(&req).await.unwrap_err();
    assert!(auth(&e), "create: {e:?}");
    let e = f.p.list_by_tag(&req.installation).await.unwrap_err();
    assert!(auth(&e), "list: {e:?}");
    let e =
        f.p.get(&format!("{}/i-0123456789abcdef0", m.region))
            .await
            .unwrap_err();
    assert!(auth(&e), "get (refused, not gone): {e:?}");
    let e =
        f.p.delete(&format!("{}/i-0123456789abcdef0", m.region))
            .await
            .unwrap_err();
    assert!(auth(&e), "delete (refused, not done): {e:?}");

    let targets = f.p.check().await.expect("ec2 has a check");
    assert!(
        !targets[0].ready && targets[0].reason == "Unauthorized",
        "{targets:?}"
    );
    assert!(instances_named(&m, &req.name).await.is_empty());
}

/// moto validates AMIs and instance types: unknown ones are refused with EC2's codes, as
/// permanent errors, and nothing is launched.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unknown_image_or_instance_type_is_refused_permanently() {
    let _dir = plugins_or_skip!();
    let m = moto_or_skip!();
    // Allowed by the plugin's config, so that moto is the one to refuse it.
    let f = fixture(&m, &m.secret_access_key, &["t9.nano"]).await;

    let mut bad_image = request(&m, &unique("uid"), &unique("inst"));
    bad_image.placement.image = "ami-0123456789abcdef0".into();
    let e = f.p.create(&bad_image).await.unwrap_err();
    assert_eq!(e.class, Class::Permanent, "{e:?}");
    assert_eq!(e.code.as_deref(), Some("InvalidAMIID.NotFound"), "{e:?}");

    let mut bad_type = request(&m, &unique("uid"), &unique("inst"));
    bad_type.placement.machine_type = "t9.nano".into();
    let e = f.p.create(&bad_type).await.unwrap_err();
    assert_eq!(e.class, Class::Permanent, "{e:?}");
    assert!(
        e.code
            .as_deref()
            .is_some_and(|c| c.starts_with("InvalidInstanceType")),
        "{e:?}"
    );

    for req in [&bad_image, &bad_type] {
        assert!(
            instances_named(&m, &req.name).await.is_empty(),
            "nothing launched for {}",
            req.name
        );
    }
}

/// A spot placement's price from moto's DescribeSpotPriceHistory. moto (5.x) answers every
/// zone of the region with `0.00001` as `Linux/UNIX (Amazon VPC)`, whatever zone and product
/// were asked for; the plugin keeps the Linux price of the placement's zone: 10 micro-USD.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_spot_quote_reads_the_spot_price_history() {
    let _dir = plugins_or_skip!();
    let m = moto_or_skip!();
    let f = fixture(&m, &m.secret_access_key, &[]).await;
    let spot = Placement {
        capacity: Capacity::Spot,
        ..Placement::new(&m.region, &m.zone, &m.instance_type, "amzn2")
    };
    let price = f.p.quote(&spot).await.unwrap();
    assert_eq!(
        price,
        Some(Price {
            currency: "USD".into(),
            micros_per_hour: 10
        })
    );
}

/// `proxy-operator provider lifecycle`, the command a user runs against their own account,
/// passes against moto with signature checking on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_lifecycle_command_passes_against_moto() {
    let plugins = plugins_or_skip!();
    let m = moto_or_skip!();
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("accessKeyId"), &m.access_key_id).unwrap();
    std::fs::write(dir.path().join("secretAccessKey"), &m.secret_access_key).unwrap();
    let file = dir.path().join("providers.yaml");
    let yaml = entry(&m, dir.path(), &[]).replace('\n', "\n  ");
    std::fs::write(&file, format!("providers:\n- {yaml}")).unwrap();
    let placement = format!("{}/{}/{}/amzn2", m.region, m.zone, m.instance_type);
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_proxy-operator"))
        .args([
            "provider",
            "lifecycle",
            "--provider",
            "aws-moto",
            "--poll",
            "200ms",
        ])
        .args(["--wait", "60s", "--installation", &unique("cli")])
        .arg("--config")
        .arg(&file)
        .arg("--plugin-dir")
        .arg(&plugins)
        .arg("--plugin-cache-dir")
        .arg(dir.path().join("cache"))
        .arg("--plugin-scratch-dir")
        .arg(dir.path().join("calls"))
        .args(["--placement", &placement])
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(stdout.contains("ok    left behind"), "{stdout}");
    assert!(stdout.ends_with("lifecycle passed\n"), "{stdout}");
}
