//! The limits that stop a plugin call, each one a single definition: the field of the
//! providers file that sets it ([`LimitHit::field`]), the label it is counted under in
//! `proxy_operator_plugin_traps_total` ([`LimitHit::label`]) and the message that names it
//! ([`LimitHit::message`]). Enforcement stays where the resource is (the memory limiter,
//! the `/tmp` accounting, the HTTP hooks, the epoch callback, wasmtime's own traps) and
//! reports here through the call's [`Tripwire`].
//!
//! Adding a limit: a variant here (its three answers), the field in `config::Limits` with
//! its bounds (and its cost in `config::fit` if it holds memory), and the code that trips
//! it; then its hostile test.

use crate::config::Limits;
use crate::rate::Spec;
use std::sync::OnceLock;
use std::time::Duration;
use tokio_util::sync::CancellationToken;

/// Which limit stopped a call.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum LimitHit {
    /// `limits.fuel`: used up (wasmtime traps).
    Fuel,
    /// `limits.timeout` (or the load-time budget).
    Deadline,
    /// The provider's request budget had no token before the call's deadline.
    Budget,
    /// `limits.memoryMib`.
    Memory,
    /// `limits.tmpMib`: bytes written to `/tmp` plus 4 KiB per entry created.
    Tmp,
    /// `limits.openFiles`.
    Files,
    /// `limits.handles`: the call's resource table is full.
    Handles,
    /// `limits.http.maxInFlight`.
    Requests,
    /// `limits.http.maxHeaderBytes`: a header set grew past it (wasmtime-wasi-http traps).
    Headers,
}

/// What a limit's message says besides the limit itself.
#[derive(Debug, Clone, Copy)]
pub struct Context<'a> {
    pub limits: &'a Limits,
    /// The call's own deadline: `limits.timeout`, or less for a load-time call.
    pub timeout: Duration,
    /// The provider's request budget, if it has one.
    pub budget: Option<Spec>,
}

impl LimitHit {
    pub const ALL: [LimitHit; 9] = [
        LimitHit::Fuel,
        LimitHit::Deadline,
        LimitHit::Budget,
        LimitHit::Memory,
        LimitHit::Tmp,
        LimitHit::Files,
        LimitHit::Handles,
        LimitHit::Requests,
        LimitHit::Headers,
    ];

    /// The `kind` label of `proxy_operator_plugin_traps_total`.
    pub fn label(self) -> &'static str {
        match self {
            LimitHit::Fuel => "fuel",
            LimitHit::Deadline => "deadline",
            LimitHit::Budget => "budget",
            LimitHit::Memory => "memory",
            LimitHit::Tmp => "tmp",
            LimitHit::Files => "files",
            LimitHit::Handles => "handles",
            LimitHit::Requests => "requests",
            LimitHit::Headers => "headers",
        }
    }

    /// The providers-file field that sets it.
    pub fn field(self) -> &'static str {
        match self {
            LimitHit::Fuel => "limits.fuel",
            LimitHit::Deadline => "limits.timeout",
            LimitHit::Budget => "budget.requestsPerHour",
            LimitHit::Memory => "limits.memoryMib",
            LimitHit::Tmp => "limits.tmpMib",
            LimitHit::Files => "limits.openFiles",
            LimitHit::Handles => "limits.handles",
            LimitHit::Requests => "limits.http.maxInFlight",
            LimitHit::Headers => "limits.http.maxHeaderBytes",
        }
    }

    /// What the call's error says: the limit, its field and value, and what happened.
    pub fn message(self, c: &Context<'_>) -> String {
        let l = c.limits;
        let field = self.field();
        match self {
            LimitHit::Fuel => format!(
                "plugin used up its fuel budget ({field} = {}) and was stopped: a runaway loop or far too much work in one call",
                l.fuel
            ),
            LimitHit::Budget => {
                let (per_hour, burst) = c.budget.map_or((0, 0), |b| (b.per_hour, b.burst));
                format!(
                    "the provider's request budget ({field} = {per_hour}, burst = {burst}) had no token for a backend request before the call's deadline (limits.timeout = {}); the call was stopped without sending it",
                    humantime::format_duration(l.timeout)
                )
            }
            LimitHit::Deadline if c.timeout < l.timeout => format!(
                "plugin call ran past the load-time wall-clock budget ({}) and was stopped",
                humantime::format_duration(c.timeout)
            ),
            LimitHit::Deadline => format!(
                "plugin call ran past its wall-clock budget ({field} = {}) and was stopped",
                humantime::format_duration(l.timeout)
            ),
            LimitHit::Memory => format!(
                "plugin hit its memory cap ({field} = {}) and was stopped",
                l.memory_mib
            ),
            LimitHit::Tmp => format!(
                "plugin wrote more than its /tmp cap ({field} = {}) and was stopped",
                l.tmp_mib
            ),
            LimitHit::Files => format!(
                "plugin held more files open than its cap ({field} = {}) and was stopped",
                l.open_files
            ),
            LimitHit::Handles => format!(
                "plugin held more host handles (HTTP fields, requests, bodies, streams, pollables, files) than its cap ({field} = {}) and was stopped",
                l.handles
            ),
            LimitHit::Requests => format!(
                "plugin had more HTTP requests in flight than its cap ({field} = {}) and was stopped",
                l.http.max_in_flight
            ),
            LimitHit::Headers => format!(
                "plugin built a header set larger than its cap ({field} = {}) and was stopped",
                l.http.max_header_bytes
            ),
        }
    }

    /// The limit behind an error that wasmtime raised itself: fuel used up, a host call
    /// that could not push its result into the full resource table (`limits.handles`), or
    /// a header set grown past `limits.http.maxHeaderBytes` (wasmtime-wasi-http traps rather
    /// than return an error).
    pub fn of_trap(err: &wasmtime::Error) -> Option<LimitHit> {
        use wasmtime::component::ResourceTableError;
        use wasmtime_wasi_http::FieldMapError;
        if let Some(wasmtime::Trap::OutOfFuel) = err.downcast_ref::<wasmtime::Trap>() {
            return Some(LimitHit::Fuel);
        }
        err.chain().find_map(|e| {
            if let Some(ResourceTableError::Full) = e.downcast_ref::<ResourceTableError>() {
                return Some(LimitHit::Handles);
            }
            match e.downcast_ref::<FieldMapError>() {
                Some(FieldMapError::TotalSizeTooBig | FieldMapError::TooManyFields) => {
                    Some(LimitHit::Headers)
                }
                _ => None,
            }
        })
    }
}

/// The one place that knows which limit stopped a call: the first one to trip wins.
///
/// Shared (behind an `Arc`) by everything that enforces a limit: the memory limiter, the
/// `/tmp` accounting, the HTTP hooks (whose futures run outside the Store), the epoch
/// callback and the table-full detection. Tripping it also wakes the call's driver, so a
/// guest blocked in a host call (a pollable, an HTTP request) stops at once instead of at
/// its deadline.
#[derive(Debug, Default)]
pub struct Tripwire {
    hit: OnceLock<LimitHit>,
    tripped: CancellationToken,
}

impl Tripwire {
    /// Records `hit` unless a limit was already recorded, and wakes [`Tripwire::tripped`].
    pub fn trip(&self, hit: LimitHit) {
        let _ = self.hit.set(hit);
        self.tripped.cancel();
    }

    /// The limit that stopped the call, if one did.
    pub fn hit(&self) -> Option<LimitHit> {
        self.hit.get().copied()
    }

    /// Resolves once a limit has tripped.
    pub async fn tripped(&self) {
        self.tripped.cancelled().await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_first_limit_to_trip_wins_and_wakes_the_call() {
        let stop = std::sync::Arc::new(Tripwire::default());
        assert_eq!(stop.hit(), None);
        stop.trip(LimitHit::Requests);
        stop.trip(LimitHit::Deadline);
        assert_eq!(stop.hit(), Some(LimitHit::Requests));
        // Already tripped: resolves at once.
        futures::executor::block_on(stop.tripped());
    }

    /// Every limit names its own field and value in its message, and has a label of its
    /// own: what an operator reads in the error, and what the metric counts it under.
    #[test]
    fn each_limit_names_its_field_and_value() {
        let limits = Limits::default();
        let c = Context {
            limits: &limits,
            timeout: limits.timeout,
            budget: Some(Spec {
                per_hour: 3600,
                burst: 100,
            }),
        };
        let mut labels = std::collections::BTreeSet::new();
        for hit in LimitHit::ALL {
            let m = hit.message(&c);
            assert!(m.contains(&format!("{} = ", hit.field())), "{hit:?}: {m}");
            assert!(labels.insert(hit.label()), "{hit:?}: label repeated");
        }
        let load = Context {
            timeout: Duration::from_secs(5),
            ..c
        };
        assert!(
            LimitHit::Deadline
                .message(&load)
                .contains("load-time wall-clock budget (5s)")
        );
    }
}
