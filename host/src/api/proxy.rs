//! `Proxy`: one forward proxy on one disposable cloud instance.

use super::schema;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use kube::{CustomResource, KubeSchema};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// Set to `"true"` to release a Proxy that is being deleted without deleting its instance:
/// the way out when the backend can no longer be reached, or the instance was removed by
/// hand. The instance is not protected afterwards: orphan GC deletes it once it is older than
/// MinAge, unless its marks are removed on the backend.
pub const ANNOTATION_SKIP_CLEANUP: &str = "egress.proxy-operator.dev/skip-cleanup";

/// On a Proxy a ProxyPool created: the pool's name. The pool finds its Proxies by this
/// label (and its owner reference); the discovery API's `pool` filter matches on it.
pub const LABEL_POOL: &str = "egress.proxy-operator.dev/pool";

// Bounds of the user-written fields. The schema carries each (the API server refuses a
// longer value naming the field) and `api::bounds` fails when a field has none.

/// A provider name: a DNS label, as the providers file requires.
pub const MAX_PROVIDER_NAME: usize = 63;
/// `placement.region`, `zone` and `machineType`: every cloud names these with short
/// identifiers (`eu-central-1a`, `fsn1-dc14`, `n2-standard-2`); 253, the longest DNS name,
/// still holds a Proxmox node's fully qualified host name.
pub const MAX_PLACEMENT_VALUE: usize = 253;
/// `placement.image`: an image may be named by a whole URL (a GCE image self-link is about
/// 120 characters, an OCI reference with its digest about 200).
pub const MAX_IMAGE: usize = 1024;
/// `cloudInit.inline`: the render limit ([`crate::controller::template::MAX_RENDERED_BYTES`],
/// 16 KiB, EC2's user-data limit). A longer template renders within the limit only when its
/// placeholders shrink it by the difference (`{{egress.port}}`, 15 characters, renders to at
/// most 5: it takes hundreds of them), which no real cloud-init does; a Secret's template is
/// held to the render limit when it is rendered.
pub const MAX_INLINE_CLOUD_INIT: usize = crate::controller::template::MAX_RENDERED_BYTES;
/// A Secret's name (a DNS subdomain) and a key of its data: Kubernetes' own limits.
pub const MAX_SECRET_NAME: usize = 253;
/// See [`MAX_SECRET_NAME`].
pub const MAX_SECRET_KEY: usize = 253;
/// One `allowedClients` entry: the longest text an IPv6 address can be written in (45,
/// `ffff:ffff:ffff:ffff:ffff:ffff:255.255.255.255`) and `/128`.
pub const MAX_CLIENT: usize = 49;
/// `allowedClients` entries. Rendered canonical, one space apart, an entry takes at most 44
/// bytes (`ffff:...:ffff/128` and the space): 256 of them take 11 KiB, so a template that
/// uses `{{egress.allowedClients}}` once still has 5 KiB of the 16 KiB render limit for the
/// rest. More would be refused at render time anyway, and a list longer than that belongs in
/// a firewall, not in a proxy's configuration.
pub const MAX_ALLOWED_CLIENTS: usize = 256;

/// What the user asks for: a forward proxy on an instance of one configured provider.
// The repeated `printcolumn(...)` arguments are distinct columns, not duplicates.
#[allow(clippy::duplicated_attributes)]
#[derive(CustomResource, KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[kube(
    group = "egress.proxy-operator.dev",
    version = "v1alpha1",
    kind = "Proxy",
    namespaced,
    status = "ProxyStatus",
    shortname = "px",
    category = "egress",
    derive = "PartialEq",
    doc = "A forward proxy on its own disposable cloud instance, with its own egress IP.",
    printcolumn(name = "Provider", type_ = "string", json_path = ".spec.provider"),
    printcolumn(name = "State", type_ = "string", json_path = ".status.state"),
    printcolumn(name = "IP", type_ = "string", json_path = ".status.ip"),
    printcolumn(name = "Port", type_ = "integer", json_path = ".status.port"),
    printcolumn(
        name = "Ready",
        type_ = "string",
        json_path = ".status.conditions[?(@.type==\"Ready\")].status"
    ),
    printcolumn(
        name = "Age",
        type_ = "date",
        json_path = ".metadata.creationTimestamp"
    )
)]
#[serde(rename_all = "camelCase")]
pub struct ProxySpec {
    /// Name of a provider in the operator's providers file. Immutable: an instance never
    /// moves between providers, so changing it would orphan the old instance.
    #[x_kube(validation = Rule::new("self == oldSelf").message("provider is immutable"))]
    #[schemars(
        length(min = 1, max = MAX_PROVIDER_NAME),
        regex(pattern = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
    )]
    pub provider: String,
    /// Where and what to run. The values are provider-specific; the provider rejects
    /// values it does not know with a permanent error naming the field.
    pub placement: Placement,
    /// User data for the instance: installs and configures the proxy software.
    pub cloud_init: CloudInit,
    /// TCP port the proxy listens on, on the instance's IP.
    #[schemars(range(min = 1, max = 65535))]
    pub port: i32,
    /// Who may use the proxy. Absent: credentials the operator generates.
    #[serde(default, skip_serializing_if = "ProxyAuth::is_default")]
    pub auth: ProxyAuth,
    /// The address family the proxy's clients connect over: `IPv4` (the default) or
    /// `IPv6`. With `IPv6` the instance must get a public IPv6 address (a provider that
    /// cannot give one refuses the Proxy, naming this field), and `status.ip` and the
    /// discovery API give that address. Changing it replaces the instance.
    #[serde(default, skip_serializing_if = "IpFamily::is_default")]
    pub ip_family: IpFamily,
}

/// See [`ProxySpec::ip_family`]. Spelled as a Service's `ipFamilies` entries are.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, JsonSchema)]
pub enum IpFamily {
    #[default]
    IPv4,
    IPv6,
}

impl IpFamily {
    /// Not serialized when default, so a Proxy written before `ipFamily` existed reads
    /// back (and hashes) the same.
    pub fn is_default(&self) -> bool {
        *self == IpFamily::default()
    }

    /// The runtime's name for it, as a create request carries it.
    pub fn to_provider(self) -> egress_plugin_host::provider::IpFamily {
        match self {
            IpFamily::IPv4 => egress_plugin_host::provider::IpFamily::V4,
            IpFamily::IPv6 => egress_plugin_host::provider::IpFamily::V6,
        }
    }
}

/// How the proxy admits clients. The operator hands the values to the cloud-init through
/// the template placeholders (`{{egress.username}}`, `{{egress.password}}`,
/// `{{egress.allowedClients}}`), probes the proxy with the credentials, and gives them out
/// through the discovery API only to callers allowed `get` on `proxies/credentials`.
///
/// Why a default of generated credentials: an open forward proxy on a public IP is found by
/// scanners within hours and used for abuse, on the user's bill. Open is possible, but only
/// when asked for by name (`type: None`).
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, KubeSchema)]
#[x_kube(
    validation = Rule::new("(has(self.type) && self.type == 'Secret') == has(self.secretName)")
        .message("secretName is set exactly when type is Secret")
)]
#[serde(rename_all = "camelCase")]
pub struct ProxyAuth {
    /// `Generated` (the default): a random username and password from the operator, kept
    /// in the Secret `<proxy name>-credentials` (keys `username` and `password`) that the
    /// operator creates in the Proxy's namespace and deletes with the Proxy; deleting that
    /// Secret rotates them (and so replaces the instance). `Secret`: the keys `username` and
    /// `password` of the Secret `secretName` in the Proxy's namespace, which the user owns.
    /// `None`: no credentials; the proxy is open to whoever can reach it, unless
    /// `allowedClients` restricts it.
    #[serde(default, rename = "type")]
    pub type_: AuthType,
    /// With `type: Secret`: the Secret holding `username` and `password`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = MAX_SECRET_NAME))]
    pub secret_name: Option<String>,
    /// Client networks allowed to use the proxy (CIDRs such as `203.0.113.0/24`, or single
    /// addresses), rendered into the cloud-init by `{{egress.allowedClients}}`: for clients
    /// that cannot send proxy credentials, such as headless browsers, with or without
    /// credentials. At most 256 entries of at most 49 characters: 256 fit the 16 KiB
    /// render limit with room for the rest of the template.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = MAX_ALLOWED_CLIENTS), inner(length(min = 1, max = MAX_CLIENT)))]
    pub allowed_clients: Vec<String>,
}

impl ProxyAuth {
    /// Whether this is the default (generated credentials, no allow-list): not serialized,
    /// so a Proxy written before `auth` existed reads back the same.
    pub fn is_default(&self) -> bool {
        *self == ProxyAuth::default()
    }
}

/// Where a proxy's credentials come from; see [`ProxyAuth::type_`].
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, JsonSchema)]
pub enum AuthType {
    #[default]
    Generated,
    Secret,
    None,
}

/// Placement of the instance, handed to the provider one to one. Changing any field
/// replaces the instance.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Placement {
    /// At most 253 characters, as `zone` and `machineType`.
    #[serde(default)]
    #[schemars(length(max = MAX_PLACEMENT_VALUE))]
    pub region: String,
    #[serde(default)]
    #[schemars(length(max = MAX_PLACEMENT_VALUE))]
    pub zone: String,
    #[serde(default)]
    #[schemars(length(max = MAX_PLACEMENT_VALUE))]
    pub machine_type: String,
    /// At most 1024 characters: an image may be named by a URL.
    #[serde(default)]
    #[schemars(length(max = MAX_IMAGE))]
    pub image: String,
    /// `OnDemand` (the default) or `Spot`: spot or preemptible capacity, cheaper, which
    /// the cloud may reclaim at any time; a reclaimed instance is replaced like a lost one
    /// (Event `Interrupted`). A provider without spot refuses it, naming this field.
    #[serde(default, skip_serializing_if = "Capacity::is_default")]
    pub capacity: Capacity,
}

/// See [`Placement::capacity`].
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, JsonSchema)]
pub enum Capacity {
    #[default]
    OnDemand,
    Spot,
}

impl Capacity {
    /// Not serialized when default, so a Proxy written before `capacity` existed reads
    /// back (and hashes) the same.
    pub fn is_default(&self) -> bool {
        *self == Capacity::default()
    }

    /// The runtime's name for it, as a create request carries it.
    pub fn to_provider(self) -> egress_plugin_host::provider::Capacity {
        match self {
            Capacity::OnDemand => egress_plugin_host::provider::Capacity::OnDemand,
            Capacity::Spot => egress_plugin_host::provider::Capacity::Spot,
        }
    }
}

impl Placement {
    /// The runtime's placement: what a create request, a quote or a price lookup carries.
    pub fn to_provider(&self) -> egress_plugin_host::provider::Placement {
        egress_plugin_host::provider::Placement {
            capacity: self.capacity.to_provider(),
            ..egress_plugin_host::provider::Placement::new(
                &self.region,
                &self.zone,
                &self.machine_type,
                &self.image,
            )
        }
    }

    /// An on-demand placement.
    pub fn new(region: &str, zone: &str, machine_type: &str, image: &str) -> Self {
        Placement {
            region: region.into(),
            zone: zone.into(),
            machine_type: machine_type.into(),
            image: image.into(),
            capacity: Capacity::OnDemand,
        }
    }
}

/// Cloud-init user data: inline text or a key of a Secret in the Proxy's namespace,
/// exactly one of the two. A Secret is the place for anything confidential (proxy
/// credentials); the operator never logs the content either way.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, KubeSchema)]
#[x_kube(
    validation = Rule::new("has(self.inline) != has(self.secretKeyRef)")
        .message("set exactly one of inline and secretKeyRef")
)]
#[serde(rename_all = "camelCase")]
pub struct CloudInit {
    /// The template itself, at most 16 KiB: what it renders to may not be longer.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = MAX_INLINE_CLOUD_INIT))]
    pub inline: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub secret_key_ref: Option<SecretKeyRef>,
}

/// A key of a Secret in the Proxy's own namespace.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
pub struct SecretKeyRef {
    /// The Secret's name: at most 253 characters, as any object's.
    #[schemars(length(min = 1, max = MAX_SECRET_NAME))]
    pub name: String,
    /// A key of its data: at most 253 characters, as Kubernetes allows.
    #[schemars(length(min = 1, max = MAX_SECRET_KEY))]
    pub key: String,
}

/// What the operator last observed. Written only by the operator, with server-side apply
/// under one field manager.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ProxyStatus {
    /// The provider's opaque ID of the current instance. Recorded only after Create
    /// returned it; cleared once the instance is gone.
    #[serde(
        rename = "providerID",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub provider_id: Option<String>,
    /// The instance's IP, once it runs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ip: Option<String>,
    /// The port clients connect to (the spec's port, once the instance runs).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub port: Option<i32>,
    /// The instance's last observed state: Provisioning, Running, Stopped or Terminated.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub state: Option<String>,
    /// Hash of the placement, resolved cloud-init and port the current instance was
    /// created from; a different hash of the spec means the instance gets replaced.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub spec_hash: Option<String>,
    /// The metadata.generation this status describes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// Provisioned, Ready and Healthy.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(schema_with = "schema::conditions")]
    pub conditions: Vec<Condition>,
    /// The health engine's last CONNECT probe.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_probe: Option<LastProbe>,
    /// What the instance costs per hour, once it runs: the price the backend reports for
    /// it, else the providers file's `prices`, else the plugin's quote for the placement.
    /// Absent when none of them knows.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hourly_price: Option<HourlyPrice>,
}

/// An amount per hour, as decimal text (never a float: `"0.0104"`), and its currency.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct HourlyPrice {
    /// ISO 4217, e.g. `EUR`.
    #[schemars(length(min = 3, max = 3))]
    pub currency: String,
    /// At most six decimals.
    #[schemars(length(min = 1, max = PER_HOUR_MAX))]
    pub per_hour: String,
}

/// The longest `perHour` the operator writes: any `u64` of millionths (a plugin's price is
/// one, a pool's sum saturates at one) renders in 21 characters. With less, a plugin
/// quoting a huge price got every status write of its Proxies refused by the API server.
pub const PER_HOUR_MAX: usize = 21;

impl HourlyPrice {
    /// The status form of a runtime price; any amount fits [`PER_HOUR_MAX`].
    pub fn of(p: &egress_plugin_host::provider::Price) -> Self {
        HourlyPrice {
            currency: p.currency.clone(),
            per_hour: egress_plugin_host::config::prices::decimal(p.micros_per_hour),
        }
    }

    /// Millionths of the currency, for sums; `None` for text the operator did not write.
    pub fn micros(&self) -> Option<u64> {
        egress_plugin_host::config::prices::micros(&self.per_hour)
    }
}

/// One CONNECT probe through the proxy.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct LastProbe {
    #[schemars(schema_with = "schema::time")]
    pub time: Time,
    /// Round trip of the successful CONNECT, in milliseconds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub latency_ms: Option<i64>,
    /// Why the probe failed; absent when it succeeded.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

impl Proxy {
    /// Whether the skip-cleanup annotation is set to a true value.
    pub fn skip_cleanup(&self) -> bool {
        self.metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(ANNOTATION_SKIP_CLEANUP))
            .is_some_and(|v| v.eq_ignore_ascii_case("true"))
    }

    /// The condition of `type_`, if set.
    pub fn condition(&self, type_: &str) -> Option<&Condition> {
        self.status
            .as_ref()?
            .conditions
            .iter()
            .find(|c| c.type_ == type_)
    }
}
