//! The provider's config block and the placement check that depends on it. Checked at load (`validate-config`, no
//! I/O) with messages that name the field and the value; every call parses it again with the same function.

use egress_guest_sdk::config::{each, endpoint, invalid, nonempty, one_of, unique};
use egress_guest_sdk::{Placement, PlacementField, ProviderError};
use serde::Deserialize;
use std::collections::BTreeMap;

pub const DEFAULT_ENDPOINT: &str = "https://compute.googleapis.com/compute/v1";
/// The GCE metadata server. Link-local: reachable only when the operator's `allowedHosts` lists
/// `http://169.254.169.254:80`, never by default.
pub const DEFAULT_METADATA: &str = "http://169.254.169.254";

/// Where access tokens come from: a service-account JSON key (the secret `credentialsSecret` names), exchanged at its
/// `token_uri`; or the metadata server of the node the operator runs on (GKE workload identity, a VM's account).
#[derive(Deserialize, Debug, Clone, Copy, PartialEq, Eq, Default)]
#[serde(rename_all = "camelCase")]
pub enum TokenSource {
    #[default]
    ServiceAccountKey,
    Metadata,
}

/// A config block; `images` maps a catalogue key (what `placement.image` names) to an image path. Empty strings are the
/// defaults, filled in by [`parse`].
#[derive(Deserialize, Debug, Clone, PartialEq)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct Config {
    pub project: String,
    pub zones: Vec<String>,
    pub machine_types: Vec<String>,
    pub images: BTreeMap<String, String>,
    #[serde(default)]
    pub network: String,
    #[serde(default)]
    pub network_tags: Vec<String>,
    #[serde(default)]
    pub token_source: TokenSource,
    #[serde(default)]
    pub credentials_secret: String,
    #[serde(default)]
    pub endpoint: String,
    #[serde(default)]
    pub metadata_endpoint: String,
}

/// Whether `s` is an RFC 1035 label of at most `max` characters: what GCE takes as a name.
pub fn is_name(s: &str, max: usize) -> bool {
    let b = s.as_bytes();
    (1..=max).contains(&b.len())
        && b[0].is_ascii_lowercase()
        && b[b.len() - 1] != b'-'
        && b.iter().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == b'-')
}

fn is_type(s: &str) -> bool {
    is_name(s, 63)
}

/// A project ID: 6-30 characters, RFC 1035 (it ends up in provider IDs, so never a `/`).
pub fn is_project(s: &str) -> bool {
    (6..=30).contains(&s.len()) && is_name(s, 30)
}

/// A zone such as `europe-west1-b`: `<region>-<letter>` with a region of two or more parts.
pub fn is_zone(s: &str) -> bool {
    is_name(s, 40) && s.rsplit_once('-').is_some_and(|(region, z)| z.len() == 1 && region.contains('-'))
}

/// A relative resource path: segments of letters, digits, `-`, `_`, `.`, never `..` or empty.
fn is_path(s: &str) -> bool {
    s.len() <= 256
        && s.split('/').all(|seg| {
            !seg.is_empty() && seg != ".." && seg.bytes().all(|b| b.is_ascii_alphanumeric() || b"-_.".contains(&b))
        })
}

/// Parse and check a config block; every message names the field and the value.
pub fn parse(json: &str) -> Result<Config, ProviderError> {
    let mut c: Config = egress_guest_sdk::config::parse(json)?;
    let or = |v: &mut String, default: &str| v.is_empty().then(|| *v = default.into());
    or(&mut c.network, "global/networks/default");
    or(&mut c.credentials_secret, "serviceAccountKey");
    or(&mut c.endpoint, DEFAULT_ENDPOINT);
    or(&mut c.metadata_endpoint, DEFAULT_METADATA);
    if !is_project(&c.project) {
        return Err(invalid("project", &c.project, "want a project ID: 6-30 lowercase letters, digits or '-'"));
    }
    let (zone, machine) = ("want a zone such as europe-west1-b", "want a machine type such as e2-micro");
    for (field, items, valid, want) in
        [("zones", &c.zones, is_zone as fn(&str) -> bool, zone), ("machineTypes", &c.machine_types, is_type, machine)]
    {
        nonempty(field, items)?;
        unique(field, items)?;
        each(field, items, |i| valid(i), want)?;
    }
    let image = "want an image path such as projects/debian-cloud/global/images/family/debian-12";
    match c.images.iter().find(|(k, i)| !is_type(k) || !is_path(i) || !i.contains("/images/")) {
        _ if c.images.is_empty() => return Err(invalid("images", "{}", "is empty: want a map of key to image")),
        Some((k, _)) if !is_type(k) => {
            return Err(invalid("images key", k, "want 1-63 lowercase letters, digits, '-'"));
        }
        Some((k, i)) => return Err(invalid(&format!("images[{k:?}]"), i, image)),
        None => {}
    }
    if !is_path(&c.network) || !c.network.contains("networks/") {
        return Err(invalid("network", &c.network, "want a network path such as global/networks/default"));
    }
    each("networkTags", &c.network_tags, |t| is_type(t), "want an RFC 1035 network tag")?;
    if !egress_guest_sdk::id::is_word(&c.credentials_secret, 128, b"-_.") {
        return Err(invalid("credentialsSecret", &c.credentials_secret, "want the key of a secret of this entry"));
    }
    c.endpoint = endpoint("endpoint", &c.endpoint, "/compute/v1")?;
    c.metadata_endpoint = endpoint("metadataEndpoint", &c.metadata_endpoint, "")?;
    Ok(c)
}

impl Config {
    /// Zone, machine type and image of a placement, checked against the catalogue before any call. `region` may be
    /// empty; if set, the zone must lie in it.
    pub fn resolve<'a>(&'a self, p: &Placement) -> Result<(&'a str, &'a str, &'a str), ProviderError> {
        let zone = one_of(PlacementField::Zone, &p.zone, &self.zones, "zones")?;
        if !p.region.is_empty() && !zone.starts_with(&format!("{}-", p.region)) {
            return Err(ProviderError::invalid_placement(
                PlacementField::Region,
                &p.region,
                format!("does not contain zone {zone:?}"),
            ));
        }
        let machine = one_of(PlacementField::MachineType, &p.machine_type, &self.machine_types, "machineTypes")?;
        let keys: Vec<&String> = self.images.keys().collect();
        let key = one_of(PlacementField::Image, &p.image, &keys, "images")?;
        Ok((zone, machine, &self.images[key.as_str()]))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::Value;

    const MIN: &str = r#"{"project":"my-project","zones":["europe-west1-b"],"machineTypes":["e2-micro"],
        "images":{"debian":"projects/debian-cloud/global/images/family/debian-12"}}"#;

    fn with(patch: &str) -> String {
        let mut v: Value = serde_json::from_str(MIN).unwrap();
        for (k, val) in serde_json::from_str::<Value>(patch).unwrap().as_object().unwrap() {
            v[k] = val.clone();
        }
        v.to_string()
    }

    #[test]
    fn defaults() {
        let c = parse(MIN).unwrap();
        assert_eq!((c.endpoint.as_str(), c.metadata_endpoint.as_str()), (DEFAULT_ENDPOINT, DEFAULT_METADATA));
        assert_eq!(
            (c.network.as_str(), c.credentials_secret.as_str()),
            ("global/networks/default", "serviceAccountKey")
        );
        assert_eq!(c.token_source, TokenSource::ServiceAccountKey);
        let c = parse(&with(r#"{"tokenSource":"metadata","endpoint":"http://127.0.0.1:9/compute/v1/"}"#)).unwrap();
        assert_eq!((c.token_source, c.endpoint.as_str()), (TokenSource::Metadata, "http://127.0.0.1:9/compute/v1"));
    }

    /// Every rejected config names the field and the offending value.
    #[test]
    fn validation_table() {
        let cases: &[(&str, &[&str])] = &[
            (r#"{"project":"My_Project"}"#, &["config.project", "\"My_Project\""]),
            (r#"{"project":"p/x"}"#, &["config.project", "\"p/x\""]),
            (r#"{"zones":[]}"#, &["config.zones", "empty"]),
            (r#"{"zones":["europe-west1"]}"#, &["config.zones", "\"europe-west1\""]),
            (r#"{"zones":["a-b1-c","a-b1-c"]}"#, &["config.zones", "twice"]),
            (r#"{"machineTypes":["E2 Micro"]}"#, &["config.machineTypes", "\"E2 Micro\""]),
            (r#"{"images":{}}"#, &["config.images", "empty"]),
            (r#"{"images":{"Deb":"projects/x/global/images/y"}}"#, &["config.images key", "\"Deb\""]),
            (r#"{"images":{"d":"../images/x"}}"#, &["config.images[\"d\"]", "\"../images/x\""]),
            (r#"{"network":"default net"}"#, &["config.network", "\"default net\""]),
            (r#"{"networkTags":["Proxy"]}"#, &["config.networkTags", "\"Proxy\""]),
            (r#"{"tokenSource":"env"}"#, &["config.tokenSource", "env"]),
            (r#"{"credentialsSecret":"a/b"}"#, &["config.credentialsSecret", "\"a/b\""]),
            (r#"{"endpoint":"https://compute.googleapis.com"}"#, &["config.endpoint", "/compute/v1"]),
            (r#"{"metadataEndpoint":"ftp://x"}"#, &["config.metadataEndpoint", "ftp://x"]),
            (r#"{"extra":1}"#, &["extra"]),
        ];
        for (patch, want) in cases {
            let e = parse(&with(patch)).err().unwrap_or_else(|| panic!("{patch} accepted"));
            assert_eq!(e.code.as_deref(), Some("InvalidConfig"), "{patch}");
            for w in *want {
                assert!(e.message.contains(w), "{patch}: {:?} lacks {w:?}", e.message);
            }
        }
    }

    #[test]
    fn placement_is_checked_against_the_catalogue() {
        let c = parse(&with(r#"{"zones":["europe-west1-b","us-central1-a"]}"#)).unwrap();
        let p = |region: &str, zone: &str, mt: &str, image: &str| Placement::new(region, zone, mt, image);
        let want = ("us-central1-a", "e2-micro", "projects/debian-cloud/global/images/family/debian-12");
        assert_eq!(c.resolve(&p("", "us-central1-a", "e2-micro", "debian")).unwrap(), want);
        assert_eq!(c.resolve(&p("us-central1", "us-central1-a", "e2-micro", "debian")).unwrap(), want);
        for (pl, code) in [
            (p("", "mars-1-a", "e2-micro", "debian"), "InvalidZone"),
            (p("europe-west1", "us-central1-a", "e2-micro", "debian"), "InvalidRegion"),
            (p("", "us-central1-a", "huge", "debian"), "InvalidMachineType"),
            (p("", "us-central1-a", "e2-micro", "ubuntu"), "InvalidImage"),
        ] {
            assert_eq!(c.resolve(&pl).unwrap_err().code.as_deref(), Some(code));
        }
    }
}
