//! The test of the cause of issue 27's "CRD schemas" gap: every field a user writes into a
//! Proxy or a ProxyPool is bounded by the schema the API server enforces. It walks the
//! generated schemas, so a field added later without a bound fails here, named by its path.
//!
//! The rules, per schema node under `spec`:
//! - an integer (or number) has a `minimum` and a `maximum`;
//! - an array has `maxItems` (and its items are walked);
//! - a string has `maxLength`, or an `enum`, or a `format` whose values have a fixed
//!   greatest length (`date-time`). A `pattern` alone is not a bound (`^[a-z]+$` takes a
//!   megabyte), so a patterned string needs `maxLength` too;
//! - a map (`additionalProperties`) has `maxProperties` (and its values are walked); an
//!   object that keeps unknown fields (`x-kubernetes-preserve-unknown-fields`) is refused;
//! - an object's declared properties are walked.
//!
//! `status` is exempt: only the operator writes it (the `*/status` subresources are granted
//! to the operator's ClusterRole alone; `proxy_user_role.yaml` and the built-in roles it
//! aggregates into give tenants no `status` verb), from values it has already bounded, and
//! its conditions carry the metav1.Condition bounds anyway (`schema::conditions`).
//! `metadata` is the API server's own. The ProviderHealth CRD has no user-written field.

use serde_json::Value;

/// The JSON paths (`.spec.placements[*].weight`) of every unbounded node under `schema`.
fn unbounded(schema: &Value, path: &str, out: &mut Vec<String>) {
    let has = |k: &str| schema.get(k).is_some();
    if schema.get("x-kubernetes-preserve-unknown-fields") == Some(&Value::Bool(true)) {
        out.push(format!("{path}: keeps unknown fields"));
    }
    match schema.get("type").and_then(Value::as_str) {
        Some("integer" | "number") => {
            for k in ["minimum", "maximum"] {
                if !has(k) {
                    out.push(format!("{path}: integer without {k}"));
                }
            }
        }
        Some("string") => {
            let sized_format = matches!(
                schema.get("format").and_then(Value::as_str),
                Some("date-time")
            );
            if !(has("maxLength") || has("enum") || sized_format) {
                out.push(format!("{path}: string without maxLength or enum"));
            }
        }
        Some("array") => {
            if !has("maxItems") {
                out.push(format!("{path}: array without maxItems"));
            }
            if let Some(items) = schema.get("items") {
                unbounded(items, &format!("{path}[*]"), out);
            }
        }
        Some("object") | None => {
            if let Some(values) = schema.get("additionalProperties").filter(|v| v.is_object()) {
                if !has("maxProperties") {
                    out.push(format!("{path}: map without maxProperties"));
                }
                unbounded(values, &format!("{path}[*]"), out);
            }
            if let Some(props) = schema.get("properties").and_then(Value::as_object) {
                for (name, sub) in props {
                    unbounded(sub, &format!("{path}.{name}"), out);
                }
            }
        }
        Some(_) => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::{Proxy, proxy_pool};
    use kube::CustomResourceExt;
    use serde_json::json;

    fn spec_schema(
        crd: &k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition,
    ) -> Value {
        let s = serde_json::to_value(&crd.spec.versions[0].schema).unwrap();
        s["openAPIV3Schema"]["properties"]["spec"].clone()
    }

    /// Every field of the Proxy and ProxyPool specs has a bound the API server enforces.
    #[test]
    fn every_user_written_field_of_proxy_and_proxypool_is_bounded() {
        let mut out = Vec::new();
        for (kind, schema) in [
            ("Proxy", spec_schema(&Proxy::crd())),
            ("ProxyPool", spec_schema(&proxy_pool::crd())),
        ] {
            assert!(schema.is_object(), "{kind}: no spec schema");
            let mut found = Vec::new();
            unbounded(&schema, ".spec", &mut found);
            out.extend(found.into_iter().map(|f| format!("{kind} {f}")));
        }
        assert!(
            out.is_empty(),
            "unbounded fields (give each a maximum, maxItems, maxLength or maxProperties, \
             with the reason in its doc comment):\n  {}",
            out.join("\n  ")
        );
    }

    /// The walker finds what it is meant to find, at the right path.
    #[test]
    fn the_walker_names_each_kind_of_unbounded_node() {
        let schema = json!({
            "type": "object",
            "properties": {
                "n": {"type": "integer", "minimum": 0},
                "ok": {"type": "integer", "minimum": 0, "maximum": 1},
                "s": {"type": "string", "pattern": "^[a-z]+$"},
                "e": {"type": "string", "enum": ["A"]},
                "t": {"type": "string", "format": "date-time"},
                "l": {"type": "array", "items": {"type": "string", "maxLength": 3}},
                "m": {"type": "object", "additionalProperties": {"type": "string"}},
                "o": {"type": "object", "x-kubernetes-preserve-unknown-fields": true},
                "b": {"type": "boolean"},
                "deep": {"type": "array", "maxItems": 2, "items": {
                    "type": "object", "properties": {"w": {"type": "integer", "maximum": 1}}
                }},
            },
        });
        let mut out = Vec::new();
        unbounded(&schema, ".spec", &mut out);
        out.sort();
        assert_eq!(
            out,
            [
                ".spec.deep[*].w: integer without minimum",
                ".spec.l: array without maxItems",
                ".spec.m: map without maxProperties",
                ".spec.m[*]: string without maxLength or enum",
                ".spec.n: integer without maximum",
                ".spec.o: keeps unknown fields",
                ".spec.s: string without maxLength or enum",
            ]
        );
    }
}
