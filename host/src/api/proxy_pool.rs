//! `ProxyPool`: N Proxies from one template, spread over placements, rotated by age.
//!
//! A pool owns its Proxies the way a ReplicaSet owns Pods (owner reference with
//! `controller: true`, the [`super::LABEL_POOL`] label). It never calls a provider: it creates
//! and deletes Proxy objects, and the Proxy reconciler, with its request budget, does the rest.

use super::proxy::{
    Capacity, HourlyPrice, MAX_IMAGE, MAX_PLACEMENT_VALUE, MAX_PROVIDER_NAME, Placement, ProxySpec,
};
use super::schema;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use kube::{CustomResource, KubeSchema};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::time::Duration;

/// The longest pool name: its Proxies are named `<pool>-<5 characters>`, and the name is a
/// label value on each of them (at most 63 characters).
pub const MAX_POOL_NAME: usize = 57;

// Bounds of the user-written fields, in the schema (the API server refuses a value out of
// them, naming the field) and checked again by the planner (`pool::plan`), which reports a
// spec out of them as `InvalidSpec` when an older CRD let it through.

/// `replicas`: a pool of 10,000 instances is beyond the default quota of every supported
/// cloud, and the plan of a pass (in memory, in one reconcile) grows with it.
pub const MAX_REPLICAS: i32 = 10_000;
/// `minReady` and `maxSurge`: neither means anything past `replicas` (the floor is capped at
/// it; a rotation never replaces more than `replicas` at once), so neither goes past its
/// bound.
pub const MAX_MIN_READY: i32 = MAX_REPLICAS;
/// See [`MAX_MIN_READY`].
pub const MAX_SURGE: i32 = MAX_REPLICAS;
/// `maxAgeJitterPercent`: at 90 a Proxy still lives a tenth of `maxAge`.
pub const MAX_JITTER_PERCENT: i32 = 90;
/// A placement's `weight`: shares of a pool of at most 10,000 need no finer grain.
pub const MAX_WEIGHT: i32 = 1000;
/// `placements`: every zone of the largest supported cloud fits. The status keeps an entry
/// per placement, each with a failure message of up to 4 KiB: 128 of them stay far under the
/// API server's 1.5 MiB per object.
pub const MAX_PLACEMENTS: usize = 128;
/// `maxAge` and `placementBackoff`, durations such as `6h` or `1h 30m`.
pub const MAX_DURATION_TEXT: usize = 64;
/// The shortest `maxAge`: a Proxy needs longer than this to boot and pass its first probe, so
/// a shorter limit would only replace instances that never got Ready, without end.
pub const MIN_MAX_AGE: Duration = Duration::from_secs(10);
/// Labels and annotations the template may put on each Proxy (each map).
pub const MAX_TEMPLATE_KEYS: usize = 64;
/// A label value: Kubernetes' own limit.
pub const MAX_LABEL_VALUE: usize = 63;
/// An annotation value: 64 annotations of a 317-character key and a 2 KiB value take 148 KiB,
/// under Kubernetes' 256 KiB for all of an object's annotations, so a Proxy made from the
/// template is never refused for them.
pub const MAX_ANNOTATION_VALUE: usize = 2048;

/// What the user asks for: `replicas` Ready proxies like `template`, over `placements`.
// The repeated `printcolumn(...)` arguments are distinct columns, not duplicates.
#[allow(clippy::duplicated_attributes)]
#[derive(CustomResource, KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[kube(
    group = "egress.proxy-operator.dev",
    version = "v1alpha1",
    kind = "ProxyPool",
    namespaced,
    status = "ProxyPoolStatus",
    shortname = "pxp",
    category = "egress",
    derive = "PartialEq",
    doc = "A set of interchangeable Proxies kept at a size, spread over placements and rotated by age.",
    validation = Rule::new("size(self.metadata.name) <= 57")
        .message("a ProxyPool name is at most 57 characters: its Proxies are named <pool>-<5 characters>"),
    scale(
        spec_replicas_path = ".spec.replicas",
        status_replicas_path = ".status.replicas",
        label_selector_path = ".status.selector"
    ),
    printcolumn(name = "Desired", type_ = "integer", json_path = ".spec.replicas"),
    printcolumn(name = "Ready", type_ = "integer", json_path = ".status.readyReplicas"),
    printcolumn(name = "Updated", type_ = "integer", json_path = ".status.updatedReplicas"),
    printcolumn(name = "Available", type_ = "integer", json_path = ".status.availableReplicas"),
    printcolumn(
        name = "Age",
        type_ = "date",
        json_path = ".metadata.creationTimestamp"
    )
)]
#[serde(rename_all = "camelCase")]
pub struct ProxyPoolSpec {
    /// How many Proxies the pool keeps (not counting the surge during rotation). At most
    /// 10,000.
    #[schemars(range(min = 0, max = MAX_REPLICAS))]
    pub replicas: i32,
    /// Rotation and scale-down never take the number of Ready Proxies below this (capped at
    /// `replicas`). Absent: `replicas`, so with a surge a rotation never lowers capacity. At
    /// most 10,000, as `replicas`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0, max = MAX_MIN_READY))]
    pub min_ready: Option<i32>,
    /// How many Proxies over `replicas` may exist while old ones are replaced. Absent: a
    /// quarter of `replicas`, rounded up, at least 1. At most 10,000, as `replicas`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0, max = MAX_SURGE))]
    pub max_surge: Option<i32>,
    /// Replace each Proxy when it gets older than this (a duration such as `6h`, `90m`),
    /// new one Ready first. Each Proxy's own limit is this minus up to `maxAgeJitterPercent`
    /// percent, fixed per Proxy, so a pool created at once does not rotate at once. Absent:
    /// no rotation by age. At least 10 s (a shorter limit would replace Proxies before they
    /// could be Ready), at most 64 characters.
    #[serde(
        default,
        with = "humantime_serde",
        skip_serializing_if = "Option::is_none"
    )]
    #[schemars(with = "Option<String>", length(min = 1, max = MAX_DURATION_TEXT))]
    pub max_age: Option<Duration>,
    /// See `maxAge`. Absent: 10. At most 90: a Proxy lives at least a tenth of `maxAge`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0, max = MAX_JITTER_PERCENT))]
    pub max_age_jitter_percent: Option<i32>,
    /// How long a placement is skipped after one of its Proxies failed with a quota or
    /// permanent error (a duration, e.g. `10m`). Absent: 10 minutes. At most 64 characters.
    #[serde(
        default,
        with = "humantime_serde",
        skip_serializing_if = "Option::is_none"
    )]
    #[schemars(with = "Option<String>", length(min = 1, max = MAX_DURATION_TEXT))]
    pub placement_backoff: Option<Duration>,
    /// The Proxies to make. Its `placement` (and `provider`) is the default that each entry
    /// of `placements` overrides field by field.
    pub template: ProxyTemplate,
    /// Where to spread the Proxies, by weight. Empty: everything on the template's own
    /// placement. At most 128: every zone of the largest cloud, and a status that stays small.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = MAX_PLACEMENTS))]
    pub placements: Vec<PoolPlacement>,
    /// How new Proxies pick a placement among the usable ones. `Spread` (the default): the
    /// one furthest below its weighted share. `Cheapest`: the one with the lowest known
    /// hourly price (the providers file's `prices`, a quote the operator still holds, or
    /// what the pool's Proxies there cost), placements of unknown price last, ties spread by
    /// weight; a weight of 0 and `fallback` still apply.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub strategy: Option<Strategy>,
}

/// See [`ProxyPoolSpec::strategy`].
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, JsonSchema)]
pub enum Strategy {
    #[default]
    Spread,
    Cheapest,
}

impl ProxyPoolSpec {
    /// `replicas` Proxies of `spec`, every other field at its default.
    pub fn new(replicas: i32, spec: ProxySpec) -> Self {
        ProxyPoolSpec {
            replicas,
            min_ready: None,
            max_surge: None,
            max_age: None,
            max_age_jitter_percent: None,
            placement_backoff: None,
            template: ProxyTemplate {
                metadata: None,
                spec,
            },
            placements: Vec::new(),
            strategy: None,
        }
    }
}

/// The ProxyPool CRD. The template embeds a Proxy spec, whose schema says `provider` is
/// immutable (`self == oldSelf`): right for a Proxy, whose instance cannot move, wrong for
/// the template, whose change rolls the pool onto new Proxies. That one rule is taken out
/// of the template's copy.
pub fn crd()
-> k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition {
    use kube::CustomResourceExt;
    let mut crd = ProxyPool::crd();
    for version in &mut crd.spec.versions {
        let provider = version
            .schema
            .as_mut()
            .and_then(|s| s.open_api_v3_schema.as_mut())
            .and_then(|s| s.properties.as_mut()?.get_mut("spec"))
            .and_then(|s| s.properties.as_mut()?.get_mut("template"))
            .and_then(|s| s.properties.as_mut()?.get_mut("spec"))
            .and_then(|s| s.properties.as_mut()?.get_mut("provider"));
        if let Some(provider) = provider {
            provider.x_kubernetes_validations = None;
            provider.description = Some(
                "Name of a provider in the operator's providers file; a placement may name another."
                    .into(),
            );
        }
    }
    crd
}

/// The Proxy a pool makes: labels and annotations for it, and its spec.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ProxyTemplate {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metadata: Option<TemplateMetadata>,
    pub spec: ProxySpec,
}

/// Labels and annotations copied onto each Proxy the pool creates.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
pub struct TemplateMetadata {
    /// At most 64, values of at most 63 characters (Kubernetes' limit for a label value).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    #[schemars(schema_with = "template_labels")]
    pub labels: BTreeMap<String, String>,
    /// At most 64, values of at most 2 KiB: all of them fit Kubernetes' 256 KiB for an
    /// object's annotations, so a Proxy is never refused for them.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    #[schemars(schema_with = "template_annotations")]
    pub annotations: BTreeMap<String, String>,
}

/// One place to put Proxies: the template's provider and placement with these fields
/// replaced where set.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PoolPlacement {
    /// Names the placement in the status and on its Proxies (annotation
    /// `egress.proxy-operator.dev/placement`). Absent: the values set, joined by `/`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 63))]
    pub name: Option<String>,
    /// Another provider than the template's (a name of the providers file).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(
        length(min = 1, max = MAX_PROVIDER_NAME),
        regex(pattern = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
    )]
    pub provider: Option<String>,
    /// The bounds of the template's placement: 253 characters, 1024 for `image`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = MAX_PLACEMENT_VALUE))]
    pub region: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = MAX_PLACEMENT_VALUE))]
    pub zone: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = MAX_PLACEMENT_VALUE))]
    pub machine_type: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = MAX_IMAGE))]
    pub image: Option<String>,
    /// `OnDemand` or `Spot`, in place of the template's `placement.capacity`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub capacity: Option<Capacity>,
    /// Used only while no other placement can take a Proxy (all failing, for instance a
    /// spot placement whose backend has no spot capacity: `QuotaExceeded`, backed off for
    /// `placementBackoff`). Once another takes Proxies again, this one's are replaced
    /// there, never taking Ready below `minReady`. The usual pair: a `Spot` placement and
    /// the same one `OnDemand` with `fallback: true`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fallback: Option<bool>,
    /// Share of the pool relative to the other placements. Absent: 1. Zero: no new Proxies
    /// here (the ones already here stay until rotated). At most 1000.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0, max = MAX_WEIGHT))]
    pub weight: Option<i32>,
}

impl PoolPlacement {
    /// The name the status and the Proxies use.
    pub fn display_name(&self) -> String {
        if let Some(n) = &self.name {
            return n.clone();
        }
        let spot = (self.capacity == Some(Capacity::Spot)).then_some("spot");
        let parts: Vec<&str> = [
            &self.provider,
            &self.region,
            &self.zone,
            &self.machine_type,
            &self.image,
        ]
        .into_iter()
        .filter_map(|v| v.as_deref().filter(|s| !s.is_empty()))
        .chain(spot)
        .collect();
        if parts.is_empty() {
            "default".into()
        } else {
            parts.join("/")
        }
    }

    /// The template's spec with this placement's fields put in.
    pub fn apply(&self, template: &ProxySpec) -> ProxySpec {
        let mut spec = template.clone();
        let set = |field: &mut String, value: &Option<String>| {
            if let Some(v) = value {
                field.clone_from(v);
            }
        };
        set(&mut spec.provider, &self.provider);
        let Placement {
            region,
            zone,
            machine_type,
            image,
            capacity,
        } = &mut spec.placement;
        set(region, &self.region);
        set(zone, &self.zone);
        set(machine_type, &self.machine_type);
        set(image, &self.image);
        if let Some(c) = self.capacity {
            *capacity = c;
        }
        spec
    }
}

/// What the pool controller last observed and decided.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ProxyPoolStatus {
    /// Proxies of this pool not being deleted.
    #[serde(default)]
    pub replicas: i32,
    /// Of those, how many are Ready.
    #[serde(default)]
    pub ready_replicas: i32,
    /// Of those, how many match the current template and placements.
    #[serde(default)]
    pub updated_replicas: i32,
    /// Ready, up to date and not due for rotation: the Proxies that will stay.
    #[serde(default)]
    pub available_replicas: i32,
    /// The label selector of the pool's Proxies, for the scale subresource (and `kubectl
    /// get proxies -l`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub selector: Option<String>,
    /// The metadata.generation this status describes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// Per placement: how many Proxies, how many Ready, and whether it is skipped.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub placements: Vec<PlacementStatus>,
    /// What the pool's instances cost per hour: the sum of its Proxies' `hourlyPrice`, one
    /// entry per currency (a pool over two clouds may pay in two). Proxies without a known
    /// price are not in it.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 8))]
    pub hourly_prices: Vec<HourlyPrice>,
    /// Available, Progressing and PlacementsFailing.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(schema_with = "schema::conditions")]
    pub conditions: Vec<Condition>,
}

/// One placement's share of the pool.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PlacementStatus {
    pub name: String,
    #[serde(default)]
    pub replicas: i32,
    #[serde(default)]
    pub ready_replicas: i32,
    /// Set while the placement is skipped: why, and until when.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub failing: Option<PlacementFailure>,
}

/// Why a placement is skipped.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PlacementFailure {
    /// The failed Proxy's Provisioned reason: QuotaExceeded, PermanentError, ...
    pub reason: String,
    pub message: String,
    #[schemars(schema_with = "schema::time")]
    pub since: Time,
    /// New Proxies go here again from this time on.
    #[schemars(schema_with = "schema::time")]
    pub retry_after: Time,
}

/// Condition types on a ProxyPool.
pub mod pool_condition {
    /// At least `minReady` Proxies are Ready.
    pub const AVAILABLE: &str = "Available";
    /// Proxies are being created, replaced or removed.
    pub const PROGRESSING: &str = "Progressing";
    /// At least one placement is skipped after quota or permanent errors.
    pub const PLACEMENTS_FAILING: &str = "PlacementsFailing";
}

/// A pool template's labels: [`MAX_TEMPLATE_KEYS`] of
/// label values.
fn template_labels(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
    schema::bounded_map(MAX_TEMPLATE_KEYS, MAX_LABEL_VALUE)
}

/// A pool template's annotations: [`MAX_TEMPLATE_KEYS`]
/// of at most [`MAX_ANNOTATION_VALUE`] characters.
fn template_annotations(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
    schema::bounded_map(MAX_TEMPLATE_KEYS, MAX_ANNOTATION_VALUE)
}
