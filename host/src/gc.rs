//! Orphan GC: deletes backend instances whose Proxy no longer exists.
//!
//! Instances leak when the operator loses track of them: a crash between Create and the
//! status write of a Proxy that is then deleted, a Proxy force-deleted without its
//! finalizer, a released skip-cleanup Proxy. GC finds them through the marks every
//! instance carries (ListByTag, for this installation only) and deletes those whose UID
//! belongs to no live Proxy.
//!
//! Three rules keep it from deleting what it must not: an instance younger than MinAge is
//! left alone (its Proxy may be newer than the live set, or its ID not yet recorded), an
//! instance without a UID is never touched (it cannot be proven to be an orphan), and a
//! provider whose list fails is skipped for the round (a partial list proves nothing).
//! If the live set itself cannot be read, nothing is deleted at all.

use crate::api::Proxy;
use crate::inventory::Inventory;
use crate::registry::ProviderRegistry;
use egress_plugin_host::provider::Priority;
use egress_plugin_host::provider::{Class, Instance, Provider};
use kube::ResourceExt;
use kube::api::Api;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::registry::Registry;
use std::collections::HashSet;
use std::sync::Arc;
use std::time::{Duration, SystemTime};
use tracing::{Instrument, debug, info, info_span, warn};

/// How GC runs.
#[derive(Debug, Clone)]
pub struct GcSettings {
    /// Time between sweeps.
    pub interval: Duration,
    /// Instances younger than this are never deleted.
    pub min_age: Duration,
    /// Only this installation's instances are listed (see [`crate::installation`]).
    pub installation: String,
}

impl GcSettings {
    pub fn new(installation: impl Into<String>) -> Self {
        GcSettings {
            interval: Duration::from_secs(600),
            min_age: Duration::from_secs(600),
            installation: installation.into(),
        }
    }
}

/// What a sweep does with one listed instance.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// An orphan past MinAge.
    Delete,
    /// Its Proxy exists.
    KeepLive,
    /// Younger than MinAge (or created "in the future", by a skewed clock).
    KeepYoung,
    /// No UID in its marks: it cannot be shown to be an orphan.
    KeepNoUid,
}

/// The verdict for one instance, given the UIDs of every live Proxy.
pub fn verdict(
    instance: &Instance,
    live: &HashSet<String>,
    now: SystemTime,
    min_age: Duration,
) -> Verdict {
    if instance.uid.is_empty() {
        return Verdict::KeepNoUid;
    }
    if live.contains(&instance.uid) {
        return Verdict::KeepLive;
    }
    // A missing creation time counts as old: an instance must not be shielded from GC
    // forever because its backend cannot say when it was made.
    match instance.created_at.map(|t| now.duration_since(t)) {
        None => Verdict::Delete,
        Some(Ok(age)) if age > min_age => Verdict::Delete,
        Some(_) => Verdict::KeepYoung,
    }
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ProviderLabels {
    pub provider: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct SkipLabels {
    pub provider: String,
    /// `list_failed`, `delete_failed`, `too_young` or `no_uid`.
    pub reason: String,
}

/// GC's counters.
#[derive(Clone, Default)]
pub struct GcMetrics {
    /// Instances listed and examined.
    pub swept: Family<ProviderLabels, Counter>,
    /// Orphans deleted.
    pub deleted: Family<ProviderLabels, Counter>,
    /// Orphan candidates left alone, and providers skipped for a round, by reason.
    pub skipped: Family<SkipLabels, Counter>,
}

impl GcMetrics {
    /// Registers `proxy_operator_gc_{swept,deleted,skipped}_total`.
    pub fn register(registry: &mut Registry) -> Self {
        let m = GcMetrics::default();
        registry.register(
            "proxy_operator_gc_swept",
            "Instances listed and examined by orphan GC, by provider",
            m.swept.clone(),
        );
        registry.register(
            "proxy_operator_gc_deleted",
            "Orphaned instances deleted by orphan GC, by provider",
            m.deleted.clone(),
        );
        registry.register(
            "proxy_operator_gc_skipped",
            "Instances (or whole providers, reason list_failed) orphan GC left alone, by provider and reason",
            m.skipped.clone(),
        );
        m
    }

    pub(crate) fn skip(&self, provider: &str, reason: &str) {
        self.skipped
            .get_or_create(&SkipLabels {
                provider: provider.to_string(),
                reason: reason.to_string(),
            })
            .inc();
    }

    pub(crate) fn provider(family: &Family<ProviderLabels, Counter>, provider: &str) {
        family
            .get_or_create(&ProviderLabels {
                provider: provider.to_string(),
            })
            .inc();
    }
}

/// One provider's share of a sweep.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ProviderSweep {
    pub provider: String,
    pub swept: usize,
    /// IDs deleted.
    pub deleted: Vec<String>,
    /// Set when ListByTag failed and the provider was skipped.
    pub list_error: Option<String>,
    pub delete_errors: usize,
}

/// A provider's instances as a sweep reads them: the inventory's list in place, or a list
/// of its own when there is no inventory.
enum Listed {
    Kept(Arc<crate::inventory::Listing>),
    Fresh(Vec<Instance>),
}

impl Listed {
    fn iter(&self) -> Box<dyn Iterator<Item = &Instance> + Send + '_> {
        match self {
            Listed::Kept(l) => Box::new(l.instances.values()),
            Listed::Fresh(v) => Box::new(v.iter()),
        }
    }
}

/// Why a sweep did not run.
#[derive(Debug, thiserror::Error)]
pub enum GcError {
    /// Without the full set of live Proxies nothing can be called an orphan.
    #[error("listing Proxies for the live set: {0}")]
    LiveSet(#[from] kube::Error),
}

/// Runs sweeps.
pub struct Sweeper {
    proxies: Api<Proxy>,
    registry: ProviderRegistry,
    settings: GcSettings,
    metrics: GcMetrics,
    /// Page size when listing Proxies.
    page_size: u32,
    /// The reconciler's lists, used instead of listing again while fresh.
    inventory: Option<Arc<Inventory>>,
}

impl Sweeper {
    pub fn new(
        client: kube::Client,
        registry: ProviderRegistry,
        settings: GcSettings,
        metrics: GcMetrics,
    ) -> Self {
        Sweeper {
            proxies: Api::all(client),
            registry,
            settings,
            metrics,
            page_size: crate::watched::LIST_PAGE,
            inventory: None,
        }
    }

    /// Reads each provider's instances from `inventory` while it holds a fresh list of
    /// them (see [`crate::inventory`]), and lists (and records the list there) otherwise.
    pub fn with_inventory(mut self, inventory: Arc<Inventory>) -> Self {
        self.inventory = Some(inventory);
        self
    }

    /// Sweeps every provider once, one after another.
    pub async fn sweep(&self) -> Result<Vec<ProviderSweep>, GcError> {
        let span = info_span!(
            "gc.sweep",
            installation = self.settings.installation.as_str()
        );
        async {
            // The live set is read before any new list: a Proxy created after this point
            // has instances younger than MinAge, which are kept anyway. A list from the
            // inventory may be older than the live set, which is safer still: every
            // instance in it existed, and so did its Proxy, before the live set was read.
            let live = self.live_uids().await?;
            let mut report = Vec::new();
            for (name, provider) in self.registry.snapshot().iter() {
                let one = self
                    .sweep_provider(name, provider, &live)
                    .instrument(info_span!("gc.provider", provider.name = name.as_str()))
                    .await;
                report.push(one);
            }
            let deleted: usize = report.iter().map(|r| r.deleted.len()).sum();
            info!(live = live.len(), deleted, "sweep done");
            Ok(report)
        }
        .instrument(span)
        .await
    }

    /// The UIDs of every Proxy, read as metadata only and in the watches' small pages
    /// ([`crate::watched::list_params`]): pages of 500 whole Proxies were about a megabyte
    /// each to receive and parse for 500 UIDs, every interval, and a tenant's Proxies with
    /// large annotations made a page of them 125 MiB.
    async fn live_uids(&self) -> Result<HashSet<String>, kube::Error> {
        let mut live = HashSet::new();
        let mut params = crate::watched::list_params().limit(self.page_size);
        loop {
            let page = self.proxies.list_metadata(&params).await?;
            live.extend(page.items.iter().filter_map(|p| p.uid()));
            match page.metadata.continue_.filter(|c| !c.is_empty()) {
                Some(token) => params = params.continue_token(&token),
                None => return Ok(live),
            }
        }
    }

    async fn sweep_provider(
        &self,
        name: &str,
        provider: &Arc<dyn Provider>,
        live: &HashSet<String>,
    ) -> ProviderSweep {
        let mut out = ProviderSweep {
            provider: name.to_string(),
            ..Default::default()
        };
        let listed = self
            .inventory
            .as_ref()
            .and_then(|inv| inv.listing(name, provider, SystemTime::now()));
        let at = SystemTime::now();
        // Read in place, never copied: the inventory's list of a large fleet is megabytes,
        // and a copy of it every interval was the largest thing the operator allocated.
        let result = match listed {
            Some(l) => {
                debug!(age = ?l.age(at), "instances from the inventory");
                Ok(Listed::Kept(l))
            }
            None => provider
                .list_by_tag_at(&self.settings.installation, Priority::Background)
                .await
                .map(|list| match &self.inventory {
                    Some(inv) => Listed::Kept(inv.record(name, provider, at, list)),
                    None => Listed::Fresh(list),
                }),
        };
        let instances = match result {
            Ok(listed) => listed,
            Err(e) => {
                warn!(error = %e, "listing failed; provider skipped this round");
                self.metrics.skip(name, "list_failed");
                out.list_error = Some(e.to_string());
                return out;
            }
        };
        let now = SystemTime::now();
        for instance in instances.iter() {
            out.swept += 1;
            GcMetrics::provider(&self.metrics.swept, name);
            match verdict(instance, live, now, self.settings.min_age) {
                Verdict::KeepLive => {}
                Verdict::KeepYoung => {
                    debug!(
                        provider.id = instance.id.as_str(),
                        uid = instance.uid.as_str(),
                        "orphan younger than MinAge kept"
                    );
                    self.metrics.skip(name, "too_young");
                }
                Verdict::KeepNoUid => {
                    warn!(
                        provider.id = instance.id.as_str(),
                        "instance without a UID mark; never collected"
                    );
                    self.metrics.skip(name, "no_uid");
                }
                Verdict::Delete => {
                    match provider.delete_at(&instance.id, Priority::Background).await {
                        Ok(()) => {
                            info!(
                                provider.id = instance.id.as_str(),
                                uid = instance.uid.as_str(),
                                "orphan deleted"
                            );
                            GcMetrics::provider(&self.metrics.deleted, name);
                            out.deleted.push(instance.id.clone());
                        }
                        Err(e) if e.class == Class::NotFound => {
                            GcMetrics::provider(&self.metrics.deleted, name);
                            out.deleted.push(instance.id.clone());
                        }
                        Err(e) => {
                            warn!(provider.id = instance.id.as_str(), error = %e, "deleting orphan failed; retried next round");
                            self.metrics.skip(name, "delete_failed");
                            out.delete_errors += 1;
                        }
                    }
                }
            }
        }
        out
    }

    /// Sweeps every Interval until `shutdown` resolves. The first sweep runs one Interval
    /// after start, so a restarting operator does not sweep before its reconciles ran.
    pub async fn run(self, shutdown: impl std::future::Future<Output = ()>) {
        let mut ticker = tokio::time::interval_at(
            tokio::time::Instant::now() + self.settings.interval,
            self.settings.interval,
        );
        ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        tokio::pin!(shutdown);
        loop {
            tokio::select! {
                _ = &mut shutdown => return,
                _ = ticker.tick() => {
                    if let Err(e) = self.sweep().await {
                        warn!(error = %e, "sweep skipped");
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::{CloudInit, ProxySpec};
    use crate::testing::fake_provider::FakeProvider;
    use egress_plugin_host::provider::{Op, State};
    use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
    use kube::api::PostParams;
    use prometheus_client::encoding::text::encode;
    use std::sync::Arc;

    const MIN: Duration = Duration::from_secs(600);

    fn inst(uid: &str, age: Option<i64>, now: SystemTime) -> Instance {
        let created_at = age.map(|secs| {
            if secs >= 0 {
                now - Duration::from_secs(secs as u64)
            } else {
                now + Duration::from_secs((-secs) as u64)
            }
        });
        Instance::new(&format!("fake/{uid}"), "", State::Running, uid, created_at)
    }

    #[test]
    fn verdict_table() {
        let now = SystemTime::UNIX_EPOCH + Duration::from_secs(1_800_000_000);
        let live: HashSet<String> = ["live".to_string()].into();
        for (name, i, want) in [
            (
                "orphan past MinAge",
                inst("gone", Some(601), now),
                Verdict::Delete,
            ),
            (
                "orphan exactly MinAge old is kept",
                inst("gone", Some(600), now),
                Verdict::KeepYoung,
            ),
            (
                "young orphan",
                inst("gone", Some(30), now),
                Verdict::KeepYoung,
            ),
            (
                "created in the future (clock skew)",
                inst("gone", Some(-30), now),
                Verdict::KeepYoung,
            ),
            (
                "missing CreatedAt counts as old",
                inst("gone", None, now),
                Verdict::Delete,
            ),
            (
                "live Proxy, old",
                inst("live", Some(99_999), now),
                Verdict::KeepLive,
            ),
            (
                "live Proxy, no CreatedAt",
                inst("live", None, now),
                Verdict::KeepLive,
            ),
            (
                "empty UID, old",
                inst("", Some(99_999), now),
                Verdict::KeepNoUid,
            ),
            (
                "empty UID, no CreatedAt",
                inst("", None, now),
                Verdict::KeepNoUid,
            ),
        ] {
            assert_eq!(verdict(&i, &live, now, MIN), want, "{name}");
        }
    }

    async fn cluster() -> (fake_kube::FakeApi, Api<Proxy>) {
        let api = fake_kube::FakeApi::new();
        let crds: Api<CustomResourceDefinition> = Api::all(api.client());
        for (_, crd) in crate::api::crds() {
            crds.create(&PostParams::default(), &crd).await.unwrap();
        }
        let proxies = Api::namespaced(api.client(), "default");
        (api, proxies)
    }

    async fn proxy(proxies: &Api<Proxy>, name: &str) -> String {
        let mut p = Proxy::new(
            name,
            ProxySpec {
                provider: "a".into(),
                placement: Default::default(),
                cloud_init: CloudInit {
                    inline: Some(String::new()),
                    secret_key_ref: None,
                },
                port: 3128,
                auth: Default::default(),
                ip_family: Default::default(),
            },
        );
        p.metadata.namespace = Some("default".into());
        proxies
            .create(&PostParams::default(), &p)
            .await
            .unwrap()
            .uid()
            .unwrap()
    }

    #[tokio::test]
    async fn sweep_deletes_only_old_orphans_of_this_installation() {
        let (api, proxies) = cluster().await;
        let live_uid = proxy(&proxies, "live").await;
        let old = SystemTime::now() - Duration::from_secs(3600);
        let young = SystemTime::now() - Duration::from_secs(60);
        let a = Arc::new(FakeProvider::new("a"));
        let b = Arc::new(FakeProvider::new("b"));
        let orphan = a.insert("proxy-orphan", "uid-gone", "me", Some(old));
        let orphan_no_time = b.insert("proxy-notime", "uid-gone-2", "me", None);
        a.insert("proxy-live", &live_uid, "me", Some(old));
        a.insert("proxy-young", "uid-new", "me", Some(young));
        a.insert("proxy-nouid", "", "me", Some(old));
        a.insert(
            "proxy-other",
            "uid-other-install",
            "someone-else",
            Some(old),
        );

        let mut registry = Registry::default();
        let metrics = GcMetrics::register(&mut registry);
        let reg = ProviderRegistry::new([a.clone() as Arc<dyn Provider>, b.clone()]);
        let sweeper = Sweeper::new(api.client(), reg, GcSettings::new("me"), metrics);
        let report = sweeper.sweep().await.unwrap();

        assert_eq!(report[0].provider, "a");
        assert_eq!(report[0].deleted, std::slice::from_ref(&orphan));
        assert_eq!(
            report[0].swept, 4,
            "the other installation's instance is not listed"
        );
        assert_eq!(report[1].deleted, [orphan_no_time]);
        let left: Vec<String> = a.instances().into_iter().map(|i| i.name).collect();
        assert_eq!(
            left,
            [
                "proxy-live",
                "proxy-nouid",
                "proxy-orphan",
                "proxy-other",
                "proxy-young"
            ],
            "the orphan is deleting (still listed until gone), nothing else was touched"
        );
        assert_eq!(a.instance(&orphan).unwrap().state, State::Terminated);
        assert_eq!(a.count_calls(Op::Delete), 1);

        let mut text = String::new();
        encode(&mut text, &registry).unwrap();
        for line in [
            r#"proxy_operator_gc_swept_total{provider="a"} 4"#,
            r#"proxy_operator_gc_deleted_total{provider="a"} 1"#,
            r#"proxy_operator_gc_deleted_total{provider="b"} 1"#,
            r#"proxy_operator_gc_skipped_total{provider="a",reason="too_young"} 1"#,
            r#"proxy_operator_gc_skipped_total{provider="a",reason="no_uid"} 1"#,
        ] {
            assert!(text.contains(line), "missing {line} in\n{text}");
        }
    }

    /// With the reconciler's inventory: a fresh list is used instead of listing again (its
    /// instances judged by the same rules), a stale one is not, and GC's own list then
    /// refreshes the inventory.
    #[tokio::test]
    async fn sweep_reads_a_fresh_inventory_instead_of_listing() {
        let (api, proxies) = cluster().await;
        let live_uid = proxy(&proxies, "live").await;
        let old = SystemTime::now() - Duration::from_secs(3600);
        let a = Arc::new(FakeProvider::new("a"));
        let orphan = a.insert("proxy-orphan", "uid-gone", "me", Some(old));
        a.insert("proxy-live", &live_uid, "me", Some(old));
        a.insert("proxy-young", "uid-new", "me", Some(SystemTime::now()));
        let a_dyn = a.clone() as Arc<dyn Provider>;
        let reg = ProviderRegistry::new([a_dyn.clone()]);
        let inventory = Arc::new(Inventory::new(Duration::from_secs(240)));
        let listed = a_dyn.list_by_tag("me").await.unwrap();
        inventory.record("a", &a_dyn, SystemTime::now(), listed);
        let lists = a.count_calls(Op::List);
        let sweeper = Sweeper::new(
            api.client(),
            reg.clone(),
            GcSettings::new("me"),
            GcMetrics::default(),
        )
        .with_inventory(inventory.clone());
        let report = sweeper.sweep().await.unwrap();
        assert_eq!(a.count_calls(Op::List), lists, "no list of its own");
        assert_eq!(report[0].swept, 3);
        assert_eq!(report[0].deleted, std::slice::from_ref(&orphan));
        assert_eq!(a.count_calls(Op::Delete), 1);

        // Stale (or from a provider since reloaded): GC lists itself and records it.
        let stale = Arc::new(Inventory::new(Duration::from_secs(240)));
        stale.record(
            "a",
            &a_dyn,
            SystemTime::now() - Duration::from_secs(600),
            vec![],
        );
        let sweeper = Sweeper::new(
            api.client(),
            reg,
            GcSettings::new("me"),
            GcMetrics::default(),
        )
        .with_inventory(stale.clone());
        let report = sweeper.sweep().await.unwrap();
        assert_eq!(a.count_calls(Op::List), lists + 1);
        assert_eq!(
            report[0].swept, 3,
            "the orphan is still listed while deleting"
        );
        assert!(
            stale
                .listing("a", &a_dyn, SystemTime::now())
                .is_some_and(|l| l.instances.len() == 3),
            "GC's list refreshed the inventory"
        );
    }

    #[tokio::test]
    async fn a_failing_list_skips_only_that_provider() {
        let (api, _) = cluster().await;
        let old = SystemTime::now() - Duration::from_secs(3600);
        let a = Arc::new(FakeProvider::new("a"));
        let b = Arc::new(FakeProvider::new("b"));
        a.insert("proxy-x", "gone-a", "me", Some(old));
        let in_b = b.insert("proxy-y", "gone-b", "me", Some(old));
        a.fail_next(Op::List, Class::Transient, 1);
        let mut registry = Registry::default();
        let metrics = GcMetrics::register(&mut registry);
        let reg = ProviderRegistry::new([a.clone() as Arc<dyn Provider>, b.clone()]);
        let sweeper = Sweeper::new(api.client(), reg, GcSettings::new("me"), metrics);
        let report = sweeper.sweep().await.unwrap();
        assert!(report[0].list_error.is_some());
        assert!(report[0].deleted.is_empty());
        assert_eq!(a.count_calls(Op::Delete), 0);
        assert_eq!(report[1].deleted, [in_b]);
        let mut text = String::new();
        encode(&mut text, &registry).unwrap();
        assert!(
            text.contains(
                r#"proxy_operator_gc_skipped_total{provider="a",reason="list_failed"} 1"#
            ),
            "{text}"
        );
    }

    #[tokio::test]
    async fn no_live_set_no_deletion() {
        let (api, _) = cluster().await;
        let a = Arc::new(FakeProvider::new("a"));
        a.insert("proxy-x", "gone", "me", None);
        api.inject_error(
            "list",
            "proxies",
            fake_kube::ApiError::new(503, "ServiceUnavailable", "try later"),
            1,
        );
        let reg = ProviderRegistry::new([a.clone() as Arc<dyn Provider>]);
        let sweeper = Sweeper::new(
            api.client(),
            reg,
            GcSettings::new("me"),
            GcMetrics::default(),
        );
        assert!(matches!(sweeper.sweep().await, Err(GcError::LiveSet(_))));
        assert!(a.calls().is_empty(), "not even listed");
    }

    #[tokio::test]
    async fn live_set_spans_pages_and_namespaces() {
        let (api, proxies) = cluster().await;
        let a = Arc::new(FakeProvider::new("a"));
        let old = SystemTime::now() - Duration::from_secs(3600);
        let mut uids = Vec::new();
        for i in 0..7 {
            uids.push(proxy(&proxies, &format!("p{i}")).await);
        }
        let other_ns: Api<Proxy> = Api::namespaced(api.client(), "kube-public");
        let mut p = Proxy::new(
            "elsewhere",
            ProxySpec {
                provider: "a".into(),
                placement: Default::default(),
                cloud_init: CloudInit {
                    inline: Some(String::new()),
                    secret_key_ref: None,
                },
                port: 1,
                auth: Default::default(),
                ip_family: Default::default(),
            },
        );
        p.metadata.namespace = Some("kube-public".into());
        uids.push(
            other_ns
                .create(&PostParams::default(), &p)
                .await
                .unwrap()
                .uid()
                .unwrap(),
        );
        for (i, uid) in uids.iter().enumerate() {
            a.insert(&format!("proxy-{i}"), uid, "me", Some(old));
        }
        let reg = ProviderRegistry::new([a.clone() as Arc<dyn Provider>]);
        let mut sweeper = Sweeper::new(
            api.client(),
            reg,
            GcSettings::new("me"),
            GcMetrics::default(),
        );
        // A small page size exercises the continue tokens.
        sweeper.page_size = 3;
        assert_eq!(sweeper.live_uids().await.unwrap().len(), 8);
        let report = sweeper.sweep().await.unwrap();
        assert!(report[0].deleted.is_empty(), "{report:?}");
        assert_eq!(report[0].swept, 8);
    }
}
