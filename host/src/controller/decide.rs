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

use crate::provider::{Class, Instance, ProviderError, State};
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
    pub const PROVIDER_NOT_CONFIGURED: &str = "ProviderNotConfigured";
    pub const CLOUD_INIT_UNAVAILABLE: &str = "CloudInitUnavailable";
    pub const INVALID_SPEC: &str = "InvalidSpec";
    /// An instance was created for a Proxy with `spec.auth.type: None` and no
    /// `allowedClients`: said once per instance, as a warning, because it is open.
    pub const OPEN_PROXY: &str = "OpenProxy";
}

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
    /// A list of this provider is under way and no fresh one exists yet (just after start,
    /// or a reload): it will answer for every Running Proxy at once.
    pub list_pending: bool,
    /// `spec.auth` asks for neither credentials nor an allow-list: the proxy is open.
    pub open: bool,
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
            && crate::inventory::listed_running_at(Some(inst), self.ip.as_deref()?);
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
            return Decision::next(Next::Fail(Failure::Input(message.clone())));
        }
    };
    let Some(id) = &o.provider_id else {
        return Decision::next(Next::Call(Call::Create));
    };
    let changed = o.stored_hash.as_ref().is_some_and(|stored| stored != hash);
    if !changed {
        if let Some(inst) = o.listed_unchanged() {
            // The drift check, answered by the provider's list: no call.
            return observe(o, inst, t);
        }
        if o.list_pending && o.running_as_recorded() {
            // The list under way answers for this Proxy and all the others; a Get each
            // (every Proxy at start) would spend the budget the list needs. A Proxy the
            // list does not confirm is sent back at once; if the list fails, this one Gets
            // at its next drift poll.
            return Decision::next(Next::Requeue(t.drift_poll));
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
        Err(e) => provider_failure(o, e, t),
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
        (GetPurpose::Observe | GetPurpose::Replace, Err(e)) => provider_failure(o, e, t),
        (GetPurpose::Finalize, Ok(_)) => Decision::next(Next::Call(Call::Delete {
            id: id.clone(),
            purpose: DeletePurpose::Finalize,
        }))
        .status(StatusChange {
            address: Some(None),
            ..Default::default()
        })
        .cond(Cond::not(
            reason::DELETING,
            format!("deleting instance {id}"),
        )),
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
            Class::Transient => Decision::next(Next::Fail(Failure::Provider(e.clone()))),
        },
    }
}

/// Get answered with the instance during normal reconciling.
fn observe(o: &Observed, inst: &Instance, t: &Timings) -> Decision {
    // An ID without a hash predates hash tracking or was written by hand: adopt the
    // current spec rather than replace a working instance.
    let adopt_hash = match (&o.stored_hash, &o.input) {
        (None, Input::Resolved { hash }) => Some(Some(hash.clone())),
        _ => None,
    };
    match inst.state {
        State::Running if !inst.ip.is_empty() => {
            let address = format!("{}:{}", inst.ip, o.port);
            let d = Decision::next(Next::Requeue(t.drift_poll)).status(StatusChange {
                spec_hash: adopt_hash,
                state: Some(Some(State::Running)),
                address: Some(Some((inst.ip.clone(), o.port))),
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
        // Running without an address is still provisioning as far as clients care.
        State::Running | State::Provisioning => Decision::next(Next::Requeue(t.provisioning_poll))
            .status(StatusChange {
                spec_hash: adopt_hash,
                state: Some(Some(State::Provisioning)),
                address: Some(None),
                provisioned: Some(Cond::not(
                    reason::PROVISIONING,
                    format!("instance {} is provisioning", inst.id),
                )),
                ..Default::default()
            }),
        State::Stopped | State::Terminated => {
            // It will not come back by itself. Delete it, keep the ID, and recreate once
            // Get says NotFound.
            let message = format!(
                "instance {} is {}; deleting it to create it again",
                inst.id,
                inst.state.as_str()
            );
            Decision::next(Next::Call(Call::Delete {
                id: o.provider_id.clone().unwrap_or_else(|| inst.id.clone()),
                purpose: DeletePurpose::Stopped,
            }))
            .status(StatusChange {
                state: Some(Some(inst.state)),
                address: Some(None),
                provisioned: Some(Cond::not(reason::INSTANCE_STOPPED, &message)),
                ..Default::default()
            })
            .event_on_transition(
                o,
                reason::INSTANCE_STOPPED,
                EventNote::warning(event::INSTANCE_STOPPED, message),
            )
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
            provider_failure(o, e, t)
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
/// stopped instance).
fn provider_failure(o: &Observed, e: &ProviderError, t: &Timings) -> Decision {
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
        // NotFound from anything but Get is not a signal the reconciler can act on.
        Class::Transient | Class::NotFound => {
            Decision::next(Next::Fail(Failure::Provider(e.clone())))
        }
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
                .cond(Cond::not(reason::PERMANENT_ERROR, &message))
                .event_on_transition(
                    o,
                    reason::PERMANENT_ERROR,
                    EventNote::warning(event::PERMANENT_ERROR, message),
                )
        }
        Class::Transient | Class::NotFound => {
            Decision::next(Next::Fail(Failure::Provider(e.clone())))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::provider::Op;

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
            list_pending: false,
            open: false,
        }
    }

    fn cond(status: &str, reason: &str, generation: i64) -> CondView {
        CondView {
            status: status.into(),
            reason: reason.into(),
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
        Instance {
            id: ID.into(),
            ip: ip.into(),
            state,
            uid: "uid-1".into(),
            created_at: None,
        }
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
                "Secret unreadable (API error): backoff",
                with(|o| {
                    o.input = Input::Unreadable {
                        message: "503".into(),
                    }
                }),
                None,
                want(Next::Fail(Failure::Input("503".into()))),
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
                "Create: transient is an error (exponential backoff)",
                with(|o| o.provider_id = None),
                Some(Answer::Created(Err(err(Class::Transient, Op::Create)))),
                want(fail(Class::Transient, Op::Create)),
            ),
            (
                "Create: NotFound cannot be acted on, so it backs off like Transient",
                with(|o| o.provider_id = None),
                Some(Answer::Created(Err(err(Class::NotFound, Op::Create)))),
                want(fail(Class::NotFound, Op::Create)),
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
                "Running, listed Running at the same address: no call, DriftPoll",
                with(|o| o.listed = Some(inst(State::Running, "192.0.2.1"))),
                None,
                want(Next::Requeue(t.drift_poll))
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
                with(|o| o.list_pending = true),
                None,
                want(Next::Requeue(t.drift_poll)),
            ),
            (
                "Provisioning, the first list under way: Get (transitions never wait for it)",
                with(|o| {
                    o.list_pending = true;
                    o.provisioned = Some(cond("False", reason::PROVISIONING, 1));
                }),
                None,
                want(get(GetPurpose::Observe)),
            ),
            (
                "Running, the first list under way, spec changed: replace at once",
                with(|o| {
                    o.list_pending = true;
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
                "still Stopped on the next poll: Delete again, no repeated event",
                with(|o| o.provisioned = Some(cond("False", reason::INSTANCE_STOPPED, 1))),
                Some(Answer::Got(
                    GetPurpose::Observe,
                    Ok(inst(State::Stopped, "")),
                )),
                want(delete(DeletePurpose::Stopped))
                    .cond(false, reason::INSTANCE_STOPPED)
                    .status(|s| {
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
                "Get: transient backs off, status untouched",
                obs(),
                Some(Answer::Got(
                    GetPurpose::Observe,
                    Err(err(Class::Transient, Op::Get)),
                )),
                want(fail(Class::Transient, Op::Get)),
            ),
            (
                "Delete of a stopped instance: transient backs off",
                with(|o| o.provisioned = Some(cond("False", reason::INSTANCE_STOPPED, 1))),
                Some(Answer::Deleted(
                    DeletePurpose::Stopped,
                    Err(err(Class::Transient, Op::Delete)),
                )),
                want(fail(Class::Transient, Op::Delete)),
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
                "replace-wait: transient Get backs off",
                with(|o| {
                    o.input = Input::Resolved { hash: "h2".into() };
                    o.provisioned = Some(cond("False", reason::REPLACING, 1));
                }),
                Some(Answer::Got(
                    GetPurpose::Replace,
                    Err(err(Class::Transient, Op::Get)),
                )),
                want(fail(Class::Transient, Op::Get)),
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
                    .events(&[event::PERMANENT_ERROR]),
            ),
            (
                "deleting: permanent Delete retried, no repeated event",
                with(|o| {
                    o.deleting = true;
                    o.provisioned = Some(cond("False", reason::PERMANENT_ERROR, 1));
                }),
                Some(Answer::Deleted(
                    DeletePurpose::Finalize,
                    Err(err(Class::Permanent, Op::Delete)),
                )),
                want(fail(Class::Permanent, Op::Delete)).cond(false, reason::PERMANENT_ERROR),
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
                "deleting: transient Get backs off",
                with(|o| o.deleting = true),
                Some(Answer::Got(
                    GetPurpose::Finalize,
                    Err(err(Class::Transient, Op::Get)),
                )),
                want(fail(Class::Transient, Op::Get)),
            ),
            (
                "deleting: transient Delete backs off",
                with(|o| o.deleting = true),
                Some(Answer::Deleted(
                    DeletePurpose::Finalize,
                    Err(err(Class::Transient, Op::Delete)),
                )),
                want(fail(Class::Transient, Op::Delete)),
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
}
