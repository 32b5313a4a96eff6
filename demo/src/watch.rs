//! Watches the Proxies and prints one line per phase change of each: the live view of the
//! story. Lines carry the time since the demo started and are plain text, so they read the
//! same in a terminal and in a CI log.

use anyhow::{Result, bail};
use futures::StreamExt;
use kube::api::{ApiResource, DynamicObject};
use kube::runtime::{WatchStreamExt, watcher};
use serde_json::Value;
use std::collections::BTreeMap;
use std::time::{Duration, Instant};
use tokio::sync::watch;

/// What the demo shows of one Proxy.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct View {
    /// Pending (no status yet), Provisioning, Running, Healthy, Ready, Replacing, Deleting,
    /// or the state/reason the operator reports otherwise.
    pub phase: String,
    pub provider_id: Option<String>,
    pub ip: Option<String>,
    pub port: Option<i64>,
    pub spec_port: Option<i64>,
    /// The Ready condition's message (why it is not Ready, while it is not).
    pub message: String,
    pub latency_ms: Option<i64>,
    /// The Healthy condition is True (the last CONNECT probes through it worked).
    pub healthy: bool,
}

fn condition<'a>(obj: &'a Value, type_: &str) -> Option<&'a Value> {
    obj["status"]["conditions"]
        .as_array()?
        .iter()
        .find(|c| c["type"] == type_)
}

fn is_true(c: Option<&Value>) -> bool {
    c.is_some_and(|c| c["status"] == "True")
}

/// The phase of a Proxy object, as the demo names it.
pub fn view_of(obj: &Value) -> View {
    let status = &obj["status"];
    let state = status["state"].as_str();
    let ready = condition(obj, "Ready");
    let reason = ready.and_then(|c| c["reason"].as_str()).unwrap_or_default();
    let phase = if obj["metadata"]["deletionTimestamp"].is_string() {
        "Deleting".to_string()
    } else if is_true(ready) {
        "Ready".to_string()
    } else if reason == "Replacing" {
        "Replacing".to_string()
    } else if state == Some("Running") && is_true(condition(obj, "Healthy")) {
        "Healthy".to_string()
    } else if let Some(s) = state {
        s.to_string()
    } else if !reason.is_empty() {
        reason.to_string()
    } else {
        "Pending".to_string()
    };
    View {
        phase,
        provider_id: status["providerID"].as_str().map(String::from),
        ip: status["ip"].as_str().map(String::from),
        port: status["port"].as_i64(),
        spec_port: obj["spec"]["port"].as_i64(),
        message: ready
            .and_then(|c| c["message"].as_str())
            .unwrap_or_default()
            .to_string(),
        latency_ms: status["lastProbe"]["latencyMs"].as_i64(),
        healthy: is_true(condition(obj, "Healthy")),
    }
}

/// The lines to print when a Proxy's view goes from `prev` to `now`: none when its phase
/// and instance are unchanged. Ready is derived from Healthy in the same status write, so
/// a jump to Ready shows the Healthy step it passed through as well.
pub fn transition(elapsed: Duration, key: &str, prev: Option<&View>, now: &View) -> Vec<String> {
    if prev.is_some_and(|p| p.phase == now.phase && p.provider_id == now.provider_id) {
        return Vec::new();
    }
    let mut out = Vec::new();
    let was = prev.map(|p| p.phase.as_str()).unwrap_or_default();
    if now.phase == "Ready" && now.healthy && !matches!(was, "Healthy" | "Ready") {
        let healthy = View {
            phase: "Healthy".into(),
            ..now.clone()
        };
        out.push(line(elapsed, key, &healthy));
    }
    out.push(line(elapsed, key, now));
    out
}

/// The line printed when a Proxy reaches a phase.
pub fn line(elapsed: Duration, key: &str, v: &View) -> String {
    let id = v.provider_id.as_deref().unwrap_or("-");
    let addr = match (&v.ip, v.port) {
        (Some(ip), Some(port)) => format!("{ip}:{port}"),
        _ => "-".into(),
    };
    let detail = match v.phase.as_str() {
        "Pending" => "accepted; the operator has not reported yet".to_string(),
        "Provisioning" => format!("instance {id} is being created"),
        "Running" => format!("instance {id} runs at {addr}; probing it"),
        "Healthy" => match v.latency_ms {
            Some(ms) => format!("a real CONNECT through {addr} worked ({ms} ms)"),
            None => format!("a real CONNECT through {addr} worked"),
        },
        "Ready" => format!("{addr} (instance {id}), ready for the discovery API to hand out"),
        "Deleting" if v.message.is_empty() => {
            format!("the finalizer holds the object until instance {id} is deleted")
        }
        _ => v.message.clone(),
    };
    format!(
        "  {:>6.1}s  {key:<26} {:<12} {detail}",
        elapsed.as_secs_f64(),
        v.phase
    )
}

pub type Views = BTreeMap<String, View>;

/// The live view of every Proxy.
pub struct Watch {
    rx: watch::Receiver<Views>,
}

/// The Proxy resource, without depending on the operator's crate (and its wasmtime build).
pub fn proxy_resource() -> ApiResource {
    ApiResource {
        group: "egress.proxy-operator.dev".into(),
        version: "v1alpha1".into(),
        api_version: "egress.proxy-operator.dev/v1alpha1".into(),
        kind: "Proxy".into(),
        plural: "proxies".into(),
    }
}

fn key(o: &DynamicObject) -> String {
    format!(
        "{}/{}",
        o.metadata.namespace.as_deref().unwrap_or_default(),
        o.metadata.name.as_deref().unwrap_or_default()
    )
}

impl Watch {
    /// Starts watching; lines are printed from now on.
    pub fn start(client: kube::Client, started: Instant) -> Watch {
        let (tx, rx) = watch::channel(Views::new());
        let api = kube::Api::<DynamicObject>::all_with(client, &proxy_resource());
        tokio::spawn(async move {
            let mut events = watcher(api, watcher::Config::default())
                .default_backoff()
                .boxed();
            while let Some(ev) = events.next().await {
                let Ok(ev) = ev else { continue };
                match ev {
                    watcher::Event::Apply(o) | watcher::Event::InitApply(o) => {
                        let k = key(&o);
                        let v = view_of(&serde_json::to_value(&o).unwrap_or_default());
                        tx.send_if_modified(|views| {
                            let prev = views.get(&k);
                            for l in transition(started.elapsed(), &k, prev, &v) {
                                println!("{l}");
                            }
                            let modified = prev != Some(&v);
                            views.insert(k, v);
                            modified
                        });
                    }
                    watcher::Event::Delete(o) => {
                        let k = key(&o);
                        println!(
                            "  {:>6.1}s  {k:<26} {:<12} finalizer released, object removed",
                            started.elapsed().as_secs_f64(),
                            "Deleted"
                        );
                        tx.send_modify(|views| {
                            views.remove(&k);
                        });
                    }
                    watcher::Event::Init | watcher::Event::InitDone => {}
                }
            }
        });
        Watch { rx }
    }

    pub fn views(&self) -> Views {
        self.rx.borrow().clone()
    }

    /// Waits until `done` holds for the views, or fails after `timeout` saying what the
    /// Proxies look like.
    pub async fn until(
        &self,
        what: &str,
        timeout: Duration,
        done: impl Fn(&Views) -> bool,
    ) -> Result<Views> {
        let mut rx = self.rx.clone();
        match tokio::time::timeout(timeout, rx.wait_for(|v| done(v))).await {
            Ok(Ok(v)) => Ok(v.clone()),
            Ok(Err(_)) => bail!("{what}: the Proxy watch ended"),
            Err(_) => {
                let now: Vec<String> = self
                    .views()
                    .iter()
                    .map(|(k, v)| format!("{k}: {} {}", v.phase, v.message))
                    .collect();
                bail!(
                    "{what}: not done within {timeout:?}; Proxies now: [{}]",
                    now.join("; ")
                )
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn proxy(status: Value) -> Value {
        json!({"metadata": {"name": "p", "namespace": "demo"}, "spec": {"port": 31281}, "status": status})
    }

    #[test]
    fn phases_follow_the_status() {
        let cond = |t: &str, s: &str, r: &str| json!({"type": t, "status": s, "reason": r, "message": format!("{t} {r}")});
        let cases = [
            (json!(null), "Pending"),
            (
                json!({"state": "Provisioning", "conditions": [cond("Ready", "False", "Provisioning")]}),
                "Provisioning",
            ),
            (
                json!({"state": "Running", "ip": "127.0.0.1", "port": 31281, "conditions": [cond("Ready", "False", "Unhealthy"), cond("Healthy", "Unknown", "NotProbed")]}),
                "Running",
            ),
            (
                json!({"state": "Running", "conditions": [cond("Ready", "False", "X"), cond("Healthy", "True", "ProbeSucceeded")]}),
                "Healthy",
            ),
            (
                json!({"state": "Running", "conditions": [cond("Ready", "True", "Ready"), cond("Healthy", "True", "ProbeSucceeded")]}),
                "Ready",
            ),
            (
                json!({"state": "Running", "conditions": [cond("Ready", "False", "Replacing"), cond("Healthy", "True", "ProbeSucceeded")]}),
                "Replacing",
            ),
            (
                json!({"conditions": [cond("Ready", "False", "ProviderNotConfigured")]}),
                "ProviderNotConfigured",
            ),
            (json!({"state": "Stopped"}), "Stopped"),
        ];
        for (status, want) in cases {
            assert_eq!(view_of(&proxy(status.clone())).phase, want, "{status}");
        }
        let mut deleting =
            proxy(json!({"state": "Running", "conditions": [cond("Ready", "True", "Ready")]}));
        deleting["metadata"]["deletionTimestamp"] = json!("2026-11-29T10:00:00Z");
        assert_eq!(view_of(&deleting).phase, "Deleting");
    }

    #[test]
    fn a_jump_to_ready_shows_healthy_first_and_repeats_print_nothing() {
        let running = view_of(&proxy(
            json!({"state": "Running", "ip": "127.0.0.1", "port": 31281}),
        ));
        let ready = view_of(&proxy(json!({
            "state": "Running", "ip": "127.0.0.1", "port": 31281, "lastProbe": {"latencyMs": 3},
            "conditions": [{"type": "Ready", "status": "True"}, {"type": "Healthy", "status": "True"}],
        })));
        let lines = transition(Duration::ZERO, "demo/p", Some(&running), &ready);
        assert_eq!(lines.len(), 2, "{lines:?}");
        assert!(
            lines[0].contains("Healthy") && lines[0].contains("(3 ms)"),
            "{lines:?}"
        );
        assert!(lines[1].contains("Ready"), "{lines:?}");
        assert!(transition(Duration::ZERO, "demo/p", Some(&ready), &ready).is_empty());
        let healthy = View {
            phase: "Healthy".into(),
            ..ready.clone()
        };
        assert_eq!(
            transition(Duration::ZERO, "demo/p", Some(&healthy), &ready).len(),
            1
        );
        let replaced = View {
            provider_id: Some("fsn1/2".into()),
            ..ready.clone()
        };
        assert_eq!(
            transition(Duration::ZERO, "demo/p", Some(&ready), &replaced).len(),
            1
        );
    }

    #[test]
    fn lines_name_the_proxy_phase_and_address() {
        let v = view_of(&proxy(json!({
            "state": "Running", "ip": "127.0.0.1", "port": 31281, "providerID": "fsn1/4200001",
            "conditions": [{"type": "Ready", "status": "True", "reason": "Ready"}],
        })));
        let l = line(Duration::from_millis(12_340), "demo/hetzner-fsn1", &v);
        assert!(l.contains("12.3s"), "{l}");
        assert!(l.contains("demo/hetzner-fsn1"), "{l}");
        assert!(l.contains("Ready"), "{l}");
        assert!(l.contains("127.0.0.1:31281 (instance fsn1/4200001)"), "{l}");
        let bad = view_of(&proxy(
            json!({"conditions": [{"type": "Ready", "status": "False", "reason": "InvalidSpec", "message": "spec.port 0"}]}),
        ));
        assert!(line(Duration::ZERO, "demo/x", &bad).ends_with("spec.port 0"));
    }
}
