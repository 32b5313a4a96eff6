//! The `vultr` config block, checked whole when the operator loads the provider (no API
//! call then), and the placement a Proxy may ask for under it.

use egress_guest_sdk::config::{self, invalid};
use egress_guest_sdk::id::is_word;
use egress_guest_sdk::{Placement, PlacementField, ProviderError};
use serde::Deserialize;
use std::collections::BTreeMap;

/// Vultr's public API; anything else must also be on the allow-list.
pub const DEFAULT_ENDPOINT: &str = "https://api.vultr.com/v2";

#[derive(Deserialize, Debug)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct Config {
    #[serde(default = "default_endpoint")]
    pub endpoint: String,
    /// Region IDs a Proxy may use as `placement.region` (`ewr`, `fra`, ...).
    pub regions: Vec<String>,
    /// Plan IDs a Proxy may use as `placement.machineType` (`vc2-1c-1gb`, ...).
    pub plans: Vec<String>,
    /// `placement.image` key -> Vultr operating system ID (`GET /v2/os`).
    pub images: BTreeMap<String, u32>,
    #[serde(default)]
    pub ssh_key_ids: Vec<String>,
    #[serde(default)]
    pub firewall_group_id: Option<String>,
    #[serde(default)]
    pub enable_ipv6: bool,
}

fn default_endpoint() -> String {
    DEFAULT_ENDPOINT.into()
}

/// A region ID: lowercase letters and digits (`ewr`, `sgp`), as IDs carry it.
pub fn is_region(s: &str) -> bool {
    is_word(s, 16, b"") && !s.bytes().any(|b| b.is_ascii_uppercase())
}

/// Vultr IDs (instances, SSH keys, firewall groups) are UUIDs: hex digits and dashes.
pub fn is_vultr_id(s: &str) -> bool {
    is_word(s, 64, b"-") && s.bytes().all(|b| b == b'-' || b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
}

fn is_catalogue_word(s: &str) -> bool {
    is_word(s, 64, b"-_.")
}

/// What one create uses: every value checked against the config.
pub struct Place<'a> {
    pub region: &'a str,
    pub plan: &'a str,
    pub os_id: u32,
}

pub fn parse(json: &str) -> Result<Config, ProviderError> {
    let mut cfg: Config = config::parse(json)?;
    cfg.endpoint = config::endpoint("endpoint", &cfg.endpoint, "/v2")?;
    config::nonempty("regions", &cfg.regions)?;
    config::each("regions", &cfg.regions, |r| is_region(r), "want 1-16 lowercase letters or digits, e.g. ewr")?;
    config::unique("regions", &cfg.regions)?;
    config::nonempty("plans", &cfg.plans)?;
    config::each("plans", &cfg.plans, |p| is_catalogue_word(p), "want a Vultr plan ID, e.g. vc2-1c-1gb")?;
    config::unique("plans", &cfg.plans)?;
    if cfg.images.is_empty() {
        return Err(ProviderError::invalid_config("config.images is empty: no Proxy could be placed"));
    }
    for (key, os_id) in &cfg.images {
        if !is_catalogue_word(key) {
            return Err(invalid("images key", key, "want 1-64 letters, digits, '-', '_' or '.'"));
        }
        if *os_id == 0 {
            return Err(invalid(&format!("images.{key}"), os_id, "want a Vultr OS ID from GET /v2/os"));
        }
    }
    config::each("sshKeyIds", &cfg.ssh_key_ids, |k| is_vultr_id(k), "want a Vultr SSH key ID (a UUID)")?;
    if let Some(fw) = cfg.firewall_group_id.as_deref().filter(|f| !is_vultr_id(f)) {
        return Err(invalid("firewallGroupId", fw, "want a Vultr firewall group ID (a UUID)"));
    }
    Ok(cfg)
}

impl Config {
    /// The placement checked against the catalogue before any API call. The zone is
    /// ignored: Vultr places instances in a region.
    pub fn resolve(&self, p: &Placement) -> Result<Place<'_>, ProviderError> {
        let region = config::one_of(PlacementField::Region, &p.region, &self.regions, "regions")?;
        let plan = config::one_of(PlacementField::MachineType, &p.machine_type, &self.plans, "plans")?;
        let keys: Vec<&String> = self.images.keys().collect();
        let os_id = *self.images.get(&p.image).ok_or_else(|| {
            let why = format!("is not one of the configured images {keys:?}");
            ProviderError::invalid_placement(PlacementField::Image, &p.image, why)
        })?;
        Ok(Place { region, plan, os_id })
    }
}
