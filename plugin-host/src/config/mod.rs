//! The providers file: which plugins run as which providers, with what limits, hosts,
//! secrets and trust.
//!
//! Parsed strictly: an unknown key in a host-side block is an error naming the key, so a
//! typo never silently falls back to a default. Only the `config` block is free-form; it
//! belongs to the plugin, which validates it in `validate-config`.

/// The descriptors the providers may hold, against the open-file limit.
pub mod descriptors;
pub mod fit;
/// `oci://` plugin references.
pub mod oci_ref;
/// The pod's resources the providers must fit: its memory limit and its scratch space.
pub mod pod;
/// `prices`: what an instance costs where the plugin cannot say, and the account's own.
pub mod prices;
/// `verify` (signatures) and `approved` (the permission review).
pub mod verify;

pub use fit::{FitError, PodResources};

use crate::policy::{AllowRule, RuleError, plugin_default_problem};
use serde::Deserialize;
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

/// The whole providers file.
#[derive(Debug, Clone, Default, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct ProvidersFile {
    /// The keys every `oci://` plugin must be signed with, unless its entry has its own
    /// `verify`.
    #[serde(default)]
    pub verify: Option<verify::Verify>,
    pub providers: Vec<ProviderEntry>,
}

/// One configured provider: a plugin plus everything the host gives it.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct ProviderEntry {
    /// What `Proxy.spec.provider` names; a DNS-1123 label.
    pub name: String,
    /// File name of the component in the plugin directory, e.g. `hetzner.wasm`, or a
    /// registry reference, `oci://registry/repository@sha256:...` (a `:tag` is resolved
    /// once and pinned).
    pub plugin: String,
    /// Signatures an `oci://` plugin must carry; replaces the file's `verify`.
    #[serde(default)]
    pub verify: Option<verify::Verify>,
    /// What the plugin may ask for: a version declaring more default hosts or importing
    /// more interfaces does not load. Unset: no review.
    #[serde(default)]
    pub approved: Option<verify::Approved>,
    /// Replaces the plugin's default hosts when set (narrowing or redirecting, e.g. to an
    /// emulator). `scheme://host[:port]`, `*.domain` allowed.
    #[serde(default)]
    pub allowed_hosts: Option<Vec<String>>,
    /// Added to the plugin's defaults (or to `allowedHosts`).
    #[serde(default)]
    pub additional_hosts: Vec<String>,
    #[serde(default)]
    pub limits: Limits,
    /// Backend requests this provider may send, across all its calls (reconciler, GC,
    /// provider checks). Unset: the default the plugin declares (`plugin-info.default-budget`,
    /// capped at [`crate::rate::MAX_DEFAULT`]), or unlimited when it declares none.
    #[serde(default)]
    pub budget: Option<RequestBudget>,
    /// Secret key -> file path (usually in an optional Secret mount). Read on every call.
    #[serde(default)]
    pub secrets: BTreeMap<String, PathBuf>,
    #[serde(default)]
    pub tls: Tls,
    /// Instance addresses may be internal (loopback, RFC 1918, link-local, CGNAT, ULA):
    /// a plugin's reply may carry them and the health prober connects to them. Off by
    /// default, because a plugin could otherwise point the operator's own prober at the
    /// pod network or the metadata service. For labs, emulators and private clouds.
    #[serde(default)]
    pub allow_private_addresses: bool,
    /// Hourly prices by machine type (and region, capacity): they win over the plugin's
    /// `quote` (see [`prices`]).
    #[serde(default)]
    pub prices: Vec<prices::PriceRule>,
    /// The plugin's own config block, handed over as JSON.
    #[serde(default = "empty_object")]
    pub config: serde_json::Value,
}

fn empty_object() -> serde_json::Value {
    serde_json::Value::Object(Default::default())
}

/// Per-call limits. Defaults suit a provider that makes a handful of API requests per call,
/// and are sized so that the shipped providers file fits the shipped Deployment (see
/// [`fit`]).
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, rename_all = "camelCase", default)]
pub struct Limits {
    /// Wall-clock budget of one call, including every HTTP request it makes.
    #[serde(with = "humantime_serde")]
    pub timeout: Duration,
    /// Wasm fuel (roughly instructions) for one call.
    pub fuel: u64,
    /// Linear memory of one instance, in MiB.
    pub memory_mib: u32,
    /// Calls into this provider at once that the pod's fit reserves for it; further
    /// calls wait, or borrow room the fit leaves over (up to `max_concurrency`).
    pub concurrency: u32,
    /// Most calls at once, its own and borrowed from the room the pod's fit leaves over
    /// while the request budget calls for them (`plugin::headroom`). Unset:
    /// [`DEFAULT_MAX_CONCURRENCY`], or `concurrency` when that is more.
    pub max_concurrency: Option<u32>,
    /// Bytes a call may write to its `/tmp`, in MiB: every byte written counts (also to
    /// files later unlinked or overwritten), plus 4 KiB per file, directory or link created.
    pub tmp_mib: u32,
    /// Files (and directories) a call may hold open at once.
    pub open_files: u32,
    /// Host handles a call may hold at once (the wasm resource table: HTTP fields, requests,
    /// bodies, streams, pollables, files). Bounds the host memory and descriptors behind them.
    pub handles: u32,
    /// Log lines (host `log` plus stdout/stderr lines) kept per call.
    pub log_lines: u32,
    /// Longest log line kept, in bytes; longer ones are cut.
    pub log_line_bytes: u32,
    pub http: HttpLimits,
}

/// Most calls at once of a provider whose entry does not set `limits.maxConcurrency`:
/// what the busiest shipped budget needs for calls of half a second (vultr's 30
/// requests a second: `ceil(30 x 0.5) + 1`), borrowed only while the budget calls for it
/// and the pod has the room.
pub const DEFAULT_MAX_CONCURRENCY: u32 = 16;

impl Limits {
    /// Most calls at once, own and borrowed: `maxConcurrency`, or its default, never
    /// fewer than `concurrency`.
    pub fn most_calls(&self) -> u32 {
        self.max_concurrency
            .unwrap_or(DEFAULT_MAX_CONCURRENCY)
            .max(self.concurrency)
    }
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            timeout: Duration::from_secs(60),
            fuel: 5_000_000_000,
            // The two shipped providers at these defaults need up to about 229 MiB of
            // memory and 48 MiB of /tmp (config::fit): they fit the shipped Deployment
            // (512Mi minus a 96 MiB reserve; a 96Mi /tmp), with room left for 4 calls
            // borrowed beyond the providers' own.
            memory_mib: 32,
            concurrency: 2,
            max_concurrency: None,
            tmp_mib: 8,
            open_files: 32,
            handles: 256,
            log_lines: 200,
            log_line_bytes: 4096,
            http: HttpLimits::default(),
        }
    }
}

/// A provider's request budget: a token bucket refilled at `requestsPerHour`, holding at
/// most `burst` tokens; every backend request takes one.
#[derive(Debug, Clone, Copy, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct RequestBudget {
    pub requests_per_hour: u32,
    pub burst: u32,
}

impl RequestBudget {
    pub fn spec(self) -> crate::rate::Spec {
        crate::rate::Spec {
            per_hour: self.requests_per_hour,
            burst: self.burst,
        }
    }
}

/// Bounds on every outgoing HTTP request.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, rename_all = "camelCase", default)]
pub struct HttpLimits {
    #[serde(with = "humantime_serde")]
    pub connect_timeout: Duration,
    #[serde(with = "humantime_serde")]
    pub first_byte_timeout: Duration,
    #[serde(with = "humantime_serde")]
    pub between_bytes_timeout: Duration,
    /// Largest response body, in bytes.
    pub max_response_bytes: u64,
    /// Outgoing requests of one call in flight at once (each holds a socket and buffers).
    pub max_in_flight: u32,
    /// Largest header set (one wasi:http `fields`) a plugin may build, in bytes of its
    /// in-memory form.
    pub max_header_bytes: u32,
    /// Kept-alive connections the provider keeps idle for its next requests (each a
    /// socket, its TLS state and hyper's buffers); 0: a new connection per request.
    pub max_idle: u32,
    /// How long an idle kept-alive connection is kept before it is closed.
    #[serde(with = "humantime_serde")]
    pub idle_timeout: Duration,
}

impl Default for HttpLimits {
    fn default() -> Self {
        HttpLimits {
            connect_timeout: Duration::from_secs(10),
            first_byte_timeout: Duration::from_secs(30),
            between_bytes_timeout: Duration::from_secs(10),
            max_response_bytes: 8 * 1024 * 1024,
            max_in_flight: 4,
            max_header_bytes: 16 * 1024,
            max_idle: 4,
            idle_timeout: Duration::from_secs(30),
        }
    }
}

/// TLS trust for the backend.
#[derive(Debug, Clone, Default, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct Tls {
    /// PEM bundle trusted instead of the system roots (a private CA).
    pub ca_file: Option<PathBuf>,
    /// Accept any certificate. For labs only; logged as a warning at startup.
    #[serde(default)]
    pub insecure_skip_tls_verify: bool,
}

/// A config error, always naming the provider and the field.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("providers file: {0}")]
    Parse(String),
    #[error(
        "provider {index}: name {name:?} is not a DNS-1123 label (lowercase letters, digits and '-', at most 63, starting and ending alphanumeric)"
    )]
    BadName { index: usize, name: String },
    #[error("provider {name:?} is configured twice")]
    Duplicate { name: String },
    #[error(
        "provider {name:?}: plugin {plugin:?} must be a file name ending in .wasm, without directories, or an oci:// reference"
    )]
    BadPlugin { name: String, plugin: String },
    #[error("provider {name:?}: plugin {plugin:?} {source}")]
    BadReference {
        name: String,
        plugin: String,
        source: oci_ref::OciRefError,
    },
    #[error("{field}: {source}")]
    Keys {
        /// `verify` (the file's) or `provider "x": verify`.
        field: String,
        source: verify::KeyError,
    },
    #[error(
        "provider {name:?}: verify applies to oci:// plugins only (a plugin file from the plugin directory carries no signature); drop it or move the plugin to a registry"
    )]
    VerifyWithoutRegistry { name: String },
    #[error("provider {name:?}: approved.{field} lists {count} entries; at most {max}")]
    Approved {
        name: String,
        field: &'static str,
        count: usize,
        max: usize,
    },
    #[error("provider {name:?}: {field}: {source}")]
    Host {
        name: String,
        field: &'static str,
        source: RuleError,
    },
    #[error("provider {name:?}: limits.{field} = {value} is out of range ({range})")]
    Limit {
        name: String,
        field: &'static str,
        value: String,
        range: &'static str,
    },
    #[error("provider {name:?}: budget.{field} = {value} is out of range ({range})")]
    Budget {
        name: String,
        field: &'static str,
        value: u32,
        range: &'static str,
    },
    #[error(
        "provider {name:?}: the plugin's default host {entry:?} {reason}; internal addresses can only be opened by the providers file (allowedHosts or additionalHosts)"
    )]
    PluginDefault {
        name: String,
        entry: String,
        reason: &'static str,
    },
    #[error(
        "provider {name:?}: secrets: key {key:?} must be non-empty and use only letters, digits, '-', '_' and '.'"
    )]
    SecretKey { name: String, key: String },
    #[error(
        "provider {name:?}: tls.caFile ({ca_file}) and tls.insecureSkipTlsVerify: true contradict each other; keep the CA file and drop the insecure switch"
    )]
    TlsContradiction { name: String, ca_file: String },
    #[error("provider {name:?}: {source}")]
    Prices {
        name: String,
        source: prices::PriceError,
    },
}

impl ProvidersFile {
    /// The signatures `entry`'s plugin must carry: its own `verify`, else the file's for an
    /// `oci://` plugin. `None`: unsigned plugins load.
    pub fn verify_for<'a>(&'a self, entry: &'a ProviderEntry) -> Option<&'a verify::Verify> {
        entry.verify.as_ref().or_else(|| {
            oci_ref::OciRef::is_oci(&entry.plugin)
                .then_some(self.verify.as_ref())
                .flatten()
        })
    }

    /// Parses and validates a providers file (YAML or JSON).
    pub fn parse(text: &str) -> Result<Self, ConfigError> {
        let file: ProvidersFile =
            serde_yaml::from_str(text).map_err(|e| ConfigError::Parse(e.to_string()))?;
        file.validate()?;
        Ok(file)
    }

    fn validate(&self) -> Result<(), ConfigError> {
        if let Some(v) = &self.verify {
            v.keys().map_err(|source| ConfigError::Keys {
                field: "verify".into(),
                source,
            })?;
        }
        let mut seen = std::collections::HashSet::new();
        for (index, p) in self.providers.iter().enumerate() {
            if !is_dns1123_label(&p.name) {
                return Err(ConfigError::BadName {
                    index,
                    name: p.name.clone(),
                });
            }
            if !seen.insert(p.name.as_str()) {
                return Err(ConfigError::Duplicate {
                    name: p.name.clone(),
                });
            }
            p.validate()?;
        }
        Ok(())
    }
}

impl ProviderEntry {
    fn validate(&self) -> Result<(), ConfigError> {
        let name = &self.name;
        if oci_ref::OciRef::is_oci(&self.plugin) {
            oci_ref::OciRef::parse(&self.plugin).map_err(|source| ConfigError::BadReference {
                name: name.clone(),
                plugin: self.plugin.clone(),
                source,
            })?;
        } else if !self.plugin.ends_with(".wasm")
            || self.plugin.contains(['/', '\\'])
            || self.plugin.starts_with('.')
        {
            return Err(ConfigError::BadPlugin {
                name: name.clone(),
                plugin: self.plugin.clone(),
            });
        } else if self.verify.is_some() {
            return Err(ConfigError::VerifyWithoutRegistry { name: name.clone() });
        }
        if let Some(v) = &self.verify {
            v.keys().map_err(|source| ConfigError::Keys {
                field: format!("provider {name:?}: verify"),
                source,
            })?;
        }
        if let Some(a) = &self.approved {
            for (field, count) in [("hosts", a.hosts.len()), ("imports", a.imports.len())] {
                if count > verify::MAX_APPROVED {
                    return Err(ConfigError::Approved {
                        name: name.clone(),
                        field,
                        count,
                        max: verify::MAX_APPROVED,
                    });
                }
            }
        }
        for (field, hosts) in [
            (
                "allowedHosts",
                self.allowed_hosts.as_deref().unwrap_or_default(),
            ),
            ("additionalHosts", &self.additional_hosts[..]),
        ] {
            for h in hosts {
                h.parse::<AllowRule>().map_err(|source| ConfigError::Host {
                    name: name.clone(),
                    field,
                    source,
                })?;
            }
        }
        prices::validate(&self.prices).map_err(|source| ConfigError::Prices {
            name: name.clone(),
            source,
        })?;
        let l = &self.limits;
        let limit = |field, value: String, range| ConfigError::Limit {
            name: name.clone(),
            field,
            value,
            range,
        };
        if l.timeout < Duration::from_millis(100) || l.timeout > Duration::from_secs(3600) {
            return Err(limit("timeout", format!("{:?}", l.timeout), "100ms to 1h"));
        }
        if l.fuel < 1_000_000 {
            return Err(limit("fuel", l.fuel.to_string(), "at least 1000000"));
        }
        if !(4..=1024).contains(&l.memory_mib) {
            return Err(limit("memoryMib", l.memory_mib.to_string(), "4 to 1024"));
        }
        if !(1..=256).contains(&l.concurrency) {
            return Err(limit("concurrency", l.concurrency.to_string(), "1 to 256"));
        }
        if let Some(most) = l.max_concurrency
            && !(l.concurrency..=256).contains(&most)
        {
            return Err(limit(
                "maxConcurrency",
                most.to_string(),
                "limits.concurrency to 256",
            ));
        }
        if l.tmp_mib > 1024 {
            return Err(limit("tmpMib", l.tmp_mib.to_string(), "0 to 1024"));
        }
        if !(1..=1024).contains(&l.open_files) {
            return Err(limit("openFiles", l.open_files.to_string(), "1 to 1024"));
        }
        if !(64..=65536).contains(&l.handles) {
            return Err(limit("handles", l.handles.to_string(), "64 to 65536"));
        }
        if !(1..=64).contains(&l.http.max_in_flight) {
            return Err(limit(
                "http.maxInFlight",
                l.http.max_in_flight.to_string(),
                "1 to 64",
            ));
        }
        if !(1024..=1 << 20).contains(&l.http.max_header_bytes) {
            return Err(limit(
                "http.maxHeaderBytes",
                l.http.max_header_bytes.to_string(),
                "1024 to 1048576",
            ));
        }
        if l.http.max_idle > 64 {
            return Err(limit(
                "http.maxIdle",
                l.http.max_idle.to_string(),
                "0 to 64",
            ));
        }
        if l.http.idle_timeout < Duration::from_millis(100)
            || l.http.idle_timeout > Duration::from_secs(600)
        {
            return Err(limit(
                "http.idleTimeout",
                format!("{:?}", l.http.idle_timeout),
                "100ms to 10m",
            ));
        }
        if l.log_line_bytes < 80 {
            return Err(limit(
                "logLineBytes",
                l.log_line_bytes.to_string(),
                "at least 80",
            ));
        }
        if let Some(b) = self.budget {
            let budget = |field, value, range| ConfigError::Budget {
                name: name.clone(),
                field,
                value,
                range,
            };
            if !(1..=10_000_000).contains(&b.requests_per_hour) {
                return Err(budget(
                    "requestsPerHour",
                    b.requests_per_hour,
                    "1 to 10000000",
                ));
            }
            if !(1..=100_000).contains(&b.burst) {
                return Err(budget("burst", b.burst, "1 to 100000"));
            }
        }
        for key in self.secrets.keys() {
            if key.is_empty()
                || !key
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
            {
                return Err(ConfigError::SecretKey {
                    name: name.clone(),
                    key: key.clone(),
                });
            }
        }
        if let (Some(ca_file), true) = (&self.tls.ca_file, self.tls.insecure_skip_tls_verify) {
            return Err(ConfigError::TlsContradiction {
                name: name.clone(),
                ca_file: ca_file.display().to_string(),
            });
        }
        Ok(())
    }

    /// The allow-list this provider runs with: the plugin's defaults unless `allowedHosts`
    /// replaces them, plus `additionalHosts`. A plugin's own defaults may only name public
    /// DNS hosts ([`plugin_default_problem`]): internal addresses are opened by this file,
    /// never by the plugin asking.
    pub fn allow_rules(&self, plugin_defaults: &[String]) -> Result<Vec<AllowRule>, ConfigError> {
        let mut rules = Vec::new();
        if self.allowed_hosts.is_none() {
            for h in plugin_defaults {
                let mut rule = h.parse::<AllowRule>().map_err(|source| ConfigError::Host {
                    name: self.name.clone(),
                    field: "plugin default-hosts",
                    source,
                })?;
                if let Some(reason) = plugin_default_problem(&rule) {
                    return Err(ConfigError::PluginDefault {
                        name: self.name.clone(),
                        entry: h.clone(),
                        reason,
                    });
                }
                rule.public_name = true;
                rules.push(rule);
            }
        }
        for (field, hosts) in [
            (
                "allowedHosts",
                self.allowed_hosts.as_deref().unwrap_or_default(),
            ),
            ("additionalHosts", &self.additional_hosts[..]),
        ] {
            for h in hosts {
                rules.push(h.parse::<AllowRule>().map_err(|source| ConfigError::Host {
                    name: self.name.clone(),
                    field,
                    source,
                })?);
            }
        }
        Ok(rules)
    }
}

/// RFC 1123 label as Kubernetes checks it: the ProviderHealth object is named after it.
pub fn is_dns1123_label(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 63
        && s.bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !s.starts_with('-')
        && !s.ends_with('-')
}

#[cfg(test)]
mod tests {
    use super::*;

    const GOOD: &str = r#"
providers:
  - name: hetzner-eu
    plugin: hetzner.wasm
    additionalHosts: ["http://127.0.0.1:8080"]
    limits:
      timeout: 30s
      memoryMib: 32
      http:
        connectTimeout: 2s
    secrets:
      token: /etc/proxy-operator/secrets/hetzner/token
    config:
      locations: [fsn1]
  - name: aws
    plugin: ec2.wasm
"#;

    #[test]
    fn parses_a_full_file() {
        let f = ProvidersFile::parse(GOOD).unwrap();
        assert_eq!(f.providers.len(), 2);
        let h = &f.providers[0];
        assert_eq!(h.limits.timeout, Duration::from_secs(30));
        assert_eq!(h.limits.memory_mib, 32);
        assert_eq!(h.limits.fuel, Limits::default().fuel);
        assert_eq!(h.limits.http.connect_timeout, Duration::from_secs(2));
        assert_eq!(h.config["locations"][0], "fsn1");
        assert_eq!(f.providers[1].config, serde_json::json!({}));
        let rules = h
            .allow_rules(&["https://api.hetzner.cloud".into()])
            .unwrap();
        assert_eq!(rules.len(), 2);
    }

    #[test]
    fn rejects_bad_input_naming_field_and_value() {
        let cases = [
            (
                "providers: [{name: a, plugin: a.wasm, colour: red}]",
                "colour",
            ),
            (
                "providers: [{name: a, plugin: a.wasm, limits: {fuell: 1}}]",
                "fuell",
            ),
            (
                "providers: [{name: Bad_Name, plugin: a.wasm}]",
                "\"Bad_Name\"",
            ),
            (
                "providers: [{name: a, plugin: a.wasm}, {name: a, plugin: b.wasm}]",
                "configured twice",
            ),
            ("providers: [{name: a, plugin: ../a.wasm}]", "\"../a.wasm\""),
            ("providers: [{name: a, plugin: a.cwasm}]", "\"a.cwasm\""),
            (
                "providers: [{name: a, plugin: a.wasm, additionalHosts: [example.com]}]",
                "additionalHosts",
            ),
            (
                "providers: [{name: a, plugin: a.wasm, limits: {memoryMib: 2}}]",
                "limits.memoryMib = 2",
            ),
            (
                "providers: [{name: a, plugin: a.wasm, limits: {timeout: 1ms}}]",
                "limits.timeout",
            ),
            (
                "providers: [{name: a, plugin: a.wasm, limits: {concurrency: 0}}]",
                "limits.concurrency = 0",
            ),
            (
                "providers: [{name: a, plugin: a.wasm, limits: {concurrency: 4, maxConcurrency: 3}}]",
                "limits.maxConcurrency = 3 is out of range (limits.concurrency to 256)",
            ),
            (
                "providers: [{name: a, plugin: a.wasm, limits: {maxConcurrency: 257}}]",
                "limits.maxConcurrency = 257",
            ),
            (
                "providers: [{name: a, plugin: a.wasm, secrets: {'a/b': /x}}]",
                "\"a/b\"",
            ),
            (
                "providers: [{name: a, plugin: a.wasm, budget: {requestsPerHour: 0, burst: 5}}]",
                "budget.requestsPerHour = 0 is out of range (1 to 10000000)",
            ),
            (
                "providers: [{name: a, plugin: a.wasm, budget: {requestsPerHour: 3600, burst: 0}}]",
                "budget.burst = 0 is out of range (1 to 100000)",
            ),
            (
                "providers: [{name: a, plugin: a.wasm, budget: {requestsPerHour: 3600, burst: 100001}}]",
                "budget.burst = 100001",
            ),
            (
                "providers: [{name: a, plugin: a.wasm, budget: {requestsPerHour: 3600}}]",
                "burst",
            ),
            (
                "providers: [{name: a, plugin: a.wasm, budget: {requestsPerHour: 3600, burst: 5, perMinute: 1}}]",
                "perMinute",
            ),
            (
                "providers: [{name: a, plugin: a.wasm, budget: {requestsPerHour: -1, burst: 5}}]",
                "requestsPerHour",
            ),
            // Trust is switched off only by its own long name, never by a look-alike.
            (
                "providers: [{name: a, plugin: a.wasm, tls: {insecure: true}}]",
                "insecure",
            ),
            (
                "providers: [{name: a, plugin: a.wasm, tls: {insecureSkipTlsVerify: yes-please}}]",
                "insecureSkipTlsVerify",
            ),
            (
                "providers: [{name: a, plugin: a.wasm, tls: {caFile: /ca.pem, insecureSkipTlsVerify: true}}]",
                "tls.caFile (/ca.pem) and tls.insecureSkipTlsVerify: true contradict",
            ),
        ];
        for (text, needle) in cases {
            let err = ProvidersFile::parse(text).expect_err(text).to_string();
            assert!(
                err.contains(needle),
                "{text}: error {err:?} lacks {needle:?}"
            );
        }
    }

    #[test]
    fn budget_is_optional_and_parsed() {
        let f = ProvidersFile::parse(
            "providers: [{name: a, plugin: a.wasm, budget: {requestsPerHour: 120, burst: 5}}, {name: b, plugin: b.wasm}]",
        )
        .unwrap();
        assert_eq!(
            f.providers[0].budget,
            Some(RequestBudget {
                requests_per_hour: 120,
                burst: 5
            })
        );
        assert_eq!(f.providers[1].budget, None);
    }

    #[test]
    fn allowed_hosts_replaces_defaults() {
        let f = ProvidersFile::parse(
            "providers: [{name: a, plugin: a.wasm, allowedHosts: ['http://127.0.0.1:1']}]",
        )
        .unwrap();
        let rules = f.providers[0]
            .allow_rules(&["https://x.example".into()])
            .unwrap();
        assert_eq!(rules.len(), 1);
        assert_eq!(rules[0].to_string(), "http://127.0.0.1:1");
    }

    #[test]
    fn plugin_defaults_cannot_open_internal_addresses() {
        let f = ProvidersFile::parse("providers: [{name: a, plugin: a.wasm}]").unwrap();
        for bad in [
            "http://169.254.169.254:80",
            "http://127.0.0.1:9000",
            "http://[::1]:9000",
            "http://localhost:9000",
        ] {
            let err = f.providers[0]
                .allow_rules(&["https://api.example.com".into(), bad.into()])
                .unwrap_err()
                .to_string();
            assert!(
                err.contains(bad) && err.contains("provider \"a\"") && err.contains("allowedHosts"),
                "{bad}: {err}"
            );
        }
        // The operator may list them; then the plugin's defaults are not consulted.
        let f = ProvidersFile::parse(
            "providers: [{name: a, plugin: a.wasm, allowedHosts: ['http://127.0.0.1:9000']}]",
        )
        .unwrap();
        let rules = f.providers[0]
            .allow_rules(&["http://169.254.169.254:80".into()])
            .unwrap();
        assert_eq!(rules.len(), 1);
    }

    #[test]
    fn dns1123() {
        for ok in ["a", "hetzner-eu", "a1", &"a".repeat(63)] {
            assert!(is_dns1123_label(ok), "{ok}");
        }
        for bad in ["", "-a", "a-", "A", "a_b", "a.b", &"a".repeat(64)] {
            assert!(!is_dns1123_label(bad), "{bad}");
        }
    }
}
