//! The non-apply patch types.
//!
//! JSON patch (RFC 6902) and JSON merge patch (RFC 7386) are exact, via the `json-patch`
//! crate. Strategic merge patch is a merge patch plus the parts of the strategic protocol
//! our kinds can meet: `metadata.finalizers` merges as a set and
//! `metadata.ownerReferences` by `uid` (their patch strategies in Kubernetes),
//! `$patch: replace|delete` on maps, `$deleteFromPrimitiveList/<field>`, and the
//! `$setElementOrder/...` and `$retainKeys` directives are accepted and ignored. Lists of
//! custom resources replace wholesale, as they do on a real server (custom resources only
//! accept strategic merge patch for built-in-like fields of `metadata`).

use crate::error::{ApiError, ApiResult};
use serde_json::{Map, Value};

pub fn json_patch(target: &Value, patch: &[u8]) -> ApiResult<Value> {
    let p: json_patch::Patch = serde_json::from_slice(patch)
        .map_err(|e| ApiError::bad_request(format!("invalid JSON patch: {e}")))?;
    let mut out = target.clone();
    for op in &p.0 {
        // The API server's JSON patch library treats a missing path as null in `test`;
        // kube-runtime's finalizer helper relies on it (`test /metadata/finalizers == null`).
        if let json_patch::PatchOperation::Test(t) = op
            && t.value.is_null()
            && out.pointer(t.path.as_str()).is_none()
        {
            continue;
        }
        json_patch::patch(&mut out, std::slice::from_ref(op))
            .map_err(|e| ApiError::unprocessable(e.to_string()))?;
    }
    Ok(out)
}

pub fn merge_patch(target: &Value, patch: &[u8]) -> ApiResult<Value> {
    let p: Value = serde_json::from_slice(patch)
        .map_err(|e| ApiError::bad_request(format!("invalid merge patch: {e}")))?;
    if !p.is_object() {
        return Err(ApiError::bad_request("merge patch must be a JSON object"));
    }
    let mut out = target.clone();
    json_patch::merge(&mut out, &p);
    Ok(out)
}

pub fn strategic_merge_patch(target: &Value, patch: &[u8]) -> ApiResult<Value> {
    let p: Value = serde_json::from_slice(patch)
        .map_err(|e| ApiError::bad_request(format!("invalid strategic merge patch: {e}")))?;
    let Value::Object(p) = p else {
        return Err(ApiError::bad_request(
            "strategic merge patch must be a JSON object",
        ));
    };
    let mut out = target.clone();
    smp_map(&mut out, &p, &[]);
    Ok(out)
}

fn list_key(path: &[&str], field: &str) -> Option<Option<&'static str>> {
    // Some(None): a set of primitives; Some(Some(key)): a list of maps merged by key.
    match (path, field) {
        (["metadata"], "finalizers") => Some(None),
        (["metadata"], "ownerReferences") => Some(Some("uid")),
        _ => None,
    }
}

fn smp_map(target: &mut Value, patch: &Map<String, Value>, path: &[&str]) {
    match patch.get("$patch").and_then(Value::as_str) {
        Some("delete") => {
            *target = Value::Null;
            return;
        }
        Some("replace") => {
            let mut clean = patch.clone();
            clean.remove("$patch");
            *target = Value::Object(clean);
            return;
        }
        _ => {}
    }
    if !target.is_object() {
        *target = Value::Object(Map::new());
    }
    let obj = target.as_object_mut().expect("made an object above");
    for (k, v) in patch {
        if k == "$patch" || k == "$retainKeys" || k.starts_with("$setElementOrder/") {
            continue;
        }
        if let Some(field) = k.strip_prefix("$deleteFromPrimitiveList/") {
            if let (Some(Value::Array(list)), Some(remove)) = (obj.get_mut(field), v.as_array()) {
                list.retain(|x| !remove.contains(x));
            }
            continue;
        }
        if v.is_null() {
            obj.remove(k);
            continue;
        }
        match (v, list_key(path, k)) {
            (Value::Object(pm), _) => {
                let mut child = obj.remove(k).unwrap_or(Value::Null);
                let mut sub: Vec<&str> = path.to_vec();
                sub.push(k);
                smp_map(&mut child, pm, &sub);
                if !child.is_null() {
                    obj.insert(k.clone(), child);
                }
            }
            (Value::Array(items), Some(None)) => {
                let list = obj.entry(k.clone()).or_insert_with(|| Value::Array(vec![]));
                if let Value::Array(list) = list {
                    for it in items {
                        if !list.contains(it) {
                            list.push(it.clone());
                        }
                    }
                }
            }
            (Value::Array(items), Some(Some(key))) => {
                let list = obj.entry(k.clone()).or_insert_with(|| Value::Array(vec![]));
                if let Value::Array(list) = list {
                    for it in items {
                        let id = it.get(key);
                        let delete = it.get("$patch").and_then(Value::as_str) == Some("delete");
                        let pos = list
                            .iter()
                            .position(|x| x.get(key).is_some() && x.get(key) == id);
                        match (pos, delete) {
                            (Some(i), true) => {
                                list.remove(i);
                            }
                            (None, true) => {}
                            (Some(i), false) => {
                                if let Value::Object(m) = it {
                                    smp_map(&mut list[i], m, &[]);
                                }
                            }
                            (None, false) => list.push(it.clone()),
                        }
                    }
                }
            }
            _ => {
                obj.insert(k.clone(), v.clone());
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn strategic_merges_finalizers_and_deletes() {
        let t = json!({"metadata": {"finalizers": ["a"], "labels": {"x": "1", "y": "2"}}, "data": {"k": "v"}, "list": [1, 2]});
        let p = json!({"metadata": {"finalizers": ["b"], "labels": {"x": null}}, "data": {"$patch": "replace", "n": "m"},
            "list": [3], "$setElementOrder/list": [3]});
        let out = strategic_merge_patch(&t, p.to_string().as_bytes()).unwrap();
        assert_eq!(out["metadata"]["finalizers"], json!(["a", "b"]));
        assert_eq!(out["metadata"]["labels"], json!({"y": "2"}));
        assert_eq!(out["data"], json!({"n": "m"}));
        assert_eq!(out["list"], json!([3]));
        let p2 = json!({"$deleteFromPrimitiveList/finalizers": ["a"]});
        let wrapped = json!({"metadata": p2});
        let out2 = strategic_merge_patch(&out, wrapped.to_string().as_bytes()).unwrap();
        assert_eq!(out2["metadata"]["finalizers"], json!(["b"]));
    }

    #[test]
    fn json_patch_test_failure_is_422() {
        let t = json!({"metadata": {"finalizers": ["a"]}});
        let p = json!([{"op": "test", "path": "/metadata/finalizers/0", "value": "b"}]);
        let err = json_patch(&t, p.to_string().as_bytes()).unwrap_err();
        assert_eq!(err.code, 422);
        let add = json!([{"op": "test", "path": "/metadata/finalizers", "value": null},
                         {"op": "add", "path": "/metadata/finalizers", "value": ["x"]}]);
        let out = json_patch(&json!({"metadata": {}}), add.to_string().as_bytes()).unwrap();
        assert_eq!(out["metadata"]["finalizers"], json!(["x"]));
    }
}
