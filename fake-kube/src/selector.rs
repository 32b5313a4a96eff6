//! Label and field selectors.
//!
//! Controllers narrow their watches with selectors, so a fake that ignored them would hand
//! a controller objects a real cluster never would. Label selectors are the operator's own
//! parser (`egress_contract::selector`, the grammar of `k8s.io/apimachinery/pkg/labels`),
//! so the fake and the discovery API can never accept different strings; field selectors
//! support `=`, `==` and `!=` on dotted paths.

use serde_json::Value;
use std::collections::BTreeMap;

pub use egress_contract::selector::LabelSelector;

/// Parses `?labelSelector=`, the error as the API server's message.
pub fn parse_labels(input: &str) -> Result<LabelSelector, String> {
    LabelSelector::parse(input).map_err(|e| e.to_string())
}

/// Whether `selector` selects `obj`, by its `metadata.labels`.
pub fn selects(selector: &LabelSelector, obj: &Value) -> bool {
    selector.is_empty() || selector.matches(Some(&labels_of(obj)))
}

pub fn labels_of(obj: &Value) -> BTreeMap<String, String> {
    obj.pointer("/metadata/labels")
        .and_then(Value::as_object)
        .map(|m| {
            m.iter()
                .filter_map(|(k, v)| v.as_str().map(|s| (k.clone(), s.to_string())))
                .collect()
        })
        .unwrap_or_default()
}

/// A parsed field selector.
#[derive(Debug, Clone, Default)]
pub struct FieldSelector {
    reqs: Vec<(String, bool, String)>,
}

impl FieldSelector {
    pub fn parse(input: &str) -> Result<Self, String> {
        let mut reqs = Vec::new();
        for part in input.split(',').map(str::trim).filter(|p| !p.is_empty()) {
            let (field, eq, value) = if let Some((f, v)) = part.split_once("!=") {
                (f, false, v)
            } else if let Some((f, v)) = part.split_once("==") {
                (f, true, v)
            } else if let Some((f, v)) = part.split_once('=') {
                (f, true, v)
            } else {
                return Err(format!("invalid field selector requirement {part:?}"));
            };
            reqs.push((field.trim().to_string(), eq, value.trim().to_string()));
        }
        Ok(Self { reqs })
    }

    /// Unknown fields compare as the empty string, which is more lenient than the real
    /// server (it rejects fields a kind does not index) but never matches more than asked.
    pub fn matches_object(&self, obj: &Value) -> bool {
        self.reqs.iter().all(|(field, eq, want)| {
            let mut cur = obj;
            let mut found = true;
            for seg in field.split('.') {
                match cur.get(seg) {
                    Some(v) => cur = v,
                    None => {
                        found = false;
                        break;
                    }
                }
            }
            let have = if !found || cur.is_null() {
                String::new()
            } else {
                match cur {
                    Value::String(s) => s.clone(),
                    other => other.to_string(),
                }
            };
            (have == *want) == *eq
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn labels_select_by_metadata_labels() {
        let obj =
            serde_json::json!({"metadata": {"name": "a", "labels": {"app": "web", "n": "5"}}});
        for (sel, want) in [
            ("", true),
            ("app=web", true),
            ("app!=web", false),
            ("n>3", true),
            ("!app", false),
        ] {
            assert_eq!(selects(&parse_labels(sel).unwrap(), &obj), want, "{sel}");
        }
        let bare = serde_json::json!({"metadata": {"name": "b"}});
        assert!(selects(&parse_labels("missing notin (x)").unwrap(), &bare));
        assert!(!selects(&parse_labels("app").unwrap(), &bare));
        let err = parse_labels("app in web").unwrap_err();
        assert!(err.contains("web") || err.contains("("), "{err}");
    }

    #[test]
    fn field_selector() {
        let obj =
            serde_json::json!({"metadata": {"name": "a", "namespace": "ns"}, "type": "Opaque"});
        for (sel, want) in [
            ("metadata.name=a", true),
            ("metadata.name!=a", false),
            ("metadata.namespace==ns,metadata.name=a", true),
            ("type=Opaque", true),
            ("spec.nodeName=", true),
        ] {
            assert_eq!(
                FieldSelector::parse(sel).unwrap().matches_object(&obj),
                want,
                "{sel}"
            );
        }
    }
}
