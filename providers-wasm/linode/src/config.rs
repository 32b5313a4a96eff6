//! The provider's config block and the placement check that depends on it.
//!
//! Validated at load (`validate-config`, no I/O) with messages naming the field and the
//! value; every call parses it again with the same function, so a config that loaded
//! always parses later.

use egress_guest_sdk::config::{choose, each, endpoint, invalid, nonempty, one_of, unique};
use egress_guest_sdk::json::nullable;
use egress_guest_sdk::{Placement, PlacementField, ProviderError};
use serde::Deserialize;
use serde_json::Value;

/// The public API, version 4. Another endpoint is for a proxy in front of it, or tests.
pub const DEFAULT_ENDPOINT: &str = "https://api.linode.com/v4";

#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct Raw {
    #[serde(default)]
    endpoint: Option<String>,
    regions: Vec<String>,
    types: Vec<String>,
    /// A list of image IDs, or a map from catalogue key to image ID; read by hand so an
    /// error can name the value.
    images: Value,
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
    /// Catalogue key (what `placement.image` names) and the Linode image ID.
    pub images: Vec<(String, String)>,
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
    let checks: [(&str, &Vec<String>, fn(&str) -> bool, &str); 2] =
        [("regions", &raw.regions, is_region, region), ("types", &raw.types, is_type, linode_type)];
    for (field, items, valid, want) in checks {
        nonempty(field, items)?;
        unique(field, items)?;
        each(field, items, |i| valid(i), want)?;
    }
    let images = images(&raw.images)?;
    let key = |k: &String| k.len() <= 16 * 1024 && k.split_whitespace().count() >= 2 && !k.chars().any(char::is_control);
    each("authorizedKeys", &raw.authorized_keys, key, "want an SSH public key line (`<type> <key> [comment]`)")?;
    if raw.firewall_id == Some(0) {
        return Err(invalid("firewallId", 0, "want a positive Cloud Firewall ID"));
    }
    Ok(Config {
        endpoint,
        regions: raw.regions,
        types: raw.types,
        images,
        authorized_keys: raw.authorized_keys,
        firewall_id: raw.firewall_id,
    })
}

fn images(v: &Value) -> Result<Vec<(String, String)>, ProviderError> {
    let want = "want a Linode image ID such as linode/debian12";
    let image = |k: &str, v: &Value| match v {
        Value::String(s) if is_image(s) => Ok((k.to_string(), s.clone())),
        other => Err(invalid(&format!("images[{k:?}]"), other, want)),
    };
    let out: Vec<(String, String)> = match v {
        Value::Array(items) => items
            .iter()
            .map(|i| match i {
                Value::String(s) if is_image(s) => Ok((s.clone(), s.clone())),
                other => Err(invalid("images entry", other, want)),
            })
            .collect::<Result<_, _>>()?,
        Value::Object(map) => map
            .iter()
            .map(|(k, v)| match is_image(k) {
                true => image(k, v),
                false => Err(invalid("images key", k, "want 1-128 printable characters without spaces")),
            })
            .collect::<Result<_, _>>()?,
        other => return Err(invalid("images", other, "want a list of image IDs or a map of key to image ID")),
    };
    nonempty("images", &out)?;
    unique("images", &out.iter().map(|(k, _)| k).collect::<Vec<_>>())?;
    Ok(out)
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
        let image = choose(PlacementField::Image, &p.image, &self.images, |(k, _)| k, "images")?;
        Ok(Resolved { region, linode_type, image: &image.1 })
    }
}
