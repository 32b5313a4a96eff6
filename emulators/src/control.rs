//! The Rust side of the control surface every backend emulator exposes, so one conformance
//! suite can drive any of them through the states and faults a real backend only shows by
//! accident. The wire types and the HTTP routes (`/_emulator/...`) are defined in
//! `egress-emulator-protocol`; [`crate::framework`] serves those routes for every emulator
//! with one router over this trait.

pub use egress_emulator_protocol::*;

/// The Rust side of the control surface.
///
/// Calls that name an instance return whether it exists: the HTTP surface answers `404`
/// for `false`, and Rust callers may ignore it (cleanup after a completed delete must not
/// fail).
pub trait Emulator: Send + Sync {
    /// Base URL of the backend API, e.g. `http://127.0.0.1:41234`.
    fn url(&self) -> String;
    /// The allow-list entry for it (`http://127.0.0.1:PORT`).
    fn allow_entry(&self) -> String {
        self.url()
    }
    /// Keep the instance in its provisioning state (no IP, not running) until released.
    fn hold_provisioning(&self, id: &str, hold: bool) -> bool;
    /// Put the instance in a raw backend state, known to the plugin or not.
    fn set_backend_state(&self, id: &str, state: &str) -> bool;
    /// Remove the instance's public address (`None`) or set it, leaving its state alone:
    /// how a plugin's "running but no address yet" path is reached.
    fn set_address(&self, id: &str, ip: Option<&str>) -> bool;
    /// Start a delete that stays in progress (the name stays taken, the backend still
    /// shows the instance in its deleting state) until [`Emulator::finish_deletes`].
    fn start_slow_delete(&self, id: &str) -> bool;
    /// Complete every delete left in progress.
    fn finish_deletes(&self);
    /// Lock the instance as the backend does during an action (calls on it fail with the
    /// backend's "locked" error); for backends without locks, an in-progress operation.
    fn set_locked(&self, id: &str, locked: bool) -> bool;
    /// Create an instance directly, returning its backend id, or the backend's refusal
    /// (name taken, invalid name, unknown scope) as the answer it would give.
    fn try_plant(&self, plant: Plant) -> Result<String, Refusal>;
    /// [`Emulator::try_plant`] for tests: panics when the backend refuses, since a planted
    /// instance must be one the backend could hold.
    fn plant(&self, plant: Plant) -> String {
        match self.try_plant(plant.clone()) {
            Ok(id) => id,
            Err(e) => panic!("cannot plant {plant:?}: {e}"),
        }
    }
    /// Inject a fault into the next calls.
    fn inject(&self, fault: Fault);
    /// Make listing fail for one scope (region / location) while the others answer.
    fn fail_scope(&self, scope: &str, fail: bool);
    /// Everything that exists now.
    fn dump(&self) -> Dump;
    /// Forget everything.
    fn reset(&self);
    /// Enforce the backend's rate limit the way the backend answers it (`None`: off, the
    /// default).
    fn set_rate_limit(&self, limit: Option<RateLimit>);
    /// The API calls answered since start or the last reset (`GET /_emulator/stats`).
    fn stats(&self) -> RequestStats;
    /// The backend reclaims spot instance `id` as the cloud does (`POST
    /// /_emulator/reclaim`): `Ok(false)` when there is no such instance, a [`Refusal`]
    /// (`409`) for an on-demand one. The default answers `501`: an emulator of a backend
    /// without spot, or one not taught it yet, says so instead of pretending.
    fn reclaim(&self, id: &str) -> Result<bool, Refusal> {
        let _ = id;
        Err(Refusal::unsupported("reclaim"))
    }
    /// Whether spot creates find capacity (`POST /_emulator/spot-capacity`); while
    /// `false` they fail the way the cloud fails them. Answers whether the emulator
    /// supports it at all; the default does not.
    fn set_spot_capacity(&self, available: bool) -> bool {
        let _ = available;
        false
    }
    /// The ids of the instances on spot or preemptible capacity now: the dump's `spot`
    /// keys. None by default.
    fn spot_instances(&self) -> Vec<String> {
        Vec::new()
    }
}

/// A backend's refusal of a control request, as the answer the backend would give: the
/// HTTP surface sends it as is, [`Emulator::plant`] panics with it.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("{status} {body}")]
pub struct Refusal {
    pub status: u16,
    /// The backend's error body (JSON).
    pub body: serde_json::Value,
}

impl Refusal {
    /// A backend's error answer: `status` and its JSON body.
    pub fn new(status: u16, body: serde_json::Value) -> Self {
        Refusal { status, body }
    }

    /// `501`: this emulator does not implement the control request `what`.
    pub fn unsupported(what: &str) -> Self {
        let error = format!("{what} is not supported by this emulator");
        Refusal::new(501, serde_json::json!({ "error": error }))
    }

    /// `409`: the control request cannot apply to this instance (`reclaim` of an on-demand
    /// one), saying why.
    pub fn conflict(id: &str, why: impl Into<String>) -> Self {
        Refusal::new(409, serde_json::json!({ "error": why.into(), "id": id }))
    }

    /// One more field of the body (`resource`, `details`, ...).
    pub fn with(mut self, key: &str, value: serde_json::Value) -> Self {
        self.body[key] = value;
        self
    }
}

/// A refusal is also an API answer: its status and body, and `Retry-After: 1` on a 429 so
/// that a client has something to wait by.
impl axum::response::IntoResponse for Refusal {
    fn into_response(self) -> axum::response::Response {
        use axum::http::{HeaderValue, StatusCode};
        let status = StatusCode::from_u16(self.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        let mut resp = (status, axum::Json(self.body)).into_response();
        if status == StatusCode::TOO_MANY_REQUESTS {
            resp.headers_mut().insert("retry-after", HeaderValue::from_static("1"));
        }
        resp
    }
}

/// Faults waiting for the calls they hit, oldest first: each hits the next `count` calls
/// of its operation (or of any, for [`FaultOp::Any`]), then goes. `E` is what a hit does
/// in a given emulator (answer an error, wait).
#[derive(Debug)]
pub struct FaultQueue<E> {
    /// Operation, effect, calls left, calls hit so far.
    queued: Vec<(FaultOp, E, u32, u32)>,
}

impl<E> Default for FaultQueue<E> {
    fn default() -> Self {
        FaultQueue { queued: Vec::new() }
    }
}

impl<E: Clone> FaultQueue<E> {
    /// Queues `effect` for the next `count` calls of `op` (nothing when `count` is 0).
    pub fn push(&mut self, op: FaultOp, effect: E, count: u32) {
        if count > 0 {
            self.queued.push((op, effect, count, 0));
        }
    }

    /// The oldest fault that applies to a call of `op` (`None`: a call of no particular
    /// operation, hit only by `Any` faults), consuming one of its uses.
    pub fn take(&mut self, op: Option<FaultOp>) -> Option<E> {
        self.take_counted(op).map(|(effect, _)| effect)
    }

    /// [`FaultQueue::take`], with how many calls the fault hit before this one (EC2
    /// alternates its server errors by it).
    pub fn take_counted(&mut self, op: Option<FaultOp>) -> Option<(E, u32)> {
        let idx = self.queued.iter().position(|(o, ..)| *o == FaultOp::Any || Some(*o) == op)?;
        let (_, effect, remaining, hit) = &mut self.queued[idx];
        *remaining -= 1;
        let result = (effect.clone(), *hit);
        *hit += 1;
        if *remaining == 0 {
            self.queued.remove(idx);
        }
        Some(result)
    }

    pub fn clear(&mut self) {
        self.queued.clear();
    }
}

#[cfg(test)]
mod fault_queue_tests {
    use super::*;

    #[test]
    fn faults_hit_their_operation_oldest_first_and_expire() {
        let mut q = FaultQueue::default();
        q.push(FaultOp::Get, "get-1", 1);
        q.push(FaultOp::Any, "any", 2);
        q.push(FaultOp::Create, "never", 0);
        assert_eq!(q.take(Some(FaultOp::Create)), Some("any"));
        assert_eq!(q.take(Some(FaultOp::Get)), Some("get-1"));
        assert_eq!(q.take(None), Some("any"));
        assert_eq!(q.take(Some(FaultOp::Get)), None);
        q.push(FaultOp::List, "l", 3);
        assert_eq!(q.take_counted(Some(FaultOp::List)), Some(("l", 0)));
        assert_eq!(q.take_counted(None), None);
        assert_eq!(q.take_counted(Some(FaultOp::List)), Some(("l", 1)));
        q.push(FaultOp::Delete, "d", 5);
        q.clear();
        assert_eq!(q.take(Some(FaultOp::Delete)), None);
    }
}
