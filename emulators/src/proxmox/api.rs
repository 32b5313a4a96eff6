//! The routes of `/api2/json`, the wire form of VMs, tasks and storage content, and pveproxy's multipart parsing.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use axum::Json;
use axum::Router;
use axum::body::Bytes;
use axum::extract::{DefaultBodyLimit, Path, Query, State};
use axum::http::HeaderMap;
use axum::response::{IntoResponse, Response};
use axum::routing::{delete, get, post};
use serde_json::{Value, json};
use sha2::{Digest, Sha256};

use super::{Backend, PveError, Vm, iso9660, lock_timeout, tag_marks, valid_name, valid_tag};
use crate::framework::{Deletion, Model, Record, Shared};

type St = State<Shared<Backend>>;
type VmPath = Path<(String, String)>;

/// A template's config, as a cloud image template usually has it: a boot disk, a NIC, a Cloud-Init drive.
const TEMPLATE_CONFIG: [(&str, &str); 6] = [
    ("cores", "1"),
    ("memory", "1024"),
    ("net0", "virtio=BC:24:11:00:00:01,bridge=vmbr0"),
    ("scsi0", "local-lvm:vm-{id}-disk-0,size=4G"),
    ("ide0", "local-lvm:vm-{id}-cloudinit,media=cdrom"),
    ("boot", "order=scsi0"),
];

pub(super) fn routes() -> Router<Shared<Backend>> {
    let vm = "/nodes/{node}/qemu/{vmid}";
    Router::new()
        .route("/cluster/resources", get(resources))
        .route("/cluster/nextid", get(nextid))
        .route(&format!("{vm}/clone"), post(clone))
        .route(&format!("{vm}/config"), get(config_get).put(config_put))
        .route(&format!("{vm}/status/current"), get(current))
        .route(&format!("{vm}/status/start"), post(start))
        .route(&format!("{vm}/status/stop"), post(stop))
        .route(&format!("{vm}/agent/network-get-interfaces"), get(agent))
        .route(vm, delete(destroy))
        .route("/nodes/{node}/tasks/{upid}/status", get(task))
        .route("/nodes/{node}/status", get(node_status))
        .route(
            "/nodes/{node}/storage/{storage}/upload",
            post(upload).layer(DefaultBodyLimit::max(64 << 20)),
        )
        .route("/nodes/{node}/storage/{storage}/content", get(content))
        .route("/nodes/{node}/storage/{storage}/content/{volume}", delete(content_delete))
        .fallback(|m: axum::http::Method, u: axum::http::Uri| async move {
            PveError::new(501, format!("Method '{m} {}' not implemented", u.path())).into_response()
        })
}

/// pveproxy reads a request body by its `Content-Length` only: a chunked one is refused before anything else.
pub(super) async fn no_chunked(
    req: axum::extract::Request,
    next: axum::middleware::Next,
) -> Response {
    let te =
        req.headers().get("transfer-encoding").and_then(|v| v.to_str().ok()).unwrap_or_default();
    match te.eq_ignore_ascii_case("chunked") {
        true => {
            (axum::http::StatusCode::NOT_IMPLEMENTED, "chunked transfer encoding not supported")
                .into_response()
        }
        false => next.run(req).await,
    }
}

fn answer(r: Result<Value, PveError>) -> Response {
    r.map_or_else(IntoResponse::into_response, |data| Json(json!({ "data": data })).into_response())
}

/// Completes the clones whose time is up (the VM gets its config, or is removed when the clone fails) and the
/// starts (QEMU runs and the guest boots: provisioning on the schedule).
fn settle(b: &mut Backend) {
    let now = Instant::now();
    let due = |r: &Record<Vm>| {
        let t = b.backend.tasks.get(r.extra.cloning.as_ref()?)?;
        (t.ends <= now).then(|| (r.id.clone(), t.exit.is_some()))
    };
    let done: Vec<(String, bool)> = b.fleet.iter().filter_map(due).collect();
    for (id, failed) in done {
        match failed {
            true => drop(b.fleet.remove(&id)),
            false => b.fleet.get_mut(&id).into_iter().for_each(|r| r.extra.cloning = None),
        }
    }
    let mut booted = Vec::new();
    for t in b.backend.tasks.values_mut().filter(|t| t.boots && t.ends <= now) {
        t.boots = false;
        booted.push(t.id.clone());
    }
    for id in booted {
        // Gone meanwhile (destroyed behind the start: not emulated further).
        if let Some(r) = b.fleet.get(&id).cloned() {
            b.create(r);
        }
    }
}

/// The node a call is routed to: unknown is 500 as pveproxy's lookup fails, a failing one 595.
fn node(b: &Backend, node: &str) -> Result<(), PveError> {
    if !b.backend.node_ok(node) {
        return Err(b.backend.err(
            500,
            format!("hostname lookup '{node}' failed - failed to get address info for: {node}"),
        ));
    }
    match b.fleet.failing_scope(std::iter::once(node)) {
        Some(_) => Err(b.backend.err(595, format!("Connection refused ({node})"))),
        None => Ok(()),
    }
}

/// VM `vmid` on `node`, or the 500 of a missing config file.
fn vm<'a>(b: &'a Backend, at: &str, vmid: &str) -> Result<&'a Record<Vm>, PveError> {
    node(b, at)?;
    let missing = || {
        b.backend.err(
            500,
            format!("Configuration file 'nodes/{at}/qemu-server/{vmid}.conf' does not exist"),
        )
    };
    b.fleet.get(vmid).filter(|r| r.scope == at && r.id == vmid).ok_or_else(missing)
}

/// The power state `status/current` shows: a VM `starting` runs (its start task has ended) while its guest boots.
fn status_of(r: &Record<Vm>) -> &str {
    match r.state.as_str() {
        "starting" => "running",
        "destroyed" => "stopped",
        s => s,
    }
}

fn lock_of(r: &Record<Vm>) -> Option<&'static str> {
    match () {
        _ if r.deleting => Some("destroyed"),
        _ if r.extra.cloning.is_some() => Some("clone"),
        _ if r.locked => Some("backup"),
        _ => None,
    }
}

/// The config `GET .../config` shows; a VM still being cloned has only its temporary one.
pub(super) fn config_of(r: &Record<Vm>) -> Value {
    if r.extra.cloning.is_some() {
        return json!({"lock": "clone", "digest": "0".repeat(40)});
    }
    let mut v: serde_json::Map<String, Value> =
        r.extra.config.iter().map(|(k, v)| (k.clone(), v.as_str().into())).collect();
    v.insert("name".into(), r.name.as_str().into());
    v.insert("digest".into(), format!("{:x}", Sha256::digest(format!("{:?}", r.extra))).into());
    for (k, val) in [("description", &r.extra.description), ("tags", &r.extra.tags)] {
        if !val.is_empty() {
            v.insert(k.into(), val.as_str().into());
        }
    }
    if let Some(lock) = lock_of(r) {
        v.insert("lock".into(), lock.into());
    }
    Value::Object(v)
}

/// The ISO a VM has as `ide2`, and its image.
pub(super) fn attached_iso<'a>(p: &'a super::Pve, r: &Record<Vm>) -> Option<(String, &'a [u8])> {
    let volid = r.extra.config.get("ide2")?.split(',').next()?.to_string();
    let iso = p.isos.get(&(r.scope.clone(), volid.clone()))?;
    Some((volid, &iso.image))
}

async fn resources(State(s): St) -> Response {
    let mut b = s.lock();
    settle(&mut b);
    let mut out: Vec<Value> = b.backend.cfg.templates.iter().map(|(vmid, name, node)| {
        json!({"id": format!("qemu/{vmid}"), "type": "qemu", "vmid": vmid, "node": node, "name": name,
               "status": "stopped", "template": 1, "maxmem": 1 << 30, "maxcpu": 1, "uptime": 0})
    }).collect();
    for r in b.fleet.iter() {
        let vmid: u64 = r.id.parse().unwrap_or_default();
        let mut v = json!({"id": format!("qemu/{vmid}"), "type": "qemu", "vmid": vmid, "node": r.scope, "template": 0,
            "status": status_of(r), "maxmem": 1 << 30, "maxcpu": 1, "uptime": 0});
        if r.extra.cloning.is_none() {
            v["name"] = r.name.as_str().into();
        }
        if b.fleet.failing_scope(std::iter::once(r.scope.as_str())).is_some() {
            v["status"] = "unknown".into();
            if let Some(o) = v.as_object_mut() {
                o.remove("name");
            }
        }
        if !r.extra.tags.is_empty() && r.extra.cloning.is_none() {
            v["tags"] = r.extra.tags.as_str().into();
        }
        if let Some(lock) = lock_of(r) {
            v["lock"] = lock.into();
        }
        out.push(v);
    }
    answer(Ok(out.into()))
}

async fn nextid(State(s): St, Query(q): Query<BTreeMap<String, String>>) -> Response {
    let b = s.lock();
    let used =
        |id: u64| b.fleet.get(&id.to_string()).is_some() || b.backend.template(id as u32).is_some();
    answer(match q.get("vmid").map(|v| v.parse::<u64>()) {
        Some(Ok(id)) if used(id) => {
            Err(PveError::param("vmid", &format!("VM {id} already exists")))
        }
        Some(Ok(id)) => Ok(id.to_string().into()),
        Some(Err(_)) => {
            Err(PveError::param("vmid", "invalid format - value does not look like a valid VM ID"))
        }
        None => Ok((100..).find(|id| !used(*id)).map(|id| id.to_string()).into()),
    })
}

async fn clone(State(s): St, Path((at, template)): VmPath, body: Option<Json<Value>>) -> Response {
    let mut b = s.lock();
    settle(&mut b);
    answer(do_clone(&mut b, &at, &template, body.map(|b| b.0).unwrap_or_default()))
}

fn do_clone(b: &mut Backend, at: &str, template: &str, body: Value) -> Result<Value, PveError> {
    node(b, at)?;
    let t =
        template.parse().ok().and_then(|v| b.backend.template(v)).filter(|t| t.2 == at).cloned();
    let missing = || {
        b.backend.err(
            500,
            format!("Configuration file 'nodes/{at}/qemu-server/{template}.conf' does not exist"),
        )
    };
    let t = t.ok_or_else(missing)?;
    let newid = body["newid"]
        .as_u64()
        .or_else(|| body["newid"].as_str()?.parse().ok())
        .filter(|v| (100..1_000_000_000).contains(v));
    let newid = newid.ok_or_else(|| {
        PveError::param("newid", "invalid format - value does not look like a valid VM ID")
    })?;
    let name = body["name"].as_str().unwrap_or_default();
    if !name.is_empty() && !valid_name(name) {
        return Err(PveError::param(
            "name",
            "invalid format - value does not look like a valid DNS name",
        ));
    }
    let target = body["target"].as_str().unwrap_or(at);
    if !b.backend.node_ok(target) {
        return Err(b.backend.err(500, format!("no such cluster node '{target}'")));
    }
    if b.fleet.get(&newid.to_string()).is_some() || b.backend.template(newid as u32).is_some() {
        return Err(b
            .backend
            .err(500, format!("unable to create VM {newid}: config file already exists")));
    }
    let exit = b.backend.failing_clones.pop_front();
    let takes = b.backend.cfg.clone_time;
    let upid = b.backend.task(at, "qmclone", template, takes, exit);
    let config = TEMPLATE_CONFIG
        .iter()
        .map(|(k, v)| (k.to_string(), v.replace("{id}", &newid.to_string())))
        .collect();
    let description = body["description"].as_str().unwrap_or_default().to_string();
    let name = if name.is_empty() { format!("Copy-of-VM-{}", t.1) } else { name.to_string() };
    let vm = Vm { description, config, cloning: Some(upid.clone()), ..Vm::default() };
    let mut r = Record::new(newid.to_string(), name, target.to_string(), vm);
    r.state = "stopped".into();
    b.fleet.insert(r);
    Ok(upid.into())
}

async fn config_get(State(s): St, Path((at, vmid)): VmPath) -> Response {
    let mut b = s.lock();
    settle(&mut b);
    answer(vm(&b, &at, &vmid).map(config_of))
}

/// `update_vm_api` checks the config, then takes the VM's config lock (`lock_config`, 10 s) for the write: a start
/// holding it makes the write wait, and fail if it is not had in time.
async fn config_put(State(s): St, Path((at, vmid)): VmPath, body: Option<Json<Value>>) -> Response {
    let body = body.map(|b| b.0).unwrap_or_default();
    let mut give_up = None;
    loop {
        let next = {
            let mut b = s.lock();
            settle(&mut b);
            if let Err(e) = vm(&b, &at, &vmid) {
                return e.into_response();
            }
            let now = Instant::now();
            let give_up = *give_up.get_or_insert(now + b.backend.cfg.config_lock_wait);
            match b.backend.lock_until(&vmid) {
                None => return answer(do_config(&mut b, &at, &vmid, body)),
                Some(_) if now >= give_up => {
                    return b.backend.err(500, lock_timeout(&vmid)).into_response();
                }
                Some(until) => until.min(give_up),
            }
        };
        tokio::time::sleep_until(next.into()).await;
    }
}

fn text(v: &Value) -> String {
    v.as_str().map_or_else(|| v.to_string(), str::to_string)
}

fn do_config(b: &mut Backend, at: &str, vmid: &str, body: Value) -> Result<Value, PveError> {
    let r = vm(b, at, vmid)?;
    if let Some(lock) = lock_of(r) {
        return Err(b.backend.err(500, format!("VM is locked ({lock})")));
    }
    let set = body.as_object().cloned().unwrap_or_default();
    if set
        .get("tags")
        .map(text)
        .is_some_and(|t| t.split([';', ',', ' ']).any(|t| !t.is_empty() && !valid_tag(t)))
    {
        return Err(PveError::param("tags", "invalid format - invalid characters in tag"));
    }
    let volid =
        set.get("ide2").map(text).map(|v| v.split(',').next().unwrap_or_default().to_string());
    let iso = volid.filter(|v| v.contains(":iso/"));
    let seed = match &iso {
        Some(v) => match b.backend.isos.get_mut(&(at.to_string(), v.clone())) {
            Some(iso) => {
                iso.attached = Some(vmid.to_string());
                iso9660::read(&iso.image).ok().and_then(|i| i.files.get("user-data").cloned())
            }
            None => return Err(b.backend.err(500, format!("volume '{v}' does not exist"))),
        },
        None => None,
    };
    let r = b.fleet.get_mut(vmid).expect("checked above");
    for (k, v) in set {
        match k.as_str() {
            "tags" => {
                r.extra.tags = text(&v);
                r.labels = tag_marks(&r.extra.tags);
                let created = r
                    .extra
                    .tags
                    .split(';')
                    .find_map(|t| t.strip_prefix("egress.created.")?.parse().ok());
                r.created_at = created.unwrap_or(r.created_at);
            }
            "description" => r.extra.description = text(&v),
            "delete" => text(&v).split(',').for_each(|key| drop(r.extra.config.remove(key.trim()))),
            "digest" => {}
            _ => drop(r.extra.config.insert(k, text(&v))),
        }
    }
    if iso.is_some() {
        r.user_data = seed.unwrap_or_default();
    }
    Ok(Value::Null)
}

async fn current(State(s): St, Path((at, vmid)): VmPath) -> Response {
    let mut b = s.lock();
    settle(&mut b);
    let v = vm(&b, &at, &vmid).map(|r| {
        let name = if r.extra.cloning.is_some() { format!("VM {vmid}") } else { r.name.clone() };
        let mut v = json!({"vmid": r.id.parse::<u64>().unwrap_or_default(), "name": name, "status": status_of(r),
            "qmpstatus": status_of(r), "cpus": 1, "maxmem": 1 << 30, "uptime": 0});
        if let Some(lock) = lock_of(r) {
            v["lock"] = lock.into();
        }
        if !r.extra.tags.is_empty() && r.extra.cloning.is_none() {
            v["tags"] = r.extra.tags.as_str().into();
        }
        v
    });
    answer(v)
}

async fn start(State(s): St, Path((at, vmid)): VmPath) -> Response {
    let mut b = s.lock();
    settle(&mut b);
    let r = match vm(&b, &at, &vmid) {
        Ok(r) => r.clone(),
        Err(e) => return e.into_response(),
    };
    if let Some(lock) = lock_of(&r) {
        return b.backend.err(500, format!("VM is locked ({lock})")).into_response();
    }
    // The worker takes the config lock (waiting for a start that holds it), then refuses a running VM.
    let p = &mut b.backend;
    let takes = p.cfg.start_time;
    let booting = |p: &super::Pve| p.tasks.values().any(|t| t.boots && t.id == vmid);
    let (ends, exit, locks) = match p.lock_wait(&vmid) {
        Err(give_up) => (give_up, Some(lock_timeout(&vmid)), false),
        Ok(free) if booting(p) || status_of(&r) == "running" => {
            (free, Some(format!("VM {vmid} already running")), false)
        }
        Ok(free) => (free + takes, p.failing_starts.pop_front(), true),
    };
    let boots = locks && exit.is_none();
    let upid = p.task_until(&at, "qmstart", &vmid, ends, exit);
    if let Some(t) = p.tasks.get_mut(&upid) {
        (t.locks, t.boots) = (locks, boots);
    }
    settle(&mut b);
    answer(Ok(upid.into()))
}

/// `vm_stop` runs inside `lock_config`: a stop sent during a start ends after it (the VM ran for a moment), or gives
/// up on the lock and changes nothing.
async fn stop(State(s): St, Path((at, vmid)): VmPath) -> Response {
    let mut b = s.lock();
    settle(&mut b);
    if let Err(e) = vm(&b, &at, &vmid) {
        return e.into_response();
    }
    let (ends, exit) = match b.backend.lock_wait(&vmid) {
        Err(give_up) => (give_up, Some(lock_timeout(&vmid))),
        Ok(free) => {
            let starts = b.backend.tasks.values_mut().filter(|t| t.boots && t.id == vmid);
            starts.for_each(|t| t.boots = false);
            Model::set_state(&mut *b, &vmid, "stopped");
            (free, None)
        }
    };
    answer(Ok(b.backend.task_until(&at, "qmstop", &vmid, ends, exit).into()))
}

async fn destroy(State(s): St, Path((at, vmid)): VmPath) -> Response {
    let mut b = s.lock();
    settle(&mut b);
    let r = match vm(&b, &at, &vmid) {
        Ok(r) => r,
        Err(e) => return e.into_response(),
    };
    if status_of(r) == "running" {
        return b
            .backend
            .err(500, format!("VM {vmid} is running - destroy failed"))
            .into_response();
    }
    let exit = match lock_of(r) {
        Some(lock) => Some(format!("VM is locked ({lock})")),
        None => match b.fleet.delete(&vmid) {
            Deletion::Done(_) => None,
            _ => Some(format!(
                "can't lock file '/var/lock/qemu-server/lock-{vmid}.conf' - got timeout"
            )),
        },
    };
    answer(Ok(b.backend.task(&at, "qmdestroy", &vmid, Duration::ZERO, exit).into()))
}

async fn agent(State(s): St, Path((at, vmid)): VmPath) -> Response {
    let mut b = s.lock();
    settle(&mut b);
    let r = match vm(&b, &at, &vmid) {
        Ok(r) => r,
        Err(e) => return e.into_response(),
    };
    let enabled =
        r.extra.config.get("agent").is_some_and(|a| a.starts_with('1') || a.contains("enabled=1"));
    let why = match () {
        _ if status_of(r) != "running" => format!("VM {vmid} is not running"),
        _ if !enabled => "No QEMU guest agent configured".into(),
        // Booting: the agent in the guest has not started yet.
        _ if r.extra.agent_down || r.state != "running" => "QEMU guest agent is not running".into(),
        _ => String::new(),
    };
    if !why.is_empty() {
        let e = b.backend.err(500, why);
        // A read of a booting guest: the schedule counts it (the guest has booted after so many).
        b.saw(&vmid);
        return e.into_response();
    }
    let mut eth = vec![
        json!({"ip-address-type": "ipv6", "ip-address": "fe80::be24:11ff:fe00:1", "prefix": 64}),
    ];
    if let Some(ip) = &r.ip {
        eth.insert(0, json!({"ip-address-type": "ipv4", "ip-address": ip, "prefix": 24}));
    }
    let lo = json!({"name": "lo", "hardware-address": "00:00:00:00:00:00", "ip-addresses": [
        {"ip-address-type": "ipv4", "ip-address": "127.0.0.1", "prefix": 8}, {"ip-address-type": "ipv6", "ip-address": "::1", "prefix": 128}]});
    let nic = json!({"name": "eth0", "hardware-address": "bc:24:11:00:00:01", "ip-addresses": eth});
    answer(Ok(json!({"result": [lo, nic]})))
}

/// A task's status as `tasks/{upid}/status` renders it; `None` for an unknown UPID.
pub(super) fn task_status(b: &Backend, upid: &str) -> Option<Value> {
    let t = b.backend.tasks.get(upid)?.clone();
    let running = Instant::now() < t.ends;
    let hex = |i: usize| {
        upid.split(':').nth(i).and_then(|h| u64::from_str_radix(h, 16).ok()).unwrap_or_default()
    };
    let mut v = json!({"upid": upid, "node": t.node, "pid": hex(2), "pstart": hex(3), "starttime": hex(4), "type": t.kind,
        "id": t.id, "user": b.backend.cfg.token_id, "status": if running { "running" } else { "stopped" }});
    if !running {
        v["exitstatus"] = t.exit.unwrap_or_else(|| "OK".into()).into();
    }
    Some(v)
}

async fn task(State(s): St, Path((at, upid)): VmPath) -> Response {
    let mut b = s.lock();
    settle(&mut b);
    let known = b.backend.tasks.get(&upid).is_some_and(|t| t.node == at);
    answer(match node(&b, &at) {
        Err(e) => Err(e),
        Ok(()) if !known => Err(PveError::param("upid", "no such task")),
        Ok(()) => Ok(task_status(&b, &upid).expect("known")),
    })
}

async fn node_status(State(s): St, Path(at): Path<String>) -> Response {
    let b = s.lock();
    answer(node(&b, &at).map(|()| {
        json!({"memory": {"total": 68_719_476_736u64, "used": 8_589_934_592u64, "free": 60_129_542_144u64}, "cpu": 0.03,
               "uptime": 86_400, "pveversion": "pve-manager/9.0.3/025864202ebb6109", "kversion": "Linux 6.14.8-2-pve"})
    }))
}

/// An upload's form: its fields, the file's name and contents.
struct Form {
    fields: BTreeMap<String, String>,
    filename: String,
    file: Vec<u8>,
}

/// A `multipart/form-data` body as pveproxy reads an upload: `content`, then optionally `checksum-algorithm` and
/// `checksum`, then the file in a field named `filename`, last. Anything else is refused.
fn multipart(body: &[u8], boundary: &str) -> Result<Form, String> {
    let delim = format!("--{boundary}");
    let find = |hay: &[u8], from: usize| {
        hay[from..].windows(delim.len()).position(|w| w == delim.as_bytes()).map(|i| i + from)
    };
    let (mut at, mut fields, mut expect) = (
        find(body, 0).ok_or("no boundary")?,
        BTreeMap::new(),
        ["content", "checksum-algorithm", "checksum"].iter(),
    );
    loop {
        let part_start = at + delim.len();
        if body[part_start..].starts_with(b"--") {
            return Err("the file part is missing".into());
        }
        let next = find(body, part_start).ok_or("no closing boundary")?;
        let part = body[part_start..next]
            .strip_prefix(b"\r\n")
            .ok_or("a part does not start on a new line")?;
        let part = part.strip_suffix(b"\r\n").ok_or("a part does not end on a new line")?;
        let split =
            part.windows(4).position(|w| w == b"\r\n\r\n").ok_or("a part has no header end")?;
        let head = String::from_utf8_lossy(&part[..split]).to_string();
        let data = &part[split + 4..];
        let disposition = head
            .lines()
            .find_map(|l| l.strip_prefix("Content-Disposition: "))
            .ok_or("a part has no Content-Disposition")?;
        let attr = |key: &str| {
            disposition
                .split("; ")
                .find_map(|p| p.strip_prefix(&format!("{key}=\""))?.strip_suffix('"'))
                .map(str::to_string)
        };
        if !disposition.starts_with("form-data;") {
            return Err(format!("Content-Disposition {disposition:?} is not form-data"));
        }
        let name = attr("name").ok_or("a part has no name")?;
        if let Some(filename) = attr("filename") {
            if name != "filename" {
                return Err(format!(
                    "wrong field name '{name}' for file upload, expected 'filename'"
                ));
            }
            if !body[next + delim.len()..].starts_with(b"--") {
                return Err("the file part is not the last".into());
            }
            return Ok(Form { fields, filename, file: data.to_vec() });
        }
        if !expect.any(|e| *e == name) {
            return Err(format!(
                "field {name:?} out of pveproxy's order (content, checksum-algorithm, checksum, file)"
            ));
        }
        fields.insert(name, String::from_utf8_lossy(data).to_string());
        at = next;
    }
}

async fn upload(
    State(s): St,
    Path((at, storage)): VmPath,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let mut b = s.lock();
    if let Err(e) = node(&b, &at) {
        return e.into_response();
    }
    if storage != b.backend.cfg.iso_storage {
        return b.backend.err(500, format!("storage '{storage}' does not exist")).into_response();
    }
    let ct = headers.get("content-type").and_then(|v| v.to_str().ok()).unwrap_or_default();
    let Some(boundary) = ct.strip_prefix("multipart/form-data; boundary=") else {
        return b.backend.err(500, "missing temporary file name").into_response();
    };
    let Form { fields, filename, file: image } = match multipart(&body, boundary) {
        Ok(p) => p,
        Err(why) => return b.backend.err(500, format!("upload failed: {why}")).into_response(),
    };
    if fields.get("content").map(String::as_str) != Some("iso") {
        return PveError::param("content", "upload content type not allowed").into_response();
    }
    let filename: String = filename
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() || "_.-".contains(c) { c } else { '_' })
        .collect();
    if !(filename.ends_with(".iso") || filename.ends_with(".img")) {
        return PveError::param("filename", "wrong file extension").into_response();
    }
    let got = format!("{:x}", Sha256::digest(&image));
    let exit = match (fields.get("checksum-algorithm").map(String::as_str), fields.get("checksum"))
    {
        (Some("sha256"), Some(want)) if !want.eq_ignore_ascii_case(&got) => {
            Some(format!("checksum mismatch: got '{got}' != expect '{want}'"))
        }
        (Some(a), _) if a != "sha256" => {
            return PveError::param("checksum-algorithm", "value not supported by the emulator")
                .into_response();
        }
        _ => None,
    };
    if exit.is_none() {
        b.backend.isos.insert(
            (at.clone(), format!("{storage}:iso/{filename}")),
            super::Iso { image, attached: None },
        );
    }
    answer(Ok(b.backend.task(&at, "imgcopy", "", Duration::ZERO, exit).into()))
}

async fn content(State(s): St, Path((at, storage)): VmPath) -> Response {
    let b = s.lock();
    let list = node(&b, &at).map(|()| {
        let mine = b.backend.isos.iter().filter(|((n, v), _)| *n == at && v.starts_with(&format!("{storage}:")));
        mine.map(|((_, v), iso)| json!({"volid": v, "format": "iso", "content": "iso", "size": iso.image.len(), "ctime": 0})).collect()
    });
    answer(list)
}

async fn content_delete(
    State(s): St,
    Path((at, storage, volume)): Path<(String, String, String)>,
) -> Response {
    let mut b = s.lock();
    if let Err(e) = node(&b, &at) {
        return e.into_response();
    }
    let volid = if volume.contains(':') { volume } else { format!("{storage}:{volume}") };
    let exit = match b.backend.isos.remove(&(at.clone(), volid.clone())) {
        Some(_) => None,
        None => Some(format!("unable to remove '{volid}': No such file or directory")),
    };
    answer(Ok(b.backend.task(&at, "imgdel", &storage, Duration::ZERO, exit).into()))
}
