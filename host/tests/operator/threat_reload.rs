//! Issue 27, item 7: a reload held hostage by one provider. Provider `stuck` runs at
//! `concurrency: 1` with a long `limits.timeout`, and its backend hangs every call: its
//! Proxies' calls hold its only call slot for the whole timeout, one after another. A
//! reload used to run the new version's `validate-config` on that same slot at background
//! priority, behind those calls, and to rebuild providers one after another: a provider
//! added after `stuck` in the same edit was not loaded after 300 s, and nothing said why.
//!
//! Here, the real operator under the Deployment's limits: one edit of the providers file
//! changes `stuck`'s config and adds `added` after it. `added` must load and its Proxy run
//! within 30 s, and `stuck`'s rebuild must either load or say why it did not (log, metric,
//! `/readyz`): never silence.

use crate::support;

use super::harness::{Limits, fake_cluster, start_operator_limited, wait_for};
use egress_emulators::example::ExampleBackend;
use kube::api::{Api, PostParams};
use proxy_operator::api::Proxy;
use std::path::Path;
use std::time::{Duration, Instant};

/// One provider entry of the example plugin against `backend`.
fn entry(
    name: &str,
    backend: &ExampleBackend,
    token: &Path,
    limits: &str,
    regions: &str,
) -> String {
    format!(
        "- name: {name}\n  plugin: example.wasm\n  additionalHosts: ['{url}']\n  allowPrivateAddresses: true\n  \
         limits: {{{limits}}}\n  secrets: {{token: {secret}}}\n  \
         config: {{endpoint: '{url}', regions: [{regions}]}}\n",
        url = backend.url(),
        secret = token.display()
    )
}

fn proxy(name: &str, provider: &str) -> Proxy {
    serde_json::from_value(serde_json::json!({
        "apiVersion": "egress.proxy-operator.dev/v1alpha1",
        "kind": "Proxy",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {"provider": provider, "placement": {"region": "r1"},
                 "cloudInit": {"inline": "#cloud-config\n"}, "port": 3128},
    }))
    .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_provider_whose_calls_hang_holds_up_no_other_provider_of_the_same_reload() {
    let plugin_dir = plugins_or_skip!();
    let dir = tempfile::tempdir().unwrap();
    let (_fake, client, kubeconfig) = fake_cluster(dir.path()).await;
    let token = dir.path().join("token");
    std::fs::write(&token, "tok").unwrap();
    let hung = ExampleBackend::start("tok");
    let healthy = ExampleBackend::start("tok");
    let providers = dir.path().join("providers.yaml");
    let stuck_limits = "timeout: 120s, concurrency: 1";
    std::fs::write(
        &providers,
        format!(
            "providers:\n{}",
            entry("stuck", &hung, &token, stuck_limits, "r1")
        ),
    )
    .unwrap();
    let Some(mut op) = start_operator_limited(
        &plugin_dir,
        &providers,
        &kubeconfig,
        dir.path(),
        &["--probe-target", "127.0.0.1:9"],
        &[],
        Limits::Deployment,
    ) else {
        return;
    };
    let body = wait_for(
        "/readyz to answer 200",
        Duration::from_secs(60),
        async || {
            let (code, body) = op.get("/readyz").await;
            (code == 200).then_some(body)
        },
    )
    .await;
    assert!(body.contains("1 provider(s) serving (stuck)"), "{body}");

    // Every call to stuck's backend now hangs past its 120 s timeout. Two Proxies: one's
    // create holds the only slot, the other's waits for it at a higher priority than any
    // load-time call would (a third would take the reconciler's last turn of three: that
    // holds up other providers' Proxies too, but not through the reload).
    hung.inject_delay(Duration::from_secs(600), 1_000_000);
    let proxies: Api<Proxy> = Api::namespaced(client.clone(), "default");
    for name in ["s1", "s2"] {
        proxies
            .create(&PostParams::default(), &proxy(name, "stuck"))
            .await
            .unwrap();
    }
    let before = hung.requests().len();
    wait_for(
        "a call of stuck's to hang on its backend",
        Duration::from_secs(30),
        async || (hung.requests().len() > before).then_some(()),
    )
    .await;
    // A Proxy for the provider the edit adds: not configured yet.
    proxies
        .create(&PostParams::default(), &proxy("a1", "added"))
        .await
        .unwrap();

    // One edit: stuck's config changes, and `added` comes after it.
    std::fs::write(
        &providers,
        format!(
            "providers:\n{}{}",
            entry("stuck", &hung, &token, stuck_limits, "r1, r2"),
            entry("added", &healthy, &token, "timeout: 30s", "r1")
        ),
    )
    .unwrap();
    let edited = Instant::now();
    let within = Duration::from_secs(30);

    // `added` loads and serves: its Proxy runs on its backend.
    wait_for(
        "the provider added by the edit to load and its Proxy to run",
        within,
        async || {
            let state = proxies
                .get("a1")
                .await
                .ok()?
                .status?
                .state
                .filter(|s| s == "Running")?;
            Some(state)
        },
    )
    .await;
    let (code, body) = op.get("/readyz").await;
    assert_eq!(code, 200, "{body}");
    assert!(body.contains("(added, stuck)"), "{body}");
    eprintln!(
        "the added provider's Proxy ran {:?} after the edit",
        edited.elapsed()
    );

    // `stuck`'s rebuild loaded, or said everywhere why not; within the same bound.
    let outcome = wait_for(
        "stuck's rebuild to load or to report its failure",
        within
            .saturating_sub(edited.elapsed())
            .max(Duration::from_secs(1)),
        async || {
            let (_, metrics) = op.get("/metrics").await;
            let (_, readyz) = op.get("/readyz").await;
            let log = op.log();
            let line = |what: &str| {
                log.lines()
                    .rfind(|l| l.contains(what) && l.contains("provider=stuck"))
                    .map(str::to_string)
            };
            if metrics.contains(r#"proxy_operator_provider_reloads_total{provider="stuck"} 2"#) {
                return Some(format!(
                    "loaded: {}",
                    line("provider loaded provider=stuck replaced=true")?
                ));
            }
            let counted = metrics.lines().any(|l| {
                l.starts_with(r#"proxy_operator_provider_reload_errors_total{provider="stuck","#)
                    && !l.ends_with(" 0")
            });
            let shown = readyz.contains("[!] provider stuck failed to reload");
            match (counted, shown, line("provider not reloaded")) {
                (true, true, Some(l)) => Some(format!("failed: {l}\n/readyz: {readyz}")),
                _ => None,
            }
        },
    )
    .await;
    eprintln!("stuck's rebuild: {outcome}");
    let log = op.log();
    assert!(
        log.lines()
            .any(|l| l.contains("provider loaded") && l.contains("provider=added")),
        "no log line of the added provider's load"
    );
    op.assert_alive("after the reload");
}
