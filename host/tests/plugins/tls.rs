//! Per-provider TLS trust in the host's `wasi:http` (a plugin cannot do TLS itself): a
//! backend on a private network whose certificate a private CA signed, as a Proxmox host's
//! is, answers a plugin only when the providers file names that CA (`tls.caFile`). Without
//! it, or with another CA, the handshake fails, the backend never sees a request, and the
//! operator's log says why. `tls.insecureSkipTlsVerify: true`, and nothing shorter, turns
//! verification off, with a warning.

use crate::support;

use egress_emulators::example::ExampleBackend;
use egress_emulators::tls::TestCa;
use egress_plugin_host::provider::{CreateRequest, Placement, Provider};
use std::path::Path;

fn entry(backend: &ExampleBackend, token: &Path, tls: &str) -> String {
    format!(
        "name: lab\nplugin: example.wasm\nadditionalHosts: ['{url}']\nallowPrivateAddresses: true\n\
         secrets: {{token: {token}}}\ntls: {tls}\nconfig: {{endpoint: '{url}', regions: [r1]}}",
        url = backend.url(),
        token = token.display()
    )
}

fn request(uid: &str) -> CreateRequest {
    CreateRequest {
        proxy_name: "p1".into(),
        cloud_init: b"#cloud-config\n".to_vec(),
        ..CreateRequest::new(uid, "inst-a", Placement::new("r1", "z", "small", "img"))
    }
}

struct Lab {
    ca: TestCa,
    backend: ExampleBackend,
    dir: tempfile::TempDir,
}

impl Lab {
    fn start() -> Lab {
        let ca = TestCa::new();
        let backend = ExampleBackend::start_tls("tok", &ca);
        assert!(
            backend.url().starts_with("https://127.0.0.1:"),
            "{}",
            backend.url()
        );
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("token"), "tok").unwrap();
        Lab { ca, backend, dir }
    }

    fn entry(&self, tls: &str) -> String {
        entry(&self.backend, &self.dir.path().join("token"), tls)
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_private_ca_is_trusted_through_its_bundle() {
    let _dir = plugins_or_skip!();
    let lab = Lab::start();
    let ca_file = lab.ca.write_ca_file(lab.dir.path()).unwrap();
    let tls = format!("{{caFile: {}}}", ca_file.display());
    let p = support::provider(&support::runtime(), "example.wasm", &lab.entry(&tls)).await;

    let id = p.create(&request("uid-tls")).await.unwrap();
    assert_eq!(p.get(&id).await.unwrap().uid, "uid-tls");
    assert_eq!(
        lab.backend.instances().len(),
        1,
        "the create reached the backend over HTTPS"
    );
    p.delete(&id).await.unwrap();
}

/// The system roots do not know the private CA, and another private CA is no better: the
/// handshake fails before any byte of the request leaves, the call fails, and the log names
/// the provider and the fix.
// One thread: the capture records what this thread emits, the request task included.
#[tokio::test]
async fn without_its_ca_the_backend_is_refused_and_the_log_says_why() {
    let _dir = plugins_or_skip!();
    let lab = Lab::start();
    let other = TestCa::new();
    let other_dir = tempfile::tempdir().unwrap();
    let other_file = other.write_ca_file(other_dir.path()).unwrap();
    let rt = support::runtime();
    for tls in [
        "{}".to_string(),
        format!("{{caFile: {}}}", other_file.display()),
    ] {
        let (_guard, captured) = proxy_operator::testing::capture();
        let p = support::provider(&rt, "example.wasm", &lab.entry(&tls)).await;
        let before = lab.backend.requests().len();
        let err = p.create(&request("uid-untrusted")).await.expect_err(&tls);
        assert!(lab.backend.instances().is_empty(), "tls {tls}: {err}");
        assert_eq!(
            lab.backend.requests().len(),
            before,
            "tls {tls}: no request got through"
        );
        let log = captured.all_text();
        assert!(
            log.contains("TLS handshake with the backend failed")
                && log.contains("tls.caFile")
                && log.contains("lab"),
            "tls {tls}: the log names the provider and the fix:\n{log}"
        );
    }
}

// One thread: the capture records what this thread emits, the request task included.
#[tokio::test]
async fn only_the_named_insecure_switch_turns_verification_off_and_it_warns() {
    let _dir = plugins_or_skip!();
    let lab = Lab::start();
    let rt = support::runtime();
    let (_guard, captured) = proxy_operator::testing::capture();
    let p = support::provider(
        &rt,
        "example.wasm",
        &lab.entry("{insecureSkipTlsVerify: true}"),
    )
    .await;
    let log = captured.all_text();
    assert!(
        log.contains("tls.insecureSkipTlsVerify is on: backend certificates are NOT verified")
            && log.contains("lab"),
        "a warning at load names the provider:\n{log}"
    );
    p.create(&request("uid-insecure")).await.unwrap();
    assert_eq!(lab.backend.instances().len(), 1);

    // Look-alikes are config errors, not a quiet "off".
    for tls in [
        "{insecure: true}",
        "{skipVerify: true}",
        "{insecureSkipTlsVerify: 1}",
    ] {
        let file = format!("providers:\n- {}", lab.entry(tls).replace('\n', "\n  "));
        let err = egress_plugin_host::config::ProvidersFile::parse(&file).expect_err(tls);
        assert!(err.to_string().contains("tls"), "{tls}: {err}");
    }
}
