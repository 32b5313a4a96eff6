//! The control surface every backend emulator serves under `/_emulator/`, as wire types.
//!
//! The conformance suite (`proxy-operator conformance`) drives a plugin's emulator only
//! through these requests, so a third-party plugin author can bring an emulator written in
//! any language: serve these routes next to the backend API and the suite runs unchanged.
//! Bodies are JSON; ids are the backend's own identifiers as [`DumpInstance::id`] shows
//! them. Answers are `204` (or `200` with a JSON body), `404` for an unknown id and `400`
//! for a body that does not parse. The Rust emulators serve these routes with one router
//! (`egress_emulators::framework`).
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
//! | `GET /_emulator/stats` | | [`RequestStats`] as JSON: the API calls answered since start (or reset), by operation and by backend call, and how many were rate-limited |
//! | `POST /_emulator/reclaim` | [`Reclaim`] | the backend reclaims that spot instance as the cloud does (EC2: terminated with `Server.SpotInstanceTermination`; GCE: a `compute.instances.preempted` operation, then stopped or deleted); `409` for an on-demand instance, `501` from an emulator without spot |
//! | `POST /_emulator/spot-capacity` | [`SpotCapacity`] | while `available` is false, spot creates fail the way the cloud fails them for want of capacity (on-demand creates are untouched; a reset makes capacity available again); `501` from an emulator without spot |
//!
//! Each instance of the dump also carries `"spot": true` when it runs on spot or
//! preemptible capacity (absent or `false` otherwise), read with [`DumpCapacities`]: an
//! emulator in another language adds the key to its dump. (It is not a field of
//! [`DumpInstance`] because emulators build that struct with a literal, and a new field
//! would break every one of them at once; see [`DumpCapacity`].)

use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
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

/// Whether a dumped instance runs on spot or preemptible capacity: the `spot` key the
/// dump carries next to [`DumpInstance`]'s fields, so that a test can tell a spot instance
/// from an on-demand one that a plugin made instead. Read from the body of
/// `GET /_emulator/dump` as [`DumpCapacities`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DumpCapacity {
    pub id: String,
    pub name: String,
    /// `false` when the key is absent: an emulator without spot never writes it.
    #[serde(default)]
    pub spot: bool,
}

/// The capacity of every dumped instance (the dump's body read for its `spot` keys).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
pub struct DumpCapacities {
    pub instances: Vec<DumpCapacity>,
}

/// `POST /_emulator/reclaim`: the backend takes this spot instance back.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Reclaim {
    pub id: String,
}

/// `POST /_emulator/spot-capacity`: whether the backend has spot capacity to give.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct SpotCapacity {
    pub available: bool,
}

/// Everything that exists, to check for leaks and duplicates. Terminated-and-gone instances
/// are not included; instances still being deleted are.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
pub struct Dump {
    pub instances: Vec<DumpInstance>,
    pub secondary: Vec<DumpSecondary>,
}

/// The API calls an emulator has answered since it started (or its last reset), control
/// surface excluded: what a benchmark reads to count a plugin's backend requests. Counters
/// only grow, so two snapshots give a window ([`RequestStats::since`]).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
pub struct RequestStats {
    /// Every call.
    pub total: u64,
    /// By the shared operation the call maps to, as in [`FaultOp`]: `create`, `get`,
    /// `delete`, `list`, and `other` for calls that map to none.
    pub by_op: BTreeMap<String, u64>,
    /// By the backend's own name of the call: an EC2 action, a Hetzner method and path
    /// with ids replaced by `{id}`.
    pub by_call: BTreeMap<String, u64>,
    /// Calls answered as rate-limited, the way the backend says it (Hetzner 429
    /// `rate_limit_exceeded`, EC2 `RequestLimitExceeded`): by the enforced [`RateLimit`]
    /// or by an injected fault.
    pub rate_limited: u64,
}

impl RequestStats {
    /// Counts one call.
    pub fn record(&mut self, op: Option<FaultOp>, call: &str) {
        self.total += 1;
        let op = match op {
            Some(FaultOp::Create) => "create",
            Some(FaultOp::Get) => "get",
            Some(FaultOp::Delete) => "delete",
            Some(FaultOp::List) => "list",
            Some(FaultOp::Any) | None => "other",
        };
        *self.by_op.entry(op.into()).or_default() += 1;
        *self.by_call.entry(call.into()).or_default() += 1;
    }

    /// What was counted after `earlier` (a snapshot of the same emulator).
    pub fn since(&self, earlier: &RequestStats) -> RequestStats {
        let diff = |now: &BTreeMap<String, u64>, then: &BTreeMap<String, u64>| {
            now.iter()
                .map(|(k, v)| {
                    (
                        k.clone(),
                        v.saturating_sub(then.get(k).copied().unwrap_or(0)),
                    )
                })
                .filter(|(_, v)| *v > 0)
                .collect()
        };
        RequestStats {
            total: self.total.saturating_sub(earlier.total),
            by_op: diff(&self.by_op, &earlier.by_op),
            by_call: diff(&self.by_call, &earlier.by_call),
            rate_limited: self.rate_limited.saturating_sub(earlier.rate_limited),
        }
    }
}

/// A path's segments with every all-digit one replaced by `{id}`: one name per route for
/// [`RequestStats::by_call`] (`GET /v1/servers/{id}`).
pub fn route_of(method: &str, path: &str) -> String {
    let segs: Vec<&str> = path
        .split('/')
        .map(|s| {
            if !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit()) {
                "{id}"
            } else {
                s
            }
        })
        .collect();
    format!("{method} {}", segs.join("/"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stats_count_by_op_and_call_and_diff() {
        let mut s = RequestStats::default();
        s.record(Some(FaultOp::Get), &route_of("GET", "/v1/servers/42"));
        let before = s.clone();
        s.record(Some(FaultOp::Get), &route_of("GET", "/v1/servers/7"));
        s.record(None, "GET /v1/locations");
        s.rate_limited += 1;
        assert_eq!(s.by_call["GET /v1/servers/{id}"], 2);
        let d = s.since(&before);
        assert_eq!(d.total, 2);
        assert_eq!(d.by_op["get"], 1);
        assert_eq!(d.by_op["other"], 1);
        assert_eq!(d.rate_limited, 1);
        assert_eq!(d.by_call.len(), 2);
    }
}
