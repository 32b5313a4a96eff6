//! The kinds the fake server knows, and the discovery documents built from them.
//!
//! Built-in kinds are registered at start; custom resources appear and disappear with
//! their CustomResourceDefinition, so discovery-driven clients (kubectl, kube's
//! `Discovery`, dynamic `ApiResource` lookups) see exactly what a cluster would show.

use crate::scale::ScalePaths;
use serde_json::{Value, json};
use std::collections::BTreeMap;

/// Whether a kind is stored, or only answered (the review APIs).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Storage {
    Stored,
    /// Create-only: the request object comes back with a computed `status`; nothing is kept.
    Review,
}

/// One resource (a plural in a group), possibly served in several versions.
#[derive(Debug, Clone)]
pub struct ResourceType {
    pub group: String,
    /// Served versions; the first is the preferred one.
    pub versions: Vec<String>,
    pub plural: String,
    pub singular: String,
    pub kind: String,
    pub namespaced: bool,
    pub short_names: Vec<String>,
    pub categories: Vec<String>,
    pub status_subresource: bool,
    /// `subresources.scale` per served version that declares one (custom resources only).
    pub scale: BTreeMap<String, ScalePaths>,
    /// Whether the kind keeps `metadata.generation` (custom resources and CRDs do;
    /// ConfigMaps, Secrets, Leases and Namespaces do not on a real cluster).
    pub has_generation: bool,
    /// DELETE answers with the object instead of a `Status` (true for custom resources).
    pub return_deleted_object: bool,
    pub storage: Storage,
    /// `openAPIV3Schema` per served version, for custom resources.
    pub schemas: BTreeMap<String, Value>,
    /// `additionalPrinterColumns` per served version, for `kubectl get` tables.
    pub printer_columns: BTreeMap<String, Vec<Value>>,
    /// Set for kinds owned by a CRD, so deleting the CRD unregisters them.
    pub from_crd: bool,
}

impl ResourceType {
    fn builtin(group: &str, version: &str, plural: &str, kind: &str, namespaced: bool) -> Self {
        Self {
            group: group.into(),
            versions: vec![version.into()],
            plural: plural.into(),
            singular: kind.to_lowercase(),
            kind: kind.into(),
            namespaced,
            short_names: vec![],
            categories: vec![],
            status_subresource: false,
            scale: BTreeMap::new(),
            has_generation: false,
            return_deleted_object: false,
            storage: Storage::Stored,
            schemas: BTreeMap::new(),
            printer_columns: BTreeMap::new(),
            from_crd: false,
        }
    }

    pub fn api_version(&self, version: &str) -> String {
        if self.group.is_empty() {
            version.to_string()
        } else {
            format!("{}/{version}", self.group)
        }
    }

    pub fn key(&self) -> ResKey {
        ResKey {
            group: self.group.clone(),
            plural: self.plural.clone(),
        }
    }

    pub fn schema(&self, version: &str) -> Option<&Value> {
        self.schemas.get(version)
    }

    /// The scale subresource served in `version`, if the CRD declares one there.
    pub fn scale(&self, version: &str) -> Option<&ScalePaths> {
        self.scale.get(version)
    }

    fn verbs(&self) -> Vec<&'static str> {
        match self.storage {
            Storage::Review => vec!["create"],
            Storage::Stored => vec![
                "create",
                "delete",
                "deletecollection",
                "get",
                "list",
                "patch",
                "update",
                "watch",
            ],
        }
    }
}

/// Storage identity of a resource: versions of one resource share objects.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ResKey {
    pub group: String,
    pub plural: String,
}

#[derive(Debug, Clone, Default)]
pub struct Registry {
    types: BTreeMap<ResKey, ResourceType>,
}

impl Registry {
    pub fn with_builtins() -> Self {
        let mut r = Self::default();
        let mut ns = ResourceType::builtin("", "v1", "namespaces", "Namespace", false);
        ns.short_names = vec!["ns".into()];
        ns.status_subresource = true;
        ns.return_deleted_object = true;
        r.insert(ns);
        let mut cm = ResourceType::builtin("", "v1", "configmaps", "ConfigMap", true);
        cm.short_names = vec!["cm".into()];
        r.insert(cm);
        r.insert(ResourceType::builtin("", "v1", "secrets", "Secret", true));
        let mut ev = ResourceType::builtin("", "v1", "events", "Event", true);
        ev.short_names = vec!["ev".into()];
        r.insert(ev);
        let mut ev2 = ResourceType::builtin("events.k8s.io", "v1", "events", "Event", true);
        ev2.short_names = vec!["ev".into()];
        r.insert(ev2);
        r.insert(ResourceType::builtin(
            "coordination.k8s.io",
            "v1",
            "leases",
            "Lease",
            true,
        ));
        // What an operator's install manifests hold (`kubectl apply -k`): stored as sent,
        // no controllers behind them.
        for (group, plural, kind, namespaced, short) in [
            ("", "services", "Service", true, "svc"),
            ("", "serviceaccounts", "ServiceAccount", true, "sa"),
            ("apps", "deployments", "Deployment", true, "deploy"),
            (
                "policy",
                "poddisruptionbudgets",
                "PodDisruptionBudget",
                true,
                "pdb",
            ),
            ("rbac.authorization.k8s.io", "roles", "Role", true, ""),
            (
                "rbac.authorization.k8s.io",
                "rolebindings",
                "RoleBinding",
                true,
                "",
            ),
            (
                "rbac.authorization.k8s.io",
                "clusterroles",
                "ClusterRole",
                false,
                "",
            ),
            (
                "rbac.authorization.k8s.io",
                "clusterrolebindings",
                "ClusterRoleBinding",
                false,
                "",
            ),
        ] {
            let mut t = ResourceType::builtin(group, "v1", plural, kind, namespaced);
            t.short_names = [short]
                .iter()
                .filter(|s| !s.is_empty())
                .map(|s| s.to_string())
                .collect();
            t.has_generation = kind == "Deployment" || kind == "PodDisruptionBudget";
            r.insert(t);
        }
        let mut crd = ResourceType::builtin(
            "apiextensions.k8s.io",
            "v1",
            "customresourcedefinitions",
            "CustomResourceDefinition",
            false,
        );
        crd.short_names = vec!["crd".into(), "crds".into()];
        crd.status_subresource = true;
        crd.has_generation = true;
        crd.return_deleted_object = true;
        crd.categories = vec!["api-extensions".into()];
        r.insert(crd);
        let mut tr = ResourceType::builtin(
            "authentication.k8s.io",
            "v1",
            "tokenreviews",
            "TokenReview",
            false,
        );
        tr.storage = Storage::Review;
        r.insert(tr);
        let mut sar = ResourceType::builtin(
            "authorization.k8s.io",
            "v1",
            "subjectaccessreviews",
            "SubjectAccessReview",
            false,
        );
        sar.storage = Storage::Review;
        r.insert(sar);
        r
    }

    pub fn insert(&mut self, t: ResourceType) {
        self.types.insert(t.key(), t);
    }

    pub fn remove(&mut self, key: &ResKey) {
        self.types.remove(key);
    }

    pub fn get(&self, key: &ResKey) -> Option<&ResourceType> {
        self.types.get(key)
    }

    /// The resource served at `/{group}/{version}/{plural}`.
    pub fn lookup(&self, group: &str, version: &str, plural: &str) -> Option<&ResourceType> {
        self.types
            .get(&ResKey {
                group: group.into(),
                plural: plural.into(),
            })
            .filter(|t| t.versions.iter().any(|v| v == version))
    }

    /// Finds a resource by plural, kind (any case), singular or short name, for test hooks.
    pub fn find(&self, name: &str) -> Option<&ResourceType> {
        let (name, group) = match name.split_once('.') {
            Some((n, g)) => (n, Some(g)),
            None => (name, None),
        };
        let mut hits = self.types.values().filter(|t| {
            group.is_none_or(|g| t.group == g)
                && (t.plural == name
                    || t.singular == name
                    || t.kind.eq_ignore_ascii_case(name)
                    || t.short_names.iter().any(|s| s == name))
        });
        // Prefer the core group when a name exists in several (e.g. `events`).
        let first = hits.next()?;
        Some(
            std::iter::once(first)
                .chain(hits)
                .min_by_key(|t| !t.group.is_empty())
                .unwrap_or(first),
        )
    }

    pub fn types(&self) -> impl Iterator<Item = &ResourceType> {
        self.types.values()
    }

    fn groups(&self) -> BTreeMap<String, Vec<String>> {
        let mut groups: BTreeMap<String, Vec<String>> = BTreeMap::new();
        for t in self.types.values().filter(|t| !t.group.is_empty()) {
            let vs = groups.entry(t.group.clone()).or_default();
            for v in &t.versions {
                if !vs.contains(v) {
                    vs.push(v.clone());
                }
            }
        }
        for vs in groups.values_mut() {
            vs.sort_by_key(|v| std::cmp::Reverse(version_priority(v)));
        }
        groups
    }

    pub fn api_versions(&self, server_address: &str) -> Value {
        json!({
            "kind": "APIVersions",
            "versions": ["v1"],
            "serverAddressByClientCIDRs": [{"clientCIDR": "0.0.0.0/0", "serverAddress": server_address}],
        })
    }

    fn group_doc(group: &str, versions: &[String]) -> Value {
        let vs: Vec<Value> = versions
            .iter()
            .map(|v| json!({"groupVersion": format!("{group}/{v}"), "version": v}))
            .collect();
        json!({
            "name": group,
            "versions": vs,
            "preferredVersion": vs[0].clone(),
        })
    }

    pub fn api_group_list(&self) -> Value {
        let groups: Vec<Value> = self
            .groups()
            .iter()
            .map(|(g, vs)| Self::group_doc(g, vs))
            .collect();
        json!({"kind": "APIGroupList", "apiVersion": "v1", "groups": groups})
    }

    pub fn api_group(&self, group: &str) -> Option<Value> {
        let groups = self.groups();
        let vs = groups.get(group)?;
        let mut doc = Self::group_doc(group, vs);
        doc["kind"] = json!("APIGroup");
        doc["apiVersion"] = json!("v1");
        Some(doc)
    }

    pub fn resource_list(&self, group: &str, version: &str) -> Option<Value> {
        let mut resources = Vec::new();
        for t in self
            .types
            .values()
            .filter(|t| t.group == group && t.versions.iter().any(|v| v == version))
        {
            let mut r = json!({
                "name": t.plural,
                "singularName": t.singular,
                "namespaced": t.namespaced,
                "kind": t.kind,
                "verbs": t.verbs(),
            });
            if !t.short_names.is_empty() {
                r["shortNames"] = json!(t.short_names);
            }
            if !t.categories.is_empty() {
                r["categories"] = json!(t.categories);
            }
            resources.push(r);
            if t.status_subresource {
                resources.push(json!({
                    "name": format!("{}/status", t.plural),
                    "singularName": "",
                    "namespaced": t.namespaced,
                    "kind": t.kind,
                    "verbs": ["get", "patch", "update"],
                }));
            }
            // The scale subresource has its own kind, which kubectl's scale client reads
            // from here to know what `/scale` answers with.
            if t.scale(version).is_some() {
                resources.push(json!({
                    "name": format!("{}/scale", t.plural),
                    "singularName": "",
                    "namespaced": t.namespaced,
                    "group": "autoscaling",
                    "version": "v1",
                    "kind": "Scale",
                    "verbs": ["get", "patch", "update"],
                }));
            }
        }
        if resources.is_empty() {
            return None;
        }
        let gv = if group.is_empty() {
            version.to_string()
        } else {
            format!("{group}/{version}")
        };
        Some(json!({
            "kind": "APIResourceList",
            "apiVersion": "v1",
            "groupVersion": gv,
            "resources": resources,
        }))
    }
}

impl Registry {
    /// `/openapi/v3`: one entry per served group-version.
    pub fn openapi_v3_root(&self) -> Value {
        let mut paths = serde_json::Map::new();
        for t in self.types.values() {
            for v in &t.versions {
                let p = if t.group.is_empty() {
                    format!("api/{v}")
                } else {
                    format!("apis/{}/{v}", t.group)
                };
                paths.insert(
                    p.clone(),
                    json!({"serverRelativeURL": format!("/openapi/v3/{p}")}),
                );
            }
        }
        json!({"paths": paths})
    }

    /// `/openapi/v3/{api/v1|apis/g/v}`: just enough for kubectl to see that the server does
    /// field validation itself (a PATCH operation per kind that takes `fieldValidation`),
    /// so `kubectl create/apply` send `fieldValidation=Strict` instead of validating
    /// client-side against schemas this fake does not publish.
    pub fn openapi_v3_group_version(&self, group: &str, version: &str) -> Option<Value> {
        let mut paths = serde_json::Map::new();
        for t in self
            .types
            .values()
            .filter(|t| t.group == group && t.versions.iter().any(|v| v == version))
        {
            let prefix = if group.is_empty() {
                format!("/api/{version}")
            } else {
                format!("/apis/{group}/{version}")
            };
            let path = if t.namespaced {
                format!("{prefix}/namespaces/{{namespace}}/{}/{{name}}", t.plural)
            } else {
                format!("{prefix}/{}/{{name}}", t.plural)
            };
            let gvk = json!({"group": group, "version": version, "kind": t.kind});
            let params = json!([
                {"name": "fieldValidation", "in": "query", "schema": {"type": "string"}},
                {"name": "dryRun", "in": "query", "schema": {"type": "string"}},
                {"name": "fieldManager", "in": "query", "schema": {"type": "string"}},
            ]);
            let op = |verb: &str| {
                json!({
                    "operationId": format!("{verb}{}", t.kind),
                    "parameters": params,
                    "responses": {"200": {"description": "OK"}},
                    "x-kubernetes-action": verb,
                    "x-kubernetes-group-version-kind": gvk,
                })
            };
            let mut item = json!({"get": op("get")});
            if t.storage == Storage::Stored {
                item["put"] = op("put");
                item["patch"] = op("patch");
                item["delete"] = op("delete");
            }
            paths.insert(path, item);
        }
        if paths.is_empty() {
            return None;
        }
        Some(json!({
            "openapi": "3.0.0",
            "info": {"title": "Kubernetes (fake-kube)", "version": "v1.34.0"},
            "paths": paths,
            "components": {"schemas": {}},
        }))
    }
}

/// Kubernetes version ordering: GA > beta > alpha, then by number.
pub fn version_priority(v: &str) -> (u8, u32, u32) {
    let Some(rest) = v.strip_prefix('v') else {
        return (0, 0, 0);
    };
    let digits: String = rest.chars().take_while(char::is_ascii_digit).collect();
    let major = digits.parse().unwrap_or(0);
    let tail = &rest[digits.len()..];
    if tail.is_empty() {
        (3, major, 0)
    } else if let Some(n) = tail.strip_prefix("beta") {
        (2, major, n.parse().unwrap_or(0))
    } else if let Some(n) = tail.strip_prefix("alpha") {
        (1, major, n.parse().unwrap_or(0))
    } else {
        (0, major, 0)
    }
}

/// Builds the resource type a CRD declares; errors are (field, message) pairs.
pub fn type_from_crd(crd: &Value) -> Result<ResourceType, Vec<(String, String)>> {
    let mut errs = Vec::new();
    let spec = crd.get("spec").cloned().unwrap_or(Value::Null);
    let s = |p: &str| {
        spec.pointer(p)
            .and_then(Value::as_str)
            .unwrap_or("")
            .to_string()
    };
    let group = s("/group");
    let plural = s("/names/plural");
    let kind = s("/names/kind");
    let scope = s("/scope");
    if group.is_empty() {
        errs.push(("spec.group".into(), "Required value".into()));
    }
    if plural.is_empty() {
        errs.push(("spec.names.plural".into(), "Required value".into()));
    }
    if kind.is_empty() {
        errs.push(("spec.names.kind".into(), "Required value".into()));
    }
    if scope != "Namespaced" && scope != "Cluster" {
        errs.push((
            "spec.scope".into(),
            format!(
                "Unsupported value: \"{scope}\": supported values: \"Cluster\", \"Namespaced\""
            ),
        ));
    }
    let name = crd
        .pointer("/metadata/name")
        .and_then(Value::as_str)
        .unwrap_or("");
    if !plural.is_empty() && !group.is_empty() && name != format!("{plural}.{group}") {
        errs.push((
            "metadata.name".into(),
            format!("Invalid value: \"{name}\": must be spec.names.plural+\".\"+spec.group"),
        ));
    }
    let versions = spec
        .get("versions")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    if versions.is_empty() {
        errs.push((
            "spec.versions".into(),
            "Invalid value: must have exactly one version marked as storage version".into(),
        ));
    }
    let storage_count = versions
        .iter()
        .filter(|v| v.get("storage").and_then(Value::as_bool) == Some(true))
        .count();
    if !versions.is_empty() && storage_count != 1 {
        errs.push((
            "spec.versions".into(),
            "Invalid value: must have exactly one version marked as storage version".into(),
        ));
    }
    for (i, v) in versions.iter().enumerate() {
        if let Some(paths) = ScalePaths::from_crd_version(v) {
            errs.extend(
                paths
                    .validate()
                    .into_iter()
                    .map(|(f, m)| (format!("spec.versions[{i}].subresources.scale.{f}"), m)),
            );
        }
    }
    if !errs.is_empty() {
        return Err(errs);
    }
    let mut served: Vec<String> = Vec::new();
    let mut status_subresource = false;
    let mut scale = BTreeMap::new();
    let mut schemas = BTreeMap::new();
    let mut printer_columns = BTreeMap::new();
    for v in &versions {
        let vname = v
            .get("name")
            .and_then(Value::as_str)
            .unwrap_or("")
            .to_string();
        if v.get("served").and_then(Value::as_bool) != Some(false) {
            served.push(vname.clone());
        }
        if v.pointer("/subresources/status").is_some() {
            status_subresource = true;
        }
        if let Some(paths) = ScalePaths::from_crd_version(v) {
            scale.insert(vname.clone(), paths);
        }
        if let Some(schema) = v.pointer("/schema/openAPIV3Schema") {
            schemas.insert(vname.clone(), schema.clone());
        }
        if let Some(cols) = v.get("additionalPrinterColumns").and_then(Value::as_array) {
            printer_columns.insert(vname.clone(), cols.clone());
        }
    }
    served.sort_by_key(|v| std::cmp::Reverse(version_priority(v)));
    let strings = |p: &str| -> Vec<String> {
        spec.pointer(p)
            .and_then(Value::as_array)
            .map(|a| {
                a.iter()
                    .filter_map(|x| x.as_str().map(String::from))
                    .collect()
            })
            .unwrap_or_default()
    };
    let singular = s("/names/singular");
    Ok(ResourceType {
        group,
        versions: served,
        singular: if singular.is_empty() {
            kind.to_lowercase()
        } else {
            singular
        },
        plural,
        kind,
        namespaced: scope == "Namespaced",
        short_names: strings("/names/shortNames"),
        categories: strings("/names/categories"),
        status_subresource,
        scale,
        has_generation: true,
        return_deleted_object: true,
        storage: Storage::Stored,
        schemas,
        printer_columns,
        from_crd: true,
    })
}
