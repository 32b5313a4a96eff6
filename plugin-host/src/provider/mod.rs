//! What the operator's loops call: the [`Provider`] trait and its value types.
//!
//! The loops (reconciler, orphan GC, health monitor) only ever see this trait. Plugins sit
//! behind it through [`crate::plugin::WasmProvider`]; tests can put an in-process fake behind it.
//! Everything here is plain data so the decision code above it can be tested without Wasm.

mod error;
mod instrument;
pub mod priority;

pub use egress_contract::name_from_uid;
pub use error::{Class, Op, ProviderError};
pub use instrument::{Instrumented, ProviderMetrics};
pub use priority::Priority;

use crate::sensitive::Full;
use async_trait::async_trait;
use std::time::SystemTime;

/// Mark keys written on every instance a provider creates (labels or tags on the backend).
/// Orphan GC finds instances only through them.
pub use egress_contract::{MARK_INSTALLATION, MARK_MANAGED, MARK_MANAGED_YES, MARK_UID};

/// Lifecycle of an instance, as far as the reconciler cares.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
pub enum State {
    Provisioning,
    Running,
    Stopped,
    Terminated,
}

impl State {
    pub fn as_str(self) -> &'static str {
        match self {
            State::Provisioning => "Provisioning",
            State::Running => "Running",
            State::Stopped => "Stopped",
            State::Terminated => "Terminated",
        }
    }
}

/// Where and what to run; copied one to one from the Proxy spec.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
pub struct Placement {
    pub region: String,
    pub zone: String,
    pub machine_type: String,
    pub image: String,
    /// On-demand unless the Proxy asks for spot (contract 0.2.0 and later).
    #[serde(default)]
    pub capacity: Capacity,
}

impl Placement {
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

/// How the backend may treat an instance.
#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize,
)]
pub enum Capacity {
    /// Runs until deleted.
    #[default]
    OnDemand,
    /// Spot or preemptible: the backend may reclaim it at any time.
    Spot,
}

/// The address family a Proxy's clients connect over.
#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize,
)]
pub enum IpFamily {
    #[default]
    V4,
    /// Needs a public IPv6 address (contract 0.2.0 and later).
    V6,
}

/// An hourly price: millionths of `currency` (ISO 4217) per hour.
#[derive(Debug, Clone, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
pub struct Price {
    pub currency: String,
    pub micros_per_hour: u64,
}

/// Everything Create needs. `name` is the idempotency key (see [`name_from_uid`]).
#[derive(Clone, PartialEq, Eq)]
pub struct CreateRequest {
    pub name: String,
    pub uid: String,
    pub namespace: String,
    pub proxy_name: String,
    pub installation: String,
    pub placement: Placement,
    /// Resolved user data. May hold secrets: it is deliberately left out of `Debug`.
    pub cloud_init: Vec<u8>,
    pub port: u16,
    /// The family the Proxy's clients need.
    pub ip_family: IpFamily,
}

impl CreateRequest {
    /// A request for the Proxy whose UID is `uid` (its name derived from it, as the
    /// reconciler does) in namespace `default`, with an empty cloud-init, port 3128 and
    /// IPv4: what tests and tools set the rest of with struct update syntax.
    pub fn new(uid: &str, installation: &str, placement: Placement) -> Self {
        CreateRequest {
            name: name_from_uid(uid),
            uid: uid.into(),
            namespace: "default".into(),
            proxy_name: "proxy".into(),
            installation: installation.into(),
            placement,
            cloud_init: Vec::new(),
            port: 3128,
            ip_family: IpFamily::V4,
        }
    }
}

impl std::fmt::Debug for CreateRequest {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CreateRequest")
            .field("name", &self.name)
            .field("uid", &self.uid)
            .field("namespace", &self.namespace)
            .field("proxy_name", &self.proxy_name)
            .field("installation", &self.installation)
            .field("placement", &self.placement)
            .field("cloud_init_bytes", &self.cloud_init.len())
            .field("port", &self.port)
            .field("ip_family", &self.ip_family)
            .finish()
    }
}

/// An instance as the backend reports it now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Instance {
    pub id: String,
    /// IPv4; empty until known, or for good on an IPv6-only instance.
    pub ip: String,
    pub state: State,
    /// Read back from the backend's mark; empty when the mark carries no UID.
    pub uid: String,
    /// `None` counts as very old for orphan GC.
    pub created_at: Option<SystemTime>,
    /// Public IPv6 address; empty until known or when it has none.
    pub ipv6: String,
    /// The backend reclaimed it (spot); only with Stopped or Terminated.
    pub interrupted: bool,
    /// What it costs, when the backend says.
    pub hourly_price: Option<Price>,
}

impl Instance {
    /// An instance with only the fields contract 0.1.0 knows (no IPv6, price or
    /// interruption).
    pub fn new(
        id: &str,
        ip: &str,
        state: State,
        uid: &str,
        created_at: Option<SystemTime>,
    ) -> Self {
        Instance {
            id: id.into(),
            ip: ip.into(),
            state,
            uid: uid.into(),
            created_at,
            ipv6: String::new(),
            interrupted: false,
            hourly_price: None,
        }
    }

    /// The address clients of `family` connect to, once known.
    ///
    /// IPv4 is `ip`, whatever it holds: a 0.1.0 plugin may have put an IPv6 address there,
    /// and such an instance served IPv4 Proxies before `ip-family` existed, so it still does.
    /// IPv6 is `ipv6`, else an IPv6 address in `ip` (a 0.1.0 plugin's only field); never
    /// an IPv4 address, which an IPv6 client cannot reach.
    pub fn address(&self, family: IpFamily) -> Option<std::net::IpAddr> {
        let parsed = |s: &str| s.trim().parse::<std::net::IpAddr>().ok();
        match family {
            IpFamily::V4 => parsed(&self.ip),
            IpFamily::V6 => parsed(&self.ipv6)
                .filter(std::net::IpAddr::is_ipv6)
                .or_else(|| parsed(&self.ip).filter(std::net::IpAddr::is_ipv6)),
        }
    }
}

impl IpFamily {
    /// The name the Proxy's `spec.ipFamily` uses: `IPv4` or `IPv6`.
    pub fn as_str(self) -> &'static str {
        match self {
            IpFamily::V4 => "IPv4",
            IpFamily::V6 => "IPv6",
        }
    }
}

/// `ip:port`, with an IPv6 address in brackets as URLs and proxy settings write it
/// (`[2001:db8::1]:3128`).
pub fn host_port(ip: std::net::IpAddr, port: u16) -> String {
    std::net::SocketAddr::new(ip, port).to_string()
}

/// One independently failing part of a backend.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TargetStatus {
    pub target: String,
    pub ready: bool,
    pub reason: String,
    pub message: String,
    pub details: Vec<(String, String)>,
}

/// The operations the operator's loops need from a backend.
///
/// Implementations must be safe for concurrent use, including two calls for the same
/// instance (the reconciler and GC can race on Delete).
#[async_trait]
pub trait Provider: Send + Sync {
    /// The configured provider name (what `Proxy.spec.provider` refers to).
    fn name(&self) -> &str;
    /// Creates `req`, waiting for the provider's call slots and request budget at
    /// `priority` (see [`priority`]).
    async fn create_at(
        &self,
        req: &CreateRequest,
        priority: Priority,
    ) -> Result<String, ProviderError>;
    async fn get_at(&self, id: &str, priority: Priority) -> Result<Instance, ProviderError>;
    async fn delete_at(&self, id: &str, priority: Priority) -> Result<(), ProviderError>;
    async fn list_by_tag_at(
        &self,
        installation: &str,
        priority: Priority,
    ) -> Result<Vec<Instance>, ProviderError>;
    /// [`Provider::create_at`] at the operation's default priority ([`Priority::of_op`]).
    async fn create(&self, req: &CreateRequest) -> Result<String, ProviderError> {
        self.create_at(req, Priority::of_op(Op::Create)).await
    }
    /// [`Provider::get_at`] at the operation's default priority.
    async fn get(&self, id: &str) -> Result<Instance, ProviderError> {
        self.get_at(id, Priority::of_op(Op::Get)).await
    }
    /// [`Provider::delete_at`] at the operation's default priority.
    async fn delete(&self, id: &str) -> Result<(), ProviderError> {
        self.delete_at(id, Priority::of_op(Op::Delete)).await
    }
    /// Whether [`Provider::list_recent_at`] lists fewer than all: the plugin declared that
    /// its `list-by-tag` honours `created-since` (contract 0.3.0 `lists-recent`).
    fn lists_recent(&self) -> bool {
        false
    }
    /// Every instance of `installation` created at or after `since` (by the backend's
    /// clock), and maybe older ones: an instance missing from it says nothing about one
    /// created before `since`. Without [`Provider::lists_recent`], the whole list.
    async fn list_recent_at(
        &self,
        installation: &str,
        since: std::time::SystemTime,
        priority: Priority,
    ) -> Result<Vec<Instance>, ProviderError> {
        let _ = since;
        self.list_by_tag_at(installation, priority).await
    }
    /// [`Provider::list_by_tag_at`] at the operation's default priority.
    async fn list_by_tag(&self, installation: &str) -> Result<Vec<Instance>, ProviderError> {
        self.list_by_tag_at(installation, Priority::of_op(Op::List))
            .await
    }
    /// `None` when the provider has no health check: reported as unsupported, not failed.
    async fn check(&self) -> Option<Vec<TargetStatus>>;
    /// The hourly price of an instance of `placement` now; `None` when the backend
    /// publishes none (or the provider cannot say).
    async fn quote(&self, _placement: &Placement) -> Result<Option<Price>, ProviderError> {
        Ok(None)
    }
    /// The price of `placement` as far as it is known without a backend request (the
    /// operator's configured prices, or a quote still kept): for loops that must not spend
    /// the budget, such as a pool choosing its cheapest placement.
    fn known_price(&self, _placement: &Placement) -> Option<Price> {
        None
    }
    /// Tells the provider about the cloud-init of the Proxy `owner` (its UID), whether or
    /// not a call for it follows: a sandboxed plugin must not be able to show any Proxy's
    /// document in any call. Refused when the redactor has no room for it
    /// (`--redaction-memory`): the Proxy must then not be created.
    fn remember_cloud_init(&self, _owner: &str, _doc: &[u8]) -> Result<(), Full> {
        Ok(())
    }
    /// Tells the provider about a Proxy's username and password, as soon as the reconciler
    /// has read them and before any call that could show them: each is then a whole
    /// sensitive value in every encoding for every later call of the provider, so no
    /// reply's ID may hold it and no message shows it (see `crate::redact`).
    fn remember_credentials(
        &self,
        _owner: &str,
        _username: &str,
        _password: &str,
    ) -> Result<(), Full> {
        Ok(())
    }
    /// The Proxy `owner` is gone: what it made sensitive may be dropped when room is
    /// needed (see `crate::sensitive`).
    fn forget(&self, _owner: &str) {}
    /// Whether its instances may have internal addresses, which the health prober then
    /// connects to. `false` unless the provider's configuration says so.
    fn private_addresses_allowed(&self) -> bool {
        false
    }
    /// How the inventory may pace its lists of this provider; `None` when nothing limits
    /// its requests (no request budget).
    fn pacing(&self) -> Option<Pacing> {
        None
    }
}

/// A provider's request rate and what listing it costs, for spacing its periodic lists.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Pacing {
    /// The rate its request budget allows now.
    pub requests_per_hour: f64,
    /// Backend requests its last successful list sent (pages, mostly), once known.
    pub last_list_requests: Option<u32>,
    /// The same for its last successful list of recent instances
    /// ([`Provider::list_recent_at`]), once known.
    pub last_recent_requests: Option<u32>,
    /// Creates, deletes or Proxies in transition wait for its call slots or tokens now: a
    /// list gets only the Background class's guaranteed share
    /// ([`crate::provider::priority::guaranteed_share`]).
    pub contended: bool,
}

/// A provider shared between owners (the reloader keeps what the registry serves) is still
/// a provider.
#[async_trait]
impl<P: Provider + ?Sized> Provider for std::sync::Arc<P> {
    fn name(&self) -> &str {
        (**self).name()
    }
    async fn create_at(
        &self,
        req: &CreateRequest,
        priority: Priority,
    ) -> Result<String, ProviderError> {
        (**self).create_at(req, priority).await
    }
    async fn get_at(&self, id: &str, priority: Priority) -> Result<Instance, ProviderError> {
        (**self).get_at(id, priority).await
    }
    async fn delete_at(&self, id: &str, priority: Priority) -> Result<(), ProviderError> {
        (**self).delete_at(id, priority).await
    }
    async fn list_by_tag_at(
        &self,
        installation: &str,
        priority: Priority,
    ) -> Result<Vec<Instance>, ProviderError> {
        (**self).list_by_tag_at(installation, priority).await
    }
    fn lists_recent(&self) -> bool {
        (**self).lists_recent()
    }
    async fn list_recent_at(
        &self,
        installation: &str,
        since: std::time::SystemTime,
        priority: Priority,
    ) -> Result<Vec<Instance>, ProviderError> {
        (**self).list_recent_at(installation, since, priority).await
    }
    async fn check(&self) -> Option<Vec<TargetStatus>> {
        (**self).check().await
    }
    async fn quote(&self, placement: &Placement) -> Result<Option<Price>, ProviderError> {
        (**self).quote(placement).await
    }
    fn known_price(&self, placement: &Placement) -> Option<Price> {
        (**self).known_price(placement)
    }
    fn remember_cloud_init(&self, owner: &str, doc: &[u8]) -> Result<(), Full> {
        (**self).remember_cloud_init(owner, doc)
    }
    fn remember_credentials(
        &self,
        owner: &str,
        username: &str,
        password: &str,
    ) -> Result<(), Full> {
        (**self).remember_credentials(owner, username, password)
    }
    fn forget(&self, owner: &str) {
        (**self).forget(owner)
    }
    fn private_addresses_allowed(&self) -> bool {
        (**self).private_addresses_allowed()
    }
    fn pacing(&self) -> Option<Pacing> {
        (**self).pacing()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Which address a Proxy of each family is served at, for what a plugin reports.
    #[test]
    fn the_address_of_each_family() {
        let cases = [
            // (ip, ipv6, IPv4 Proxy, IPv6 Proxy)
            ("203.0.113.7", "", Some("203.0.113.7"), None),
            (
                "203.0.113.7",
                "2001:db8::1",
                Some("203.0.113.7"),
                Some("2001:db8::1"),
            ),
            ("", "2001:db8::1", None, Some("2001:db8::1")),
            // A 0.1.0 plugin's only field: it served IPv4 Proxies before, and serves IPv6.
            ("2001:db8::2", "", Some("2001:db8::2"), Some("2001:db8::2")),
            // An IPv4 address in `ipv6` is no IPv6 address (the reply check refuses it too).
            ("", "203.0.113.7", None, None),
            ("", "", None, None),
            ("not an address", "", None, None),
        ];
        for (ip, ipv6, v4, v6) in cases {
            let i = Instance {
                ipv6: ipv6.into(),
                ..Instance::new("i-1", ip, State::Running, "u", None)
            };
            let text = |f| i.address(f).map(|a| a.to_string());
            assert_eq!(
                text(IpFamily::V4).as_deref(),
                v4,
                "{ip:?} {ipv6:?} for IPv4"
            );
            assert_eq!(
                text(IpFamily::V6).as_deref(),
                v6,
                "{ip:?} {ipv6:?} for IPv6"
            );
        }
    }

    #[test]
    fn an_ipv6_address_takes_brackets_before_its_port() {
        assert_eq!(
            host_port("203.0.113.7".parse().unwrap(), 3128),
            "203.0.113.7:3128"
        );
        assert_eq!(
            host_port("2001:db8::1".parse().unwrap(), 3128),
            "[2001:db8::1]:3128"
        );
    }
}
