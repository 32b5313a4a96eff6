//! The provider's config block and the placement check that depends on it.
//!
//! Everything is validated at load (`validate-config`, no I/O) with messages that name the
//! field and the value, because a config error stops only this provider and the message is
//! all the admin sees. The same parser runs at every call, so a config that loaded always
//! parses later.

use egress_guest_sdk::config::{choose, each, endpoint, nonempty, one_of, unique};
use egress_guest_sdk::json::nullable;
use egress_guest_sdk::{Placement, PlacementField, ProviderError};
use serde::Deserialize;
use serde_json::Value;

/// The public API. A different endpoint is for a proxy in front of it or for tests.
pub const DEFAULT_ENDPOINT: &str = "https://api.hetzner.cloud/v1";

#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct Raw {
    #[serde(default)]
    endpoint: Option<String>,
    locations: Vec<String>,
    server_types: Vec<String>,
    /// A list of image names, or a map from catalogue key to image name or ID; read by
    /// hand below, since serde cannot say which form went wrong.
    images: Value,
    // `null` is an empty list: an admin's template may render an unset list that way.
    #[serde(default, deserialize_with = "nullable")]
    firewall_ids: Vec<u64>,
    #[serde(default, deserialize_with = "nullable")]
    network_ids: Vec<u64>,
    #[serde(default, deserialize_with = "nullable")]
    ssh_keys: Vec<String>,
}

/// A validated config block.
#[derive(Debug, Clone, PartialEq)]
pub struct Config {
    /// The API base including `/v1`, without a trailing slash.
    pub endpoint: String,
    pub locations: Vec<String>,
    pub server_types: Vec<String>,
    /// Catalogue key (what `placement.image` names) and the image name or ID sent to
    /// Hetzner. For the list form both are the image name.
    pub images: Vec<(String, String)>,
    pub firewall_ids: Vec<u64>,
    pub network_ids: Vec<u64>,
    pub ssh_keys: Vec<String>,
}

/// What a placement resolved to: the values the create call sends.
#[derive(Debug, PartialEq, Eq)]
pub struct Resolved<'a> {
    pub location: &'a str,
    pub server_type: &'a str,
    pub image: &'a str,
}

fn invalid(msg: String) -> ProviderError {
    ProviderError::invalid_config(msg)
}

/// Parse and validate a config block. The endpoint must end in `/v1`: the plugin speaks
/// API v1 and appends resource paths, so a base without it would turn every lookup into a
/// 404 that could pass for "gone".
pub fn parse(json: &str) -> Result<Config, ProviderError> {
    let raw: Raw = egress_guest_sdk::config::parse(json)?;
    let endpoint = endpoint(
        "endpoint",
        raw.endpoint.as_deref().unwrap_or(DEFAULT_ENDPOINT),
        "/v1",
    )?;
    let location = "want 1-32 lowercase letters, digits or '-' (a Hetzner location such as fsn1)";
    let server_type =
        "want 1-64 letters, digits, '.', '_' or '-' (a Hetzner server type such as cx22)";
    for (field, items, valid, want) in [
        (
            "locations",
            &raw.locations,
            is_location as fn(&str) -> bool,
            location,
        ),
        (
            "serverTypes",
            &raw.server_types,
            |t: &str| is_catalogue_name(t, 64),
            server_type,
        ),
    ] {
        nonempty(field, items)?;
        unique(field, items)?;
        each(field, items, |i| valid(i), want)?;
    }
    let images = images(&raw.images)?;
    for (field, ids) in [
        ("firewallIds", &raw.firewall_ids),
        ("networkIds", &raw.network_ids),
    ] {
        each(field, ids, |id| *id > 0, "want a positive integer ID")?;
        unique(field, ids)?;
    }
    let ssh_key =
        |k: &String| !k.trim().is_empty() && k.len() <= 128 && !k.chars().any(char::is_control);
    each(
        "sshKeys",
        &raw.ssh_keys,
        ssh_key,
        "want an SSH key name or ID",
    )?;
    Ok(Config {
        endpoint,
        locations: raw.locations,
        server_types: raw.server_types,
        images,
        firewall_ids: raw.firewall_ids,
        network_ids: raw.network_ids,
        ssh_keys: raw.ssh_keys,
    })
}

fn images(v: &Value) -> Result<Vec<(String, String)>, ProviderError> {
    let bad_key = |k: &str| {
        let why = "want 1-63 printable characters without spaces";
        invalid(format!("config.images key {k:?} is invalid: {why}"))
    };
    let out: Vec<(String, String)> = match v {
        Value::Array(items) => items
            .iter()
            .map(|item| match item {
                Value::String(s) if is_image_name(s) => Ok((s.clone(), s.clone())),
                other => Err(invalid(format!("config.images entry {other} is invalid: want an image name"))),
            })
            .collect::<Result<_, _>>()?,
        Value::Object(map) => map
            .iter()
            .map(|(k, v)| {
                if !is_image_name(k) || k.len() > 63 {
                    return Err(bad_key(k));
                }
                match v {
                    Value::String(s) if is_image_name(s) => Ok((k.clone(), s.clone())),
                    Value::Number(n) if n.as_u64().is_some_and(|n| n > 0) => Ok((k.clone(), n.to_string())),
                    other => Err(invalid(format!(
                        "config.images[{k:?}] value {other} is invalid: want an image name or a positive image ID"
                    ))),
                }
            })
            .collect::<Result<_, _>>()?,
        other => {
            return Err(invalid(format!(
                "config.images {other} is invalid: want a list of image names or a map of key to image name or ID"
            )));
        }
    };
    nonempty("images", &out)?;
    let keys: Vec<&String> = out.iter().map(|(k, _)| k).collect();
    unique("images", &keys)?;
    Ok(out)
}

/// Location names end up in provider IDs (`<location>/<server id>`) and in a label value,
/// so they must be free of `/` and valid as a label value.
pub fn is_location(s: &str) -> bool {
    (1..=32).contains(&s.len())
        && s.bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
}

fn is_catalogue_name(s: &str, max: usize) -> bool {
    (1..=max).contains(&s.len())
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
}

fn is_image_name(s: &str) -> bool {
    (1..=128).contains(&s.len()) && s.bytes().all(|b| b.is_ascii_graphic())
}

impl Config {
    /// Check a placement against the catalogue before any backend call: the CRD cannot,
    /// and this error is the user's only feedback. `zone` is ignored (Hetzner places a
    /// server in a location, not a zone).
    pub fn resolve<'a>(&'a self, p: &Placement) -> Result<Resolved<'a>, ProviderError> {
        let location = one_of(
            PlacementField::Region,
            &p.region,
            &self.locations,
            "locations",
        )?;
        let server_type = one_of(
            PlacementField::MachineType,
            &p.machine_type,
            &self.server_types,
            "server types",
        )?;
        let image = choose(
            PlacementField::Image,
            &p.image,
            &self.images,
            |(k, _)| k,
            "images",
        )?;
        Ok(Resolved {
            location,
            server_type,
            image: &image.1,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIN: &str = r#"{"locations":["fsn1"],"serverTypes":["cx22"],"images":["ubuntu-24.04"]}"#;

    #[test]
    fn defaults_and_both_image_forms() {
        let c = parse(MIN).unwrap();
        assert_eq!(c.endpoint, DEFAULT_ENDPOINT);
        assert_eq!(
            c.images,
            vec![("ubuntu-24.04".to_string(), "ubuntu-24.04".to_string())]
        );
        assert!(c.firewall_ids.is_empty() && c.network_ids.is_empty() && c.ssh_keys.is_empty());

        let c = parse(
            r#"{"endpoint":"http://127.0.0.1:8080/v1/","locations":["fsn1","ash"],"serverTypes":["cx22","cpx11"],
                "images":{"ubuntu":"ubuntu-24.04","debian":114690387},"firewallIds":[1,2],"networkIds":[3],
                "sshKeys":["ops key","42"]}"#,
        )
        .unwrap();
        assert_eq!(c.endpoint, "http://127.0.0.1:8080/v1");
        assert_eq!(
            c.images,
            vec![
                ("debian".to_string(), "114690387".to_string()),
                ("ubuntu".to_string(), "ubuntu-24.04".to_string())
            ]
        );
        assert_eq!((c.firewall_ids, c.network_ids), (vec![1, 2], vec![3]));
    }

    /// Every rejected config names the field and the offending value.
    #[test]
    fn validation_table() {
        let base = |patch: &str| {
            let mut v: Value = serde_json::from_str(MIN).unwrap();
            let p: Value = serde_json::from_str(patch).unwrap();
            for (k, val) in p.as_object().unwrap() {
                v[k] = val.clone();
            }
            v.to_string()
        };
        let cases: &[(&str, &[&str])] = &[
            (
                r#"{"endpoint":"ftp://x/v1"}"#,
                &["config.endpoint", "ftp://x/v1"],
            ),
            (
                r#"{"endpoint":"https://api.hetzner.cloud"}"#,
                &["config.endpoint", "/v1"],
            ),
            (
                r#"{"endpoint":"https://u:p@h/v1"}"#,
                &["config.endpoint", "user info"],
            ),
            (r#"{"endpoint":"https:///v1"}"#, &["config.endpoint"]),
            (
                r#"{"endpoint":"https://h/v1?x=1"}"#,
                &["config.endpoint", "query"],
            ),
            (r#"{"locations":[]}"#, &["config.locations", "empty"]),
            (
                r#"{"locations":["fsn1","fsn1"]}"#,
                &["config.locations", "\"fsn1\" twice"],
            ),
            (
                r#"{"locations":["FSN1"]}"#,
                &["config.locations", "\"FSN1\""],
            ),
            (
                r#"{"locations":["fsn1/x"]}"#,
                &["config.locations", "\"fsn1/x\""],
            ),
            (r#"{"serverTypes":[]}"#, &["config.serverTypes", "empty"]),
            (
                r#"{"serverTypes":["cx 22"]}"#,
                &["config.serverTypes", "\"cx 22\""],
            ),
            (r#"{"images":[]}"#, &["config.images", "empty"]),
            (r#"{"images":{}}"#, &["config.images", "empty"]),
            (r#"{"images":"ubuntu"}"#, &["config.images", "\"ubuntu\""]),
            (r#"{"images":[7]}"#, &["config.images", "7"]),
            (r#"{"images":{"u":0}}"#, &["config.images[\"u\"]", "0"]),
            (
                r#"{"images":{"u":"has space"}}"#,
                &["config.images[\"u\"]", "has space"],
            ),
            (
                r#"{"images":{"a b":"x"}}"#,
                &["config.images key", "\"a b\""],
            ),
            (r#"{"images":["u","u"]}"#, &["config.images", "\"u\" twice"]),
            (r#"{"firewallIds":[0]}"#, &["config.firewallIds", "0"]),
            (r#"{"networkIds":[5,5]}"#, &["config.networkIds", "5 twice"]),
            (r#"{"firewallIds":["x"]}"#, &["config.firewallIds", "\"x\""]),
            (r#"{"networkIds":-3}"#, &["config.networkIds", "-3"]),
            (r#"{"locations":"fsn1"}"#, &["config.locations", "\"fsn1\""]),
            (r#"{"serverTypes":[22]}"#, &["config.serverTypes", "22"]),
            (r#"{"sshKeys":[1]}"#, &["config.sshKeys", "1"]),
            (r#"{"sshKeys":[""]}"#, &["config.sshKeys", "\"\""]),
            (r#"{"sshKeys":["a\u0001"]}"#, &["config.sshKeys"]),
            (r#"{"extra":1}"#, &["extra"]),
        ];
        for (patch, want) in cases {
            let json = base(patch);
            let e = parse(&json)
                .err()
                .unwrap_or_else(|| panic!("{patch} was accepted"));
            assert_eq!(e.class, egress_guest_sdk::ErrorClass::Permanent, "{patch}");
            for w in *want {
                assert!(
                    e.message.contains(w),
                    "{patch}: {:?} does not contain {w:?}",
                    e.message
                );
            }
        }
        for missing in ["locations", "serverTypes", "images"] {
            let mut v: Value = serde_json::from_str(MIN).unwrap();
            v.as_object_mut().unwrap().remove(missing);
            let e = parse(&v.to_string()).err().unwrap();
            assert!(e.message.contains(missing), "{}", e.message);
        }
    }

    #[test]
    fn placement_is_checked_against_the_catalogue() {
        let c = parse(r#"{"locations":["fsn1","nbg1"],"serverTypes":["cx22"],"images":{"ubuntu":"ubuntu-24.04"}}"#)
            .unwrap();
        let p = |region: &str, mt: &str, image: &str| Placement::new(region, "ignored", mt, image);
        assert_eq!(
            c.resolve(&p("nbg1", "cx22", "ubuntu")).unwrap(),
            Resolved {
                location: "nbg1",
                server_type: "cx22",
                image: "ubuntu-24.04"
            }
        );
        let cases = [
            (
                p("mars1", "cx22", "ubuntu"),
                "InvalidRegion",
                "placement.region \"mars1\"",
            ),
            (
                p("", "cx22", "ubuntu"),
                "InvalidRegion",
                "placement.region \"\"",
            ),
            (
                p("fsn1", "cx99", "ubuntu"),
                "InvalidMachineType",
                "placement.machineType \"cx99\"",
            ),
            // The map form takes keys, not the image names behind them.
            (
                p("fsn1", "cx22", "ubuntu-24.04"),
                "InvalidImage",
                "placement.image \"ubuntu-24.04\"",
            ),
        ];
        for (placement, code, text) in cases {
            let e = c.resolve(&placement).unwrap_err();
            assert_eq!(e.code.as_deref(), Some(code));
            assert!(e.message.contains(text), "{}", e.message);
        }
    }
}
