//! The object store: the state machine behind every verb.
//!
//! Everything a controller can observe about ordering lives here under one lock: the
//! global resourceVersion counter, the event history that watches resume from, and the
//! background behaviour a cluster's controllers would add (finalizer-driven deletion,
//! namespace and CRD cleanup, owner-reference garbage collection). Running that background
//! work synchronously after each write keeps tests deterministic: when a write returns,
//! its consequences are already visible.

use crate::error::{ApiError, ApiResult, group_resource};
use crate::managed::{self, Scope, Writer};
use crate::patch;
use crate::registry::{Registry, ResKey, ResourceType, Storage};
use crate::scale::{self, ScalePaths};
use crate::schema;
use crate::selector::{FieldSelector, LabelSelector};
use k8s_openapi::jiff;
use serde_json::{Value, json};
use std::collections::{BTreeMap, HashSet, VecDeque};
use std::sync::Arc;
use tokio::sync::mpsc;

/// What happened to an object, as watches report it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ChangeKind {
    Added,
    Modified,
    Deleted,
}

/// One entry of the event history.
#[derive(Debug)]
pub struct Change {
    pub rv: u64,
    pub res: ResKey,
    pub kind: ChangeKind,
    /// The previous state, for modifications: lets a selector watch turn a change into
    /// ADDED or DELETED when an object starts or stops matching.
    pub old: Option<Value>,
    pub obj: Value,
}

struct Watcher {
    res: ResKey,
    tx: mpsc::UnboundedSender<Arc<Change>>,
}

/// How a patch body is to be read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PatchType {
    Json,
    Merge,
    Strategic,
    Apply,
}

impl PatchType {
    pub fn from_content_type(ct: &str) -> Option<Self> {
        let base = ct.split(';').next().unwrap_or("").trim();
        Some(match base {
            "application/json-patch+json" => Self::Json,
            "application/merge-patch+json" => Self::Merge,
            "application/strategic-merge-patch+json" => Self::Strategic,
            "application/apply-patch+yaml" | "application/apply-patch+json" => Self::Apply,
            _ => return None,
        })
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum FieldValidation {
    #[default]
    Ignore,
    Warn,
    Strict,
}

/// Per-request facts that shape a write.
#[derive(Debug, Clone, Default)]
pub struct WriteCtx {
    /// The `fieldManager` query parameter.
    pub field_manager: Option<String>,
    /// The manager name used when `fieldManager` is absent (user agent prefix).
    pub default_manager: String,
    pub dry_run: bool,
    pub force: bool,
    pub field_validation: FieldValidation,
    /// API version of the request (objects are stored version-agnostic).
    pub version: String,
    /// Warnings for the `Warning` response header.
    pub warnings: Vec<String>,
}

impl WriteCtx {
    fn manager(&self) -> &str {
        self.field_manager
            .as_deref()
            .unwrap_or(&self.default_manager)
    }
}

/// Deletion propagation, as in `DeleteOptions.propagationPolicy`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Propagation {
    Background,
    Foreground,
    Orphan,
}

#[derive(Debug, Clone, Default)]
pub struct DeleteOpts {
    pub propagation: Option<Propagation>,
    pub precondition_uid: Option<String>,
    pub precondition_rv: Option<String>,
    pub dry_run: bool,
}

pub enum Deleted {
    /// Finalizers hold the object; it now carries a deletionTimestamp.
    Pending(Value),
    Gone(Value),
}

/// Where a watch starts.
pub struct WatchStart {
    pub initial: Vec<Arc<Change>>,
    /// Set for `sendInitialEvents=true`: the resourceVersion of the initial-events-end bookmark.
    pub initial_end_rv: Option<u64>,
    pub rx: mpsc::UnboundedReceiver<Arc<Change>>,
}

const FINALIZER_FOREGROUND: &str = "foregroundDeletion";
const FINALIZER_ORPHAN: &str = "orphan";
const FINALIZER_CRD_CLEANUP: &str = "customresourcecleanup.apiextensions.k8s.io";

type ObjKey = (String, String);

pub struct Store {
    pub registry: Registry,
    rv: u64,
    objects: BTreeMap<ResKey, BTreeMap<ObjKey, Value>>,
    history: VecDeque<Arc<Change>>,
    pub history_limit: usize,
    /// Watches may resume from any resourceVersion >= this.
    oldest_resumable: u64,
    watchers: Vec<Watcher>,
    pub garbage_collection: bool,
    /// The last settle left no object deleting (see `settle_after_write`); false forces the
    /// next write to settle.
    pub(crate) quiet: bool,
    uid_seq: u64,
    uid_seed: u64,
}

pub fn now() -> String {
    jiff::Timestamp::now()
        .strftime("%Y-%m-%dT%H:%M:%SZ")
        .to_string()
}

fn meta_str<'a>(obj: &'a Value, field: &str) -> Option<&'a str> {
    obj.get("metadata")?.get(field)?.as_str()
}

fn name_of(obj: &Value) -> String {
    meta_str(obj, "name").unwrap_or("").to_string()
}

fn uid_of(obj: &Value) -> String {
    meta_str(obj, "uid").unwrap_or("").to_string()
}

fn finalizers_of(obj: &Value) -> Vec<String> {
    obj.pointer("/metadata/finalizers")
        .and_then(Value::as_array)
        .map(|a| {
            a.iter()
                .filter_map(|f| f.as_str().map(String::from))
                .collect()
        })
        .unwrap_or_default()
}

fn is_deleting(obj: &Value) -> bool {
    obj.pointer("/metadata/deletionTimestamp")
        .is_some_and(|v| !v.is_null())
}

fn meta_mut(obj: &mut Value) -> &mut serde_json::Map<String, Value> {
    if !obj.get("metadata").is_some_and(Value::is_object) {
        obj["metadata"] = json!({});
    }
    obj["metadata"]
        .as_object_mut()
        .expect("metadata is an object")
}

fn set_finalizers(obj: &mut Value, fins: &[String]) {
    let meta = meta_mut(obj);
    if fins.is_empty() {
        meta.remove("finalizers");
    } else {
        meta.insert("finalizers".into(), json!(fins));
    }
}

/// Namespaces also wait on `spec.finalizers` (the namespace controller's "kubernetes").
fn pending_finalizers(obj: &Value, rt: &ResourceType) -> bool {
    if !finalizers_of(obj).is_empty() {
        return true;
    }
    rt.group.is_empty()
        && rt.plural == "namespaces"
        && obj
            .pointer("/spec/finalizers")
            .and_then(Value::as_array)
            .is_some_and(|a| !a.is_empty())
}

fn is_dns_subdomain(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 253
        && name.split('.').all(|label| {
            !label.is_empty()
                && label
                    .chars()
                    .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
                && !label.starts_with('-')
                && !label.ends_with('-')
        })
}

fn is_dns_label(name: &str) -> bool {
    name.len() <= 63 && !name.contains('.') && is_dns_subdomain(name)
}

fn owner_uids(obj: &Value) -> Vec<String> {
    obj.pointer("/metadata/ownerReferences")
        .and_then(Value::as_array)
        .map(|refs| {
            refs.iter()
                .filter_map(|r| r.get("uid").and_then(Value::as_str).map(String::from))
                .collect()
        })
        .unwrap_or_default()
}

/// Object content without the bookkeeping that changes on every write, for no-op detection.
fn content(obj: &Value) -> Value {
    let mut c = obj.clone();
    if let Some(meta) = c.get_mut("metadata").and_then(Value::as_object_mut) {
        meta.remove("resourceVersion");
        meta.remove("generation");
        // Ownership changes are real changes (an apply that only takes over fields is
        // persisted); timestamps alone are not.
        if let Some(Value::Array(entries)) = meta.get_mut("managedFields") {
            for e in entries.iter_mut().filter_map(Value::as_object_mut) {
                e.remove("time");
            }
        }
    }
    c
}

/// The part of an object whose change bumps `metadata.generation`.
fn spec_part(obj: &Value, status_subresource: bool) -> Value {
    let mut c = obj.clone();
    if let Some(m) = c.as_object_mut() {
        m.remove("metadata");
        m.remove("apiVersion");
        m.remove("kind");
        if status_subresource {
            m.remove("status");
        }
    }
    c
}

impl Store {
    pub fn new() -> Self {
        let seed = {
            use std::hash::{BuildHasher, Hasher};
            let mut h = std::collections::hash_map::RandomState::new().build_hasher();
            h.write_u128(
                std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .map(|d| d.as_nanos())
                    .unwrap_or(0),
            );
            h.finish()
        };
        let mut s = Self {
            registry: Registry::with_builtins(),
            rv: 0,
            objects: BTreeMap::new(),
            history: VecDeque::new(),
            history_limit: 10_000,
            oldest_resumable: 0,
            watchers: Vec::new(),
            garbage_collection: true,
            quiet: false,
            uid_seq: 0,
            uid_seed: seed,
        };
        for ns in ["default", "kube-system", "kube-public", "kube-node-lease"] {
            let rt = s.registry.find("namespaces").cloned().expect("built-in");
            let mut ctx = WriteCtx {
                default_manager: "fake-kube".into(),
                version: "v1".into(),
                ..Default::default()
            };
            s.create(&rt, None, json!({"metadata": {"name": ns}}), &mut ctx)
                .expect("creating a built-in namespace");
        }
        s
    }

    pub fn resource_version(&self) -> u64 {
        self.rv
    }

    fn next_rv(&mut self) -> u64 {
        self.rv += 1;
        self.rv
    }

    fn random(&mut self) -> u64 {
        // SplitMix64 over a per-store seed: unique enough for uids and generateName suffixes.
        self.uid_seq += 1;
        let mut z = self
            .uid_seed
            .wrapping_add(self.uid_seq.wrapping_mul(0x9E37_79B9_7F4A_7C15));
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    fn new_uid(&mut self) -> String {
        let a = self.random();
        let b = self.random();
        let hex = format!("{a:016x}{b:016x}");
        format!(
            "{}-{}-4{}-a{}-{}",
            &hex[0..8],
            &hex[8..12],
            &hex[13..16],
            &hex[17..20],
            &hex[20..32]
        )
    }

    fn random_suffix(&mut self) -> String {
        const ALPHABET: &[u8] = b"bcdfghjklmnpqrstvwxz2456789";
        let mut r = self.random();
        (0..5)
            .map(|_| {
                let c = ALPHABET[(r % ALPHABET.len() as u64) as usize] as char;
                r /= ALPHABET.len() as u64;
                c
            })
            .collect()
    }

    fn emit(&mut self, res: &ResKey, kind: ChangeKind, old: Option<Value>, obj: Value) {
        let change = Arc::new(Change {
            rv: self.rv,
            res: res.clone(),
            kind,
            old,
            obj,
        });
        self.watchers
            .retain(|w| w.res != *res || w.tx.send(change.clone()).is_ok());
        self.history.push_back(change);
        while self.history.len() > self.history_limit {
            if let Some(old) = self.history.pop_front() {
                self.oldest_resumable = old.rv;
            }
        }
    }

    /// Forgets the event history: watches resuming from an older resourceVersion get 410 Gone.
    pub fn compact(&mut self) {
        self.history.clear();
        self.oldest_resumable = self.rv;
    }

    /// Ends every open watch, as an API server restart or a load balancer timeout would.
    pub fn close_watches(&mut self) {
        self.watchers.clear();
    }

    fn objects_of(&self, res: &ResKey) -> Option<&BTreeMap<ObjKey, Value>> {
        self.objects.get(res)
    }

    /// Every object of a resource, as stored, by reference.
    pub fn stored(&self, res: &ResKey) -> impl Iterator<Item = &Value> {
        self.objects_of(res).into_iter().flat_map(|m| m.values())
    }

    /// A snapshot of every object of a resource, as stored.
    pub fn snapshot(&self, res: &ResKey) -> Vec<Value> {
        self.objects_of(res)
            .map(|m| m.values().cloned().collect())
            .unwrap_or_default()
    }

    pub fn present(&self, rt: &ResourceType, obj: &Value, version: &str) -> Value {
        let mut o = obj.clone();
        if let Some(m) = o.as_object_mut() {
            m.insert("apiVersion".into(), json!(rt.api_version(version)));
            m.insert("kind".into(), json!(rt.kind));
        }
        o
    }

    fn key_for(rt: &ResourceType, ns: Option<&str>, name: &str) -> ObjKey {
        (
            if rt.namespaced {
                ns.unwrap_or("").to_string()
            } else {
                String::new()
            },
            name.to_string(),
        )
    }

    pub fn get(&self, rt: &ResourceType, ns: Option<&str>, name: &str) -> ApiResult<Value> {
        self.objects_of(&rt.key())
            .and_then(|m| m.get(&Self::key_for(rt, ns, name)))
            .cloned()
            .ok_or_else(|| ApiError::not_found(&rt.group, &rt.plural, name))
    }

    /// Objects in `ns` (all namespaces when None) matching the selectors, in name order,
    /// starting after `after` (a continue position): at most `limit` of them, how many more
    /// match, and the current resourceVersion. Only the page is copied: copying every
    /// match and cutting the page after made each page of a paged list cost the whole
    /// store, and a paged list of 10,000 Proxies cost 20 copies of it.
    pub fn list(
        &self,
        rt: &ResourceType,
        ns: Option<&str>,
        (labels, fields): (&LabelSelector, &FieldSelector),
        after: Option<&(String, String)>,
        limit: Option<usize>,
    ) -> (Vec<(ObjKey, Value)>, usize, u64) {
        use std::ops::Bound;
        let Some(m) = self.objects_of(&rt.key()) else {
            return (Vec::new(), 0, self.rv);
        };
        let from = match after {
            Some(a) => Bound::Excluded(a.clone()),
            None => Bound::Unbounded,
        };
        let mut matching = m
            .range((from, Bound::Unbounded))
            .filter(|(k, _)| ns.is_none_or(|ns| k.0 == ns))
            .filter(|(_, v)| crate::selector::selects(labels, v) && fields.matches_object(v));
        let items: Vec<(ObjKey, Value)> = matching
            .by_ref()
            .take(limit.unwrap_or(usize::MAX))
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        (items, matching.count(), self.rv)
    }

    fn namespace_state(&self, ns: &str) -> Option<bool> {
        self.objects
            .get(&ResKey {
                group: String::new(),
                plural: "namespaces".into(),
            })
            .and_then(|m| m.get(&(String::new(), ns.to_string())))
            .map(is_deleting)
    }

    fn require_namespace(&self, rt: &ResourceType, ns: &str, name: &str) -> ApiResult<()> {
        match self.namespace_state(ns) {
            None => Err(ApiError::not_found("", "namespaces", ns)),
            Some(true) => Err(ApiError::forbidden(format!(
                "{} \"{name}\" is forbidden: unable to create new content in namespace {ns} because it is being terminated",
                group_resource(&rt.group, &rt.plural)
            ))
            .with_details(json!({"name": name, "group": rt.group, "kind": rt.plural,
                "causes": [{"reason": "NamespaceTerminating", "message": format!("namespace {ns} is being terminated"), "field": "metadata.namespace"}]}))),
            Some(false) => Ok(()),
        }
    }

    fn check_identity(rt: &ResourceType, obj: &Value) -> ApiResult<()> {
        if let Some(kind) = obj.get("kind").and_then(Value::as_str)
            && kind != rt.kind
        {
            return Err(ApiError::bad_request(format!(
                "the kind in the body ({kind}) does not match the kind of the resource ({})",
                rt.kind
            )));
        }
        if let Some(av) = obj.get("apiVersion").and_then(Value::as_str) {
            let (group, version) = match av.rsplit_once('/') {
                Some((g, v)) => (g, v),
                None => ("", av),
            };
            if group != rt.group || !rt.versions.iter().any(|v| v == version) {
                return Err(ApiError::bad_request(format!(
                    "the API version in the data ({av}) does not match the expected API version ({})",
                    rt.api_version(&rt.versions[0])
                )));
            }
        }
        Ok(())
    }

    /// Kind-specific defaulting and validation that a real server's strategies do.
    fn prepare_kind(
        &self,
        rt: &ResourceType,
        old: Option<&Value>,
        obj: &mut Value,
        ctx: &mut WriteCtx,
    ) -> ApiResult<()> {
        let name = name_of(obj);
        match (rt.group.as_str(), rt.plural.as_str()) {
            ("", "secrets") => {
                if let Some(Value::Object(sd)) =
                    obj.as_object_mut().and_then(|o| o.remove("stringData"))
                {
                    for (k, v) in sd {
                        let s = v.as_str().unwrap_or_default();
                        obj["data"][k] = json!(data_encoding::BASE64.encode(s.as_bytes()));
                    }
                }
                if let Some(data) = obj.get("data").and_then(Value::as_object) {
                    for (k, v) in data {
                        let ok = v
                            .as_str()
                            .is_some_and(|s| data_encoding::BASE64.decode(s.as_bytes()).is_ok());
                        if !ok {
                            return Err(ApiError::bad_request(format!(
                                "Secret in version \"v1\" cannot be handled as a Secret: illegal base64 data in data.{k}"
                            )));
                        }
                    }
                }
                if obj.get("type").is_none_or(Value::is_null) {
                    obj["type"] = json!("Opaque");
                }
                if let Some(old) = old
                    && old.get("type") != obj.get("type")
                {
                    return Err(ApiError::invalid(
                        "Secret",
                        "",
                        &name,
                        vec![(
                            "FieldValueInvalid".into(),
                            "type".into(),
                            "Invalid value: field is immutable".into(),
                        )],
                    ));
                }
            }
            ("", "namespaces") => {
                if !is_dns_label(&name) {
                    return Err(ApiError::invalid(
                        "Namespace",
                        "",
                        &name,
                        vec![(
                            "FieldValueInvalid".into(),
                            "metadata.name".into(),
                            format!(
                                "Invalid value: \"{name}\": a lowercase RFC 1123 label must consist of lower case alphanumeric characters or '-'"
                            ),
                        )],
                    ));
                }
                match old {
                    None => {
                        obj["spec"] = json!({"finalizers": ["kubernetes"]});
                        obj["status"] = json!({"phase": "Active"});
                    }
                    // spec.finalizers belongs to the namespace controller (the `finalize`
                    // subresource on a cluster), so updates keep it.
                    Some(old) => obj["spec"] = old.get("spec").cloned().unwrap_or(json!({})),
                }
            }
            ("apiextensions.k8s.io", "customresourcedefinitions") => {
                let t = crate::registry::type_from_crd(obj).map_err(|errs| {
                    ApiError::invalid(
                        "CustomResourceDefinition",
                        "apiextensions.k8s.io",
                        &name,
                        errs.into_iter()
                            .map(|(f, m)| ("FieldValueInvalid".into(), f, m))
                            .collect(),
                    )
                })?;
                if let Some(existing) = self.registry.get(&t.key())
                    && !existing.from_crd
                {
                    return Err(ApiError::invalid(
                        "CustomResourceDefinition",
                        "apiextensions.k8s.io",
                        &name,
                        vec![(
                            "FieldValueInvalid".into(),
                            "spec.group".into(),
                            "Invalid value: the resource is built in".into(),
                        )],
                    ));
                }
                if old.is_none() {
                    let mut fins = finalizers_of(obj);
                    if !fins.iter().any(|f| f == FINALIZER_CRD_CLEANUP) {
                        fins.push(FINALIZER_CRD_CLEANUP.into());
                    }
                    set_finalizers(obj, &fins);
                }
                let storage = obj
                    .pointer("/spec/versions")
                    .and_then(Value::as_array)
                    .and_then(|vs| {
                        vs.iter()
                            .find(|v| v.get("storage").and_then(Value::as_bool) == Some(true))
                    })
                    .and_then(|v| v.get("name").cloned())
                    .unwrap_or(Value::Null);
                let mut stored: Vec<Value> = old
                    .and_then(|o| o.pointer("/status/storedVersions"))
                    .and_then(Value::as_array)
                    .cloned()
                    .unwrap_or_default();
                if !stored.contains(&storage) {
                    stored.push(storage);
                }
                let now = now();
                let conditions = old
                    .and_then(|o| o.pointer("/status/conditions"))
                    .cloned()
                    .unwrap_or_else(|| {
                        json!([
                            {"type": "NamesAccepted", "status": "True", "reason": "NoConflicts",
                             "message": "no conflicts found", "lastTransitionTime": now},
                            {"type": "Established", "status": "True", "reason": "InitialNamesAccepted",
                             "message": "the initial names have been accepted", "lastTransitionTime": now},
                        ])
                    });
                obj["status"] = json!({
                    "conditions": conditions,
                    "acceptedNames": obj.pointer("/spec/names").cloned().unwrap_or(json!({})),
                    "storedVersions": stored,
                });
            }
            _ => {}
        }
        if rt.from_crd
            && let Some(schema) = rt.schema(&ctx.version).cloned()
        {
            let (causes, pruned) = schema::normalize(&schema, obj);
            if !causes.is_empty() {
                return Err(ApiError::invalid(&rt.kind, &rt.group, &name, causes));
            }
            if !pruned.is_empty() {
                match ctx.field_validation {
                    FieldValidation::Strict => {
                        let list: Vec<String> = pruned
                            .iter()
                            .map(|p| format!("unknown field \"{p}\""))
                            .collect();
                        return Err(ApiError::bad_request(format!(
                            "{} in version \"{}\" cannot be handled as a {}: strict decoding error: {}",
                            rt.kind,
                            rt.api_version(&ctx.version),
                            rt.kind,
                            list.join(", ")
                        )));
                    }
                    FieldValidation::Warn => {
                        ctx.warnings
                            .extend(pruned.iter().map(|p| format!("unknown field \"{p}\"")));
                    }
                    FieldValidation::Ignore => {}
                }
            }
        }
        Ok(())
    }

    fn root_schema(rt: &ResourceType, version: &str) -> Value {
        managed::root_schema(rt.schema(version).or_else(|| rt.schemas.values().next()))
    }

    fn writer<'a>(
        ctx: &'a WriteCtx,
        api_version: &'a str,
        now: &'a str,
        scope: Scope,
    ) -> Writer<'a> {
        Writer {
            manager: ctx.manager(),
            api_version,
            now,
            scope,
        }
    }

    fn main_scope(rt: &ResourceType) -> Scope {
        Scope::Main {
            exclude_status: rt.status_subresource,
        }
    }

    pub fn create(
        &mut self,
        rt: &ResourceType,
        ns: Option<&str>,
        body: Value,
        ctx: &mut WriteCtx,
    ) -> ApiResult<Value> {
        self.create_inner(rt, ns, body, ctx, false)
    }

    /// `managed_done`: the managedFields were already computed (server-side apply).
    fn create_inner(
        &mut self,
        rt: &ResourceType,
        ns: Option<&str>,
        body: Value,
        ctx: &mut WriteCtx,
        managed_done: bool,
    ) -> ApiResult<Value> {
        if rt.storage == Storage::Review {
            return Err(ApiError::method_not_allowed(
                "reviews are answered by the server",
            ));
        }
        let mut obj = body;
        if !obj.is_object() {
            return Err(ApiError::bad_request(
                "the body of the request must be a JSON object",
            ));
        }
        Self::check_identity(rt, &obj)?;
        let body_ns = meta_str(&obj, "namespace").map(String::from);
        let meta = meta_mut(&mut obj);
        if rt.namespaced {
            let ns = ns.ok_or_else(|| {
                ApiError::bad_request("a namespace is required for a namespaced resource")
            })?;
            if body_ns.as_deref().is_some_and(|b| !b.is_empty() && b != ns) {
                return Err(ApiError::bad_request(
                    "the namespace of the provided object does not match the namespace sent on the request",
                ));
            }
            meta.insert("namespace".into(), json!(ns));
        } else {
            meta.remove("namespace");
        }
        if meta
            .get("resourceVersion")
            .and_then(Value::as_str)
            .is_some_and(|s| !s.is_empty())
        {
            return Err(ApiError::bad_request(
                "resourceVersion should not be set on objects to be created",
            ));
        }
        let mut name = meta
            .get("name")
            .and_then(Value::as_str)
            .unwrap_or("")
            .to_string();
        let generate = meta
            .get("generateName")
            .and_then(Value::as_str)
            .unwrap_or("")
            .to_string();
        if name.is_empty() {
            if generate.is_empty() {
                return Err(ApiError::invalid(
                    &rt.kind,
                    &rt.group,
                    "",
                    vec![(
                        "FieldValueRequired".into(),
                        "metadata.name".into(),
                        "Required value: name or generateName is required".into(),
                    )],
                ));
            }
            let stem: String = generate.chars().take(58).collect();
            loop {
                name = format!("{stem}{}", self.random_suffix());
                if self.get(rt, ns, &name).is_err() {
                    break;
                }
            }
        }
        if !is_dns_subdomain(&name) {
            return Err(ApiError::invalid(
                &rt.kind,
                &rt.group,
                &name,
                vec![(
                    "FieldValueInvalid".into(),
                    "metadata.name".into(),
                    format!(
                        "Invalid value: \"{name}\": a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', and must start and end with an alphanumeric character"
                    ),
                )],
            ));
        }
        if rt.namespaced {
            self.require_namespace(rt, ns.unwrap_or(""), &name)?;
        }
        if self.get(rt, ns, &name).is_ok() {
            return Err(ApiError::already_exists(&rt.group, &rt.plural, &name));
        }
        let uid = self.new_uid();
        let now = now();
        let meta = meta_mut(&mut obj);
        meta.insert("name".into(), json!(name));
        meta.insert("uid".into(), json!(uid));
        meta.insert("creationTimestamp".into(), json!(now));
        meta.remove("deletionTimestamp");
        meta.remove("deletionGracePeriodSeconds");
        meta.remove("selfLink");
        if !managed_done {
            meta.remove("managedFields");
        }
        if rt.has_generation {
            meta.insert("generation".into(), json!(1));
        } else {
            meta.remove("generation");
        }
        if rt.status_subresource && rt.from_crd {
            obj.as_object_mut().expect("object").remove("status");
        }
        self.prepare_kind(rt, None, &mut obj, ctx)?;
        let api_version = rt.api_version(&ctx.version);
        obj["apiVersion"] = json!(api_version);
        obj["kind"] = json!(rt.kind);
        if !managed_done {
            let root = Self::root_schema(rt, &ctx.version);
            let w = Self::writer(
                ctx,
                &api_version,
                &now,
                Scope::Main {
                    exclude_status: false,
                },
            );
            managed::track_update(None, &mut obj, &root, &w);
        }
        if ctx.dry_run {
            return Ok(obj);
        }
        let rv = self.next_rv();
        meta_mut(&mut obj).insert("resourceVersion".into(), json!(rv.to_string()));
        let key = Self::key_for(rt, ns, &name);
        self.objects
            .entry(rt.key())
            .or_default()
            .insert(key, obj.clone());
        if rt.group == "apiextensions.k8s.io" && rt.plural == "customresourcedefinitions" {
            self.register_crd(&obj);
        }
        self.emit(&rt.key(), ChangeKind::Added, None, obj.clone());
        self.settle_after_write(&obj);
        Ok(obj)
    }

    fn register_crd(&mut self, crd: &Value) {
        if let Ok(t) = crate::registry::type_from_crd(crd) {
            self.registry.insert(t);
        }
    }

    /// PUT of the main resource or of `/status`.
    pub fn update(
        &mut self,
        rt: &ResourceType,
        ns: Option<&str>,
        name: &str,
        body: Value,
        scope: Scope,
        ctx: &mut WriteCtx,
    ) -> ApiResult<Value> {
        let old = self.get(rt, ns, name)?;
        let body_rv = meta_str(&body, "resourceVersion").unwrap_or("").to_string();
        if body_rv.is_empty() && rt.from_crd {
            return Err(ApiError::invalid(
                &rt.kind,
                &rt.group,
                name,
                vec![(
                    "FieldValueInvalid".into(),
                    "metadata.resourceVersion".into(),
                    "Invalid value: 0x0: must be specified for an update".into(),
                )],
            ));
        }
        if !body_rv.is_empty() && meta_str(&old, "resourceVersion") != Some(body_rv.as_str()) {
            return Err(ApiError::stale(&rt.group, &rt.plural, name));
        }
        self.write_over(rt, ns, name, old, body, scope, ctx, true)
    }

    /// Builds the new state from a full body and commits it: shared by PUT and the patches.
    #[allow(clippy::too_many_arguments)]
    fn write_over(
        &mut self,
        rt: &ResourceType,
        ns: Option<&str>,
        name: &str,
        old: Value,
        body: Value,
        scope: Scope,
        ctx: &mut WriteCtx,
        track: bool,
    ) -> ApiResult<Value> {
        if !body.is_object() {
            return Err(ApiError::bad_request(
                "the body of the request must be a JSON object",
            ));
        }
        Self::check_identity(rt, &body)?;
        if let Some(n) = meta_str(&body, "name")
            && n != name
        {
            return Err(ApiError::bad_request(format!(
                "the name of the object ({n}) does not match the name on the URL ({name})"
            )));
        }
        if rt.namespaced
            && let Some(n) = meta_str(&body, "namespace")
            && !n.is_empty()
            && Some(n) != ns
        {
            return Err(ApiError::bad_request(
                "the namespace of the provided object does not match the namespace sent on the request",
            ));
        }
        let new = match scope {
            // Only update_scale and patch_scale write through the scale subresource.
            Scope::Scale => {
                return Err(ApiError::new(
                    500,
                    "InternalError",
                    "Internal error occurred: a scale write must go through the scale handler",
                ));
            }
            Scope::Status => {
                let mut n = old.clone();
                match body.get("status") {
                    Some(s) => n["status"] = s.clone(),
                    None => {
                        n.as_object_mut().expect("object").remove("status");
                    }
                }
                n
            }
            Scope::Main { .. } => {
                let mut n = body;
                let old_meta = old.get("metadata").cloned().unwrap_or(json!({}));
                let meta = meta_mut(&mut n);
                for k in [
                    "name",
                    "namespace",
                    "uid",
                    "creationTimestamp",
                    "deletionTimestamp",
                    "deletionGracePeriodSeconds",
                    "generation",
                    "managedFields",
                ] {
                    match old_meta.get(k) {
                        Some(v) => meta.insert(k.into(), v.clone()),
                        None => meta.remove(k),
                    };
                }
                if rt.status_subresource {
                    match old.get("status") {
                        Some(s) => n["status"] = s.clone(),
                        None => {
                            n.as_object_mut().expect("object").remove("status");
                        }
                    }
                }
                n
            }
        };
        self.commit_update(rt, ns, name, old, new, scope, ctx, track)
    }

    #[allow(clippy::too_many_arguments)]
    fn commit_update(
        &mut self,
        rt: &ResourceType,
        ns: Option<&str>,
        name: &str,
        old: Value,
        mut new: Value,
        scope: Scope,
        ctx: &mut WriteCtx,
        track: bool,
    ) -> ApiResult<Value> {
        if is_deleting(&old) {
            let before = finalizers_of(&old);
            if finalizers_of(&new).iter().any(|f| !before.contains(f)) {
                return Err(ApiError::invalid(
                    &rt.kind,
                    &rt.group,
                    name,
                    vec![(
                        "FieldValueForbidden".into(),
                        "metadata.finalizers".into(),
                        "Forbidden: no new finalizers can be added if the object is being deleted"
                            .into(),
                    )],
                ));
            }
        }
        self.prepare_kind(rt, Some(&old), &mut new, ctx)?;
        let api_version = rt.api_version(&ctx.version);
        new["apiVersion"] = json!(api_version);
        new["kind"] = json!(rt.kind);
        let now = now();
        if track {
            let root = Self::root_schema(rt, &ctx.version);
            let w = Self::writer(ctx, &api_version, &now, scope);
            managed::track_update(Some(&old), &mut new, &root, &w);
        }
        if content(&old) == content(&new) {
            // A no-op write changes nothing, not even the resourceVersion, like a real server.
            return Ok(old);
        }
        if rt.has_generation
            && spec_part(&old, rt.status_subresource) != spec_part(&new, rt.status_subresource)
        {
            let g = old
                .pointer("/metadata/generation")
                .and_then(Value::as_i64)
                .unwrap_or(0);
            meta_mut(&mut new).insert("generation".into(), json!(g + 1));
        }
        if ctx.dry_run {
            return Ok(new);
        }
        let rv = self.next_rv();
        meta_mut(&mut new).insert("resourceVersion".into(), json!(rv.to_string()));
        let key = Self::key_for(rt, ns, name);
        if is_deleting(&new) && !pending_finalizers(&new, rt) {
            self.objects
                .entry(rt.key())
                .or_default()
                .insert(key.clone(), new.clone());
            let gone = self.remove(&rt.key(), &key);
            self.settle();
            return Ok(gone.unwrap_or(new));
        }
        self.objects
            .entry(rt.key())
            .or_default()
            .insert(key, new.clone());
        if rt.group == "apiextensions.k8s.io" && rt.plural == "customresourcedefinitions" {
            self.register_crd(&new);
        }
        self.emit(&rt.key(), ChangeKind::Modified, Some(old), new.clone());
        self.settle_after_write(&new);
        Ok(new)
    }

    /// PATCH of any type. Returns the object and whether it was created (apply only).
    #[allow(clippy::too_many_arguments)]
    pub fn patch(
        &mut self,
        rt: &ResourceType,
        ns: Option<&str>,
        name: &str,
        ptype: PatchType,
        body: &[u8],
        scope: Scope,
        ctx: &mut WriteCtx,
    ) -> ApiResult<(Value, bool)> {
        if ptype == PatchType::Apply {
            return self.apply(rt, ns, name, body, scope, ctx);
        }
        if ptype == PatchType::Strategic && rt.from_crd {
            return Err(ApiError::unsupported_media_type(
                "the body of the request was in an unknown format - accepted media types include: application/json-patch+json, application/merge-patch+json, application/apply-patch+yaml",
            ));
        }
        let old = self.get(rt, ns, name)?;
        let shown = self.present(rt, &old, &ctx.version);
        let patched = match ptype {
            PatchType::Json => patch::json_patch(&shown, body)?,
            PatchType::Merge => patch::merge_patch(&shown, body)?,
            _ => patch::strategic_merge_patch(&shown, body)?,
        };
        if let Some(rv) = meta_str(&patched, "resourceVersion")
            && Some(rv) != meta_str(&old, "resourceVersion")
        {
            return Err(ApiError::stale(&rt.group, &rt.plural, name));
        }
        Ok((
            self.write_over(rt, ns, name, old, patched, scope, ctx, true)?,
            false,
        ))
    }

    fn apply(
        &mut self,
        rt: &ResourceType,
        ns: Option<&str>,
        name: &str,
        body: &[u8],
        scope: Scope,
        ctx: &mut WriteCtx,
    ) -> ApiResult<(Value, bool)> {
        if ctx.field_manager.as_deref().is_none_or(str::is_empty) {
            return Err(ApiError::bad_request(
                "PATCH, application/apply-patch+yaml: fieldManager is required for apply requests",
            ));
        }
        let cfg: Value = serde_yaml::from_slice(body)
            .map_err(|e| ApiError::bad_request(format!("error decoding YAML: {e}")))?;
        if !cfg.is_object() {
            return Err(ApiError::bad_request(
                "an applied configuration must be an object",
            ));
        }
        if cfg
            .get("apiVersion")
            .and_then(Value::as_str)
            .is_none_or(str::is_empty)
            || cfg
                .get("kind")
                .and_then(Value::as_str)
                .is_none_or(str::is_empty)
        {
            return Err(ApiError::bad_request(
                "apiVersion and kind must be set in an applied configuration",
            ));
        }
        Self::check_identity(rt, &cfg)?;
        match meta_str(&cfg, "name") {
            Some(n) if n == name => {}
            Some(n) => {
                return Err(ApiError::bad_request(format!(
                    "the name of the object ({n}) does not match the name on the URL ({name})"
                )));
            }
            // The name comes from the URL, as on a real server (kube-lease-manager relies on it).
            None => {}
        }
        if rt.namespaced
            && let Some(n) = meta_str(&cfg, "namespace")
            && Some(n) != ns
        {
            return Err(ApiError::bad_request(
                "the namespace of the provided object does not match the namespace sent on the request",
            ));
        }
        let api_version = rt.api_version(&ctx.version);
        let now = now();
        let root = Self::root_schema(rt, &ctx.version);
        let conflict_error = |conflicts| apply_conflict(rt, name, conflicts);
        match self.get(rt, ns, name) {
            Err(_) if !matches!(scope, Scope::Main { .. }) => {
                Err(ApiError::not_found(&rt.group, &rt.plural, name))
            }
            Err(_) => {
                let mut skeleton =
                    json!({"apiVersion": api_version, "kind": rt.kind, "metadata": {"name": name}});
                if rt.namespaced {
                    skeleton["metadata"]["namespace"] = json!(ns);
                }
                let w = Self::writer(ctx, &api_version, &now, Self::main_scope(rt));
                let mut new = managed::apply(&skeleton, &cfg, &root, &w, ctx.force)
                    .map_err(conflict_error)?;
                // Apply never sets status on create of a kind with a status subresource,
                // but the skeleton keeps the applied metadata (labels, finalizers, ...).
                meta_mut(&mut new).remove("resourceVersion");
                let created = self.create_inner(rt, ns, new, ctx, true)?;
                Ok((created, true))
            }
            Ok(live) => {
                if let Some(rv) = meta_str(&cfg, "resourceVersion")
                    && Some(rv) != meta_str(&live, "resourceVersion")
                {
                    return Err(ApiError::stale(&rt.group, &rt.plural, name));
                }
                let scope = match scope {
                    Scope::Main { .. } => Self::main_scope(rt),
                    other => other,
                };
                let w = Self::writer(ctx, &api_version, &now, scope);
                let new =
                    managed::apply(&live, &cfg, &root, &w, ctx.force).map_err(conflict_error)?;
                Ok((
                    self.commit_update(rt, ns, name, live, new, scope, ctx, false)?,
                    false,
                ))
            }
        }
    }

    /// GET of `/scale`. A parent with no value at `specReplicasPath` has no Scale to show:
    /// the real server answers 500 and so do we.
    pub fn get_scale(
        &self,
        rt: &ResourceType,
        ns: Option<&str>,
        name: &str,
        paths: &ScalePaths,
    ) -> ApiResult<Value> {
        let obj = self.get(rt, ns, name)?;
        match scale::scale_of(&obj, paths)? {
            (s, true) => Ok(s),
            (_, false) => Err(ApiError::new(
                500,
                "InternalError",
                format!(
                    "Internal error occurred: the spec replicas field \"{}\" does not exist",
                    paths.spec_replicas
                ),
            )),
        }
    }

    /// PUT of `/scale`: the body is a Scale; unlike a PUT of the parent it may leave out
    /// `metadata.resourceVersion` (then nothing is checked).
    pub fn update_scale(
        &mut self,
        rt: &ResourceType,
        ns: Option<&str>,
        name: &str,
        paths: &ScalePaths,
        body: Value,
        ctx: &mut WriteCtx,
    ) -> ApiResult<Value> {
        let old = self.get(rt, ns, name)?;
        scale::check_identity(&body, name)?;
        self.write_scale(rt, ns, name, paths, old, &body, ctx)
    }

    /// PATCH of `/scale`: the patch applies to the Scale the server would show, never to
    /// the parent, so a patch can only change `spec.replicas`. Strategic merge patch is
    /// accepted (Scale is a built-in type) even though the parent is a custom resource.
    #[allow(clippy::too_many_arguments)]
    pub fn patch_scale(
        &mut self,
        rt: &ResourceType,
        ns: Option<&str>,
        name: &str,
        paths: &ScalePaths,
        ptype: PatchType,
        body: &[u8],
        ctx: &mut WriteCtx,
    ) -> ApiResult<Value> {
        let old = self.get(rt, ns, name)?;
        if ptype == PatchType::Apply {
            return self.apply_scale(rt, ns, name, paths, old, body, ctx);
        }
        let before = scale::scale_before_write(&old, paths)?;
        let patched = match ptype {
            PatchType::Json => patch::json_patch(&before, body)?,
            PatchType::Merge => patch::merge_patch(&before, body)?,
            _ => patch::strategic_merge_patch(&before, body)?,
        };
        scale::check_identity(&patched, name)?;
        self.write_scale(rt, ns, name, paths, old, &patched, ctx)
    }

    /// Server-side apply of a Scale: the applied `spec.replicas` is owned by the manager
    /// with subresource `scale`, and conflicts with whoever else owns the parent field.
    #[allow(clippy::too_many_arguments)]
    fn apply_scale(
        &mut self,
        rt: &ResourceType,
        ns: Option<&str>,
        name: &str,
        paths: &ScalePaths,
        live: Value,
        body: &[u8],
        ctx: &mut WriteCtx,
    ) -> ApiResult<Value> {
        if ctx.field_manager.as_deref().is_none_or(str::is_empty) {
            return Err(ApiError::bad_request(
                "PATCH, application/apply-patch+yaml: fieldManager is required for apply requests",
            ));
        }
        let cfg: Value = serde_yaml::from_slice(body)
            .map_err(|e| ApiError::bad_request(format!("error decoding YAML: {e}")))?;
        let typed = |k: &str| {
            cfg.get(k)
                .and_then(Value::as_str)
                .is_some_and(|s| !s.is_empty())
        };
        if !typed("apiVersion") || !typed("kind") {
            return Err(ApiError::bad_request(
                "apiVersion and kind must be set in an applied configuration",
            ));
        }
        scale::check_identity(&cfg, name)?;
        Self::check_scale_precondition(rt, name, &live, &cfg)?;
        let api_version = rt.api_version(&ctx.version);
        let parent_cfg = scale::parent_apply_config(&cfg, &api_version, &rt.kind, name, paths)?;
        let now = now();
        let root = Self::root_schema(rt, &ctx.version);
        let w = Self::writer(ctx, &api_version, &now, Scope::Scale);
        let new = managed::apply(&live, &parent_cfg, &root, &w, ctx.force)
            .map_err(|c| apply_conflict(rt, name, c))?;
        let stored = self.commit_update(rt, ns, name, live, new, Scope::Scale, ctx, false)?;
        Self::scale_after_write(&stored, paths)
    }

    /// A resourceVersion in the Scale a client sent is a precondition on the parent.
    fn check_scale_precondition(
        rt: &ResourceType,
        name: &str,
        live: &Value,
        scale: &Value,
    ) -> ApiResult<()> {
        match scale
            .pointer("/metadata/resourceVersion")
            .and_then(Value::as_str)
        {
            Some(rv) if !rv.is_empty() && Some(rv) != meta_str(live, "resourceVersion") => {
                Err(ApiError::stale(&rt.group, &rt.plural, name))
            }
            _ => Ok(()),
        }
    }

    /// Stores the parent with the Scale's `spec.replicas` at `specReplicasPath`: an
    /// ordinary update from there on (validation, generation, resourceVersion, watchers).
    #[allow(clippy::too_many_arguments)]
    fn write_scale(
        &mut self,
        rt: &ResourceType,
        ns: Option<&str>,
        name: &str,
        paths: &ScalePaths,
        old: Value,
        scale: &Value,
        ctx: &mut WriteCtx,
    ) -> ApiResult<Value> {
        let replicas = scale::replicas_of(scale, paths)?;
        Self::check_scale_precondition(rt, name, &old, scale)?;
        let mut new = old.clone();
        scale::set_replicas(&mut new, &paths.spec_replicas, replicas)?;
        let stored = self.commit_update(rt, ns, name, old, new, Scope::Scale, ctx, true)?;
        Self::scale_after_write(&stored, paths)
    }

    fn scale_after_write(stored: &Value, paths: &ScalePaths) -> ApiResult<Value> {
        scale::scale_of(stored, paths)
            .map(|(s, _)| s)
            .map_err(|e| ApiError::bad_request(e.message))
    }

    pub fn delete(
        &mut self,
        rt: &ResourceType,
        ns: Option<&str>,
        name: &str,
        opts: &DeleteOpts,
    ) -> ApiResult<Deleted> {
        let old = self.get(rt, ns, name)?;
        if let Some(uid) = &opts.precondition_uid
            && *uid != uid_of(&old)
        {
            return Err(ApiError::conflict(
                &rt.group,
                &rt.plural,
                name,
                &format!(
                    "Precondition failed: UID in precondition: {uid}, UID in object meta: {}",
                    uid_of(&old)
                ),
            ));
        }
        if let Some(rv) = &opts.precondition_rv
            && Some(rv.as_str()) != meta_str(&old, "resourceVersion")
        {
            return Err(ApiError::conflict(
                &rt.group,
                &rt.plural,
                name,
                &format!(
                    "Precondition failed: ResourceVersion in precondition: {rv}, ResourceVersion in object meta: {}",
                    meta_str(&old, "resourceVersion").unwrap_or("")
                ),
            ));
        }
        if opts.dry_run {
            return Ok(if pending_finalizers(&old, rt) {
                Deleted::Pending(old)
            } else {
                Deleted::Gone(old)
            });
        }
        let out = self.delete_internal(&rt.key(), &Self::key_for(rt, ns, name), opts.propagation);
        self.settle();
        Ok(out.unwrap_or(Deleted::Gone(old)))
    }

    /// Starts deletion: marks objects that finalizers hold, removes the rest.
    fn delete_internal(
        &mut self,
        res: &ResKey,
        key: &ObjKey,
        policy: Option<Propagation>,
    ) -> Option<Deleted> {
        let rt = self.registry.get(res)?.clone();
        let old = self.objects.get(res)?.get(key)?.clone();
        let mut new = old.clone();
        if !is_deleting(&old) {
            let mut fins = finalizers_of(&old);
            let extra = match policy {
                Some(Propagation::Foreground) => Some(FINALIZER_FOREGROUND),
                Some(Propagation::Orphan) => Some(FINALIZER_ORPHAN),
                _ => None,
            };
            if let Some(f) = extra
                && !fins.iter().any(|x| x == f)
            {
                fins.push(f.into());
            }
            set_finalizers(&mut new, &fins);
        }
        if !pending_finalizers(&new, &rt) {
            return self.remove(res, key).map(Deleted::Gone);
        }
        if is_deleting(&old) {
            return Some(Deleted::Pending(old));
        }
        let meta = meta_mut(&mut new);
        meta.insert("deletionTimestamp".into(), json!(now()));
        meta.insert("deletionGracePeriodSeconds".into(), json!(0));
        if let Some(g) = meta.get("generation").and_then(Value::as_i64) {
            meta.insert("generation".into(), json!(g + 1));
        }
        if rt.group.is_empty() && rt.plural == "namespaces" {
            new["status"]["phase"] = json!("Terminating");
        }
        let rv = self.next_rv();
        meta_mut(&mut new).insert("resourceVersion".into(), json!(rv.to_string()));
        self.objects.get_mut(res)?.insert(key.clone(), new.clone());
        self.emit(res, ChangeKind::Modified, Some(old), new.clone());
        Some(Deleted::Pending(new))
    }

    /// Removes an object for good and reports DELETED.
    fn remove(&mut self, res: &ResKey, key: &ObjKey) -> Option<Value> {
        let mut obj = self.objects.get_mut(res)?.remove(key)?;
        let rv = self.next_rv();
        meta_mut(&mut obj).insert("resourceVersion".into(), json!(rv.to_string()));
        if res.group == "apiextensions.k8s.io"
            && res.plural == "customresourcedefinitions"
            && let Ok(t) = crate::registry::type_from_crd(&obj)
        {
            let gone = t.key();
            self.registry.remove(&gone);
            self.objects.remove(&gone);
            self.watchers.retain(|w| w.res != gone);
        }
        self.emit(res, ChangeKind::Deleted, None, obj.clone());
        Some(obj)
    }

    /// Applies a change to an object on behalf of a built-in controller.
    fn controller_update(&mut self, res: &ResKey, key: &ObjKey, f: impl FnOnce(&mut Value)) {
        let Some(rt) = self.registry.get(res).cloned() else {
            return;
        };
        let Some(old) = self.objects.get(res).and_then(|m| m.get(key)).cloned() else {
            return;
        };
        let mut new = old.clone();
        f(&mut new);
        if new == old {
            return;
        }
        let rv = self.next_rv();
        meta_mut(&mut new).insert("resourceVersion".into(), json!(rv.to_string()));
        if is_deleting(&new) && !pending_finalizers(&new, &rt) {
            if let Some(m) = self.objects.get_mut(res) {
                m.insert(key.clone(), new);
            }
            self.remove(res, key);
            return;
        }
        if let Some(m) = self.objects.get_mut(res) {
            m.insert(key.clone(), new.clone());
        }
        self.emit(res, ChangeKind::Modified, Some(old), new);
    }

    fn remove_finalizer(&mut self, res: &ResKey, key: &ObjKey, finalizer: &str) {
        self.controller_update(res, key, |o| {
            let fins: Vec<String> = finalizers_of(o)
                .into_iter()
                .filter(|f| f != finalizer)
                .collect();
            set_finalizers(o, &fins);
        });
    }

    /// [`Store::settle`] after a create or update that left `obj` in the store. Settling
    /// scans every object, which makes each write cost O(objects) (minutes for thousands of
    /// writes to thousands of objects); it is skipped when it cannot find anything: the last
    /// settle left no object deleting, and this one neither is deleting nor names owners
    /// (whose absence GC would act on). Removals always settle.
    fn settle_after_write(&mut self, obj: &Value) {
        // A write with nothing deleting (the last settle left nothing to do) can start
        // garbage collection only if the object is deleting or one of its owners is gone.
        // Checked here by the owners' keys, since a settle scans every object: at 10,000
        // owned Secrets, the settle after each create took half the CPU of a scale run.
        if self.quiet && !is_deleting(obj) && self.owners_present(obj) {
            return;
        }
        self.settle();
    }

    /// Whether every owner `obj` names exists under that UID (true when it names none).
    fn owners_present(&self, obj: &Value) -> bool {
        let Some(refs) = obj
            .pointer("/metadata/ownerReferences")
            .and_then(Value::as_array)
        else {
            return true;
        };
        let ns = meta_str(obj, "namespace").unwrap_or("");
        refs.iter().all(|r| {
            let field = |f: &str| r.get(f).and_then(Value::as_str).unwrap_or("");
            let group = field("apiVersion").rsplit_once('/').map_or("", |(g, _)| g);
            let Some(t) = self
                .registry
                .types()
                .find(|t| t.group == group && t.kind == field("kind"))
            else {
                return false;
            };
            let key = (
                if t.namespaced { ns } else { "" }.to_string(),
                field("name").to_string(),
            );
            self.objects
                .get(&t.key())
                .and_then(|m| m.get(&key))
                .is_some_and(|o| meta_str(o, "uid") == Some(field("uid")))
        })
    }

    /// The background controllers of a cluster, run to a fixed point: namespace and CRD
    /// cleanup, foreground/orphan deletion, and garbage collection of dependents whose
    /// owners are gone.
    fn settle(&mut self) {
        for _ in 0..1000 {
            let mut actions: Vec<Action> = Vec::new();
            let uids: HashSet<String> = self
                .objects
                .values()
                .flat_map(|m| m.values().map(uid_of))
                .collect();
            for (res, objs) in &self.objects {
                for (key, obj) in objs {
                    let deleting = is_deleting(obj);
                    if deleting && res.group.is_empty() && res.plural == "namespaces" {
                        let contents: Vec<(ResKey, ObjKey, bool)> = self
                            .objects
                            .iter()
                            .filter(|(r, _)| self.registry.get(r).is_some_and(|t| t.namespaced))
                            .flat_map(|(r, m)| {
                                m.iter()
                                    .filter(|(k, _)| k.0 == key.1)
                                    .map(|(k, o)| (r.clone(), k.clone(), is_deleting(o)))
                            })
                            .collect();
                        if contents.is_empty() {
                            actions.push(Action::FinalizeNamespace(key.clone()));
                        }
                        for (r, k, d) in contents {
                            if !d {
                                actions.push(Action::Delete(r, k));
                            }
                        }
                    }
                    let fins = finalizers_of(obj);
                    if deleting
                        && res.group == "apiextensions.k8s.io"
                        && res.plural == "customresourcedefinitions"
                        && fins.iter().any(|f| f == FINALIZER_CRD_CLEANUP)
                        && let Ok(t) = crate::registry::type_from_crd(obj)
                    {
                        let instances: Vec<(ObjKey, bool)> = self
                            .objects
                            .get(&t.key())
                            .map(|m| m.iter().map(|(k, o)| (k.clone(), is_deleting(o))).collect())
                            .unwrap_or_default();
                        if instances.is_empty() {
                            actions.push(Action::RemoveFinalizer(
                                res.clone(),
                                key.clone(),
                                FINALIZER_CRD_CLEANUP,
                            ));
                        }
                        for (k, d) in instances {
                            if !d {
                                actions.push(Action::Delete(t.key(), k));
                            }
                        }
                    }
                    if deleting
                        && (fins
                            .iter()
                            .any(|f| f == FINALIZER_FOREGROUND || f == FINALIZER_ORPHAN))
                    {
                        let uid = uid_of(obj);
                        let dependents: Vec<(ResKey, ObjKey, bool)> = self
                            .objects
                            .iter()
                            .flat_map(|(r, m)| {
                                m.iter()
                                    .filter(|(_, o)| owner_uids(o).contains(&uid))
                                    .map(|(k, o)| (r.clone(), k.clone(), is_deleting(o)))
                            })
                            .collect();
                        if fins.iter().any(|f| f == FINALIZER_ORPHAN) {
                            for (r, k, _) in &dependents {
                                actions.push(Action::DropOwner(r.clone(), k.clone(), uid.clone()));
                            }
                            actions.push(Action::RemoveFinalizer(
                                res.clone(),
                                key.clone(),
                                FINALIZER_ORPHAN,
                            ));
                        } else if dependents.is_empty() {
                            actions.push(Action::RemoveFinalizer(
                                res.clone(),
                                key.clone(),
                                FINALIZER_FOREGROUND,
                            ));
                        } else {
                            for (r, k, d) in dependents {
                                if !d {
                                    actions.push(Action::Delete(r, k));
                                }
                            }
                        }
                    }
                    if self.garbage_collection {
                        let owners = owner_uids(obj);
                        let dangling: Vec<&String> =
                            owners.iter().filter(|u| !uids.contains(*u)).collect();
                        if !dangling.is_empty() {
                            if dangling.len() == owners.len() {
                                if !deleting {
                                    actions.push(Action::Delete(res.clone(), key.clone()));
                                }
                            } else {
                                for u in dangling {
                                    actions.push(Action::DropOwner(
                                        res.clone(),
                                        key.clone(),
                                        u.clone(),
                                    ));
                                }
                            }
                        }
                    }
                }
            }
            if actions.is_empty() {
                self.quiet = !self
                    .objects
                    .values()
                    .flat_map(|m| m.values())
                    .any(is_deleting);
                return;
            }
            for a in actions {
                match a {
                    Action::Delete(r, k) => {
                        self.delete_internal(&r, &k, Some(Propagation::Background));
                    }
                    Action::RemoveFinalizer(r, k, f) => self.remove_finalizer(&r, &k, f),
                    Action::DropOwner(r, k, uid) => self.controller_update(&r, &k, |o| {
                        if let Some(Value::Array(refs)) = o.pointer_mut("/metadata/ownerReferences")
                        {
                            refs.retain(|x| {
                                x.get("uid").and_then(Value::as_str) != Some(uid.as_str())
                            });
                            if refs.is_empty() {
                                meta_mut(o).remove("ownerReferences");
                            }
                        }
                    }),
                    Action::FinalizeNamespace(k) => {
                        let res = ResKey {
                            group: String::new(),
                            plural: "namespaces".into(),
                        };
                        self.controller_update(&res, &k, |o| {
                            if let Some(spec) = o.get_mut("spec").and_then(Value::as_object_mut) {
                                spec.insert("finalizers".into(), json!([]));
                            }
                        });
                    }
                }
            }
        }
        tracing::warn!("fake-kube: background controllers did not settle after 1000 rounds");
    }

    /// Registers a watch on `rt` and returns what it must send first.
    pub fn watch(
        &mut self,
        rt: &ResourceType,
        ns: Option<&str>,
        resource_version: Option<&str>,
        send_initial_events: bool,
    ) -> ApiResult<WatchStart> {
        let res = rt.key();
        let from = match resource_version.filter(|s| !s.is_empty() && *s != "0") {
            Some(rv) => Some(rv.parse::<u64>().map_err(|_| {
                ApiError::bad_request(format!("invalid resource version \"{rv}\""))
            })?),
            None => None,
        };
        let mut initial = Vec::new();
        let mut initial_end_rv = None;
        match from {
            Some(rv) if !send_initial_events => {
                if rv < self.oldest_resumable {
                    return Err(ApiError::gone(format!(
                        "too old resource version: {rv} ({})",
                        self.oldest_resumable + 1
                    )));
                }
                initial.extend(
                    self.history
                        .iter()
                        .filter(|c| c.rv > rv && c.res == res)
                        .cloned(),
                );
            }
            _ => {
                for ((obj_ns, _), obj) in self.objects.get(&res).into_iter().flatten() {
                    if ns.is_none_or(|n| n == obj_ns) {
                        initial.push(Arc::new(Change {
                            rv: self.rv,
                            res: res.clone(),
                            kind: ChangeKind::Added,
                            old: None,
                            obj: obj.clone(),
                        }));
                    }
                }
                if send_initial_events {
                    initial_end_rv = Some(self.rv);
                }
            }
        }
        let (tx, rx) = mpsc::unbounded_channel();
        self.watchers.push(Watcher { res, tx });
        Ok(WatchStart {
            initial,
            initial_end_rv,
            rx,
        })
    }
}

/// The 409 of an apply that would take fields other managers own.
fn apply_conflict(rt: &ResourceType, name: &str, conflicts: Vec<managed::Conflict>) -> ApiError {
    let n = conflicts.len();
    let mut by_manager: BTreeMap<&str, Vec<&str>> = BTreeMap::new();
    for c in &conflicts {
        by_manager.entry(&c.manager).or_default().push(&c.field);
    }
    let parts: Vec<String> = by_manager
        .iter()
        .map(|(m, fields)| {
            if fields.len() == 1 {
                format!("conflict with \"{m}\": {}", fields[0])
            } else {
                format!("conflicts with \"{m}\":\n- {}", fields.join("\n- "))
            }
        })
        .collect();
    let causes: Vec<Value> = conflicts
        .iter()
        .map(|c| json!({"reason": "FieldManagerConflict", "message": format!("conflict with \"{}\"", c.manager), "field": c.field}))
        .collect();
    ApiError::new(
        409,
        "Conflict",
        format!(
            "Apply failed with {n} conflict{}: {}",
            if n == 1 { "" } else { "s" },
            parts.join("\n")
        ),
    )
    .with_details(json!({"name": name, "group": rt.group, "kind": rt.plural, "causes": causes}))
}

enum Action {
    Delete(ResKey, ObjKey),
    RemoveFinalizer(ResKey, ObjKey, &'static str),
    DropOwner(ResKey, ObjKey, String),
    FinalizeNamespace(ObjKey),
}

impl Default for Store {
    fn default() -> Self {
        Self::new()
    }
}
