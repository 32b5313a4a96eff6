//! `egress-demo`: the one-command local demo, run by `cargo xtask demo`.
//!
//! It starts everything on 127.0.0.1 and nothing needs the internet:
//! - an in-memory Kubernetes API (`fake-kube`) served over HTTP, with the CRDs installed —
//!   a **local demo control plane, not for production**;
//! - the Hetzner and EC2 emulators in real-proxy mode: every running instance is a real
//!   forward proxy on 127.0.0.1 (tinyproxy when installed, else a built-in CONNECT proxy),
//!   and with `--clouds` those of DigitalOcean, Vultr, Linode, Scaleway and GCE, one Proxy each;
//! - an echo server answering with the caller's IP: the health probe's egress check and
//!   the target of the demo's own request through a proxy;
//! - the real operator binary (`proxy-operator run`) with the real plugins, pointed at all
//!   of that, with short intervals.
//!
//! Then it tells the story ([`story`]): apply the sample Proxies and show each go
//! Provisioning, Running, Healthy, Ready; ask the discovery API; send a request through a
//! proxy it returned; edit one Proxy (replaced under the same name); delete one; plant an
//! orphan and watch GC remove it. Every step has a timeout; a failed step ends the demo
//! with a non-zero exit after stopping everything. Ctrl-C at any point stops everything.

mod clouds;
mod http;
mod scale;
mod stack;
mod status_page;
mod story;
mod watch;

use anyhow::Result;
use clap::Parser;
use std::path::PathBuf;
use std::time::Duration;

#[derive(Parser, Debug, Clone)]
#[command(
    name = "egress-demo",
    about = "The egress-proxies-operator local demo (run it with `cargo xtask demo`)"
)]
pub struct Args {
    /// The operator binary (`proxy-operator`). Default: next to this binary.
    #[arg(long)]
    pub operator_bin: Option<PathBuf>,
    /// Directory holding the built plugins (ec2.wasm, hetzner.wasm, and those of `--clouds`).
    #[arg(long)]
    pub plugin_dir: PathBuf,
    /// The demo's samples: proxies.yaml and proxy-edit.yaml.
    #[arg(long, default_value = "config/samples/demo")]
    pub samples: PathBuf,
    /// The CRDs to install into the in-memory API.
    #[arg(long, default_value = "config/crd")]
    pub crds: PathBuf,
    /// Where the kubeconfig, providers file, secrets, plugin cache and operator log go.
    #[arg(long, default_value = "target/demo")]
    pub workdir: PathBuf,
    /// Stay up after the story until Ctrl-C, for exploring with kubectl and curl.
    #[arg(long)]
    pub keep_running: bool,
    /// Also run one Proxy on each of these clouds' emulators: a comma-separated list of
    /// digitalocean, vultr, linode, scaleway, gce, proxmox, azure, or `all`. Hetzner and EC2 always run.
    #[arg(long, default_value = "", value_parser = clouds::parse)]
    pub clouds: clouds::Clouds,
    /// Run the built-in CONNECT proxy on every instance even when tinyproxy is installed.
    #[arg(long)]
    pub builtin_proxy: bool,
    /// Port of the in-memory Kubernetes API on 127.0.0.1 (0: any free port).
    #[arg(long, default_value_t = 0)]
    pub api_port: u16,
    /// Port of the operator's discovery API and /metrics on 127.0.0.1 (0: any free port).
    #[arg(long, default_value_t = 0)]
    pub discovery_port: u16,
    /// Port of the echo server on 127.0.0.1 (0: any free port).
    #[arg(long, default_value_t = 0)]
    pub echo_port: u16,
    /// How long each step of the story may take.
    #[arg(long, default_value = "90s", value_parser = parse_duration)]
    pub step_timeout: Duration,
    #[command(subcommand)]
    pub command: Option<Command>,
}

#[derive(clap::Subcommand, Debug, Clone)]
pub enum Command {
    /// Instead of the story: the operator at scale (`cargo xtask scale`): N Proxies, time
    /// to Running, steady-state backend and API requests, drift latency, RSS.
    Scale(scale::ScaleArgs),
}

pub fn parse_duration(s: &str) -> Result<Duration, String> {
    let (num, unit) = s.split_at(s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len()));
    let n: u64 = num
        .parse()
        .map_err(|_| format!("{s:?} is not a duration like 90s or 2m"))?;
    match unit {
        "s" | "" => Ok(Duration::from_secs(n)),
        "m" => Ok(Duration::from_secs(n * 60)),
        _ => Err(format!("{s:?} is not a duration like 90s or 2m")),
    }
}

/// How the demo ended.
enum Outcome {
    Done,
    Interrupted,
}

fn main() -> std::process::ExitCode {
    let args = Args::parse();
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("EGRESS_DEMO_LOG")
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn")),
        )
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .with_target(false)
        .init();
    let rt = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("demo failed: starting the runtime: {e}");
            return std::process::ExitCode::FAILURE;
        }
    };
    let result = match &args.command {
        Some(Command::Scale(s)) => rt.block_on(scale::run(&args, s)).map(|()| Outcome::Done),
        None => rt.block_on(run(args)),
    };
    // The in-memory API's server task ends with the runtime.
    rt.shutdown_timeout(Duration::from_secs(2));
    match result {
        Ok(Outcome::Done) => std::process::ExitCode::SUCCESS,
        Ok(Outcome::Interrupted) => {
            println!("interrupted: everything the demo started is stopped");
            std::process::ExitCode::from(130)
        }
        Err(e) => {
            eprintln!("\ndemo FAILED: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}

async fn run(args: Args) -> Result<Outcome> {
    let started = std::time::Instant::now();
    let interrupted = async {
        // A failure to install the handler must not end the demo at once.
        if tokio::signal::ctrl_c().await.is_err() {
            futures::future::pending::<()>().await;
        }
    };
    tokio::pin!(interrupted);

    let (stack, mut operator) = tokio::select! {
        s = stack::Stack::start(&args) => s?,
        _ = &mut interrupted => return Ok(Outcome::Interrupted),
    };
    let story = async {
        stack::wait_serving(stack.discovery, args.step_timeout).await?;
        story::run(&stack, &args, started).await
    };
    let mut outcome = tokio::select! {
        r = story => r.map(|()| Outcome::Done),
        e = operator.exited() => Err(e),
        _ = &mut interrupted => Ok(Outcome::Interrupted),
    };
    if matches!(outcome, Ok(Outcome::Done)) && args.keep_running {
        stack.print_exploration();
        println!("\nrunning until Ctrl-C");
        outcome = tokio::select! {
            _ = &mut interrupted => Ok(Outcome::Done),
            e = operator.exited() => Err(e),
        };
    }
    operator.wind_down(outcome.is_err()).await;
    println!("stopping: {}", stack.stop());
    println!("stopping: the in-memory Kubernetes API");
    outcome
}
