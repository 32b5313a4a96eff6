//! The scale benchmark in small (`cargo xtask scale` is the large one): 300 Proxies on the
//! Hetzner plugin, time compressed 60 times, with the emulator's rate limit as tight as
//! the operator's budget (3,600/h, a bucket of 100 on both sides). Fails when the steady
//! state spends more than 90% of the budget, or when the backend answers a single 429
//! after convergence. About 45 s with the debug build.
//!
//! Needs the plugins (`EGRESS_PLUGIN_DIR`) and the operator binary next to the driver, as
//! the story test does.

mod support;

#[test]
fn three_hundred_proxies_stay_within_a_tight_budget() {
    let Some((mut demo, work)) =
        support::driver(env!("CARGO_BIN_EXE_egress-demo"), "egress-scale-test")
    else {
        return;
    };
    let json = work.join("scale.json");
    std::fs::create_dir_all(&work).unwrap();
    let out = demo
        .args(["scale", "--proxies", "300", "--provider", "hetzner"])
        .args([
            "--factor",
            "120",
            "--minutes",
            "20",
            "--settle-minutes",
            "6",
        ])
        .args(["--budget", "3600", "--burst", "100"])
        .args(["--backend-limit", "3600", "--backend-burst", "100"])
        .args(["--timeout", "3m", "--json"])
        .arg(&json)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    println!("{stdout}");
    assert!(
        out.status.success(),
        "the scale run failed:\n{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&std::fs::read(&json).unwrap()).unwrap();
    let share = v["steady"]["budget_share"].as_f64().unwrap();
    assert!(
        share <= 0.9,
        "steady state spends {:.0}% of the budget (over 90%):\n{stdout}",
        share * 100.0
    );
    assert_eq!(
        v["rate_limited_after_convergence"], 0,
        "the backend answered 429 after convergence:\n{stdout}"
    );
    // Something was measured at all: lists ran in the window.
    assert!(
        v["steady"]["backend"]["total"].as_u64().unwrap() > 0,
        "{stdout}"
    );
    let _ = std::fs::remove_dir_all(&work);
}
