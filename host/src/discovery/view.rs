//! What the discovery API says about one Proxy, and when a Proxy counts as Ready.

use crate::api::{IpFamily, Proxy, condition};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::ResourceExt;
use serde::Serialize;

/// Why a Proxy is not handed out.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NotReady<'a> {
    pub reason: &'a str,
    pub message: &'a str,
}

/// Whether clients may use the Proxy, and its IP when they may.
///
/// Ready means: the `Ready` condition is `True` (the controller derives it from Provisioned
/// and Healthy), the status carries an IP, and the Proxy is not being deleted (its instance
/// is about to go away). A `Ready` condition from an older generation still counts: the
/// instance it describes keeps running until the controller replaces it.
pub fn readiness(p: &Proxy) -> Result<&str, NotReady<'_>> {
    if p.metadata.deletion_timestamp.is_some() {
        return Err(NotReady {
            reason: "Deleting",
            message: "the Proxy is being deleted",
        });
    }
    let Some(ready) = p.condition(condition::READY) else {
        return Err(NotReady {
            reason: "NotReconciled",
            message: "the operator has not reported a Ready condition yet",
        });
    };
    if ready.status != "True" {
        return Err(NotReady {
            reason: if ready.reason.is_empty() {
                "NotReady"
            } else {
                &ready.reason
            },
            message: &ready.message,
        });
    }
    match p.status.as_ref().and_then(|s| s.ip.as_deref()) {
        Some(ip) if !ip.is_empty() => Ok(ip),
        _ => Err(NotReady {
            reason: "NoAddress",
            message: "the Ready condition is True but the status carries no IP",
        }),
    }
}

/// One Proxy as the API returns it (schema `Proxy` in the OpenAPI document).
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ProxyView<'a> {
    pub namespace: &'a str,
    pub name: &'a str,
    pub provider: &'a str,
    pub region: &'a str,
    pub zone: &'a str,
    /// Null only when not Ready.
    pub ip: Option<&'a str>,
    /// The status port, else the spec port.
    pub port: i32,
    /// `ip:port`, or `[ip]:port` for IPv6: what a proxy URL holds after `http://`.
    pub address: Option<String>,
    /// `spec.ipFamily`: `IPv4` or `IPv6`.
    pub ip_family: IpFamily,
    pub ready: bool,
    /// The `Healthy` condition is True: the last CONNECT probe through the proxy succeeded.
    pub healthy: bool,
    /// The instance state (Provisioning, Running, Stopped, Terminated), when known.
    pub state: Option<&'a str>,
    /// Only when not Ready: a CamelCase reason and a human-readable message.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub message: Option<&'a str>,
    pub last_probe: Option<ProbeView<'a>>,
}

#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ProbeView<'a> {
    pub time: &'a Time,
    pub latency_ms: Option<i64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<&'a str>,
}

impl<'a> ProxyView<'a> {
    pub fn of(p: &'a Proxy) -> Self {
        let status = p.status.as_ref();
        let (ip, ready, reason, message) = match readiness(p) {
            Ok(ip) => (Some(ip), true, None, None),
            Err(nr) => (
                status
                    .and_then(|s| s.ip.as_deref())
                    .filter(|ip| !ip.is_empty()),
                false,
                Some(nr.reason),
                Some(nr.message).filter(|m| !m.is_empty()),
            ),
        };
        let port = status.and_then(|s| s.port).unwrap_or(p.spec.port);
        ProxyView {
            namespace: p.metadata.namespace.as_deref().unwrap_or(""),
            name: p.metadata.name.as_deref().unwrap_or(""),
            provider: &p.spec.provider,
            region: &p.spec.placement.region,
            zone: &p.spec.placement.zone,
            ip,
            port,
            address: ip.map(|ip| address(ip, port)),
            ip_family: p.spec.ip_family,
            ready,
            healthy: p
                .condition(condition::HEALTHY)
                .is_some_and(|c| c.status == "True"),
            state: status.and_then(|s| s.state.as_deref()),
            reason,
            message,
            last_probe: status
                .and_then(|s| s.last_probe.as_ref())
                .map(|lp| ProbeView {
                    time: &lp.time,
                    latency_ms: lp.latency_ms,
                    error: lp.error.as_deref(),
                }),
        }
    }
}

/// `ip:port` as a proxy URL writes it: an IPv6 address in brackets. The status holds
/// what the operator wrote, so `ip` parses; anything else is given as it is.
pub fn address(ip: &str, port: i32) -> String {
    match (ip.parse::<std::net::IpAddr>(), u16::try_from(port)) {
        (Ok(ip), Ok(port)) => egress_plugin_host::provider::host_port(ip, port),
        _ if ip.contains(':') => format!("[{ip}]:{port}"),
        _ => format!("{ip}:{port}"),
    }
}

/// The sort key of every answer: namespace, then name.
pub fn sort_key(p: &Proxy) -> (&str, &str) {
    (
        p.metadata.namespace.as_deref().unwrap_or(""),
        p.metadata.name.as_deref().unwrap_or(""),
    )
}

/// `namespace/name`, for logs.
pub fn display_name(p: &Proxy) -> String {
    format!("{}/{}", p.namespace().unwrap_or_default(), p.name_any())
}
