//! Turning `.wasm` files into loaded plugins and configured providers.

use super::abi::{self, WorldVersion};
use super::artifact_cache::CacheOutcome;
use super::compiler::{CompileError, CompileLimit, CompileStats};
use super::precheck::{self, Refusal};
use super::{GuestCall, GuestReply, Runtime, WasmProvider, http, provider_shared};
use crate::config::{Limits, ProviderEntry, ProvidersFile};
use crate::provider::{Op, Priority};
use sha2::{Digest, Sha256};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

pub use super::guest::PluginInfo;

/// A compiled, pre-linked plugin file.
pub struct LoadedPlugin {
    pub path: PathBuf,
    pub sha256: String,
    pub size: u64,
    pub info: PluginInfo,
    pub cache: CacheOutcome,
    /// What its compile used, when it was compiled in a child process.
    pub compile: Option<CompileStats>,
    /// Time to compile or deserialize, and to pre-link.
    pub load_time: Duration,
    pub(super) pre: abi::Pre,
}

impl std::fmt::Debug for LoadedPlugin {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LoadedPlugin")
            .field("path", &self.path)
            .field("sha256", &self.sha256)
            .field("world_version", &self.version())
            .field("info", &self.info)
            .finish_non_exhaustive()
    }
}

impl LoadedPlugin {
    /// The contract version it implements.
    pub fn version(&self) -> WorldVersion {
        self.pre.version()
    }

    /// Its file name, for messages.
    pub fn file_name(&self) -> String {
        self.path
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default()
    }

    /// The interfaces the component imports: everything it could ever ask of the host.
    pub fn imports(&self) -> Vec<String> {
        let pre = self.pre.instance_pre();
        let engine = pre.engine();
        let mut names: Vec<String> = pre
            .component()
            .component_type()
            .imports(engine)
            .map(|(name, _)| name.to_string())
            .collect();
        names.sort();
        names
    }

    /// Each default host the plugin asks for, with why it would be refused (`None`: fine).
    /// A provider that relies on the defaults fails to load when one is refused.
    pub fn default_host_review(&self) -> Vec<(String, Option<String>)> {
        self.info
            .default_hosts
            .iter()
            .map(|h| {
                let verdict = match h.parse::<crate::policy::AllowRule>() {
                    Err(e) => Some(e.reason.to_string()),
                    Ok(rule) => crate::policy::plugin_default_problem(&rule).map(String::from),
                };
                (h.clone(), verdict)
            })
            .collect()
    }
}

/// Why a plugin file did not load. Every message names the file.
#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    #[error("plugin {path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error(
        "plugin {path}: refusing precompiled native code; ship the .wasm component and the operator compiles it itself"
    )]
    Precompiled { path: PathBuf },
    #[error("plugin {path}: {what}, not a WebAssembly component (build it for wasm32-wasip2)")]
    NotAComponent { path: PathBuf, what: &'static str },
    #[error("plugin {path}: is not a well-formed component: {message}")]
    Malformed { path: PathBuf, message: String },
    #[error("plugin {path}: does not compile: {message}")]
    Compile { path: PathBuf, message: String },
    /// The compile reached one of its limits (`--plugin-compile-*`): the plugin is refused.
    #[error("plugin {path}: {limit}")]
    CompileLimit { path: PathBuf, limit: CompileLimit },
    #[error("plugin {path}: compile failed: {message}")]
    CompileFailed { path: PathBuf, message: String },
    #[error(
        "plugin {path}: built for egress:provider@{found}, but this operator supports egress:provider versions {supported}"
    )]
    Version {
        path: PathBuf,
        found: String,
        supported: String,
    },
    #[error(
        "plugin {path}: exports no egress:provider world (expected the interfaces egress:provider/plugin and egress:provider/provider)"
    )]
    NotAProvider { path: PathBuf },
    #[error("plugin {path}: cannot be linked: {message}")]
    Link { path: PathBuf, message: String },
    #[error("plugin {path}: info() failed: {message}")]
    Info { path: PathBuf, message: String },
    #[error(
        "plugin {path}: {size} bytes is more than the largest plugin file accepted ({limit} bytes, --max-plugin-bytes)"
    )]
    TooLarge {
        path: PathBuf,
        size: u64,
        limit: u64,
    },
}

/// Why a configured provider did not start. The other providers are unaffected.
#[derive(Debug, thiserror::Error)]
pub enum ProviderLoadError {
    #[error("provider {provider:?}: plugin file {plugin:?} is not in the plugin directory")]
    MissingPlugin { provider: String, plugin: String },
    #[error("provider {provider:?}: {source}")]
    Plugin {
        provider: String,
        #[source]
        source: Arc<LoadError>,
    },
    #[error("provider {provider:?}: {message}")]
    Config { provider: String, message: String },
    #[error("{0}")]
    Invalid(crate::provider::ProviderError),
}

impl ProviderLoadError {
    pub fn provider(&self) -> &str {
        match self {
            ProviderLoadError::MissingPlugin { provider, .. }
            | ProviderLoadError::Plugin { provider, .. }
            | ProviderLoadError::Config { provider, .. } => provider,
            ProviderLoadError::Invalid(e) => &e.provider,
        }
    }
}

const WASM_MAGIC: &[u8] = b"\0asm";
const ELF_MAGIC: &[u8] = b"\x7fELF";

impl Runtime {
    /// Loads one plugin file: checks it is a component of the `egress:provider` world at
    /// this host's version importing nothing the host cannot provide (before compiling:
    /// see `precheck.rs`), compiles it within the compile limits (or takes it from the
    /// cache), pre-links it and reads its `info`.
    pub async fn load_plugin(
        self: &Arc<Self>,
        path: &Path,
    ) -> Result<Arc<LoadedPlugin>, LoadError> {
        let started = Instant::now();
        let p = || path.to_path_buf();
        if path.extension().is_some_and(|e| e == "cwasm") {
            return Err(LoadError::Precompiled { path: p() });
        }
        let bytes = read_capped(path, self.max_plugin_bytes)?;
        if bytes.starts_with(ELF_MAGIC) {
            return Err(LoadError::Precompiled { path: p() });
        }
        if !bytes.starts_with(WASM_MAGIC) || bytes.len() < 8 {
            return Err(LoadError::NotAComponent {
                path: p(),
                what: "not WebAssembly at all",
            });
        }
        // Layer byte: 0 for a core module, 1 for a component.
        if bytes[6..8] != [1, 0] {
            return Err(LoadError::NotAComponent {
                path: p(),
                what: "a core WebAssembly module",
            });
        }
        let world_version = precheck::check(&bytes).map_err(|refusal| match refusal {
            Refusal::Malformed(message) => LoadError::Malformed { path: p(), message },
            Refusal::NotAProvider => LoadError::NotAProvider { path: p() },
            Refusal::Version(found) => LoadError::Version {
                path: p(),
                found,
                supported: WorldVersion::supported(),
            },
            Refusal::Import(name) => LoadError::Link {
                path: p(),
                message: link_message(&format!(
                    "component imports instance `{name}`, which this host does not provide"
                )),
            },
        })?;
        let sha256 = hex::encode(Sha256::digest(&bytes));
        let bytes: Arc<[u8]> = bytes.into();
        let (component, cache, compile) = self
            .cache
            .component(&self.engine, &self.compiler, &bytes, &sha256)
            .await
            .map_err(|e| match e {
                CompileError::Invalid(message) => LoadError::Compile { path: p(), message },
                CompileError::Limit(limit) => LoadError::CompileLimit { path: p(), limit },
                CompileError::Failed(message) => LoadError::CompileFailed { path: p(), message },
            })?;
        let instance_pre =
            self.linker
                .instantiate_pre(&component)
                .map_err(|e| LoadError::Link {
                    path: p(),
                    message: link_message(&format!("{e:#}")),
                })?;
        let pre = abi::Pre::new(world_version, instance_pre).map_err(|e| LoadError::Link {
            path: p(),
            message: format!("{e:#}"),
        })?;
        let load_time = started.elapsed();

        let plugin = LoadedPlugin {
            path: p(),
            sha256,
            size: bytes.len() as u64,
            info: PluginInfo::default(),
            cache,
            compile,
            load_time,
            pre,
        };
        let label = path
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        let shared_plugin = Arc::new(plugin);
        let probe = self.sandbox(
            shared_plugin.clone(),
            &label,
            load_limits(),
            None,
            Vec::new(),
            no_tls(),
        );
        let info = probe
            .invoke(
                Op::Load,
                "",
                None,
                true,
                GuestCall::Info,
                Priority::of_op(Op::Load),
            )
            .await;
        drop(probe);
        let Ok(mut plugin) = Arc::try_unwrap(shared_plugin) else {
            unreachable!("the probe was the only other holder");
        };
        let info = match info {
            Ok((GuestReply::Info(i), _)) => i,
            Ok(_) => unreachable!("info returns GuestReply::Info"),
            Err(e) => {
                return Err(LoadError::Info {
                    path: p(),
                    message: e.message,
                });
            }
        };
        plugin.info = info;
        tracing::info!(
            plugin = %path.display(),
            r#type = %plugin.info.type_name,
            version = %plugin.info.version,
            world = %plugin.version(),
            size = plugin.size,
            cache = ?plugin.cache,
            load_ms = plugin.load_time.as_secs_f64() * 1000.0,
            compile_cpu_ms = plugin.compile.map(|c| c.cpu.as_millis() as u64),
            compile_max_rss_mib = plugin.compile.map(|c| c.max_rss_bytes as f64 / (1 << 20) as f64),
            "plugin loaded"
        );
        Ok(Arc::new(plugin))
    }

    /// Makes a provider from a loaded plugin and its config entry: builds the allow-list
    /// and TLS trust, and runs `validate-config` with HTTP denied.
    pub async fn provider(
        self: &Arc<Self>,
        plugin: Arc<LoadedPlugin>,
        entry: &ProviderEntry,
    ) -> Result<WasmProvider, ProviderLoadError> {
        let config_err = |message: String| ProviderLoadError::Config {
            provider: entry.name.clone(),
            message,
        };
        let rules = entry
            .allow_rules(&plugin.info.default_hosts)
            .map_err(|e| config_err(e.to_string()))?;
        if entry.tls.insecure_skip_tls_verify {
            tracing::warn!(provider = %entry.name, "tls.insecureSkipTlsVerify is on: backend certificates are NOT verified");
        }
        let tls = http::tls_config(
            entry.tls.ca_file.as_deref(),
            entry.tls.insecure_skip_tls_verify,
        )
        .map_err(config_err)?;
        let provider = self.sandbox(
            plugin,
            &entry.name,
            entry.limits.clone(),
            Some(entry),
            rules,
            tls,
        );
        let config = entry.config.to_string();
        match provider
            .invoke(
                Op::Load,
                "",
                None,
                true,
                GuestCall::Validate(&config),
                Priority::of_op(Op::Load),
            )
            .await
        {
            Ok((GuestReply::Unit(Ok(())), _)) => Ok(provider),
            Ok((GuestReply::Unit(Err(e)), _)) => {
                Err(ProviderLoadError::Invalid(crate::provider::ProviderError {
                    class: e.class,
                    op: Op::Load,
                    provider: entry.name.clone(),
                    id: String::new(),
                    message: format!("invalid config: {}", e.message),
                    code: e.code,
                }))
            }
            Ok(_) => unreachable!("validate-config returns GuestReply::Unit"),
            Err(e) => Err(ProviderLoadError::Invalid(e)),
        }
    }

    fn sandbox(
        self: &Arc<Self>,
        plugin: Arc<LoadedPlugin>,
        name: &str,
        limits: Limits,
        entry: Option<&ProviderEntry>,
        rules: Vec<crate::policy::AllowRule>,
        tls: Arc<rustls::ClientConfig>,
    ) -> WasmProvider {
        // The anonymous sandbox that reads `info` at load shares nothing with any provider.
        let sensitive = match entry {
            Some(_) => self.sensitive.get(name),
            None => Arc::default(),
        };
        // Only a configured provider has a budget: the one that reads `info` makes no
        // requests.
        let budget = entry
            .and_then(|e| {
                e.budget.map(|b| b.spec()).or_else(|| {
                    self.default_budgets
                        .then_some(plugin.info.default_budget)
                        .flatten()
                        .map(crate::rate::cap_default)
                })
            })
            .map(|spec| self.budget(name, spec));
        let http = Arc::new(http::HttpPolicy {
            provider: name.to_string(),
            budget,
            allow: crate::policy::AllowList::new(rules),
            pool: super::pool::Pool::new(limits.http.max_idle, limits.http.idle_timeout),
            limits: limits.http.clone(),
            tls,
            sensitive: sensitive.clone(),
        });
        let permits = match entry {
            Some(_) => self.permits(name, &limits),
            None => super::slots::Slots::new(limits.concurrency as usize),
        };
        let scratch =
            super::scratch::ScratchPool::new(&self.scratch_dir, limits.concurrency as usize);
        WasmProvider {
            runtime: self.clone(),
            scratch,
            plugin,
            shared: Arc::new(provider_shared(name, limits, entry, sensitive)),
            http,
            permits,
            last_list_requests: Default::default(),
            last_recent_requests: Default::default(),
            per_request: Default::default(),
        }
    }

    /// Loads every `*.wasm` in `dir` (and reports every `*.cwasm` as refused), then makes a
    /// provider for each entry of the providers file. A broken plugin or config stops only
    /// the providers that use it.
    pub async fn load(self: &Arc<Self>, dir: &Path, file: &ProvidersFile) -> LoadReport {
        let mut report = LoadReport::default();
        let mut plugins = std::collections::HashMap::new();
        let entries = match std::fs::read_dir(dir) {
            Ok(rd) => rd.flatten().map(|e| e.path()).collect::<Vec<_>>(),
            Err(source) => {
                report.plugin_errors.push(Arc::new(LoadError::Io {
                    path: dir.to_path_buf(),
                    source,
                }));
                Vec::new()
            }
        };
        let mut paths: Vec<PathBuf> = entries
            .into_iter()
            .filter(|p| {
                let name = p
                    .file_name()
                    .map(|n| n.to_string_lossy().into_owned())
                    .unwrap_or_default();
                // ConfigMap mounts hold `..data` links and dot-dirs: not plugins.
                !name.starts_with('.') && (name.ends_with(".wasm") || name.ends_with(".cwasm"))
            })
            .collect();
        paths.sort();
        for path in paths {
            let file_name = path.file_name().unwrap().to_string_lossy().into_owned();
            match self.load_plugin(&path).await {
                Ok(p) => {
                    plugins.insert(file_name, Ok(p));
                }
                Err(e) => {
                    tracing::error!(error = %e, "plugin not loaded");
                    let e = Arc::new(e);
                    report.plugin_errors.push(e.clone());
                    plugins.insert(file_name, Err(e));
                }
            }
        }
        for entry in &file.providers {
            let result = match plugins.get(&entry.plugin) {
                None if crate::config::oci_ref::OciRef::is_oci(&entry.plugin) => {
                    Err(ProviderLoadError::Config {
                        provider: entry.name.clone(),
                        message: format!(
                            "plugin {}: only the operator (`run`) pulls plugins from registries; `proxy-operator plugin inspect` pulls and reviews one",
                            entry.plugin
                        ),
                    })
                }
                None => Err(ProviderLoadError::MissingPlugin {
                    provider: entry.name.clone(),
                    plugin: entry.plugin.clone(),
                }),
                Some(Err(e)) => Err(ProviderLoadError::Plugin {
                    provider: entry.name.clone(),
                    source: e.clone(),
                }),
                Some(Ok(plugin)) => self.provider(plugin.clone(), entry).await,
            };
            match result {
                Ok(p) => report.providers.push(p),
                Err(e) => {
                    tracing::error!(error = %e, "provider not started");
                    report.provider_errors.push(e);
                }
            }
        }
        report
    }
}

/// The outcome of loading a plugin directory against a providers file.
#[derive(Default)]
pub struct LoadReport {
    pub providers: Vec<WasmProvider>,
    pub plugin_errors: Vec<Arc<LoadError>>,
    pub provider_errors: Vec<ProviderLoadError>,
}

/// Reads a plugin file of at most `limit` bytes: the size is checked before reading, and
/// the read itself stops after `limit + 1` bytes (a file growing meanwhile is still
/// refused; `size` is then what was read).
pub(crate) fn read_capped(path: &Path, limit: u64) -> Result<Vec<u8>, LoadError> {
    use std::io::Read;
    let io = |source| LoadError::Io {
        path: path.to_path_buf(),
        source,
    };
    let too_large = |size| LoadError::TooLarge {
        path: path.to_path_buf(),
        size,
        limit,
    };
    let file = std::fs::File::open(path).map_err(io)?;
    let size = file.metadata().map_err(io)?.len();
    if size > limit {
        return Err(too_large(size));
    }
    let mut bytes = Vec::with_capacity(size as usize);
    file.take(limit.saturating_add(1))
        .read_to_end(&mut bytes)
        .map_err(io)?;
    if bytes.len() as u64 > limit {
        return Err(too_large(bytes.len() as u64));
    }
    Ok(bytes)
}

/// Load-time calls deny all HTTP; they still need a TLS config to build the policy.
fn no_tls() -> Arc<rustls::ClientConfig> {
    http::tls_config(None, false).expect("the system roots always make a config")
}

fn load_limits() -> Limits {
    Limits {
        timeout: super::LOAD_CALL_TIMEOUT,
        concurrency: 1,
        ..Limits::default()
    }
}

/// wasmtime's link error names the missing import; add what it means here.
fn link_message(text: &str) -> String {
    if text.contains("wasi:sockets") {
        format!(
            "{text} (plugins get no sockets: outbound traffic goes through wasi:http to allow-listed hosts only)"
        )
    } else {
        format!(
            "{text} (the host provides egress:provider/host, wasi:http/outgoing-handler, and the wasi:cli, clocks, filesystem, io and random interfaces)"
        )
    }
}
