//! Issue 30: plugins from an OCI registry, signed and reviewed, end to end. The real
//! operator under the Deployment's limits pulls the example plugin from the real
//! distribution registry (`docker-registry` on 127.0.0.1 over HTTPS), pushed and signed
//! with `proxy-operator plugin push|keygen|sign`. Then each bad new version (unsigned,
//! signed by another key, a tampered layer, a plugin asking for hosts the entry did not
//! approve) is refused with its reason while the verified version keeps serving its
//! Proxy; and with the registry gone, a restarted operator loads from its store.

use crate::support;

use super::harness::{Limits, Operator, fake_cluster, start_operator_limited, wait_for};
use egress_emulators::example::ExampleBackend;
use kube::api::{Api, PostParams};
use proxy_operator::api::{ProviderHealth, Proxy, condition};
use std::path::Path;
use std::process::Command;
use std::time::Duration;

/// `proxy-operator` with `args`; its stdout, or a panic with its stderr.
fn cli(args: &[&str]) -> String {
    let out = Command::new(env!("CARGO_BIN_EXE_proxy-operator"))
        .args(args)
        .env("RUST_LOG", "warn")
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "proxy-operator {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

/// `wasm` with a custom section appended: another plugin version (another digest) that
/// behaves the same.
fn variant(wasm: &[u8], name: &str) -> Vec<u8> {
    use support::bomb::leb;
    let mut content = Vec::new();
    leb(name.len() as u64, &mut content);
    content.extend_from_slice(name.as_bytes());
    let mut out = wasm.to_vec();
    out.push(0);
    leb(content.len() as u64, &mut out);
    out.extend_from_slice(&content);
    out
}

/// A Proxy on provider `ex`; its instance is 127.0.0.1 (the example backend), so `port` is
/// tinyproxy's and the health probe's CONNECT goes through it.
fn proxy(name: &str, port: u16) -> Proxy {
    serde_json::from_value(serde_json::json!({
        "apiVersion": "egress.proxy-operator.dev/v1alpha1",
        "kind": "Proxy",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {"provider": "ex", "placement": {"region": "r1"},
                 "cloudInit": {"inline": "#cloud-config\n"}, "port": port},
    }))
    .unwrap()
}

struct Setup<'a> {
    backend: &'a ExampleBackend,
    token: &'a Path,
    ca: &'a Path,
    key_a: String,
    approved: String,
}

impl Setup<'_> {
    /// The providers file with `ex` running `plugin`, verified with key A.
    fn file(&self, plugin: &str) -> String {
        let indent = |block: &str| {
            block
                .lines()
                .map(|l| format!("  {l}\n"))
                .collect::<String>()
        };
        format!(
            "verify:\n  publicKeys:\n  - |\n{key}providers:\n- name: ex\n  plugin: {plugin}\n  additionalHosts: ['{url}']\n  allowPrivateAddresses: true\n  \
             tls: {{caFile: {ca}}}\n  secrets: {{token: {secret}}}\n{approved}  config: {{endpoint: '{url}', regions: [r1]}}\n",
            key = self
                .key_a
                .lines()
                .map(|l| format!("    {l}\n"))
                .collect::<String>(),
            url = self.backend.url(),
            secret = self.token.display(),
            ca = self.ca.display(),
            approved = indent(&self.approved),
        )
    }
}

fn start(
    plugin_dir: &Path,
    providers: &Path,
    kubeconfig: &Path,
    dir: &Path,
    echo: u16,
) -> Option<Operator> {
    let store = dir.join("store");
    let auth = dir.join("no-credentials.json");
    start_operator_limited(
        plugin_dir,
        providers,
        kubeconfig,
        dir,
        &[
            "--probe-target",
            &format!("127.0.0.1:{echo}"),
            "--probe-interval",
            "300ms",
            "--plugin-store-dir",
            store.to_str().unwrap(),
            "--registry-auth-file",
            auth.to_str().unwrap(),
            "--plugin-pull-retry",
            "1s",
        ],
        &[],
        Limits::Deployment,
    )
}

/// The reload error counter of provider `ex` for `reason`.
async fn errors(op: &Operator, reason: &str) -> u64 {
    let (_, metrics) = op.get("/metrics").await;
    let prefix = format!(
        r#"proxy_operator_provider_reload_errors_total{{provider="ex",reason="{reason}"}} "#
    );
    metrics
        .lines()
        .find_map(|l| l.strip_prefix(&prefix))
        .map_or(0, |n| n.trim().parse().unwrap())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn registry_plugins_load_signed_and_approved_and_bad_versions_leave_the_verified_one_serving()
{
    let plugin_dir = plugins_or_skip!();
    let Some(mut registry) = support::registry::Registry::start().await else {
        return;
    };
    let Some(tinyproxy) = support::tinyproxy::tinyproxy_bin() else {
        return;
    };
    let (echo, _echo) = support::tinyproxy::echo_server().await;
    let tinyproxy =
        support::tinyproxy::Tinyproxy::start(&tinyproxy, &format!("ConnectPort {echo}")).await;
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let host = registry.host();
    let ca = registry.ca_file.clone();
    let ca_arg = ca.to_str().unwrap();
    let cache = d.join("cli-cache");
    let cache_arg = cache.to_str().unwrap();
    let repo = format!("oci://{host}/egress/example");

    // Push: v1 (tag), v2 (unsigned), v3 (signed by key B), v4 (signed, then tampered in
    // the registry's storage), and hetzner's plugin as a "new version" asking for a host
    // the entry never approved.
    let example = std::fs::read(plugin_dir.join("example.wasm")).unwrap();
    let push = |file: &Path, tag: &str| -> String {
        let out = cli(&[
            "plugin",
            "push",
            file.to_str().unwrap(),
            &format!("{repo}:{tag}"),
            "--ca-file",
            ca_arg,
            "--plugin-cache-dir",
            cache_arg,
        ]);
        let pinned = out.trim().to_string();
        assert!(
            pinned.starts_with(&format!("{repo}:{tag}@sha256:")),
            "{pinned}"
        );
        pinned
    };
    let mut refs = Vec::new();
    for (i, name) in ["v1", "v2", "v3", "v4"].iter().enumerate() {
        let file = d.join(format!("{name}.wasm"));
        let bytes = if i == 0 {
            example.clone()
        } else {
            variant(&example, name)
        };
        std::fs::write(&file, bytes).unwrap();
        refs.push(push(&file, name));
    }
    let hetzner = push(&plugin_dir.join("hetzner.wasm"), "hetzner");
    let digest = |r: &str| r.rsplit_once('@').unwrap().1.to_string();
    for who in ["a", "b"] {
        let out = cli(&["plugin", "keygen", d.join(who).to_str().unwrap()]);
        assert!(out.contains("keep it secret"), "{out}");
    }
    let mode = std::os::unix::fs::PermissionsExt::mode(
        &std::fs::metadata(d.join("a.key")).unwrap().permissions(),
    );
    assert_eq!(mode & 0o777, 0o600, "the private key is the owner's only");
    let sign = |reference: &str, who: &str| {
        let key = d.join(format!("{who}.key"));
        let out = cli(&[
            "plugin",
            "sign",
            reference,
            "--key",
            key.to_str().unwrap(),
            "--ca-file",
            ca_arg,
        ]);
        assert!(out.starts_with("signed "), "{out}");
    };
    // v1 is signed through its tag: the digest it resolves to is what is signed.
    sign(&format!("{repo}:v1"), "a");
    sign(&refs[2], "b");
    sign(&refs[3], "a");
    sign(&hetzner, "a");
    // The registry now serves v4's layer with one byte flipped (same size).
    let manifest: serde_json::Value =
        serde_json::from_slice(&std::fs::read(registry.blob_file(&digest(&refs[3]))).unwrap())
            .unwrap();
    let layer = registry.blob_file(manifest["layers"][0]["digest"].as_str().unwrap());
    let mut bytes = std::fs::read(&layer).unwrap();
    bytes[100] ^= 0xff;
    std::fs::write(&layer, bytes).unwrap();

    // The approval comes from `plugin inspect --approve` of the version reviewed.
    let approved = cli(&[
        "plugin",
        "inspect",
        &refs[0],
        "--approve",
        "--ca-file",
        ca_arg,
        "--plugin-cache-dir",
        cache_arg,
    ]);
    assert!(approved.starts_with("approved:\n"), "{approved}");
    assert!(
        approved.contains("wasi:http/outgoing-handler"),
        "{approved}"
    );

    let (_fake, client, kubeconfig) = fake_cluster(d).await;
    let token = d.join("token");
    std::fs::write(&token, "tok").unwrap();
    let backend = ExampleBackend::start("tok");
    // Two misbehaving registries next to the real one (the in-memory registry with a
    // fault each), trusted through one CA bundle: the running operator meets them too.
    let fault_ca = egress_emulators::tls::TestCa::new();
    let bundle = d.join("ca-bundle.pem");
    std::fs::write(
        &bundle,
        format!(
            "{}{}",
            std::fs::read_to_string(&ca).unwrap(),
            fault_ca.ca_pem()
        ),
    )
    .unwrap();
    let faulty: Vec<(egress_emulators::oci_registry::OciRegistry, String)> = [
        egress_emulators::oci_registry::Fault::Status(500),
        egress_emulators::oci_registry::Fault::TruncateBlob,
    ]
    .into_iter()
    .enumerate()
    .map(|(i, fault)| {
        let r = egress_emulators::oci_registry::OciRegistry::start(&fault_ca);
        // A layer of its own: the store already holds v1's, and would serve it without
        // asking (content by digest).
        let layer = variant(&example, &format!("fault-{i}"));
        let digest = r.put_plugin("egress/example", "v1", &layer);
        r.set_fault(fault);
        let reference = format!("oci://{}/egress/example@{digest}", r.host());
        (r, reference)
    })
    .collect();
    let setup = Setup {
        backend: &backend,
        token: &token,
        ca: &bundle,
        key_a: std::fs::read_to_string(d.join("a.pub")).unwrap(),
        approved,
    };
    // `plugin inspect` against the entry: the review and the signature, before install.
    let providers = d.join("providers.yaml");
    std::fs::write(&providers, setup.file(&hetzner)).unwrap();
    let review: serde_json::Value = serde_json::from_str(&cli(&[
        "plugin",
        "inspect",
        &hetzner,
        "--providers",
        providers.to_str().unwrap(),
        "--provider",
        "ex",
        "--plugin-cache-dir",
        cache_arg,
    ]))
    .unwrap();
    assert_eq!(review["review"]["loads"], false, "{review}");
    assert_eq!(
        review["review"]["hostsNotApproved"],
        serde_json::json!(["https://api.hetzner.cloud:443"]),
        "{review}"
    );
    assert!(
        review["signedBy"].as_str().unwrap().starts_with("sha256:"),
        "{review}"
    );

    // v1 by its tag: resolved once, pinned, shown.
    std::fs::write(&providers, setup.file(&format!("{repo}:v1"))).unwrap();
    let Some(op) = start(&plugin_dir, &providers, &kubeconfig, d, echo) else {
        return;
    };
    let proxies: Api<Proxy> = Api::namespaced(client.clone(), "default");
    proxies
        .create(&PostParams::default(), &proxy("p1", tinyproxy.addr.port()))
        .await
        .unwrap();
    // Ready: Running, and a real CONNECT through its proxy passed.
    let ready = async || {
        let p = proxies.get("p1").await.ok()?;
        (p.condition(condition::READY)?.status == "True").then_some(())
    };
    wait_for(
        "p1 Ready on the registry's v1",
        Duration::from_secs(90),
        ready,
    )
    .await;
    let health: Api<ProviderHealth> = Api::all(client.clone());
    let serving = async || health.get("ex").await.ok()?.status?.plugin;
    let shown = wait_for(
        "ProviderHealth to show the plugin",
        Duration::from_secs(30),
        async || serving().await,
    )
    .await;
    assert_eq!(shown, refs[0], "the tag is shown pinned to its digest");
    assert!(
        op.log()
            .contains("tag resolved; pinned to this digest from now on"),
        "{}",
        op.log()
    );

    // Each bad version is refused with its reason, and v1 serves on.
    let cases = [
        (&refs[1], "signature", "it is not signed"),
        (&refs[2], "signature", "a key not in verify.publicKeys"),
        (&refs[3], "pull", "does not match its digest"),
        (&faulty[0].1, "pull", "answered 500"),
        (&faulty[1].1, "pull", "cut short"),
        (
            &hetzner,
            "review",
            "default hosts not approved: https://api.hetzner.cloud:443",
        ),
    ];
    for (reference, reason, why) in cases {
        let before = errors(&op, reason).await;
        std::fs::write(&providers, setup.file(reference)).unwrap();
        let load_error = wait_for(
            &format!("{reference} to be refused ({reason})"),
            Duration::from_secs(60),
            async || {
                let status = health.get("ex").await.ok()?.status?;
                let e = status.load_error.filter(|e| e.contains(why))?;
                (errors(&op, reason).await > before).then_some(e)
            },
        )
        .await;
        assert!(load_error.contains("provider \"ex\""), "{load_error}");
        assert!(
            load_error.contains(reference.split('@').next().unwrap()),
            "names the reference: {load_error}"
        );
        let (code, readyz) = op.get("/readyz").await;
        assert_eq!(code, 200, "{readyz}");
        assert!(readyz.contains("provider ex failed to reload"), "{readyz}");
        assert_eq!(
            serving().await.as_deref(),
            Some(refs[0].as_str()),
            "v1 serves on"
        );
        assert!(ready().await.is_some(), "p1 stays Ready");
    }
    // A refused pull is tried again (registry fixed, key rotated...), not only on edits.
    let before = errors(&op, "signature").await;
    std::fs::write(&providers, setup.file(&refs[1])).unwrap();
    wait_for(
        "the unsigned version to be refused twice",
        Duration::from_secs(30),
        async || (errors(&op, "signature").await >= before + 2).then_some(()),
    )
    .await;

    // Back to v1 by digest; then the registry goes away, and a restarted operator loads
    // v1 from its store, its signature verified again offline.
    std::fs::write(&providers, setup.file(&refs[0])).unwrap();
    wait_for(
        "v1 by digest to load",
        Duration::from_secs(30),
        async || {
            let e = health.get("ex").await.ok()?.status?.load_error;
            e.is_none().then_some(())
        },
    )
    .await;
    drop(op);
    registry.stop();
    let Some(mut op) = start(&plugin_dir, &providers, &kubeconfig, d, echo) else {
        return;
    };
    wait_for(
        "/readyz with ex serving from the store",
        Duration::from_secs(60),
        async || {
            let (code, body) = op.get("/readyz").await;
            (code == 200 && body.contains("(ex)")).then_some(())
        },
    )
    .await;
    let log = op.log();
    assert!(
        log.lines()
            .any(|l| l.contains("plugin pulled") && l.contains("from_cache=true")),
        "{log}"
    );
    wait_for("p1 Ready after the restart", Duration::from_secs(30), ready).await;
    op.assert_alive("after loading from the store");
}

/// A registry that answers wrong, in every way the distribution API allows, gets a refusal
/// that names the reference and the reason, and nothing of it is kept as a plugin. The
/// in-memory registry of the emulators (HTTPS, faults on demand, token auth).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_misbehaving_registry_is_refused_by_name_and_leaves_nothing_in_the_store() {
    use egress_emulators::oci_registry::{Fault, OciRegistry};
    use egress_emulators::tls::TestCa;
    use proxy_operator::oci::store::{PullOptions, Store};

    let plugin_dir = plugins_or_skip!();
    let wasm = std::fs::read(plugin_dir.join("example.wasm")).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let ca = TestCa::new();
    let ca_file = ca.write_ca_file(dir.path()).unwrap();
    let tls = egress_plugin_host::plugin::tls_config(Some(&ca_file), false).unwrap();
    let registry = OciRegistry::start(&ca);
    let host = registry.host();
    let digest = registry.put_plugin("egress/ex", "v1", &wasm);
    let max = 8 << 20;

    // Each case pulls into a store of its own: `(reference, max bytes, auth file)`.
    let n = std::sync::atomic::AtomicU32::new(0);
    let pull = async |reference: &str, max_plugin_bytes: u64, auth: Option<&Path>| {
        let at = dir.path().join(format!(
            "store-{}",
            n.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
        ));
        let store = Store::open(&at).unwrap();
        let reference = egress_plugin_host::config::oci_ref::OciRef::parse(reference).unwrap();
        let opts = PullOptions {
            tls: tls.clone(),
            auth_file: auth,
            max_plugin_bytes,
            keys: None,
        };
        let got = store.fetch(&reference, &opts).await;
        let kept = std::fs::read_dir(at.join("plugins")).unwrap().count();
        (got, kept)
    };
    let by_digest = format!("oci://{host}/egress/ex@{digest}");
    let (ok, _) = pull(&by_digest, max, None).await;
    let ok = ok.unwrap();
    assert_eq!(
        std::fs::read(&ok.path).unwrap(),
        wasm,
        "the layer, byte for byte"
    );
    assert!(!ok.from_cache);

    let refused =
        async |reference: &str, max: u64, auth: Option<&Path>, reason: &str, why: &str| {
            let (got, kept) = pull(reference, max, auth).await;
            let e = got.expect_err(why);
            let message = e.to_string();
            assert!(
                message.contains(reference),
                "names the reference: {message}"
            );
            assert!(message.contains(why), "{why:?} in {message}");
            assert_eq!(e.reason(), reason, "{message}");
            assert_eq!(kept, 0, "no plugin kept after: {message}");
            message
        };
    let other = format!("oci://{host}/egress/ex@sha256:{}", "ab".repeat(32));
    refused(&other, max, None, "pull", "has no manifest").await;
    refused(
        &format!("oci://{host}/egress/ex:nope"),
        max,
        None,
        "pull",
        "(404)",
    )
    .await;
    refused(
        &by_digest,
        wasm.len() as u64 - 1,
        None,
        "pull",
        "more than the largest plugin",
    )
    .await;
    // A container image where a plugin was expected.
    let image = serde_json::to_vec(&serde_json::json!({
        "schemaVersion": 2, "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "config": {"mediaType": "application/vnd.oci.image.config.v1+json", "digest": digest, "size": 2},
        "layers": [{"mediaType": "application/vnd.oci.image.layer.v1.tar+gzip", "digest": digest, "size": 2}],
    }))
    .unwrap();
    let image_digest = registry.put_manifest(
        "egress/ex",
        "image",
        &image,
        "application/vnd.oci.image.manifest.v1+json",
    );
    refused(
        &format!("oci://{host}/egress/ex@{image_digest}"),
        max,
        None,
        "pull",
        "not a Wasm plugin",
    )
    .await;
    for (fault, why) in [
        (Fault::Status(500), "answered 500"),
        (Fault::BlobStatus(503), "answered 503 for blob"),
        (Fault::TamperBlob, "does not match its digest"),
        (Fault::TruncateBlob, "cut short"),
    ] {
        registry.set_fault(fault);
        refused(&by_digest, max, None, "pull", why).await;
    }
    registry.set_fault(Fault::None);

    // Token auth: none, wrong and right credentials; the password is in no message.
    let private = OciRegistry::start_with_auth(&ca, "robot", "s3cret-pw");
    let private_digest = private.put_plugin("egress/ex", "v1", &wasm);
    let reference = format!("oci://{}/egress/ex@{private_digest}", private.host());
    let auth = |password: &str| {
        let path = dir.path().join(format!("auth-{password}.json"));
        let b64 = data_encoding::BASE64.encode(format!("robot:{password}").as_bytes());
        std::fs::write(
            &path,
            format!(
                r#"{{"auths": {{"https://{}": {{"auth": "{b64}"}}}}}}"#,
                private.host()
            ),
        )
        .unwrap();
        path
    };
    let none = dir.path().join("missing.json");
    let m = refused(
        &reference,
        max,
        Some(&none),
        "pull",
        "no credentials for this registry",
    )
    .await;
    assert!(m.contains("401"), "{m}");
    let wrong = auth("wrong-pw");
    let m = refused(
        &reference,
        max,
        Some(&wrong),
        "pull",
        "refused the credentials",
    )
    .await;
    assert!(!m.contains("wrong-pw"), "{m}");
    let right = auth("s3cret-pw");
    let (ok, _) = pull(&reference, max, Some(&right)).await;
    assert_eq!(std::fs::read(ok.unwrap().path).unwrap(), wasm);
    assert!(
        private
            .requests()
            .iter()
            .any(|r| r.starts_with("GET /token")),
        "the token service was asked"
    );
}
