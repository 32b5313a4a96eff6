//! Contract 0.2.0's inputs against the real `proxy-operator run` binary under the
//! Deployment's limits (threat model: plugin -> host, 0.2.0 rows): the hostile plugin is the
//! only provider, and each Proxy's create runs one attack (`machineType: get:<attack>`).
//! What a plugin marks sensitive never reaches a Proxy's status, an Event, `/metrics` or the
//! log; a flood of marked values stays within the operator's memory; a value too long to
//! hold fails that Proxy's create and says why on it; a text that matches marked values at
//! every byte is withheld whole within the memory limit; a rate limit the plugin reports is a
//! quota wait; and the operator stays ready throughout. (The reply fields 0.2.0 adds come
//! back from `get`, which `create` does not return: `hostile.rs` attacks them.)

use crate::harness::{HostileOperator, hostile_operator, wait_for};
use crate::support;

use kube::api::{Api, PostParams};
use proxy_operator::api::{Proxy, condition};
use proxy_operator::controller::decide::reason;
use serde_json::json;
use std::time::Duration;

const TOKEN: &str = "derived-token-SENTINEL-8f3a";

fn proxy(name: &str, attack: &str) -> Proxy {
    serde_json::from_value(json!({
        "apiVersion": "egress.proxy-operator.dev/v1alpha1",
        "kind": "Proxy",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {"provider": "hostile",
                 "placement": {"region": "r1", "machineType": format!("get:{attack}")},
                 "cloudInit": {"inline": "#cloud-config\n"}, "port": 3128},
    }))
    .unwrap()
}

/// The Proxy's Provisioned condition, once it has `reason` and its message says `says`.
async fn said_on(
    proxies: &Api<Proxy>,
    name: &str,
    reason: &str,
    says: &str,
) -> k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition {
    wait_for(
        &format!("{name}: {reason} saying {says:?} on the Proxy"),
        Duration::from_secs(90),
        async || {
            let p = proxies.get(name).await.ok()?;
            let c = p.condition(condition::PROVISIONED)?.clone();
            (c.reason == reason && c.message.contains(says)).then_some(c)
        },
    )
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn contract_0_2_0_inputs_are_bounded_in_a_running_operator() {
    let plugin_dir = plugins_or_skip!();
    let dir = tempfile::tempdir().unwrap();
    let Some(HostileOperator { fake, client, op }) =
        hostile_operator(&plugin_dir, dir.path(), "", &[]).await
    else {
        return;
    };

    // (name, attack, reason on the Proxy, what its message says)
    let cases = [
        (
            "marked",
            format!("mark:{TOKEN}"),
            reason::PROVIDER_ERROR,
            "[REDACTED]",
        ),
        (
            "huge",
            "mark-huge:5000".to_string(),
            reason::PROVIDER_ERROR,
            "5000 bytes, more than the 2048",
        ),
        (
            "rate",
            "rate-limited:4294967295".to_string(),
            reason::QUOTA_EXCEEDED,
            "slow down",
        ),
    ];
    let proxies: Api<Proxy> = Api::namespaced(client.clone(), "default");
    for (name, attack, _, _) in &cases {
        proxies
            .create(&PostParams::default(), &proxy(name, attack))
            .await
            .unwrap();
    }
    for (name, attack, want_reason, says) in &cases {
        let c = said_on(&proxies, name, want_reason, says).await;
        assert!(!c.message.contains(TOKEN), "{name} ({attack}): {c:?}");
    }
    // Once marked, the value is refused as an instance ID (value withheld).
    proxies
        .create(
            &PostParams::default(),
            &proxy("as-id", &format!("id:{TOKEN}")),
        )
        .await
        .unwrap();
    wait_for(
        "the marked value refused as an ID",
        Duration::from_secs(90),
        async || {
            let p = proxies.get("as-id").await.ok()?;
            let c = p.condition(condition::PROVISIONED)?.clone();
            c.message
                .contains("plugin reply rejected: id holds a secret")
                .then_some(())
        },
    )
    .await;
    assert_eq!(
        proxies
            .get("as-id")
            .await
            .unwrap()
            .status
            .unwrap_or_default()
            .provider_id,
        None
    );

    // Nothing shows the marked value: statuses, Events, /metrics, the log.
    // (Only the statuses: the specs hold the value, in the attack the test wrote.)
    let statuses: Vec<_> = proxies
        .list(&Default::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .map(|p| p.status)
        .collect();
    let statuses = serde_json::to_string(&statuses).unwrap();
    let events = serde_json::to_string(&fake.objects("events.events.k8s.io")).unwrap();
    let (_, metrics) = op.get("/metrics").await;
    for (what, text) in [
        ("statuses", &statuses),
        ("events", &events),
        ("metrics", &metrics),
        ("log", &op.log()),
    ] {
        if let Some(at) = text.find(TOKEN) {
            let from = text[..at]
                .char_indices()
                .rev()
                .nth(300)
                .map_or(0, |(i, _)| i);
            panic!(
                "the marked value is in the {what}: ...{}",
                &text[from..(at + 60).min(text.len())]
            );
        }
    }
    assert!(
        op.log().contains("[REDACTED]"),
        "the marked value was scrubbed from the log"
    );

    // A flood of marked values (each create marks 400 new ones, and is retried again and
    // again): scrubbed too, and the operator stays ready and within the Deployment's memory.
    // It comes last: it pushes the plugin's earlier values out of their ring of 8, so the
    // marked value may then show (the plugin forgot its own secret, which a hostile plugin
    // can show anyway); it can never push out a Proxy's values or another provider's.
    proxies
        .create(&PostParams::default(), &proxy("flood", "mark-flood:400"))
        .await
        .unwrap();
    said_on(
        &proxies,
        "flood",
        reason::PROVIDER_ERROR,
        "flooded, last [REDACTED]",
    )
    .await;

    // Eight marked values of one byte, then 3 MB of that byte in a log line and in the
    // error, again on every retry: each place of the text matches every value. Holding
    // every match took the host to 389 MiB for one line (release build), past the
    // Deployment's limit. The text is withheld whole, and the operator stays up.
    proxies
        .create(&PostParams::default(), &proxy("run", "mark-run:3000000"))
        .await
        .unwrap();
    said_on(
        &proxies,
        "run",
        reason::PROVIDER_ERROR,
        "[REDACTED: the whole text",
    )
    .await;
    assert_eq!(op.get("/readyz").await.0, 200, "ready after the run");

    // What a plugin says a placement costs: a quote that never answers holds no reconcile
    // (the others are priced while it hangs), the largest amount there is fits the
    // Proxy's status, a currency that is no ISO 4217 code leaves the Proxy without a
    // price. Each of the three still goes Running, its status written.
    for name in ["hang", "huge", "currency"] {
        let mut p = proxy(&format!("quote-{name}"), "");
        p.spec.placement.machine_type = format!("run+{name}");
        proxies.create(&PostParams::default(), &p).await.unwrap();
    }
    let price = |p: &Proxy| {
        p.status
            .as_ref()
            .and_then(|s| s.hourly_price.as_ref())
            .map(|h| format!("{} {}", h.per_hour, h.currency))
    };
    let running =
        |p: &Proxy| p.status.as_ref().and_then(|s| s.state.clone()) == Some("Running".into());
    let huge = wait_for(
        "the huge price on its Proxy",
        Duration::from_secs(30),
        async || {
            let p = proxies.get("quote-huge").await.ok()?;
            price(&p).is_some().then_some(p)
        },
    )
    .await;
    assert_eq!(price(&huge).as_deref(), Some("18446744073709.551615 IDR"));
    for name in ["quote-hang", "quote-currency"] {
        let p = wait_for(
            &format!("{name} Running"),
            Duration::from_secs(30),
            async || {
                let p = proxies.get(name).await.ok()?;
                running(&p).then_some(p)
            },
        )
        .await;
        assert_eq!(price(&p), None, "{name}");
    }

    tokio::time::sleep(Duration::from_secs(10)).await;
    assert_eq!(op.get("/readyz").await.0, 200);
    if let Some(cgroup) = op.cgroup.as_ref() {
        assert_eq!(cgroup.oom_kills(), 0, "OOM kills in the operator's cgroup");
        eprintln!("the pod's memory peaked at {} MiB", cgroup.peak() >> 20);
    }
}
