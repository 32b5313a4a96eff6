//! Plugin runtime benchmark: `cargo xtask bench` (or `cargo bench -p proxy-operator --bench
//! runtime` after `cargo xtask build-plugins`).
//!
//! Everything is measured side by side in one run, because these machines are noisy and
//! only ratios between runs mean much:
//! - per-call host overhead (fresh Store + fresh /tmp + instantiate + a no-op `check`),
//!   p50/p99, with the pooling allocator and with on-demand allocation;
//! - per plugin, first load (compile) against cached load (deserialize), both including
//!   the pre-link and the `info` call;
//! - host RSS with the plugins loaded and idle, and its peak during 32 concurrent calls
//!   (each in a child process of its own, so one measurement does not inflate the other).
//!
//! Prints a Markdown table; `--json FILE` also writes the figures as JSON.

use egress_plugin_host::config::ProvidersFile;
use egress_plugin_host::plugin::{Runtime, RuntimeOptions, WasmProvider};
use egress_plugin_host::provider::Provider;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

const CALLS: usize = 3000;
const CONCURRENT: usize = 32;

fn plugin_dir() -> PathBuf {
    std::env::var_os("EGRESS_PLUGIN_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            std::env::var_os("CARGO_TARGET_DIR")
                .map(PathBuf::from)
                .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../target"))
                .join("plugins")
        })
}

/// Every component that loads as a provider: the real providers and the loadable testing ones.
fn plugin_files() -> Vec<PathBuf> {
    let dir = plugin_dir();
    let mut files: Vec<PathBuf> = [dir.clone(), dir.join("testing")]
        .iter()
        .filter_map(|d| std::fs::read_dir(d).ok())
        .flat_map(|rd| rd.flatten().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|e| e == "wasm"))
        .collect();
    files.sort();
    files
}

fn runtime(pooling: bool, cache: Option<&Path>, scratch: &Path) -> Arc<Runtime> {
    let mut opts = RuntimeOptions::for_providers(
        &ProvidersFile::default(),
        cache.map(Path::to_path_buf),
        scratch.to_path_buf(),
    );
    opts.engine.max_instances = 4 * 8 + 4;
    opts.engine.pooling = pooling;
    Runtime::new(opts).expect("runtime")
}

async fn example_provider(rt: &Arc<Runtime>, concurrency: u32) -> WasmProvider {
    let plugin = rt
        .load_plugin(&plugin_dir().join("example.wasm"))
        .await
        .expect("example.wasm loads");
    let entry = ProvidersFile::parse(&format!(
        "providers: [{{name: bench, plugin: example.wasm, limits: {{concurrency: {concurrency}}}, config: {{endpoint: 'http://127.0.0.1:9', regions: []}}}}]"
    ))
    .unwrap()
    .providers
    .remove(0);
    rt.provider(plugin, &entry).await.expect("example provider")
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    sorted[((sorted.len() as f64 - 1.0) * p).round() as usize]
}

fn rss_kib(field: &str) -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status
        .lines()
        .find_map(|l| {
            l.strip_prefix(field)
                .map(|v| v.trim().trim_end_matches("kB").trim().parse().unwrap_or(0))
        })
        .unwrap_or(0)
}

/// Child process: load every plugin as a provider, report idle RSS, then peak RSS while
/// 32 calls run at once.
async fn rss_child(pooling: bool) {
    let scratch = tempfile::tempdir().unwrap();
    let cache = tempfile::tempdir().unwrap();
    let rt = runtime(pooling, Some(&cache.path().join("c")), scratch.path());
    let mut loaded = Vec::new();
    for f in plugin_files() {
        if let Ok(p) = rt.load_plugin(&f).await {
            loaded.push(p);
        }
    }
    // Warm up so the idle figure includes what every process pays after its first call.
    let p = example_provider(&rt, CONCURRENT as u32).await;
    p.bench_call().await.unwrap();
    tokio::time::sleep(Duration::from_millis(200)).await;
    let idle = rss_kib("VmRSS:");
    let hostile = loaded
        .iter()
        .find(|p| p.info.type_name == "hostile")
        .cloned();
    let busy = if let Some(h) = hostile {
        let entry = ProvidersFile::parse(
            "providers: [{name: h, plugin: hostile.wasm, limits: {concurrency: 32}}]",
        )
        .unwrap()
        .providers
        .remove(0);
        let h = rt.provider(h, &entry).await.unwrap();
        // 32 calls in the guest at once (each holds its instance for 300 ms).
        let calls: Vec<_> = (0..CONCURRENT)
            .map(|_| {
                let h = h.clone();
                tokio::spawn(async move { h.get("sleep:300").await })
            })
            .collect();
        let mut peak = 0;
        let start = Instant::now();
        while start.elapsed() < Duration::from_millis(250) {
            peak = peak.max(rss_kib("VmRSS:"));
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        for c in calls {
            c.await.unwrap().unwrap();
        }
        peak
    } else {
        0
    };
    println!(
        "{{\"plugins\": {}, \"idle_kib\": {idle}, \"busy_kib\": {busy}}}",
        loaded.len()
    );
}

fn child(pooling: bool) -> serde_json::Value {
    let out = std::process::Command::new(std::env::current_exe().unwrap())
        .arg("--rss-child")
        .arg(if pooling { "pooling" } else { "ondemand" })
        .output()
        .expect("spawn rss child");
    assert!(
        out.status.success(),
        "rss child failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(out.stdout.trim_ascii()).expect("rss child output")
}

async fn per_call(pooling: bool) -> (Duration, Duration, u64) {
    let scratch = tempfile::tempdir().unwrap();
    let rt = runtime(pooling, None, scratch.path());
    let p = example_provider(&rt, 8).await;
    for _ in 0..200 {
        p.bench_call().await.unwrap();
    }
    let mut times = Vec::with_capacity(CALLS);
    let mut fuel = 0;
    for _ in 0..CALLS {
        let start = Instant::now();
        let stats = p.bench_call().await.unwrap();
        times.push(start.elapsed());
        fuel = stats.fuel_used;
    }
    times.sort();
    (percentile(&times, 0.5), percentile(&times, 0.99), fuel)
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let args: Vec<String> = std::env::args().collect();
    if let Some(i) = args.iter().position(|a| a == "--rss-child") {
        rss_child(args[i + 1] == "pooling").await;
        return;
    }
    let json_out = args
        .iter()
        .position(|a| a == "--json")
        .map(|i| PathBuf::from(&args[i + 1]));
    if !plugin_dir().join("example.wasm").is_file() {
        eprintln!(
            "plugins not built in {}: run `cargo xtask build-plugins` first",
            plugin_dir().display()
        );
        std::process::exit(2);
    }

    // Interleave the two allocation modes so drift in machine load hits both alike.
    let mut pooled = Vec::new();
    let mut ondemand = Vec::new();
    for _ in 0..2 {
        pooled.push(per_call(true).await);
        ondemand.push(per_call(false).await);
    }
    let best = |v: &[(Duration, Duration, u64)]| *v.iter().min_by_key(|r| r.0).unwrap();
    let (p50, p99, fuel) = best(&pooled);
    let (o50, o99, _) = best(&ondemand);

    println!("## Plugin runtime benchmark\n");
    println!(
        "Per-call host overhead: fresh Store + fresh /tmp + instantiate + no-op `check` ({CALLS} sequential calls, best of 2 runs; the guest itself burns {fuel} fuel):\n"
    );
    println!("| allocator | p50 (ms) | p99 (ms) |\n|---|---|---|");
    println!("| pooling | {:.3} | {:.3} |", ms(p50), ms(p99));
    println!("| on-demand | {:.3} | {:.3} |", ms(o50), ms(o99));
    println!(
        "\nRatio on-demand / pooling at p50: {:.2}\n",
        o50.as_secs_f64() / p50.as_secs_f64()
    );

    let mut loads = Vec::new();
    println!(
        "Load per plugin (read + compile or deserialize + pre-link + `info` call), first load vs cached:\n"
    );
    println!(
        "| plugin | size (KiB) | first load (ms) | cached load (ms) | ratio |\n|---|---|---|---|---|"
    );
    for f in plugin_files() {
        let scratch = tempfile::tempdir().unwrap();
        let cache = tempfile::tempdir().unwrap();
        let cache_dir = cache.path().join("c");
        let rt = runtime(true, Some(&cache_dir), scratch.path());
        let start = Instant::now();
        let Ok(first) = rt.load_plugin(&f).await else {
            continue;
        };
        let cold = start.elapsed();
        let rt2 = runtime(true, Some(&cache_dir), scratch.path());
        let start = Instant::now();
        let again = rt2.load_plugin(&f).await.unwrap();
        let warm = start.elapsed();
        assert_eq!(again.cache, egress_plugin_host::plugin::CacheOutcome::Hit);
        let name = f.file_name().unwrap().to_string_lossy().into_owned();
        println!(
            "| {name} | {} | {:.1} | {:.2} | {:.0}x |",
            first.size / 1024,
            ms(cold),
            ms(warm),
            cold.as_secs_f64() / warm.as_secs_f64()
        );
        loads.push(serde_json::json!({"plugin": name, "size_bytes": first.size, "first_ms": ms(cold), "cached_ms": ms(warm)}));
    }

    let rss_pool = child(true);
    let rss_ondemand = child(false);
    println!(
        "\nHost RSS ({} plugins loaded; busy = peak during {CONCURRENT} concurrent calls):\n",
        rss_pool["plugins"]
    );
    println!("| allocator | idle (MiB) | busy (MiB) |\n|---|---|---|");
    for (name, r) in [("pooling", &rss_pool), ("on-demand", &rss_ondemand)] {
        println!(
            "| {name} | {:.1} | {:.1} |",
            r["idle_kib"].as_f64().unwrap() / 1024.0,
            r["busy_kib"].as_f64().unwrap() / 1024.0
        );
    }
    if let Some(path) = json_out {
        let v = serde_json::json!({
            "per_call_ms": {"pooling": {"p50": ms(p50), "p99": ms(p99)}, "on_demand": {"p50": ms(o50), "p99": ms(o99)}},
            "load": loads,
            "rss": {"pooling": rss_pool, "on_demand": rss_ondemand},
        });
        std::fs::write(path, serde_json::to_string_pretty(&v).unwrap()).unwrap();
    }
}
