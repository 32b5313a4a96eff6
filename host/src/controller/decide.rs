//! What the reconciler does next, as a pure function.
//!
//! One reconcile is a short loop: [`decide`] looks at the Proxy (and at the answer to the
//! provider call it asked for last, if any) and returns a [`Decision`]: status changes,
//! events, and the next step. The shell in `reconcile.rs` writes the status, publishes the
//! events, performs the step and, for a provider call, feeds the answer back in. Every branch
//! of the reconciler's behaviour is therefore a row in this file's table test, with no
//! Kubernetes or provider in sight.
//!
//! The provider's answers are the only thing known about an instance: nothing watches the
//! backend, so every state change is found by polling, with Get, or (for a Running Proxy)
//! with the provider's periodic list (see `crate::inventory`), which can confirm that
//! nothing changed but never that an instance is gone.

use super::bounds::{CONDITION_MESSAGE_MAX, truncate};
use egress_plugin_host::provider::{Class, Instance, IpFamily, ProviderError, State, host_port};
use std::time::Duration;

/// How long to wait before looking again, per situation. Defaults from the design brief,
/// each overridable by a flag.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Timings {
    /// Instance created or booting: poll Get this often until it runs.
    pub provisioning_poll: Duration,
    /// Instance being deleted (replacement, stopped instance, Proxy deletion).
    pub deletion_poll: Duration,
    /// Instance running: look again this often to notice it stopped or vanished.
    pub drift_poll: Duration,
    /// A quick second look (used by the shell when a reconcile needs another round).
    pub requeue_now: Duration,
    /// The backend said quota, rate limit or out of capacity.
    pub quota_retry: Duration,
    /// The cloud-init Secret or its key is missing: look again this often.
    pub input_retry: Duration,
}

impl Default for Timings {
    fn default() -> Self {
        Timings {
            provisioning_poll: Duration::from_secs(10),
            deletion_poll: Duration::from_secs(10),
            drift_poll: Duration::from_secs(300),
            requeue_now: Duration::from_secs(1),
            quota_retry: Duration::from_secs(300),
            input_retry: Duration::from_secs(30),
        }
    }
}

/// Reasons of the `Provisioned` condition (and of `Ready` while not provisioned).
pub mod reason {
    pub const PROVISIONING: &str = "Provisioning";
    pub const RUNNING: &str = "Running";
    pub const QUOTA_EXCEEDED: &str = "QuotaExceeded";
    /// Latched: no provider call until `metadata.generation` changes.
    pub const PERMANENT_ERROR: &str = "PermanentError";
    pub const PROVIDER_NOT_CONFIGURED: &str = "ProviderNotConfigured";
    pub const CLOUD_INIT_UNAVAILABLE: &str = "CloudInitUnavailable";
    pub const INVALID_SPEC: &str = "InvalidSpec";
    pub const REPLACING: &str = "Replacing";
    pub const INSTANCE_STOPPED: &str = "InstanceStopped";
    pub const INSTANCE_LOST: &str = "InstanceLost";
    pub const DELETING: &str = "Deleting";
    /// A provider call failed Transient (or NotFound where that cannot be acted on) and is
    /// retried with backoff. Set only where no reason of its own says more: a Running
    /// Proxy stays Running (the failure is in the message, the address stays published),
    /// and Replacing, InstanceStopped and Deleting keep their reason.
    pub const PROVIDER_ERROR: &str = "ProviderError";
}

/// Reasons of the events the reconciler publishes.
pub mod event {
    pub const CREATED: &str = "Created";
    pub const PROVISIONED: &str = "Provisioned";
    pub const REPLACING: &str = "Replacing";
    pub const DELETED: &str = "Deleted";
    pub const CLEANUP_SKIPPED: &str = "CleanupSkipped";
    pub const QUOTA_EXCEEDED: &str = "QuotaExceeded";
    pub const PERMANENT_ERROR: &str = "PermanentError";
    pub const INSTANCE_STOPPED: &str = "InstanceStopped";
    pub const INSTANCE_LOST: &str = "InstanceLost";
    /// The cloud reclaimed a spot instance (the plugin said `interrupted`, or answered
    /// NotFound with code `Interrupted`): replaced like a stopped or lost one, but said
    /// apart, since it is the price of spot capacity rather than a fault.
    pub const INTERRUPTED: &str = "Interrupted";
    pub const PROVIDER_NOT_CONFIGURED: &str = "ProviderNotConfigured";
    pub const CLOUD_INIT_UNAVAILABLE: &str = "CloudInitUnavailable";
    pub const INVALID_SPEC: &str = "InvalidSpec";
    /// An instance was created for a Proxy with `spec.auth.type: None` and no
    /// `allowedClients`: said once per instance, as a warning, because it is open.
    pub const OPEN_PROXY: &str = "OpenProxy";
    /// A provider call failed Transient and is retried with backoff: said (as a warning,
    /// its note the condition's message) when the Provisioned condition's reason or
    /// message changes, not on every retry.
    pub const PROVIDER_ERROR: &str = "ProviderError";
}

/// The error code of a NotFound that says the cloud reclaimed the instance (a spot
/// instance its backend deleted on preemption), as the provider contract defines it.
pub const INTERRUPTED_CODE: &str = egress_contract::codes::INTERRUPTED;

/// The spec's inputs as far as they could be resolved this reconcile.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Input {
    /// Cloud-init resolved; the spec hash of placement, cloud-init and port.
    Resolved { hash: String },
    /// The referenced Secret or key does not exist (yet): a condition, retried.
    Unavailable { message: String },
    /// The spec cannot work as written (neither or both cloud-init sources, bad port): a
    /// condition, until the spec is edited.
    Invalid { message: String },
    /// Reading the Secret failed (API error): retried with backoff.
    Unreadable { message: String },
}

/// A condition as far as decisions care.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct CondView {
    /// "True", "False" or "Unknown".
    pub status: String,
    pub reason: String,
    /// As written (so cut to the reconciler's bound): a failure reported again with the
    /// same reason and message is not news.
    pub message: String,
    pub observed_generation: Option<i64>,
}

/// Everything [`decide`] looks at, extracted from the Proxy and the provider registry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Observed {
    pub generation: i64,
    /// `metadata.deletionTimestamp` is set.
    pub deleting: bool,
    pub has_finalizer: bool,
    pub skip_cleanup: bool,
    /// `spec.provider` names a provider in the current registry.
    pub provider_configured: bool,
    pub provider: String,
    /// Irrelevant while deleting (a missing Secret must never block deletion).
    pub input: Input,
    pub provider_id: Option<String>,
    pub stored_hash: Option<String>,
    pub port: i32,
    pub provisioned: Option<CondView>,
    /// `status.ip`.
    pub ip: Option<String>,
    /// The instance `provider_id` as the provider's last fresh list shows it; `None` when
    /// no fresh list shows it (only Get can tell then).
    pub listed: Option<Instance>,
    /// A list of this provider to come will answer for this Running Proxy, and how long
    /// until it should have: one under way with no fresh one yet (just after start, or a
    /// reload; zero), or the next whole list for a Proxy Running since the fresh one
    /// started.
    pub list_pending: Option<Duration>,
    /// For a Proxy in transition: whether the provider's lists answer for it instead of a
    /// Get (see [`crate::inventory::by_list_view`]).
    pub by_list: crate::inventory::ByList,
    /// For a Proxy in transition whose create this process saw return: how long until a
    /// provisioning poll has passed since (`None`: it has, or the create is not known).
    pub first_look_in: Option<Duration>,
    /// `spec.auth` asks for neither credentials nor an allow-list: the proxy is open.
    pub open: bool,
    /// `spec.ipFamily`: which of the instance's addresses clients get.
    pub ip_family: IpFamily,
}

impl Observed {
    fn provisioned_reason(&self) -> &str {
        self.provisioned
            .as_ref()
            .map(|c| c.reason.as_str())
            .unwrap_or("")
    }

    fn provisioned_true(&self) -> bool {
        self.provisioned
            .as_ref()
            .is_some_and(|c| c.status == "True")
    }

    /// The listed instance, when it confirms a Running Proxy as its status has it: same
    /// ID, Running, same address. Everything else (a Proxy in transition, an instance
    /// missing from the list, stopped or moved) is left to Get.
    fn listed_unchanged(&self) -> Option<&Instance> {
        if !self.running_as_recorded() {
            return None;
        }
        let inst = self.listed.as_ref()?;
        let same = Some(&inst.id) == self.provider_id.as_ref()
            && crate::inventory::listed_running_at(Some(inst), self.ip.as_deref()?, self.ip_family);
        same.then_some(inst)
    }

    /// Provisioned=True with reason Running: the state a drift check looks at.
    fn running_as_recorded(&self) -> bool {
        self.provisioned
            .as_ref()
            .is_some_and(|c| c.status == "True" && c.reason == reason::RUNNING)
    }

    /// A permanent error from this generation: no provider calls until the spec changes.
    fn latched(&self) -> bool {
        self.provisioned.as_ref().is_some_and(|c| {
            c.reason == reason::PERMANENT_ERROR && c.observed_generation == Some(self.generation)
        })
    }
}

/// Why a Get is made: the same answer means different things on each path.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GetPurpose {
    /// Normal reconciling: how is the instance doing?
    Observe,
    /// Replacement: is the old instance gone yet?
    Replace,
    /// Proxy deletion: is the instance gone yet?
    Finalize,
}

/// Why a Delete is made.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DeletePurpose {
    /// Replacement: the old instance must go before the new one (same name) is created.
    Replace,
    /// The instance stopped or terminated: it will not recover, so it is recreated.
    Stopped,
    /// Proxy deletion, instance still there.
    Finalize,
    /// Proxy deletion, Get failed permanently (malformed ID, location gone): if Delete
    /// succeeds there is nothing the provider can still reach, so the Proxy is released.
    FinalizeAfterPermanentGet,
}

/// A provider call the shell makes for the decision.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Call {
    /// Create with the name derived from the Proxy UID (idempotent by that name).
    Create,
    Get {
        id: String,
        purpose: GetPurpose,
    },
    Delete {
        id: String,
        purpose: DeletePurpose,
    },
}

/// The provider's answer to a [`Call`], tagged with the call's purpose.
#[derive(Debug, Clone, PartialEq)]
pub enum Answer {
    Created(Result<String, ProviderError>),
    Got(GetPurpose, Result<Instance, ProviderError>),
    Deleted(DeletePurpose, Result<(), ProviderError>),
}

/// Why a reconcile fails (and so backs off exponentially).
#[derive(Debug, Clone, PartialEq)]
pub enum Failure {
    /// A transient provider failure, or a permanent one while deleting (retried forever;
    /// the skip-cleanup annotation is the way out).
    Provider(ProviderError),
    /// The cloud-init Secret could not be read.
    Input(String),
}

/// The step after this decision.
#[derive(Debug, Clone, PartialEq)]
pub enum Next {
    /// Make this provider call and decide again with its answer.
    Call(Call),
    /// Add the finalizer (it must be there before the first Create); the reconcile ends and
    /// the next one starts from the updated object.
    AddFinalizer,
    /// Remove the finalizer: the Proxy may go.
    ReleaseFinalizer,
    /// Done for now; look again after this long.
    Requeue(Duration),
    /// Done until the Proxy (or the provider configuration) changes.
    AwaitChange,
    /// Return an error: exponential backoff.
    Fail(Failure),
}

/// The condition `Provisioned` as a decision sets it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Cond {
    pub ok: bool,
    pub reason: &'static str,
    pub message: String,
}

impl Cond {
    fn ok(reason: &'static str, message: impl Into<String>) -> Self {
        Cond {
            ok: true,
            reason,
            message: message.into(),
        }
    }
    fn not(reason: &'static str, message: impl Into<String>) -> Self {
        Cond {
            ok: false,
            reason,
            message: message.into(),
        }
    }
}

/// Changes to the Proxy's status. Every field: `None` keeps the current value; for the
/// `Option<Option<_>>` ones, `Some(None)` clears it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct StatusChange {
    pub provider_id: Option<Option<String>>,
    pub spec_hash: Option<Option<String>>,
    pub state: Option<Option<State>>,
    /// `ip` and `port` together: the address clients are given.
    pub address: Option<Option<(String, i32)>>,
    pub provisioned: Option<Cond>,
    /// What the instance costs (set by the shell, which looks prices up); cleared with the
    /// instance.
    pub hourly_price: Option<Option<crate::api::HourlyPrice>>,
}

impl StatusChange {
    pub fn is_empty(&self) -> bool {
        *self == StatusChange::default()
    }

    /// The instance is gone or about to be: nothing in status may point at it.
    fn forget_instance() -> Self {
        StatusChange {
            provider_id: Some(None),
            spec_hash: Some(None),
            state: Some(None),
            address: Some(None),
            provisioned: None,
            hourly_price: Some(None),
        }
    }

    fn with(mut self, cond: Cond) -> Self {
        self.provisioned = Some(cond);
        self
    }
}

/// An event to publish on the Proxy.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EventNote {
    pub warning: bool,
    pub reason: &'static str,
    pub note: String,
}

impl EventNote {
    fn normal(reason: &'static str, note: impl Into<String>) -> Self {
        EventNote {
            warning: false,
            reason,
            note: note.into(),
        }
    }
    fn warning(reason: &'static str, note: impl Into<String>) -> Self {
        EventNote {
            warning: true,
            reason,
            note: note.into(),
        }
    }
}

/// What to do: write `status`, publish `events`, then take `next`.
#[derive(Debug, Clone, PartialEq)]
pub struct Decision {
    pub status: StatusChange,
    pub events: Vec<EventNote>,
    pub next: Next,
}

impl Decision {
    fn next(next: Next) -> Self {
        Decision {
            status: StatusChange::default(),
            events: Vec::new(),
            next,
        }
    }
    /// A Running Proxy the lists answer for waits for them instead of the drift poll.
    fn at_rest(mut self, t: &Timings) -> Self {
        if self.next == Next::Requeue(t.drift_poll) {
            self.next = Next::AwaitChange;
        }
        self
    }
    fn status(mut self, status: StatusChange) -> Self {
        self.status = status;
        self
    }
    fn cond(mut self, cond: Cond) -> Self {
        self.status.provisioned = Some(cond);
        self
    }
    fn event(mut self, event: EventNote) -> Self {
        self.events.push(event);
        self
    }
    fn event_if(self, cond: bool, event: impl FnOnce() -> EventNote) -> Self {
        if cond { self.event(event()) } else { self }
    }
    /// Publishes `event` only when the Provisioned reason changes to `to`: a condition that
    /// stays the same on every retry is not news.
    fn event_on_transition(self, o: &Observed, to: &str, event: EventNote) -> Self {
        if o.provisioned_reason() == to {
            self
        } else {
            self.event(event)
        }
    }
    /// Sets `cond` (its message cut as the reconciler writes it) and publishes a warning
    /// `event` with the same text, unless the Provisioned condition already says exactly
    /// that (status, reason and message): a failure retried with backoff is news once,
    /// and again only when what it says changes, not on every retry.
    fn cond_and_warn_on_change(self, o: &Observed, mut cond: Cond, event: &'static str) -> Self {
        truncate(&mut cond.message, CONDITION_MESSAGE_MAX);
        let said = o.provisioned.as_ref().is_some_and(|c| {
            c.status == if cond.ok { "True" } else { "False" }
                && c.reason == cond.reason
                && c.message == cond.message
        });
        let note = cond.message.clone();
        self.cond(cond)
            .event_if(!said, || EventNote::warning(event, note))
    }
}

/// Ends every message of a failure that is retried with backoff.
const RETRYING: &str = "retrying with backoff";

/// The step a failed provider call belonged to: what the Provisioned condition says while
/// it is retried.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum During {
    /// Create (of a first instance, a recreation or a replacement).
    Create,
    /// The Get of normal reconciling (a drift check when the Proxy is Running).
    Observe,
    /// The Get or Delete of an instance being replaced.
    Replace,
    /// The Delete of a stopped or terminated instance.
    Stopped,
}

/// The Provisioned condition while a call of step `during` fails with `e` and is retried.
/// A Running Proxy stays Running: a failed drift check says nothing about the instance, so
/// its address stays published and Ready stays what it was; the failure is in the message.
/// Replacing and InstanceStopped keep their reason (the reconciler's next step depends on
/// it); anything else is `ProviderError`.
fn retrying(o: &Observed, during: During, e: &ProviderError) -> Cond {
    let id = o.provider_id.as_deref().unwrap_or_default();
    let stopped = || {
        Cond::not(
            reason::INSTANCE_STOPPED,
            format!(
                "instance {id} is stopped or terminated; deleting it to create it again: {e}; {RETRYING}"
            ),
        )
    };
    match during {
        During::Create => Cond::not(reason::PROVIDER_ERROR, format!("{e}; {RETRYING}")),
        During::Observe if o.provisioned_true() => {
            let at =
                o.ip.as_ref()
                    .map(|ip| format!(" at {ip}:{}", o.port))
                    .unwrap_or_default();
            Cond::ok(
                reason::RUNNING,
                format!(
                    "instance {id} running{at}; checking it failed: {e}; {RETRYING} (the address stays published)"
                ),
            )
        }
        During::Observe if o.provisioned_reason() == reason::INSTANCE_STOPPED => stopped(),
        During::Observe => Cond::not(reason::PROVIDER_ERROR, format!("{e}; {RETRYING}")),
        During::Replace => Cond::not(
            reason::REPLACING,
            format!("spec changed: replacing instance {id}: {e}; {RETRYING}"),
        ),
        During::Stopped => stopped(),
    }
}

/// The next step for a Proxy, given what is known about it and the answer to the last
/// provider call made in this reconcile (`None` at the start of a reconcile).
pub fn decide(o: &Observed, answer: Option<&Answer>, t: &Timings) -> Decision {
    match answer {
        None if o.deleting => plan_delete(o),
        None => plan(o, t),
        Some(Answer::Created(r)) => after_create(o, r, t),
        Some(Answer::Got(purpose, r)) => after_get(o, *purpose, r, t),
        Some(Answer::Deleted(purpose, r)) => after_delete(o, *purpose, r, t),
    }
}

/// Start of a reconcile of a Proxy that is not being deleted.
fn plan(o: &Observed, t: &Timings) -> Decision {
    if !o.has_finalizer {
        return Decision::next(Next::AddFinalizer);
    }
    if !o.provider_configured {
        // Not latched: the registry re-triggers every Proxy when the config changes.
        let message = format!(
            "provider {:?} is not in the operator's providers configuration",
            o.provider
        );
        return Decision::next(Next::AwaitChange)
            .cond(Cond::not(reason::PROVIDER_NOT_CONFIGURED, &message))
            .event_on_transition(
                o,
                reason::PROVIDER_NOT_CONFIGURED,
                EventNote::warning(event::PROVIDER_NOT_CONFIGURED, message),
            );
    }
    if o.latched() {
        return Decision::next(Next::AwaitChange);
    }
    let hash = match &o.input {
        Input::Resolved { hash } => hash,
        Input::Unavailable { message } => {
            return Decision::next(Next::Requeue(t.input_retry))
                .cond(Cond::not(reason::CLOUD_INIT_UNAVAILABLE, message))
                .event_on_transition(
                    o,
                    reason::CLOUD_INIT_UNAVAILABLE,
                    EventNote::warning(event::CLOUD_INIT_UNAVAILABLE, message),
                );
        }
        Input::Invalid { message } => {
            return Decision::next(Next::AwaitChange)
                .cond(Cond::not(reason::INVALID_SPEC, message))
                .event_on_transition(
                    o,
                    reason::INVALID_SPEC,
                    EventNote::warning(event::INVALID_SPEC, message),
                );
        }
        Input::Unreadable { message } => {
            // An API error reading the Proxy's Secret: backed off, and said on the Proxy
            // (once, while it stays the same). A Running Proxy keeps its address: nothing
            // is known to be wrong with its instance.
            let cond = if o.provisioned_true() {
                let id = o.provider_id.as_deref().unwrap_or_default();
                let at =
                    o.ip.as_ref()
                        .map(|ip| format!(" at {ip}:{}", o.port))
                        .unwrap_or_default();
                Cond::ok(
                    reason::RUNNING,
                    format!(
                        "instance {id} running{at}; reading its cloud-init or credentials failed: {message}; {RETRYING} (the address stays published)"
                    ),
                )
            } else {
                Cond::not(
                    reason::CLOUD_INIT_UNAVAILABLE,
                    format!("{message}; {RETRYING}"),
                )
            };
            return Decision::next(Next::Fail(Failure::Input(message.clone())))
                .cond_and_warn_on_change(o, cond, event::CLOUD_INIT_UNAVAILABLE);
        }
    };
    let Some(id) = &o.provider_id else {
        return Decision::next(Next::Call(Call::Create));
    };
    let changed = o.stored_hash.as_ref().is_some_and(|stored| stored != hash);
    if !changed {
        if let Some(inst) = o.listed_unchanged() {
            // The drift check, answered by the provider's list: no call, and no timer of
            // its own. The lists send this Proxy back when one does not confirm it, and
            // all of the provider's Running Proxies when its lists fail for longer than a
            // list stays fresh (`inventory::list_one`); and a list sends it back when its
            // `lastProbe` is due a refresh (`inventory::probe_due`). A requeue per Running
            // Proxy was an entry in kube's scheduler each, kept twice (about 1.4 KB), and
            // a reconcile per Proxy per drift poll: 2,000 a second (real) at 10,000.
            return observe(o, inst, t).at_rest(t);
        }
        if let Some(wait) = o.list_pending
            && o.running_as_recorded()
        {
            // The list to come answers for this Proxy and all the others; a Get each
            // (every Proxy at start) would spend the budget the list needs. A Proxy the
            // list does not confirm is sent back at once; if the list fails, this one Gets
            // at its next drift poll. No sooner than when the list should have ended: a
            // whole list paced during a rollout is due long after the drift poll, and a
            // reconcile each drift poll until then was work for nothing.
            return Decision::next(Next::Requeue(wait.max(t.drift_poll)));
        }
        if !o.running_as_recorded() {
            // In transition while lists confirm this provider's many Proxies in transition:
            // a list's answer stands for a Get's; a list coming answers for all at once.
            match &o.by_list {
                crate::inventory::ByList::Listed(inst) => return observe(o, inst, t),
                crate::inventory::ByList::Wait => {
                    return Decision::next(Next::Requeue(t.provisioning_poll));
                }
                crate::inventory::ByList::No => {}
            }
            // The first Get comes a provisioning poll after the create, as the create's
            // own requeue asks. The reconcile that the create's status write sets off
            // comes milliseconds after it: no instance has booted yet, and the list loop
            // has not yet counted the rollout this Proxy starts, whose lists would answer
            // for it. A Get there cost one request per Proxy of a small rollout, and made
            // how many Proxies of a larger one Get depend on when the loop last woke.
            if let Some(wait) = o.first_look_in {
                return Decision::next(Next::Requeue(wait));
            }
        }
        return Decision::next(Next::Call(Call::Get {
            id: id.clone(),
            purpose: GetPurpose::Observe,
        }));
    }
    if o.provisioned_reason() == reason::REPLACING {
        // Replace-wait: the old instance was asked to go; is it gone?
        return Decision::next(Next::Call(Call::Get {
            id: id.clone(),
            purpose: GetPurpose::Replace,
        }));
    }
    // Replace-delete. Recorded before the call, so a crash or a failed Delete resumes
    // in replace-wait (which deletes again while the instance is still there).
    let message = format!("spec changed: deleting instance {id} to create its replacement");
    Decision::next(Next::Call(Call::Delete {
        id: id.clone(),
        purpose: DeletePurpose::Replace,
    }))
    .status(StatusChange {
        address: Some(None),
        ..Default::default()
    })
    .cond(Cond::not(reason::REPLACING, &message))
    .event(EventNote::normal(event::REPLACING, message))
}

/// Start of a reconcile of a Proxy that is being deleted.
fn plan_delete(o: &Observed) -> Decision {
    if !o.has_finalizer {
        return Decision::next(Next::AwaitChange);
    }
    if o.skip_cleanup {
        let note = match &o.provider_id {
            Some(id) => format!("skip-cleanup set: instance {id} left in place"),
            None => "skip-cleanup set".to_string(),
        };
        return Decision::next(Next::ReleaseFinalizer)
            .event(EventNote::normal(event::CLEANUP_SKIPPED, note));
    }
    let Some(id) = &o.provider_id else {
        // Nothing recorded. An instance created just before a crash (ID never written) is
        // an orphan now; GC collects it once it is older than MinAge.
        return Decision::next(Next::ReleaseFinalizer).event(EventNote::normal(
            event::DELETED,
            "no instance was recorded; nothing to delete",
        ));
    };
    if !o.provider_configured {
        let message = format!(
            "provider {:?} is not in the operator's providers configuration: cannot delete instance {id} (set the skip-cleanup annotation to release the Proxy without deleting it)",
            o.provider
        );
        return Decision::next(Next::AwaitChange)
            .cond(Cond::not(reason::PROVIDER_NOT_CONFIGURED, &message))
            .event_on_transition(
                o,
                reason::PROVIDER_NOT_CONFIGURED,
                EventNote::warning(event::PROVIDER_NOT_CONFIGURED, message),
            );
    }
    Decision::next(Next::Call(Call::Get {
        id: id.clone(),
        purpose: GetPurpose::Finalize,
    }))
}

fn after_create(o: &Observed, r: &Result<String, ProviderError>, t: &Timings) -> Decision {
    match r {
        Ok(id) => {
            let hash = match &o.input {
                Input::Resolved { hash } => Some(hash.clone()),
                _ => None,
            };
            Decision::next(Next::Requeue(t.provisioning_poll))
                .status(StatusChange {
                    provider_id: Some(Some(id.clone())),
                    spec_hash: Some(hash),
                    state: Some(None),
                    address: Some(None),
                    provisioned: None,
                    // The instance it replaced was forgotten with its price.
                    hourly_price: None,
                })
                .cond(Cond::not(
                    reason::PROVISIONING,
                    format!("instance {id} created; waiting for it to run"),
                ))
                .event(EventNote::normal(
                    event::CREATED,
                    format!("created instance {id}"),
                ))
                .event_if(o.open, || {
                    EventNote::warning(
                        event::OPEN_PROXY,
                        format!(
                            "instance {id} runs an open proxy: spec.auth.type is None and \
                             spec.auth.allowedClients is empty, so anyone who can reach it \
                             may use it"
                        ),
                    )
                })
        }
        Err(e) => provider_failure(o, e, t, During::Create),
    }
}

fn after_get(
    o: &Observed,
    purpose: GetPurpose,
    r: &Result<Instance, ProviderError>,
    t: &Timings,
) -> Decision {
    let id = o.provider_id.clone().unwrap_or_default();
    match (purpose, r) {
        (GetPurpose::Observe, Ok(inst)) => observe(o, inst, t),
        (GetPurpose::Observe, Err(e)) if e.class == Class::NotFound => {
            // Gone. Clear the ID first (so a crash after the next Create cannot leave a
            // stale ID in status), then create again under the same name.
            let d = Decision::next(Next::Call(Call::Create)).status(
                StatusChange::forget_instance().with(Cond::not(
                    reason::PROVISIONING,
                    format!("instance {id} is gone; creating it again"),
                )),
            );
            if o.provisioned_reason() == reason::INSTANCE_STOPPED {
                d // we deleted it ourselves
            } else if e.code.as_deref() == Some(INTERRUPTED_CODE) {
                d.event(EventNote::warning(
                    event::INTERRUPTED,
                    format!(
                        "instance {id} was reclaimed by the provider (spot interruption); creating it again"
                    ),
                ))
            } else {
                d.event(EventNote::warning(
                    event::INSTANCE_LOST,
                    format!("instance {id} no longer exists; creating it again"),
                ))
            }
        }
        (GetPurpose::Replace, Ok(_)) => Decision::next(Next::Call(Call::Delete {
            id,
            purpose: DeletePurpose::Replace,
        })),
        (GetPurpose::Replace, Err(e)) if e.class == Class::NotFound => Decision::next(Next::Call(
            Call::Create,
        ))
        .status(StatusChange::forget_instance().with(Cond::not(
            reason::REPLACING,
            format!("old instance {id} is gone; creating the replacement"),
        ))),
        (GetPurpose::Observe, Err(e))
            if e.class == Class::QuotaExceeded && o.provisioned_true() =>
        {
            // A rate-limited drift check says nothing about a running instance: keep its
            // address published (Ready stays), and look again after QuotaRetry.
            Decision::next(Next::Requeue(t.quota_retry))
        }
        (GetPurpose::Observe, Err(e)) => provider_failure(o, e, t, During::Observe),
        (GetPurpose::Replace, Err(e)) => provider_failure(o, e, t, During::Replace),
        (GetPurpose::Finalize, Ok(_)) => {
            let d = Decision::next(Next::Call(Call::Delete {
                id: id.clone(),
                purpose: DeletePurpose::Finalize,
            }))
            .status(StatusChange {
                address: Some(None),
                ..Default::default()
            });
            if deletion_said(o) {
                // Kept: a failure of the last try is still the news, and writing
                // "deleting" over it on every retry would make it news again each time.
                d
            } else {
                d.cond(Cond::not(
                    reason::DELETING,
                    format!("deleting instance {id}"),
                ))
            }
        }
        (GetPurpose::Finalize, Err(e)) => match e.class {
            Class::NotFound => Decision::next(Next::ReleaseFinalizer).event(EventNote::normal(
                event::DELETED,
                format!("instance {id} deleted"),
            )),
            Class::Permanent => Decision::next(Next::Call(Call::Delete {
                id,
                purpose: DeletePurpose::FinalizeAfterPermanentGet,
            })),
            Class::QuotaExceeded => Decision::next(Next::Requeue(t.quota_retry)),
            Class::Transient => deletion_retrying(o, e),
        },
    }
}

/// The Proxy is being deleted and its condition already says so (Deleting, or a failure
/// of a Delete: a permanent error while deleting is retried too).
fn deletion_said(o: &Observed) -> bool {
    o.deleting
        && o.provisioned.as_ref().is_some_and(|c| {
            c.status == "False"
                && (c.reason == reason::DELETING || c.reason == reason::PERMANENT_ERROR)
        })
}

/// A Get or Delete of the Proxy's instance failed Transient while the Proxy is deleted:
/// backoff, with the failure in the Deleting condition (and the address withdrawn, as
/// every step of a deletion does).
fn deletion_retrying(o: &Observed, e: &ProviderError) -> Decision {
    let id = o.provider_id.as_deref().unwrap_or_default();
    Decision::next(Next::Fail(Failure::Provider(e.clone())))
        .status(StatusChange {
            address: Some(None),
            ..Default::default()
        })
        .cond_and_warn_on_change(
            o,
            Cond::not(
                reason::DELETING,
                format!("deleting instance {id}: {e}; {RETRYING}"),
            ),
            event::PROVIDER_ERROR,
        )
}

/// Get answered with the instance during normal reconciling.
fn observe(o: &Observed, inst: &Instance, t: &Timings) -> Decision {
    // An ID without a hash predates hash tracking or was written by hand: adopt the
    // current spec rather than replace a working instance.
    let adopt_hash = match (&o.stored_hash, &o.input) {
        (None, Input::Resolved { hash }) => Some(Some(hash.clone())),
        _ => None,
    };
    let ip = inst.address(o.ip_family);
    match inst.state {
        State::Running if let Some(ip) = ip => {
            let address = match u16::try_from(o.port) {
                Ok(port) => host_port(ip, port),
                Err(_) => format!("{ip} port {}", o.port),
            };
            let d = Decision::next(Next::Requeue(t.drift_poll)).status(StatusChange {
                spec_hash: adopt_hash,
                state: Some(Some(State::Running)),
                address: Some(Some((ip.to_string(), o.port))),
                provisioned: Some(Cond::ok(
                    reason::RUNNING,
                    format!("instance {} running at {address}", inst.id),
                )),
                ..Default::default()
            });
            if o.provisioned_true() {
                d
            } else {
                d.event(EventNote::normal(
                    event::PROVISIONED,
                    format!("instance {} running at {address}", inst.id),
                ))
            }
        }
        // Running without an address (of the Proxy's family) is still provisioning as far
        // as clients care.
        State::Running | State::Provisioning => {
            let message = match (inst.state, o.ip_family) {
                (State::Running, IpFamily::V6) if !inst.ip.is_empty() => format!(
                    "instance {} is running at {} but has no IPv6 address yet, which \
                     spec.ipFamily IPv6 needs",
                    inst.id, inst.ip
                ),
                _ => format!("instance {} is provisioning", inst.id),
            };
            Decision::next(Next::Requeue(t.provisioning_poll)).status(StatusChange {
                spec_hash: adopt_hash,
                state: Some(Some(State::Provisioning)),
                address: Some(None),
                provisioned: Some(Cond::not(reason::PROVISIONING, message)),
                ..Default::default()
            })
        }
        State::Stopped | State::Terminated => {
            // It will not come back by itself. Delete it, keep the ID, and recreate once
            // Get says NotFound.
            let (message, said_as) = if inst.interrupted {
                let m = format!(
                    "instance {} was reclaimed by the provider (spot interruption) and is {}; \
                     deleting it to create it again",
                    inst.id,
                    inst.state.as_str()
                );
                (m, event::INTERRUPTED)
            } else {
                let m = format!(
                    "instance {} is {}; deleting it to create it again",
                    inst.id,
                    inst.state.as_str()
                );
                (m, event::INSTANCE_STOPPED)
            };
            // Already InstanceStopped: the condition is kept, so that the failure of the
            // last Delete (retried now) stays the news instead of being written over and
            // reported again on every retry.
            let already = o.provisioned_reason() == reason::INSTANCE_STOPPED;
            Decision::next(Next::Call(Call::Delete {
                id: o.provider_id.clone().unwrap_or_else(|| inst.id.clone()),
                purpose: DeletePurpose::Stopped,
            }))
            .status(StatusChange {
                state: Some(Some(inst.state)),
                address: Some(None),
                provisioned: (!already).then(|| Cond::not(reason::INSTANCE_STOPPED, &message)),
                ..Default::default()
            })
            .event_if(!already, || EventNote::warning(said_as, message))
        }
    }
}

fn after_delete(
    o: &Observed,
    purpose: DeletePurpose,
    r: &Result<(), ProviderError>,
    t: &Timings,
) -> Decision {
    let id = o.provider_id.clone().unwrap_or_default();
    // Delete is idempotent; NotFound from it means the same as success.
    let gone = match r {
        Ok(()) => true,
        Err(e) => e.class == Class::NotFound,
    };
    match purpose {
        DeletePurpose::Replace | DeletePurpose::Stopped | DeletePurpose::Finalize if gone => {
            // Wait for Get to say NotFound: the name stays taken until then.
            Decision::next(Next::Requeue(t.deletion_poll))
        }
        DeletePurpose::FinalizeAfterPermanentGet if gone => Decision::next(Next::ReleaseFinalizer)
            .event(EventNote::normal(
                event::DELETED,
                format!("instance {id} deleted (it could no longer be read)"),
            )),
        DeletePurpose::Replace | DeletePurpose::Stopped => {
            let Err(e) = r else {
                unreachable!("gone handled above")
            };
            let during = match purpose {
                DeletePurpose::Replace => During::Replace,
                _ => During::Stopped,
            };
            provider_failure(o, e, t, during)
        }
        DeletePurpose::Finalize | DeletePurpose::FinalizeAfterPermanentGet => {
            let Err(e) = r else {
                unreachable!("gone handled above")
            };
            deletion_failure(o, e, t)
        }
    }
}

/// A provider error during normal reconciling (Create, Get, Delete of a replacement or a
/// stopped instance), in step `during`.
fn provider_failure(o: &Observed, e: &ProviderError, t: &Timings, during: During) -> Decision {
    match e.class {
        Class::QuotaExceeded => {
            let message = e.to_string();
            Decision::next(Next::Requeue(t.quota_retry))
                .cond(Cond::not(reason::QUOTA_EXCEEDED, &message))
                .event_on_transition(
                    o,
                    reason::QUOTA_EXCEEDED,
                    EventNote::warning(event::QUOTA_EXCEEDED, message),
                )
        }
        Class::Permanent => {
            // The condition's observedGeneration is this generation: that is the latch.
            let message = format!("{e}; fix the spec or the provider configuration");
            Decision::next(Next::AwaitChange)
                .cond(Cond::not(reason::PERMANENT_ERROR, &message))
                .event(EventNote::warning(event::PERMANENT_ERROR, message))
        }
        // NotFound from anything but Get is not a signal the reconciler can act on. Backoff,
        // and the Proxy says why (once per change, not per retry).
        Class::Transient | Class::NotFound => Decision::next(Next::Fail(Failure::Provider(
            e.clone(),
        )))
        .cond_and_warn_on_change(o, retrying(o, during, e), event::PROVIDER_ERROR),
    }
}

/// A provider error while deleting the Proxy's instance. Nothing latches here: the Proxy
/// is released only once the instance is known to be gone (or skip-cleanup is set).
fn deletion_failure(o: &Observed, e: &ProviderError, t: &Timings) -> Decision {
    match e.class {
        Class::QuotaExceeded => Decision::next(Next::Requeue(t.quota_retry)),
        Class::Permanent => {
            let message = format!(
                "{e}; retrying (set the skip-cleanup annotation to release the Proxy without deleting the instance)"
            );
            Decision::next(Next::Fail(Failure::Provider(e.clone())))
                .status(StatusChange {
                    address: Some(None),
                    ..Default::default()
                })
                .cond_and_warn_on_change(
                    o,
                    Cond::not(reason::PERMANENT_ERROR, message),
                    event::PERMANENT_ERROR,
                )
        }
        // NotFound is gone (the caller's); anything unknown is retried as Transient is.
        Class::Transient | Class::NotFound => deletion_retrying(o, e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use egress_plugin_host::provider::Op;

    const ID: &str = "fsn1/proxy-abc";

    fn t() -> Timings {
        Timings::default()
    }

    /// A Proxy with a running instance that matches its spec, generation 1.
    fn obs() -> Observed {
        Observed {
            generation: 1,
            deleting: false,
            has_finalizer: true,
            skip_cleanup: false,
            provider_configured: true,
            provider: "hetzner-eu".into(),
            input: Input::Resolved { hash: "h1".into() },
            provider_id: Some(ID.into()),
            stored_hash: Some("h1".into()),
            port: 3128,
            provisioned: Some(cond("True", reason::RUNNING, 1)),
            ip: Some("192.0.2.1".into()),
            listed: None,
            list_pending: None,
            by_list: crate::inventory::ByList::No,
            first_look_in: None,
            open: false,
            ip_family: IpFamily::V4,
        }
    }

    fn cond(status: &str, reason: &str, generation: i64) -> CondView {
        CondView {
            status: status.into(),
            reason: reason.into(),
            message: String::new(),
            observed_generation: Some(generation),
        }
    }

    fn with(f: impl FnOnce(&mut Observed)) -> Observed {
        let mut o = obs();
        f(&mut o);
        o
    }

    fn err(class: Class, op: Op) -> ProviderError {
        ProviderError::new(class, op, "hetzner-eu", ID, "backend said no")
    }

    fn inst(state: State, ip: &str) -> Instance {
        Instance::new(ID, ip, state, "uid-1", None)
    }

    fn get(purpose: GetPurpose) -> Next {
        Next::Call(Call::Get {
            id: ID.into(),
            purpose,
        })
    }

    fn delete(purpose: DeletePurpose) -> Next {
        Next::Call(Call::Delete {
            id: ID.into(),
            purpose,
        })
    }

    fn fail(class: Class, op: Op) -> Next {
        Next::Fail(Failure::Provider(err(class, op)))
    }

    /// The parts of a decision the table compares: messages are free text (checked
    /// separately), reasons and steps are the contract.
    #[derive(Debug, PartialEq)]
    struct Want {
        next: Next,
        status: StatusChange,
        events: Vec<&'static str>,
    }

    fn want(next: Next) -> Want {
        Want {
            next,
            status: StatusChange::default(),
            events: vec![],
        }
    }

    impl Want {
        fn cond(mut self, ok: bool, reason: &'static str) -> Self {
            self.status.provisioned = Some(Cond {
                ok,
                reason,
                message: String::new(),
            });
            self
        }
        fn status(mut self, f: impl FnOnce(&mut StatusChange)) -> Self {
            f(&mut self.status);
            self
        }
        fn events(mut self, events: &[&'static str]) -> Self {
            self.events = events.to_vec();
            self
        }
    }

    fn summarize(d: Decision) -> Want {
        let mut status = d.status;
        if let Some(c) = &mut status.provisioned {
            c.message.clear();
        }
        Want {
            next: d.next,
            status,
            events: d.events.iter().map(|e| e.reason).collect(),
        }
    }

    fn forget(s: &mut StatusChange) {
        s.provider_id = Some(None);
        s.spec_hash = Some(None);
        s.state = Some(None);
        s.address = Some(None);
        s.hourly_price = Some(None);
    }

    #[test]
    fn table() {
        let t = t();
        let rows: Vec<(&str, Observed, Option<Answer>, Want)> = vec![
            // --- finalizer, inputs, provider configuration ---
            (
                "no finalizer: add it before anything else (before the first Create)",
                with(|o| {
                    o.has_finalizer = false;
                    o.provider_id = None;
                    o.provisioned = None;
                }),
                None,
                want(Next::AddFinalizer),
            ),
            (
                "provider not configured: condition, wait for a config change, no provider call",
                with(|o| o.provider_configured = false),
                None,
                want(Next::AwaitChange)
                    .cond(false, reason::PROVIDER_NOT_CONFIGURED)
                    .events(&[event::PROVIDER_NOT_CONFIGURED]),
            ),
            (
                "provider still not configured: no repeated event",
                with(|o| {
                    o.provider_configured = false;
                    o.provisioned = Some(cond("False", reason::PROVIDER_NOT_CONFIGURED, 1));
                }),
                None,
                want(Next::AwaitChange).cond(false, reason::PROVIDER_NOT_CONFIGURED),
            ),
            (
                "provider configured again (same generation): not latched, reconciles",
                with(|o| o.provisioned = Some(cond("False", reason::PROVIDER_NOT_CONFIGURED, 1))),
                None,
                want(get(GetPurpose::Observe)),
            ),
            (
                "cloud-init Secret missing: condition and retry, not latched",
                with(|o| {
                    o.input = Input::Unavailable {
                        message: "Secret default/ci not found".into(),
                    }
                }),
                None,
                want(Next::Requeue(t.input_retry))
                    .cond(false, reason::CLOUD_INIT_UNAVAILABLE)
                    .events(&[event::CLOUD_INIT_UNAVAILABLE]),
            ),
            (
                "cloud-init Secret still missing: retry again, no repeated event",
                with(|o| {
                    o.input = Input::Unavailable {
                        message: "Secret default/ci not found".into(),
                    };
                    o.provisioned = Some(cond("False", reason::CLOUD_INIT_UNAVAILABLE, 1));
                }),
                None,
                want(Next::Requeue(t.input_retry)).cond(false, reason::CLOUD_INIT_UNAVAILABLE),
            ),
            (
                "cloud-init Secret back: reconciles normally",
                with(|o| o.provisioned = Some(cond("False", reason::CLOUD_INIT_UNAVAILABLE, 1))),
                None,
                want(get(GetPurpose::Observe)),
            ),
            (
                "invalid spec (both cloud-init sources): condition until the spec is edited",
                with(|o| {
                    o.input = Input::Invalid {
                        message: "set exactly one".into(),
                    }
                }),
                None,
                want(Next::AwaitChange)
                    .cond(false, reason::INVALID_SPEC)
                    .events(&[event::INVALID_SPEC]),
            ),
            (
                "Secret unreadable (API error) while Running: backoff, said, still Running",
                with(|o| {
                    o.input = Input::Unreadable {
                        message: "503".into(),
                    }
                }),
                None,
                want(Next::Fail(Failure::Input("503".into())))
                    .cond(true, reason::RUNNING)
                    .events(&[event::CLOUD_INIT_UNAVAILABLE]),
            ),
            (
                "Secret unreadable (API error) before an instance: backoff and said",
                with(|o| {
                    o.input = Input::Unreadable {
                        message: "503".into(),
                    };
                    o.provider_id = None;
                    o.provisioned = None;
                }),
                None,
                want(Next::Fail(Failure::Input("503".into())))
                    .cond(false, reason::CLOUD_INIT_UNAVAILABLE)
                    .events(&[event::CLOUD_INIT_UNAVAILABLE]),
            ),
            // --- create ---
            (
                "no providerID: Create",
                with(|o| {
                    o.provider_id = None;
                    o.stored_hash = None;
                    o.provisioned = None;
                }),
                None,
                want(Next::Call(Call::Create)),
            ),
            (
                "Create returned: record ID and hash, Provisioning, poll",
                with(|o| {
                    o.provider_id = None;
                    o.stored_hash = None;
                }),
                Some(Answer::Created(Ok(ID.into()))),
                want(Next::Requeue(t.provisioning_poll))
                    .cond(false, reason::PROVISIONING)
                    .status(|s| {
                        s.provider_id = Some(Some(ID.into()));
                        s.spec_hash = Some(Some("h1".into()));
                        s.state = Some(None);
                        s.address = Some(None);
                    })
                    .events(&[event::CREATED]),
            ),
            (
                "Create of an open proxy: a warning says so",
                with(|o| {
                    o.provider_id = None;
                    o.open = true;
                }),
                Some(Answer::Created(Ok(ID.into()))),
                want(Next::Requeue(t.provisioning_poll))
                    .cond(false, reason::PROVISIONING)
                    .status(|s| {
                        s.provider_id = Some(Some(ID.into()));
                        s.spec_hash = Some(Some("h1".into()));
                        s.state = Some(None);
                        s.address = Some(None);
                    })
                    .events(&[event::CREATED, event::OPEN_PROXY]),
            ),
            (
                "Create: quota is a condition and a slow retry, not an error",
                with(|o| o.provider_id = None),
                Some(Answer::Created(Err(err(Class::QuotaExceeded, Op::Create)))),
                want(Next::Requeue(t.quota_retry))
                    .cond(false, reason::QUOTA_EXCEEDED)
                    .events(&[event::QUOTA_EXCEEDED]),
            ),
            (
                "Create: quota again, no repeated event",
                with(|o| {
                    o.provider_id = None;
                    o.provisioned = Some(cond("False", reason::QUOTA_EXCEEDED, 1));
                }),
                Some(Answer::Created(Err(err(Class::QuotaExceeded, Op::Create)))),
                want(Next::Requeue(t.quota_retry)).cond(false, reason::QUOTA_EXCEEDED),
            ),
            (
                "Create: permanent latches (condition at this generation, no requeue)",
                with(|o| o.provider_id = None),
                Some(Answer::Created(Err(err(Class::Permanent, Op::Create)))),
                want(Next::AwaitChange)
                    .cond(false, reason::PERMANENT_ERROR)
                    .events(&[event::PERMANENT_ERROR]),
            ),
            (
                "Create: transient is an error (exponential backoff), said on the Proxy",
                with(|o| o.provider_id = None),
                Some(Answer::Created(Err(err(Class::Transient, Op::Create)))),
                want(fail(Class::Transient, Op::Create))
                    .cond(false, reason::PROVIDER_ERROR)
                    .events(&[event::PROVIDER_ERROR]),
            ),
            (
                "Create: NotFound cannot be acted on, so it backs off like Transient",
                with(|o| o.provider_id = None),
                Some(Answer::Created(Err(err(Class::NotFound, Op::Create)))),
                want(fail(Class::NotFound, Op::Create))
                    .cond(false, reason::PROVIDER_ERROR)
                    .events(&[event::PROVIDER_ERROR]),
            ),
            // --- the latch ---
            (
                "latched at this generation: no provider call",
                with(|o| o.provisioned = Some(cond("False", reason::PERMANENT_ERROR, 1))),
                None,
                want(Next::AwaitChange),
            ),
            (
                "latched, no ID: still no Create",
                with(|o| {
                    o.provider_id = None;
                    o.provisioned = Some(cond("False", reason::PERMANENT_ERROR, 1));
                }),
                None,
                want(Next::AwaitChange),
            ),
            (
                "latch released once metadata.generation changes",
                with(|o| {
                    o.generation = 2;
                    o.provider_id = None;
                    o.provisioned = Some(cond("False", reason::PERMANENT_ERROR, 1));
                }),
                None,
                want(Next::Call(Call::Create)),
            ),
            // --- observe ---
            (
                "providerID, hash unchanged: Get",
                obs(),
                None,
                want(get(GetPurpose::Observe)),
            ),
            // --- the inventory (the provider's last fresh list) ---
            (
                "Running, listed Running at the same address: no call, no timer (the lists send it back)",
                with(|o| o.listed = Some(inst(State::Running, "192.0.2.1"))),
                None,
                want(Next::AwaitChange)
                    .cond(true, reason::RUNNING)
                    .status(|s| {
                        s.state = Some(Some(State::Running));
                        s.address = Some(Some(("192.0.2.1".into(), 3128)));
                    }),
            ),
            (
                "Running, not in the list (or no fresh list): Get, never 'gone'",
                with(|o| o.listed = None),
                None,
                want(get(GetPurpose::Observe)),
            ),
            (
                "Running, not yet listed, the first list under way: no call, DriftPoll",
                with(|o| o.list_pending = Some(Duration::ZERO)),
                None,
                want(Next::Requeue(t.drift_poll)),
            ),
            (
                "Running since the fresh whole list began: wait until the next should end",
                with(|o| o.list_pending = Some(t.drift_poll * 3)),
                None,
                want(Next::Requeue(t.drift_poll * 3)),
            ),
            (
                "Provisioning, the first list under way: Get (transitions never wait for it)",
                with(|o| {
                    o.list_pending = Some(Duration::ZERO);
                    o.provisioned = Some(cond("False", reason::PROVISIONING, 1));
                }),
                None,
                want(get(GetPurpose::Observe)),
            ),
            (
                "Running, the first list under way, spec changed: replace at once",
                with(|o| {
                    o.list_pending = Some(Duration::ZERO);
                    o.input = Input::Resolved { hash: "h2".into() };
                }),
                None,
                want(delete(DeletePurpose::Replace))
                    .cond(false, reason::REPLACING)
                    .status(|s| s.address = Some(None))
                    .events(&[event::REPLACING]),
            ),
            (
                "Running, listed at another address: Get",
                with(|o| o.listed = Some(inst(State::Running, "192.0.2.9"))),
                None,
                want(get(GetPurpose::Observe)),
            ),
            (
                "Running, listed Stopped: Get (the list may be older than a restart)",
                with(|o| o.listed = Some(inst(State::Stopped, "192.0.2.1"))),
                None,
                want(get(GetPurpose::Observe)),
            ),
            (
                "Running, listed Running without an address: Get",
                with(|o| o.listed = Some(inst(State::Running, ""))),
                None,
                want(get(GetPurpose::Observe)),
            ),
            (
                "listed under another ID: Get",
                with(|o| {
                    let mut i = inst(State::Running, "192.0.2.1");
                    i.id = "fsn1/other".into();
                    o.listed = Some(i);
                }),
                None,
                want(get(GetPurpose::Observe)),
            ),
            (
                "in transition (Provisioning), listed Running: Get",
                with(|o| {
                    o.provisioned = Some(cond("False", reason::PROVISIONING, 1));
                    o.listed = Some(inst(State::Running, "192.0.2.1"));
                }),
                None,
                want(get(GetPurpose::Observe)),
            ),
            (
                "QuotaExceeded condition, listed Running: Get (the condition must clear)",
                with(|o| {
                    o.provisioned = Some(cond("False", reason::QUOTA_EXCEEDED, 1));
                    o.listed = Some(inst(State::Running, "192.0.2.1"));
                }),
                None,
                want(get(GetPurpose::Observe)),
            ),
            (
                "spec changed, listed Running: replace (Delete), the list is not asked",
                with(|o| {
                    o.input = Input::Resolved { hash: "h2".into() };
                    o.listed = Some(inst(State::Running, "192.0.2.1"));
                }),
                None,
                want(delete(DeletePurpose::Replace))
                    .cond(false, reason::REPLACING)
                    .status(|s| s.address = Some(None))
                    .events(&[event::REPLACING]),
            ),
            (
                "deleting, listed Running: Get (Finalize)",
                with(|o| {
                    o.deleting = true;
                    o.listed = Some(inst(State::Running, "192.0.2.1"));
                }),
                None,
                want(get(GetPurpose::Finalize)),
            ),
            (
                "Running with IP: write ip/state, Provisioned, requeue after DriftPoll",
                with(|o| o.provisioned = Some(cond("False", reason::PROVISIONING, 1))),
                Some(Answer::Got(
                    GetPurpose::Observe,
                    Ok(inst(State::Running, "192.0.2.7")),
                )),
                want(Next::Requeue(t.drift_poll))
                    .cond(true, reason::RUNNING)
                    .status(|s| {
                        s.state = Some(Some(State::Running));
                        s.address = Some(Some(("192.0.2.7".into(), 3128)));
                    })
                    .events(&[event::PROVISIONED]),
            ),
            (
                "still Running: same status, no event",
                obs(),
                Some(Answer::Got(
                    GetPurpose::Observe,
                    Ok(inst(State::Running, "192.0.2.7")),
                )),
                want(Next::Requeue(t.drift_poll))
                    .cond(true, reason::RUNNING)
                    .status(|s| {
                        s.state = Some(Some(State::Running));
                        s.address = Some(Some(("192.0.2.7".into(), 3128)));
                    }),
            ),
            (
                "ID without a stored hash: adopt the current hash instead of replacing",
                with(|o| o.stored_hash = None),
                Some(Answer::Got(
                    GetPurpose::Observe,
                    Ok(inst(State::Running, "192.0.2.7")),
                )),
                want(Next::Requeue(t.drift_poll))
                    .cond(true, reason::RUNNING)
                    .status(|s| {
                        s.spec_hash = Some(Some("h1".into()));
                        s.state = Some(Some(State::Running));
                        s.address = Some(Some(("192.0.2.7".into(), 3128)));
                    }),
            ),
            (
                "Provisioning: requeue after ProvisioningPoll",
                with(|o| o.provisioned = Some(cond("False", reason::PROVISIONING, 1))),
                Some(Answer::Got(
                    GetPurpose::Observe,
                    Ok(inst(State::Provisioning, "")),
                )),
                want(Next::Requeue(t.provisioning_poll))
                    .cond(false, reason::PROVISIONING)
                    .status(|s| {
                        s.state = Some(Some(State::Provisioning));
                        s.address = Some(None);
                    }),
            ),
            (
                "Running without an IP counts as Provisioning",
                obs(),
                Some(Answer::Got(
                    GetPurpose::Observe,
                    Ok(inst(State::Running, "")),
                )),
                want(Next::Requeue(t.provisioning_poll))
                    .cond(false, reason::PROVISIONING)
                    .status(|s| {
                        s.state = Some(Some(State::Provisioning));
                        s.address = Some(None);
                    }),
            ),
            (
                "IPv6 Proxy, dual-stack instance: the IPv6 address is published",
                with(|o| {
                    o.ip_family = IpFamily::V6;
                    o.ip = Some("2001:db8::7".into());
                }),
                Some(Answer::Got(
                    GetPurpose::Observe,
                    Ok(Instance {
                        ipv6: "2001:db8::7".into(),
                        ..inst(State::Running, "192.0.2.7")
                    }),
                )),
                want(Next::Requeue(t.drift_poll))
                    .cond(true, reason::RUNNING)
                    .status(|s| {
                        s.state = Some(Some(State::Running));
                        s.address = Some(Some(("2001:db8::7".into(), 3128)));
                    }),
            ),
            (
                "IPv6 Proxy, IPv6-only instance: Running",
                with(|o| {
                    o.ip_family = IpFamily::V6;
                    o.provisioned = Some(cond("False", reason::PROVISIONING, 1));
                }),
                Some(Answer::Got(
                    GetPurpose::Observe,
                    Ok(Instance {
                        ipv6: "2001:db8::7".into(),
                        ..inst(State::Running, "")
                    }),
                )),
                want(Next::Requeue(t.drift_poll))
                    .cond(true, reason::RUNNING)
                    .status(|s| {
                        s.state = Some(Some(State::Running));
                        s.address = Some(Some(("2001:db8::7".into(), 3128)));
                    })
                    .events(&[event::PROVISIONED]),
            ),
            (
                "IPv6 Proxy, IPv4-only instance: not Running, no address published",
                with(|o| o.ip_family = IpFamily::V6),
                Some(Answer::Got(
                    GetPurpose::Observe,
                    Ok(inst(State::Running, "192.0.2.7")),
                )),
                want(Next::Requeue(t.provisioning_poll))
                    .cond(false, reason::PROVISIONING)
                    .status(|s| {
                        s.state = Some(Some(State::Provisioning));
                        s.address = Some(None);
                    }),
            ),
            (
                "IPv4 Proxy, IPv6-only instance: not Running either",
                obs(),
                Some(Answer::Got(
                    GetPurpose::Observe,
                    Ok(Instance {
                        ipv6: "2001:db8::7".into(),
                        ..inst(State::Running, "")
                    }),
                )),
                want(Next::Requeue(t.provisioning_poll))
                    .cond(false, reason::PROVISIONING)
                    .status(|s| {
                        s.state = Some(Some(State::Provisioning));
                        s.address = Some(None);
                    }),
            ),
            (
                "Stopped: Delete, keep the ID",
                obs(),
                Some(Answer::Got(
                    GetPurpose::Observe,
                    Ok(inst(State::Stopped, "")),
                )),
                want(delete(DeletePurpose::Stopped))
                    .cond(false, reason::INSTANCE_STOPPED)
                    .status(|s| {
                        s.state = Some(Some(State::Stopped));
                        s.address = Some(None);
                    })
                    .events(&[event::INSTANCE_STOPPED]),
            ),
            (
                "Terminated because the cloud reclaimed it (spot): same steps, said as Interrupted",
                obs(),
                Some(Answer::Got(
                    GetPurpose::Observe,
                    Ok(Instance {
                        interrupted: true,
                        ..inst(State::Terminated, "")
                    }),
                )),
                want(delete(DeletePurpose::Stopped))
                    .cond(false, reason::INSTANCE_STOPPED)
                    .status(|s| {
                        s.state = Some(Some(State::Terminated));
                        s.address = Some(None);
                    })
                    .events(&[event::INTERRUPTED]),
            ),
            (
                "Terminated: same as Stopped",
                obs(),
                Some(Answer::Got(
                    GetPurpose::Observe,
                    Ok(inst(State::Terminated, "192.0.2.7")),
                )),
                want(delete(DeletePurpose::Stopped))
                    .cond(false, reason::INSTANCE_STOPPED)
                    .status(|s| {
                        s.state = Some(Some(State::Terminated));
                        s.address = Some(None);
                    })
                    .events(&[event::INSTANCE_STOPPED]),
            ),
            (
                "still Stopped on the next poll: Delete again, condition kept, no repeated event",
                with(|o| o.provisioned = Some(cond("False", reason::INSTANCE_STOPPED, 1))),
                Some(Answer::Got(
                    GetPurpose::Observe,
                    Ok(inst(State::Stopped, "")),
                )),
                want(delete(DeletePurpose::Stopped)).status(|s| {
                    s.state = Some(Some(State::Stopped));
                    s.address = Some(None);
                }),
            ),
            (
                "Delete of a stopped instance accepted: ID kept, requeue after DeletionPoll",
                with(|o| o.provisioned = Some(cond("False", reason::INSTANCE_STOPPED, 1))),
                Some(Answer::Deleted(DeletePurpose::Stopped, Ok(()))),
                want(Next::Requeue(t.deletion_poll)),
            ),
            (
                "stopped instance gone (NotFound): clear the ID and recreate, no InstanceLost",
                with(|o| o.provisioned = Some(cond("False", reason::INSTANCE_STOPPED, 1))),
                Some(Answer::Got(
                    GetPurpose::Observe,
                    Err(err(Class::NotFound, Op::Get)),
                )),
                want(Next::Call(Call::Create))
                    .cond(false, reason::PROVISIONING)
                    .status(forget),
            ),
            (
                "instance vanished (NotFound): clear the ID and create again",
                obs(),
                Some(Answer::Got(
                    GetPurpose::Observe,
                    Err(err(Class::NotFound, Op::Get)),
                )),
                want(Next::Call(Call::Create))
                    .cond(false, reason::PROVISIONING)
                    .status(forget)
                    .events(&[event::INSTANCE_LOST]),
            ),
            (
                "reclaimed and already removed (NotFound, code Interrupted): create again, said as Interrupted",
                obs(),
                Some(Answer::Got(
                    GetPurpose::Observe,
                    Err(err(Class::NotFound, Op::Get).with_code(INTERRUPTED_CODE)),
                )),
                want(Next::Call(Call::Create))
                    .cond(false, reason::PROVISIONING)
                    .status(forget)
                    .events(&[event::INTERRUPTED]),
            ),
            (
                "drift Get of a running instance: quota keeps it Ready, slow retry",
                obs(),
                Some(Answer::Got(
                    GetPurpose::Observe,
                    Err(err(Class::QuotaExceeded, Op::Get)),
                )),
                want(Next::Requeue(t.quota_retry)),
            ),
            (
                "Get while provisioning: quota is a condition and a slow retry",
                with(|o| o.provisioned = Some(cond("False", reason::PROVISIONING, 1))),
                Some(Answer::Got(
                    GetPurpose::Observe,
                    Err(err(Class::QuotaExceeded, Op::Get)),
                )),
                want(Next::Requeue(t.quota_retry))
                    .cond(false, reason::QUOTA_EXCEEDED)
                    .events(&[event::QUOTA_EXCEEDED]),
            ),
            (
                "Get: permanent latches",
                obs(),
                Some(Answer::Got(
                    GetPurpose::Observe,
                    Err(err(Class::Permanent, Op::Get)),
                )),
                want(Next::AwaitChange)
                    .cond(false, reason::PERMANENT_ERROR)
                    .events(&[event::PERMANENT_ERROR]),
            ),
            (
                "drift Get: transient backs off, still Running at its address (Ready kept)",
                obs(),
                Some(Answer::Got(
                    GetPurpose::Observe,
                    Err(err(Class::Transient, Op::Get)),
                )),
                want(fail(Class::Transient, Op::Get))
                    .cond(true, reason::RUNNING)
                    .events(&[event::PROVIDER_ERROR]),
            ),
            (
                "Get while provisioning: transient backs off as ProviderError",
                with(|o| o.provisioned = Some(cond("False", reason::PROVISIONING, 1))),
                Some(Answer::Got(
                    GetPurpose::Observe,
                    Err(err(Class::Transient, Op::Get)),
                )),
                want(fail(Class::Transient, Op::Get))
                    .cond(false, reason::PROVIDER_ERROR)
                    .events(&[event::PROVIDER_ERROR]),
            ),
            (
                "Get of a stopped instance: transient keeps InstanceStopped (no InstanceLost later)",
                with(|o| o.provisioned = Some(cond("False", reason::INSTANCE_STOPPED, 1))),
                Some(Answer::Got(
                    GetPurpose::Observe,
                    Err(err(Class::Transient, Op::Get)),
                )),
                want(fail(Class::Transient, Op::Get))
                    .cond(false, reason::INSTANCE_STOPPED)
                    .events(&[event::PROVIDER_ERROR]),
            ),
            (
                "Delete of a stopped instance: transient backs off, InstanceStopped kept",
                with(|o| o.provisioned = Some(cond("False", reason::INSTANCE_STOPPED, 1))),
                Some(Answer::Deleted(
                    DeletePurpose::Stopped,
                    Err(err(Class::Transient, Op::Delete)),
                )),
                want(fail(Class::Transient, Op::Delete))
                    .cond(false, reason::INSTANCE_STOPPED)
                    .events(&[event::PROVIDER_ERROR]),
            ),
            // --- replace ---
            (
                "hash changed: replace-delete (Replacing, address withdrawn, Ready False)",
                with(|o| o.input = Input::Resolved { hash: "h2".into() }),
                None,
                want(delete(DeletePurpose::Replace))
                    .cond(false, reason::REPLACING)
                    .status(|s| s.address = Some(None))
                    .events(&[event::REPLACING]),
            ),
            (
                "replace-delete accepted: requeue after DeletionPoll",
                with(|o| {
                    o.input = Input::Resolved { hash: "h2".into() };
                    o.provisioned = Some(cond("False", reason::REPLACING, 1));
                }),
                Some(Answer::Deleted(DeletePurpose::Replace, Ok(()))),
                want(Next::Requeue(t.deletion_poll)),
            ),
            (
                "replacing: replace-wait polls Get",
                with(|o| {
                    o.input = Input::Resolved { hash: "h2".into() };
                    o.provisioned = Some(cond("False", reason::REPLACING, 1));
                }),
                None,
                want(get(GetPurpose::Replace)),
            ),
            (
                "replace-wait: old instance still there, Delete again (idempotent)",
                with(|o| {
                    o.input = Input::Resolved { hash: "h2".into() };
                    o.provisioned = Some(cond("False", reason::REPLACING, 1));
                }),
                Some(Answer::Got(
                    GetPurpose::Replace,
                    Ok(inst(State::Terminated, "")),
                )),
                want(delete(DeletePurpose::Replace)),
            ),
            (
                "replace-wait: old instance gone, clear the ID, create the new one (same name)",
                with(|o| {
                    o.input = Input::Resolved { hash: "h2".into() };
                    o.provisioned = Some(cond("False", reason::REPLACING, 1));
                }),
                Some(Answer::Got(
                    GetPurpose::Replace,
                    Err(err(Class::NotFound, Op::Get)),
                )),
                want(Next::Call(Call::Create))
                    .cond(false, reason::REPLACING)
                    .status(forget),
            ),
            (
                "replacement created: new ID and new hash recorded",
                with(|o| {
                    o.input = Input::Resolved { hash: "h2".into() };
                    o.provider_id = None;
                    o.stored_hash = None;
                    o.provisioned = Some(cond("False", reason::REPLACING, 1));
                }),
                Some(Answer::Created(Ok(ID.into()))),
                want(Next::Requeue(t.provisioning_poll))
                    .cond(false, reason::PROVISIONING)
                    .status(|s| {
                        s.provider_id = Some(Some(ID.into()));
                        s.spec_hash = Some(Some("h2".into()));
                        s.state = Some(None);
                        s.address = Some(None);
                    })
                    .events(&[event::CREATED]),
            ),
            (
                "replace-delete: permanent latches",
                with(|o| {
                    o.input = Input::Resolved { hash: "h2".into() };
                    o.provisioned = Some(cond("False", reason::REPLACING, 1));
                }),
                Some(Answer::Deleted(
                    DeletePurpose::Replace,
                    Err(err(Class::Permanent, Op::Delete)),
                )),
                want(Next::AwaitChange)
                    .cond(false, reason::PERMANENT_ERROR)
                    .events(&[event::PERMANENT_ERROR]),
            ),
            (
                "replace-wait: transient Get backs off, Replacing kept (no second replace-delete)",
                with(|o| {
                    o.input = Input::Resolved { hash: "h2".into() };
                    o.provisioned = Some(cond("False", reason::REPLACING, 1));
                }),
                Some(Answer::Got(
                    GetPurpose::Replace,
                    Err(err(Class::Transient, Op::Get)),
                )),
                want(fail(Class::Transient, Op::Get))
                    .cond(false, reason::REPLACING)
                    .events(&[event::PROVIDER_ERROR]),
            ),
            (
                "replace-delete: transient backs off, Replacing kept",
                with(|o| {
                    o.input = Input::Resolved { hash: "h2".into() };
                    o.provisioned = Some(cond("False", reason::REPLACING, 1));
                }),
                Some(Answer::Deleted(
                    DeletePurpose::Replace,
                    Err(err(Class::Transient, Op::Delete)),
                )),
                want(fail(Class::Transient, Op::Delete))
                    .cond(false, reason::REPLACING)
                    .events(&[event::PROVIDER_ERROR]),
            ),
            (
                "replacement's Create: transient backs off as ProviderError",
                with(|o| {
                    o.input = Input::Resolved { hash: "h2".into() };
                    o.provider_id = None;
                    o.stored_hash = None;
                    o.provisioned = Some(cond("False", reason::REPLACING, 1));
                }),
                Some(Answer::Created(Err(err(Class::Transient, Op::Create)))),
                want(fail(Class::Transient, Op::Create))
                    .cond(false, reason::PROVIDER_ERROR)
                    .events(&[event::PROVIDER_ERROR]),
            ),
            // --- deletion ---
            (
                "deleting without our finalizer: nothing to do",
                with(|o| {
                    o.deleting = true;
                    o.has_finalizer = false;
                }),
                None,
                want(Next::AwaitChange),
            ),
            (
                "deleting with skip-cleanup: release at once, no provider call",
                with(|o| {
                    o.deleting = true;
                    o.skip_cleanup = true;
                }),
                None,
                want(Next::ReleaseFinalizer).events(&[event::CLEANUP_SKIPPED]),
            ),
            (
                "deleting, skip-cleanup, provider not configured: still released",
                with(|o| {
                    o.deleting = true;
                    o.skip_cleanup = true;
                    o.provider_configured = false;
                }),
                None,
                want(Next::ReleaseFinalizer).events(&[event::CLEANUP_SKIPPED]),
            ),
            (
                "deleting, no instance recorded: release",
                with(|o| {
                    o.deleting = true;
                    o.provider_id = None;
                }),
                None,
                want(Next::ReleaseFinalizer).events(&[event::DELETED]),
            ),
            (
                "deleting: Get first (a missing cloud-init Secret does not matter)",
                with(|o| {
                    o.deleting = true;
                    o.input = Input::Unavailable {
                        message: "gone".into(),
                    };
                }),
                None,
                want(get(GetPurpose::Finalize)),
            ),
            (
                "deleting, even when latched",
                with(|o| {
                    o.deleting = true;
                    o.provisioned = Some(cond("False", reason::PERMANENT_ERROR, 1));
                }),
                None,
                want(get(GetPurpose::Finalize)),
            ),
            (
                "deleting, provider not configured: condition, wait for a config change",
                with(|o| {
                    o.deleting = true;
                    o.provider_configured = false;
                }),
                None,
                want(Next::AwaitChange)
                    .cond(false, reason::PROVIDER_NOT_CONFIGURED)
                    .events(&[event::PROVIDER_NOT_CONFIGURED]),
            ),
            (
                "deleting: instance still there, Delete",
                with(|o| o.deleting = true),
                Some(Answer::Got(
                    GetPurpose::Finalize,
                    Ok(inst(State::Running, "192.0.2.7")),
                )),
                want(delete(DeletePurpose::Finalize))
                    .cond(false, reason::DELETING)
                    .status(|s| s.address = Some(None)),
            ),
            (
                "deleting: Delete accepted, poll Get after DeletionPoll (finalizer kept)",
                with(|o| o.deleting = true),
                Some(Answer::Deleted(DeletePurpose::Finalize, Ok(()))),
                want(Next::Requeue(t.deletion_poll)),
            ),
            (
                "deleting: Get NotFound releases the finalizer",
                with(|o| o.deleting = true),
                Some(Answer::Got(
                    GetPurpose::Finalize,
                    Err(err(Class::NotFound, Op::Get)),
                )),
                want(Next::ReleaseFinalizer).events(&[event::DELETED]),
            ),
            (
                "deleting: permanent Get still tries Delete",
                with(|o| o.deleting = true),
                Some(Answer::Got(
                    GetPurpose::Finalize,
                    Err(err(Class::Permanent, Op::Get)),
                )),
                want(delete(DeletePurpose::FinalizeAfterPermanentGet)),
            ),
            (
                "deleting: ... and releases when that Delete succeeds",
                with(|o| o.deleting = true),
                Some(Answer::Deleted(
                    DeletePurpose::FinalizeAfterPermanentGet,
                    Ok(()),
                )),
                want(Next::ReleaseFinalizer).events(&[event::DELETED]),
            ),
            (
                "deleting: ... and retries when it fails permanently too (never latched)",
                with(|o| o.deleting = true),
                Some(Answer::Deleted(
                    DeletePurpose::FinalizeAfterPermanentGet,
                    Err(err(Class::Permanent, Op::Delete)),
                )),
                want(fail(Class::Permanent, Op::Delete))
                    .cond(false, reason::PERMANENT_ERROR)
                    .status(|s| s.address = Some(None))
                    .events(&[event::PERMANENT_ERROR]),
            ),
            (
                "deleting: instance still there after a failed Delete: the failure is kept",
                with(|o| {
                    o.deleting = true;
                    o.provisioned = Some(cond("False", reason::PERMANENT_ERROR, 1));
                }),
                Some(Answer::Got(
                    GetPurpose::Finalize,
                    Ok(inst(State::Running, "192.0.2.7")),
                )),
                want(delete(DeletePurpose::Finalize)).status(|s| s.address = Some(None)),
            ),
            (
                "deleting: quota on Get waits QuotaRetry",
                with(|o| o.deleting = true),
                Some(Answer::Got(
                    GetPurpose::Finalize,
                    Err(err(Class::QuotaExceeded, Op::Get)),
                )),
                want(Next::Requeue(t.quota_retry)),
            ),
            (
                "deleting: quota on Delete waits QuotaRetry",
                with(|o| o.deleting = true),
                Some(Answer::Deleted(
                    DeletePurpose::Finalize,
                    Err(err(Class::QuotaExceeded, Op::Delete)),
                )),
                want(Next::Requeue(t.quota_retry)),
            ),
            (
                "deleting: transient Get backs off, said in the Deleting condition",
                with(|o| o.deleting = true),
                Some(Answer::Got(
                    GetPurpose::Finalize,
                    Err(err(Class::Transient, Op::Get)),
                )),
                want(fail(Class::Transient, Op::Get))
                    .cond(false, reason::DELETING)
                    .status(|s| s.address = Some(None))
                    .events(&[event::PROVIDER_ERROR]),
            ),
            (
                "deleting: transient Delete backs off, said in the Deleting condition",
                with(|o| o.deleting = true),
                Some(Answer::Deleted(
                    DeletePurpose::Finalize,
                    Err(err(Class::Transient, Op::Delete)),
                )),
                want(fail(Class::Transient, Op::Delete))
                    .cond(false, reason::DELETING)
                    .status(|s| s.address = Some(None))
                    .events(&[event::PROVIDER_ERROR]),
            ),
            (
                "deleting: transient Delete after a permanent Get backs off, said too",
                with(|o| o.deleting = true),
                Some(Answer::Deleted(
                    DeletePurpose::FinalizeAfterPermanentGet,
                    Err(err(Class::Transient, Op::Delete)),
                )),
                want(fail(Class::Transient, Op::Delete))
                    .cond(false, reason::DELETING)
                    .status(|s| s.address = Some(None))
                    .events(&[event::PROVIDER_ERROR]),
            ),
        ];
        let mut failures = Vec::new();
        for (name, o, answer, expected) in rows {
            let got = summarize(decide(&o, answer.as_ref(), &t));
            if got != expected {
                failures.push(format!("{name}:\n  want {expected:?}\n  got  {got:?}"));
            }
        }
        assert!(failures.is_empty(), "{}", failures.join("\n"));
    }

    /// The status as the shell writes it after `d`, as far as decide reads it back.
    fn fold(o: &Observed, d: &Decision) -> Observed {
        let mut o = o.clone();
        if let Some(id) = &d.status.provider_id {
            o.provider_id = id.clone();
        }
        if let Some(hash) = &d.status.spec_hash {
            o.stored_hash = hash.clone();
        }
        if let Some(address) = &d.status.address {
            o.ip = address.as_ref().map(|(ip, _)| ip.clone());
        }
        if let Some(c) = &d.status.provisioned {
            let mut message = c.message.clone();
            truncate(&mut message, CONDITION_MESSAGE_MAX);
            o.provisioned = Some(CondView {
                status: if c.ok { "True" } else { "False" }.into(),
                reason: c.reason.into(),
                message,
                observed_generation: Some(o.generation),
            });
        }
        o
    }

    /// What one reconcile did: the events it published, how it ended, the status after it.
    struct Run {
        events: Vec<EventNote>,
        next: Next,
        after: Observed,
    }

    /// One reconcile as the shell runs it: decide, write, call (answered by `answer`),
    /// until a step that is not a call.
    fn reconcile(o: &Observed, answer: &dyn Fn(&Call) -> Answer) -> Run {
        let t = t();
        let mut o = o.clone();
        let mut events = vec![];
        let mut last: Option<Answer> = None;
        for _ in 0..6 {
            let d = decide(&o, last.take().as_ref(), &t);
            o = fold(&o, &d);
            events.extend(d.events.iter().cloned());
            match &d.next {
                Next::Call(call) => last = Some(answer(call)),
                next => {
                    return Run {
                        events,
                        next: next.clone(),
                        after: o,
                    };
                }
            }
        }
        panic!("did not settle")
    }

    /// Issue 27: every provider failure that backs off is said on the Proxy (its
    /// Provisioned condition and a warning Event naming the operation and the provider's
    /// message) and still backs off; the retries that fail the same way write nothing and
    /// publish nothing; a different failure is news again. For every operation on every
    /// path: Create, Get (drift check, provisioning, stopped, replace-wait, finalize) and
    /// Delete (replace, stopped, finalize, after a permanent Get), Transient and NotFound
    /// (where NotFound cannot be acted on).
    #[test]
    fn backoff_failures_are_said_once_on_the_proxy_and_still_back_off() {
        type Answerer = Box<dyn Fn(&Call) -> Answer>;
        // The instance answers Get with `got`; the call of `op` fails with `class`.
        let failing = |op: Op, class: Class, got: Result<Instance, ProviderError>| -> Answerer {
            Box::new(move |call: &Call| match call {
                Call::Create if op == Op::Create => Answer::Created(Err(err(class, op))),
                Call::Create => Answer::Created(Ok(ID.into())),
                Call::Get { purpose, .. } if op == Op::Get => {
                    Answer::Got(*purpose, Err(err(class, op)))
                }
                Call::Get { purpose, .. } => Answer::Got(*purpose, got.clone()),
                Call::Delete { purpose, .. } if op == Op::Delete => {
                    Answer::Deleted(*purpose, Err(err(class, op)))
                }
                Call::Delete { purpose, .. } => Answer::Deleted(*purpose, Ok(())),
            })
        };
        let running = || Ok(inst(State::Running, "192.0.2.1"));
        let stopped = || Ok(inst(State::Stopped, ""));
        let deleting = |o: &mut Observed| o.deleting = true;
        // (path, the Proxy, the provider, the condition while retried: ok, reason, address
        // kept, what the message names, the event's reason)
        #[allow(clippy::type_complexity)]
        let rows: Vec<(&str, Observed, Answerer, bool, &str, bool, &str, &str)> = vec![
            (
                "first Create, Transient",
                with(|o| {
                    o.provider_id = None;
                    o.stored_hash = None;
                    o.provisioned = None;
                    o.ip = None;
                }),
                failing(Op::Create, Class::Transient, running()),
                false,
                reason::PROVIDER_ERROR,
                false,
                "create",
                event::PROVIDER_ERROR,
            ),
            (
                "first Create, NotFound (cannot be acted on)",
                with(|o| {
                    o.provider_id = None;
                    o.stored_hash = None;
                    o.provisioned = None;
                    o.ip = None;
                }),
                failing(Op::Create, Class::NotFound, running()),
                false,
                reason::PROVIDER_ERROR,
                false,
                "create",
                event::PROVIDER_ERROR,
            ),
            (
                "Create after the instance vanished, Transient",
                obs(),
                Box::new(|call: &Call| match call {
                    Call::Create => Answer::Created(Err(err(Class::Transient, Op::Create))),
                    Call::Get { purpose, .. } => {
                        Answer::Got(*purpose, Err(err(Class::NotFound, Op::Get)))
                    }
                    Call::Delete { purpose, .. } => Answer::Deleted(*purpose, Ok(())),
                }),
                false,
                reason::PROVIDER_ERROR,
                false,
                "create",
                event::PROVIDER_ERROR,
            ),
            (
                "drift Get of a Running Proxy, Transient: still Running, address kept",
                obs(),
                failing(Op::Get, Class::Transient, running()),
                true,
                reason::RUNNING,
                true,
                "get",
                event::PROVIDER_ERROR,
            ),
            (
                "Get while provisioning, Transient",
                with(|o| {
                    o.provisioned = Some(cond("False", reason::PROVISIONING, 1));
                    o.ip = None;
                }),
                failing(Op::Get, Class::Transient, running()),
                false,
                reason::PROVIDER_ERROR,
                false,
                "get",
                event::PROVIDER_ERROR,
            ),
            (
                "Delete of a stopped instance, Transient (Get says Stopped every retry)",
                obs(),
                failing(Op::Delete, Class::Transient, stopped()),
                false,
                reason::INSTANCE_STOPPED,
                false,
                "delete",
                event::PROVIDER_ERROR,
            ),
            (
                "replace-delete, Transient (Get says it is still there every retry)",
                with(|o| o.input = Input::Resolved { hash: "h2".into() }),
                failing(Op::Delete, Class::Transient, running()),
                false,
                reason::REPLACING,
                false,
                "delete",
                event::PROVIDER_ERROR,
            ),
            (
                "replace-wait Get, Transient",
                with(|o| {
                    o.input = Input::Resolved { hash: "h2".into() };
                    o.provisioned = Some(cond("False", reason::REPLACING, 1));
                    o.ip = None;
                }),
                failing(Op::Get, Class::Transient, running()),
                false,
                reason::REPLACING,
                false,
                "get",
                event::PROVIDER_ERROR,
            ),
            (
                "finalize: Get, Transient",
                with(deleting),
                failing(Op::Get, Class::Transient, running()),
                false,
                reason::DELETING,
                false,
                "get",
                event::PROVIDER_ERROR,
            ),
            (
                "finalize: Delete, Transient (Get says it is still there every retry)",
                with(deleting),
                failing(Op::Delete, Class::Transient, running()),
                false,
                reason::DELETING,
                false,
                "delete",
                event::PROVIDER_ERROR,
            ),
            (
                "finalize: Delete after a permanent Get, Transient",
                with(deleting),
                failing(
                    Op::Delete,
                    Class::Transient,
                    Err(err(Class::Permanent, Op::Get)),
                ),
                false,
                reason::DELETING,
                false,
                "delete",
                event::PROVIDER_ERROR,
            ),
            (
                "finalize: Delete, Permanent (retried too, never latched)",
                with(deleting),
                failing(Op::Delete, Class::Permanent, running()),
                false,
                reason::PERMANENT_ERROR,
                false,
                "delete",
                event::PERMANENT_ERROR,
            ),
        ];
        let mut failures = Vec::new();
        for (name, start, answer, ok, want_reason, keeps_address, op, want_event) in &rows {
            let mut o = start.clone();
            for attempt in 0..4 {
                let run = reconcile(&o, answer.as_ref());
                let before = o.clone();
                o = run.after;
                if !matches!(&run.next, Next::Fail(Failure::Provider(e)) if e.message == "backend said no")
                {
                    failures.push(format!("{name} #{attempt}: no backoff: {:?}", run.next));
                }
                let Some(c) = &o.provisioned else {
                    failures.push(format!("{name} #{attempt}: no condition"));
                    continue;
                };
                let status = if *ok { "True" } else { "False" };
                if (c.status.as_str(), c.reason.as_str()) != (status, *want_reason) {
                    failures.push(format!("{name} #{attempt}: condition {c:?}"));
                }
                let named = format!("\"hetzner-eu\" {op}");
                if !(c.message.contains(&named) && c.message.contains("backend said no")) {
                    failures.push(format!("{name} #{attempt}: message {:?}", c.message));
                }
                if (o.ip.is_some() && o.ip == start.ip) != *keeps_address {
                    failures.push(format!("{name} #{attempt}: address {:?}", o.ip));
                }
                let warnings: Vec<_> = run
                    .events
                    .iter()
                    .filter(|e| e.reason == *want_event)
                    .collect();
                if attempt == 0 {
                    if warnings.len() != 1 || !warnings[0].warning || warnings[0].note != c.message
                    {
                        failures.push(format!("{name}: first failure: events {:?}", run.events));
                    }
                } else {
                    // The same failure again: nothing new is written or published.
                    if !warnings.is_empty() {
                        failures.push(format!("{name} #{attempt}: repeated {:?}", run.events));
                    }
                    if (&before.provisioned, &before.ip) != (&o.provisioned, &o.ip) {
                        failures.push(format!(
                            "{name} #{attempt}: status written again: {:?} -> {:?}",
                            before.provisioned, o.provisioned
                        ));
                    }
                }
            }
            // Another failure is news again.
            let other = |call: &Call| match answer(call) {
                Answer::Created(Err(mut e)) => {
                    e.message = "backend said no again".into();
                    Answer::Created(Err(e))
                }
                Answer::Got(p, Err(mut e)) if e.class != Class::Permanent => {
                    e.message = "backend said no again".into();
                    Answer::Got(p, Err(e))
                }
                Answer::Deleted(p, Err(mut e)) => {
                    e.message = "backend said no again".into();
                    Answer::Deleted(p, Err(e))
                }
                a => a,
            };
            let run = reconcile(&o, &other);
            if run
                .events
                .iter()
                .filter(|e| e.reason == *want_event)
                .count()
                != 1
            {
                failures.push(format!("{name}: a new failure not said: {:?}", run.events));
            }
        }
        assert!(failures.is_empty(), "{}", failures.join("\n"));
    }

    #[test]
    fn a_running_proxy_whose_drift_check_fails_stays_ready_and_clears_the_message() {
        let t = t();
        let o = obs();
        let d = decide(
            &o,
            Some(&Answer::Got(
                GetPurpose::Observe,
                Err(err(Class::Transient, Op::Get)),
            )),
            &t,
        );
        assert_eq!(d.status.address, None, "the address is not touched");
        assert_eq!(d.status.state, None);
        let c = d.status.provisioned.clone().unwrap();
        assert!(c.ok && c.reason == reason::RUNNING, "{c:?}");
        assert!(
            c.message.contains("192.0.2.1:3128") && c.message.contains("address stays published"),
            "{}",
            c.message
        );
        // The next good answer (Get or the provider's list) says Running again, plainly,
        // with no Provisioned event (it never stopped being provisioned).
        let o = fold(&o, &d);
        for answer in [
            Some(Answer::Got(
                GetPurpose::Observe,
                Ok(inst(State::Running, "192.0.2.1")),
            )),
            None,
        ] {
            let mut o = o.clone();
            if answer.is_none() {
                o.listed = Some(inst(State::Running, "192.0.2.1"));
            }
            let d = decide(&o, answer.as_ref(), &t);
            let c = d.status.provisioned.unwrap();
            assert!(c.ok && !c.message.contains("failed"), "{c:?}");
            assert!(d.events.is_empty(), "{:?}", d.events);
        }
    }

    #[test]
    fn failure_messages_are_cut_to_the_condition_bound() {
        let t = t();
        let mut e = err(Class::Transient, Op::Create);
        e.message = "é".repeat(CONDITION_MESSAGE_MAX);
        let o = with(|o| o.provider_id = None);
        let d = decide(&o, Some(&Answer::Created(Err(e.clone()))), &t);
        let c = d.status.provisioned.clone().unwrap();
        assert!(
            c.message.len() <= CONDITION_MESSAGE_MAX,
            "{}",
            c.message.len()
        );
        assert_eq!(d.events.len(), 1);
        // Cut as written, so the same failure again is recognised.
        let d = decide(&fold(&o, &d), Some(&Answer::Created(Err(e))), &t);
        assert!(d.events.is_empty(), "{:?}", d.events);
    }

    #[test]
    fn messages_name_the_instance_and_the_provider_error() {
        let t = t();
        let d = decide(
            &with(|o| o.provider_id = None),
            Some(&Answer::Created(Err(err(Class::Permanent, Op::Create)))),
            &t,
        );
        let c = d.status.provisioned.unwrap();
        assert!(
            c.message.contains("backend said no") && c.message.contains("permanent"),
            "{}",
            c.message
        );
        let d = decide(
            &with(|o| o.input = Input::Resolved { hash: "h2".into() }),
            None,
            &t,
        );
        assert!(d.events[0].note.contains(ID), "{:?}", d.events);
        let d = decide(&with(|o| o.provider_configured = false), None, &t);
        assert!(d.events[0].warning && d.events[0].note.contains("hetzner-eu"));
    }

    /// An IPv6 Proxy says where its instance runs as a client would dial it, and why an
    /// instance with only IPv4 does not serve it.
    #[test]
    fn an_ipv6_proxy_names_its_address_and_what_it_lacks() {
        let t = t();
        let v6 = |o: &mut Observed| {
            o.ip_family = IpFamily::V6;
            o.provisioned = None;
        };
        let running = Instance {
            ipv6: "2001:db8::7".into(),
            ..inst(State::Running, "192.0.2.7")
        };
        let d = decide(
            &with(v6),
            Some(&Answer::Got(GetPurpose::Observe, Ok(running))),
            &t,
        );
        let c = d.status.provisioned.unwrap();
        assert!(c.message.contains("[2001:db8::7]:3128"), "{}", c.message);
        assert!(
            d.events[0].note.contains("[2001:db8::7]:3128"),
            "{:?}",
            d.events
        );

        let v4_only = inst(State::Running, "192.0.2.7");
        let d = decide(
            &with(v6),
            Some(&Answer::Got(GetPurpose::Observe, Ok(v4_only))),
            &t,
        );
        let c = d.status.provisioned.unwrap();
        assert!(
            c.message.contains("no IPv6 address") && c.message.contains("spec.ipFamily"),
            "{}",
            c.message
        );
    }

    /// Issue 29: while lists confirm a provider's Proxies in transition, a list's answer
    /// stands for a Get's (the same decision, no call), a list coming is waited for, and a
    /// Running Proxy's drift check is not affected.
    #[test]
    fn a_proxy_in_transition_takes_a_lists_answer_as_a_gets() {
        use crate::inventory::ByList;
        let t = t();
        let provisioning = |by_list: ByList| {
            with(|o| {
                o.provisioned = Some(cond("False", reason::PROVISIONING, 1));
                o.by_list = by_list;
            })
        };
        for state in [State::Running, State::Provisioning, State::Stopped] {
            let i = inst(state, "192.0.2.1");
            let by_list = decide(&provisioning(ByList::Listed(i.clone())), None, &t);
            let by_get = decide(
                &provisioning(ByList::No),
                Some(&Answer::Got(GetPurpose::Observe, Ok(i))),
                &t,
            );
            assert_eq!(by_list, by_get, "{state:?}");
        }
        assert_eq!(
            decide(&provisioning(ByList::Wait), None, &t),
            Decision::next(Next::Requeue(t.provisioning_poll))
        );
        assert_eq!(
            decide(&provisioning(ByList::No), None, &t),
            Decision::next(get(GetPurpose::Observe))
        );
        // Running as recorded: the drift check's own rules, whatever `by_list` says.
        let running = with(|o| o.by_list = ByList::Wait);
        assert_eq!(
            decide(&running, None, &t),
            Decision::next(get(GetPurpose::Observe))
        );
    }

    /// A Proxy whose create returned less than a provisioning poll ago does not Get yet:
    /// the reconcile its status write sets off comes back when the poll is up. A list's
    /// answer still counts at once, and so does a Running Proxy's drift check.
    #[test]
    fn the_first_get_waits_a_provisioning_poll_after_the_create() {
        use crate::inventory::ByList;
        let t = t();
        let soon = Duration::from_millis(7_500);
        let fresh = |by_list: ByList, first_look_in: Option<Duration>| {
            with(|o| {
                o.provisioned = Some(cond("False", reason::PROVISIONING, 1));
                o.by_list = by_list;
                o.first_look_in = first_look_in;
            })
        };
        let cases = [
            (ByList::No, Some(soon), Decision::next(Next::Requeue(soon))),
            (ByList::No, None, Decision::next(get(GetPurpose::Observe))),
            (
                ByList::Wait,
                Some(soon),
                Decision::next(Next::Requeue(t.provisioning_poll)),
            ),
        ];
        for (by_list, first_look_in, want) in cases {
            let o = fresh(by_list.clone(), first_look_in);
            assert_eq!(decide(&o, None, &t), want, "{by_list:?} {first_look_in:?}");
        }
        let running = inst(State::Running, "192.0.2.1");
        let listed = decide(
            &fresh(ByList::Listed(running.clone()), Some(soon)),
            None,
            &t,
        );
        let got = decide(
            &fresh(ByList::No, None),
            Some(&Answer::Got(GetPurpose::Observe, Ok(running))),
            &t,
        );
        assert_eq!(listed, got, "a list's answer is taken at once");
        let drift = with(|o| o.first_look_in = Some(soon));
        assert_eq!(
            decide(&drift, None, &t),
            Decision::next(get(GetPurpose::Observe)),
            "Running as recorded: the drift check"
        );
    }
}
