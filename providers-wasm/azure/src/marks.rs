//! Tags and provider IDs: the identity of an instance's parts as the operator sees them.
//!
//! ARM refuses tag names containing `<`, `>`, `%`, `&`, `\`, `?` or `/`, so the contract's marks
//! (`egress.proxy-operator.dev/uid`) cannot be tag names as they are: the mark `egress.proxy-operator.dev/<name>` is
//! written as the tag `egress-<name>`, its value unchanged. A value longer than ARM's 256 characters is written as `__`
//! plus the lowercase unpadded base32 of the first 20 bytes of its SHA-256, and matched that way (an installation);
//! a UID that long is refused (Kubernetes UIDs are 36 characters). The same mapping as the emulator's `tags.rs`.
//!
//! One instance is a VM `<name>`, a NIC `<name>-nic` and a Standard public IP `<name>-ip` in the configured resource
//! group, every part tagged. The names derive from the instance name, so a repeated create addresses the same parts,
//! and a part found without its VM names the instance it belongs to.

use crate::config::{is_group, is_guid, is_vm_name};
use egress_guest_sdk::ProviderError;
use sha2::{Digest, Sha256};
use std::collections::BTreeMap;
use std::fmt;

pub const MANAGED: &str = "egress-managed";
pub const UID: &str = "egress-uid";
pub const INSTALLATION: &str = "egress-installation";
/// ARM's longest tag value.
const MAX_VALUE: usize = 256;

/// The NIC's name is the VM's plus this.
pub const NIC_SUFFIX: &str = "-nic";
/// The public IP's name is the VM's plus this.
pub const IP_SUFFIX: &str = "-ip";

/// A mark's value as a tag value: itself, or hashed when ARM would refuse its length.
pub fn value(v: &str) -> String {
    if v.chars().count() <= MAX_VALUE {
        return v.to_string();
    }
    let digest = Sha256::digest(v.as_bytes());
    format!("__{}", data_encoding::BASE32_NOPAD.encode(&digest[..20]).to_ascii_lowercase())
}

/// The tags every part of an instance is created with.
pub fn create_tags(uid: &str, installation: &str) -> Result<BTreeMap<&'static str, String>, ProviderError> {
    if uid.chars().count() > MAX_VALUE {
        let msg = format!("uid {uid:?} does not fit in an ARM tag value (256 characters)");
        return Err(ProviderError::permanent(msg).with_code("InvalidUid"));
    }
    Ok(BTreeMap::from([(MANAGED, "true".to_string()), (UID, uid.to_string()), (INSTALLATION, value(installation))]))
}

/// A tag by name; ARM treats tag names without regard to case.
pub fn tag<'a>(tags: &'a BTreeMap<String, String>, name: &str) -> Option<&'a str> {
    tags.iter().find(|(k, _)| k.eq_ignore_ascii_case(name)).map(|(_, v)| v.as_str())
}

/// The UID mark read back, `""` when the part has none.
pub fn uid(tags: &BTreeMap<String, String>) -> String {
    tag(tags, UID).unwrap_or_default().to_string()
}

/// Whether a part is managed by this installation: checked on every listed part, so a filter ARM ignored cannot
/// hand GC another installation's.
pub fn is_ours(tags: &BTreeMap<String, String>, installation: &str) -> bool {
    tag(tags, MANAGED) == Some("true") && tag(tags, INSTALLATION) == Some(value(installation).as_str())
}

/// What a resource of an instance is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Part {
    Vm,
    Nic,
    Ip,
}

impl Part {
    /// The part an ARM resource type and name are, and the instance name they belong to; `None` for anything else
    /// (a disk, which carries no tags, or a resource this plugin does not make).
    pub fn of<'a>(resource_type: &str, name: &'a str) -> Option<(Part, &'a str)> {
        let (part, instance) = match resource_type.to_ascii_lowercase().as_str() {
            "microsoft.compute/virtualmachines" => (Part::Vm, Some(name)),
            "microsoft.network/networkinterfaces" => (Part::Nic, name.strip_suffix(NIC_SUFFIX)),
            "microsoft.network/publicipaddresses" => (Part::Ip, name.strip_suffix(IP_SUFFIX)),
            _ => return None,
        };
        instance.filter(|n| is_vm_name(n)).map(|n| (part, n))
    }
}

/// `<subscription>/<resource group>/<VM name>`: everything `get` and `delete` need, valid when the config has moved
/// on; parsed strictly.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Id {
    pub subscription: String,
    pub group: String,
    pub name: String,
}

const SHAPE: &str =
    "<subscription id>/<resource group>/<VM name>, e.g. 00000000-0000-0000-0000-000000000000/egress-rg/proxy-abc";

impl Id {
    pub fn parse(id: &str) -> Result<Id, ProviderError> {
        let mut parts = id.splitn(3, '/');
        match (parts.next(), parts.next(), parts.next()) {
            (Some(s), Some(g), Some(n)) if is_guid(s) && is_group(g) && is_vm_name(n) => {
                Ok(Id { subscription: s.to_string(), group: g.to_string(), name: n.to_string() })
            }
            _ => Err(ProviderError::invalid_id(id, SHAPE)),
        }
    }

    /// The ARM path of the resource group's provider namespace: `/subscriptions/<s>/resourceGroups/<g>/providers`.
    fn providers(&self) -> String {
        format!("/subscriptions/{}/resourceGroups/{}/providers", self.subscription, self.group)
    }

    /// The ARM path of a part (no query).
    pub fn path(&self, part: Part) -> String {
        let p = self.providers();
        match part {
            Part::Vm => format!("{p}/Microsoft.Compute/virtualMachines/{}", self.name),
            Part::Nic => format!("{p}/Microsoft.Network/networkInterfaces/{}{NIC_SUFFIX}", self.name),
            Part::Ip => format!("{p}/Microsoft.Network/publicIPAddresses/{}{IP_SUFFIX}", self.name),
        }
    }
}

impl fmt::Display for Id {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}/{}", self.subscription, self.group, self.name)
    }
}
