//! The control surface every backend emulator exposes, so one conformance suite can drive
//! any of them through the states and faults a real backend only shows by accident.
//!
//! Each emulator implements [`Emulator`] (the Rust API tests use) and serves the same
//! operations over HTTP under `/_emulator/` (for a third-party plugin author driving an
//! emulator from outside, and for `proxy-operator conformance`):
//!
//! | method + path | body | effect |
//! |---|---|---|
//! | `GET /_emulator/dump` | | [`Dump`] as JSON |
//! | `POST /_emulator/hold` | `{"id": .., "hold": true}` | [`Emulator::hold_provisioning`] |
//! | `POST /_emulator/state` | `{"id": .., "state": ..}` | [`Emulator::set_backend_state`] |
//! | `POST /_emulator/deleting` | `{"id": ..}` | [`Emulator::start_slow_delete`] |
//! | `POST /_emulator/lock` | `{"id": .., "locked": true}` | [`Emulator::set_locked`] |
//! | `POST /_emulator/plant` | [`Plant`] | [`Emulator::plant`], answers `{"id": ..}` |
//! | `POST /_emulator/faults` | [`Fault`] | [`Emulator::inject`] |
//! | `POST /_emulator/scope` | `{"scope": .., "fail": true}` | [`Emulator::fail_scope`] |
//! | `POST /_emulator/reset` | | [`Emulator::reset`] |

use serde::{Deserialize, Serialize};
use std::time::Duration;

/// Which provider operation a fault applies to, as the plugin's backend calls map to it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum FaultOp {
    /// Calls that create an instance (and its secondary resources).
    Create,
    /// Calls that read one instance.
    Get,
    /// Calls that delete.
    Delete,
    /// Calls that list or search.
    List,
    /// Any API call.
    Any,
}

/// What the injected fault looks like on the wire: each emulator answers with its
/// backend's real status codes and error bodies for the kind.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case", tag = "kind")]
pub enum FaultKind {
    /// A 5xx server error.
    ServerError,
    /// The answer comes after this delay (longer than the plugin's timeout to test it).
    Slow { delay_ms: u64 },
    /// Quota or capacity exhausted (EC2 InstanceLimitExceeded, Hetzner resource_limit_exceeded).
    Quota,
    /// Rate limited (EC2 RequestLimitExceeded, Hetzner rate_limit_exceeded / 429).
    RateLimit,
    /// Authentication failed (EC2 AuthFailure, Hetzner unauthorized / 401).
    Auth,
}

/// Inject `kind` into the next `count` calls of `op`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Fault {
    pub op: FaultOp,
    #[serde(flatten)]
    pub kind: FaultKind,
    pub count: u32,
}

impl Fault {
    pub fn slow(op: FaultOp, delay: Duration, count: u32) -> Self {
        Fault {
            op,
            kind: FaultKind::Slow {
                delay_ms: delay.as_millis() as u64,
            },
            count,
        }
    }
}

/// An instance created behind the plugin's back.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
pub struct Plant {
    pub name: String,
    /// Where to put it (region / location); the emulator's default when empty.
    #[serde(default)]
    pub scope: String,
    /// Carry the managed mark.
    pub managed: bool,
    /// The uid mark; `None` writes no uid mark at all, `Some("")` an empty one.
    pub uid: Option<String>,
    /// The installation mark.
    pub installation: Option<String>,
    /// Creation time as Unix seconds; now when `None`.
    pub created_at: Option<u64>,
}

/// An instance as the emulator holds it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DumpInstance {
    /// The backend's own identifier.
    pub id: String,
    pub name: String,
    pub scope: String,
    /// The backend's raw state string.
    pub state: String,
    pub ip: String,
    /// Labels or tags as key/value pairs.
    pub labels: Vec<(String, String)>,
    pub user_data: Vec<u8>,
}

/// A secondary resource (volume, IP address, network interface) and what it is attached to.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DumpSecondary {
    pub kind: String,
    pub id: String,
    /// The instance id it belongs to, if attached.
    pub attached_to: Option<String>,
}

/// Everything that exists, to check for leaks and duplicates. Terminated-and-gone instances
/// are not included; instances still being deleted are.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
pub struct Dump {
    pub instances: Vec<DumpInstance>,
    pub secondary: Vec<DumpSecondary>,
}

/// The Rust side of the control surface.
pub trait Emulator: Send + Sync {
    /// Base URL of the backend API, e.g. `http://127.0.0.1:41234`.
    fn url(&self) -> String;
    /// The allow-list entry for it (`http://127.0.0.1:PORT`).
    fn allow_entry(&self) -> String {
        self.url()
    }
    /// Keep the instance in its provisioning state (no IP, not running) until released.
    fn hold_provisioning(&self, id: &str, hold: bool);
    /// Put the instance in a raw backend state, known to the plugin or not.
    fn set_backend_state(&self, id: &str, state: &str);
    /// Start a delete that stays in progress (the name stays taken, the backend still
    /// shows the instance in its deleting state) until [`Emulator::finish_deletes`].
    fn start_slow_delete(&self, id: &str);
    /// Complete every delete left in progress.
    fn finish_deletes(&self);
    /// Lock the instance as the backend does during an action (calls on it fail with the
    /// backend's "locked" error); for backends without locks, an in-progress operation.
    fn set_locked(&self, id: &str, locked: bool);
    /// Create an instance directly, returning its backend id.
    fn plant(&self, plant: Plant) -> String;
    /// Inject a fault into the next calls.
    fn inject(&self, fault: Fault);
    /// Make listing fail for one scope (region / location) while the others answer.
    fn fail_scope(&self, scope: &str, fail: bool);
    /// Everything that exists now.
    fn dump(&self) -> Dump;
    /// Forget everything.
    fn reset(&self);
}
