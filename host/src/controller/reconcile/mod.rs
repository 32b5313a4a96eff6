//! The shell around [`decide`]: reads what it needs, writes status, publishes events, adds
//! and removes the finalizer, and makes the provider calls. No branching on outcomes here;
//! that is all in `decide.rs`.

mod calls;
mod resolve;

use crate::api::{Proxy, ProxyStatus, condition};
use crate::controller::bounds::{CONDITION_MESSAGE_MAX, EVENT_NOTE_MAX, truncate};
use crate::controller::context::{Context, FIELD_MANAGER, FINALIZER, ReconcileError};
use crate::controller::decide::{
    Answer, Call, CondView, Decision, EventNote, Input, Next, Observed, decide, event,
};
use crate::controller::proxy_auth::{self, Credentials};
use crate::controller::status;
use egress_plugin_host::provider::Provider;
use egress_plugin_host::provider::State;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::controller::Action;
use kube::runtime::events::{Event, EventType};
use kube::runtime::reflector::ObjectRef;
use kube::{Resource, ResourceExt};
use resolve::Resolved;
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use tracing::{Instrument, debug, info, warn};

/// Upper bound on decide/act rounds in one reconcile. The longest path is
/// Get (NotFound) -> Create, or AddFinalizer -> Create; anything longer is a bug, and
/// the reconcile then just comes back after RequeueNow.
const MAX_STEPS: usize = 6;
/// One reconcile of one Proxy.
pub async fn reconcile(proxy: Arc<Proxy>, ctx: Arc<Context>) -> Result<Action, ReconcileError> {
    let span = tracing::info_span!(
        "reconcile",
        proxy.namespace = proxy.namespace().unwrap_or_default(),
        proxy.name = proxy.name_any(),
        proxy.uid = proxy.uid().unwrap_or_default(),
        provider.name = proxy.spec.provider.as_str(),
        generation = proxy.metadata.generation.unwrap_or_default(),
        trace_id = tracing::field::Empty,
    );
    if let Some(id) = crate::telemetry::trace_id(&span) {
        span.record("trace_id", id);
    }
    let started = std::time::Instant::now();
    let result = match Shell::new(&proxy, &ctx) {
        Ok(shell) => shell.run().instrument(span).await,
        Err(e) => Err(e),
    };
    ctx.metrics.observe(&result, started.elapsed());
    if result.is_ok()
        && let Some(uid) = proxy.uid()
    {
        ctx.failures().remove(&uid);
    }
    result
}

struct Shell<'a> {
    proxy: &'a Proxy,
    ctx: &'a Context,
    api: Api<Proxy>,
    namespace: String,
    name: String,
    uid: String,
    provider: Option<Arc<dyn Provider>>,
    /// The object's resourceVersion as of our last write, for the finalizer patch's
    /// optimistic lock (a status write in the same reconcile moves it).
    resource_version: Option<String>,
    /// This reconcile wrote the object: `resource_version` is the server's as of then.
    wrote: bool,
}

impl<'a> Shell<'a> {
    fn new(proxy: &'a Proxy, ctx: &'a Context) -> Result<Self, ReconcileError> {
        let namespace = proxy
            .namespace()
            .ok_or(ReconcileError::Metadata("namespace"))?;
        let name = proxy
            .metadata
            .name
            .clone()
            .ok_or(ReconcileError::Metadata("name"))?;
        let uid = proxy.uid().ok_or(ReconcileError::Metadata("uid"))?;
        Ok(Shell {
            proxy,
            ctx,
            api: Api::namespaced(ctx.client.clone(), &namespace),
            provider: ctx.registry.get(&proxy.spec.provider),
            resource_version: proxy.resource_version(),
            wrote: false,
            namespace,
            name,
            uid,
        })
    }

    async fn run(mut self) -> Result<Action, ReconcileError> {
        let timings = &self.ctx.settings.timings;
        let deleting = self.proxy.metadata.deletion_timestamp.is_some();
        // A missing Secret must never block deletion, so it is not even read then.
        let (input, resolved) = if deleting {
            (
                Input::Unavailable {
                    message: "not resolved while deleting".into(),
                },
                None,
            )
        } else {
            self.resolve().await
        };
        let mut status = self.proxy.status.clone().unwrap_or_default();
        let mut has_finalizer = self.proxy.finalizers().iter().any(|f| f == FINALIZER);
        // A probe that just failed outweighs the last list: ask the provider.
        let suspect = self.ctx.take_suspect(&self.health_key());
        let listed = (!suspect).then(|| self.listed(&status)).flatten();
        let list_pending = (!suspect && listed.is_none())
            .then(|| self.list_pending(&status))
            .flatten();
        let mut answer: Option<Answer> = None;
        for _ in 0..MAX_STEPS {
            // Asked again at each step: right after a Create the new instance waits for the
            // next list like the others rather than Get at once, when lists confirm.
            let by_list = if suspect {
                crate::inventory::ByList::No
            } else {
                self.by_list(&status)
            };
            let mut observed = observe(
                self.proxy,
                &status,
                has_finalizer,
                self.provider.is_some(),
                input.clone(),
                listed.clone(),
                list_pending,
            );
            let from_lists = matches!(
                by_list,
                crate::inventory::ByList::Listed(_) | crate::inventory::ByList::Wait
            );
            // Looked up only where it counts: a Proxy that lists answer for never Gets.
            observed.first_look_in = matches!(by_list, crate::inventory::ByList::No)
                .then(|| self.first_look_in(&status))
                .flatten();
            observed.by_list = by_list;
            let reported = match &answer {
                Some(Answer::Got(_, Ok(i))) => i.hourly_price.clone(),
                _ => None,
            };
            let Decision {
                status: mut change,
                events,
                next,
            } = decide(&observed, answer.take().as_ref(), timings);
            // A Proxy that lists answer for comes back when the next list has: each list
            // sends on at once the Proxies it shows changed, so a requeue every poll only
            // repeats the answer it has. At 10,000 Proxies, thousands of them polling
            // every provisioning poll took every reconcile turn from those confirmations.
            let next = match next {
                Next::Requeue(after) if from_lists => {
                    Next::Requeue(after.max(self.confirm_every()))
                }
                next => next,
            };
            change.hourly_price = self.price_change(&status, &change, reported);
            debug!(next = ?next, status_change = ?change, "decided");
            // A Create, and the status written with it, only from the server's copy.
            if next == Next::Call(Call::Create) && !self.copy_is_current().await? {
                // The watch has not brought the server's copy yet; the requeue comes back
                // at the provisioning poll, by when it usually has.
                debug!("cached copy is behind the server's; Create deferred");
                return Ok(Action::requeue(timings.provisioning_poll));
            }
            if !change.is_empty() || self.health_view(&status).is_some() {
                status = self.write_status(&status, &change).await?;
            }
            self.sync_health(&status, deleting, resolved.as_ref());
            for e in events {
                if e.reason == event::INTERRUPTED {
                    self.ctx.metrics.interrupted(&self.proxy.spec.provider);
                }
                self.publish(e).await;
            }
            match next {
                Next::Call(call) => answer = Some(self.call(call, resolved.as_ref()).await),
                Next::AddFinalizer => {
                    // Carry on with the finalizer in place: the patch's answer is the
                    // server's copy, so the Create that follows needs no read of its own.
                    // The reconcile the patch triggers may start from a cached copy older
                    // than the status this one writes next; it sends no Create from such
                    // a copy (`copy_is_current`), and anything else it decides costs a
                    // Get at most. Ending here instead cost every new Proxy a second
                    // reconcile, and a rollout's confirmations queued behind them.
                    if !self.add_finalizer().await? {
                        // Gone meanwhile: nothing to create for.
                        return Ok(Action::await_change());
                    }
                    has_finalizer = true;
                }
                Next::ReleaseFinalizer => {
                    // Not left to owner-reference garbage collection alone: the Secret
                    // goes before the Proxy does, even where nothing collects garbage.
                    self.delete_generated_secret().await?;
                    self.remove_finalizer().await?;
                    // Its instance is gone: what it made sensitive may go when room is
                    // needed (kept a while: see `egress_plugin_host::sensitive`).
                    if let Some(p) = &self.provider {
                        p.forget(&self.uid);
                    }
                    info!("finalizer released");
                    return Ok(Action::await_change());
                }
                Next::Requeue(after) => return Ok(Action::requeue(after)),
                Next::AwaitChange => return Ok(Action::await_change()),
                Next::Fail(f) => return Err(f.into()),
            }
        }
        warn!("reconcile did not settle; coming back shortly");
        Ok(Action::requeue(timings.requeue_now))
    }

    /// Whether the copy this reconcile acts on is the server's (as of our own writes in it).
    ///
    /// Asked before a Create (and the status written with it) only: a copy from a watch
    /// that lags shows no instance for a Proxy whose instance the last reconcile recorded.
    /// Every other decision made on such a copy is undone by the next one at the price of
    /// a Get at most, while a Create costs a backend request (answered by name, so never a
    /// second instance) of the budget the rollout needs. At most one API read per Create,
    /// none after a write of this reconcile.
    async fn copy_is_current(&self) -> Result<bool, ReconcileError> {
        if self.wrote {
            // Our own write's answer is the server's copy, read a moment ago.
            return Ok(true);
        }
        match self.api.get_metadata_opt(&self.name).await? {
            Some(server) => Ok(server.metadata.resource_version == self.resource_version),
            // Gone: the deletion event ends this Proxy's reconciles.
            None => Ok(false),
        }
    }

    /// What the provider's last fresh list says about the recorded instance.
    fn listed(&self, status: &ProxyStatus) -> Option<egress_plugin_host::provider::Instance> {
        let inventory = self.ctx.inventory.as_ref()?;
        let provider = self.provider.as_ref()?;
        let id = status.provider_id.as_deref().filter(|s| !s.is_empty())?;
        inventory.lookup(
            &self.proxy.spec.provider,
            provider,
            id,
            std::time::SystemTime::now(),
        )
    }

    /// For a Proxy in transition, whether the provider's lists answer for it (see
    /// [`crate::inventory::Inventory::transition`]).
    fn by_list(&self, status: &ProxyStatus) -> crate::inventory::ByList {
        use crate::inventory::ByList;
        let (Some(inventory), Some(provider)) = (&self.ctx.inventory, &self.provider) else {
            return ByList::No;
        };
        // In transition as of this step's status.
        let deleting = self.proxy.metadata.deletion_timestamp.is_some();
        let Some(id) = crate::inventory::transition_id(deleting, status) else {
            return ByList::No;
        };
        let since = crate::inventory::provisioned_since(status);
        inventory.transition(
            &self.proxy.spec.provider,
            provider,
            id,
            since,
            std::time::SystemTime::now(),
            self.ctx.settings.timings.provisioning_poll,
        )
    }

    /// For a Proxy in transition, how long until its first Get is due (see
    /// [`crate::inventory::Inventory::first_look_in`]).
    fn first_look_in(&self, status: &ProxyStatus) -> Option<std::time::Duration> {
        let inventory = self.ctx.inventory.as_ref()?;
        let deleting = self.proxy.metadata.deletion_timestamp.is_some();
        let id = crate::inventory::transition_id(deleting, status)?;
        inventory.first_look_in(
            &self.proxy.spec.provider,
            id,
            std::time::SystemTime::now(),
            self.ctx.settings.timings.provisioning_poll,
        )
    }

    /// How far apart the lists confirming this Proxy's provider are (the provisioning poll
    /// when they do not).
    fn confirm_every(&self) -> std::time::Duration {
        self.ctx
            .inventory
            .as_ref()
            .and_then(|i| i.confirm_every(&self.proxy.spec.provider))
            .unwrap_or(self.ctx.settings.timings.provisioning_poll)
    }

    /// Whether a list of the provider to come will answer for this Proxy, and how long
    /// until it should have (zero: a list under way with no fresh one yet).
    fn list_pending(&self, status: &ProxyStatus) -> Option<std::time::Duration> {
        let (Some(inventory), Some(provider)) = (&self.ctx.inventory, &self.provider) else {
            return None;
        };
        let (name, now) = (&self.proxy.spec.provider, std::time::SystemTime::now());
        // Running since the last whole list started (a list of recent instances confirmed
        // it, and no longer shows it): the next whole list answers for it. A Get each was
        // most of a rollout's Gets, the health verdict's status write bringing each back.
        crate::inventory::provisioned_since(status)
            .and_then(|since| inventory.listed_before(name, provider, since, now))
            .or_else(|| {
                inventory
                    .pending(name, provider, now)
                    .then_some(std::time::Duration::ZERO)
            })
    }

    /// Applies the whole status (current + change) under our field manager. Skipped when
    /// nothing would change, so steady-state polling does not write.
    /// The `hourlyPrice` to write with `change`, if it changes: once the instance runs,
    /// the price the backend reported for it (`reported`), else the price the provider
    /// knows for the placement without a call (the providers file's `prices`, or a quote
    /// it keeps), asked only while the status has none. When nothing is known the quote is
    /// asked in the background (see [`crate::controller::pricing`]) and this Proxy is
    /// reconciled again when it brings a price: the reconcile never waits on it.
    fn price_change(
        &self,
        status: &ProxyStatus,
        change: &super::decide::StatusChange,
        reported: Option<egress_plugin_host::provider::Price>,
    ) -> Option<Option<crate::api::HourlyPrice>> {
        if change.hourly_price.is_some() {
            return change.hourly_price.clone();
        }
        let running = match change.state {
            Some(state) => state == Some(State::Running),
            None => status.state.as_deref() == Some(State::Running.as_str()),
        };
        if !running {
            return None;
        }
        let price = match reported {
            Some(p) => p,
            None if status.hourly_price.is_some() => return None,
            None => {
                let provider = self.provider.as_ref()?;
                let placement = self.proxy.spec.placement.to_provider();
                match provider.known_price(&placement) {
                    Some(p) => p,
                    None => {
                        self.ctx.pricing.ask(
                            &self.proxy.spec.provider,
                            provider.clone(),
                            placement,
                            ObjectRef::from_obj(self.proxy),
                        );
                        return None;
                    }
                }
            }
        };
        let price = crate::api::HourlyPrice::of(&price);
        (status.hourly_price.as_ref() != Some(&price)).then_some(Some(price))
    }

    async fn write_status(
        &mut self,
        current: &ProxyStatus,
        change: &super::decide::StatusChange,
    ) -> Result<ProxyStatus, ReconcileError> {
        let generation = self.proxy.metadata.generation.unwrap_or_default();
        let mut next = status::apply(current, change, generation, &now());
        if let Some(h) = self.health_view(&next) {
            next = status::apply_health(&next, &h, generation, &now());
        }
        for c in &mut next.conditions {
            truncate(&mut c.message, CONDITION_MESSAGE_MAX);
        }
        if next == *current {
            return Ok(next);
        }
        let patch = serde_json::json!({
            "apiVersion": Proxy::api_version(&()),
            "kind": Proxy::kind(&()),
            "status": next,
        });
        let written = self
            .api
            .patch_status(
                &self.name,
                &PatchParams::apply(FIELD_MANAGER).force(),
                &Patch::Apply(patch),
            )
            .await?;
        self.resource_version = written.resource_version();
        self.wrote = true;
        Ok(next)
    }

    /// The key the probe engine knows this Proxy by.
    fn health_key(&self) -> String {
        format!("{}/{}", self.namespace, self.name)
    }

    /// The address in `status`, when the instance runs there.
    fn running_at(status: &ProxyStatus) -> Option<SocketAddr> {
        if status.state.as_deref() != Some(State::Running.as_str()) {
            return None;
        }
        let ip: IpAddr = status.ip.as_deref()?.parse().ok()?;
        let port = u16::try_from(status.port?).ok()?;
        Some(SocketAddr::new(ip, port))
    }

    /// The engine's verdict about the address in `status`, when it differs from what the
    /// status says (so a reconcile with nothing else to do still writes it).
    fn health_view(&self, status: &ProxyStatus) -> Option<status::HealthView> {
        let hook = self.ctx.health.as_ref()?;
        let addr = Self::running_at(status)?;
        let v = hook.engine.verdict_at(&self.health_key(), addr)?;
        let probed_at = v.probed_at?;
        let view = status::HealthView {
            healthy: v.healthy,
            reason: v.reason,
            message: v.message,
            probed_at: Time(k8s_openapi::jiff::Timestamp::try_from(probed_at).ok()?),
            latency_ms: v.latency.map(|d| d.as_millis() as i64),
        };
        let healthy = status
            .conditions
            .iter()
            .find(|c| c.type_ == condition::HEALTHY);
        let same = healthy.is_some_and(|c| {
            c.status == if view.healthy { "True" } else { "False" } && c.reason == view.reason
        });
        // lastProbe is refreshed when the verdict changes, and otherwise at most once per
        // `probe_refresh`, so steady probing does not write the status every interval.
        let fresh = status.last_probe.as_ref().is_some_and(|p| {
            let age = view.probed_at.0.duration_since(p.time.0);
            age.is_negative() || age.unsigned_abs() < hook.probe_refresh
        });
        (!(same && fresh)).then_some(view)
    }

    /// Registers the running address with the probe engine, or stops probing it. Without
    /// resolved inputs this reconcile (a credentials Secret briefly unreadable), the probe
    /// keeps the credentials it had.
    fn sync_health(&self, status: &ProxyStatus, deleting: bool, resolved: Option<&Resolved>) {
        let Some(hook) = &self.ctx.health else { return };
        let allow_internal = self
            .provider
            .as_ref()
            .is_some_and(|p| p.private_addresses_allowed());
        match Self::running_at(status).filter(|_| !deleting) {
            Some(addr) => {
                let key = self.health_key();
                let credentials = match resolved {
                    Some(r) => r.credentials.clone(),
                    None => hook
                        .engine
                        .credentials(&key)
                        .map(|(username, password)| Credentials { username, password }),
                };
                hook.engine.upsert(
                    &key,
                    hook.spec(addr, allow_internal, credentials.as_ref()),
                    &addr.ip().to_string(),
                )
            }
            None => hook.engine.remove(&self.health_key()),
        }
    }

    /// Merge patch of the whole finalizer list, guarded by the resourceVersion it was read
    /// at: a concurrent change fails with a conflict (and is retried) instead of being lost.
    /// Adds the finalizer; false when the Proxy is gone. The patch's answer is the
    /// server's copy: its resourceVersion is the one later writes of this reconcile
    /// compare with.
    async fn add_finalizer(&mut self) -> Result<bool, ReconcileError> {
        let Some(mut finalizers) = self.finalizers().await? else {
            return Ok(false);
        };
        finalizers.push(FINALIZER.to_string());
        match self.patch_finalizers(finalizers).await? {
            Some(written) => {
                self.resource_version = written.resource_version();
                self.wrote = true;
                Ok(true)
            }
            None => Ok(false),
        }
    }

    async fn remove_finalizer(&self) -> Result<(), ReconcileError> {
        let Some(mut finalizers) = self.finalizers().await? else {
            return Ok(());
        };
        finalizers.retain(|f| f != FINALIZER);
        self.patch_finalizers(finalizers).await.map(drop)
    }

    /// The Proxy's finalizers, whole: its copy's, or the server's when the cache cut them
    /// ([`crate::watched::MAX_FINALIZERS`]); `None` when it is gone. The patch stays guarded
    /// by the copy's resourceVersion, so a server copy that moved on makes it conflict.
    async fn finalizers(&self) -> Result<Option<Vec<String>>, ReconcileError> {
        if !crate::watched::finalizers_trimmed(&self.proxy.metadata) {
            return Ok(Some(self.proxy.finalizers().to_vec()));
        }
        let server = self.api.get_opt(&self.name).await?;
        Ok(server.map(|p| p.finalizers().to_vec()))
    }

    /// The patched object, or `None` when it is gone.
    async fn patch_finalizers(
        &self,
        finalizers: Vec<String>,
    ) -> Result<Option<Proxy>, ReconcileError> {
        let patch = serde_json::json!({
            "metadata": {
                "finalizers": finalizers,
                "resourceVersion": self.resource_version,
            }
        });
        match self
            .api
            .patch(&self.name, &PatchParams::default(), &Patch::Merge(patch))
            .await
        {
            Ok(written) => Ok(Some(written)),
            // Released and already gone: nothing left to do.
            Err(kube::Error::Api(s)) if s.code == 404 => Ok(None),
            Err(e) => Err(e.into()),
        }
    }

    async fn publish(&self, e: EventNote) {
        let mut note = e.note;
        truncate(&mut note, EVENT_NOTE_MAX);
        if e.warning {
            warn!(reason = e.reason, note = note.as_str(), "event");
        } else {
            info!(reason = e.reason, note = note.as_str(), "event");
        }
        let event = Event {
            type_: if e.warning {
                EventType::Warning
            } else {
                EventType::Normal
            },
            reason: e.reason.to_string(),
            note: Some(note),
            action: e.reason.to_string(),
            secondary: None,
        };
        // An event that cannot be published must not fail the reconcile.
        if let Err(err) = self
            .ctx
            .recorder
            .publish(&event, &self.proxy.object_ref(&()))
            .await
        {
            warn!(error = %err, reason = e.reason, "publishing event failed");
        }
    }
}

/// What decide looks at, from the Proxy and its (in-memory, latest) status.
pub fn observe(
    proxy: &Proxy,
    status: &ProxyStatus,
    has_finalizer: bool,
    provider_configured: bool,
    input: Input,
    listed: Option<egress_plugin_host::provider::Instance>,
    list_pending: Option<std::time::Duration>,
) -> Observed {
    Observed {
        generation: proxy.metadata.generation.unwrap_or_default(),
        deleting: proxy.metadata.deletion_timestamp.is_some(),
        has_finalizer,
        skip_cleanup: proxy.skip_cleanup(),
        provider_configured,
        provider: proxy.spec.provider.clone(),
        input,
        provider_id: status.provider_id.clone().filter(|s| !s.is_empty()),
        stored_hash: status.spec_hash.clone().filter(|s| !s.is_empty()),
        port: proxy.spec.port,
        ip: status.ip.clone().filter(|s| !s.is_empty()),
        listed,
        list_pending,
        by_list: crate::inventory::ByList::No,
        first_look_in: None,
        open: proxy
            .metadata
            .name
            .as_deref()
            .and_then(|name| proxy_auth::access(&proxy.spec.auth, name).ok())
            .is_some_and(|a| a.is_open()),
        ip_family: proxy.spec.ip_family.to_provider(),
        provisioned: status
            .conditions
            .iter()
            .find(|c| c.type_ == condition::PROVISIONED)
            .map(|c| CondView {
                status: c.status.clone(),
                reason: c.reason.clone(),
                message: c.message.clone(),
                observed_generation: c.observed_generation,
            }),
    }
}

fn now() -> Time {
    Time(k8s_openapi::jiff::Timestamp::now())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::{CloudInit, ProxySpec};
    use crate::controller::wiring::{backoff, trigger_hash};
    use crate::proxy_cache::trim_for_cache;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
    use std::time::Duration;

    #[test]
    fn backoff_doubles_and_caps() {
        let base = Duration::from_secs(1);
        let max = Duration::from_secs(300);
        let got: Vec<u64> = [1, 2, 3, 4, 9, 10, 40]
            .iter()
            .map(|n| backoff(*n, base, max).as_secs())
            .collect();
        assert_eq!(got, [1, 2, 4, 8, 256, 300, 300]);
        assert_eq!(backoff(0, base, max), base);
    }

    #[test]
    fn observe_reads_metadata_and_status() {
        let mut p = Proxy::new(
            "p",
            ProxySpec {
                provider: "fake".into(),
                placement: Default::default(),
                cloud_init: CloudInit::default(),
                port: 8080,
                auth: Default::default(),
                ip_family: Default::default(),
            },
        );
        p.metadata.generation = Some(3);
        p.metadata.annotations = Some(
            [(
                crate::api::ANNOTATION_SKIP_CLEANUP.to_string(),
                "True".to_string(),
            )]
            .into(),
        );
        let status = ProxyStatus {
            provider_id: Some(String::new()),
            spec_hash: Some("h".into()),
            conditions: vec![Condition {
                type_: condition::PROVISIONED.into(),
                status: "False".into(),
                reason: "PermanentError".into(),
                message: "refused".into(),
                observed_generation: Some(3),
                last_transition_time: now(),
            }],
            ..Default::default()
        };
        let o = observe(
            &p,
            &status,
            true,
            false,
            Input::Resolved { hash: "h".into() },
            None,
            None,
        );
        assert_eq!(o.generation, 3);
        assert!(o.skip_cleanup && o.has_finalizer && !o.deleting && !o.provider_configured);
        assert_eq!(o.provider_id, None, "an empty ID counts as none");
        assert_eq!(o.stored_hash.as_deref(), Some("h"));
        assert_eq!(o.port, 8080);
        assert_eq!(
            o.provisioned,
            Some(CondView {
                status: "False".into(),
                reason: "PermanentError".into(),
                message: "refused".into(),
                observed_generation: Some(3)
            })
        );
    }

    #[test]
    fn only_what_the_reconciler_reads_triggers_it() {
        let mut base = Proxy::new(
            "p",
            ProxySpec {
                provider: "fake".into(),
                placement: Default::default(),
                cloud_init: CloudInit::default(),
                port: 8080,
                auth: Default::default(),
                ip_family: Default::default(),
            },
        );
        base.metadata.generation = Some(1);
        base.metadata.resource_version = Some("10".into());
        let h = trigger_hash(&base);
        let changed = |f: &dyn Fn(&mut Proxy)| {
            let mut p = base.clone();
            f(&mut p);
            trigger_hash(&p) != h
        };
        // Our own writes: status (and with it resourceVersion, managedFields).
        assert!(!changed(&|p| {
            p.status = Some(ProxyStatus {
                ip: Some("192.0.2.1".into()),
                ..Default::default()
            });
            p.metadata.resource_version = Some("11".into());
        }));
        assert!(!changed(&|p| {
            p.metadata.labels = Some([("team".to_string(), "a".to_string())].into())
        }));
        // What the reconciler reads.
        assert!(changed(&|p| p.metadata.generation = Some(2)));
        assert!(changed(&|p| p.metadata.deletion_timestamp = Some(now())));
        assert!(changed(
            &|p| p.metadata.finalizers = Some(vec![FINALIZER.into()])
        ));
        assert!(changed(&|p| {
            p.metadata.annotations = Some(
                [(
                    crate::api::ANNOTATION_SKIP_CLEANUP.to_string(),
                    "true".to_string(),
                )]
                .into(),
            )
        }));
    }

    #[test]
    fn the_cache_keeps_what_the_reconciler_reads() {
        use k8s_openapi::apimachinery::pkg::apis::meta::v1::ManagedFieldsEntry;
        let mut p = Proxy::new(
            "p",
            ProxySpec {
                provider: "fake".into(),
                placement: Default::default(),
                cloud_init: CloudInit::default(),
                port: 8080,
                auth: Default::default(),
                ip_family: Default::default(),
            },
        );
        p.metadata.managed_fields = Some(vec![ManagedFieldsEntry {
            manager: Some(FIELD_MANAGER.into()),
            ..Default::default()
        }]);
        p.metadata.annotations = Some(
            [
                (
                    "kubectl.kubernetes.io/last-applied-configuration".to_string(),
                    "{...}".to_string(),
                ),
                (
                    crate::api::ANNOTATION_SKIP_CLEANUP.to_string(),
                    "true".to_string(),
                ),
            ]
            .into(),
        );
        p.metadata.finalizers = Some(vec![FINALIZER.into()]);
        trim_for_cache(&mut p);
        assert!(p.managed_fields().is_empty());
        assert_eq!(
            p.annotations().keys().collect::<Vec<_>>(),
            [crate::api::ANNOTATION_SKIP_CLEANUP]
        );
        assert!(p.skip_cleanup());
        assert_eq!(p.finalizers(), [FINALIZER]);
    }
}
