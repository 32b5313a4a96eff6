//! The shipped container image runs as the Deployment runs it: `cargo xtask image` built
//! it (`EGRESS_OPERATOR_IMAGE` names it), podman runs it with the Deployment's arguments,
//! environment and mounts read from `config/manager/manager.yaml`, a read-only root
//! filesystem, uid 65532, the Deployment's memory limit and a 64 MiB `/tmp`, on the host
//! network, against the in-memory API server and the Hetzner emulator whose instances are
//! real proxies on 127.0.0.1. A Proxy goes Ready through it: the image holds everything
//! the operator needs (libraries, CA roots, user) and nothing writes outside `/tmp`.
//!
//! Installed as a user installs from a registry: the image is pushed to the distribution
//! registry on 127.0.0.1 and run from there by digest, and the Hetzner plugin is pushed
//! and signed there too, the providers file naming it `oci://...@sha256:...` with
//! `verify.publicKeys`: no plugin ConfigMap at all.
//!
//! Without the variable (the image was not built, as under a bare `cargo test`) the test is
//! skipped loudly; under `CI=true` it fails instead: `cargo xtask test` builds the image.

use crate::harness::{fake_cluster, free_port, wait_for};
use crate::support;

use egress_emulators::hetzner::{HetznerConfig, HetznerEmulator};
use egress_emulators::real_proxy::{ProxyKind, RealProxies};
use kube::api::{Api, PostParams};
use proxy_operator::api::{Proxy, condition};
use serde::Deserialize;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

const TOKEN: &str = "image-token";
const CLOUD_INIT: &str = "#cloud-config\nwrite_files:\n  - path: /etc/tinyproxy/tinyproxy.conf\n    content: |\n      Port {{egress.port}}\n      BasicAuth {{egress.username}} {{egress.password}}\n";

/// The image to run, or `None` (skipped, said loudly; a failure under `CI=true`).
fn image() -> Option<String> {
    match std::env::var("EGRESS_OPERATOR_IMAGE") {
        Ok(i) if !i.is_empty() => Some(i),
        _ => {
            let msg = "EGRESS_OPERATOR_IMAGE is not set: the image was not built \
                       (`cargo xtask image`; `cargo xtask test` builds it and sets it)";
            assert!(std::env::var("CI").as_deref() != Ok("true"), "{msg}");
            eprintln!("\n!!! SKIPPED: {msg}\n");
            None
        }
    }
}

/// The manager container of the Deployment, as committed.
fn manager() -> serde_yaml::Value {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../config/manager/manager.yaml");
    let text = std::fs::read_to_string(&path).unwrap();
    let deployment = serde_yaml::Deserializer::from_str(&text)
        .map(|d| serde_yaml::Value::deserialize(d).unwrap())
        .find(|d| d["kind"] == "Deployment")
        .expect("a Deployment in manager.yaml");
    deployment["spec"]["template"]["spec"]["containers"][0].clone()
}

/// The mount path of the volume `name` in the manager container.
fn mount(manager: &serde_yaml::Value, name: &str) -> String {
    manager["volumeMounts"]
        .as_sequence()
        .unwrap()
        .iter()
        .find(|m| m["name"] == name)
        .and_then(|m| m["mountPath"].as_str())
        .unwrap_or_else(|| panic!("no volume mount {name} in manager.yaml"))
        .to_string()
}

/// A directory the container's user (65532) can read: 0755, its files 0644.
fn readable_dir(path: &Path, files: &[(&str, &[u8])]) -> PathBuf {
    std::fs::create_dir_all(path).unwrap();
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o755)).unwrap();
    for (name, bytes) in files {
        let f = path.join(name);
        std::fs::write(&f, bytes).unwrap();
        std::fs::set_permissions(&f, std::fs::Permissions::from_mode(0o644)).unwrap();
    }
    path.to_path_buf()
}

/// Pushes the image and the Hetzner plugin (signed with a new key) to `registry`, and
/// pulls the image back by digest: the image's registry reference, the plugin's pinned
/// `oci://` reference, and the public key.
fn publish(
    registry: &support::registry::Registry,
    image: &str,
    plugin_dir: &Path,
    dir: &Path,
) -> (String, String, String) {
    let run = |cmd: &mut Command| -> String {
        let out = cmd.output().unwrap();
        assert!(
            out.status.success(),
            "{cmd:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8(out.stdout).unwrap()
    };
    // podman trusts the registry's CA from a directory of `*.crt` files.
    let certs = dir.join("certs");
    std::fs::create_dir_all(&certs).unwrap();
    std::fs::copy(&registry.ca_file, certs.join("ca.crt")).unwrap();
    let host = registry.host();
    let digest_file = dir.join("image.digest");
    run(Command::new("podman")
        .args(["push", "--quiet", "--cert-dir"])
        .arg(&certs)
        .arg("--digestfile")
        .arg(&digest_file)
        .arg(image)
        .arg(format!("docker://{host}/egress/proxy-operator:test")));
    let digest = std::fs::read_to_string(&digest_file).unwrap();
    let by_digest = format!("{host}/egress/proxy-operator@{}", digest.trim());
    run(Command::new("podman")
        .args(["pull", "--quiet", "--cert-dir"])
        .arg(&certs)
        .arg(&by_digest));

    let operator = env!("CARGO_BIN_EXE_proxy-operator");
    let ca = registry.ca_file.to_str().unwrap();
    let cache = dir.join("cli-cache");
    let pinned = run(Command::new(operator)
        .args(["plugin", "push"])
        .arg(plugin_dir.join("hetzner.wasm"))
        .arg(format!("oci://{host}/egress/hetzner:test"))
        .args(["--ca-file", ca, "--plugin-cache-dir"])
        .arg(&cache))
    .trim()
    .to_string();
    let prefix = dir.join("signing");
    run(Command::new(operator)
        .args(["plugin", "keygen"])
        .arg(&prefix));
    run(Command::new(operator)
        .args(["plugin", "sign", &pinned, "--key"])
        .arg(prefix.with_extension("key"))
        .args(["--ca-file", ca]));
    let public = std::fs::read_to_string(prefix.with_extension("pub")).unwrap();
    (by_digest, pinned, public)
}

/// The container, removed (by name) however the test ends.
struct Container {
    name: String,
    child: Child,
    log: PathBuf,
}

impl Drop for Container {
    fn drop(&mut self) {
        let _ = Command::new("podman")
            .args(["rm", "--force", "--time", "0", &self.name])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status();
        let _ = self.child.kill();
        let _ = self.child.wait();
        if std::thread::panicking() {
            let log = std::fs::read_to_string(&self.log).unwrap_or_default();
            eprintln!("--- container log ---\n{log}--- end of log ---");
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_image_runs_as_the_deployment_and_a_proxy_goes_ready_through_it() {
    let Some(plugin_dir) = support::plugin_dir() else {
        return;
    };
    let Some(image) = image() else {
        return;
    };
    let Some(registry) = support::registry::Registry::start().await else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let (image, plugin, public_key) = publish(&registry, &image, &plugin_dir, dir.path());
    let (_fake, client, kubeconfig) = fake_cluster(dir.path()).await;
    let real = RealProxies::new(ProxyKind::Builtin);
    let hz = HetznerEmulator::start(HetznerConfig {
        real_proxies: Some(real.clone()),
        ..HetznerConfig::new(TOKEN)
    });
    let (echo, _echo) = support::tinyproxy::echo_server().await;

    let manager = manager();
    let url = hz.url();
    let secrets_at = mount(&manager, "secret-hetzner");
    let providers_at = mount(&manager, "providers");
    let key: String = public_key.lines().map(|l| format!("    {l}\n")).collect();
    let providers = format!(
        "verify:\n  publicKeys:\n  - |\n{key}providers:\n- name: hz\n  plugin: {plugin}\n  \
         tls: {{caFile: {providers_at}/registry-ca.pem}}\n  additionalHosts: ['{url}']\n  \
         allowPrivateAddresses: true\n  secrets: {{token: {secrets_at}/token}}\n  \
         config: {{endpoint: '{url}/v1', locations: [fsn1], serverTypes: [cpx11], \
         images: {{ubuntu: ubuntu-24.04}}}}\n"
    );
    let ca = std::fs::read(&registry.ca_file).unwrap();
    let kube = std::fs::read(&kubeconfig).unwrap();
    let volumes = [
        (
            "providers",
            readable_dir(
                &dir.path().join("providers"),
                &[
                    ("providers.yaml", providers.as_bytes()),
                    ("registry-ca.pem", &ca),
                ],
            ),
        ),
        // The plugin ConfigMap's mount, empty: the plugin comes from the registry.
        ("plugins", readable_dir(&dir.path().join("plugins"), &[])),
        (
            "secret-hetzner",
            readable_dir(&dir.path().join("secret"), &[("token", TOKEN.as_bytes())]),
        ),
    ];
    let kube_dir = readable_dir(&dir.path().join("kube"), &[("config", &kube)]);

    let port = free_port();
    let name = format!("egress-image-test-{}", std::process::id());
    let mut cmd = Command::new("podman");
    // runc, not crun (which cannot set its rlimits here), with limits this machine allows.
    cmd.args([
        "--runtime",
        "runc",
        "run",
        "--rm",
        "--pull",
        "never",
        "--name",
        &name,
    ])
    .args(["--network", "host", "--read-only", "--user", "65532:65532"])
    .arg("--memory")
    .arg(format!(
        "{}m",
        crate::harness::DEPLOYMENT_MEMORY_LIMIT >> 20
    ))
    .args(["--cap-drop", "ALL"])
    .args(["--security-opt", "no-new-privileges"])
    .args([
        "--ulimit",
        "nofile=20000:20000",
        "--ulimit",
        "nproc=32768:32768",
    ]);
    // The Deployment's emptyDir on /tmp, as large as its `--scratch-limit` says.
    let scratch = crate::harness::deployment_flag("scratch-limit")
        .strip_suffix("Mi")
        .expect("the Deployment's --scratch-limit in Mi");
    cmd.arg("--tmpfs").arg(format!(
        "{}:rw,size={scratch}m,mode=1777",
        mount(&manager, "tmp")
    ));
    for (volume, host) in &volumes {
        cmd.arg("--volume")
            .arg(format!("{}:{}:ro", host.display(), mount(&manager, volume)));
    }
    // Out of cluster: the API server's address and no ServiceAccount token.
    cmd.arg("--volume")
        .arg(format!(
            "{}:/etc/proxy-operator/kube:ro",
            kube_dir.display()
        ))
        .args(["--env", "KUBECONFIG=/etc/proxy-operator/kube/config"]);
    for e in manager["env"].as_sequence().unwrap() {
        let key = e["name"].as_str().unwrap();
        let value = match (key, e["value"].as_str()) {
            (_, Some(v)) => v.to_string(),
            ("POD_NAME", None) => "proxy-operator-image-test".into(),
            ("POD_NAMESPACE", None) => "default".into(),
            (other, None) => panic!("env {other} has no value the test can give"),
        };
        cmd.args(["--env", &format!("{key}={value}")]);
    }
    cmd.arg(&image);
    let mut listen_replaced = false;
    for a in manager["args"].as_sequence().unwrap() {
        let a = a.as_str().unwrap();
        // The host network: a free port on loopback instead of the pod's 0.0.0.0:8080.
        if a.starts_with("--listen=") {
            cmd.arg(format!("--listen=127.0.0.1:{port}"));
            listen_replaced = true;
        } else {
            cmd.arg(a);
        }
    }
    assert!(listen_replaced, "the Deployment passes --listen");
    cmd.args(["--probe-target", &format!("127.0.0.1:{echo}")])
        .args(["--installation", "image-test"]);
    let log = dir.path().join("container.log");
    let started = Instant::now();
    let child = cmd
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log).unwrap())
        .spawn()
        .expect("running podman (apt-get install podman runc)");
    let mut container = Container { name, child, log };
    let addr = std::net::SocketAddr::from(([127, 0, 0, 1], port));
    wait_for(
        "/readyz from the container",
        Duration::from_secs(120),
        async || {
            if let Ok(Some(status)) = container.child.try_wait() {
                panic!("the container exited: {status}");
            }
            let a = support::http::try_get(addr, "/readyz").await?;
            (a.status == 200).then_some(())
        },
    )
    .await;
    let ready_after = started.elapsed();

    let proxies: Api<Proxy> = Api::namespaced(client.clone(), "default");
    let mut p = Proxy::new(
        "through-the-image",
        support::hetzner_spec(CLOUD_INIT, support::tinyproxy::free_port()),
    );
    p.metadata.namespace = Some("default".into());
    let created = Instant::now();
    proxies.create(&PostParams::default(), &p).await.unwrap();
    wait_for("the Proxy Ready", Duration::from_secs(120), async || {
        if let Ok(Some(status)) = container.child.try_wait() {
            panic!("the container exited: {status}");
        }
        let p = proxies.get("through-the-image").await.ok()?;
        let c = p.condition(condition::READY)?;
        (c.status == "True").then_some(())
    })
    .await;
    let proxy_ready = created.elapsed();
    let size = Command::new("podman")
        .args(["image", "inspect", "--format", "{{.Size}}", &image])
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .unwrap_or_default();
    eprintln!(
        "image {image}: {size} bytes; /readyz 200 after {ready_after:?} from podman run; \
         a Proxy Ready {proxy_ready:?} after its create"
    );
    // JSON logs, as the Deployment asks, and nothing about the read-only filesystem.
    let text = std::fs::read_to_string(&container.log).unwrap_or_default();
    assert!(text.lines().any(|l| l.starts_with('{')), "{text}");
    assert!(
        text.lines()
            .any(|l| l.contains("plugin pulled") && l.contains("sha256:")),
        "the plugin came from the registry: {text}"
    );
    assert!(!text.contains("Read-only file system"), "{text}");
    drop(real);
}
