//! Tests through real HTTP, the way a plugin sees the emulator: a token from the token
//! endpoint, then ARM calls with it, long-running operations polled through the URLs the
//! answers name.

use super::*;
use crate::control::{Emulator, Fault, FaultKind, FaultOp, Plant};
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper_util::rt::TokioIo;
use serde_json::{Value, json};

const SUB: &str = EMULATOR_SUBSCRIPTION;
const RG: &str = EMULATOR_RESOURCE_GROUP;
const COMPUTE: &str = "2025-04-01";
const NETWORK: &str = "2024-07-01";

struct Resp {
    status: u16,
    headers: axum::http::HeaderMap,
    body: Value,
}

impl Resp {
    fn code(&self) -> &str {
        self.body["error"]["code"].as_str().unwrap_or("")
    }
    fn header(&self, name: &str) -> &str {
        self.headers.get(name).and_then(|v| v.to_str().ok()).unwrap_or("")
    }
}

/// One HTTP/1 request to the emulator; `path` may be an absolute URL the emulator handed
/// out (an operation URL, a `nextLink`).
async fn raw(
    emu: &AzureEmulator,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &str,
) -> Resp {
    let path = path.strip_prefix(&emu.url()).unwrap_or(path);
    let stream = tokio::net::TcpStream::connect(emu.addr()).await.unwrap();
    let (mut sender, conn) =
        hyper::client::conn::http1::handshake(TokioIo::new(stream)).await.unwrap();
    tokio::spawn(conn);
    let mut req = hyper::Request::builder()
        .method(method)
        .uri(path.replace(' ', "%20"))
        .header("host", "management.azure.com");
    for (k, v) in headers {
        req = req.header(*k, *v);
    }
    let req = req.body(Full::new(Bytes::from(body.to_string()))).unwrap();
    let resp = sender.send_request(req).await.unwrap();
    let status = resp.status().as_u16();
    let headers = resp.headers().clone();
    let bytes = resp.into_body().collect().await.unwrap().to_bytes();
    let body = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
    Resp { status, headers, body }
}

fn form(pairs: &[(&str, &str)]) -> String {
    pairs
        .iter()
        .map(|(k, v)| format!("{k}={}", super::percent::encode(v)))
        .collect::<Vec<_>>()
        .join("&")
}

async fn token_request(emu: &AzureEmulator, tenant: &str, pairs: &[(&str, &str)]) -> Resp {
    let path = format!("/{tenant}/oauth2/v2.0/token");
    let ct = [("content-type", "application/x-www-form-urlencoded")];
    raw(emu, "POST", &path, &ct, &form(pairs)).await
}

async fn token(emu: &AzureEmulator) -> String {
    let r = token_request(
        emu,
        EMULATOR_TENANT,
        &[
            ("grant_type", "client_credentials"),
            ("client_id", EMULATOR_CLIENT_ID),
            ("client_secret", EMULATOR_CLIENT_SECRET),
            ("scope", MANAGEMENT_SCOPE),
        ],
    )
    .await;
    assert_eq!(r.status, 200, "{}", r.body);
    r.body["access_token"].as_str().unwrap().to_string()
}

/// An ARM call with a bearer token.
async fn arm(
    emu: &AzureEmulator,
    tok: &str,
    method: &str,
    path: &str,
    body: Option<Value>,
) -> Resp {
    let auth = format!("Bearer {tok}");
    let headers = [("authorization", auth.as_str()), ("content-type", "application/json")];
    raw(emu, method, path, &headers, &body.map(|b| b.to_string()).unwrap_or_default()).await
}

fn rg_path(rg: &str) -> String {
    format!("/subscriptions/{SUB}/resourceGroups/{rg}")
}

fn ip_path(name: &str) -> String {
    format!(
        "{}/providers/Microsoft.Network/publicIPAddresses/{name}?api-version={NETWORK}",
        rg_path(RG)
    )
}

fn nic_path(name: &str) -> String {
    format!(
        "{}/providers/Microsoft.Network/networkInterfaces/{name}?api-version={NETWORK}",
        rg_path(RG)
    )
}

fn vm_path(name: &str) -> String {
    format!(
        "{}/providers/Microsoft.Compute/virtualMachines/{name}?api-version={COMPUTE}",
        rg_path(RG)
    )
}

fn vm_sub(name: &str, sub: &str) -> String {
    format!(
        "{}/providers/Microsoft.Compute/virtualMachines/{name}/{sub}?api-version={COMPUTE}",
        rg_path(RG)
    )
}

fn id(kind: &str, name: &str) -> String {
    format!("/subscriptions/{SUB}/resourceGroups/{RG}/providers/{kind}/{name}")
}

fn marks(uid: &str) -> Value {
    let mut t = serde_json::Map::new();
    for (k, v) in
        [(crate::MARK_MANAGED, "true"), (crate::MARK_UID, uid), (crate::MARK_INSTALLATION, "inst")]
    {
        let (k, v) = tags::encode(k, v).unwrap();
        t.insert(k, v.into());
    }
    Value::Object(t)
}

fn ip_body(tags: &Value) -> Value {
    json!({
        "location": "westeurope", "tags": tags,
        "sku": {"name": "Standard", "tier": "Regional"},
        "properties": {"publicIPAllocationMethod": "Static", "publicIPAddressVersion": "IPv4"},
    })
}

fn nic_body(ip: Option<&str>, delete: &str, tags: &Value) -> Value {
    let mut cfg = json!({"name": "ipconfig1", "properties": {"subnet": {"id": AzureConfig::default().default_subnet()}}});
    if let Some(ip) = ip {
        cfg["properties"]["publicIPAddress"] = json!({"id": id("Microsoft.Network/publicIPAddresses", ip), "properties": {"deleteOption": delete}});
    }
    json!({"location": "westeurope", "tags": tags, "properties": {"ipConfigurations": [cfg]}})
}

fn vm_body(nic: &str, delete: &str, tags: &Value, custom: &str) -> Value {
    json!({
        "location": "westeurope", "tags": tags,
        "properties": {
            "hardwareProfile": {"vmSize": "Standard_B1s"},
            "storageProfile": {
                "imageReference": {"publisher": "Canonical", "offer": "ubuntu-24_04-lts", "sku": "server", "version": "latest"},
                "osDisk": {"createOption": "FromImage", "managedDisk": {"storageAccountType": "Standard_LRS"}, "deleteOption": delete},
            },
            "osProfile": {
                "computerName": "proxy", "adminUsername": "azureuser",
                "customData": data_encoding::BASE64.encode(custom.as_bytes()),
                "linuxConfiguration": {"disablePasswordAuthentication": true,
                    "ssh": {"publicKeys": [{"path": "/home/azureuser/.ssh/authorized_keys", "keyData": "ssh-ed25519 AAAA"}]}},
            },
            "networkProfile": {"networkInterfaces": [{"id": id("Microsoft.Network/networkInterfaces", nic),
                "properties": {"primary": true, "deleteOption": delete}}]},
        },
    })
}

fn spot(mut body: Value, policy: &str, max: f64) -> Value {
    body["properties"]["priority"] = "Spot".into();
    body["properties"]["evictionPolicy"] = policy.into();
    body["properties"]["billingProfile"] = json!({"maxPrice": max});
    body
}

/// Polls an `Azure-AsyncOperation` URL until the operation is over; the final status.
async fn wait(emu: &AzureEmulator, tok: &str, url: &str) -> Value {
    for _ in 0..20 {
        let r = arm(emu, tok, "GET", url, None).await;
        assert_eq!(r.status, 200, "{}", r.body);
        if r.body["status"] != "InProgress" {
            return r.body;
        }
        assert_eq!(r.header("retry-after"), "1");
    }
    panic!("operation {url} never ended");
}

/// IP, NIC and VM, each awaited: the VM runs.
async fn create_proxy(
    emu: &AzureEmulator,
    tok: &str,
    name: &str,
    delete: &str,
    tags: &Value,
) -> Resp {
    let r = arm(emu, tok, "PUT", &ip_path(&format!("{name}-ip")), Some(ip_body(tags))).await;
    assert_eq!(r.status, 201, "{}", r.body);
    wait(emu, tok, r.header("azure-asyncoperation")).await;
    let nic = nic_body(Some(&format!("{name}-ip")), delete, tags);
    let r = arm(emu, tok, "PUT", &nic_path(&format!("{name}-nic")), Some(nic)).await;
    assert_eq!(r.status, 201, "{}", r.body);
    wait(emu, tok, r.header("azure-asyncoperation")).await;
    let vm = vm_body(&format!("{name}-nic"), delete, tags, "#cloud-config\n");
    let r = arm(emu, tok, "PUT", &vm_path(name), Some(vm)).await;
    assert_eq!(r.status, 201, "{}", r.body);
    let done = wait(emu, tok, r.header("azure-asyncoperation")).await;
    assert_eq!(done["status"], "Succeeded", "{done}");
    r
}

fn start() -> AzureEmulator {
    AzureEmulator::start(AzureConfig::default())
}

fn power(view: &Value) -> String {
    view["statuses"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|s| s["code"].as_str())
        .find(|c| c.starts_with("PowerState/"))
        .unwrap_or("")
        .to_string()
}

fn names(emu: &AzureEmulator) -> Vec<String> {
    let mut n: Vec<String> = emu.resources().into_iter().map(|r| r.name).collect();
    n.sort();
    n
}

#[tokio::test]
async fn tokens_are_issued_for_the_right_secret_or_assertion_only() {
    let emu = start();
    let ok = [
        ("grant_type", "client_credentials"),
        ("client_id", EMULATOR_CLIENT_ID),
        ("client_secret", EMULATOR_CLIENT_SECRET),
        ("scope", MANAGEMENT_SCOPE),
    ];
    let r = token_request(&emu, EMULATOR_TENANT, &ok).await;
    assert_eq!(r.status, 200);
    assert_eq!(
        (r.body["token_type"].as_str(), r.body["expires_in"].as_u64()),
        (Some("Bearer"), Some(3599))
    );
    assert_eq!(r.body["access_token"].as_str().unwrap().split('.').count(), 3, "JWT-shaped");
    let mut wrong = ok;
    wrong[2].1 = "not-the-secret";
    let r = token_request(&emu, EMULATOR_TENANT, &wrong).await;
    assert_eq!((r.status, r.body["error"].as_str()), (401, Some("invalid_client")));
    assert!(
        r.body["error_description"]
            .as_str()
            .unwrap()
            .starts_with("AADSTS7000215: Invalid client secret")
    );
    assert_eq!(r.body["error_codes"], json!([7000215]));
    let mut unknown = ok;
    unknown[1].1 = "99999999-0000-4000-8000-000000000000";
    let r = token_request(&emu, EMULATOR_TENANT, &unknown).await;
    assert_eq!((r.status, r.body["error"].as_str()), (400, Some("unauthorized_client")));
    let mut scope = ok;
    scope[3].1 = "https://management.azure.com/user_impersonation";
    let r = token_request(&emu, EMULATOR_TENANT, &scope).await;
    assert_eq!(r.body["error"], "invalid_scope");
    let r = token_request(&emu, "00000000-0000-0000-0000-000000000000", &ok).await;
    assert_eq!(r.body["error_codes"], json!([90002]));
    // Workload identity: any non-empty assertion of the right type, for a federated client.
    let assertion = |a: &'static str, t: &'static str| {
        [
            ("grant_type", "client_credentials"),
            ("client_id", EMULATOR_FEDERATED_CLIENT_ID),
            ("client_assertion_type", t),
            ("client_assertion", a),
            ("scope", MANAGEMENT_SCOPE),
        ]
    };
    let r =
        token_request(&emu, EMULATOR_TENANT, &assertion("eyJ.a.b", auth::CLIENT_ASSERTION_TYPE))
            .await;
    assert_eq!(r.status, 200, "{}", r.body);
    let federated = r.body["access_token"].as_str().unwrap().to_string();
    let r = token_request(&emu, EMULATOR_TENANT, &assertion("", auth::CLIENT_ASSERTION_TYPE)).await;
    assert_eq!((r.status, r.body["error"].as_str()), (401, Some("invalid_client")));
    let grant_type = "urn:ietf:params:oauth:grant-type:jwt-bearer";
    let r = token_request(&emu, EMULATOR_TENANT, &assertion("eyJ.a.b", grant_type)).await;
    assert_eq!(r.status, 400, "the client assertion type is RFC 7523's, not the grant type");
    // The secret client cannot use an assertion.
    let mut a = assertion("eyJ.a.b", auth::CLIENT_ASSERTION_TYPE);
    a[1].1 = EMULATOR_CLIENT_ID;
    assert_eq!(token_request(&emu, EMULATOR_TENANT, &a).await.status, 401);
    // Both tokens work on ARM, until they expire.
    let list = format!("/subscriptions/{SUB}/resources?api-version=2021-04-01");
    assert_eq!(arm(&emu, &federated, "GET", &list, None).await.status, 200);
    assert_eq!(emu.token_grants(), 2);
    emu.expire_tokens();
    let r = arm(&emu, &federated, "GET", &list, None).await;
    assert_eq!((r.status, r.code()), (401, "ExpiredAuthenticationToken"));
}

#[tokio::test]
async fn arm_wants_an_issued_bearer_token() {
    let emu = start();
    let list = format!("/subscriptions/{SUB}/resources?api-version=2021-04-01");
    let r = raw(&emu, "GET", &list, &[], "").await;
    assert_eq!((r.status, r.code()), (401, "AuthenticationFailed"));
    let challenge = r.header("www-authenticate");
    assert!(challenge.starts_with("Bearer authorization_uri=\""), "{challenge}");
    assert!(
        challenge.contains(&format!("/{EMULATOR_TENANT}\""))
            && challenge.contains("error=\"invalid_token\"")
    );
    let r = raw(&emu, "GET", &list, &[("authorization", "Basic dXNlcjpwdw==")], "").await;
    assert_eq!((r.status, r.code()), (401, "AuthenticationFailedInvalidHeader"));
    let r = arm(&emu, "made-up", "GET", &list, None).await;
    assert_eq!((r.status, r.code()), (401, "InvalidAuthenticationToken"));
    assert!(!r.header("www-authenticate").is_empty());
    // The token endpoint and the price list need no token; ARM answers carry request ids.
    assert_eq!(raw(&emu, "GET", "/api/retail/prices", &[], "").await.status, 200);
    let tok = token(&emu).await;
    let r = arm(&emu, &tok, "GET", &list, None).await;
    assert_eq!(r.status, 200);
    assert!(!r.header("x-ms-request-id").is_empty());
}

#[tokio::test]
async fn api_version_subscription_and_group_are_checked_as_arm_does() {
    let emu = start();
    let tok = token(&emu).await;
    let vm = format!("{}/providers/Microsoft.Compute/virtualMachines/x", rg_path(RG));
    let r = arm(&emu, &tok, "GET", &vm, None).await;
    assert_eq!((r.status, r.code()), (400, "MissingApiVersionParameter"));
    assert_eq!(
        r.body["error"]["message"],
        "The api-version query parameter (?api-version=) is required for all requests."
    );
    let r = arm(&emu, &tok, "GET", &format!("{vm}?api-version=2099-01-01"), None).await;
    assert_eq!((r.status, r.code()), (400, "NoRegisteredProviderFound"));
    assert!(r.body["error"]["message"].as_str().unwrap().contains("2025-04-01"));
    let list = format!("/subscriptions/{SUB}/resources?api-version=2099-01-01");
    let r = arm(&emu, &tok, "GET", &list, None).await;
    assert_eq!((r.status, r.code()), (400, "InvalidApiVersionParameter"));
    let r = arm(&emu, &tok, "GET", &vm_path("nope"), None).await;
    assert_eq!((r.status, r.code()), (404, "ResourceNotFound"));
    assert_eq!(
        r.body["error"]["message"],
        format!(
            "The Resource 'Microsoft.Compute/virtualMachines/nope' under resource group '{RG}' was not found. For more details please go to https://aka.ms/ARMResourceNotFoundFix"
        )
    );
    let r = arm(&emu, &tok, "GET", &vm_path("x").replace(RG, "no-such-rg"), None).await;
    assert_eq!((r.status, r.code()), (404, "ResourceGroupNotFound"));
    let r = arm(
        &emu,
        &tok,
        "GET",
        &vm_path("x").replace(SUB, "00000000-0000-0000-0000-000000000000"),
        None,
    )
    .await;
    assert_eq!((r.status, r.code()), (404, "SubscriptionNotFound"));
    // Namespaces and types match case-insensitively; unknown types do not.
    let lower = vm_path("nope")
        .replace("Microsoft.Compute/virtualMachines", "microsoft.compute/VIRTUALMACHINES");
    assert_eq!(arm(&emu, &tok, "GET", &lower, None).await.code(), "ResourceNotFound");
    let r = arm(&emu, &tok, "GET", &vm_path("x").replace("virtualMachines", "teapots"), None).await;
    assert_eq!((r.status, r.code()), (400, "InvalidResourceType"));
    // The contract's mark keys are not valid tag names.
    let mut body = ip_body(&json!({}));
    body["tags"] = json!({ crate::MARK_UID: "u" });
    let r = arm(&emu, &tok, "PUT", &ip_path("bad-tags"), Some(body)).await;
    assert_eq!((r.status, r.code()), (400, "InvalidTagNameCharacters"));
    assert!(emu.resources().is_empty());
}

#[tokio::test]
async fn a_proxy_is_created_through_its_operations_to_running() {
    let emu = start();
    let tok = token(&emu).await;
    let tags = marks("uid-1");
    // The public IP: 201 Updating behind an operation, its address once that succeeds.
    let r = arm(&emu, &tok, "PUT", &ip_path("p1-ip"), Some(ip_body(&tags))).await;
    assert_eq!(r.status, 201);
    assert_eq!(r.body["properties"]["provisioningState"], "Updating");
    assert!(r.body["properties"]["ipAddress"].is_null());
    let op = r.header("azure-asyncoperation").to_string();
    assert!(
        op.starts_with(&format!(
            "{}/subscriptions/{SUB}/providers/Microsoft.Network/locations/westeurope/operations/",
            emu.url()
        )),
        "{op}"
    );
    assert_eq!(r.header("retry-after"), "1");
    assert_eq!(arm(&emu, &tok, "GET", &op, None).await.body, json!({"status": "InProgress"}));
    assert_eq!(arm(&emu, &tok, "GET", &op, None).await.body, json!({"status": "Succeeded"}));
    let ip = arm(&emu, &tok, "GET", &ip_path("p1-ip"), None).await.body;
    assert_eq!(ip["properties"]["provisioningState"], "Succeeded");
    assert_eq!(ip["properties"]["ipAddress"], "198.51.100.10");
    assert_eq!(ip["sku"], json!({"name": "Standard", "tier": "Regional"}));
    // The NIC on it, the public IP's deleteOption set through the NIC.
    let r =
        arm(&emu, &tok, "PUT", &nic_path("p1-nic"), Some(nic_body(Some("p1-ip"), "Delete", &tags)))
            .await;
    assert_eq!(r.status, 201, "{}", r.body);
    let cfg = &r.body["properties"]["ipConfigurations"][0];
    assert_eq!(cfg["properties"]["privateIPAddress"], "10.0.0.4");
    assert_eq!(
        cfg["properties"]["publicIPAddress"]["id"],
        id("Microsoft.Network/publicIPAddresses", "p1-ip")
    );
    wait(&emu, &tok, r.header("azure-asyncoperation")).await;
    let ip = arm(&emu, &tok, "GET", &ip_path("p1-ip"), None).await.body;
    assert_eq!(ip["properties"]["deleteOption"], "Delete");
    assert_eq!(
        ip["properties"]["ipConfiguration"]["id"],
        format!(
            "{}/ipConfigurations/ipconfig1",
            id("Microsoft.Network/networkInterfaces", "p1-nic")
        )
    );
    // The VM: 201 Creating, starting, then running after its operation.
    let user_data = "#cloud-config\nwrite_files: []\n";
    let r =
        arm(&emu, &tok, "PUT", &vm_path("p1"), Some(vm_body("p1-nic", "Delete", &tags, user_data)))
            .await;
    assert_eq!(r.status, 201, "{}", r.body);
    assert_eq!(r.body["properties"]["provisioningState"], "Creating");
    assert!(r.body["properties"]["osProfile"].get("customData").is_none(), "never returned");
    let op = r.header("azure-asyncoperation").to_string();
    assert!(op.contains("/providers/Microsoft.Compute/locations/westeurope/operations/"));
    let view = arm(&emu, &tok, "GET", &vm_sub("p1", "instanceView"), None).await.body;
    assert_eq!(power(&view), "PowerState/starting");
    let status = arm(&emu, &tok, "GET", &op, None).await.body;
    assert_eq!(
        (status["status"].as_str(), status["name"].is_string()),
        (Some("Succeeded"), true),
        "{status}"
    );
    assert!(status["endTime"].is_string());
    let vm =
        arm(&emu, &tok, "GET", &format!("{}&$expand=instanceView", vm_path("p1")), None).await.body;
    assert_eq!(vm["properties"]["provisioningState"], "Succeeded");
    assert_eq!(power(&vm["properties"]["instanceView"]), "PowerState/running");
    assert_eq!(vm["tags"], tags);
    let disk_id = vm["properties"]["storageProfile"]["osDisk"]["managedDisk"]["id"]
        .as_str()
        .unwrap()
        .to_string();
    assert!(disk_id.contains("/providers/Microsoft.Compute/disks/p1_OsDisk_1_"), "{disk_id}");
    let nic = arm(&emu, &tok, "GET", &nic_path("p1-nic"), None).await.body;
    assert_eq!(
        nic["properties"]["virtualMachine"]["id"],
        id("Microsoft.Compute/virtualMachines", "p1")
    );
    // The dump: one instance with its address, decoded user data and marks; its parts.
    let dump = emu.dump();
    assert_eq!(dump.instances.len(), 1);
    let i = &dump.instances[0];
    assert_eq!(
        (i.id.as_str(), i.state.as_str(), i.ip.as_str()),
        (id("Microsoft.Compute/virtualMachines", "p1").as_str(), "running", "198.51.100.10")
    );
    assert_eq!(i.user_data, user_data.as_bytes());
    assert!(i.labels.contains(&(crate::MARK_UID.to_string(), "uid-1".to_string())));
    assert_eq!(dump.secondary.len(), 3, "{:?}", dump.secondary);
    assert!(dump.secondary.iter().all(|s| s.attached_to.as_deref() == Some(i.id.as_str())));
}

#[tokio::test]
async fn puts_are_idempotent_by_name() {
    let emu = start();
    let tok = token(&emu).await;
    let tags = marks("uid-2");
    create_proxy(&emu, &tok, "p2", "Delete", &tags).await;
    let r = arm(&emu, &tok, "PUT", &ip_path("p2-ip"), Some(ip_body(&tags))).await;
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(r.body["properties"]["ipAddress"], "198.51.100.10", "the address stays");
    let status = arm(&emu, &tok, "GET", r.header("azure-asyncoperation"), None).await;
    assert_eq!(status.body["status"], "Succeeded");
    let r =
        arm(&emu, &tok, "PUT", &nic_path("p2-nic"), Some(nic_body(Some("p2-ip"), "Delete", &tags)))
            .await;
    assert_eq!(r.status, 200, "{}", r.body);
    let r = arm(
        &emu,
        &tok,
        "PUT",
        &vm_path("p2"),
        Some(vm_body("p2-nic", "Delete", &tags, "#cloud-config\n")),
    )
    .await;
    assert_eq!(
        (r.status, r.body["properties"]["provisioningState"].as_str()),
        (200, Some("Succeeded"))
    );
    let r =
        arm(&emu, &tok, "PUT", &vm_path("p2"), Some(vm_body("p2-nic", "Delete", &tags, "other")))
            .await;
    assert_eq!((r.status, r.code()), (409, "PropertyChangeNotAllowed"));
    assert_eq!(emu.dump().instances.len(), 1);
    assert_eq!(emu.resources().len(), 4);
}

#[tokio::test]
async fn references_and_deletes_follow_arm_rules() {
    let emu = start();
    let tok = token(&emu).await;
    let none = json!({});
    // A NIC naming a missing public IP or subnet, a VM naming a missing NIC.
    let r = arm(
        &emu,
        &tok,
        "PUT",
        &nic_path("n0"),
        Some(nic_body(Some("missing-ip"), "Delete", &none)),
    )
    .await;
    assert_eq!((r.status, r.code()), (400, "InvalidResourceReference"));
    assert!(
        r.body["error"]["message"].as_str().unwrap().contains("missing-ip referenced by resource")
    );
    assert_eq!(r.body["error"]["details"], json!([]));
    let mut bad_subnet = nic_body(None, "Delete", &none);
    bad_subnet["properties"]["ipConfigurations"][0]["properties"]["subnet"]["id"] =
        "/subscriptions/x/y".into();
    assert_eq!(
        arm(&emu, &tok, "PUT", &nic_path("n0"), Some(bad_subnet)).await.code(),
        "InvalidResourceReference"
    );
    let r =
        arm(&emu, &tok, "PUT", &vm_path("v0"), Some(vm_body("missing-nic", "Delete", &none, "")))
            .await;
    assert_eq!((r.status, r.code()), (404, "NotFound"));
    assert!(emu.resources().is_empty(), "nothing was made");

    // Everything with deleteOption Delete: deleting the VM takes its parts along.
    create_proxy(&emu, &tok, "all", "Delete", &none).await;
    let r = arm(&emu, &tok, "DELETE", &ip_path("all-ip"), None).await;
    assert_eq!((r.status, r.code()), (400, "PublicIPAddressCannotBeDeleted"));
    let r = arm(&emu, &tok, "DELETE", &nic_path("all-nic"), None).await;
    assert_eq!((r.status, r.code()), (400, "NicInUse"));
    let r =
        arm(&emu, &tok, "PUT", &vm_path("thief"), Some(vm_body("all-nic", "Delete", &none, "")))
            .await;
    assert_eq!((r.status, r.code()), (400, "NicInUse"));
    let r = arm(&emu, &tok, "DELETE", &vm_path("all"), None).await;
    assert_eq!(r.status, 202);
    assert!(r.header("location").contains("/operationResults/"));
    let op = r.header("azure-asyncoperation").to_string();
    let vm = arm(&emu, &tok, "GET", &vm_path("all"), None).await.body;
    assert_eq!(vm["properties"]["provisioningState"], "Deleting");
    assert_eq!(wait(&emu, &tok, &op).await["status"], "Succeeded");
    assert_eq!(arm(&emu, &tok, "GET", &vm_path("all"), None).await.status, 404);
    assert!(emu.resources().is_empty(), "{:?}", names(&emu));
    assert_eq!(arm(&emu, &tok, "DELETE", &vm_path("all"), None).await.status, 204, "gone: 204");

    // Detach (the default): the VM goes alone; its parts stay, detached, and go one by one.
    create_proxy(&emu, &tok, "keep", "Detach", &none).await;
    let r = arm(&emu, &tok, "DELETE", &vm_path("keep"), None).await;
    wait(&emu, &tok, r.header("azure-asyncoperation")).await;
    let left = emu.resources();
    let mut kinds: Vec<ResourceKind> = left.iter().map(|r| r.kind).collect();
    kinds.sort();
    assert_eq!(kinds, [ResourceKind::PublicIp, ResourceKind::Nic, ResourceKind::Disk], "{left:?}");
    let nic = left.iter().find(|r| r.kind == ResourceKind::Nic).unwrap();
    assert_eq!(nic.attached_to, None);
    let disk = left.iter().find(|r| r.kind == ResourceKind::Disk).unwrap().clone();
    assert_eq!(disk.attached_to, None);
    assert!(disk.tags.is_empty(), "a VM's OS disk does not inherit its tags");
    let r = arm(&emu, &tok, "DELETE", &ip_path("keep-ip"), None).await;
    assert_eq!(r.code(), "PublicIPAddressCannotBeDeleted", "still on its NIC");
    let r = arm(&emu, &tok, "DELETE", &nic_path("keep-nic"), None).await;
    assert_eq!(r.status, 202);
    wait(&emu, &tok, r.header("azure-asyncoperation")).await;
    let r = arm(&emu, &tok, "DELETE", &ip_path("keep-ip"), None).await;
    assert_eq!(r.status, 202, "{}", r.body);
    let disk_path = format!("{}?api-version=2024-03-02", disk.id);
    let d = arm(&emu, &tok, "GET", &disk_path, None).await;
    assert_eq!(d.body["properties"]["diskState"], "Unattached");
    let r = arm(&emu, &tok, "DELETE", &disk_path, None).await;
    assert_eq!(r.status, 202);
    emu.finish_deletes();
    assert!(emu.resources().is_empty(), "{:?}", names(&emu));
}

#[tokio::test]
async fn lists_by_tag_page_with_next_links() {
    let emu = AzureEmulator::start(AzureConfig {
        page_size: 2,
        list_page_size: 2,
        ..AzureConfig::default()
    });
    let tok = token(&emu).await;
    for n in 0..5 {
        let tags = marks(&format!("uid-{n}"));
        let r = arm(&emu, &tok, "PUT", &ip_path(&format!("ip-{n}")), Some(ip_body(&tags))).await;
        assert_eq!(r.status, 201);
    }
    let other = json!({"owner": "someone-else"});
    arm(&emu, &tok, "PUT", &ip_path("foreign"), Some(ip_body(&other))).await;
    let filter = super::percent::encode("tagName eq 'egress-installation' and tagValue eq 'inst'");
    let mut url = format!("/subscriptions/{SUB}/resources?$filter={filter}&api-version=2021-04-01");
    let (mut seen, mut pages) = (Vec::new(), 0);
    loop {
        let r = arm(&emu, &tok, "GET", &url, None).await;
        assert_eq!(r.status, 200, "{}", r.body);
        pages += 1;
        for v in r.body["value"].as_array().unwrap() {
            assert_eq!(v["type"], "Microsoft.Network/publicIPAddresses");
            assert!(v.get("tags").is_none(), "a tag name and value filter returns no tags");
            seen.push(v["name"].as_str().unwrap().to_string());
        }
        match r.body["nextLink"].as_str() {
            Some(next) => {
                assert!(next.starts_with(&emu.url()) && next.contains("$skiptoken="), "{next}");
                url = next.to_string();
            }
            None => break,
        }
    }
    assert_eq!((pages, seen.len()), (3, 5), "{seen:?}");
    // By tag name only, tags come back; $top makes pages of one.
    let by_name = format!(
        "/subscriptions/{SUB}/resources?$filter={}&$top=1&api-version=2021-04-01",
        super::percent::encode("tagName eq 'owner'")
    );
    let r = arm(&emu, &tok, "GET", &by_name, None).await;
    assert_eq!(r.body["value"].as_array().unwrap().len(), 1);
    assert_eq!(r.body["value"][0]["tags"], other);
    assert!(r.body.get("nextLink").is_none());
    // A tag filter combined with anything else is refused, as ARM does.
    let mixed = super::percent::encode(
        "tagName eq 'owner' and resourceType eq 'Microsoft.Network/publicIPAddresses'",
    );
    let r = arm(
        &emu,
        &tok,
        "GET",
        &format!("/subscriptions/{SUB}/resources?$filter={mixed}&api-version=2021-04-01"),
        None,
    )
    .await;
    assert_eq!((r.status, r.code()), (400, "InvalidFilterInQueryString"));
    // Scoped to a resource group; and the typed list of a group pages too.
    let r = arm(
        &emu,
        &tok,
        "GET",
        &format!("{}/resources?api-version=2021-04-01", rg_path("egress-rg-us")),
        None,
    )
    .await;
    assert_eq!(r.body["value"], json!([]));
    let typed = format!(
        "{}/providers/Microsoft.Network/publicIPAddresses?api-version={NETWORK}",
        rg_path(RG)
    );
    let r = arm(&emu, &tok, "GET", &typed, None).await;
    assert_eq!(r.body["value"].as_array().unwrap().len(), 2);
    let next = r.body["nextLink"].as_str().unwrap().to_string();
    let r = arm(&emu, &tok, "GET", &next, None).await;
    assert_eq!(r.body["value"][0]["properties"]["publicIPAllocationMethod"], "Static");
    // VMs: the typed list of a group.
    for n in 0..3 {
        emu.plant(Plant { name: format!("vm-{n}"), managed: true, ..Plant::default() });
    }
    let vms = format!(
        "{}/providers/Microsoft.Compute/virtualMachines?api-version={COMPUTE}",
        rg_path(RG)
    );
    let r = arm(&emu, &tok, "GET", &vms, None).await;
    assert_eq!(r.body["value"].as_array().unwrap().len(), 2);
    assert!(r.body["value"][0]["properties"].get("instanceView").is_none());
    let r = arm(&emu, &tok, "GET", r.body["nextLink"].as_str().unwrap(), None).await;
    assert_eq!(r.body["value"][0]["name"], "vm-2");
    assert!(r.body.get("nextLink").is_none());
    // With `$expand=instanceView`, each VM carries its instance view, on every page.
    let r = arm(&emu, &tok, "GET", &format!("{vms}&$expand=instanceView"), None).await;
    let view = &r.body["value"][0]["properties"]["instanceView"];
    assert_eq!(view["statuses"][1]["code"], "PowerState/running", "{view}");
    let r = arm(&emu, &tok, "GET", r.body["nextLink"].as_str().unwrap(), None).await;
    assert_eq!(
        r.body["value"][0]["properties"]["instanceView"]["statuses"][0]["code"],
        "ProvisioningState/succeeded"
    );
}

#[tokio::test]
async fn throttling_answers_429_with_retry_after_and_remaining_headers() {
    let emu = start();
    let tok = token(&emu).await;
    let list = format!("/subscriptions/{SUB}/resources?api-version=2021-04-01");
    let r = arm(&emu, &tok, "GET", &list, None).await;
    assert_eq!(
        r.header("x-ms-ratelimit-remaining-subscription-reads"),
        "11999",
        "ARM's hourly reads"
    );
    emu.set_rate_limit(Some(RateLimit { per_hour: 3600, burst: 2 }));
    let r = arm(&emu, &tok, "GET", &list, None).await;
    assert_eq!(r.header("x-ms-ratelimit-remaining-subscription-reads"), "1");
    assert_eq!(
        arm(&emu, &tok, "GET", &list, None)
            .await
            .header("x-ms-ratelimit-remaining-subscription-reads"),
        "0"
    );
    let r = arm(&emu, &tok, "GET", &list, None).await;
    assert_eq!((r.status, r.code()), (429, "SubscriptionRequestsThrottled"));
    assert_eq!(r.header("retry-after"), "1");
    assert_eq!(r.header("x-ms-ratelimit-remaining-subscription-reads"), "0");
    // Writes have a bucket of their own.
    let r = arm(&emu, &tok, "PUT", &ip_path("w"), Some(ip_body(&json!({})))).await;
    assert_eq!(r.status, 201);
    assert_eq!(r.header("x-ms-ratelimit-remaining-subscription-writes"), "1");
    assert!(r.headers.get("x-ms-ratelimit-remaining-subscription-reads").is_none());
    assert_eq!(emu.stats().rate_limited, 1);
    tokio::time::sleep(std::time::Duration::from_millis(1100)).await;
    assert_eq!(arm(&emu, &tok, "GET", &list, None).await.status, 200, "refilled");
}

#[tokio::test]
async fn spot_vms_are_evicted_per_their_policy() {
    let emu = start();
    let tok = token(&emu).await;
    let none = json!({});
    // evictionPolicy Delete: Deleting, then gone with every part marked Delete.
    for part in ["ip", "nic"] {
        let (path, body) = match part {
            "ip" => (ip_path("s1-ip"), ip_body(&none)),
            _ => (nic_path("s1-nic"), nic_body(Some("s1-ip"), "Delete", &none)),
        };
        let r = arm(&emu, &tok, "PUT", &path, Some(body)).await;
        wait(&emu, &tok, r.header("azure-asyncoperation")).await;
    }
    let body = spot(vm_body("s1-nic", "Delete", &none, ""), "Delete", 0.01);
    let r = arm(&emu, &tok, "PUT", &vm_path("s1"), Some(body)).await;
    assert_eq!(r.status, 201, "{}", r.body);
    wait(&emu, &tok, r.header("azure-asyncoperation")).await;
    let vm = arm(&emu, &tok, "GET", &vm_path("s1"), None).await.body;
    assert_eq!(
        (vm["properties"]["priority"].as_str(), vm["properties"]["evictionPolicy"].as_str()),
        (Some("Spot"), Some("Delete"))
    );
    assert_eq!(vm["properties"]["billingProfile"]["maxPrice"], 0.01);
    assert_eq!(emu.spot_instances(), [id("Microsoft.Compute/virtualMachines", "s1")]);
    assert!(emu.evict("s1"));
    let vm =
        arm(&emu, &tok, "GET", &format!("{}&$expand=instanceView", vm_path("s1")), None).await.body;
    assert_eq!(vm["properties"]["provisioningState"], "Deleting");
    assert_eq!(power(&vm["properties"]["instanceView"]), "PowerState/deallocating");
    assert_eq!(arm(&emu, &tok, "GET", &vm_path("s1"), None).await.status, 404);
    assert!(emu.resources().is_empty(), "{:?}", names(&emu));

    // evictionPolicy Deallocate, through the API's simulateEviction: deallocated, kept.
    create_proxy(&emu, &tok, "s2", "Delete", &none).await;
    let r = arm(&emu, &tok, "POST", &vm_sub("s2", "simulateEviction"), None).await;
    assert_eq!((r.status, r.code()), (409, "OperationNotAllowed"), "a regular VM");
    assert!(emu.reclaim("s2").is_err());
    arm(&emu, &tok, "DELETE", &vm_path("s2"), None).await;
    emu.finish_deletes();
    for part in ["ip", "nic"] {
        let (path, body) = match part {
            "ip" => (ip_path("s3-ip"), ip_body(&none)),
            _ => (nic_path("s3-nic"), nic_body(Some("s3-ip"), "Delete", &none)),
        };
        arm(&emu, &tok, "PUT", &path, Some(body)).await;
    }
    let body = spot(vm_body("s3-nic", "Delete", &none, ""), "Deallocate", -1.0);
    let r = arm(&emu, &tok, "PUT", &vm_path("s3"), Some(body)).await;
    wait(&emu, &tok, r.header("azure-asyncoperation")).await;
    let r = arm(&emu, &tok, "POST", &vm_sub("s3", "simulateEviction"), None).await;
    assert_eq!(r.status, 204, "{}", r.body);
    let view = arm(&emu, &tok, "GET", &vm_sub("s3", "instanceView"), None).await.body;
    assert_eq!(power(&view), "PowerState/deallocated");
    assert_eq!(emu.dump().instances[0].state, "deallocated");
    // The shared control surface reclaims too.
    let r = raw(
        &emu,
        "POST",
        "/_emulator/reclaim",
        &[("content-type", "application/json")],
        r#"{"id": "nope"}"#,
    )
    .await;
    assert_eq!(r.status, 404);
}

#[tokio::test]
async fn spot_capacity_can_be_refused() {
    let emu = start();
    let tok = token(&emu).await;
    let none = json!({});
    for n in ["a", "b", "c"] {
        arm(&emu, &tok, "PUT", &ip_path(&format!("{n}-ip")), Some(ip_body(&none))).await;
        arm(
            &emu,
            &tok,
            "PUT",
            &nic_path(&format!("{n}-nic")),
            Some(nic_body(Some(&format!("{n}-ip")), "Delete", &none)),
        )
        .await;
    }
    // No capacity: the PUT itself answers SkuNotAvailable and makes nothing.
    let ct = [("content-type", "application/json")];
    assert_eq!(
        raw(&emu, "POST", "/_emulator/spot-capacity", &ct, r#"{"available": false}"#).await.status,
        204
    );
    let r = arm(
        &emu,
        &tok,
        "PUT",
        &vm_path("a"),
        Some(spot(vm_body("a-nic", "Delete", &none, ""), "Delete", -1.0)),
    )
    .await;
    assert_eq!((r.status, r.code()), (409, "SkuNotAvailable"));
    assert!(
        r.body["error"]["message"]
            .as_str()
            .unwrap()
            .contains("Following SKUs have failed for Capacity Restrictions: Standard_B1s")
    );
    assert!(emu.dump().instances.is_empty());
    let r =
        arm(&emu, &tok, "PUT", &vm_path("a"), Some(vm_body("a-nic", "Delete", &none, ""))).await;
    assert_eq!(r.status, 201, "regular VMs are untouched");
    // Accepted, then failed in allocation: the VM stays, Failed, until deleted.
    emu.refuse_spot(Some(SpotRefusal::Overconstrained));
    let r = arm(
        &emu,
        &tok,
        "PUT",
        &vm_path("b"),
        Some(spot(vm_body("b-nic", "Delete", &none, ""), "Delete", -1.0)),
    )
    .await;
    assert_eq!(r.status, 201);
    let done = wait(&emu, &tok, r.header("azure-asyncoperation")).await;
    assert_eq!(
        (done["status"].as_str(), done["error"]["code"].as_str()),
        (Some("Failed"), Some("OverconstrainedAllocationRequest"))
    );
    let vm =
        arm(&emu, &tok, "GET", &format!("{}&$expand=instanceView", vm_path("b")), None).await.body;
    assert_eq!(vm["properties"]["provisioningState"], "Failed");
    let codes = vm["properties"]["instanceView"]["statuses"][0]["code"].as_str().unwrap();
    assert_eq!(codes, "ProvisioningState/failed/OverconstrainedAllocationRequest");
    // The Azure-only route picks the refusal over HTTP.
    let r = raw(&emu, "POST", "/_emulator/spot-refusal", &ct, r#"{"refuse": "AllocationFailed"}"#)
        .await;
    assert_eq!(r.status, 204);
    let r = arm(
        &emu,
        &tok,
        "PUT",
        &vm_path("b"),
        Some(spot(vm_body("b-nic", "Delete", &none, ""), "Delete", -1.0)),
    )
    .await;
    assert_eq!(r.status, 200, "a re-PUT of a failed VM retries its creation");
    let done = wait(&emu, &tok, r.header("azure-asyncoperation")).await;
    assert_eq!(done["error"]["code"], "AllocationFailed");
    // A max price under the Spot price of the price list is refused.
    emu.refuse_spot(None);
    let r = arm(
        &emu,
        &tok,
        "PUT",
        &vm_path("c"),
        Some(spot(vm_body("c-nic", "Delete", &none, ""), "Delete", 0.001)),
    )
    .await;
    assert_eq!((r.status, r.code()), (409, "OperationNotAllowed"));
    assert!(r.body["error"]["message"].as_str().unwrap().contains("'0.0025' USD"), "{}", r.body);
}

#[tokio::test]
async fn retail_prices_come_from_the_config() {
    let emu = AzureEmulator::start(AzureConfig { prices_page_size: 2, ..AzureConfig::default() });
    let filter = super::percent::encode(
        "serviceName eq 'Virtual Machines' and armRegionName eq 'westeurope' and armSkuName eq 'Standard_B1s' and priceType eq 'Consumption'",
    );
    let r = raw(&emu, "GET", &format!("/api/retail/prices?$filter={filter}"), &[], "").await;
    assert_eq!(r.status, 200);
    assert_eq!(
        (r.body["BillingCurrency"].as_str(), r.body["Count"].as_u64()),
        (Some("USD"), Some(2))
    );
    let items = r.body["Items"].as_array().unwrap();
    let linux = items.iter().find(|i| i["productName"] == "Virtual Machines BS Series").unwrap();
    assert_eq!(
        (linux["retailPrice"].as_f64(), linux["skuName"].as_str()),
        (Some(0.0124), Some("B1s"))
    );
    assert_eq!(
        (linux["unitOfMeasure"].as_str(), linux["armSkuName"].as_str()),
        (Some("1 Hour"), Some("Standard_B1s"))
    );
    // Three meters match; the third is on the next page.
    let next = r.body["NextPageLink"].as_str().unwrap().to_string();
    assert!(next.contains("$skip=2"), "{next}");
    let r = raw(&emu, "GET", &next, &[], "").await;
    let spot = &r.body["Items"][0];
    assert_eq!(
        (spot["skuName"].as_str(), spot["retailPrice"].as_f64()),
        (Some("B1s Spot"), Some(0.0025))
    );
    assert!(r.body["NextPageLink"].is_null());
    let none = super::percent::encode("armSkuName eq 'Standard_Nope'");
    let r = raw(&emu, "GET", &format!("/api/retail/prices?$filter={none}"), &[], "").await;
    assert_eq!((r.body["Items"].clone(), r.body["Count"].as_u64()), (json!([]), Some(0)));
}

#[tokio::test]
async fn the_control_surface_drives_vms() {
    let emu = start();
    let tok = token(&emu).await;
    // Plant: a running VM with a NIC and IP, every part marked (tags encoded).
    let planted = emu.plant(Plant {
        name: "planted".into(),
        managed: true,
        uid: Some("uid-p".into()),
        installation: Some("inst".into()),
        ..Plant::default()
    });
    assert_eq!(planted, id("Microsoft.Compute/virtualMachines", "planted"));
    let vm = arm(&emu, &tok, "GET", &vm_path("planted"), None).await.body;
    assert_eq!(vm["tags"]["egress-uid"], "uid-p");
    let dump = emu.dump();
    assert_eq!(
        (dump.instances[0].state.as_str(), dump.instances[0].scope.as_str()),
        ("running", "westeurope")
    );
    assert!(
        dump.instances[0].labels.contains(&(crate::MARK_MANAGED.to_string(), "true".to_string()))
    );
    assert!(emu.try_plant(Plant { name: "planted".into(), ..Plant::default() }).is_err());
    assert!(
        emu.resources()
            .iter()
            .filter(|r| r.kind != ResourceKind::Disk)
            .all(|r| r.tags["egress-installation"] == "inst")
    );

    // Hold: back to Creating, its operation stays in progress however often it is read.
    assert!(emu.hold_provisioning("planted", true));
    for _ in 0..3 {
        let vm = arm(&emu, &tok, "GET", &vm_path("planted"), None).await.body;
        assert_eq!(vm["properties"]["provisioningState"], "Creating");
    }
    assert!(emu.hold_provisioning(&planted, false));
    arm(&emu, &tok, "GET", &vm_path("planted"), None).await;
    let view = arm(&emu, &tok, "GET", &vm_sub("planted", "instanceView"), None).await.body;
    assert_eq!(power(&view), "PowerState/running");

    // Raw states and addresses.
    assert!(emu.set_backend_state("planted", "egress-conformance-unknown-state"));
    let view = arm(&emu, &tok, "GET", &vm_sub("planted", "instanceView"), None).await.body;
    assert_eq!(power(&view), "PowerState/egress-conformance-unknown-state");
    assert!(emu.set_backend_state("planted", "Failed"));
    assert_eq!(emu.dump().instances[0].state, "Failed");
    assert!(emu.set_backend_state("planted", "running"));
    assert!(emu.set_address("planted", None));
    let ip = arm(&emu, &tok, "GET", &ip_path("planted-ip"), None).await.body;
    assert!(ip["properties"]["ipAddress"].is_null());
    assert!(emu.set_address("planted", Some("198.51.100.200")));
    assert_eq!(emu.dump().instances[0].ip, "198.51.100.200");
    assert!(!emu.set_address("nope", None));

    // Faults answer as ARM does.
    for (kind, status, code) in [
        (FaultKind::ServerError, 500, "InternalExecutionError"),
        (FaultKind::Quota, 409, "OperationNotAllowed"),
        (FaultKind::Auth, 401, "InvalidAuthenticationToken"),
        (FaultKind::RateLimit, 429, "SubscriptionRequestsThrottled"),
    ] {
        emu.inject(Fault { op: FaultOp::Get, kind, count: 1 });
        let r = arm(&emu, &tok, "GET", &vm_path("planted"), None).await;
        assert_eq!((r.status, r.code()), (status, code));
        assert_eq!(
            arm(&emu, &tok, "GET", &vm_path("planted"), None).await.status,
            200,
            "one call only"
        );
    }
    emu.inject_error(FaultOp::Create, ArmError::new(503, "ServiceUnavailable", "down"), 1);
    let r = arm(&emu, &tok, "PUT", &ip_path("x"), Some(ip_body(&json!({})))).await;
    assert_eq!((r.status, r.code()), (503, "ServiceUnavailable"));

    // A failing scope fails every list that touches it.
    emu.fail_scope("westeurope", true);
    let list = format!("/subscriptions/{SUB}/resources?api-version=2021-04-01");
    let r = arm(&emu, &tok, "GET", &list, None).await;
    assert_eq!((r.status, r.code()), (500, "InternalServerError"));
    let us = format!("{}/resources?api-version=2021-04-01", rg_path("egress-rg-us"));
    assert_eq!(arm(&emu, &tok, "GET", &us, None).await.status, 200);
    emu.fail_scope("westeurope", false);
    assert_eq!(arm(&emu, &tok, "GET", &list, None).await.status, 200);

    // A lock: writes are refused, reads answer.
    assert!(emu.set_locked("planted", true));
    let r = arm(&emu, &tok, "DELETE", &vm_path("planted"), None).await;
    assert_eq!((r.status, r.code()), (409, "AnotherOperationInProgress"));
    assert_eq!(arm(&emu, &tok, "GET", &vm_path("planted"), None).await.status, 200);
    assert!(emu.set_locked("planted", false));

    // A slow delete: Deleting however often it is read, until finished.
    assert!(emu.start_slow_delete("planted"));
    for _ in 0..3 {
        let vm = arm(&emu, &tok, "GET", &vm_path("planted"), None).await;
        assert_eq!(vm.body["properties"]["provisioningState"], "Deleting");
    }
    let r = arm(&emu, &tok, "DELETE", &vm_path("planted"), None).await;
    assert_eq!(r.status, 202, "a delete in progress answers with its operation");
    emu.finish_deletes();
    assert_eq!(arm(&emu, &tok, "GET", &vm_path("planted"), None).await.status, 404);
    assert!(emu.dump().instances.is_empty() && emu.dump().secondary.is_empty());

    // The HTTP surface drives the same state; a reset keeps tokens.
    let ct = [("content-type", "application/json")];
    let body =
        json!({"name": "over-http", "managed": true, "uid": "u", "installation": "i"}).to_string();
    let r = raw(&emu, "POST", "/_emulator/plant", &ct, &body).await;
    assert_eq!(r.status, 200, "{}", r.body);
    let r = raw(&emu, "GET", "/_emulator/dump", &[], "").await;
    assert_eq!(r.body["instances"][0]["spot"], false);
    let r = raw(&emu, "GET", "/_emulator/resources", &[], "").await;
    let kinds: Vec<&str> =
        r.body["resources"].as_array().unwrap().iter().filter_map(|x| x["kind"].as_str()).collect();
    assert_eq!(kinds.len(), 4, "{kinds:?}");
    assert!(kinds.contains(&"Microsoft.Compute/disks"));
    assert_eq!(raw(&emu, "POST", "/_emulator/reset", &[], "").await.status, 204);
    assert!(emu.resources().is_empty());
    assert_eq!(arm(&emu, &tok, "GET", &list, None).await.status, 200);
}

/// Real-proxy mode: the VM's custom data names the port; running starts the proxy and the
/// VM's public IP reads 127.0.0.1; the delete stops it.
#[tokio::test(flavor = "multi_thread")]
async fn real_proxy_mode_runs_a_proxy_per_running_vm() {
    use crate::real_proxy::tests::{closed, echo_server, free_port, get_through_tunnel};
    use crate::real_proxy::{ProxyKind, RealProxies};
    let echo = echo_server().await;
    let proxies = RealProxies::new(ProxyKind::Builtin);
    let emu = AzureEmulator::start(AzureConfig {
        real_proxies: Some(proxies.clone()),
        ..AzureConfig::default()
    });
    let tok = token(&emu).await;
    let port = free_port();
    let none = json!({});
    arm(&emu, &tok, "PUT", &ip_path("rp-ip"), Some(ip_body(&none))).await;
    arm(&emu, &tok, "PUT", &nic_path("rp-nic"), Some(nic_body(Some("rp-ip"), "Delete", &none)))
        .await;
    let data = format!(
        "#cloud-config\nwrite_files:\n  - path: /etc/tinyproxy/tinyproxy.conf\n    content: |\n      Port {port}\n"
    );
    let r = arm(&emu, &tok, "PUT", &vm_path("rp"), Some(vm_body("rp-nic", "Delete", &none, &data)))
        .await;
    assert!(closed(port), "no proxy while creating");
    wait(&emu, &tok, r.header("azure-asyncoperation")).await;
    let ip = arm(&emu, &tok, "GET", &ip_path("rp-ip"), None).await.body;
    assert_eq!(ip["properties"]["ipAddress"], "127.0.0.1");
    assert!(get_through_tunnel(port, echo).await.starts_with("hello from 127.0.0.1"));
    let r = arm(&emu, &tok, "DELETE", &vm_path("rp"), None).await;
    assert_eq!(r.status, 202);
    assert!(closed(port), "deleting stops the proxy");
    drop(emu);
    assert!(proxies.listening().is_empty());
}
