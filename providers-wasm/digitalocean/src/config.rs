//! The provider's config block and the placement check that depends on it. Checked at load (`validate-config`, no I/O) with messages that name the field and the value; every call parses it
//! again with the same function, so a config that loaded always parses later.

use crate::marks::is_tag;
use egress_guest_sdk::config::{choose, each, endpoint, invalid, nonempty, one_of, unique};
use egress_guest_sdk::json::nullable;
use egress_guest_sdk::{Placement, PlacementField, ProviderError};
use serde::Deserialize;
use serde_json::Value;

/// The public API. Anything else is a proxy in front of it or an emulator.
pub const DEFAULT_ENDPOINT: &str = "https://api.digitalocean.com/v2";

/// A config block, validated by [`parse`].
#[derive(Deserialize, Debug, Clone, PartialEq)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct Config {
    /// The API base including `/v2`, without a trailing slash once parsed; absent is the public API.
    #[serde(default)]
    pub endpoint: String,
    pub regions: Vec<String>,
    pub sizes: Vec<String>,
    /// A list of image slugs, or a map from catalogue key to slug or numeric image ID.
    images: Value,
    #[serde(default, deserialize_with = "nullable")]
    pub ssh_keys: Vec<String>,
    /// Extra tags for every Droplet (e.g. the one a Cloud Firewall targets).
    #[serde(default, deserialize_with = "nullable")]
    pub tags: Vec<String>,
}

/// Parse and validate a config block. The endpoint must end in `/v2`: the plugin appends `/droplets`, and a base
/// without the version would make every lookup a 404.
pub fn parse(json: &str) -> Result<Config, ProviderError> {
    let mut c: Config = egress_guest_sdk::config::parse(json)?;
    let base = if c.endpoint.is_empty() { DEFAULT_ENDPOINT } else { &c.endpoint };
    c.endpoint = endpoint("endpoint", base, "/v2")?;
    let region = "want 1-32 lowercase letters or digits (a region slug such as nyc3)";
    let size = "want 1-64 lowercase letters, digits or '-' (a size slug such as s-1vcpu-1gb)";
    for (field, items, valid, want) in
        [("regions", &c.regions, is_region as fn(&str) -> bool, region), ("sizes", &c.sizes, is_slug, size)]
    {
        nonempty(field, items)?;
        unique(field, items)?;
        each(field, items, |i| valid(i), want)?;
    }
    nonempty("images", &c.images()?)?;
    let key = |k: &String| !k.trim().is_empty() && k.len() <= 128 && !k.chars().any(char::is_control);
    each("sshKeys", &c.ssh_keys, key, "want an SSH key ID or fingerprint")?;
    let tag = |t: &String| is_tag(t) && !t.to_ascii_lowercase().starts_with("egress:");
    let want = "want 1-255 letters, digits, ':', '-' or '_', not starting with \"egress:\" (the operator's own tags)";
    each("tags", &c.tags, tag, want)?;
    Ok(c)
}

/// [`invalid`] with the value as the admin wrote it (JSON), not as Rust debugs it.
fn bad(field: &str, value: &Value, why: &str) -> ProviderError {
    ProviderError::invalid_config(format!("config.{field} {value} is invalid: {why}"))
}

/// Region slugs end up in provider IDs (`<region>/<droplet id>`): no `/`, lowercase.
pub fn is_region(s: &str) -> bool {
    (1..=32).contains(&s.len()) && s.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit())
}

fn is_slug(s: &str) -> bool {
    (1..=64).contains(&s.len())
        && s.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || matches!(b, b'-' | b'.' | b'_'))
}

impl Config {
    /// The image catalogue: key, and what the create call sends as `image`.
    pub fn images(&self) -> Result<Vec<(String, Value)>, ProviderError> {
        let known = |v: &Value| v.as_str().is_some_and(is_slug) || v.as_u64().is_some_and(|n| n > 0);
        match &self.images {
            Value::Array(items) => items
                .iter()
                .map(|i| match i.as_str() {
                    Some(s) if is_slug(s) => Ok((s.to_string(), i.clone())),
                    _ => Err(bad("images entry", i, "want an image slug such as debian-12-x64")),
                })
                .collect(),
            Value::Object(map) => map
                .iter()
                .map(|(k, v)| match (is_slug(k), known(v)) {
                    (false, _) => Err(invalid("images key", k, "want 1-64 lowercase letters, digits or '-'")),
                    (_, false) => Err(bad(&format!("images[{k:?}]"), v, "want an image slug or a positive image ID")),
                    _ => Ok((k.clone(), v.clone())),
                })
                .collect(),
            other => Err(bad("images", other, "want a list of image slugs or a map of key to slug or ID")),
        }
    }

    /// The region, size and image a placement names, checked against the catalogue before any call. `zone` is
    /// ignored: a region slug is already one datacenter.
    pub fn resolve(&self, p: &Placement) -> Result<(String, String, Value), ProviderError> {
        let region = one_of(PlacementField::Region, &p.region, &self.regions, "regions")?;
        let size = one_of(PlacementField::MachineType, &p.machine_type, &self.sizes, "sizes")?;
        let images = self.images()?;
        let image = choose(PlacementField::Image, &p.image, &images, |(k, _)| k, "images")?;
        Ok((region.clone(), size.clone(), image.1.clone()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIN: &str = r#"{"regions":["nyc3"],"sizes":["s-1vcpu-1gb"],"images":["debian-12-x64"]}"#;

    fn with(patch: &str) -> String {
        let mut v: Value = serde_json::from_str(MIN).unwrap();
        for (k, val) in serde_json::from_str::<Value>(patch).unwrap().as_object().unwrap() {
            v[k] = val.clone();
        }
        v.to_string()
    }

    #[test]
    fn defaults_and_both_image_forms() {
        let c = parse(MIN).unwrap();
        assert_eq!(c.endpoint, DEFAULT_ENDPOINT);
        assert_eq!(c.images().unwrap(), vec![("debian-12-x64".to_string(), Value::from("debian-12-x64"))]);
        let c = parse(&with(r#"{"endpoint":"http://127.0.0.1:9/v2/","images":{"debian":"debian-12-x64","mine":123},"tags":["fw:proxies"]}"#)).unwrap();
        assert_eq!(c.endpoint, "http://127.0.0.1:9/v2");
        assert_eq!(c.images().unwrap()[1], ("mine".to_string(), Value::from(123)));
        assert_eq!(c.tags, ["fw:proxies"]);
    }

    /// Every rejected config names the field and the offending value.
    #[test]
    fn validation_table() {
        let cases: &[(&str, &[&str])] = &[
            (r#"{"endpoint":"https://api.digitalocean.com"}"#, &["config.endpoint", "/v2"]),
            (r#"{"endpoint":"ftp://x/v2"}"#, &["config.endpoint", "ftp://x/v2"]),
            (r#"{"regions":[]}"#, &["config.regions", "empty"]),
            (r#"{"regions":["NYC3"]}"#, &["config.regions", "\"NYC3\""]),
            (r#"{"regions":["nyc3/x"]}"#, &["config.regions", "\"nyc3/x\""]),
            (r#"{"regions":["nyc3","nyc3"]}"#, &["config.regions", "twice"]),
            (r#"{"sizes":["S 1"]}"#, &["config.sizes", "\"S 1\""]),
            (r#"{"images":[]}"#, &["config.images", "empty"]),
            (r#"{"images":"debian"}"#, &["config.images", "\"debian\""]),
            (r#"{"images":[7]}"#, &["config.images entry", "7"]),
            (r#"{"images":{"d":0}}"#, &["config.images[\"d\"]", "0"]),
            (r#"{"images":{"A B":"x"}}"#, &["config.images key", "\"A B\""]),
            (r#"{"sshKeys":[""]}"#, &["config.sshKeys", "\"\""]),
            (r#"{"tags":["has space"]}"#, &["config.tags", "\"has space\""]),
            (r#"{"tags":["egress:mine"]}"#, &["config.tags", "\"egress:mine\""]),
            (r#"{"regions":"nyc3"}"#, &["config.regions", "\"nyc3\""]),
            (r#"{"extra":1}"#, &["extra"]),
        ];
        for (patch, want) in cases {
            let e = parse(&with(patch)).err().unwrap_or_else(|| panic!("{patch} accepted"));
            assert_eq!(
                (e.class, e.code.as_deref()),
                (egress_guest_sdk::ErrorClass::Permanent, Some("InvalidConfig")),
                "{patch}"
            );
            for w in *want {
                assert!(e.message.contains(w), "{patch}: {:?} lacks {w:?}", e.message);
            }
        }
    }

    #[test]
    fn placement_is_checked_against_the_catalogue() {
        let c = parse(&with(r#"{"regions":["nyc3","ams3"],"images":{"debian":"debian-12-x64"}}"#)).unwrap();
        let p = |region: &str, size: &str, image: &str| Placement::new(region, "ignored", size, image);
        let r = c.resolve(&p("ams3", "s-1vcpu-1gb", "debian")).unwrap();
        assert_eq!(r, ("ams3".into(), "s-1vcpu-1gb".into(), Value::from("debian-12-x64")));
        for (pl, code) in [
            (p("mars1", "s-1vcpu-1gb", "debian"), "InvalidRegion"),
            (p("nyc3", "huge", "debian"), "InvalidMachineType"),
            (p("nyc3", "s-1vcpu-1gb", "debian-12-x64"), "InvalidImage"),
        ] {
            assert_eq!(c.resolve(&pl).unwrap_err().code.as_deref(), Some(code));
        }
    }
}
