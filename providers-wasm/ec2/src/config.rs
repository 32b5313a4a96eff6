//! The provider's config block, its validation, and how a placement resolves against it.
//!
//! Validation is pure (no I/O: `validate-config` runs with HTTP denied) and names the
//! field and the value, because the config is the user's only lever and a vague error
//! costs a support round-trip. Everything that ends up in an identifier, a URL or an EC2
//! parameter is checked here, so `create` can trust it.

use egress_guest_sdk::{
    MARK_INSTALLATION, MARK_MANAGED, MARK_UID, Placement, PlacementField, ProviderError,
};
use serde::Deserialize;
use std::collections::BTreeMap;

/// The config block.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct Config {
    /// Every region the provider creates in, and so the scope `list-by-tag` covers.
    pub regions: BTreeMap<String, Region>,
    /// Instance types a Proxy may ask for. A list rather than "anything": an unknown type
    /// is then refused before the call, naming the allowed ones.
    pub instance_types: Vec<String>,
    /// Extra tags on every instance and volume (cost allocation, ownership).
    #[serde(default)]
    pub tags: BTreeMap<String, String>,
    /// Which address is the proxy's IP: `public` (default) or `private` (the operator and
    /// the clients run inside the VPC).
    #[serde(default)]
    pub ip_address: IpAddress,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct Region {
    /// Defaults to the public regional endpoint; set it for a VPC endpoint, FIPS, or an
    /// emulator. Must then be allow-listed with `additionalHosts`.
    #[serde(default)]
    pub endpoint: Option<String>,
    /// Availability zones instances may run in, each with the network it uses.
    pub zones: BTreeMap<String, Zone>,
    /// Image catalogue: key -> AMI id, or `{id, rootDeviceName}`. AMIs are regional, so
    /// the same key can name a different AMI per region.
    #[serde(default)]
    pub images: BTreeMap<String, serde_json::Value>,
    /// The root device of this region's AMIs unless an image says otherwise. The root
    /// volume is only deleted with the instance when this matches the AMI.
    #[serde(default)]
    pub root_device_name: Option<String>,
}

#[derive(Debug, Deserialize, Default)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct Zone {
    /// Without it, EC2 picks the zone's default subnet (default VPC only).
    #[serde(default)]
    pub subnet_id: Option<String>,
    /// Without them, EC2 uses the VPC's default security group.
    #[serde(default)]
    pub security_group_ids: Vec<String>,
}

#[derive(Debug, Deserialize, Default, Clone, Copy, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum IpAddress {
    #[default]
    Public,
    Private,
}

/// What an AMI catalogue entry resolves to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Image {
    pub id: String,
    pub root_device_name: Option<String>,
}

/// Amazon Linux and Debian AMIs boot from it; others (Ubuntu: `/dev/sda1`) need it set.
pub const DEFAULT_ROOT_DEVICE: &str = "/dev/xvda";

/// EC2 allows 50 tags per resource; the plugin writes `Name` and three marks.
const MAX_USER_TAGS: usize = 46;

/// An EC2 endpoint, split once so the signer and the URL agree on the authority.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Endpoint {
    /// `https://host[:port]`, no trailing slash.
    pub base: String,
    /// `host[:port]` exactly as in the URL: what the host sends as `Host` and what is signed.
    pub authority: String,
}

impl Config {
    /// Parse and validate a config block.
    pub fn parse(json: &str) -> Result<Config, ProviderError> {
        let cfg: Config = egress_guest_sdk::host::parse_config(json)?;
        cfg.validate()?;
        Ok(cfg)
    }

    fn validate(&self) -> Result<(), ProviderError> {
        if self.regions.is_empty() {
            return Err(invalid("config.regions must name at least one region"));
        }
        for (name, region) in &self.regions {
            let at = format!("config.regions[{name:?}]");
            if !valid_region(name) {
                return Err(invalid(format!(
                    "config.regions key {name:?} is not an AWS region name (like \"eu-west-1\")"
                )));
            }
            region.endpoint(name).map_err(|why| {
                invalid(format!(
                    "{at}.endpoint {:?} {why}",
                    region.endpoint.as_deref().unwrap_or_default()
                ))
            })?;
            if region.zones.is_empty() {
                return Err(invalid(format!("{at}.zones must name at least one zone")));
            }
            for (zone, z) in &region.zones {
                let zat = format!("{at}.zones[{zone:?}]");
                if !valid_zone(name, zone) {
                    return Err(invalid(format!(
                        "{at}.zones key {zone:?} is not an availability zone of {name} (like \"{name}a\")"
                    )));
                }
                if let Some(s) = &z.subnet_id
                    && !valid_id(s, "subnet")
                {
                    return Err(invalid(format!(
                        "{zat}.subnetId {s:?} is not a subnet id (\"subnet-\" and 8 or 17 hex digits)"
                    )));
                }
                if let Some(g) = z.security_group_ids.iter().find(|g| !valid_id(g, "sg")) {
                    return Err(invalid(format!(
                        "{zat}.securityGroupIds entry {g:?} is not a security group id (\"sg-\" and 8 or 17 hex digits)"
                    )));
                }
            }
            if let Some(d) = &region.root_device_name
                && !valid_device(d)
            {
                return Err(invalid(format!(
                    "{at}.rootDeviceName {d:?} is not a device name (like \"/dev/xvda\")"
                )));
            }
            for key in region.images.keys() {
                if key.is_empty() || key.len() > 128 || key.starts_with("ami-") {
                    return Err(invalid(format!(
                        "{at}.images key {key:?} must be 1 to 128 characters and not start with \"ami-\" (AMI ids are accepted as they are)"
                    )));
                }
                region
                    .image(key)
                    .map_err(|why| invalid(format!("{at}.images[{key:?}] {why}")))?;
            }
        }
        if self.instance_types.is_empty() {
            return Err(invalid(
                "config.instanceTypes must name at least one instance type",
            ));
        }
        if let Some(t) = self.instance_types.iter().find(|t| !valid_instance_type(t)) {
            return Err(invalid(format!(
                "config.instanceTypes entry {t:?} is not an instance type (like \"t3.micro\")"
            )));
        }
        if self.tags.len() > MAX_USER_TAGS {
            return Err(invalid(format!(
                "config.tags has {} tags; EC2 allows 50 per resource and the plugin writes 4",
                self.tags.len()
            )));
        }
        for (k, v) in &self.tags {
            let reserved = k == "Name"
                || k.to_ascii_lowercase().starts_with("aws:")
                || [MARK_MANAGED, MARK_UID, MARK_INSTALLATION].contains(&k.as_str());
            if k.is_empty() || k.chars().count() > 128 || reserved {
                return Err(invalid(format!(
                    "config.tags key {k:?} is empty, longer than 128 characters, or reserved (Name, aws:*, the operator's marks)"
                )));
            }
            if v.chars().count() > 256 {
                return Err(invalid(format!(
                    "config.tags[{k:?}] is longer than 256 characters"
                )));
            }
        }
        Ok(())
    }

    /// The region of a placement or an ID, which must be configured: the endpoint and the
    /// network come from here.
    pub fn region(&self, name: &str) -> Result<&Region, ProviderError> {
        self.regions.get(name).ok_or_else(|| {
            let known: Vec<&str> = self.regions.keys().map(String::as_str).collect();
            ProviderError::permanent(format!(
                "region {name:?} is not configured (config.regions has {known:?})"
            ))
            .with_code("InvalidRegion")
        })
    }
}

impl Region {
    /// The configured endpoint or the regional default (`.amazonaws.com.cn` in China).
    pub fn endpoint(&self, region: &str) -> Result<Endpoint, &'static str> {
        match &self.endpoint {
            Some(url) => parse_endpoint(url),
            None => Ok(default_endpoint(region)),
        }
    }

    /// A catalogue entry, parsed; `why` names what is wrong with it.
    pub fn image(&self, key: &str) -> Result<Option<Image>, String> {
        let Some(value) = self.images.get(key) else {
            return Ok(None);
        };
        let (id, root) = match value {
            serde_json::Value::String(id) => (id.clone(), None),
            serde_json::Value::Object(map) => {
                if let Some(unknown) = map
                    .keys()
                    .find(|k| !matches!(k.as_str(), "id" | "rootDeviceName"))
                {
                    return Err(format!(
                        "has unknown field {unknown:?} (expected id, rootDeviceName)"
                    ));
                }
                let id = match map.get("id") {
                    Some(serde_json::Value::String(s)) => s.clone(),
                    _ => return Err("needs \"id\": an AMI id string".to_string()),
                };
                let root = match map.get("rootDeviceName") {
                    None => None,
                    Some(serde_json::Value::String(d)) if valid_device(d) => Some(d.clone()),
                    Some(d) => {
                        return Err(format!(
                            "rootDeviceName {d} is not a device name (like \"/dev/sda1\")"
                        ));
                    }
                };
                (id, root)
            }
            other => {
                return Err(format!(
                    "is {other}; expected an AMI id or {{\"id\": .., \"rootDeviceName\": ..}}"
                ));
            }
        };
        if !valid_id(&id, "ami") {
            return Err(format!(
                "id {id:?} is not an AMI id (\"ami-\" and 8 or 17 hex digits)"
            ));
        }
        Ok(Some(Image {
            id,
            root_device_name: root,
        }))
    }
}

/// Everything `create` needs from the config for one placement.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Launch {
    pub region: String,
    pub endpoint: Endpoint,
    pub zone: String,
    pub subnet_id: Option<String>,
    pub security_group_ids: Vec<String>,
    pub instance_type: String,
    pub image_id: String,
    pub root_device_name: String,
}

/// Resolve a placement, refusing what can never work before anything is sent, naming
/// the field, the value and what would have been accepted.
pub fn resolve(cfg: &Config, p: &Placement) -> Result<Launch, ProviderError> {
    let bad = |field: PlacementField, value: &str, accepted: String| {
        ProviderError::invalid_placement(field, value, format!("is not usable: {accepted}"))
    };
    let region = cfg.regions.get(&p.region).ok_or_else(|| {
        bad(
            PlacementField::Region,
            &p.region,
            format!("configured regions are {:?}", keys(&cfg.regions)),
        )
    })?;
    let zone = region.zones.get(&p.zone).ok_or_else(|| {
        bad(
            PlacementField::Zone,
            &p.zone,
            format!(
                "configured zones of {} are {:?}",
                p.region,
                keys(&region.zones)
            ),
        )
    })?;
    if !cfg.instance_types.contains(&p.machine_type) {
        return Err(bad(
            PlacementField::MachineType,
            &p.machine_type,
            format!("configured instance types are {:?}", cfg.instance_types),
        ));
    }
    let image = if p.image.starts_with("ami-") {
        if !valid_id(&p.image, "ami") {
            return Err(bad(
                PlacementField::Image,
                &p.image,
                "an AMI id is \"ami-\" and 8 or 17 hex digits".to_string(),
            ));
        }
        Image {
            id: p.image.clone(),
            root_device_name: None,
        }
    } else {
        match region.image(&p.image) {
            Ok(Some(image)) => image,
            _ => {
                return Err(bad(
                    PlacementField::Image,
                    &p.image,
                    format!(
                        "not an AMI id, and the image keys of {} are {:?}",
                        p.region,
                        keys(&region.images)
                    ),
                ));
            }
        }
    };
    let endpoint = region
        .endpoint(&p.region)
        .map_err(|why| ProviderError::permanent(format!("endpoint of {}: {why}", p.region)))?;
    let root_device_name = image
        .root_device_name
        .or_else(|| region.root_device_name.clone())
        .unwrap_or_else(|| DEFAULT_ROOT_DEVICE.to_string());
    Ok(Launch {
        region: p.region.clone(),
        endpoint,
        zone: p.zone.clone(),
        subnet_id: zone.subnet_id.clone(),
        security_group_ids: zone.security_group_ids.clone(),
        instance_type: p.machine_type.clone(),
        image_id: image.id,
        root_device_name,
    })
}

fn keys<V>(m: &BTreeMap<String, V>) -> Vec<&str> {
    m.keys().map(String::as_str).collect()
}

pub fn default_endpoint(region: &str) -> Endpoint {
    let domain = if region.starts_with("cn-") {
        "amazonaws.com.cn"
    } else {
        "amazonaws.com"
    };
    let authority = format!("ec2.{region}.{domain}");
    Endpoint {
        base: format!("https://{authority}"),
        authority,
    }
}

/// `http(s)://host[:port][/]`: the Query API is served at `/`, so a path would be a
/// mistake (and would have to be signed).
fn parse_endpoint(url: &str) -> Result<Endpoint, &'static str> {
    let rest = url
        .strip_prefix("https://")
        .or_else(|| url.strip_prefix("http://"))
        .ok_or("is not an http(s) URL")?;
    let authority = rest.strip_suffix('/').unwrap_or(rest);
    if authority.is_empty() {
        return Err("has no host");
    }
    if authority.contains(['/', '?', '#', '@']) || authority.chars().any(char::is_whitespace) {
        return Err("must be scheme://host[:port] with no path, query or user");
    }
    let scheme_len = url.len() - rest.len();
    Ok(Endpoint {
        base: format!("{}{authority}", &url[..scheme_len]),
        authority: authority.to_string(),
    })
}

fn invalid(message: impl Into<String>) -> ProviderError {
    ProviderError::invalid_config(message)
}

/// `eu-west-1`, `us-gov-east-1`, `ap-southeast-4`: lowercase words joined by `-`, the
/// last a number. It becomes part of instance IDs and endpoint host names, so nothing
/// else may pass.
pub fn valid_region(s: &str) -> bool {
    let parts: Vec<&str> = s.split('-').collect();
    s.len() <= 32
        && parts.len() >= 3
        && parts.iter().all(|p| {
            !p.is_empty()
                && p.bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit())
        })
        && parts[0].bytes().all(|b| b.is_ascii_lowercase())
        && parts[parts.len() - 1].bytes().all(|b| b.is_ascii_digit())
}

/// `eu-west-1a`, and Local Zones like `us-east-1-bos-1a`.
fn valid_zone(region: &str, zone: &str) -> bool {
    zone.strip_prefix(region).is_some_and(|rest| {
        !rest.is_empty()
            && rest.len() <= 24
            && rest
                .bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
    })
}

/// `<prefix>-` and 8 or 17 lowercase hex digits: the two id formats EC2 issues.
pub fn valid_id(id: &str, prefix: &str) -> bool {
    let Some(rest) = id.strip_prefix(prefix).and_then(|r| r.strip_prefix('-')) else {
        return false;
    };
    matches!(rest.len(), 8 | 17)
        && rest
            .bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
}

/// `t3.micro`, `m7i-flex.large`, `u-6tb1.metal`.
fn valid_instance_type(t: &str) -> bool {
    let Some((family, size)) = t.split_once('.') else {
        return false;
    };
    let ok = |s: &str| {
        !s.is_empty()
            && s.bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
    };
    t.len() <= 32 && ok(family) && ok(size)
}

fn valid_device(d: &str) -> bool {
    d.len() <= 32
        && d.strip_prefix("/dev/").is_some_and(|n| {
            !n.is_empty()
                && n.bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'/')
        })
}
