//! The "calls beyond a provider's own slots" row of docs/threat-model.md, against the real
//! binary under the Deployment's memory limit: a hostile plugin whose every call holds
//! most of its `memoryMib` while it waits a second on its backend, with a budget that calls
//! for far more calls at once than the pod holds. Its want climbs to `maxConcurrency`, but
//! it borrows only the calls the fit's left-over room holds, each at its whole worst case,
//! so the pod stays within its limit with every borrowed call at its memory in full.

use crate::harness::{DEPLOYMENT_MEMORY_LIMIT, HostileOperator, deployment_flag};
use crate::harness::{hostile_operator, hostile_proxies, sample, wait_for};
use crate::support;
use egress_plugin_host::config::{PodResources, ProvidersFile, fit, pod};
use std::sync::atomic::Ordering::SeqCst;
use std::time::Duration;

const PROXIES: usize = 24;
/// Held by each call, of its 32 MiB of linear memory.
const HOARD_MIB: usize = 24;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slow_calls_at_full_memory_borrow_only_the_room_the_fit_leaves() {
    let plugin_dir = plugins_or_skip!();
    let server = support::TestServer::start().await;
    let dir = tempfile::tempdir().unwrap();
    // 100 requests a second of a second each want 101 calls: capped at 16.
    let entry = format!(
        "  additionalHosts: ['http://127.0.0.1:{}']\n  budget: {{requestsPerHour: 360000, burst: 1000}}\n  limits: {{concurrency: 1, maxConcurrency: 16, timeout: 20s}}\n",
        server.port
    );
    let Some(HostileOperator { client, mut op, .. }) =
        hostile_operator(&plugin_dir, dir.path(), &entry, &[]).await
    else {
        return;
    };

    // The room as the operator computes it from its cgroup and the Deployment's flags.
    let file = ProvidersFile::parse(&format!(
        "providers:\n- name: hostile\n  plugin: hostile.wasm\n{entry}"
    ))
    .unwrap();
    let flag = |name: &str| pod::parse_quantity(deployment_flag(name)).unwrap();
    let budget = PodResources {
        memory_bytes: Some(DEPLOYMENT_MEMORY_LIMIT),
        reserve_bytes: flag("memory-reserve"),
        scratch_bytes: Some(flag("scratch-limit")),
        descriptors: None,
    };
    let left = fit::left_over(&file, &budget);
    let limits = &file.providers[0].limits;
    let room = (left.memory.unwrap() / limits.memory_bytes_per_call())
        .min(left.scratch.unwrap() / limits.tmp_bytes_per_call())
        .min(u64::from(limits.most_calls() - limits.concurrency)) as usize;
    assert!(
        (2..16).contains(&room),
        "the test needs a room between 2 calls and maxConcurrency: {room}"
    );

    let machine_type = format!("get:hoard-http:{HOARD_MIB}:{}", server.url("/second"));
    hostile_proxies(&client, PROXIES, &machine_type).await;
    let started = std::time::Instant::now();
    wait_for(
        "every create's request answered",
        Duration::from_secs(120),
        async || (server.hits.load(SeqCst) >= PROXIES).then_some(()),
    )
    .await;
    let took = started.elapsed();
    op.assert_alive("after the creates");
    let log = op.log();
    let room_line = log
        .lines()
        .find(|l| l.contains("room left over"))
        .unwrap_or("(no room logged)");
    eprintln!("{room_line}");
    let most = server.most_at_once.load(SeqCst);
    let (_, metrics) = op.get("/metrics").await;
    let slots = |kind: &str| {
        sample(
            &metrics,
            &format!(r#"proxy_operator_plugin_call_slots{{provider="hostile",kind="{kind}"}} "#),
        )
    };
    let cgroup = op.cgroup.as_ref().expect("under the Deployment's limits");
    eprintln!(
        "{PROXIES} creates of {HOARD_MIB} MiB held a second each in {:.1} s: at most {most} at \
         once (1 own + a room of {room}); wanted {}, borrowed {} at the end; cgroup peak {} MiB \
         of {} MiB, OOM kills {}",
        took.as_secs_f64(),
        slots("wanted"),
        slots("borrowed"),
        cgroup.peak() >> 20,
        DEPLOYMENT_MEMORY_LIMIT >> 20,
        cgroup.oom_kills(),
    );
    assert_eq!(cgroup.oom_kills(), 0, "OOM kills in the operator's cgroup");
    assert!(
        most <= 1 + room,
        "{most} calls at once: more than the own slot and the {room} the room holds"
    );
    assert!(
        most >= 2,
        "the budget called for more calls and the room held {room}: nothing was borrowed"
    );
    assert_eq!(slots("wanted"), 16.0, "the want, capped by maxConcurrency");
    let (status, _) = op.get("/readyz").await;
    assert_eq!(status, 200, "the operator stays ready");
}
