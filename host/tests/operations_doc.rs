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

    let mut sample_applied = false;
    for cmd in &cmds {
        if cmd.starts_with("kubectl describe proxy") && !sample_applied {
            // The troubleshooting commands need a Proxy to look at.
            let sample = root().join("config/samples/proxy_hetzner.yaml");
            run(
                &format!("kubectl apply --server-side -f {}", sample.display()),
                &kubeconfig,
            );
            sample_applied = true;
        }
        let filled = cmd
            .replace("...", "not-a-real-secret")
            .replace(
                "config/release",
                &config.join("release").display().to_string(),
            )
            .replace("NAME -n NAMESPACE", &sample_name());
        println!("$ {filled}");
        run(&filled, &kubeconfig);
    }
    assert!(sample_applied, "no `kubectl describe proxy` command found");

    // What the install did: the plugins ConfigMap holds the built plugins, byte for byte.
    let cm = fake
        .object(
            "configmaps",
            Some("egress-system"),
            "proxy-operator-plugins",
        )
        .expect("the plugins ConfigMap was applied");
    let plugins = cm["binaryData"].as_object().cloned().unwrap_or_default();
    assert!(
        plugins.contains_key("hetzner.wasm") && plugins.contains_key("ec2.wasm"),
        "plugins in the ConfigMap: {:?}",
        plugins.keys().collect::<Vec<_>>()
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
fn run(cmd: &str, kubeconfig: &Path) {
    let mut c = Command::new("bash");
    c.args(["-c", cmd])
        .current_dir(root())
        .env("KUBECONFIG", kubeconfig);
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
