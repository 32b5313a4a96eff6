//! The config block, the placement check against it, and the tags that mark a server.
//!
//! Everything is checked at load (`validate-config`, no I/O) with messages that name the
//! field and the value; the same parser runs at every call, so a config that loaded always
//! parses later.

use data_encoding::BASE32_NOPAD;
use egress_guest_sdk::config::{each, endpoint, invalid, nonempty, one_of, unique};
use egress_guest_sdk::{MARK_INSTALLATION, MARK_MANAGED, MARK_MANAGED_YES, MARK_UID};
use egress_guest_sdk::{Placement, PlacementField, ProviderError};
use serde::Deserialize;
use sha2::{Digest, Sha256};

/// The public API; another endpoint is for a proxy in front of it, or for tests.
pub const DEFAULT_ENDPOINT: &str = "https://api.scaleway.com";

/// A config block, validated by [`parse`].
#[derive(Deserialize, Debug, Clone, PartialEq)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct Config {
    /// The API base without a trailing slash; paths start `/instance/v1/zones/...`.
    #[serde(default = "default_endpoint")]
    pub endpoint: String,
    pub project_id: String,
    pub zones: Vec<String>,
    pub commercial_types: Vec<String>,
    /// Image labels (`ubuntu_noble`) or image IDs, sent as they are.
    pub images: Vec<String>,
    #[serde(default)]
    pub security_group_id: Option<String>,
}

fn default_endpoint() -> String {
    DEFAULT_ENDPOINT.into()
}

/// `xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx`, lowercase hex: Scaleway's IDs.
pub fn is_uuid(s: &str) -> bool {
    s.len() == 36
        && s.bytes().enumerate().all(|(i, b)| match i {
            8 | 13 | 18 | 23 => b == b'-',
            _ => b.is_ascii_digit() || (b'a'..=b'f').contains(&b),
        })
}

/// A zone such as `fr-par-1`: it goes into URLs and into instance IDs.
pub fn is_zone(s: &str) -> bool {
    let b = s.as_bytes();
    b.len() == 8
        && b[2] == b'-'
        && b[6] == b'-'
        && b[7].is_ascii_digit()
        && b[..2].iter().chain(&b[3..6]).all(u8::is_ascii_lowercase)
}

fn is_catalogue_name(s: &str) -> bool {
    (1..=64).contains(&s.len()) && s.bytes().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
}

pub fn parse(json: &str) -> Result<Config, ProviderError> {
    let mut raw: Config = egress_guest_sdk::config::parse(json)?;
    raw.endpoint = endpoint("endpoint", &raw.endpoint, "")?;
    if !is_uuid(&raw.project_id) {
        return Err(invalid("projectId", &raw.project_id, "want a Scaleway project ID (a lowercase UUID)"));
    }
    let lists = [
        ("zones", &raw.zones, is_zone as fn(&str) -> bool, "want a Scaleway zone such as fr-par-1"),
        ("commercialTypes", &raw.commercial_types, is_catalogue_name, "want a commercial type such as DEV1-S"),
        ("images", &raw.images, is_catalogue_name, "want an image label such as ubuntu_noble, or an image ID"),
    ];
    for (field, items, valid, want) in lists {
        nonempty(field, items)?;
        unique(field, items)?;
        each(field, items, |i| valid(i), want)?;
    }
    if let Some(sg) = raw.security_group_id.as_deref().filter(|sg| !is_uuid(sg)) {
        return Err(invalid("securityGroupId", sg, "want a security group ID (a lowercase UUID)"));
    }
    Ok(raw)
}

impl Config {
    /// Check a placement against the catalogue before any call, giving (zone, commercial
    /// type, image). `region`, when set, must be the zone's region (`fr-par` for
    /// `fr-par-1`), so a Proxy cannot say one place and get another.
    pub fn resolve<'a>(&'a self, p: &Placement) -> Result<(&'a str, &'a str, &'a str), ProviderError> {
        let zone = one_of(PlacementField::Zone, &p.zone, &self.zones, "zones")?;
        let region = zone.rsplit_once('-').map_or("", |(r, _)| r);
        if !p.region.is_empty() && p.region != region {
            let why = format!("is not the region of placement.zone {zone:?} (want {region:?} or empty)");
            return Err(ProviderError::invalid_placement(PlacementField::Region, &p.region, why));
        }
        let kind = "commercial types";
        let commercial_type = one_of(PlacementField::MachineType, &p.machine_type, &self.commercial_types, kind)?;
        let image = one_of(PlacementField::Image, &p.image, &self.images, "images")?;
        Ok((zone, commercial_type, image))
    }
}

/// Tags are plain strings, so each mark is `key=value`. Tags are matched exactly and a
/// list filter separates them with commas, so a value must be printable ASCII without a
/// comma; an installation identity that is not is replaced by a hash of it (the same
/// installation always maps to the same tag).
pub fn tag(key: &str, value: &str) -> String {
    format!("{key}={value}")
}

fn is_tag_value(s: &str) -> bool {
    s.len() <= 64 && s.bytes().all(|b| b.is_ascii_graphic() && b != b',')
}

pub fn installation_tag(installation: &str) -> String {
    if is_tag_value(installation) && !installation.is_empty() {
        return tag(MARK_INSTALLATION, installation);
    }
    let digest = Sha256::digest(installation.as_bytes());
    let hashed = BASE32_NOPAD.encode(&digest[..20]).to_ascii_lowercase();
    tag(MARK_INSTALLATION, &format!("sha256-{hashed}"))
}

/// The tags a server (and its IP) is created with: the three marks, in the create call.
pub fn create_tags(uid: &str, installation: &str) -> Result<Vec<String>, ProviderError> {
    if !is_tag_value(uid) {
        let msg = format!("uid {uid:?} cannot be a Scaleway tag value (printable ASCII without ',')");
        return Err(ProviderError::permanent(msg).with_code("InvalidUid"));
    }
    Ok(vec![tag(MARK_MANAGED, MARK_MANAGED_YES), tag(MARK_UID, uid), installation_tag(installation)])
}

/// The value of the mark `key` among `tags`.
pub fn mark<'a>(tags: &'a [String], key: &str) -> Option<&'a str> {
    tags.iter().find_map(|t| t.strip_prefix(key)?.strip_prefix('='))
}
