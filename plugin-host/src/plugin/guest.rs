//! One call into a plugin and what it answered, whatever contract version it implements:
//! the version modules (`abi/`) lift their generated types into these, `reply` checks them,
//! and the `Provider` adapter turns them into the operator's types.

use crate::provider::{Class, CreateRequest, Placement, Price, State, TargetStatus};

/// One call into a plugin, whatever version it implements. Borrowed inputs.
pub(crate) enum GuestCall<'a> {
    Info,
    Validate(&'a str),
    Create(&'a CreateRequest),
    Get(&'a str),
    Delete(&'a str),
    /// The installation, and for a plugin that lists recent instances (0.3.0
    /// `lists-recent`), the creation time from which it must list them all.
    List(&'a str, Option<std::time::SystemTime>),
    Check,
    Quote(&'a Placement),
}

/// A plugin's answer, lifted out of its version's types and not yet checked (see
/// `reply::check`).
pub(crate) enum GuestReply {
    Info(PluginInfo),
    Unit(Result<(), GuestError>),
    Id(Result<String, GuestError>),
    Instance(Result<RawInstance, GuestError>),
    List(Result<Vec<RawInstance>, GuestError>),
    Check(Vec<TargetStatus>),
    Quote(Result<Option<Price>, GuestError>),
}

impl GuestReply {
    /// The rate limit a plugin's error reported, if any.
    pub(crate) fn retry_after_ms(&self) -> Option<u32> {
        let e = match self {
            GuestReply::Unit(Err(e))
            | GuestReply::Id(Err(e))
            | GuestReply::Instance(Err(e))
            | GuestReply::List(Err(e))
            | GuestReply::Quote(Err(e)) => e,
            _ => return None,
        };
        e.retry_after_ms
    }
}

/// An error a plugin returned.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct GuestError {
    pub class: Class,
    pub message: String,
    pub code: Option<String>,
    /// The backend's own rate limit, as the plugin read it (0.2.0 and later).
    pub retry_after_ms: Option<u32>,
}

/// An instance as a plugin reported it, before the host checks it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct RawInstance {
    pub id: String,
    pub ip: String,
    pub ipv6: String,
    pub state: State,
    pub uid: String,
    /// Seconds and nanoseconds since the epoch.
    pub created_at: Option<(u64, u32)>,
    pub interrupted: bool,
    pub hourly_price: Option<Price>,
}

/// What a plugin says about itself (`plugin.info`), read once at load; checked by
/// `reply::check` before the host keeps it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PluginInfo {
    pub type_name: String,
    pub version: String,
    pub has_check: bool,
    pub default_hosts: Vec<String>,
    pub profile: Vec<(String, String)>,
    /// The budget a provider of this plugin gets when its entry sets none (contract 0.2.0;
    /// capped, see `budget::cap_default`).
    pub default_budget: Option<crate::rate::Spec>,
    /// `list-by-tag` honours `created-since` (contract 0.3.0; false before): the inventory
    /// may confirm a rollout's instances with lists of the recent ones.
    pub lists_recent: bool,
}
