//! A user's Proxies against the redactor's memory, in a running operator under the
//! Deployment's memory limit (threat model: user -> operator, cloud-init and credentials):
//! every distinct document a Proxy brings is scrubbed from everything its provider's plugin
//! says, at about 1.2 MiB of automaton for a random 15 KiB one, and was kept for the life
//! of the process with no limit: 150 such Proxies took the operator to 291 MiB of its 320,
//! 250 past it. Now what
//! the redactor holds is bounded (`--redaction-memory`): the Proxies past it wait with
//! `CloudInitUnavailable` naming the limit, the operator stays up, and deleting Proxies
//! makes room for the waiting ones.

use super::harness::{Limits, start_example_operator, wait_for};
use crate::support;
use kube::api::{Api, DeleteParams, ListParams, PostParams};
use proxy_operator::api::Proxy;
use std::time::Duration;

/// Without the bound, 150 of them took the operator (debug build) to a peak of 291 MiB of
/// its 320 MiB; 250 are past it.
const PROXIES: usize = 250;

/// About 15 KiB of random lines, different for every `seed`: the costliest document for
/// the redactor (every line a whole value of its own in every encoding).
fn random_document(seed: usize) -> String {
    use sha2::{Digest, Sha256};
    let mut doc = String::from("#cloud-config\nruncmd:\n");
    for line in 0..360 {
        let d = Sha256::digest(format!("{seed}/{line}").as_bytes());
        let hex: String = d.iter().map(|b| format!("{b:02x}")).collect();
        doc.push_str(&format!("  - echo {}\n", &hex[..34]));
    }
    doc
}

/// The message of the Proxy's `CloudInitUnavailable` condition, if it has one.
fn waiting_message(p: &Proxy) -> Option<String> {
    let v = serde_json::to_value(p).ok()?;
    v["status"]["conditions"]
        .as_array()?
        .iter()
        .find(|c| c["reason"] == "CloudInitUnavailable")
        .map(|c| c["message"].as_str().unwrap_or_default().to_string())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn many_distinct_documents_wait_at_the_limit_and_the_operator_stays_up() {
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
    for i in 0..PROXIES {
        let p: Proxy = serde_json::from_value(serde_json::json!({
            "apiVersion": "egress.proxy-operator.dev/v1alpha1",
            "kind": "Proxy",
            "metadata": {"name": format!("p{i:03}"), "namespace": "default"},
            "spec": {"provider": "ex", "placement": {"region": "r1"},
                     "cloudInit": {"inline": random_document(i)}, "port": 3128},
        }))
        .unwrap();
        proxies.create(&PostParams::default(), &p).await.unwrap();
    }

    // Every Proxy either got an instance or waits, saying why.
    let (admitted, waiting) = wait_for(
        "every Proxy created or waiting on the limit",
        Duration::from_secs(240),
        async || {
            op.assert_alive("while the Proxies are reconciled");
            assert_eq!(op.get("/healthz").await.0, 200, "/healthz");
            let list = proxies.list(&ListParams::default()).await.ok()?;
            let mut admitted = vec![];
            let mut waiting = vec![];
            for p in &list.items {
                let name = p.metadata.name.clone().unwrap_or_default();
                let id = serde_json::to_value(p).ok()?["status"]["providerID"].clone();
                match waiting_message(p) {
                    Some(m) => {
                        assert!(m.contains("--redaction-memory"), "{name}: {m}");
                        waiting.push(name);
                    }
                    _ if id.is_string() => admitted.push(name),
                    _ => return None,
                }
            }
            (admitted.len() + waiting.len() == PROXIES).then_some((admitted, waiting))
        },
    )
    .await;
    eprintln!(
        "{} Proxies created, {} waiting on --redaction-memory",
        admitted.len(),
        waiting.len()
    );
    assert!(!waiting.is_empty(), "the limit was never reached");
    assert!(admitted.len() >= 5, "only {} admitted", admitted.len());
    op.assert_alive("with the redactor full");

    // Deleting Proxies makes room: waiting ones are created on their next try.
    for name in admitted.iter().take(8) {
        proxies
            .delete(name, &DeleteParams::default())
            .await
            .unwrap();
    }
    let waiting_before = waiting.len();
    wait_for(
        "a waiting Proxy to be created once others are deleted",
        Duration::from_secs(120),
        async || {
            op.assert_alive("after the deletions");
            let list = proxies.list(&ListParams::default()).await.ok()?;
            let still = list
                .items
                .iter()
                .filter(|p| waiting_message(p).is_some())
                .count();
            (still < waiting_before).then_some(())
        },
    )
    .await;
    op.assert_alive("at the end");
    let cgroup = op.cgroup.as_ref().unwrap();
    assert_eq!(cgroup.oom_kills(), 0);
    eprintln!("operator cgroup peak: {} MiB", cgroup.peak() >> 20);
}
