//! Composition root of the `proxy-operator` binary: parses the command line and wires the
//! library's parts together. No logic of its own lives here.

use anyhow::Context;
use clap::{Parser, Subcommand};
use proxy_operator::config::ProvidersFile;
use proxy_operator::conformance::{self, Control, Options, Subject, lifecycle};
use proxy_operator::plugin::{Runtime, RuntimeOptions, WasmProvider};
use proxy_operator::provider::{Placement, Provider};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

/// How stale `status.lastProbe` may get while the health verdict does not change: a refresh
/// is a status write, and at rest a Proxy should cost next to none.
const PROBE_REFRESH: Duration = Duration::from_secs(30 * 60);

#[derive(Parser)]
#[command(
    name = "proxy-operator",
    version,
    about = "Keeps egress proxies running on disposable cloud instances; cloud backends are sandboxed WebAssembly plugins."
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Work with one plugin file.
    Plugin {
        #[command(subcommand)]
        command: PluginCommand,
    },
    /// Load the providers of a providers file from a plugin directory and report on each:
    /// what loaded, what did not and why, and (with --check) each provider's health check.
    Providers {
        #[command(flatten)]
        source: SourceArgs,
        /// Also run every provider's health check and print its targets.
        #[arg(long)]
        check: bool,
        #[command(flatten)]
        runtime: RuntimeArgs,
        #[command(flatten)]
        fit: FitArgs,
    },
    /// Run the operator: the Proxy reconciler, orphan GC, health probes and provider checks
    /// (on the elected leader), and the discovery API, /metrics, /healthz and /readyz (on
    /// every replica), over the providers loaded from the plugin directory and reloaded
    /// when it or the providers file changes.
    Run(Box<RunArgs>),
    /// Print the operator's CustomResourceDefinitions as YAML (generated from the Rust types),
    /// or write one file per CRD into a directory (how config/crd/ is regenerated).
    Crds {
        /// Write `<group>_<plural>.yaml` files here instead of printing to stdout.
        #[arg(long)]
        output_dir: Option<PathBuf>,
    },
    /// Print the discovery API's OpenAPI 3 document (JSON), as served at /openapi.json and
    /// committed as docs/openapi/discovery.json.
    Openapi,
    /// Print the operator's RBAC rules (ClusterRole and leader-election Role) as YAML, as
    /// committed in config/rbac/role.yaml.
    Rbac,
    /// Work with one configured provider.
    Provider {
        #[command(subcommand)]
        command: ProviderCommand,
    },
    /// Run the provider conformance suite: one provider of a providers file, configured
    /// against an emulator of its backend that serves the `/_emulator/` control surface.
    /// Prints one line per case and a total; exits non-zero when any case fails.
    Conformance {
        /// The providers file (YAML) whose entry points the plugin at the emulator.
        #[arg(long, alias = "config")]
        providers: PathBuf,
        /// The provider entry to test.
        #[arg(long)]
        provider: String,
        /// The emulator's base URL (its control surface lives under `/_emulator/`).
        #[arg(long)]
        emulator: String,
        #[command(flatten)]
        target: TargetArgs,
        /// Run only the cases whose name contains this (repeatable).
        #[arg(long)]
        only: Vec<String>,
        /// How long to wait for the backend to move (running, gone).
        #[arg(long, default_value = "30s", value_parser = humantime::parse_duration)]
        wait: Duration,
        /// List the cases and exit.
        #[arg(long)]
        list: bool,
    },
}

/// Where the providers come from: what the operator's Deployment mounts.
#[derive(clap::Args)]
struct SourceArgs {
    /// Directory holding the plugin components (`*.wasm`), e.g. the plugins ConfigMap mount.
    #[arg(
        long,
        env = "PLUGIN_DIR",
        default_value = "/etc/proxy-operator/plugins"
    )]
    plugin_dir: PathBuf,
    /// The providers file (YAML).
    #[arg(
        long,
        env = "PROVIDERS_FILE",
        default_value = "/etc/proxy-operator/providers.yaml"
    )]
    providers: PathBuf,
}

#[derive(clap::Args)]
struct RunArgs {
    #[command(flatten)]
    source: SourceArgs,
    #[command(flatten)]
    runtime: RuntimeArgs,
    #[command(flatten)]
    fit: FitArgs,
    /// Installation identity written on every instance and used to scope GC. Default:
    /// derived from the cluster (kube-system's UID) and --namespace.
    #[arg(long, env = "INSTALLATION_ID")]
    installation: Option<String>,
    /// The operator's own namespace (part of the default installation identity).
    #[arg(long, env = "POD_NAMESPACE", default_value = "egress-system")]
    namespace: String,
    /// Reported as the events' reporting instance.
    #[arg(long, env = "POD_NAME")]
    pod_name: Option<String>,
    /// Proxies reconciled at once.
    #[arg(long, default_value_t = 3)]
    concurrency: u16,
    #[arg(long, value_parser = humantime::parse_duration, default_value = "10s")]
    provisioning_poll: Duration,
    #[arg(long, value_parser = humantime::parse_duration, default_value = "10s")]
    deletion_poll: Duration,
    /// How often a Running instance is checked against its provider's list (each provider
    /// is listed this often, or less often when its request budget calls for it). The
    /// health probe notices a dead proxy long before this.
    #[arg(long, value_parser = humantime::parse_duration, default_value = "5m")]
    drift_poll: Duration,
    #[arg(long, value_parser = humantime::parse_duration, default_value = "1s")]
    requeue_now: Duration,
    #[arg(long, value_parser = humantime::parse_duration, default_value = "5m")]
    quota_retry: Duration,
    /// Retry interval while a cloud-init Secret (or key) is missing.
    #[arg(long, value_parser = humantime::parse_duration, default_value = "30s")]
    input_retry: Duration,
    #[arg(long, value_parser = humantime::parse_duration, default_value = "10m")]
    gc_interval: Duration,
    /// Orphans younger than this are never deleted.
    #[arg(long, value_parser = humantime::parse_duration, default_value = "10m")]
    gc_min_age: Duration,
    /// `host:port` every health probe asks the proxy to CONNECT to.
    #[arg(long, default_value = "example.com:443")]
    probe_target: String,
    /// Also fetch this URL (http or https) through the tunnel; its body must be the
    /// instance's IP (e.g. https://checkip.amazonaws.com/). Replaces --probe-target.
    #[arg(long)]
    egress_echo_url: Option<http::Uri>,
    #[arg(long, value_parser = humantime::parse_duration, default_value = "30s")]
    probe_interval: Duration,
    #[arg(long, value_parser = humantime::parse_duration, default_value = "5s")]
    probe_timeout: Duration,
    /// Failed probes in a row before a healthy proxy is marked unhealthy.
    #[arg(long, default_value_t = 3)]
    probe_failure_threshold: u32,
    /// How often every provider's health check runs (results in ProviderHealth objects).
    #[arg(long, value_parser = humantime::parse_duration, default_value = "1m")]
    provider_check_interval: Duration,
    /// One timeout for a whole round of provider checks.
    #[arg(long, value_parser = humantime::parse_duration, default_value = "20s")]
    provider_check_timeout: Duration,
    /// How often the providers file and plugin directory are checked for changes.
    #[arg(long, value_parser = humantime::parse_duration, default_value = "10s")]
    reload_interval: Duration,
    /// After SIGTERM, how long reconciles in flight may keep calling plugins; then the
    /// calls still running are cancelled (they fail Transient and are retried by the next
    /// leader). Keep it below the pod's terminationGracePeriodSeconds.
    #[arg(long, value_parser = humantime::parse_duration, default_value = "15s")]
    shutdown_grace: std::time::Duration,
    /// Where the discovery API, /metrics, /healthz and /readyz listen.
    #[arg(long, default_value = "0.0.0.0:8080")]
    listen: std::net::SocketAddr,
    /// Serve the discovery API without authentication (local development only).
    #[arg(long)]
    discovery_insecure_no_auth: bool,
    /// Elect one leader over a Lease in --namespace: only the leader reconciles, runs GC,
    /// health probes and provider checks; every replica serves the discovery API and
    /// /metrics. Turn off only when running a single replica.
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set)]
    leader_election: bool,
    /// Name of the leader-election Lease (coordination.k8s.io/v1) in --namespace.
    #[arg(long, default_value = "proxy-operator-leader")]
    lease_name: String,
    /// How long the Lease stays valid after a renewal (whole seconds): a crashed leader is
    /// replaced after at most about this long.
    #[arg(long, value_parser = humantime::parse_duration, default_value = "15s")]
    lease_duration: Duration,
    /// How often the leader renews the Lease (whole seconds, shorter than --lease-duration).
    #[arg(long, value_parser = humantime::parse_duration, default_value = "5s")]
    lease_renew: Duration,
}

/// One provider operation, as the operator's loops call it.
#[derive(Subcommand)]
enum CallOp {
    /// Create (or find, by the name derived from --uid) an instance; prints its ID.
    Create {
        /// Where: `region/zone/machineType/image`.
        #[arg(long, value_parser = parse_placement)]
        placement: Placement,
        /// The owner's UID; the instance name derives from it, so a repeat call with the
        /// same UID returns the same instance.
        #[arg(long)]
        uid: String,
        /// User data file (cloud-init); empty when not given.
        #[arg(long)]
        cloud_init: Option<PathBuf>,
        #[arg(long, default_value_t = 3128)]
        port: u16,
        #[arg(long, default_value = "egress-cli")]
        installation: String,
    },
    /// The instance behind an ID.
    Get { id: String },
    /// Delete the instance behind an ID (deleting something gone succeeds).
    Delete { id: String },
    /// Every managed instance of an installation.
    List {
        #[arg(long, default_value = "egress-cli")]
        installation: String,
    },
    /// The provider's health check.
    Check,
}

#[derive(Subcommand)]
enum ProviderCommand {
    /// Make one provider call with the operator's sandbox and limits, and print the answer
    /// as JSON (errors: class, code and message, and a non-zero exit).
    Call {
        /// The providers file (YAML).
        #[arg(long, alias = "providers")]
        config: PathBuf,
        /// The provider entry to call.
        #[arg(long)]
        provider: String,
        /// Directory holding the plugin components (`*.wasm`).
        #[arg(
            long,
            env = "PLUGIN_DIR",
            default_value = "/etc/proxy-operator/plugins"
        )]
        plugin_dir: PathBuf,
        #[command(flatten)]
        runtime: RuntimeArgs,
        #[command(subcommand)]
        op: CallOp,
    },
    /// Create one instance through the provider, create it again (same ID), wait until it
    /// runs, find it in the listing, delete it twice, wait until it is gone, and report
    /// anything left behind. Works against whatever endpoint the config names: a real
    /// cloud account (where it costs a few minutes of one instance), moto, or an emulator.
    /// Whatever step fails, the instance is deleted before it exits.
    Lifecycle {
        /// The providers file (YAML).
        #[arg(long, alias = "providers")]
        config: PathBuf,
        /// The provider entry to use.
        #[arg(long)]
        provider: String,
        #[command(flatten)]
        target: TargetArgs,
        /// Pause between two Gets while waiting.
        #[arg(long, default_value = "5s", value_parser = humantime::parse_duration)]
        poll: Duration,
        /// How long to wait for Running, and again for NotFound.
        #[arg(long, default_value = "10m", value_parser = humantime::parse_duration)]
        wait: Duration,
        /// The installation identity to create and list under.
        #[arg(long, default_value = "egress-lifecycle-test")]
        installation: String,
        /// An emulator's base URL: also check its dump for anything left behind.
        #[arg(long)]
        emulator: Option<String>,
    },
}

/// Which plugin, and where the instance goes.
#[derive(clap::Args)]
struct TargetArgs {
    /// Directory holding the plugin components (`*.wasm`).
    #[arg(
        long,
        env = "PLUGIN_DIR",
        default_value = "/etc/proxy-operator/plugins"
    )]
    plugin_dir: PathBuf,
    /// Where to create: `region/zone/machineType/image`, as in a Proxy's spec.placement.
    #[arg(long, value_parser = parse_placement)]
    placement: Placement,
    #[command(flatten)]
    runtime: RuntimeArgs,
}

#[derive(Subcommand)]
enum PluginCommand {
    /// Load a plugin and print what it declares and asks for, for review before installing:
    /// world version, type, version, the default hosts it wants (each marked usable or not:
    /// a plugin may only name public DNS hosts), the interfaces it imports, behaviour
    /// profile, size and digest.
    Inspect {
        file: PathBuf,
        #[command(flatten)]
        runtime: RuntimeArgs,
    },
}

#[derive(clap::Args)]
struct RuntimeArgs {
    /// Where compiled plugins are cached (must be private to this user). Empty disables.
    #[arg(
        long,
        env = "PLUGIN_CACHE_DIR",
        default_value = "/tmp/proxy-operator/cache"
    )]
    plugin_cache_dir: PathBuf,
    /// Parent of the per-call /tmp directories given to plugins.
    #[arg(
        long,
        env = "PLUGIN_SCRATCH_DIR",
        default_value = "/tmp/proxy-operator/calls"
    )]
    plugin_scratch_dir: PathBuf,
    /// Largest plugin file loaded (bytes, or a quantity such as 8Mi); a larger one is
    /// refused before it is read.
    #[arg(long, default_value = "8Mi", value_parser = parse_quantity)]
    max_plugin_bytes: u64,
}

impl RuntimeArgs {
    fn options(&self, file: &ProvidersFile) -> RuntimeOptions {
        let cache =
            (!self.plugin_cache_dir.as_os_str().is_empty()).then(|| self.plugin_cache_dir.clone());
        let mut opts = RuntimeOptions::for_providers(file, cache, self.plugin_scratch_dir.clone());
        opts.max_plugin_bytes = self.max_plugin_bytes;
        opts
    }
}

/// What the providers must fit: every provider at full concurrency, each call at its
/// memory and /tmp caps (docs/operations.md, "Fitting the pod").
#[derive(clap::Args)]
struct FitArgs {
    /// The pod's memory limit (e.g. 256Mi). Default: the memory limit of this process's
    /// cgroup; none there means no memory check.
    #[arg(long, value_parser = parse_quantity)]
    memory_limit: Option<u64>,
    /// Memory the operator keeps for itself, off the memory limit: its RSS with the shipped
    /// plugins loaded is 55-70 MiB (kube client and caches, compiled plugin code, tokio).
    #[arg(long, default_value = "96Mi", value_parser = parse_quantity)]
    memory_reserve: u64,
    /// Size of the /tmp volume holding the per-call scratch directories and the compile
    /// cache (the emptyDir's sizeLimit). Default: the size of that file system when it is a
    /// tmpfs; else no /tmp check.
    #[arg(long, value_parser = parse_quantity)]
    scratch_limit: Option<u64>,
}

impl FitArgs {
    fn budget(&self, runtime: &RuntimeArgs) -> proxy_operator::config::Budget {
        proxy_operator::config::budget::resolve(
            self.memory_limit,
            self.memory_reserve,
            self.scratch_limit,
            &runtime.plugin_scratch_dir,
        )
    }
}

fn parse_quantity(s: &str) -> Result<u64, String> {
    proxy_operator::config::budget::parse_quantity(s)
}

/// Logs what a fitting providers file needs.
fn log_fit(need: &proxy_operator::config::fit::Need, budget: &proxy_operator::config::Budget) {
    use proxy_operator::config::fit::Mib;
    tracing::info!(
        memory_need = %Mib(need.memory.total()),
        memory_available = %budget.memory_bytes.map(|m| Mib(m.saturating_sub(budget.reserve_bytes)).to_string()).unwrap_or_else(|| "unknown".into()),
        tmp_need = %Mib(need.scratch.total()),
        tmp_available = %budget.scratch_bytes.map(|m| Mib(m).to_string()).unwrap_or_else(|| "unknown".into()),
        "providers fit the pod"
    );
}

/// `region/zone/machineType/image`; parts may be empty where the provider ignores them.
fn parse_placement(s: &str) -> Result<Placement, String> {
    let parts: Vec<&str> = s.split('/').collect();
    match parts.as_slice() {
        [region, zone, machine_type, image] => Ok(Placement {
            region: region.to_string(),
            zone: zone.to_string(),
            machine_type: machine_type.to_string(),
            image: image.to_string(),
        }),
        _ => Err(format!(
            "placement {s:?} has {} part(s); want region/zone/machineType/image",
            parts.len()
        )),
    }
}

/// One provider call, its answer as JSON.
async fn call(
    p: &WasmProvider,
    op: CallOp,
) -> Result<serde_json::Value, proxy_operator::provider::ProviderError> {
    use proxy_operator::provider::{CreateRequest, Instance, name_from_uid};
    let instance = |i: &Instance| {
        serde_json::json!({
            "id": i.id,
            "ip": i.ip,
            "state": i.state.as_str(),
            "uid": i.uid,
            "createdAt": i.created_at.map(|t| humantime::format_rfc3339_seconds(t).to_string()),
        })
    };
    Ok(match op {
        CallOp::Create {
            placement,
            uid,
            cloud_init,
            port,
            installation,
        } => {
            let cloud_init = match cloud_init {
                Some(path) => std::fs::read(&path).map_err(|e| {
                    proxy_operator::provider::ProviderError::new(
                        proxy_operator::provider::Class::Permanent,
                        proxy_operator::provider::Op::Create,
                        p.name(),
                        "",
                        format!("reading --cloud-init {}: {e}", path.display()),
                    )
                })?,
                None => Vec::new(),
            };
            let req = CreateRequest {
                name: name_from_uid(&uid),
                uid,
                namespace: "cli".into(),
                proxy_name: "cli".into(),
                installation,
                placement,
                cloud_init,
                port,
            };
            serde_json::json!({"id": p.create(&req).await?, "name": req.name})
        }
        CallOp::Get { id } => instance(&p.get(&id).await?),
        CallOp::Delete { id } => {
            p.delete(&id).await?;
            serde_json::json!({"deleted": id})
        }
        CallOp::List { installation } => serde_json::Value::Array(
            p.list_by_tag(&installation)
                .await?
                .iter()
                .map(instance)
                .collect(),
        ),
        CallOp::Check => match p.check().await {
            None => serde_json::json!({"supported": false}),
            Some(targets) => serde_json::json!({
                "supported": true,
                "targets": targets.iter().map(|t| serde_json::json!({
                    "target": t.target, "ready": t.ready, "reason": t.reason, "message": t.message,
                })).collect::<Vec<_>>(),
            }),
        },
    })
}

/// Loads the one provider `name` of a providers file, or says why it did not load.
async fn load_provider(
    file_path: &std::path::Path,
    name: &str,
    plugin_dir: &std::path::Path,
    runtime: &RuntimeArgs,
    shipped_budgets: bool,
) -> anyhow::Result<WasmProvider> {
    let text = std::fs::read_to_string(file_path)
        .with_context(|| format!("reading providers file {}", file_path.display()))?;
    let mut file = ProvidersFile::parse(&text)?;
    let names: Vec<String> = file.providers.iter().map(|p| p.name.clone()).collect();
    file.providers.retain(|p| p.name == name);
    anyhow::ensure!(
        !file.providers.is_empty(),
        "--provider {name:?} is not in {} (it has: {})",
        file_path.display(),
        names.join(", ")
    );
    let mut opts = runtime.options(&file);
    opts.shipped_budgets = shipped_budgets;
    let rt = Runtime::new(opts)?;
    let entry = &file.providers[0];
    // Only the plugin this entry names: the others in the directory are not under test.
    let plugin = rt.load_plugin(&plugin_dir.join(&entry.plugin)).await?;
    Ok(rt.provider(plugin, entry).await?)
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let _telemetry = proxy_operator::telemetry::init(
        &std::env::var("RUST_LOG").unwrap_or_else(|_| "info".into()),
    )?;
    // Plugins' files and sockets come out of the same open-file limit as the operator's
    // own: take all the hard limit allows (plugin/fs.rs and plugin/http.rs cap each call).
    match proxy_operator::fdlimit::raise_nofile() {
        Ok(l) => tracing::debug!(
            before = l.before,
            soft = l.soft,
            hard = l.hard,
            "open-file limit (RLIMIT_NOFILE)"
        ),
        Err(e) => tracing::warn!(error = %e, "cannot read the open-file limit (RLIMIT_NOFILE)"),
    }
    match Cli::parse().command {
        Command::Crds { output_dir } => crds(output_dir.as_deref()),
        Command::Openapi => {
            print!("{}", proxy_operator::discovery::openapi::document_text());
            Ok(())
        }
        Command::Rbac => {
            print!("{}", proxy_operator::rbac::yaml()?);
            Ok(())
        }
        Command::Run(args) => run(*args).await,
        Command::Plugin {
            command: PluginCommand::Inspect { file, runtime },
        } => {
            let rt = Runtime::new(runtime.options(&ProvidersFile { providers: vec![] }))?;
            let p = rt.load_plugin(&file).await?;
            let out = serde_json::json!({
                "file": p.path,
                "sha256": p.sha256,
                "sizeBytes": p.size,
                "world": format!("egress:provider@{}", p.world_version),
                "type": p.info.type_name,
                "version": p.info.version,
                "hasCheck": p.info.has_check,
                "defaultHosts": p.default_host_review().into_iter().map(|(host, problem)| serde_json::json!({
                    "host": host,
                    "usable": problem.is_none(),
                    "problem": problem,
                })).collect::<Vec<_>>(),
                "imports": p.imports(),
                "profile": p.info.profile.iter().cloned().collect::<std::collections::BTreeMap<_, _>>(),
            });
            println!("{}", serde_json::to_string_pretty(&out)?);
            Ok(())
        }
        Command::Conformance {
            providers,
            provider,
            emulator,
            target,
            only,
            wait,
            list,
        } => {
            if list {
                for name in conformance::case_names() {
                    println!("{name}");
                }
                return Ok(());
            }
            let control = Control::new(&emulator)?;
            let p =
                // Against an emulator, far faster than a real backend allows: the shipped
                // plugins' default budgets are off (a `budget` in the entry still applies).
                load_provider(
                    &providers,
                    &provider,
                    &target.plugin_dir,
                    &target.runtime,
                    false,
                )
                .await?;
            let mut opts = Options::new(target.placement.clone());
            opts.only = only;
            opts.wait = wait;
            println!(
                "conformance: provider {} ({} {}) against {emulator}",
                p.name(),
                p.info().type_name,
                p.info().version
            );
            let report =
                conformance::run(&Subject::wasm(&p), &control, &opts, |r| println!("{r}")).await;
            println!("{}", report.total());
            anyhow::ensure!(
                report.passed(),
                "{} conformance case(s) failed",
                report.failed().len()
            );
            Ok(())
        }
        Command::Provider {
            command:
                ProviderCommand::Call {
                    config,
                    provider,
                    plugin_dir,
                    runtime,
                    op,
                },
        } => {
            let p = load_provider(&config, &provider, &plugin_dir, &runtime, true).await?;
            let answer = call(&p, op).await;
            match answer {
                Ok(v) => {
                    println!("{}", serde_json::to_string_pretty(&v)?);
                    Ok(())
                }
                Err(e) => {
                    let v = serde_json::json!({
                        "error": {"class": format!("{:?}", e.class), "code": e.code, "message": e.message}
                    });
                    println!("{}", serde_json::to_string_pretty(&v)?);
                    anyhow::bail!("{e}")
                }
            }
        }
        Command::Provider {
            command:
                ProviderCommand::Lifecycle {
                    config,
                    provider,
                    target,
                    poll,
                    wait,
                    installation,
                    emulator,
                },
        } => {
            let control = emulator.as_deref().map(Control::new).transpose()?;
            let p = load_provider(
                &config,
                &provider,
                &target.plugin_dir,
                &target.runtime,
                true,
            )
            .await?;
            let mut opts = lifecycle::LifecycleOptions::new(target.placement.clone());
            opts.poll = poll;
            opts.wait = wait;
            opts.installation = installation;
            println!(
                "lifecycle: provider {} ({} {}), uid {}",
                p.name(),
                p.info().type_name,
                p.info().version,
                opts.uid
            );
            match lifecycle::run(&p, &opts, |s| println!("{s}")).await {
                Ok(_) => {}
                Err(lifecycle::LifecycleError::Step {
                    step,
                    message,
                    cleanup,
                }) => {
                    println!("FAIL  {step}: {message}");
                    println!("      cleanup: {cleanup}");
                    anyhow::bail!("lifecycle failed at {step}");
                }
                Err(e) => {
                    println!("FAIL  {e}");
                    anyhow::bail!("lifecycle failed: {e}");
                }
            }
            if let Some(control) = control {
                let dump = control.dump().await?;
                anyhow::ensure!(
                    dump.instances.is_empty() && dump.secondary.is_empty(),
                    "the emulator still holds {} instance(s) and {} secondary resource(s): {dump:?}",
                    dump.instances.len(),
                    dump.secondary.len()
                );
                println!("ok    emulator holds nothing");
            }
            println!("lifecycle passed");
            Ok(())
        }
        Command::Providers {
            source:
                SourceArgs {
                    plugin_dir,
                    providers,
                },
            check,
            runtime,
            fit,
        } => {
            let text = std::fs::read_to_string(&providers)
                .with_context(|| format!("reading providers file {}", providers.display()))?;
            let file = ProvidersFile::parse(&text)?;
            let budget = fit.budget(&runtime);
            let fits = proxy_operator::config::fit::check(&file, &budget);
            match &fits {
                Ok(need) => {
                    use proxy_operator::config::fit::Mib;
                    let of = |b: Option<u64>| {
                        b.map_or("no limit known".into(), |b| format!("{} available", Mib(b)))
                    };
                    println!(
                        "fit     memory {} ({}), /tmp {} ({})",
                        Mib(need.memory.total()),
                        of(budget
                            .memory_bytes
                            .map(|m| m.saturating_sub(budget.reserve_bytes))),
                        Mib(need.scratch.total()),
                        of(budget.scratch_bytes)
                    );
                }
                Err(e) => println!("failed  {e}"),
            }
            let rt = Runtime::new(runtime.options(&file))?;
            let report = rt.load(&plugin_dir, &file).await;
            for p in &report.providers {
                println!(
                    "ok      {:<20} {} {} (hosts: {})",
                    p.name(),
                    p.info().type_name,
                    p.info().version,
                    p.allowed_hosts().join(", ")
                );
                if check {
                    match p.check().await {
                        None => println!("        check: unsupported"),
                        Some(targets) => {
                            for t in targets {
                                println!(
                                    "        {:<16} ready={} reason={} {}",
                                    t.target, t.ready, t.reason, t.message
                                );
                            }
                        }
                    }
                }
            }
            for e in &report.plugin_errors {
                println!("failed  {e}");
            }
            for e in &report.provider_errors {
                println!("failed  {e}");
            }
            if fits.is_err() {
                anyhow::bail!("the providers file does not fit the pod")
            } else if report.provider_errors.is_empty() && report.plugin_errors.is_empty() {
                Ok(())
            } else {
                anyhow::bail!(
                    "{} provider(s) and {} plugin file(s) failed to load",
                    report.provider_errors.len(),
                    report.plugin_errors.len()
                )
            }
        }
    }
}

fn crds(output_dir: Option<&std::path::Path>) -> anyhow::Result<()> {
    match output_dir {
        None => print!("{}", proxy_operator::api::all_crds_yaml()?),
        Some(dir) => {
            for (file, crd) in proxy_operator::api::crds() {
                let path = dir.join(file);
                std::fs::write(&path, proxy_operator::api::crd_yaml(&crd)?)
                    .with_context(|| format!("writing {}", path.display()))?;
                eprintln!("wrote {}", path.display());
            }
        }
    }
    Ok(())
}

/// The composition root of the running operator.
async fn run(args: RunArgs) -> anyhow::Result<()> {
    use proxy_operator::controller::{self, Context, HealthHook, Settings, Timings};
    use proxy_operator::discovery::{Auth, AuthSettings};
    use proxy_operator::gc::{GcSettings, Sweeper};
    use proxy_operator::health::{EngineConfig, HealthEngine, Thresholds};
    use proxy_operator::metrics::OperatorMetrics;
    use proxy_operator::ops::{ProviderLoad, Readiness};
    use proxy_operator::provider::Instrumented;
    use proxy_operator::provider_health::{Monitor, publish};
    use proxy_operator::registry::ProviderRegistry;
    use proxy_operator::reload::Reloader;
    use std::collections::BTreeMap;

    // A providers file that cannot fit the pod is refused before anything starts.
    let SourceArgs {
        plugin_dir,
        providers,
    } = &args.source;
    let text = std::fs::read_to_string(providers)
        .with_context(|| format!("reading providers file {}", providers.display()))?;
    let file = ProvidersFile::parse(&text)?;
    let budget = args.fit.budget(&args.runtime);
    let need = proxy_operator::config::fit::check(&file, &budget)
        .with_context(|| format!("providers file {}", providers.display()))?;
    log_fit(&need, &budget);

    let client = kube::Client::try_default()
        .await
        .context("connecting to the Kubernetes API")?;
    let installation = match args.installation {
        Some(id) => id,
        None => proxy_operator::installation::default_identity(client.clone(), &args.namespace)
            .await
            .context("deriving the installation identity (or pass --installation)")?,
    };
    tracing::info!(
        installation = installation.as_str(),
        open_file_limit = proxy_operator::fdlimit::nofile_limit(),
        "starting"
    );

    // The Proxy cache behind the discovery API, also read by the proxy gauges at scrape.
    // The one Proxy cache: the discovery API, the gauges, and the reconciler on the leader.
    let (cache, proxy_feed, reflect) = proxy_operator::cache::watch_proxies(client.clone());
    let metrics = OperatorMetrics::new(cache.store.clone());
    let provider_metrics = metrics.provider.clone();
    let (metrics_gc, metrics_monitor) = (metrics.gc.clone(), metrics.monitor.clone());
    let readiness = Readiness::default();

    // Providers come from the reloader: a provider that fails to load is left out (its
    // Proxies report ProviderNotConfigured), the others run, and later changes on disk
    // swap the set without a restart.
    let rt = Runtime::new(args.runtime.options(&file))?;
    rt.set_metrics(metrics.plugin.clone());
    let mut reloader = Reloader::new(rt.clone(), plugin_dir, providers, metrics.reload.clone())
        .with_budget(budget);
    reloader.poll().await;
    let provider_load = |r: &Reloader| ProviderLoad {
        serving: r.providers().into_keys().collect(),
        errors: r.errors().clone(),
    };
    readiness.set_providers(provider_load(&reloader));
    let instrumented = |r: &Reloader| -> Vec<Arc<dyn Provider>> {
        r.providers()
            .into_values()
            .map(|p| Arc::new(Instrumented::new(p, provider_metrics.clone())) as Arc<dyn Provider>)
            .collect()
    };
    let registry = ProviderRegistry::new(instrumented(&reloader));
    let plugin_types = |r: &Reloader| -> BTreeMap<String, String> {
        r.providers()
            .into_iter()
            .map(|(n, p)| (n, p.info().type_name.clone()))
            .collect()
    };
    let types = Arc::new(std::sync::Mutex::new(plugin_types(&reloader)));

    let mut settings = Settings::new(installation.clone());
    settings.timings = Timings {
        provisioning_poll: args.provisioning_poll,
        deletion_poll: args.deletion_poll,
        drift_poll: args.drift_poll,
        requeue_now: args.requeue_now,
        quota_retry: args.quota_retry,
        input_retry: args.input_retry,
    };
    settings.concurrency = args.concurrency;
    settings.instance_name = args.pod_name.clone();
    let engine = HealthEngine::new(
        EngineConfig {
            interval: args.probe_interval,
            concurrency: 16,
            thresholds: Thresholds {
                failure: args.probe_failure_threshold,
                success: 1,
            },
        },
        Some(metrics.health.clone()),
    );
    let tls = proxy_operator::plugin::tls_config(None, false).map_err(anyhow::Error::msg)?;
    // Drift detection and GC share one list per provider per drift poll; a list older than
    // two drift polls (the lists failed) is not used.
    let inventory = Arc::new(proxy_operator::inventory::Inventory::new(
        args.drift_poll.saturating_mul(2),
    ));
    let ctx = Context::new(client.clone(), registry.clone(), settings)
        .with_inventory(inventory.clone())
        .with_health(HealthHook {
            engine,
            target: args.probe_target.clone(),
            egress_echo: args.egress_echo_url.clone(),
            timeout: args.probe_timeout,
            tls: Some(tls),
            probe_refresh: PROBE_REFRESH.max(args.drift_poll),
        })
        .with_metrics(metrics.reconcile.clone())
        .with_proxy_cache(cache.clone(), proxy_feed);
    let gc_settings = GcSettings {
        interval: args.gc_interval,
        min_age: args.gc_min_age,
        installation,
    };

    let shutdown = tokio_util::sync::CancellationToken::new();
    let signal = shutdown.clone();
    let grace = args.shutdown_grace;
    tokio::spawn(async move {
        shutdown_signal().await;
        tracing::info!(grace = %humantime::format_duration(grace), "shutting down: finishing reconciles in flight");
        signal.cancel();
        // Reconciles in flight get `grace` to finish their plugin calls; then the calls
        // still running are cut short, so the loops can stop before Kubernetes kills us.
        tokio::time::sleep(grace).await;
        tracing::warn!("shutdown grace period over: cancelling plugin calls in flight");
        rt.cancel_calls();
    });

    {
        let (synced, readiness) = (cache.synced.clone(), readiness.clone());
        tokio::spawn(async move {
            if synced.wait().await {
                tracing::info!("proxy cache synced");
                readiness.set_cache_synced();
            }
        });
    }

    // Discovery API, metrics and probes on one port.
    let auth = if args.discovery_insecure_no_auth {
        Auth::DisabledInsecure
    } else {
        Auth::Kubernetes(client.clone(), AuthSettings::default())
    };
    let (provider_health, reflect_health) =
        proxy_operator::discovery::provider_health_reflector(client.clone());
    let router =
        proxy_operator::discovery::router_with_providers(cache, Some(provider_health), auth).merge(
            proxy_operator::ops::router(Arc::new(metrics), readiness.clone()),
        );
    let listener = tokio::net::TcpListener::bind(args.listen)
        .await
        .with_context(|| format!("listening on {}", args.listen))?;
    tracing::info!(addr = %args.listen, "serving the discovery API, /metrics, /healthz, /readyz");
    let server =
        proxy_operator::discovery::serve(listener, router, shutdown.clone().cancelled_owned());

    let monitor_run = {
        let monitor = Arc::new(Monitor::new(args.provider_check_timeout, metrics_monitor));
        let (registry, client, types) = (registry.clone(), client.clone(), types.clone());
        let readiness = readiness.clone();
        move |token: tokio_util::sync::CancellationToken| {
            let (registry, client, types) = (registry.clone(), client.clone(), types.clone());
            let readiness = readiness.clone();
            let monitor = monitor.clone();
            async move {
                let mut tick = tokio::time::interval(args.provider_check_interval);
                loop {
                    tokio::select! {
                        _ = token.cancelled() => return,
                        _ = tick.tick() => {}
                    }
                    let providers: Vec<Arc<dyn Provider>> =
                        registry.snapshot().values().cloned().collect();
                    let checks = monitor.round(&providers).await;
                    if token.is_cancelled() {
                        // Checks cut short by shutdown say nothing about the backends.
                        return;
                    }
                    let types = types.lock().unwrap_or_else(|e| e.into_inner()).clone();
                    publish(&client, &checks, &types, &readiness.load_errors()).await;
                }
            }
        }
    };
    let reload_run = {
        let registry = registry.clone();
        let readiness = readiness.clone();
        let token = shutdown.clone();
        async move {
            let mut tick = tokio::time::interval(args.reload_interval);
            tick.tick().await;
            loop {
                tokio::select! {
                    _ = token.cancelled() => return,
                    _ = tick.tick() => {}
                }
                if let Some(change) = reloader.poll().await {
                    readiness.set_providers(provider_load(&reloader));
                    if !change.loaded.is_empty() || !change.removed.is_empty() {
                        registry.replace(instrumented(&reloader));
                        *types.lock().unwrap_or_else(|e| e.into_inner()) = plugin_types(&reloader);
                    }
                }
            }
        }
    };
    let reflect = {
        let token = shutdown.clone();
        async move {
            tokio::select! {
                _ = token.cancelled() => {}
                _ = reflect => {}
                _ = reflect_health => {}
            }
        }
    };
    // Reconciler (with the health engine inside it), GC and provider checks run on the
    // leader only, started on every gain of leadership and cancelled on its loss.
    let leadership = if args.leader_election {
        let identity = args.pod_name.clone().unwrap_or_else(|| {
            let host = std::env::var("HOSTNAME").unwrap_or_else(|_| "proxy-operator".into());
            format!("{host}-{}", std::process::id())
        });
        proxy_operator::leader::Leadership::new(
            client.clone(),
            proxy_operator::leader::LeaseSettings {
                namespace: args.namespace.clone(),
                lease_name: args.lease_name.clone(),
                identity,
                duration: args.lease_duration,
                renew: args.lease_renew,
            },
        )
        .context("--lease-duration / --lease-renew")?
    } else {
        tracing::warn!("leader election is off: run a single replica only");
        proxy_operator::leader::Leadership::always()
    };
    let ctx = Arc::new(ctx);
    let leader_only = {
        let leader = leadership.subscribe();
        let (token, grace) = (shutdown.clone(), args.lease_renew);
        async move {
            proxy_operator::leader::run_while_leader(leader, token, grace, |term| {
                let sweeper = Sweeper::new(
                    client.clone(),
                    registry.clone(),
                    gc_settings.clone(),
                    metrics_gc.clone(),
                )
                .with_inventory(inventory.clone());
                let (ctx, stop) = (ctx.clone(), term.clone());
                let monitor_run = monitor_run(term.clone());
                async move {
                    tracing::info!("leading: starting the reconciler, GC and health checks");
                    tokio::join!(
                        // The reconciler, with its health engine, inventory loop and the
                        // metadata watch of cloud-init Secrets (see controller::secret_cache):
                        // all of them stop with leadership, and the Secret data held goes.
                        controller::run(ctx, stop.cancelled_owned()),
                        sweeper.run(term.cancelled()),
                        monitor_run,
                    );
                    tracing::info!("leader-only loops stopped");
                }
            })
            .await;
            leadership.stop().await;
        }
    };
    let (served, ..) = tokio::join!(server, leader_only, reload_run, reflect);
    served.context("serving the discovery API")?;
    Ok(())
}

/// SIGINT or SIGTERM (what Kubernetes sends on pod deletion).
async fn shutdown_signal() {
    let ctrl_c = tokio::signal::ctrl_c();
    #[cfg(unix)]
    {
        let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
            .expect("installing the SIGTERM handler");
        tokio::select! {
            _ = ctrl_c => {}
            _ = term.recv() => {}
        }
    }
    #[cfg(not(unix))]
    let _ = ctrl_c.await;
}
