//! `cargo xtask scale --proxies N`: the operator at scale (issue 12), release build.
//!
//! Builds the plugins, the operator and the demo driver in release, runs the sandbox bench
//! (`host/benches/sandbox.rs`: one plugin `get` against the same request made natively),
//! then `egress-demo scale` (`demo/src/scale.rs`: the in-memory API, the emulators with
//! their rate limits on, the real operator with the real plugins, N Proxies). Writes the
//! driver's table plus the sandbox line into the `scale` section of docs/benchmarks.md,
//! one block per provider and size (a run replaces its own block and keeps the others),
//! and the raw figures to `<target>/scale-<provider>-<N>.json` and
//! `<target>/bench-sandbox.json`.

use anyhow::{Context, Result, bail};
use std::time::Instant;

#[derive(clap::Args)]
pub struct Args {
    /// How many Proxies.
    #[arg(long)]
    pub proxies: usize,
    /// The provider they use.
    #[arg(long, default_value = "hetzner", value_parser = ["hetzner", "ec2"])]
    pub provider: String,
    /// Length of the steady-state window, in the operator's (time-compressed) minutes.
    #[arg(long, default_value_t = 30)]
    pub minutes: u64,
    /// Time compression: intervals divided by it, budget and backend rate limit
    /// multiplied by it.
    #[arg(long, default_value_t = 30)]
    pub factor: u32,
    /// Skip the sandbox bench (its line is then left out of the table).
    #[arg(long)]
    pub no_sandbox: bool,
    /// More arguments for the driver (`egress-demo scale --help`), e.g. `--budget 7200`.
    #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
    pub driver_args: Vec<String>,
}

/// What the section says before the runs.
const INTRO: &str = "## Scale

Written by `cargo xtask scale --proxies N [--provider hetzner|ec2] [--factor F] [--minutes M]`
(release build; `demo/src/scale.rs` says how it measures). The real operator and plugins run
against the in-memory Kubernetes API and the backend emulators, with the emulator's rate limit
on (Hetzner 3,600/h with a 3,600-deep bucket, 429 past it; EC2 72,000/h, 100 per action,
`RequestLimitExceeded`) and the operator's budget at the plugin's shipped default. All N Proxies
are created at once.

**Time compression.** Every interval of the operator (polls, drift poll, GC, provider checks,
retries) is divided by the factor, and the budget and the emulator's limit multiplied by it: an
hour of the operator's time passes in 3600/F s. Per-hour figures are counted in that time and
so read as real-time figures; times are given both ways. Not compressed: Lease renewals (5 s,
counted per real hour), the 30-minute `lastProbe` refresh (a constant, so it falls outside the
window and is added by design where it counts), the transient-error backoff.

**Health probes.** The operator has no switch to turn them off. Instances get loopback
addresses and a port nothing listens on, so every probe is refused at once and each Proxy
runs with `Healthy=False` (the same single verdict write as a healthy one). The steady state
is measured after every Proxy has its verdict.

The in-memory API and the emulators run in the driver's process, on the same 2 cores as the
operator; RSS and CPU figures are the operator process's alone. A run that does not converge
within the driver's `--timeout` says so in its first row and measures the rest anyway.

Verdicts compare with the issue's acceptance figures, each stated for a size (10,000 Proxies
with a 3,600/h budget; 1,000 with defaults); at other sizes they are shown for orientation.
";

pub fn run(args: &Args) -> Result<()> {
    crate::build_plugins::run(&crate::build_plugins::Args::default())?;
    let ws = crate::workspace()?;
    let plugins = ws.target_dir.join("plugins");
    println!("building the operator and the scale driver (release)");
    let status = crate::cargo()
        .current_dir(&ws.root)
        .args([
            "build",
            "--release",
            "--quiet",
            "-p",
            "proxy-operator",
            "-p",
            "egress-demo",
        ])
        .status()
        .context("running cargo build --release")?;
    if !status.success() {
        bail!("building the binaries failed ({status})");
    }

    let sandbox = if args.no_sandbox {
        None
    } else {
        let json = ws.target_dir.join("bench-sandbox.json");
        println!("sandbox bench: plugin get vs native GET (release)");
        let status = crate::cargo()
            .current_dir(&ws.root)
            .env("EGRESS_PLUGIN_DIR", &plugins)
            .args([
                "bench",
                "--quiet",
                "-p",
                "proxy-operator",
                "--bench",
                "sandbox",
                "--",
            ])
            .arg("--json")
            .arg(&json)
            .status()
            .context("running the sandbox bench")?;
        if !status.success() {
            bail!("the sandbox bench failed ({status})");
        }
        Some(read_json(&json)?)
    };

    let key = format!("{}-{}", args.provider, args.proxies);
    let json = ws.target_dir.join(format!("scale-{key}.json"));
    let bin = ws.target_dir.join("release");
    let started = Instant::now();
    let status = std::process::Command::new(bin.join("egress-demo"))
        .current_dir(&ws.root)
        .arg("--operator-bin")
        .arg(bin.join("proxy-operator"))
        .arg("--plugin-dir")
        .arg(&plugins)
        .arg("--crds")
        .arg(ws.root.join("config/crd"))
        .arg("--workdir")
        .arg(ws.target_dir.join("scale").join(&key))
        .arg("scale")
        .args(["--proxies", &args.proxies.to_string()])
        .args(["--provider", &args.provider])
        .args(["--minutes", &args.minutes.to_string()])
        .args(["--factor", &args.factor.to_string()])
        .arg("--json")
        .arg(&json)
        .args(&args.driver_args)
        .status()
        .context("running egress-demo scale")?;
    if !status.success() {
        bail!("the scale run failed ({status})");
    }
    let took = started.elapsed();
    let run = read_json(&json)?;

    let mut table = run["markdown"].as_str().unwrap_or_default().to_string();
    if let Some(s) = &sandbox {
        let ratio = s["ratio"].as_f64().unwrap_or(f64::NAN);
        let line = format!(
            "| sandbox price: one `get` through hetzner.wasm vs the same GET natively, p50 ({} interleaved calls, in process) | {:.3} ms vs {:.3} ms: {ratio:.2}x (a plugin call that sends nothing: {:.3} ms) | ≤ 1.2x | {} |\n",
            s["calls"],
            s["plugin_get_p50_ms"].as_f64().unwrap_or(f64::NAN),
            s["native_get_p50_ms"].as_f64().unwrap_or(f64::NAN),
            s["plugin_no_request_p50_ms"].as_f64().unwrap_or(f64::NAN),
            if ratio <= 1.2 { "**pass**" } else { "**FAIL**" }
        );
        print!("{line}");
        table.push_str(&line);
    }
    if let Some(curve) = run["curve"].as_array() {
        let points: Vec<(f64, f64)> = curve
            .iter()
            .filter_map(|p| Some((p[0].as_f64()?, p[1].as_f64()?)))
            .collect();
        let factor = run["factor"].as_f64().unwrap_or(1.0);
        let svg = curve_svg(&points, factor, args.proxies as f64);
        let name = format!("scale-{key}.svg");
        std::fs::write(ws.root.join("docs").join(&name), svg)?;
        table.push_str(&format!(
            "\n![Proxies Running over the operator's time after the apply]({name})\n"
        ));
    }
    let extra = if args.driver_args.is_empty() {
        String::new()
    } else {
        format!(" -- {}", args.driver_args.join(" "))
    };
    let block = format!(
        "### {} Proxies on {}\n\n`cargo xtask scale --proxies {} --provider {} --factor {} --minutes {}{extra}`: \
time x{}, budget {}/h (burst {}), backend limit {}/h (depth {}), servers boot in {} s, drift poll {} s, {} reconciles at once. \
The run took {:.1} min {}.\n\n{table}\nRaw figures: `target/scale-{key}.json`{}.\n",
        args.proxies,
        args.provider,
        args.proxies,
        args.provider,
        args.factor,
        args.minutes,
        run["factor"],
        run["budget_per_hour"],
        run["burst"],
        run["backend_limit"]["per_hour"],
        run["backend_limit"]["burst"],
        run["boot_s"],
        run["drift_poll_s"],
        run["concurrency"],
        took.as_secs_f64() / 60.0,
        crate::docs::machine(),
        if sandbox.is_some() {
            ", `target/bench-sandbox.json`"
        } else {
            ""
        }
    );

    let path = ws.root.join("docs/benchmarks.md");
    let doc = std::fs::read_to_string(&path).unwrap_or_else(|_| crate::docs::TITLE.to_string());
    let old = crate::docs::section(&doc, "scale").unwrap_or_default();
    let mut runs: Vec<(String, String)> = crate::docs::runs(old);
    runs.retain(|(k, _)| k != &key);
    runs.push((key, block));
    runs.sort_by_key(|(k, _)| {
        let (provider, n) = k.rsplit_once('-').unwrap_or((k, "0"));
        (provider.to_string(), n.parse::<u64>().unwrap_or(0))
    });
    let mut body = String::from(INTRO);
    for (k, b) in &runs {
        body.push_str(&crate::docs::run_block(k, b));
    }
    crate::docs::update_file(&path, crate::docs::TITLE, "scale", &body)?;
    println!(
        "\nwrote the scale section ({} run(s)) of {}",
        runs.len(),
        path.display()
    );
    Ok(())
}

fn read_json(path: &std::path::Path) -> Result<serde_json::Value> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    serde_json::from_str(&text).with_context(|| format!("parsing {}", path.display()))
}

/// The Running count over time as a small SVG line chart (operator time on x: real
/// seconds times the factor), committed next to docs/benchmarks.md.
fn curve_svg(points: &[(f64, f64)], factor: f64, n: f64) -> String {
    let (w, h, left, bottom) = (640.0, 320.0, 60.0, 40.0);
    let t_max = points.last().map_or(1.0, |p| p.0 * factor).max(1.0);
    let x = |t: f64| left + (w - left - 20.0) * (t * factor) / t_max;
    let y = |up: f64| h - bottom - (h - bottom - 20.0) * up / n.max(1.0);
    // A step line: the count holds until the next sample.
    let mut path = String::new();
    let mut prev: Option<(f64, f64)> = None;
    for &(t, up) in points {
        if let Some((_, pu)) = prev {
            path.push_str(&format!(" L{:.1},{:.1}", x(t), y(pu)));
        } else {
            path.push_str(&format!("M{:.1},{:.1}", x(t), y(up)));
        }
        path.push_str(&format!(" L{:.1},{:.1}", x(t), y(up)));
        prev = Some((t, up));
    }
    let minutes = t_max / 60.0;
    format!(
        r##"<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" font-family="sans-serif" font-size="12">
<rect width="100%" height="100%" fill="white"/>
<line x1="{left}" y1="{yb}" x2="{xr}" y2="{yb}" stroke="black"/>
<line x1="{left}" y1="20" x2="{left}" y2="{yb}" stroke="black"/>
<text x="{left}" y="{yl}" >0</text>
<text x="{xr}" y="{yl}" text-anchor="end">{minutes:.0} min (operator time)</text>
<text x="{lx}" y="{yb}" text-anchor="end">0</text>
<text x="{lx}" y="24" text-anchor="end">{n:.0}</text>
<text x="{cx}" y="14" text-anchor="middle">Proxies Running after the apply</text>
<path d="{path}" fill="none" stroke="#1f77b4" stroke-width="2"/>
</svg>
"##,
        yb = h - bottom,
        xr = w - 20.0,
        yl = h - bottom + 16.0,
        lx = left - 6.0,
        cx = w / 2.0,
    )
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_curve_is_a_step_line_within_the_frame() {
        let svg = super::curve_svg(&[(0.0, 0.0), (1.0, 5.0), (2.0, 10.0)], 60.0, 10.0);
        assert!(svg.starts_with("<svg"), "{svg}");
        // Starts at the origin, ends at the top right.
        assert!(svg.contains("M60.0,280.0"), "{svg}");
        assert!(svg.contains("L620.0,20.0"), "{svg}");
        assert!(svg.contains("2 min (operator time)"), "{svg}");
    }
}
