//! A real moto EC2 server on 127.0.0.1 for the EC2 plugin's backend test
//! (`host/tests/provider_ec2_moto.rs`), and `cargo xtask moto` to run one by hand.
//!
//! [`MotoServer::start`] installs the pinned moto into a venv under the target directory
//! (reused while the version matches), starts it on a free loopback port with AMI and
//! instance-type validation on, creates an IAM user with an access key allowed `ec2:*`,
//! turns signature checking on and proves it by having a wrong secret refused
//! (`xtask/moto_setup.py`). The server is stopped by PID when the guard is dropped, and
//! stops by itself when this process dies (`xtask/moto_server.py`).

use anyhow::{Context, Result, bail, ensure};
use std::io::{Read, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// The one place the moto version is pinned. Changing it reinstalls the venv.
pub const MOTO_VERSION: &str = "5.2.5";
/// The region and instance type the test launches in; the AMI and zone come from moto.
const REGION: &str = "eu-west-1";
const INSTANCE_TYPE: &str = "t3.micro";
/// moto is ready in well under a second; the bound is for a loaded CI machine.
const READY_TIMEOUT: Duration = Duration::from_secs(30);

#[derive(clap::Args)]
pub struct Args {}

/// `cargo xtask moto`: start a server, print its env vars, run until Ctrl-C.
pub fn run(_: &Args) -> Result<()> {
    let ws = crate::workspace()?;
    let mut moto = MotoServer::start(&ws.target_dir, &ws.root)?;
    for (k, v) in moto.env() {
        println!("export {k}='{v}'");
    }
    eprintln!(
        "moto {MOTO_VERSION} is running at {} (pid {}, log {}); Ctrl-C stops it",
        moto.server.url,
        moto.server.child.id(),
        moto.server.log.display()
    );
    loop {
        if let Some(status) = moto.server.child.try_wait()? {
            bail!("moto exited ({status}); see {}", moto.server.log.display());
        }
        std::thread::sleep(Duration::from_secs(1));
    }
}

/// A running, prepared moto server. Dropping it stops the server.
pub struct MotoServer {
    server: Process,
    access_key_id: String,
    secret_access_key: String,
    region: String,
    zone: String,
    image: String,
    instance_type: String,
}

/// The server process, killed by its PID when dropped: when the guard goes, and on every
/// error path of the setup.
struct Process {
    child: Child,
    url: String,
    /// The server's stdout and stderr.
    log: PathBuf,
}

impl Drop for Process {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl MotoServer {
    /// Everything above, or an error saying which step failed (with moto's log tail).
    pub fn start(target_dir: &Path, root: &Path) -> Result<MotoServer> {
        let python = ensure_venv(target_dir)?;
        let log_dir = target_dir.join("moto");
        std::fs::create_dir_all(&log_dir)
            .with_context(|| format!("creating {}", log_dir.display()))?;
        let server = spawn_ready(&python, root, &log_dir)?;

        let setup = Command::new(&python)
            .arg(root.join("xtask/moto_setup.py"))
            .args([&server.url, REGION, INSTANCE_TYPE])
            .stdin(Stdio::null())
            .output()
            .context("running xtask/moto_setup.py")?;
        if !setup.status.success() {
            bail!(
                "setting up moto failed ({}):\n{}\nmoto's log ({}):\n{}",
                setup.status,
                String::from_utf8_lossy(&setup.stderr).trim(),
                server.log.display(),
                tail(&server.log)
            );
        }
        let out: serde_json::Value = serde_json::from_slice(&setup.stdout).with_context(|| {
            format!(
                "moto_setup.py printed no JSON: {}",
                String::from_utf8_lossy(&setup.stdout)
            )
        })?;
        let field = |k: &str| -> Result<String> {
            out[k]
                .as_str()
                .map(str::to_string)
                .with_context(|| format!("moto_setup.py printed no {k}: {out}"))
        };
        let (access_key_id, secret_access_key) = (field("accessKeyId")?, field("secretAccessKey")?);
        let (region, zone, image, instance_type) = (
            field("region")?,
            field("zone")?,
            field("image")?,
            field("instanceType")?,
        );
        Ok(MotoServer {
            server,
            access_key_id,
            secret_access_key,
            region,
            zone,
            image,
            instance_type,
        })
    }

    /// What `host/tests/provider_ec2_moto.rs` reads.
    pub fn env(&self) -> Vec<(&'static str, String)> {
        vec![
            ("EGRESS_MOTO_URL", self.server.url.clone()),
            ("EGRESS_MOTO_ACCESS_KEY_ID", self.access_key_id.clone()),
            (
                "EGRESS_MOTO_SECRET_ACCESS_KEY",
                self.secret_access_key.clone(),
            ),
            ("EGRESS_MOTO_REGION", self.region.clone()),
            ("EGRESS_MOTO_ZONE", self.zone.clone()),
            ("EGRESS_MOTO_IMAGE", self.image.clone()),
            ("EGRESS_MOTO_INSTANCE_TYPE", self.instance_type.clone()),
        ]
    }
}

/// The venv's Python, with the pinned moto installed. A venv is reused when it has the
/// marker written after a complete install of this version; anything else there (another
/// version, an install that was interrupted) is replaced.
fn ensure_venv(target_dir: &Path) -> Result<PathBuf> {
    let venv = target_dir.join("moto-venv");
    let python = venv.join("bin/python");
    let marker = venv.join(format!(".egress-moto-{MOTO_VERSION}"));
    if marker.is_file() && installed_version(&python).as_deref() == Some(MOTO_VERSION) {
        return Ok(python);
    }
    let started = Instant::now();
    eprintln!(
        "installing moto {MOTO_VERSION} into {} (about a minute)...",
        venv.display()
    );
    let result = (|| -> Result<()> {
        if venv.exists() {
            std::fs::remove_dir_all(&venv)
                .with_context(|| format!("removing {}", venv.display()))?;
        }
        create_venv(&venv)?;
        let status = Command::new(&python)
            .args([
                "-m",
                "pip",
                "install",
                "--quiet",
                "--disable-pip-version-check",
                &format!("moto[server,ec2]=={MOTO_VERSION}"),
            ])
            .status()
            .context("running pip")?;
        ensure!(
            status.success(),
            "pip install moto[server,ec2]=={MOTO_VERSION} failed ({status})"
        );
        ensure!(
            installed_version(&python).as_deref() == Some(MOTO_VERSION),
            "moto {MOTO_VERSION} is not importable from {} after installing it",
            python.display()
        );
        std::fs::write(&marker, "")?;
        Ok(())
    })();
    if let Err(e) = result {
        let _ = std::fs::remove_dir_all(&venv);
        return Err(e);
    }
    eprintln!("installed moto {MOTO_VERSION} in {:.0?}", started.elapsed());
    Ok(python)
}

/// moto's version as the venv's Python imports it (with boto3, which the setup uses).
fn installed_version(python: &Path) -> Option<String> {
    let out = Command::new(python)
        .args([
            "-c",
            "import boto3, importlib.metadata as m; print(m.version('moto'))",
        ])
        .stderr(Stdio::null())
        .output()
        .ok()?;
    out.status
        .success()
        .then(|| String::from_utf8_lossy(&out.stdout).trim().to_string())
}

/// `python3 -m venv DIR`, installing Debian's python3-venv first when that is what is
/// missing and we may (root); otherwise an error that says what to install.
fn create_venv(dir: &Path) -> Result<()> {
    let attempt = || {
        Command::new("python3")
            .args(["-m", "venv"])
            .arg(dir)
            .output()
    };
    let out = match attempt() {
        Ok(out) => out,
        Err(e) => bail!("python3 is needed for the moto EC2 test and could not be run: {e}"),
    };
    if out.status.success() {
        return Ok(());
    }
    let why = String::from_utf8_lossy(&out.stderr).trim().to_string();
    let _ = std::fs::remove_dir_all(dir);
    if !is_root() {
        bail!(
            "`python3 -m venv` failed ({why}); install the venv module (Debian/Ubuntu: \
             `apt-get install python3-venv`) and run again"
        );
    }
    eprintln!("`python3 -m venv` failed ({why}); installing python3-venv with apt-get");
    for args in [
        &["update", "-qq"][..],
        &["install", "-y", "-qq", "python3-venv"][..],
    ] {
        let status = Command::new("apt-get")
            .args(args)
            .env("DEBIAN_FRONTEND", "noninteractive")
            .status()
            .context("running apt-get")?;
        ensure!(status.success(), "apt-get {} failed ({status})", args[0]);
    }
    let out = attempt().context("running python3 -m venv")?;
    ensure!(
        out.status.success(),
        "`python3 -m venv` still fails after installing python3-venv: {}",
        String::from_utf8_lossy(&out.stderr).trim()
    );
    Ok(())
}

fn is_root() -> bool {
    Command::new("id")
        .arg("-u")
        .output()
        .is_ok_and(|o| String::from_utf8_lossy(&o.stdout).trim() == "0")
}

/// Start the server on a free loopback port and wait until it answers HTTP. The port is
/// picked by binding port 0 and releasing it, so another process can take it in between:
/// then moto exits at once and the next port is tried.
fn spawn_ready(python: &Path, root: &Path, log_dir: &Path) -> Result<Process> {
    let mut last = String::new();
    for _ in 0..3 {
        let port = TcpListener::bind((Ipv4Addr::LOCALHOST, 0))?
            .local_addr()?
            .port();
        let log = log_dir.join(format!("server-{port}.log"));
        let out =
            std::fs::File::create(&log).with_context(|| format!("creating {}", log.display()))?;
        let child = Command::new(python)
            .arg(root.join("xtask/moto_server.py"))
            .args(["-H", "127.0.0.1", "-p", &port.to_string()])
            .env("MOTO_EC2_ENABLE_INSTANCE_TYPE_VALIDATION", "true")
            .env("MOTO_ENABLE_AMI_VALIDATION", "true")
            .env("PYTHONUNBUFFERED", "1")
            .stdin(Stdio::null())
            .stdout(out.try_clone()?)
            .stderr(out)
            .spawn()
            .context("starting moto")?;
        let mut server = Process {
            child,
            url: format!("http://127.0.0.1:{port}"),
            log,
        };
        let deadline = Instant::now() + READY_TIMEOUT;
        loop {
            if let Some(status) = server.child.try_wait()? {
                last = format!("moto exited ({status}):\n{}", tail(&server.log));
                break;
            }
            if answers_http(port) {
                return Ok(server);
            }
            if Instant::now() > deadline {
                bail!(
                    "moto did not answer on port {port} within {READY_TIMEOUT:?}:\n{}",
                    tail(&server.log)
                );
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }
    bail!("moto did not start: {last}")
}

/// Whether something on the port answers an HTTP request (moto's answer to `/` is fine
/// whatever its status).
fn answers_http(port: u16) -> bool {
    let addr = SocketAddr::from((Ipv4Addr::LOCALHOST, port));
    let Ok(mut s) = TcpStream::connect_timeout(&addr, Duration::from_millis(500)) else {
        return false;
    };
    let _ = s.set_read_timeout(Some(Duration::from_secs(2)));
    let req = format!("GET /moto-api/reset-auth HTTP/1.0\r\nHost: 127.0.0.1:{port}\r\n\r\n");
    if s.write_all(req.as_bytes()).is_err() {
        return false;
    }
    let mut head = [0u8; 8];
    s.read_exact(&mut head).is_ok() && head.starts_with(b"HTTP/1.")
}

/// The last lines of a log, for error messages.
fn tail(path: &Path) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(30)..].join("\n")
}
