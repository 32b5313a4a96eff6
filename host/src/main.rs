//! Composition root of the `proxy-operator` binary: parses the command line, sets up
//! logging, and hands over to the subcommand's module under `cli/`. No logic of its own
//! lives here.

use clap::{Parser, Subcommand};
use proxy_operator::telemetry::LogFormat;

mod cli;

#[derive(Parser)]
#[command(
    name = "proxy-operator",
    version,
    about = "Keeps egress proxies running on disposable cloud instances; cloud backends are sandboxed WebAssembly plugins."
)]
struct Cli {
    /// How log lines on stderr are written: `text` for people (coloured only on a
    /// terminal), `json` for log pipelines (one object per line, with every span's fields).
    #[arg(long, global = true, env = "LOG_FORMAT", value_enum, default_value_t)]
    log_format: LogFormat,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Work with one plugin file.
    Plugin {
        #[command(subcommand)]
        command: cli::plugin::Command,
    },
    /// Load the providers of a providers file from a plugin directory and report on each:
    /// what loaded, what did not and why, and (with --check) each provider's health check.
    Providers(cli::providers::Args),
    /// Run the operator: the Proxy reconciler, orphan GC, health probes and provider checks
    /// (on the elected leader), and the discovery API, /metrics, /healthz and /readyz (on
    /// every replica), over the providers loaded from the plugin directory and reloaded
    /// when it or the providers file changes.
    Run(Box<cli::run::Args>),
    /// Print the operator's CustomResourceDefinitions as YAML (generated from the Rust types),
    /// or write one file per CRD into a directory (how config/crd/ is regenerated).
    Crds(cli::crds::Args),
    /// Print the discovery API's OpenAPI 3 document (JSON), as served at /openapi.json and
    /// committed as docs/openapi/discovery.json.
    Openapi,
    /// Print the operator's RBAC rules (ClusterRole and leader-election Role) as YAML, as
    /// committed in config/rbac/role.yaml.
    Rbac,
    /// Work with one configured provider.
    Provider {
        #[command(subcommand)]
        command: cli::provider::Command,
    },
    /// Run the provider conformance suite: one provider of a providers file, configured
    /// against an emulator of its backend that serves the `/_emulator/` control surface.
    /// Prints one line per case and a total; exits non-zero when any case fails.
    Conformance(cli::conformance::Args),
    /// Compile one plugin (stdin) to an artifact (stdout) for an engine with these options:
    /// how the operator keeps cranelift out of its own long-running process.
    #[command(name = "compile-plugin", hide = true)]
    CompilePlugin(egress_plugin_host::plugin::compiler::ChildArgs),
}

fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    // The operator's own child: no runtime, no logging, no exporters (its memory is the
    // compile's, within its limits); its parent reads stderr.
    if let Command::CompilePlugin(args) = &cli.command {
        std::process::exit(egress_plugin_host::plugin::compiler::child_main(args));
    }
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?
        .block_on(run(cli))
}

async fn run(cli: Cli) -> anyhow::Result<()> {
    let _telemetry = proxy_operator::telemetry::init(
        &std::env::var("RUST_LOG").unwrap_or_else(|_| "info".into()),
        cli.log_format,
    )?;
    // Plugins' files and sockets come out of the same open-file limit as the operator's
    // own: take all the hard limit allows (plugin/fs.rs and plugin/http.rs cap each call).
    match egress_plugin_host::fdlimit::raise_nofile() {
        Ok(l) => tracing::debug!(
            before = l.before,
            soft = l.soft,
            hard = l.hard,
            "open-file limit (RLIMIT_NOFILE)"
        ),
        Err(e) => tracing::warn!(error = %e, "cannot read the open-file limit (RLIMIT_NOFILE)"),
    }
    match cli.command {
        Command::Plugin { command } => cli::plugin::run(command).await,
        Command::Providers(args) => cli::providers::run(args).await,
        Command::Run(args) => cli::run::run(*args).await,
        Command::Crds(args) => cli::crds::run(&args),
        Command::Openapi => cli::openapi::run(),
        Command::Rbac => cli::rbac::run(),
        Command::Provider { command } => cli::provider::run(command).await,
        Command::Conformance(args) => cli::conformance::run(args).await,
        Command::CompilePlugin(_) => unreachable!("handled before logging is set up"),
    }
}
