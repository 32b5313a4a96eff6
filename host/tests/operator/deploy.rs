//! The deployment manifests in config/: `kubectl kustomize config/default` renders, every
//! object is valid for its kind (it survives a round trip through the typed k8s-openapi
//! struct unchanged, so a misspelt or misplaced field shows), the CRDs are the committed
//! and generated ones, the RBAC rules are the generated ones, the Deployment is hardened as
//! the provider contract requires (reference section 1.4), and the pieces fit together
//! (service account, ConfigMaps, Secrets, ports, labels, providers file, samples).
//!
//! Needs kubectl (kustomize is built in). Without it the test is skipped loudly; under
//! `CI=true` it fails.

use egress_plugin_host::config::fit::{self, Mib};
use egress_plugin_host::config::{PodResources, ProvidersFile, pod};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{ConfigMap, Namespace, Service, ServiceAccount};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding, Role, RoleBinding};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use proxy_operator::api::{self, Proxy};
use proxy_operator::rbac;
use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::Command;

const NS: &str = "egress-system";

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// `kubectl kustomize DIR` as parsed documents; None (after saying so) without kubectl.
fn kustomize(dir: &str) -> Option<Vec<Value>> {
    let out = match Command::new("kubectl")
        .arg("kustomize")
        .arg(root().join(dir))
        .output()
    {
        Ok(out) => out,
        Err(e) => {
            let msg = format!("kubectl is not runnable ({e}); it renders config/ in this test");
            if std::env::var("CI").is_ok_and(|v| v == "true") {
                panic!("{msg}");
            }
            eprintln!("\n!!! SKIPPING: {msg}\n");
            return None;
        }
    };
    assert!(
        out.status.success(),
        "kubectl kustomize {dir} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8(out.stdout).unwrap();
    Some(parse_yaml_stream(&text))
}

fn parse_yaml_stream(text: &str) -> Vec<Value> {
    serde_yaml::Deserializer::from_str(text)
        .map(|d| serde::Deserialize::deserialize(d).unwrap())
        .filter(|v: &Value| !v.is_null())
        .collect()
}

fn name_of(v: &Value) -> String {
    format!(
        "{} {}",
        v["kind"].as_str().unwrap_or("?"),
        v["metadata"]["name"].as_str().unwrap_or("?")
    )
}

/// `v` with every number as a float: YAML's `65535` and a typed field's `65535.0` (JSON
/// schema bounds are `f64`) are the same value.
fn numbers_as_floats(v: &Value) -> Value {
    match v {
        Value::Number(n) => n.as_f64().map(Value::from).unwrap_or_else(|| v.clone()),
        Value::Array(a) => Value::Array(a.iter().map(numbers_as_floats).collect()),
        Value::Object(o) => Value::Object(
            o.iter()
                .map(|(k, v)| (k.clone(), numbers_as_floats(v)))
                .collect(),
        ),
        other => other.clone(),
    }
}

/// Deserializes `doc` as `K` and back; the result must equal the input.
fn round_trip<K: serde::de::DeserializeOwned + serde::Serialize>(doc: &Value) -> K {
    let typed: K = serde_json::from_value(doc.clone())
        .unwrap_or_else(|e| panic!("{} is not a valid object: {e}", name_of(doc)));
    let back = serde_json::to_value(&typed).unwrap();
    assert_eq!(
        numbers_as_floats(&back),
        numbers_as_floats(doc),
        "{} changes in a round trip through its type: a field is misspelt or misplaced",
        name_of(doc)
    );
    typed
}

fn one<'a>(docs: &'a [Value], kind: &str, name: &str) -> &'a Value {
    let found: Vec<&Value> = docs
        .iter()
        .filter(|d| d["kind"] == kind && d["metadata"]["name"] == name)
        .collect();
    assert_eq!(found.len(), 1, "want exactly one {kind} {name}");
    found[0]
}

#[test]
fn default_overlay_renders_valid_hardened_manifests() {
    let Some(docs) = kustomize("config/default") else {
        return;
    };

    // Every object is valid for its kind, and everything namespaced is in egress-system.
    let mut kinds: Vec<String> = Vec::new();
    for d in &docs {
        let kind = d["kind"].as_str().unwrap_or_default();
        kinds.push(name_of(d));
        match kind {
            "Namespace" => drop(round_trip::<Namespace>(d)),
            "CustomResourceDefinition" => drop(round_trip::<CustomResourceDefinition>(d)),
            "ServiceAccount" => drop(round_trip::<ServiceAccount>(d)),
            "ClusterRole" => drop(round_trip::<ClusterRole>(d)),
            "Role" => drop(round_trip::<Role>(d)),
            "ClusterRoleBinding" => drop(round_trip::<ClusterRoleBinding>(d)),
            "RoleBinding" => drop(round_trip::<RoleBinding>(d)),
            "ConfigMap" => drop(round_trip::<ConfigMap>(d)),
            "Service" => drop(round_trip::<Service>(d)),
            "Deployment" => drop(round_trip::<Deployment>(d)),
            "PodDisruptionBudget" => drop(round_trip::<PodDisruptionBudget>(d)),
            other => panic!("unexpected kind {other} in config/default"),
        }
        let cluster_scoped = matches!(
            kind,
            "Namespace" | "CustomResourceDefinition" | "ClusterRole" | "ClusterRoleBinding"
        );
        if !cluster_scoped {
            assert_eq!(d["metadata"]["namespace"], NS, "{}", name_of(d));
        }
    }
    kinds.sort();
    let mut want = vec![
        "ClusterRole proxy-operator",
        "ClusterRole proxy-operator-discovery-reader",
        "ClusterRole proxy-operator-proxy-user",
        "ClusterRoleBinding proxy-operator",
        "ConfigMap proxy-operator-plugins",
        "ConfigMap proxy-operator-providers",
        "CustomResourceDefinition providerhealths.egress.proxy-operator.dev",
        "CustomResourceDefinition proxies.egress.proxy-operator.dev",
        "CustomResourceDefinition proxypools.egress.proxy-operator.dev",
        "Deployment proxy-operator",
        "Namespace egress-system",
        "PodDisruptionBudget proxy-operator",
        "Role proxy-operator",
        "RoleBinding proxy-operator",
        "Service proxy-operator",
        "ServiceAccount proxy-operator",
    ];
    want.sort();
    assert_eq!(kinds, want);

    // The CRDs are the committed files and the generated ones.
    for (file, crd) in api::crds() {
        let name = crd.metadata.name.clone().unwrap();
        let rendered = one(&docs, "CustomResourceDefinition", &name);
        let committed = std::fs::read_to_string(root().join("config/crd").join(file)).unwrap();
        let committed = &parse_yaml_stream(&committed)[0];
        assert_eq!(
            numbers_as_floats(rendered),
            numbers_as_floats(committed),
            "{name}: rendered differs from config/crd/{file}"
        );
        assert_eq!(
            numbers_as_floats(rendered),
            numbers_as_floats(&serde_json::to_value(&crd).unwrap()),
            "{name}: differs from the generated CRD (run `proxy-operator crds --output-dir config/crd`)"
        );
    }

    // The RBAC rules are the generated ones, bound to the operator's ServiceAccount.
    let cr: ClusterRole = round_trip(one(&docs, "ClusterRole", rbac::NAME));
    assert_eq!(cr.rules, rbac::cluster_role().rules);
    let role: Role = round_trip(one(&docs, "Role", rbac::NAME));
    assert_eq!(role.rules, rbac::role().rules);
    let crb: ClusterRoleBinding = round_trip(one(&docs, "ClusterRoleBinding", rbac::NAME));
    let rb: RoleBinding = round_trip(one(&docs, "RoleBinding", rbac::NAME));
    assert_eq!(
        (crb.role_ref.kind.as_str(), crb.role_ref.name.as_str()),
        ("ClusterRole", rbac::NAME)
    );
    assert_eq!(
        (rb.role_ref.kind.as_str(), rb.role_ref.name.as_str()),
        ("Role", rbac::NAME)
    );
    for subjects in [crb.subjects.unwrap(), rb.subjects.unwrap()] {
        assert_eq!(subjects.len(), 1);
        assert_eq!(subjects[0].kind, "ServiceAccount");
        assert_eq!(subjects[0].name, rbac::NAME);
        assert_eq!(subjects[0].namespace.as_deref(), Some(NS));
    }

    // The Deployment, hardened.
    let dep: Deployment = round_trip(one(&docs, "Deployment", "proxy-operator"));
    let spec = dep.spec.unwrap();
    assert_eq!(spec.replicas, Some(2), "two replicas with leader election");
    let pod = spec.template.spec.unwrap();
    assert_eq!(pod.service_account_name.as_deref(), Some(rbac::NAME));
    let psc = pod.security_context.unwrap();
    assert_eq!(psc.run_as_non_root, Some(true));
    assert!(psc.run_as_user.is_some_and(|u| u != 0));
    assert_eq!(
        psc.seccomp_profile.map(|s| s.type_).as_deref(),
        Some("RuntimeDefault")
    );
    assert_eq!(pod.containers.len(), 1);
    let c = &pod.containers[0];
    let sc = c.security_context.clone().unwrap();
    assert_eq!(sc.read_only_root_filesystem, Some(true));
    assert_eq!(sc.allow_privilege_escalation, Some(false));
    assert_eq!(sc.run_as_non_root, Some(true));
    assert_eq!(
        sc.capabilities.and_then(|c| c.drop),
        Some(vec!["ALL".to_string()])
    );
    let limits = c.resources.clone().unwrap().limits.unwrap();
    assert_eq!(
        pod::parse_quantity(&limits["memory"].0).unwrap(),
        crate::harness::DEPLOYMENT_MEMORY_LIMIT,
        "sized in shipped_manifests_fit_the_pod; the hostile tests run under this limit"
    );
    for flag in crate::harness::DEPLOYMENT_ARGS {
        assert!(
            c.args.iter().flatten().any(|a| a == flag),
            "the hostile tests run with {flag}, as the Deployment must"
        );
    }
    let args = c.args.clone().unwrap();
    assert_eq!(args[0], "run");
    assert!(
        args.contains(&"--leader-election=true".to_string()),
        "{args:?}"
    );
    // Pod logs go to log pipelines: one JSON object per line.
    assert!(args.contains(&"--log-format=json".to_string()), "{args:?}");
    let env = |name: &str| -> Option<&k8s_openapi::api::core::v1::EnvVar> {
        c.env.as_ref().unwrap().iter().find(|e| e.name == name)
    };
    for (name, field) in [
        ("POD_NAME", "metadata.name"),
        ("POD_NAMESPACE", "metadata.namespace"),
    ] {
        let from = env(name)
            .and_then(|e| e.value_from.clone())
            .and_then(|v| v.field_ref)
            .unwrap_or_else(|| panic!("{name} from the downward API"));
        assert_eq!(from.field_path, field);
    }
    // Two glibc heap arenas: a third less RSS at 1,000 Proxies (see the manifest).
    assert_eq!(
        env("MALLOC_ARENA_MAX").and_then(|e| e.value.as_deref()),
        Some("2")
    );
    // A fixed mmap threshold: large transient blocks go back to the system when freed.
    assert_eq!(
        env("MALLOC_MMAP_THRESHOLD_").and_then(|e| e.value.as_deref()),
        Some("131072")
    );
    // Probes on /healthz and /readyz, on the named port the server listens on.
    let port = c
        .ports
        .as_ref()
        .unwrap()
        .iter()
        .find(|p| p.name.as_deref() == Some("http"));
    assert_eq!(port.map(|p| p.container_port), Some(8080));
    assert!(args.contains(&"--listen=0.0.0.0:8080".to_string()));
    for (probe, path) in [
        (c.liveness_probe.clone(), "/healthz"),
        (c.readiness_probe.clone(), "/readyz"),
    ] {
        let get = probe.and_then(|p| p.http_get).unwrap();
        assert_eq!(get.path.as_deref(), Some(path));
        assert_eq!(
            serde_json::to_value(&get.port).unwrap(),
            serde_json::json!("http")
        );
    }
    // Volumes: /tmp is a 64Mi emptyDir; ConfigMaps exist; Secrets are optional.
    let volumes = pod.volumes.unwrap();
    let mounts = c.volume_mounts.clone().unwrap();
    let mount_of = |vol: &str| {
        mounts
            .iter()
            .find(|m| m.name == vol)
            .unwrap_or_else(|| panic!("volume {vol} is not mounted"))
    };
    let tmp = volumes
        .iter()
        .find(|v| mount_of(&v.name).mount_path == "/tmp")
        .unwrap();
    assert_eq!(
        tmp.empty_dir
            .as_ref()
            .and_then(|e| e.size_limit.clone())
            .map(|q| q.0)
            .as_deref(),
        Some(crate::harness::deployment_flag("scratch-limit")),
        "the hostile tests' scratch limit is the Deployment's /tmp"
    );
    let mut secret_dirs = Vec::new();
    for v in &volumes {
        let m = mount_of(&v.name);
        if let Some(cm) = &v.config_map {
            one(&docs, "ConfigMap", &cm.name);
            assert_eq!(m.read_only, Some(true), "{}", v.name);
        }
        // The plugin directory projects one ConfigMap per plugin (here the placeholder).
        if let Some(projected) = &v.projected {
            for source in projected.sources.iter().flatten() {
                let cm = source.config_map.as_ref().unwrap_or_else(|| {
                    panic!("volume {} projects something else: {source:?}", v.name)
                });
                one(&docs, "ConfigMap", &cm.name);
            }
            assert_eq!(m.read_only, Some(true), "{}", v.name);
        }
        if let Some(s) = &v.secret {
            assert_eq!(
                s.optional,
                Some(true),
                "Secret volume {} must be optional",
                v.name
            );
            assert_eq!(m.read_only, Some(true), "{}", v.name);
            secret_dirs.push(m.mount_path.clone());
        }
    }
    // Every mount lies under /tmp or is read-only: nothing else is writable.
    for m in &mounts {
        assert!(
            m.mount_path == "/tmp" || m.read_only == Some(true),
            "{}",
            m.mount_path
        );
    }
    let env_path = |name: &str| env(name).and_then(|e| e.value.clone()).unwrap();
    for dir in ["PLUGIN_CACHE_DIR", "PLUGIN_SCRATCH_DIR"] {
        assert!(
            env_path(dir).starts_with("/tmp/"),
            "{dir} must be on the /tmp emptyDir"
        );
    }

    // The providers file parses, its plugins are loaded from the plugins mount and its
    // secrets are files in the optional Secret mounts.
    let providers_path = env_path("PROVIDERS_FILE");
    let providers_mount = mounts
        .iter()
        .find(|m| providers_path.starts_with(&format!("{}/", m.mount_path)))
        .expect("PROVIDERS_FILE is on a mount");
    let providers_cm: ConfigMap = round_trip(one(&docs, "ConfigMap", "proxy-operator-providers"));
    let key = providers_path.rsplit('/').next().unwrap();
    let file = ProvidersFile::parse(&providers_cm.data.unwrap()[key])
        .unwrap_or_else(|e| panic!("the providers ConfigMap does not parse: {e}"));
    assert_eq!(
        volumes
            .iter()
            .find(|v| v.name == providers_mount.name)
            .and_then(|v| v.config_map.as_ref())
            .map(|c| c.name.as_str()),
        Some("proxy-operator-providers")
    );
    let mut provider_names = Vec::new();
    for p in &file.providers {
        provider_names.push(p.name.clone());
        for (k, path) in &p.secrets {
            assert!(
                secret_dirs.iter().any(|d| path.starts_with(d)),
                "provider {} secret {k} ({}) is not in a Secret mount",
                p.name,
                path.display()
            );
        }
    }
    assert!(env_path("PLUGIN_DIR") == mount_of("plugins").mount_path);

    // The Service reaches the pods' http port.
    let svc: Service = round_trip(one(&docs, "Service", "proxy-operator"));
    let svc = svc.spec.unwrap();
    let pod_labels = spec.template.metadata.unwrap().labels.unwrap();
    for (k, v) in svc.selector.unwrap() {
        assert_eq!(pod_labels.get(&k), Some(&v), "Service selector {k}={v}");
    }
    let sp = &svc.ports.unwrap()[0];
    assert_eq!(
        serde_json::to_value(&sp.target_port).unwrap(),
        serde_json::json!("http")
    );

    // One sample Proxy per provider type, each naming a configured provider.
    for (file, provider) in [("proxy_hetzner.yaml", "hetzner"), ("proxy_ec2.yaml", "aws")] {
        let text = std::fs::read_to_string(root().join("config/samples").join(file)).unwrap();
        let p: Proxy =
            serde_yaml::from_str(&text).unwrap_or_else(|e| panic!("config/samples/{file}: {e}"));
        assert_eq!(p.spec.provider, provider, "{file}");
        assert!(provider_names.contains(&p.spec.provider), "{file}");
        assert!(
            p.spec
                .cloud_init
                .inline
                .is_some_and(|c| c.starts_with("#cloud-config"))
        );
    }
}

/// The Deployment's pod, as config/manager/manager.yaml has it.
fn shipped_pod() -> k8s_openapi::api::core::v1::PodSpec {
    let text = std::fs::read_to_string(root().join("config/manager/manager.yaml")).unwrap();
    let dep: Deployment = serde_yaml::from_str(&text).unwrap();
    dep.spec.unwrap().template.spec.unwrap()
}

/// What the pod gives the sandboxes, read from config/manager/manager.yaml as written:
/// the container's memory limit, `--memory-reserve` (or its default), and the /tmp
/// emptyDir's sizeLimit, which `--scratch-limit` must repeat.
fn deployment_budget() -> PodResources {
    let pod = shipped_pod();
    let c = &pod.containers[0];
    let limit = &c.resources.as_ref().unwrap().limits.as_ref().unwrap()["memory"].0;
    let args = c.args.clone().unwrap_or_default();
    let flag = |name: &str| {
        args.iter()
            .find_map(|a| a.strip_prefix(&format!("--{name}=")))
            .map(str::to_string)
    };
    let tmp_mount = c
        .volume_mounts
        .as_ref()
        .unwrap()
        .iter()
        .find(|m| m.mount_path == "/tmp")
        .expect("/tmp is a volume");
    let size_limit = pod
        .volumes
        .unwrap()
        .into_iter()
        .find(|v| v.name == tmp_mount.name)
        .and_then(|v| v.empty_dir)
        .and_then(|e| e.size_limit)
        .expect("/tmp is an emptyDir with a sizeLimit")
        .0;
    assert_eq!(
        flag("scratch-limit").as_deref(),
        Some(size_limit.as_str()),
        "--scratch-limit must equal the /tmp emptyDir's sizeLimit"
    );
    let q = |s: &str| pod::parse_quantity(s).unwrap();
    PodResources {
        memory_bytes: Some(q(limit)),
        reserve_bytes: q(&flag("memory-reserve").unwrap_or_else(|| "96Mi".into())),
        scratch_bytes: Some(q(&size_limit)),
        descriptors: None,
    }
}

/// The shipped providers file (the ConfigMap in config/manager/providers.yaml).
fn shipped_providers() -> ProvidersFile {
    let text = std::fs::read_to_string(root().join("config/manager/providers.yaml")).unwrap();
    let cm: ConfigMap = serde_yaml::from_str(&text).unwrap();
    ProvidersFile::parse(&cm.data.unwrap()["providers.yaml"]).unwrap()
}

/// The shipped defaults and manifests agree: the shipped providers file fits the
/// Deployment's own memory limit and /tmp size, and a file asking for far more is refused
/// with a message naming the provider, the fields and the numbers. Needs no kubectl.
#[test]
fn shipped_manifests_fit_the_pod() {
    let budget = deployment_budget();
    let file = shipped_providers();
    let need = fit::check(&file, &budget).unwrap_or_else(|e| {
        panic!("the shipped providers file does not fit the shipped Deployment: {e}")
    });
    eprintln!(
        "shipped: memory {} of {} - {}, /tmp {} of {}",
        Mib(need.memory.total()),
        Mib(budget.memory_bytes.unwrap()),
        Mib(budget.reserve_bytes),
        Mib(need.scratch.total()),
        Mib(budget.scratch_bytes.unwrap())
    );

    let mut greedy = file.clone();
    greedy.providers[0].limits.memory_mib = 512;
    greedy.providers[0].limits.concurrency = 8;
    let name = greedy.providers[0].name.clone();
    let err = fit::check(&greedy, &budget)
        .expect_err("memoryMib 512 x concurrency 8 must not fit")
        .to_string();
    for needle in [
        "providers need up to".to_string(),
        "of sandbox memory".to_string(),
        format!("{name}: limits.concurrency 8 x (limits.memoryMib 512 + "),
        format!(
            "the pod's memory limit {} minus the operator's reserve {} leaves {}",
            Mib(budget.memory_bytes.unwrap()),
            Mib(budget.reserve_bytes),
            Mib(budget.memory_bytes.unwrap() - budget.reserve_bytes)
        ),
        "lower limits.concurrency or limits.memoryMib, or raise the pod's memory limit".to_string(),
    ] {
        assert!(err.contains(&needle), "{err:?} lacks {needle:?}");
    }
}

/// The shipped Deployment leaves the room aws's default budget calls for beyond its own
/// calls: 72,000 requests an hour (ec2's `defaultBudget`, docs/providers/ec2.md) at a
/// quarter of a second a request keep 6 calls busy, and the fit's left-over holds the 4
/// beyond the 2 own, in memory and in /tmp. At 328Mi it held none: aws ran 2 calls, about
/// 8 requests a second of its 20. Its `--concurrency` lets that many creates run: a
/// provider's creates take at most half the reconcile turns (`controller::turns`).
#[test]
fn the_shipped_deployment_leaves_room_for_aws_to_follow_its_budget() {
    let budget = deployment_budget();
    let file = shipped_providers();
    let left = fit::left_over(&file, &budget);
    let aws = file
        .providers
        .iter()
        .find(|p| p.name == "aws")
        .expect("aws in the shipped providers file");
    let calls_in = |room: Option<u64>, per_call: u64| room.map_or(u64::MAX, |r| r / per_call);
    let borrowable = calls_in(left.memory, aws.limits.memory_bytes_per_call())
        .min(calls_in(left.scratch, aws.limits.tmp_bytes_per_call()));
    let wanted = egress_plugin_host::plugin::budget_slots(72_000.0 / 3_600.0, 0.25) as u64;
    let own = u64::from(aws.limits.concurrency);
    eprintln!(
        "shipped room: memory {}, /tmp {}: {borrowable} calls of aws beyond its {own}; it wants {wanted}",
        Mib(left.memory.unwrap()),
        Mib(left.scratch.unwrap()),
    );
    assert_eq!(wanted, 6, "docs/operations.md's table");
    assert!(
        own + borrowable >= wanted,
        "the shipped Deployment leaves room for {borrowable} borrowed calls; aws wants {wanted} in all"
    );
    assert!(u64::from(aws.limits.most_calls()) >= wanted);
    let args = shipped_pod().containers[0].args.clone().unwrap_or_default();
    let turns: u64 = args
        .iter()
        .find_map(|a| a.strip_prefix("--concurrency="))
        .expect("--concurrency in the Deployment")
        .parse()
        .unwrap();
    assert!(
        turns.div_ceil(2) >= wanted,
        "--concurrency={turns} lets a provider run {} creates at once; aws wants {wanted}",
        turns.div_ceil(2)
    );
}

/// Every shipped cloud-init (the documents in config/samples/cloud-init/, every provider
/// sample, the demo's Proxies) renders with the operator's template: no unknown
/// placeholder, nothing of `{{egress.` left, still YAML with `#cloud-config` first. The
/// tinyproxy ones configure the port and the credentials where the emulators' real-proxy
/// mode (which reads them as a machine would) finds them.
#[test]
fn cloud_init_samples_render() {
    use egress_emulators::real_proxy::{basic_auth_from_user_data, port_from_user_data};
    use proxy_operator::controller::template::{self, Placeholder, Values};
    let clients = vec!["203.0.113.0/24".to_string(), "2001:db8::/32".to_string()];
    let values = |port| Values {
        port,
        name: "sample",
        credentials: Some(("u1234", "p5678")),
        allowed_clients: &clients,
    };
    let mut docs: Vec<(String, String)> = Vec::new();
    for entry in std::fs::read_dir(root().join("config/samples/cloud-init")).unwrap() {
        let path = entry.unwrap().path();
        docs.push((
            path.display().to_string(),
            std::fs::read_to_string(&path).unwrap(),
        ));
    }
    assert_eq!(docs.len(), 3, "{docs:?}");
    let mut proxies = Vec::new();
    for dir in ["config/samples", "config/samples/demo"] {
        for entry in std::fs::read_dir(root().join(dir)).unwrap() {
            let path = entry.unwrap().path();
            if path.extension().is_none_or(|e| e != "yaml") {
                continue;
            }
            let text = std::fs::read_to_string(&path).unwrap();
            for doc in serde_yaml::Deserializer::from_str(&text) {
                let v: Value = serde::Deserialize::deserialize(doc).unwrap();
                if v["kind"] == "Proxy" {
                    let p: Proxy = serde_json::from_value(v).unwrap();
                    proxies.push((path.display().to_string(), p));
                }
            }
        }
    }
    assert!(proxies.len() >= 10, "{}", proxies.len());
    for (path, p) in &proxies {
        let ci = p.spec.cloud_init.inline.clone().unwrap();
        assert!(
            ci.contains("BasicAuth {{egress.username}} {{egress.password}}"),
            "{path}: the sample Proxy {} requires no credentials",
            p.metadata.name.as_deref().unwrap_or_default()
        );
        docs.push((path.clone(), ci));
    }
    for (path, doc) in docs {
        let r = template::render(doc.as_bytes(), &values(31999))
            .unwrap_or_else(|e| panic!("{path}: {e}"));
        let text = String::from_utf8(r.bytes).unwrap();
        assert!(!text.contains("{{egress."), "{path}");
        assert!(text.starts_with("#cloud-config\n"), "{path}");
        let yaml: Value = serde_yaml::from_str(&text).unwrap_or_else(|e| panic!("{path}: {e}"));
        assert!(yaml.is_object(), "{path}");
        if r.used.contains(&Placeholder::Password) && doc.contains("BasicAuth") {
            assert_eq!(
                port_from_user_data(Some(text.as_bytes())),
                Ok(31999),
                "{path}"
            );
            assert_eq!(
                basic_auth_from_user_data(Some(text.as_bytes())),
                [("u1234".to_string(), "p5678".to_string())],
                "{path}"
            );
        }
        if path.contains("squid") {
            assert!(
                text.contains("http_port 31999\n") && text.contains("'p5678' | htpasswd"),
                "{path}"
            );
        }
        if path.contains("allowlist") {
            assert!(
                text.contains("for c in 203.0.113.0/24 2001:db8::/32;"),
                "{path}"
            );
        }
    }
}
