//! The crate a provider plugin is written against.
//!
//! A plugin implements [`Provider`] on a plain type and calls [`export_provider!`] once; it
//! never touches the generated WIT traits, so a new WIT version can be absorbed here
//! instead of in every plugin. Everything else (HTTP, errors, secrets, logging, time,
//! naming) is here so that all plugins behave the same way where the contract says
//! they must: same error classes for the same failures, same marks, same instance names.
//!
//! What every REST plugin would otherwise write again, each its own module:
//! [`config`](mod@config) (parse a config block and check its fields, errors naming field and value),
//! [`id`] (`<scope>/<key>` instance IDs, parsed strictly), [`paging`] (a bounded page loop
//! that converts page by page), [`classify`] (the status/code -> error class table),
//! [`outcome`] (the one log line per operation result that [`export_provider!`] writes,
//! with the plugin's own words where it has better ones) and the typed constructors of
//! [`ProviderError`] in [`error`](mod@error) (`invalid_config`, `invalid_id`, `name_taken`, ...).
//!
//! ```ignore
//! struct MyCloud;
//! impl egress_guest_sdk::Provider for MyCloud { /* ... */ }
//! egress_guest_sdk::export_provider!(MyCloud);
//! ```

// The generated export macro names this crate by path; `self` lets the same path work
// inside this crate's own tests.
extern crate self as egress_guest_sdk;

/// Raw bindings of `egress:provider@0.3.0` (of 0.2.0 with the `contract-v0-2` feature, of
/// 0.1.0 with `contract-v0-1`). Plugins should not need them; they are public because the
/// export macro expands in the plugin crate and must reach them.
#[doc(hidden)]
pub mod bindings {
    #[cfg(not(any(feature = "contract-v0-1", feature = "contract-v0-2")))]
    wit_bindgen::generate!({
        path: "../wit/v0.3.0",
        world: "provider-plugin",
        pub_export_macro: true,
        default_bindings_module: "egress_guest_sdk::bindings",
    });
    #[cfg(all(feature = "contract-v0-2", not(feature = "contract-v0-1")))]
    wit_bindgen::generate!({
        path: "../wit/v0.2.0",
        world: "provider-plugin",
        pub_export_macro: true,
        default_bindings_module: "egress_guest_sdk::bindings",
    });
    #[cfg(feature = "contract-v0-1")]
    wit_bindgen::generate!({
        path: "../wit/v0.1.0",
        world: "provider-plugin",
        pub_export_macro: true,
        default_bindings_module: "egress_guest_sdk::bindings",
    });
}

#[cfg(all(feature = "contract-v0-1", feature = "contract-v0-2"))]
compile_error!(
    "the features `contract-v0-1` and `contract-v0-2` choose one contract each: enable one"
);

/// The contract version this build of the SDK implements.
#[cfg(not(any(feature = "contract-v0-1", feature = "contract-v0-2")))]
pub const CONTRACT_VERSION: &str = "0.3.0";
/// The contract version this build of the SDK implements.
#[cfg(all(feature = "contract-v0-2", not(feature = "contract-v0-1")))]
pub const CONTRACT_VERSION: &str = "0.2.0";
/// The contract version this build of the SDK implements.
#[cfg(feature = "contract-v0-1")]
pub const CONTRACT_VERSION: &str = "0.1.0";

/// The one table that turns a backend's failed answer into the contract's error classes.
pub mod classify;
/// Reading and checking a provider's config block, with errors that name the field and the value.
pub mod config;
/// Constructors for `ProviderError`: a class chosen by name where the failure is understood.
pub mod error;
/// The `host` interface's services, with errors classified as the contract asks.
pub mod host;
/// A blocking HTTP client over `wasi:http/outgoing-handler`.
pub mod http;
/// Scoped instance IDs (`<scope>/<key>`), parsed strictly.
pub mod id;
/// Small helpers for backends' JSON.
pub mod json;
mod log;
/// Prices in millionths from a catalogue's decimal text or floats, one rounding for all.
pub mod money;
/// One log line per operation result, with secrets cut out.
pub mod outcome;
/// A page loop bounded in pages and items, converting page by page.
pub mod paging;
/// Random bytes from the host (`wasi:random`), for secrets a plugin makes up itself.
pub mod random;
/// Two answers every REST plugin reads the same way, on top of its [`Classifier`].
pub mod rest;
mod secrets_seen;
/// The contract's marks on backends whose tags are plain strings, not key/value labels.
pub mod tags;
/// RFC 3339 to and from the WIT `datetime`.
pub mod time;
/// What a plugin did not declare it supports ([`Provider::IPV6`], [`Provider::SPOT`]),
/// refused before its code runs.
#[doc(hidden)]
pub mod unsupported;

pub use bindings::egress::provider::host::Level;
#[cfg(not(feature = "contract-v0-1"))]
pub use bindings::egress::provider::types::{Capacity, IpFamily, Price, RequestBudget};
pub use bindings::egress::provider::types::{
    CreateRequest, Datetime, ErrorClass, Instance, Placement, PluginInfo, ProviderError, State,
    TargetStatus,
};
pub use error::PlacementField;
#[cfg(not(feature = "contract-v0-1"))]
pub use host::mark_sensitive;
pub use host::{cache_get, cache_set, config, config_json, secret, secret_string};

/// Marks every managed instance carries, and the backend name for a Proxy's UID: the
/// operator's own definitions (crate `egress-contract`), so a plugin can never disagree
/// with it on a key or a name.
pub use egress_contract::{
    MARK_INSTALLATION, MARK_MANAGED, MARK_MANAGED_YES, MARK_PREFIX, MARK_UID, name_from_uid,
};

/// What a plugin implements. All functions are associated (no `self`): every call runs in
/// a fresh instance, so there is no state to hold; use [`cache_get`]/[`cache_set`] for
/// anything that must outlive a call.
pub trait Provider {
    /// Who writes the outcome line of every operation, at which levels:
    /// [`export_provider!`] logs each `create`, `get`, `delete`, `list-by-tag` and `quote`
    /// with it (see [`outcome`]). `Outcomes::new("<type-name>")` for the usual levels.
    const OUTCOMES: outcome::Outcomes;
    /// `create` honours `ip-family: ipv6`: the instance gets a public IPv6 address, reported
    /// in `Instance::ipv6`. Left false, [`export_provider!`] refuses an IPv6 request as
    /// permanent before `create` runs, so a plugin that never read the field cannot make
    /// an instance its Proxy's clients cannot reach.
    #[cfg(not(feature = "contract-v0-1"))]
    const IPV6: bool = false;
    /// `create` and `quote` honour `capacity: spot`. Left false, [`export_provider!`]
    /// refuses a spot placement as permanent before either runs, so an on-demand instance
    /// is never billed for what the user asked to be cheaper.
    #[cfg(not(feature = "contract-v0-1"))]
    const SPOT: bool = false;
    /// Static facts; called once at load, must not do I/O.
    fn info() -> PluginInfo;
    /// Check a config block (JSON). Runs with HTTP denied: validate, never dial.
    fn validate_config(config: &str) -> Result<(), ProviderError>;
    /// Create the instance `req.name`, or return the ID of the one that already has that
    /// name after verifying its UID mark.
    fn create(req: CreateRequest) -> Result<String, ProviderError>;
    /// The instance now; not-found only when the backend says it is gone.
    fn get(id: &str) -> Result<Instance, ProviderError>;
    /// Delete; deleting something already gone succeeds.
    fn delete(id: &str) -> Result<(), ProviderError>;
    /// Every instance with the managed mark of `installation`.
    fn list_by_tag(installation: &str) -> Result<Vec<Instance>, ProviderError>;
    /// [`list_recent`](Self::list_recent) lists the instances created since a time at a
    /// cost that follows how many there are (the backend sorts by creation time, or
    /// filters by it). Declared in `plugin-info.lists-recent` by [`export_provider!`]; the
    /// operator asks for such lists only then.
    #[cfg(not(any(feature = "contract-v0-1", feature = "contract-v0-2")))]
    const LISTS_RECENT: bool = false;
    /// Every instance with the managed mark of `installation` created at or after `since`
    /// by the backend's clock; older ones may be in it too. Never leave out one created at
    /// or after `since`. Called only when [`LISTS_RECENT`](Self::LISTS_RECENT) is true;
    /// the default lists everything.
    #[cfg(not(any(feature = "contract-v0-1", feature = "contract-v0-2")))]
    fn list_recent(installation: &str, since: Datetime) -> Result<Vec<Instance>, ProviderError> {
        let _ = since;
        Self::list_by_tag(installation)
    }
    /// One entry per target; only called when `info().has_check` is true.
    fn check() -> Vec<TargetStatus> {
        Vec::new()
    }
    /// The hourly price of an instance of `placement` now; `None` when the backend
    /// publishes none. Unknown placement values are permanent errors, as in `create`.
    #[cfg(not(feature = "contract-v0-1"))]
    fn quote(placement: Placement) -> Result<Option<Price>, ProviderError> {
        let _ = placement;
        Ok(None)
    }
}

/// Export a [`Provider`] implementation as the plugin's `plugin` and `provider` interfaces.
/// Use it exactly once per plugin crate.
#[macro_export]
macro_rules! export_provider {
    ($ty:ty) => {
        const _: () = {
            struct __EgressExport;

            impl $crate::bindings::exports::egress::provider::plugin::Guest for __EgressExport {
                fn info() -> $crate::PluginInfo {
                    $crate::__info::<$ty>()
                }
                fn validate_config(
                    config: ::std::string::String,
                ) -> ::core::result::Result<(), $crate::ProviderError> {
                    <$ty as $crate::Provider>::validate_config(&config)
                }
            }

            impl $crate::bindings::exports::egress::provider::provider::Guest for __EgressExport {
                fn create(
                    req: $crate::CreateRequest,
                ) -> ::core::result::Result<::std::string::String, $crate::ProviderError> {
                    let name = req.name.clone();
                    let result = match $crate::unsupported::create::<$ty>(&req) {
                        Some(refused) => Err(refused),
                        None => <$ty as $crate::Provider>::create(req),
                    };
                    <$ty as $crate::Provider>::OUTCOMES.log("create", &name, result)
                }
                fn get(
                    id: ::std::string::String,
                ) -> ::core::result::Result<$crate::Instance, $crate::ProviderError> {
                    <$ty as $crate::Provider>::OUTCOMES.log(
                        "get",
                        &id,
                        <$ty as $crate::Provider>::get(&id),
                    )
                }
                fn delete(
                    id: ::std::string::String,
                ) -> ::core::result::Result<(), $crate::ProviderError> {
                    <$ty as $crate::Provider>::OUTCOMES.log(
                        "delete",
                        &id,
                        <$ty as $crate::Provider>::delete(&id),
                    )
                }
                $crate::__export_list!($ty);
                fn check() -> ::std::vec::Vec<$crate::TargetStatus> {
                    <$ty as $crate::Provider>::check()
                }
                $crate::__export_quote!($ty);
            }

    $crate::bindings::export!(__EgressExport with_types_in $crate::bindings);
        };
    };
}

/// What the plugin says about itself, with what the SDK declares for it: `lists-recent`
/// from [`Provider::LISTS_RECENT`], so the declaration and the code cannot disagree.
#[doc(hidden)]
pub fn __info<P: Provider>() -> PluginInfo {
    #[allow(unused_mut)]
    let mut info = P::info();
    #[cfg(not(any(feature = "contract-v0-1", feature = "contract-v0-2")))]
    {
        info.lists_recent = P::LISTS_RECENT;
    }
    info
}

/// The `list-by-tag` export of [`export_provider!`]: 0.3.0 passes `created-since`, which
/// goes to [`Provider::list_recent`] when the plugin declared it honours it.
#[doc(hidden)]
#[cfg(not(any(feature = "contract-v0-1", feature = "contract-v0-2")))]
#[macro_export]
macro_rules! __export_list {
    ($ty:ty) => {
        fn list_by_tag(
            installation: ::std::string::String,
            created_since: ::core::option::Option<$crate::Datetime>,
        ) -> ::core::result::Result<::std::vec::Vec<$crate::Instance>, $crate::ProviderError> {
            let result = match created_since {
                Some(since) if <$ty as $crate::Provider>::LISTS_RECENT => {
                    <$ty as $crate::Provider>::list_recent(&installation, since)
                }
                _ => <$ty as $crate::Provider>::list_by_tag(&installation),
            };
            <$ty as $crate::Provider>::OUTCOMES.log("list", &installation, result)
        }
    };
}

/// See the 0.3.0 definition: before 0.3.0, `list-by-tag` has no `created-since`.
#[doc(hidden)]
#[cfg(any(feature = "contract-v0-1", feature = "contract-v0-2"))]
#[macro_export]
macro_rules! __export_list {
    ($ty:ty) => {
        fn list_by_tag(
            installation: ::std::string::String,
        ) -> ::core::result::Result<::std::vec::Vec<$crate::Instance>, $crate::ProviderError> {
            <$ty as $crate::Provider>::OUTCOMES.log(
                "list",
                &installation,
                <$ty as $crate::Provider>::list_by_tag(&installation),
            )
        }
    };
}

/// The `quote` export of [`export_provider!`]: a function of `egress:provider@0.2.0`, and
/// nothing under the `contract-v0-1` feature (0.1.0 has no `quote`).
#[doc(hidden)]
#[cfg(not(feature = "contract-v0-1"))]
#[macro_export]
macro_rules! __export_quote {
    ($ty:ty) => {
        fn quote(
            placement: $crate::Placement,
        ) -> ::core::result::Result<::core::option::Option<$crate::Price>, $crate::ProviderError> {
            let region = placement.region.clone();
            let result = match $crate::unsupported::placement::<$ty>(&placement) {
                Some(refused) => Err(refused),
                None => <$ty as $crate::Provider>::quote(placement),
            };
            <$ty as $crate::Provider>::OUTCOMES.log("quote", &region, result)
        }
    };
}

/// See the 0.2.0 definition: 0.1.0 has no `quote`.
#[doc(hidden)]
#[cfg(feature = "contract-v0-1")]
#[macro_export]
macro_rules! __export_quote {
    ($ty:ty) => {};
}

impl PluginInfo {
    /// Info with no check, no default hosts and no profile; fill in the rest with struct
    /// update syntax or [`with_profile`](Self::with_profile).
    pub fn new(type_name: impl Into<String>, version: impl Into<String>) -> Self {
        PluginInfo {
            type_name: type_name.into(),
            version: version.into(),
            has_check: false,
            default_hosts: Vec::new(),
            profile: Vec::new(),
            #[cfg(not(feature = "contract-v0-1"))]
            default_budget: None,
            #[cfg(not(any(feature = "contract-v0-1", feature = "contract-v0-2")))]
            lists_recent: false,
        }
    }

    /// The request budget a provider of this plugin gets when its entry in the providers
    /// file sets none: the backend's documented limit, with room left for the account's
    /// other tools. The host caps it; the providers file overrides it.
    #[cfg(not(feature = "contract-v0-1"))]
    pub fn with_budget(mut self, requests_per_hour: u32, burst: u32) -> Self {
        self.default_budget = Some(RequestBudget {
            requests_per_hour,
            burst,
        });
        self
    }

    /// The behaviour profile from whitespace-separated `axis=code` words, so a plugin can
    /// keep its profile as one readable constant.
    pub fn with_profile(mut self, spec: &str) -> Self {
        self.profile = spec
            .split_whitespace()
            .filter_map(|w| w.split_once('='))
            .map(|(axis, code)| (axis.to_string(), code.to_string()))
            .collect();
        self
    }
}

impl Instance {
    /// An instance with nothing known: no address, provisioning, no UID, no creation time.
    /// Lets a plugin fill in what it knows with struct update syntax and still build
    /// against either contract version: `Instance { id, ip, state, uid, created_at,
    /// ..Instance::empty() }`.
    pub fn empty() -> Self {
        Instance {
            id: String::new(),
            ip: String::new(),
            state: State::Provisioning,
            uid: String::new(),
            created_at: None,
            #[cfg(not(feature = "contract-v0-1"))]
            ipv6: String::new(),
            #[cfg(not(feature = "contract-v0-1"))]
            interrupted: false,
            #[cfg(not(feature = "contract-v0-1"))]
            hourly_price: None,
        }
    }
}

impl Placement {
    /// An on-demand placement.
    pub fn new(region: &str, zone: &str, machine_type: &str, image: &str) -> Self {
        Placement {
            region: region.into(),
            zone: zone.into(),
            machine_type: machine_type.into(),
            image: image.into(),
            #[cfg(not(feature = "contract-v0-1"))]
            capacity: Capacity::OnDemand,
        }
    }
}

impl TargetStatus {
    /// A target that answered. `reason` is `Reachable`, the WIT's conventional word.
    pub fn ready(target: impl Into<String>, details: Vec<(String, String)>) -> Self {
        TargetStatus {
            target: target.into(),
            ready: true,
            reason: "Reachable".into(),
            message: String::new(),
            details,
        }
    }

    /// The one entry of a check whose config no longer parses: target `config`, reason
    /// `InvalidConfig`, so the failure is not blamed on any one region.
    pub fn invalid_config(e: ProviderError) -> Self {
        Self::failed("config", error::code::INVALID_CONFIG, e.message)
    }

    /// A target that did not answer or refused; `reason` is a short CamelCase word such as
    /// [`HttpError::reason`](http::HttpError::reason) gives.
    pub fn failed(
        target: impl Into<String>,
        reason: impl Into<String>,
        message: impl Into<String>,
    ) -> Self {
        TargetStatus {
            target: target.into(),
            ready: false,
            reason: reason.into(),
            message: message.into(),
            details: Vec::new(),
        }
    }
}

/// One [`TargetStatus`] per target, in the order given: `probe` with the API client, or,
/// when no client could be built (a secret missing or unreadable), every target failed as
/// `Unauthorized` with that error's message and no request made.
pub fn check_each<C, T: AsRef<str>>(
    targets: &[T],
    client: Result<C, ProviderError>,
    probe: impl Fn(&C, &str) -> TargetStatus,
) -> Vec<TargetStatus> {
    let one = |t: &T| match &client {
        Ok(c) => probe(c, t.as_ref()),
        Err(e) => TargetStatus::failed(t.as_ref(), "Unauthorized", &e.message),
    };
    targets.iter().map(one).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn check_each_probes_or_fails_every_target() {
        let targets = ["r1", "r2"];
        let got = check_each(&targets, Ok(7), |c, t| {
            TargetStatus::ready(t, vec![("c".into(), c.to_string())])
        });
        assert_eq!(
            got.iter()
                .map(|t| (t.target.as_str(), t.ready))
                .collect::<Vec<_>>(),
            [("r1", true), ("r2", true)]
        );
        assert_eq!(got[1].details, vec![("c".to_string(), "7".to_string())]);

        let no_token: Result<u8, _> = Err(ProviderError::permanent(
            "secret \"token\" is not configured",
        ));
        let got = check_each(&targets, no_token, |_, _| {
            unreachable!("no request without a client")
        });
        assert!(
            got.iter()
                .all(|t| !t.ready && t.reason == "Unauthorized" && t.message.contains("token"))
        );

        let bad =
            TargetStatus::invalid_config(ProviderError::invalid_config("config.x is invalid"));
        assert_eq!(
            (bad.target.as_str(), bad.reason.as_str(), bad.ready),
            ("config", "InvalidConfig", false)
        );
    }

    #[test]
    fn plugin_info_profile() {
        let info =
            PluginInfo::new("x", "1.0.0").with_profile("readiness=immediate\n  quota=absent");
        assert_eq!(info.type_name, "x");
        assert!(!info.has_check);
        assert_eq!(
            info.profile,
            vec![
                ("readiness".to_string(), "immediate".to_string()),
                ("quota".to_string(), "absent".to_string())
            ]
        );
    }

    #[test]
    fn target_status_constructors() {
        let ok = TargetStatus::ready("r1", vec![("k".into(), "v".into())]);
        assert!(ok.ready);
        assert_eq!(ok.reason, "Reachable");
        let bad = TargetStatus::failed("r2", "Timeout", "slow");
        assert!(!bad.ready);
        assert_eq!(
            (bad.reason.as_str(), bad.message.as_str()),
            ("Timeout", "slow")
        );
    }

    #[test]
    fn name_is_lowercase_base32() {
        let name = name_from_uid("some-uid");
        let suffix = name.strip_prefix("proxy-").unwrap();
        assert!(
            suffix
                .chars()
                .all(|c| c.is_ascii_lowercase() || ('2'..='7').contains(&c))
        );
    }
}
