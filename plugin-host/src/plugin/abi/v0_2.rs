//! `egress:provider@0.2.0`: its bindings, its host interface and its conversions.
//!
//! Frozen with `wit/v0.2.0` once released. What it adds to 0.1.0 is listed at the top of
//! its WIT file.

use crate::plugin::guest::{GuestCall, GuestError, GuestReply, PluginInfo, RawInstance};
use crate::plugin::host_services::{LogLevel, SecretProblem};
use crate::plugin::sandbox::CallState;
use crate::provider::{Capacity, Class, IpFamily, Placement, Price, State, TargetStatus};
use wasmtime::Store;
use wasmtime::component::{HasSelf, Linker};

wasmtime::component::bindgen!({
    path: "../wit/v0.2.0",
    world: "provider-plugin",
    exports: { default: async },
    // A value too long to hold ends the call rather than stay unscrubbed.
    imports: { "egress:provider/host.mark-sensitive": trappable },
});

use egress::provider::host as wit_host;
use egress::provider::types as wit;

/// The WIT package version this module binds.
pub const WORLD_VERSION: &str = "0.2.0";

pub(super) fn add_to_linker(l: &mut Linker<CallState>) -> wasmtime::Result<()> {
    wit_host::add_to_linker::<_, HasSelf<CallState>>(l, |s| s)
}

pub(super) async fn dispatch(
    pre: &ProviderPluginPre<CallState>,
    store: &mut Store<CallState>,
    call: GuestCall<'_>,
) -> wasmtime::Result<GuestReply> {
    let plugin = pre.instantiate_async(&mut *store).await?;
    let p = plugin.egress_provider_plugin();
    let v = plugin.egress_provider_provider();
    Ok(match call {
        GuestCall::Info => GuestReply::Info(info(p.call_info(&mut *store).await?)),
        GuestCall::Validate(cfg) => GuestReply::Unit(
            p.call_validate_config(&mut *store, cfg)
                .await?
                .map_err(error),
        ),
        GuestCall::Create(req) => {
            let wreq = wit::CreateRequest {
                name: req.name.clone(),
                uid: req.uid.clone(),
                namespace: req.namespace.clone(),
                proxy_name: req.proxy_name.clone(),
                installation: req.installation.clone(),
                placement: placement(&req.placement),
                cloud_init: req.cloud_init.clone(),
                port: req.port,
                ip_family: match req.ip_family {
                    IpFamily::V4 => wit::IpFamily::Ipv4,
                    IpFamily::V6 => wit::IpFamily::Ipv6,
                },
            };
            GuestReply::Id(v.call_create(&mut *store, &wreq).await?.map_err(error))
        }
        GuestCall::Get(id) => GuestReply::Instance(
            v.call_get(&mut *store, id)
                .await?
                .map(instance)
                .map_err(error),
        ),
        GuestCall::Delete(id) => {
            GuestReply::Unit(v.call_delete(&mut *store, id).await?.map_err(error))
        }
        // No `created-since` before 0.3.0: the host never asks these for a partial list.
        GuestCall::List(inst, _) => GuestReply::List(
            v.call_list_by_tag(&mut *store, inst)
                .await?
                .map(|l| l.into_iter().map(instance).collect())
                .map_err(error),
        ),
        GuestCall::Check => GuestReply::Check(
            v.call_check(&mut *store)
                .await?
                .into_iter()
                .map(target)
                .collect(),
        ),
        GuestCall::Quote(pl) => GuestReply::Quote(
            v.call_quote(&mut *store, &placement(pl))
                .await?
                .map(|p| p.map(price))
                .map_err(error),
        ),
    })
}

fn placement(p: &Placement) -> wit::Placement {
    wit::Placement {
        region: p.region.clone(),
        zone: p.zone.clone(),
        machine_type: p.machine_type.clone(),
        image: p.image.clone(),
        capacity: match p.capacity {
            Capacity::OnDemand => wit::Capacity::OnDemand,
            Capacity::Spot => wit::Capacity::Spot,
        },
    }
}

fn class(c: wit::ErrorClass) -> Class {
    match c {
        wit::ErrorClass::NotFound => Class::NotFound,
        wit::ErrorClass::QuotaExceeded => Class::QuotaExceeded,
        wit::ErrorClass::Transient => Class::Transient,
        wit::ErrorClass::Permanent => Class::Permanent,
    }
}

fn error(e: wit::ProviderError) -> GuestError {
    GuestError {
        class: class(e.class),
        message: e.message,
        code: e.code,
        retry_after_ms: e.retry_after_ms,
    }
}

fn state(s: wit::State) -> State {
    match s {
        wit::State::Provisioning => State::Provisioning,
        wit::State::Running => State::Running,
        wit::State::Stopped => State::Stopped,
        wit::State::Terminated => State::Terminated,
    }
}

fn price(p: wit::Price) -> Price {
    Price {
        currency: p.currency,
        micros_per_hour: p.micros_per_hour,
    }
}

fn instance(i: wit::Instance) -> RawInstance {
    RawInstance {
        id: i.id,
        ip: i.ip,
        ipv6: i.ipv6,
        state: state(i.state),
        uid: i.uid,
        created_at: i.created_at.map(|t| (t.seconds, t.nanoseconds)),
        interrupted: i.interrupted,
        hourly_price: i.hourly_price.map(price),
    }
}

fn target(t: wit::TargetStatus) -> TargetStatus {
    TargetStatus {
        target: t.target,
        ready: t.ready,
        reason: t.reason,
        message: t.message,
        details: t.details,
    }
}

fn info(i: wit::PluginInfo) -> PluginInfo {
    PluginInfo {
        type_name: i.type_name,
        version: i.version,
        has_check: i.has_check,
        default_hosts: i.default_hosts,
        profile: i.profile,
        default_budget: i.default_budget.map(|b| crate::rate::Spec {
            per_hour: b.requests_per_hour,
            burst: b.burst,
        }),
        lists_recent: false,
    }
}

impl wit_host::Host for CallState {
    fn log(&mut self, level: wit_host::Level, message: String) {
        let level = match level {
            wit_host::Level::Trace => LogLevel::Trace,
            wit_host::Level::Debug => LogLevel::Debug,
            wit_host::Level::Info => LogLevel::Info,
            wit_host::Level::Warn => LogLevel::Warn,
            wit_host::Level::Error => LogLevel::Error,
        };
        self.guest_log(level, &message);
    }

    fn config(&mut self) -> String {
        self.guest_config()
    }

    fn read_secret(&mut self, key: String) -> Result<Vec<u8>, wit_host::SecretError> {
        self.guest_read_secret(&key).map_err(|e| match e {
            SecretProblem::NotConfigured => wit_host::SecretError::NotConfigured,
            SecretProblem::Missing(m) => wit_host::SecretError::Missing(m),
            SecretProblem::Unreadable(m) => wit_host::SecretError::Unreadable(m),
        })
    }

    fn cache_get(&mut self, key: String) -> Option<Vec<u8>> {
        self.guest_cache_get(&key)
    }

    fn cache_set(&mut self, key: String, value: Vec<u8>, ttl_seconds: u32) {
        self.guest_cache_set(key, value, ttl_seconds);
    }

    fn mark_sensitive(&mut self, value: Vec<u8>) -> wasmtime::Result<()> {
        self.guest_mark_sensitive(&value)
    }
}
