//! The emulated subscription: public IPs, NICs, disks and VMs, the operations that move
//! them, and every rule between them. Handlers in `api` lock, call one method here and
//! render; the control surface uses the same methods, so the two never disagree.

use std::collections::{BTreeMap, BTreeSet};
use std::net::Ipv4Addr;
use std::time::Instant;

use serde_json::Value;

use super::error::ArmError;
use super::{AzureConfig, SpotRefusal};
use crate::control::{FaultKind, FaultOp};
use crate::framework::{Effect, Schedule, Traffic};
use crate::time::now_secs;

/// ARM IDs are case-insensitive: every map is keyed by the lowercased ID.
pub(crate) fn key(id: &str) -> String {
    id.trim_end_matches('/').to_ascii_lowercase()
}

/// The resource types the emulator holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum ResourceKind {
    PublicIp,
    Nic,
    Disk,
    Vm,
}

impl ResourceKind {
    pub const ALL: [ResourceKind; 4] =
        [ResourceKind::PublicIp, ResourceKind::Nic, ResourceKind::Disk, ResourceKind::Vm];

    pub fn namespace(self) -> &'static str {
        match self {
            ResourceKind::PublicIp | ResourceKind::Nic => "Microsoft.Network",
            ResourceKind::Disk | ResourceKind::Vm => "Microsoft.Compute",
        }
    }

    pub fn type_name(self) -> &'static str {
        match self {
            ResourceKind::PublicIp => "publicIPAddresses",
            ResourceKind::Nic => "networkInterfaces",
            ResourceKind::Disk => "disks",
            ResourceKind::Vm => "virtualMachines",
        }
    }

    /// `Microsoft.Network/publicIPAddresses`.
    pub fn full_type(self) -> String {
        format!("{}/{}", self.namespace(), self.type_name())
    }

    /// The kind a path names, case-insensitively as ARM matches.
    pub(crate) fn from_path(ns: &str, ty: &str) -> Option<ResourceKind> {
        ResourceKind::ALL.into_iter().find(|k| {
            k.namespace().eq_ignore_ascii_case(ns) && k.type_name().eq_ignore_ascii_case(ty)
        })
    }

    pub(super) fn word(self) -> &'static str {
        match self {
            ResourceKind::PublicIp => "publicIPAddress",
            ResourceKind::Nic => "networkInterface",
            ResourceKind::Disk => "disk",
            ResourceKind::Vm => "virtualMachine",
        }
    }
}

/// One resource as [`AzureEmulator::resources`](super::AzureEmulator::resources) lists it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ArmResource {
    pub kind: ResourceKind,
    pub id: String,
    pub name: String,
    pub resource_group: String,
    pub location: String,
    pub tags: BTreeMap<String, String>,
    pub provisioning_state: String,
    /// The VM a NIC or disk is attached to, the NIC IP configuration a public IP is.
    pub attached_to: Option<String>,
}

pub(crate) struct Res {
    pub kind: ResourceKind,
    pub id: String,
    pub name: String,
    pub rg: String,
    pub location: String,
    pub tags: BTreeMap<String, String>,
    pub created: u64,
    pub changed: u64,
    /// `provisioningState`.
    pub state: String,
    pub etag: u64,
    pub guid: String,
    /// The operation in progress on it.
    pub op: Option<String>,
    pub detail: Detail,
}

pub(crate) enum Detail {
    Ip(Ip),
    Nic(Nic),
    Disk(Disk),
    Vm(Box<Vm>),
}

pub(crate) struct Ip {
    pub sku: String,
    pub tier: String,
    pub allocation: String,
    pub version: String,
    pub idle_timeout: u64,
    pub address: Option<String>,
    pub delete_option: Option<String>,
    /// The NIC IP configuration using it.
    pub ip_config: Option<String>,
    pub zones: Vec<String>,
}

pub(crate) struct IpConfig {
    pub name: String,
    pub subnet: String,
    pub private_ip: String,
    pub public_ip: Option<String>,
    pub primary: bool,
}

pub(crate) struct Nic {
    pub ip_configs: Vec<IpConfig>,
    pub vm: Option<String>,
    pub mac: String,
    pub accelerated: bool,
    pub nsg: Option<String>,
}

pub(crate) struct Disk {
    pub size_gb: u64,
    pub sku: String,
    pub vm: Option<String>,
}

pub(crate) struct OsDisk {
    pub name: String,
    pub id: String,
    pub caching: String,
    pub storage: String,
    pub delete_option: String,
    pub size_gb: u64,
}

pub(crate) struct NicRef {
    pub id: String,
    pub primary: Option<bool>,
    pub delete_option: Option<String>,
}

pub(crate) struct Vm {
    pub vm_id: String,
    pub size: String,
    pub image: Value,
    pub os_disk: OsDisk,
    pub nics: Vec<NicRef>,
    pub computer_name: String,
    pub admin_username: String,
    pub linux: Value,
    pub custom_data: Option<Vec<u8>>,
    pub user_data: Option<String>,
    pub priority: String,
    pub eviction_policy: Option<String>,
    pub max_price: Option<f64>,
    pub zones: Vec<String>,
    /// The code after `PowerState/`.
    pub power: String,
    pub held: bool,
    pub locked: bool,
    /// Why creation failed (instance view `ProvisioningState/failed/{code}`).
    pub failure: Option<ArmError>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Action {
    Create,
    Update,
    Delete,
    /// A power action ending in this power state.
    Power(&'static str),
}

#[derive(Debug, Clone, PartialEq)]
pub(crate) enum OpStatus {
    InProgress,
    Succeeded,
    Failed(ArmError),
}

pub(crate) struct Op {
    pub id: String,
    pub kind: ResourceKind,
    pub action: Action,
    pub target: String,
    pub location: String,
    pub api_version: String,
    pub status: OpStatus,
    pub start: u64,
    pub end: Option<u64>,
    pub(super) reads: u32,
    pub(super) born: Instant,
    /// A slow delete: only `finish_deletes` ends it.
    pub held: bool,
    /// The error the operation ends with instead of succeeding.
    pub failure: Option<ArmError>,
}

impl Op {
    pub(crate) fn running(&self) -> bool {
        self.status == OpStatus::InProgress
    }
}

/// What a write answered: `201` or `200`, the resource, and its operation.
pub(crate) struct Written {
    pub created: bool,
    pub body: Value,
    pub op: String,
}

/// The emulated subscription, tenant and price list.
pub struct Backend {
    pub(crate) cfg: AzureConfig,
    /// `http://127.0.0.1:PORT`, for operation URLs and `nextLink`s.
    pub(crate) base_url: String,
    pub(crate) res: BTreeMap<String, Res>,
    pub(crate) ops: BTreeMap<String, Op>,
    /// Issued tokens and when they expire (Unix seconds).
    pub(crate) tokens: BTreeMap<String, u64>,
    pub(crate) grants: u32,
    pub(crate) traffic: Traffic<ArmError>,
    pub(crate) spot_refusal: Option<SpotRefusal>,
    pub(super) failing: BTreeSet<String>,
    pub(super) counter: u64,
    pub(super) next_v4: u32,
    pub(super) next_v6: u32,
    pub(super) next_private: BTreeMap<String, u32>,
}

impl Backend {
    pub(crate) fn new(cfg: AzureConfig, base_url: String) -> Self {
        Backend {
            traffic: Traffic::new(cfg.rate_limit),
            cfg,
            base_url,
            res: BTreeMap::new(),
            ops: BTreeMap::new(),
            tokens: BTreeMap::new(),
            grants: 0,
            spot_refusal: None,
            failing: BTreeSet::new(),
            counter: 0,
            next_v4: 0,
            next_v6: 0,
            next_private: BTreeMap::new(),
        }
    }

    // ---- identifiers ----------------------------------------------------------------------

    /// A fresh GUID-shaped identifier (deterministic per emulator; never reused).
    pub(crate) fn guid(&mut self) -> String {
        self.counter += 1;
        let mut z = self.counter.wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ 0x5a2e_1a2e_1a2e_1a2e;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^= z >> 31;
        format!(
            "{:08x}-{:04x}-4{:03x}-a{:03x}-{:012x}",
            (z >> 32) as u32,
            (z >> 16) as u16,
            z & 0xfff,
            self.counter & 0xfff,
            self.counter
        )
    }

    /// The configured resource group of that name, any case.
    pub(crate) fn rg(&self, rg: &str) -> Result<super::ResourceGroupSpec, ArmError> {
        self.cfg
            .resource_groups
            .iter()
            .find(|r| r.name.eq_ignore_ascii_case(rg))
            .cloned()
            .ok_or_else(|| ArmError::resource_group_not_found(rg))
    }

    pub(crate) fn id_of(&self, kind: ResourceKind, rg: &str, name: &str) -> String {
        let rg = self.rg(rg).map(|r| r.name).unwrap_or_else(|_| rg.to_string());
        format!(
            "/subscriptions/{}/resourceGroups/{rg}/providers/{}/{name}",
            self.cfg.subscription_id,
            kind.full_type()
        )
    }

    /// ARM's normalized location (`West Europe` -> `westeurope`), if configured.
    pub(crate) fn location(&self, given: &str, kind: ResourceKind) -> Result<String, ArmError> {
        let norm: String = given.chars().filter(|c| !c.is_whitespace()).collect::<String>();
        let norm = norm.to_ascii_lowercase();
        if self.cfg.locations.contains(&norm) {
            Ok(norm)
        } else {
            Err(ArmError::location_not_available(given, &kind.full_type(), &self.cfg.locations))
        }
    }

    pub(super) fn find(&self, kind: ResourceKind, id: &str) -> Option<&Res> {
        self.res.get(&key(id)).filter(|r| r.kind == kind)
    }

    pub(crate) fn get_res(
        &self,
        kind: ResourceKind,
        rg: &str,
        name: &str,
    ) -> Result<&Res, ArmError> {
        let rg = self.rg(rg)?;
        self.find(kind, &self.id_of(kind, &rg.name, name))
            .ok_or_else(|| ArmError::resource_not_found(&kind.full_type(), name, &rg.name))
    }

    pub(super) fn next_ipv4(&mut self) -> String {
        let base = u32::from(self.cfg.first_ipv4);
        let ip = Ipv4Addr::from(base.wrapping_add(self.next_v4));
        self.next_v4 += 1;
        ip.to_string()
    }

    pub(super) fn next_ipv6(&mut self) -> String {
        self.next_v6 += 1;
        format!("2001:db8:a2e::{:x}", self.next_v6)
    }

    pub(super) fn private_ip(&mut self, subnet: &str) -> String {
        let spec = self.cfg.subnets.iter().find(|s| s.id.eq_ignore_ascii_case(subnet));
        let base =
            spec.map(|s| u32::from(s.prefix)).unwrap_or(u32::from(Ipv4Addr::new(10, 0, 0, 0)));
        let n = self.next_private.entry(key(subnet)).or_insert(4);
        let ip = Ipv4Addr::from(base + *n);
        *n += 1;
        ip.to_string()
    }

    pub(super) fn mac(&mut self) -> String {
        self.counter += 1;
        let n = self.counter;
        format!("00-0D-3A-{:02X}-{:02X}-{:02X}", (n >> 16) as u8, (n >> 8) as u8, n as u8)
    }

    // ---- operations -----------------------------------------------------------------------

    pub(super) fn schedule_of(&self, action: Action) -> Schedule {
        match action {
            Action::Delete => self.cfg.delete_schedule,
            _ => self.cfg.schedule,
        }
    }

    /// A new operation on `target` (its key), in progress.
    pub(super) fn start_op(&mut self, target: &str, action: Action, api_version: &str) -> String {
        let id = self.guid();
        let (kind, location) = match self.res.get(target) {
            Some(r) => (r.kind, r.location.clone()),
            None => (ResourceKind::Vm, String::new()),
        };
        self.ops.insert(
            id.clone(),
            Op {
                id: id.clone(),
                kind,
                action,
                target: target.to_string(),
                location,
                api_version: api_version.to_string(),
                status: OpStatus::InProgress,
                start: now_secs(),
                end: None,
                reads: 0,
                born: Instant::now(),
                held: false,
                failure: None,
            },
        );
        if let Some(r) = self.res.get_mut(target) {
            r.op = Some(id.clone());
        }
        id
    }

    /// An operation that is already over (an update with nothing to wait for).
    pub(super) fn done_op(&mut self, target: &str, api_version: &str) -> String {
        let id = self.start_op(target, Action::Update, api_version);
        if let Some(r) = self.res.get_mut(target) {
            r.op = None;
        }
        if let Some(op) = self.ops.get_mut(&id) {
            op.status = OpStatus::Succeeded;
            op.end = Some(now_secs());
        }
        id
    }

    /// After the answer that started it: with `AfterReads(0)` an operation is over at once.
    pub(crate) fn settle(&mut self, op: &str) {
        let Some(o) = self.ops.get(op) else { return };
        if o.running() && !o.held && self.schedule_of(o.action) == Schedule::AfterReads(0) {
            self.complete(op);
        }
    }

    /// A read of the operation or of its target: advance a read-counted schedule. Called
    /// after the answer is rendered, so the read that sees the change is the next one.
    pub(crate) fn advance(&mut self, op: &str) {
        let held = self.op_blocked(op);
        let Some(o) = self.ops.get_mut(op) else { return };
        if !o.running() || held {
            return;
        }
        let schedule = match o.action {
            Action::Delete => self.cfg.delete_schedule,
            _ => self.cfg.schedule,
        };
        if let Schedule::AfterReads(n) = schedule {
            o.reads += 1;
            if o.reads >= n {
                self.complete(op);
            }
        }
    }

    pub(super) fn op_blocked(&self, op: &str) -> bool {
        let Some(o) = self.ops.get(op) else { return true };
        if o.held {
            return true;
        }
        // A held VM stays in its creation until released.
        o.action != Action::Delete
            && matches!(self.res.get(&o.target), Some(Res { detail: Detail::Vm(vm), .. }) if vm.held)
    }

    /// A read of resource `k`: advance its operation.
    pub(crate) fn saw(&mut self, k: &str) {
        if let Some(op) = self.res.get(k).and_then(|r| r.op.clone()) {
            self.advance(&op);
        }
    }

    /// Time-based schedules; called before every API call and every dump.
    pub(crate) fn tick(&mut self) {
        let due: Vec<String> = self
            .ops
            .values()
            .filter(|o| o.running())
            .filter(|o| match self.schedule_of(o.action) {
                Schedule::After(d) => o.born.elapsed() >= d,
                _ => false,
            })
            .map(|o| o.id.clone())
            .collect();
        for op in due {
            if !self.op_blocked(&op) {
                self.complete(&op);
            }
        }
    }

    /// The operation is over: its effect on its target.
    pub(crate) fn complete(&mut self, op: &str) {
        let Some(o) = self.ops.get_mut(op) else { return };
        if !o.running() {
            return;
        }
        let failure = o.failure.take();
        o.status = match &failure {
            Some(e) => OpStatus::Failed(e.clone()),
            None => OpStatus::Succeeded,
        };
        o.end = Some(now_secs());
        let (target, action) = (o.target.clone(), o.action);
        if let Some(r) = self.res.get_mut(&target)
            && r.op.as_deref() == Some(op)
        {
            r.op = None;
        }
        match action {
            Action::Delete => self.remove(&target),
            Action::Create => self.created(&target, failure),
            Action::Update => self.set_prov(&target, "Succeeded"),
            Action::Power(p) => {
                self.set_prov(&target, "Succeeded");
                self.set_power(&target, p);
            }
        }
    }

    pub(super) fn set_prov(&mut self, k: &str, state: &str) {
        if let Some(r) = self.res.get_mut(k) {
            r.state = state.to_string();
            r.changed = now_secs();
        }
    }

    pub(super) fn created(&mut self, k: &str, failure: Option<ArmError>) {
        let Some(r) = self.res.get(k) else { return };
        match &r.detail {
            Detail::Ip(ip) => {
                let (v6, has) = (ip.version == "IPv6", ip.address.is_some());
                let static_ = ip.allocation == "Static";
                self.set_prov(k, "Succeeded");
                if static_ && !has {
                    let addr = if v6 { self.next_ipv6() } else { self.next_ipv4() };
                    if let Some(Detail::Ip(ip)) = self.res.get_mut(k).map(|r| &mut r.detail) {
                        ip.address = Some(addr);
                    }
                }
            }
            Detail::Nic(_) | Detail::Disk(_) => self.set_prov(k, "Succeeded"),
            Detail::Vm(vm) => {
                let disk = key(&vm.os_disk.id);
                match failure {
                    Some(e) => {
                        self.set_prov(k, "Failed");
                        if let Some(Detail::Vm(vm)) = self.res.get_mut(k).map(|r| &mut r.detail) {
                            vm.failure = Some(e);
                        }
                        self.set_power(k, "deallocated");
                    }
                    None => {
                        self.set_prov(k, "Succeeded");
                        self.set_power(k, "running");
                    }
                }
                self.set_prov(&disk, "Succeeded");
            }
        }
    }

    /// A VM's power state changes: real proxies start and stop, dynamic addresses come and go.
    pub(super) fn set_power(&mut self, k: &str, power: &str) {
        let Some(Detail::Vm(vm)) = self.res.get_mut(k).map(|r| &mut r.detail) else {
            return;
        };
        let was = std::mem::replace(&mut vm.power, power.to_string());
        let ips = self.vm_public_ips(k);
        if power == "running" {
            for ip in &ips {
                let need = matches!(self.res.get(ip).map(|r| &r.detail),
                    Some(Detail::Ip(d)) if d.address.is_none() && d.allocation == "Dynamic");
                if need {
                    let v6 = matches!(self.res.get(ip).map(|r| &r.detail), Some(Detail::Ip(d)) if d.version == "IPv6");
                    let addr = if v6 { self.next_ipv6() } else { self.next_ipv4() };
                    if let Some(Detail::Ip(d)) = self.res.get_mut(ip).map(|r| &mut r.detail) {
                        d.address = Some(addr);
                    }
                }
            }
            if was != "running" {
                self.start_proxy(k);
            }
        } else {
            if was == "running" {
                self.stop_proxy(k);
            }
            if power == "deallocated" {
                for ip in &ips {
                    if let Some(Detail::Ip(d)) = self.res.get_mut(ip).map(|r| &mut r.detail)
                        && d.allocation == "Dynamic"
                    {
                        d.address = None;
                    }
                }
            }
        }
    }

    /// The public IPs (keys) on the NICs of VM `k`, primary NIC and IP configuration first.
    pub(crate) fn vm_public_ips(&self, k: &str) -> Vec<String> {
        let Some(Detail::Vm(vm)) = self.res.get(k).map(|r| &r.detail) else {
            return Vec::new();
        };
        let mut nics: Vec<&NicRef> = vm.nics.iter().collect();
        nics.sort_by_key(|n| !n.primary.unwrap_or(false));
        let mut out = Vec::new();
        for n in nics {
            if let Some(Detail::Nic(nic)) = self.res.get(&key(&n.id)).map(|r| &r.detail) {
                let mut cfgs: Vec<&IpConfig> = nic.ip_configs.iter().collect();
                cfgs.sort_by_key(|c| !c.primary);
                out.extend(cfgs.iter().filter_map(|c| c.public_ip.as_deref()).map(key));
            }
        }
        out
    }

    /// The address of a VM's first public IP, if it has one.
    pub(crate) fn vm_address(&self, k: &str) -> Option<String> {
        self.vm_public_ips(k).iter().find_map(|ip| match self.res.get(ip).map(|r| &r.detail) {
            Some(Detail::Ip(d)) => d.address.clone(),
            _ => None,
        })
    }

    pub(super) fn start_proxy(&mut self, k: &str) {
        let Some(proxies) = self.cfg.real_proxies.clone() else { return };
        let Some(Detail::Vm(vm)) = self.res.get(k).map(|r| &r.detail) else { return };
        let addr = proxies.start(k, vm.custom_data.as_deref()).to_string();
        if let Some(ip) = self.vm_public_ips(k).first()
            && let Some(Detail::Ip(d)) = self.res.get_mut(ip).map(|r| &mut r.detail)
        {
            d.address = Some(addr);
        }
    }

    pub(super) fn stop_proxy(&self, k: &str) {
        if let Some(p) = &self.cfg.real_proxies {
            p.stop(k);
        }
    }

    /// The resource is gone; a VM takes its parts whose `deleteOption` is `Delete`.
    pub(super) fn remove(&mut self, k: &str) {
        let kind = match self.res.get(k) {
            Some(r) => r.kind,
            None => return,
        };
        match kind {
            ResourceKind::Nic => self.remove_nic(k, false),
            ResourceKind::PublicIp | ResourceKind::Disk => {
                self.res.remove(k);
            }
            ResourceKind::Vm => {
                let Some(Res { detail: Detail::Vm(vm), .. }) = self.res.remove(k) else {
                    return;
                };
                self.stop_proxy(k);
                let disk = key(&vm.os_disk.id);
                if vm.os_disk.delete_option.eq_ignore_ascii_case("Delete") {
                    self.res.remove(&disk);
                } else if let Some(Detail::Disk(d)) = self.res.get_mut(&disk).map(|r| &mut r.detail)
                {
                    d.vm = None;
                }
                for n in vm.nics {
                    let nk = key(&n.id);
                    if let Some(Detail::Nic(nic)) = self.res.get_mut(&nk).map(|r| &mut r.detail) {
                        nic.vm = None;
                    }
                    let delete = n.delete_option.is_some_and(|d| d.eq_ignore_ascii_case("Delete"));
                    if delete {
                        self.remove_nic(&nk, true);
                    } else {
                        self.release_dynamic(&nk);
                    }
                }
            }
        }
    }

    /// A NIC goes; its public IPs are deleted when the NIC goes with its VM and their
    /// `deleteOption` is `Delete`, and detached otherwise.
    pub(super) fn remove_nic(&mut self, k: &str, with_vm: bool) {
        let Some(Res { detail: Detail::Nic(nic), .. }) = self.res.remove(k) else { return };
        for c in nic.ip_configs {
            let Some(ip) = c.public_ip.map(|p| key(&p)) else { continue };
            let delete = matches!(self.res.get(&ip).map(|r| &r.detail),
                Some(Detail::Ip(d)) if with_vm && d.delete_option.as_deref().is_some_and(|o| o.eq_ignore_ascii_case("Delete")));
            if delete {
                self.res.remove(&ip);
            } else if let Some(Detail::Ip(d)) = self.res.get_mut(&ip).map(|r| &mut r.detail) {
                d.ip_config = None;
                if d.allocation == "Dynamic" {
                    d.address = None;
                }
            }
        }
    }

    pub(super) fn release_dynamic(&mut self, nic: &str) {
        let ips: Vec<String> = match self.res.get(nic).map(|r| &r.detail) {
            Some(Detail::Nic(n)) => {
                n.ip_configs.iter().filter_map(|c| c.public_ip.as_deref()).map(key).collect()
            }
            _ => return,
        };
        for ip in ips {
            if let Some(Detail::Ip(d)) = self.res.get_mut(&ip).map(|r| &mut r.detail)
                && d.allocation == "Dynamic"
            {
                d.address = None;
            }
        }
    }

    pub(crate) fn op_url(&self, op: &str) -> String {
        self.op_link(op, "operations")
    }

    pub(crate) fn op_result_url(&self, op: &str) -> String {
        self.op_link(op, "operationResults")
    }

    pub(super) fn op_link(&self, op: &str, what: &str) -> String {
        let Some(o) = self.ops.get(op) else { return String::new() };
        format!(
            "{}/subscriptions/{}/providers/{}/locations/{}/{what}/{op}?api-version={}",
            self.base_url,
            self.cfg.subscription_id,
            o.kind.namespace(),
            o.location,
            o.api_version
        )
    }

    // ---- scopes, faults -------------------------------------------------------------------

    /// A failing scope (location or resource group, any case) a list touches.
    pub(crate) fn failing_scope<'a>(&self, mut touched: impl Iterator<Item = &'a Res>) -> bool {
        touched.any(|r| {
            self.failing.contains(&r.location) || self.failing.contains(&r.rg.to_ascii_lowercase())
        })
    }

    pub(crate) fn fault_error(&self, kind: &FaultKind) -> ArmError {
        let authority = self.authority();
        match kind {
            FaultKind::ServerError | FaultKind::Slow { .. } => ArmError::internal_execution(),
            FaultKind::Quota => ArmError::quota(&self.cfg.locations[0], 10, 10),
            FaultKind::RateLimit => {
                ArmError::throttled("write", &self.cfg.subscription_id, "emulator", 5)
            }
            FaultKind::Auth => ArmError::invalid_token(&authority),
        }
    }

    pub(crate) fn inject_error(&mut self, op: FaultOp, error: ArmError, count: u32) {
        self.traffic.faults.push(op, Effect::fail(error), count);
    }

    /// The login authority the `WWW-Authenticate` header names.
    pub(crate) fn authority(&self) -> String {
        format!("{}/{}", self.base_url, self.cfg.tenant_id)
    }

    pub(crate) fn expire_tokens(&mut self) {
        let past = now_secs().saturating_sub(1);
        self.tokens.values_mut().for_each(|t| *t = past);
    }
}

impl Drop for Backend {
    /// Real-proxy mode: the proxies of this emulator's VMs stop with it.
    fn drop(&mut self) {
        for (k, r) in &self.res {
            if r.kind == ResourceKind::Vm {
                self.stop_proxy(k);
            }
        }
    }
}
