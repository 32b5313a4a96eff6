//! The `/scale` subresource of custom resources: an `autoscaling/v1` `Scale` view of the
//! fields a CRD's `subresources.scale` points at.
//!
//! `kubectl scale` and HorizontalPodAutoscalers never read the custom resource itself;
//! they GET and PATCH this view. As in apiextensions-apiserver's `ScaleREST`, a write is
//! applied to the Scale the server would show, and only `spec.replicas` of the result
//! goes back into the parent, which is then stored like any other update (schema
//! validation, generation, resourceVersion, watch event).

use crate::error::{ApiError, ApiResult};
use serde_json::{Map, Value, json};

pub const API_VERSION: &str = "autoscaling/v1";
pub const KIND: &str = "Scale";

/// What the Scale shows when the parent has no value at `specReplicasPath`, so that a
/// write which does not set `spec.replicas` can be told apart from one that sets 0 (the
/// real server uses the same sentinel, the smallest int32).
const UNSET_REPLICAS: i64 = i32::MIN as i64;

/// A CRD version's `subresources.scale`: JSON paths such as `.spec.replicas`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ScalePaths {
    pub spec_replicas: String,
    pub status_replicas: String,
    pub label_selector: Option<String>,
}

impl ScalePaths {
    /// Reads `subresources.scale` of a CRD version; None when it declares no scale.
    pub fn from_crd_version(version: &Value) -> Option<Self> {
        let scale = version.pointer("/subresources/scale")?;
        let s = |k: &str| scale.get(k).and_then(Value::as_str).map(String::from);
        Some(Self {
            spec_replicas: s("specReplicasPath").unwrap_or_default(),
            status_replicas: s("statusReplicasPath").unwrap_or_default(),
            label_selector: s("labelSelectorPath").filter(|p| !p.is_empty()),
        })
    }
}

impl ScalePaths {
    /// CRD validation of the paths: (field, message) pairs, as the real server words them.
    /// Keeping `specReplicasPath` under `.spec` is what lets a scale write touch nothing
    /// but the spec.
    pub fn validate(&self) -> Vec<(String, String)> {
        let mut errs = Vec::new();
        let mut check = |field: &str, path: &str, roots: &[&str], want: &str| {
            let segs = segments(path);
            if path.is_empty() {
                errs.push((field.to_string(), "Required value".to_string()));
            } else if !path.starts_with('.')
                || segs.len() < 2
                || segs.iter().any(|s| s.is_empty() || s.contains('['))
                || !roots.contains(&segs[0])
            {
                errs.push((
                    field.to_string(),
                    format!("Invalid value: \"{path}\": should be a json path under {want}"),
                ));
            }
        };
        check("specReplicasPath", &self.spec_replicas, &["spec"], ".spec");
        check(
            "statusReplicasPath",
            &self.status_replicas,
            &["status"],
            ".status",
        );
        if let Some(p) = &self.label_selector {
            check(
                "labelSelectorPath",
                p,
                &["spec", "status"],
                "either .spec or .status",
            );
        }
        errs
    }
}

/// `.spec.replicas` -> `["spec", "replicas"]`, as the real server splits these paths
/// (CRD validation allows no array notation in them).
fn segments(path: &str) -> Vec<&str> {
    path.trim_start_matches('.').split('.').collect()
}

fn nested<'a>(obj: &'a Value, path: &str) -> Option<&'a Value> {
    segments(path)
        .into_iter()
        .try_fold(obj, |cur, seg| cur.as_object()?.get(seg))
        .filter(|v| !v.is_null())
}

/// The integer at `path`, None when absent; a value of another type is the server's
/// fault (the schema should have prevented it), hence a 500 like the real one.
fn nested_int(obj: &Value, path: &str) -> ApiResult<Option<i64>> {
    match nested(obj, path) {
        None => Ok(None),
        Some(v) => v.as_i64().map(Some).ok_or_else(|| {
            ApiError::new(
                500,
                "InternalError",
                format!(
                    "Internal error occurred: {path} accessor error: {v} is of the type {}, expected int64",
                    type_name(v)
                ),
            )
        }),
    }
}

fn type_name(v: &Value) -> &'static str {
    match v {
        Value::String(_) => "string",
        Value::Bool(_) => "bool",
        Value::Number(_) => "float64",
        Value::Array(_) => "[]interface {}",
        Value::Object(_) => "map[string]interface {}",
        Value::Null => "<nil>",
    }
}

/// The Scale of `obj`, and whether `obj` has a value at `specReplicasPath`.
pub fn scale_of(obj: &Value, paths: &ScalePaths) -> ApiResult<(Value, bool)> {
    let spec = nested_int(obj, &paths.spec_replicas)?;
    let status = nested_int(obj, &paths.status_replicas)?.unwrap_or(0);
    let meta = |k: &str| obj.pointer(&format!("/metadata/{k}")).cloned();
    let mut metadata = Map::new();
    for k in [
        "name",
        "namespace",
        "uid",
        "resourceVersion",
        "creationTimestamp",
    ] {
        if let Some(v) = meta(k).filter(|v| v.as_str().is_some_and(|s| !s.is_empty())) {
            metadata.insert(k.into(), v);
        }
    }
    let mut scale_spec = json!({});
    // `replicas` is `omitempty` in autoscaling/v1 ScaleSpec: 0 is not written.
    if let Some(n) = spec.filter(|n| *n != 0) {
        scale_spec["replicas"] = json!(n as i32);
    }
    let mut scale_status = json!({"replicas": status as i32});
    let selector = paths
        .label_selector
        .as_deref()
        .and_then(|p| nested(obj, p))
        .and_then(Value::as_str)
        .filter(|s| !s.is_empty());
    if let Some(sel) = selector {
        scale_status["selector"] = json!(sel);
    }
    Ok((
        json!({
            "kind": KIND,
            "apiVersion": API_VERSION,
            "metadata": metadata,
            "spec": scale_spec,
            "status": scale_status,
        }),
        spec.is_some(),
    ))
}

/// The Scale a write starts from: like [`scale_of`], with the sentinel in `spec.replicas`
/// when the parent has none.
pub fn scale_before_write(obj: &Value, paths: &ScalePaths) -> ApiResult<Value> {
    let (mut scale, found) = scale_of(obj, paths)?;
    if !found {
        scale["spec"]["replicas"] = json!(UNSET_REPLICAS);
    }
    Ok(scale)
}

/// Checks that a Scale sent by a client is one (kind and apiVersion, when given) and for
/// `name`, as decoding and the update handler's name check do on a real server.
pub fn check_identity(scale: &Value, name: &str) -> ApiResult<()> {
    if !scale.is_object() {
        return Err(ApiError::bad_request(
            "the body of the request must be a JSON object",
        ));
    }
    if let Some(kind) = scale.get("kind").and_then(Value::as_str)
        && kind != KIND
    {
        return Err(ApiError::bad_request(format!(
            "the kind in the body ({kind}) does not match the kind of the resource ({KIND})"
        )));
    }
    if let Some(av) = scale.get("apiVersion").and_then(Value::as_str)
        && av != API_VERSION
    {
        return Err(ApiError::bad_request(format!(
            "the API version in the data ({av}) does not match the expected API version ({API_VERSION})"
        )));
    }
    if let Some(n) = scale.pointer("/metadata/name").and_then(Value::as_str)
        && !n.is_empty()
        && n != name
    {
        return Err(ApiError::bad_request(format!(
            "the name of the object ({n}) does not match the name on the URL ({name})"
        )));
    }
    Ok(())
}

/// `spec.replicas` of a Scale after a write: an int32 (0 when absent, as decoding an
/// `omitempty` field gives); still the sentinel means nobody set it.
pub fn replicas_of(scale: &Value, paths: &ScalePaths) -> ApiResult<i32> {
    let n = match scale.pointer("/spec/replicas") {
        None | Some(Value::Null) => 0,
        Some(v) => v
            .as_i64()
            .filter(|n| i32::try_from(*n).is_ok())
            .ok_or_else(|| {
                ApiError::bad_request(format!(
                    "Scale in version \"v1\" cannot be handled as a Scale: json: cannot unmarshal {v} into Go struct field ScaleSpec.spec.replicas of type int32"
                ))
            })?,
    };
    if n == UNSET_REPLICAS {
        return Err(ApiError::bad_request(format!(
            "the spec replicas field \"{}\" cannot be empty",
            paths.spec_replicas
        )));
    }
    Ok(n as i32)
}

/// Writes `replicas` at `path` in the parent, creating the maps on the way.
pub fn set_replicas(obj: &mut Value, path: &str, replicas: i32) -> ApiResult<()> {
    let segs = segments(path);
    let (last, parents) = segs.split_last().expect("split always yields a segment");
    let mut cur = obj;
    for seg in parents {
        if cur.get(*seg).is_none_or(Value::is_null) {
            cur[*seg] = json!({});
        }
        cur = cur.get_mut(*seg).expect("inserted above");
        if !cur.is_object() {
            return Err(ApiError::new(
                500,
                "InternalError",
                format!(
                    "Internal error occurred: value cannot be set because {path} is not a map[string]interface {{}}"
                ),
            ));
        }
    }
    cur[*last] = json!(replicas);
    Ok(())
}

/// The columns `kubectl get --subresource=scale` shows, read from the Scale (the real
/// server's scale table convertor has the same ones).
pub fn table_columns() -> Vec<Value> {
    vec![
        json!({"name": "Desired", "type": "integer", "jsonPath": ".spec.replicas"}),
        json!({"name": "Available", "type": "integer", "jsonPath": ".status.replicas"}),
        json!({"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"}),
    ]
}

/// A Scale applied configuration as the parent configuration it stands for: only
/// `spec.replicas`, moved to `specReplicasPath`.
pub fn parent_apply_config(
    cfg: &Value,
    parent_api_version: &str,
    parent_kind: &str,
    name: &str,
    paths: &ScalePaths,
) -> ApiResult<Value> {
    let mut out = json!({
        "apiVersion": parent_api_version,
        "kind": parent_kind,
        "metadata": {"name": name},
    });
    if cfg.pointer("/spec/replicas").is_some_and(|v| !v.is_null()) {
        let n = replicas_of(cfg, paths)?;
        set_replicas(&mut out, &paths.spec_replicas, n)?;
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn paths() -> ScalePaths {
        ScalePaths {
            spec_replicas: ".spec.replicas".into(),
            status_replicas: ".status.replicas".into(),
            label_selector: Some(".status.selector".into()),
        }
    }

    fn pool() -> Value {
        json!({
            "apiVersion": "example.com/v1", "kind": "ProxyPool",
            "metadata": {"name": "p", "namespace": "ns", "uid": "u1", "resourceVersion": "7",
                         "creationTimestamp": "2026-01-01T00:00:00Z", "labels": {"a": "b"}},
            "spec": {"replicas": 3, "other": true},
            "status": {"replicas": 2, "selector": "app=p"},
        })
    }

    #[test]
    fn scale_shows_the_mapped_fields_and_parent_metadata() {
        let (scale, found) = scale_of(&pool(), &paths()).unwrap();
        assert!(found);
        assert_eq!(
            scale,
            json!({
                "kind": "Scale", "apiVersion": "autoscaling/v1",
                "metadata": {"name": "p", "namespace": "ns", "uid": "u1", "resourceVersion": "7",
                             "creationTimestamp": "2026-01-01T00:00:00Z"},
                "spec": {"replicas": 3},
                "status": {"replicas": 2, "selector": "app=p"},
            })
        );
    }

    #[test]
    fn absent_fields_read_as_zero_and_unset() {
        let obj = json!({"metadata": {"name": "p"}, "spec": {}});
        let (scale, found) = scale_of(&obj, &paths()).unwrap();
        assert!(!found);
        assert_eq!(scale["spec"], json!({}));
        assert_eq!(scale["status"], json!({"replicas": 0}));
        let before = scale_before_write(&obj, &paths()).unwrap();
        let err = replicas_of(&before, &paths()).unwrap_err();
        assert_eq!(err.code, 400);
        assert!(err.message.contains("\".spec.replicas\" cannot be empty"));
    }

    #[test]
    fn a_wrong_type_at_the_path_is_an_internal_error() {
        let obj = json!({"metadata": {"name": "p"}, "spec": {"replicas": "three"}});
        assert_eq!(scale_of(&obj, &paths()).unwrap_err().code, 500);
    }

    #[test]
    fn replicas_must_be_int32() {
        for bad in [json!("5"), json!(1.5), json!(1i64 << 40)] {
            let s = json!({"spec": {"replicas": bad}});
            assert_eq!(replicas_of(&s, &paths()).unwrap_err().code, 400, "{bad}");
        }
        assert_eq!(replicas_of(&json!({"spec": {}}), &paths()).unwrap(), 0);
    }

    #[test]
    fn set_replicas_creates_missing_maps() {
        let mut obj = json!({"metadata": {"name": "p"}});
        set_replicas(&mut obj, ".spec.scaling.replicas", 4).unwrap();
        assert_eq!(obj["spec"], json!({"scaling": {"replicas": 4}}));
        let mut bad = json!({"spec": {"scaling": 1}});
        assert_eq!(
            set_replicas(&mut bad, ".spec.scaling.replicas", 4)
                .unwrap_err()
                .code,
            500
        );
    }

    #[test]
    fn crd_validation_of_the_paths() {
        assert!(paths().validate().is_empty());
        let bad = ScalePaths {
            spec_replicas: ".status.replicas".into(),
            status_replicas: String::new(),
            label_selector: Some(".metadata.labels".into()),
        };
        let fields: Vec<String> = bad.validate().into_iter().map(|(f, _)| f).collect();
        assert_eq!(
            fields,
            [
                "specReplicasPath",
                "statusReplicasPath",
                "labelSelectorPath"
            ]
        );
    }

    #[test]
    fn identity_checks() {
        assert!(
            check_identity(
                &json!({"kind": "Scale", "apiVersion": "autoscaling/v1"}),
                "p"
            )
            .is_ok()
        );
        for bad in [
            json!({"kind": "Deployment"}),
            json!({"apiVersion": "apps/v1"}),
            json!({"metadata": {"name": "q"}}),
            json!([1]),
        ] {
            assert_eq!(check_identity(&bad, "p").unwrap_err().code, 400, "{bad}");
        }
    }

    #[test]
    fn apply_config_moves_replicas_to_the_parent_path() {
        let cfg = json!({"apiVersion": "autoscaling/v1", "kind": "Scale", "spec": {"replicas": 6}});
        let out = parent_apply_config(&cfg, "example.com/v1", "ProxyPool", "p", &paths()).unwrap();
        assert_eq!(
            out,
            json!({"apiVersion": "example.com/v1", "kind": "ProxyPool",
                   "metadata": {"name": "p"}, "spec": {"replicas": 6}})
        );
    }
}
