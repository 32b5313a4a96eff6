//! Everything the demo starts, and stopping it again.

use crate::Args;
use crate::clouds::Cloud;
use anyhow::{Context, Result, ensure};
use egress_emulators::ec2::{Ec2Config, Ec2Emulator, Transition};
use egress_emulators::hetzner::{HetznerConfig, HetznerEmulator, RunSchedule};
use egress_emulators::real_proxy::{ProxyKind, RealProxies};
use fake_kube::{AccessRule, FakeApi, UserInfo};
use serde_json::{Value, json};
use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Written on every instance the demo's operator creates, and the scope of its GC.
pub const INSTALLATION: &str = "egress-demo";
/// The operator's own namespace (its leader-election Lease lives there).
pub const OPERATOR_NAMESPACE: &str = "egress-system";
pub const HETZNER_TOKEN: &str = "demo-hetzner-token";
/// The user the demo's discovery token authenticates as.
pub const DEMO_USER: &str = "demo-user";
/// Namespaces the demo creates carry this label, so nobody mistakes the control plane.
const DEMO_LABEL: &str = "egress.proxy-operator.dev/local-demo";

/// How the operator runs: short intervals, so the story takes seconds.
pub const GC_INTERVAL: &str = "2s";
pub const GC_MIN_AGE: &str = "5s";

pub struct Stack {
    pub api_addr: SocketAddr,
    pub client: kube::Client,
    pub hetzner: HetznerEmulator,
    pub ec2: Ec2Emulator,
    pub hetzner_proxies: Arc<RealProxies>,
    pub ec2_proxies: Arc<RealProxies>,
    /// The clouds of `--clouds`, one Proxy each (in `sample_docs`).
    pub clouds: Vec<Cloud>,
    pub proxy_kind: &'static str,
    pub echo_port: u16,
    pub discovery: SocketAddr,
    pub token: String,
    pub kubeconfig: PathBuf,
    pub providers_file: PathBuf,
    pub samples: PathBuf,
    /// The sample documents, applied in step 1, and the edit applied in step 4.
    pub sample_docs: Vec<Value>,
    pub edit_docs: Vec<Value>,
}

/// The operator subprocess.
pub struct Operator {
    child: tokio::process::Child,
    pub pid: u32,
    pub log: PathBuf,
}

/// Every YAML document of a file, as JSON.
pub fn load_docs(path: &Path) -> Result<Vec<Value>> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    let mut docs = Vec::new();
    for (i, doc) in serde_yaml::Deserializer::from_str(&text).enumerate() {
        let v = <serde_yaml::Value as serde::Deserialize>::deserialize(doc)
            .with_context(|| format!("{}: document {} is not YAML", path.display(), i + 1))?;
        if v.is_null() {
            continue;
        }
        let v: Value = serde_json::to_value(v)
            .with_context(|| format!("{}: document {} is not JSON-like", path.display(), i + 1))?;
        docs.push(v);
    }
    Ok(docs)
}

/// `namespace/name` of a Proxy document, and its `spec.port`.
pub fn proxy_ports(docs: &[Value]) -> Result<Vec<(String, u16)>> {
    let mut out = Vec::new();
    for d in docs.iter().filter(|d| d["kind"] == "Proxy") {
        let name = format!(
            "{}/{}",
            d["metadata"]["namespace"].as_str().unwrap_or("default"),
            d["metadata"]["name"].as_str().unwrap_or("")
        );
        let port = d["spec"]["port"]
            .as_u64()
            .and_then(|p| u16::try_from(p).ok())
            .filter(|p| *p > 0)
            .with_context(|| {
                format!(
                    "Proxy {name}: spec.port is {}, not a port in 1..=65535",
                    d["spec"]["port"]
                )
            })?;
        out.push((name, port));
    }
    Ok(out)
}

pub fn free_port(wanted: u16) -> Result<u16> {
    let l = std::net::TcpListener::bind(("127.0.0.1", wanted))
        .with_context(|| format!("port {wanted} on 127.0.0.1 is not free"))?;
    Ok(l.local_addr()?.port())
}

pub(crate) fn write_private(path: &Path, content: &str) -> Result<()> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let _ = std::fs::remove_file(path);
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)
        .with_context(|| format!("writing {}", path.display()))?;
    f.write_all(content.as_bytes())?;
    Ok(())
}

/// A token nobody can guess from the outside; the demo's API only listens on loopback.
fn demo_token() -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default()
        .as_nanos();
    let mut x = (nanos as u64) ^ (u64::from(std::process::id()) << 32);
    let mut s = String::from("demo-");
    for _ in 0..3 {
        // splitmix64
        x = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = x;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        s.push_str(&format!("{:016x}", z ^ (z >> 31)));
    }
    s
}

/// The egress echo on 127.0.0.1 (the health probe's egress check, and the target of the
/// demo's own request); it runs as long as the demo's runtime.
async fn echo_server(port: u16) -> Result<u16> {
    let (port, _task) = egress_emulators::echo::start(port)
        .await
        .with_context(|| format!("echo server: binding 127.0.0.1:{port}"))?;
    Ok(port)
}

pub fn absolute(p: &Path) -> Result<PathBuf> {
    std::path::absolute(p).with_context(|| format!("resolving {}", p.display()))
}

/// The in-memory Kubernetes API on `127.0.0.1:port` (0: any free port) with the CRDs of
/// `crds` installed and the operator's namespace created; its kubeconfig is written to
/// `kubeconfig`.
pub async fn start_api(crds: &Path, port: u16, kubeconfig: &Path) -> Result<(FakeApi, SocketAddr)> {
    let api = FakeApi::new();
    let mut crd_files: Vec<PathBuf> = std::fs::read_dir(crds)
        .with_context(|| format!("reading {}", crds.display()))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| {
            p.extension().is_some_and(|e| e == "yaml")
                && p.file_name().is_some_and(|n| n != "kustomization.yaml")
        })
        .collect();
    crd_files.sort();
    ensure!(!crd_files.is_empty(), "no CRD in {}", crds.display());
    for f in &crd_files {
        for doc in load_docs(f)? {
            api.create(doc)
                .map_err(|e| anyhow::anyhow!("installing the CRD {}: {e:?}", f.display()))?;
        }
    }
    api.create(json!({
        "apiVersion": "v1", "kind": "Namespace",
        "metadata": {"name": OPERATOR_NAMESPACE, "labels": {DEMO_LABEL: "true"}},
    }))
    .map_err(|e| anyhow::anyhow!("creating namespace {OPERATOR_NAMESPACE}: {e:?}"))?;
    let api_addr = api
        .serve(&format!("127.0.0.1:{port}"))
        .await
        .with_context(|| format!("serving the in-memory API on 127.0.0.1:{port}"))?;
    write_kubeconfig(&api, api_addr, kubeconfig)?;
    Ok((api, api_addr))
}

/// Writes the plugins' credentials (the emulators' own) as files under `secrets`, and the
/// providers file naming them, with `extra` appended to each provider's entry (`hetzner`,
/// `ec2`: YAML lines at the entry's indentation, e.g. a `budget`).
pub fn write_providers(
    file: &Path,
    secrets: &Path,
    hetzner: &str,
    ec2: &str,
    extra: &BTreeMap<&str, String>,
) -> Result<()> {
    std::fs::create_dir_all(secrets).with_context(|| format!("creating {}", secrets.display()))?;
    write_private(
        &secrets.join("hetzner-token"),
        &format!("{HETZNER_TOKEN}\n"),
    )?;
    write_private(
        &secrets.join("aws-access-key-id"),
        egress_emulators::ec2::EXAMPLE_ACCESS_KEY,
    )?;
    write_private(
        &secrets.join("aws-secret-access-key"),
        egress_emulators::ec2::EXAMPLE_SECRET_KEY,
    )?;
    std::fs::write(file, providers_yaml(hetzner, ec2, secrets, extra))
        .with_context(|| format!("writing {}", file.display()))
}

/// The `proxy-operator run` arguments every local run shares: plugins, providers file,
/// scratch and cache under `workdir`, the installation and namespace, where it listens.
pub fn operator_args(
    plugin_dir: &Path,
    providers_file: &Path,
    workdir: &Path,
    listen: SocketAddr,
) -> Vec<String> {
    [
        "run",
        "--plugin-dir",
        &plugin_dir.display().to_string(),
        "--providers",
        &providers_file.display().to_string(),
        "--plugin-cache-dir",
        &workdir.join("plugin-cache").display().to_string(),
        "--plugin-scratch-dir",
        &workdir.join("plugin-calls").display().to_string(),
        "--installation",
        INSTALLATION,
        "--namespace",
        OPERATOR_NAMESPACE,
        "--pod-name",
        "egress-demo-operator",
        "--listen",
        &listen.to_string(),
    ]
    .map(String::from)
    .to_vec()
}

/// The operator binary (`--operator-bin`, default next to this one) and the plugin
/// directory, both checked.
pub fn binaries(args: &Args) -> Result<(PathBuf, PathBuf)> {
    let operator_bin = match &args.operator_bin {
        Some(p) => p.clone(),
        None => std::env::current_exe()?
            .parent()
            .context("this binary has no directory")?
            .join("proxy-operator"),
    };
    ensure!(
        operator_bin.is_file(),
        "the operator binary {} does not exist (build it, or pass --operator-bin)",
        operator_bin.display()
    );
    let plugin_dir = absolute(&args.plugin_dir)?;
    let clouds = args.clouds.iter().map(|c| format!("{c}.wasm"));
    for p in ["hetzner.wasm".to_string(), "ec2.wasm".to_string()]
        .into_iter()
        .chain(clouds)
    {
        ensure!(
            plugin_dir.join(&p).is_file(),
            "plugin {} is missing (cargo xtask build-plugins builds it)",
            plugin_dir.join(p).display()
        );
    }
    Ok((operator_bin, plugin_dir))
}

impl Stack {
    pub async fn start(args: &Args) -> Result<(Stack, Operator)> {
        let samples = absolute(&args.samples)?;
        let sample_docs = load_docs(&samples.join("proxies.yaml"))?;
        let edit_docs = load_docs(&samples.join("proxy-edit.yaml"))?;
        let mut sample_docs = sample_docs;
        let mut ports = proxy_ports(&sample_docs)?;
        ports.extend(proxy_ports(&edit_docs)?);
        ensure!(
            !ports.is_empty(),
            "{} holds no Proxy",
            samples.join("proxies.yaml").display()
        );
        for (name, port) in &ports {
            free_port(*port).with_context(|| {
                format!(
                    "Proxy {name} (in {}) uses spec.port {port}; stop what listens there",
                    samples.display()
                )
            })?;
        }
        let (operator_bin, plugin_dir) = binaries(args)?;
        let crds = absolute(&args.crds)?;
        let workdir = absolute(&args.workdir)?;
        std::fs::create_dir_all(workdir.join("secrets"))
            .with_context(|| format!("creating {}", workdir.display()))?;

        println!("egress-proxies-operator: local demo");
        println!("  everything below runs on 127.0.0.1 and stops when the demo ends\n");

        // The in-memory Kubernetes API.
        let kubeconfig = workdir.join("kubeconfig");
        let (api, api_addr) = start_api(&crds, args.api_port, &kubeconfig).await?;
        let token = demo_token();
        api.add_token(&token, UserInfo::new(DEMO_USER));
        api.allow(AccessRule::user(DEMO_USER, ["get", "list"], ["proxies"]));
        // And may use them: the discovery API hands it their credentials.
        api.allow(AccessRule::user(
            DEMO_USER,
            ["get"],
            ["proxies/credentials"],
        ));
        let client = api.client();
        println!(
            "  Kubernetes API  http://{api_addr}  LOCAL DEMO CONTROL PLANE (in-memory, fake-kube), not for production"
        );
        println!(
            "                  kubectl --kubeconfig {} get proxies -A",
            kubeconfig.display()
        );

        // Emulators whose instances are real proxies.
        // Each instance on its own loopback address, as on a cloud: the pool's Proxies share
        // one port, and a request through a proxy arrives from the proxy's own address.
        let hetzner_proxies = RealProxies::with_own_addresses(kind_of(args));
        let ec2_proxies = RealProxies::with_own_addresses(kind_of(args));
        let proxy_kind = hetzner_proxies.kind_name();
        let hetzner = HetznerEmulator::start(HetznerConfig {
            run_schedule: RunSchedule::After(Duration::from_secs(2)),
            real_proxies: Some(hetzner_proxies.clone()),
            ..HetznerConfig::new(HETZNER_TOKEN)
        });
        let ec2 = Ec2Emulator::start(Ec2Config {
            launch: Transition::After(Duration::from_secs(2)),
            real_proxies: Some(ec2_proxies.clone()),
            ..Ec2Config::default()
        });
        println!(
            "  emulators       hetzner {}  ec2 {}  (every running instance: a real {proxy_kind} proxy on a loopback address of its own)",
            hetzner.url(),
            ec2.url()
        );
        let mut clouds = Vec::new();
        if !args.clouds.is_empty() {
            let at = sample_docs
                .iter()
                .position(|d| d["kind"] == "Proxy")
                .context("no sample Proxy to make the --clouds Proxies from")?;
            let template = sample_docs[at].clone();
            for (i, name) in args.clouds.iter().enumerate() {
                let cloud = Cloud::start(name, kind_of(args), &workdir.join("secrets"))?;
                // Ports next to the samples' when free, so the printed lines look alike.
                let port = free_port(31291 + i as u16).or_else(|_| free_port(0))?;
                // After the template, so the story still edits and deletes the samples'.
                sample_docs.insert(at + 1 + i, cloud.proxy(&template, port)?);
                println!(
                    "                  {name} {}  (one Proxy: {name}-demo, port {port})",
                    cloud.emulator.url()
                );
                clouds.push(cloud);
            }
        }
        let echo_port = echo_server(args.echo_port).await?;
        println!(
            "  echo server     http://127.0.0.1:{echo_port}/  (answers with the caller's IP: the health probe's egress check)"
        );

        // The operator.
        let providers_file = workdir.join("providers.yaml");
        write_providers(
            &providers_file,
            &workdir.join("secrets"),
            &hetzner.url(),
            &ec2.url(),
            &BTreeMap::new(),
        )?;
        if !clouds.is_empty() {
            let mut text = std::fs::read_to_string(&providers_file)?;
            text.extend(clouds.iter().map(|c| c.entry.as_str()));
            std::fs::write(&providers_file, text)
                .with_context(|| format!("writing {}", providers_file.display()))?;
        }
        let discovery = SocketAddr::from(([127, 0, 0, 1], free_port(args.discovery_port)?));
        let mut operator_args = operator_args(&plugin_dir, &providers_file, &workdir, discovery);
        operator_args.extend(
            [
                "--provisioning-poll",
                "1s",
                "--deletion-poll",
                "1s",
                "--drift-poll",
                "10s",
                "--gc-interval",
                GC_INTERVAL,
                "--gc-min-age",
                GC_MIN_AGE,
                "--egress-echo-url",
                &format!("http://127.0.0.1:{echo_port}/"),
                "--probe-interval",
                "2s",
                "--probe-timeout",
                "2s",
                "--provider-check-interval",
                "15s",
                "--reload-interval",
                "5s",
                "--shutdown-grace",
                "5s",
            ]
            .map(String::from),
        );
        let operator =
            Operator::spawn(&operator_bin, &operator_args, &kubeconfig, &workdir, "info")?;
        println!(
            "  operator        {} run (pid {}), log: {}",
            operator_bin.display(),
            operator.pid,
            operator.log.display()
        );
        println!(
            "                  providers file {} ({} plugins -> the emulators)",
            providers_file.display(),
            ["hetzner", "ec2"]
                .into_iter()
                .chain(clouds.iter().map(|c| c.name))
                .collect::<Vec<_>>()
                .join(", ")
        );
        let stack = Stack {
            api_addr,
            client,
            hetzner,
            ec2,
            hetzner_proxies,
            ec2_proxies,
            clouds,
            proxy_kind,
            echo_port,
            discovery,
            token,
            kubeconfig,
            providers_file,
            samples,
            sample_docs,
            edit_docs,
        };
        Ok((stack, operator))
    }

    /// The ready-to-paste line for the discovery API.
    pub fn curl_line(&self, path: &str) -> String {
        format!(
            "curl -H \"Authorization: Bearer {}\" 'http://{}{path}'",
            self.token, self.discovery
        )
    }

    pub fn print_exploration(&self) {
        println!("\nexplore (the demo keeps running):");
        println!(
            "  Kubernetes API http://{} (local demo control plane, in memory), operator's providers file {}",
            self.api_addr,
            self.providers_file.display()
        );
        println!(
            "  kubectl --kubeconfig {} get proxies -A",
            self.kubeconfig.display()
        );
        println!(
            "  kubectl --kubeconfig {} apply -f {}",
            self.kubeconfig.display(),
            self.samples.join("proxies.yaml").display()
        );
        println!("  {}", self.curl_line("/v1/proxies"));
        println!("  {}", self.curl_line("/v1/proxies:pick"));
        println!("  curl http://{}/metrics", self.discovery);
        for (id, port) in self.listening() {
            println!(
                "  curl -p -x http://127.0.0.1:{port} http://127.0.0.1:{}/   # through instance {id}",
                self.echo_port
            );
        }
    }

    /// Every running instance's proxy: backend ID and port.
    pub fn listening(&self) -> Vec<(String, u16)> {
        let mut out = Vec::new();
        let clouds = self.clouds.iter().map(|c| (c.name, &c.proxies));
        for (emu, proxies) in [
            ("hetzner", &self.hetzner_proxies),
            ("ec2", &self.ec2_proxies),
        ]
        .into_iter()
        .chain(clouds)
        {
            out.extend(
                proxies
                    .listening()
                    .into_iter()
                    .map(|(id, port)| (format!("{emu}/{id}"), port)),
            );
        }
        out
    }

    /// Stops the emulators, and with them every instance's proxy; the in-memory API stops
    /// with the runtime.
    pub fn stop(self) -> String {
        let proxies = self.listening().len();
        let Stack {
            hetzner,
            ec2,
            hetzner_proxies,
            ec2_proxies,
            clouds,
            ..
        } = self;
        drop((hetzner, ec2));
        hetzner_proxies.stop_all();
        ec2_proxies.stop_all();
        for Cloud {
            emulator, proxies, ..
        } in clouds
        {
            drop(emulator);
            proxies.stop_all();
        }
        format!("emulators stopped with their {proxies} running proxies")
    }
}

fn kind_of(args: &Args) -> ProxyKind {
    if args.builtin_proxy {
        ProxyKind::Builtin
    } else {
        ProxyKind::Auto
    }
}

/// Waits until `/healthz` answers on the operator's discovery port.
pub async fn wait_serving(addr: SocketAddr, timeout: Duration) -> Result<()> {
    wait_200(addr, "/healthz", timeout).await
}

/// Waits until `/readyz` answers 200: the Proxy cache has synced and the first plugin load
/// (compiles included, on a cold plugin cache) is done.
pub async fn wait_ready(addr: SocketAddr, timeout: Duration) -> Result<()> {
    wait_200(addr, "/readyz", timeout).await
}

async fn wait_200(addr: SocketAddr, path: &str, timeout: Duration) -> Result<()> {
    let deadline = Instant::now() + timeout;
    loop {
        if let Ok(r) = crate::http::get(addr, path, None).await
            && r.status == 200
        {
            return Ok(());
        }
        ensure!(
            Instant::now() < deadline,
            "the operator did not answer 200 on {path} at {addr} within {timeout:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

fn providers_yaml(
    hetzner: &str,
    ec2: &str,
    secrets: &Path,
    extra: &BTreeMap<&str, String>,
) -> String {
    let s = |k: &str| secrets.join(k).display().to_string();
    let extra = |name: &str| extra.get(name).cloned().unwrap_or_default();
    format!(
        r#"# Written by egress-demo (cargo xtask demo): the hetzner and ec2 plugins, pointed at the
# local emulators. Loopback is refused to plugins unless allow-listed, hence additionalHosts;
# the emulators' instances are proxies on 127.0.0.1, hence allowPrivateAddresses.
providers:
  - name: hetzner
    plugin: hetzner.wasm
    additionalHosts: ['{hetzner}']
    allowPrivateAddresses: true
    secrets: {{token: '{hz_token}'}}
    config:
      endpoint: '{hetzner}/v1'
      locations: [fsn1, nbg1]
      serverTypes: [cpx11]
      images: {{ubuntu: ubuntu-24.04}}
{hz_extra}  - name: ec2
    plugin: ec2.wasm
    additionalHosts: ['{ec2}']
    allowPrivateAddresses: true
    secrets: {{accessKeyId: '{ak}', secretAccessKey: '{sk}'}}
    config:
      regions:
        eu-west-1:
          endpoint: '{ec2}'
          zones: {{eu-west-1a: {{}}}}
          images: {{debian: ami-0fedcba9876543210}}
      instanceTypes: [t3.micro]
{ec2_extra}"#,
        hz_token = s("hetzner-token"),
        ak = s("aws-access-key-id"),
        sk = s("aws-secret-access-key"),
        hz_extra = extra("hetzner"),
        ec2_extra = extra("ec2"),
    )
}

/// The in-memory API's kubeconfig, with the cluster and context named so nobody mistakes
/// it for a real cluster.
fn write_kubeconfig(api: &FakeApi, addr: SocketAddr, path: &Path) -> Result<()> {
    let kc = serde_json::to_value(api.kubeconfig(addr))?;
    let text = serde_json::to_string(&kc)?.replace("\"fake-kube\"", "\"egress-local-demo\"");
    let kc: Value = serde_json::from_str(&text)?;
    let yaml = serde_yaml::to_string(&kc)?;
    std::fs::write(
        path,
        format!(
            "# LOCAL DEMO control plane: the in-memory Kubernetes API of `cargo xtask demo`\n\
             # (fake-kube on {addr}), not a cluster and not for production. Gone when the demo stops.\n{yaml}"
        ),
    )
    .with_context(|| format!("writing {}", path.display()))
}

impl Operator {
    /// Starts `bin` with `args`, logging to `workdir/operator.log` at `RUST_LOG` (else
    /// `default_log`).
    pub fn spawn(
        bin: &Path,
        args: &[String],
        kubeconfig: &Path,
        workdir: &Path,
        default_log: &str,
    ) -> Result<Operator> {
        let log = workdir.join("operator.log");
        let out =
            std::fs::File::create(&log).with_context(|| format!("creating {}", log.display()))?;
        let err = out.try_clone()?;
        let cache = workdir.join("plugin-cache");
        std::fs::create_dir_all(&cache)?;
        // The compiled-plugin cache must be private to this user.
        std::fs::set_permissions(&cache, std::os::unix::fs::PermissionsExt::from_mode(0o700))?;
        let mut cmd = tokio::process::Command::new(bin);
        cmd.args(args)
            .env("KUBECONFIG", kubeconfig)
            .env(
                "RUST_LOG",
                std::env::var("RUST_LOG").unwrap_or_else(|_| default_log.into()),
            )
            // As the shipped Deployment sets them (config/manager): glibc's per-thread heap
            // arenas and its adaptive mmap threshold otherwise hold a good part of the
            // operator's RSS, and the scale benchmark measures the RSS the Deployment
            // would see.
            .env(
                "MALLOC_ARENA_MAX",
                std::env::var("MALLOC_ARENA_MAX").unwrap_or_else(|_| "2".into()),
            )
            .env(
                "MALLOC_MMAP_THRESHOLD_",
                std::env::var("MALLOC_MMAP_THRESHOLD_").unwrap_or_else(|_| "131072".into()),
            )
            .stdin(std::process::Stdio::null())
            .stdout(out)
            .stderr(err)
            // A safety net: dropped without `stop` (a panic), it is killed.
            .kill_on_drop(true);
        #[cfg(target_os = "linux")]
        // SAFETY: prctl is async-signal-safe and touches no memory of the parent.
        unsafe {
            // If the demo dies without stopping it (SIGKILL), the operator gets SIGTERM.
            cmd.pre_exec(|| {
                if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGTERM) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
        let child = cmd
            .spawn()
            .with_context(|| format!("starting {}", bin.display()))?;
        let pid = child.id().context("the operator has no PID")?;
        Ok(Operator { child, pid, log })
    }

    /// Waits until the operator exits, and says how.
    pub async fn exited(&mut self) -> anyhow::Error {
        match self.child.wait().await {
            Ok(status) => anyhow::anyhow!(
                "the operator exited unexpectedly ({status}); see {}",
                self.log.display()
            ),
            Err(e) => anyhow::anyhow!("waiting for the operator: {e}"),
        }
    }

    /// The last lines of the operator's log.
    pub fn log_tail(&self, lines: usize) -> String {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        let all: Vec<&str> = text.lines().collect();
        all[all.len().saturating_sub(lines)..].join("\n")
    }

    /// At the end of a run: the last lines of the log when it failed, then [`Operator::stop`];
    /// prints both.
    pub async fn wind_down(&mut self, failed: bool) {
        if failed {
            println!(
                "\nlast lines of the operator's log ({}):\n{}",
                self.log.display(),
                self.log_tail(30)
            );
        }
        println!("\nstopping: {}", self.stop().await);
    }

    /// SIGTERM by PID (a graceful stop: reconciles in flight finish), SIGKILL after 15 s.
    pub async fn stop(&mut self) -> String {
        if let Ok(Some(status)) = self.child.try_wait() {
            return format!("operator had already exited ({status})");
        }
        let pid = libc::pid_t::try_from(self.pid).unwrap_or(0);
        if pid > 0 {
            // SAFETY: plain syscall; the PID is our unreaped child, so it names no other process.
            unsafe {
                libc::kill(pid, libc::SIGTERM);
            }
        }
        match tokio::time::timeout(Duration::from_secs(15), self.child.wait()).await {
            Ok(Ok(status)) => format!("operator stopped ({status})"),
            _ => {
                let _ = self.child.kill().await;
                "operator did not stop within 15s after SIGTERM: killed".into()
            }
        }
    }
}
