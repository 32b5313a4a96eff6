//! Hetzner server status -> operator state.
//!
//! The reconciler deletes and recreates anything `stopped` or `terminated`, so the mapping
//! leans towards `provisioning` wherever the server is still on its way up, and towards
//! `stopped` only for servers that will not come back by themselves.

use egress_guest_sdk::State;

/// How long after creation an `off` server with no other evidence counts as still being
/// started. Hetzner creates a server powered off and then runs `start_server`, so `off` is
/// briefly "created, not started yet"; the start normally follows within seconds.
pub const START_GRACE_SECS: u64 = 180;

/// The state a status means on its own. `off` needs more evidence: see [`off_is_starting`].
pub fn base_state(status: &str, has_address: bool) -> State {
    match status {
        // Being created or booted.
        "initializing" | "starting" => State::Provisioning,
        // A Hetzner server has its address before it boots; an address alone is not
        // readiness, and running without one is not reachable.
        "running" if has_address => State::Running,
        "running" => State::Provisioning,
        // An asynchronous operation on a live server: it comes back by itself.
        "rebuilding" | "migrating" => State::Provisioning,
        // Still visible while the delete runs; the name stays taken until it is gone.
        "deleting" => State::Terminated,
        // Stopped or stopping, and any status this plugin does not know (deleted and
        // recreated: instances are disposable).
        _ => State::Stopped,
    }
}

/// What is known about the `start_server` action the create call started.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StartAction<'a> {
    /// Read back from Hetzner: `running`, `success` or `error`.
    Status(&'a str),
    /// Not known (the cache entry was evicted or the operator restarted, or someone else
    /// created the server).
    Unknown,
}

/// Whether an `off` server is one that was created and has not been started yet, which
/// must read `provisioning`, never `stopped` (the reconciler would delete it at once).
///
/// Evidence, strongest first: a lock (an action is running on it, the power-on among
/// them); the start action itself; otherwise its age, so a server whose start evidence was
/// lost still gets [`START_GRACE_SECS`] before it counts as stopped.
pub fn off_is_starting(locked: bool, start: StartAction<'_>, age_secs: Option<u64>) -> bool {
    if locked {
        return true;
    }
    match start {
        StartAction::Status(s) => s == "running",
        StartAction::Unknown => age_secs.is_some_and(|a| a < START_GRACE_SECS),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn status_table() {
        let cases = [
            ("initializing", true, State::Provisioning),
            ("initializing", false, State::Provisioning),
            ("starting", true, State::Provisioning),
            ("running", true, State::Running),
            ("running", false, State::Provisioning),
            ("rebuilding", true, State::Provisioning),
            ("migrating", true, State::Provisioning),
            ("deleting", true, State::Terminated),
            ("stopping", true, State::Stopped),
            ("off", true, State::Stopped),
            ("unknown", true, State::Stopped),
            ("exploded", true, State::Stopped),
            ("", false, State::Stopped),
        ];
        for (status, ip, want) in cases {
            assert_eq!(base_state(status, ip), want, "{status} ip={ip}");
        }
    }

    #[test]
    fn off_after_create() {
        use StartAction::*;
        let cases = [
            (true, Unknown, Some(10_000), true),
            (true, Status("error"), None, true),
            (false, Status("running"), Some(10_000), true),
            (false, Status("error"), Some(5), false),
            (false, Status("success"), Some(5), false),
            (false, Unknown, Some(5), true),
            (false, Unknown, Some(START_GRACE_SECS), false),
            (false, Unknown, None, false),
        ];
        for (locked, start, age, want) in cases {
            assert_eq!(
                off_is_starting(locked, start, age),
                want,
                "{locked} {start:?} {age:?}"
            );
        }
    }
}
