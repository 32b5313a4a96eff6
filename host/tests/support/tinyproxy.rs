//! A real forward proxy (tinyproxy) and an egress echo server on 127.0.0.1, for the
//! health probe and controller tests.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// A tinyproxy child process on a free loopback port, killed on drop.
pub struct Tinyproxy {
    child: Child,
    pub addr: SocketAddr,
    _dir: tempfile::TempDir,
}

impl Drop for Tinyproxy {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

pub fn tinyproxy_bin() -> Option<PathBuf> {
    let found = std::env::var_os("PATH").and_then(|paths| {
        std::env::split_paths(&paths)
            .chain([PathBuf::from("/usr/sbin"), PathBuf::from("/usr/bin")])
            .map(|d| d.join("tinyproxy"))
            .find(|p| p.is_file())
    });
    if found.is_none() {
        let msg =
            "tinyproxy is not installed (cargo xtask test installs it: apt-get install tinyproxy)";
        if std::env::var("CI").is_ok_and(|v| v == "true") {
            panic!("{msg}");
        }
        eprintln!("\n!!! SKIPPING: {msg}\n");
    }
    found
}

pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

impl Tinyproxy {
    /// `extra` lines go into the config (ConnectPort, BasicAuth).
    pub async fn start(bin: &PathBuf, extra: &str) -> Tinyproxy {
        Self::start_on(bin, free_port(), extra).await
    }

    /// On a given port (a proxy coming back where it was).
    pub async fn start_on(bin: &PathBuf, port: u16, extra: &str) -> Tinyproxy {
        Self::start_at(bin, std::net::Ipv4Addr::LOCALHOST.into(), port, extra).await
    }

    /// On another loopback address, `::1` for the IPv6 tests.
    pub async fn start_at(
        bin: &PathBuf,
        ip: std::net::IpAddr,
        port: u16,
        extra: &str,
    ) -> Tinyproxy {
        let dir = tempfile::tempdir().unwrap();
        let conf = dir.path().join("tinyproxy.conf");
        std::fs::write(
            &conf,
            format!(
                "Port {port}\nListen {ip}\nAllow {ip}\nLogLevel Error\nMaxClients 50\n{extra}\n"
            ),
        )
        .unwrap();
        let child = Command::new(bin)
            .arg("-d")
            .arg("-c")
            .arg(&conf)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let addr = SocketAddr::new(ip, port);
        let deadline = Instant::now() + Duration::from_secs(10);
        while tokio::net::TcpStream::connect(addr).await.is_err() {
            assert!(
                Instant::now() < deadline,
                "tinyproxy did not listen on {addr}"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        Tinyproxy {
            child,
            addr,
            _dir: dir,
        }
    }
}

/// An HTTP server on 127.0.0.1 whose every answer is the client's IP: the egress echo.
pub async fn echo_server() -> (u16, tokio::task::JoinHandle<()>) {
    egress_emulators::echo::start(0).await.unwrap()
}
