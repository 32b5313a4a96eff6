//! The emulator driven over HTTP the way a plugin drives EC2: SigV4-signed Query requests,
//! XML answers parsed back.

use super::sigv4::{SignedRequest, format_amz_date, signature, uri_encode};
use super::*;
use crate::control::{DumpCapacities, Emulator, FaultOp};
use bytes::Bytes;
use data_encoding::BASE64;
use http_body_util::{BodyExt, Full};
use hyper_util::rt::TokioIo;
use serde_json::json;
use std::net::SocketAddr;

const KEY: &str = EXAMPLE_ACCESS_KEY;
const SECRET: &str = EXAMPLE_SECRET_KEY;
const AMI: &str = "ami-0abcdef1234567890";
const EU_AMI: &str = "ami-0fedcba9876543210";

/// How a test request is signed; every field can be broken on purpose.
#[derive(Clone)]
struct Signer {
    access_key: String,
    secret: String,
    token: Option<String>,
    region: String,
    /// Seconds added to the signing clock.
    skew: i64,
    /// Send no Authorization header at all.
    unsigned: bool,
    /// Leave `Signature=` out of the Authorization header.
    drop_signature: bool,
    /// Change the body after signing it.
    tamper: bool,
    /// Send the parameters as a GET query string instead of a form body.
    get: bool,
}

impl Signer {
    fn new(region: &str) -> Signer {
        Signer {
            access_key: KEY.into(),
            secret: SECRET.into(),
            token: None,
            region: region.into(),
            skew: 0,
            unsigned: false,
            drop_signature: false,
            tamper: false,
            get: false,
        }
    }
}

struct Answer {
    status: u16,
    body: String,
}

impl Answer {
    fn doc(&self) -> roxmltree::Document<'_> {
        roxmltree::Document::parse(&self.body).unwrap_or_else(|e| panic!("{e}: {}", self.body))
    }

    /// The text of every element named `tag`, in document order.
    fn all(&self, tag: &str) -> Vec<String> {
        self.doc()
            .descendants()
            .filter(|n| n.has_tag_name(tag))
            .map(|n| n.text().unwrap_or("").to_string())
            .collect()
    }

    fn first(&self, tag: &str) -> Option<String> {
        self.all(tag).into_iter().next()
    }

    /// The error code of an error answer.
    fn code(&self) -> String {
        let doc = self.doc();
        let root = doc.root_element();
        assert_eq!(root.tag_name().name(), "Response", "{}", self.body);
        assert!(root.children().any(|n| n.has_tag_name("RequestID") && n.text().is_some()));
        self.first("Code").unwrap_or_default()
    }

    fn ok(&self) -> &Self {
        assert_eq!(self.status, 200, "{}", self.body);
        let doc = self.doc();
        let root = doc.root_element();
        assert_eq!(root.tag_name().namespace(), Some(xml::NAMESPACE));
        assert!(root.children().any(|n| n.has_tag_name("requestId")));
        self
    }
}

async fn call(emu: &Ec2Emulator, signer: &Signer, params: &[(&str, &str)]) -> Answer {
    let mut all: Vec<(&str, &str)> = vec![("Version", "2016-11-15")];
    all.extend_from_slice(params);
    let encoded = all
        .iter()
        .map(|(k, v)| format!("{}={}", uri_encode(k), uri_encode(v)))
        .collect::<Vec<_>>()
        .join("&");
    let (method, query, body) =
        if signer.get { ("GET", encoded, String::new()) } else { ("POST", String::new(), encoded) };
    let host = emu.addr().to_string();
    let now = unix_now() as i64 + signer.skew;
    let amz_date = format_amz_date(now as u64);
    let mut headers: Vec<(String, String)> =
        vec![("host".into(), host.clone()), ("x-amz-date".into(), amz_date.clone())];
    if !signer.get {
        headers.push((
            "content-type".into(),
            "application/x-www-form-urlencoded; charset=utf-8".into(),
        ));
    }
    if let Some(t) = &signer.token {
        headers.push(("x-amz-security-token".into(), t.clone()));
    }
    let names: Vec<String> = headers.iter().map(|(k, _)| k.clone()).collect();
    let sig = signature(
        &SignedRequest {
            method,
            path: "/",
            query: &query,
            headers: headers.clone(),
            body: body.as_bytes(),
        },
        &names,
        &signer.secret,
        &amz_date,
        &signer.region,
        "ec2",
    );
    let mut sorted = names.clone();
    sorted.sort();
    let mut auth = format!(
        "AWS4-HMAC-SHA256 Credential={}/{}/{}/ec2/aws4_request, SignedHeaders={}",
        signer.access_key,
        &amz_date[..8],
        signer.region,
        sorted.join(";")
    );
    if !signer.drop_signature {
        auth.push_str(&format!(", Signature={sig}"));
    }
    if !signer.unsigned {
        headers.push(("authorization".into(), auth));
    }
    let body =
        if signer.tamper { body.replace("Version=2016-11-15", "Version=2016-11-16") } else { body };
    let uri = if query.is_empty() { "/".to_string() } else { format!("/?{query}") };
    send(emu.addr(), method, &uri, &headers, body).await
}

async fn send(
    addr: SocketAddr,
    method: &str,
    uri: &str,
    headers: &[(String, String)],
    body: String,
) -> Answer {
    let stream = tokio::net::TcpStream::connect(addr).await.unwrap();
    let (mut sender, conn) =
        hyper::client::conn::http1::handshake(TokioIo::new(stream)).await.unwrap();
    tokio::spawn(conn);
    let mut req = hyper::Request::builder().method(method).uri(uri);
    for (k, v) in headers {
        req = req.header(k.as_str(), v.as_str());
    }
    let resp = sender.send_request(req.body(Full::new(Bytes::from(body))).unwrap()).await.unwrap();
    let status = resp.status().as_u16();
    let bytes = resp.into_body().collect().await.unwrap().to_bytes();
    Answer { status, body: String::from_utf8_lossy(&bytes).into_owned() }
}

async fn control(emu: &Ec2Emulator, method: &str, path: &str, body: serde_json::Value) -> Answer {
    let headers = vec![("content-type".to_string(), "application/json".to_string())];
    let body = if body.is_null() { String::new() } else { body.to_string() };
    send(emu.addr(), method, path, &headers, body).await
}

fn us() -> Signer {
    Signer::new("us-east-1")
}

/// RunInstances of one t3.micro with the given extra parameters; returns the instance id.
async fn run(emu: &Ec2Emulator, signer: &Signer, extra: &[(&str, &str)]) -> String {
    let mut params = vec![
        ("Action", "RunInstances"),
        ("ImageId", AMI),
        ("InstanceType", "t3.micro"),
        ("MinCount", "1"),
        ("MaxCount", "1"),
    ];
    params.extend_from_slice(extra);
    let a = call(emu, signer, &params).await;
    a.ok();
    a.first("instanceId").unwrap()
}

async fn describe(emu: &Ec2Emulator, id: &str) -> Answer {
    call(emu, &us(), &[("Action", "DescribeInstances"), ("InstanceId.1", id)]).await
}

async fn state_of(emu: &Ec2Emulator, id: &str) -> String {
    let a = describe(emu, id).await;
    a.ok();
    a.first("name").unwrap()
}

#[tokio::test]
async fn sigv4_accepts_and_rejects_like_ec2() {
    let emu = Ec2Emulator::start(Ec2Config::default().with_session_credential(
        "ASIAEXAMPLESESSION",
        "sessionsecret",
        "the-session-token",
    ));
    let regions = [("Action", "DescribeRegions")];
    let session = Signer {
        access_key: "ASIAEXAMPLESESSION".into(),
        secret: "sessionsecret".into(),
        token: Some("the-session-token".into()),
        ..us()
    };
    let table: Vec<(&str, Signer, u16, &str)> = vec![
        ("valid", us(), 200, ""),
        ("valid, GET query string", Signer { get: true, ..us() }, 200, ""),
        ("valid, other region", Signer::new("eu-west-1"), 200, ""),
        ("wrong secret", Signer { secret: "not-the-secret".into(), ..us() }, 401, "AuthFailure"),
        (
            "unknown access key",
            Signer { access_key: "AKIAUNKNOWN".into(), ..us() },
            401,
            "AuthFailure",
        ),
        ("date 20 minutes behind", Signer { skew: -20 * 60, ..us() }, 400, "RequestExpired"),
        ("date 20 minutes ahead", Signer { skew: 20 * 60, ..us() }, 400, "RequestExpired"),
        ("date 10 minutes off is within EC2's 15", Signer { skew: -10 * 60, ..us() }, 200, ""),
        (
            "no Authorization header",
            Signer { unsigned: true, ..us() },
            403,
            "MissingAuthenticationToken",
        ),
        (
            "Authorization without Signature",
            Signer { drop_signature: true, ..us() },
            400,
            "IncompleteSignature",
        ),
        (
            "body changed after signing (payload hash)",
            Signer { tamper: true, ..us() },
            401,
            "AuthFailure",
        ),
        ("region the endpoint does not serve", Signer::new("ap-south-9"), 401, "AuthFailure"),
        ("session credentials with token", session.clone(), 200, ""),
        (
            "session credentials without token",
            Signer { token: None, ..session.clone() },
            401,
            "AuthFailure",
        ),
        (
            "session credentials with wrong token",
            Signer { token: Some("other".into()), ..session.clone() },
            401,
            "AuthFailure",
        ),
        (
            "long-term key with a token",
            Signer { token: Some("the-session-token".into()), ..us() },
            401,
            "AuthFailure",
        ),
    ];
    for (what, signer, status, code) in table {
        let a = call(&emu, &signer, &regions).await;
        assert_eq!(a.status, status, "{what}: {}", a.body);
        if status == 200 {
            a.ok();
            assert_eq!(a.all("regionName"), ["us-east-1", "eu-west-1"], "{what}");
        } else {
            assert_eq!(a.code(), code, "{what}");
        }
    }

    // Missing x-amz-date: sent by hand, since the signer always adds it.
    let headers = vec![(
        "authorization".to_string(),
        format!(
            "AWS4-HMAC-SHA256 Credential={KEY}/20240101/us-east-1/ec2/aws4_request, \
             SignedHeaders=host, Signature=00"
        ),
    )];
    let a = send(emu.addr(), "GET", "/?Action=DescribeRegions", &headers, String::new()).await;
    assert_eq!((a.status, a.code().as_str()), (400, "IncompleteSignature"));
    assert!(emu.requests().iter().all(|r| r == "DescribeRegions"));

    // The older answer to a bad signature, for plugins that must handle both.
    let legacy = Ec2Emulator::start(Ec2Config {
        signature_mismatch: SignatureMismatch::SignatureDoesNotMatch,
        ..Ec2Config::default()
    });
    let a = call(&legacy, &Signer { secret: "wrong".into(), ..us() }, &regions).await;
    assert_eq!((a.status, a.code().as_str()), (403, "SignatureDoesNotMatch"));
}

#[tokio::test]
async fn run_describe_terminate_lifecycle() {
    let emu = Ec2Emulator::start(Ec2Config::default());
    let user_data = "#cloud-config\npackages: [tinyproxy]\n";
    let b64 = BASE64.encode(user_data.as_bytes());
    let a = call(
        &emu,
        &us(),
        &[
            ("Action", "RunInstances"),
            ("ImageId", AMI),
            ("InstanceType", "t3.small"),
            ("MinCount", "1"),
            ("MaxCount", "1"),
            ("UserData", &b64),
            ("Placement.AvailabilityZone", "us-east-1b"),
            ("SubnetId", "subnet-0123456789abcdef0"),
            ("SecurityGroupId.1", "sg-0123456789abcdef0"),
            ("TagSpecification.1.ResourceType", "instance"),
            ("TagSpecification.1.Tag.1.Key", "Name"),
            ("TagSpecification.1.Tag.1.Value", "proxy-abc"),
            ("TagSpecification.1.Tag.2.Key", "egress.proxy-operator.dev/uid"),
            ("TagSpecification.1.Tag.2.Value", "uid-1"),
            ("TagSpecification.2.ResourceType", "volume"),
            ("TagSpecification.2.Tag.1.Key", "Name"),
            ("TagSpecification.2.Tag.1.Value", "proxy-abc-root"),
            ("BlockDeviceMapping.1.DeviceName", "/dev/xvda"),
            ("BlockDeviceMapping.1.Ebs.DeleteOnTermination", "true"),
            ("BlockDeviceMapping.1.Ebs.VolumeSize", "10"),
        ],
    )
    .await;
    a.ok();
    let root = a.doc();
    assert_eq!(root.root_element().tag_name().name(), "RunInstancesResponse");
    assert!(a.first("reservationId").unwrap().starts_with("r-"));
    assert_eq!(a.first("ownerId").unwrap(), "123456789012");
    let id = a.first("instanceId").unwrap();
    assert!(model::valid_id(&id, "i"), "{id}");
    assert_eq!(a.first("code").unwrap(), "0");
    assert_eq!(a.first("name").unwrap(), "pending");
    assert_eq!(a.first("ipAddress"), None, "no public IP while pending");
    assert!(a.first("privateIpAddress").unwrap().starts_with("10."));
    assert_eq!(a.first("availabilityZone").unwrap(), "us-east-1b");
    assert_eq!(a.first("subnetId").unwrap(), "subnet-0123456789abcdef0");
    assert_eq!(a.first("groupId").unwrap(), "sg-0123456789abcdef0");

    // First Describe shows pending, the next one running with the public IP.
    let d = describe(&emu, &id).await;
    d.ok();
    assert_eq!(d.first("name").unwrap(), "pending");
    assert_eq!(d.all("reservationId").len(), 1);
    let d = describe(&emu, &id).await;
    d.ok();
    assert_eq!(d.first("name").unwrap(), "running");
    assert_eq!(d.first("code").unwrap(), "16");
    assert_eq!(d.first("ipAddress").unwrap(), "127.0.0.1");
    assert_eq!(d.first("instanceType").unwrap(), "t3.small");
    assert_eq!(d.first("imageId").unwrap(), AMI);
    let launch = d.first("launchTime").unwrap();
    let t = crate::time::parse_rfc3339(&launch).unwrap();
    assert!(t.abs_diff(unix_now()) < 60, "{launch}");
    assert!(launch.ends_with(".000Z"));
    assert_eq!(d.all("key"), ["Name", "egress.proxy-operator.dev/uid"]);
    assert_eq!(d.all("value"), ["proxy-abc", "uid-1"]);
    assert_eq!(d.first("deleteOnTermination").unwrap(), "true");

    let attr = call(
        &emu,
        &us(),
        &[("Action", "DescribeInstanceAttribute"), ("InstanceId", &id), ("Attribute", "userData")],
    )
    .await;
    attr.ok();
    assert_eq!(attr.first("instanceId").unwrap(), id);
    assert_eq!(attr.first("value").unwrap(), b64);

    let vols = call(&emu, &us(), &[("Action", "DescribeVolumes")]).await;
    vols.ok();
    assert_eq!(vols.all("volumeId").len(), 2, "volume id + attachment's");
    assert_eq!(vols.first("size").unwrap(), "10");
    assert_eq!(vols.first("status").unwrap(), "in-use");
    assert_eq!(vols.first("instanceId").unwrap(), id);
    assert_eq!(vols.first("device").unwrap(), "/dev/xvda");
    assert_eq!(vols.first("deleteOnTermination").unwrap(), "true");
    assert_eq!(vols.all("value"), ["proxy-abc-root"]);

    let dump = emu.dump();
    assert_eq!(dump.instances.len(), 1);
    assert_eq!(dump.instances[0].name, "proxy-abc");
    assert_eq!(dump.instances[0].scope, "us-east-1");
    assert_eq!(dump.instances[0].user_data, user_data.as_bytes());
    assert_eq!(dump.secondary.len(), 1);
    assert_eq!(dump.secondary[0].attached_to.as_deref(), Some(id.as_str()));

    let term = call(&emu, &us(), &[("Action", "TerminateInstances"), ("InstanceId.1", &id)]).await;
    term.ok();
    assert_eq!(term.all("instanceId"), [id.as_str()]);
    assert_eq!(term.all("name"), ["shutting-down", "running"]);
    assert_eq!(term.all("code"), ["32", "16"]);

    // Still listed while shutting down, then terminated; the root volume goes with it.
    assert_eq!(emu.dump().instances.len(), 1, "shutting-down is still dumped");
    assert_eq!(emu.dump().instances[0].state, "shutting-down");
    assert_eq!(state_of(&emu, &id).await, "shutting-down");
    assert_eq!(state_of(&emu, &id).await, "terminated");
    let d = describe(&emu, &id).await;
    assert_eq!(d.first("ipAddress"), None);
    assert!(d.first("reason").unwrap_or_default().starts_with("User initiated ("));
    assert!(emu.dump().instances.is_empty(), "terminated is not dumped");
    assert!(emu.dump().secondary.is_empty());

    // Terminating again is idempotent.
    let again = call(&emu, &us(), &[("Action", "TerminateInstances"), ("InstanceId.1", &id)]).await;
    again.ok();
    assert_eq!(again.all("name"), ["terminated", "terminated"]);
    assert_eq!(
        emu.requests(),
        [
            "RunInstances",
            "DescribeInstances",
            "DescribeInstances",
            "DescribeInstanceAttribute",
            "DescribeVolumes",
            "TerminateInstances",
            "DescribeInstances",
            "DescribeInstances",
            "DescribeInstances",
            "TerminateInstances"
        ]
    );
}

#[tokio::test]
async fn terminated_instances_disappear_after_a_while() {
    let emu = Ec2Emulator::start(Ec2Config {
        terminated_visible_for: Duration::from_millis(200),
        ..Ec2Config::default()
    });
    let id = run(&emu, &us(), &[]).await;
    call(&emu, &us(), &[("Action", "TerminateInstances"), ("InstanceId.1", &id)]).await.ok();
    assert_eq!(state_of(&emu, &id).await, "shutting-down");
    assert_eq!(state_of(&emu, &id).await, "terminated");
    tokio::time::sleep(Duration::from_millis(300)).await;
    let d = describe(&emu, &id).await;
    assert_eq!((d.status, d.code().as_str()), (400, "InvalidInstanceID.NotFound"));
    assert_eq!(d.first("Message").unwrap(), format!("The instance ID '{id}' does not exist"));
}

#[tokio::test]
async fn time_based_schedule() {
    let emu = Ec2Emulator::start(Ec2Config {
        launch: Transition::After(Duration::from_millis(150)),
        ..Ec2Config::default()
    });
    let id = run(&emu, &us(), &[]).await;
    for _ in 0..3 {
        assert_eq!(state_of(&emu, &id).await, "pending");
    }
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(state_of(&emu, &id).await, "running");
}

#[tokio::test]
async fn client_token_idempotency() {
    let emu = Ec2Emulator::start(Ec2Config::default());
    let token = [("ClientToken", "proxy-abcdefghijklmnop")];
    let first = run(&emu, &us(), &token).await;
    let second = run(&emu, &us(), &token).await;
    assert_eq!(first, second);
    assert_eq!(emu.dump().instances.len(), 1);
    assert_eq!(emu.dump().secondary.len(), 1);

    // The retry answers with the same reservation, and the token shows in Describe.
    let d = describe(&emu, &first).await;
    assert_eq!(d.first("clientToken").unwrap(), "proxy-abcdefghijklmnop");
    let by_token = call(
        &emu,
        &us(),
        &[
            ("Action", "DescribeInstances"),
            ("Filter.1.Name", "client-token"),
            ("Filter.1.Value.1", "proxy-abcdefghijklmnop"),
        ],
    )
    .await;
    assert_eq!(by_token.all("instanceId"), [first.as_str()]);

    // A different AZ is allowed; a different parameter is not.
    let az = run(
        &emu,
        &us(),
        &[("ClientToken", "proxy-abcdefghijklmnop"), ("Placement.AvailabilityZone", "us-east-1c")],
    )
    .await;
    assert_eq!(az, first);
    let a = call(
        &emu,
        &us(),
        &[
            ("Action", "RunInstances"),
            ("ImageId", AMI),
            ("InstanceType", "t3.medium"),
            ("MinCount", "1"),
            ("MaxCount", "1"),
            ("ClientToken", "proxy-abcdefghijklmnop"),
        ],
    )
    .await;
    assert_eq!((a.status, a.code().as_str()), (400, "IdempotentParameterMismatch"));

    // Tokens are per region: the same call in another region launches there.
    let eu = call(
        &emu,
        &Signer::new("eu-west-1"),
        &[
            ("Action", "RunInstances"),
            ("ImageId", EU_AMI),
            ("InstanceType", "t3.micro"),
            ("MinCount", "1"),
            ("MaxCount", "1"),
            ("ClientToken", "proxy-abcdefghijklmnop"),
        ],
    )
    .await;
    eu.ok();
    assert_ne!(eu.first("instanceId").unwrap(), first);

    // After termination the token still answers with the original launch.
    call(&emu, &us(), &[("Action", "TerminateInstances"), ("InstanceId.1", &first)]).await.ok();
    let a = call(
        &emu,
        &us(),
        &[
            ("Action", "RunInstances"),
            ("ImageId", AMI),
            ("InstanceType", "t3.micro"),
            ("MinCount", "1"),
            ("MaxCount", "1"),
            ("ClientToken", "proxy-abcdefghijklmnop"),
        ],
    )
    .await;
    a.ok();
    assert_eq!(a.first("instanceId").unwrap(), first);
    assert_eq!(a.first("name").unwrap(), "shutting-down");
    assert_eq!(emu.dump().instances.len(), 2, "one in each region");
}

#[tokio::test]
async fn filters_and_pagination() {
    let emu = Ec2Emulator::start(Ec2Config::default());
    let mut managed = Vec::new();
    for n in 0..6 {
        let zone = if n % 2 == 0 { "us-east-1a" } else { "us-east-1b" };
        let name = format!("proxy-{n}");
        let id = run(
            &emu,
            &us(),
            &[
                ("Placement.AvailabilityZone", zone),
                ("TagSpecification.1.ResourceType", "instance"),
                ("TagSpecification.1.Tag.1.Key", "egress.proxy-operator.dev/managed"),
                ("TagSpecification.1.Tag.1.Value", "true"),
                ("TagSpecification.1.Tag.2.Key", "Name"),
                ("TagSpecification.1.Tag.2.Value", &name),
            ],
        )
        .await;
        managed.push(id);
    }
    let other = run(
        &emu,
        &us(),
        &[
            ("TagSpecification.1.ResourceType", "instance"),
            ("TagSpecification.1.Tag.1.Key", "team"),
            ("TagSpecification.1.Tag.1.Value", "web"),
        ],
    )
    .await;
    // One in another region, never listed from us-east-1.
    call(
        &emu,
        &Signer::new("eu-west-1"),
        &[
            ("Action", "RunInstances"),
            ("ImageId", EU_AMI),
            ("InstanceType", "t3.micro"),
            ("MinCount", "1"),
            ("MaxCount", "1"),
            ("TagSpecification.1.ResourceType", "instance"),
            ("TagSpecification.1.Tag.1.Key", "egress.proxy-operator.dev/managed"),
            ("TagSpecification.1.Tag.1.Value", "true"),
        ],
    )
    .await
    .ok();

    let list = |filters: Vec<(&'static str, String)>| {
        let emu = &emu;
        async move {
            let mut params: Vec<(&str, &str)> = vec![("Action", "DescribeInstances")];
            params.extend(filters.iter().map(|(k, v)| (*k, v.as_str())));
            let a = call(emu, &us(), &params).await;
            a.ok();
            let mut ids = a.all("instanceId");
            ids.sort();
            ids
        }
    };
    let sorted = |mut v: Vec<String>| {
        v.sort();
        v
    };
    let mut all = managed.clone();
    all.push(other.clone());
    assert_eq!(list(vec![]).await, sorted(all));
    assert_eq!(
        list(vec![
            ("Filter.1.Name", "tag:egress.proxy-operator.dev/managed".into()),
            ("Filter.1.Value.1", "true".into()),
        ])
        .await,
        sorted(managed.clone())
    );
    assert_eq!(
        list(vec![("Filter.1.Name", "tag-key".into()), ("Filter.1.Value.1", "team".into()),]).await,
        [other.as_str()]
    );
    assert_eq!(
        list(vec![
            ("Filter.1.Name", "tag:Name".into()),
            ("Filter.1.Value.1", "proxy-1".into()),
            ("Filter.1.Value.2", "proxy-2".into()),
        ])
        .await,
        sorted(vec![managed[1].clone(), managed[2].clone()])
    );
    assert_eq!(
        list(vec![
            ("Filter.1.Name", "tag:Name".into()),
            ("Filter.1.Value.1", "proxy-*".into()),
            ("Filter.2.Name", "availability-zone".into()),
            ("Filter.2.Value.1", "us-east-1b".into()),
        ])
        .await,
        sorted(vec![managed[1].clone(), managed[3].clone(), managed[5].clone()])
    );
    // Everything is pending until described once; describe-all moved them all to running.
    assert_eq!(
        list(vec![
            ("Filter.1.Name", "instance-state-name".into()),
            ("Filter.1.Value.1", "pending".into()),
        ])
        .await,
        Vec::<String>::new()
    );
    call(&emu, &us(), &[("Action", "TerminateInstances"), ("InstanceId.1", &other)]).await.ok();
    assert_eq!(
        list(vec![
            ("Filter.1.Name", "instance-state-name".into()),
            ("Filter.1.Value.1", "running".into()),
        ])
        .await,
        sorted(managed.clone())
    );

    // Pagination: 7 instances in pages of 5.
    let page = call(&emu, &us(), &[("Action", "DescribeInstances"), ("MaxResults", "5")]).await;
    page.ok();
    let mut seen = page.all("instanceId");
    assert_eq!(seen.len(), 5);
    let token = page.first("nextToken").unwrap();
    let page2 = call(
        &emu,
        &us(),
        &[("Action", "DescribeInstances"), ("MaxResults", "5"), ("NextToken", &token)],
    )
    .await;
    page2.ok();
    assert_eq!(page2.first("nextToken"), None);
    seen.extend(page2.all("instanceId"));
    let mut everything = managed.clone();
    everything.push(other.clone());
    assert_eq!(sorted(seen), sorted(everything));

    for (params, status, code) in [
        (vec![("MaxResults", "4")], 400, "InvalidParameterValue"),
        (
            vec![("MaxResults", "5"), ("InstanceId.1", managed[0].as_str())],
            400,
            "InvalidParameterCombination",
        ),
        (vec![("NextToken", "bm9wZQ")], 400, "InvalidPaginationToken"),
        (
            vec![("Filter.1.Name", "no-such-filter"), ("Filter.1.Value.1", "x")],
            400,
            "InvalidParameterValue",
        ),
    ] {
        let mut p = vec![("Action", "DescribeInstances")];
        p.extend(params);
        let a = call(&emu, &us(), &p).await;
        assert_eq!((a.status, a.code().as_str()), (status, code), "{p:?}");
    }
    // A token from one region is refused in another.
    let eu = call(
        &emu,
        &Signer::new("eu-west-1"),
        &[("Action", "DescribeInstances"), ("NextToken", &token)],
    )
    .await;
    assert_eq!(eu.code(), "InvalidPaginationToken");

    // DescribeVolumes filters on the attachment.
    let vols = call(
        &emu,
        &us(),
        &[
            ("Action", "DescribeVolumes"),
            ("Filter.1.Name", "attachment.instance-id"),
            ("Filter.1.Value.1", &managed[0]),
        ],
    )
    .await;
    vols.ok();
    assert_eq!(vols.first("instanceId").unwrap(), managed[0]);
    let vols = call(&emu, &us(), &[("Action", "DescribeVolumes"), ("MaxResults", "5")]).await;
    vols.ok();
    assert!(vols.first("nextToken").is_some());
}

#[tokio::test]
async fn error_codes() {
    let emu = Ec2Emulator::start(Ec2Config { instance_limit: Some(2), ..Ec2Config::default() });
    let launch =
        |image: &'static str, itype: &'static str, extra: Vec<(&'static str, &'static str)>| {
            let emu = &emu;
            async move {
                let mut p = vec![
                    ("Action", "RunInstances"),
                    ("ImageId", image),
                    ("InstanceType", itype),
                    ("MinCount", "1"),
                    ("MaxCount", "1"),
                ];
                p.extend(extra);
                call(emu, &us(), &p).await
            }
        };
    let cases: Vec<(Answer, u16, &str, &str)> = vec![
        (
            launch("ami-0123456789abcdef9", "t3.micro", vec![]).await,
            400,
            "InvalidAMIID.NotFound",
            "The image id '[ami-0123456789abcdef9]' does not exist",
        ),
        (
            launch(EU_AMI, "t3.micro", vec![]).await,
            400,
            "InvalidAMIID.NotFound",
            "The image id '[ami-0fedcba9876543210]' does not exist",
        ),
        (
            launch("ubuntu-22.04", "t3.micro", vec![]).await,
            400,
            "InvalidAMIID.Malformed",
            "Invalid id: \"ubuntu-22.04\" (expecting \"ami-...\")",
        ),
        (
            launch(AMI, "t3.gigantic", vec![]).await,
            400,
            "InvalidParameterValue",
            "Invalid value 't3.gigantic' for InstanceType.",
        ),
        (
            launch(AMI, "t3.micro", vec![("Placement.AvailabilityZone", "us-east-1z")]).await,
            400,
            "InvalidParameterValue",
            "Invalid availability zone: [us-east-1z]",
        ),
        (
            launch(AMI, "t3.micro", vec![("UserData", "not base64!")]).await,
            400,
            "InvalidParameterValue",
            "Invalid BASE64 encoding of user data.",
        ),
        (
            launch(AMI, "t3.micro", vec![("DryRun", "true")]).await,
            412,
            "DryRunOperation",
            "Request would have succeeded, but DryRun flag is set.",
        ),
        (
            describe(&emu, "i-0123456789abcdef0").await,
            400,
            "InvalidInstanceID.NotFound",
            "The instance ID 'i-0123456789abcdef0' does not exist",
        ),
        (
            call(
                &emu,
                &us(),
                &[
                    ("Action", "DescribeInstances"),
                    ("InstanceId.1", "i-0123456789abcdef0"),
                    ("InstanceId.2", "i-0123456789abcdef1"),
                ],
            )
            .await,
            400,
            "InvalidInstanceID.NotFound",
            "The instance IDs 'i-0123456789abcdef0, i-0123456789abcdef1' do not exist",
        ),
        (
            describe(&emu, "proxy-abc").await,
            400,
            "InvalidInstanceID.Malformed",
            "Invalid id: \"proxy-abc\"",
        ),
        (
            call(
                &emu,
                &us(),
                &[("Action", "TerminateInstances"), ("InstanceId.1", "i-0123456789abcdef0")],
            )
            .await,
            400,
            "InvalidInstanceID.NotFound",
            "The instance ID 'i-0123456789abcdef0' does not exist",
        ),
        (
            call(&emu, &us(), &[("Action", "RebootEverything")]).await,
            400,
            "InvalidAction",
            "The action RebootEverything is not valid for this web service.",
        ),
        (
            call(&emu, &us(), &[]).await,
            400,
            "MissingAction",
            "The request must contain the parameter Action",
        ),
        (
            call(&emu, &us(), &[("Action", "RunInstances"), ("MinCount", "1")]).await,
            400,
            "MissingParameter",
            "The request must contain the parameter ImageId",
        ),
    ];
    for (a, status, code, message) in cases {
        assert_eq!(a.status, status, "{}", a.body);
        assert_eq!(a.code(), code);
        assert_eq!(a.first("Message").unwrap(), message);
    }

    // The configured instance limit: two fit, the third does not; MaxCount is trimmed to
    // what fits when MinCount still does.
    let a = launch(AMI, "t3.micro", vec![]).await;
    a.ok();
    let b = call(
        &emu,
        &us(),
        &[
            ("Action", "RunInstances"),
            ("ImageId", AMI),
            ("InstanceType", "t3.micro"),
            ("MinCount", "1"),
            ("MaxCount", "5"),
        ],
    )
    .await;
    b.ok();
    assert_eq!(b.all("instanceId").len(), 1);
    let c = launch(AMI, "t3.micro", vec![]).await;
    assert_eq!((c.status, c.code().as_str()), (400, "InstanceLimitExceeded"));
    assert!(emu.dump().instances.len() == 2);
}

#[tokio::test]
async fn every_fault_kind() {
    let emu = Ec2Emulator::start(Ec2Config::default());
    let id = run(&emu, &us(), &[]).await;
    let list = [("Action", "DescribeInstances")];

    emu.inject(Fault { op: FaultOp::Any, kind: FaultKind::ServerError, count: 2 });
    let a = call(&emu, &us(), &list).await;
    assert_eq!((a.status, a.code().as_str()), (500, "InternalError"));
    let a = call(&emu, &us(), &list).await;
    assert_eq!((a.status, a.code().as_str()), (503, "Unavailable"));
    call(&emu, &us(), &list).await.ok();

    // Aimed at create only: reads still answer.
    emu.inject(Fault { op: FaultOp::Create, kind: FaultKind::Quota, count: 1 });
    describe(&emu, &id).await.ok();
    let a = call(
        &emu,
        &us(),
        &[
            ("Action", "RunInstances"),
            ("ImageId", AMI),
            ("InstanceType", "t3.micro"),
            ("MinCount", "1"),
            ("MaxCount", "1"),
        ],
    )
    .await;
    assert_eq!((a.status, a.code().as_str()), (400, "InstanceLimitExceeded"));
    assert_eq!(emu.dump().instances.len(), 1);

    emu.inject(Fault { op: FaultOp::List, kind: FaultKind::RateLimit, count: 1 });
    describe(&emu, &id).await.ok();
    let a = call(&emu, &us(), &list).await;
    assert_eq!((a.status, a.code().as_str()), (503, "RequestLimitExceeded"));

    emu.inject(Fault { op: FaultOp::Get, kind: FaultKind::Auth, count: 1 });
    let a = describe(&emu, &id).await;
    assert_eq!((a.status, a.code().as_str()), (401, "AuthFailure"));

    emu.inject(Fault { op: FaultOp::Delete, kind: FaultKind::ServerError, count: 1 });
    let a = call(&emu, &us(), &[("Action", "TerminateInstances"), ("InstanceId.1", &id)]).await;
    assert_eq!(a.status, 500);
    assert_eq!(state_of(&emu, &id).await, "running", "the fault stopped it");

    emu.inject(Fault::slow(FaultOp::Get, Duration::from_millis(300), 1));
    let t = Instant::now();
    describe(&emu, &id).await.ok();
    assert!(t.elapsed() >= Duration::from_millis(300));
    let t = Instant::now();
    describe(&emu, &id).await.ok();
    assert!(t.elapsed() < Duration::from_millis(300));

    // Over HTTP, in the control surface's JSON.
    let r = control(
        &emu,
        "POST",
        "/_emulator/faults",
        json!({"op": "list", "kind": "rate-limit", "count": 1}),
    )
    .await;
    assert_eq!(r.status, 204, "{}", r.body);
    assert_eq!(call(&emu, &us(), &list).await.status, 503);
    call(&emu, &us(), &list).await.ok();
}

#[tokio::test]
async fn delete_on_termination_default_leaks_the_root_volume() {
    let emu = Ec2Emulator::start(Ec2Config {
        shutdown: Transition::AfterDescribes(0),
        ..Ec2Config::default()
    });
    // No BlockDeviceMapping: DeleteOnTermination is false here.
    let leaky = run(&emu, &us(), &[]).await;
    // An extra data volume marked for deletion goes; a root one left default stays.
    let tidy = run(
        &emu,
        &us(),
        &[
            ("BlockDeviceMapping.1.DeviceName", "/dev/xvda"),
            ("BlockDeviceMapping.1.Ebs.DeleteOnTermination", "true"),
            ("BlockDeviceMapping.2.DeviceName", "/dev/sdf"),
            ("BlockDeviceMapping.2.Ebs.DeleteOnTermination", "true"),
        ],
    )
    .await;
    assert_eq!(emu.dump().secondary.len(), 3);
    let d = describe(&emu, &leaky).await;
    assert_eq!(d.first("deleteOnTermination").unwrap(), "false");
    for id in [&leaky, &tidy] {
        call(&emu, &us(), &[("Action", "TerminateInstances"), ("InstanceId.1", id)]).await.ok();
        // AfterDescribes(0): terminated from the next call on.
        assert_eq!(state_of(&emu, id).await, "terminated");
    }
    let dump = emu.dump();
    assert!(dump.instances.is_empty());
    assert_eq!(dump.secondary.len(), 1, "{dump:?}");
    assert_eq!(dump.secondary[0].kind, "volume");
    assert_eq!(dump.secondary[0].attached_to, None);
    let vols = call(&emu, &us(), &[("Action", "DescribeVolumes")]).await;
    vols.ok();
    assert_eq!(vols.first("status").unwrap(), "available");
    assert_eq!(vols.all("instanceId"), Vec::<String>::new());
    let avail = call(
        &emu,
        &us(),
        &[
            ("Action", "DescribeVolumes"),
            ("Filter.1.Name", "status"),
            ("Filter.1.Value.1", "available"),
        ],
    )
    .await;
    assert_eq!(avail.all("volumeId"), [dump.secondary[0].id.clone()]);
}

#[tokio::test]
async fn eventual_consistency_hides_new_instances() {
    let emu = Ec2Emulator::start(Ec2Config {
        eventual_consistency: Duration::from_millis(300),
        ..Ec2Config::default()
    });
    let id = run(&emu, &us(), &[]).await;
    let a = describe(&emu, &id).await;
    assert_eq!((a.status, a.code().as_str()), (400, "InvalidInstanceID.NotFound"));
    let all = call(&emu, &us(), &[("Action", "DescribeInstances")]).await;
    all.ok();
    assert!(all.all("instanceId").is_empty());
    let t = call(&emu, &us(), &[("Action", "TerminateInstances"), ("InstanceId.1", &id)]).await;
    assert_eq!(t.code(), "InvalidInstanceID.NotFound");
    assert_eq!(emu.dump().instances.len(), 1, "it exists all the same");
    tokio::time::sleep(Duration::from_millis(350)).await;
    assert_eq!(state_of(&emu, &id).await, "pending");
}

#[tokio::test]
async fn fail_scope_fails_one_region() {
    let emu = Ec2Emulator::start(Ec2Config::default());
    let list = [("Action", "DescribeInstances")];
    emu.fail_scope("us-east-1", true);
    let a = call(&emu, &us(), &list).await;
    assert_eq!((a.status, a.code().as_str()), (503, "Unavailable"));
    call(&emu, &Signer::new("eu-west-1"), &list).await.ok();
    emu.fail_scope("us-east-1", false);
    call(&emu, &us(), &list).await.ok();

    let r = control(&emu, "POST", "/_emulator/scope", json!({"scope": "eu-west-1", "fail": true}))
        .await;
    assert_eq!(r.status, 204);
    assert_eq!(call(&emu, &Signer::new("eu-west-1"), &list).await.status, 503);
    call(&emu, &us(), &list).await.ok();
}

#[tokio::test]
async fn control_surface_states_locks_and_slow_deletes() {
    let emu = Ec2Emulator::start(Ec2Config::default());
    let id = run(&emu, &us(), &[]).await;

    emu.hold_provisioning(&id, true);
    for _ in 0..3 {
        assert_eq!(state_of(&emu, &id).await, "pending");
    }
    emu.hold_provisioning(&id, false);
    assert_eq!(state_of(&emu, &id).await, "pending");
    assert_eq!(state_of(&emu, &id).await, "running");

    // A state EC2 does not document: code 112, no public IP, kept until terminated.
    emu.set_backend_state(&id, "hibernating-weirdly");
    let d = describe(&emu, &id).await;
    assert_eq!(d.first("name").unwrap(), "hibernating-weirdly");
    assert_eq!(d.first("code").unwrap(), "112");
    assert_eq!(d.first("ipAddress"), None);
    emu.set_backend_state(&id, "stopped");
    assert_eq!(state_of(&emu, &id).await, "stopped");
    assert_eq!(state_of(&emu, &id).await, "stopped");
    emu.set_backend_state(&id, "running");
    assert_eq!(describe(&emu, &id).await.first("ipAddress").unwrap(), "127.0.0.1");

    // Locked: the state is frozen and TerminateInstances is refused.
    emu.set_locked(&id, true);
    let t = call(&emu, &us(), &[("Action", "TerminateInstances"), ("InstanceId.1", &id)]).await;
    assert_eq!((t.status, t.code().as_str()), (400, "IncorrectInstanceState"));
    assert_eq!(state_of(&emu, &id).await, "running");
    emu.set_locked(&id, false);

    // Slow delete: shutting-down until finished, however often it is described.
    emu.start_slow_delete(&id);
    for _ in 0..3 {
        assert_eq!(state_of(&emu, &id).await, "shutting-down");
    }
    let t = call(&emu, &us(), &[("Action", "TerminateInstances"), ("InstanceId.1", &id)]).await;
    assert_eq!(t.all("name"), ["shutting-down", "shutting-down"]);
    assert_eq!(emu.dump().instances[0].state, "shutting-down");
    emu.finish_deletes();
    assert_eq!(state_of(&emu, &id).await, "terminated");
    assert!(emu.dump().instances.is_empty());
}

#[tokio::test]
async fn plant_dump_and_reset() {
    let emu = Ec2Emulator::start(Ec2Config::default());
    let orphan = emu.plant(Plant {
        name: "proxy-orphan".into(),
        scope: "eu-west-1".into(),
        managed: true,
        uid: Some(String::new()),
        installation: Some("install-a".into()),
        created_at: Some(1_600_000_000),
    });
    let unmarked = emu.plant(Plant { name: "someone-else".into(), ..Plant::default() });
    let listed = call(
        &emu,
        &Signer::new("eu-west-1"),
        &[
            ("Action", "DescribeInstances"),
            ("Filter.1.Name", "tag:egress.proxy-operator.dev/managed"),
            ("Filter.1.Value.1", "true"),
            ("Filter.2.Name", "tag:egress.proxy-operator.dev/installation"),
            ("Filter.2.Value.1", "install-a"),
        ],
    )
    .await;
    listed.ok();
    assert_eq!(listed.all("instanceId"), [orphan.as_str()]);
    assert_eq!(listed.first("launchTime").unwrap(), "2020-09-13T12:26:40.000Z");
    assert_eq!(listed.first("name").unwrap(), "running");
    assert_eq!(listed.first("ipAddress").unwrap(), "127.0.0.1");
    let uid = listed
        .doc()
        .descendants()
        .filter(|n| n.has_tag_name("item"))
        .find(|n| {
            n.children()
                .any(|c| c.has_tag_name("key") && c.text() == Some("egress.proxy-operator.dev/uid"))
        })
        .map(|n| {
            n.children()
                .find(|c| c.has_tag_name("value"))
                .and_then(|c| c.text())
                .unwrap_or("")
                .to_string()
        });
    assert_eq!(uid.as_deref(), Some(""), "empty uid mark is kept");

    let dump = emu.dump();
    assert_eq!(dump.instances.len(), 2);
    let u = dump.instances.iter().find(|i| i.id == unmarked).unwrap();
    assert_eq!(u.scope, "us-east-1", "empty scope is the first region");
    assert_eq!(u.labels, [("Name".to_string(), "someone-else".to_string())]);

    // The same over HTTP.
    let r = control(&emu, "GET", "/_emulator/dump", serde_json::Value::Null).await;
    let d: Dump = serde_json::from_str(&r.body).unwrap();
    assert_eq!(d, dump);
    let r = control(
        &emu,
        "POST",
        "/_emulator/plant",
        json!({"name": "p", "managed": true, "uid": "u1"}),
    )
    .await;
    let planted: serde_json::Value = serde_json::from_str(&r.body).unwrap();
    let pid = planted["id"].as_str().unwrap().to_string();
    assert!(model::valid_id(&pid, "i"));
    for (path, body) in [
        ("/_emulator/hold", json!({"id": pid, "hold": true})),
        ("/_emulator/lock", json!({"id": pid, "locked": true})),
        ("/_emulator/lock", json!({"id": pid, "locked": false})),
        ("/_emulator/state", json!({"id": pid, "state": "stopping"})),
        ("/_emulator/deleting", json!({"id": pid})),
    ] {
        assert_eq!(control(&emu, "POST", path, body).await.status, 204, "{path}");
    }
    assert_eq!(
        control(&emu, "POST", "/_emulator/lock", json!({"id": "i-0", "locked": true})).await.status,
        404
    );
    assert_eq!(control(&emu, "POST", "/_emulator/hold", json!({"nope": 1})).await.status, 400);
    assert_eq!(
        control(&emu, "POST", "/_emulator/finish-deletes", serde_json::Value::Null).await.status,
        204
    );
    assert_eq!(emu.dump().instances.len(), 2);
    let r = control(&emu, "GET", "/_emulator/requests", serde_json::Value::Null).await;
    assert_eq!(r.body, "[\"DescribeInstances\"]");

    assert_eq!(
        control(&emu, "POST", "/_emulator/reset", serde_json::Value::Null).await.status,
        204
    );
    assert_eq!(emu.dump(), Dump::default());
    assert!(emu.requests().is_empty());
    emu.plant(Plant::default());
    emu.reset();
    assert_eq!(emu.dump(), Dump::default());
}

#[tokio::test]
async fn zones_regions_and_attributes() {
    let emu = Ec2Emulator::start(Ec2Config::default());
    let z = call(&emu, &us(), &[("Action", "DescribeAvailabilityZones")]).await;
    z.ok();
    assert_eq!(z.all("zoneName"), ["us-east-1a", "us-east-1b", "us-east-1c"]);
    assert_eq!(z.first("zoneId").unwrap(), "use1-az1");
    assert_eq!(z.first("zoneState").unwrap(), "available");
    let z = call(
        &emu,
        &Signer::new("eu-west-1"),
        &[("Action", "DescribeAvailabilityZones"), ("ZoneName.1", "eu-west-1b")],
    )
    .await;
    assert_eq!(z.all("zoneName"), ["eu-west-1b"]);
    let r = call(
        &emu,
        &us(),
        &[
            ("Action", "DescribeRegions"),
            ("Filter.1.Name", "region-name"),
            ("Filter.1.Value.1", "eu-*"),
        ],
    )
    .await;
    r.ok();
    assert_eq!(r.all("regionName"), ["eu-west-1"]);
    assert_eq!(r.first("regionEndpoint").unwrap(), "ec2.eu-west-1.amazonaws.com");

    let id = run(&emu, &us(), &[]).await;
    let a = call(
        &emu,
        &us(),
        &[("Action", "DescribeInstanceAttribute"), ("InstanceId", &id), ("Attribute", "userData")],
    )
    .await;
    a.ok();
    assert!(a.doc().descendants().any(|n| n.has_tag_name("userData")));
    assert_eq!(a.first("value"), None, "no user data: empty element");
    let a = call(
        &emu,
        &us(),
        &[
            ("Action", "DescribeInstanceAttribute"),
            ("InstanceId", &id),
            ("Attribute", "instanceType"),
        ],
    )
    .await;
    assert_eq!(a.first("value").unwrap(), "t3.micro");
    let a = call(
        &emu,
        &us(),
        &[("Action", "DescribeInstanceAttribute"), ("InstanceId", &id), ("Attribute", "colour")],
    )
    .await;
    assert_eq!(a.code(), "InvalidParameterValue");
}

#[test]
fn drop_stops_the_server() {
    let emu = Ec2Emulator::start(Ec2Config::default());
    let addr = emu.addr();
    assert!(emu.url().starts_with("http://127.0.0.1:"));
    assert_eq!(Emulator::allow_entry(&emu), emu.url());
    drop(emu);
    assert!(std::net::TcpStream::connect(addr).is_err());
}

/// Real-proxy mode: the instance's user data names the port, running starts the proxy at
/// 127.0.0.1, TerminateInstances stops it; a second instance stops when the emulator drops.
#[tokio::test(flavor = "multi_thread")]
async fn real_proxy_mode_runs_a_proxy_per_running_instance() {
    use crate::real_proxy::tests::{closed, echo_server, free_port, get_through_tunnel};
    use crate::real_proxy::{ProxyKind, RealProxies};
    let echo = echo_server().await;
    let proxies = RealProxies::new(ProxyKind::Builtin);
    let emu = Ec2Emulator::start(Ec2Config {
        public_ip: "198.51.100.7".into(),
        real_proxies: Some(proxies.clone()),
        ..Ec2Config::default()
    });
    let (p1, p2) = (free_port(), free_port());
    let user_data = |port: u16| {
        BASE64.encode(
            format!("#cloud-config\nwrite_files:\n  - content: |\n      Port {port}\n").as_bytes(),
        )
    };
    let (ud1, ud2) = (user_data(p1), user_data(p2));
    let i1 = run(&emu, &us(), &[("UserData", &ud1)]).await;
    let i2 = run(&emu, &us(), &[("UserData", &ud2)]).await;
    assert!(closed(p1), "no proxy while pending");
    assert_eq!(state_of(&emu, &i1).await, "pending");
    assert_eq!(state_of(&emu, &i1).await, "running");
    let a = describe(&emu, &i1).await;
    assert_eq!(a.first("ipAddress").as_deref(), Some("127.0.0.1"), "{}", a.body);
    let body = get_through_tunnel(p1, echo).await;
    assert!(body.starts_with("hello from 127.0.0.1"), "{body}");
    assert_eq!(state_of(&emu, &i2).await, "pending");
    assert_eq!(state_of(&emu, &i2).await, "running");
    assert_eq!(proxies.port_of(&i2), Some(p2));

    call(&emu, &us(), &[("Action", "TerminateInstances"), ("InstanceId.1", &i1)]).await.ok();
    assert!(closed(p1), "TerminateInstances stops the proxy");
    assert!(!closed(p2), "the other instance keeps its proxy");
    drop(emu);
    assert!(closed(p2), "dropping the emulator stops its proxies");
    assert!(proxies.listening().is_empty());
}

/// Off by default; with a limit, one bucket per action and region, and a call past it
/// answers EC2's 503 `RequestLimitExceeded` XML error and does nothing.
#[tokio::test]
async fn rate_limit_answers_like_ec2() {
    let emu = Ec2Emulator::start(Ec2Config::default());
    let list = [("Action", "DescribeInstances")];
    for _ in 0..10 {
        call(&emu, &us(), &list).await.ok();
    }
    let a =
        control(&emu, "POST", "/_emulator/rate-limit", json!({"per_hour": 3600, "burst": 2})).await;
    assert_eq!(a.status, 204);
    call(&emu, &us(), &list).await.ok();
    call(&emu, &us(), &list).await.ok();
    let a = call(&emu, &us(), &list).await;
    assert_eq!((a.status, a.code().as_str()), (503, "RequestLimitExceeded"));
    assert_eq!(a.first("Message").as_deref(), Some("Request limit exceeded."));
    // Another action, another region: their own buckets.
    let id = run(&emu, &us(), &[]).await;
    call(&emu, &Signer::new("eu-west-1"), &list).await.ok();
    // A throttled RunInstances launches nothing.
    run(&emu, &us(), &[]).await;
    let a = call(
        &emu,
        &us(),
        &[
            ("Action", "RunInstances"),
            ("ImageId", AMI),
            ("InstanceType", "t3.micro"),
            ("MinCount", "1"),
            ("MaxCount", "1"),
        ],
    )
    .await;
    assert_eq!((a.status, a.code().as_str()), (503, "RequestLimitExceeded"));
    assert_eq!(emu.dump().instances.len(), 2, "{id}");
    // Every call is counted by action and operation, the throttled ones as such.
    let stats = emu.stats();
    assert_eq!(stats.rate_limited, 2);
    assert_eq!(stats.by_call["DescribeInstances"], 14);
    assert_eq!(stats.by_op["create"], 3);
    let a = control(&emu, "GET", "/_emulator/stats", serde_json::Value::Null).await;
    assert!(a.body.contains("\"rate_limited\":2"), "{}", a.body);
    // Refills at 3600/h: one a second. A reset keeps the limit; off through the trait.
    tokio::time::sleep(Duration::from_millis(1050)).await;
    call(&emu, &us(), &list).await.ok();
    emu.reset();
    call(&emu, &us(), &list).await.ok();
    call(&emu, &us(), &list).await.ok();
    assert_eq!(call(&emu, &us(), &list).await.status, 503);
    emu.set_rate_limit(None);
    for _ in 0..5 {
        call(&emu, &us(), &list).await.ok();
    }
}

const SPOT: [(&str, &str); 3] = [
    ("InstanceMarketOptions.MarketType", "spot"),
    ("InstanceMarketOptions.SpotOptions.SpotInstanceType", "one-time"),
    ("InstanceMarketOptions.SpotOptions.InstanceInterruptionBehavior", "terminate"),
];

/// The dump's `spot` keys over HTTP, as the conformance suite reads them.
async fn spot_in_dump(emu: &Ec2Emulator) -> Vec<(String, bool)> {
    let a = control(emu, "GET", "/_emulator/dump", serde_json::Value::Null).await;
    let caps: DumpCapacities = serde_json::from_str(&a.body).unwrap();
    caps.instances.into_iter().map(|c| (c.id, c.spot)).collect()
}

#[tokio::test]
async fn spot_launches_are_described_as_spot_and_checked_like_ec2() {
    let emu = Ec2Emulator::start(Ec2Config::default());
    let spot = run(&emu, &us(), &SPOT).await;
    let on_demand = run(&emu, &us(), &[]).await;
    let a = describe(&emu, &spot).await;
    a.ok();
    assert_eq!(a.first("instanceLifecycle").as_deref(), Some("spot"));
    assert!(a.first("spotInstanceRequestId").is_some_and(|r| r.starts_with("sir-")), "{}", a.body);
    let a = describe(&emu, &on_demand).await;
    assert_eq!(a.first("instanceLifecycle"), None, "on-demand has no lifecycle: {}", a.body);
    let mut dump = spot_in_dump(&emu).await;
    dump.sort();
    let mut want = vec![(spot.clone(), true), (on_demand.clone(), false)];
    want.sort();
    assert_eq!(dump, want);
    assert_eq!(emu.spot_instances(), std::slice::from_ref(&spot));
    let filtered = call(
        &emu,
        &us(),
        &[
            ("Action", "DescribeInstances"),
            ("Filter.1.Name", "instance-lifecycle"),
            ("Filter.1.Value.1", "spot"),
        ],
    )
    .await;
    assert_eq!(filtered.all("instanceId"), std::slice::from_ref(&spot));

    // Defaults are one-time and terminate; what EC2 refuses names the parameter.
    run(&emu, &us(), &SPOT[..1]).await;
    // (the launch's extra parameters, EC2's error code, the parameter it names)
    type Refused<'a> = (&'a [(&'a str, &'a str)], &'a str, &'a str);
    let cases: &[Refused] = &[
        (&[("InstanceMarketOptions.MarketType", "cheap")], "InvalidParameterValue", "MarketType"),
        (
            &[("InstanceMarketOptions.MarketType", "capacity-block")],
            "Unsupported",
            "capacity-block",
        ),
        (
            &[("InstanceMarketOptions.SpotOptions.SpotInstanceType", "one-time")],
            "InvalidParameterCombination",
            "MarketType spot",
        ),
        (
            &[SPOT[0], ("InstanceMarketOptions.SpotOptions.SpotInstanceType", "forever")],
            "InvalidParameterValue",
            "SpotInstanceType",
        ),
        (
            &[SPOT[0], ("InstanceMarketOptions.SpotOptions.InstanceInterruptionBehavior", "stop")],
            "InvalidParameterCombination",
            "persistent",
        ),
        (
            &[SPOT[0], ("InstanceMarketOptions.SpotOptions.SpotInstanceType", "persistent")],
            "InvalidParameterCombination",
            "hibernate or stop",
        ),
        (
            &[SPOT[0], ("InstanceMarketOptions.SpotOptions.ValidUntil", "2030-01-01T00:00:00Z")],
            "InvalidParameterCombination",
            "ValidUntil",
        ),
        (
            &[SPOT[0], ("InstanceMarketOptions.SpotOptions.MaxPrice", "0.0005")],
            "InvalidParameterValue",
            "MaxPrice",
        ),
        (
            &[SPOT[0], ("InstanceMarketOptions.SpotOptions.MaxPrice", "0.002")],
            "SpotMaxPriceTooLow",
            "0.0035",
        ),
    ];
    for (extra, code, says) in cases {
        let mut params = vec![
            ("Action", "RunInstances"),
            ("ImageId", AMI),
            ("InstanceType", "t3.micro"),
            ("MinCount", "1"),
            ("MaxCount", "1"),
        ];
        params.extend_from_slice(extra);
        let a = call(&emu, &us(), &params).await;
        assert_eq!((a.status, a.code().as_str()), (400, *code), "{extra:?}: {}", a.body);
        assert!(a.first("Message").is_some_and(|m| m.contains(says)), "{extra:?}: {}", a.body);
    }
    assert_eq!(emu.dump().instances.len(), 3, "a refused launch makes nothing");
}

#[tokio::test]
async fn reclaim_terminates_a_spot_instance_with_the_spot_reason() {
    let emu = Ec2Emulator::start(Ec2Config::default());
    let spot = run(&emu, &us(), &SPOT).await;
    let on_demand = run(&emu, &us(), &[]).await;
    for id in [&spot, &on_demand] {
        state_of(&emu, id).await;
        assert_eq!(state_of(&emu, id).await, "running");
    }

    let a = control(&emu, "POST", "/_emulator/reclaim", json!({"id": on_demand})).await;
    assert_eq!(a.status, 409, "{}", a.body);
    assert!(a.body.contains("not a Spot Instance"), "{}", a.body);
    let a = control(&emu, "POST", "/_emulator/reclaim", json!({"id": "i-0000000000000000f"})).await;
    assert_eq!(a.status, 404, "{}", a.body);
    let a = control(&emu, "POST", "/_emulator/reclaim", json!({"nope": 1})).await;
    assert_eq!(a.status, 400, "{}", a.body);

    let a = control(&emu, "POST", "/_emulator/reclaim", json!({"id": spot})).await;
    assert_eq!(a.status, 204, "{}", a.body);
    let a = describe(&emu, &spot).await;
    assert_eq!(a.first("name").as_deref(), Some("shutting-down"));
    let codes = a.all("code");
    assert!(codes.contains(&"Server.SpotInstanceTermination".to_string()), "{}", a.body);
    assert_eq!(a.first("reason").as_deref(), Some(""), "not user initiated: {}", a.body);
    let a = describe(&emu, &spot).await;
    assert_eq!(a.first("name").as_deref(), Some("terminated"));
    assert!(a.all("code").contains(&"Server.SpotInstanceTermination".to_string()));
    assert!(a.first("ipAddress").is_none(), "{}", a.body);
    assert_eq!(emu.dump().instances.len(), 1, "the terminated one leaves the dump");
    assert_eq!(emu.spot_instances(), Vec::<String>::new());
    assert_eq!(state_of(&emu, &on_demand).await, "running", "the other one is untouched");
}

#[tokio::test]
async fn reclaim_stops_a_persistent_spot_instance_that_stops() {
    let emu = Ec2Emulator::start(Ec2Config::default());
    let stop = [
        SPOT[0],
        ("InstanceMarketOptions.SpotOptions.SpotInstanceType", "persistent"),
        ("InstanceMarketOptions.SpotOptions.InstanceInterruptionBehavior", "stop"),
    ];
    let id = run(&emu, &us(), &stop).await;
    assert_eq!(emu.reclaim(&id), Ok(true));
    let a = describe(&emu, &id).await;
    assert_eq!(a.first("name").as_deref(), Some("stopped"));
    assert!(a.all("code").contains(&"Server.SpotInstanceShutdown".to_string()), "{}", a.body);
    assert_eq!(emu.dump().secondary.len(), 1, "a stopped instance keeps its volume");
}

#[tokio::test]
async fn without_spot_capacity_spot_launches_fail_and_on_demand_ones_do_not() {
    let emu = Ec2Emulator::start(Ec2Config::default());
    let a = control(&emu, "POST", "/_emulator/spot-capacity", json!({"available": false})).await;
    assert_eq!(a.status, 204, "{}", a.body);
    let mut params = vec![
        ("Action", "RunInstances"),
        ("ImageId", AMI),
        ("InstanceType", "t3.micro"),
        ("MinCount", "1"),
        ("MaxCount", "1"),
        ("ClientToken", "tok-1"),
    ];
    params.extend_from_slice(&SPOT);
    let a = call(&emu, &us(), &params).await;
    assert_eq!((a.status, a.code().as_str()), (500, "InsufficientInstanceCapacity"), "{}", a.body);
    assert!(a.body.contains("no Spot capacity"), "{}", a.body);
    assert!(emu.dump().instances.is_empty() && emu.dump().secondary.is_empty());
    run(&emu, &us(), &[]).await;
    assert_eq!(emu.dump().instances.len(), 1, "on-demand is untouched");

    // Capacity back: the same token launches (a failed launch records no token).
    assert!(emu.set_spot_capacity(true));
    let a = call(&emu, &us(), &params).await;
    a.ok();
    emu.set_spot_capacity(false);
    emu.reset();
    run(&emu, &us(), &SPOT).await;
}

/// DescribeSpotPriceHistory after the 2016-11-15 model: one price per type, zone and product
/// set at SPOT_PRICES_SINCE, so a start time of now still answers it; the parameters and
/// filters narrow it, pages follow `nextToken`, and the price a zone is given is the one
/// RunInstances compares `MaxPrice` with.
#[tokio::test]
async fn spot_price_history_is_the_configured_prices() {
    let cfg = Ec2Config {
        spot_price: "0.004000".into(),
        spot_prices: vec![ZoneSpotPrice::new("t3.micro", "us-east-1b", "0.003100")],
        ..Ec2Config::default()
    };
    let emu = Ec2Emulator::start(cfg);
    let now = crate::time::rfc3339(unix_now());
    let history = |extra: &[(&'static str, &'static str)]| spot_history(&emu, extra.to_vec());
    let one = spot_history(
        &emu,
        vec![
            ("InstanceType.1", "t3.micro"),
            ("ProductDescription.1", "Linux/UNIX"),
            ("AvailabilityZone", "us-east-1b"),
            ("StartTime", now.as_str()),
        ],
    )
    .await;
    one.ok();
    assert_eq!(one.all("spotPrice"), ["0.003100"]);
    assert_eq!(
        (one.all("instanceType"), one.all("availabilityZone"), one.all("productDescription")),
        (
            vec!["t3.micro".to_string()],
            vec!["us-east-1b".to_string()],
            vec!["Linux/UNIX".to_string()]
        )
    );
    assert_eq!(one.first("timestamp").unwrap(), "2024-01-01T00:00:00.000Z");
    assert_eq!(one.first("availabilityZoneId").unwrap(), "use1-az2");
    // The last page: "an empty string or null" says the reference; an empty element here.
    assert_eq!(one.first("nextToken").as_deref(), Some(""));

    // Every zone, both products: the other zones at the default price, Windows at twice it.
    let all_zones = history(&[("InstanceType.1", "t3.micro")]).await;
    assert_eq!(
        all_zones.all("spotPrice"),
        ["0.004000", "0.008000", "0.003100", "0.006200", "0.004000", "0.008000"]
    );
    let filtered = history(&[
        ("Filter.1.Name", "product-description"),
        ("Filter.1.Value.1", "Linux*"),
        ("Filter.2.Name", "instance-type"),
        ("Filter.2.Value.1", "m5.large"),
        ("AvailabilityZoneId", "use1-az3"),
    ])
    .await;
    assert_eq!(filtered.all("spotPrice"), ["0.004000"]);
    assert_eq!(filtered.all("availabilityZone"), ["us-east-1c"]);
    // A type the region does not offer has no history; an end time before the price, none.
    assert!(history(&[("InstanceType.1", "p5.48xlarge")]).await.all("item").is_empty());
    assert!(history(&[("EndTime", "2023-06-01T00:00:00Z")]).await.all("item").is_empty());

    // 4 types x 3 zones x 2 products = 24 prices, in pages of 10.
    let (mut seen, mut token) = (0, String::new());
    for pages in 1.. {
        let a = spot_history(&emu, vec![("MaxResults", "10"), ("NextToken", token.as_str())]).await;
        a.ok();
        seen += a.all("spotPrice").len();
        match a.first("nextToken") {
            Some(t) if !t.is_empty() => token = t,
            _ => {
                assert_eq!((pages, seen), (3, 24));
                break;
            }
        }
    }

    for (bad, code) in [
        (vec![("AvailabilityZone", "us-east-1z")], "InvalidParameterValue"),
        (
            vec![("AvailabilityZone", "us-east-1a"), ("AvailabilityZoneId", "use1-az1")],
            "InvalidParameterCombination",
        ),
        (vec![("StartTime", "yesterday")], "InvalidParameterValue"),
        (vec![("Filter.1.Name", "colour")], "InvalidParameterValue"),
        (vec![("NextToken", "garbage!")], "InvalidPaginationToken"),
    ] {
        assert_eq!(spot_history(&emu, bad.clone()).await.code(), code, "{bad:?}");
    }

    // RunInstances compares MaxPrice with the zone's price.
    let market = [
        ("InstanceMarketOptions.MarketType", "spot"),
        ("InstanceMarketOptions.SpotOptions.MaxPrice", "0.0035"),
    ];
    let mut in_b = market.to_vec();
    in_b.push(("Placement.AvailabilityZone", "us-east-1b"));
    run(&emu, &us(), &in_b).await;
    let mut in_a = market.to_vec();
    in_a.extend([("Action", "RunInstances"), ("ImageId", AMI), ("InstanceType", "t3.micro")]);
    in_a.extend([
        ("MinCount", "1"),
        ("MaxCount", "1"),
        ("Placement.AvailabilityZone", "us-east-1a"),
    ]);
    assert_eq!(call(&emu, &us(), &in_a).await.code(), "SpotMaxPriceTooLow");
}

async fn spot_history(emu: &Ec2Emulator, extra: Vec<(&str, &str)>) -> Answer {
    let mut params = vec![("Action", "DescribeSpotPriceHistory")];
    params.extend(extra);
    call(emu, &us(), &params).await
}
