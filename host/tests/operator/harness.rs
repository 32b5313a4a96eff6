//! The real `proxy-operator run` binary against the in-memory API on 127.0.0.1, for the
//! tests that watch a replica from outside: its HTTP endpoints, its log, its memory.
//!
//! [`Limits::deployment`] runs it as `config/manager/manager.yaml` does: the same resource
//! flags and a memory cgroup with the Deployment's limit (512Mi), so a hostile input that
//! would take a real pod down (OOM kill, a crash loop) does the same here instead of
//! passing on a 24 GiB test machine. The operator reads that limit from its cgroup, as in a
//! pod, and sizes its fit from it.

use crate::support;

use egress_emulators::example::ExampleBackend;
use fake_kube::FakeApi;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, PostParams};
use proxy_operator::api;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// The Deployment's memory limit (`config/manager/manager.yaml`, `resources.limits.memory`).
pub const DEPLOYMENT_MEMORY_LIMIT: u64 = 512 << 20;
/// The Deployment's resource and reconcile flags, in the same order.
pub const DEPLOYMENT_ARGS: &[&str] = &[
    "--memory-reserve=96Mi",
    "--scratch-limit=96Mi",
    "--concurrency=16",
];

/// The value of the Deployment's flag `--name=value` in [`DEPLOYMENT_ARGS`].
pub fn deployment_flag(name: &str) -> &'static str {
    DEPLOYMENT_ARGS
        .iter()
        .find_map(|a| a.strip_prefix("--")?.strip_prefix(name)?.strip_prefix('='))
        .unwrap_or_else(|| panic!("--{name} is not among the Deployment's flags"))
}

pub struct Operator {
    pub child: Child,
    pub addr: std::net::SocketAddr,
    pub log: std::path::PathBuf,
    /// The memory cgroup it runs in, when started with [`Limits::deployment`].
    pub cgroup: Option<MemoryCgroup>,
}

impl Drop for Operator {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        if std::thread::panicking() {
            let log = std::fs::read_to_string(&self.log).unwrap_or_default();
            eprintln!("--- proxy-operator log ---\n{log}--- end of log ---");
        }
    }
}

// Not every test uses every accessor.
#[allow(dead_code)]
impl Operator {
    /// (status, body); status 0 while nothing listens.
    pub async fn get(&self, path: &str) -> (u16, String) {
        match support::http::try_get(self.addr, path).await {
            Some(a) => (a.status, a.body),
            None => (0, "connection refused".into()),
        }
    }

    /// The log so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Whether the process is still running (not exited, not killed by the OOM killer).
    pub fn alive(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }

    /// Panics with the log and the cgroup's counters when the process is gone.
    pub fn assert_alive(&mut self, when: &str) {
        if let Ok(Some(status)) = self.child.try_wait() {
            let oom = self.cgroup.as_ref().map(|c| c.oom_kills()).unwrap_or(0);
            panic!("the operator exited {when}: {status} (OOM kills in its cgroup: {oom})");
        }
    }
}

pub async fn wait_for<T>(what: &str, within: Duration, mut f: impl AsyncFnMut() -> Option<T>) -> T {
    let start = Instant::now();
    loop {
        if let Some(v) = f().await {
            return v;
        }
        assert!(
            start.elapsed() < within,
            "timed out after {within:?} waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

pub fn providers_yaml(backend: &ExampleBackend, token: &Path, extra: &str) -> String {
    format!(
        "providers:\n- name: ex\n  plugin: example.wasm\n  additionalHosts: ['{url}']\n  allowPrivateAddresses: true\n  \
         limits: {{timeout: 60s}}\n  secrets: {{token: {secret}}}\n  \
         config: {{endpoint: '{url}', regions: [r1]}}\n{extra}",
        url = backend.url(),
        secret = token.display()
    )
}

/// The example backend (token `tok`) and the real binary under the Deployment's limits
/// with it as its one provider, `ex` (`entry` more lines of the entry, such as a budget),
/// `args` appended to the run; with the Proxies not probed (`--probe-target 127.0.0.1:9`).
/// `None` when the Deployment's limits cannot be set up here (the caller returns: the
/// test was skipped, and said so). Not waited for: the caller watches it start.
pub fn example_operator(
    plugin_dir: &Path,
    dir: &Path,
    kubeconfig: &Path,
    entry: &str,
    args: &[&str],
) -> Option<(ExampleBackend, Operator)> {
    let token = dir.join("token");
    std::fs::write(&token, "tok").unwrap();
    let backend = ExampleBackend::start("tok");
    let providers = dir.join("providers.yaml");
    std::fs::write(&providers, providers_yaml(&backend, &token, entry)).unwrap();
    let mut all = vec!["--probe-target", "127.0.0.1:9"];
    all.extend_from_slice(args);
    let op = start_operator_limited(
        plugin_dir,
        &providers,
        kubeconfig,
        dir,
        &all,
        &[],
        Limits::Deployment,
    )?;
    Some((backend, op))
}

/// The value of the one sample of `series` (`name{labels} `) in a Prometheus text page (0
/// if absent).
pub fn sample(text: &str, series: &str) -> f64 {
    text.lines()
        .find_map(|l| l.strip_prefix(series)?.trim().parse().ok())
        .unwrap_or(0.0)
}

pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// The in-memory API with the operator's CRDs, served on loopback; a client and a
/// kubeconfig (in `dir`) for it.
pub async fn fake_cluster(dir: &Path) -> (FakeApi, kube::Client, std::path::PathBuf) {
    let fake = FakeApi::new();
    let client = fake.client();
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    for (_, crd) in api::crds() {
        crds.create(&PostParams::default(), &crd).await.unwrap();
    }
    let api_addr = fake.serve("127.0.0.1:0").await.unwrap();
    let kubeconfig = dir.join("kubeconfig");
    fake.write_kubeconfig(api_addr, &kubeconfig).unwrap();
    (fake, client, kubeconfig)
}

/// What the operator process may use.
#[derive(Debug, Clone, Copy, Default)]
pub enum Limits {
    /// The test machine's: no memory limit.
    #[default]
    Machine,
    /// The Deployment's: [`DEPLOYMENT_ARGS`] and a memory cgroup of
    /// [`DEPLOYMENT_MEMORY_LIMIT`]. Where no memory cgroup can be made the test is skipped
    /// (loudly), and fails under `CI=true`.
    Deployment,
}

/// Starts `proxy-operator run` against the fake API at `kubeconfig`, with fast loops, the
/// discovery API without auth, its log in `dir/operator.log`; `extra` flags are appended.
pub fn start_operator(
    plugin_dir: &Path,
    providers: &Path,
    kubeconfig: &Path,
    dir: &Path,
    extra: &[&str],
) -> Operator {
    start_operator_with_env(plugin_dir, providers, kubeconfig, dir, extra, &[])
}

/// [`start_operator`], with `env` added to its environment.
pub fn start_operator_with_env(
    plugin_dir: &Path,
    providers: &Path,
    kubeconfig: &Path,
    dir: &Path,
    extra: &[&str],
    env: &[(&str, &str)],
) -> Operator {
    start_operator_limited(
        plugin_dir,
        providers,
        kubeconfig,
        dir,
        extra,
        env,
        Limits::Machine,
    )
    .expect("no limits to set up")
}

/// [`start_operator_with_env`] under `limits`; `None` when the limits cannot be set up here
/// (the caller returns: the test was skipped, and said so).
pub fn start_operator_limited(
    plugin_dir: &Path,
    providers: &Path,
    kubeconfig: &Path,
    dir: &Path,
    extra: &[&str],
    env: &[(&str, &str)],
    limits: Limits,
) -> Option<Operator> {
    let listen = std::net::SocketAddr::from(([127, 0, 0, 1], free_port()));
    let log = dir.join("operator.log");
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_proxy-operator"));
    cmd.args([
        "run",
        "--installation",
        "run-test",
        "--leader-election=false",
    ])
    .arg("--plugin-dir")
    .arg(plugin_dir)
    .arg("--providers")
    .arg(providers)
    .arg("--plugin-cache-dir")
    .arg(support::cache_dir())
    .arg("--plugin-scratch-dir")
    .arg(dir.join("scratch"))
    .args([
        "--listen",
        &listen.to_string(),
        "--discovery-insecure-no-auth",
    ])
    .args([
        "--reload-interval",
        "200ms",
        "--provider-check-interval",
        "300ms",
    ])
    .args(["--provisioning-poll", "100ms", "--requeue-now", "50ms"]);
    let cgroup = match limits {
        Limits::Machine => None,
        Limits::Deployment => {
            let cgroup = MemoryCgroup::new(DEPLOYMENT_MEMORY_LIMIT)?;
            cmd.args(DEPLOYMENT_ARGS);
            cgroup.join_on_exec(&mut cmd);
            Some(cgroup)
        }
    };
    let child = cmd
        .args(extra)
        .env("KUBECONFIG", kubeconfig)
        .env("RUST_LOG", "info")
        .env("NO_COLOR", "1")
        .envs(env.iter().copied())
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log).unwrap())
        .spawn()
        .expect("starting proxy-operator run");
    Some(Operator {
        child,
        addr: listen,
        log,
        cgroup,
    })
}

/// An operator under the Deployment's limits whose one provider, `hostile`, is the hostile
/// test plugin, answering `/readyz` 200; with the in-memory API it runs against.
pub struct HostileOperator {
    pub fake: FakeApi,
    pub client: kube::Client,
    pub op: Operator,
}

/// Starts a [`HostileOperator`] in `dir`: the plugin copied into `dir/plugins`, the provider
/// entry `providers.yaml` ends with `entry` (further lines of the entry, such as its config
/// or secrets), `extra` flags appended to the run. `None` when the Deployment's limits cannot
/// be set up here (the caller returns: the test was skipped, and said so).
pub async fn hostile_operator(
    plugin_dir: &Path,
    dir: &Path,
    entry: &str,
    extra: &[&str],
) -> Option<HostileOperator> {
    let plugins = dir.join("plugins");
    std::fs::create_dir(&plugins).unwrap();
    let hostile = plugin_dir.join("testing").join("hostile.wasm");
    std::fs::copy(&hostile, plugins.join("hostile.wasm"))
        .unwrap_or_else(|e| panic!("{}: {e}", hostile.display()));
    let (fake, client, kubeconfig) = fake_cluster(dir).await;
    let providers = dir.join("providers.yaml");
    std::fs::write(
        &providers,
        format!("providers:\n- name: hostile\n  plugin: hostile.wasm\n{entry}"),
    )
    .unwrap();
    let op = start_operator_limited(
        &plugins,
        &providers,
        &kubeconfig,
        dir,
        extra,
        &[],
        Limits::Deployment,
    )?;
    wait_for("/readyz", Duration::from_secs(60), async || {
        (op.get("/readyz").await.0 == 200).then_some(())
    })
    .await;
    Some(HostileOperator { fake, client, op })
}

/// Creates Proxies `p0` to `p{n-1}` in `default` on the hostile provider, each with
/// `machine_type` (which picks the plugin's `create` attack); returns their API.
pub async fn hostile_proxies(
    client: &kube::Client,
    n: usize,
    machine_type: &str,
) -> Api<api::Proxy> {
    let proxies: Api<api::Proxy> = Api::namespaced(client.clone(), "default");
    for i in 0..n {
        let p: api::Proxy = serde_json::from_value(serde_json::json!({
            "apiVersion": "egress.proxy-operator.dev/v1alpha1",
            "kind": "Proxy",
            "metadata": {"name": format!("p{i}"), "namespace": "default"},
            "spec": {"provider": "hostile",
                     "placement": {"region": "r1", "machineType": machine_type},
                     "cloudInit": {"inline": "#cloud-config\n"}, "port": 3128},
        }))
        .unwrap();
        proxies.create(&PostParams::default(), &p).await.unwrap();
    }
    proxies
}

/// A memory cgroup of its own (v1 `memory` hierarchy, or v2), removed on drop with every
/// process still in it killed first (the operator's compile children included).
pub struct MemoryCgroup {
    path: PathBuf,
    v2: bool,
}

impl MemoryCgroup {
    /// A new cgroup limited to `bytes` (swap included where the kernel accounts it). `None`
    /// when no memory cgroup can be made here, after saying so; a failure under `CI=true`.
    pub fn new(bytes: u64) -> Option<Self> {
        static N: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
        let name = format!(
            "egress-test-{}-{}",
            std::process::id(),
            N.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
        );
        let v1 = Path::new("/sys/fs/cgroup/memory");
        let v2 = Path::new("/sys/fs/cgroup/cgroup.controllers");
        let made = if v1.join("memory.limit_in_bytes").exists() {
            let path = v1.join(&name);
            std::fs::create_dir(&path)
                .and_then(|()| {
                    std::fs::write(path.join("memory.limit_in_bytes"), bytes.to_string())
                })
                .map(|()| {
                    // Without swap accounting the file is absent: there is no swap to use.
                    let _ =
                        std::fs::write(path.join("memory.memsw.limit_in_bytes"), bytes.to_string());
                    MemoryCgroup { path, v2: false }
                })
        } else if std::fs::read_to_string(v2)
            .is_ok_and(|c| c.split_whitespace().any(|c| c == "memory"))
        {
            let path = Path::new("/sys/fs/cgroup").join(&name);
            std::fs::create_dir(&path)
                .and_then(|()| std::fs::write(path.join("memory.max"), bytes.to_string()))
                .map(|()| {
                    let _ = std::fs::write(path.join("memory.swap.max"), "0");
                    MemoryCgroup { path, v2: true }
                })
        } else {
            Err(std::io::Error::other(
                "no memory cgroup controller mounted under /sys/fs/cgroup",
            ))
        };
        match made {
            Ok(c) => Some(c),
            Err(e) => {
                let why = format!(
                    "cannot make a memory cgroup for the Deployment's limit ({e}): needs root and a writable /sys/fs/cgroup"
                );
                assert!(std::env::var("CI").as_deref() != Ok("true"), "{why}");
                eprintln!("SKIPPED (not tested here): {why}");
                None
            }
        }
    }

    /// Makes the command's process join this cgroup before it executes, so everything it
    /// allocates, and every child it starts, counts against the limit.
    pub fn join_on_exec(&self, cmd: &mut Command) {
        let procs = std::ffi::CString::new(
            self.path
                .join("cgroup.procs")
                .into_os_string()
                .into_encoded_bytes(),
        )
        .expect("no NUL in a cgroup path");
        // SAFETY: between fork and exec only async-signal-safe calls: open, write, close on
        // a path built before the fork.
        unsafe {
            cmd.pre_exec(move || {
                let fd = libc::open(procs.as_ptr(), libc::O_WRONLY);
                if fd < 0 {
                    return Err(std::io::Error::last_os_error());
                }
                // "0": the writing process itself.
                let wrote = libc::write(fd, b"0".as_ptr().cast(), 1);
                libc::close(fd);
                if wrote != 1 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
    }

    /// Processes the OOM killer ended in this cgroup.
    pub fn oom_kills(&self) -> u64 {
        let (file, key) = if self.v2 {
            ("memory.events", "oom_kill")
        } else {
            ("memory.oom_control", "oom_kill")
        };
        std::fs::read_to_string(self.path.join(file))
            .unwrap_or_default()
            .lines()
            .find_map(|l| {
                let mut it = l.split_whitespace();
                (it.next() == Some(key)).then(|| it.next()?.parse().ok())?
            })
            .unwrap_or(0)
    }

    /// The most memory the cgroup used at once, in bytes.
    pub fn peak(&self) -> u64 {
        let file = if self.v2 {
            "memory.peak"
        } else {
            "memory.max_usage_in_bytes"
        };
        std::fs::read_to_string(self.path.join(file))
            .ok()
            .and_then(|s| s.trim().parse().ok())
            .unwrap_or(0)
    }

    fn pids(&self) -> Vec<i32> {
        std::fs::read_to_string(self.path.join("cgroup.procs"))
            .unwrap_or_default()
            .lines()
            .filter_map(|l| l.trim().parse().ok())
            .collect()
    }
}

impl Drop for MemoryCgroup {
    fn drop(&mut self) {
        for _ in 0..50 {
            let pids = self.pids();
            if pids.is_empty() && std::fs::remove_dir(&self.path).is_ok() {
                return;
            }
            for pid in pids {
                // SAFETY: a plain kill(2) of a process of this test's own cgroup.
                unsafe { libc::kill(pid, libc::SIGKILL) };
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        eprintln!("could not remove the test cgroup {}", self.path.display());
    }
}

/// The harness itself: a process in a [`MemoryCgroup`] that allocates past the limit is
/// killed, and one that stays under it is not; the counters say which.
#[test]
fn a_memory_cgroup_kills_what_outgrows_it() {
    let Some(cgroup) = MemoryCgroup::new(64 << 20) else {
        return;
    };
    let run = |mib: u32| {
        let mut cmd = Command::new("python3");
        cmd.args(["-c", &format!("b = bytearray({mib} << 20); print(len(b))")]);
        cgroup.join_on_exec(&mut cmd);
        cmd.stdout(Stdio::null()).status().expect("python3")
    };
    assert!(run(16).success(), "16 MiB fits in 64");
    let killed = run(256);
    assert!(!killed.success(), "256 MiB in a 64 MiB cgroup: {killed}");
    assert!(cgroup.oom_kills() >= 1, "the kill is counted");
    assert!(cgroup.peak() <= 64 << 20, "peak {}", cgroup.peak());
}

/// An operator under `limits`, ready (`/readyz` 200), serving the example backend as
/// provider `ex` in a fake cluster: what the threat tests against a running replica share.
pub struct ExampleOperator {
    pub op: Operator,
    pub client: kube::Client,
    /// The rest lives as long as the test holds it: the backend, the API server and the
    /// directory the operator's files are in.
    #[allow(dead_code)]
    pub backend: ExampleBackend,
    #[allow(dead_code)]
    pub fake: FakeApi,
    #[allow(dead_code)]
    pub dir: tempfile::TempDir,
}

/// [`ExampleOperator`] with `extra` flags; `None` when the limits cannot be set up here (the
/// caller returns: the test was skipped, and said so).
pub async fn start_example_operator(
    plugin_dir: &Path,
    extra: &[&str],
    limits: Limits,
) -> Option<ExampleOperator> {
    let dir = tempfile::tempdir().unwrap();
    let (fake, client, kubeconfig) = fake_cluster(dir.path()).await;
    let token = dir.path().join("token");
    std::fs::write(&token, "tok").unwrap();
    let backend = ExampleBackend::start("tok");
    let providers = dir.path().join("providers.yaml");
    std::fs::write(&providers, providers_yaml(&backend, &token, "")).unwrap();
    let op = start_operator_limited(
        plugin_dir,
        &providers,
        &kubeconfig,
        dir.path(),
        extra,
        &[],
        limits,
    )?;
    wait_for(
        "/readyz to answer 200",
        Duration::from_secs(60),
        async || (op.get("/readyz").await.0 == 200).then_some(()),
    )
    .await;
    Some(ExampleOperator {
        op,
        client,
        backend,
        fake,
        dir,
    })
}
