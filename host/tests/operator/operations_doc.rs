//! Every command in docs/operations.md, run as written against an API server: the
//! in-memory one (fake-kube) served on 127.0.0.1, with a real kubectl and the real
//! `cargo xtask build-plugins`. Placeholders are filled in (`...` with a dummy secret
//! value, `NAME`/`NAMESPACE` with the sample Proxy the test applies), and `config/release`
//! points at a copy of `config/` so the repository is not written to. A doc edit that
//! breaks a command fails here.
//!
//! Needs kubectl; without it the test is skipped loudly, under `CI=true` it fails.

use fake_kube::FakeApi;
use std::path::{Path, PathBuf};
use std::process::Command;

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// The shell commands of the ```sh blocks, continuation lines joined.
fn commands(markdown: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut in_sh = false;
    let mut current = String::new();
    for line in markdown.lines() {
        let t = line.trim_end();
        if !in_sh {
            in_sh = t == "```sh";
            continue;
        }
        if t == "```" {
            in_sh = false;
            continue;
        }
        match t.strip_suffix('\\') {
            Some(part) => current.push_str(part),
            None => {
                current.push_str(t);
                let cmd = current.trim().to_string();
                if !cmd.is_empty() && !cmd.starts_with('#') {
                    out.push(cmd);
                }
                current.clear();
            }
        }
    }
    out
}

fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for e in std::fs::read_dir(from).unwrap().flatten() {
        let p = e.path();
        if p.is_dir() {
            copy_dir(&p, &to.join(e.file_name()));
        } else {
            std::fs::copy(&p, to.join(e.file_name())).unwrap();
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_command_in_operations_md_runs() {
    if Command::new("kubectl")
        .args(["version", "--client"])
        .output()
        .is_err()
    {
        let msg = "kubectl is not installed: docs/operations.md's commands are not run";
        if std::env::var("CI").is_ok_and(|v| v == "true") {
            panic!("{msg}");
        }
        eprintln!("\n!!! SKIPPING: {msg}\n");
        return;
    }
    let doc = std::fs::read_to_string(root().join("docs/operations.md")).unwrap();
    let cmds = commands(&doc);
    assert!(cmds.len() >= 6, "too few commands found: {cmds:?}");

    let fake = FakeApi::new();
    let addr = fake.serve("127.0.0.1:0").await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let kubeconfig = dir.path().join("kubeconfig");
    fake.write_kubeconfig(addr, &kubeconfig).unwrap();
    let config = dir.path().join("config");
    copy_dir(&root().join("config"), &config);
    let _ = std::fs::remove_file(config.join("release/plugins.yaml"));
    let _ = std::fs::remove_file(config.join("release/plugins-volume.yaml"));
    let _ = std::fs::remove_file(config.join("release/image.yaml"));

    // The registry the install pushes the image and the plugins to: the distribution
    // registry on 127.0.0.1 in place of `registry.example.com`, trusted through its CA.
    let Some(registry) = crate::support::registry::Registry::start().await else {
        return;
    };
    if Command::new("podman").arg("--version").output().is_err() {
        let msg = "podman is not installed: docs/operations.md's image push is not run";
        assert!(std::env::var("CI").as_deref() != Ok("true"), "{msg}");
        eprintln!("\n!!! SKIPPING: {msg}\n");
        return;
    }
    let certs = dir.path().join("certs");
    std::fs::create_dir_all(&certs).unwrap();
    std::fs::copy(&registry.ca_file, certs.join("ca.crt")).unwrap();
    let keys = dir.path().join("keys");
    std::fs::create_dir_all(&keys).unwrap();
    let bin_dir = Path::new(env!("CARGO_BIN_EXE_proxy-operator"))
        .parent()
        .unwrap()
        .to_path_buf();
    let path = format!(
        "{}:{}",
        bin_dir.display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let release = config.join("release");

    let mut sample_applied = false;
    for cmd in &cmds {
        if cmd.starts_with("kubectl describe proxy") && !sample_applied {
            // The troubleshooting commands need a Proxy to look at.
            let sample = root().join("config/samples/proxy_hetzner.yaml");
            run(
                &format!("kubectl apply --server-side -f {}", sample.display()),
                &kubeconfig,
                &path,
            );
            sample_applied = true;
        }
        // A trailing comment would swallow the arguments added below.
        let cmd = cmd.split(" #").next().unwrap_or_default();
        let mut filled = cmd
            .replace("...", "not-a-real-secret")
            .replace("config/release", &release.display().to_string())
            .replace("NAME -n NAMESPACE", &sample_name())
            .replace("registry.example.com", &registry.host())
            .replace(
                "keygen release",
                &format!("keygen {}/release", keys.display()),
            )
            .replace("release.key", &format!("{}/release.key", keys.display()));
        if cmd.starts_with("cargo xtask image --push") {
            filled += &format!(
                " --cert-dir {} --release-patch {}/image.yaml",
                certs.display(),
                release.display()
            );
        }
        if cmd.starts_with("cargo xtask build-plugins --push") {
            filled += &format!(" --ca-file {}", registry.ca_file.display());
        }
        println!("$ {filled}");
        run(&filled, &kubeconfig, &path);
    }
    assert!(sample_applied, "no `kubectl describe proxy` command found");

    // What the install did: one ConfigMap per built plugin, holding it byte for byte, all
    // projected into the plugin directory, and no empty placeholder beside them.
    let plugin_dir = std::env::var_os("EGRESS_PLUGIN_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            std::env::var_os("CARGO_TARGET_DIR")
                .map(PathBuf::from)
                .unwrap_or_else(|| root().join("target"))
                .join("plugins")
        });
    let mut deployed = Vec::new();
    for cm in fake.objects("configmaps") {
        if cm["metadata"]["labels"]["app.kubernetes.io/component"] != "plugin" {
            continue;
        }
        assert_eq!(cm["metadata"]["namespace"], "egress-system", "{cm}");
        let data = cm["binaryData"].as_object().cloned().unwrap_or_default();
        assert_eq!(data.len(), 1, "one plugin per ConfigMap: {:?}", data.keys());
        let (file, b64) = data.iter().next().unwrap();
        let bytes = data_encoding::BASE64
            .decode(b64.as_str().unwrap().as_bytes())
            .unwrap();
        let built = std::fs::read(plugin_dir.join(file)).unwrap();
        assert!(
            bytes == built,
            "{file} in its ConfigMap is not the built plugin"
        );
        deployed.push(cm["metadata"]["name"].as_str().unwrap().to_string());
    }
    deployed.sort();
    for plugin in ["hetzner", "ec2"] {
        let name = format!("proxy-operator-plugin-{plugin}");
        assert!(deployed.contains(&name), "{name} not applied: {deployed:?}");
    }
    assert!(
        fake.object(
            "configmaps",
            Some("egress-system"),
            "proxy-operator-plugins"
        )
        .is_none(),
        "the empty placeholder was applied beside the plugins"
    );
    let deployment = fake
        .object("deployments", Some("egress-system"), "proxy-operator")
        .expect("the Deployment was applied");
    let volumes = deployment["spec"]["template"]["spec"]["volumes"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    let plugins = volumes
        .iter()
        .find(|v| v["name"] == "plugins")
        .expect("the plugins volume");
    let mut projected: Vec<String> = plugins["projected"]["sources"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|s| {
            s["configMap"]["name"]
                .as_str()
                .unwrap_or_default()
                .to_string()
        })
        .collect();
    projected.sort();
    assert_eq!(
        projected, deployed,
        "the volume projects every plugin ConfigMap"
    );
    // The image the install pushed, by digest; the plugins pushed and signed.
    let image = deployment["spec"]["template"]["spec"]["containers"][0]["image"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    assert!(
        image.starts_with(&format!(
            "{}/egress/proxy-operator@sha256:",
            registry.host()
        )),
        "the Deployment runs the pushed image by digest: {image}"
    );
    assert!(
        keys.join("release.pub").is_file(),
        "plugin keygen wrote the public key"
    );
    let blobs = registry
        .dir()
        .join("data/docker/registry/v2/repositories/egress");
    for plugin in ["hetzner", "ec2"] {
        let signatures = blobs.join(format!("{plugin}/_manifests/tags"));
        let tags: Vec<String> = std::fs::read_dir(&signatures)
            .map(|rd| {
                rd.flatten()
                    .map(|e| e.file_name().to_string_lossy().into_owned())
                    .collect()
            })
            .unwrap_or_default();
        assert!(
            tags.iter().any(|t| t.ends_with(".sig")),
            "{plugin} pushed and signed: {tags:?}"
        );
    }
    assert!(
        fake.object("secrets", Some("egress-system"), "proxy-operator-registry")
            .is_some(),
        "the registry credentials Secret"
    );
    for kind in ["deployments", "services", "clusterroles", "serviceaccounts"] {
        assert!(!fake.objects(kind).is_empty(), "no {kind} applied");
    }
    assert!(
        fake.object("secrets", Some("egress-system"), "proxy-operator-aws")
            .is_some()
    );
}

/// `NAME -n NAMESPACE` of the sample Proxy the troubleshooting commands look at.
fn sample_name() -> String {
    let text = std::fs::read_to_string(root().join("config/samples/proxy_hetzner.yaml")).unwrap();
    let doc: serde_json::Value = serde_yaml::from_str(&text).unwrap();
    format!(
        "{} -n {}",
        doc["metadata"]["name"].as_str().unwrap(),
        doc["metadata"]["namespace"].as_str().unwrap_or("default")
    )
}

/// Runs one documented command with bash (the way a reader pastes it), from the repository
/// root, against the in-memory API server.
fn run(cmd: &str, kubeconfig: &Path, path: &str) {
    let mut c = Command::new("bash");
    c.args(["-c", cmd])
        .current_dir(root())
        .env("KUBECONFIG", kubeconfig)
        .env("PATH", path);
    // `cargo xtask build-plugins` builds into the same target dir as this test.
    if std::env::var_os("CARGO_TARGET_DIR").is_none() {
        let exe = std::env::current_exe().unwrap();
        if let Some(target) = exe.ancestors().nth(3) {
            c.env("CARGO_TARGET_DIR", target);
        }
    }
    let out = c.output().unwrap();
    assert!(
        out.status.success(),
        "`{cmd}` failed ({}):\n{}{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}
