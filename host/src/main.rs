//! Composition root of the `proxy-operator` binary: parses the command line and wires the
//! library's parts together. No logic of its own lives here.

use anyhow::Context;
use clap::{Parser, Subcommand};
use proxy_operator::config::ProvidersFile;
use proxy_operator::plugin::{Runtime, RuntimeOptions};
use proxy_operator::provider::Provider;
use std::path::PathBuf;

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

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(proxy_operator::telemetry::env_filter(
            &std::env::var("RUST_LOG").unwrap_or_else(|_| "info".into()),
        ))
        .with_writer(std::io::stderr)
        .init();
    match Cli::parse().command {
        Command::Crds { output_dir } => crds(output_dir.as_deref()),
        Command::Openapi => {
            print!("{}", proxy_operator::discovery::openapi::document_text());
            Ok(())
        }
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
