//! The Proxmox VE API (`/api2/json`) as this plugin uses it: the token header, the `{"data": ...}` envelope, the one
//! classify function, tasks (UPIDs) and waiting for them, the upload of a seed image, and the JSON it reads.

use crate::config::{Config, is_node};
use egress_guest_sdk::http::{Client, HttpError, Method, Request, encode_component};
use egress_guest_sdk::{self as sdk, ErrorClass, ProviderError};
use serde::Deserialize;
use serde::de::DeserializeOwned;
use serde_json::Value;
use std::net::Ipv4Addr;
use std::time::{Duration, Instant};

/// Proxmox has no error codes: an error is a status, `{"data": null}` and, since pve-http-server 6 (PVE 9), a
/// `message` (older versions put it in the HTTP reason phrase, which `wasi:http` does not pass on) and for bad
/// parameters an `errors` map. Not-found is never decided here: a missing VM answers 500 like any failure, so the
/// plugin reads absence from the cluster's VM list. 401 (bad token) and 403 (missing privilege) are permanent; 400,
/// 404, 405 and 501 (a parameter or path this API does not take) too; 595/596 (pveproxy cannot reach the node) and
/// everything else transient. No quota or rate limit exists to detect (`quota=absent`).
pub fn classify(e: HttpError) -> ProviderError {
    let HttpError::Status { status, body, .. } = &e else {
        let class = match &e {
            HttpError::InvalidUrl(_) | HttpError::Header { .. } => ErrorClass::Permanent,
            _ => ErrorClass::Transient,
        };
        // The handshake fails before any request when the host does not trust the API's certificate.
        let hint = match e.code_name().starts_with("Tls") {
            true => {
                " (a Proxmox host's certificate is signed by its cluster's CA: name \
                /etc/pve/pve-root-ca.pem in the provider entry's tls.caFile)"
            }
            false => "",
        };
        return ProviderError::new(class, format!("Proxmox VE API: {e}{hint}")).with_code(e.code_name());
    };
    let v: Value = serde_json::from_slice(body).unwrap_or_default();
    let mut said = v["message"].as_str().unwrap_or_default().trim().to_string();
    if let Some(errors) = v["errors"].as_object() {
        let fields: Vec<String> =
            errors.iter().map(|(k, m)| format!("{k}: {}", m.as_str().unwrap_or("").trim())).collect();
        said = format!("{said} ({})", fields.join("; "));
    }
    let (class, code, hint) = match status {
        401 => (ErrorClass::Permanent, "Unauthorized", " (check config.tokenId and the token secret)"),
        403 => (ErrorClass::Permanent, "Forbidden", " (the token lacks a privilege, see docs/providers/proxmox.md)"),
        400 | 404 | 405 | 501 => (ErrorClass::Permanent, "InvalidRequest", ""),
        595 | 596 => (ErrorClass::Transient, "NodeUnreachable", ""),
        _ => (ErrorClass::Transient, "", ""),
    };
    let said: String = said.chars().take(300).collect();
    let msg = format!("Proxmox VE API answered HTTP {status}{}{said}{hint}", if said.is_empty() { "" } else { ": " });
    ProviderError::new(class, msg).with_code(if code.is_empty() { e.code_name() } else { code.into() })
}

/// The health-check reason of a failed request.
pub fn reason(e: &HttpError) -> &'static str {
    match e.status() {
        Some(595 | 596) => "Unreachable",
        _ => e.reason(),
    }
}

/// A task that ended with an error. Retrying cannot fix a template or storage that does not support the operation,
/// or a name or path that does not exist: permanent. Everything else (a lock, a timeout, no space) passes or may.
pub fn task_failure(what: &str, upid: &str, exit: &str) -> ProviderError {
    const PERMANENT: [&str; 6] =
        ["not supported", "does not exist", "unable to parse", "not allowed", "no such", "invalid"];
    let lower = exit.to_ascii_lowercase();
    let class = match PERMANENT.iter().any(|p| lower.contains(p)) {
        true => ErrorClass::Permanent,
        false => ErrorClass::Transient,
    };
    ProviderError::new(class, format!("{what} failed (task {upid}): {exit}")).with_code("TaskFailed")
}

/// An entry of `/cluster/resources?type=vm`. `name` and `status` come from the nodes' statistics (a few seconds
/// late, absent for a node that does not report); `lock` and `tags` from the config, current.
#[derive(Deserialize, Default, Debug, Clone)]
#[serde(default)]
pub struct Resource {
    pub vmid: u32,
    pub node: String,
    #[serde(rename = "type")]
    pub kind: String,
    pub name: String,
    pub status: String,
    pub tags: String,
    pub lock: String,
    pub template: Value,
}

impl Resource {
    pub fn is_template(&self) -> bool {
        self.template == 1 || self.template == true
    }
}

/// `status/current`: read from the config and the QEMU process, never late.
#[derive(Deserialize, Default, Debug)]
#[serde(default)]
pub struct Status {
    pub status: String,
    pub qmpstatus: String,
    pub name: String,
    pub lock: String,
    pub tags: String,
}

#[derive(Deserialize, Default, Debug)]
#[serde(default)]
pub struct VmConfig {
    pub description: String,
    pub ide2: String,
    pub tags: String,
    /// Every other key: drives, cores, ...
    #[serde(flatten)]
    pub rest: std::collections::BTreeMap<String, Value>,
}

/// `tasks/{upid}/status`: `running` or `stopped` with `exitstatus` `OK`, `WARNINGS: n` or the error.
#[derive(Deserialize, Default, Debug)]
#[serde(default)]
pub struct Task {
    pub status: String,
    pub exitstatus: String,
}

impl Task {
    pub fn failed(&self) -> bool {
        self.status == "stopped" && self.exitstatus != "OK" && !self.exitstatus.starts_with("WARNINGS")
    }
}

/// The address the guest agent reports: the first IPv4 address of an interface other than the loopback one that
/// is not link-local (DHCP not answered yet) or unspecified.
pub fn agent_address(answer: &Value) -> Option<String> {
    let ifaces = answer["result"].as_array()?;
    let nic = |i: &&Value| i["name"] != "lo" && i["hardware-address"] != "00:00:00:00:00:00";
    let addrs = ifaces.iter().filter(nic).flat_map(|i| i["ip-addresses"].as_array().into_iter().flatten());
    let v4 = addrs.filter(|a| a["ip-address-type"] == "ipv4").filter_map(|a| a["ip-address"].as_str()?.parse().ok());
    v4.into_iter().find(|ip: &Ipv4Addr| !ip.is_link_local() && !ip.is_unspecified()).map(|ip| ip.to_string())
}

/// The node a UPID ran on (`UPID:<node>:...`).
pub fn upid_node(upid: &str) -> Option<&str> {
    let node = upid.strip_prefix("UPID:")?.split(':').next()?;
    is_node(node).then_some(node)
}

pub struct Api<'a> {
    pub cfg: &'a Config,
    client: Client,
    deadline: Instant,
}

impl<'a> Api<'a> {
    /// A client with the token header; the secret is read on every call, so a rotated Secret works at once.
    pub fn new(cfg: &'a Config) -> Result<Self, ProviderError> {
        let secret = sdk::secret_string(&cfg.token_secret)?;
        let client =
            Client::new(&cfg.endpoint).header("authorization", format!("PVEAPIToken={}={secret}", cfg.token_id));
        Ok(Api { cfg, client, deadline: Instant::now() + Duration::from_secs(cfg.wait().into()) })
    }

    /// Send and unwrap `data`; any failure classified.
    pub fn call<T: DeserializeOwned>(
        &self,
        method: Method,
        path: &str,
        body: Option<&Value>,
    ) -> Result<T, ProviderError> {
        self.send(method, path, body).map_err(classify)
    }

    pub fn send<T: DeserializeOwned>(&self, method: Method, path: &str, body: Option<&Value>) -> Result<T, HttpError> {
        let mut req = self.client.request(method, path);
        if body.is_some() {
            req = req.header("content-type", "application/json");
        }
        let bytes = body.map(|b| b.to_string().into_bytes()).unwrap_or_default();
        Self::data(Self::sized(req, bytes).send_json::<Value>()?)
    }

    /// pveproxy reads a body by its `Content-Length` and refuses a chunked one (501), so every request states its
    /// length, also an empty one.
    fn sized(req: Request, body: Vec<u8>) -> Request {
        req.header("content-length", body.len().to_string()).body(body)
    }

    fn data<T: DeserializeOwned>(mut v: Value) -> Result<T, HttpError> {
        serde_json::from_value(v["data"].take()).map_err(|e| HttpError::Json(e.to_string()))
    }

    pub fn get<T: DeserializeOwned>(&self, path: &str) -> Result<T, ProviderError> {
        self.call(Method::Get, path, None)
    }

    /// Every VM and template of the cluster. The list comes from the cluster file system, so it is whole even when
    /// nodes are down: what is not in it does not exist.
    pub fn resources(&self) -> Result<Vec<Resource>, ProviderError> {
        let all: Vec<Resource> = self.get("/cluster/resources?type=vm")?;
        Ok(all.into_iter().filter(|r| r.kind == "qemu" && is_node(&r.node)).collect())
    }

    pub fn vm(node: &str, vmid: u32) -> String {
        format!("/nodes/{node}/qemu/{vmid}")
    }

    pub fn task(&self, upid: &str) -> Result<Task, ProviderError> {
        let node = upid_node(upid).ok_or_else(|| ProviderError::transient(format!("unreadable task id {upid:?}")))?;
        self.get(&format!("/nodes/{node}/tasks/{}/status", encode_component(upid)))
    }

    /// Waits for a task that must succeed: `what` failed names its exit status; still running is transient.
    pub fn finish(&self, upid: &str, what: &str) -> Result<(), ProviderError> {
        match self.poll(|| self.task(upid), |t| t.status != "running")? {
            Some(t) if t.failed() => Err(task_failure(what, upid, &t.exitstatus)),
            Some(_) => Ok(()),
            None => {
                Err(ProviderError::transient(format!("{what} still running after {} s (task {upid})", self.cfg.wait()))
                    .with_code("TaskRunning"))
            }
        }
    }

    /// Reads until `done` holds for the answer, pausing 50 ms, then longer up to 1 s, or until this call's wait
    /// runs out (`None`).
    pub fn poll<T>(
        &self,
        read: impl Fn() -> Result<T, ProviderError>,
        done: impl Fn(&T) -> bool,
    ) -> Result<Option<T>, ProviderError> {
        let mut pause = Duration::from_millis(50);
        loop {
            let v = read()?;
            if done(&v) {
                return Ok(Some(v));
            }
            if Instant::now() + pause > self.deadline {
                return Ok(None);
            }
            std::thread::sleep(pause);
            pause = (pause * 2).min(Duration::from_secs(1));
        }
    }

    /// Uploads `image` as `iso` content `filename` to `storage` on `node` and waits for the copy. Proxmox reads the
    /// form in a fixed order: `content`, `checksum-algorithm`, `checksum`, then the file in a field named
    /// `filename`; the SHA-256 makes Proxmox refuse a copy that differs from what was sent.
    pub fn upload(&self, node: &str, filename: &str, image: &[u8]) -> Result<(), ProviderError> {
        let sum = data_encoding::HEXLOWER.encode(&<sha2::Sha256 as sha2::Digest>::digest(image));
        let boundary = format!("egress-{}", data_encoding::HEXLOWER.encode(&sdk::random::random_bytes(12)));
        let field = |name: &str, value: &str| {
            format!("--{boundary}\r\nContent-Disposition: form-data; name=\"{name}\"\r\n\r\n{value}\r\n")
        };
        let mut body =
            [field("content", "iso"), field("checksum-algorithm", "sha256"), field("checksum", &sum)].concat();
        body +=
            &format!("--{boundary}\r\nContent-Disposition: form-data; name=\"filename\"; filename=\"{filename}\"\r\n");
        body += "Content-Type: application/octet-stream\r\n\r\n";
        let mut bytes = body.into_bytes();
        bytes.extend_from_slice(image);
        bytes.extend_from_slice(format!("\r\n--{boundary}--\r\n").as_bytes());
        let path = format!("/nodes/{node}/storage/{}/upload", self.cfg.iso_storage);
        let req = self.client.post(&path).header("content-type", format!("multipart/form-data; boundary={boundary}"));
        let upid: String = Self::sized(req, bytes).send_json::<Value>().and_then(Self::data).map_err(classify)?;
        self.finish(&upid, &format!("upload of {filename}"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use egress_guest_sdk::ErrorClass::*;
    use egress_guest_sdk::http::ErrorCode;
    use serde_json::json;

    fn status(status: u16, body: Value) -> HttpError {
        HttpError::Status { status, body: body.to_string().into_bytes(), retry_after: None }
    }

    /// Answers as pveproxy gives them: PVE 9 bodies with `message`, PVE 8 bodies without, parameter errors, an
    /// unreachable node, and transport failures.
    #[test]
    fn classify_table() {
        let cases: Vec<(HttpError, ErrorClass, &str, &str)> = vec![
            (HttpError::Status { status: 401, body: vec![], retry_after: None }, Permanent, "Unauthorized", "tokenId"),
            (
                status(403, json!({"data": null, "message": "Permission check failed (/vms/900100, VM.Allocate)\n"})),
                Permanent,
                "Forbidden",
                "VM.Allocate",
            ),
            (
                status(
                    400,
                    json!({"data": null, "errors": {"newid": "invalid format - value does not look like a valid VM ID\n"},
                "message": "Parameter verification failed.\n"}),
                ),
                Permanent,
                "InvalidRequest",
                "newid: invalid format",
            ),
            (
                status(501, json!({"data": null, "message": "Method 'GET /nodes/pve1/x' not implemented"})),
                Permanent,
                "InvalidRequest",
                "not implemented",
            ),
            (
                status(
                    500,
                    json!({"data": null, "message": "Configuration file 'nodes/pve1/qemu-server/900100.conf' does not exist\n"}),
                ),
                Transient,
                "HTTP500",
                "does not exist",
            ),
            (status(500, json!({"data": null})), Transient, "HTTP500", "HTTP 500"),
            (status(595, json!({"data": null})), Transient, "NodeUnreachable", "595"),
            (status(503, json!({"data": null})), Transient, "HTTP503", "503"),
            (HttpError::Transport(ErrorCode::ConnectionRefused), Transient, "ConnectionRefused", "ConnectionRefused"),
            (
                HttpError::Transport(ErrorCode::TlsCertificateError),
                Transient,
                "TlsCertificateError",
                "TlsCertificateError",
            ),
            (HttpError::Json("eof".into()), Transient, "InvalidJson", "eof"),
        ];
        for (e, class, code, text) in cases {
            let err = classify(e);
            assert_eq!((err.class, err.code.as_deref()), (class, Some(code)), "{}", err.message);
            assert!(err.message.contains(text), "{}", err.message);
        }
        assert_eq!(reason(&status(595, json!({}))), "Unreachable");
        assert_eq!(reason(&status(401, json!({}))), "Unauthorized");
    }

    /// Exit statuses as Proxmox writes them into task logs.
    #[test]
    fn task_failures() {
        for (exit, class) in [
            (
                "clone failed: lvcreate 'pve/vm-900100-disk-0' error:   Volume group \"pve\" has insufficient free space",
                Transient,
            ),
            (
                "clone failed: Linked clone feature is not supported for 'local:9000/base-9000-disk-0.raw' (scsi0)",
                Permanent,
            ),
            ("storage 'fast' does not exist", Permanent),
            ("VM is locked (backup)", Transient),
            ("start failed: QEMU exited with code 1", Transient),
        ] {
            let e = task_failure("clone of VM 900100", "UPID:pve1:x", exit);
            assert_eq!((e.class, e.code.as_deref()), (class, Some("TaskFailed")), "{exit}");
            assert!(e.message.contains(exit) && e.message.contains("UPID:pve1:x"), "{}", e.message);
        }
        let t = |s: &str, e: &str| Task { status: s.into(), exitstatus: e.into() };
        assert!(t("stopped", "oops").failed() && !t("stopped", "OK").failed() && !t("stopped", "WARNINGS: 2").failed());
        assert!(!t("running", "").failed());
        assert_eq!(upid_node("UPID:pve-2:0001E240:0A1B2C3D:6750B5C0:qmstart:900100:egress@pve!op:"), Some("pve-2"));
        assert_eq!(upid_node("UPID:../x:1"), None);
    }

    #[test]
    fn agent_addresses() {
        let iface = |name: &str, mac: &str, ips: &[(&str, &str)]| {
            let ips: Vec<Value> =
                ips.iter().map(|(t, a)| json!({"ip-address-type": t, "ip-address": a, "prefix": 24})).collect();
            json!({"name": name, "hardware-address": mac, "ip-addresses": ips})
        };
        let lo = iface("lo", "00:00:00:00:00:00", &[("ipv4", "127.0.0.1"), ("ipv6", "::1")]);
        let cases = [
            (
                json!({"result": [lo, iface("eth0", "bc:24:11:00:00:01", &[("ipv6", "fe80::1"), ("ipv4", "192.168.1.50")])]}),
                Some("192.168.1.50"),
            ),
            (json!({"result": [lo, iface("eth0", "bc:24:11:00:00:01", &[("ipv4", "169.254.3.4")])]}), None),
            (json!({"result": [lo, iface("ens18", "bc:24:11:00:00:01", &[])]}), None),
            (
                json!({"result": [iface("eth0", "bc:24:11:00:00:01", &[("ipv4", "0.0.0.0"), ("ipv4", "203.0.113.9")])]}),
                Some("203.0.113.9"),
            ),
            (json!({"result": [lo]}), None),
            (json!({}), None),
        ];
        for (answer, want) in cases {
            assert_eq!(agent_address(&answer).as_deref(), want, "{answer}");
        }
    }
}
