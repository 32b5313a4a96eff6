//! Field ownership (`metadata.managedFields`) and server-side apply.
//!
//! Leader election (kube-lease-manager) and operators that use server-side apply depend on
//! the server refusing to let one manager silently overwrite a field another manager set,
//! and on apply removing fields a manager stopped applying. This module keeps a field set
//! per (manager, operation, subresource) in the real `FieldsV1` format and implements:
//!
//! * apply: conflicts (409, reason `Conflict`, one `FieldManagerConflict` cause per field)
//!   when another manager owns a field with a different value; `force` takes ownership;
//!   fields the same manager applied before and no longer applies are removed unless some
//!   other manager also owns them; shared ownership when values agree.
//! * update operations (PUT and the non-apply patches): the writer takes ownership of every
//!   field it changed, other managers lose it, removed fields leave every set.
//!
//! Simplifications: list and map merge types come from the CRD schema
//! (`x-kubernetes-list-type`, `x-kubernetes-list-map-keys`, `x-kubernetes-map-type`) and
//! from a built-in table for `metadata` (finalizers is a set, ownerReferences a map keyed by
//! uid); every other list of a built-in kind is atomic. There is no version conversion of
//! field sets, and a `null` in an applied configuration removes the field without owning it.

use crate::schema::{self, ListType};
use serde_json::{Map, Value, json};
use std::collections::BTreeSet;

#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Pe {
    /// A field of an object: `f:name`.
    F(String),
    /// An element of a map-list, by its key fields as canonical JSON: `k:{"name":"x"}`.
    K(String),
    /// An element of a set-list, by value as JSON: `v:"x"`.
    V(String),
    /// An element of a list by position: `i:0` (read from clients' field sets only).
    I(usize),
}

pub type Path = Vec<Pe>;
pub type FieldSet = BTreeSet<Path>;

/// Which part of an object a write may touch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scope {
    /// The main resource; `status` excluded when the kind has a status subresource.
    Main { exclude_status: bool },
    /// The `/status` subresource: only `status`.
    Status,
    /// The `/scale` subresource of a custom resource. Its one writable field,
    /// `specReplicasPath`, is under `spec` (CRD validation sees to that), and its entries
    /// name the parent's field as the real server's scale handler maps them.
    Scale,
}

impl Scope {
    pub fn subresource(self) -> &'static str {
        match self {
            Scope::Main { .. } => "",
            Scope::Status => "status",
            Scope::Scale => "scale",
        }
    }

    fn includes_root(self, key: &str) -> bool {
        match (self, key) {
            (_, "apiVersion" | "kind") => false,
            (Scope::Status, k) => k == "status",
            (Scope::Scale, k) => k == "spec",
            (
                Scope::Main {
                    exclude_status: true,
                },
                "status",
            ) => false,
            _ => true,
        }
    }
}

const OWNED_METADATA: [&str; 4] = ["labels", "annotations", "finalizers", "ownerReferences"];

fn canonical(v: &Value) -> String {
    // serde_json maps may keep insertion order; sort keys so equal keys print equally.
    fn sort(v: &Value) -> Value {
        match v {
            Value::Object(m) => {
                let mut keys: Vec<&String> = m.keys().collect();
                keys.sort();
                let mut out = Map::new();
                for k in keys {
                    out.insert(k.clone(), sort(&m[k]));
                }
                Value::Object(out)
            }
            Value::Array(a) => Value::Array(a.iter().map(sort).collect()),
            other => other.clone(),
        }
    }
    sort(v).to_string()
}

fn map_key(item: &Value, keys: &[String]) -> Option<String> {
    let obj = item.as_object()?;
    if keys.is_empty() {
        return None;
    }
    let mut k = Map::new();
    for name in keys {
        k.insert(name.clone(), obj.get(name)?.clone());
    }
    Some(canonical(&Value::Object(k)))
}

/// The root schema to navigate with: the CRD schema with `metadata` replaced by the
/// built-in metadata merge rules.
pub fn root_schema(crd_schema: Option<&Value>) -> Value {
    let mut root = crd_schema
        .cloned()
        .unwrap_or_else(|| json!({"type": "object"}));
    if !root.get("properties").is_some_and(Value::is_object) {
        root["properties"] = json!({});
    }
    root["properties"]["metadata"] = schema::metadata_schema();
    root
}

/// Every field `obj` sets within `scope`.
pub fn fields_of(obj: &Value, root: &Value, scope: Scope) -> FieldSet {
    let mut out = FieldSet::new();
    let Some(map) = obj.as_object() else {
        return out;
    };
    for (k, v) in map {
        if !scope.includes_root(k) || v.is_null() {
            continue;
        }
        let sub = schema::child(Some(root), k);
        if k == "metadata" {
            if let Some(meta) = v.as_object() {
                for mk in OWNED_METADATA {
                    if let Some(mv) = meta.get(mk).filter(|v| !v.is_null()) {
                        let path = vec![Pe::F("metadata".into()), Pe::F(mk.into())];
                        walk(mv, schema::child(sub, mk), path, &mut out);
                    }
                }
            }
            continue;
        }
        walk(v, sub, vec![Pe::F(k.clone())], &mut out);
    }
    out
}

fn walk(v: &Value, schema: Option<&Value>, path: Path, out: &mut FieldSet) {
    match v {
        Value::Object(m) if !m.is_empty() && !schema::map_is_atomic(schema) => {
            for (k, child) in m {
                if child.is_null() {
                    continue;
                }
                let mut p = path.clone();
                p.push(Pe::F(k.clone()));
                walk(child, schema::child(schema, k), p, out);
            }
        }
        Value::Array(items) => match schema::list_type(schema) {
            ListType::Atomic => {
                out.insert(path);
            }
            ListType::Set => {
                for item in items {
                    let mut p = path.clone();
                    p.push(Pe::V(canonical(item)));
                    out.insert(p);
                }
            }
            ListType::Map(keys) => {
                for item in items {
                    let Some(key) = map_key(item, &keys) else {
                        continue;
                    };
                    let mut p = path.clone();
                    p.push(Pe::K(key));
                    out.insert(p.clone());
                    walk(item, schema::items(schema), p, out);
                }
            }
        },
        _ => {
            out.insert(path);
        }
    }
}

fn key_matches(item: &Value, key: &str) -> bool {
    let Ok(Value::Object(k)) = serde_json::from_str::<Value>(key) else {
        return false;
    };
    k.iter().all(|(name, want)| item.get(name) == Some(want))
}

fn find_elem(items: &[Value], pe: &Pe) -> Option<usize> {
    match pe {
        Pe::K(key) => items.iter().position(|it| key_matches(it, key)),
        Pe::V(v) => {
            let want: Value = serde_json::from_str(v).ok()?;
            items.iter().position(|it| *it == want)
        }
        Pe::I(i) => (*i < items.len()).then_some(*i),
        Pe::F(_) => None,
    }
}

pub fn value_at<'a>(obj: &'a Value, path: &[Pe]) -> Option<&'a Value> {
    let mut cur = obj;
    for pe in path {
        cur = match (pe, cur) {
            (Pe::F(k), Value::Object(m)) => m.get(k)?,
            (pe, Value::Array(items)) => &items[find_elem(items, pe)?],
            _ => return None,
        };
    }
    Some(cur)
}

fn value_at_mut<'a>(obj: &'a mut Value, path: &[Pe]) -> Option<&'a mut Value> {
    let mut cur = obj;
    for pe in path {
        cur = match (pe, cur) {
            (Pe::F(k), Value::Object(m)) => m.get_mut(k)?,
            (pe, Value::Array(items)) => {
                let i = find_elem(items, pe)?;
                &mut items[i]
            }
            _ => return None,
        };
    }
    Some(cur)
}

fn remove_path(obj: &mut Value, path: &[Pe]) {
    let Some((last, parent)) = path.split_last() else {
        return;
    };
    match (last, value_at_mut(obj, parent)) {
        (Pe::F(k), Some(Value::Object(m))) => {
            m.remove(k);
        }
        (pe, Some(Value::Array(items))) => {
            if let Some(i) = find_elem(items, pe) {
                items.remove(i);
            }
        }
        _ => {}
    }
}

/// Merges an applied configuration into the live object, following the list types.
fn merge_apply(live: &mut Value, cfg: &Value, schema: Option<&Value>) {
    match (live, cfg) {
        (Value::Object(l), Value::Object(c)) if !schema::map_is_atomic(schema) => {
            for (k, cv) in c {
                if cv.is_null() {
                    l.remove(k);
                    continue;
                }
                let sub = schema::child(schema, k);
                match l.get_mut(k) {
                    Some(lv) => merge_apply(lv, cv, sub),
                    None => {
                        l.insert(k.clone(), cv.clone());
                    }
                }
            }
        }
        (Value::Array(l), Value::Array(c)) => match schema::list_type(schema) {
            ListType::Atomic => *l = c.clone(),
            ListType::Set => {
                for item in c {
                    if !l.contains(item) {
                        l.push(item.clone());
                    }
                }
            }
            ListType::Map(keys) => {
                for item in c {
                    let pos = map_key(item, &keys)
                        .and_then(|k| l.iter().position(|it| key_matches(it, &k)));
                    match pos {
                        Some(i) => merge_apply(&mut l[i], item, schema::items(schema)),
                        None => l.push(item.clone()),
                    }
                }
            }
        },
        (live, cfg) => *live = cfg.clone(),
    }
}

/// Applies `cfg` to the part of `live` that `scope` covers: only the owned metadata fields
/// and the scoped top-level fields take part.
fn merge_scoped(live: &mut Value, cfg: &Value, root: &Value, scope: Scope) {
    let Some(c) = cfg.as_object() else { return };
    if !live.is_object() {
        *live = json!({});
    }
    for (k, cv) in c {
        if !scope.includes_root(k) {
            continue;
        }
        let sub = schema::child(Some(root), k);
        if k == "metadata" {
            let Some(cm) = cv.as_object() else { continue };
            if !live.get("metadata").is_some_and(Value::is_object) {
                live["metadata"] = json!({});
            }
            for mk in OWNED_METADATA {
                if let Some(mv) = cm.get(mk) {
                    let meta = live["metadata"]
                        .as_object_mut()
                        .expect("metadata is an object");
                    if mv.is_null() {
                        meta.remove(mk);
                    } else if let Some(lv) = meta.get_mut(mk) {
                        merge_apply(lv, mv, schema::child(sub, mk));
                    } else {
                        meta.insert(mk.to_string(), mv.clone());
                    }
                }
            }
            continue;
        }
        let l = live.as_object_mut().expect("checked above");
        if cv.is_null() {
            l.remove(k);
        } else if let Some(lv) = l.get_mut(k) {
            merge_apply(lv, cv, sub);
        } else {
            l.insert(k.clone(), cv.clone());
        }
    }
}

/// One `managedFields` entry.
#[derive(Debug, Clone)]
pub struct Entry {
    pub manager: String,
    pub operation: String,
    pub api_version: String,
    pub time: String,
    pub subresource: String,
    pub fields: FieldSet,
}

impl Entry {
    fn same(&self, manager: &str, operation: &str, subresource: &str) -> bool {
        self.manager == manager && self.operation == operation && self.subresource == subresource
    }
}

pub fn parse_entries(obj: &Value) -> Vec<Entry> {
    let Some(list) = obj
        .pointer("/metadata/managedFields")
        .and_then(Value::as_array)
    else {
        return vec![];
    };
    list.iter()
        .map(|e| {
            let s = |k: &str| e.get(k).and_then(Value::as_str).unwrap_or("").to_string();
            let mut fields = FieldSet::new();
            if let Some(f) = e.get("fieldsV1") {
                parse_fields_v1(f, &mut vec![], &mut fields);
            }
            Entry {
                manager: s("manager"),
                operation: s("operation"),
                api_version: s("apiVersion"),
                time: s("time"),
                subresource: s("subresource"),
                fields,
            }
        })
        .collect()
}

fn parse_pe(key: &str) -> Option<Pe> {
    let (kind, rest) = key.split_once(':')?;
    Some(match kind {
        "f" => Pe::F(rest.to_string()),
        "k" => Pe::K(canonical(&serde_json::from_str(rest).ok()?)),
        "v" => Pe::V(canonical(&serde_json::from_str(rest).ok()?)),
        "i" => Pe::I(rest.parse().ok()?),
        _ => return None,
    })
}

fn parse_fields_v1(v: &Value, prefix: &mut Path, out: &mut FieldSet) {
    let Some(m) = v.as_object() else { return };
    if (m.is_empty() || m.contains_key(".")) && !prefix.is_empty() {
        out.insert(prefix.clone());
    }
    for (k, child) in m {
        if k == "." {
            continue;
        }
        if let Some(pe) = parse_pe(k) {
            prefix.push(pe);
            parse_fields_v1(child, prefix, out);
            prefix.pop();
        }
    }
}

pub fn to_fields_v1(set: &FieldSet) -> Value {
    let mut root = Map::new();
    for path in set {
        let mut node = &mut root;
        for pe in path {
            let key = match pe {
                Pe::F(f) => format!("f:{f}"),
                Pe::K(k) => format!("k:{k}"),
                Pe::V(v) => format!("v:{v}"),
                Pe::I(i) => format!("i:{i}"),
            };
            node = node
                .entry(key)
                .or_insert_with(|| json!({}))
                .as_object_mut()
                .expect("field set nodes are objects");
        }
        node.insert(".".into(), json!({}));
    }
    // A member with no children is written as `{}`, not `{".": {}}`.
    fn tidy(m: &mut Map<String, Value>) {
        for v in m.values_mut() {
            if let Value::Object(child) = v {
                if child.len() == 1 && child.contains_key(".") {
                    child.clear();
                } else {
                    tidy(child);
                }
            }
        }
    }
    tidy(&mut root);
    Value::Object(root)
}

pub fn write_entries(obj: &mut Value, entries: &[Entry]) {
    let list: Vec<Value> = entries
        .iter()
        .filter(|e| !e.fields.is_empty())
        .map(|e| {
            let mut v = json!({
                "manager": e.manager,
                "operation": e.operation,
                "apiVersion": e.api_version,
                "time": e.time,
                "fieldsType": "FieldsV1",
                "fieldsV1": to_fields_v1(&e.fields),
            });
            if !e.subresource.is_empty() {
                v["subresource"] = json!(e.subresource);
            }
            v
        })
        .collect();
    let meta = obj
        .as_object_mut()
        .and_then(|o| o.get_mut("metadata"))
        .and_then(Value::as_object_mut);
    if let Some(meta) = meta {
        if list.is_empty() {
            meta.remove("managedFields");
        } else {
            meta.insert("managedFields".into(), Value::Array(list));
        }
    }
}

/// What a write is and who makes it.
pub struct Writer<'a> {
    pub manager: &'a str,
    pub api_version: &'a str,
    pub now: &'a str,
    pub scope: Scope,
}

/// Records an update operation (PUT, merge/JSON/strategic patch, create) in `new`'s
/// managedFields, starting from `old`'s entries.
pub fn track_update(old: Option<&Value>, new: &mut Value, root: &Value, w: &Writer) {
    let mut entries = old.map(parse_entries).unwrap_or_default();
    let empty = json!({});
    let old_v = old.unwrap_or(&empty);
    let before = fields_of(old_v, root, w.scope);
    let after = fields_of(new, root, w.scope);
    let changed: FieldSet = after
        .iter()
        .filter(|f| !before.contains(*f) || value_at(old_v, f) != value_at(new, f))
        .cloned()
        .collect();
    let removed: FieldSet = before.difference(&after).cloned().collect();
    let sub = w.scope.subresource();
    for e in &mut entries {
        e.fields.retain(|f| !removed.contains(f));
        if !e.same(w.manager, "Update", sub) {
            e.fields.retain(|f| !changed.contains(f));
        }
    }
    if !changed.is_empty() {
        match entries
            .iter_mut()
            .find(|e| e.same(w.manager, "Update", sub))
        {
            Some(e) => {
                e.fields.extend(changed);
                e.time = w.now.to_string();
                e.api_version = w.api_version.to_string();
            }
            None => entries.push(Entry {
                manager: w.manager.to_string(),
                operation: "Update".into(),
                api_version: w.api_version.to_string(),
                time: w.now.to_string(),
                subresource: sub.to_string(),
                fields: changed,
            }),
        }
    }
    write_entries(new, &entries);
}

/// A field another manager owns with a different value.
#[derive(Debug, Clone)]
pub struct Conflict {
    pub manager: String,
    pub field: String,
}

pub fn display_path(path: &[Pe]) -> String {
    let mut s = String::new();
    for pe in path {
        match pe {
            Pe::F(f) => {
                s.push('.');
                s.push_str(f);
            }
            Pe::K(k) => {
                let parsed: Value = serde_json::from_str(k).unwrap_or(Value::Null);
                let parts: Vec<String> = parsed
                    .as_object()
                    .map(|m| m.iter().map(|(k, v)| format!("{k}={v}")).collect())
                    .unwrap_or_default();
                s.push_str(&format!("[{}]", parts.join(",")));
            }
            Pe::V(v) => s.push_str(&format!("[={v}]")),
            Pe::I(i) => s.push_str(&format!("[{i}]")),
        }
    }
    s
}

/// Server-side apply of `cfg` onto `live` (an existing object, or a skeleton for a create).
/// Returns the new object, or the conflicts when `force` is false.
pub fn apply(
    live: &Value,
    cfg: &Value,
    root: &Value,
    w: &Writer,
    force: bool,
) -> Result<Value, Vec<Conflict>> {
    let mut entries = parse_entries(live);
    let sub = w.scope.subresource();
    let applied = fields_of(cfg, root, w.scope);
    let mut conflicts = Vec::new();
    for e in entries
        .iter_mut()
        .filter(|e| !e.same(w.manager, "Apply", sub))
    {
        let clashing: Vec<Path> = e
            .fields
            .intersection(&applied)
            .filter(|f| !matches!(f.last(), Some(Pe::K(_))))
            .filter(|f| value_at(live, f) != value_at(cfg, f))
            .cloned()
            .collect();
        for f in clashing {
            conflicts.push(Conflict {
                manager: e.manager.clone(),
                field: display_path(&f),
            });
            if force {
                e.fields.remove(&f);
            }
        }
    }
    if !conflicts.is_empty() && !force {
        return Err(conflicts);
    }
    let previous = entries
        .iter()
        .find(|e| e.same(w.manager, "Apply", sub))
        .map(|e| e.fields.clone())
        .unwrap_or_default();
    let others: FieldSet = entries
        .iter()
        .filter(|e| !e.same(w.manager, "Apply", sub))
        .flat_map(|e| e.fields.iter().cloned())
        .collect();
    let mut dropped: Vec<&Path> = previous
        .iter()
        .filter(|f| !applied.contains(*f) && !others.contains(*f))
        .collect();
    // A dropped list-map element goes whole. Its fields must not be removed one by one
    // first: without its key fields it could no longer be found, and an element with only
    // its other fields would be left behind.
    let whole: Vec<Path> = dropped
        .iter()
        .filter(|f| matches!(f.last(), Some(Pe::K(_))))
        .map(|f| f.to_vec())
        .collect();
    dropped.retain(|f| !whole.iter().any(|w| f.len() > w.len() && f.starts_with(w)));
    // Deepest first, so removing an element never shifts a path still to be removed.
    dropped.sort_by_key(|p| std::cmp::Reverse(p.len()));
    let mut out = live.clone();
    for f in &dropped {
        remove_path(&mut out, f);
    }
    // A map whose every field was just removed goes too, as the API server's
    // structured-merge-diff does: `lastProbe: {}` must not outlive its last field.
    for f in &dropped {
        for depth in (1..f.len()).rev() {
            let parent = &f[..depth];
            let empty = matches!(value_at(&out, parent), Some(Value::Object(m)) if m.is_empty());
            if empty && !applied.iter().chain(&others).any(|o| o.starts_with(parent)) {
                remove_path(&mut out, parent);
            } else {
                break;
            }
        }
    }
    merge_scoped(&mut out, cfg, root, w.scope);
    match entries.iter_mut().find(|e| e.same(w.manager, "Apply", sub)) {
        Some(e) => {
            e.fields = applied;
            e.time = w.now.to_string();
            e.api_version = w.api_version.to_string();
        }
        None => entries.push(Entry {
            manager: w.manager.to_string(),
            operation: "Apply".into(),
            api_version: w.api_version.to_string(),
            time: w.now.to_string(),
            subresource: sub.to_string(),
            fields: applied,
        }),
    }
    write_entries(&mut out, &entries);
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn w<'a>(manager: &'a str) -> Writer<'a> {
        Writer {
            manager,
            api_version: "v1",
            now: "2026-01-01T00:00:00Z",
            scope: Scope::Main {
                exclude_status: false,
            },
        }
    }

    #[test]
    fn fields_v1_round_trip() {
        let root = root_schema(None);
        let obj = json!({"metadata": {"name": "x", "labels": {"a": "b"}, "finalizers": ["f1"],
            "ownerReferences": [{"uid": "u1", "name": "o"}]}, "data": {"k": "v"}});
        let set = fields_of(
            &obj,
            &root,
            Scope::Main {
                exclude_status: false,
            },
        );
        let v1 = to_fields_v1(&set);
        assert_eq!(
            v1,
            json!({"f:data": {"f:k": {}}, "f:metadata": {"f:finalizers": {"v:\"f1\"": {}},
                "f:labels": {"f:a": {}}, "f:ownerReferences": {"k:{\"uid\":\"u1\"}": {".": {}, "f:name": {}, "f:uid": {}}}}})
        );
        let mut back = FieldSet::new();
        parse_fields_v1(&v1, &mut vec![], &mut back);
        assert_eq!(back, set);
    }

    #[test]
    fn apply_conflicts_force_and_removal() {
        let root = root_schema(None);
        let live = json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "x"}});
        let a1 = apply(
            &live,
            &json!({"metadata": {"name": "x"}, "data": {"a": "1", "b": "2"}}),
            &root,
            &w("m1"),
            false,
        )
        .unwrap();
        // m1 stops applying b: it goes away.
        let a2 = apply(
            &a1,
            &json!({"metadata": {"name": "x"}, "data": {"a": "1"}}),
            &root,
            &w("m1"),
            false,
        )
        .unwrap();
        assert_eq!(a2["data"], json!({"a": "1"}));
        // m2 agrees on a: shared, no conflict; disagrees: conflict.
        let shared = apply(&a2, &json!({"data": {"a": "1"}}), &root, &w("m2"), false).unwrap();
        assert_eq!(parse_entries(&shared).len(), 2);
        let err = apply(&a2, &json!({"data": {"a": "9"}}), &root, &w("m2"), false).unwrap_err();
        assert_eq!(err[0].manager, "m1");
        assert_eq!(err[0].field, ".data.a");
        let forced = apply(&a2, &json!({"data": {"a": "9"}}), &root, &w("m2"), true).unwrap();
        assert_eq!(forced["data"]["a"], "9");
        let entries = parse_entries(&forced);
        assert_eq!(entries.len(), 1, "m1 lost its only field");
        assert_eq!(entries[0].manager, "m2");
        // An update by m3 takes the field from m2 without a conflict.
        let mut updated = forced.clone();
        updated["data"]["a"] = json!("10");
        track_update(Some(&forced), &mut updated, &root, &w("m3"));
        let entries = parse_entries(&updated);
        assert_eq!(entries.len(), 1);
        assert_eq!(entries[0].manager, "m3");
        assert_eq!(entries[0].operation, "Update");
    }

    #[test]
    fn a_list_map_element_no_longer_applied_goes_whole() {
        let root = root_schema(Some(&json!({
            "type": "object",
            "properties": {"targets": {
                "type": "array",
                "x-kubernetes-list-type": "map",
                "x-kubernetes-list-map-keys": ["target"],
                "items": {"type": "object", "properties": {
                    "target": {"type": "string"}, "ready": {"type": "boolean"},
                    "message": {"type": "string"}}},
            }},
        })));
        let live = json!({"apiVersion": "v1", "kind": "X", "metadata": {"name": "x"}});
        let first = apply(
            &live,
            &json!({"targets": [{"target": "r1", "ready": true, "message": "ok"}]}),
            &root,
            &w("m1"),
            false,
        )
        .unwrap();
        let second = apply(
            &first,
            &json!({"targets": [{"target": "plugin", "ready": false, "message": "down"}]}),
            &root,
            &w("m1"),
            false,
        )
        .unwrap();
        assert_eq!(
            second["targets"],
            json!([{"target": "plugin", "ready": false, "message": "down"}])
        );
    }
}
