//! Structural-schema handling for custom resources: defaulting, pruning and validation.
//!
//! A real API server drops fields a CRD schema does not declare and rejects values of the
//! wrong type. An operator that writes an undeclared status field would "work" against a
//! fake that kept it and silently lose it on a cluster, so the fake prunes and validates
//! too. Supported: `type`, `properties`, `additionalProperties`, `items`, `required`,
//! `enum`, `nullable`, `default`, `minimum`/`maximum`, `minLength`/`maxLength`,
//! `minItems`/`maxItems`, `x-kubernetes-preserve-unknown-fields`,
//! `x-kubernetes-int-or-string`, `x-kubernetes-embedded-resource`. Not supported:
//! `pattern`, `format`, `oneOf`/`anyOf`/`allOf`/`not`, CEL validation rules.

use serde_json::{Map, Value};

/// A problem found while validating: (reason, field path, message).
pub type Cause = (String, String, String);

/// Defaults, prunes and validates `obj` (a whole custom resource) against its version's schema.
/// Returns the validation causes and the paths of the fields that were pruned.
pub fn normalize(schema: &Value, obj: &mut Value) -> (Vec<Cause>, Vec<String>) {
    let mut causes = Vec::new();
    let mut pruned = Vec::new();
    let Some(root) = obj.as_object_mut() else {
        causes.push((
            "FieldValueTypeInvalid".into(),
            "".into(),
            "must be an object".into(),
        ));
        return (causes, pruned);
    };
    let props = schema.get("properties").and_then(Value::as_object);
    let preserve = preserves_unknown(schema);
    let keys: Vec<String> = root.keys().cloned().collect();
    for k in keys {
        if matches!(k.as_str(), "apiVersion" | "kind" | "metadata") {
            continue;
        }
        match props.and_then(|p| p.get(&k)) {
            Some(sub) => {
                let mut v = root.remove(&k).unwrap_or(Value::Null);
                if walk(sub, &mut v, &k, &mut causes, &mut pruned) {
                    root.insert(k, v);
                }
            }
            None if preserve => {}
            None => {
                root.remove(&k);
                pruned.push(k);
            }
        }
    }
    apply_defaults(schema, root);
    check_required(schema, root, "", &mut causes);
    (causes, pruned)
}

fn preserves_unknown(schema: &Value) -> bool {
    schema
        .get("x-kubernetes-preserve-unknown-fields")
        .and_then(Value::as_bool)
        == Some(true)
}

fn join(path: &str, k: &str) -> String {
    if path.is_empty() {
        k.to_string()
    } else {
        format!("{path}.{k}")
    }
}

fn apply_defaults(schema: &Value, obj: &mut Map<String, Value>) {
    if let Some(props) = schema.get("properties").and_then(Value::as_object) {
        for (k, sub) in props {
            if !obj.contains_key(k)
                && let Some(d) = sub.get("default")
            {
                let mut d = d.clone();
                let mut ignored = (Vec::new(), Vec::new());
                walk(sub, &mut d, k, &mut ignored.0, &mut ignored.1);
                obj.insert(k.clone(), d);
            }
        }
    }
}

fn check_required(schema: &Value, obj: &Map<String, Value>, path: &str, causes: &mut Vec<Cause>) {
    if let Some(req) = schema.get("required").and_then(Value::as_array) {
        for r in req.iter().filter_map(Value::as_str) {
            if !obj.contains_key(r) {
                causes.push((
                    "FieldValueRequired".into(),
                    join(path, r),
                    "Required value".into(),
                ));
            }
        }
    }
}

fn type_name(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "boolean",
        Value::Number(n) if n.is_i64() || n.is_u64() => "integer",
        Value::Number(_) => "number",
        Value::String(_) => "string",
        Value::Array(_) => "array",
        Value::Object(_) => "object",
    }
}

/// Returns false when the value should be dropped (a null where null is not allowed).
fn walk(
    schema: &Value,
    v: &mut Value,
    path: &str,
    causes: &mut Vec<Cause>,
    pruned: &mut Vec<String>,
) -> bool {
    if v.is_null() {
        return schema.get("nullable").and_then(Value::as_bool) == Some(true);
    }
    let int_or_string = schema
        .get("x-kubernetes-int-or-string")
        .and_then(Value::as_bool)
        == Some(true);
    if int_or_string {
        if !matches!(type_name(v), "integer" | "string") {
            causes.push(type_error(path, v, "integer or string"));
        }
        return true;
    }
    if let Some(want) = schema.get("type").and_then(Value::as_str) {
        let have = type_name(v);
        let ok = have == want || (want == "number" && have == "integer");
        if !ok {
            causes.push(type_error(path, v, want));
            return true;
        }
    }
    if let Some(allowed) = schema.get("enum").and_then(Value::as_array)
        && !allowed.contains(v)
    {
        let list: Vec<String> = allowed.iter().map(Value::to_string).collect();
        causes.push((
            "FieldValueNotSupported".into(),
            path.to_string(),
            format!(
                "Unsupported value: {v}: supported values: {}",
                list.join(", ")
            ),
        ));
    }
    let num = |k: &str| schema.get(k).and_then(Value::as_f64);
    let invalid = |msg: String| ("FieldValueInvalid".to_string(), path.to_string(), msg);
    match v {
        Value::Number(n) => {
            let x = n.as_f64().unwrap_or(0.0);
            if let Some(min) = num("minimum")
                && x < min
            {
                causes.push(invalid(format!(
                    "Invalid value: {n}: {path} in body should be greater than or equal to {min}"
                )));
            }
            if let Some(max) = num("maximum")
                && x > max
            {
                causes.push(invalid(format!(
                    "Invalid value: {n}: {path} in body should be less than or equal to {max}"
                )));
            }
        }
        Value::String(s) => {
            let len = s.chars().count() as f64;
            if let Some(min) = num("minLength")
                && len < min
            {
                causes.push(invalid(format!(
                    "Invalid value: {s:?}: {path} in body should be at least {min} chars long"
                )));
            }
            if let Some(max) = num("maxLength")
                && len > max
            {
                causes.push(invalid(format!(
                    "Too long: may not be more than {max} bytes"
                )));
            }
        }
        Value::Array(items) => {
            let len = items.len() as f64;
            if let Some(min) = num("minItems")
                && len < min
            {
                causes.push(invalid(format!(
                    "{path} in body should have at least {min} items"
                )));
            }
            if let Some(max) = num("maxItems")
                && len > max
            {
                causes.push((
                    "FieldValueTooMany".into(),
                    path.to_string(),
                    format!("Too many: {len}: must have at most {max} items"),
                ));
            }
            if let Some(item_schema) = schema.get("items") {
                let mut kept = Vec::with_capacity(items.len());
                for (i, mut item) in std::mem::take(items).into_iter().enumerate() {
                    if walk(
                        item_schema,
                        &mut item,
                        &format!("{path}[{i}]"),
                        causes,
                        pruned,
                    ) {
                        kept.push(item);
                    }
                }
                *items = kept;
            }
        }
        Value::Object(map) => {
            let embedded = schema
                .get("x-kubernetes-embedded-resource")
                .and_then(Value::as_bool)
                == Some(true);
            let props = schema.get("properties").and_then(Value::as_object);
            let additional = schema.get("additionalProperties");
            let preserve = preserves_unknown(schema);
            let keys: Vec<String> = map.keys().cloned().collect();
            for k in keys {
                if embedded && matches!(k.as_str(), "apiVersion" | "kind" | "metadata") {
                    continue;
                }
                let sub = props
                    .and_then(|p| p.get(&k))
                    .or_else(|| additional.filter(|a| a.is_object()));
                let child_path = join(path, &k);
                match sub {
                    Some(sub) => {
                        let mut child = map.remove(&k).unwrap_or(Value::Null);
                        if walk(sub, &mut child, &child_path, causes, pruned) {
                            map.insert(k, child);
                        }
                    }
                    None if preserve || additional.and_then(Value::as_bool) == Some(true) => {}
                    None => {
                        map.remove(&k);
                        pruned.push(child_path);
                    }
                }
            }
            apply_defaults(schema, map);
            check_required(schema, map, path, causes);
        }
        _ => {}
    }
    true
}

fn type_error(path: &str, v: &Value, want: &str) -> Cause {
    (
        "FieldValueTypeInvalid".into(),
        path.to_string(),
        format!(
            "Invalid value: \"{}\": {path} in body must be of type {want}: \"{}\"",
            type_name(v),
            type_name(v)
        ),
    )
}

/// How a list at some path merges under server-side apply.
#[derive(Debug, Clone, PartialEq)]
pub enum ListType {
    Atomic,
    Set,
    Map(Vec<String>),
}

/// Whether a map at some path is owned as a whole under server-side apply.
pub fn map_is_atomic(schema: Option<&Value>) -> bool {
    schema
        .and_then(|s| s.get("x-kubernetes-map-type"))
        .and_then(Value::as_str)
        == Some("atomic")
}

pub fn list_type(schema: Option<&Value>) -> ListType {
    let Some(s) = schema else {
        return ListType::Atomic;
    };
    match s.get("x-kubernetes-list-type").and_then(Value::as_str) {
        Some("set") => ListType::Set,
        Some("map") => ListType::Map(
            s.get("x-kubernetes-list-map-keys")
                .and_then(Value::as_array)
                .map(|a| {
                    a.iter()
                        .filter_map(|k| k.as_str().map(String::from))
                        .collect()
                })
                .unwrap_or_default(),
        ),
        _ => ListType::Atomic,
    }
}

/// Schema for the parts of `metadata` that merge rather than replace under apply.
pub fn metadata_schema() -> Value {
    serde_json::json!({
        "type": "object",
        "properties": {
            "finalizers": {"type": "array", "items": {"type": "string"}, "x-kubernetes-list-type": "set"},
            "ownerReferences": {
                "type": "array",
                "items": {"type": "object"},
                "x-kubernetes-list-type": "map",
                "x-kubernetes-list-map-keys": ["uid"],
            },
        },
    })
}

/// Child schema of an object schema for a field.
pub fn child<'a>(schema: Option<&'a Value>, field: &str) -> Option<&'a Value> {
    let s = schema?;
    s.get("properties")
        .and_then(|p| p.get(field))
        .or_else(|| s.get("additionalProperties").filter(|a| a.is_object()))
}

/// Item schema of an array schema.
pub fn items(schema: Option<&Value>) -> Option<&Value> {
    schema?.get("items")
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn prunes_defaults_and_validates() {
        let schema = json!({
            "type": "object",
            "properties": {
                "spec": {
                    "type": "object",
                    "required": ["port"],
                    "properties": {
                        "port": {"type": "integer", "minimum": 1},
                        "mode": {"type": "string", "enum": ["a", "b"], "default": "a"},
                        "free": {"type": "object", "x-kubernetes-preserve-unknown-fields": true},
                        "tags": {"type": "object", "additionalProperties": {"type": "string"}},
                    },
                },
            },
        });
        let mut obj = json!({"apiVersion": "x/v1", "kind": "X", "metadata": {"name": "a"},
            "spec": {"port": 80, "junk": 1, "free": {"any": {"thing": 1}}, "tags": {"a": "b"}}, "other": 1});
        let (causes, mut pruned) = normalize(&schema, &mut obj);
        assert!(causes.is_empty(), "{causes:?}");
        pruned.sort();
        assert_eq!(pruned, vec!["other".to_string(), "spec.junk".to_string()]);
        assert_eq!(obj["spec"]["mode"], "a");
        assert_eq!(obj["spec"]["free"]["any"]["thing"], 1);

        let mut bad = json!({"spec": {"port": "x", "mode": "c"}});
        let (causes, _) = normalize(&schema, &mut bad);
        let mut fields: Vec<&str> = causes.iter().map(|c| c.1.as_str()).collect();
        fields.sort();
        assert_eq!(fields, vec!["spec.mode", "spec.port"]);
        let mut missing = json!({"spec": {}});
        let (causes, _) = normalize(&schema, &mut missing);
        assert_eq!(causes[0].0, "FieldValueRequired");
    }
}
