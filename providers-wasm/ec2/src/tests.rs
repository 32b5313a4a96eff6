//! Native tests of the pure parts: classify table, config validation, placement
//! resolution, ID parsing, state mapping, XML answers, RunInstances parameters and the
//! client-token chain. The wire shapes are those of the EC2 API reference and of answers
//! captured from EC2 (namespace, nested `item` sets, empty elements).

use super::*;
use api::Ec2Error;
use egress_guest_sdk::http::{ErrorCode, HttpError};
use wire::ApiError;

// ---------------------------------------------------------------------------------------
// classify

fn api_error(status: u16, code: &str) -> Ec2Error {
    Ec2Error::Api {
        call: "RunInstances in eu-west-1".into(),
        status,
        error: ApiError {
            code: code.into(),
            message: "m".into(),
            request_id: "r-1".into(),
        },
    }
}

#[test]
fn classify_table() {
    use ErrorClass::*;
    let cases: &[(u16, &str, ErrorClass)] = &[
        (400, "InvalidInstanceID.NotFound", NotFound),
        (400, "InvalidInstanceID.Malformed", Permanent),
        (400, "InstanceLimitExceeded", QuotaExceeded),
        (500, "InsufficientInstanceCapacity", QuotaExceeded),
        (400, "VcpuLimitExceeded", QuotaExceeded),
        (503, "RequestLimitExceeded", QuotaExceeded),
        (400, "InsufficientFreeAddressesInSubnet", QuotaExceeded),
        (401, "AuthFailure", Permanent),
        (403, "SignatureDoesNotMatch", Permanent),
        (403, "UnauthorizedOperation", Permanent),
        (401, "OptInRequired", Permanent),
        (400, "InvalidAMIID.NotFound", Permanent),
        (400, "InvalidAMIID.Malformed", Permanent),
        (400, "InvalidAMIID.Unavailable", Permanent),
        (400, "InvalidParameterValue", Permanent),
        (400, "InvalidParameterCombination", Permanent),
        (400, "InvalidSubnetID.NotFound", Permanent),
        (400, "InvalidGroup.NotFound", Permanent),
        (400, "MissingParameter", Permanent),
        (400, "IdempotentParameterMismatch", Permanent),
        (400, "OperationNotPermitted", Permanent),
        (400, "IncorrectInstanceState", Transient),
        (400, "RequestExpired", Transient),
        (500, "InternalError", Transient),
        (503, "Unavailable", Transient),
        (500, "SomethingNew", Transient),
        (400, "SomethingNew", Transient),
        (403, "SomethingNew", Permanent),
        (429, "SomethingNew", QuotaExceeded),
    ];
    for (status, code, want) in cases {
        let e = classify(&api_error(*status, code));
        assert_eq!(e.class, *want, "{status} {code}");
        assert_eq!(e.code.as_deref(), Some(*code));
        assert!(
            e.message.contains(code) && e.message.contains("[request r-1]"),
            "{}",
            e.message
        );
    }

    // Transport errors: no answer at all, whatever the cause.
    for code in [
        ErrorCode::ConnectionRefused,
        ErrorCode::ConnectionReadTimeout,
        ErrorCode::HttpRequestDenied,
        ErrorCode::DestinationIpProhibited,
    ] {
        let e = classify(&Ec2Error::Transport {
            call: "DescribeInstances in eu-west-1".into(),
            error: HttpError::Transport(code),
        });
        assert_eq!(e.class, ErrorClass::Transient, "{}", e.message);
    }
    let e = classify(&Ec2Error::Transport {
        call: "x".into(),
        error: HttpError::Transport(ErrorCode::ConnectionTimeout),
    });
    assert_eq!(e.code.as_deref(), Some("ConnectionTimeout"));

    // Not a backend error at all: an answer EC2 would never send.
    let unexpected = |status| Ec2Error::Unexpected {
        call: "x".into(),
        status,
        what: "<html>bad gateway</html>".into(),
    };
    assert_eq!(classify(&unexpected(502)).class, ErrorClass::Transient);
    assert_eq!(classify(&unexpected(200)).class, ErrorClass::Transient);
    assert_eq!(classify(&unexpected(403)).class, ErrorClass::Permanent);
    assert_eq!(classify(&unexpected(429)).class, ErrorClass::QuotaExceeded);
    assert_eq!(classify(&unexpected(502)).code.as_deref(), Some("HTTP502"));
}

#[test]
fn check_reasons() {
    assert_eq!(api_error(401, "AuthFailure").reason(), "Unauthorized");
    assert_eq!(
        api_error(403, "SignatureDoesNotMatch").reason(),
        "Unauthorized"
    );
    assert_eq!(
        api_error(403, "UnauthorizedOperation").reason(),
        "Forbidden"
    );
    assert_eq!(api_error(503, "Unavailable").reason(), "APIError");
    let transport = |code| Ec2Error::Transport {
        call: "x".into(),
        error: HttpError::Transport(code),
    };
    assert_eq!(transport(ErrorCode::ConnectionTimeout).reason(), "Timeout");
    assert_eq!(
        transport(ErrorCode::ConnectionRefused).reason(),
        "Unreachable"
    );
}

// ---------------------------------------------------------------------------------------
// XML answers

/// The shape of a real DescribeInstances answer: namespace, a nested network interface
/// with its own `item`s and tags, empty elements, and a page token.
const DESCRIBE: &str = r#"<?xml version="1.0" encoding="UTF-8"?>
<DescribeInstancesResponse xmlns="http://ec2.amazonaws.com/doc/2016-11-15/">
    <requestId>8f7724cf-496f-496e-8fe3-example</requestId>
    <reservationSet>
        <item>
            <reservationId>r-1234567890abcdef0</reservationId>
            <ownerId>123456789012</ownerId>
            <groupSet/>
            <instancesSet>
                <item>
                    <instanceId>i-1234567890abcdef0</instanceId>
                    <imageId>ami-bff32ccc</imageId>
                    <instanceState>
                        <code>16</code>
                        <name>running</name>
                    </instanceState>
                    <privateDnsName>ip-192-168-1-88.eu-west-1.compute.internal</privateDnsName>
                    <dnsName>ec2-54-194-252-215.eu-west-1.compute.amazonaws.com</dnsName>
                    <reason/>
                    <instanceType>t2.micro</instanceType>
                    <launchTime>2018-05-08T16:46:19.000Z</launchTime>
                    <placement>
                        <availabilityZone>eu-west-1c</availabilityZone>
                        <groupName/>
                        <tenancy>default</tenancy>
                    </placement>
                    <subnetId>subnet-56f5f633</subnetId>
                    <privateIpAddress>192.168.1.88</privateIpAddress>
                    <ipAddress>54.194.252.215</ipAddress>
                    <groupSet>
                        <item>
                            <groupId>sg-e4076980</groupId>
                            <groupName>SecurityGroup1</groupName>
                        </item>
                    </groupSet>
                    <blockDeviceMapping>
                        <item>
                            <deviceName>/dev/xvda</deviceName>
                            <ebs>
                                <volumeId>vol-1234567890abcdef0</volumeId>
                                <status>attached</status>
                                <deleteOnTermination>true</deleteOnTermination>
                            </ebs>
                        </item>
                    </blockDeviceMapping>
                    <networkInterfaceSet>
                        <item>
                            <networkInterfaceId>eni-551ba033</networkInterfaceId>
                            <privateIpAddress>192.168.1.88</privateIpAddress>
                            <tagSet>
                                <item><key>Name</key><value>not-the-instance</value></item>
                            </tagSet>
                        </item>
                    </networkInterfaceSet>
                    <tagSet>
                        <item>
                            <key>Name</key>
                            <value>proxy-abc</value>
                        </item>
                        <item>
                            <key>egress.proxy-operator.dev/uid</key>
                            <value>u-1 &amp; more</value>
                        </item>
                        <item>
                            <key>empty</key>
                            <value/>
                        </item>
                    </tagSet>
                </item>
                <item>
                    <instanceId>i-0598c7d356eba48d7</instanceId>
                    <instanceState><code>0</code><name>pending</name></instanceState>
                    <launchTime>2018-05-08T16:46:20.000Z</launchTime>
                    <privateIpAddress>192.168.1.89</privateIpAddress>
                </item>
            </instancesSet>
        </item>
        <item>
            <reservationId>r-2</reservationId>
            <instancesSet>
                <item>
                    <instanceId>i-00000003</instanceId>
                    <instanceState><code>48</code><name>terminated</name></instanceState>
                    <launchTime>2018-05-08T16:46:21.000Z</launchTime>
                </item>
            </instancesSet>
        </item>
    </reservationSet>
    <nextToken>eyJ2IjoiMiIsImMiOiJ</nextToken>
</DescribeInstancesResponse>"#;

#[test]
fn parses_describe_instances() {
    let page = wire::parse_instances(DESCRIBE).unwrap();
    let ids: Vec<&str> = page.instances.iter().map(|i| i.id.as_str()).collect();
    assert_eq!(
        ids,
        ["i-1234567890abcdef0", "i-0598c7d356eba48d7", "i-00000003"]
    );
    let first = &page.instances[0];
    assert_eq!(first.state, "running");
    assert_eq!(first.public_ip.as_deref(), Some("54.194.252.215"));
    assert_eq!(first.private_ip.as_deref(), Some("192.168.1.88"));
    assert_eq!(first.launch_time, "2018-05-08T16:46:19.000Z");
    assert_eq!(first.tag("Name"), Some("proxy-abc"), "not the ENI's tag");
    assert_eq!(first.tag(MARK_UID), Some("u-1 & more"));
    assert_eq!(first.tag("empty"), Some(""));
    assert_eq!(first.tags.len(), 3);
    assert_eq!(page.instances[1].public_ip, None);
    assert!(page.instances[2].is_dead());
    assert_eq!(page.next_token.as_deref(), Some("eyJ2IjoiMiIsImMiOiJ"));

    let empty = r#"<DescribeInstancesResponse xmlns="http://ec2.amazonaws.com/doc/2016-11-15/">
        <requestId>x</requestId><reservationSet/></DescribeInstancesResponse>"#;
    assert_eq!(wire::parse_instances(empty).unwrap(), wire::Page::default());
}

#[test]
fn parses_run_instances() {
    let body = r#"<RunInstancesResponse xmlns="http://ec2.amazonaws.com/doc/2016-11-15/">
      <requestId>r</requestId><reservationId>r-1</reservationId><ownerId>1</ownerId><groupSet/>
      <instancesSet><item><instanceId>i-0123456789abcdef0</instanceId>
        <instanceState><code>0</code><name>pending</name></instanceState>
        <launchTime>2024-05-01T12:00:00.000Z</launchTime>
        <tagSet><item><key>Name</key><value>proxy-x</value></item></tagSet>
      </item></instancesSet></RunInstancesResponse>"#;
    let page = wire::parse_instances(body).unwrap();
    assert_eq!(page.instances.len(), 1);
    assert_eq!(page.instances[0].id, "i-0123456789abcdef0");
    assert_eq!(page.instances[0].state, "pending");
    assert_eq!(page.next_token, None);
}

#[test]
fn rejects_what_is_not_an_instance_answer() {
    for body in [
        "",
        "not xml",
        "<html><body>502 Bad Gateway</body></html>",
        "<DescribeInstancesResponse><reservationSet><item><instancesSet><item>\
         <instanceState><name>running</name></instanceState></item></instancesSet></item>\
         </reservationSet></DescribeInstancesResponse>",
    ] {
        assert!(wire::parse_instances(body).is_err(), "{body:?}");
    }
}

#[test]
fn parses_error_documents() {
    // The documented EC2 error shape.
    let body = r#"<?xml version="1.0" encoding="UTF-8"?>
<Response><Errors><Error><Code>InvalidInstanceID.NotFound</Code><Message>The instance ID 'i-1a2b3c4d' does not exist</Message></Error></Errors><RequestID>ea966190-f9aa-478e-9ede-example</RequestID></Response>"#;
    let e = wire::parse_error(body).unwrap();
    assert_eq!(e.code, "InvalidInstanceID.NotFound");
    assert_eq!(e.message, "The instance ID 'i-1a2b3c4d' does not exist");
    assert_eq!(e.request_id, "ea966190-f9aa-478e-9ede-example");

    // The older query-protocol shape some AWS front ends still use.
    let body = r#"<ErrorResponse xmlns="https://iam.amazonaws.com/doc/2010-05-08/"><Error><Type>Sender</Type><Code>SignatureDoesNotMatch</Code><Message>m</Message></Error><RequestId>rid</RequestId></ErrorResponse>"#;
    let e = wire::parse_error(body).unwrap();
    assert_eq!(
        (e.code.as_str(), e.request_id.as_str()),
        ("SignatureDoesNotMatch", "rid")
    );

    assert_eq!(wire::parse_error("<html>503</html>"), None);
    assert_eq!(wire::parse_error(""), None);
}

// ---------------------------------------------------------------------------------------
// States, IDs, instances

#[test]
fn state_mapping() {
    let cases = [
        ("pending", false, State::Provisioning),
        ("pending", true, State::Provisioning),
        ("running", true, State::Running),
        ("running", false, State::Provisioning),
        ("shutting-down", false, State::Terminated),
        ("terminated", false, State::Terminated),
        ("stopping", true, State::Stopped),
        ("stopped", false, State::Stopped),
        ("hibernating", false, State::Stopped),
        ("", false, State::Stopped),
    ];
    for (state, ip, want) in cases {
        assert_eq!(map_state(state, ip), want, "{state} ip={ip}");
    }
}

#[test]
fn instances_read_uid_ip_and_created_at_from_the_answer() {
    let page = wire::parse_instances(DESCRIBE).unwrap();
    let i = to_instance("eu-west-1", &page.instances[0], IpAddress::Public);
    assert_eq!(i.id, "eu-west-1/i-1234567890abcdef0");
    assert_eq!((i.ip.as_str(), i.state), ("54.194.252.215", State::Running));
    assert_eq!(i.uid, "u-1 & more");
    assert_eq!(i.created_at.map(|t| t.seconds), Some(1_525_797_979));

    let pending = to_instance("eu-west-1", &page.instances[1], IpAddress::Public);
    assert_eq!(
        (pending.ip.as_str(), pending.state),
        ("", State::Provisioning)
    );
    assert_eq!(pending.uid, "", "no uid mark reads as empty");

    let private = to_instance("eu-west-1", &page.instances[0], IpAddress::Private);
    assert_eq!(private.ip, "192.168.1.88");

    let mut odd = page.instances[0].clone();
    odd.launch_time = "yesterday".into();
    assert!(
        to_instance("eu-west-1", &odd, IpAddress::Public)
            .created_at
            .is_none()
    );
}

#[test]
fn ids_are_parsed_strictly() {
    assert_eq!(
        parse_id("eu-west-1/i-0123456789abcdef0").unwrap(),
        ("eu-west-1", "i-0123456789abcdef0")
    );
    assert_eq!(
        parse_id("us-gov-west-1/i-0123abcd").unwrap(),
        ("us-gov-west-1", "i-0123abcd")
    );
    for bad in [
        "",
        "i-0123456789abcdef0",
        "eu-west-1/",
        "/i-0123456789abcdef0",
        "eu-west-1/i-0123456789abcdef0/x",
        "eu-west-1/i-0123456789ABCDEF0",
        "eu-west-1/i-123",
        "eu-west-1/vol-0123456789abcdef0",
        "EU-west-1/i-0123456789abcdef0",
        "eu-west/i-0123456789abcdef0",
        "../i-0123456789abcdef0",
        "eu-west-1 /i-0123456789abcdef0",
    ] {
        let e = parse_id(bad).unwrap_err();
        assert_eq!(e.class, ErrorClass::Permanent, "{bad:?}");
        assert_eq!(e.code.as_deref(), Some("InvalidId"));
    }
}

// ---------------------------------------------------------------------------------------
// Config

const GOOD: &str = r#"{
  "regions": {
    "eu-west-1": {
      "zones": {
        "eu-west-1a": {"subnetId": "subnet-0123456789abcdef0", "securityGroupIds": ["sg-0123456789abcdef0"]},
        "eu-west-1b": {}
      },
      "images": {"debian-12": "ami-0fedcba9876543210", "ubuntu": {"id": "ami-01234567", "rootDeviceName": "/dev/sda1"}}
    },
    "us-east-1": {"endpoint": "http://127.0.0.1:4566", "zones": {"us-east-1a": {}}, "rootDeviceName": "/dev/sdb"}
  },
  "instanceTypes": ["t3.micro", "m7i-flex.large"],
  "tags": {"team": "net"}
}"#;

fn with(patch: &str, value: serde_json::Value) -> String {
    let mut v: serde_json::Value = serde_json::from_str(GOOD).unwrap();
    let (parent, key) = patch.rsplit_once('/').unwrap();
    let target = v.pointer_mut(parent).unwrap_or_else(|| panic!("{patch}"));
    target
        .as_object_mut()
        .unwrap()
        .insert(key.to_string(), value);
    v.to_string()
}

#[test]
fn config_accepts_a_full_block() {
    let cfg = Config::parse(GOOD).unwrap();
    assert_eq!(cfg.ip_address, IpAddress::Public);
    let r = cfg.region("eu-west-1").unwrap();
    assert_eq!(
        r.endpoint("eu-west-1").unwrap(),
        config::Endpoint {
            base: "https://ec2.eu-west-1.amazonaws.com".into(),
            authority: "ec2.eu-west-1.amazonaws.com".into()
        }
    );
    let us = cfg
        .region("us-east-1")
        .unwrap()
        .endpoint("us-east-1")
        .unwrap();
    assert_eq!(
        (us.base.as_str(), us.authority.as_str()),
        ("http://127.0.0.1:4566", "127.0.0.1:4566")
    );
    assert_eq!(
        config::default_endpoint("cn-north-1").authority,
        "ec2.cn-north-1.amazonaws.com.cn"
    );
    assert_eq!(
        cfg.region("mars-1").unwrap_err().code.as_deref(),
        Some("InvalidRegion")
    );
    let private = with("/ipAddress", "private".into());
    assert_eq!(
        Config::parse(&private).unwrap().ip_address,
        IpAddress::Private
    );
}

#[test]
fn config_errors_name_field_and_value() {
    use serde_json::json;
    let cases: Vec<(String, &[&str])> = vec![
        ("{}".into(), &["regions"]),
        (with("/regions", json!({})), &["config.regions"]),
        (
            with("/regions/eu-west-1/endpoint", "ftp://x".into()),
            &["config.regions[\"eu-west-1\"].endpoint", "ftp://x"],
        ),
        (
            with("/regions/eu-west-1/endpoint", "https://h/path".into()),
            &["endpoint", "https://h/path"],
        ),
        (
            with("/regions/eu-west-1/endpoint", "https://u@h".into()),
            &["endpoint", "https://u@h"],
        ),
        (with("/regions/eu-west-1/zones", json!({})), &["zones"]),
        (
            with("/regions/eu-west-1/zones", json!({"us-east-1a": {}})),
            &["zones", "us-east-1a"],
        ),
        (
            with(
                "/regions/eu-west-1/zones/eu-west-1a/subnetId",
                "subnet-xyz".into(),
            ),
            &["subnetId", "subnet-xyz"],
        ),
        (
            with(
                "/regions/eu-west-1/zones/eu-west-1a/securityGroupIds",
                json!(["sg-01234567", "default"]),
            ),
            &["securityGroupIds", "default"],
        ),
        (
            with("/regions/eu-west-1/zones/eu-west-1a/extra", json!(1)),
            &["extra"],
        ),
        (
            with("/regions/eu-west-1/images/debian-12", "debian".into()),
            &["images[\"debian-12\"]", "debian"],
        ),
        (
            with(
                "/regions/eu-west-1/images/ubuntu/rootDeviceName",
                "sda1".into(),
            ),
            &["images[\"ubuntu\"]", "sda1"],
        ),
        (
            with("/regions/eu-west-1/images/ubuntu/size", json!(8)),
            &["images[\"ubuntu\"]", "size"],
        ),
        (
            with(
                "/regions/eu-west-1/images/ami-01234567",
                "ami-01234567".into(),
            ),
            &["images key", "ami-01234567"],
        ),
        (
            with("/regions/us-east-1/rootDeviceName", "xvda".into()),
            &["rootDeviceName", "xvda"],
        ),
        (with("/instanceTypes", json!([])), &["instanceTypes"]),
        (
            with("/instanceTypes", json!(["t3.micro", "T3 Micro"])),
            &["instanceTypes", "T3 Micro"],
        ),
        (
            with("/tags", json!({"Name": "x"})),
            &["config.tags", "Name"],
        ),
        (with("/tags", json!({"aws:foo": "x"})), &["aws:foo"]),
        (
            with("/tags", json!({"egress.proxy-operator.dev/uid": "x"})),
            &["egress.proxy-operator.dev/uid"],
        ),
        (with("/ipAddress", "ipv6".into()), &["ipv6"]),
        (with("/unknown", json!(true)), &["unknown"]),
    ];
    for (json, wants) in cases {
        let e = Config::parse(&json)
            .err()
            .unwrap_or_else(|| panic!("accepted {json}"));
        assert_eq!(e.class, ErrorClass::Permanent);
        for want in wants {
            assert!(e.message.contains(want), "{want:?} not in {:?}", e.message);
        }
    }
    // A region key is checked as a region name: it becomes part of IDs and host names.
    let mut v: serde_json::Value = serde_json::from_str(GOOD).unwrap();
    let regions = v["regions"].as_object_mut().unwrap();
    let r = regions.remove("eu-west-1").unwrap();
    regions.insert("eu/west".into(), r);
    let e = Config::parse(&v.to_string()).unwrap_err();
    assert!(e.message.contains("eu/west"), "{}", e.message);
}

#[test]
fn region_names() {
    for ok in [
        "eu-west-1",
        "us-gov-west-1",
        "ap-southeast-4",
        "cn-northwest-1",
        "us-isob-east-1",
    ] {
        assert!(config::valid_region(ok), "{ok}");
    }
    for bad in [
        "",
        "eu",
        "eu-west",
        "eu-west-x",
        "EU-west-1",
        "eu--1",
        "1u-west-1",
        "eu-west-1/x",
    ] {
        assert!(!config::valid_region(bad), "{bad}");
    }
}

// ---------------------------------------------------------------------------------------
// Placement

fn placement(region: &str, zone: &str, machine: &str, image: &str) -> Placement {
    Placement::new(region, zone, machine, image)
}

#[test]
fn placement_resolves_against_the_config() {
    let cfg = Config::parse(GOOD).unwrap();
    let l = config::resolve(
        &cfg,
        &placement("eu-west-1", "eu-west-1a", "t3.micro", "debian-12"),
    )
    .unwrap();
    assert_eq!(l.image_id, "ami-0fedcba9876543210");
    assert_eq!(l.root_device_name, "/dev/xvda");
    assert_eq!(l.subnet_id.as_deref(), Some("subnet-0123456789abcdef0"));
    assert_eq!(l.security_group_ids, ["sg-0123456789abcdef0"]);

    let l = config::resolve(
        &cfg,
        &placement("eu-west-1", "eu-west-1b", "t3.micro", "ubuntu"),
    )
    .unwrap();
    assert_eq!(
        (l.image_id.as_str(), l.root_device_name.as_str()),
        ("ami-01234567", "/dev/sda1")
    );
    assert_eq!(l.subnet_id, None);

    let l = config::resolve(
        &cfg,
        &placement(
            "us-east-1",
            "us-east-1a",
            "m7i-flex.large",
            "ami-0abcdef1234567890",
        ),
    )
    .unwrap();
    assert_eq!(
        (l.image_id.as_str(), l.root_device_name.as_str()),
        ("ami-0abcdef1234567890", "/dev/sdb")
    );
    assert_eq!(l.endpoint.authority, "127.0.0.1:4566");
}

#[test]
fn placement_errors_name_field_and_value() {
    let cfg = Config::parse(GOOD).unwrap();
    let cases = [
        (
            placement("mars-1", "eu-west-1a", "t3.micro", "debian-12"),
            "placement.region",
            "mars-1",
            "InvalidRegion",
        ),
        (
            placement("eu-west-1", "", "t3.micro", "debian-12"),
            "placement.zone",
            "\"\"",
            "InvalidZone",
        ),
        (
            placement("eu-west-1", "eu-west-1c", "t3.micro", "debian-12"),
            "placement.zone",
            "eu-west-1c",
            "InvalidZone",
        ),
        (
            placement("eu-west-1", "eu-west-1a", "t3.huge", "debian-12"),
            "placement.machineType",
            "t3.huge",
            "InvalidMachineType",
        ),
        (
            placement("eu-west-1", "eu-west-1a", "t3.micro", "arch"),
            "placement.image",
            "arch",
            "InvalidImage",
        ),
        (
            placement("eu-west-1", "eu-west-1a", "t3.micro", "ami-xyz"),
            "placement.image",
            "ami-xyz",
            "InvalidImage",
        ),
        // Catalogues are per region: us-east-1 has no debian-12.
        (
            placement("us-east-1", "us-east-1a", "t3.micro", "debian-12"),
            "placement.image",
            "debian-12",
            "InvalidImage",
        ),
    ];
    for (p, field, value, code) in cases {
        let e = config::resolve(&cfg, &p).unwrap_err();
        assert_eq!(e.class, ErrorClass::Permanent);
        assert_eq!(e.code.as_deref(), Some(code));
        assert!(
            e.message.contains(field) && e.message.contains(value),
            "{}",
            e.message
        );
    }
}

// ---------------------------------------------------------------------------------------
// RunInstances parameters and client tokens

fn request(cloud_init: &[u8]) -> CreateRequest {
    CreateRequest {
        name: "proxy-itnbf4wjfyhs3q6u".into(),
        uid: "3f1c2a4e-7b1d-4c8e-9a55-0d6f2b9e1c01".into(),
        namespace: "default".into(),
        proxy_name: "p1".into(),
        installation: "inst-a".into(),
        placement: placement("eu-west-1", "eu-west-1a", "t3.micro", "debian-12"),
        cloud_init: cloud_init.to_vec(),
        port: 3128,
        ip_family: egress_guest_sdk::IpFamily::Ipv4,
    }
}

fn launch() -> Launch {
    let cfg = Config::parse(GOOD).unwrap();
    config::resolve(&cfg, &request(b"").placement).unwrap()
}

#[test]
fn run_parameters_carry_marks_user_data_and_root_volume() {
    let cfg = Config::parse(GOOD).unwrap();
    let req = request(b"#cloud-config\n\x00\xff");
    let params = run_params(&req, &launch(), &cfg.tags);
    let get = |k: &str| {
        params
            .iter()
            .find(|(key, _)| key == k)
            .map(|(_, v)| v.as_str())
            .unwrap_or_else(|| panic!("{k} missing"))
    };
    assert_eq!(get("ImageId"), "ami-0fedcba9876543210");
    assert_eq!(get("InstanceType"), "t3.micro");
    assert_eq!((get("MinCount"), get("MaxCount")), ("1", "1"));
    assert_eq!(get("SubnetId"), "subnet-0123456789abcdef0");
    assert_eq!(get("SecurityGroupId.1"), "sg-0123456789abcdef0");
    assert_eq!(get("Placement.AvailabilityZone"), "eu-west-1a");
    assert_eq!(get("BlockDeviceMapping.1.DeviceName"), "/dev/xvda");
    assert_eq!(get("BlockDeviceMapping.1.Ebs.DeleteOnTermination"), "true");
    let user_data = data_encoding::BASE64
        .decode(get("UserData").as_bytes())
        .unwrap();
    assert_eq!(user_data, req.cloud_init, "byte for byte");
    for (n, kind) in [(1, "instance"), (2, "volume")] {
        assert_eq!(get(&format!("TagSpecification.{n}.ResourceType")), kind);
        let tags: Vec<(&str, &str)> = (1..=5)
            .map(|m| {
                (
                    get(&format!("TagSpecification.{n}.Tag.{m}.Key")),
                    get(&format!("TagSpecification.{n}.Tag.{m}.Value")),
                )
            })
            .collect();
        assert_eq!(
            tags,
            [
                ("Name", "proxy-itnbf4wjfyhs3q6u"),
                (MARK_MANAGED, "true"),
                (MARK_UID, "3f1c2a4e-7b1d-4c8e-9a55-0d6f2b9e1c01"),
                (MARK_INSTALLATION, "inst-a"),
                ("team", "net"),
            ]
        );
    }
    // No user data, no parameter (EC2 refuses an empty one).
    let params = run_params(&request(b""), &launch(), &cfg.tags);
    assert!(params.iter().all(|(k, _)| k != "UserData"));
}

#[test]
fn form_body_is_rfc3986_encoded() {
    let body = api::form_body(
        "DescribeInstances",
        &[
            (
                "Filter.1.Name".into(),
                "tag:egress.proxy-operator.dev/managed".into(),
            ),
            ("UserData".into(), "a+b/c=".into()),
            ("x".into(), "a b".into()),
        ],
    );
    assert_eq!(
        body,
        "Action=DescribeInstances&Version=2016-11-15\
         &Filter.1.Name=tag%3Aegress.proxy-operator.dev%2Fmanaged&UserData=a%2Bb%2Fc%3D&x=a%20b"
    );
}

#[test]
fn filters_are_numbered() {
    let f = filters(&[
        ("tag:Name", &["a"]),
        ("instance-state-name", &["pending", "running"]),
    ]);
    let want: Vec<(String, String)> = [
        ("Filter.1.Name", "tag:Name"),
        ("Filter.1.Value.1", "a"),
        ("Filter.2.Name", "instance-state-name"),
        ("Filter.2.Value.1", "pending"),
        ("Filter.2.Value.2", "running"),
    ]
    .iter()
    .map(|(k, v)| (k.to_string(), v.to_string()))
    .collect();
    assert_eq!(f, want);
}

#[test]
fn client_tokens() {
    let cfg = Config::parse(GOOD).unwrap();
    let req = request(b"#cloud-config\n");
    let params = run_params(&req, &launch(), &cfg.tags);
    let t0 = client_token(&req.name, &params, &[]);
    assert!(t0.len() <= 64 && t0.is_ascii(), "{t0}");
    assert!(t0.starts_with("proxy-itnbf4wjfyhs3q6u-"), "{t0}");
    assert_eq!(t0, client_token(&req.name, &params, &[]), "deterministic");

    // A changed spec (here the user data) is a new launch: a new token.
    let other = run_params(&request(b"#cloud-config\nother\n"), &launch(), &cfg.tags);
    assert_ne!(t0, client_token(&req.name, &other, &[]));
    // A same-spec recreate after the first instance died walks on to a new token.
    let t1 = client_token(&req.name, &params, &["i-0123456789abcdef0".into()]);
    assert_ne!(t0, t1);
    assert_eq!(
        t1,
        client_token(&req.name, &params, &["i-0123456789abcdef0".into()])
    );

    let long = "x".repeat(40);
    let t = client_token(&long, &params, &[]);
    assert_eq!(t.len(), 64);
    assert!(!t.contains(&long));
}

#[test]
fn default_hosts_are_exact_regional_endpoints() {
    let hosts = default_hosts();
    assert!(hosts.contains(&"https://ec2.eu-west-1.amazonaws.com:443".to_string()));
    assert!(hosts.contains(&"https://ec2.cn-north-1.amazonaws.com.cn:443".to_string()));
    assert!(
        hosts
            .iter()
            .all(|h| h.starts_with("https://ec2.") && !h.contains('*'))
    );
    assert_eq!(hosts.len(), DEFAULT_REGIONS.len());
    let ep = config::Endpoint {
        base: "http://127.0.0.1:4566".into(),
        authority: "127.0.0.1:4566".into(),
    };
    assert_eq!(allow_entry(&ep), "http://127.0.0.1:4566");
}

// ---------------------------------------------------------------------------------------
// Spot

#[test]
fn spot_requests_send_one_time_terminate_market_options_and_on_demand_sends_none() {
    let cfg = Config::parse(GOOD).unwrap();
    let market = |req: &CreateRequest| -> Vec<(String, String)> {
        let params = run_params(req, &launch(), &cfg.tags);
        params
            .into_iter()
            .filter(|(k, _)| k.starts_with("InstanceMarketOptions"))
            .collect()
    };
    assert!(
        market(&request(b"")).is_empty(),
        "on-demand: no market options"
    );
    let mut spot = request(b"");
    spot.placement.capacity = Capacity::Spot;
    let p = |k: &str, v: &str| (k.to_string(), v.to_string());
    assert_eq!(
        market(&spot),
        [
            p("InstanceMarketOptions.MarketType", "spot"),
            p(
                "InstanceMarketOptions.SpotOptions.SpotInstanceType",
                "one-time"
            ),
            p(
                "InstanceMarketOptions.SpotOptions.InstanceInterruptionBehavior",
                "terminate"
            ),
        ]
    );
    let on_demand = run_params(&request(b""), &launch(), &cfg.tags);
    let spot_params = run_params(&spot, &launch(), &cfg.tags);
    assert_ne!(
        client_token(&spot.name, &spot_params, &[]),
        client_token(&spot.name, &on_demand, &[]),
        "falling back to on-demand is a new launch, not a retry of the spot one"
    );
}

/// EC2's refusals of a spot launch for want of capacity are SpotCapacityUnavailable
/// (naming EC2's code); the same codes for an on-demand launch, and other refusals of a
/// spot launch, keep their own class and code.
#[test]
fn spot_capacity_refusals_are_quota_with_their_own_code() {
    let mut spot = request(b"");
    spot.placement.capacity = Capacity::Spot;
    let on_demand = request(b"");
    for (status, code) in [
        (500, "InsufficientInstanceCapacity"),
        (400, "SpotMaxPriceTooLow"),
        (400, "MaxSpotInstanceCountExceeded"),
    ] {
        let e = launch_error(&spot, &api_error(status, code));
        assert_eq!(e.class, ErrorClass::QuotaExceeded, "{code}");
        assert_eq!(e.code.as_deref(), Some(SPOT_CAPACITY_UNAVAILABLE), "{code}");
        assert!(
            e.message.contains(code) && e.message.contains("placement.capacity Spot"),
            "{}",
            e.message
        );
        let e = launch_error(&on_demand, &api_error(status, code));
        assert_eq!(
            (e.class, e.code.as_deref()),
            (ErrorClass::QuotaExceeded, Some(code)),
            "on-demand {code}"
        );
    }
    let e = launch_error(&spot, &api_error(400, "InvalidParameterCombination"));
    assert_eq!(
        (e.class, e.code.as_deref()),
        (ErrorClass::Permanent, Some("InvalidParameterCombination"))
    );
}

#[test]
fn a_reclaimed_spot_instance_is_interrupted_only_when_stopped_or_terminated() {
    let body = |state: &str, reason: &str, ip: &str| {
        format!(
            r#"<DescribeInstancesResponse xmlns="http://ec2.amazonaws.com/doc/2016-11-15/">
            <reservationSet><item><instancesSet><item>
              <instanceId>i-0123456789abcdef0</instanceId>
              <instanceState><code>32</code><name>{state}</name></instanceState>
              {ip}<launchTime>2024-05-01T12:00:00.000Z</launchTime>
              <stateReason><code>{reason}</code><message>{reason}: m</message></stateReason>
              <instanceLifecycle>spot</instanceLifecycle>
              <spotInstanceRequestId>sir-abcd1234</spotInstanceRequestId>
              <blockDeviceMapping><item><ebs><status>attached</status></ebs></item></blockDeviceMapping>
            </item></instancesSet></item></reservationSet></DescribeInstancesResponse>"#
        )
    };
    let read = |state: &str, reason: &str, ip: &str| {
        let page = wire::parse_instances(&body(state, reason, ip)).unwrap();
        let i = &page.instances[0];
        (i.clone(), to_instance("eu-west-1", i, IpAddress::Public))
    };
    let (raw, i) = read("shutting-down", "Server.SpotInstanceTermination", "");
    assert_eq!(
        (raw.lifecycle.as_str(), i.state, i.interrupted),
        ("spot", State::Terminated, true)
    );
    let (_, i) = read("stopped", "Server.SpotInstanceShutdown", "");
    assert_eq!((i.state, i.interrupted), (State::Stopped, true));
    let (_, i) = read("shutting-down", "Client.UserInitiatedShutdown", "");
    assert_eq!(
        (i.state, i.interrupted),
        (State::Terminated, false),
        "a delete"
    );
    // Restarted after a stop: the old reason may linger, the instance runs.
    let (_, i) = read(
        "running",
        "Server.SpotInstanceShutdown",
        "<ipAddress>54.1.2.3</ipAddress>",
    );
    assert_eq!((i.state, i.interrupted), (State::Running, false));
    let page = wire::parse_instances(DESCRIBE).unwrap();
    assert_eq!(
        (
            page.instances[0].lifecycle.as_str(),
            page.instances[0].state_reason.as_str()
        ),
        ("", ""),
        "on-demand, running"
    );
}

// ---------------------------------------------------------------------------------------
// spot prices

/// A DescribeSpotPriceHistory answer as the 2016-11-15 reference shapes it
/// (`spotPriceHistorySet/item`, `nextToken`): the latest Linux price of the type in the zone,
/// whatever else the answer holds; and what is not such an answer.
#[test]
fn reads_the_latest_spot_price() {
    let item = |kind: &str, zone: &str, product: &str, price: &str, at: &str| {
        format!(
            "<item><instanceType>{kind}</instanceType><productDescription>{product}</productDescription>\
             <spotPrice>{price}</spotPrice><timestamp>{at}</timestamp>\
             <availabilityZone>{zone}</availabilityZone></item>"
        )
    };
    let answer = |items: &[String], next: &str| {
        format!(
            "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<DescribeSpotPriceHistoryResponse \
             xmlns=\"http://ec2.amazonaws.com/doc/2016-11-15/\"><requestId>r-1</requestId>\
             <spotPriceHistorySet>{}</spotPriceHistorySet><nextToken>{next}</nextToken>\
             </DescribeSpotPriceHistoryResponse>",
            items.concat()
        )
    };
    let t1 = "2026-08-01T10:00:00.000Z";
    let t2 = "2026-08-01T11:30:00.000Z";
    let body = answer(
        &[
            item("t3.micro", "us-east-1a", "Linux/UNIX", "0.003100", t1),
            item("t3.micro", "us-east-1a", "Linux/UNIX", "0.003300", t2),
            item("t3.micro", "us-east-1a", "Windows", "0.009000", t2),
            item("t3.micro", "us-east-1b", "Linux/UNIX", "0.001000", t2),
            item("t3.small", "us-east-1a", "Linux/UNIX", "0.002000", t2),
        ],
        "tok-2",
    );
    let latest = |body: &str, zone: &str| wire::latest_spot_price(body, "t3.micro", zone).unwrap();
    assert_eq!(
        latest(&body, "us-east-1a"),
        (Some((t2.into(), "0.003300".into())), Some("tok-2".into()))
    );
    assert_eq!(latest(&body, "us-east-1c").0, None);
    // moto answers with the VPC product whatever was asked: still Linux.
    let moto = answer(
        &[item(
            "t3.micro",
            "us-east-1a",
            "Linux/UNIX (Amazon VPC)",
            "0.00001",
            t1,
        )],
        "",
    );
    assert_eq!(
        latest(&moto, "us-east-1a"),
        (Some((t1.into(), "0.00001".into())), None)
    );
    let empty = "<DescribeSpotPriceHistoryResponse><spotPriceHistorySet/><nextToken/></DescribeSpotPriceHistoryResponse>";
    assert_eq!(latest(empty, "us-east-1a"), (None, None));
    for bad in ["", "<html>gateway</html>", DESCRIBE] {
        assert!(
            wire::latest_spot_price(bad, "t3.micro", "us-east-1a").is_err(),
            "{bad:?}"
        );
    }
}
