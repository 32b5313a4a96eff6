//! The "lists of recent instances" row of docs/threat-model.md, against the real binary under
//! the Deployment's memory limit: the hostile plugin, which declares lists of recent
//! instances, answers every list (whole or recent) with 2,000 instances whose strings all
//! point at one 64 KiB string, so the host refuses each reply at the lift bound. Its Proxies
//! stay in transition (their instance reports Provisioning), so the operator keeps wanting
//! lists to confirm them. It must ask at the lists' pace, not as fast as they fail (it
//! asked 46,854 times in 2 s before lists that fail were paced), stay within its memory, and
//! keep the Proxies waiting rather than judge them by a list it never got.

use crate::harness::{HostileOperator, hostile_operator, hostile_proxies, wait_for};
use crate::support;
use std::time::Duration;

const PROXIES: usize = 20;
/// The harness's `--provisioning-poll`.
const PROVISIONING_POLL_MS: u64 = 100;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hostile_lists_of_recent_instances_are_paced_and_bounded_in_a_running_operator() {
    let plugin_dir = plugins_or_skip!();
    let dir = tempfile::tempdir().unwrap();
    let Some(HostileOperator { client, mut op, .. }) = hostile_operator(
        &plugin_dir,
        dir.path(),
        "  config: {list: 'alias-list:2000:65536'}\n",
        &["--drift-poll", "2s"],
    )
    .await
    else {
        return;
    };

    // Every create returns instance `ok`, which reports Provisioning: all stay in transition.
    let proxies = hostile_proxies(&client, PROXIES, "get:ok").await;
    let in_transition = || async {
        let list = proxies.list(&Default::default()).await.ok()?;
        let n = list
            .items
            .iter()
            .filter(|p| {
                p.status.as_ref().is_some_and(|s| {
                    s.provider_id.as_deref() == Some("ok") && s.state.as_deref() != Some("Running")
                })
            })
            .count();
        (n == PROXIES).then_some(())
    };
    wait_for(
        "every Proxy created and in transition",
        Duration::from_secs(60),
        in_transition,
    )
    .await;

    // A window of lists: each refused at the lift bound, each logged once.
    let failed = |log: &str| log.matches("listing the recent instances failed").count();
    let before = failed(&op.log());
    let window = Duration::from_secs(4);
    tokio::time::sleep(window).await;
    op.assert_alive("while its lists fail");
    let lists = failed(&op.log()) - before;
    let paced = window.as_millis() / u128::from(PROVISIONING_POLL_MS);
    eprintln!("{lists} failed lists of recent instances in {window:?} (paced: {paced})");
    assert!(
        lists > 0,
        "the operator asked for lists of recent instances"
    );
    assert!(
        lists as u128 <= 2 * paced + 5,
        "{lists} failed lists of recent instances in {window:?}: not paced (at most {paced})"
    );
    let log = op.log();
    let line = log
        .lines()
        .find(|l| l.contains("listing the recent instances failed"))
        .unwrap_or_default();
    assert!(
        line.contains("MAX_LIFT_BYTES = 3 MiB"),
        "the failure names the bound that refused the reply: {line}"
    );

    // The Proxies wait for a list or a Get: none is judged by the lists it never got.
    in_transition()
        .await
        .expect("every Proxy still in transition");
    let (status, _) = op.get("/readyz").await;
    assert_eq!(status, 200, "the operator stays ready");
    let oom = op.cgroup.as_ref().map_or(0, |c| c.oom_kills());
    assert_eq!(oom, 0, "OOM kills in the operator's cgroup");
    op.assert_alive("after the window");
}
