//! The Rust side of the control surface every backend emulator exposes, so one conformance
//! suite can drive any of them through the states and faults a real backend only shows by
//! accident. The wire types and the HTTP routes (`/_emulator/...`) are defined in
//! `egress-emulator-protocol`; each emulator implements [`Emulator`] and serves those routes.

pub use egress_emulator_protocol::*;

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
    /// Remove the instance's public address (`None`) or set it, leaving its state alone:
    /// how a plugin's "running but no address yet" path is reached.
    fn set_address(&self, id: &str, ip: Option<&str>);
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
