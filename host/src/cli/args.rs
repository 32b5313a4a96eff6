//! Argument groups several subcommands share, and their value parsers.

use egress_plugin_host::config::{PodResources, ProvidersFile, fit};
use egress_plugin_host::plugin::compiler::CompileLimits;
use egress_plugin_host::plugin::{DEFAULT_MAX_PLUGIN_BYTES, RuntimeOptions};
use egress_plugin_host::provider::{Capacity, Placement};
use std::path::PathBuf;
use std::time::Duration;

/// Where the providers come from: what the operator's Deployment mounts.
#[derive(clap::Args)]
pub struct SourceArgs {
    /// Directory holding the plugin components (`*.wasm`), e.g. the plugins ConfigMap mount.
    #[arg(
        long,
        env = "PLUGIN_DIR",
        default_value = "/etc/proxy-operator/plugins"
    )]
    pub plugin_dir: PathBuf,
    /// The providers file (YAML).
    #[arg(
        long,
        env = "PROVIDERS_FILE",
        default_value = "/etc/proxy-operator/providers.yaml"
    )]
    pub providers: PathBuf,
}

/// Plugins from OCI registries (`plugin: oci://...` in the providers file).
#[derive(clap::Args, Clone)]
pub struct RegistryArgs {
    /// A docker config file with registry credentials (`auths`), read at each pull: the
    /// `.dockerconfigjson` of a `kubernetes.io/dockerconfigjson` Secret. Missing: anonymous
    /// pulls.
    #[arg(
        long,
        env = "REGISTRY_AUTH_FILE",
        default_value = "/etc/proxy-operator/registry/.dockerconfigjson"
    )]
    pub registry_auth_file: PathBuf,
    /// Where pulled plugins, their signatures and tag pins are kept: a restart loads from
    /// here while the registry is away. Only what serves is kept.
    #[arg(
        long,
        env = "PLUGIN_STORE_DIR",
        default_value = "/tmp/proxy-operator/store"
    )]
    pub plugin_store_dir: PathBuf,
    /// How long after a failed pull (registry away, refused signature) it is tried again.
    #[arg(long, value_parser = humantime::parse_duration, default_value = "30s")]
    pub plugin_pull_retry: Duration,
}

/// Which plugin, and where the instance goes.
#[derive(clap::Args)]
pub struct TargetArgs {
    /// Directory holding the plugin components (`*.wasm`).
    #[arg(
        long,
        env = "PLUGIN_DIR",
        default_value = "/etc/proxy-operator/plugins"
    )]
    pub plugin_dir: PathBuf,
    /// Where to create: `region/zone/machineType/image[/spot]`, as in a Proxy's spec.placement. The first three
    /// `/` end region, zone and machine type; the rest is the image (`linode/debian12` too), and a last `/spot`
    /// asks for spot capacity.
    #[arg(long, value_parser = parse_placement)]
    pub placement: Placement,
    #[command(flatten)]
    pub runtime: RuntimeArgs,
}

#[derive(clap::Args)]
pub struct RuntimeArgs {
    /// Where compiled plugins are cached (must be private to this user). Empty disables.
    #[arg(
        long,
        env = "PLUGIN_CACHE_DIR",
        default_value = "/tmp/proxy-operator/cache"
    )]
    pub plugin_cache_dir: PathBuf,
    /// Parent of the per-call /tmp directories given to plugins.
    #[arg(
        long,
        env = "PLUGIN_SCRATCH_DIR",
        default_value = "/tmp/proxy-operator/calls"
    )]
    pub plugin_scratch_dir: PathBuf,
    /// Largest plugin file loaded (bytes, or a quantity such as 8Mi); a larger one is
    /// refused before it is read.
    #[arg(long, default_value = quantity_text(DEFAULT_MAX_PLUGIN_BYTES), value_parser = parse_quantity)]
    pub max_plugin_bytes: u64,
    /// CPU time one plugin compile may take (its child process's RLIMIT_CPU, whole
    /// seconds). The shipped plugins take under 1 s; past the limit the plugin is refused.
    #[arg(long, value_parser = humantime::parse_duration, default_value = duration_text(CompileLimits::default().cpu))]
    pub plugin_compile_cpu: Duration,
    /// Memory one plugin compile may take (its child process's RLIMIT_DATA; at most the
    /// pod's memory limit minus --memory-reserve). The shipped plugins need 47-70 MiB.
    #[arg(long, default_value = quantity_text(CompileLimits::default().memory_bytes), value_parser = parse_quantity)]
    pub plugin_compile_memory: u64,
    /// Wall time one plugin compile may take; then its child process is killed.
    #[arg(long, value_parser = humantime::parse_duration, default_value = duration_text(CompileLimits::default().wall))]
    pub plugin_compile_timeout: Duration,
    /// Memory the redactor may use for all Proxies' cloud-init and credentials together
    /// (part of --memory-reserve). A Proxy whose values do not fit waits, with
    /// CloudInitUnavailable naming this flag; one template shared by a fleet costs a few
    /// KiB per Proxy, a Proxy with its own generated credentials about 1.6 KiB.
    #[arg(long, default_value = quantity_text(egress_plugin_host::sensitive::DEFAULT_LIMIT_BYTES as u64), value_parser = parse_quantity)]
    pub redaction_memory: u64,
}

impl RuntimeArgs {
    pub fn options(&self, file: &ProvidersFile) -> RuntimeOptions {
        let cache =
            (!self.plugin_cache_dir.as_os_str().is_empty()).then(|| self.plugin_cache_dir.clone());
        let mut opts = RuntimeOptions::for_providers(file, cache, self.plugin_scratch_dir.clone());
        opts.max_plugin_bytes = self.max_plugin_bytes;
        opts.compile_in =
            Some(egress_plugin_host::plugin::compiler::Compiler::THIS_EXECUTABLE.into());
        opts.compile_limits = CompileLimits {
            cpu: self.plugin_compile_cpu,
            memory_bytes: self.plugin_compile_memory,
            wall: self.plugin_compile_timeout,
        };
        opts.redaction_memory_bytes = usize::try_from(self.redaction_memory).unwrap_or(usize::MAX);
        opts
    }

    /// [`options`](Self::options), with the compile's memory within what the pod's
    /// `budget` leaves ([`fit::compile_memory`]); logs the compile limits.
    pub fn options_within(&self, file: &ProvidersFile, budget: &PodResources) -> RuntimeOptions {
        let mut opts = self.options(file);
        let (memory, capped) = fit::compile_memory(budget, self.plugin_compile_memory);
        opts.compile_limits.memory_bytes = memory;
        let limits = &opts.compile_limits;
        tracing::info!(
            cpu = %humantime::format_duration(limits.cpu),
            memory = %fit::Mib(limits.memory_bytes),
            memory_capped_by_the_pod = capped,
            timeout = %humantime::format_duration(limits.wall),
            "plugin compile limits"
        );
        opts
    }
}

/// What the providers must fit: every provider at full concurrency, each call at its
/// memory and /tmp caps (docs/operations.md, "Fitting the pod").
#[derive(clap::Args)]
pub struct FitArgs {
    /// The pod's memory limit (e.g. 256Mi). Default: the memory limit of this process's
    /// cgroup; none there means no memory check.
    #[arg(long, value_parser = parse_quantity)]
    pub memory_limit: Option<u64>,
    /// Memory the operator keeps for itself, off the memory limit: its RSS with the shipped
    /// plugins loaded is 55-70 MiB (kube client and caches, compiled plugin code, tokio).
    #[arg(long, default_value = "96Mi", value_parser = parse_quantity)]
    pub memory_reserve: u64,
    /// Size of the /tmp volume holding the per-call scratch directories and the compile
    /// cache (the emptyDir's sizeLimit). Default: the size of that file system when it is a
    /// tmpfs; else no /tmp check.
    #[arg(long, value_parser = parse_quantity)]
    pub scratch_limit: Option<u64>,
}

impl FitArgs {
    pub fn budget(&self, runtime: &RuntimeArgs) -> PodResources {
        egress_plugin_host::config::pod::resolve(
            self.memory_limit,
            self.memory_reserve,
            self.scratch_limit,
            &runtime.plugin_scratch_dir,
        )
    }
}

pub fn parse_quantity(s: &str) -> Result<u64, String> {
    egress_plugin_host::config::pod::parse_quantity(s)
}

/// A flag's default duration as text, from the constant the code itself uses, so that
/// `--help` and an unset flag can never disagree with the code's default.
pub fn duration_text(d: Duration) -> String {
    humantime::format_duration(d).to_string()
}

/// A flag's default byte size as text (`8Mi` when it is whole MiB), from the code's
/// constant; [`parse_quantity`] reads it back.
pub fn quantity_text(bytes: u64) -> String {
    if bytes.is_multiple_of(1 << 20) {
        format!("{}Mi", bytes >> 20)
    } else {
        bytes.to_string()
    }
}

/// The `--placement` rule, as every error states it.
const PLACEMENT_RULE: &str = "want region/zone/machineType/image[/spot]: the first three '/' end region, zone \
    and machine type, the rest is the image (it may hold '/', as linode/debian12 does), and a last '/spot' \
    asks for spot capacity";

/// `region/zone/machineType/image[/spot]`. Region, zone and machine type never hold `/` at any provider, while
/// image IDs may (`linode/debian12`, GCE's `projects/.../family/debian-12`): so the first three `/` split, the
/// rest is the image, and a last `/spot` is the capacity, as before. Parts may be empty where the provider ignores
/// them. The one image this cannot name on demand is one whose last segment is `spot`.
pub fn parse_placement(s: &str) -> Result<Placement, String> {
    let parts: Vec<&str> = s.splitn(4, '/').collect();
    let [region, zone, machine_type, rest] = parts[..] else {
        return Err(format!(
            "placement {s:?} has {} part(s); {PLACEMENT_RULE}",
            parts.len()
        ));
    };
    let (image, capacity) = match rest.strip_suffix("/spot") {
        Some(image) => (image, Capacity::Spot),
        None => (rest, Capacity::OnDemand),
    };
    if image.ends_with('/') {
        return Err(format!(
            "placement {s:?}: the image part {image:?} ends in '/'; {PLACEMENT_RULE}"
        ));
    }
    Ok(Placement {
        capacity,
        ..Placement::new(region, zone, machine_type, image)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn placement(
        region: &str,
        zone: &str,
        machine_type: &str,
        image: &str,
        spot: bool,
    ) -> Placement {
        let capacity = if spot {
            Capacity::Spot
        } else {
            Capacity::OnDemand
        };
        Placement {
            capacity,
            ..Placement::new(region, zone, machine_type, image)
        }
    }

    /// The first three `/` end region, zone and machine type; the rest is the image, less a last `/spot`.
    #[test]
    fn placements_split_at_the_first_three_slashes() {
        let cases = [
            (
                "eu-west-1/eu-west-1a/t3.micro/debian",
                placement("eu-west-1", "eu-west-1a", "t3.micro", "debian", false),
            ),
            (
                "fsn1//cpx11/ubuntu",
                placement("fsn1", "", "cpx11", "ubuntu", false),
            ),
            ("/pve2//debian", placement("", "pve2", "", "debian", false)),
            ("///", placement("", "", "", "", false)),
            (
                "us-east//g6-nanode-1/linode/debian12",
                placement("us-east", "", "g6-nanode-1", "linode/debian12", false),
            ),
            (
                "us-east//g6-nanode-1/linode/debian12/spot",
                placement("us-east", "", "g6-nanode-1", "linode/debian12", true),
            ),
            (
                "europe-west1/europe-west1-b/e2-micro/projects/debian-cloud/global/images/family/debian-12",
                placement(
                    "europe-west1",
                    "europe-west1-b",
                    "e2-micro",
                    "projects/debian-cloud/global/images/family/debian-12",
                    false,
                ),
            ),
            (
                "r/z/m/debian/spot",
                placement("r", "z", "m", "debian", true),
            ),
            ("r/z/m//spot", placement("r", "z", "m", "", true)),
            ("r/z/m/spot", placement("r", "z", "m", "spot", false)),
            (
                "r/z/m/a/spotless",
                placement("r", "z", "m", "a/spotless", false),
            ),
        ];
        for (text, want) in cases {
            assert_eq!(parse_placement(text), Ok(want), "{text:?}");
        }
    }

    /// Each error names the value and the rule.
    #[test]
    fn bad_placements_name_the_value_and_the_rule() {
        let rule = "region/zone/machineType/image[/spot]";
        let cases: [(&str, &[&str]); 4] = [
            (
                "eu-west-1/t3.micro",
                &["\"eu-west-1/t3.micro\" has 2 part(s)", rule],
            ),
            ("", &["\"\" has 1 part(s)", rule]),
            (
                "r/z/m",
                &["\"r/z/m\" has 3 part(s)", rule, "first three '/'"],
            ),
            (
                "r/z/m/linode/",
                &["\"r/z/m/linode/\"", "\"linode/\"", "ends in '/'", rule],
            ),
        ];
        for (text, want) in cases {
            let err = parse_placement(text).unwrap_err();
            for w in want {
                assert!(err.contains(w), "{text:?}: {err:?} lacks {w:?}");
            }
        }
    }
}
