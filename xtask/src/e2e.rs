//! `cargo xtask e2e`: the operator against a real Kubernetes cluster, the current kube
//! context (kind or k3d), with the Hetzner plugin talking to the Hetzner emulator.
//!
//! The operator runs as a process on this machine (out of cluster, with the kubeconfig's
//! credentials), next to the emulator and a tinyproxy on 127.0.0.1, so no image has to be
//! built or loaded into the cluster. Everything Kubernetes-side is real: CRDs, the API
//! server's validation, watches, finalizers, server-side apply, Leases, TokenReview and
//! SubjectAccessReview.
//!
//! Checks, in order: the CRDs install; a Proxy gets an instance (Provisioned) and becomes
//! Ready through a real CONNECT probe; the discovery API refuses a caller without a token
//! and lists the Proxy for a ServiceAccount allowed to list proxies in its namespace; a
//! spec change replaces the instance (new one Ready, old one deleted); orphan GC deletes a
//! planted orphan of this installation and leaves a foreign and an unmarked instance
//! alone; deleting the Proxy deletes its instance and releases the finalizer.
//!
//! The emulator gives instances documentation addresses nobody listens on, so until it
//! can run a real proxy per instance, the test points each new instance's address at the
//! local tinyproxy through the emulator's control surface (`/_emulator/address`).
//!
//! With no reachable cluster it prints why and exits successfully (skipped), unless
//! `--require-cluster` (or `E2E_REQUIRE_CLUSTER=true`) asks for a failure instead.

use anyhow::{Context, Result, bail, ensure};
use serde_json::{Value, json};
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant, SystemTime};

#[derive(clap::Args)]
pub struct Args {
    /// Fail instead of skipping when no cluster is reachable.
    #[arg(long, env = "E2E_REQUIRE_CLUSTER")]
    pub require_cluster: bool,
    /// Allow a kube context whose name does not start with `kind-` or `k3d-` (the run
    /// installs CRDs and creates and deletes a namespace there).
    #[arg(long)]
    pub any_context: bool,
    /// Serve the discovery API without auth and skip the token checks (for API servers
    /// without the TokenRequest API).
    #[arg(long)]
    pub discovery_insecure_no_auth: bool,
    /// Leave the test namespace (and the CRDs, if this run installed them) behind.
    #[arg(long)]
    pub keep: bool,
    /// How long to wait for each step.
    #[arg(long, default_value = "120s", value_parser = parse_secs)]
    pub step_timeout: Duration,
    /// Use this kubeconfig instead of the default one (`KUBECONFIG` or ~/.kube/config).
    #[arg(long)]
    pub kubeconfig: Option<PathBuf>,
    /// Run against a fresh in-memory API server (fake-kube) instead of a cluster, with
    /// discovery auth off (what `cargo xtask test` does).
    #[arg(long, conflicts_with_all = ["kubeconfig", "any_context"])]
    pub fake_kube: bool,
}

/// The kubeconfig every kubectl call and the operator use, when not the default.
static KUBECONFIG: std::sync::OnceLock<Option<PathBuf>> = std::sync::OnceLock::new();

fn with_kubeconfig(cmd: &mut Command) -> &mut Command {
    if let Some(Some(path)) = KUBECONFIG.get() {
        cmd.env("KUBECONFIG", path);
    }
    cmd
}

/// The whole scenario against the in-memory API server (`fake-kube`'s `serve` example,
/// built by `cargo test --workspace`), as `cargo xtask test` runs it: it checks the e2e
/// flow itself and the operator's wiring on every CI run, where no cluster exists. What a
/// real cluster adds (its admission, RBAC, TokenRequest) needs `cargo xtask e2e`.
pub fn run_against_fake_kube(target_dir: &Path) -> Result<()> {
    let serve = target_dir.join("debug").join("examples").join("serve");
    ensure!(
        serve.is_file(),
        "{} is missing (built by `cargo test --workspace`)",
        serve.display()
    );
    let dir = target_dir.join("e2e");
    std::fs::create_dir_all(&dir)?;
    let kubeconfig = dir.join(format!("fake-kube-{}.kubeconfig", std::process::id()));
    let mut server = Command::new(&serve)
        .arg(&kubeconfig)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .with_context(|| format!("starting {}", serve.display()))?;
    let mut lines = BufReader::new(server.stdout.take().context("fake-kube stdout")?).lines();
    let started = lines.next();
    std::thread::spawn(move || for _ in lines {});
    let result = match started {
        Some(Ok(line)) if line.contains("serving on") => run(&Args {
            require_cluster: true,
            any_context: true,
            // fake-kube has no ServiceAccounts or TokenRequest.
            discovery_insecure_no_auth: true,
            keep: false,
            step_timeout: Duration::from_secs(60),
            kubeconfig: Some(kubeconfig.clone()),
            fake_kube: false,
        }),
        other => Err(anyhow::anyhow!("fake-kube did not start: {other:?}")),
    };
    let _ = server.kill();
    let _ = server.wait();
    let _ = std::fs::remove_file(&kubeconfig);
    result
}

fn parse_secs(s: &str) -> Result<Duration, String> {
    s.strip_suffix('s')
        .and_then(|n| n.parse::<u64>().ok())
        .map(Duration::from_secs)
        .ok_or_else(|| format!("{s:?} is not a number of seconds like 120s"))
}

const PROVIDER: &str = "hetzner-e2e";
const EMULATOR_TOKEN: &str = "emulator-token";
const CRD_DIR: &str = "config/crd";
const CRDS: &[&str] = &[
    "proxies.egress.proxy-operator.dev",
    "providerhealths.egress.proxy-operator.dev",
];

pub fn run(args: &Args) -> Result<()> {
    if args.fake_kube {
        let ws = crate::workspace()?;
        run_checked(crate::cargo().current_dir(&ws.root).args([
            "build",
            "--workspace",
            "--exclude",
            "broken",
            "--example",
            "serve",
        ]))?;
        return run_against_fake_kube(&ws.target_dir);
    }
    if KUBECONFIG.set(args.kubeconfig.clone()).is_err() {
        ensure!(
            KUBECONFIG.get() == Some(&args.kubeconfig),
            "one e2e run per process"
        );
    }
    let context = match kubectl(&["config", "current-context"]) {
        Ok(c) => c.trim().to_string(),
        Err(e) => return skip(args, &format!("no current kube context ({e:#})")),
    };
    if let Err(e) = kubectl(&["get", "--raw", "/version", "--request-timeout=5s"]) {
        return skip(
            args,
            &format!("the current kube context {context:?} does not answer ({e:#})"),
        );
    }
    if !args.any_context && !context.starts_with("kind-") && !context.starts_with("k3d-") {
        bail!(
            "refusing to run against kube context {context:?}: the e2e installs CRDs and \
             creates and deletes a namespace; use a kind or k3d cluster, or pass --any-context"
        );
    }
    println!("e2e against kube context {context}");

    // What runs locally: plugins, the operator and the emulator.
    crate::build_plugins::run(&crate::build_plugins::Args::default())?;
    let ws = crate::workspace()?;
    run_checked(crate::cargo().current_dir(&ws.root).args([
        "build",
        "--workspace",
        "--exclude",
        "broken",
        "--bin",
        "proxy-operator",
        "--example",
        "emulator",
    ]))?;
    let bin = ws.target_dir.join("debug");
    let stamp = SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)?
        .as_secs();
    let run_id = format!("e2e-{stamp}-{}", std::process::id());
    let work = ws.target_dir.join("e2e").join(&run_id);
    std::fs::create_dir_all(&work).with_context(|| format!("creating {}", work.display()))?;

    let mut env = Env {
        children: Vec::new(),
        namespace: run_id.clone(),
        installed_crds: false,
        keep: args.keep,
        timeout: args.step_timeout,
        work: work.clone(),
    };
    let result = env.scenario(args, &ws.root, &bin, &ws.target_dir.join("plugins"));
    env.cleanup();
    match &result {
        Ok(()) => println!("e2e passed (logs in {})", work.display()),
        Err(_) => eprintln!(
            "e2e failed; operator log: {}",
            work.join("operator.log").display()
        ),
    }
    result
}

fn skip(args: &Args, why: &str) -> Result<()> {
    if args.require_cluster {
        bail!("no Kubernetes cluster to run the e2e against: {why}");
    }
    println!(
        "\n!!! SKIPPED cargo xtask e2e: {why}.\n!!! It needs a reachable cluster in the current \
         kube context (e.g. `kind create cluster`); nothing was run.\n"
    );
    Ok(())
}

struct Env {
    children: Vec<(String, Child)>,
    namespace: String,
    installed_crds: bool,
    keep: bool,
    timeout: Duration,
    work: PathBuf,
}

impl Env {
    fn scenario(&mut self, args: &Args, root: &Path, bin: &Path, plugins: &Path) -> Result<()> {
        let ns = self.namespace.clone();
        let installation = format!("inst-{ns}");

        // Backend, a CONNECT target and a forward proxy, all on 127.0.0.1.
        let emulator = self.start_emulator(bin)?;
        println!("ok    Hetzner emulator at {emulator}");
        let target = connect_target()?;
        let proxy_port = self.start_tinyproxy(target.port())?;
        println!("ok    tinyproxy on 127.0.0.1:{proxy_port}, CONNECT target {target}");

        // CRDs: install unless present (a cluster that runs the operator already has them).
        let present = kubectl(&["get", "crd", CRDS[0], "--ignore-not-found", "-o", "name"])?;
        if present.trim().is_empty() {
            kubectl(&[
                "apply",
                "--server-side",
                "-k",
                &root.join(CRD_DIR).display().to_string(),
            ])
            .context("installing the CRDs")?;
            self.installed_crds = true;
        }
        let mut wait = vec!["wait", "--for=condition=Established", "--timeout=60s"];
        let crds: Vec<String> = CRDS.iter().map(|c| format!("crd/{c}")).collect();
        wait.extend(crds.iter().map(String::as_str));
        kubectl(&wait)?;
        println!("ok    CRDs established");
        kubectl(&["create", "namespace", &ns])?;

        // The operator, out of cluster.
        let token_file = self.work.join("hetzner-token");
        std::fs::write(&token_file, EMULATOR_TOKEN)?;
        let providers = self.work.join("providers.yaml");
        std::fs::write(
            &providers,
            format!(
                "providers:\n  - name: {PROVIDER}\n    plugin: hetzner.wasm\n    \
                 additionalHosts: ['{emulator}']\n    allowPrivateAddresses: true\n    secrets:\n      token: {}\n    \
                 config:\n      endpoint: '{emulator}/v1'\n      locations: [fsn1, nbg1]\n      \
                 serverTypes: [cpx11, cx23]\n      images: {{ubuntu: ubuntu-24.04}}\n",
                token_file.display()
            ),
        )?;
        let listen = free_port()?;
        let mut op = Command::new(bin.join("proxy-operator"));
        with_kubeconfig(&mut op)
            .arg("run")
            .arg("--plugin-dir")
            .arg(plugins)
            .arg("--providers")
            .arg(&providers)
            .arg("--plugin-cache-dir")
            .arg(self.work.join("cache"))
            .arg("--plugin-scratch-dir")
            .arg(self.work.join("calls"))
            .args(["--listen", &listen.to_string()])
            .args(["--namespace", &ns, "--installation", &installation])
            .args(["--pod-name", "e2e-operator"])
            .args([
                "--leader-election=true",
                "--lease-duration=4s",
                "--lease-renew=1s",
            ])
            .args([
                "--provisioning-poll=1s",
                "--deletion-poll=1s",
                "--drift-poll=5s",
            ])
            .args(["--requeue-now=1s", "--quota-retry=5s", "--input-retry=2s"])
            .args(["--probe-interval=1s", "--probe-timeout=2s"])
            .args(["--probe-target", &target.to_string()])
            .args(["--gc-interval=2s", "--gc-min-age=0s"])
            .args(["--provider-check-interval=3s", "--reload-interval=5s"]);
        if args.discovery_insecure_no_auth {
            op.arg("--discovery-insecure-no-auth");
        }
        let log = std::fs::File::create(self.work.join("operator.log"))?;
        op.stdout(log.try_clone()?).stderr(log);
        self.spawn("operator", op)?;
        self.until("the operator's /healthz", || {
            Ok(http(listen, "GET", "/healthz", None, None).is_ok_and(|(s, _)| s == 200))
        })?;
        println!("ok    operator serving on {listen}");

        // Create: Provisioned, then Ready through a real CONNECT.
        let name = "e2e-proxy";
        kubectl_stdin(
            &["apply", "--server-side", "-n", &ns, "-f", "-"],
            &proxy_yaml(name, "fsn1", proxy_port),
        )?;
        let id1 = self.until_ready(&emulator, &ns, name, None)?;
        println!("ok    created and Ready (instance {id1})");

        // Discovery API.
        self.check_discovery(args, listen, &ns, name, proxy_port)?;

        // Replace: a spec change makes a new instance; the old one goes.
        kubectl(&[
            "patch",
            "proxy",
            name,
            "-n",
            &ns,
            "--type=merge",
            "-p",
            r#"{"spec":{"placement":{"region":"nbg1"}}}"#,
        ])?;
        let id2 = self.until_ready(&emulator, &ns, name, Some(&id1))?;
        self.until(&format!("the old instance {id1} deleted"), || {
            Ok(!dump(&emulator)?.iter().any(|i| i["id"] == id1.as_str()))
        })?;
        println!("ok    replaced: instance {id1} -> {id2}, old one deleted");

        // GC: an orphan of this installation goes; a foreign and an unmarked one stay.
        let old = SystemTime::now()
            .duration_since(SystemTime::UNIX_EPOCH)?
            .as_secs()
            - 3600;
        let plant = |n: &str, managed: bool, inst: Option<&str>| -> Result<String> {
            let (status, body) = http(
                addr_of(&emulator)?,
                "POST",
                "/_emulator/plant",
                Some(
                    &json!({"name": n, "scope": "fsn1", "managed": managed,
                             "uid": "00000000-0000-0000-0000-00000000dead",
                             "installation": inst, "created_at": old})
                    .to_string(),
                ),
                None,
            )?;
            ensure!(status == 200, "planting {n}: {status} {body}");
            let v: Value = serde_json::from_str(&body)?;
            Ok(v["id"].as_str().unwrap_or_default().to_string())
        };
        let orphan = plant("e2e-orphan", true, Some(&installation))?;
        let foreign = plant("e2e-foreign", true, Some("some-other-installation"))?;
        let unmarked = plant("e2e-unmarked", false, None)?;
        self.until("GC to delete the orphan", || {
            Ok(!dump(&emulator)?.iter().any(|i| i["id"] == orphan.as_str()))
        })?;
        // Two more sweeps' worth of time: the others must still be there.
        std::thread::sleep(Duration::from_secs(5));
        let left = dump(&emulator)?;
        for (what, id) in [("foreign", &foreign), ("unmarked", &unmarked)] {
            ensure!(
                left.iter().any(|i| i["id"] == id.as_str()),
                "GC deleted the {what} instance {id}"
            );
        }
        println!("ok    GC deleted the orphan {orphan}, kept foreign and unmarked instances");

        // Delete: the instance goes, then the finalizer and the object.
        let uid = kubectl(&[
            "get",
            "proxy",
            name,
            "-n",
            &ns,
            "-o",
            "jsonpath={.metadata.uid}",
        ])?;
        kubectl(&[
            "delete",
            "proxy",
            name,
            "-n",
            &ns,
            "--wait=true",
            "--timeout=120s",
        ])?;
        ensure!(
            !dump(&emulator)?
                .iter()
                .any(|i| has_label_value(i, uid.trim())),
            "the Proxy is gone but its instance is still in the backend"
        );
        println!("ok    deleted: instance gone, finalizer released");

        // Provider health was published for the provider.
        let ph = kubectl(&["get", "providerhealth", PROVIDER, "-o", "json"])?;
        let ph: Value = serde_json::from_str(&ph)?;
        ensure!(
            ph["status"]["targets"]
                .as_array()
                .is_some_and(|t| !t.is_empty()),
            "ProviderHealth {PROVIDER} has no targets: {ph}"
        );
        println!("ok    ProviderHealth {PROVIDER} published");
        Ok(())
    }

    /// Waits until the Proxy has an instance other than `previous`, points it at the local
    /// tinyproxy, and waits until the Proxy is Ready with that address. Returns its ID.
    fn until_ready(
        &self,
        emulator: &str,
        ns: &str,
        name: &str,
        previous: Option<&str>,
    ) -> Result<String> {
        let mut id = String::new();
        self.until(&format!("{name} provisioned"), || {
            let p = get_proxy(ns, name)?;
            let uid = p["metadata"]["uid"]
                .as_str()
                .unwrap_or_default()
                .to_string();
            let found = dump(emulator)?.into_iter().find(|i| {
                has_label_value(i, &uid) && Some(i["id"].as_str().unwrap_or("")) != previous
            });
            match found {
                Some(i) => {
                    id = i["id"].as_str().unwrap_or_default().to_string();
                    Ok(true)
                }
                None => Ok(false),
            }
        })?;
        // Until the emulator runs real proxies: the instance's address is our tinyproxy.
        let (status, body) = http(
            addr_of(emulator)?,
            "POST",
            "/_emulator/address",
            Some(&json!({"id": id, "ip": "127.0.0.1"}).to_string()),
            None,
        )?;
        ensure!(
            (200..300).contains(&status),
            "setting the address of {id}: {status} {body}"
        );
        self.until(&format!("{name} Ready on instance {id}"), || {
            let p = get_proxy(ns, name)?;
            let ready = p["status"]["conditions"]
                .as_array()
                .into_iter()
                .flatten()
                .any(|c| c["type"] == "Ready" && c["status"] == "True");
            Ok(ready
                && p["status"]["ip"] == "127.0.0.1"
                && p["status"]["providerID"]
                    .as_str()
                    .is_some_and(|pid| pid.contains(id.as_str())))
        })?;
        Ok(id)
    }

    fn check_discovery(
        &self,
        args: &Args,
        listen: SocketAddr,
        ns: &str,
        name: &str,
        port: u16,
    ) -> Result<()> {
        let path = format!("/v1/proxies?namespace={ns}");
        let token = if args.discovery_insecure_no_auth {
            None
        } else {
            let (status, _) = http(listen, "GET", &path, None, None)?;
            ensure!(
                status == 401,
                "discovery without a token answered {status}, want 401"
            );
            kubectl(&["create", "serviceaccount", "e2e-reader", "-n", ns])?;
            kubectl(&[
                "create",
                "role",
                "e2e-reader",
                "-n",
                ns,
                "--verb=get,list",
                "--resource=proxies.egress.proxy-operator.dev",
            ])?;
            kubectl(&[
                "create",
                "rolebinding",
                "e2e-reader",
                "-n",
                ns,
                "--role=e2e-reader",
                &format!("--serviceaccount={ns}:e2e-reader"),
            ])?;
            Some(
                kubectl(&["create", "token", "e2e-reader", "-n", ns, "--duration=10m"])?
                    .trim()
                    .to_string(),
            )
        };
        let want_ip = "127.0.0.1";
        self.until("the discovery API to list the Proxy", || {
            let (status, body) = http(listen, "GET", &path, None, token.as_deref())?;
            if status != 200 {
                return Ok(false);
            }
            let v: Value = serde_json::from_str(&body)?;
            Ok(v["items"].as_array().is_some_and(|items| {
                items.iter().any(|i| {
                    i["name"] == name
                        && i["ip"] == want_ip
                        && i["port"] == port
                        && i["ready"] == true
                })
            }))
        })?;
        if token.is_some() {
            // Allowed in its namespace only.
            let (status, _) = http(listen, "GET", "/v1/proxies", None, token.as_deref())?;
            ensure!(
                status == 403,
                "listing all namespaces with a namespace-scoped token answered {status}, want 403"
            );
        }
        println!(
            "ok    discovery API lists {ns}/{name} at {want_ip}:{port}{}",
            if token.is_some() {
                " (401 without a token, 403 outside the token's namespace)"
            } else {
                " (auth disabled)"
            }
        );
        Ok(())
    }

    fn start_emulator(&mut self, bin: &Path) -> Result<String> {
        let mut cmd = Command::new(bin.join("examples").join("emulator"));
        cmd.arg("hetzner")
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit());
        let child = self.spawn("emulator", cmd)?;
        let out = child.stdout.take().context("emulator stdout")?;
        let mut lines = BufReader::new(out).lines();
        let first = lines
            .next()
            .context("the emulator exited before printing its URL")??;
        // Keep draining its output so it never blocks on a full pipe.
        std::thread::spawn(move || for _ in lines {});
        // "Hetzner emulator at http://127.0.0.1:PORT (API under /v1)"
        first
            .split_whitespace()
            .find(|w| w.starts_with("http://"))
            .map(str::to_string)
            .with_context(|| format!("no URL in the emulator's first line {first:?}"))
    }

    fn start_tinyproxy(&mut self, connect_port: u16) -> Result<u16> {
        ensure!(
            on_path("tinyproxy"),
            "tinyproxy is not installed (apt-get install tinyproxy); the e2e probes through it"
        );
        let port = free_port()?.port();
        let conf = self.work.join("tinyproxy.conf");
        std::fs::write(
            &conf,
            format!(
                "Port {port}\nListen 127.0.0.1\nAllow 127.0.0.1\nConnectPort {connect_port}\n\
                 Timeout 30\nMaxClients 20\nLogLevel Warning\n"
            ),
        )?;
        let mut cmd = Command::new("tinyproxy");
        cmd.arg("-d").arg("-c").arg(&conf);
        cmd.stdout(Stdio::null()).stderr(Stdio::null());
        self.spawn("tinyproxy", cmd)?;
        self.until("tinyproxy to listen", || {
            Ok(TcpStream::connect(("127.0.0.1", port)).is_ok())
        })?;
        Ok(port)
    }

    fn spawn(&mut self, what: &str, mut cmd: Command) -> Result<&mut Child> {
        let child = cmd
            .stdin(Stdio::null())
            .spawn()
            .with_context(|| format!("starting the {what}: {cmd:?}"))?;
        self.children.push((what.to_string(), child));
        Ok(&mut self.children.last_mut().expect("just pushed").1)
    }

    fn until(&self, what: &str, mut f: impl FnMut() -> Result<bool>) -> Result<()> {
        let deadline = Instant::now() + self.timeout;
        let mut last_err = None;
        loop {
            match f() {
                Ok(true) => return Ok(()),
                Ok(false) => {}
                Err(e) => last_err = Some(e),
            }
            if Instant::now() > deadline {
                let why = last_err
                    .map(|e| format!(" (last error: {e:#})"))
                    .unwrap_or_default();
                bail!("gave up after {:?} waiting for {what}{why}", self.timeout);
            }
            std::thread::sleep(Duration::from_millis(500));
        }
    }

    /// Stops what this run started (by process, in reverse order) and removes what it
    /// created in the cluster, unless `--keep`.
    fn cleanup(&mut self) {
        if !self.keep {
            // Proxies first, while the operator still runs to release their finalizers.
            let _ = kubectl(&[
                "delete",
                "proxies",
                "--all",
                "-n",
                &self.namespace,
                "--wait=true",
                "--timeout=60s",
            ]);
        }
        while let Some((what, mut child)) = self.children.pop() {
            let _ = child.kill();
            let _ = child.wait();
            println!("stopped the {what}");
        }
        if self.keep {
            println!("kept namespace {} (--keep)", self.namespace);
            return;
        }
        let _ = kubectl(&["delete", "namespace", &self.namespace, "--wait=false"]);
        if self.installed_crds {
            let mut args = vec!["delete", "--wait=false"];
            let crds: Vec<String> = CRDS.iter().map(|c| format!("crd/{c}")).collect();
            args.extend(crds.iter().map(String::as_str));
            let _ = kubectl(&args);
        }
    }
}

fn proxy_yaml(name: &str, region: &str, port: u16) -> String {
    format!(
        "apiVersion: egress.proxy-operator.dev/v1alpha1\nkind: Proxy\nmetadata:\n  name: {name}\n\
         spec:\n  provider: {PROVIDER}\n  placement:\n    region: {region}\n    zone: ''\n    \
         machineType: cpx11\n    image: ubuntu\n  port: {port}\n  cloudInit:\n    inline: |\n      \
         #cloud-config\n      packages: [tinyproxy]\n"
    )
}

fn get_proxy(ns: &str, name: &str) -> Result<Value> {
    let text = kubectl(&["get", "proxy", name, "-n", ns, "-o", "json"])?;
    Ok(serde_json::from_str(&text)?)
}

/// Whether an emulator dump instance carries `value` in any label.
fn has_label_value(instance: &Value, value: &str) -> bool {
    !value.is_empty()
        && instance["labels"]
            .as_array()
            .into_iter()
            .flatten()
            .any(|kv| kv[1] == value)
}

fn dump(emulator: &str) -> Result<Vec<Value>> {
    let (status, body) = http(addr_of(emulator)?, "GET", "/_emulator/dump", None, None)?;
    ensure!(status == 200, "emulator dump: {status} {body}");
    let v: Value = serde_json::from_str(&body)?;
    Ok(v["instances"].as_array().cloned().unwrap_or_default())
}

fn addr_of(url: &str) -> Result<SocketAddr> {
    let hostport = url
        .strip_prefix("http://")
        .with_context(|| format!("{url:?} is not an http:// URL"))?
        .trim_end_matches('/');
    hostport
        .parse()
        .with_context(|| format!("{hostport:?} is not ip:port"))
}

/// A TCP listener on 127.0.0.1 that accepts connections and holds them briefly: what the
/// health probe asks the proxy to CONNECT to.
fn connect_target() -> Result<SocketAddr> {
    let listener = TcpListener::bind("127.0.0.1:0")?;
    let addr = listener.local_addr()?;
    std::thread::spawn(move || {
        for conn in listener.incoming().flatten() {
            std::thread::spawn(move || {
                let _ = conn.set_read_timeout(Some(Duration::from_secs(5)));
                let mut buf = [0u8; 256];
                let _ = (&conn).read(&mut buf);
            });
        }
    });
    Ok(addr)
}

fn free_port() -> Result<SocketAddr> {
    Ok(TcpListener::bind("127.0.0.1:0")?.local_addr()?)
}

/// One HTTP/1.1 request over a fresh connection: (status, body).
fn http(
    addr: SocketAddr,
    method: &str,
    path: &str,
    body: Option<&str>,
    token: Option<&str>,
) -> Result<(u16, String)> {
    let mut s = TcpStream::connect_timeout(&addr, Duration::from_secs(5))
        .with_context(|| format!("connecting to {addr}"))?;
    s.set_read_timeout(Some(Duration::from_secs(30)))?;
    let mut req = format!("{method} {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n");
    if let Some(t) = token {
        req.push_str(&format!("Authorization: Bearer {t}\r\n"));
    }
    let body = body.unwrap_or("");
    if !body.is_empty() {
        req.push_str("Content-Type: application/json\r\n");
    }
    req.push_str(&format!("Content-Length: {}\r\n\r\n{body}", body.len()));
    s.write_all(req.as_bytes())?;
    let mut raw = Vec::new();
    s.read_to_end(&mut raw)?;
    parse_response(&raw).with_context(|| format!("{method} {path} on {addr}"))
}

fn parse_response(raw: &[u8]) -> Result<(u16, String)> {
    let text = String::from_utf8_lossy(raw);
    let (head, body) = text
        .split_once("\r\n\r\n")
        .context("no end of headers in the answer")?;
    let status: u16 = head
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .context("no status in the answer")?;
    let chunked = head.lines().any(|l| {
        let l = l.to_ascii_lowercase();
        l.starts_with("transfer-encoding:") && l.contains("chunked")
    });
    if !chunked {
        return Ok((status, body.to_string()));
    }
    let mut out = String::new();
    let mut rest = body;
    loop {
        let (size, after) = rest.split_once("\r\n").context("bad chunk")?;
        let size = usize::from_str_radix(size.trim(), 16).context("bad chunk size")?;
        if size == 0 {
            return Ok((status, out));
        }
        ensure!(after.len() >= size, "truncated chunk");
        out.push_str(&after[..size]);
        rest = after[size..].trim_start_matches("\r\n");
    }
}

fn kubectl(args: &[&str]) -> Result<String> {
    run_kubectl(args, None)
}

fn kubectl_stdin(args: &[&str], input: &str) -> Result<String> {
    run_kubectl(args, Some(input))
}

/// Runs kubectl against the e2e kubeconfig, feeding it `input` when given; its stdout, or
/// an error quoting the command and its stderr.
fn run_kubectl(args: &[&str], input: Option<&str>) -> Result<String> {
    let mut child = with_kubeconfig(&mut Command::new("kubectl"))
        .args(args)
        .stdin(if input.is_some() {
            Stdio::piped()
        } else {
            Stdio::null()
        })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .context("running kubectl (is it installed?)")?;
    if let Some(input) = input {
        child
            .stdin
            .take()
            .context("kubectl stdin")?
            .write_all(input.as_bytes())?;
    }
    let out = child.wait_with_output()?;
    ensure!(
        out.status.success(),
        "kubectl {} failed: {}",
        args.join(" "),
        String::from_utf8_lossy(&out.stderr).trim()
    );
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

fn on_path(bin: &str) -> bool {
    std::env::var_os("PATH").is_some_and(|paths| {
        std::env::split_paths(&paths)
            .chain([PathBuf::from("/usr/sbin")])
            .any(|d| d.join(bin).is_file())
    })
}

fn run_checked(cmd: &mut Command) -> Result<()> {
    let status = cmd.status().with_context(|| format!("starting {cmd:?}"))?;
    ensure!(status.success(), "{cmd:?} failed with {status}");
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_plain_and_chunked_answers() {
        let plain = b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\n{}";
        assert_eq!(parse_response(plain).unwrap(), (200, "{}".to_string()));
        let chunked =
            b"HTTP/1.1 401 Unauthorized\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n2\r\nde\r\n0\r\n\r\n";
        assert_eq!(parse_response(chunked).unwrap(), (401, "abcde".to_string()));
        assert!(parse_response(b"garbage").is_err());
    }

    #[test]
    fn finds_label_values_and_addresses() {
        let i = json!({"id": "7", "labels": [["egress/uid", "abc"], ["x", "y"]]});
        assert!(has_label_value(&i, "abc"));
        assert!(!has_label_value(&i, "abd"));
        assert!(!has_label_value(&i, ""));
        assert_eq!(
            addr_of("http://127.0.0.1:8080").unwrap(),
            "127.0.0.1:8080".parse().unwrap()
        );
        assert!(addr_of("https://x").is_err());
    }

    #[test]
    fn proxy_manifest_is_a_proxy_of_the_e2e_provider() {
        let y = proxy_yaml("p", "fsn1", 3128);
        assert!(y.contains("provider: hetzner-e2e\n"));
        assert!(y.contains("port: 3128\n"));
        assert!(y.contains("  cloudInit:\n    inline: |\n      #cloud-config\n"));
    }

    #[test]
    fn step_timeout_parses_seconds() {
        assert_eq!(parse_secs("120s").unwrap(), Duration::from_secs(120));
        assert!(parse_secs("2m").is_err());
    }
}
