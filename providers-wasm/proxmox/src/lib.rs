//! Proxmox VE provider: each egress proxy is a QEMU VM cloned from a template, its cloud-init on a NoCloud seed ISO.
//! Config in [`config`], the API and its classify function in [`api`], tags, description and IDs in [`marks`], the
//! seed image in [`iso`]; this file is the contract, operation by operation. docs/providers/proxmox.md is the user's
//! guide and gives the reason for every choice of the behaviour profile below.

mod api;
mod config;
mod iso;
mod marks;

use api::{Api, Resource, Status, Task, VmConfig, task_failure};
use egress_guest_sdk::http::{HttpError, Method, encode_component};
use egress_guest_sdk::outcome::{self, Outcomes};
use egress_guest_sdk::{
    self as sdk, CreateRequest, Datetime, Instance, Level, PluginInfo, Provider, ProviderError, State, TargetStatus,
    export_provider,
};
use marks::Id;
use serde_json::{Value, json};
use sha2::{Digest, Sha256};

struct Proxmox;
export_provider!(Proxmox);

/// The behaviour profile (provider contract section 4); the guide's "Behaviour profile" section gives the reasons.
const PROFILE: &str = "readiness=provisioning-window create-return=submit delete-return=returns-early \
    ip-source=discovered gc-mark=written-metadata created-at=written-at-create list-partial=omit-unreachable \
    quota=absent not-found=list-and-miss primary-key=allocated-id provisioning-state=marker async-ops=task-handle \
    secondary-resources=explicit credentials=mounted-files client-kind=thin-client timeouts=per-call \
    logging=outcome-only child-spans=transport-wrapper backend-test=integration-tag";
/// The request budget a provider gets when its entry sets none (requests per hour, burst):
/// Proxmox VE has no rate limit, but every call takes a pveproxy worker (clones, starts and
/// uploads fork more): ten a second keeps the operator from crowding out the web UI.
const BUDGET: (u32, u32) = (36_000, 50);

/// The largest cloud-init the seed image takes: far more than a proxy needs, well inside the `/tmp` budget.
const USER_DATA_MAX: usize = 1024 * 1024;
/// VMIDs tried for one name before giving up.
const CANDIDATES: u64 = 8;

/// Cloud-init of any bytes fits the seed image up to [`USER_DATA_MAX`].
fn fits(cloud_init: &[u8]) -> Result<(), ProviderError> {
    match cloud_init.len() {
        n if n > USER_DATA_MAX => {
            Err(ProviderError::user_data_too_large(n, USER_DATA_MAX, " (the seed image's limit)"))
        }
        _ => Ok(()),
    }
}

fn cfg() -> Result<config::Config, ProviderError> {
    config::parse(&sdk::config())
}

fn now() -> u64 {
    sdk::time::now().seconds
}

/// The VMIDs a VM of this name may get, in order: derived from the name, so two creates for one Proxy (a retry, a
/// race) try the same VMID and the clone that creates it first wins; the others find the VM there.
fn candidates(cfg: &config::Config, name: &str) -> Vec<u32> {
    let [first, last] = cfg.vmids();
    let span = u64::from(last - first) + 1;
    let h = u64::from_be_bytes(Sha256::digest(name.as_bytes())[..8].try_into().expect("8 bytes"));
    let mut out: Vec<u32> = (0..CANDIDATES).map(|k| first + (h.wrapping_add(k) % span) as u32).collect();
    out.dedup();
    out
}

/// The seed image's file name in the ISO storage: one per VM name, so delete finds it without the VM.
fn iso_name(name: &str) -> String {
    format!("{name}-cidata.iso")
}

fn clone_key(vmid: u32) -> String {
    format!("clone:{vmid}")
}

/// The start task a create sent and stopped waiting for, per VM: by VMID and name, so another VM in that VMID never
/// inherits it.
fn start_key(vmid: u32, name: &str) -> String {
    format!("start:{vmid}:{name}")
}

/// What a VMID holds, for a create of `name`.
enum Found {
    Mine,
    /// A clone that has not written its config yet (Proxmox shows it as `VM <vmid>` with lock `clone`): the create
    /// that raced us for this VMID, or an earlier attempt of ours.
    Cloning,
    Other,
}

fn inspect(api: &Api, r: &Resource, name: &str, uid: &str) -> Result<Found, ProviderError> {
    let vm = Api::vm(&r.node, r.vmid);
    let st: Status = api.get(&format!("{vm}/status/current"))?;
    if st.name != name {
        let cloning = st.lock == "clone" && st.name == format!("VM {}", r.vmid);
        return Ok(if cloning { Found::Cloning } else { Found::Other });
    }
    let found = match marks::from_tags(&st.tags).uid {
        Some(u) => u,
        None => {
            marks::from_description(&api.get::<VmConfig>(&format!("{vm}/config"))?.description).uid.unwrap_or_default()
        }
    };
    match found == uid {
        true => Ok(Found::Mine),
        false => Err(ProviderError::name_taken(name, &format!("VM {}", r.vmid), &found, uid)),
    }
}

/// A clone whose task failed after an earlier call stopped waiting for it: reported once, then forgotten.
fn earlier_clone(api: &Api, vmid: u32) -> Result<(), ProviderError> {
    let Some(upid) = sdk::cache_get(&clone_key(vmid)).and_then(|v| String::from_utf8(v).ok()) else { return Ok(()) };
    sdk::cache_set(&clone_key(vmid), b"", 0);
    match api.task(&upid) {
        Ok(t) if t.failed() => Err(task_failure(&format!("clone into VMID {vmid}"), &upid, &t.exitstatus)),
        _ => Ok(()),
    }
}

/// Clones the template into `vmid` with the name and the full marks (the description is the only mark the clone
/// call can carry); returns the clone task.
fn clone(
    api: &Api,
    vms: &[Resource],
    req: &CreateRequest,
    node: &str,
    template: u32,
    target: (u32, &str),
) -> Result<String, ProviderError> {
    let Some(t) = vms.iter().find(|r| r.vmid == template && r.is_template()) else {
        let msg = format!(
            "placement.image {:?} names VMID {template}, which is not a template in this cluster",
            req.placement.image
        );
        return Err(ProviderError::permanent(msg).with_code("InvalidImage"));
    };
    let (vmid, name) = target;
    let description = marks::description(&req.uid, &req.installation, now(), None);
    let mut body =
        json!({"newid": vmid, "name": name, "description": description, "full": u8::from(api.cfg.full_clone)});
    if t.node != node {
        body["target"] = node.into();
    }
    if !api.cfg.pool.is_empty() {
        body["pool"] = api.cfg.pool.as_str().into();
    }
    let upid: String = api.call(Method::Post, &format!("{}/clone", Api::vm(&t.node, template)), Some(&body))?;
    sdk::cache_set(&clone_key(vmid), upid.as_bytes(), 3600);
    Ok(upid)
}

/// The seed image of a VM, written to the plugin's `/tmp` and read back for the upload.
fn seed(name: &str, vmid: u32, user_data: &[u8]) -> Result<Vec<u8>, ProviderError> {
    const PATH: &str = "/tmp/seed.iso";
    let io = |e: std::io::Error| ProviderError::transient(format!("seed image {PATH}: {e}")).with_code("SeedImage");
    let meta = format!("instance-id: {name}-{vmid}\nlocal-hostname: {name}\n");
    let mut f = std::io::BufWriter::new(std::fs::File::create(PATH).map_err(io)?);
    iso::write(&mut f, &[("meta-data", meta.as_bytes()), ("user-data", user_data)], now()).map_err(io)?;
    f.into_inner().map_err(|e| io(e.into_error()))?.sync_all().map_err(io)?;
    std::fs::read(PATH).map_err(io)
}

/// Every step after the clone, each skipped when done, so a create cut short (a timeout, a crash, a lost race)
/// resumes where it stopped: wait for the clone, upload and attach the seed, set tags and size, start, wait for the
/// start task, and record it in the description.
fn finish(
    api: &Api,
    req: &CreateRequest,
    target: (u32, &str),
    node: &str,
    cloned: Option<String>,
) -> Result<String, ProviderError> {
    let (vmid, name) = target;
    let vm = Api::vm(node, vmid);
    match cloned {
        Some(upid) => {
            // A fresh clone was never started, whatever an earlier VM of this name was.
            sdk::cache_set(&start_key(vmid, name), b"", 0);
            let done = api.finish(&upid, &format!("clone into VMID {vmid}"));
            // Ended either way: a failure is reported now, so the next create must not report it again.
            if done.as_ref().err().and_then(|e| e.code.as_deref()) != Some("TaskRunning") {
                sdk::cache_set(&clone_key(vmid), b"", 0);
            }
            done?
        }
        None => match api.poll(|| api.get::<Status>(&format!("{vm}/status/current")), |s| s.lock != "clone")? {
            None => {
                return Err(
                    ProviderError::transient(format!("clone into VMID {vmid} still running")).with_code("TaskRunning")
                );
            }
            Some(st) if st.name != name => {
                let msg = format!("VMID {vmid} was cloned for VM {:?}, not {name:?}; trying again", st.name);
                return Err(ProviderError::transient(msg).with_code("VmidTaken"));
            }
            Some(_) => {}
        },
    }
    sdk::cache_set(&clone_key(vmid), b"", 0);
    let conf: VmConfig = api.get(&format!("{vm}/config"))?;
    let written = marks::from_description(&conf.description);
    if written.start.is_some() {
        return Ok("adopted".into());
    }
    let created = written.created.unwrap_or_else(now);
    let (uid, inst) = (&req.uid, &req.installation);
    let volid = format!("{}:iso/{}", api.cfg.iso_storage, iso_name(name));
    // A start an earlier call sent and stopped waiting for: the steps before it are done, and a config write now
    // would only wait for the lock the start holds.
    let start = match sdk::cache_get(&start_key(vmid, name))
        .and_then(|v| String::from_utf8(v).ok())
        .filter(|u| !u.is_empty())
    {
        Some(upid) => upid,
        None => {
            configure(api, req, (vmid, name), node, &conf, created)?;
            let st: Status = api.get(&format!("{vm}/status/current"))?;
            match st.status.as_str() {
                "running" => "started".to_string(),
                _ => {
                    let upid: String = api.call(Method::Post, &format!("{vm}/status/start"), None)?;
                    sdk::cache_set(&start_key(vmid, name), upid.as_bytes(), 3600);
                    upid
                }
            }
        }
    };
    // `vm_start` holds the VM's config lock until its task ends, and a config write waits at most 10 s for it
    // (then `can't lock file ... got timeout`): the start is recorded once its task has ended, OK or not (a failed
    // start is get's error, read from the marker).
    if start.starts_with("UPID:") {
        let ended = |t: &Task| t.status != "running";
        // A task the node no longer knows (its log rotated, the node replaced) has ended.
        let read = || match api.task(&start) {
            Err(e) if e.class == sdk::ErrorClass::Permanent => Ok(Task { status: "stopped".into(), ..Task::default() }),
            other => other,
        };
        if api.poll(read, ended)?.is_none() {
            let msg = format!(
                "start of VM {vmid} still running after {} s (task {start}); the next create records it",
                api.cfg.wait()
            );
            return Err(ProviderError::transient(msg).with_code("TaskRunning"));
        }
    }
    let description = marks::description(uid, inst, created, Some(&start));
    api.call::<Value>(Method::Put, &format!("{vm}/config"), Some(&json!({"description": description})))?;
    sdk::cache_set(&start_key(vmid, name), b"", 0);
    Ok(format!("cloned and started ({} bytes of user data on {volid})", req.cloud_init.len()))
}

/// The config step before the start: the seed uploaded and attached, tags, description, the agent, the size, and
/// the template's Cloud-Init drive removed.
fn configure(
    api: &Api,
    req: &CreateRequest,
    target: (u32, &str),
    node: &str,
    conf: &VmConfig,
    created: u64,
) -> Result<(), ProviderError> {
    let (vmid, name) = target;
    let vm = Api::vm(node, vmid);
    let volid = format!("{}:iso/{}", api.cfg.iso_storage, iso_name(name));
    if !conf.ide2.starts_with(&format!("{volid},")) {
        api.upload(node, &iso_name(name), &seed(name, vmid, &req.cloud_init)?)?;
    }
    let (uid, inst) = (&req.uid, &req.installation);
    let mut body = json!({"tags": marks::tags(uid, inst, created, &conf.tags), "ide2": format!("{volid},media=cdrom"),
        "description": marks::description(uid, inst, created, None), "agent": "1"});
    // A Cloud-Init drive of the template would be a second `cidata` volume: cloud-init could read either.
    let drives: Vec<&String> = conf
        .rest
        .iter()
        .filter(|(k, v)| *k != "ide2" && v.as_str().is_some_and(|v| v.contains("cloudinit")))
        .map(|(k, _)| k)
        .collect();
    if !drives.is_empty() {
        body["delete"] = drives.iter().map(|d| d.as_str()).collect::<Vec<_>>().join(",").into();
    }
    if let Some(size) = api.cfg.resolve(&req.placement)?.2 {
        body["cores"] = size.cores.into();
        body["memory"] = size.memory_mib.to_string().into();
    }
    api.call::<Value>(Method::Put, &format!("{vm}/config"), Some(&body))?;
    Ok(())
}

fn create(req: &CreateRequest) -> Result<(String, String), ProviderError> {
    let cfg = cfg()?;
    let (node, template, _) = cfg.resolve(&req.placement)?;
    fits(&req.cloud_init)?;
    // The host's names (`proxy-` + base32) are DNS names already; anything else maps deterministically.
    let name = if marks::is_vm_name(&req.name) { req.name.clone() } else { sdk::name_from_uid(&req.uid) };
    let api = Api::new(&cfg)?;
    let vms = api.resources()?;
    // Idempotent by name: a VM of this name anywhere (its listed name may be a few seconds late), then the VMIDs
    // the name derives; the first free one is claimed by cloning into it.
    let listed = vms.iter().filter(|r| r.name == name).map(|r| r.vmid);
    let mut tried = Vec::new();
    for vmid in listed.chain(candidates(&cfg, &name)) {
        if tried.contains(&vmid) {
            continue;
        }
        tried.push(vmid);
        let (found, cloned) = match vms.iter().find(|r| r.vmid == vmid) {
            Some(r) => ((inspect(&api, r, &name, &req.uid)?, r.node.clone()), None),
            None => {
                earlier_clone(&api, vmid)?;
                match clone(&api, &vms, req, node, template, (vmid, &name)) {
                    Ok(upid) => ((Found::Mine, node.to_string()), Some(upid)),
                    // Refused: a race for the VMID if it exists now (the clone's answer says so only since PVE 9).
                    Err(e) => match api.resources()?.into_iter().find(|r| r.vmid == vmid) {
                        Some(r) => ((inspect(&api, &r, &name, &req.uid)?, r.node), None),
                        None => return Err(e),
                    },
                }
            }
        };
        if let (Found::Mine | Found::Cloning, at) = found {
            let what = finish(&api, req, (vmid, &name), &at, cloned)?;
            return Ok((Id { vmid, name: &name }.to_string(), what));
        }
    }
    let msg = format!("no free VMID for {name:?}: {tried:?} hold other VMs (config.vmidRange)");
    Err(ProviderError::transient(msg).with_code("NoFreeVmid"))
}

/// What the lock and the power state say before the guest agent and the start marker are asked.
#[derive(Debug, PartialEq, Eq)]
enum Phase {
    /// Being destroyed: Terminated.
    Destroying,
    /// Being cloned or created: Provisioning.
    Building,
    /// Running: Running once the guest agent reports an address.
    Up,
    /// Stopped: never started, starting, or stopped since; the start marker decides.
    Down,
    /// Paused, suspended, or a state this plugin does not know: Stopped.
    Other,
}

/// Other locks (backup, snapshot, migrate) leave the VM as it is: its power state stands.
fn phase(lock: &str, status: &str, qmpstatus: &str) -> Phase {
    match (lock, status, qmpstatus) {
        ("destroyed", ..) => Phase::Destroying,
        ("clone" | "create", ..) => Phase::Building,
        (_, "running", "running" | "") => Phase::Up,
        (_, "stopped", _) => Phase::Down,
        _ => Phase::Other,
    }
}

/// A stopped VM by its start marker: never started (or its start not recorded yet) is Provisioning, a start task
/// still running too; one that ran is Stopped, whatever happened since; a failed start is its exit status.
fn after_start(vmid: u32, marker: Option<&str>, task: Option<&Task>) -> Result<(State, String), ProviderError> {
    match (marker, task) {
        (None, _) => Ok((State::Provisioning, "defined, never started".into())),
        (Some(upid), Some(t)) if t.status == "running" => Ok((State::Provisioning, format!("starting ({upid})"))),
        (Some(upid), Some(t)) if t.failed() && !t.exitstatus.contains("already running") => {
            Err(task_failure(&format!("start of VM {vmid}"), upid, &t.exitstatus))
        }
        _ => Ok((State::Stopped, "stopped since it ran".into())),
    }
}

fn get(id: &str) -> Result<(Instance, String), ProviderError> {
    let id = Id::parse(id)?;
    let cfg = cfg()?;
    let api = Api::new(&cfg)?;
    let gone =
        |why: String| Err(ProviderError::not_found(format!("VM {id} does not exist{why}")).with_code("NotFound"));
    let Some(r) = api.resources()?.into_iter().find(|r| r.vmid == id.vmid) else { return gone(String::new()) };
    let vm = Api::vm(&r.node, id.vmid);
    let st: Status = api.get(&format!("{vm}/status/current"))?;
    let m = marks::from_tags(&st.tags);
    let created_at = m.created.map(|seconds| Datetime { seconds, nanoseconds: 0 });
    let inst = |state, ip: String| Instance {
        id: id.to_string(),
        ip,
        state,
        uid: m.uid.clone().unwrap_or_default(),
        created_at,
        ..Instance::empty()
    };
    if st.name != id.name {
        return match st.lock.as_str() {
            "clone" => Ok((inst(State::Provisioning, String::new()), "being cloned".into())),
            _ => gone(format!(" (VMID {} now holds {:?})", id.vmid, st.name)),
        };
    }
    let (state, ip, what) = match phase(&st.lock, &st.status, &st.qmpstatus) {
        Phase::Destroying => (State::Terminated, String::new(), "being destroyed".into()),
        Phase::Building => (State::Provisioning, String::new(), format!("locked ({})", st.lock)),
        Phase::Up => match api.send::<Value>(Method::Get, &format!("{vm}/agent/network-get-interfaces"), None) {
            Ok(v) => match api::agent_address(&v) {
                Some(ip) => (State::Running, ip, "running".into()),
                None => (State::Provisioning, String::new(), "running, the guest agent reports no address yet".into()),
            },
            // The agent not running (yet) or not answering: 500, whatever the message. Not an error.
            Err(HttpError::Status { status: 500, .. }) => {
                (State::Provisioning, String::new(), "running, the guest agent does not answer yet".into())
            }
            Err(e) => return Err(api::classify(e)),
        },
        Phase::Down => {
            let conf: VmConfig = api.get(&format!("{vm}/config"))?;
            let marker = marks::from_description(&conf.description).start;
            let task = match marker.as_deref().filter(|u| u.starts_with("UPID:")) {
                Some(upid) => match api.task(upid) {
                    Ok(t) => Some(t),
                    // Gone from the task index long ago (a rotated log): it ran.
                    Err(e) if e.class == sdk::ErrorClass::Permanent => None,
                    Err(e) => return Err(e),
                },
                None => None,
            };
            let (state, what) = after_start(id.vmid, marker.as_deref(), task.as_ref())?;
            // A start that ended between the status read and the task read: the VM runs now, it did not stop.
            match state == State::Stopped && task.is_some() {
                true if api.get::<Status>(&format!("{vm}/status/current"))?.status != "stopped" => {
                    (State::Provisioning, String::new(), "started just now".into())
                }
                _ => (state, String::new(), what),
            }
        }
        Phase::Other => (State::Stopped, String::new(), format!("status {} ({})", st.status, st.qmpstatus)),
    };
    Ok((inst(state, ip), what))
}

/// Removes the seed image `filename` from `node`'s ISO storage if it is there, and waits for the removal.
fn remove_seed(api: &Api, node: &str, filename: &str) -> Result<bool, ProviderError> {
    let path = format!("/nodes/{node}/storage/{}/content", api.cfg.iso_storage);
    let volid = format!("{}:iso/{filename}", api.cfg.iso_storage);
    let list: Vec<Value> = api.get(&format!("{path}?content=iso"))?;
    if !list.iter().any(|v| v["volid"] == volid.as_str()) {
        return Ok(false);
    }
    if let Some(upid) =
        api.call::<Option<String>>(Method::Delete, &format!("{path}/{}", encode_component(&volid)), None)?
    {
        api.finish(&upid, &format!("removal of {volid}"))?;
    }
    Ok(true)
}

/// The VM is gone already (this is a repeat, or it was deleted behind the operator's back): its seed image may be
/// left on the node it was made on, which the ID does not say. Best effort on every configured node.
fn sweep_seed(api: &Api, name: &str) -> String {
    let mut removed = 0;
    for node in &api.cfg.nodes {
        match remove_seed(api, node, &iso_name(name)) {
            Ok(r) => removed += usize::from(r),
            Err(e) => sdk::warn!("proxmox delete: seed image {} on {node} not checked: {}", iso_name(name), e.message),
        }
    }
    format!("already gone ({removed} seed images removed)")
}

fn delete(id: &str) -> Result<((), String), ProviderError> {
    let id = Id::parse(id)?;
    let cfg = cfg()?;
    let api = Api::new(&cfg)?;
    let Some(r) = api.resources()?.into_iter().find(|r| r.vmid == id.vmid) else {
        return Ok(((), sweep_seed(&api, id.name)));
    };
    let vm = Api::vm(&r.node, id.vmid);
    let st: Status = api.get(&format!("{vm}/status/current"))?;
    if st.name != id.name && st.lock != "clone" {
        return Ok(((), sweep_seed(&api, id.name)));
    }
    match st.lock.as_str() {
        // A destroy already runs (ours, or one started by hand): the seed goes too.
        "destroyed" => {
            remove_seed(&api, &r.node, &iso_name(id.name))?;
            return Ok(((), "destroy in progress".into()));
        }
        "" => {}
        lock => {
            let msg = format!("VM {id} is locked ({lock}); deleting it when the lock is released");
            return Err(ProviderError::transient(msg).with_code("VmLocked"));
        }
    }
    // Stopped first, always: a running VM cannot be destroyed, and one that reads stopped may be starting (its
    // start holds the config lock; the stop waits for it). Stopping a stopped VM is a task that ends OK.
    let upid: String = api.call(Method::Post, &format!("{vm}/status/stop"), None)?;
    api.finish(&upid, &format!("stop of VM {id}"))?;
    // The seed goes first: once the VM is destroyed, nothing says on which node it was.
    remove_seed(&api, &r.node, &iso_name(id.name))?;
    let upid: String = api.call(Method::Delete, &format!("{vm}?purge=1&destroy-unreferenced-disks=1"), None)?;
    Ok(((), format!("destroy accepted ({upid})")))
}

fn list_by_tag(installation: &str) -> Result<(Vec<Instance>, String), ProviderError> {
    let cfg = cfg()?;
    let api = Api::new(&cfg)?;
    let want = marks::installation_value(installation);
    let (mut out, mut left_out) = (Vec::new(), Vec::new());
    let vms = api.resources()?;
    let to_instance = |r: &Resource, m: marks::Marks| Instance {
        id: Id { vmid: r.vmid, name: &r.name }.to_string(),
        ip: String::new(),
        state: if r.status == "running" { State::Running } else { State::Stopped },
        uid: m.uid.unwrap_or_default(),
        created_at: m.created.map(|seconds| Datetime { seconds, nanoseconds: 0 }),
        ..Instance::empty()
    };
    for r in vms.iter().filter(|r| !r.is_template()) {
        let m = marks::from_tags(&r.tags);
        let untagged = !marks::split(&r.tags).any(|t| t.to_ascii_lowercase().starts_with("egress."));
        let tagged_ours = m.managed && m.installation.as_deref() == Some(want.as_str());
        let maybe_ours = untagged && looks_made(&r.name);
        if !(tagged_ours || maybe_ours) {
            continue;
        }
        // Its node does not report (down, or the VM is seconds old): leaving it out is safe, GC never deletes what
        // it does not see.
        if r.status == "unknown" || !marks::is_vm_name(&r.name) {
            left_out.push(r.vmid);
            continue;
        }
        if !untagged {
            out.push(to_instance(r, m));
            continue;
        }
        // A clone whose create stopped before the tags were set: its description has the marks.
        let d =
            marks::from_description(&api.get::<VmConfig>(&format!("{}/config", Api::vm(&r.node, r.vmid)))?.description);
        if d.managed && d.installation.as_deref() == Some(installation) {
            out.push(to_instance(r, d));
        }
    }
    if !left_out.is_empty() {
        sdk::warn!("proxmox list: left out VMs {left_out:?}: their nodes report no status or name");
    }
    let what = format!("{} managed VMs, {} left out", out.len(), left_out.len());
    Ok((out, what))
}

/// A name the host gives (`proxy-` and 16 base32 characters).
fn looks_made(name: &str) -> bool {
    name.strip_prefix("proxy-")
        .is_some_and(|s| s.len() == 16 && s.bytes().all(|b| b.is_ascii_lowercase() || (b'2'..=b'7').contains(&b)))
}

/// One cheap authenticated read per node (`GET /nodes/{node}/status`), with its free memory and version as details.
fn probe(api: &Api, node: &str) -> TargetStatus {
    match api.send::<Value>(Method::Get, &format!("/nodes/{node}/status"), None) {
        Err(e) => TargetStatus::failed(node, api::reason(&e), api::classify(e).message),
        Ok(s) => {
            let mib = |k: &str| (s["memory"][k].as_u64().unwrap_or(0) / (1024 * 1024)).to_string();
            let version = s["pveversion"].as_str().unwrap_or_default().to_string();
            let details = vec![
                ("memoryFreeMiB".into(), mib("free")),
                ("memoryTotalMiB".into(), mib("total")),
                ("version".into(), version),
            ];
            TargetStatus::ready(node, details)
        }
    }
}

impl Provider for Proxmox {
    const OUTCOMES: Outcomes = Outcomes { plugin: "proxmox", changes: Level::Info, reads: Level::Debug };

    fn info() -> PluginInfo {
        // No default hosts: a cluster's address differs per installation and is listed in the providers file.
        PluginInfo {
            has_check: true,
            ..PluginInfo::new("proxmox", env!("CARGO_PKG_VERSION"))
                .with_profile(PROFILE)
                .with_budget(BUDGET.0, BUDGET.1)
        }
    }

    fn validate_config(config: &str) -> Result<(), ProviderError> {
        config::parse(config).map(drop)
    }

    fn create(req: CreateRequest) -> Result<String, ProviderError> {
        outcome::keep(create(&req))
    }

    fn get(id: &str) -> Result<Instance, ProviderError> {
        outcome::keep(get(id))
    }

    fn delete(id: &str) -> Result<(), ProviderError> {
        outcome::keep(delete(id))
    }

    fn list_by_tag(installation: &str) -> Result<Vec<Instance>, ProviderError> {
        outcome::keep(list_by_tag(installation))
    }

    fn check() -> Vec<TargetStatus> {
        match cfg() {
            Ok(cfg) => sdk::check_each(&cfg.nodes, Api::new(&cfg), probe),
            Err(e) => vec![TargetStatus::invalid_config(e)],
        }
    }
}

#[cfg(test)]
mod tests;
