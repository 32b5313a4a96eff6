//! Reading and checking a provider's config block, with errors that name the field and
//! the value.
//!
//! A config error stops only this provider, and its message is all the operator's admin
//! sees, so every message here reads `config.<field> <value> is invalid: <why>`. Plain
//! serde errors say *what* is wrong but not *where*; [`parse`] adds the path
//! (`config.serverTypes[0]: invalid type: integer 22, expected a string`).
//!
//! Placement checks live here too: a Proxy's `spec.placement` is checked against the
//! config's catalogue before any backend call ([`one_of`]).

use crate::ProviderError;
use crate::error::PlacementField;
use serde::de::DeserializeOwned;
use std::fmt;

/// Parse a config block into the plugin's config type. What `validate-config` and every
/// later call share, so a config that validated also parses at call time. Any failure is
/// permanent (`InvalidConfig`) and names the field's path.
pub fn parse<T: DeserializeOwned>(json: &str) -> Result<T, ProviderError> {
    let de = &mut serde_json::Deserializer::from_str(json);
    serde_path_to_error::deserialize(de).map_err(|e| {
        let at = match e.path().to_string() {
            root if root == "." => "config".to_string(),
            path => format!("config.{path}"),
        };
        ProviderError::invalid_config(format!("invalid provider config: {at}: {}", e.inner()))
    })
}

/// `config.<field> <value> is invalid: <why>`, permanent, `InvalidConfig`. `field` is the
/// path below `config` as the admin wrote it (`locations`, `regions["r1"].zones`).
pub fn invalid(field: &str, value: impl fmt::Debug, why: impl fmt::Display) -> ProviderError {
    ProviderError::invalid_config(format!("config.{field} {value:?} is invalid: {why}"))
}

/// Every entry of the list `field` passes `valid`; the first that does not is named, with
/// `want` saying what would pass.
pub fn each<T: fmt::Debug>(
    field: &str,
    items: &[T],
    valid: impl Fn(&T) -> bool,
    want: &str,
) -> Result<(), ProviderError> {
    match items.iter().find(|i| !valid(i)) {
        Some(bad) => Err(invalid(&format!("{field} entry"), bad, want)),
        None => Ok(()),
    }
}

/// The list `field` names at least one entry: a catalogue with nothing in it places no
/// Proxy, which is better said at load than at the first create.
pub fn nonempty<T>(field: &str, items: &[T]) -> Result<(), ProviderError> {
    if items.is_empty() {
        let msg = format!("config.{field} is empty: no Proxy could be placed");
        return Err(ProviderError::invalid_config(msg));
    }
    Ok(())
}

/// No entry of the list `field` appears twice: a duplicate is a typo more often than not.
pub fn unique<T: PartialEq + fmt::Debug>(field: &str, items: &[T]) -> Result<(), ProviderError> {
    let dup = items
        .iter()
        .enumerate()
        .find(|(i, x)| items[..*i].contains(x));
    match dup {
        Some((_, d)) => Err(ProviderError::invalid_config(format!(
            "config.{field} lists {d:?} twice"
        ))),
        None => Ok(()),
    }
}

/// An `http(s)://host[:port][/path]` base URL for the API, normalised without a trailing
/// slash so resource paths can be appended. The path must end in `suffix` (`"/v1"` for an
/// API the plugin speaks one version of; `""` for any path): a base without it would turn
/// every lookup into a 404 that could pass for "gone". No whitespace, query, fragment or
/// user info: credentials come from secrets, never from the config.
pub fn endpoint(field: &str, url: &str, suffix: &str) -> Result<String, ProviderError> {
    let bad = |why: &str| invalid(field, url, why);
    let rest = url
        .strip_prefix("https://")
        .or_else(|| url.strip_prefix("http://"))
        .ok_or_else(|| bad("want an http:// or https:// URL"))?;
    if url.chars().any(|c| c.is_whitespace() || c.is_control()) || rest.contains(['?', '#']) {
        return Err(bad("no whitespace, query or fragment allowed"));
    }
    let (authority, path) = rest.split_at(rest.find('/').unwrap_or(rest.len()));
    if authority.is_empty() || authority.contains('@') {
        return Err(bad("want a host and no user info"));
    }
    let path = path.trim_end_matches('/');
    if !path.ends_with(suffix) {
        return Err(bad(&format!("the path must end in {suffix}")));
    }
    Ok(format!(
        "{}{authority}{path}",
        &url[..url.len() - rest.len()]
    ))
}

/// The entry of `choices` whose `key` is the placement's `value`, or a permanent error
/// naming the placement field, the value and every configured key (`what` says what they
/// are: `locations`, `server types`).
pub fn choose<'a, T>(
    field: PlacementField,
    value: &str,
    choices: &'a [T],
    key: impl Fn(&T) -> &str,
    what: &str,
) -> Result<&'a T, ProviderError> {
    choices.iter().find(|c| key(c) == value).ok_or_else(|| {
        let keys: Vec<&str> = choices.iter().map(&key).collect();
        ProviderError::invalid_placement(
            field,
            value,
            format!("is not one of the configured {what} {keys:?}"),
        )
    })
}

/// [`choose`] for a list of names.
pub fn one_of<'a, T: AsRef<str>>(
    field: PlacementField,
    value: &str,
    choices: &'a [T],
    what: &str,
) -> Result<&'a T, ProviderError> {
    choose(field, value, choices, |c| c.as_ref(), what)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ErrorClass;
    use serde::Deserialize;

    #[derive(Deserialize, Debug)]
    #[serde(deny_unknown_fields, rename_all = "camelCase")]
    #[allow(dead_code)]
    struct C {
        endpoint: String,
        server_types: Vec<String>,
        #[serde(default)]
        ids: Option<Vec<u64>>,
    }

    /// Each rejected block names where the problem is and the value at fault.
    #[test]
    fn parse_names_the_path_and_value() {
        let cases: &[(&str, &[&str])] = &[
            (
                r#"{"serverTypes":[]}"#,
                &["config:", "missing field `endpoint`"],
            ),
            (
                r#"{"endpoint":"x","serverTypes":[22]}"#,
                &["config.serverTypes[0]:", "22"],
            ),
            (
                r#"{"endpoint":"x","serverTypes":"cx22"}"#,
                &["config.serverTypes:", "\"cx22\""],
            ),
            (
                r#"{"endpoint":"x","serverTypes":[],"ids":[-3]}"#,
                &["config.ids[0]:", "-3"],
            ),
            (
                r#"{"endpoint":"x","serverTypes":[],"extra":1}"#,
                &["unknown field `extra`"],
            ),
            ("not json", &["config:", "expected"]),
        ];
        for (json, want) in cases {
            let e = parse::<C>(json).unwrap_err();
            assert_eq!(
                (e.class, e.code.as_deref()),
                (ErrorClass::Permanent, Some("InvalidConfig")),
                "{json}"
            );
            for w in *want {
                assert!(e.message.contains(w), "{json}: {:?} lacks {w:?}", e.message);
            }
        }
        let c: C = parse(r#"{"endpoint":"x","serverTypes":["a"],"ids":null}"#).unwrap();
        assert_eq!((c.server_types.len(), c.ids), (1, None));
    }

    #[test]
    fn list_checks() {
        let items = ["fsn1".to_string(), "NBG1".to_string(), "fsn1".to_string()];
        let lower = |s: &String| {
            s.bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit())
        };
        let e = each("locations", &items, lower, "want lowercase").unwrap_err();
        assert_eq!(
            e.message,
            r#"config.locations entry "NBG1" is invalid: want lowercase"#
        );
        assert_eq!(e.code.as_deref(), Some("InvalidConfig"));
        assert!(each("locations", &items[..1], lower, "x").is_ok());

        let e = unique("locations", &items).unwrap_err();
        assert_eq!(e.message, r#"config.locations lists "fsn1" twice"#);
        assert!(unique("locations", &items[..2]).is_ok());
        assert!(unique::<u64>("ids", &[1, 2]).is_ok());
        assert_eq!(
            unique("ids", &[5u64, 5]).unwrap_err().message,
            "config.ids lists 5 twice"
        );

        let e = nonempty::<String>("serverTypes", &[]).unwrap_err();
        assert!(
            e.message.starts_with("config.serverTypes is empty"),
            "{}",
            e.message
        );
        assert!(nonempty("serverTypes", &items).is_ok());
    }

    #[test]
    fn endpoints() {
        let ok = [
            (
                "https://api.hetzner.cloud/v1",
                "/v1",
                "https://api.hetzner.cloud/v1",
            ),
            (
                "http://127.0.0.1:8080/v1/",
                "/v1",
                "http://127.0.0.1:8080/v1",
            ),
            ("http://127.0.0.1:8080/", "", "http://127.0.0.1:8080"),
            ("http://h", "", "http://h"),
            ("https://h/proxy/v2//", "/v2", "https://h/proxy/v2"),
        ];
        for (url, suffix, want) in ok {
            assert_eq!(endpoint("endpoint", url, suffix).unwrap(), want, "{url}");
        }
        let bad = [
            ("ftp://x/v1", "/v1", "http:// or https://"),
            ("https://api.hetzner.cloud", "/v1", "end in /v1"),
            ("https://u:p@h/v1", "/v1", "user info"),
            ("https:///v1", "/v1", "want a host"),
            ("https://h/v1?x=1", "/v1", "query"),
            ("https://h/v 1", "", "whitespace"),
            ("h:80", "", "http:// or https://"),
        ];
        for (url, suffix, why) in bad {
            let e = endpoint("endpoint", url, suffix).unwrap_err();
            let msg = &e.message;
            assert!(
                msg.starts_with(&format!("config.endpoint {url:?} is invalid: ")),
                "{msg}"
            );
            assert!(msg.contains(why), "{url}: {msg}");
            assert_eq!(e.code.as_deref(), Some("InvalidConfig"));
        }
    }

    #[test]
    fn placement_choices() {
        let locations = vec!["fsn1".to_string(), "nbg1".to_string()];
        assert_eq!(
            one_of(PlacementField::Region, "nbg1", &locations, "locations").unwrap(),
            "nbg1"
        );
        let e = one_of(PlacementField::Region, "mars1", &locations, "locations").unwrap_err();
        assert_eq!(
            e.message,
            r#"placement.region "mars1" is not one of the configured locations ["fsn1", "nbg1"]"#
        );
        assert_eq!(
            (e.class, e.code.as_deref()),
            (ErrorClass::Permanent, Some("InvalidRegion"))
        );

        let images = vec![("ubuntu".to_string(), "ubuntu-24.04".to_string())];
        let pick = |v| choose(PlacementField::Image, v, &images, |(k, _)| k, "images");
        assert_eq!(pick("ubuntu").unwrap().1, "ubuntu-24.04");
        let e = pick("ubuntu-24.04").unwrap_err();
        assert_eq!(e.code.as_deref(), Some("InvalidImage"));
        assert!(
            e.message.contains(r#"placement.image "ubuntu-24.04""#),
            "{}",
            e.message
        );
    }
}
