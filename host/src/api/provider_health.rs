//! `ProviderHealth`: what a provider's health check last said, one object per provider.

use super::schema;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// Cluster-scoped and named after the provider, so `kubectl get providerhealth` answers
/// "can the operator reach its backends" without reading the operator's logs. Written only
/// by the provider health monitor; the spec is empty.
///
/// Readable beyond any one namespace (`view` includes it), so it carries no free text from
/// a plugin: target names, reasons and details are bounded identifiers and tokens, none
/// holding a secret of the provider or a credential of any of its Proxies, and the
/// message is the operator's own.
// The repeated `printcolumn(...)` arguments are distinct columns, not duplicates.
#[allow(clippy::duplicated_attributes)]
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[kube(
    group = "egress.proxy-operator.dev",
    version = "v1alpha1",
    kind = "ProviderHealth",
    status = "ProviderHealthStatus",
    shortname = "ph",
    category = "egress",
    derive = "PartialEq",
    derive = "Default",
    doc = "Health of one configured provider's backend, as its health check reports it.",
    printcolumn(name = "Type", type_ = "string", json_path = ".status.type"),
    printcolumn(name = "Checked", type_ = "date", json_path = ".status.lastCheckTime"),
    printcolumn(
        name = "Age",
        type_ = "date",
        json_path = ".metadata.creationTimestamp"
    )
)]
pub struct ProviderHealthSpec {}

/// The last check round for this provider.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ProviderHealthStatus {
    /// The plugin type behind the provider (e.g. `hetzner`, `ec2`).
    #[serde(rename = "type", default, skip_serializing_if = "Option::is_none")]
    pub type_: Option<String>,
    /// False when the plugin has no health check: reported as unsupported, not failed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub check_supported: Option<bool>,
    /// One entry per independently failing part of the backend, in the plugin's order.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["target"]))]
    pub targets: Vec<TargetHealth>,
    /// When the last round finished.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "schema::optional_time")]
    pub last_check_time: Option<Time>,
    /// Why the last load of this provider (its plugin file or its providers-file entry)
    /// failed. The version loaded before, if any, keeps serving; absent once a load
    /// succeeds again.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub load_error: Option<String>,
    /// What serves: an `oci://` plugin's reference pinned to its manifest digest (a tag is
    /// resolved once), or the plugin file's name and sha256.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 1024))]
    pub plugin: Option<String>,
}

/// One target of a provider's health check.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct TargetHealth {
    /// The part of the backend (a region, a zone, `api`): 1 to 63 letters, digits, '-',
    /// '_' or '.'; `invalid#<n>` when the plugin's name for its n-th target was not one.
    pub target: String,
    pub ready: bool,
    /// Why, in CamelCase (Reachable, Timeout, Unreachable, Unauthorized, Forbidden, APIError
    /// or a provider-specific reason; Unknown when the plugin gave none fit to publish).
    pub reason: String,
    /// The operator's words, never the plugin's: the plugin's message is in the operator's
    /// log only.
    #[serde(default)]
    pub message: String,
    /// Facts useful when triaging: versions, capacity, the account in use. Keys are
    /// camelCase words, values tokens of at most 64 characters without spaces.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub details: BTreeMap<String, String>,
    /// When `ready` last changed.
    #[schemars(schema_with = "schema::time")]
    pub last_transition_time: Time,
}
