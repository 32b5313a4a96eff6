//! Label rules and the label-selector language, as the API reference states them.
//!
//! A plugin's GC listing depends on `label_selector` matching exactly what Hetzner matches,
//! and its create call on the API accepting its mark keys (which carry a DNS prefix), so
//! both are implemented from the reference rather than approximated.

use std::collections::BTreeMap;

/// Why a key is not a valid Hetzner label key, or `Ok`.
pub(crate) fn validate_key(key: &str) -> Result<(), String> {
    let (prefix, name) = match key.split_once('/') {
        Some((p, n)) => (Some(p), n),
        None => (None, key),
    };
    if let Some(prefix) = prefix {
        if prefix.is_empty() || prefix.len() > 253 || !prefix.split('.').all(is_dns_label) {
            return Err(format!("label key '{key}' has an invalid prefix"));
        }
        if prefix == "hetzner.cloud" {
            return Err(format!("label key '{key}' uses the reserved prefix hetzner.cloud/"));
        }
    }
    if name.is_empty() || !is_name_segment(name) {
        return Err(format!("label key '{key}' is invalid"));
    }
    Ok(())
}

/// Why a value is not a valid Hetzner label value, or `Ok`.
pub(crate) fn validate_value(value: &str) -> Result<(), String> {
    if value.is_empty() || is_name_segment(value) {
        Ok(())
    } else {
        Err(format!("label value '{value}' is invalid"))
    }
}

/// 63 characters at most, alphanumeric at both ends, `-_.` and alphanumerics between.
fn is_name_segment(s: &str) -> bool {
    let b = s.as_bytes();
    b.len() <= 63
        && b.first().is_some_and(u8::is_ascii_alphanumeric)
        && b.last().is_some_and(u8::is_ascii_alphanumeric)
        && b.iter().all(|c| c.is_ascii_alphanumeric() || matches!(c, b'-' | b'_' | b'.'))
}

/// An RFC 1123 DNS label: lowercase alphanumerics and `-`, not at either end.
fn is_dns_label(s: &str) -> bool {
    let b = s.as_bytes();
    !b.is_empty()
        && b.len() <= 63
        && b.iter().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == b'-')
        && b[0] != b'-'
        && b[b.len() - 1] != b'-'
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Requirement {
    Equals(String, String),
    NotEquals(String, String),
    Exists(String),
    NotExists(String),
    In(String, Vec<String>),
    NotIn(String, Vec<String>),
}

/// A parsed `label_selector`: every requirement must hold (comma means AND).
///
/// `k!=v` and `k notin (..)` also match resources without `k`, as in the Kubernetes
/// selector language Hetzner's is modelled on (the reference does not say either way).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub(crate) struct Selector(Vec<Requirement>);

impl Selector {
    /// Parse, or say what is wrong (the API answers `invalid_input` for `label_selector`).
    pub(crate) fn parse(input: &str) -> Result<Selector, String> {
        let input = input.trim();
        if input.is_empty() {
            return Ok(Selector::default());
        }
        let mut reqs = Vec::new();
        for term in split_top_level(input)? {
            reqs.push(parse_requirement(term.trim())?);
        }
        Ok(Selector(reqs))
    }

    pub(crate) fn matches(&self, labels: &BTreeMap<String, String>) -> bool {
        self.0.iter().all(|r| match r {
            Requirement::Equals(k, v) => labels.get(k) == Some(v),
            Requirement::NotEquals(k, v) => labels.get(k) != Some(v),
            Requirement::Exists(k) => labels.contains_key(k),
            Requirement::NotExists(k) => !labels.contains_key(k),
            Requirement::In(k, vs) => labels.get(k).is_some_and(|v| vs.contains(v)),
            Requirement::NotIn(k, vs) => labels.get(k).is_none_or(|v| !vs.contains(v)),
        })
    }
}

/// Split on commas outside parentheses, so `k in (a,b),x=y` is two terms.
fn split_top_level(input: &str) -> Result<Vec<&str>, String> {
    let mut terms = Vec::new();
    let mut depth = 0u32;
    let mut start = 0;
    for (i, c) in input.char_indices() {
        match c {
            '(' => depth += 1,
            ')' => {
                depth = depth
                    .checked_sub(1)
                    .ok_or_else(|| "unbalanced ')' in label selector".to_string())?
            }
            ',' if depth == 0 => {
                terms.push(&input[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    if depth != 0 {
        return Err("unbalanced '(' in label selector".into());
    }
    terms.push(&input[start..]);
    Ok(terms)
}

fn parse_requirement(term: &str) -> Result<Requirement, String> {
    if term.is_empty() {
        return Err("empty expression in label selector".into());
    }
    if let Some(key) = term.strip_prefix('!') {
        let key = key.trim();
        validate_key(key)?;
        return Ok(Requirement::NotExists(key.to_string()));
    }
    let key_end =
        term.find(|c: char| c == '=' || c == '!' || c.is_whitespace()).unwrap_or(term.len());
    let key = &term[..key_end];
    validate_key(key)?;
    let key = key.to_string();
    let rest = term[key_end..].trim_start();
    if rest.is_empty() {
        return Ok(Requirement::Exists(key));
    }
    if let Some(v) = rest.strip_prefix("==").or_else(|| rest.strip_prefix('=')) {
        let v = v.trim();
        validate_value(v)?;
        return Ok(Requirement::Equals(key, v.to_string()));
    }
    if let Some(v) = rest.strip_prefix("!=") {
        let v = v.trim();
        validate_value(v)?;
        return Ok(Requirement::NotEquals(key, v.to_string()));
    }
    if let Some(set) = rest.strip_prefix("notin") {
        return Ok(Requirement::NotIn(key, parse_set(set)?));
    }
    if let Some(set) = rest.strip_prefix("in") {
        return Ok(Requirement::In(key, parse_set(set)?));
    }
    Err(format!("invalid expression '{term}' in label selector"))
}

fn parse_set(s: &str) -> Result<Vec<String>, String> {
    let inner = s
        .trim()
        .strip_prefix('(')
        .and_then(|s| s.strip_suffix(')'))
        .ok_or_else(|| format!("expected a parenthesised set, got '{}'", s.trim()))?;
    let mut values = Vec::new();
    for v in inner.split(',') {
        let v = v.trim();
        validate_value(v)?;
        values.push(v.to_string());
    }
    Ok(values)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_and_values_follow_the_reference() {
        for ok in [
            "egress.proxy-operator.dev/uid",
            "egress.proxy-operator.dev/managed",
            "just-a-key",
            "example.com/my",
            "A_b.c-9",
        ] {
            assert_eq!(validate_key(ok), Ok(()), "{ok}");
        }
        let long_name = "a".repeat(64);
        let long_prefix = format!("{}/k", "a.".repeat(127));
        for bad in [
            "",
            "-a",
            "a-",
            "a/b/c",
            "/k",
            "Upper.Case/k",
            "hetzner.cloud/x",
            long_name.as_str(),
            long_prefix.as_str(),
            "a b",
        ] {
            assert!(validate_key(bad).is_err(), "{bad:?}");
        }
        for ok in ["", "true", "3f6c5a4e-1b2c-4d5e-8f90-a1b2c3d4e5f6", "v1.2_x"] {
            assert_eq!(validate_value(ok), Ok(()), "{ok}");
        }
        for bad in ["-x", "x.", "a/b", &"v".repeat(64)] {
            assert!(validate_value(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn selector_parse_errors() {
        for bad in ["a=b,", ",a", "a in (b", "a in b", "a)", "a ~ b", "a=b c", "!", "-k=v", "k=-v"]
        {
            assert!(Selector::parse(bad).is_err(), "{bad:?}");
        }
        assert_eq!(Selector::parse("  "), Ok(Selector::default()));
    }
}
