//! The control surface on Azure's terms (see "Control surface" in the module docs), and
//! what tests look at: the dump, the resource list, plants, holds, raw states.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use super::error::ArmError;
use super::model::{
    Action, ArmResource, Backend, Detail, Disk, Ip, IpConfig, Nic, NicRef, OpStatus, OsDisk, Res,
    ResourceKind, Vm, key,
};
use super::tags;
use crate::control::{
    Dump, DumpInstance, DumpSecondary, Fault, FaultKind, Plant, RateLimit, Refusal, RequestStats,
};
use crate::framework::{Effect, Model};
use crate::time::now_secs;

impl Backend {
    // ---- what tests look at ---------------------------------------------------------------

    pub(crate) fn resources(&self) -> Vec<ArmResource> {
        self.res
            .values()
            .map(|r| ArmResource {
                kind: r.kind,
                id: r.id.clone(),
                name: r.name.clone(),
                resource_group: r.rg.clone(),
                location: r.location.clone(),
                tags: r.tags.clone(),
                provisioning_state: r.state.clone(),
                attached_to: match &r.detail {
                    Detail::Ip(d) => d.ip_config.clone(),
                    Detail::Nic(d) => d.vm.clone(),
                    Detail::Disk(d) => d.vm.clone(),
                    Detail::Vm(_) => None,
                },
            })
            .collect()
    }

    pub(crate) fn render_by_id(&self, id: &str) -> Option<Value> {
        let k = key(id);
        self.res.contains_key(&k).then(|| self.render(&k))
    }

    /// The raw state of a VM for the dump: its power state once provisioned, its
    /// provisioning state otherwise.
    pub(super) fn raw_state(r: &Res) -> String {
        match &r.detail {
            Detail::Vm(vm) if r.state == "Succeeded" => vm.power.clone(),
            _ => r.state.clone(),
        }
    }

    pub(super) fn dump_all(&mut self) -> Dump {
        self.tick();
        let mut instances = Vec::new();
        let mut secondary = Vec::new();
        for (k, r) in &self.res {
            match &r.detail {
                Detail::Vm(vm) => instances.push(DumpInstance {
                    id: r.id.clone(),
                    name: r.name.clone(),
                    scope: r.location.clone(),
                    state: Self::raw_state(r),
                    ip: self.vm_address(k).unwrap_or_default(),
                    labels: r
                        .tags
                        .iter()
                        .map(|(n, v)| tags::decode(n, v).unwrap_or_else(|| (n.clone(), v.clone())))
                        .collect(),
                    user_data: vm.custom_data.clone().unwrap_or_default(),
                }),
                Detail::Nic(n) => secondary.push(DumpSecondary {
                    kind: r.kind.word().into(),
                    id: r.id.clone(),
                    attached_to: n.vm.clone(),
                }),
                Detail::Disk(d) => secondary.push(DumpSecondary {
                    kind: r.kind.word().into(),
                    id: r.id.clone(),
                    attached_to: d.vm.clone(),
                }),
                Detail::Ip(d) => {
                    // Attached to the VM whose NIC uses it, if any.
                    let nic = d
                        .ip_config
                        .as_deref()
                        .and_then(|c| c.split("/ipConfigurations/").next())
                        .map(key);
                    let vm = nic.and_then(|n| match self.res.get(&n).map(|r| &r.detail) {
                        Some(Detail::Nic(n)) => n.vm.clone(),
                        _ => None,
                    });
                    secondary.push(DumpSecondary {
                        kind: r.kind.word().into(),
                        id: r.id.clone(),
                        attached_to: vm,
                    });
                }
            }
        }
        Dump { instances, secondary }
    }

    /// Forget every resource and operation; issued tokens stay valid (a plugin's cached
    /// token outlives a reset between test cases) and counters keep counting.
    pub(super) fn forget(&mut self) {
        let vms: Vec<String> = self
            .res
            .iter()
            .filter(|(_, r)| r.kind == ResourceKind::Vm)
            .map(|(k, _)| k.clone())
            .collect();
        for k in vms {
            self.stop_proxy(&k);
        }
        self.res.clear();
        self.ops.clear();
        self.failing.clear();
        self.spot_refusal = None;
        self.traffic.reset();
    }

    // ---- control surface ------------------------------------------------------------------

    pub(super) fn hold_vm(&mut self, id: &str, hold: bool) -> bool {
        let Some(k) = self.find_vm(id) else { return false };
        let deleting = self.res[&k]
            .op
            .as_ref()
            .and_then(|o| self.ops.get(o))
            .is_some_and(|o| o.action == Action::Delete);
        if deleting {
            return true;
        }
        if hold {
            if let Some(Detail::Vm(vm)) = self.res.get_mut(&k).map(|r| &mut r.detail) {
                vm.held = true;
            }
            self.set_prov(&k, "Creating");
            self.set_power(&k, "starting");
            if self.res[&k].op.is_none() {
                let version = self.cfg.api_versions.compute.last().cloned().unwrap_or_default();
                self.start_op(&k, Action::Create, &version);
            }
        } else {
            if let Some(Detail::Vm(vm)) = self.res.get_mut(&k).map(|r| &mut r.detail) {
                vm.held = false;
            }
            if let Some(op) = self.res[&k].op.clone()
                && let Some(o) = self.ops.get_mut(&op)
            {
                o.reads = 0;
                o.born = Instant::now();
            }
        }
        true
    }

    /// A raw state: a provisioning state (`Creating`, `Updating`, `Deleting`, `Failed`,
    /// `Succeeded`, `Canceled`) sets `provisioningState`; anything else is a power state
    /// (`running`, `deallocated`, or one no plugin knows) with `provisioningState:
    /// Succeeded`. An operation in progress on the VM is over.
    pub(super) fn set_vm_state(&mut self, id: &str, state: &str) -> bool {
        let Some(k) = self.find_vm(id) else { return false };
        if let Some(op) = self.res[&k].op.clone()
            && let Some(o) = self.ops.get_mut(&op)
            && o.action != Action::Delete
        {
            o.status = OpStatus::Succeeded;
            o.end = Some(now_secs());
            if let Some(r) = self.res.get_mut(&k) {
                r.op = None;
            }
        }
        if let Some(Detail::Vm(vm)) = self.res.get_mut(&k).map(|r| &mut r.detail) {
            vm.held = false;
        }
        const PROVISIONING: [&str; 6] =
            ["Creating", "Updating", "Deleting", "Failed", "Succeeded", "Canceled"];
        if PROVISIONING.contains(&state) {
            self.set_prov(&k, state);
        } else {
            self.set_prov(&k, "Succeeded");
            self.set_power(&k, state);
        }
        true
    }

    /// `None` takes the address off the VM's public IP (as if not allocated yet); `Some`
    /// sets it, making a public IP (`deleteOption: Delete`) on the primary NIC when it has
    /// none.
    pub(super) fn set_vm_address(&mut self, id: &str, ip: Option<&str>) -> bool {
        let Some(k) = self.find_vm(id) else { return false };
        let ips = self.vm_public_ips(&k);
        match (ip, ips.first()) {
            (None, _) => {
                for i in &ips {
                    if let Some(Detail::Ip(d)) = self.res.get_mut(i).map(|r| &mut r.detail) {
                        d.address = None;
                    }
                }
            }
            (Some(addr), Some(i)) => {
                if let Some(Detail::Ip(d)) = self.res.get_mut(i).map(|r| &mut r.detail) {
                    d.address = Some(addr.to_string());
                }
            }
            (Some(addr), None) => {
                let (rg, name, location) = {
                    let r = &self.res[&k];
                    (r.rg.clone(), format!("{}-ip", r.name), r.location.clone())
                };
                let ip_key = key(&self.id_of(ResourceKind::PublicIp, &rg, &name));
                let nic = match self.res.get(&k).map(|r| &r.detail) {
                    Some(Detail::Vm(vm)) => vm.nics.first().map(|n| key(&n.id)),
                    _ => None,
                };
                let Some(nic) = nic else { return true };
                let cfg_id = match self.res.get(&nic) {
                    Some(Res { id, detail: Detail::Nic(n), .. }) => {
                        n.ip_configs.first().map(|c| format!("{id}/ipConfigurations/{}", c.name))
                    }
                    _ => None,
                };
                let detail = Detail::Ip(Ip {
                    sku: "Standard".into(),
                    tier: "Regional".into(),
                    allocation: "Static".into(),
                    version: "IPv4".into(),
                    idle_timeout: 4,
                    address: Some(addr.to_string()),
                    delete_option: Some("Delete".into()),
                    ip_config: cfg_id,
                    zones: Vec::new(),
                });
                let r = self.new_res(
                    ResourceKind::PublicIp,
                    (&rg, &name, &location),
                    BTreeMap::new(),
                    "Succeeded",
                    detail,
                );
                let canon = r.id.clone();
                self.res.insert(ip_key, r);
                if let Some(Detail::Nic(n)) = self.res.get_mut(&nic).map(|r| &mut r.detail)
                    && let Some(c) = n.ip_configs.first_mut()
                {
                    c.public_ip = Some(canon);
                }
            }
        }
        true
    }

    pub(super) fn slow_delete_vm(&mut self, id: &str) -> bool {
        let Some(k) = self.find_vm(id) else { return false };
        let current = self.res[&k]
            .op
            .clone()
            .filter(|o| self.ops.get(o).is_some_and(|o| o.action == Action::Delete));
        match current {
            Some(op) => {
                if let Some(o) = self.ops.get_mut(&op) {
                    o.held = true;
                }
            }
            None => {
                let version = self.cfg.api_versions.compute.last().cloned().unwrap_or_default();
                self.start_delete(&k, &version, true);
            }
        }
        true
    }

    pub(super) fn finish_all_deletes(&mut self) {
        let ops: Vec<String> = self
            .ops
            .values()
            .filter(|o| o.running() && o.action == Action::Delete)
            .map(|o| o.id.clone())
            .collect();
        for op in ops {
            self.complete(&op);
        }
    }

    pub(super) fn set_vm_locked(&mut self, id: &str, locked: bool) -> bool {
        let Some(k) = self.find_vm(id) else { return false };
        if let Some(Detail::Vm(vm)) = self.res.get_mut(&k).map(|r| &mut r.detail) {
            vm.locked = locked;
        }
        true
    }

    /// A running VM with a NIC and a Standard static public IP, every part tagged with the
    /// marks `plant` asks for and `deleteOption: Delete`, as a plugin would make it.
    pub(super) fn plant_vm(&mut self, p: &Plant) -> Result<String, ArmError> {
        let (rg, location) = self.plant_scope(&p.scope)?;
        Self::check_name(ResourceKind::Vm, &p.name)?;
        let vm_id = self.id_of(ResourceKind::Vm, &rg, &p.name);
        if self.res.contains_key(&key(&vm_id)) {
            return Err(ArmError::new(
                409,
                "Conflict",
                format!(
                    "A virtual machine named '{}' already exists in resource group '{rg}'.",
                    p.name
                ),
            ));
        }
        let subnet = self
            .cfg
            .subnets
            .iter()
            .find(|s| s.location == location)
            .map(|s| s.id.clone())
            .ok_or_else(|| {
                ArmError::location_not_available(
                    &location,
                    "Microsoft.Network/virtualNetworks/subnets",
                    &self.cfg.locations,
                )
            })?;
        let marks: BTreeMap<String, String> =
            crate::framework::marks(p).iter().filter_map(|(k, v)| tags::encode(k, v)).collect();
        let created = p.created_at.unwrap_or_else(now_secs);
        let (ip_name, nic_name) = (format!("{}-ip", p.name), format!("{}-nic", p.name));
        let ip_id = self.id_of(ResourceKind::PublicIp, &rg, &ip_name);
        let nic_id = self.id_of(ResourceKind::Nic, &rg, &nic_name);
        let disk_name = format!("{}_OsDisk_1_{}", p.name, self.guid().replace('-', ""));
        let disk_id = self.id_of(ResourceKind::Disk, &rg, &disk_name);
        let address = self.next_ipv4();
        let private = self.private_ip(&subnet);
        let mac = self.mac();
        let mut ip = self.new_res(
            ResourceKind::PublicIp,
            (&rg, &ip_name, &location),
            marks.clone(),
            "Succeeded",
            Detail::Ip(Ip {
                sku: "Standard".into(),
                tier: "Regional".into(),
                allocation: "Static".into(),
                version: "IPv4".into(),
                idle_timeout: 4,
                address: Some(address),
                delete_option: Some("Delete".into()),
                ip_config: Some(format!("{nic_id}/ipConfigurations/ipconfig1")),
                zones: Vec::new(),
            }),
        );
        let mut nic = self.new_res(
            ResourceKind::Nic,
            (&rg, &nic_name, &location),
            marks.clone(),
            "Succeeded",
            Detail::Nic(Nic {
                ip_configs: vec![IpConfig {
                    name: "ipconfig1".into(),
                    subnet,
                    private_ip: private,
                    public_ip: Some(ip_id.clone()),
                    primary: true,
                }],
                vm: Some(vm_id.clone()),
                mac,
                accelerated: false,
                nsg: None,
            }),
        );
        let size = self.cfg.vm_sizes.first().cloned().unwrap_or_else(|| "Standard_B1s".into());
        let mut disk = self.new_res(
            ResourceKind::Disk,
            (&rg, &disk_name, &location),
            BTreeMap::new(),
            "Succeeded",
            Detail::Disk(Disk { size_gb: 30, sku: "Premium_LRS".into(), vm: Some(vm_id.clone()) }),
        );
        let vm_guid = self.guid();
        let mut vm = self.new_res(ResourceKind::Vm, (&rg, &p.name, &location),
            marks,
            "Succeeded",
            Detail::Vm(Box::new(Vm {
                vm_id: vm_guid,
                size,
                image: json!({"publisher": "Canonical", "offer": "ubuntu-24_04-lts", "sku": "server", "version": "latest"}),
                os_disk: OsDisk {
                    name: disk_name,
                    id: disk_id.clone(),
                    caching: "ReadWrite".into(),
                    storage: "Premium_LRS".into(),
                    delete_option: "Delete".into(),
                    size_gb: 30,
                },
                nics: vec![NicRef { id: nic_id.clone(), primary: Some(true), delete_option: Some("Delete".into()) }],
                computer_name: p.name.clone(),
                admin_username: "azureuser".into(),
                linux: json!({"disablePasswordAuthentication": true, "provisionVMAgent": true}),
                custom_data: None,
                user_data: None,
                priority: "Regular".into(),
                eviction_policy: None,
                max_price: None,
                zones: Vec::new(),
                power: "running".into(),
                held: false,
                locked: false,
                failure: None,
            })),
        );
        for r in [&mut ip, &mut nic, &mut disk, &mut vm] {
            r.created = created;
            r.changed = created;
        }
        let vk = key(&vm_id);
        for r in [ip, nic, disk, vm] {
            self.res.insert(key(&r.id), r);
        }
        self.start_proxy(&vk);
        Ok(vm_id)
    }

    /// A plant's scope: a resource group, a location (its first resource group), or the
    /// first resource group.
    pub(super) fn plant_scope(&self, scope: &str) -> Result<(String, String), ArmError> {
        let rgs = &self.cfg.resource_groups;
        let found = if scope.is_empty() {
            rgs.first()
        } else {
            rgs.iter()
                .find(|r| r.name.eq_ignore_ascii_case(scope))
                .or_else(|| rgs.iter().find(|r| r.location.eq_ignore_ascii_case(scope)))
        };
        let rg = found.ok_or_else(|| ArmError::resource_group_not_found(scope))?;
        Ok((rg.name.clone(), rg.location.clone()))
    }
}

/// The control surface on Azure's terms; see "Control surface" in the module docs.
impl Model for Backend {
    fn hold(&mut self, id: &str, hold: bool) -> bool {
        self.hold_vm(id, hold)
    }
    fn set_state(&mut self, id: &str, state: &str) -> bool {
        self.set_vm_state(id, state)
    }
    fn set_address(&mut self, id: &str, ip: Option<&str>) -> bool {
        self.set_vm_address(id, ip)
    }
    fn slow_delete(&mut self, id: &str) -> bool {
        self.slow_delete_vm(id)
    }
    fn finish_deletes(&mut self) {
        self.finish_all_deletes()
    }
    fn set_locked(&mut self, id: &str, locked: bool) -> bool {
        self.set_vm_locked(id, locked)
    }
    fn plant(&mut self, plant: &Plant) -> Result<String, Refusal> {
        self.plant_vm(plant).map_err(Into::into)
    }
    fn inject(&mut self, fault: Fault) {
        let effect = match &fault.kind {
            FaultKind::Slow { delay_ms } => Effect::delay(Duration::from_millis(*delay_ms)),
            kind => Effect::fail(self.fault_error(kind)),
        };
        self.traffic.faults.push(fault.op, effect, fault.count);
    }
    /// A location or a resource group (any case): any list touching a resource there fails
    /// whole with ARM's 500, as a region whose backend is down fails a global list.
    fn fail_scope(&mut self, scope: &str, fail: bool) {
        let s = scope.to_ascii_lowercase();
        if fail {
            self.failing.insert(s);
        } else {
            self.failing.remove(&s);
        }
    }
    fn dump(&mut self) -> Dump {
        self.dump_all()
    }
    fn reset(&mut self) {
        self.forget()
    }
    fn set_rate_limit(&mut self, limit: Option<RateLimit>) {
        self.traffic.limits.set(limit);
    }
    fn stats(&self) -> RequestStats {
        self.traffic.stats.clone()
    }
    fn requests(&self) -> Vec<String> {
        self.traffic.requests.clone()
    }
    /// Evicts a Spot VM ([`AzureEmulator::evict`](super::AzureEmulator::evict)); `409` for a
    /// regular one.
    fn reclaim(&mut self, id: &str) -> Result<bool, Refusal> {
        let Some(k) = self.find_vm(id) else { return Ok(false) };
        let spot = matches!(self.res.get(&k).map(|r| &r.detail), Some(Detail::Vm(vm)) if vm.priority == "Spot");
        if !spot {
            return Err(Refusal::conflict(id, "not an Azure Spot VM (priority Regular)"));
        }
        self.evict(&k).map(|()| true).map_err(Into::into)
    }
    /// Without capacity, Spot creates are refused as
    /// [`AzureConfig::spot_refusal`](super::AzureConfig::spot_refusal) says.
    fn set_spot_capacity(&mut self, available: bool) -> bool {
        self.spot_refusal = (!available).then_some(self.cfg.spot_refusal);
        true
    }
    fn spot_instances(&mut self) -> Vec<String> {
        self.tick();
        self.res
            .values()
            .filter(|r| matches!(&r.detail, Detail::Vm(vm) if vm.priority == "Spot"))
            .map(|r| r.id.clone())
            .collect()
    }
}
