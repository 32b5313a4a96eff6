//! The resources as the API shows them: the `VirtualMachine`, `VirtualMachineInstanceView`,
//! `PublicIPAddress`, `NetworkInterface`, `Disk` and `GenericResourceExpanded` schemas of
//! the specs, in the shape of their examples (`VirtualMachine_Get.json`,
//! `VirtualMachine_Get_InstanceView.json`, `NetworkInterfaceGet.json`,
//! `PublicIpAddressCreateCustomizedValues.json`).

use serde_json::{Value, json};

use super::model::{Backend, Detail, Op, OpStatus, Res, ResourceKind, key};
use crate::time::rfc3339;

fn with_tags(v: &mut Value, r: &Res) {
    if !r.tags.is_empty() {
        v["tags"] = json!(r.tags);
    }
}

fn prov_display(state: &str) -> String {
    match state {
        "Succeeded" => "Provisioning succeeded".into(),
        "Failed" => "Provisioning failed".into(),
        other => other.to_string(),
    }
}

fn power_display(power: &str) -> String {
    format!("VM {power}")
}

impl Backend {
    /// The resource `k` (a key) as its `GET` shows it.
    pub(crate) fn render(&self, k: &str) -> Value {
        let Some(r) = self.res.get(k) else { return Value::Null };
        match &r.detail {
            Detail::Ip(_) => self.render_ip(r),
            Detail::Nic(_) => self.render_nic(r),
            Detail::Disk(_) => self.render_disk(r),
            Detail::Vm(_) => self.render_vm(r, false, false),
        }
    }

    /// A VM, with `$expand=instanceView` / `userData` as asked.
    pub(crate) fn render_vm_expanded(
        &self,
        k: &str,
        instance_view: bool,
        user_data: bool,
    ) -> Value {
        self.res.get(k).map(|r| self.render_vm(r, instance_view, user_data)).unwrap_or(Value::Null)
    }

    fn render_vm(&self, r: &Res, instance_view: bool, user_data: bool) -> Value {
        let Detail::Vm(vm) = &r.detail else { return Value::Null };
        let nics: Vec<Value> = vm
            .nics
            .iter()
            .map(|n| {
                let mut p = json!({});
                if let Some(primary) = n.primary {
                    p["primary"] = primary.into();
                }
                if let Some(d) = &n.delete_option {
                    p["deleteOption"] = d.as_str().into();
                }
                json!({"id": n.id, "properties": p})
            })
            .collect();
        let mut image = vm.image.clone();
        if image.get("version").and_then(Value::as_str) == Some("latest") {
            image["exactVersion"] = "24.04.202501010".into();
        }
        let mut props = json!({
            "vmId": vm.vm_id,
            "hardwareProfile": {"vmSize": vm.size},
            "storageProfile": {
                "imageReference": image,
                "osDisk": {
                    "osType": "Linux",
                    "name": vm.os_disk.name,
                    "createOption": "FromImage",
                    "caching": vm.os_disk.caching,
                    "managedDisk": {"storageAccountType": vm.os_disk.storage, "id": vm.os_disk.id},
                    "deleteOption": vm.os_disk.delete_option,
                    "diskSizeGB": vm.os_disk.size_gb,
                },
                "dataDisks": [],
                "diskControllerType": "SCSI",
            },
            "osProfile": {
                "computerName": vm.computer_name,
                "adminUsername": vm.admin_username,
                "linuxConfiguration": vm.linux,
                "secrets": [],
                "allowExtensionOperations": true,
                "requireGuestProvisionSignal": true,
            },
            "networkProfile": {"networkInterfaces": nics},
            "provisioningState": r.state,
            "timeCreated": rfc3339(r.created),
        });
        if vm.priority == "Spot" {
            props["priority"] = "Spot".into();
            if let Some(e) = &vm.eviction_policy {
                props["evictionPolicy"] = e.as_str().into();
            }
            props["billingProfile"] = json!({"maxPrice": vm.max_price.unwrap_or(-1.0)});
        }
        if user_data && let Some(u) = &vm.user_data {
            props["userData"] = u.as_str().into();
        }
        if instance_view {
            props["instanceView"] = self.instance_view_of(r);
        }
        let mut v = json!({
            "name": r.name,
            "id": r.id,
            "type": "Microsoft.Compute/virtualMachines",
            "location": r.location,
            "etag": format!("\"{}\"", r.etag),
            "properties": props,
        });
        with_tags(&mut v, r);
        if !vm.zones.is_empty() {
            v["zones"] = json!(vm.zones);
        }
        v
    }

    /// `GET .../virtualMachines/{name}/instanceView`.
    pub(crate) fn instance_view(&self, k: &str) -> Value {
        self.res.get(k).map(|r| self.instance_view_of(r)).unwrap_or(Value::Null)
    }

    fn instance_view_of(&self, r: &Res) -> Value {
        let Detail::Vm(vm) = &r.detail else { return Value::Null };
        let time = rfc3339(r.changed);
        let mut prov = json!({
            "code": format!("ProvisioningState/{}", r.state.to_ascii_lowercase()),
            "level": "Info",
            "displayStatus": prov_display(&r.state),
            "time": time,
        });
        if let (Some(e), "Failed") = (&vm.failure, r.state.as_str()) {
            prov["code"] = format!("ProvisioningState/failed/{}", e.code).into();
            prov["level"] = "Error".into();
            prov["message"] = e.message.as_str().into();
        }
        let power = json!({
            "code": format!("PowerState/{}", vm.power),
            "level": "Info",
            "displayStatus": power_display(&vm.power),
        });
        let disk_state = match self.res.get(&key(&vm.os_disk.id)) {
            Some(d) => d.state.clone(),
            None => "Succeeded".into(),
        };
        let mut v = json!({
            "computerName": vm.computer_name,
            "osName": "ubuntu",
            "osVersion": "24.04",
            "disks": [{
                "name": vm.os_disk.name,
                "statuses": [{
                    "code": format!("ProvisioningState/{}", disk_state.to_ascii_lowercase()),
                    "level": "Info",
                    "displayStatus": prov_display(&disk_state),
                    "time": time,
                }],
            }],
            "hyperVGeneration": "V2",
            "statuses": [prov, power],
        });
        if vm.power == "running" {
            v["vmAgent"] = json!({
                "vmAgentVersion": "2.12.0.2",
                "statuses": [{
                    "code": "ProvisioningState/succeeded",
                    "level": "Info",
                    "displayStatus": "Ready",
                    "message": "Guest Agent is running",
                    "time": time,
                }],
                "extensionHandlers": [],
            });
        }
        v
    }

    fn render_ip(&self, r: &Res) -> Value {
        let Detail::Ip(ip) = &r.detail else { return Value::Null };
        let mut props = json!({
            "provisioningState": r.state,
            "resourceGuid": r.guid,
            "publicIPAddressVersion": ip.version,
            "publicIPAllocationMethod": ip.allocation,
            "idleTimeoutInMinutes": ip.idle_timeout,
            "ipTags": [],
            "ddosSettings": {"protectionMode": "VirtualNetworkInherited"},
        });
        if let Some(a) = &ip.address {
            props["ipAddress"] = a.as_str().into();
        }
        if let Some(c) = &ip.ip_config {
            props["ipConfiguration"] = json!({"id": c});
        }
        if let Some(d) = &ip.delete_option {
            props["deleteOption"] = d.as_str().into();
        }
        let mut v = json!({
            "name": r.name,
            "id": r.id,
            "etag": format!("W/\"{}-{}\"", r.guid, r.etag),
            "location": r.location,
            "properties": props,
            "type": "Microsoft.Network/publicIPAddresses",
            "sku": {"name": ip.sku, "tier": ip.tier},
        });
        with_tags(&mut v, r);
        if !ip.zones.is_empty() {
            v["zones"] = json!(ip.zones);
        }
        v
    }

    fn render_nic(&self, r: &Res) -> Value {
        let Detail::Nic(nic) = &r.detail else { return Value::Null };
        let etag = format!("W/\"{}-{}\"", r.guid, r.etag);
        let configs: Vec<Value> = nic
            .ip_configs
            .iter()
            .map(|c| {
                let mut p = json!({
                    "provisioningState": r.state,
                    "privateIPAddress": c.private_ip,
                    "privateIPAllocationMethod": "Dynamic",
                    "subnet": {"id": c.subnet},
                    "primary": c.primary,
                    "privateIPAddressVersion": "IPv4",
                });
                if let Some(p_ip) = &c.public_ip {
                    p["publicIPAddress"] = json!({"id": p_ip});
                }
                json!({
                    "name": c.name,
                    "id": format!("{}/ipConfigurations/{}", r.id, c.name),
                    "etag": etag,
                    "type": "Microsoft.Network/networkInterfaces/ipConfigurations",
                    "properties": p,
                })
            })
            .collect();
        let mut props = json!({
            "provisioningState": r.state,
            "resourceGuid": r.guid,
            "ipConfigurations": configs,
            "dnsSettings": {"dnsServers": [], "appliedDnsServers": []},
            "enableAcceleratedNetworking": nic.accelerated,
            "vnetEncryptionSupported": false,
            "enableIPForwarding": false,
            "disableTcpStateTracking": false,
            "nicType": "Standard",
        });
        if let Some(nsg) = &nic.nsg {
            props["networkSecurityGroup"] = json!({"id": nsg});
        }
        if let Some(vm) = &nic.vm {
            props["virtualMachine"] = json!({"id": vm});
            props["primary"] = true.into();
            props["macAddress"] = nic.mac.as_str().into();
        }
        let mut v = json!({
            "name": r.name,
            "id": r.id,
            "etag": etag,
            "location": r.location,
            "properties": props,
            "type": "Microsoft.Network/networkInterfaces",
        });
        with_tags(&mut v, r);
        v
    }

    fn render_disk(&self, r: &Res) -> Value {
        let Detail::Disk(d) = &r.detail else { return Value::Null };
        let state = match d.vm.as_ref().and_then(|vm| self.res.get(&key(vm))) {
            None => "Unattached",
            Some(Res { detail: Detail::Vm(vm), .. }) if vm.power == "deallocated" => "Reserved",
            Some(_) => "Attached",
        };
        let tier = if d.sku.starts_with("Premium") { "Premium" } else { "Standard" };
        let mut v = json!({
            "name": r.name,
            "id": r.id,
            "type": "Microsoft.Compute/disks",
            "location": r.location,
            "sku": {"name": d.sku, "tier": tier},
            "properties": {
                "osType": "Linux",
                "hyperVGeneration": "V2",
                "creationData": {"createOption": "FromImage"},
                "diskSizeGB": d.size_gb,
                "diskSizeBytes": d.size_gb * 1024 * 1024 * 1024,
                "timeCreated": rfc3339(r.created),
                "provisioningState": r.state,
                "diskState": state,
                "uniqueId": r.guid,
                "networkAccessPolicy": "AllowAll",
                "publicNetworkAccess": "Enabled",
            },
        });
        if let Some(vm) = &d.vm {
            v["managedBy"] = vm.as_str().into();
        }
        with_tags(&mut v, r);
        v
    }

    /// A `GenericResourceExpanded` of `Resources_List`; `tags: false` when the list was
    /// filtered by tag name and value (the spec: "the tags for each resource are not
    /// returned in the results").
    pub(crate) fn render_generic(&self, r: &Res, tags: bool, expand: &[String]) -> Value {
        let mut v = json!({
            "id": r.id,
            "name": r.name,
            "type": r.kind.full_type(),
            "location": r.location,
        });
        match &r.detail {
            Detail::Ip(ip) => v["sku"] = json!({"name": ip.sku, "tier": ip.tier}),
            Detail::Disk(d) => {
                v["sku"] = json!({"name": d.sku});
                if let Some(vm) = &d.vm {
                    v["managedBy"] = vm.as_str().into();
                }
            }
            Detail::Vm(vm) if !vm.zones.is_empty() => v["zones"] = json!(vm.zones),
            _ => {}
        }
        if tags {
            with_tags(&mut v, r);
        }
        for e in expand {
            match e.as_str() {
                "createdTime" => v["createdTime"] = rfc3339(r.created).into(),
                "changedTime" => v["changedTime"] = rfc3339(r.changed).into(),
                "provisioningState" => v["provisioningState"] = r.state.as_str().into(),
                _ => {}
            }
        }
        v
    }

    /// The operation status (`Azure-AsyncOperation`): Compute's `{startTime, endTime,
    /// status, name}`, Network's `{status}`, with `error` when it failed.
    pub(crate) fn render_op(&self, op: &Op) -> Value {
        let status = match &op.status {
            OpStatus::InProgress => "InProgress",
            OpStatus::Succeeded => "Succeeded",
            OpStatus::Failed(_) => "Failed",
        };
        let mut v = match op.kind {
            ResourceKind::Vm | ResourceKind::Disk => {
                let mut v =
                    json!({"startTime": rfc3339(op.start), "status": status, "name": op.id});
                if let Some(end) = op.end {
                    v["endTime"] = rfc3339(end).into();
                }
                v
            }
            ResourceKind::PublicIp | ResourceKind::Nic => json!({"status": status}),
        };
        if let OpStatus::Failed(e) = &op.status {
            v["error"] = e.detail();
        }
        v
    }
}
