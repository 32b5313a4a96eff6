//! The provider's config block and the placement check that depends on it. Checked at load (`validate-config`, no
//! I/O) with messages that name the field and the value; every call parses it again with the same function, so a
//! config that validated never surprises a later call.

use egress_guest_sdk::config::{each, endpoint, invalid, nonempty, one_of, unique};
use egress_guest_sdk::{Placement, PlacementField, ProviderError};
use serde::Deserialize;
use serde_json::{Value, json};
use std::collections::BTreeMap;

pub const DEFAULT_AUTHORITY: &str = "https://login.microsoftonline.com";
pub const DEFAULT_ARM: &str = "https://management.azure.com";
pub const DEFAULT_PRICES: &str = "https://prices.azure.com";
/// What `adminUsername` is when the config says nothing: the name Azure's own quickstarts use.
pub const DEFAULT_ADMIN: &str = "azureuser";
/// Standard SSD: every VM size takes it, unlike Premium SSD, and it boots faster than Standard HDD.
pub const DEFAULT_OS_DISK: &str = "StandardSSD_LRS";
/// How long one call waits for ARM's long-running operations when the config says nothing: room for the public IP's
/// and the NIC's (the Network RP asks for 10 s between polls) inside the host's default 60 s per call.
pub const DEFAULT_WAIT: u32 = 30;

/// The managed-disk types a VM's OS disk may have.
const DISK_TYPES: [&str; 5] = ["Standard_LRS", "StandardSSD_LRS", "Premium_LRS", "StandardSSD_ZRS", "Premium_ZRS"];
/// User names Azure refuses for a Linux VM's administrator (the documented list, lowercase).
const RESERVED_USERS: [&str; 8] = ["admin", "administrator", "root", "guest", "user", "test", "sys", "adm"];

/// Where access tokens come from: a service principal's client secret (the entry's secret `clientSecret`), or
/// workload identity, a federated token file (the entry's secret `federatedToken`, e.g. the token AKS projects into the
/// pod) exchanged as a client assertion.
#[derive(Deserialize, Debug, Clone, Copy, PartialEq, Eq, Default)]
#[serde(rename_all = "camelCase")]
pub enum Credential {
    #[default]
    ClientSecret,
    WorkloadIdentity,
}

/// A config block. Empty strings and `None` are the defaults, filled in by [`parse`].
#[derive(Deserialize, Debug, Clone, PartialEq)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct Config {
    /// The Entra ID tenant: a GUID, or a verified domain such as `contoso.onmicrosoft.com`.
    pub tenant_id: String,
    /// The application (client) ID of the service principal or the user-assigned managed identity.
    pub client_id: String,
    #[serde(default)]
    pub credential: Credential,
    pub subscription_id: String,
    /// Every part of every instance is made in this resource group, and GC lists it.
    pub resource_group: String,
    /// Location (`placement.region`) -> the ID of the subnet its NICs go into: a virtual network is regional, so each
    /// location needs a subnet of its own.
    pub locations: BTreeMap<String, String>,
    pub vm_sizes: Vec<String>,
    /// Catalogue key (`placement.image`) -> a Marketplace URN `publisher:offer:sku:version` or an image resource ID.
    pub images: BTreeMap<String, String>,
    /// Azure requires a password or an SSH key for a Linux VM; the operator never logs in, so a key it does not hold.
    pub ssh_public_key: String,
    #[serde(default)]
    pub admin_username: String,
    /// A network security group for every NIC (Standard public IPs are closed to inbound traffic without one, on the
    /// NIC or on the subnet).
    #[serde(default)]
    pub network_security_group_id: String,
    #[serde(default)]
    pub os_disk_type: String,
    #[serde(default)]
    pub wait_seconds: Option<u32>,
    #[serde(default)]
    pub authority_host: String,
    #[serde(default)]
    pub arm_endpoint: String,
    #[serde(default)]
    pub prices_endpoint: String,
}

/// What a placement resolves to.
#[derive(Debug, Clone, PartialEq)]
pub struct Resolved<'a> {
    pub location: &'a str,
    pub subnet: &'a str,
    /// `None`: no availability zone (the VM goes where Azure puts it).
    pub zone: Option<&'static str>,
    pub size: &'a str,
    pub image_key: &'a str,
    pub image: Value,
}

/// A GUID as Azure writes tenant, client and subscription IDs.
pub fn is_guid(s: &str) -> bool {
    let b = s.as_bytes();
    b.len() == 36
        && b.iter().enumerate().all(|(i, c)| match i {
            8 | 13 | 18 | 23 => *c == b'-',
            _ => c.is_ascii_hexdigit(),
        })
}

/// A resource group name: 1-90 letters, digits, `.`, `_`, `-`, `(`, `)`, not ending in `.` (ASCII only here: it
/// becomes part of provider IDs and URL paths).
pub fn is_group(s: &str) -> bool {
    (1..=90).contains(&s.len())
        && !s.ends_with('.')
        && s.bytes().all(|b| b.is_ascii_alphanumeric() || b"._-()".contains(&b))
}

/// A VM name this plugin writes and reads: 1-64 letters, digits, `-`, `_`, `.`, starting with a letter or digit and
/// ending with a letter, digit or `_` (ARM's rule for Linux VM names).
pub fn is_vm_name(s: &str) -> bool {
    let b = s.as_bytes();
    (1..=64).contains(&b.len())
        && b[0].is_ascii_alphanumeric()
        && (b[b.len() - 1].is_ascii_alphanumeric() || b[b.len() - 1] == b'_')
        && b.iter().all(|c| c.is_ascii_alphanumeric() || b"-_.".contains(c))
}

fn is_location(s: &str) -> bool {
    (1..=40).contains(&s.len()) && s.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit())
}

fn is_tenant(s: &str) -> bool {
    is_guid(s)
        || ((3..=253).contains(&s.len())
            && s.contains('.')
            && s.bytes().all(|b| b.is_ascii_alphanumeric() || b"-.".contains(&b)))
}

/// `/subscriptions/<guid>/resourceGroups/<group>/providers/<namespace>/<type>/<name>[/<child type>/<name>]` with the
/// types given (matched without regard to case, as ARM matches them).
pub fn is_arm_id(s: &str, types: &[&str]) -> bool {
    let parts: Vec<&str> = s.split('/').collect();
    let word =
        |p: &str| (1..=80).contains(&p.len()) && p.bytes().all(|b| b.is_ascii_alphanumeric() || b"._-()".contains(&b));
    let fixed = |i: usize, want: &str| parts.get(i).is_some_and(|p| p.eq_ignore_ascii_case(want));
    parts.len() == 9 + 2 * (types.len() - 1)
        && parts[0].is_empty()
        && fixed(1, "subscriptions")
        && is_guid(parts[2])
        && fixed(3, "resourceGroups")
        && is_group(parts[4])
        && fixed(5, "providers")
        && types.iter().enumerate().all(|(i, t)| {
            let (kind, name) = if i == 0 {
                (format!("{}/{}", parts[6], parts[7]), parts[8])
            } else {
                (parts[7 + 2 * i].to_string(), parts[8 + 2 * i])
            };
            kind.eq_ignore_ascii_case(t) && word(name)
        })
}

/// A subnet's resource ID.
pub fn is_subnet(s: &str) -> bool {
    is_arm_id(s, &["Microsoft.Network/virtualNetworks", "subnets"])
}

/// The `imageReference` of a catalogue entry: a Marketplace URN (`Canonical:ubuntu-24_04-lts:server:latest`), the ID
/// of a managed image or gallery image (version), or a community or shared gallery image; `None` for anything else.
pub fn image_reference(s: &str) -> Option<Value> {
    let path_ok = || {
        s.len() <= 512
            && s[1..]
                .split('/')
                .all(|p| !p.is_empty() && p.bytes().all(|b| b.is_ascii_alphanumeric() || b"._-()".contains(&b)))
    };
    if s.starts_with('/') {
        if !path_ok() {
            return None;
        }
        let lower = s.to_ascii_lowercase();
        return Some(if lower.starts_with("/subscriptions/") {
            json!({"id": s})
        } else if lower.starts_with("/communitygalleries/") {
            json!({"communityGalleryImageId": s})
        } else if lower.starts_with("/sharedgalleries/") {
            json!({"sharedGalleryImageId": s})
        } else {
            return None;
        });
    }
    let parts: Vec<&str> = s.split(':').collect();
    let part_ok =
        |p: &&str| (1..=128).contains(&p.len()) && p.bytes().all(|b| b.is_ascii_alphanumeric() || b"._-".contains(&b));
    (parts.len() == 4 && parts.iter().all(part_ok))
        .then(|| json!({"publisher": parts[0], "offer": parts[1], "sku": parts[2], "version": parts[3]}))
}

/// An OpenSSH public key line of a type Azure accepts for Linux VMs (RSA, Ed25519, ECDSA).
fn is_ssh_key(s: &str) -> bool {
    let mut words = s.split_whitespace();
    let kind_ok =
        words.next().is_some_and(|k| ["ssh-rsa", "ssh-ed25519"].contains(&k) || k.starts_with("ecdsa-sha2-nistp"));
    let key_ok = words.next().is_some_and(|k| k.len() >= 32 && data_encoding::BASE64.decode(k.as_bytes()).is_ok());
    kind_ok && key_ok && s.len() <= 8192 && !s.contains(['\n', '\r'])
}

/// A Linux user name Azure accepts: a lowercase letter or `_`, then up to 31 lowercase letters, digits, `_` or `-`,
/// and none of the names Azure reserves.
fn is_user(s: &str) -> bool {
    let b = s.as_bytes();
    (1..=32).contains(&b.len())
        && (b[0].is_ascii_lowercase() || b[0] == b'_')
        && b.iter().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || b"_-".contains(c))
        && !RESERVED_USERS.contains(&s)
}

/// A VM size as ARM names it (`Standard_B1s`, `Standard_D2as_v5`).
fn is_size(s: &str) -> bool {
    (1..=64).contains(&s.len()) && s.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_')
}

fn is_key(s: &str) -> bool {
    egress_guest_sdk::id::is_word(s, 63, b"-_.")
}

/// Parse and check a config block; every message names the field and the value.
pub fn parse(json: &str) -> Result<Config, ProviderError> {
    let mut c: Config = egress_guest_sdk::config::parse(json)?;
    let or = |v: &mut String, default: &str| v.is_empty().then(|| *v = default.into());
    or(&mut c.admin_username, DEFAULT_ADMIN);
    or(&mut c.os_disk_type, DEFAULT_OS_DISK);
    or(&mut c.authority_host, DEFAULT_AUTHORITY);
    or(&mut c.arm_endpoint, DEFAULT_ARM);
    or(&mut c.prices_endpoint, DEFAULT_PRICES);
    let guid = "want a GUID such as 00000000-0000-0000-0000-000000000000";
    if !is_tenant(&c.tenant_id) {
        return Err(invalid(
            "tenantId",
            &c.tenant_id,
            "want the tenant's GUID or a domain such as contoso.onmicrosoft.com",
        ));
    }
    for (field, value) in [("clientId", &c.client_id), ("subscriptionId", &c.subscription_id)] {
        if !is_guid(value) {
            return Err(invalid(field, value, guid));
        }
    }
    if !is_group(&c.resource_group) {
        let want = "want 1-90 letters, digits, '.', '_', '-', '(' or ')', not ending in '.'";
        return Err(invalid("resourceGroup", &c.resource_group, want));
    }
    if c.locations.is_empty() {
        return Err(invalid("locations", "{}", "is empty: want a map of location to subnet ID"));
    }
    for (location, subnet) in &c.locations {
        if !is_location(location) {
            return Err(invalid("locations key", location, "want a location as ARM names it, such as westeurope"));
        }
        if !is_subnet(subnet) {
            let want = "want a subnet ID: /subscriptions/<id>/resourceGroups/<group>/providers/Microsoft.Network/virtualNetworks/<vnet>/subnets/<subnet>";
            return Err(invalid(&format!("locations[{location:?}]"), subnet, want));
        }
    }
    nonempty("vmSizes", &c.vm_sizes)?;
    unique("vmSizes", &c.vm_sizes)?;
    each("vmSizes", &c.vm_sizes, |s| is_size(s), "want a VM size such as Standard_B1s")?;
    if c.images.is_empty() {
        return Err(invalid("images", "{}", "is empty: want a map of key to image"));
    }
    for (key, image) in &c.images {
        if !is_key(key) {
            return Err(invalid("images key", key, "want 1-63 letters, digits, '-', '_' or '.'"));
        }
        if image_reference(image).is_none() {
            let want = "want a Marketplace URN publisher:offer:sku:version or an image resource ID";
            return Err(invalid(&format!("images[{key:?}]"), image, want));
        }
    }
    if !is_ssh_key(&c.ssh_public_key) {
        // Never the value: it is public, but a pasted private key must not reach a log.
        let msg =
            "config.sshPublicKey is invalid: want one OpenSSH public key line (ssh-rsa, ssh-ed25519 or ecdsa-sha2-*)";
        return Err(ProviderError::invalid_config(msg));
    }
    if !is_user(&c.admin_username) {
        let want = "want a lowercase Linux user name of at most 32 characters that Azure does not reserve";
        return Err(invalid("adminUsername", &c.admin_username, want));
    }
    if !c.network_security_group_id.is_empty()
        && !is_arm_id(&c.network_security_group_id, &["Microsoft.Network/networkSecurityGroups"])
    {
        let want = "want a network security group ID: /subscriptions/<id>/resourceGroups/<group>/providers/Microsoft.Network/networkSecurityGroups/<name>";
        return Err(invalid("networkSecurityGroupId", &c.network_security_group_id, want));
    }
    if !DISK_TYPES.contains(&c.os_disk_type.as_str()) {
        return Err(invalid("osDiskType", &c.os_disk_type, format!("want one of {DISK_TYPES:?}")));
    }
    if let Some(w) = c.wait_seconds.filter(|w| !(1..=600).contains(w)) {
        return Err(invalid("waitSeconds", w, "want 1-600"));
    }
    c.authority_host = endpoint("authorityHost", &c.authority_host, "")?;
    c.arm_endpoint = endpoint("armEndpoint", &c.arm_endpoint, "")?;
    c.prices_endpoint = endpoint("pricesEndpoint", &c.prices_endpoint, "")?;
    Ok(c)
}

impl Config {
    pub fn wait(&self) -> u32 {
        self.wait_seconds.unwrap_or(DEFAULT_WAIT)
    }

    /// Location, subnet, zone, size and image of a placement, checked against the catalogue before any call.
    pub fn resolve<'a>(&'a self, p: &Placement) -> Result<Resolved<'a>, ProviderError> {
        let locations: Vec<&String> = self.locations.keys().collect();
        let location: &'a String = *one_of(PlacementField::Region, &p.region, &locations, "locations")?;
        let zone = match p.zone.as_str() {
            "" => None,
            "1" => Some("1"),
            "2" => Some("2"),
            "3" => Some("3"),
            z => {
                let why = "is not an Azure availability zone: want \"1\", \"2\", \"3\" or empty for none";
                return Err(ProviderError::invalid_placement(PlacementField::Zone, z, why));
            }
        };
        let size = one_of(PlacementField::MachineType, &p.machine_type, &self.vm_sizes, "vmSizes")?;
        let keys: Vec<&String> = self.images.keys().collect();
        let key: &'a String = *one_of(PlacementField::Image, &p.image, &keys, "images")?;
        let image = image_reference(&self.images[key.as_str()]).expect("checked by parse");
        Ok(Resolved { location, subnet: &self.locations[location.as_str()], zone, size, image_key: key, image })
    }
}
