//! Reloading providers without a restart, when the mounted providers file or a plugin file
//! changes.
//!
//! Kubernetes updates a ConfigMap mount by swapping a symlink, which file-event watchers
//! see as a create/delete dance on hidden paths; so this polls content hashes instead (a
//! few hundred KiB per plugin, every few seconds, is nothing). Only providers whose entry
//! or plugin changed are rebuilt. A new version that fails to load or validate leaves the
//! old one serving, and the error is kept for status and metrics until a later change
//! loads cleanly.
//!
//! [`Reloader::run`] is the loop every replica runs: it polls, and hands what serves to
//! [`Serving`], the one place that updates the provider registry the other loops read and
//! the load report `/readyz` and the `ProviderHealth` objects show.

use crate::config::{Budget, ProviderEntry, ProvidersFile};
use crate::endpoints::{ProviderLoad, Readiness};
use crate::plugin::{Runtime, WasmProvider};
use crate::provider::{Instrumented, Provider, ProviderMetrics};
use crate::registry::{Entry, ProviderRegistry};
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::registry::Registry;
use sha2::{Digest, Sha256};
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;
use tokio_util::sync::CancellationToken;

/// What to do with each provider after a change on disk.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Plan {
    /// Entry and plugin unchanged: keep the running provider.
    pub keep: Vec<String>,
    /// New, or its entry or plugin changed: (re)build.
    pub load: Vec<String>,
    /// No longer in the file.
    pub remove: Vec<String>,
}

/// What a running provider was built from.
#[derive(Debug, Clone, PartialEq)]
pub struct Source {
    pub entry: ProviderEntry,
    /// sha256 of the plugin file.
    pub plugin_sha: String,
}

/// Decides per provider; pure, so every combination is a table row in the tests.
/// `shas` maps plugin file names to their digests (a missing file has no digest).
pub fn plan(
    current: &BTreeMap<String, Source>,
    file: &ProvidersFile,
    shas: &BTreeMap<String, String>,
) -> Plan {
    let mut p = Plan::default();
    for entry in &file.providers {
        let same = current
            .get(&entry.name)
            .is_some_and(|s| s.entry == *entry && shas.get(&entry.plugin) == Some(&s.plugin_sha));
        if same {
            p.keep.push(entry.name.clone());
        } else {
            p.load.push(entry.name.clone());
        }
    }
    let wanted: BTreeSet<&str> = file.providers.iter().map(|e| e.name.as_str()).collect();
    p.remove = current
        .keys()
        .filter(|n| !wanted.contains(n.as_str()))
        .cloned()
        .collect();
    p
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ProviderLabel {
    provider: String,
}

/// `proxy_operator_provider_reloads_total{provider}` and
/// `proxy_operator_provider_reload_errors_total{provider}` (`provider=""` for the file).
#[derive(Clone, Default)]
pub struct ReloadMetrics {
    reloads: Family<ProviderLabel, Counter>,
    errors: Family<ProviderLabel, Counter>,
}

impl ReloadMetrics {
    pub fn register(registry: &mut Registry) -> Self {
        let m = ReloadMetrics::default();
        registry.register(
            "proxy_operator_provider_reloads",
            "Providers rebuilt after their entry or plugin changed",
            m.reloads.clone(),
        );
        registry.register(
            "proxy_operator_provider_reload_errors",
            "Reloads that failed (the previous version, if any, keeps serving); provider=\"\" for an unreadable providers file",
            m.errors.clone(),
        );
        m
    }

    pub(crate) fn loaded(&self, provider: &str) {
        self.reloads
            .get_or_create(&ProviderLabel {
                provider: provider.into(),
            })
            .inc();
    }

    pub(crate) fn failed(&self, provider: &str) {
        self.errors
            .get_or_create(&ProviderLabel {
                provider: provider.into(),
            })
            .inc();
    }

    pub fn errors(&self, provider: &str) -> u64 {
        self.errors
            .get_or_create(&ProviderLabel {
                provider: provider.into(),
            })
            .get()
    }
}

/// The outcome of a poll that found a change.
#[derive(Debug, Default)]
pub struct Change {
    pub loaded: Vec<String>,
    pub removed: Vec<String>,
    /// Providers whose new version failed, with why; the old one (if any) still serves.
    pub failed: BTreeMap<String, String>,
}

pub struct Reloader {
    rt: Arc<Runtime>,
    plugin_dir: PathBuf,
    providers_file: PathBuf,
    metrics: ReloadMetrics,
    running: BTreeMap<String, (Source, Arc<WasmProvider>)>,
    /// What was on disk at the last poll, to tell "changed" from "still broken".
    seen: Option<(String, BTreeMap<String, String>)>,
    errors: BTreeMap<String, String>,
    /// What a providers file must fit (config::fit); a file that does not is refused.
    budget: Budget,
}

impl Reloader {
    pub fn new(
        rt: Arc<Runtime>,
        plugin_dir: &Path,
        providers_file: &Path,
        metrics: ReloadMetrics,
    ) -> Self {
        Reloader {
            rt,
            plugin_dir: plugin_dir.to_path_buf(),
            providers_file: providers_file.to_path_buf(),
            metrics,
            running: BTreeMap::new(),
            seen: None,
            errors: BTreeMap::new(),
            budget: Budget::default(),
        }
    }

    /// Refuses a providers file that does not fit `budget` (config::fit), like one that
    /// does not parse: every provider keeps its current version. Default: no budget known,
    /// nothing checked.
    pub fn with_budget(mut self, budget: Budget) -> Self {
        self.budget = budget;
        self
    }

    /// The providers serving now, by name.
    pub fn providers(&self) -> BTreeMap<String, Arc<WasmProvider>> {
        self.running
            .iter()
            .map(|(n, (_, p))| (n.clone(), p.clone()))
            .collect()
    }

    /// The last load error per provider (`""` for the providers file itself), cleared when
    /// a later version loads.
    pub fn errors(&self) -> &BTreeMap<String, String> {
        &self.errors
    }

    /// Reads the file and plugin digests; when anything differs from the last poll, applies
    /// the [`plan`]. `None` when nothing changed on disk.
    pub async fn poll(&mut self) -> Option<Change> {
        let text = match std::fs::read_to_string(&self.providers_file) {
            Ok(t) => t,
            Err(e) => {
                let why = format!("reading {}: {e}", self.providers_file.display());
                return self.file_error(String::new(), why);
            }
        };
        let shas = plugin_digests(&self.plugin_dir, self.rt.max_plugin_bytes());
        if self
            .seen
            .as_ref()
            .is_some_and(|(t, s)| *t == text && *s == shas)
        {
            return None;
        }
        self.seen = Some((text.clone(), shas.clone()));
        let file = match ProvidersFile::parse(&text) {
            Ok(f) => f,
            Err(e) => {
                let why = format!("{}: {e}", self.providers_file.display());
                return self.file_error(text, why);
            }
        };
        if let Err(e) = crate::config::fit::check(&file, &self.budget) {
            let why = format!("{}: {e}", self.providers_file.display());
            return self.file_error(text, why);
        }
        self.errors.remove("");
        let current: BTreeMap<String, Source> = self
            .running
            .iter()
            .map(|(n, (s, _))| (n.clone(), s.clone()))
            .collect();
        let plan = plan(&current, &file, &shas);
        let mut change = Change::default();
        for name in &plan.keep {
            // Back to what is running (a broken edit reverted): nothing is wrong any more.
            self.errors.remove(name);
        }
        for name in &plan.remove {
            self.running.remove(name);
            self.errors.remove(name);
            tracing::info!(provider = %name, "provider removed from the providers file");
            change.removed.push(name.clone());
        }
        for name in &plan.load {
            let entry = file
                .providers
                .iter()
                .find(|e| &e.name == name)
                .expect("planned from this file");
            match self.build(entry, &shas).await {
                Ok((source, p)) => {
                    let replaced = self.running.insert(name.clone(), (source, Arc::new(p)));
                    self.errors.remove(name);
                    self.metrics.loaded(name);
                    tracing::info!(provider = %name, replaced = replaced.is_some(), "provider loaded");
                    change.loaded.push(name.clone());
                }
                Err(why) => {
                    self.metrics.failed(name);
                    let keeps = self.running.contains_key(name);
                    tracing::error!(provider = %name, error = %why, previous_version_serving = keeps, "provider not reloaded");
                    self.errors.insert(name.clone(), why.clone());
                    change.failed.insert(name.clone(), why);
                }
            }
        }
        Some(change)
    }

    /// Polls every `interval` (the first poll is the caller's, before the other loops
    /// start) until `cancel`, and publishes every change to `serving`.
    pub async fn run(mut self, interval: Duration, cancel: CancellationToken, serving: Serving) {
        let mut tick = tokio::time::interval(interval);
        tick.tick().await;
        loop {
            tokio::select! {
                _ = cancel.cancelled() => return,
                _ = tick.tick() => {}
            }
            if let Some(change) = self.poll().await {
                serving.publish(&self, &change);
            }
        }
    }

    fn file_error(&mut self, text: String, why: String) -> Option<Change> {
        let again = self.errors.get("") == Some(&why);
        self.seen = Some((text, BTreeMap::new()));
        if again {
            return None;
        }
        self.metrics.failed("");
        tracing::error!(error = %why, "providers file not reloaded; every provider keeps its current version");
        self.errors.insert(String::new(), why.clone());
        Some(Change {
            failed: [(String::new(), why)].into(),
            ..Change::default()
        })
    }

    async fn build(
        &self,
        entry: &ProviderEntry,
        shas: &BTreeMap<String, String>,
    ) -> Result<(Source, WasmProvider), String> {
        let sha = shas.get(&entry.plugin).ok_or_else(|| {
            format!(
                "provider {:?}: plugin file {:?} is not in {}",
                entry.name,
                entry.plugin,
                self.plugin_dir.display()
            )
        })?;
        let plugin = self
            .rt
            .load_plugin(&self.plugin_dir.join(&entry.plugin))
            .await
            .map_err(|e| format!("provider {:?}: {e}", entry.name))?;
        // The file may have changed between hashing and loading; record what was loaded.
        let plugin_sha = if plugin.sha256 == *sha {
            sha.clone()
        } else {
            plugin.sha256.clone()
        };
        let p = self
            .rt
            .provider(plugin, entry)
            .await
            .map_err(|e| e.to_string())?;
        Ok((
            Source {
                entry: entry.clone(),
                plugin_sha,
            },
            p,
        ))
    }
}

/// Where the reloader's results go: the registry the reconciler, GC, inventory and
/// provider checks read, and the readiness `/readyz` reports (its load errors also feed
/// the `ProviderHealth` objects).
#[derive(Clone)]
pub struct Serving {
    pub registry: ProviderRegistry,
    pub readiness: Readiness,
    /// Every provider in the registry is wrapped in [`Instrumented`] with these.
    pub metrics: ProviderMetrics,
}

impl Serving {
    /// A registry of what `reloader` serves now (after its first poll), and readiness set
    /// to match.
    pub fn first(reloader: &Reloader, readiness: Readiness, metrics: ProviderMetrics) -> Self {
        let registry = ProviderRegistry::with_entries(entries(reloader, &metrics));
        readiness.set_providers(load(reloader));
        Serving {
            registry,
            readiness,
            metrics,
        }
    }

    /// After a poll that found a change: the load report always; the registry's set only
    /// when a provider was built or removed (a failed reload leaves the old version, and
    /// announcing a swap would re-run every Proxy for nothing).
    pub fn publish(&self, reloader: &Reloader, change: &Change) {
        self.readiness.set_providers(load(reloader));
        if !change.loaded.is_empty() || !change.removed.is_empty() {
            self.registry
                .replace_entries(entries(reloader, &self.metrics));
        }
    }
}

/// Which providers serve and which failed, as `/readyz` reports it.
fn load(reloader: &Reloader) -> ProviderLoad {
    ProviderLoad {
        serving: reloader.providers().into_keys().collect(),
        errors: reloader.errors().clone(),
    }
}

/// The serving providers as registry entries: instrumented, with their plugin types.
fn entries(reloader: &Reloader, metrics: &ProviderMetrics) -> Vec<Entry> {
    reloader
        .providers()
        .into_values()
        .map(|p| Entry {
            plugin_type: p.info().type_name.clone(),
            provider: Arc::new(Instrumented::new(p, metrics.clone())) as Arc<dyn Provider>,
        })
        .collect()
}

/// sha256 (hex) of every `*.wasm` directly in `dir`, by file name; unreadable files are
/// left out (and then reported as missing by whoever needs them). At most `max_bytes + 1`
/// bytes of a file are read: a larger file gets a digest of what was read, and its load
/// then fails naming the limit.
fn plugin_digests(dir: &Path, max_bytes: u64) -> BTreeMap<String, String> {
    let Ok(rd) = std::fs::read_dir(dir) else {
        return BTreeMap::new();
    };
    rd.flatten()
        .filter_map(|e| {
            let name = e.file_name().to_string_lossy().into_owned();
            if name.starts_with('.') || !name.ends_with(".wasm") {
                return None;
            }
            let file = std::fs::File::open(e.path()).ok()?;
            let mut hasher = Sha256::new();
            std::io::copy(
                &mut std::io::Read::take(file, max_bytes.saturating_add(1)),
                &mut hasher,
            )
            .ok()?;
            Some((name, hex::encode(hasher.finalize())))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn file(entries: &[(&str, &str, &str)]) -> ProvidersFile {
        let mut yaml = String::from("providers:\n");
        for (name, plugin, endpoint) in entries {
            yaml.push_str(&format!(
                "- name: {name}\n  plugin: {plugin}\n  config: {{endpoint: '{endpoint}'}}\n"
            ));
        }
        ProvidersFile::parse(&yaml).unwrap()
    }

    fn running(f: &ProvidersFile, shas: &BTreeMap<String, String>) -> BTreeMap<String, Source> {
        f.providers
            .iter()
            .map(|e| {
                (
                    e.name.clone(),
                    Source {
                        entry: e.clone(),
                        plugin_sha: shas[&e.plugin].clone(),
                    },
                )
            })
            .collect()
    }

    #[test]
    fn plan_rebuilds_only_what_changed() {
        let shas: BTreeMap<String, String> = [("a.wasm", "1"), ("b.wasm", "2")]
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .into();
        let before = file(&[("one", "a.wasm", "http://x"), ("two", "b.wasm", "http://y")]);
        let cur = running(&before, &shas);
        let mut new_b = shas.clone();
        new_b.insert("b.wasm".into(), "3".into());
        let mut no_a = shas.clone();
        no_a.remove("a.wasm");
        let s = |v: &[&str]| v.iter().map(|x| x.to_string()).collect::<Vec<_>>();
        for (name, after, digests, keep, load, remove) in [
            (
                "nothing changed",
                before.clone(),
                shas.clone(),
                s(&["one", "two"]),
                s(&[]),
                s(&[]),
            ),
            (
                "one entry's config changed",
                file(&[
                    ("one", "a.wasm", "http://changed"),
                    ("two", "b.wasm", "http://y"),
                ]),
                shas.clone(),
                s(&["two"]),
                s(&["one"]),
                s(&[]),
            ),
            (
                "a plugin file changed",
                before.clone(),
                new_b,
                s(&["one"]),
                s(&["two"]),
                s(&[]),
            ),
            (
                "a plugin file vanished",
                before.clone(),
                no_a,
                s(&["two"]),
                s(&["one"]),
                s(&[]),
            ),
            (
                "an entry added and one removed",
                file(&[
                    ("two", "b.wasm", "http://y"),
                    ("three", "a.wasm", "http://z"),
                ]),
                shas.clone(),
                s(&["two"]),
                s(&["three"]),
                s(&["one"]),
            ),
        ] {
            assert_eq!(
                plan(&cur, &after, &digests),
                Plan { keep, load, remove },
                "{name}"
            );
        }
    }
}
