//! Issue 27's plugin-reply item against a running operator under the Deployment's memory
//! limit: a provider whose `list-by-tag` answers 2,000 instances whose strings all point at
//! the same 64 KiB of guest memory (375 MiB if the host copied them whole) is listed again
//! and again by the inventory; each list fails naming `MAX_LIFT_BYTES`, and the operator's
//! resident memory grows by less than the host side the fit counts for one call.

use crate::support;

use super::harness::{HostileOperator, hostile_operator, wait_for};
use std::time::{Duration, Instant};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_aliased_list_reply_is_refused_within_the_fit_by_a_running_operator() {
    let plugin_dir = plugins_or_skip!();
    let dir = tempfile::tempdir().unwrap();
    let Some(HostileOperator { mut op, .. }) = hostile_operator(
        &plugin_dir,
        dir.path(),
        "  config: {list: 'alias-list:2000:65536'}\n",
        &["--drift-poll", "100ms"],
    )
    .await
    else {
        return;
    };
    let pid = op.child.id();
    // The first list has failed once its line is in the log; from then on every list is
    // the same attack, so the memory it leaves behind shows in the steady state.
    wait_for("a refused list", Duration::from_secs(30), async || {
        op.log().contains("MAX_LIFT_BYTES").then_some(())
    })
    .await;
    let before = support::process::resident_bytes(pid);
    let lists_before = op.log().matches("MAX_LIFT_BYTES").count();
    let mut peak = before;
    let start = Instant::now();
    while start.elapsed() < Duration::from_secs(5) {
        peak = peak.max(support::process::resident_bytes(pid));
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    op.assert_alive("while its provider answered aliased lists");
    let lists = op.log().matches("MAX_LIFT_BYTES").count() - lists_before;
    assert!(
        lists >= 3,
        "only {lists} lists were refused in 5 s:\n{}",
        op.log()
    );
    let log = op.log();
    assert!(
        log.contains("MAX_LIFT_BYTES = 3 MiB"),
        "the refusal names the bound:\n{log}"
    );
    let grew = peak.saturating_sub(before);
    let fit = egress_plugin_host::config::Limits::default().host_bytes_per_call();
    eprintln!(
        "{lists} aliased lists in 5 s: operator RSS {:.1} MiB, grew by {:.1} MiB at its peak (fit's host side per call {:.1} MiB); cgroup peak {:.1} MiB",
        before as f64 / (1 << 20) as f64,
        grew as f64 / (1 << 20) as f64,
        fit as f64 / (1 << 20) as f64,
        op.cgroup.as_ref().map_or(0, |c| c.peak()) as f64 / (1 << 20) as f64,
    );
    assert!(
        grew < fit,
        "the operator grew by {grew} bytes while lists were refused, more than the {fit} bytes of host side the fit counts for a call"
    );
    assert_eq!(op.cgroup.as_ref().map_or(0, |c| c.oom_kills()), 0);
}
