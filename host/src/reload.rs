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
//! Providers rebuild independently ([`run_jobs`]): in parallel (a few at once), each within
//! [`REBUILDS`]'s timeout, each published as it finishes. One provider cannot hold up the
//! others: its load-time calls run on the runtime's load slot, never on its own call slots
//! (which calls hanging on its backend may hold for their whole `limits.timeout`); a
//! rebuild that still does not finish in time is reported (log, metric with
//! `reason="timeout"`, `/readyz`, `ProviderHealth`) and its old version keeps serving.
//!
//! [`Reloader::run`] is the loop every replica runs: it polls, and hands what serves to
//! [`Serving`], the one place that updates the provider registry the other loops read and
//! the load report `/readyz` and the `ProviderHealth` objects show.

use crate::readiness::{ProviderLoad, Readiness};
use crate::registry::{Entry, ProviderRegistry};
use egress_plugin_host::config::oci_ref::OciRef;
use egress_plugin_host::config::{PodResources, ProviderEntry, ProvidersFile};
use egress_plugin_host::plugin::{LoadedPlugin, ProviderLoadError, Runtime, WasmProvider};
use egress_plugin_host::provider::{Instrumented, Provider, ProviderMetrics};
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::registry::Registry;
use sha2::{Digest, Sha256};
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::future::Future;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::OnceCell;
use tokio::task::JoinSet;
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
    /// sha256 of the plugin file; for an `oci://` plugin, its manifest's digest.
    pub plugin_sha: String,
    /// What runs, for status and logs: `oci://registry/repository@sha256:...` (pinned),
    /// or the plugin file's name and digest.
    pub origin: String,
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

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct FailureLabels {
    provider: String,
    reason: &'static str,
}

/// Why a provider's new version was not loaded: the `reason` label of
/// `proxy_operator_provider_reload_errors_total`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Reason {
    /// The providers file is unreadable, does not parse or does not fit the pod
    /// (`provider=""`).
    File,
    /// The plugin file is missing, is not a loadable plugin, or its `info` failed.
    Plugin,
    /// The entry is refused: its allow-list or TLS settings, or `validate-config`.
    Config,
    /// The rebuild did not finish within its timeout ([`REBUILDS`]).
    Timeout,
    /// The rebuild panicked (a bug in the operator).
    Crashed,
    /// An `oci://` plugin could not be pulled (registry away or refusing, a manifest that
    /// is not a plugin, a layer that does not match its digest, too large).
    Pull,
    /// An `oci://` plugin's signature did not verify with the entry's keys.
    Signature,
    /// The plugin asks for more than the entry's `approved` allows.
    Review,
}

impl Reason {
    pub fn as_str(self) -> &'static str {
        match self {
            Reason::File => "file",
            Reason::Plugin => "plugin",
            Reason::Config => "config",
            Reason::Timeout => "timeout",
            Reason::Crashed => "crashed",
            Reason::Pull => "pull",
            Reason::Signature => "signature",
            Reason::Review => "review",
        }
    }
}

/// A failed rebuild: why (for the metric), and the message kept for `/readyz` and
/// `ProviderHealth`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Failure {
    pub reason: Reason,
    pub message: String,
}

impl Failure {
    fn new(reason: Reason, message: String) -> Self {
        Failure { reason, message }
    }
}

/// `proxy_operator_provider_reloads_total{provider}` and
/// `proxy_operator_provider_reload_errors_total{provider,reason}` (`provider=""` for the
/// file; `reason` from [`Reason`]).
#[derive(Clone, Default)]
pub struct ReloadMetrics {
    reloads: Family<ProviderLabel, Counter>,
    errors: Family<FailureLabels, Counter>,
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
            "Reloads that failed (the previous version, if any, keeps serving), by reason (file, plugin, config, timeout, crashed, pull, signature, review); provider=\"\" for the providers file",
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

    pub(crate) fn failed(&self, provider: &str, reason: Reason) {
        self.errors
            .get_or_create(&FailureLabels {
                provider: provider.into(),
                reason: reason.as_str(),
            })
            .inc();
    }

    /// Failed reloads of `provider` for `reason` so far.
    pub fn errors(&self, provider: &str, reason: Reason) -> u64 {
        self.errors
            .get_or_create(&FailureLabels {
                provider: provider.into(),
                reason: reason.as_str(),
            })
            .get()
    }
}

/// How the rebuilds of one reload run ([`run_jobs`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Rebuilds {
    /// Rebuilds running at once. Their plugin loads (a compile, in a child process, when
    /// the plugin version is new) still run one at a time, and their load-time calls on
    /// the runtime's load slot.
    pub parallel: usize,
    /// How long one rebuild may take, from its start: its plugin's load (read, compile or
    /// the compile cache, `info`), `validate-config`, and the waits for the plugin load
    /// and the load slot behind the other rebuilds running. Each load-time call stops at
    /// `LOAD_CALL_TIMEOUT` (5 s), so the others running delay one by at most
    /// `(parallel - 1) x 2 x 5 s` plus their compiles.
    pub timeout: Duration,
    /// A rebuild's outcome is published at most this long after it finished, together
    /// with those that finished meanwhile: an edit of many providers swaps the registry
    /// (which re-runs every Proxy) about once, and a slow one delays nobody else's.
    pub window: Duration,
}

/// How a reload's rebuilds run.
pub const REBUILDS: Rebuilds = Rebuilds {
    parallel: 4,
    timeout: Duration::from_secs(60),
    window: Duration::from_secs(1),
};

/// Runs every job, at most `how.parallel` at once, each stopped `how.timeout` after it
/// started (its outcome is then `timed_out(name)`), and hands the outcomes to `report` in
/// batches: a batch closes `how.window` after its first outcome, or when every job is
/// done. Dropping the future aborts the jobs still running.
pub async fn run_jobs<T, F>(
    jobs: Vec<(String, F)>,
    how: Rebuilds,
    timed_out: impl Fn(&str) -> Failure,
    mut report: impl FnMut(Vec<(String, Result<T, Failure>)>),
) where
    T: Send + 'static,
    F: Future<Output = Result<T, Failure>> + Send + 'static,
{
    let mut waiting = jobs.into_iter();
    let mut running = JoinSet::new();
    // By task: the job's name, for the outcome of a job that panicked.
    let mut names = HashMap::new();
    let mut start_next = |running: &mut JoinSet<Option<Result<T, Failure>>>,
                          names: &mut HashMap<tokio::task::Id, String>| {
        if let Some((name, job)) = waiting.next() {
            let task =
                running.spawn(async move { tokio::time::timeout(how.timeout, job).await.ok() });
            names.insert(task.id(), name);
        }
    };
    for _ in 0..how.parallel.max(1) {
        start_next(&mut running, &mut names);
    }
    let mut batch = Vec::new();
    let mut closes = None;
    loop {
        let joined = match closes {
            None => running.join_next_with_id().await,
            Some(at) => match tokio::time::timeout_at(at, running.join_next_with_id()).await {
                Ok(joined) => joined,
                Err(_) => {
                    report(std::mem::take(&mut batch));
                    closes = None;
                    continue;
                }
            },
        };
        let Some(joined) = joined else { break };
        let (id, outcome) = match joined {
            Ok((id, outcome)) => (id, Ok(outcome)),
            Err(e) => (e.id(), Err(e)),
        };
        let name = names.remove(&id).expect("every job's task is named");
        let outcome = match outcome {
            Ok(Some(outcome)) => outcome,
            Ok(None) => Err(timed_out(&name)),
            Err(e) => Err(Failure::new(
                Reason::Crashed,
                format!("provider {name:?}: the rebuild crashed: {e}"),
            )),
        };
        batch.push((name, outcome));
        closes.get_or_insert_with(|| tokio::time::Instant::now() + how.window);
        start_next(&mut running, &mut names);
    }
    if !batch.is_empty() {
        report(batch);
    }
}

/// The outcome of a poll that found a change (or of one batch of it, see
/// [`Reloader::poll_with`]).
#[derive(Debug, Default)]
pub struct Change {
    pub loaded: Vec<String>,
    pub removed: Vec<String>,
    /// Providers whose new version failed, with why; the old one (if any) still serves.
    pub failed: BTreeMap<String, String>,
}

impl Change {
    fn is_empty(&self) -> bool {
        self.loaded.is_empty() && self.removed.is_empty() && self.failed.is_empty()
    }

    fn absorb(&mut self, other: Change) {
        self.loaded.extend(other.loaded);
        self.removed.extend(other.removed);
        self.failed.extend(other.failed);
    }
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
    budget: PodResources,
    /// Where `oci://` plugins come from; `None`: such entries fail to load, saying so.
    registries: Option<Arc<Registries>>,
    /// Providers whose last rebuild failed to pull or verify, and when: retried after
    /// `Registries::retry` even when nothing changed on disk.
    pull_failed: Option<(BTreeSet<String>, std::time::Instant)>,
}

/// What pulling `oci://` plugins needs.
pub struct Registries {
    pub store: crate::oci::store::Store,
    /// The docker config with registry credentials (read at each pull; may be missing).
    pub auth_file: PathBuf,
    pub retry: Duration,
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
            budget: PodResources::default(),
            registries: None,
            pull_failed: None,
        }
    }

    /// Lets entries name `oci://` plugins, pulled through `registries`.
    pub fn with_registries(mut self, registries: Registries) -> Self {
        self.registries = Some(Arc::new(registries));
        self
    }

    /// What each serving provider runs (`Source::origin`), by name.
    pub fn origins(&self) -> BTreeMap<String, String> {
        self.running
            .iter()
            .map(|(n, (s, _))| (n.clone(), s.origin.clone()))
            .collect()
    }

    /// Refuses a providers file that does not fit `budget` (config::fit), like one that
    /// does not parse: every provider keeps its current version. Default: no budget known,
    /// nothing checked.
    pub fn with_budget(mut self, budget: PodResources) -> Self {
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

    /// [`Reloader::poll_with`], reporting only the whole change at the end.
    pub async fn poll(&mut self) -> Option<Change> {
        self.poll_with(|_, _| {}).await
    }

    /// Reads the file and plugin digests; when anything differs from the last poll, applies
    /// the [`plan`]: removes, then rebuilds what is new or changed ([`run_jobs`]). Hands
    /// each part of the change to `publish` as it happens (the removals with the first
    /// rebuilds to finish; a rebuild that takes long comes later, on its own), with the
    /// reloader as it is then; returns the whole change (`loaded` sorted). `None` when
    /// nothing changed on disk.
    pub async fn poll_with(
        &mut self,
        mut publish: impl FnMut(&Reloader, &Change),
    ) -> Option<Change> {
        let text = match std::fs::read_to_string(&self.providers_file) {
            Ok(t) => t,
            Err(e) => {
                let why = format!("reading {}: {e}", self.providers_file.display());
                return self.file_error(String::new(), why, publish);
            }
        };
        let mut shas = plugin_digests(&self.plugin_dir, self.rt.max_plugin_bytes());
        let retry_pulls = match (&self.pull_failed, &self.registries) {
            (Some((_, at)), Some(r)) => at.elapsed() >= r.retry,
            _ => false,
        };
        if !retry_pulls
            && self
                .seen
                .as_ref()
                .is_some_and(|(t, s)| *t == text && *s == shas)
        {
            return None;
        }
        let retrying = if retry_pulls {
            self.pull_failed
                .take()
                .map(|(names, _)| names)
                .unwrap_or_default()
        } else {
            BTreeSet::new()
        };
        self.seen = Some((text.clone(), shas.clone()));
        let file = match ProvidersFile::parse(&text) {
            Ok(f) => f,
            Err(e) => {
                let why = format!("{}: {e}", self.providers_file.display());
                return self.file_error(text, why, publish);
            }
        };
        if let Err(e) = egress_plugin_host::config::fit::check(&file, &self.budget) {
            let why = format!("{}: {e}", self.providers_file.display());
            return self.file_error(text, why, publish);
        }
        if let Some(e) = self.rt.pool_problem(&file) {
            let why = format!("{}: {e}", self.providers_file.display());
            return self.file_error(text, why, publish);
        }
        self.rt.set_room(
            &file,
            egress_plugin_host::config::fit::left_over(&file, &self.budget),
        );
        self.errors.remove("");
        // An `oci://` plugin's digest: its own, or its tag's pin (no I/O); "" for a tag not
        // resolved yet, which never matches what runs.
        for entry in &file.providers {
            if let Ok(reference) = OciRef::parse(&entry.plugin) {
                let resolved = self
                    .registries
                    .as_ref()
                    .and_then(|r| r.store.resolved(&reference))
                    .unwrap_or_default();
                shas.insert(entry.plugin.clone(), resolved);
            }
        }
        let current: BTreeMap<String, Source> = self
            .running
            .iter()
            .map(|(n, (s, _))| (n.clone(), s.clone()))
            .collect();
        let mut plan = plan(&current, &file, &shas);
        // A pull that failed is tried again, even for an entry whose previous version
        // still serves unchanged.
        plan.keep.retain(|n| {
            let again = retrying.contains(n) && self.errors.contains_key(n);
            if again {
                plan.load.push(n.clone());
            }
            !again
        });
        for name in &plan.keep {
            // Back to what is running (a broken edit reverted): nothing is wrong any more.
            self.errors.remove(name);
        }
        let mut unpublished = Change::default();
        for name in &plan.remove {
            self.running.remove(name);
            self.errors.remove(name);
            tracing::info!(provider = %name, "provider removed from the providers file");
            unpublished.removed.push(name.clone());
        }

        let to_load: Vec<&ProviderEntry> = file
            .providers
            .iter()
            .filter(|e| plan.load.contains(&e.name))
            .collect();
        let builder = Arc::new(Builder {
            rt: self.rt.clone(),
            plugin_dir: self.plugin_dir.clone(),
            plugins: Mutex::default(),
            plugin_load: tokio::sync::Mutex::new(()),
            registries: self.registries.clone(),
        });
        let stages: BTreeMap<String, Stage> = plan
            .load
            .iter()
            .map(|n| (n.clone(), Stage::default()))
            .collect();
        let jobs = to_load
            .into_iter()
            .map(|entry| {
                let keys = file
                    .verify_for(entry)
                    .map(|v| v.keys().expect("checked when the file was parsed"));
                let job = rebuild(
                    builder.clone(),
                    entry.clone(),
                    keys,
                    shas.contains_key(&entry.plugin),
                    stages[&entry.name].clone(),
                );
                (entry.name.clone(), job)
            })
            .collect();
        let timed_out = |name: &str| {
            Failure::new(
                Reason::Timeout,
                format!(
                    "provider {name:?}: not rebuilt within {} (stopped while {})",
                    humantime::format_duration(REBUILDS.timeout),
                    stages[name].get()
                ),
            )
        };
        let mut change = Change::default();
        run_jobs(jobs, REBUILDS, timed_out, |batch| {
            for (name, outcome) in batch {
                self.apply(name, outcome, &mut unpublished);
            }
            publish(self, &unpublished);
            change.absorb(std::mem::take(&mut unpublished));
        })
        .await;
        // Nothing rebuilt: what was removed or cleared still has to be published.
        if change.is_empty() {
            publish(self, &unpublished);
            change.absorb(unpublished);
        }
        if let Some(r) = &self.registries {
            // The cache keeps what serves (and the pins), nothing older.
            let serving: Vec<String> = self
                .running
                .values()
                .filter(|(s, _)| OciRef::is_oci(&s.entry.plugin))
                .map(|(s, _)| s.plugin_sha.clone())
                .collect();
            r.store.retain(&serving);
        }
        change.loaded.sort();
        Some(change)
    }

    /// Records one rebuild's outcome in the running set, the errors, the metrics and the log.
    fn apply(
        &mut self,
        name: String,
        outcome: Result<(Source, WasmProvider), Failure>,
        change: &mut Change,
    ) {
        match outcome {
            Ok((source, p)) => {
                let replaced = self.running.insert(name.clone(), (source, Arc::new(p)));
                self.errors.remove(&name);
                self.metrics.loaded(&name);
                tracing::info!(provider = %name, replaced = replaced.is_some(), "provider loaded");
                change.loaded.push(name);
            }
            Err(Failure { reason, message }) => {
                self.metrics.failed(&name, reason);
                if matches!(reason, Reason::Pull | Reason::Signature) {
                    let (names, at) = self
                        .pull_failed
                        .get_or_insert_with(|| (BTreeSet::new(), std::time::Instant::now()));
                    names.insert(name.clone());
                    *at = std::time::Instant::now();
                }
                let keeps = self.running.contains_key(&name);
                tracing::error!(
                    provider = %name,
                    reason = reason.as_str(),
                    error = %message,
                    previous_version_serving = keeps,
                    "provider not reloaded"
                );
                self.errors.insert(name.clone(), message.clone());
                change.failed.insert(name, message);
            }
        }
    }

    /// Polls every `interval` (the first poll is the caller's, before the other loops
    /// start) until `cancel`, and publishes every change to `serving` as it happens. A
    /// poll cut short by `cancel` stops its rebuilds.
    pub async fn run(mut self, interval: Duration, cancel: CancellationToken, serving: Serving) {
        let mut tick = tokio::time::interval(interval);
        tick.tick().await;
        loop {
            tokio::select! {
                _ = cancel.cancelled() => return,
                _ = tick.tick() => {}
            }
            tokio::select! {
                _ = cancel.cancelled() => return,
                _ = self.poll_with(|r, change| serving.publish(r, change)) => {}
            }
        }
    }

    fn file_error(
        &mut self,
        text: String,
        why: String,
        mut publish: impl FnMut(&Reloader, &Change),
    ) -> Option<Change> {
        let again = self.errors.get("") == Some(&why);
        self.seen = Some((text, BTreeMap::new()));
        if again {
            return None;
        }
        self.metrics.failed("", Reason::File);
        tracing::error!(error = %why, "providers file not reloaded; every provider keeps its current version");
        self.errors.insert(String::new(), why.clone());
        let change = Change {
            failed: [(String::new(), why)].into(),
            ..Change::default()
        };
        publish(self, &change);
        Some(change)
    }
}

/// A plugin file's load, shared by every rebuild of one poll that needs it.
type PluginLoad = Arc<OnceCell<Result<Arc<LoadedPlugin>, String>>>;

/// What the rebuilds of one poll share.
struct Builder {
    rt: Arc<Runtime>,
    plugin_dir: PathBuf,
    /// Each plugin file the rebuilds need, loaded once for all the providers using it.
    plugins: Mutex<BTreeMap<PathBuf, PluginLoad>>,
    /// Held while a plugin loads: one compile at a time, as before rebuilds ran in
    /// parallel (a compile runs cranelift in a child process, and blocks the thread it
    /// waits on).
    plugin_load: tokio::sync::Mutex<()>,
    registries: Option<Arc<Registries>>,
}

impl Builder {
    fn plugin_cell(&self, path: &Path) -> PluginLoad {
        self.plugins
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .entry(path.to_path_buf())
            .or_default()
            .clone()
    }
}

/// What a rebuild is doing, for the message when it times out.
#[derive(Clone)]
struct Stage(Arc<Mutex<&'static str>>);

impl Default for Stage {
    fn default() -> Self {
        Stage(Arc::new(Mutex::new("waiting to start")))
    }
}

impl Stage {
    fn set(&self, what: &'static str) {
        *self.0.lock().unwrap_or_else(|e| e.into_inner()) = what;
    }

    fn get(&self) -> &'static str {
        *self.0.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// Builds one provider from its entry: its plugin (pulled from its registry for an
/// `oci://` plugin, and verified with `keys`; loaded once per poll, see [`Builder`]), its
/// review against `approved`, then the provider, which runs `validate-config`.
async fn rebuild(
    b: Arc<Builder>,
    entry: ProviderEntry,
    keys: Option<Vec<egress_plugin_host::config::verify::PublicKey>>,
    plugin_present: bool,
    stage: Stage,
) -> Result<(Source, WasmProvider), Failure> {
    let name = &entry.name;
    let (path, pulled) = match OciRef::parse(&entry.plugin) {
        Ok(reference) => {
            stage.set("pulling its plugin from the registry");
            let pulled = pull(&b, &entry, &reference, keys.as_deref()).await?;
            (pulled.path.clone(), Some(pulled))
        }
        Err(_) if !plugin_present => {
            return Err(Failure::new(
                Reason::Plugin,
                format!(
                    "provider {name:?}: plugin file {:?} is not in {}",
                    entry.plugin,
                    b.plugin_dir.display()
                ),
            ));
        }
        Err(_) => (b.plugin_dir.join(&entry.plugin), None),
    };
    stage.set("waiting for its plugin to load");
    let plugin = b
        .plugin_cell(&path)
        .get_or_init(|| async {
            let _one = b.plugin_load.lock().await;
            stage.set("loading its plugin");
            b.rt.load_plugin(&path).await.map_err(|e| e.to_string())
        })
        .await
        .clone()
        .map_err(|e| Failure::new(Reason::Plugin, format!("provider {name:?}: {e}")))?;
    // The file may have changed since it was hashed: record what was loaded.
    let (plugin_sha, origin) = match &pulled {
        Some(p) => (p.digest.clone(), p.reference.to_string()),
        None => (
            plugin.sha256.clone(),
            format!("{} (sha256:{})", entry.plugin, plugin.sha256),
        ),
    };
    if let Some(approved) = &entry.approved {
        let excess = approved.excess(&plugin.info.default_hosts, &plugin.imports());
        if !excess.is_empty() {
            return Err(Failure::new(
                Reason::Review,
                format!(
                    "provider {name:?}: plugin {origin} asks for more than the entry's approved allows ({excess}); review it with `proxy-operator plugin inspect` and extend approved to load it"
                ),
            ));
        }
    }
    stage.set("running validate-config");
    let p = b.rt.provider(plugin, &entry).await.map_err(|e| {
        let reason = match e {
            ProviderLoadError::MissingPlugin { .. } | ProviderLoadError::Plugin { .. } => {
                Reason::Plugin
            }
            ProviderLoadError::Config { .. } | ProviderLoadError::Invalid(_) => Reason::Config,
        };
        Failure::new(reason, e.to_string())
    })?;
    Ok((
        Source {
            entry,
            plugin_sha,
            origin,
        },
        p,
    ))
}

/// Pulls (or takes from the cache) `entry`'s `oci://` plugin, verified with `keys`.
async fn pull(
    b: &Builder,
    entry: &ProviderEntry,
    reference: &OciRef,
    keys: Option<&[egress_plugin_host::config::verify::PublicKey]>,
) -> Result<crate::oci::store::Pulled, Failure> {
    let name = &entry.name;
    let Some(registries) = &b.registries else {
        return Err(Failure::new(
            Reason::Pull,
            format!(
                "provider {name:?}: plugin {reference}: this command loads no plugins from registries"
            ),
        ));
    };
    let tls = egress_plugin_host::plugin::tls_config(
        entry.tls.ca_file.as_deref(),
        entry.tls.insecure_skip_tls_verify,
    )
    .map_err(|e| Failure::new(Reason::Config, format!("provider {name:?}: {e}")))?;
    let opts = crate::oci::store::PullOptions {
        tls,
        auth_file: Some(&registries.auth_file),
        max_plugin_bytes: b.rt.max_plugin_bytes(),
        keys,
    };
    let pulled = registries
        .store
        .fetch(reference, &opts)
        .await
        .map_err(|e| {
            let reason = match e {
                crate::oci::store::PullError::Signature { .. } => Reason::Signature,
                _ => Reason::Pull,
            };
            Failure::new(reason, format!("provider {name:?}: {e}"))
        })?;
    tracing::info!(
        provider = %name,
        plugin = %pulled.reference,
        signed_by = pulled.signed_by.as_deref().unwrap_or("(no signature asked for)"),
        from_cache = pulled.from_cache,
        "plugin pulled"
    );
    Ok(pulled)
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

    /// After each part of a poll's change ([`Reloader::poll_with`]): the load report
    /// always; the registry's set only when a provider was built or removed (a failed
    /// reload leaves the old version, and announcing a swap would re-run every Proxy for
    /// nothing).
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
        plugins: reloader.origins(),
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
                        origin: String::new(),
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

    type Outcomes = Vec<(Duration, Vec<(String, Result<u32, Failure>)>)>;

    /// Runs `jobs` through [`run_jobs`]; each batch with when it was reported.
    async fn batches(
        jobs: Vec<(
            &str,
            futures::future::BoxFuture<'static, Result<u32, Failure>>,
        )>,
        how: Rebuilds,
    ) -> Outcomes {
        let started = tokio::time::Instant::now();
        let mut got = Vec::new();
        let jobs = jobs.into_iter().map(|(n, j)| (n.to_string(), j)).collect();
        let timed_out = |name: &str| Failure::new(Reason::Timeout, format!("{name} timed out"));
        run_jobs(jobs, how, timed_out, |batch| {
            got.push((started.elapsed(), batch))
        })
        .await;
        got
    }

    fn after(
        ms: u64,
        v: Result<u32, Failure>,
    ) -> futures::future::BoxFuture<'static, Result<u32, Failure>> {
        Box::pin(async move {
            tokio::time::sleep(Duration::from_millis(ms)).await;
            v
        })
    }

    fn names(batch: &[(String, Result<u32, Failure>)]) -> Vec<&str> {
        let mut n: Vec<&str> = batch.iter().map(|(n, _)| n.as_str()).collect();
        n.sort();
        n
    }

    /// The attack of issue 27: one provider's rebuild never finishes. The others are
    /// reported together at once, and the stuck one when its timeout ends it, as a timeout.
    #[tokio::test]
    async fn a_rebuild_that_never_ends_times_out_and_holds_up_no_other() {
        let how = Rebuilds {
            parallel: 4,
            timeout: Duration::from_secs(1),
            window: Duration::from_millis(50),
        };
        let config = Failure::new(Reason::Config, "b: invalid".into());
        let got = batches(
            vec![
                ("a-stuck", Box::pin(futures::future::pending())),
                ("b-invalid", after(0, Err(config.clone()))),
                ("c-new", after(10, Ok(3))),
            ],
            how,
        )
        .await;
        assert_eq!(got.len(), 2, "{got:?}");
        let (at, first) = &got[0];
        assert_eq!(names(first), ["b-invalid", "c-new"]);
        assert!(*at < how.timeout, "the quick ones waited: {at:?}");
        assert!(first.contains(&("c-new".into(), Ok(3))));
        assert!(first.contains(&("b-invalid".into(), Err(config))));
        let (at, second) = &got[1];
        assert!(*at >= how.timeout, "{at:?}");
        assert_eq!(
            second,
            &[(
                "a-stuck".to_string(),
                Err(Failure::new(Reason::Timeout, "a-stuck timed out".into()))
            )]
        );
    }

    /// At most `parallel` run at once, and a rebuild's timeout counts from its own start,
    /// not from the start of the poll.
    #[tokio::test]
    async fn rebuilds_run_a_few_at_once_each_timed_from_its_start() {
        let running = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let most = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let job = |i: u32| -> futures::future::BoxFuture<'static, Result<u32, Failure>> {
            let (running, most) = (running.clone(), most.clone());
            Box::pin(async move {
                use std::sync::atomic::Ordering::SeqCst;
                let now = running.fetch_add(1, SeqCst) + 1;
                most.fetch_max(now, SeqCst);
                tokio::time::sleep(Duration::from_millis(100)).await;
                running.fetch_sub(1, SeqCst);
                Ok(i)
            })
        };
        let how = Rebuilds {
            parallel: 2,
            // Eight jobs of 100 ms two at a time take 400 ms: more than a job's timeout.
            timeout: Duration::from_millis(300),
            window: Duration::from_millis(1),
        };
        let got = batches(
            ["j0", "j1", "j2", "j3", "j4", "j5", "j6", "j7"]
                .into_iter()
                .zip(0..)
                .map(|(name, i)| (name, job(i)))
                .collect(),
            how,
        )
        .await;
        let all: Vec<_> = got.into_iter().flat_map(|(_, b)| b).collect();
        assert_eq!(all.len(), 8);
        assert!(all.iter().all(|(_, r)| r.is_ok()), "{all:?}");
        assert_eq!(most.load(std::sync::atomic::Ordering::SeqCst), 2);
    }

    /// A rebuild that panics is reported under its name, and the others still finish.
    #[tokio::test]
    async fn a_rebuild_that_panics_is_reported_not_lost() {
        let how = Rebuilds {
            parallel: 1,
            timeout: Duration::from_secs(5),
            window: Duration::from_millis(1),
        };
        let got = batches(
            vec![
                ("boom", Box::pin(async { panic!("a bug") })),
                ("fine", after(0, Ok(1))),
            ],
            how,
        )
        .await;
        let all: BTreeMap<_, _> = got.into_iter().flat_map(|(_, b)| b).collect();
        let boom = all["boom"].as_ref().unwrap_err();
        assert_eq!(boom.reason, Reason::Crashed);
        assert!(
            boom.message.contains("\"boom\"") && boom.message.contains("a bug"),
            "{boom:?}"
        );
        assert_eq!(all["fine"], Ok(1));
    }
}
