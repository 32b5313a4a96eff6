//! The provider's config block and the placement check that depends on it. Checked at load (`validate-config`, no
//! I/O) with messages that name the field and the value; every call parses it again with the same function.

use egress_guest_sdk::config::{each, endpoint, invalid, nonempty, one_of, unique};
use egress_guest_sdk::id::is_word;
use egress_guest_sdk::{Placement, PlacementField, ProviderError};
use serde::Deserialize;
use std::collections::BTreeMap;

/// The VMIDs the plugin derives its VMs' IDs from unless `vmidRange` says otherwise: the top of Proxmox's default
/// `next-id` range, which `/cluster/nextid` hands out last, so VMs made by hand rarely sit there.
pub const DEFAULT_VMIDS: [u32; 2] = [900_000, 999_999];

/// Cores and memory of a `placement.machineType`; a VM without one keeps the template's.
#[derive(Deserialize, Debug, Clone, Copy, PartialEq, Eq)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct Size {
    pub cores: u32,
    #[serde(rename = "memoryMiB")]
    pub memory_mib: u32,
}

/// A config block. Empty strings and missing numbers are the defaults, filled in by [`parse`].
#[derive(Deserialize, Debug, Clone, PartialEq)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct Config {
    /// `https://pve.example.lan:8006`; `/api2/json` is added.
    pub endpoint: String,
    /// The API token's ID, `user@realm!tokenid`; its secret comes from the secret `tokenSecret` names.
    pub token_id: String,
    #[serde(default)]
    pub token_secret: String,
    /// The nodes a Proxy may run on (`placement.zone`).
    pub nodes: Vec<String>,
    /// `placement.image` -> VMID of the template to clone.
    pub templates: BTreeMap<String, u32>,
    #[serde(default)]
    pub machine_types: BTreeMap<String, Size>,
    /// A storage with `iso` content on every node, for the seed images.
    #[serde(default)]
    pub iso_storage: String,
    /// Full clones (a copy of every disk) instead of linked clones of the template.
    #[serde(default)]
    pub full_clone: bool,
    /// A resource pool every VM joins.
    #[serde(default)]
    pub pool: String,
    /// `[first, last]` VMIDs.
    #[serde(default)]
    pub vmid_range: Option<[u32; 2]>,
    /// How long one call waits for a clone, an upload or a stop to finish.
    #[serde(default)]
    pub wait_seconds: Option<u32>,
}

/// A node name (a host name label).
pub fn is_node(s: &str) -> bool {
    is_word(s, 63, b"-") && !s.starts_with('-') && !s.ends_with('-')
}

/// `user@realm!tokenid`, as Proxmox writes token IDs.
fn is_token_id(s: &str) -> bool {
    let ident = |s: &str| s.starts_with(|c: char| c.is_ascii_alphabetic()) && is_word(s, 64, b"-_.");
    match s.split_once('@').and_then(|(user, rest)| Some((user, rest.split_once('!')?))) {
        Some((user, (realm, token))) => is_word(user, 64, b"-_.+") && ident(realm) && ident(token),
        None => false,
    }
}

/// Parse and check a config block; every message names the field and the value.
pub fn parse(json: &str) -> Result<Config, ProviderError> {
    let mut c: Config = egress_guest_sdk::config::parse(json)?;
    let or = |v: &mut String, default: &str| v.is_empty().then(|| *v = default.into());
    or(&mut c.token_secret, "tokenSecret");
    or(&mut c.iso_storage, "local");
    let base = c.endpoint.trim_end_matches('/').trim_end_matches("/api2/json").to_string();
    c.endpoint = format!("{}/api2/json", endpoint("endpoint", &base, "")?);
    if !is_token_id(&c.token_id) {
        return Err(invalid("tokenId", &c.token_id, "want the API token's ID, user@realm!tokenid"));
    }
    if !is_word(&c.token_secret, 128, b"-_.") {
        return Err(invalid("tokenSecret", &c.token_secret, "want the key of a secret of this entry"));
    }
    nonempty("nodes", &c.nodes)?;
    unique("nodes", &c.nodes)?;
    each("nodes", &c.nodes, |n| is_node(n), "want a node name")?;
    if c.templates.is_empty() {
        return Err(invalid("templates", "{}", "is empty: want a map of image key to template VMID"));
    }
    let key = |k: &String| is_word(k, 63, b"-_.");
    if let Some((k, v)) = c.templates.iter().find(|(k, v)| !key(k) || !(100..1_000_000_000).contains(*v)) {
        return Err(invalid(&format!("templates[{k:?}]"), v, "want a key of letters, digits, '-_.' and a VMID"));
    }
    if let Some((k, s)) =
        c.machine_types.iter().find(|(k, s)| !key(k) || s.cores == 0 || s.cores > 512 || s.memory_mib < 16)
    {
        return Err(invalid(&format!("machineTypes[{k:?}]"), s, "want 1-512 cores and at least 16 memoryMiB"));
    }
    let storage = |s: &str| s.starts_with(|c: char| c.is_ascii_alphabetic()) && is_word(s, 64, b"-_.");
    if !storage(&c.iso_storage) {
        return Err(invalid("isoStorage", &c.iso_storage, "want a storage ID"));
    }
    if !c.pool.is_empty() && !is_word(&c.pool, 64, b"-_") {
        return Err(invalid("pool", &c.pool, "want a pool ID"));
    }
    let [first, last] = c.vmids();
    if !(100 <= first && first <= last && last < 1_000_000_000) {
        return Err(invalid("vmidRange", [first, last], "want [first, last] with 100 <= first <= last <= 999999999"));
    }
    if !(1..=600).contains(&c.wait()) {
        return Err(invalid("waitSeconds", c.wait(), "want 1-600"));
    }
    Ok(c)
}

impl Config {
    pub fn vmids(&self) -> [u32; 2] {
        self.vmid_range.unwrap_or(DEFAULT_VMIDS)
    }

    pub fn wait(&self) -> u32 {
        self.wait_seconds.unwrap_or(30)
    }

    /// Node, template VMID and size of a placement, checked against the catalogue before any call. `region` is
    /// not used: a cluster is one endpoint.
    pub fn resolve(&self, p: &Placement) -> Result<(&str, u32, Option<Size>), ProviderError> {
        let node = one_of(PlacementField::Zone, &p.zone, &self.nodes, "nodes")?;
        let images: Vec<&String> = self.templates.keys().collect();
        let image = one_of(PlacementField::Image, &p.image, &images, "templates")?;
        let size = match p.machine_type.as_str() {
            "" => None,
            mt => {
                let keys: Vec<&String> = self.machine_types.keys().collect();
                Some(self.machine_types[one_of(PlacementField::MachineType, mt, &keys, "machineTypes")?.as_str()])
            }
        };
        Ok((node, self.templates[image.as_str()], size))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::Value;

    const MIN: &str = r#"{"endpoint":"https://pve.lan:8006","tokenId":"egress@pve!operator","nodes":["pve1"],
        "templates":{"debian":9000}}"#;

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
        assert_eq!((c.endpoint.as_str(), c.token_secret.as_str()), ("https://pve.lan:8006/api2/json", "tokenSecret"));
        assert_eq!((c.iso_storage.as_str(), c.vmids(), c.wait(), c.full_clone), ("local", DEFAULT_VMIDS, 30, false));
        let c = parse(&with(r#"{"endpoint":"http://127.0.0.1:9/api2/json/"}"#)).unwrap();
        assert_eq!(c.endpoint, "http://127.0.0.1:9/api2/json");
    }

    /// Every rejected config names the field and the offending value.
    #[test]
    fn validation_table() {
        let cases: &[(&str, &[&str])] = &[
            (r#"{"endpoint":"ftp://pve"}"#, &["config.endpoint", "ftp://pve"]),
            (r#"{"tokenId":"root@pam"}"#, &["config.tokenId", "\"root@pam\""]),
            (r#"{"tokenId":"root@pam!"}"#, &["config.tokenId"]),
            (r#"{"tokenSecret":"a/b"}"#, &["config.tokenSecret", "\"a/b\""]),
            (r#"{"nodes":[]}"#, &["config.nodes", "empty"]),
            (r#"{"nodes":["pve 1"]}"#, &["config.nodes", "\"pve 1\""]),
            (r#"{"nodes":["a","a"]}"#, &["config.nodes", "twice"]),
            (r#"{"templates":{}}"#, &["config.templates", "empty"]),
            (r#"{"templates":{"debian":99}}"#, &["config.templates[\"debian\"]", "99"]),
            (r#"{"templates":{"a/b":9000}}"#, &["config.templates[\"a/b\"]"]),
            (
                r#"{"machineTypes":{"small":{"cores":0,"memoryMiB":512}}}"#,
                &["config.machineTypes[\"small\"]", "cores: 0"],
            ),
            (r#"{"machineTypes":{"small":{"cores":1}}}"#, &["memoryMiB"]),
            (r#"{"isoStorage":"local/iso"}"#, &["config.isoStorage", "\"local/iso\""]),
            (r#"{"pool":"a b"}"#, &["config.pool", "\"a b\""]),
            (r#"{"vmidRange":[1000,999]}"#, &["config.vmidRange", "[1000, 999]"]),
            (r#"{"vmidRange":[50,999]}"#, &["config.vmidRange", "[50, 999]"]),
            (r#"{"waitSeconds":0}"#, &["config.waitSeconds", "0"]),
            (r#"{"insecure":true}"#, &["insecure"]),
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
        let c =
            parse(&with(r#"{"nodes":["pve1","pve2"],"machineTypes":{"small":{"cores":1,"memoryMiB":512}}}"#)).unwrap();
        let p = |zone: &str, mt: &str, image: &str| Placement::new("ignored", zone, mt, image);
        assert_eq!(c.resolve(&p("pve2", "", "debian")).unwrap(), ("pve2", 9000, None));
        let small = Some(Size { cores: 1, memory_mib: 512 });
        assert_eq!(c.resolve(&p("pve1", "small", "debian")).unwrap(), ("pve1", 9000, small));
        for (pl, code) in [
            (p("pve3", "", "debian"), "InvalidZone"),
            (p("", "", "debian"), "InvalidZone"),
            (p("pve1", "huge", "debian"), "InvalidMachineType"),
            (p("pve1", "", "ubuntu"), "InvalidImage"),
        ] {
            assert_eq!(c.resolve(&pl).unwrap_err().code.as_deref(), Some(code));
        }
    }
}
