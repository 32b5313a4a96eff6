//! The boundary between the host and each version of the WIT contract it serves.
//!
//! One module per frozen `wit/vX.Y.Z` folder holds that version's generated bindings, its
//! host interface and the conversions between its types and the version-neutral ones here
//! ([`Call`], [`Reply`]). Nothing outside this module names a generated type, so the rest of
//! the runtime (limits, redaction, reply checks, the `Provider` adapter) serves every
//! version with one code path. A new version is a new module and a new arm in each `match`
//! below; an old one is never edited.

pub mod v0_1;
pub mod v0_2;

use super::sandbox::CallState;
use crate::provider::{Class, CreateRequest, IpFamily, Placement, Price, State, TargetStatus};
use wasmtime::Store;
use wasmtime::component::Linker;

/// A contract version this host serves, read from the names a component exports.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum WorldVersion {
    V0_1,
    V0_2,
}

impl WorldVersion {
    /// Every version served, oldest first.
    pub const ALL: [WorldVersion; 2] = [WorldVersion::V0_1, WorldVersion::V0_2];

    /// The newest version: what the SDK builds and the docs describe.
    pub const LATEST: WorldVersion = WorldVersion::V0_2;

    pub fn as_str(self) -> &'static str {
        match self {
            WorldVersion::V0_1 => v0_1::WORLD_VERSION,
            WorldVersion::V0_2 => v0_2::WORLD_VERSION,
        }
    }

    pub fn parse(v: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|w| w.as_str() == v)
    }

    /// The versions served, for messages: `0.1.0, 0.2.0`.
    pub fn supported() -> String {
        Self::ALL.map(Self::as_str).join(", ")
    }
}

impl std::fmt::Display for WorldVersion {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A pre-linked plugin, of whichever version it implements.
pub(crate) enum Pre {
    V0_1(v0_1::ProviderPluginPre<CallState>),
    V0_2(v0_2::ProviderPluginPre<CallState>),
}

impl Pre {
    /// Checks that a pre-linked component has the exports of `version`.
    pub(crate) fn new(
        version: WorldVersion,
        pre: wasmtime::component::InstancePre<CallState>,
    ) -> wasmtime::Result<Self> {
        Ok(match version {
            WorldVersion::V0_1 => Pre::V0_1(v0_1::ProviderPluginPre::new(pre)?),
            WorldVersion::V0_2 => Pre::V0_2(v0_2::ProviderPluginPre::new(pre)?),
        })
    }

    pub(crate) fn instance_pre(&self) -> &wasmtime::component::InstancePre<CallState> {
        match self {
            Pre::V0_1(p) => p.instance_pre(),
            Pre::V0_2(p) => p.instance_pre(),
        }
    }

    pub(crate) fn version(&self) -> WorldVersion {
        match self {
            Pre::V0_1(_) => WorldVersion::V0_1,
            Pre::V0_2(_) => WorldVersion::V0_2,
        }
    }
}

/// Adds every served version's `host` interface.
pub(crate) fn add_to_linker(l: &mut Linker<CallState>) -> wasmtime::Result<()> {
    v0_1::add_to_linker(l)?;
    v0_2::add_to_linker(l)
}

/// Runs `call` on a fresh instance of the plugin.
pub(crate) async fn dispatch(
    pre: &Pre,
    store: &mut Store<CallState>,
    call: Call<'_>,
) -> wasmtime::Result<Reply> {
    match pre {
        Pre::V0_1(p) => v0_1::dispatch(p, store, call).await,
        Pre::V0_2(p) => v0_2::dispatch(p, store, call).await,
    }
}

/// Why `version` cannot carry `call`: what it asks for has no place in that version's
/// types. Checked before the call takes a slot, so the answer is a clear permanent error
/// rather than a silently dropped field (a spot request run as on-demand).
pub(crate) fn unsupported(version: WorldVersion, call: &Call<'_>) -> Option<&'static str> {
    match version {
        WorldVersion::V0_1 => v0_1::unsupported(call),
        WorldVersion::V0_2 => None,
    }
}

/// One call into a plugin, whatever version it implements. Borrowed inputs.
pub(crate) enum Call<'a> {
    Info,
    Validate(&'a str),
    Create(&'a CreateRequest),
    Get(&'a str),
    Delete(&'a str),
    List(&'a str),
    Check,
    Quote(&'a Placement),
}

/// A plugin's answer, lifted out of its version's types and not yet checked (see
/// `reply::check`).
pub(crate) enum Reply {
    Info(RawInfo),
    Unit(Result<(), GuestError>),
    Id(Result<String, GuestError>),
    Instance(Result<RawInstance, GuestError>),
    List(Result<Vec<RawInstance>, GuestError>),
    Check(Vec<TargetStatus>),
    Quote(Result<Option<Price>, GuestError>),
}

impl Reply {
    /// The rate limit a plugin's error reported, if any.
    pub(crate) fn retry_after_ms(&self) -> Option<u32> {
        let e = match self {
            Reply::Unit(Err(e))
            | Reply::Id(Err(e))
            | Reply::Instance(Err(e))
            | Reply::List(Err(e))
            | Reply::Quote(Err(e)) => e,
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

/// What a plugin says about itself, before the host checks it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct RawInfo {
    pub type_name: String,
    pub version: String,
    pub has_check: bool,
    pub default_hosts: Vec<String>,
    pub profile: Vec<(String, String)>,
    /// Requests per hour and burst (0.2.0 and later).
    pub default_budget: Option<(u32, u32)>,
}

/// The family a request needs, for the versions that know only IPv4.
pub(crate) fn needs_ipv6(req: &CreateRequest) -> bool {
    req.ip_family == IpFamily::V6
}
