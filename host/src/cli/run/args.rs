//! The flags of `proxy-operator run`.

use crate::cli::args::{FitArgs, RegistryArgs, RuntimeArgs, SourceArgs, duration_text};
use proxy_operator::controller::{Settings, Timings};
use proxy_operator::gc::GcSettings;
use proxy_operator::http_server::Limits as HttpLimits;
use proxy_operator::probe::{EngineConfig, Thresholds};
use std::time::Duration;

#[derive(clap::Args)]
pub struct Args {
    #[command(flatten)]
    pub source: SourceArgs,
    #[command(flatten)]
    pub runtime: RuntimeArgs,
    #[command(flatten)]
    pub registry: RegistryArgs,
    #[command(flatten)]
    pub fit: FitArgs,
    /// Installation identity written on every instance and used to scope GC. Default:
    /// derived from the cluster (kube-system's UID) and --namespace.
    #[arg(long, env = "INSTALLATION_ID")]
    pub installation: Option<String>,
    /// The operator's own namespace (part of the default installation identity).
    #[arg(long, env = "POD_NAMESPACE", default_value = "egress-system")]
    pub namespace: String,
    /// Reported as the events' reporting instance.
    #[arg(long, env = "POD_NAME")]
    pub pod_name: Option<String>,
    /// Proxies reconciled at once; the others wait their turn in the order they came due.
    #[arg(long, default_value_t = Settings::new("").concurrency)]
    pub concurrency: u16,
    #[arg(long, value_parser = humantime::parse_duration, default_value = duration_text(Timings::default().provisioning_poll))]
    pub provisioning_poll: Duration,
    #[arg(long, value_parser = humantime::parse_duration, default_value = duration_text(Timings::default().deletion_poll))]
    pub deletion_poll: Duration,
    /// How often a Running instance is checked against its provider's list (each provider
    /// is listed this often, or less often when its request budget calls for it). The
    /// health probe notices a dead proxy long before this.
    #[arg(long, value_parser = humantime::parse_duration, default_value = duration_text(Timings::default().drift_poll))]
    pub drift_poll: Duration,
    #[arg(long, value_parser = humantime::parse_duration, default_value = duration_text(Timings::default().requeue_now))]
    pub requeue_now: Duration,
    #[arg(long, value_parser = humantime::parse_duration, default_value = duration_text(Timings::default().quota_retry))]
    pub quota_retry: Duration,
    /// Retry interval while a cloud-init Secret (or key) is missing.
    #[arg(long, value_parser = humantime::parse_duration, default_value = duration_text(Timings::default().input_retry))]
    pub input_retry: Duration,
    #[arg(long, value_parser = humantime::parse_duration, default_value = duration_text(GcSettings::new("").interval))]
    pub gc_interval: Duration,
    /// Orphans younger than this are never deleted.
    #[arg(long, value_parser = humantime::parse_duration, default_value = duration_text(GcSettings::new("").min_age))]
    pub gc_min_age: Duration,
    /// `host:port` every health probe asks the proxy to CONNECT to.
    #[arg(long, default_value = "example.com:443")]
    pub probe_target: String,
    /// Also fetch this URL (http or https) through the tunnel; its body must be the
    /// instance's IP (e.g. https://checkip.amazonaws.com/). Replaces --probe-target.
    #[arg(long)]
    pub egress_echo_url: Option<http::Uri>,
    #[arg(long, value_parser = humantime::parse_duration, default_value = duration_text(EngineConfig::default().interval))]
    pub probe_interval: Duration,
    #[arg(long, value_parser = humantime::parse_duration, default_value = "5s")]
    pub probe_timeout: Duration,
    /// Failed probes in a row before a healthy proxy is marked unhealthy.
    #[arg(long, default_value_t = Thresholds::default().failure)]
    pub probe_failure_threshold: u32,
    /// How often every provider's health check runs (results in ProviderHealth objects).
    #[arg(long, value_parser = humantime::parse_duration, default_value = "1m")]
    pub provider_check_interval: Duration,
    /// One timeout for a whole round of provider checks.
    #[arg(long, value_parser = humantime::parse_duration, default_value = "20s")]
    pub provider_check_timeout: Duration,
    /// How often the providers file and plugin directory are checked for changes.
    #[arg(long, value_parser = humantime::parse_duration, default_value = "10s")]
    pub reload_interval: Duration,
    /// After SIGTERM, how long reconciles in flight may keep calling plugins; then the
    /// calls still running are cancelled (they fail Transient and are retried by the next
    /// leader). Keep it below the pod's terminationGracePeriodSeconds.
    #[arg(long, value_parser = humantime::parse_duration, default_value = "15s")]
    pub shutdown_grace: Duration,
    /// Where the discovery API, /metrics, /healthz and /readyz listen.
    #[arg(long, default_value = "0.0.0.0:8080")]
    pub listen: std::net::SocketAddr,
    /// Connections the HTTP port holds open at once; more are closed at once.
    #[arg(long, default_value_t = HttpLimits::default().max_connections as u32, value_parser = clap::value_parser!(u32).range(1..=65536))]
    pub http_max_connections: u32,
    /// Connections the HTTP port holds open at once from one client address, so one
    /// client cannot take the places the kubelet's probes and Prometheus need.
    #[arg(long, default_value_t = HttpLimits::default().max_per_client as u32, value_parser = clap::value_parser!(u32).range(1..=65536))]
    pub http_max_connections_per_client: u32,
    /// Time a client has to send a request's headers, and to start the next request on a
    /// kept-alive connection.
    #[arg(long, value_parser = humantime::parse_duration, default_value = duration_text(HttpLimits::default().header_timeout))]
    pub http_header_timeout: Duration,
    /// Serve the discovery API without authentication (local development only).
    #[arg(long)]
    pub discovery_insecure_no_auth: bool,
    /// Elect one leader over a Lease in --namespace: only the leader reconciles, runs GC,
    /// health probes and provider checks; every replica serves the discovery API and
    /// /metrics. Turn off only when running a single replica.
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set)]
    pub leader_election: bool,
    /// Name of the leader-election Lease (coordination.k8s.io/v1) in --namespace.
    #[arg(long, default_value = "proxy-operator-leader")]
    pub lease_name: String,
    /// How long the Lease stays valid after a renewal (whole seconds): a crashed leader is
    /// replaced after at most about this long.
    #[arg(long, value_parser = humantime::parse_duration, default_value = "15s")]
    pub lease_duration: Duration,
    /// How often the leader renews the Lease (whole seconds, shorter than --lease-duration).
    #[arg(long, value_parser = humantime::parse_duration, default_value = "5s")]
    pub lease_renew: Duration,
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;
    use egress_plugin_host::plugin::DEFAULT_MAX_PLUGIN_BYTES;
    use egress_plugin_host::plugin::compiler::CompileLimits;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        run: Args,
    }

    /// `run` with no flags gets exactly the defaults the code has: the flags' default texts
    /// come from the code's constants and read back to the same values.
    #[test]
    fn an_unset_flag_is_the_codes_default() {
        let a = Cli::try_parse_from(["run"]).unwrap().run;
        let t = Timings::default();
        assert_eq!(
            [
                a.provisioning_poll,
                a.deletion_poll,
                a.drift_poll,
                a.requeue_now,
                a.quota_retry,
                a.input_retry
            ],
            [
                t.provisioning_poll,
                t.deletion_poll,
                t.drift_poll,
                t.requeue_now,
                t.quota_retry,
                t.input_retry
            ]
        );
        let gc = GcSettings::new("");
        assert_eq!((a.gc_interval, a.gc_min_age), (gc.interval, gc.min_age));
        assert_eq!(a.probe_interval, EngineConfig::default().interval);
        assert_eq!(a.probe_failure_threshold, Thresholds::default().failure);
        assert_eq!(a.concurrency, Settings::new("").concurrency);
        let http = HttpLimits::default();
        assert_eq!(
            (
                a.http_max_connections as usize,
                a.http_max_connections_per_client as usize,
                a.http_header_timeout
            ),
            (
                http.max_connections,
                http.max_per_client,
                http.header_timeout
            )
        );
        let compile = CompileLimits::default();
        let r = &a.runtime;
        assert_eq!(r.max_plugin_bytes, DEFAULT_MAX_PLUGIN_BYTES);
        assert_eq!(
            (
                r.plugin_compile_cpu,
                r.plugin_compile_memory,
                r.plugin_compile_timeout
            ),
            (compile.cpu, compile.memory_bytes, compile.wall)
        );
        assert_eq!(
            r.redaction_memory,
            egress_plugin_host::sensitive::DEFAULT_LIMIT_BYTES as u64
        );
    }
}
