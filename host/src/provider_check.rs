//! The provider check monitor: every interval, runs every provider's `check`
//! concurrently under one shared timeout, logs each target that changes readiness, sets
//! per-target gauges, and hands the results to a sink (the controller publishes them as
//! `ProviderHealth` objects).
//!
//! One timeout for the whole round, not one per provider: a round must end in bounded
//! time whatever the plugins do, so a hung backend cannot delay the others' results.

use egress_plugin_host::provider::{Provider, TargetStatus};
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use std::collections::BTreeMap;
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};
use tokio_util::sync::CancellationToken;

/// What one provider's check came to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CheckOutcome {
    /// The targets, in the provider's order.
    Checked(Vec<TargetStatus>),
    /// The plugin has no check: reported as such, never as a failure.
    Unsupported,
    /// No answer within the round's timeout.
    TimedOut(Duration),
}

#[derive(Debug, Clone)]
pub struct ProviderCheck {
    pub provider: String,
    pub outcome: CheckOutcome,
    pub checked_at: SystemTime,
    pub duration: Duration,
}

impl ProviderCheck {
    /// The targets to publish. A timed-out check keeps the targets the provider last
    /// reported, each marked not ready, so a hung backend shows up as down rather than
    /// vanishing from the status.
    pub fn targets(&self, previous: &[String]) -> Vec<TargetStatus> {
        match &self.outcome {
            CheckOutcome::Checked(t) => t.clone(),
            CheckOutcome::Unsupported => Vec::new(),
            CheckOutcome::TimedOut(d) => previous
                .iter()
                .map(|name| TargetStatus {
                    target: name.clone(),
                    ready: false,
                    reason: "CheckTimeout".into(),
                    message: format!("the provider's check did not answer within {d:?}"),
                    details: Vec::new(),
                })
                .collect(),
        }
    }
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct TargetLabels {
    provider: String,
    target: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ProviderLabels {
    provider: String,
}

/// `proxy_operator_provider_target_up{provider,target}`,
/// `proxy_operator_provider_check_duration_seconds{provider}`,
/// `proxy_operator_provider_check_timestamp_seconds{provider}`.
#[derive(Clone, Default)]
pub struct MonitorMetrics {
    up: Family<TargetLabels, Gauge>,
    duration: Family<ProviderLabels, Gauge<f64, AtomicU64>>,
    timestamp: Family<ProviderLabels, Gauge<f64, AtomicU64>>,
}

impl MonitorMetrics {
    pub fn register(registry: &mut Registry) -> Self {
        let m = MonitorMetrics::default();
        registry.register(
            "proxy_operator_provider_target_up",
            "1 when the provider's health check reports the target ready, 0 otherwise",
            m.up.clone(),
        );
        registry.register(
            "proxy_operator_provider_check_duration_seconds",
            "How long the provider's last health check took",
            m.duration.clone(),
        );
        registry.register(
            "proxy_operator_provider_check_timestamp_seconds",
            "When the provider's last health check finished (Unix time)",
            m.timestamp.clone(),
        );
        m
    }

    pub fn target_up(&self, provider: &str, target: &str) -> i64 {
        self.up
            .get_or_create(&TargetLabels {
                provider: provider.into(),
                target: target.into(),
            })
            .get()
    }
}

pub struct Monitor {
    timeout: Duration,
    metrics: MonitorMetrics,
    /// Last readiness per provider and target, for transition logs and timed-out rounds.
    last: Mutex<BTreeMap<String, Vec<(String, bool)>>>,
}

impl Monitor {
    pub fn new(timeout: Duration, metrics: MonitorMetrics) -> Self {
        Monitor {
            timeout,
            metrics,
            last: Mutex::new(BTreeMap::new()),
        }
    }

    /// Checks every provider once, concurrently; returns when all have answered or the
    /// timeout has passed, in the order given.
    pub async fn round(&self, providers: &[Arc<dyn Provider>]) -> Vec<ProviderCheck> {
        let deadline = tokio::time::Instant::now() + self.timeout;
        let mut set = tokio::task::JoinSet::new();
        for (i, p) in providers.iter().enumerate() {
            let p = p.clone();
            set.spawn(async move {
                let started = Instant::now();
                let r = p.check().await;
                (i, r, started.elapsed())
            });
        }
        let mut answers: Vec<Option<(Option<Vec<TargetStatus>>, Duration)>> =
            vec![None; providers.len()];
        loop {
            match tokio::time::timeout_at(deadline, set.join_next()).await {
                Ok(Some(Ok((i, r, took)))) => answers[i] = Some((r, took)),
                Ok(Some(Err(e))) => tracing::error!(error = %e, "provider check task failed"),
                Ok(None) | Err(_) => break,
            }
        }
        // Whatever has not answered is dropped here, which cancels its call.
        set.abort_all();
        let now = SystemTime::now();
        let checks: Vec<ProviderCheck> = providers
            .iter()
            .zip(answers)
            .map(|(p, a)| {
                let (outcome, duration) = match a {
                    Some((Some(t), d)) => (CheckOutcome::Checked(t), d),
                    Some((None, d)) => (CheckOutcome::Unsupported, d),
                    None => (CheckOutcome::TimedOut(self.timeout), self.timeout),
                };
                ProviderCheck {
                    provider: p.name().to_string(),
                    outcome,
                    checked_at: now,
                    duration,
                }
            })
            .collect();
        for c in &checks {
            self.record(c);
        }
        checks
    }

    /// Gauges and transition logs for one result.
    pub(crate) fn record(&self, c: &ProviderCheck) {
        let mut last = self.last.lock().expect("monitor lock");
        let previous = last.remove(&c.provider).unwrap_or_default();
        let names: Vec<String> = previous.iter().map(|(t, _)| t.clone()).collect();
        let targets = c.targets(&names);
        for t in &targets {
            let before = previous
                .iter()
                .find(|(n, _)| *n == t.target)
                .map(|(_, r)| *r);
            if before != Some(t.ready) {
                if t.ready {
                    tracing::info!(provider = %c.provider, target = %t.target, "provider target ready");
                } else {
                    tracing::warn!(provider = %c.provider, target = %t.target, reason = %t.reason, detail = %t.message, "provider target not ready");
                }
            }
            self.metrics
                .up
                .get_or_create(&TargetLabels {
                    provider: c.provider.clone(),
                    target: t.target.clone(),
                })
                .set(i64::from(t.ready));
        }
        // Targets that disappeared from the answer stop being exported.
        for (name, _) in &previous {
            if !targets.iter().any(|t| &t.target == name) {
                self.metrics.up.remove(&TargetLabels {
                    provider: c.provider.clone(),
                    target: name.clone(),
                });
            }
        }
        let labels = ProviderLabels {
            provider: c.provider.clone(),
        };
        self.metrics
            .duration
            .get_or_create(&labels)
            .set(c.duration.as_secs_f64());
        let ts = c
            .checked_at
            .duration_since(UNIX_EPOCH)
            .unwrap_or_default()
            .as_secs_f64();
        self.metrics.timestamp.get_or_create(&labels).set(ts);
        last.insert(
            c.provider.clone(),
            targets
                .iter()
                .map(|t| (t.target.clone(), t.ready))
                .collect(),
        );
    }

    /// Runs a round every `interval` until cancelled, and hands each round's results to
    /// `sink` (awaited before the next round, so a slow sink delays the next round instead
    /// of piling up). `providers` is asked each round, so a config reload takes effect at
    /// the next one. A round cut short by `cancel` is dropped, which cancels its calls, and
    /// its results are not sunk: checks stopped by a shutdown or a lost leadership say
    /// nothing about the backends.
    pub async fn run<F>(
        &self,
        interval: Duration,
        cancel: CancellationToken,
        providers: impl Fn() -> Vec<Arc<dyn Provider>>,
        mut sink: impl FnMut(Vec<ProviderCheck>) -> F,
    ) where
        F: Future<Output = ()>,
    {
        let mut tick = tokio::time::interval(interval);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                biased;
                _ = cancel.cancelled() => return,
                _ = tick.tick() => {}
            }
            let list = providers();
            let checks = tokio::select! {
                biased;
                _ = cancel.cancelled() => return,
                checks = self.round(&list) => checks,
            };
            sink(checks).await;
        }
    }
}

/// Where the leader's provider checks go: one `ProviderHealth` object per provider,
/// written by [`publish`] with each provider's plugin type from the registry and the
/// reloader's load errors as `/readyz` reports them.
pub async fn publish_rounds(
    monitor: &Monitor,
    interval: Duration,
    cancel: CancellationToken,
    client: &kube::Client,
    registry: &crate::registry::ProviderRegistry,
    readiness: &crate::readiness::Readiness,
) {
    let providers = || registry.snapshot().values().cloned().collect();
    let sink = move |checks: Vec<ProviderCheck>| async move {
        let types = registry.plugin_types();
        publish(
            client,
            &checks,
            &types,
            &readiness.load_errors(),
            &readiness.plugins(),
        )
        .await;
    };
    monitor.run(interval, cancel, providers, sink).await;
}

/// The field manager ProviderHealth objects are written under.
pub const FIELD_MANAGER: &str = "proxy-operator-provider-health";

/// The status of one provider's `ProviderHealth` after `check` (none when the provider
/// has never loaded), keeping each target's `lastTransitionTime` from `previous` unless its
/// readiness flipped. Pure.
pub fn status_for(
    check: Option<&ProviderCheck>,
    type_name: &str,
    load_error: Option<&str>,
    previous: Option<&crate::api::ProviderHealthStatus>,
) -> crate::api::ProviderHealthStatus {
    use crate::api::TargetHealth;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
    let time = |t: SystemTime| {
        Time(
            k8s_openapi::jiff::Timestamp::try_from(t)
                .unwrap_or(k8s_openapi::jiff::Timestamp::UNIX_EPOCH),
        )
    };
    let before: Vec<TargetHealth> = previous.map(|p| p.targets.clone()).unwrap_or_default();
    let names: Vec<String> = before.iter().map(|t| t.target.clone()).collect();
    let targets = check
        .map(|c| c.targets(&names))
        .unwrap_or_default()
        .into_iter()
        .map(|t| {
            let kept = before
                .iter()
                .find(|b| b.target == t.target && b.ready == t.ready)
                .map(|b| b.last_transition_time.clone());
            TargetHealth {
                message: published_message(check, &t),
                target: t.target,
                ready: t.ready,
                reason: t.reason,
                details: t.details.into_iter().collect(),
                last_transition_time: kept
                    .unwrap_or_else(|| time(check.map_or_else(SystemTime::now, |c| c.checked_at))),
            }
        })
        .collect();
    crate::api::ProviderHealthStatus {
        type_: (!type_name.is_empty()).then(|| type_name.to_string()),
        check_supported: check.map(|c| !matches!(c.outcome, CheckOutcome::Unsupported)),
        targets,
        last_check_time: check.map(|c| time(c.checked_at)),
        load_error: load_error.map(str::to_string),
        plugin: None,
    }
}

/// What `ProviderHealth` says about a target besides its name, reason and details: the
/// operator's own words, never the plugin's.
///
/// `ProviderHealth` is cluster-scoped and readable with `view`; a plugin's message is free
/// text that could carry any Proxy's credentials of the provider in a form no scrubbing
/// recognises (an encoding the redactor does not know, or a value it has not been told of
/// yet: after a restart, the checks run before the reconciler has read every Proxy's
/// Secret). Scrubbing and a shape check would still leave that channel open; leaving the
/// text out closes it. The plugin's message stays in the operator's log (scrubbed), where
/// the transition to not ready is logged with it.
fn published_message(check: Option<&ProviderCheck>, t: &TargetStatus) -> String {
    match check.map(|c| &c.outcome) {
        // Made by `ProviderCheck::targets`, from the round's timeout alone.
        Some(CheckOutcome::TimedOut(_)) => t.message.clone(),
        _ if t.ready => String::new(),
        _ => NOT_READY_MESSAGE.to_string(),
    }
}

/// [`published_message`] of a target the plugin reports not ready.
pub const NOT_READY_MESSAGE: &str = "the plugin's own message is in the operator's log \
     (\"provider target not ready\", with this provider and target); ProviderHealth is \
     readable cluster-wide and publishes no plugin text";

/// How often an unchanged `ProviderHealth` is written anyway, so that `lastCheckTime`
/// shows the checks are still running.
pub const LAST_CHECK_REFRESH: Duration = Duration::from_secs(600);

/// Whether `new` must be written over `previous`: the object is new, something other than
/// `lastCheckTime` changed, or that time is older than [`LAST_CHECK_REFRESH`]. Writing
/// every round (once a minute) cost two API writes a minute per provider for nothing. Pure.
pub fn needs_write(
    previous: Option<&crate::api::ProviderHealthStatus>,
    new: &crate::api::ProviderHealthStatus,
) -> bool {
    let Some(previous) = previous else {
        return true;
    };
    let stamp = |s: &crate::api::ProviderHealthStatus| {
        s.last_check_time.as_ref().map(|t| SystemTime::from(t.0))
    };
    let mut same = previous.clone();
    same.last_check_time = new.last_check_time.clone();
    if same != *new {
        return true;
    }
    match (stamp(previous), stamp(new)) {
        (Some(before), Some(now)) => now
            .duration_since(before)
            .is_ok_and(|age| age >= LAST_CHECK_REFRESH),
        (None, None) => false,
        _ => true,
    }
}

/// The load error to show on `provider`'s object: its own, or the providers file's (its
/// new entry was not applied either). Pure.
pub fn load_error_for<'a>(provider: &str, errors: &'a BTreeMap<String, String>) -> Option<&'a str> {
    errors
        .get(provider)
        .or_else(|| errors.get(""))
        .map(String::as_str)
}

/// Writes one `ProviderHealth` per checked provider and per provider whose load failed
/// (server-side apply, creating it when missing). `types` maps provider names to plugin
/// types; `load_errors` are the reloader's errors by provider (`""`: the providers file).
/// A failed write is logged and retried at the next round; it never stops the monitor.
pub async fn publish(
    client: &kube::Client,
    checks: &[ProviderCheck],
    types: &BTreeMap<String, String>,
    load_errors: &BTreeMap<String, String>,
    plugins: &BTreeMap<String, String>,
) {
    use crate::api::ProviderHealth;
    use kube::Resource;
    use kube::api::{Api, Patch, PatchParams};
    let api: Api<ProviderHealth> = Api::all(client.clone());
    let params = PatchParams::apply(FIELD_MANAGER).force();
    let mut names: Vec<&str> = checks.iter().map(|c| c.provider.as_str()).collect();
    names.extend(
        load_errors
            .keys()
            .filter(|n| !n.is_empty() && !names.contains(&n.as_str()))
            .map(String::as_str)
            .collect::<Vec<_>>(),
    );
    for name in names {
        if !egress_plugin_host::config::is_dns1123_label(name) {
            continue;
        }
        let (exists, previous) = match api.get_opt(name).await {
            Ok(p) => (p.is_some(), p.and_then(|p| p.status)),
            Err(e) => {
                tracing::warn!(provider = %name, error = %e, "reading ProviderHealth");
                continue;
            }
        };
        let check = checks.iter().find(|c| c.provider == name);
        let type_name = types.get(name).map(String::as_str).unwrap_or("");
        let mut status = status_for(
            check,
            type_name,
            load_error_for(name, load_errors),
            previous.as_ref(),
        );
        // What serves now; a provider that never loaded keeps what it last said.
        status.plugin = plugins
            .get(name)
            .cloned()
            .or_else(|| previous.as_ref().and_then(|p| p.plugin.clone()));
        if exists && !needs_write(previous.as_ref(), &status) {
            continue;
        }
        let object = serde_json::json!({
            "apiVersion": ProviderHealth::api_version(&()),
            "kind": ProviderHealth::kind(&()),
            "metadata": {"name": name},
            "spec": {},
        });
        let status = serde_json::json!({
            "apiVersion": ProviderHealth::api_version(&()),
            "kind": ProviderHealth::kind(&()),
            "status": status,
        });
        let created = if exists {
            Ok(())
        } else {
            api.patch(name, &params, &Patch::Apply(object))
                .await
                .map(drop)
        };
        let written = match created {
            Ok(()) => api
                .patch_status(name, &params, &Patch::Apply(status))
                .await
                .map(drop),
            Err(e) => Err(e),
        };
        if let Err(e) = written {
            tracing::warn!(provider = %name, error = %e, "writing ProviderHealth");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use async_trait::async_trait;
    use egress_plugin_host::provider::{CreateRequest, Instance, ProviderError};

    /// A provider whose check answers `targets` after `delay` (or has no check).
    struct Checking {
        name: &'static str,
        delay: Duration,
        targets: Mutex<Option<Vec<(&'static str, bool)>>>,
    }

    fn checking(
        name: &'static str,
        delay_ms: u64,
        t: Option<Vec<(&'static str, bool)>>,
    ) -> Arc<Checking> {
        Arc::new(Checking {
            name,
            delay: Duration::from_millis(delay_ms),
            targets: Mutex::new(t),
        })
    }

    use egress_plugin_host::provider::Priority;

    #[async_trait]
    impl Provider for Checking {
        fn name(&self) -> &str {
            self.name
        }
        async fn create_at(&self, _: &CreateRequest, _: Priority) -> Result<String, ProviderError> {
            unreachable!("the monitor only checks")
        }
        async fn get_at(&self, _: &str, _: Priority) -> Result<Instance, ProviderError> {
            unreachable!("the monitor only checks")
        }
        async fn delete_at(&self, _: &str, _: Priority) -> Result<(), ProviderError> {
            unreachable!("the monitor only checks")
        }
        async fn list_by_tag_at(
            &self,
            _: &str,
            _: Priority,
        ) -> Result<Vec<Instance>, ProviderError> {
            unreachable!("the monitor only checks")
        }
        async fn check(&self) -> Option<Vec<TargetStatus>> {
            tokio::time::sleep(self.delay).await;
            let t = self.targets.lock().unwrap().clone()?;
            Some(
                t.into_iter()
                    .map(|(target, ready)| TargetStatus {
                        target: target.into(),
                        ready,
                        reason: if ready { "Ready" } else { "Unreachable" }.into(),
                        message: String::new(),
                        details: Vec::new(),
                    })
                    .collect(),
            )
        }
    }

    fn summary(c: &[ProviderCheck]) -> Vec<(String, String)> {
        c.iter()
            .map(|c| {
                let what = match &c.outcome {
                    CheckOutcome::Checked(t) => t
                        .iter()
                        .map(|t| format!("{}={}", t.target, t.ready))
                        .collect::<Vec<_>>()
                        .join(","),
                    CheckOutcome::Unsupported => "unsupported".into(),
                    CheckOutcome::TimedOut(_) => "timed out".into(),
                };
                (c.provider.clone(), what)
            })
            .collect()
    }

    #[tokio::test]
    async fn one_round_under_one_timeout() {
        let mut registry = Registry::default();
        let metrics = MonitorMetrics::register(&mut registry);
        let m = Monitor::new(Duration::from_millis(300), metrics.clone());
        let slow = checking("slow", 50, Some(vec![("fsn1", true)]));
        let providers: Vec<Arc<dyn Provider>> = vec![
            checking(
                "aws",
                0,
                Some(vec![("eu-west-1", true), ("us-east-1", false)]),
            ),
            checking("plain", 0, None),
            slow.clone(),
        ];
        let started = Instant::now();
        let checks = m.round(&providers).await;
        assert!(started.elapsed() < Duration::from_millis(300));
        assert_eq!(
            summary(&checks),
            [
                ("aws".into(), "eu-west-1=true,us-east-1=false".into()),
                ("plain".into(), "unsupported".into()),
                ("slow".into(), "fsn1=true".into()),
            ]
        );
        assert_eq!(metrics.target_up("aws", "eu-west-1"), 1);
        assert_eq!(metrics.target_up("aws", "us-east-1"), 0);

        // The slow one now hangs past the timeout: the round still ends on time, and its
        // last known target reads not ready.
        let hung: Vec<Arc<dyn Provider>> = vec![
            providers[0].clone(),
            checking("slow", 5_000, Some(vec![("fsn1", true)])),
        ];
        let started = Instant::now();
        let checks = m.round(&hung).await;
        let took = started.elapsed();
        assert!(
            took >= Duration::from_millis(300) && took < Duration::from_millis(600),
            "{took:?}"
        );
        assert_eq!(
            checks[1].outcome,
            CheckOutcome::TimedOut(Duration::from_millis(300))
        );
        let t = checks[1].targets(&["fsn1".to_string()]);
        assert_eq!((t[0].ready, t[0].reason.as_str()), (false, "CheckTimeout"));
        assert_eq!(metrics.target_up("slow", "fsn1"), 0);

        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &registry).unwrap();
        for line in [
            "proxy_operator_provider_target_up{provider=\"aws\",target=\"us-east-1\"} 0",
            "proxy_operator_provider_check_duration_seconds{provider=\"slow\"} 0.3",
            "proxy_operator_provider_check_timestamp_seconds{provider=\"aws\"}",
        ] {
            assert!(text.contains(line), "{line} in\n{text}");
        }
        assert!(
            !text.contains("provider=\"plain\",target"),
            "no targets for an unsupported check"
        );
    }

    #[tokio::test]
    async fn transitions_are_logged_once_and_vanished_targets_unexported() {
        let (_guard, logs) = crate::testing::capture();
        let mut registry = Registry::default();
        let metrics = MonitorMetrics::register(&mut registry);
        let m = Monitor::new(Duration::from_secs(1), metrics.clone());
        let p = checking("hz", 0, Some(vec![("fsn1", true), ("nbg1", true)]));
        let list: Vec<Arc<dyn Provider>> = vec![p.clone()];
        m.round(&list).await;
        m.round(&list).await;
        *p.targets.lock().unwrap() = Some(vec![("fsn1", false)]);
        m.round(&list).await;
        m.round(&list).await;
        let lines: Vec<String> = logs
            .events()
            .iter()
            .map(|e| e.message().to_string())
            .collect();
        let ready = lines
            .iter()
            .filter(|l| *l == "provider target ready")
            .count();
        let down = lines
            .iter()
            .filter(|l| *l == "provider target not ready")
            .count();
        assert_eq!((ready, down), (2, 1), "{lines:#?}");
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &registry).unwrap();
        assert!(!text.contains("nbg1"), "{text}");
        assert_eq!(metrics.target_up("hz", "fsn1"), 0);
    }

    #[tokio::test]
    async fn run_follows_the_provider_list_and_stops_on_cancel() {
        let m = Monitor::new(Duration::from_secs(1), MonitorMetrics::default());
        let current: Arc<Mutex<Vec<Arc<dyn Provider>>>> = Arc::new(Mutex::new(vec![checking(
            "a", 0, None,
        )
            as Arc<dyn Provider>]));
        let seen = Arc::new(Mutex::new(Vec::new()));
        let cancel = CancellationToken::new();
        let run = {
            let (current, seen, cancel) = (current.clone(), seen.clone(), cancel.clone());
            async move {
                m.run(
                    Duration::from_millis(20),
                    cancel,
                    move || current.lock().unwrap().clone(),
                    move |c| {
                        seen.lock().unwrap().push(summary(&c));
                        std::future::ready(())
                    },
                )
                .await
            }
        };
        let task = tokio::spawn(run);
        tokio::time::sleep(Duration::from_millis(70)).await;
        current
            .lock()
            .unwrap()
            .push(checking("b", 0, Some(vec![("x", true)])));
        tokio::time::sleep(Duration::from_millis(70)).await;
        cancel.cancel();
        tokio::time::timeout(Duration::from_secs(1), task)
            .await
            .unwrap()
            .unwrap();
        let seen = seen.lock().unwrap();
        assert!(seen.first().is_some_and(|s| s.len() == 1), "{seen:?}");
        assert!(seen.last().is_some_and(|s| s.len() == 2), "{seen:?}");
    }

    #[tokio::test]
    async fn provider_health_objects_are_created_and_keep_transition_times() {
        use crate::api::ProviderHealth;
        use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
        use kube::api::{Api, PostParams};
        let fake = fake_kube::FakeApi::new();
        let client = fake.client();
        let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
        for (_, crd) in crate::api::crds() {
            crds.create(&PostParams::default(), &crd).await.unwrap();
        }
        let m = Monitor::new(Duration::from_secs(1), MonitorMetrics::default());
        let p = checking("hz", 0, Some(vec![("fsn1", true), ("nbg1", true)]));
        let list: Vec<Arc<dyn Provider>> = vec![p.clone(), checking("plain", 0, None)];
        let types: BTreeMap<String, String> = [("hz".to_string(), "hetzner".to_string())].into();
        publish(
            &client,
            &m.round(&list).await,
            &types,
            &BTreeMap::new(),
            &BTreeMap::new(),
        )
        .await;
        let api: Api<ProviderHealth> = Api::all(client.clone());
        let hz = api.get("hz").await.unwrap().status.unwrap();
        assert_eq!(hz.type_.as_deref(), Some("hetzner"));
        assert_eq!(hz.check_supported, Some(true));
        assert_eq!(hz.targets.len(), 2);
        let first = hz.targets[0].last_transition_time.clone();
        let plain = api.get("plain").await.unwrap().status.unwrap();
        assert_eq!(plain.check_supported, Some(false));

        tokio::time::sleep(Duration::from_millis(1100)).await;
        *p.targets.lock().unwrap() = Some(vec![("fsn1", true), ("nbg1", false)]);
        publish(
            &client,
            &m.round(&list).await,
            &types,
            &BTreeMap::new(),
            &BTreeMap::new(),
        )
        .await;
        let hz = api.get("hz").await.unwrap().status.unwrap();
        assert_eq!(
            hz.targets[0].last_transition_time, first,
            "fsn1 did not flip"
        );
        assert!(!hz.targets[1].ready);
        assert_ne!(hz.targets[1].last_transition_time, first, "nbg1 flipped");
        assert_eq!(hz.load_error, None);

        // Nothing changed: read, not written (the check runs every minute).
        fake.clear_requests();
        publish(
            &client,
            &m.round(&list).await,
            &types,
            &BTreeMap::new(),
            &BTreeMap::new(),
        )
        .await;
        let writes: Vec<_> = fake
            .requests()
            .into_iter()
            .filter(|r| r.verb != "get")
            .collect();
        assert!(writes.is_empty(), "{writes:?}");

        // A failed reload shows on the provider still serving its old version, and a
        // provider that never loaded gets an object that says why.
        let errors: BTreeMap<String, String> = [
            (
                "hz".to_string(),
                "plugin file \"hetzner.wasm\": not a component".to_string(),
            ),
            (
                "never".to_string(),
                "plugin file \"nope.wasm\" is not in /plugins".to_string(),
            ),
        ]
        .into();
        publish(
            &client,
            &m.round(&list).await,
            &types,
            &errors,
            &BTreeMap::new(),
        )
        .await;
        let hz = api.get("hz").await.unwrap().status.unwrap();
        assert_eq!(hz.load_error.as_deref(), Some(errors["hz"].as_str()));
        assert_eq!(
            hz.targets.len(),
            2,
            "the old version still checks its targets"
        );
        let never = api.get("never").await.unwrap().status.unwrap();
        assert_eq!(never.load_error.as_deref(), Some(errors["never"].as_str()));
        assert_eq!((never.check_supported, never.targets.len()), (None, 0));

        // Fixed: the error goes away.
        publish(
            &client,
            &m.round(&list).await,
            &types,
            &BTreeMap::new(),
            &BTreeMap::new(),
        )
        .await;
        let hz = api.get("hz").await.unwrap().status.unwrap();
        assert_eq!(hz.load_error, None);
    }

    /// ProviderHealth carries the operator's words only: a plugin's message (here holding
    /// what could be a credential) stays out; a timed-out round's is the operator's own.
    #[test]
    fn published_messages_are_the_operators_own() {
        let target = |ready: bool| TargetStatus {
            target: "fsn1".into(),
            ready,
            reason: if ready { "Reachable" } else { "Unauthorized" }.into(),
            message: "token SENTINEL-from-the-plugin refused".into(),
            details: vec![("managed".into(), "3".into())],
        };
        let checked = ProviderCheck {
            provider: "hz".into(),
            outcome: CheckOutcome::Checked(vec![
                target(false),
                TargetStatus {
                    target: "nbg1".into(),
                    ..target(true)
                },
            ]),
            checked_at: SystemTime::now(),
            duration: Duration::from_millis(5),
        };
        let s = status_for(Some(&checked), "hetzner", None, None);
        assert_eq!(s.targets[0].message, NOT_READY_MESSAGE);
        assert_eq!(s.targets[0].reason, "Unauthorized");
        assert_eq!(s.targets[1].message, "");
        assert_eq!(s.targets[1].details["managed"], "3");
        let timed_out = ProviderCheck {
            outcome: CheckOutcome::TimedOut(Duration::from_secs(20)),
            ..checked
        };
        let s = status_for(Some(&timed_out), "hetzner", None, Some(&s));
        assert_eq!(
            s.targets[0].message,
            "the provider's check did not answer within 20s"
        );
        assert!(!format!("{s:?}").contains("SENTINEL"));
    }

    #[test]
    fn unchanged_health_is_written_only_to_refresh_the_check_time() {
        use crate::api::{ProviderHealthStatus, TargetHealth};
        use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
        let at = |secs: i64| {
            Some(Time(
                k8s_openapi::jiff::Timestamp::from_second(secs).unwrap(),
            ))
        };
        let status = |checked: i64, ready: bool| ProviderHealthStatus {
            type_: Some("hetzner".into()),
            check_supported: Some(true),
            targets: vec![TargetHealth {
                target: "fsn1".into(),
                ready,
                reason: String::new(),
                message: String::new(),
                details: Default::default(),
                last_transition_time: at(1000).unwrap(),
            }],
            last_check_time: at(checked),
            load_error: None,
            plugin: None,
        };
        let refresh = LAST_CHECK_REFRESH.as_secs() as i64;
        let cases = [
            ("new object", None, status(1060, true), true),
            (
                "same, a minute later",
                Some(status(1000, true)),
                status(1060, true),
                false,
            ),
            (
                "same, just under the refresh",
                Some(status(1000, true)),
                status(999 + refresh, true),
                false,
            ),
            (
                "same, at the refresh",
                Some(status(1000, true)),
                status(1000 + refresh, true),
                true,
            ),
            (
                "a target flipped",
                Some(status(1000, true)),
                status(1060, false),
                true,
            ),
        ];
        for (what, previous, new, want) in cases {
            assert_eq!(needs_write(previous.as_ref(), &new), want, "{what}");
        }
    }

    #[test]
    fn a_broken_providers_file_shows_on_every_provider() {
        let errors: BTreeMap<String, String> = [(
            String::new(),
            "providers.yaml: unknown field `limit`".to_string(),
        )]
        .into();
        assert_eq!(
            load_error_for("hz", &errors),
            Some("providers.yaml: unknown field `limit`")
        );
        let own: BTreeMap<String, String> = [
            (String::new(), "file".to_string()),
            ("hz".to_string(), "own".to_string()),
        ]
        .into();
        assert_eq!(load_error_for("hz", &own), Some("own"));
        assert_eq!(load_error_for("hz", &BTreeMap::new()), None);
    }
}
