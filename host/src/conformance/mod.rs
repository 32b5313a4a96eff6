//! The provider conformance suite: runs a provider against an emulator of its backend
//! through every behaviour the operator's loops rely on, and reports one line per case.
//!
//! The suite knows nothing about any backend. It drives the provider through the
//! [`Provider`] trait (as the reconciler and GC do) and the emulator through the
//! `/_emulator/` control surface ([`Control`]), which is how it forces the states a real
//! backend only shows by accident: an instance held in provisioning, an unknown state, a
//! delete in progress, a lock, faults. A plugin author with their own emulator serving
//! that surface runs it unchanged: `proxy-operator conformance`.
//!
//! Cases run one after another; each starts from a reset emulator and uses its own names,
//! so a failure in one does not leak into the next. A case fails with a sentence saying
//! what was expected and what came back.

mod cases;
pub mod control;
pub mod lifecycle;
pub mod profile;

pub use control::{Control, ControlError};
pub use profile::Profile;

use egress_plugin_host::provider::{Placement, Provider};
use std::time::{Duration, Instant};
use tracing::Instrument;

/// What is tested: a provider configured against the emulator.
pub struct Subject<'a> {
    pub provider: &'a dyn Provider,
    /// The provider's per-call time limit: slow faults are made to outlast it, and a
    /// cut-off call must come back within it.
    pub call_timeout: Duration,
    /// The behaviour profile the plugin declares (`info`).
    pub profile: Vec<(String, String)>,
}

impl<'a> Subject<'a> {
    pub fn wasm(p: &'a egress_plugin_host::plugin::WasmProvider) -> Self {
        Subject {
            provider: p,
            call_timeout: p.limits().timeout,
            profile: p.info().profile.clone(),
        }
    }
}

/// How to run the suite.
#[derive(Debug, Clone)]
pub struct Options {
    /// A placement the provider accepts and the emulator can run.
    pub placement: Placement,
    /// The installation identity given to Create and ListByTag.
    pub installation: String,
    /// How long to wait for the backend to move (running, gone).
    pub wait: Duration,
    /// Pause between two Gets while waiting.
    pub poll: Duration,
    /// Run only the cases whose name contains one of these (all when empty).
    pub only: Vec<String>,
}

impl Options {
    pub fn new(placement: Placement) -> Self {
        Options {
            placement,
            installation: "egress-conformance".into(),
            wait: Duration::from_secs(30),
            poll: Duration::from_millis(50),
            only: Vec::new(),
        }
    }
}

/// The outcome of one case.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    Passed,
    Failed(String),
}

#[derive(Debug, Clone)]
pub struct CaseResult {
    pub name: &'static str,
    pub outcome: Outcome,
    pub elapsed: Duration,
}

impl std::fmt::Display for CaseResult {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let ms = self.elapsed.as_millis();
        match &self.outcome {
            Outcome::Passed => write!(f, "ok    {:<46} {ms:>6} ms", self.name),
            Outcome::Failed(why) => write!(f, "FAIL  {:<46} {ms:>6} ms  {why}", self.name),
        }
    }
}

/// Every case's result, in the order they ran.
#[derive(Debug, Clone, Default)]
pub struct Report {
    pub results: Vec<CaseResult>,
}

impl Report {
    pub fn failed(&self) -> Vec<&CaseResult> {
        self.results
            .iter()
            .filter(|r| r.outcome != Outcome::Passed)
            .collect()
    }

    pub fn passed(&self) -> bool {
        !self.results.is_empty() && self.failed().is_empty()
    }

    /// `N passed, M failed` for the last line of the output.
    pub fn total(&self) -> String {
        let failed = self.failed().len();
        format!(
            "{} cases: {} passed, {failed} failed",
            self.results.len(),
            self.results.len() - failed
        )
    }
}

/// The names of every case, in the order they run.
pub fn case_names() -> Vec<&'static str> {
    cases::CASES.iter().map(|c| c.name).collect()
}

/// Runs the suite. `each` sees every result as soon as it is known (to print progress).
pub async fn run(
    subject: &Subject<'_>,
    control: &Control,
    opts: &Options,
    mut each: impl FnMut(&CaseResult),
) -> Report {
    let run_id = run_id();
    let mut report = Report::default();
    for case in cases::CASES {
        if !opts.only.is_empty() && !opts.only.iter().any(|o| case.name.contains(o.as_str())) {
            continue;
        }
        let started = Instant::now();
        let ctx = cases::Ctx::new(subject, control, opts, &run_id, case.name);
        let outcome = async {
            match control.reset().await {
                Err(e) => Outcome::Failed(format!("resetting the emulator: {e}")),
                Ok(()) => match (case.run)(&ctx).await {
                    Ok(()) => Outcome::Passed,
                    Err(cases::Fail(why)) => Outcome::Failed(why),
                },
            }
        }
        .instrument(tracing::info_span!("conformance.case", case = case.name))
        .await;
        let result = CaseResult {
            name: case.name,
            outcome,
            elapsed: started.elapsed(),
        };
        each(&result);
        report.results.push(result);
    }
    // Leave nothing behind for whoever uses the emulator next.
    let _ = control.reset().await;
    report
}

/// Distinguishes the names of two runs against one long-lived emulator.
fn run_id() -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default()
        .as_nanos();
    format!(
        "{:x}",
        (nanos as u64) ^ u64::from(std::process::id()).rotate_left(40)
    )
}
