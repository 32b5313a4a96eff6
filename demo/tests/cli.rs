//! The driver's own checks, before it starts anything: what is missing is named.

use std::process::Command;

fn demo() -> Command {
    Command::new(env!("CARGO_BIN_EXE_egress-demo"))
}

fn root() -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap()
        .to_path_buf()
}

#[test]
fn a_missing_operator_binary_is_named_and_nothing_starts() {
    let work = std::env::temp_dir().join(format!("egress-demo-cli-{}", std::process::id()));
    let out = demo()
        .current_dir(root())
        .args(["--operator-bin", "/nonexistent/proxy-operator"])
        .args(["--plugin-dir", "/nonexistent/plugins"])
        .arg("--workdir")
        .arg(&work)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(
        stderr.contains("/nonexistent/proxy-operator") && stderr.contains("does not exist"),
        "{stderr}"
    );
    assert!(!work.exists(), "nothing is written before the checks pass");
}

#[test]
fn samples_with_a_bad_port_are_refused_naming_the_proxy() {
    let dir = std::env::temp_dir().join(format!("egress-demo-samples-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let good = std::fs::read_to_string(root().join("config/samples/demo/proxies.yaml")).unwrap();
    std::fs::write(
        dir.join("proxies.yaml"),
        good.replace("port: 31282", "port: 70000"),
    )
    .unwrap();
    std::fs::copy(
        root().join("config/samples/demo/proxy-edit.yaml"),
        dir.join("proxy-edit.yaml"),
    )
    .unwrap();
    let out = demo()
        .arg("--samples")
        .arg(&dir)
        .args(["--plugin-dir", "/nonexistent/plugins"])
        .output()
        .unwrap();
    let _ = std::fs::remove_dir_all(&dir);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(
        stderr.contains("demo/ec2-eu-west-1") && stderr.contains("spec.port is 70000"),
        "{stderr}"
    );
}
