//! An emulator of the Proxmox VE API (`/api2/json`) for QEMU VMs, after the API viewer's schema and the code behind
//! it (pve-manager, qemu-server, pve-storage, pve-http-server: clone, tasks, locks, the guest agent, uploads), for
//! `providers-wasm/proxmox`.
//!
//! Under `Authorization: PVEAPIToken=<user@realm!token>=<secret>` (else 401 with an empty body); a chunked request
//! body is refused with 501, as pveproxy reads bodies by `Content-Length` only. Answers are
//! `{"data": ...}`; errors `{"data": null, "message": ...}` (the message in the body as pve-http-server 6 / PVE 9
//! writes it; [`ProxmoxConfig::messages_in_body`] `false` answers as PVE 8 and earlier, which put it only in the
//! reason phrase) and for bad parameters 400 with `errors: {param: why}`. A missing VM is a 500 like any failure.
//! - `GET /cluster/resources?type=vm`: templates and VMs with `vmid`, `node`, `name`, `status`, `tags`, `lock`,
//!   `template`. A VM on a node made to fail ([`Emulator::fail_scope`]) is `status: unknown` without a name, as when
//!   its node stops reporting; calls routed to that node answer 595.
//! - `GET /cluster/nextid[?vmid=N]`: the lowest free VMID from 100, or N, or 400 `VM N already exists`.
//! - `POST /nodes/{node}/qemu/{template}/clone` `{newid, name, description, full, target, pool}`: 500 `unable to
//!   create VM N: config file already exists` for a VMID in use, else a `qmclone` UPID. The new VM exists at once
//!   with the temporary config (`VM N`, `lock: clone`, nothing else) until the task ends after
//!   [`ProxmoxConfig::clone_time`]; then it has the template's config, the name and description, no lock. A clone
//!   queued with [`ProxmoxEmulator::fail_next_clone`] removes the VM and ends with that exit status.
//! - `GET`/`PUT /nodes/{node}/qemu/{vmid}/config`: the config; a PUT sets keys (`delete` removes some), checks tags
//!   against Proxmox's tag syntax and that an `ide2` ISO exists, and refuses a locked VM (500 `VM is locked (x)`).
//!   A PUT takes the VM's config lock as `update_vm_api` does (`lock_config`, 10 s,
//!   [`ProxmoxConfig::config_lock_wait`]): while a start task holds it the PUT waits, and past the wait answers 500
//!   `can't lock file '/var/lock/qemu-server/lock-{vmid}.conf' - got timeout`, pve-common's `lock_file_full` words.
//!   Attaching a seed ISO reads it with [`iso9660`] (not the plugin's writer): its `user-data` becomes the VM's
//!   user data, which real-proxy mode runs.
//! - `GET .../status/current`; `POST .../status/start` (`qmstart`, [`ProxmoxEmulator::fail_next_start`]): the task
//!   runs [`ProxmoxConfig::start_time`] holding the VM's config lock (`vm_start` runs inside `lock_config`), the VM
//!   `stopped` meanwhile; then QEMU runs (`running`) and the guest boots: the agent answers `QEMU guest agent is not
//!   running` until the [`Schedule`] says it has booted, each such answer counting as a read. A second start waits
//!   for the lock as well and ends `VM {vmid} already running`, or with the lock error past the wait.
//!   `.../status/stop` (`qmstop`) waits for a start's lock too, then stops the VM. `DELETE /nodes/{node}/qemu/{vmid}`
//!   (500 while running; a locked VM's `qmdestroy` task fails; a slow delete shows `lock: destroyed`).
//! - `GET .../agent/network-get-interfaces`: `lo` and `eth0` with the VM's address; 500 `VM N is not running`, `No
//!   QEMU guest agent configured`, or `QEMU guest agent is not running` ([`ProxmoxEmulator::set_agent`]).
//! - `GET /nodes/{node}/tasks/{upid}/status`: `running`/`stopped` with `exitstatus`; 400 `no such task`.
//! - `POST /nodes/{node}/storage/{storage}/upload` (multipart: `content`, `checksum-algorithm`, `checksum`, then the
//!   file in a field named `filename`, in that order, as pveproxy parses it) -> `imgcopy` UPID; a wrong checksum
//!   fails the task. `GET .../content?content=iso`, `DELETE .../content/{volume}` (`imgdel`).
//! - `GET /nodes/{node}/status`: memory, CPU, version.
//!
//! Faults: `server-error` 500 `cfs-lock ... got lock request timeout`, `quota` 500 out of space on storage (Proxmox
//! has no quotas), `rate-limit` 503 from a proxy in front (Proxmox has no rate limit), `auth` 401. Not emulated: the
//! 3 s delay pveproxy adds to a 401, statistics a few seconds late in the resource list, migration, HA, a destroy
//! waiting for the config lock.
//!
//! Marks: the plugin writes them as tags (`egress.managed`, `egress.uid.<v>`, `egress.inst.<v>`,
//! `egress.created.<unix>`, values escaped `_xx`); the emulator decodes them into the dump's labels and writes
//! them (and the description lines) for planted VMs.

mod api;
pub mod iso9660;
#[cfg(test)]
mod tests;

use std::collections::{BTreeMap, VecDeque};
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::http::{HeaderMap, Method, StatusCode};
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};

use crate::control::{DumpSecondary, FaultKind, FaultOp, Plant, RateLimit, Refusal};
use crate::framework::{Adapter, Cloud, Fleet, Schedule, Served, Shared, States, marks};
use crate::real_proxy::RealProxies;
use crate::tls::TestCa;

pub const EMULATOR_TOKEN_ID: &str = "egress@pve!operator";
pub const EMULATOR_TOKEN_SECRET: &str = "5f0a7a4e-2b6c-4f7e-9d2a-0c1b2a3d4e5f";
/// `PVE::AbstractConfig::lock_config`'s timeout for the VM's config lock.
pub const CONFIG_LOCK_WAIT: Duration = Duration::from_secs(10);

/// What one emulator holds and accepts.
#[derive(Clone)]
pub struct ProxmoxConfig {
    pub token_id: String,
    pub token_secret: String,
    /// Nodes; the first is where a plant without a scope goes.
    pub nodes: Vec<String>,
    /// Templates: VMID, name, node.
    pub templates: Vec<(u32, String, String)>,
    /// The storage with `iso` content (node-local, as `local` is).
    pub iso_storage: String,
    /// How long a clone task runs.
    pub clone_time: Duration,
    /// How long a start task (`qmstart`) runs. PVE's `vm_start` holds the VM's config lock for all of it: until it
    /// ends the VM is stopped, config writes wait for the lock, and only then does QEMU run and the guest boot.
    pub start_time: Duration,
    /// How long a config write waits for the VM's config lock before it fails: `lock_config` takes it with a
    /// 10 s timeout (pve-guest-common `PVE/AbstractConfig.pm`); shorter only to keep tests short.
    pub config_lock_wait: Duration,
    /// When a started VM runs.
    pub schedule: Schedule,
    /// PVE 9's error bodies (with `message`); `false`: PVE 8's (`{"data": null}`).
    pub messages_in_body: bool,
    pub rate_limit: Option<RateLimit>,
    pub real_proxies: Option<Arc<RealProxies>>,
}

impl Default for ProxmoxConfig {
    fn default() -> Self {
        ProxmoxConfig {
            token_id: EMULATOR_TOKEN_ID.into(),
            token_secret: EMULATOR_TOKEN_SECRET.into(),
            nodes: vec!["pve1".into(), "pve2".into()],
            templates: vec![(9000, "debian-12-cloud".into(), "pve1".into())],
            iso_storage: "local".into(),
            clone_time: Duration::from_millis(50),
            start_time: Duration::ZERO,
            config_lock_wait: CONFIG_LOCK_WAIT,
            schedule: Schedule::AfterReads(1),
            messages_in_body: true,
            rate_limit: None,
            real_proxies: None,
        }
    }
}

/// An error answer: status, message, and the `errors` map of a parameter error.
#[derive(Debug, Clone)]
pub struct PveError {
    pub status: u16,
    pub message: String,
    pub errors: Option<Value>,
    legacy: bool,
}

impl PveError {
    pub fn new(status: u16, message: impl Into<String>) -> Self {
        PveError { status, message: message.into(), errors: None, legacy: false }
    }

    /// 400 `Parameter verification failed.` with `param: why`.
    pub fn param(param: &str, why: &str) -> Self {
        let mut e = PveError::new(400, "Parameter verification failed.");
        e.errors = Some(json!({ param: format!("{why}\n") }));
        e
    }

    fn body(&self) -> Value {
        let mut body = json!({"data": null});
        if let Some(errors) = &self.errors {
            body["errors"] = errors.clone();
        }
        if !self.legacy && self.status != 401 {
            body["message"] = format!("{}\n", self.message).into();
        }
        body
    }
}

impl IntoResponse for PveError {
    fn into_response(self) -> Response {
        let status = StatusCode::from_u16(self.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        match self.status {
            401 | 503 => status.into_response(),
            _ => (status, axum::Json(self.body())).into_response(),
        }
    }
}

impl From<PveError> for Refusal {
    fn from(e: PveError) -> Refusal {
        Refusal::new(e.status, e.body())
    }
}

/// A VM beyond the common record: what its config holds, and the tasks that change it.
#[derive(Debug, Clone, Default)]
pub struct Vm {
    pub description: String,
    pub tags: String,
    /// Every other config key (`ide2`, `agent`, `cores`, `net0`, `scsi0`, ...).
    pub config: BTreeMap<String, String>,
    /// The clone task still writing this VM.
    pub cloning: Option<String>,
    /// The guest agent does not answer.
    pub agent_down: bool,
}

/// A task: its node, type, the VMID or storage it names, when it ends and how (`None`: `OK`).
#[derive(Debug, Clone)]
struct Task {
    node: String,
    kind: &'static str,
    id: String,
    ends: Instant,
    exit: Option<String>,
    /// It holds the VM's config lock until it ends (a start: `vm_start` runs inside `lock_config`).
    locks: bool,
    /// When it ends, QEMU runs and the guest boots (a start that has not been cancelled by a stop).
    boots: bool,
}

/// An uploaded ISO, and the VM that has it as `ide2`.
#[derive(Debug, Clone)]
struct Iso {
    image: Vec<u8>,
    attached: Option<String>,
}

/// Proxmox's side of the framework.
pub struct Pve {
    cfg: ProxmoxConfig,
    tasks: BTreeMap<String, Task>,
    /// By node and volid.
    isos: BTreeMap<(String, String), Iso>,
    failing_clones: VecDeque<String>,
    failing_starts: VecDeque<String>,
    pid: u32,
}

/// Tag syntax (`pve-tag`).
pub fn valid_tag(t: &str) -> bool {
    let ok = |b: u8| b.is_ascii_alphanumeric() || b"_+.-".contains(&b);
    t.bytes().all(ok) && t.bytes().next().is_some_and(|b| b.is_ascii_alphanumeric() || b == b'_')
}

/// A `dns-name` (a VM name).
pub fn valid_name(n: &str) -> bool {
    let label = |l: &str| {
        !l.is_empty()
            && l.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-')
            && !l.starts_with('-')
            && !l.ends_with('-')
    };
    n.split('.').all(label)
}

fn escape(s: &str) -> String {
    s.bytes()
        .map(|b| {
            if b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' {
                (b as char).to_string()
            } else {
                format!("_{b:02x}")
            }
        })
        .collect()
}

fn unescape(s: &str) -> Option<String> {
    let mut out = Vec::new();
    let mut it = s.bytes();
    while let Some(b) = it.next() {
        match b {
            b'_' => {
                let hex = [it.next()?, it.next()?];
                out.push(u8::from_str_radix(std::str::from_utf8(&hex).ok()?, 16).ok()?);
            }
            b => out.push(b),
        }
    }
    String::from_utf8(out).ok()
}

/// The contract's marks a VM's tags carry (an installation too long for a tag stays hashed, as the plugin wrote it).
pub fn tag_marks(tags: &str) -> BTreeMap<String, String> {
    let mut m = BTreeMap::new();
    for t in tags.split([';', ',', ' ']).map(str::to_ascii_lowercase) {
        let (key, value) = match t.as_str() {
            "egress.managed" => (crate::MARK_MANAGED, Some(crate::MARK_MANAGED_YES.to_string())),
            _ if t.starts_with("egress.uid.") => {
                (crate::MARK_UID, unescape(&t["egress.uid.".len()..]))
            }
            _ if t.starts_with("egress.inst.") => {
                (crate::MARK_INSTALLATION, unescape(&t["egress.inst.".len()..]))
            }
            _ => continue,
        };
        if let Some(v) = value {
            m.insert(key.to_string(), v);
        }
    }
    m
}

impl Pve {
    /// A new task; its UPID as Proxmox encodes it.
    fn task(
        &mut self,
        node: &str,
        kind: &'static str,
        id: &str,
        takes: Duration,
        exit: Option<String>,
    ) -> String {
        self.task_until(node, kind, id, Instant::now() + takes, exit)
    }

    /// A new task ending at `ends`; see [`Pve::task`].
    fn task_until(
        &mut self,
        node: &str,
        kind: &'static str,
        id: &str,
        ends: Instant,
        exit: Option<String>,
    ) -> String {
        self.pid += 1;
        let (now, user) = (crate::time::now_secs(), &self.cfg.token_id);
        let upid = format!(
            "UPID:{node}:{:08X}:{:08X}:{now:08X}:{kind}:{id}:{user}:",
            0x1000 + self.pid,
            0x100_0000 + self.pid
        );
        let (locks, boots) = (false, false);
        let task = Task { node: node.into(), kind, id: id.into(), ends, exit, locks, boots };
        self.tasks.insert(upid.clone(), task);
        upid
    }

    /// Until when a task holds VM `vmid`'s config lock, if one does now.
    fn lock_until(&self, vmid: &str) -> Option<Instant> {
        let now = Instant::now();
        let holding = self.tasks.values().filter(|t| t.locks && t.id == vmid && t.ends > now);
        holding.map(|t| t.ends).max()
    }

    /// What waiting for VM `vmid`'s config lock comes to for a call made now: `Ok(when)` the lock is free (now, or
    /// when the task holding it ends), or `Err(when)` the wait gives up, as `lock_config` does after its timeout.
    fn lock_wait(&self, vmid: &str) -> Result<Instant, Instant> {
        let now = Instant::now();
        let give_up = now + self.cfg.config_lock_wait;
        match self.lock_until(vmid) {
            None => Ok(now),
            Some(until) if until <= give_up => Ok(until),
            Some(_) => Err(give_up),
        }
    }

    fn node_ok(&self, node: &str) -> bool {
        self.cfg.nodes.iter().any(|n| n == node)
    }

    fn template(&self, vmid: u32) -> Option<&(u32, String, String)> {
        self.cfg.templates.iter().find(|t| t.0 == vmid)
    }

    fn err(&self, status: u16, message: impl Into<String>) -> PveError {
        PveError { legacy: !self.cfg.messages_in_body, ..PveError::new(status, message) }
    }
}

/// How pve-common's `lock_file_full` reports a lock not had within the timeout.
fn lock_timeout(vmid: &str) -> String {
    format!("can't lock file '/var/lock/qemu-server/lock-{vmid}.conf' - got timeout")
}

impl Adapter for Pve {
    type Extra = Vm;
    type Error = PveError;
    const STATES: States =
        States { provisioning: "starting", running: "running", deleting: "destroyed" };

    fn id(&self, n: u64) -> String {
        (1000 + n).to_string()
    }

    fn address(&self, n: u64) -> String {
        format!("10.20.{}.{}", n / 250, 2 + n % 250)
    }

    fn default_scope(&self) -> String {
        self.cfg.nodes[0].clone()
    }

    fn plant(&self, plant: &Plant, scope: &str) -> Result<Vm, PveError> {
        if !self.node_ok(scope) {
            return Err(self.err(595, format!("no such node '{scope}'")));
        }
        if !valid_name(&plant.name) {
            return Err(PveError::param("name", "value does not look like a valid DNS name"));
        }
        let created = plant.created_at.unwrap_or_else(crate::time::now_secs);
        let mut tags: Vec<String> = Vec::new();
        let mut description = String::new();
        for (k, v) in marks(plant) {
            description += &format!("{k}={v}\n");
            let name = k.trim_start_matches(crate::MARK_PREFIX);
            tags.push(match name {
                "managed" => "egress.managed".into(),
                "uid" => format!("egress.uid.{}", escape(&v)),
                _ => format!("egress.inst.{}", escape(&v)),
            });
        }
        tags.push(format!("egress.created.{created}"));
        let config = BTreeMap::from([("agent".to_string(), "1".to_string())]);
        Ok(Vm { description, tags: tags.join(";"), config, ..Vm::default() })
    }

    fn name_taken(&self) -> PveError {
        PveError::param("name", "name already used (control surface)")
    }

    fn fault(&self, kind: &FaultKind) -> PveError {
        match kind {
            FaultKind::Quota => {
                self.err(500, "storage 'local-lvm' does not have enough free space")
            }
            FaultKind::RateLimit => self.err(503, "Service Unavailable"),
            FaultKind::Auth => self.err(401, "authentication failure"),
            FaultKind::ServerError | FaultKind::Slow { .. } => {
                self.err(500, "cfs-lock 'file-replication_cfg' error: got lock request timeout")
            }
        }
    }

    fn classify(&self, method: &Method, path: &str) -> (Option<FaultOp>, String) {
        let mut route = Vec::new();
        let mut prev = "";
        for seg in path.trim_start_matches("/api2/json").split('/').skip(1) {
            let named = match prev {
                "nodes" => "{node}",
                "qemu" => "{vmid}",
                "tasks" => "{upid}",
                "storage" => "{storage}",
                "content" => "{volume}",
                _ => seg,
            };
            route.push(named);
            prev = seg;
        }
        let route = format!("/{}", route.join("/"));
        let op = match (method.as_str(), route.as_str()) {
            ("GET", "/cluster/resources") => Some(FaultOp::List),
            ("GET", "/cluster/nextid") | ("PUT", "/nodes/{node}/qemu/{vmid}/config") => {
                Some(FaultOp::Create)
            }
            ("POST", r)
                if r.ends_with("/clone")
                    || r.ends_with("/upload")
                    || r.ends_with("/status/start") =>
            {
                Some(FaultOp::Create)
            }
            ("GET", r)
                if r.ends_with("/status/current")
                    || r.ends_with("/config")
                    || r.contains("/agent/") =>
            {
                Some(FaultOp::Get)
            }
            ("POST", r) if r.ends_with("/status/stop") => Some(FaultOp::Delete),
            ("DELETE", _) => Some(FaultOp::Delete),
            ("GET", r) if r.ends_with("/content") => Some(FaultOp::Delete),
            _ => None,
        };
        (op, format!("{method} {route}"))
    }

    fn authorized(&self, headers: &HeaderMap) -> bool {
        let want = format!("PVEAPIToken={}={}", self.cfg.token_id, self.cfg.token_secret);
        headers.get("authorization").and_then(|v| v.to_str().ok()) == Some(want.as_str())
    }

    fn unauthorized(&self) -> PveError {
        self.err(401, "authentication failure")
    }

    fn rate_limited(&self, _limit: RateLimit) -> PveError {
        self.err(503, "Service Unavailable")
    }

    fn secondary(&self) -> Vec<DumpSecondary> {
        let iso = |((node, volid), iso): (&(String, String), &Iso)| DumpSecondary {
            kind: "iso".into(),
            id: format!("{node}/{volid}"),
            attached_to: iso.attached.clone(),
        };
        self.isos.iter().map(iso).collect()
    }

    fn reset(&mut self) {
        self.tasks.clear();
        self.isos.clear();
        self.failing_clones.clear();
        self.failing_starts.clear();
    }
}

type Backend = Cloud<Pve>;

/// A running Proxmox VE emulator on 127.0.0.1. Stops, closing every connection, when dropped.
pub type ProxmoxEmulator = Served<Backend>;

impl Served<Backend> {
    /// Start on an OS-chosen port; the API is under `/api2/json`.
    pub fn start(cfg: ProxmoxConfig) -> ProxmoxEmulator {
        Self::start_with(cfg, 0, None).expect("bind 127.0.0.1:0")
    }

    pub fn start_on_port(cfg: ProxmoxConfig, port: u16) -> std::io::Result<ProxmoxEmulator> {
        Self::start_with(cfg, port, None)
    }

    /// Over HTTPS with a certificate `ca` signed, as a Proxmox host serves its API with one of its
    /// cluster's CA: only a client that trusts `ca` gets an answer.
    pub fn start_tls(cfg: ProxmoxConfig, ca: &TestCa) -> ProxmoxEmulator {
        Self::start_with(cfg, 0, Some(ca)).expect("bind 127.0.0.1:0")
    }

    fn start_with(
        cfg: ProxmoxConfig,
        port: u16,
        ca: Option<&TestCa>,
    ) -> std::io::Result<ProxmoxEmulator> {
        let (listener, _) = crate::framework::bind(port)?;
        let fleet = Fleet::new(Pve::STATES, cfg.schedule, cfg.real_proxies.clone());
        let limit = cfg.rate_limit;
        let (tasks, isos, failing_clones, failing_starts) = Default::default();
        let pve = Pve { cfg, tasks, isos, failing_clones, failing_starts, pid: 0 };
        let state = Shared::new(Cloud::new(pve, fleet, limit));
        let api = crate::framework::gated(api::routes(), &state)
            .layer(axum::middleware::from_fn(api::no_chunked));
        let app = axum::Router::new().nest("/api2/json", api);
        Ok(match ca {
            Some(ca) => Served::serve_tls("proxmox-emulator", listener, state, app, ca),
            None => Served::serve("proxmox-emulator", listener, state, app),
        })
    }

    /// The next clone removes its VM when its task ends, which fails with `exit` (e.g. `clone failed: ...`).
    pub fn fail_next_clone(&self, exit: &str) {
        self.lock().backend.failing_clones.push_back(exit.into());
    }

    /// The next start task fails with `exit`; the VM stays stopped.
    pub fn fail_next_start(&self, exit: &str) {
        self.lock().backend.failing_starts.push_back(exit.into());
    }

    /// How long the start tasks from now on run (see [`ProxmoxConfig::start_time`]).
    pub fn set_start_time(&self, takes: Duration) {
        self.lock().backend.cfg.start_time = takes;
    }

    /// Whether VM `vmid`'s guest agent answers (it does unless told otherwise).
    pub fn set_agent(&self, vmid: &str, running: bool) -> bool {
        let mut b = self.lock();
        b.fleet.get_mut(vmid).map(|r| r.extra.agent_down = !running).is_some()
    }

    /// VM `vmid`'s config as `GET .../config` shows it, without counting a read.
    pub fn config(&self, vmid: &str) -> Option<Value> {
        let b = self.lock();
        b.fleet.get(vmid).map(api::config_of)
    }

    /// The seed image attached to VM `vmid` as `ide2`, read with [`iso9660`].
    pub fn seed(&self, vmid: &str) -> Option<Result<iso9660::Image, String>> {
        let b = self.lock();
        let r = b.fleet.get(vmid)?;
        let (_, image) = api::attached_iso(&b.backend, r)?;
        Some(iso9660::read(image))
    }

    /// Every ISO in the ISO storages, as `node/volid`.
    pub fn isos(&self) -> Vec<String> {
        self.lock().backend.isos.keys().map(|(n, v)| format!("{n}/{v}")).collect()
    }

    /// Every task so far: UPID and exit status (`None` while running).
    pub fn tasks(&self) -> Vec<(String, Option<String>)> {
        let b = self.lock();
        let upids: Vec<String> = b.backend.tasks.keys().cloned().collect();
        upids
            .into_iter()
            .map(|u| {
                let status = api::task_status(&b, &u);
                (u, status.and_then(|s| s["exitstatus"].as_str().map(str::to_string)))
            })
            .collect()
    }
}
