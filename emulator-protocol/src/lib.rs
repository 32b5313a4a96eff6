//! The control surface every backend emulator serves under `/_emulator/`, as wire types.
//!
//! The conformance suite (`proxy-operator conformance`) drives a plugin's emulator only
//! through these requests, so a third-party plugin author can bring an emulator written in
//! any language: serve these routes next to the backend API and the suite runs unchanged.
//! Bodies are JSON; ids are the backend's own identifiers as [`DumpInstance::id`] shows
//! them. Answers are `204` (or `200` with a JSON body), and `404` for an unknown id.
//!
//! | method + path | body | effect |
//! |---|---|---|
//! | `GET /_emulator/dump` | | [`Dump`] as JSON |
//! | `POST /_emulator/hold` | `{"id": .., "hold": true}` | keep the instance provisioning (no IP, not running) until released |
//! | `POST /_emulator/state` | `{"id": .., "state": ..}` | put the instance in a raw backend state, known to the plugin or not |
//! | `POST /_emulator/address` | `{"id": .., "ip": null}` | remove (or, with a string, set) the instance's public address |
//! | `POST /_emulator/deleting` | `{"id": ..}` | start a delete that stays in progress: the name stays taken and the backend shows the instance in its deleting state |
//! | `POST /_emulator/finish-deletes` | | complete every delete in progress |
//! | `POST /_emulator/lock` | `{"id": .., "locked": true}` | lock the instance as during a backend action (or, without locks, an operation in progress) |
//! | `POST /_emulator/plant` | [`Plant`] | create an instance behind the plugin's back; answers `{"id": ..}` |
//! | `POST /_emulator/faults` | [`Fault`] | fail or delay the next calls of an operation |
//! | `POST /_emulator/scope` | [`ScopeFailure`] | make listing fail for one region / location |
//! | `POST /_emulator/reset` | | forget everything, faults included; ids are never reused afterwards |
//! | `POST /_emulator/rate-limit` | [`RateLimit`] or `null` | optional: enforce the backend's rate limit (a token bucket) the way the backend answers it, or stop enforcing it |

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

/// A backend rate limit as a token bucket: `burst` calls at once, refilled at `per_hour`.
/// Off unless set. Each emulator answers a call past it the way its backend does (Hetzner:
/// 429 `rate_limit_exceeded`; EC2: 503 `RequestLimitExceeded`, one bucket per action and
/// region).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct RateLimit {
    pub per_hour: u32,
    pub burst: u32,
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

/// Make listing fail (or work again) in one region / location, as a backend outage of one
/// scope looks to the plugin.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ScopeFailure {
    pub scope: String,
    /// `false` ends the failure; a body without it starts one.
    #[serde(default = "yes")]
    pub fail: bool,
}

fn yes() -> bool {
    true
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
