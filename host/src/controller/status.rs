//! Turning a decision's [`StatusChange`] into the Proxy's next status.
//!
//! Status is written with server-side apply under one field manager, and a field that
//! manager stops sending is removed. So every write sends the whole status: the current one
//! with the change folded in. That is this function, pure, so "what does the status look
//! like after X" is a unit test.

use super::decide::{Cond, StatusChange};
use crate::api::{ProxyStatus, condition};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};

/// `Ready` reasons of their own (otherwise `Ready` carries the `Provisioned` reason).
pub mod ready_reason {
    pub const READY: &str = "Ready";
    /// Provisioned, but no probe result for this address yet.
    pub const HEALTH_UNKNOWN: &str = "HealthUnknown";
    pub const UNHEALTHY: &str = "Unhealthy";
}

/// `Healthy` reason set when the address changes: the last probe was of another instance.
pub const NOT_PROBED: &str = "NotProbed";

/// The status after `change`, for generation `generation`, at `now`.
///
/// - `Provisioned` is set from the change; its `lastTransitionTime` moves only when its
///   status flips.
/// - `Ready` is derived: Provisioned and Healthy. While not provisioned it carries the
///   Provisioned reason, so `kubectl get` shows why (Replacing, QuotaExceeded, ...).
/// - `Healthy` and `lastProbe` belong to the probe engine, except that a new address
///   resets them: a probe of the previous instance says nothing about this one.
pub fn apply(
    current: &ProxyStatus,
    change: &StatusChange,
    generation: i64,
    now: &Time,
) -> ProxyStatus {
    let mut s = current.clone();
    if let Some(id) = &change.provider_id {
        s.provider_id = id.clone();
    }
    if let Some(hash) = &change.spec_hash {
        s.spec_hash = hash.clone();
    }
    if let Some(state) = &change.state {
        s.state = state.map(|st| st.as_str().to_string());
    }
    if let Some(price) = &change.hourly_price {
        s.hourly_price = price.clone();
    }
    if let Some(address) = &change.address {
        let (ip, port) = match address {
            Some((ip, port)) => (Some(ip.clone()), Some(*port)),
            None => (None, None),
        };
        if (ip.as_ref(), port) != (current.ip.as_ref(), current.port) {
            s.last_probe = None;
            set_condition(
                &mut s.conditions,
                condition::HEALTHY,
                "Unknown",
                NOT_PROBED,
                "not probed at this address yet",
                generation,
                now,
            );
        }
        s.ip = ip;
        s.port = port;
    }
    if let Some(Cond {
        ok,
        reason,
        message,
    }) = &change.provisioned
    {
        set_condition(
            &mut s.conditions,
            condition::PROVISIONED,
            if *ok { "True" } else { "False" },
            reason,
            message,
            generation,
            now,
        );
    }
    derive_ready(&mut s.conditions, generation, now);
    s.observed_generation = Some(generation);
    s
}

/// What the probe engine last concluded about the address in the status.
#[derive(Debug, Clone, PartialEq)]
pub struct HealthView {
    pub healthy: bool,
    pub reason: String,
    pub message: String,
    pub probed_at: Time,
    pub latency_ms: Option<i64>,
}

/// Folds the probe engine's verdict in: the `Healthy` condition, `lastProbe`, and `Ready`
/// derived again. Only called with a verdict about the address the status holds.
pub fn apply_health(
    current: &ProxyStatus,
    h: &HealthView,
    generation: i64,
    now: &Time,
) -> ProxyStatus {
    let mut s = current.clone();
    set_condition(
        &mut s.conditions,
        condition::HEALTHY,
        if h.healthy { "True" } else { "False" },
        &h.reason,
        &h.message,
        generation,
        now,
    );
    s.last_probe = Some(crate::api::LastProbe {
        time: h.probed_at.clone(),
        latency_ms: h.latency_ms.filter(|_| h.healthy),
        error: (!h.healthy).then(|| h.message.clone()),
    });
    derive_ready(&mut s.conditions, generation, now);
    s
}

fn derive_ready(conditions: &mut Vec<Condition>, generation: i64, now: &Time) {
    let find = |t: &str| conditions.iter().find(|c| c.type_ == t).cloned();
    let (status, reason, message) = match (find(condition::PROVISIONED), find(condition::HEALTHY)) {
        (None, _) => ("False", "Pending".to_string(), String::new()),
        (Some(p), _) if p.status != "True" => ("False", p.reason, p.message),
        (Some(_), Some(h)) if h.status == "True" => {
            ("True", ready_reason::READY.to_string(), String::new())
        }
        (Some(_), Some(h)) if h.status == "False" => {
            ("False", ready_reason::UNHEALTHY.to_string(), h.message)
        }
        (Some(_), _) => (
            "False",
            ready_reason::HEALTH_UNKNOWN.to_string(),
            "waiting for the first health probe".to_string(),
        ),
    };
    set_condition(
        conditions,
        condition::READY,
        status,
        &reason,
        &message,
        generation,
        now,
    );
}

/// Sets one condition, keeping `lastTransitionTime` unless the status flips. Conditions
/// keep a stable order (the order they were first set in).
pub fn set_condition(
    conditions: &mut Vec<Condition>,
    type_: &str,
    status: &str,
    reason: &str,
    message: &str,
    generation: i64,
    now: &Time,
) {
    let next = |last_transition_time: Time| Condition {
        type_: type_.to_string(),
        status: status.to_string(),
        reason: reason.to_string(),
        message: message.to_string(),
        observed_generation: Some(generation),
        last_transition_time,
    };
    match conditions.iter_mut().find(|c| c.type_ == type_) {
        Some(c) => {
            let since = if c.status == status {
                c.last_transition_time.clone()
            } else {
                now.clone()
            };
            *c = next(since);
        }
        None => conditions.push(next(now.clone())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::controller::decide::reason;
    use egress_plugin_host::provider::State;
    use k8s_openapi::jiff::Timestamp;

    fn at(s: i64) -> Time {
        Time(Timestamp::from_second(s).unwrap())
    }

    fn cond<'a>(s: &'a ProxyStatus, t: &str) -> &'a Condition {
        s.conditions.iter().find(|c| c.type_ == t).unwrap()
    }

    fn provisioned(ok: bool, reason: &'static str) -> StatusChange {
        StatusChange {
            provisioned: Some(Cond {
                ok,
                reason,
                message: format!("m-{reason}"),
            }),
            ..Default::default()
        }
    }

    fn healthy(s: &mut ProxyStatus, status: &str) {
        set_condition(
            &mut s.conditions,
            condition::HEALTHY,
            status,
            "Probed",
            "probe said so",
            1,
            &at(5),
        );
    }

    #[test]
    fn ready_is_provisioned_and_healthy() {
        let empty = ProxyStatus::default();
        // (provisioned, healthy, want Ready status, want Ready reason)
        for (p, h, want, want_reason) in [
            (
                Some((false, reason::REPLACING)),
                Some("True"),
                "False",
                reason::REPLACING,
            ),
            (
                Some((false, reason::QUOTA_EXCEEDED)),
                None,
                "False",
                reason::QUOTA_EXCEEDED,
            ),
            (
                Some((true, reason::RUNNING)),
                None,
                "False",
                ready_reason::HEALTH_UNKNOWN,
            ),
            (
                Some((true, reason::RUNNING)),
                Some("Unknown"),
                "False",
                ready_reason::HEALTH_UNKNOWN,
            ),
            (
                Some((true, reason::RUNNING)),
                Some("False"),
                "False",
                ready_reason::UNHEALTHY,
            ),
            (
                Some((true, reason::RUNNING)),
                Some("True"),
                "True",
                ready_reason::READY,
            ),
            (None, None, "False", "Pending"),
        ] {
            let mut s = empty.clone();
            if let Some(h) = h {
                healthy(&mut s, h);
            }
            let change = match p {
                Some((ok, r)) => provisioned(ok, r),
                None => StatusChange::default(),
            };
            let out = apply(&s, &change, 1, &at(10));
            let ready = cond(&out, condition::READY);
            assert_eq!(
                (ready.status.as_str(), ready.reason.as_str()),
                (want, want_reason),
                "{p:?} {h:?}"
            );
        }
    }

    #[test]
    fn transition_time_moves_only_when_status_flips() {
        let s = apply(
            &ProxyStatus::default(),
            &provisioned(false, reason::PROVISIONING),
            1,
            &at(10),
        );
        assert_eq!(
            cond(&s, condition::PROVISIONED).last_transition_time,
            at(10)
        );
        let s = apply(&s, &provisioned(false, reason::QUOTA_EXCEEDED), 2, &at(20));
        let c = cond(&s, condition::PROVISIONED);
        assert_eq!(c.last_transition_time, at(10), "False -> False keeps it");
        assert_eq!(
            (c.reason.as_str(), c.observed_generation),
            (reason::QUOTA_EXCEEDED, Some(2))
        );
        let s = apply(&s, &provisioned(true, reason::RUNNING), 2, &at(30));
        assert_eq!(
            cond(&s, condition::PROVISIONED).last_transition_time,
            at(30)
        );
        assert_eq!(s.observed_generation, Some(2));
    }

    #[test]
    fn fields_set_cleared_and_kept() {
        let running = StatusChange {
            provider_id: Some(Some("id".into())),
            spec_hash: Some(Some("h".into())),
            state: Some(Some(State::Running)),
            address: Some(Some(("192.0.2.1".into(), 3128))),
            provisioned: None,
            hourly_price: Default::default(),
        };
        let s = apply(&ProxyStatus::default(), &running, 1, &at(1));
        assert_eq!(
            (
                s.provider_id.as_deref(),
                s.spec_hash.as_deref(),
                s.state.as_deref(),
                s.ip.as_deref(),
                s.port
            ),
            (
                Some("id"),
                Some("h"),
                Some("Running"),
                Some("192.0.2.1"),
                Some(3128)
            )
        );
        // An empty change keeps everything.
        let kept = apply(&s, &StatusChange::default(), 1, &at(2));
        assert_eq!(kept, s);
        let cleared = apply(
            &s,
            &StatusChange {
                provider_id: Some(None),
                spec_hash: Some(None),
                state: Some(None),
                address: Some(None),
                provisioned: None,
                hourly_price: Default::default(),
            },
            1,
            &at(3),
        );
        assert_eq!(
            (
                cleared.provider_id,
                cleared.spec_hash,
                cleared.state,
                cleared.ip,
                cleared.port
            ),
            (None, None, None, None, None)
        );
    }

    #[test]
    fn a_new_address_resets_the_health_verdict() {
        let mut s = apply(
            &ProxyStatus::default(),
            &StatusChange {
                address: Some(Some(("192.0.2.1".into(), 3128))),
                provisioned: Some(Cond {
                    ok: true,
                    reason: reason::RUNNING,
                    message: String::new(),
                }),
                ..Default::default()
            },
            1,
            &at(1),
        );
        healthy(&mut s, "True");
        s.last_probe = Some(crate::api::LastProbe {
            time: at(5),
            latency_ms: Some(3),
            error: None,
        });
        let same = StatusChange {
            address: Some(Some(("192.0.2.1".into(), 3128))),
            ..Default::default()
        };
        let out = apply(&s, &same, 1, &at(6));
        assert_eq!(cond(&out, condition::READY).status, "True");
        assert!(out.last_probe.is_some(), "same address keeps the probe");

        let moved = StatusChange {
            address: Some(Some(("192.0.2.2".into(), 3128))),
            ..Default::default()
        };
        let out = apply(&s, &moved, 1, &at(7));
        assert_eq!(cond(&out, condition::HEALTHY).status, "Unknown");
        assert_eq!(cond(&out, condition::HEALTHY).reason, NOT_PROBED);
        assert_eq!(cond(&out, condition::READY).status, "False");
        assert!(out.last_probe.is_none());
    }

    #[test]
    fn health_verdicts_set_healthy_last_probe_and_ready() {
        let now = Time(k8s_openapi::jiff::Timestamp::from_second(1_700_000_000).unwrap());
        let provisioned = StatusChange {
            provisioned: Some(Cond {
                ok: true,
                reason: "Running",
                message: String::new(),
            }),
            address: Some(Some(("127.0.0.1".into(), 3128))),
            ..StatusChange::default()
        };
        let s = apply(&ProxyStatus::default(), &provisioned, 1, &now);
        let ready = |s: &ProxyStatus| {
            let c = s
                .conditions
                .iter()
                .find(|c| c.type_ == condition::READY)
                .unwrap();
            (c.status.clone(), c.reason.clone())
        };
        assert_eq!(
            ready(&s),
            ("False".into(), ready_reason::HEALTH_UNKNOWN.into())
        );
        let view = |healthy: bool, reason: &str| HealthView {
            healthy,
            reason: reason.into(),
            message: format!("{reason} message"),
            probed_at: now.clone(),
            latency_ms: Some(4),
        };
        let up = apply_health(&s, &view(true, "Healthy"), 1, &now);
        assert_eq!(ready(&up), ("True".into(), ready_reason::READY.into()));
        let probe = up.last_probe.clone().unwrap();
        assert_eq!((probe.latency_ms, probe.error), (Some(4), None));
        let down = apply_health(&up, &view(false, "TunnelRefused"), 1, &now);
        assert_eq!(
            ready(&down),
            ("False".into(), ready_reason::UNHEALTHY.into())
        );
        let probe = down.last_probe.unwrap();
        assert_eq!(
            (probe.latency_ms, probe.error.as_deref()),
            (None, Some("TunnelRefused message"))
        );
        let healthy = down
            .conditions
            .iter()
            .find(|c| c.type_ == condition::HEALTHY)
            .unwrap();
        assert_eq!(
            (healthy.status.as_str(), healthy.reason.as_str()),
            ("False", "TunnelRefused")
        );
    }
}
