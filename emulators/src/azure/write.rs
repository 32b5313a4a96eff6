//! The API's writes: `PUT` of public IPs, NICs and VMs with the references ARM checks,
//! `DELETE` with its refusals, the VM power actions and evictions.

use std::collections::BTreeMap;

use serde_json::{Value, json};

use super::error::ArmError;
use super::model::{
    Action, Backend, Detail, Disk, Ip, IpConfig, Nic, NicRef, OpStatus, OsDisk, Res, ResourceKind,
    Vm, Written, key,
};
use super::{SpotRefusal, tags};
use crate::time::now_secs;

impl Backend {
    // ---- writes ---------------------------------------------------------------------------

    pub(super) fn check_name(kind: ResourceKind, name: &str) -> Result<(), ArmError> {
        let max = if kind == ResourceKind::Vm { 64 } else { 80 };
        let chars_ok = name.chars().all(|c| c.is_ascii_alphanumeric() || "-._".contains(c));
        let first_ok = name.chars().next().is_some_and(|c| c.is_ascii_alphanumeric());
        let last_ok = name.chars().last().is_some_and(|c| c.is_ascii_alphanumeric() || c == '_');
        if name.is_empty() || name.len() > max || !chars_ok || !first_ok || !last_ok {
            return Err(ArmError::invalid_resource_name(name, &kind.full_type()));
        }
        Ok(())
    }

    /// The `tags` of a body, checked as ARM checks them.
    pub(crate) fn parse_tags(body: &Value) -> Result<BTreeMap<String, String>, ArmError> {
        let Some(obj) = body.get("tags").filter(|t| !t.is_null()) else {
            return Ok(BTreeMap::new());
        };
        let Some(obj) = obj.as_object() else {
            return Err(ArmError::invalid_request_content("tags must be an object"));
        };
        if obj.len() > tags::MAX_TAGS {
            return Err(ArmError::too_many_tags());
        }
        let bad: Vec<&str> =
            obj.keys().filter(|k| !tags::valid_name(k)).map(String::as_str).collect();
        if !bad.is_empty() {
            return Err(ArmError::invalid_tag_name(&bad));
        }
        let mut out = BTreeMap::new();
        for (k, v) in obj {
            let Some(v) = v.as_str() else {
                return Err(ArmError::invalid_request_content(&format!(
                    "tag '{k}' is not a string"
                )));
            };
            if k.chars().count() > tags::MAX_NAME {
                return Err(ArmError::invalid_tag_name_length(k));
            }
            if v.chars().count() > tags::MAX_VALUE {
                return Err(ArmError::invalid_tag_value(k));
            }
            out.insert(k.clone(), v.to_string());
        }
        Ok(out)
    }

    pub(super) fn new_res(
        &mut self,
        kind: ResourceKind,
        (rg, name, location): (&str, &str, &str),
        tags: BTreeMap<String, String>,
        state: &str,
        detail: Detail,
    ) -> Res {
        let now = now_secs();
        Res {
            kind,
            id: self.id_of(kind, rg, name),
            name: name.to_string(),
            rg: rg.to_string(),
            location: location.to_string(),
            tags,
            created: now,
            changed: now,
            state: state.to_string(),
            etag: 1,
            guid: self.guid(),
            op: None,
            detail,
        }
    }

    /// Common to every PUT: the resource group, the name, the location, the tags.
    pub(super) fn put_common(
        &self,
        kind: ResourceKind,
        rg: &str,
        name: &str,
        body: &Value,
    ) -> Result<(String, String, BTreeMap<String, String>), ArmError> {
        let rg = self.rg(rg)?.name;
        Self::check_name(kind, name)?;
        let location = match body.get("location").and_then(Value::as_str) {
            Some(l) => self.location(l, kind)?,
            None => return Err(ArmError::location_required()),
        };
        Ok((rg, location, Self::parse_tags(body)?))
    }

    /// A write to an existing resource while an operation that it cannot wait for runs.
    pub(super) fn busy(&self, k: &str) -> Result<(), ArmError> {
        let r = &self.res[k];
        let deleting =
            r.op.as_ref().and_then(|o| self.ops.get(o)).is_some_and(|o| o.action == Action::Delete);
        if deleting {
            if r.kind == ResourceKind::Vm {
                return Err(ArmError::new(
                    409,
                    "OperationNotAllowed",
                    format!(
                        "Operation 'PUT' is not allowed on VM '{}' since the VM is marked for \
                         deletion. You can only retry the Delete operation (or wait for an ongoing \
                         one to complete).",
                        r.name
                    ),
                ));
            }
            return Err(
                ArmError::another_operation(&self.op_url(r.op.as_deref().unwrap_or(""))).network()
            );
        }
        if matches!(&r.detail, Detail::Vm(vm) if vm.locked) {
            let url = r.op.as_deref().map(|o| self.op_url(o)).unwrap_or_else(|| r.id.clone());
            return Err(ArmError::another_operation(&url));
        }
        Ok(())
    }

    /// `PUT .../publicIPAddresses/{name}`.
    pub(crate) fn put_ip(
        &mut self,
        rg: &str,
        name: &str,
        body: &Value,
        version: &str,
    ) -> Result<Written, ArmError> {
        let (rg, location, tags) = self.put_common(ResourceKind::PublicIp, rg, name, body)?;
        let props = body.get("properties").cloned().unwrap_or(json!({}));
        let sku = body.pointer("/sku/name").and_then(Value::as_str).unwrap_or("Basic").to_string();
        let tier =
            body.pointer("/sku/tier").and_then(Value::as_str).unwrap_or("Regional").to_string();
        let standard = sku.eq_ignore_ascii_case("Standard");
        let allocation = props
            .get("publicIPAllocationMethod")
            .and_then(Value::as_str)
            .map(str::to_string)
            .unwrap_or_else(|| if standard { "Static" } else { "Dynamic" }.into());
        let id = self.id_of(ResourceKind::PublicIp, &rg, name);
        if standard && !allocation.eq_ignore_ascii_case("Static") {
            // Captured: pulumi-azure-native#1597.
            return Err(ArmError::new(
                400,
                "StandardSkuPublicIPAddressesMustBeStatic",
                format!("Standard sku publicIp {id} must have AllocationMethod set to Static."),
            )
            .network());
        }
        let version_ = props
            .get("publicIPAddressVersion")
            .and_then(Value::as_str)
            .unwrap_or("IPv4")
            .to_string();
        let idle = props.get("idleTimeoutInMinutes").and_then(Value::as_u64).unwrap_or(4);
        let delete_option = props.get("deleteOption").and_then(Value::as_str).map(str::to_string);
        let zones = str_list(body.get("zones"));
        let k = key(&id);
        if self.res.contains_key(&k) {
            self.busy(&k)?;
            let r = self.res.get_mut(&k).expect("checked");
            r.tags = tags;
            r.etag += 1;
            r.changed = now_secs();
            if let Detail::Ip(ip) = &mut r.detail {
                ip.idle_timeout = idle;
                if delete_option.is_some() {
                    ip.delete_option = delete_option;
                }
            }
            let op = self.update_op(&k, version);
            return Ok(Written { created: false, body: self.render(&k), op });
        }
        let detail = Detail::Ip(Ip {
            sku: if standard { "Standard".into() } else { "Basic".into() },
            tier,
            allocation: if allocation.eq_ignore_ascii_case("Static") {
                "Static".into()
            } else {
                "Dynamic".into()
            },
            version: if version_.eq_ignore_ascii_case("IPv6") {
                "IPv6".into()
            } else {
                "IPv4".into()
            },
            idle_timeout: idle,
            address: None,
            delete_option,
            ip_config: None,
            zones,
        });
        let r =
            self.new_res(ResourceKind::PublicIp, (&rg, name, &location), tags, "Updating", detail);
        self.res.insert(k.clone(), r);
        let op = self.start_op(&k, Action::Create, version);
        Ok(Written { created: true, body: self.render(&k), op })
    }

    /// An update of a resource with no operation running is over at once; one that comes
    /// while an operation runs joins it.
    pub(super) fn update_op(&mut self, k: &str, version: &str) -> String {
        match self.res.get(k).and_then(|r| r.op.clone()) {
            Some(op) => op,
            None => self.done_op(k, version),
        }
    }

    /// `PUT .../networkInterfaces/{name}`.
    pub(crate) fn put_nic(
        &mut self,
        rg: &str,
        name: &str,
        body: &Value,
        version: &str,
    ) -> Result<Written, ArmError> {
        let (rg, location, tags) = self.put_common(ResourceKind::Nic, rg, name, body)?;
        let id = self.id_of(ResourceKind::Nic, &rg, name);
        let k = key(&id);
        let configs = body
            .pointer("/properties/ipConfigurations")
            .and_then(Value::as_array)
            .cloned()
            .unwrap_or_default();
        if configs.is_empty() {
            return Err(ArmError::new(
                400,
                "InvalidRequestFormat",
                "Cannot parse the request.",
            )
            .network()
            .with_detail("InvalidJson", "Network interface must have at least one IP configuration. Path properties.ipConfigurations."));
        }
        let reference = |what: &str| {
            ArmError::new(
                400,
                "InvalidResourceReference",
                format!(
                    "Resource {what} referenced by resource {id} was not found. Please make sure \
                     that the referenced resource exists, and that both resources are in the same \
                     region."
                ),
            )
            .network()
        };
        let mut parsed = Vec::new();
        for (i, c) in configs.iter().enumerate() {
            let cname = c.get("name").and_then(Value::as_str).unwrap_or("ipconfig1").to_string();
            let subnet = c.pointer("/properties/subnet/id").and_then(Value::as_str).unwrap_or("");
            let spec = self.cfg.subnets.iter().find(|s| s.id.eq_ignore_ascii_case(subnet));
            let Some(spec) = spec.filter(|s| s.location == location) else {
                return Err(reference(subnet));
            };
            let subnet = spec.id.clone();
            let public = c.pointer("/properties/publicIPAddress").filter(|p| !p.is_null());
            let public_id = match public {
                None => None,
                Some(p) => match p.get("id").and_then(Value::as_str) {
                    Some(pid) => Some((
                        pid.to_string(),
                        p.pointer("/properties/deleteOption")
                            .and_then(Value::as_str)
                            .map(str::to_string),
                    )),
                    None => {
                        // Captured: compute-node-manage-vm#15.
                        return Err(ArmError::new(400, "InvalidRequestFormat", "Cannot parse the request.")
                            .network()
                            .with_detail(
                                "MissingJsonReferenceId",
                                &format!("Value for reference id is missing. Path properties.ipConfigurations[{i}].properties.publicIPAddress."),
                            ));
                    }
                },
            };
            let primary =
                c.pointer("/properties/primary").and_then(Value::as_bool).unwrap_or(i == 0);
            let private = c
                .pointer("/properties/privateIPAddress")
                .and_then(Value::as_str)
                .map(str::to_string);
            parsed.push((cname, subnet, public_id, primary, private));
        }
        // References: each public IP exists, is in the NIC's region and is free.
        for (cname, _, public, _, _) in &parsed {
            let Some((pid, _)) = public else { continue };
            let pk = key(pid);
            let ip = self
                .res
                .get(&pk)
                .filter(|r| r.kind == ResourceKind::PublicIp && r.location == location);
            let deleting = ip
                .and_then(|r| r.op.as_ref())
                .and_then(|o| self.ops.get(o))
                .is_some_and(|o| o.action == Action::Delete);
            let Some(ip) = ip.filter(|_| !deleting) else {
                return Err(reference(pid));
            };
            if let Detail::Ip(d) = &ip.detail
                && let Some(used) = &d.ip_config
                && !key(used).starts_with(&format!("{k}/ipconfigurations/"))
            {
                let _ = cname;
                return Err(ArmError::new(
                    400,
                    "PublicIPAddressInUse",
                    format!("Public IP address {} is already allocated to resource {used}.", ip.id),
                )
                .network());
            }
        }
        let existing = self.res.contains_key(&k);
        if existing {
            self.busy(&k)?;
        }
        // Detach the IPs this NIC no longer uses, attach the new ones.
        if let Some(Res { detail: Detail::Nic(old), .. }) = self.res.get(&k) {
            let olds: Vec<String> =
                old.ip_configs.iter().filter_map(|c| c.public_ip.as_deref()).map(key).collect();
            for o in olds {
                if !parsed.iter().any(|p| p.2.as_ref().is_some_and(|(pid, _)| key(pid) == o))
                    && let Some(Detail::Ip(d)) = self.res.get_mut(&o).map(|r| &mut r.detail)
                {
                    d.ip_config = None;
                }
            }
        }
        let old_privates: BTreeMap<String, String> = match self.res.get(&k).map(|r| &r.detail) {
            Some(Detail::Nic(n)) => {
                n.ip_configs.iter().map(|c| (c.name.clone(), c.private_ip.clone())).collect()
            }
            _ => BTreeMap::new(),
        };
        let mut ip_configs = Vec::new();
        for (cname, subnet, public, primary, private) in parsed {
            let private_ip = match private.or_else(|| old_privates.get(&cname).cloned()) {
                Some(p) => p,
                None => self.private_ip(&subnet),
            };
            let public_ip = public.map(|(pid, delete_option)| {
                let pk = key(&pid);
                let canon = self.res.get(&pk).map(|r| r.id.clone()).unwrap_or(pid);
                if let Some(Detail::Ip(d)) = self.res.get_mut(&pk).map(|r| &mut r.detail) {
                    d.ip_config = Some(format!("{id}/ipConfigurations/{cname}"));
                    if delete_option.is_some() {
                        d.delete_option = delete_option;
                    }
                }
                canon
            });
            ip_configs.push(IpConfig { name: cname, subnet, private_ip, public_ip, primary });
        }
        let accelerated = body
            .pointer("/properties/enableAcceleratedNetworking")
            .and_then(Value::as_bool)
            .unwrap_or(false);
        let nsg = body
            .pointer("/properties/networkSecurityGroup/id")
            .and_then(Value::as_str)
            .map(str::to_string);
        if existing {
            let r = self.res.get_mut(&k).expect("checked");
            r.tags = tags;
            r.etag += 1;
            r.changed = now_secs();
            if let Detail::Nic(n) = &mut r.detail {
                n.ip_configs = ip_configs;
                n.accelerated = accelerated;
                n.nsg = nsg;
            }
            let op = self.update_op(&k, version);
            // A NIC whose VM runs gives a new dynamic IP its address.
            let vm = match self.res.get(&k).map(|r| &r.detail) {
                Some(Detail::Nic(n)) => n.vm.clone(),
                _ => None,
            };
            if let Some(vm) = vm.map(|v| key(&v))
                && matches!(self.res.get(&vm).map(|r| &r.detail), Some(Detail::Vm(v)) if v.power == "running")
            {
                self.set_power(&vm, "running");
            }
            return Ok(Written { created: false, body: self.render(&k), op });
        }
        let mac = self.mac();
        let detail = Detail::Nic(Nic { ip_configs, vm: None, mac, accelerated, nsg });
        let r = self.new_res(ResourceKind::Nic, (&rg, name, &location), tags, "Updating", detail);
        self.res.insert(k.clone(), r);
        let op = self.start_op(&k, Action::Create, version);
        Ok(Written { created: true, body: self.render(&k), op })
    }

    /// `PUT .../virtualMachines/{name}`.
    pub(crate) fn put_vm(
        &mut self,
        rg: &str,
        name: &str,
        body: &Value,
        version: &str,
    ) -> Result<Written, ArmError> {
        let (rg, location, tags) = self.put_common(ResourceKind::Vm, rg, name, body)?;
        let id = self.id_of(ResourceKind::Vm, &rg, name);
        let k = key(&id);
        let props = body.get("properties").cloned().unwrap_or(json!({}));
        let custom_data = match props.pointer("/osProfile/customData").and_then(Value::as_str) {
            None => None,
            Some(s) => Some(data_encoding::BASE64.decode(s.as_bytes()).map_err(|_| {
                ArmError::invalid_parameter(
                    "Custom data in OSProfile must be in Base64 encoding and with a maximum length \
                     of 87380 characters.",
                    "customData",
                )
            })?),
        };
        if self.res.contains_key(&k) {
            return self.update_vm(&k, tags, custom_data, &props, version);
        }
        let size = props.pointer("/hardwareProfile/vmSize").and_then(Value::as_str).unwrap_or("");
        let Some(size) = self.cfg.vm_sizes.iter().find(|s| s.eq_ignore_ascii_case(size)).cloned()
        else {
            return Err(ArmError::invalid_parameter(
                format!(
                    "The value {size} provided for the VM size is not valid. The valid sizes in the \
                     current region are: {}.",
                    self.cfg.vm_sizes.join(",")
                ),
                "vmSize",
            ));
        };
        if props
            .pointer("/networkProfile/networkInterfaceConfigurations")
            .is_some_and(|v| !v.is_null())
        {
            return Err(ArmError::invalid_parameter(
                "The emulator creates VMs on existing network interfaces only \
                 (networkProfile.networkInterfaces); networkInterfaceConfigurations is not emulated.",
                "networkInterfaceConfigurations",
            ));
        }
        let nic_refs = props
            .pointer("/networkProfile/networkInterfaces")
            .and_then(Value::as_array)
            .cloned()
            .unwrap_or_default();
        if nic_refs.is_empty() {
            return Err(ArmError::invalid_parameter(
                "Required parameter 'networkProfile' is missing (null).",
                "networkProfile",
            ));
        }
        let os_disk = props.pointer("/storageProfile/osDisk").cloned().unwrap_or(Value::Null);
        let create_option = os_disk.get("createOption").and_then(Value::as_str).unwrap_or("");
        if !create_option.eq_ignore_ascii_case("FromImage") {
            return Err(ArmError::invalid_parameter(
                format!(
                    "Required parameter 'osDisk.createOption' is missing (null) or not supported by the emulator ('{create_option}'): use FromImage."
                ),
                "osDisk.createOption",
            ));
        }
        let image = props.pointer("/storageProfile/imageReference").cloned().unwrap_or(Value::Null);
        if image.is_null() {
            return Err(ArmError::invalid_parameter(
                "Required parameter 'imageReference' is missing (null).",
                "imageReference",
            ));
        }
        let os = props.get("osProfile").cloned().unwrap_or(Value::Null);
        if os.is_null() {
            return Err(ArmError::invalid_parameter(
                "Required parameter 'osProfile' is missing (null).",
                "osProfile",
            ));
        }
        let admin = os.get("adminUsername").and_then(Value::as_str).unwrap_or("");
        if admin.is_empty() {
            return Err(ArmError::invalid_parameter(
                "Required parameter 'adminUsername' is missing (null).",
                "adminUsername",
            ));
        }
        let keys = os
            .pointer("/linuxConfiguration/ssh/publicKeys")
            .and_then(Value::as_array)
            .is_some_and(|k| !k.is_empty());
        if os.get("adminPassword").and_then(Value::as_str).is_none() && !keys {
            return Err(ArmError::invalid_parameter(
                "Required parameter 'adminPassword' is missing (null).",
                "adminPassword",
            ));
        }
        let computer = os.get("computerName").and_then(Value::as_str).unwrap_or(name).to_string();
        // Spot.
        let priority = props.get("priority").and_then(Value::as_str).unwrap_or("Regular");
        let spot = priority.eq_ignore_ascii_case("Spot") || priority.eq_ignore_ascii_case("Low");
        let eviction = props.get("evictionPolicy").and_then(Value::as_str).map(str::to_string);
        let max_price = props.pointer("/billingProfile/maxPrice").and_then(Value::as_f64);
        if !spot && eviction.is_some() {
            return Err(ArmError::invalid_parameter(
                "Eviction policy can be set only on Azure Spot Virtual Machines.",
                "evictionPolicy",
            ));
        }
        if !spot && max_price.is_some() {
            return Err(ArmError::invalid_parameter(
                "Max price can be set only on Azure Spot Virtual Machines.",
                "billingProfile.maxPrice",
            ));
        }
        if let Some(p) = max_price
            && p != -1.0
            && p <= 0.0
        {
            return Err(ArmError::invalid_parameter(
                format!(
                    "The value '{p}' provided for the max price is not valid. Allowed values are -1 or a decimal greater than zero."
                ),
                "billingProfile.maxPrice",
            ));
        }
        // Network interfaces: each exists, is in the VM's region and is free.
        let mut nics = Vec::new();
        for n in &nic_refs {
            let nid = n.get("id").and_then(Value::as_str).unwrap_or("");
            let nk = key(nid);
            let found = self.res.get(&nk).filter(|r| r.kind == ResourceKind::Nic);
            let deleting = found
                .and_then(|r| r.op.as_ref())
                .and_then(|o| self.ops.get(o))
                .is_some_and(|o| o.action == Action::Delete);
            let Some(nic) = found.filter(|_| !deleting) else {
                return Err(ArmError::new(404, "NotFound", format!("Resource {nid} not found.")));
            };
            if nic.location != location {
                return Err(ArmError::invalid_parameter(
                    format!(
                        "The network interface {} is in location '{}', but the virtual machine is \
                         in location '{location}'. They must be in the same location.",
                        nic.id, nic.location
                    ),
                    "networkProfile.networkInterfaces",
                ));
            }
            if let Detail::Nic(d) = &nic.detail
                && let Some(vm) = &d.vm
                && key(vm) != k
            {
                // Captured: pulumi-azure#441.
                return Err(ArmError::new(
                    400,
                    "NicInUse",
                    format!(
                        "Network Interface {} is used by existing resource {vm}. In order to delete \
                         the network interface, it must be dissociated from the resource. To learn \
                         more, see aka.ms/deletenic.",
                        nic.id
                    ),
                ));
            }
            nics.push(NicRef {
                id: nic.id.clone(),
                primary: n.pointer("/properties/primary").and_then(Value::as_bool),
                delete_option: n
                    .pointer("/properties/deleteOption")
                    .and_then(Value::as_str)
                    .map(str::to_string),
            });
        }
        // Capacity: quota, then Spot.
        if let Some(limit) = self.cfg.vm_limit {
            let used = self
                .res
                .values()
                .filter(|r| r.kind == ResourceKind::Vm && r.location == location)
                .count();
            if used >= limit {
                return Err(ArmError::quota(&location, limit, used));
            }
        }
        let mut failure = None;
        if spot {
            match self.spot_refusal {
                Some(SpotRefusal::SkuNotAvailable) => {
                    // Captured: azuresandbox#70 (409 Conflict).
                    return Err(ArmError::new(
                        409,
                        "SkuNotAvailable",
                        format!(
                            "The requested VM size for resource 'Following SKUs have failed for \
                             Capacity Restrictions: {size}' is currently not available in location \
                             '{location}'. Please try another size or deploy to a different \
                             location or different zone. See https://aka.ms/azureskunotavailable \
                             for details."
                        ),
                    ));
                }
                Some(SpotRefusal::Overconstrained) => {
                    failure = Some(ArmError::new(
                        409,
                        "OverconstrainedAllocationRequest",
                        "Allocation failed. VM(s) with the following constraints cannot be \
                         allocated, because the condition is too restrictive. Please remove some \
                         constraints and try again. Constraints applied are:\n  - Priority \
                         (Spot)\n  - VM Size\n",
                    ));
                }
                Some(SpotRefusal::AllocationFailed) => {
                    failure = Some(ArmError::new(
                        409,
                        "AllocationFailed",
                        "Allocation failed. We do not have sufficient capacity for the requested \
                         VM size in this region. Read more about improving likelihood of \
                         allocation success at http://aka.ms/allocation-guidance",
                    ));
                }
                None => {}
            }
            if let (Some(max), Some(current)) = (max_price, self.spot_price(&size, &location))
                && max != -1.0
                && max < current
            {
                return Err(ArmError::new(
                    409,
                    "OperationNotAllowed",
                    format!(
                        "Unable to perform operation 'Create VM' since the provided MaxPrice \
                         '{max}' USD is lower than the current spot price '{current}' USD for \
                         Azure Spot VM size '{size}'."
                    ),
                ));
            }
        }
        // The OS disk the VM makes.
        let disk_name = match os_disk.get("name").and_then(Value::as_str) {
            Some(n) => n.to_string(),
            None => {
                let g = self.guid().replace('-', "");
                format!("{name}_OsDisk_1_{g}")
            }
        };
        let disk_id = self.id_of(ResourceKind::Disk, &rg, &disk_name);
        let dk = key(&disk_id);
        if self.res.contains_key(&dk) {
            return Err(ArmError::new(
                409,
                "Conflict",
                format!(
                    "Disk {disk_name} already exists in resource group {}. Only CreateOption.Attach is supported.",
                    rg.to_ascii_uppercase()
                ),
            ));
        }
        let storage = os_disk
            .pointer("/managedDisk/storageAccountType")
            .and_then(Value::as_str)
            .unwrap_or("Premium_LRS")
            .to_string();
        let size_gb = os_disk.get("diskSizeGB").and_then(Value::as_u64).unwrap_or(30);
        let os_disk = OsDisk {
            name: disk_name.clone(),
            id: disk_id.clone(),
            caching: os_disk
                .get("caching")
                .and_then(Value::as_str)
                .unwrap_or("ReadWrite")
                .to_string(),
            storage: storage.clone(),
            delete_option: os_disk
                .get("deleteOption")
                .and_then(Value::as_str)
                .unwrap_or("Detach")
                .to_string(),
            size_gb,
        };
        let mut linux = os.get("linuxConfiguration").cloned().unwrap_or(Value::Null);
        if linux.is_null() {
            linux = json!({"disablePasswordAuthentication": false, "provisionVMAgent": true});
        }
        let vm_id = self.guid();
        let vm = Vm {
            vm_id,
            size: size.clone(),
            image,
            os_disk,
            nics,
            computer_name: computer,
            admin_username: admin.to_string(),
            linux,
            custom_data,
            user_data: props.get("userData").and_then(Value::as_str).map(str::to_string),
            priority: if spot { "Spot".into() } else { "Regular".into() },
            eviction_policy: if spot {
                Some(eviction.unwrap_or_else(|| "Deallocate".into()))
            } else {
                None
            },
            max_price: if spot { Some(max_price.unwrap_or(-1.0)) } else { None },
            zones: str_list(body.get("zones")),
            power: "starting".into(),
            held: false,
            locked: false,
            failure: None,
        };
        let nic_keys: Vec<String> = vm.nics.iter().map(|n| key(&n.id)).collect();
        let r = self.new_res(
            ResourceKind::Vm,
            (&rg, name, &location),
            tags,
            "Creating",
            Detail::Vm(Box::new(vm)),
        );
        self.res.insert(k.clone(), r);
        let disk = self.new_res(
            ResourceKind::Disk,
            (&rg, &disk_name, &location),
            BTreeMap::new(),
            "Updating",
            Detail::Disk(Disk { size_gb, sku: storage, vm: Some(id.clone()) }),
        );
        self.res.insert(dk, disk);
        for nk in nic_keys {
            if let Some(Detail::Nic(n)) = self.res.get_mut(&nk).map(|r| &mut r.detail) {
                n.vm = Some(id.clone());
            }
        }
        let op = self.start_op(&k, Action::Create, version);
        if let Some(o) = self.ops.get_mut(&op) {
            o.failure = failure;
        }
        Ok(Written { created: true, body: self.render(&k), op })
    }

    pub(super) fn update_vm(
        &mut self,
        k: &str,
        tags: BTreeMap<String, String>,
        custom_data: Option<Vec<u8>>,
        props: &Value,
        version: &str,
    ) -> Result<Written, ArmError> {
        self.busy(k)?;
        let failed = self.res[k].state == "Failed";
        let Some(Res { detail: Detail::Vm(vm), .. }) = self.res.get(k) else {
            return Err(ArmError::internal_execution());
        };
        if let Some(cd) = &custom_data
            && vm.custom_data.as_ref() != Some(cd)
        {
            return Err(ArmError::new(
                409,
                "PropertyChangeNotAllowed",
                "Changing property 'customData' is not allowed.",
            )
            .with_target("customData"));
        }
        let max_price = props.pointer("/billingProfile/maxPrice").and_then(Value::as_f64);
        let r = self.res.get_mut(k).expect("checked");
        r.tags = tags;
        r.etag += 1;
        r.changed = now_secs();
        if let Detail::Vm(vm) = &mut r.detail
            && vm.priority == "Spot"
            && max_price.is_some()
        {
            vm.max_price = max_price;
        }
        if failed {
            // A PUT of a VM whose creation failed tries the creation again.
            r.state = "Creating".into();
            if let Detail::Vm(vm) = &mut r.detail {
                vm.failure = None;
                vm.power = "starting".into();
            }
            let spot = matches!(&r.detail, Detail::Vm(vm) if vm.priority == "Spot");
            let op = self.start_op(k, Action::Create, version);
            let refusal = if spot { self.spot_refusal } else { None };
            if let (Some(SpotRefusal::Overconstrained | SpotRefusal::AllocationFailed), Some(o)) =
                (refusal, self.ops.get_mut(&op))
            {
                o.failure = Some(ArmError::new(
                    409,
                    "AllocationFailed",
                    "Allocation failed. We do not have sufficient capacity for the requested VM \
                     size in this region. Read more about improving likelihood of allocation \
                     success at http://aka.ms/allocation-guidance",
                ));
            }
            return Ok(Written { created: false, body: self.render(k), op });
        }
        let op = self.update_op(k, version);
        Ok(Written { created: false, body: self.render(k), op })
    }

    /// The Spot price the price list gives a size in a region (Linux meter).
    pub(super) fn spot_price(&self, size: &str, location: &str) -> Option<f64> {
        self.cfg
            .prices
            .iter()
            .find(|p| {
                p.arm_sku_name.eq_ignore_ascii_case(size)
                    && p.arm_region_name == location
                    && p.sku_name.ends_with(" Spot")
                    && !p.product_name.ends_with(" Windows")
            })
            .map(|p| p.retail_price)
    }

    // ---- deletes --------------------------------------------------------------------------

    /// `DELETE` of a resource: `None` when it does not exist (ARM's 204), else the operation
    /// (a delete already in progress answers with its own).
    pub(crate) fn delete(
        &mut self,
        kind: ResourceKind,
        rg: &str,
        name: &str,
        version: &str,
    ) -> Result<Option<String>, ArmError> {
        let rg = self.rg(rg)?.name;
        let k = key(&self.id_of(kind, &rg, name));
        let Some(r) = self.res.get(&k).filter(|r| r.kind == kind) else {
            return Ok(None);
        };
        if let Some(op) =
            r.op.as_ref().filter(|o| self.ops.get(*o).is_some_and(|o| o.action == Action::Delete))
        {
            return Ok(Some(op.clone()));
        }
        match &r.detail {
            Detail::Vm(vm) if vm.locked => {
                let url = r.op.as_deref().map(|o| self.op_url(o)).unwrap_or_else(|| r.id.clone());
                return Err(ArmError::another_operation(&url));
            }
            Detail::Nic(n) => {
                if let Some(vm) = &n.vm {
                    // Captured: terraform-provider-azurerm#8105.
                    return Err(ArmError::new(
                        400,
                        "NicInUse",
                        format!(
                            "Network Interface {} is used by existing resource {vm}. In order to \
                             delete the network interface, it must be dissociated from the \
                             resource. To learn more, see aka.ms/deletenic.",
                            r.id
                        ),
                    )
                    .network());
                }
            }
            Detail::Ip(ip) => {
                if let Some(cfg) = &ip.ip_config {
                    // Captured: oap-project/cloudtik#158.
                    return Err(ArmError::new(
                        400,
                        "PublicIPAddressCannotBeDeleted",
                        format!(
                            "Public IP address {} can not be deleted since it is still allocated \
                             to resource {cfg}. In order to delete the public IP, disassociate/detach \
                             the Public IP address from the resource.  To learn how to do this, see \
                             aka.ms/deletepublicip.",
                            r.id
                        ),
                    )
                    .network());
                }
            }
            Detail::Disk(d) => {
                if let Some(vm) = &d.vm {
                    return Err(ArmError::new(
                        409,
                        "OperationNotAllowed",
                        format!("Disk {} is attached to VM {vm}.", r.name),
                    ));
                }
            }
            Detail::Vm(_) => {}
        }
        Ok(Some(self.start_delete(&k, version, false)))
    }

    /// Puts a resource in `Deleting` behind a delete operation (`held`: a slow delete).
    pub(super) fn start_delete(&mut self, k: &str, version: &str, held: bool) -> String {
        // An operation it was in (a creation) is over, cut short.
        if let Some(old) = self.res.get(k).and_then(|r| r.op.clone())
            && let Some(o) = self.ops.get_mut(&old)
            && o.running()
        {
            o.status = OpStatus::Failed(ArmError::new(
                409,
                "OperationPreempted",
                "Operation execution has been preempted by a more recent operation.",
            ));
            o.end = Some(now_secs());
        }
        self.set_prov(k, "Deleting");
        if matches!(self.res.get(k).map(|r| r.kind), Some(ResourceKind::Vm)) {
            if let Some(Detail::Vm(vm)) = self.res.get_mut(k).map(|r| &mut r.detail) {
                vm.held = false;
            }
            self.set_power(k, "deallocating");
        }
        let op = self.start_op(k, Action::Delete, version);
        if let Some(o) = self.ops.get_mut(&op) {
            o.held = held;
        }
        op
    }

    // ---- VM actions -----------------------------------------------------------------------

    /// `POST .../virtualMachines/{name}/{start|powerOff|deallocate|restart}`.
    pub(crate) fn vm_action(
        &mut self,
        rg: &str,
        name: &str,
        action: &str,
        version: &str,
    ) -> Result<String, ArmError> {
        let k = key(&self.get_res(ResourceKind::Vm, rg, name)?.id);
        self.busy(&k)?;
        let (target, transient) = match action {
            "start" => ("running", "starting"),
            "powerOff" => ("stopped", "stopping"),
            "deallocate" => ("deallocated", "deallocating"),
            "restart" => ("running", "starting"),
            _ => {
                return Err(ArmError::invalid_resource_type(
                    "Microsoft.Compute",
                    &format!("virtualMachines/{action}"),
                    version,
                ));
            }
        };
        if let Some(old) = self.res[&k].op.clone() {
            return Err(ArmError::another_operation(&self.op_url(&old)));
        }
        self.set_prov(&k, "Updating");
        self.set_power(&k, transient);
        Ok(self.start_op(&k, Action::Power(target), version))
    }

    /// Evicts a Spot VM; see [`AzureEmulator::evict`](super::AzureEmulator::evict).
    pub(crate) fn evict(&mut self, id: &str) -> Result<(), ArmError> {
        let k = self
            .find_vm(id)
            .ok_or_else(|| ArmError::new(404, "NotFound", format!("VM {id} not found.")))?;
        let (policy, spot) = match self.res.get(&k).map(|r| &r.detail) {
            Some(Detail::Vm(vm)) => (vm.eviction_policy.clone(), vm.priority == "Spot"),
            _ => (None, false),
        };
        if !spot {
            return Err(ArmError::new(
                409,
                "OperationNotAllowed",
                "The operation 'simulateEviction' is allowed only for Azure Spot virtual machines.",
            ));
        }
        if policy.as_deref().is_some_and(|p| p.eq_ignore_ascii_case("Delete")) {
            let version = self.cfg.api_versions.compute.last().cloned().unwrap_or_default();
            self.start_delete(&k, &version, false);
        } else {
            if let Some(old) = self.res.get(&k).and_then(|r| r.op.clone())
                && let Some(o) = self.ops.get_mut(&old)
            {
                o.status = OpStatus::Succeeded;
                o.end = Some(now_secs());
            }
            if let Some(r) = self.res.get_mut(&k) {
                r.op = None;
            }
            self.set_prov(&k, "Succeeded");
            self.set_power(&k, "deallocated");
        }
        Ok(())
    }

    /// A VM named by the control surface: its full ID (any case), `rg/name`, or a name no
    /// other VM has.
    pub(crate) fn find_vm(&self, id: &str) -> Option<String> {
        let k = key(id);
        if self.res.get(&k).is_some_and(|r| r.kind == ResourceKind::Vm) {
            return Some(k);
        }
        let vms = || self.res.values().filter(|r| r.kind == ResourceKind::Vm);
        if let Some((rg, name)) = id.split_once('/') {
            return vms()
                .find(|r| r.rg.eq_ignore_ascii_case(rg) && r.name.eq_ignore_ascii_case(name))
                .map(|r| key(&r.id));
        }
        let mut named = vms().filter(|r| r.name.eq_ignore_ascii_case(id));
        match (named.next(), named.next()) {
            (Some(r), None) => Some(key(&r.id)),
            _ => None,
        }
    }
}

/// The strings of a JSON array (`zones`).
fn str_list(v: Option<&Value>) -> Vec<String> {
    v.and_then(Value::as_array)
        .map(|a| a.iter().filter_map(Value::as_str).map(str::to_string).collect())
        .unwrap_or_default()
}
