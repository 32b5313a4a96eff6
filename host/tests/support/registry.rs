//! The CNCF distribution registry (Debian's `docker-registry`) on 127.0.0.1 over HTTPS,
//! started and stopped by PID as tinyproxy is: the real registry the operator pulls
//! plugins from and `proxy-operator plugin push|sign` write to.

use egress_emulators::tls::TestCa;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// A registry child process, killed on drop; its storage lives as long as it.
pub struct Registry {
    child: Option<Child>,
    pub port: u16,
    /// The CA its certificate chains to, for `tls.caFile` and `--ca-file`.
    pub ca_file: PathBuf,
    dir: tempfile::TempDir,
    bin: PathBuf,
}

impl Drop for Registry {
    fn drop(&mut self) {
        self.stop();
    }
}

/// The registry binary; `None` (after saying so loudly) when it is missing, a failure
/// under `CI=true`.
pub fn registry_bin() -> Option<PathBuf> {
    let found = ["/usr/bin/docker-registry", "/usr/sbin/docker-registry"]
        .into_iter()
        .map(PathBuf::from)
        .find(|p| p.is_file());
    if found.is_none() {
        let msg = "docker-registry is not installed (cargo xtask test installs it: apt-get install docker-registry)";
        if std::env::var("CI").is_ok_and(|v| v == "true") {
            panic!("{msg}");
        }
        eprintln!("\n!!! SKIPPING: {msg}\n");
    }
    found
}

impl Registry {
    /// A new, empty registry on a free port; `None` when the binary is missing (skipped).
    pub async fn start() -> Option<Registry> {
        let bin = registry_bin()?;
        let dir = tempfile::tempdir().unwrap();
        let ca = TestCa::new();
        let ca_file = ca.write_ca_file(dir.path()).unwrap();
        let (cert, key) = ca.write_server_files(dir.path()).unwrap();
        let port = super::tinyproxy::free_port();
        std::fs::write(
            dir.path().join("config.yml"),
            format!(
                "version: 0.1\nlog:\n  level: warn\n  accesslog:\n    disabled: true\nstorage:\n  filesystem:\n    rootdirectory: {data}\n  delete:\n    enabled: true\nhttp:\n  addr: 127.0.0.1:{port}\n  tls:\n    certificate: {cert}\n    key: {key}\n",
                data = dir.path().join("data").display(),
                cert = cert.display(),
                key = key.display(),
            ),
        )
        .unwrap();
        let mut r = Registry {
            child: None,
            port,
            ca_file,
            dir,
            bin,
        };
        r.restart().await;
        Some(r)
    }

    /// `127.0.0.1:PORT`.
    pub fn host(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    /// Stops the process (its storage stays, for [`Registry::restart`]).
    pub fn stop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// Starts it (again) on its port, and waits until it accepts connections.
    pub async fn restart(&mut self) {
        self.stop();
        let log = std::fs::File::create(self.dir.path().join("registry.log")).unwrap();
        let child = Command::new(&self.bin)
            .arg("serve")
            .arg(self.dir.path().join("config.yml"))
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("starting docker-registry");
        self.child = Some(child);
        let start = Instant::now();
        while tokio::net::TcpStream::connect(("127.0.0.1", self.port))
            .await
            .is_err()
        {
            assert!(
                start.elapsed() < Duration::from_secs(20),
                "docker-registry did not listen within 20 s: {}",
                std::fs::read_to_string(self.dir.path().join("registry.log")).unwrap_or_default()
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// The file the registry keeps blob `digest` in (its filesystem driver's layout), for
    /// tests that tamper with what it serves.
    pub fn blob_file(&self, digest: &str) -> PathBuf {
        let hex = digest.strip_prefix("sha256:").unwrap();
        self.dir
            .path()
            .join("data/docker/registry/v2/blobs/sha256")
            .join(&hex[..2])
            .join(hex)
            .join("data")
    }

    pub fn dir(&self) -> &Path {
        self.dir.path()
    }
}
