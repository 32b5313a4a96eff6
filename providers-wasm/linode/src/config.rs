//! The provider's config block and the placement check that depends on it.
//!
//! Validated at load (`validate-config`, no I/O) with messages naming the field and the
//! value; every call parses it again with the same function, so a config that loaded
//! always parses later.

use egress_guest_sdk::config::{each, endpoint, invalid, nonempty, one_of, unique};
use egress_guest_sdk::json::nullable;
use egress_guest_sdk::{Placement, PlacementField, ProviderError};
use serde::Deserialize;

/// The public API, version 4. Another endpoint is for a proxy in front of it, or tests.
pub const DEFAULT_ENDPOINT: &str = "https://api.linode.com/v4";

#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct Raw {
    #[serde(default)]
    endpoint: Option<String>,
    regions: Vec<String>,
    types: Vec<String>,
    images: Vec<String>,
    #[serde(default, deserialize_with = "nullable")]
    authorized_keys: Vec<String>,
    #[serde(default)]
    firewall_id: Option<u64>,
}

/// A validated config block.
#[derive(Debug, Clone, PartialEq)]
pub struct Config {
    /// The API base including `/v4`, without a trailing slash.
    pub endpoint: String,
    pub regions: Vec<String>,
    pub types: Vec<String>,
    /// Linode image IDs (`linode/debian12`), what `placement.image` names.
    pub images: Vec<String>,
    pub authorized_keys: Vec<String>,
    pub firewall_id: Option<u64>,
}

/// What a placement resolved to: the values the create call sends.
#[derive(Debug, PartialEq, Eq)]
pub struct Resolved<'a> {
    pub region: &'a str,
    pub linode_type: &'a str,
    pub image: &'a str,
}

/// Parse and validate a config block. The endpoint must end in `/v4`: on the real API a
/// path without it answers 404 "Not found" to everything, which must never pass for
/// "the Linode is gone".
pub fn parse(json: &str) -> Result<Config, ProviderError> {
    let raw: Raw = egress_guest_sdk::config::parse(json)?;
    let endpoint = endpoint("endpoint", raw.endpoint.as_deref().unwrap_or(DEFAULT_ENDPOINT), "/v4")?;
    let region = "want 1-32 lowercase letters, digits or '-' (a Linode region such as us-east)";
    let linode_type = "want 1-64 lowercase letters, digits, '.', '_' or '-' (a Linode type such as g6-nanode-1)";
    let image = "want a Linode image ID such as linode/debian12";
    let checks = [
        ("regions", &raw.regions, is_region as fn(&str) -> bool, region),
        ("types", &raw.types, is_type, linode_type),
        ("images", &raw.images, is_image, image),
    ];
    for (field, items, valid, want) in checks {
        nonempty(field, items)?;
        unique(field, items)?;
        each(field, items, |i| valid(i), want)?;
    }
    let key =
        |k: &String| k.len() <= 16 * 1024 && k.split_whitespace().count() >= 2 && !k.chars().any(char::is_control);
    each("authorizedKeys", &raw.authorized_keys, key, "want an SSH public key line (`<type> <key> [comment]`)")?;
    if raw.firewall_id == Some(0) {
        return Err(invalid("firewallId", 0, "want a positive Cloud Firewall ID"));
    }
    Ok(Config {
        endpoint,
        regions: raw.regions,
        types: raw.types,
        images: raw.images,
        authorized_keys: raw.authorized_keys,
        firewall_id: raw.firewall_id,
    })
}

/// Region IDs end up in provider IDs (`<region>/<linode id>`), so never contain `/`.
pub fn is_region(s: &str) -> bool {
    (1..=32).contains(&s.len()) && s.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
}

fn is_type(s: &str) -> bool {
    (1..=64).contains(&s.len())
        && s.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || matches!(b, b'.' | b'_' | b'-'))
}

fn is_image(s: &str) -> bool {
    (1..=128).contains(&s.len()) && s.bytes().all(|b| b.is_ascii_graphic())
}

impl Config {
    /// Check a placement against the catalogue before any backend call: the CRD cannot,
    /// and this error is the user's only feedback. `zone` is ignored: a Linode region has
    /// no zones.
    pub fn resolve<'a>(&'a self, p: &Placement) -> Result<Resolved<'a>, ProviderError> {
        let region = one_of(PlacementField::Region, &p.region, &self.regions, "regions")?;
        let linode_type = one_of(PlacementField::MachineType, &p.machine_type, &self.types, "types")?;
        let image = one_of(PlacementField::Image, &p.image, &self.images, "images")?;
        Ok(Resolved { region, linode_type, image })
    }
}
