//! Composition root of the `proxy-operator` binary: parses the command line and wires the
//! library's parts together. No logic of its own lives here.

use anyhow::Context;
use clap::{Parser, Subcommand};
use proxy_operator::config::ProvidersFile;
use proxy_operator::conformance::{self, Control, Options, Subject, lifecycle};
use proxy_operator::plugin::WasmProvider;
use proxy_operator::plugin::{Runtime, RuntimeOptions};
use proxy_operator::provider::{Placement, Provider};
use std::path::PathBuf;
use std::time::Duration;

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
        /// Also run every provider's health check and print its targets.
        #[arg(long)]
        check: bool,
        #[command(flatten)]
        runtime: RuntimeArgs,
    },
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

#[derive(Subcommand)]
enum ProviderCommand {
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
    /// Load a plugin and print what it declares: world version, type, version, default
    /// hosts, behaviour profile, size and digest.
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
}

impl RuntimeArgs {
    fn options(&self, file: &ProvidersFile) -> RuntimeOptions {
        let cache =
            (!self.plugin_cache_dir.as_os_str().is_empty()).then(|| self.plugin_cache_dir.clone());
        RuntimeOptions::for_providers(file, cache, self.plugin_scratch_dir.clone())
    }
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

/// Loads the one provider `name` of a providers file, or says why it did not load.
async fn load_provider(
    file_path: &std::path::Path,
    name: &str,
    target: &TargetArgs,
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
    let rt = Runtime::new(target.runtime.options(&file))?;
    let entry = &file.providers[0];
    // Only the plugin this entry names: the others in the directory are not under test.
    let plugin = rt
        .load_plugin(&target.plugin_dir.join(&entry.plugin))
        .await?;
    Ok(rt.provider(plugin, entry).await?)
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(proxy_operator::telemetry::env_filter(
            &std::env::var("RUST_LOG").unwrap_or_else(|_| "info".into()),
        ))
        .with_writer(std::io::stderr)
        .init();
    match Cli::parse().command {
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
                "defaultHosts": p.info.default_hosts,
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
            let p = load_provider(&providers, &provider, &target).await?;
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
            let p = load_provider(&config, &provider, &target).await?;
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
            plugin_dir,
            providers,
            check,
            runtime,
        } => {
            let text = std::fs::read_to_string(&providers)
                .with_context(|| format!("reading providers file {}", providers.display()))?;
            let file = ProvidersFile::parse(&text)?;
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
            if report.provider_errors.is_empty() && report.plugin_errors.is_empty() {
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
