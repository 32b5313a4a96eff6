//! The boundary between the host and each version of the WIT contract it serves.
//!
//! One module per frozen `wit/vX.Y.Z` folder holds that version's generated bindings, its
//! host interface and the conversions between its types and the version-neutral ones here
//! ([`GuestCall`], [`GuestReply`]). Nothing outside this module names a generated type, so the rest of
//! the runtime (limits, redaction, reply checks, the `Provider` adapter) serves every
//! version with one code path. A new version is a new module and a new arm in each `match`
//! below; an old one is never edited.

pub mod v0_1;
pub mod v0_2;
pub mod v0_3;

use super::guest::{GuestCall, GuestReply};
use super::sandbox::CallState;
use wasmtime::Store;
use wasmtime::component::Linker;

/// A contract version this host serves, read from the names a component exports.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum WorldVersion {
    V0_1,
    V0_2,
    V0_3,
}

impl WorldVersion {
    /// Every version served, oldest first.
    pub const ALL: [WorldVersion; 3] = [WorldVersion::V0_1, WorldVersion::V0_2, WorldVersion::V0_3];

    /// The newest version: what the SDK builds and the docs describe.
    pub const LATEST: WorldVersion = WorldVersion::V0_3;

    pub fn as_str(self) -> &'static str {
        match self {
            WorldVersion::V0_1 => v0_1::WORLD_VERSION,
            WorldVersion::V0_2 => v0_2::WORLD_VERSION,
            WorldVersion::V0_3 => v0_3::WORLD_VERSION,
        }
    }

    pub fn parse(v: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|w| w.as_str() == v)
    }

    /// The versions served, for messages: `0.1.0, 0.2.0, 0.3.0`.
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
    V0_3(v0_3::ProviderPluginPre<CallState>),
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
            WorldVersion::V0_3 => Pre::V0_3(v0_3::ProviderPluginPre::new(pre)?),
        })
    }

    pub(crate) fn instance_pre(&self) -> &wasmtime::component::InstancePre<CallState> {
        match self {
            Pre::V0_1(p) => p.instance_pre(),
            Pre::V0_2(p) => p.instance_pre(),
            Pre::V0_3(p) => p.instance_pre(),
        }
    }

    pub(crate) fn version(&self) -> WorldVersion {
        match self {
            Pre::V0_1(_) => WorldVersion::V0_1,
            Pre::V0_2(_) => WorldVersion::V0_2,
            Pre::V0_3(_) => WorldVersion::V0_3,
        }
    }
}

/// Adds every served version's `host` interface.
pub(crate) fn add_to_linker(l: &mut Linker<CallState>) -> wasmtime::Result<()> {
    v0_1::add_to_linker(l)?;
    v0_2::add_to_linker(l)?;
    v0_3::add_to_linker(l)
}

/// Runs `call` on a fresh instance of the plugin.
pub(crate) async fn dispatch(
    pre: &Pre,
    store: &mut Store<CallState>,
    call: GuestCall<'_>,
) -> wasmtime::Result<GuestReply> {
    match pre {
        Pre::V0_1(p) => v0_1::dispatch(p, store, call).await,
        Pre::V0_2(p) => v0_2::dispatch(p, store, call).await,
        Pre::V0_3(p) => v0_3::dispatch(p, store, call).await,
    }
}

/// Why `version` cannot carry `call`: what it asks for has no place in that version's
/// types. Checked before the call takes a slot, so the answer is a clear permanent error
/// rather than a silently dropped field (a spot request run as on-demand).
pub(crate) fn unsupported(version: WorldVersion, call: &GuestCall<'_>) -> Option<&'static str> {
    match version {
        WorldVersion::V0_1 => v0_1::unsupported(call),
        WorldVersion::V0_2 | WorldVersion::V0_3 => None,
    }
}
