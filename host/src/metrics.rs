//! Every metric the operator serves on `/metrics`, registered in one place.
//!
//! Each loop owns its metric handles (so it can be tested alone); this module only decides
//! which of them a running operator exposes, and adds the gauges that are read off the
//! informer cache at scrape time rather than kept up to date by hand.

use crate::api::Proxy;
use crate::controller::ReconcileMetrics;
use crate::gc::GcMetrics;
use crate::probe::ProbeMetrics;
use crate::provider_check::MonitorMetrics;
use crate::reload::ReloadMetrics;
use egress_plugin_host::plugin::PluginMetrics;
use egress_plugin_host::provider::ProviderMetrics;
use kube::runtime::reflector::Store;
use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeLabelSet, EncodeMetric};
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

/// The handles of every metric family a running operator serves, plus its registry.
pub struct OperatorMetrics {
    pub registry: Registry,
    pub provider: ProviderMetrics,
    pub plugin: PluginMetrics,
    pub gc: GcMetrics,
    pub reconcile: ReconcileMetrics,
    pub health: ProbeMetrics,
    pub monitor: MonitorMetrics,
    pub reload: ReloadMetrics,
}

impl OperatorMetrics {
    /// Registers every family; `proxies` (the discovery cache) feeds the proxy gauges.
    pub fn new(proxies: Store<Proxy>) -> Self {
        let mut registry = Registry::default();
        let provider = ProviderMetrics::register(&mut registry);
        let plugin = PluginMetrics::register(&mut registry);
        let gc = GcMetrics::register(&mut registry);
        let reconcile = ReconcileMetrics::register(&mut registry);
        let health = ProbeMetrics::register(&mut registry);
        let monitor = MonitorMetrics::register(&mut registry);
        let reload = ReloadMetrics::register(&mut registry);
        registry.register_collector(Box::new(ProxyGauges { proxies }));
        OperatorMetrics {
            registry,
            provider,
            plugin,
            gc,
            reconcile,
            health,
            monitor,
            reload,
        }
    }

    /// The OpenMetrics text of every family.
    pub fn encode(&self) -> Result<String, std::fmt::Error> {
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &self.registry)?;
        Ok(text)
    }
}

/// Every family `/metrics` serves: (name, type, labels). Dashboards and alerts
/// (`config/monitoring/alerts.yaml`) are written against these; tests hold both to it.
pub const FAMILIES: &[(&str, &str, &[&str])] = &[
    (
        "proxy_operator_provider_requests",
        "counter",
        &["provider", "op", "result"],
    ),
    (
        "proxy_operator_plugin_call_duration_seconds",
        "histogram",
        &["provider", "op"],
    ),
    (
        "proxy_operator_plugin_call_fuel",
        "histogram",
        &["provider", "op"],
    ),
    (
        "proxy_operator_plugin_call_memory_bytes",
        "histogram",
        &["provider", "op"],
    ),
    (
        "proxy_operator_plugin_traps",
        "counter",
        &["provider", "op", "kind"],
    ),
    (
        "proxy_operator_plugin_http_requests",
        "counter",
        &["provider", "priority"],
    ),
    (
        "proxy_operator_plugin_slot_wait_seconds",
        "histogram",
        &["provider", "priority"],
    ),
    (
        "proxy_operator_plugin_budget_wait_seconds",
        "histogram",
        &["provider", "priority"],
    ),
    (
        "proxy_operator_plugin_budget_tokens",
        "gauge",
        &["provider"],
    ),
    (
        "proxy_operator_plugin_http_rate_limited",
        "counter",
        &["provider"],
    ),
    ("proxy_operator_reconciles", "counter", &["result"]),
    (
        "proxy_operator_instance_interruptions",
        "counter",
        &["provider"],
    ),
    (
        "proxy_operator_cost_per_hour",
        "gauge",
        &["provider", "placement", "capacity", "currency"],
    ),
    (
        "proxy_operator_reconcile_duration_seconds",
        "histogram",
        &["result"],
    ),
    (
        "proxy_operator_proxies",
        "gauge",
        &["provider", "state", "ready"],
    ),
    ("proxy_operator_gc_swept", "counter", &["provider"]),
    ("proxy_operator_gc_deleted", "counter", &["provider"]),
    (
        "proxy_operator_gc_skipped",
        "counter",
        &["provider", "reason"],
    ),
    ("proxy_operator_health_probes", "counter", &["result"]),
    (
        "proxy_operator_health_probe_duration_seconds",
        "histogram",
        &[],
    ),
    (
        "proxy_operator_provider_target_up",
        "gauge",
        &["provider", "target"],
    ),
    (
        "proxy_operator_provider_check_duration_seconds",
        "gauge",
        &["provider"],
    ),
    (
        "proxy_operator_provider_check_timestamp_seconds",
        "gauge",
        &["provider"],
    ),
    ("proxy_operator_provider_reloads", "counter", &["provider"]),
    (
        "proxy_operator_provider_reload_errors",
        "counter",
        &["provider", "reason"],
    ),
];

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ProxyLabels {
    pub provider: String,
    /// The instance's last observed state, or `Pending` before the first one.
    pub state: String,
    /// Whether the discovery API hands the Proxy out (`true` / `false`).
    pub ready: String,
}

/// `proxy_operator_proxies{provider,state,ready}`, counted from the informer cache at each
/// scrape: always consistent with what the discovery API serves, never a stale series for
/// a provider nobody uses any more, and served by every replica (not only the leader).
#[derive(Debug)]
struct ProxyGauges {
    proxies: Store<Proxy>,
}

/// Counts Proxies by provider, state and readiness. Pure.
pub fn proxy_counts<'a>(
    proxies: impl IntoIterator<Item = &'a Proxy>,
) -> std::collections::BTreeMap<(String, String, bool), i64> {
    let mut counts = std::collections::BTreeMap::new();
    for p in proxies {
        let state = p
            .status
            .as_ref()
            .and_then(|s| s.state.clone())
            .unwrap_or_else(|| "Pending".to_string());
        let ready = crate::discovery::view::readiness(p).is_ok();
        *counts
            .entry((p.spec.provider.clone(), state, ready))
            .or_insert(0) += 1;
    }
    counts
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct CostLabels {
    pub provider: String,
    /// `region/zone/machineType`: the placement's price-relevant part, as many series as
    /// the placements the users wrote.
    pub placement: String,
    /// `OnDemand` or `Spot`.
    pub capacity: String,
    pub currency: String,
}

/// What the running instances cost per hour, summed by provider, placement, capacity and
/// currency, in units of the currency (from each Proxy's `status.hourlyPrice`). Pure.
pub fn costs<'a>(
    proxies: impl IntoIterator<Item = &'a Proxy>,
) -> std::collections::BTreeMap<(String, String, String, String), u64> {
    let mut sums = std::collections::BTreeMap::new();
    for p in proxies {
        if p.metadata.deletion_timestamp.is_some() {
            continue;
        }
        let Some(price) = p.status.as_ref().and_then(|s| s.hourly_price.as_ref()) else {
            continue;
        };
        let Some(micros) = price.micros() else {
            continue;
        };
        let pl = &p.spec.placement;
        let key = (
            p.spec.provider.clone(),
            format!("{}/{}/{}", pl.region, pl.zone, pl.machine_type),
            format!("{:?}", pl.capacity),
            price.currency.clone(),
        );
        let sum: &mut u64 = sums.entry(key).or_insert(0);
        *sum = sum.saturating_add(micros);
    }
    sums
}

impl Collector for ProxyGauges {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let snapshot = self.proxies.state();
        let cost = Family::<CostLabels, Gauge<f64, std::sync::atomic::AtomicU64>>::default();
        for ((provider, placement, capacity, currency), micros) in
            costs(snapshot.iter().map(AsRef::as_ref))
        {
            cost.get_or_create(&CostLabels {
                provider,
                placement,
                capacity,
                currency,
            })
            .set(micros as f64 / 1_000_000.0);
        }
        let metric = encoder.encode_descriptor(
            "proxy_operator_cost_per_hour",
            "What the running instances cost per hour, in units of the currency, by provider, placement, capacity and currency",
            None,
            cost.metric_type(),
        )?;
        cost.encode(metric)?;
        let family = Family::<ProxyLabels, Gauge>::default();
        for ((provider, state, ready), n) in proxy_counts(snapshot.iter().map(AsRef::as_ref)) {
            family
                .get_or_create(&ProxyLabels {
                    provider,
                    state,
                    ready: ready.to_string(),
                })
                .set(n);
        }
        let metric = encoder.encode_descriptor(
            "proxy_operator_proxies",
            "Proxies by provider, instance state (Pending before the first) and whether they are Ready",
            None,
            family.metric_type(),
        )?;
        family.encode(metric)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::{ProxySpec, ProxyStatus};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
    use kube::runtime::reflector::store;
    use kube::runtime::watcher::Event;
    use std::collections::BTreeSet;

    fn proxy(name: &str, provider: &str, state: Option<&str>, ready: bool) -> Proxy {
        let mut p = Proxy::new(
            name,
            ProxySpec {
                provider: provider.into(),
                placement: Default::default(),
                cloud_init: Default::default(),
                port: 3128,
                auth: Default::default(),
                ip_family: Default::default(),
            },
        );
        p.metadata.namespace = Some("ns".into());
        p.metadata.uid = Some(format!("uid-{name}"));
        p.metadata.generation = Some(1);
        if let Some(state) = state {
            p.status = Some(ProxyStatus {
                state: Some(state.into()),
                ip: Some("192.0.2.1".into()),
                port: Some(3128),
                observed_generation: Some(1),
                conditions: vec![Condition {
                    type_: "Ready".into(),
                    status: if ready { "True" } else { "False" }.into(),
                    reason: if ready { "Ready" } else { "NotHealthy" }.into(),
                    message: String::new(),
                    observed_generation: Some(1),
                    last_transition_time: Time(k8s_openapi::jiff::Timestamp::UNIX_EPOCH),
                }],
                ..ProxyStatus::default()
            });
        }
        p
    }

    #[test]
    fn proxies_are_counted_by_provider_state_and_readiness() {
        let ps = [
            proxy("a", "ec2", Some("Running"), true),
            proxy("b", "ec2", Some("Running"), true),
            proxy("c", "ec2", Some("Running"), false),
            proxy("d", "hetzner", Some("Provisioning"), false),
            proxy("e", "hetzner", None, false),
        ];
        let counts = proxy_counts(&ps);
        let want = [
            (("ec2", "Running", false), 1),
            (("ec2", "Running", true), 2),
            (("hetzner", "Pending", false), 1),
            (("hetzner", "Provisioning", false), 1),
        ]
        .map(|((p, s, r), n)| ((p.to_string(), s.to_string(), r), n));
        assert_eq!(counts, want.into_iter().collect());
    }

    /// The names, types and label sets of every family `/metrics` serves: what dashboards
    /// and alerts are written against. A rename or a dropped label fails here first.
    #[tokio::test]
    async fn every_family_is_served_with_its_labels() {
        let (reader, mut writer) = store::<Proxy>();
        writer.apply_watcher_event(&Event::Init);
        writer.apply_watcher_event(&Event::InitApply(proxy("a", "ec2", Some("Running"), true)));
        for name in ["b", "c"] {
            let mut p = proxy(name, "ec2", Some("Running"), true);
            p.spec.placement =
                crate::api::Placement::new("eu-west-1", "eu-west-1a", "t3.micro", "ami");
            p.status.as_mut().unwrap().hourly_price = Some(crate::api::HourlyPrice {
                currency: "USD".into(),
                per_hour: "0.0104".into(),
            });
            writer.apply_watcher_event(&Event::InitApply(p));
        }
        writer.apply_watcher_event(&Event::InitDone);
        let m = OperatorMetrics::new(reader);
        feed_one_of_each(&m);
        let text = m.encode().unwrap();

        let want = FAMILIES;
        let mut missing = Vec::new();
        for (name, kind, labels) in want {
            if !text.contains(&format!("# TYPE {name} {kind}\n")) {
                missing.push(format!("# TYPE {name} {kind}"));
                continue;
            }
            let series = series_labels(&text, name, kind);
            let want: BTreeSet<String> = labels.iter().map(|l| l.to_string()).collect();
            if series != want {
                missing.push(format!("{name}: labels {series:?}, want {want:?}"));
            }
        }
        let served: BTreeSet<&str> = text
            .lines()
            .filter_map(|l| l.strip_prefix("# TYPE "))
            .filter_map(|l| l.split(' ').next())
            .collect();
        let known: BTreeSet<&str> = want.iter().map(|w| w.0).collect();
        let extra: Vec<_> = served.difference(&known).collect();
        assert!(
            missing.is_empty() && extra.is_empty(),
            "metrics differ from the documented set.\nmissing or wrong: {missing:#?}\nnot in the list: {extra:?}\n\n{text}"
        );
        assert!(
            text.contains(
                "proxy_operator_proxies{provider=\"ec2\",state=\"Running\",ready=\"true\"} 3"
            ),
            "{text}"
        );
        // Two instances of 0.0104 USD an hour: the fleet's cost, summed by placement.
        assert!(
            text.contains(
                "proxy_operator_cost_per_hour{provider=\"ec2\",placement=\"eu-west-1/eu-west-1a/t3.micro\",capacity=\"OnDemand\",currency=\"USD\"} 0.0208"
            ),
            "{text}"
        );
    }

    /// Every `proxy_operator_*` metric `text` names, checked against what the operator
    /// serves: the family exists and each label matcher right after the name is one of its
    /// labels. Returns how many names it checked.
    fn check_metric_names(path: &str, text: &str) -> usize {
        let mut used = 0;
        for (i, _) in text.match_indices("proxy_operator_") {
            let name: String = text[i..]
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                .collect();
            let family = ["_total", "_count", "_sum", "_bucket"]
                .iter()
                .find_map(|s| name.strip_suffix(s))
                .unwrap_or(&name);
            let Some((_, _, labels)) = FAMILIES.iter().find(|f| f.0 == family) else {
                panic!("{path} uses {name}, which /metrics does not serve");
            };
            // Label matchers right after the name: {a="x",b!="y"} (JSON escapes the quotes).
            let rest = &text[i + name.len()..];
            if let Some(matchers) = rest.strip_prefix('{').and_then(|r| r.split('}').next()) {
                for m in matchers.split(',') {
                    let label = m.split(['=', '!', '~']).next().unwrap().trim();
                    assert!(
                        labels.contains(&label),
                        "{path}: {name} has no label {label:?} (it has {labels:?})"
                    );
                }
            }
            used += 1;
        }
        used
    }

    /// The shipped alert rules and dashboard name only metrics the operator serves, with
    /// their labels; every dashboard panel queries something.
    #[test]
    fn the_alert_rules_and_the_dashboard_use_served_metrics_and_labels() {
        let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/../config/monitoring/");
        let alerts = format!("{dir}alerts.yaml");
        let text = std::fs::read_to_string(&alerts).unwrap();
        let used = check_metric_names(&alerts, &text);
        assert!(used >= 5, "only {used} metrics found in {alerts}");

        let dashboard = format!("{dir}dashboard.json");
        let text = std::fs::read_to_string(&dashboard).unwrap();
        let json: serde_json::Value = serde_json::from_str(&text).unwrap();
        let panels = json["panels"].as_array().unwrap();
        for p in panels {
            let exprs: Vec<&str> = (p["targets"].as_array().unwrap().iter())
                .filter_map(|t| t["expr"].as_str())
                .collect();
            assert!(
                !exprs.is_empty(),
                "{dashboard}: panel {} queries nothing",
                p["title"]
            );
            for e in exprs {
                assert!(
                    check_metric_names(&dashboard, e) >= 1,
                    "{dashboard}: panel {}: {e} names no operator metric",
                    p["title"]
                );
            }
        }
        // The families an operator is run by: each on some panel.
        for family in [
            "proxy_operator_proxies",
            "proxy_operator_cost_per_hour",
            "proxy_operator_instance_interruptions",
            "proxy_operator_plugin_call_duration_seconds",
            "proxy_operator_plugin_budget_tokens",
            "proxy_operator_reconcile_duration_seconds",
            "proxy_operator_health_probes",
            "proxy_operator_gc_deleted",
        ] {
            assert!(
                text.contains(family),
                "{dashboard} has no panel on {family}"
            );
        }
        let docs = concat!(env!("CARGO_MANIFEST_DIR"), "/../docs/architecture.md");
        let docs = std::fs::read_to_string(docs).unwrap();
        for (name, _, _) in FAMILIES {
            assert!(
                docs.contains(&format!("`{name}")),
                "docs/architecture.md does not list {name}"
            );
        }
    }

    /// Label names of the first sample of `name` (counters get `_total`, histograms
    /// `_count`), without the histogram's own `le`.
    fn series_labels(text: &str, name: &str, kind: &str) -> BTreeSet<String> {
        let sample = match kind {
            "counter" => format!("{name}_total"),
            "histogram" => format!("{name}_count"),
            _ => name.to_string(),
        };
        let line = text
            .lines()
            .find(|l| l.starts_with(&format!("{sample}{{")) || l.starts_with(&format!("{sample} ")))
            .unwrap_or_else(|| panic!("no sample of {name} in:\n{text}"));
        let Some(inner) = line
            .strip_prefix(&format!("{sample}{{"))
            .and_then(|l| l.split('}').next())
        else {
            return BTreeSet::new();
        };
        inner
            .split(',')
            .filter_map(|kv| kv.split('=').next())
            .map(str::to_string)
            .collect()
    }

    /// One observation through each family's own recording code, so that every labelled
    /// family has a sample to read its labels from.
    fn feed_one_of_each(m: &OperatorMetrics) {
        use crate::provider_check::{CheckOutcome, Monitor, ProviderCheck};
        use std::time::{Duration, SystemTime};
        m.provider.count("ec2", "create", "ok");
        m.plugin.observe(
            "ec2",
            "create",
            Duration::from_millis(3),
            1_000_000,
            2 << 20,
            Some(egress_plugin_host::plugin::TrapKind::Limit(
                egress_plugin_host::plugin::limits::LimitHit::Fuel,
            )),
        );
        m.plugin
            .budget()
            .granted("ec2", "urgent", Duration::from_millis(1), 99.0);
        m.plugin.budget().rate_limited("ec2");
        m.plugin
            .slot_waited("ec2", "urgent", Duration::from_millis(1));
        m.reconcile.observe(
            &Ok(kube::runtime::controller::Action::await_change()),
            Duration::from_millis(5),
        );
        m.reconcile.interrupted("ec2");
        GcMetrics::provider(&m.gc.swept, "ec2");
        GcMetrics::provider(&m.gc.deleted, "ec2");
        m.gc.skip("ec2", "too_young");
        m.health.record("Healthy", Some(Duration::from_millis(2)));
        Monitor::new(Duration::from_secs(1), m.monitor.clone()).record(&ProviderCheck {
            provider: "ec2".into(),
            outcome: CheckOutcome::Checked(vec![egress_plugin_host::provider::TargetStatus {
                target: "eu-central-1".into(),
                ready: true,
                reason: "Reachable".into(),
                message: String::new(),
                details: Vec::new(),
            }]),
            checked_at: SystemTime::now(),
            duration: Duration::from_millis(40),
        });
        m.reload.loaded("ec2");
        m.reload.failed("ec2", crate::reload::Reason::Timeout);
    }
}
