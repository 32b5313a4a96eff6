//! A user's template bomb against a running operator under the Deployment's memory limit
//! (threat model: user -> operator, templates): one 204 KiB Proxy with 10,000
//! `allowedClients` and 1,000 `{{egress.allowedClients}}` placeholders rendered to 136 MiB
//! and got the operator OOM-killed within a second, and, since the Proxy stays, a real pod
//! would crash-loop. It is refused as `InvalidSpec` naming the limit, before anything is
//! rendered, and another Proxy still runs.

use super::harness::{Limits, start_example_operator, wait_for};
use crate::support;
use kube::api::{Api, PostParams};
use proxy_operator::api::Proxy;
use std::time::Duration;

fn condition(p: &Proxy, reason: &str) -> Option<String> {
    let v = serde_json::to_value(p).ok()?;
    v["status"]["conditions"]
        .as_array()?
        .iter()
        .find(|c| c["reason"] == reason)
        .map(|c| c["message"].as_str().unwrap_or_default().to_string())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_template_bomb_is_refused_and_the_operator_stays_up() {
    let plugin_dir = plugins_or_skip!();
    let Some(setup) = start_example_operator(
        &plugin_dir,
        &["--probe-target", "127.0.0.1:9"],
        Limits::Deployment,
    )
    .await
    else {
        return;
    };
    let (mut op, client) = (setup.op, setup.client);
    let proxies: Api<Proxy> = Api::namespaced(client.clone(), "default");
    // Past the CRD's bounds (10,000 allowedClients, a 28 KiB template) the API server
    // refuses it, naming both fields.
    let clients = |n: usize| -> Vec<String> {
        (0..n)
            .map(|i| format!("10.{}.{}.0/24", i / 256, i % 256))
            .collect()
    };
    let bomb = |clients: Vec<String>, placeholders: usize| -> Proxy {
        serde_json::from_value(serde_json::json!({
            "apiVersion": "egress.proxy-operator.dev/v1alpha1",
            "kind": "Proxy",
            "metadata": {"name": "bomb", "namespace": "default"},
            "spec": {"provider": "ex", "placement": {"region": "r1"},
                     "cloudInit": {"inline": "x {{egress.allowedClients}}\n".repeat(placeholders)},
                     "port": 3128,
                     "auth": {"type": "None", "allowedClients": clients}},
        }))
        .unwrap()
    };
    let refused = proxies
        .create(&PostParams::default(), &bomb(clients(10_000), 1_000))
        .await
        .unwrap_err()
        .to_string();
    assert!(
        refused.contains("spec.auth.allowedClients") && refused.contains("spec.cloudInit.inline"),
        "{refused}"
    );
    // Within them (256 clients, 585 placeholders in 16 KiB) it would render to 2.2 MiB:
    // the operator refuses it before building any of it.
    proxies
        .create(&PostParams::default(), &bomb(clients(256), 585))
        .await
        .unwrap();
    let fine: Proxy = serde_json::from_value(serde_json::json!({
        "apiVersion": "egress.proxy-operator.dev/v1alpha1",
        "kind": "Proxy",
        "metadata": {"name": "fine", "namespace": "default"},
        "spec": {"provider": "ex", "placement": {"region": "r1"},
                 "cloudInit": {"inline": "#cloud-config\n"}, "port": 3128},
    }))
    .unwrap();
    proxies.create(&PostParams::default(), &fine).await.unwrap();

    let message = wait_for(
        "the bomb's InvalidSpec",
        Duration::from_secs(30),
        async || {
            op.assert_alive("while the bomb is reconciled");
            assert_eq!(op.get("/healthz").await.0, 200, "/healthz");
            let p = proxies.get("bomb").await.ok()?;
            condition(&p, "InvalidSpec")
        },
    )
    .await;
    assert!(
        message.contains("16384 bytes") && message.contains("spec.cloudInit"),
        "{message}"
    );
    wait_for(
        "the other Proxy to run",
        Duration::from_secs(30),
        async || {
            let p = proxies.get("fine").await.ok()?;
            let v = serde_json::to_value(&p).ok()?;
            (v["status"]["phase"] == "Running" || v["status"]["state"] == "Running").then_some(())
        },
    )
    .await;
    op.assert_alive("after the bomb");
    let cgroup = op.cgroup.as_ref().unwrap();
    assert_eq!(cgroup.oom_kills(), 0);
    eprintln!("operator cgroup peak: {} MiB", cgroup.peak() >> 20);
}
