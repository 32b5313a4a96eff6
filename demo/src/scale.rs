//! `egress-demo scale`: the operator at scale, run by `cargo xtask scale`.
//!
//! The same local stack as the demo (the in-memory Kubernetes API, the Hetzner and EC2
//! emulators, the real `proxy-operator run` with the real plugins), set up for measuring:
//!
//! - the emulators enforce their backend's rate limit (Hetzner 3,600/h with a 3,600-deep
//!   bucket, EC2 72,000/h with 100 per action), and the operator's providers carry a request
//!   budget (by default the plugin's shipped one);
//! - **time compression** by `--factor F`: every interval of the operator is divided by F,
//!   and the budget and the emulator's limit multiplied by F, so an hour of the operator's
//!   time passes in 3600/F s. Per-hour figures are counted in that scaled time and reported
//!   as real-time figures. Not compressed: the health probe interval (30 s; probes are about
//!   the proxies, not the backend), its 30-minute `lastProbe` refresh (a constant), the
//!   Lease renewals (5 s, counted per real hour), the operator's transient-error backoff;
//! - no proxy listens: instances get loopback addresses (Hetzner 127.1.x.y, EC2 127.0.0.1)
//!   and a port nothing listens on, so every health probe is refused at once (the operator
//!   has no switch to turn probes off). Each Proxy goes Running with `Healthy=False`: the
//!   same status writes as a healthy one (one verdict change), and little probe load. The
//!   probe interval is N/1000 s (2 to 30 s) and one failure decides, so that the verdicts,
//!   one write per Proxy, land before the steady state is measured.
//!
//! Steps: create N Proxies at once (directly in the API's store), wait until all are
//! Running and have their health verdict, settle, measure a steady-state window, delete one instance behind the
//! operator's back and time its replacement, stop. The figures go to stdout as a Markdown
//! table and with `--json FILE` as JSON (the table included, under `markdown`).

use crate::stack::{self, Operator};
use crate::{Args, parse_duration};
use anyhow::{Context, Result, ensure};
use egress_emulators::control::{Emulator, RateLimit, RequestStats};
use egress_emulators::ec2::{Ec2Config, Ec2Emulator};
use egress_emulators::hetzner::{HetznerConfig, HetznerEmulator, RunSchedule};
use fake_kube::{FakeApi, RequestRecord};
use serde_json::{Value, json};
use std::collections::BTreeMap;
use std::net::{Ipv4Addr, SocketAddr};
use std::path::PathBuf;
use std::time::{Duration, Instant};

#[derive(clap::Args, Debug, Clone)]
pub struct ScaleArgs {
    /// How many Proxies to create (all at once).
    #[arg(long)]
    pub proxies: usize,
    /// The provider every Proxy uses.
    #[arg(long, default_value = "hetzner", value_parser = ["hetzner", "ec2"])]
    pub provider: String,
    /// Time compression: the operator's intervals divided by F, the budget and the
    /// emulator's rate limit multiplied by F.
    #[arg(long, default_value_t = 30)]
    pub factor: u32,
    /// The steady-state window, in the operator's (scaled) minutes.
    #[arg(long, default_value_t = 30)]
    pub minutes: u64,
    /// Settling between convergence and the window, in the operator's minutes.
    #[arg(long, default_value_t = 6)]
    pub settle_minutes: u64,
    /// The provider's request budget per hour (the providers file's
    /// `budget.requestsPerHour`, before compression). Default: the plugin's shipped one
    /// (hetzner 3,600, ec2 72,000).
    #[arg(long)]
    pub budget: Option<u32>,
    /// The budget's burst.
    #[arg(long, default_value_t = 100)]
    pub burst: u32,
    /// The emulator's rate limit per hour (before compression). Default: the backend's
    /// (hetzner 3,600, ec2 72,000 per action).
    #[arg(long)]
    pub backend_limit: Option<u32>,
    /// The emulator's bucket depth. Default: the backend's (hetzner 3,600, ec2 100).
    #[arg(long)]
    pub backend_burst: Option<u32>,
    /// How long a Hetzner server takes from its create to `running`, in the backend's own
    /// time (compressed by the factor like everything else): Hetzner's servers boot in
    /// seconds, whoever looks. `0s`: the emulator's test default instead, running after
    /// the first read that sees it (which takes a confirmation two reads).
    #[arg(long, default_value = "20s", value_parser = parse_duration)]
    pub boot: Duration,
    /// The operator's drift poll, in its own time (`--drift-poll` before compression).
    #[arg(long, default_value = "5m", value_parser = parse_duration)]
    pub drift_poll: Duration,
    /// The measured provider's call slots (`limits.concurrency` in the providers file).
    /// Default: the operator's default for it.
    #[arg(long)]
    pub slots: Option<u32>,
    /// Reconciles at once (`--concurrency` of the operator).
    #[arg(long, default_value_t = 3)]
    pub concurrency: u16,
    /// The operator's `--redaction-memory` (a Kubernetes quantity), when not its default:
    /// every Proxy here has generated credentials, about 1.6 KiB of it each.
    #[arg(long)]
    pub redaction_memory: Option<String>,
    /// How long (real time) all Proxies may take to become Running.
    #[arg(long, default_value = "40m", value_parser = parse_duration)]
    pub timeout: Duration,
    /// Write the figures as JSON here.
    #[arg(long)]
    pub json: Option<PathBuf>,
}

/// Namespace of the benchmark's Proxies.
const NAMESPACE: &str = "scale";
const PROXY_API: &str = "egress.proxy-operator.dev/v1alpha1";

/// A provider's shipped budget per hour, and its backend's rate limit and bucket depth.
fn shipped(provider: &str) -> (u32, RateLimit) {
    match provider {
        "ec2" => (
            72_000,
            RateLimit {
                per_hour: 72_000,
                burst: 100,
            },
        ),
        _ => (
            3_600,
            RateLimit {
                per_hour: 3_600,
                burst: 3_600,
            },
        ),
    }
}

impl ScaleArgs {
    fn budget(&self) -> u32 {
        self.limits(&self.provider).0
    }

    fn backend_limit(&self) -> RateLimit {
        self.limits(&self.provider).1
    }

    /// A provider's budget per hour and its backend's limit, before compression: the
    /// shipped ones, with this run's overrides for the measured provider.
    fn limits(&self, provider: &str) -> (u32, RateLimit) {
        let (budget, limit) = shipped(provider);
        if provider != self.provider {
            return (budget, limit);
        }
        (
            self.budget.unwrap_or(budget),
            RateLimit {
                per_hour: self.backend_limit.unwrap_or(limit.per_hour),
                burst: self.backend_burst.unwrap_or(limit.burst),
            },
        )
    }

    /// A backend's limit as its emulator enforces it: compressed.
    fn emulator_limit(&self, provider: &str) -> Option<RateLimit> {
        let l = self.limits(provider).1;
        Some(RateLimit {
            per_hour: l.per_hour.saturating_mul(self.factor),
            burst: l.burst,
        })
    }

    /// An interval of the operator's time, in real time, as `proxy-operator` parses it.
    fn scaled(&self, d: Duration) -> String {
        format!(
            "{}ms",
            (d.as_millis() / u128::from(self.factor.max(1))).max(1)
        )
    }

    fn real(&self, operator_time: Duration) -> Duration {
        operator_time / self.factor.max(1)
    }
}

/// A scrape of the operator's `/metrics`: every sample, `(name, labels, value)`.
struct Metrics(Vec<(String, BTreeMap<String, String>, f64)>);

impl Metrics {
    fn parse(text: &str) -> Metrics {
        let mut out = Vec::new();
        for line in text.lines().filter(|l| !l.starts_with('#')) {
            let Some((head, value)) = line.rsplit_once(' ') else {
                continue;
            };
            let Ok(value) = value.parse::<f64>() else {
                continue;
            };
            let (name, labels) = match head.split_once('{') {
                Some((n, rest)) => (n, rest.trim_end_matches('}')),
                None => (head, ""),
            };
            let labels = labels
                .split("\",")
                .filter_map(|kv| kv.split_once('='))
                .map(|(k, v)| (k.to_string(), v.trim_matches('"').to_string()))
                .collect();
            out.push((name.to_string(), labels, value));
        }
        Metrics(out)
    }

    /// The sum of a family's samples whose labels pass `keep`.
    fn sum(&self, name: &str, keep: impl Fn(&BTreeMap<String, String>) -> bool) -> f64 {
        self.0
            .iter()
            .filter(|(n, l, _)| n == name && keep(l))
            .map(|(_, _, v)| v)
            .sum()
    }

    /// A histogram's cumulative buckets (`le` -> count), summed over its other labels.
    fn buckets(&self, name: &str) -> BTreeMap<u64, f64> {
        let mut out = BTreeMap::new();
        for (n, l, v) in &self.0 {
            if n == &format!("{name}_bucket") {
                let le = l
                    .get("le")
                    .map_or(f64::INFINITY, |s| s.parse().unwrap_or(f64::INFINITY));
                *out.entry(le.to_bits()).or_default() += v;
            }
        }
        out
    }
}

/// The `q` quantile of what a histogram counted between two scrapes: the upper bound of
/// the first bucket that holds it (infinite past the last bound); `None` without samples.
fn quantile(before: &Metrics, after: &Metrics, name: &str, q: f64) -> Option<f64> {
    let (b0, b1) = (before.buckets(name), after.buckets(name));
    let mut bounds: Vec<(f64, f64)> = b1
        .iter()
        .map(|(le, v)| (f64::from_bits(*le), v - b0.get(le).copied().unwrap_or(0.0)))
        .collect();
    bounds.sort_by(|a, b| a.0.total_cmp(&b.0));
    let total = bounds.last()?.1;
    (total > 0.0).then(|| {
        bounds
            .iter()
            .find(|(_, c)| *c >= q * total)
            .map_or(f64::INFINITY, |(le, _)| *le)
    })
}

/// `VmRSS` / `VmHWM` (peak) of a process, in MiB (0 when unreadable).
fn memory_mib(pid: u32, field: &str) -> f64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix(field))
                .and_then(|v| v.split_whitespace().next()?.parse::<f64>().ok())
        })
        .unwrap_or(0.0)
        / 1024.0
}

/// CPU time the process has used (user + system), from /proc/PID/stat (clock ticks of
/// 1/100 s).
fn cpu_seconds(pid: u32) -> f64 {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|s| {
            // Fields after the command name (which may hold spaces): state is the first.
            let rest = s.rsplit_once(')')?.1;
            let f: Vec<&str> = rest.split_whitespace().collect();
            let ticks = f.get(11)?.parse::<f64>().ok()? + f.get(12)?.parse::<f64>().ok()?;
            Some(ticks / 100.0)
        })
        .unwrap_or(0.0)
}

async fn scrape(addr: SocketAddr) -> Result<Metrics> {
    let a = crate::http::get(addr, "/metrics", None).await?;
    ensure!(a.status == 200, "/metrics answered {}", a.status);
    Ok(Metrics::parse(&a.body))
}

/// API requests the operator made: (all, writes, of which Lease writes, writes by `verb
/// resource`).
fn api_counts(records: &[RequestRecord]) -> (u64, u64, u64, BTreeMap<String, u64>) {
    let mut by = BTreeMap::new();
    let writes: Vec<&RequestRecord> = records
        .iter()
        .filter(|r| {
            matches!(
                r.verb.as_str(),
                "create" | "update" | "patch" | "delete" | "deletecollection"
            )
        })
        .collect();
    for r in &writes {
        let what = format!("{} {}", r.verb, r.rbac_resource().unwrap_or_default());
        *by.entry(what).or_default() += 1;
    }
    let lease = writes
        .iter()
        .filter(|r| r.resource.as_deref() == Some("leases"))
        .count();
    (records.len() as u64, writes.len() as u64, lease as u64, by)
}

fn proxy_doc(i: usize, provider: &str, port: u16) -> Value {
    let placement = match provider {
        "ec2" => {
            json!({"region": "eu-west-1", "zone": "eu-west-1a", "machineType": "t3.micro", "image": "debian"})
        }
        _ => {
            json!({"region": "fsn1", "zone": "fsn1-dc14", "machineType": "cpx11", "image": "ubuntu"})
        }
    };
    json!({
        "apiVersion": PROXY_API, "kind": "Proxy",
        "metadata": {"name": format!("p{i:05}"), "namespace": NAMESPACE},
        "spec": {"provider": provider, "placement": placement, "port": port,
                 "cloudInit": {"inline": "#cloud-config\n"}},
    })
}

/// Creates Proxies `p00000`.. through the API, one at a time; returns how long that took
/// from `t0` (real time).
async fn apply(
    client: kube::Client,
    n: usize,
    provider: String,
    port: u16,
    t0: Instant,
) -> Result<Duration> {
    let api = kube::Api::<kube::api::DynamicObject>::namespaced_with(
        client,
        NAMESPACE,
        &crate::watch::proxy_resource(),
    );
    for i in 0..n {
        let doc = serde_json::from_value(proxy_doc(i, &provider, port))?;
        api.create(&kube::api::PostParams::default(), &doc)
            .await
            .with_context(|| format!("creating Proxy {i}"))?;
    }
    Ok(t0.elapsed())
}

/// When (real seconds after `t0`) the watch first shows a Proxy of the run Running. The
/// counting poll is coarse for large runs: a scan of 10,000 Proxies every 20 ms would hold
/// the API's lock a good share of the time, and its 0.5 s steps are 30 s of the operator's
/// time at x60, half the first-Running goal.
fn first_running(client: kube::Client, t0: Instant) -> tokio::task::JoinHandle<Option<f64>> {
    use futures::StreamExt;
    use kube::runtime::{WatchStreamExt, watcher};
    let api = kube::Api::<kube::api::DynamicObject>::namespaced_with(
        client,
        NAMESPACE,
        &crate::watch::proxy_resource(),
    );
    tokio::spawn(async move {
        let mut objects = watcher(api, watcher::Config::default())
            .default_backoff()
            .applied_objects()
            .boxed();
        while let Some(o) = objects.next().await {
            let Ok(o) = o else { continue };
            let v = crate::watch::view_of(&serde_json::to_value(&o).unwrap_or_default());
            if matches!(v.phase.as_str(), "Running" | "Healthy" | "Ready")
                && v.provider_id.is_some()
            {
                return Some(t0.elapsed().as_secs_f64());
            }
        }
        None
    })
}

/// The Proxies that run (state Running with an instance), by name -> provider ID.
/// Read in place (`FakeApi::scan`): a copy of every Proxy at each poll held the API's
/// lock long enough to slow the operator's own requests.
fn running(api: &FakeApi) -> BTreeMap<String, String> {
    api.scan("proxies", |o| {
        let v = crate::watch::view_of(o);
        let up = matches!(v.phase.as_str(), "Running" | "Healthy" | "Ready");
        let name = o["metadata"]["name"].as_str()?.to_string();
        up.then_some((name, v.provider_id?))
    })
    .into_iter()
    .collect()
}

/// How many Proxies carry a health verdict (`Healthy` True or False, not Unknown).
fn probed(api: &FakeApi) -> usize {
    api.scan("proxies", |o| {
        o["status"]["conditions"]
            .as_array()
            .is_some_and(|cs| {
                cs.iter()
                    .any(|c| c["type"] == "Healthy" && c["status"] != "Unknown")
            })
            .then_some(())
    })
    .len()
}

fn verdict(ok: bool) -> &'static str {
    if ok { "**pass**" } else { "**FAIL**" }
}

/// Everything a run measured, and the Markdown table of it.
struct Figures {
    json: Value,
    rows: Vec<[String; 4]>,
}

impl Figures {
    fn row(&mut self, what: &str, value: String, goal: &str, ok: Option<bool>) {
        self.rows.push([
            what.to_string(),
            value,
            goal.to_string(),
            ok.map(verdict).unwrap_or_default().to_string(),
        ]);
    }

    fn markdown(&self) -> String {
        let mut s = String::from("| figure | measured | goal | verdict |\n|---|---|---|---|\n");
        for r in &self.rows {
            s.push_str(&format!("| {} | {} | {} | {} |\n", r[0], r[1], r[2], r[3]));
        }
        s
    }
}

pub async fn run(args: &Args, s: &ScaleArgs) -> Result<()> {
    ensure!(s.proxies > 0, "--proxies must be at least 1");
    ensure!(s.factor >= 1, "--factor must be at least 1");
    let (operator_bin, plugin_dir) = stack::binaries(args)?;
    let workdir = stack::absolute(&args.workdir)?;
    std::fs::create_dir_all(&workdir).with_context(|| format!("creating {}", workdir.display()))?;
    let f = s.factor;
    let kubeconfig = workdir.join("kubeconfig");
    let (api, _api_addr) = stack::start_api(&stack::absolute(&args.crds)?, 0, &kubeconfig).await?;

    // Both emulators run (the operator loads both plugins); each enforces its backend's
    // limit, compressed.
    let limit = s.backend_limit();
    let mut hetzner_config = HetznerConfig {
        first_ipv4: Ipv4Addr::new(127, 1, 0, 1),
        rate_limit: s.emulator_limit("hetzner"),
        ..HetznerConfig::new(stack::HETZNER_TOKEN)
    };
    if !s.boot.is_zero() {
        hetzner_config.run_schedule = RunSchedule::After(s.boot / f);
    }
    let hetzner = HetznerEmulator::start(hetzner_config);
    let ec2 = Ec2Emulator::start(Ec2Config {
        rate_limit: s.emulator_limit("ec2"),
        ..Ec2Config::default()
    });
    let emu: &dyn Emulator = if s.provider == "ec2" { &ec2 } else { &hetzner };

    let budget = s.budget();
    let mut extra = BTreeMap::new();
    for name in ["hetzner", "ec2"] {
        let mut lines = format!(
            "    budget: {{requestsPerHour: {}, burst: {}}}\n",
            s.limits(name).0.saturating_mul(f),
            s.burst
        );
        if let Some(n) = s.slots.filter(|_| name == s.provider) {
            lines.push_str(&format!("    limits: {{concurrency: {n}}}\n"));
        }
        extra.insert(name, lines);
    }
    let providers_file = workdir.join("providers.yaml");
    stack::write_providers(
        &providers_file,
        &workdir.join("secrets"),
        &hetzner.url(),
        &ec2.url(),
        &extra,
    )?;
    let listen = SocketAddr::from(([127, 0, 0, 1], stack::free_port(0)?));
    let mut op_args = stack::operator_args(&plugin_dir, &providers_file, &workdir, listen);
    let secs = Duration::from_secs;
    for (flag, operator_time) in [
        ("--provisioning-poll", secs(10)),
        ("--deletion-poll", secs(10)),
        ("--drift-poll", s.drift_poll),
        ("--requeue-now", secs(1)),
        ("--quota-retry", secs(300)),
        ("--input-retry", secs(30)),
        ("--gc-interval", secs(600)),
        ("--gc-min-age", secs(600)),
        ("--provider-check-interval", secs(60)),
    ] {
        op_args.push(flag.into());
        op_args.push(s.scaled(operator_time));
    }
    if let Some(m) = &s.redaction_memory {
        op_args.extend(["--redaction-memory".to_string(), m.clone()]);
    }
    // Nothing listens on the Proxies' port: every probe is refused at once.
    let port = stack::free_port(0)?;
    op_args.extend(
        [
            "--concurrency",
            &s.concurrency.to_string(),
            "--probe-target",
            "127.0.0.1:9",
            "--probe-failure-threshold",
            "1",
            "--probe-interval",
            &format!("{}s", (s.proxies / 1000).clamp(2, 30)),
            "--shutdown-grace",
            "5s",
        ]
        .map(String::from),
    );
    let mut operator = Operator::spawn(&operator_bin, &op_args, &kubeconfig, &workdir, "warn")?;
    println!(
        "scale: {} Proxies on {}, time x{f} (budget {budget}/h burst {}, backend limit {}/h burst {}, drift poll {:?}); operator pid {}, log {}",
        s.proxies,
        s.provider,
        s.burst,
        limit.per_hour,
        limit.burst,
        s.drift_poll,
        operator.pid,
        operator.log.display()
    );

    let result = tokio::select! {
        r = measure(s, &api, emu, operator.pid, listen, port) => r,
        e = operator.exited() => Err(e),
    };
    operator.wind_down(result.is_err()).await;
    let figures = result?;
    print!("\n{}", figures.markdown());
    if let Some(path) = &s.json {
        let mut json = figures.json.clone();
        json["markdown"] = figures.markdown().into();
        std::fs::write(path, serde_json::to_string_pretty(&json)?)
            .with_context(|| format!("writing {}", path.display()))?;
        println!("wrote {}", path.display());
    }
    drop((hetzner, ec2));
    Ok(())
}

/// Per hour of the operator's time, from a count over `real` seconds of compressed time.
fn per_hour(count: f64, real: Duration, factor: u32) -> f64 {
    count * 3600.0 / (real.as_secs_f64() * f64::from(factor))
}

async fn measure(
    s: &ScaleArgs,
    api: &FakeApi,
    emu: &dyn Emulator,
    pid: u32,
    listen: SocketAddr,
    port: u16,
) -> Result<Figures> {
    let n = s.proxies;
    // Ready, not only serving: on a cold plugin cache the operator compiles its plugins
    // first (about a second of real time each, not compressed), and at x60 the first
    // Proxies of a run on a fresh work directory waited 100 to 156 s of operator time for
    // them, against 34 to 55 s on a warm cache. The goal times a running operator.
    stack::wait_ready(listen, Duration::from_secs(120)).await?;
    api.create(json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}}))
        .map_err(|e| anyhow::anyhow!("creating namespace {NAMESPACE}: {e:?}"))?;

    // Convergence: all at once, until every one runs.
    let start_stats = emu.stats();
    let t0 = Instant::now();
    // The apply goes through the API, one create after the other, as `kubectl apply` sends
    // it, while the operator watches: the first Proxies are seen, created and confirmed
    // while the last are still being applied. (Creating them straight into the in-memory
    // store, as this driver first did, held the store's lock from one create to the next:
    // the operator's status writes waited for the whole apply, 1.85 s real at 10,000, so
    // at x60 no Proxy could run before 111 s of operator time.)
    let first = first_running(api.client(), t0);
    let applier = tokio::spawn(apply(api.client(), n, s.provider.clone(), port, t0));
    let poll = if n > 2000 { secs_f(2.0) } else { secs_f(0.5) };
    let mut last_print = Instant::now();
    // Running over time: sampled finely until the first one runs (its time is a goal),
    // then at `poll`.
    let mut curve: Vec<(f64, usize)> = vec![(0.0, 0)];
    // Samples of ProviderHealth that showed a provider check timed out.
    let mut check_timeouts = 0usize;
    // `--timeout` without convergence still measures the rest (marked as such): where it
    // stalls is a finding too.
    let (converged, up) = loop {
        let up = running(api).len();
        if curve.last().is_none_or(|(_, u)| *u != up) {
            curve.push((t0.elapsed().as_secs_f64(), up));
        }
        if up == n || t0.elapsed() >= s.timeout {
            break (t0.elapsed(), up);
        }
        if up == 0 {
            // Counting scans every Proxy: finely for small runs, at most every 0.5 s for
            // large ones (the driver shares the 2 cores with the API it serves).
            check_timeouts += check_timed_out(api);
            let fine = if n > 2000 { 500 } else { 20 };
            tokio::time::sleep(Duration::from_millis(fine)).await;
            continue;
        }
        if last_print.elapsed() > Duration::from_secs(15) {
            last_print = Instant::now();
            println!(
                "  {:>5.0} s: {up}/{n} Running, {} backend requests, operator RSS {:.0} MiB",
                t0.elapsed().as_secs_f64(),
                emu.stats().since(&start_stats).total,
                memory_mib(pid, "VmRSS:")
            );
        }
        // Provider checks between samples: a CheckTimeout shows in ProviderHealth until
        // the next check, so it is looked for more often than the Proxies are counted.
        let tick = Instant::now();
        while tick.elapsed() < poll {
            check_timeouts += check_timed_out(api);
            tokio::time::sleep(Duration::from_millis(100).min(poll)).await;
        }
    };
    let applied = applier.await.context("the apply panicked")??;
    // The first Running Proxy to the watch event, where the poll above saw it later.
    first.abort();
    if let Ok(Some(t)) = first.await
        && let Some(at) = curve.iter().position(|(_, up)| *up > 0)
        && t < curve[at].0
    {
        curve.insert(at, (t, 1));
    }
    let conv = emu.stats().since(&start_stats);
    // The operator started with this run: its wait histograms so far are convergence's.
    let mc = scrape(listen).await?;
    let (conv_api, conv_writes, _, _) = api_counts(&api.requests());
    api.clear_requests();
    println!(
        "  {up} of {n} Running after {:.1} s ({} backend requests, {} rate-limited)",
        converged.as_secs_f64(),
        conv.total,
        conv.rate_limited
    );
    let after_convergence = emu.stats();

    // Every Proxy's first health verdict is one status write of its convergence, not of
    // the steady state: wait for all of them.
    let tp = Instant::now();
    while probed(api) < up {
        ensure!(
            tp.elapsed() < Duration::from_secs(300),
            "health verdicts missing after 300 s"
        );
        tokio::time::sleep(poll).await;
    }
    println!(
        "  every Proxy has its health verdict {:.1} s later",
        tp.elapsed().as_secs_f64()
    );

    // Settle, then the steady-state window.
    let settle = s
        .real(Duration::from_secs(60 * s.settle_minutes))
        .max(s.real(s.drift_poll) * 2);
    println!("  settling {:.1} s", settle.as_secs_f64());
    tokio::time::sleep(settle).await;
    let window = s
        .real(Duration::from_secs(60 * s.minutes))
        .max(s.real(s.drift_poll) * 3);
    println!("  steady-state window {:.1} s", window.as_secs_f64());
    let m0 = scrape(listen).await?;
    let w0 = emu.stats();
    api.clear_requests();
    let tw = Instant::now();
    let cpu0 = cpu_seconds(pid);
    let mut rss_max: f64 = 0.0;
    while tw.elapsed() < window {
        rss_max = rss_max.max(memory_mib(pid, "VmRSS:"));
        tokio::time::sleep(Duration::from_millis(500).min(window)).await;
    }
    let real_window = tw.elapsed();
    let cpu = (cpu_seconds(pid) - cpu0) / real_window.as_secs_f64();
    let steady = emu.stats().since(&w0);
    let records = api.requests();
    let m1 = scrape(listen).await?;
    let rss_steady = memory_mib(pid, "VmRSS:");
    // What of it is heap and stacks, and what the binary's code and other mapped files:
    // the code pages count in RSS too (about 20 MiB of the release binary's are touched).
    let rss_split = (memory_mib(pid, "RssAnon:"), memory_mib(pid, "RssFile:"));
    let (api_all, api_writes, lease_writes, writes_by) = api_counts(&records);

    // Drift: one instance deleted behind the operator's back.
    let before = running(api);
    let (victim, old_id) = before
        .iter()
        .next()
        .map(|(k, v)| (k.clone(), v.clone()))
        .context("no running Proxy")?;
    let backend_id = old_id.rsplit('/').next().unwrap_or(&old_id).to_string();
    emu.start_slow_delete(&backend_id);
    emu.finish_deletes();
    let td = Instant::now();
    let drift_timeout = s.real(s.drift_poll) * 10 + Duration::from_secs(60);
    // When the status first names another instance (the loss noticed, its replacement
    // created), and when that one runs.
    let mut replaced = None;
    let drift = loop {
        if let Some(o) = api.object("proxies", Some(NAMESPACE), &victim) {
            let v = crate::watch::view_of(&o);
            if v.provider_id.as_deref().is_some_and(|id| id != old_id) {
                let at = *replaced.get_or_insert(td.elapsed());
                if matches!(v.phase.as_str(), "Running" | "Healthy" | "Ready") {
                    break (at, td.elapsed());
                }
            }
        }
        if td.elapsed() > drift_timeout {
            println!(
                "  Proxy {victim} got no new instance within {drift_timeout:?} after its instance {old_id} was deleted"
            );
            let never = Duration::MAX;
            break (replaced.unwrap_or(never), never);
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    let m2 = scrape(listen).await?;
    let since_convergence = emu.stats().since(&after_convergence);
    let rss_peak = memory_mib(pid, "VmHWM:");

    Ok(figures(
        s,
        Measured {
            converged,
            applied,
            curve,
            check_timeouts,
            mc,
            up,
            conv,
            conv_api,
            conv_writes,
            real_window,
            steady,
            api_all,
            api_writes,
            lease_writes,
            writes_by,
            m0,
            m1,
            m2,
            drift,
            since_convergence,
            rss_peak,
            rss_steady,
            rss_max,
            rss_split,
            cpu,
        },
    ))
}

/// 1 when some ProviderHealth shows a target whose check timed out, else 0.
fn check_timed_out(api: &FakeApi) -> usize {
    api.scan("providerhealths", |h| {
        h["status"]["targets"]
            .as_array()?
            .iter()
            .any(|t| t["reason"] == "CheckTimeout")
            .then_some(())
    })
    .len()
    .min(1)
}

/// When the Running count first reached `k` (real seconds), from the sampled curve.
fn time_to(curve: &[(f64, usize)], k: usize) -> Option<f64> {
    curve.iter().find(|(_, up)| *up >= k).map(|(t, _)| *t)
}

/// The longest stretch (real seconds) between the first Running Proxy and the last in
/// which no more came: a plateau while creates run.
fn longest_plateau(curve: &[(f64, usize)]) -> f64 {
    let from = curve.iter().position(|(_, up)| *up > 0).unwrap_or(0);
    curve[from..]
        .windows(2)
        .map(|w| w[1].0 - w[0].0)
        .fold(0.0, f64::max)
}

/// The upper bound of the highest histogram bucket `name` counted anything in, for the
/// series `keep`: the longest observation, to a bucket's precision.
fn longest(
    m: &Metrics,
    name: &str,
    keep: impl Fn(&BTreeMap<String, String>) -> bool,
) -> Option<f64> {
    let bucket = format!("{name}_bucket");
    let mut by_le: BTreeMap<u64, f64> = BTreeMap::new();
    for (n, labels, v) in &m.0 {
        if *n != bucket || !keep(labels) {
            continue;
        }
        let le = labels
            .get("le")
            .map_or(f64::INFINITY, |s| s.parse().unwrap_or(f64::INFINITY));
        *by_le.entry(le.to_bits()).or_default() += v;
    }
    let mut les: Vec<(f64, f64)> = by_le
        .into_iter()
        .map(|(k, v)| (f64::from_bits(k), v))
        .collect();
    les.sort_by(|a, b| a.0.total_cmp(&b.0));
    let total = les.last()?.1;
    if total == 0.0 {
        return None;
    }
    les.into_iter().find(|(_, c)| *c >= total).map(|(le, _)| le)
}

fn secs_f(s: f64) -> Duration {
    Duration::from_secs_f64(s)
}

struct Measured {
    /// How long until all ran, or until `--timeout` when `up` < N.
    converged: Duration,
    /// How long creating the Proxies took, from `t0` (real time).
    applied: Duration,
    /// (real seconds since the apply, Proxies Running), at each change seen.
    curve: Vec<(f64, usize)>,
    /// The operator's metrics at convergence.
    mc: Metrics,
    /// Samples during convergence in which a ProviderHealth showed `CheckTimeout`.
    check_timeouts: usize,
    up: usize,
    conv: RequestStats,
    conv_api: u64,
    conv_writes: u64,
    real_window: Duration,
    steady: RequestStats,
    api_all: u64,
    api_writes: u64,
    lease_writes: u64,
    writes_by: BTreeMap<String, u64>,
    m0: Metrics,
    m1: Metrics,
    m2: Metrics,
    /// Instance deleted -> another one in status, -> that one Running.
    drift: (Duration, Duration),
    since_convergence: RequestStats,
    rss_peak: f64,
    rss_steady: f64,
    rss_max: f64,
    /// Steady RSS: anonymous (heap, stacks) and file-backed (the binary's code, mapped
    /// plugin artifacts), in MiB.
    rss_split: (f64, f64),
    /// The operator's CPU in the window, in cores.
    cpu: f64,
}

fn figures(s: &ScaleArgs, m: Measured) -> Figures {
    let (f, n) = (s.factor, s.proxies as f64);
    let n_usize = s.proxies;
    let budget = f64::from(s.budget());
    let w = m.real_window;
    let scaled_h = |count: u64| per_hour(count as f64, w, f);
    let real_h = |count: u64| count as f64 * 3600.0 / w.as_secs_f64();
    let steady_h = scaled_h(m.steady.total);
    let by_op_h: BTreeMap<String, f64> = m
        .steady
        .by_op
        .iter()
        .map(|(k, v)| (k.clone(), scaled_h(*v)))
        .collect();
    // Lease renewals run in real time; everything else in the operator's.
    let proxy_writes_h = scaled_h(m.api_writes - m.lease_writes);
    let lease_writes_h = real_h(m.lease_writes);
    let writes_per_proxy_h = (proxy_writes_h + lease_writes_h) / n;
    let writes_by_h: BTreeMap<String, f64> = m
        .writes_by
        .iter()
        .map(|(k, v)| {
            let h = if k.ends_with(" leases") {
                real_h(*v)
            } else {
                scaled_h(*v)
            };
            (k.clone(), h)
        })
        .collect();
    let api_h = scaled_h(m.api_all - m.lease_writes) + lease_writes_h;
    // Writes that do not grow with the fleet: Lease renewals (one replica's) and the
    // ProviderHealth objects (one per provider). The rest are the Proxies' own (status,
    // finalizers, Events).
    let fixed = |k: &str| k.ends_with(" leases") || k.contains(" providerhealths");
    let fixed_writes_h: f64 = writes_by_h
        .iter()
        .filter(|(k, _)| fixed(k))
        .map(|(_, v)| v)
        .sum();
    let proxy_own_writes_h = (proxy_writes_h + lease_writes_h - fixed_writes_h).max(0.0) / n;
    let p99 = quantile(
        &m.m0,
        &m.m1,
        "proxy_operator_reconcile_duration_seconds",
        0.99,
    );
    let reconciles = m.m1.sum("proxy_operator_reconciles_total", |_| true)
        - m.m0.sum("proxy_operator_reconciles_total", |_| true);
    // One inventory list: the plugin's list calls during the window and the drift check.
    let is_list = |l: &BTreeMap<String, String>| {
        l.get("provider").map(String::as_str) == Some(s.provider.as_str())
            && l.get("op").is_some_and(|o| o.contains("list"))
    };
    let lists =
        m.m2.sum("proxy_operator_plugin_call_duration_seconds_count", is_list)
            - m.m0
                .sum("proxy_operator_plugin_call_duration_seconds_count", is_list);
    let list_secs = (m
        .m2
        .sum("proxy_operator_plugin_call_duration_seconds_sum", is_list)
        - m.m0
            .sum("proxy_operator_plugin_call_duration_seconds_sum", is_list))
        / lists.max(1.0);
    let replaced_scaled = m.drift.0.as_secs_f64() * f64::from(f);
    let drift_scaled = m.drift.1.as_secs_f64() * f64::from(f);
    let list_scaled = list_secs * f64::from(f);
    // The provider's list interval: the drift poll, or longer when a list costs more than
    // the budget allows that often (the operator's own rule, inventory::list_interval).
    let lists_window =
        m.m1.sum("proxy_operator_plugin_call_duration_seconds_count", is_list)
            - m.m0
                .sum("proxy_operator_plugin_call_duration_seconds_count", is_list);
    let pages = m.steady.by_op.get("list").copied().unwrap_or(0) as f64 / lists_window.max(1.0);
    let list_interval = proxy_operator::inventory::list_interval(
        s.drift_poll,
        Some(egress_plugin_host::provider::Pacing {
            requests_per_hour: budget,
            last_list_requests: Some(pages.ceil() as u32),
            last_recent_requests: None,
            contended: false,
        }),
    );
    let drift_bound = list_interval.as_secs_f64() + list_scaled;
    let conv_scaled = m.converged.as_secs_f64() * f64::from(f);
    let rate_limited_after = m.since_convergence.rate_limited;
    let limited_word = if s.provider == "ec2" {
        "RequestLimitExceeded"
    } else {
        "429"
    };

    let mut fig = Figures {
        json: Value::Null,
        rows: Vec::new(),
    };
    fig.row(
        "time until all Running",
        if m.up == s.proxies {
            format!(
                "{:.0} s real = {:.1} min at x{f} ({} backend requests: {})",
                m.converged.as_secs_f64(),
                conv_scaled / 60.0,
                m.conv.total,
                ops(&m.conv.by_op, |v| format!("{v}"))
            )
        } else {
            format!(
                "**not reached**: {} of {} Running after {:.0} s real = {:.1} min at x{f} (`--timeout`; {} backend requests: {}). The rows below were measured anyway, in a state that is not steady",
                m.up,
                s.proxies,
                m.converged.as_secs_f64(),
                conv_scaled / 60.0,
                m.conv.total,
                ops(&m.conv.by_op, |v| format!("{v}"))
            )
        },
        "",
        (m.up < s.proxies).then_some(false),
    );
    fig.row(
        &format!("{limited_word} answers during convergence"),
        m.conv.rate_limited.to_string(),
        "",
        None,
    );
    // Ready over time (issue 29): the first, 10%, 50%, 90% and all, real and operator time.
    let marks: Vec<(&str, Option<f64>)> = [
        ("first", 1),
        ("10%", n_usize.div_ceil(10)),
        ("50%", n_usize.div_ceil(2)),
        ("90%", (n_usize * 9).div_ceil(10)),
        ("100%", n_usize),
    ]
    .into_iter()
    .map(|(what, k)| (what, time_to(&m.curve, k)))
    .collect();
    let first_scaled = marks[0].1.map(|t| t * f64::from(f));
    fig.row(
        "Running over time after the apply: first / 10% / 50% / 90% / 100%",
        marks
            .iter()
            .map(|(what, t)| match t {
                Some(t) => format!("{what} {:.0} s ({t:.1} s real)", t * f64::from(f)),
                None => format!("{what} not reached"),
            })
            .collect::<Vec<_>>()
            .join(" / ")
            + &format!(
                " (the apply itself, {n_usize} creates through the API one at a time while the operator ran, took {:.0} s = {:.2} s real)",
                m.applied.as_secs_f64() * f64::from(f),
                m.applied.as_secs_f64()
            ),
        "first ≤ 60 s (10,000 Proxies)",
        first_scaled.map(|t| t <= 60.0),
    );
    let plateau = longest_plateau(&m.curve);
    fig.row(
        "longest stretch with no new Running Proxy, first to last",
        format!(
            "{:.0} s ({:.1} s real; {:.1}% of the convergence)",
            plateau * f64::from(f),
            plateau,
            100.0 * plateau / m.converged.as_secs_f64().max(1e-9)
        ),
        "no plateau while creates run (≤ 5% of the convergence; 10,000 Proxies)",
        (n_usize >= 10_000).then_some(plateau <= 0.05 * m.converged.as_secs_f64()),
    );
    let all_scaled = marks[4].1.map(|t| t * f64::from(f));
    let floor = n / (budget / 3600.0);
    fig.row(
        "all Running against the create floor (N creates at the budget)",
        match all_scaled {
            Some(t) => format!("{:.2}x ({t:.0} s against {floor:.0} s)", t / floor),
            None => "not reached".into(),
        },
        "≤ 1.3x (10,000 Proxies, 3,600/h)",
        all_scaled
            .filter(|_| n_usize >= 10_000)
            .map(|t| t <= 1.3 * floor),
    );
    let background =
        |l: &BTreeMap<String, String>| l.get("priority").map(String::as_str) == Some("background");
    let slot = longest(&m.mc, "proxy_operator_plugin_slot_wait_seconds", background);
    let token = longest(
        &m.mc,
        "proxy_operator_plugin_budget_wait_seconds",
        background,
    );
    let show = |v: Option<f64>| match v {
        Some(v) if v.is_finite() => format!("≤ {:.3} s ({v:.3} s real)", v * f64::from(f)),
        Some(_) => "past the largest bucket".into(),
        None => "none".into(),
    };
    let drift_real = s.real(s.drift_poll).as_secs_f64();
    fig.row(
        "longest wait of a background call (lists, provider checks, drift Gets) during convergence: for a call slot / for a token",
        format!("{} / {}", show(slot), show(token)),
        "within the drift poll",
        Some(
            slot.unwrap_or(0.0) <= drift_real && token.unwrap_or(0.0) <= drift_real,
        ),
    );
    // What one call really holds (issue 29: concurrency fitted to measured memory).
    let memory = ["create", "get", "list", "check"]
        .iter()
        .filter_map(|op| {
            let v = longest(&m.mc, "proxy_operator_plugin_call_memory_bytes", |l| {
                l.get("op").map(String::as_str) == Some(*op)
            })?;
            Some(format!("{op} ≤ {:.2} MiB", v / 1048576.0))
        })
        .collect::<Vec<_>>()
        .join(", ");
    fig.row(
        "linear memory one call grew to, during convergence (the bucket's bound)",
        if memory.is_empty() {
            "no calls".into()
        } else {
            memory
        },
        "",
        None,
    );
    // Where a rollout's time goes when the backend sees less than the budget: calls that
    // hold a slot long (a whole list waits for every page's token) against slots waited for.
    // Per label value of a histogram: its mean in ms and how many it counted.
    let means = |name: &str, key: &str, values: &[&str]| {
        values
            .iter()
            .filter_map(|value| {
                let keep =
                    |l: &BTreeMap<String, String>| l.get(key).map(String::as_str) == Some(*value);
                let count = m.mc.sum(&format!("{name}_count"), keep);
                let t = m.mc.sum(&format!("{name}_sum"), keep) / count;
                (count > 0.0).then(|| format!("{value} {:.1} ms x {count:.0}", t * 1e3))
            })
            .collect::<Vec<_>>()
            .join(", ")
    };
    let calls = means(
        "proxy_operator_plugin_call_duration_seconds",
        "op",
        &["create", "get", "list", "check"],
    );
    let waits = means(
        "proxy_operator_plugin_slot_wait_seconds",
        "priority",
        &["urgent", "transition", "background"],
    );
    fig.row(
        "mean plugin call time by op / mean wait for a call slot by priority (real time, whole run)",
        format!("{calls} / {waits} ({} slots)", s.slots.map_or("default".into(), |n| n.to_string())),
        "",
        None,
    );
    fig.row(
        "provider checks timed out during convergence (ProviderHealth samples showing CheckTimeout)",
        m.check_timeouts.to_string(),
        "0",
        Some(m.check_timeouts == 0),
    );
    fig.row(
        "steady-state backend requests per hour",
        format!(
            "{steady_h:.0} ({:.0}% of the {budget:.0}/h budget; {})",
            100.0 * steady_h / budget,
            ops(&by_op_h, |v| format!("{v:.0}"))
        ),
        "≤ 90% of the budget",
        Some(steady_h <= 0.9 * budget),
    );
    fig.row(
        "steady-state backend requests per Proxy per hour",
        format!("{:.3}", steady_h / n),
        "≤ 0.5 (1,000 Proxies, defaults)",
        Some(steady_h / n <= 0.5),
    );
    fig.row(
        &format!("{limited_word} answers after convergence (window + drift check)"),
        rate_limited_after.to_string(),
        "0",
        Some(rate_limited_after == 0),
    );
    fig.row(
        "drift-detection latency: instance deleted -> a new one in status (-> Running)",
        if m.drift.0 == Duration::MAX {
            format!(
                "no new instance within the check's timeout; bound: list interval {:.0} s + one list {list_scaled:.0} s = {drift_bound:.0} s",
                list_interval.as_secs_f64()
            )
        } else {
            format!(
                "{replaced_scaled:.0} s ({}) at x{f} = {:.2} s real; bound: list interval {:.0} s (drift poll, or longer when the budget calls for it; {pages:.0} pages a list) + one list {list_scaled:.0} s = {drift_bound:.0} s",
                if m.drift.1 == Duration::MAX {
                    "not Running within the timeout".to_string()
                } else {
                    format!("{drift_scaled:.0} s")
                },
                m.drift.0.as_secs_f64(),
                list_interval.as_secs_f64()
            )
        },
        "new instance within one list interval + one list",
        Some(replaced_scaled <= drift_bound),
    );
    fig.row(
        "operator RSS, peak / steady",
        format!(
            "{:.1} / {:.1} MiB (window max {:.1}; steady: {:.1} anonymous, {:.1} file-backed, the binary's code above all)",
            m.rss_peak, m.rss_steady, m.rss_max, m.rss_split.0, m.rss_split.1
        ),
        "< 128 MiB (10,000 Proxies)",
        Some(m.rss_peak < 128.0),
    );
    fig.row(
        "API-server requests / writes per hour, steady",
        format!(
            "{api_h:.0} / {:.0} (writes: {}; Leases in real time)",
            proxy_writes_h + lease_writes_h,
            ops(&writes_by_h, |v| format!("{v:.0}"))
        ),
        "",
        None,
    );
    fig.row(
        "API-server writes per Proxy per hour, steady (the Proxy's own: status, finalizer, Events)",
        format!(
            "{proxy_own_writes_h:.3} measured + 2 `lastProbe` refreshes by design (every 30 min, not compressed) = {:.3}; \
             besides, {fixed_writes_h:.0} writes an hour that do not grow with the fleet (Lease, ProviderHealth) = {:.3} per Proxy here",
            proxy_own_writes_h + 2.0,
            fixed_writes_h / n
        ),
        "≤ 2 (1,000 Proxies, defaults)",
        Some(proxy_own_writes_h + 2.0 <= 2.0 + 1e-9),
    );
    fig.row(
        "API-server requests during convergence (writes)",
        format!("{} ({})", m.conv_api, m.conv_writes),
        "",
        None,
    );
    fig.row(
        "reconcile p99, steady (real time)",
        match p99 {
            Some(v) if v.is_finite() => format!(
                "≤ {:.3} s ({:.0} reconciles/s real; operator CPU {:.2} cores)",
                v,
                reconciles / w.as_secs_f64(),
                m.cpu
            ),
            Some(_) => "above the largest bucket".into(),
            None => format!(
                "no reconcile in the window (Running Proxies the lists confirm keep no timer); operator CPU {:.2} cores",
                m.cpu
            ),
        },
        "",
        None,
    );
    fig.json = json!({
        "provider": s.provider,
        "proxies": s.proxies,
        "factor": f,
        "budget_per_hour": s.budget(),
        "burst": s.burst,
        "backend_limit": s.backend_limit(),
        "drift_poll_s": s.drift_poll.as_secs_f64(),
        "boot_s": s.boot.as_secs_f64(),
        "concurrency": s.concurrency,
        "curve": m.curve.iter().map(|(t, up)| json!([t, up])).collect::<Vec<_>>(),
        "convergence": {
            "seconds_real": m.converged.as_secs_f64(),
            "seconds_scaled": conv_scaled,
            "backend": m.conv,
            "api_requests": m.conv_api,
            "api_writes": m.conv_writes,
        },
        "steady": {
            "window_s_real": w.as_secs_f64(),
            "backend": m.steady,
            "backend_per_hour": steady_h,
            "backend_per_hour_by_op": by_op_h,
            "backend_per_proxy_per_hour": steady_h / n,
            "budget_share": steady_h / budget,
            "api_requests_per_hour": api_h,
            "api_writes_per_hour": proxy_writes_h + lease_writes_h,
            "lease_writes_per_hour": lease_writes_h,
            "api_writes_per_hour_by": writes_by_h,
            "api_writes_per_proxy_per_hour": writes_per_proxy_h,
            "proxy_own_writes_per_proxy_per_hour": proxy_own_writes_h,
            "fixed_writes_per_hour": fixed_writes_h,
            "reconcile_p99_s": p99.filter(|v| v.is_finite()),
            "reconciles_per_s_real": reconciles / w.as_secs_f64(),
            "operator_cpu_cores": m.cpu,
        },
        "rate_limited_after_convergence": rate_limited_after,
        "drift": {
            "replaced_s_real": m.drift.0.as_secs_f64(),
            "replaced_s_scaled": replaced_scaled,
            "running_s_real": m.drift.1.as_secs_f64(),
            "running_s_scaled": drift_scaled,
            "list_s_scaled": list_scaled,
            "bound_s_scaled": drift_bound,
        },
        "applied_s_real": m.applied.as_secs_f64(),
        "rss_mib": {"peak": m.rss_peak, "steady": m.rss_steady, "window_max": m.rss_max,
                    "steady_anonymous": m.rss_split.0, "steady_file": m.rss_split.1},
    });
    fig
}

/// `create 10, get 20, ...` in a fixed order.
fn ops<V>(by_op: &BTreeMap<String, V>, show: impl Fn(&V) -> String) -> String {
    by_op
        .iter()
        .map(|(k, v)| format!("{k} {}", show(v)))
        .collect::<Vec<_>>()
        .join(", ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn metrics_quantile_from_bucket_differences() {
        let before = Metrics::parse(
            "# TYPE x histogram\nx_bucket{le=\"0.1\",result=\"ok\"} 10\nx_bucket{le=\"1.0\",result=\"ok\"} 10\nx_bucket{le=\"+Inf\",result=\"ok\"} 10\n",
        );
        let after = Metrics::parse(
            "x_bucket{le=\"0.1\",result=\"ok\"} 100\nx_bucket{le=\"1.0\",result=\"ok\"} 109\nx_bucket{le=\"+Inf\",result=\"ok\"} 110\nx_bucket{le=\"0.1\",result=\"kube\"} 0\nx_bucket{le=\"1.0\",result=\"kube\"} 0\nx_bucket{le=\"+Inf\",result=\"kube\"} 0\nx_count{result=\"ok\"} 110\n",
        );
        assert_eq!(quantile(&before, &after, "x", 0.5), Some(0.1));
        assert_eq!(quantile(&before, &after, "x", 0.99), Some(1.0));
        assert_eq!(quantile(&before, &after, "x", 1.0), Some(f64::INFINITY));
        assert_eq!(quantile(&after, &after, "x", 0.99), None);
        assert_eq!(after.sum("x_count", |l| l["result"] == "ok"), 110.0);
    }

    #[test]
    fn per_hour_counts_in_operator_time() {
        // 100 requests in 60 s at x60 is 100 in an hour of the operator's time.
        assert_eq!(per_hour(100.0, Duration::from_secs(60), 60), 100.0);
    }

    #[test]
    fn ready_over_time_from_the_sampled_curve() {
        let curve = [(0.0, 0), (1.0, 0), (2.5, 1), (3.0, 5), (9.0, 6), (10.0, 10)];
        assert_eq!(time_to(&curve, 1), Some(2.5));
        assert_eq!(time_to(&curve, 5), Some(3.0));
        assert_eq!(time_to(&curve, 10), Some(10.0));
        assert_eq!(time_to(&curve, 11), None);
        // From the first Running on: 3.0 -> 9.0.
        assert_eq!(longest_plateau(&curve), 6.0);
        let m = Metrics::parse(
            "w_bucket{p=\"background\",le=\"1\"} 2\nw_bucket{p=\"background\",le=\"2\"} 3\nw_bucket{p=\"background\",le=\"4\"} 3\nw_bucket{p=\"background\",le=\"+Inf\"} 3\nw_bucket{p=\"urgent\",le=\"4\"} 0\nw_bucket{p=\"urgent\",le=\"+Inf\"} 1\n",
        );
        let bg =
            |l: &BTreeMap<String, String>| l.get("p").map(String::as_str) == Some("background");
        assert_eq!(longest(&m, "w", bg), Some(2.0));
        assert_eq!(longest(&m, "w", |_| true), Some(f64::INFINITY));
        assert_eq!(longest(&m, "x", |_| true), None);
    }
}
