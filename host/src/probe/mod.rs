//! The probe engine: probes every running proxy on an interval with a real `CONNECT`
//! ([`connect`]), turns the results into a `Healthy` verdict with thresholds ([`verdict`]),
//! and hands each verdict to a sink (the controller writes it to the Proxy's status).
//!
//! The engine owns no Kubernetes state: the controller tells it which proxies are
//! running ([`ProbeEngine::upsert`], [`ProbeEngine::remove`]), so the probing can be
//! tested against a local proxy without any API server.

pub mod connect;
pub mod verdict;

pub use connect::{ProbeError, ProbeOk, ProbeSpec};
pub use verdict::{Thresholds, Verdict};

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;
use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

#[derive(Debug, Clone)]
pub struct EngineConfig {
    /// Time between two probes of one proxy.
    pub interval: Duration,
    /// Probes in flight at once.
    pub concurrency: usize,
    pub thresholds: Thresholds,
}

impl Default for EngineConfig {
    fn default() -> Self {
        EngineConfig {
            interval: Duration::from_secs(30),
            concurrency: 16,
            thresholds: Thresholds::default(),
        }
    }
}

/// One probe's outcome for one proxy, as the sink gets it.
#[derive(Debug, Clone)]
pub struct Report {
    /// The key the proxy was registered under (`namespace/name`).
    pub key: String,
    pub verdict: Verdict,
    /// The verdict (healthy, or the reason) changed with this probe.
    pub changed: bool,
    /// Healthy turned unhealthy or back with this probe (not a first verdict's reason, nor
    /// a failing proxy's reason moving from one failure to another).
    pub flipped: bool,
    pub at: SystemTime,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ResultLabels {
    /// `Healthy` or the failure reason; never the proxy, to keep cardinality flat.
    result: String,
}

/// `proxy_operator_health_probes_total{result}` and the probe latency histogram.
#[derive(Clone)]
pub struct ProbeMetrics {
    probes: Family<ResultLabels, Counter>,
    latency: Histogram,
}

impl ProbeMetrics {
    pub fn register(registry: &mut Registry) -> Self {
        let m = ProbeMetrics {
            probes: Family::default(),
            latency: Histogram::new([0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0]),
        };
        registry.register(
            "proxy_operator_health_probes",
            "Health probes (CONNECT through the proxy) by result",
            m.probes.clone(),
        );
        registry.register(
            "proxy_operator_health_probe_duration_seconds",
            "Time to a successful CONNECT (and egress check)",
            m.latency.clone(),
        );
        m
    }

    /// One probe: `Healthy` with its latency, or the failure reason.
    pub(crate) fn record(&self, result: &str, latency: Option<std::time::Duration>) {
        self.probes
            .get_or_create(&ResultLabels {
                result: result.into(),
            })
            .inc();
        if let Some(l) = latency {
            self.latency.observe(l.as_secs_f64());
        }
    }

    pub fn probes(&self, result: &str) -> u64 {
        self.probes
            .get_or_create(&ResultLabels {
                result: result.into(),
            })
            .get()
    }
}

struct Entry {
    spec: ProbeSpec,
    ip: String,
    verdict: Verdict,
}

pub struct ProbeEngine {
    cfg: EngineConfig,
    targets: Mutex<BTreeMap<String, Entry>>,
    metrics: Option<ProbeMetrics>,
}

impl ProbeEngine {
    pub fn new(cfg: EngineConfig, metrics: Option<ProbeMetrics>) -> Arc<Self> {
        Arc::new(ProbeEngine {
            cfg,
            targets: Mutex::new(BTreeMap::new()),
            metrics,
        })
    }

    /// Starts (or keeps) probing `key` at `ip` with `spec`. A new address or proxy starts
    /// a fresh verdict: the history of the old instance says nothing about the new one.
    pub fn upsert(&self, key: &str, spec: ProbeSpec, ip: &str) {
        let mut t = self.targets.lock().expect("health targets lock");
        match t.get_mut(key) {
            Some(e) if e.ip == ip && e.spec.proxy == spec.proxy => e.spec = spec,
            _ => {
                t.insert(
                    key.to_string(),
                    Entry {
                        spec,
                        ip: ip.to_string(),
                        verdict: Verdict::default(),
                    },
                );
            }
        }
    }

    /// The credentials `key` is probed with, if any.
    pub fn credentials(&self, key: &str) -> Option<(String, String)> {
        self.targets
            .lock()
            .expect("health targets lock")
            .get(key)
            .and_then(|e| e.spec.auth.clone())
    }

    pub fn remove(&self, key: &str) {
        self.targets
            .lock()
            .expect("health targets lock")
            .remove(key);
    }

    pub fn verdict(&self, key: &str) -> Option<Verdict> {
        self.targets
            .lock()
            .expect("health targets lock")
            .get(key)
            .map(|e| e.verdict.clone())
    }

    /// The verdict for `key` if it is being probed at exactly `proxy` (the address in the
    /// Proxy's status): a verdict about another address says nothing about this one.
    pub fn verdict_at(&self, key: &str, proxy: SocketAddr) -> Option<Verdict> {
        self.targets
            .lock()
            .expect("health targets lock")
            .get(key)
            .filter(|e| e.spec.proxy == proxy)
            .map(|e| e.verdict.clone())
    }

    /// Probes every registered proxy once, `concurrency` at a time, and folds the results
    /// into their verdicts. A proxy removed or re-addressed meanwhile keeps its new state.
    pub async fn round(&self) -> Vec<Report> {
        // Keys only: each probe's spec and address are copied when it starts. A copy of
        // every target up front was about 5 MiB at 10,000 proxies, held for every round.
        let keys: Vec<String> = self
            .targets
            .lock()
            .expect("health targets lock")
            .keys()
            .cloned()
            .collect();
        // At most `concurrency` probes exist at once, each its own task: spawning one task
        // per proxy up front (waiting on a semaphore) held every probe's future in memory
        // for the whole round, 12 MiB at 2,800 proxies.
        let limit = self.cfg.concurrency.max(1);
        let mut queue = keys.into_iter();
        let probe_one = |(key, spec, ip): (String, ProbeSpec, String)| {
            let span = tracing::debug_span!("health.probe", proxy = %key, addr = %spec.proxy);
            async move {
                let r = connect::probe(&spec, &ip).await;
                (key, spec.proxy, ip, r)
            }
            .instrument(span)
        };
        let mut set = tokio::task::JoinSet::new();
        // The next targets still registered, until `limit` probes run.
        let fill = |set: &mut tokio::task::JoinSet<_>, queue: &mut std::vec::IntoIter<String>| {
            while set.len() < limit {
                let Some(key) = queue.next() else { return };
                let job = {
                    let t = self.targets.lock().expect("health targets lock");
                    t.get(&key).map(|e| (e.spec.clone(), e.ip.clone()))
                };
                if let Some((spec, ip)) = job {
                    set.spawn(probe_one((key, spec, ip)));
                }
            }
        };
        fill(&mut set, &mut queue);
        let mut reports = Vec::new();
        while let Some(joined) = set.join_next().await {
            fill(&mut set, &mut queue);
            let Ok((key, proxy, ip, result)) = joined else {
                continue;
            };
            if let Some(m) = &self.metrics {
                match &result {
                    Ok(ok) => m.record("Healthy", Some(ok.latency)),
                    Err(e) => m.record(e.reason(), None),
                }
            }
            let mut t = self.targets.lock().expect("health targets lock");
            let Some(e) = t.get_mut(&key) else { continue };
            if e.ip != ip || e.spec.proxy != proxy {
                continue;
            }
            let before = e.verdict.reason.clone();
            let flipped = e.verdict.observe(&result, self.cfg.thresholds);
            let changed = flipped || e.verdict.reason != before;
            let at = SystemTime::now();
            e.verdict.probed_at = Some(at);
            if flipped {
                tracing::info!(proxy = %key, healthy = e.verdict.healthy, reason = %e.verdict.reason, "health changed");
            }
            reports.push(Report {
                key,
                verdict: e.verdict.clone(),
                changed,
                flipped,
                at,
            });
        }
        reports.sort_by(|a, b| a.key.cmp(&b.key));
        reports
    }

    /// Runs rounds every `interval` until cancelled, giving each report to `sink`.
    pub async fn run(self: Arc<Self>, cancel: CancellationToken, sink: impl Fn(Report)) {
        let mut tick = tokio::time::interval(self.cfg.interval);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = cancel.cancelled() => return,
                _ = tick.tick() => {}
            }
            tokio::select! {
                _ = cancel.cancelled() => return,
                reports = self.round() => reports.into_iter().for_each(&sink),
            }
        }
    }
}
