//! Real-proxy mode: every running emulated instance is a real forward proxy on 127.0.0.1.
//!
//! The emulators normally hand out addresses nobody listens on. For the local demo (and any
//! test that wants the whole path, from `Proxy` object to a request through the proxy),
//! [`RealProxies`] is plugged into an emulator's configuration
//! ([`crate::hetzner::HetznerConfig::real_proxies`], [`crate::ec2::Ec2Config::real_proxies`]):
//!
//! - when an instance becomes running, a forward proxy is started on `127.0.0.1:PORT` and
//!   the instance's public IPv4 address becomes `127.0.0.1`;
//! - when it stops running (delete/terminate started, state forced elsewhere, held back in
//!   provisioning, emulator reset) the proxy is stopped, and every proxy an emulator started
//!   is stopped when the emulator is dropped (or when the [`RealProxies`] itself is).
//!
//! # Which address
//!
//! By default every instance gets `127.0.0.1`, so two instances need two ports. Made with
//! [`RealProxies::with_own_addresses`], each instance gets an address of its own on the
//! loopback network instead (`127.0.0.2`, `127.0.0.3`, ..., unique in the process), its proxy
//! listens there and connects out from there: many instances share one port, as a
//! ProxyPool's do, and a request through an instance's proxy arrives from that instance's
//! address, as on a cloud. Everything stays on the loopback interface.
//!
//! # Which port
//!
//! The instance learns its port the way a real machine does: from its user data. The rule
//! is tinyproxy's own config syntax: **the first line of the user data that, with leading
//! and trailing whitespace removed, reads `Port N`** (`N` in 1..=65535) is the port. A
//! cloud-init that writes a `tinyproxy.conf` through `write_files` carries exactly such a
//! line, indented inside the YAML block; so do the demo's samples (`config/samples/demo/`).
//! User data without such a line, or with `Port` followed by something that is not a port,
//! leaves the instance running *without* a proxy, with a warning naming the instance and
//! the problem (the content of the user data is never logged). So does a port that is
//! already taken on 127.0.0.1. An instance with no user data at all (one planted through
//! the control surface, say) asked for nothing: it runs without a proxy, logged at info.
//!
//! # Credentials
//!
//! The same way, in tinyproxy's syntax: every line of the user data that, trimmed, reads
//! `BasicAuth USER PASSWORD` (three words) adds a user. With at least one, the proxy
//! requires Basic proxy authentication as one of them: tinyproxy gets the lines in its
//! config (it answers a request without or with wrong credentials with 407, or 401), the
//! built-in proxy answers it with `407 Proxy Authentication Required`. Without any, the
//! proxy is open to 127.0.0.1, as before. The operator's template
//! (`BasicAuth {{egress.username}} {{egress.password}}`) renders exactly such a line.
//!
//! # Which clients
//!
//! Every line that, trimmed, reads `Allow NETWORK` (an address or a CIDR, tinyproxy's
//! syntax) restricts the proxy to clients from those networks; others get `403`. Without
//! any, every client on loopback may use it. The operator's
//! `Allow {{egress.allowedClients}}` renders such a line for one network.
//!
//! # Which proxy
//!
//! [`ProxyKind::Auto`] runs tinyproxy when it is installed (`tinyproxy -d -c FILE`, with
//! `Port N`, `Listen 127.0.0.1`, `Allow 127.0.0.1`, stopped by PID: kill, then wait) and
//! otherwise a small built-in proxy on a thread of its own: `CONNECT host:port` tunnels,
//! plus plain `GET http://host:port/path` (absolute URI) forwarding. Both accept clients
//! from 127.0.0.1 only.
//!
//! Starting a proxy runs inside the emulator's state lock (the instance's address and its
//! proxy change together); it waits at most [`START_TIMEOUT`] for tinyproxy to listen.

use std::collections::BTreeMap;
use std::fmt;
use std::net::{Ipv4Addr, Ipv6Addr, SocketAddr, TcpListener};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// How long tinyproxy gets to start listening before the instance runs without a proxy.
pub const START_TIMEOUT: Duration = Duration::from_secs(5);

/// The address every instance gets in real-proxy mode.
pub const LOOPBACK: Ipv4Addr = Ipv4Addr::LOCALHOST;

/// Which forward proxy runs on each instance.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ProxyKind {
    /// tinyproxy when it is on `PATH` (or in `/usr/sbin`, `/usr/bin`), else the built-in one.
    Auto,
    /// Always the built-in proxy.
    Builtin,
    /// tinyproxy at this path.
    Tinyproxy(PathBuf),
}

/// Why an instance's user data names no usable port.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PortError {
    /// No `Port N` line at all (or no user data).
    Missing,
    /// A `Port` line whose value is not a port number in 1..=65535.
    Invalid(String),
}

impl fmt::Display for PortError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            PortError::Missing => write!(f, "the user data has no `Port N` line"),
            PortError::Invalid(v) => {
                write!(f, "the user data's `Port` line has value {v:?}, not a port in 1..=65535")
            }
        }
    }
}

/// The proxy port an instance's user data asks for; see "Which port" in the module docs.
pub fn port_from_user_data(user_data: Option<&[u8]>) -> Result<u16, PortError> {
    let text = String::from_utf8_lossy(user_data.unwrap_or_default());
    for line in text.lines() {
        let mut words = line.split_whitespace();
        if words.next() != Some("Port") {
            continue;
        }
        let value: Vec<&str> = words.collect();
        let value = value.join(" ");
        return match value.parse::<u16>() {
            Ok(p) if p > 0 && !value.starts_with('+') => Ok(p),
            _ => Err(PortError::Invalid(value)),
        };
    }
    Err(PortError::Missing)
}

/// The users (`BasicAuth USER PASSWORD` lines) an instance's user data asks its proxy to
/// require; see "Credentials" in the module docs. Lines with another number of words are
/// not a user (tinyproxy would refuse them; here the proxy just stays open to the others).
pub fn basic_auth_from_user_data(user_data: Option<&[u8]>) -> Vec<(String, String)> {
    let text = String::from_utf8_lossy(user_data.unwrap_or_default());
    text.lines()
        .filter_map(|line| {
            let words: Vec<&str> = line.split_whitespace().collect();
            match words[..] {
                ["BasicAuth", user, pass] => Some((user.to_string(), pass.to_string())),
                _ => None,
            }
        })
        .collect()
}

/// A client network of an `Allow` line: an address and a prefix length.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Network {
    pub addr: std::net::IpAddr,
    pub prefix: u8,
}

impl Network {
    /// `203.0.113.0/24`, `2001:db8::/32` or a single address.
    fn parse(s: &str) -> Option<Network> {
        let (addr, prefix) = match s.split_once('/') {
            Some((a, p)) => (a.parse::<std::net::IpAddr>().ok()?, Some(p.parse::<u8>().ok()?)),
            None => (s.parse().ok()?, None),
        };
        let max = if addr.is_ipv4() { 32 } else { 128 };
        let prefix = prefix.unwrap_or(max);
        (prefix <= max).then_some(Network { addr, prefix })
    }

    pub fn contains(&self, ip: std::net::IpAddr) -> bool {
        use std::net::IpAddr::{V4, V6};
        let (net, ip, bits) = match (self.addr, ip) {
            (V4(n), V4(i)) => (u128::from(u32::from(n)), u128::from(u32::from(i)), 32),
            (V6(n), V6(i)) => (u128::from(n), u128::from(i), 128),
            _ => return false,
        };
        let host_bits = bits - u32::from(self.prefix);
        host_bits >= bits || (net >> host_bits) == (ip >> host_bits)
    }
}

/// The client networks (`Allow NETWORK` lines, tinyproxy's syntax) an instance's user data
/// lets use its proxy. None: every client (on loopback) may. Lines whose value is not an
/// address or network are left out, as tinyproxy would refuse to start with them (here
/// the proxy runs with the others).
pub fn allowed_clients_from_user_data(user_data: Option<&[u8]>) -> Vec<Network> {
    let text = String::from_utf8_lossy(user_data.unwrap_or_default());
    text.lines()
        .filter_map(|line| match line.split_whitespace().collect::<Vec<_>>()[..] {
            ["Allow", value] => Network::parse(value),
            _ => None,
        })
        .collect()
}

/// Loopback addresses held by running instances, across every [`RealProxies`] with own
/// addresses in the process.
static HELD: Mutex<std::collections::BTreeSet<Ipv4Addr>> =
    Mutex::new(std::collections::BTreeSet::new());

/// The forward proxies of the instances of one or more emulators, keyed by instance ID.
pub struct RealProxies {
    kind: Resolved,
    dir: PathBuf,
    /// Each instance on its own loopback address (see [`RealProxies::with_own_addresses`]).
    own_addresses: bool,
    running: Mutex<BTreeMap<String, Running>>,
    /// With own addresses: each running instance's address, proxy or not.
    addresses: Mutex<BTreeMap<String, Ipv4Addr>>,
}

#[derive(Debug, Clone)]
enum Resolved {
    Builtin,
    Tinyproxy(PathBuf),
}

enum Running {
    Tinyproxy { child: Child, conf: PathBuf, addr: SocketAddr, ipv6: bool },
    Builtin(BuiltinProxy),
}

impl Running {
    fn addr(&self) -> SocketAddr {
        match self {
            Running::Tinyproxy { addr, .. } => *addr,
            Running::Builtin(b) => b.addr,
        }
    }

    /// It listens on `[::1]:port` too.
    fn ipv6(&self) -> bool {
        match self {
            Running::Tinyproxy { ipv6, .. } => *ipv6,
            Running::Builtin(b) => b.ipv6,
        }
    }

    fn port(&self) -> u16 {
        self.addr().port()
    }

    fn stop(self) {
        match self {
            Running::Tinyproxy { mut child, conf, .. } => {
                // By PID: the Child is not reaped until `wait`, so the PID cannot have been
                // reused by another process.
                let _ = child.kill();
                let _ = child.wait();
                let _ = std::fs::remove_file(conf);
            }
            Running::Builtin(b) => drop(b),
        }
    }
}

impl fmt::Debug for RealProxies {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RealProxies")
            .field("kind", &self.kind_name())
            .field("listening", &self.listening())
            .finish()
    }
}

static NEXT_DIR: AtomicU64 = AtomicU64::new(0);

/// tinyproxy on PATH, `/usr/sbin` or `/usr/bin`.
pub fn find_tinyproxy() -> Option<PathBuf> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .chain([PathBuf::from("/usr/sbin"), PathBuf::from("/usr/bin")])
        .map(|d| d.join("tinyproxy"))
        .find(|p| p.is_file())
}

impl RealProxies {
    /// Ready to start proxies; nothing runs until an instance does.
    pub fn new(kind: ProxyKind) -> Arc<RealProxies> {
        let kind = match kind {
            ProxyKind::Builtin => Resolved::Builtin,
            ProxyKind::Tinyproxy(p) => Resolved::Tinyproxy(p),
            ProxyKind::Auto => find_tinyproxy().map_or(Resolved::Builtin, Resolved::Tinyproxy),
        };
        let dir = std::env::temp_dir().join(format!(
            "egress-real-proxies-{}-{}",
            std::process::id(),
            NEXT_DIR.fetch_add(1, Ordering::Relaxed)
        ));
        Arc::new(RealProxies {
            kind,
            dir,
            own_addresses: false,
            running: Mutex::new(BTreeMap::new()),
            addresses: Mutex::new(BTreeMap::new()),
        })
    }

    /// Like [`RealProxies::new`], but every instance gets an address of its own on the
    /// loopback network (127.0.0.2, 127.0.0.3, ...; Linux answers on all of 127.0.0.0/8
    /// without configuration), as instances on a cloud each have their own IP. Many
    /// instances can then run a proxy on the same port, as a ProxyPool's Proxies do. Nothing
    /// leaves the machine either way.
    pub fn with_own_addresses(kind: ProxyKind) -> Arc<RealProxies> {
        let mut proxies = Arc::into_inner(RealProxies::new(kind)).expect("just made");
        proxies.own_addresses = true;
        Arc::new(proxies)
    }

    /// The address for an instance starting now: [`LOOPBACK`], or with own addresses the
    /// lowest loopback address no instance of any emulator in this process holds (the
    /// demo runs one set of real proxies per emulator, and two clouds' instances must not
    /// share an address either).
    ///
    /// With a `port`, an address where something else (a proxy another process left
    /// behind) already listens on it is skipped too.
    fn address_for_new(&self, port: Option<u16>) -> Ipv4Addr {
        if !self.own_addresses {
            return LOOPBACK;
        }
        let mut taken = HELD.lock().unwrap_or_else(|e| e.into_inner());
        let free = |ip: &Ipv4Addr| port.is_none_or(|p| TcpListener::bind((*ip, p)).is_ok());
        let ip = (2u32..(1 << 16))
            .map(|n| Ipv4Addr::from(0x7f00_0000 | n))
            .filter(|ip| !taken.contains(ip))
            .take(1024)
            .find(free)
            .unwrap_or(LOOPBACK);
        taken.insert(ip);
        ip
    }

    /// The address of an instance that stopped goes back to the pool.
    fn release(&self, ip: Ipv4Addr) {
        if self.own_addresses && ip != LOOPBACK {
            HELD.lock().unwrap_or_else(|e| e.into_inner()).remove(&ip);
        }
    }

    /// `"tinyproxy"` or `"built-in"`.
    pub fn kind_name(&self) -> &'static str {
        match self.kind {
            Resolved::Builtin => "built-in",
            Resolved::Tinyproxy(_) => "tinyproxy",
        }
    }

    fn lock(&self) -> MutexGuard<'_, BTreeMap<String, Running>> {
        self.running.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Instance `id` is running with this user data: start its proxy (replacing one it
    /// already had) and return the address the instance now has, [`LOOPBACK`]. Failures
    /// are warnings: the instance runs without a proxy, as a machine with a broken
    /// cloud-init would.
    pub fn start(&self, id: &str, user_data: Option<&[u8]>) -> Ipv4Addr {
        self.stop(id);
        let wanted = port_from_user_data(user_data);
        let ip = self.address_for_new(wanted.as_ref().ok().copied());
        if self.own_addresses {
            self.addresses.lock().unwrap_or_else(|e| e.into_inner()).insert(id.to_string(), ip);
        }
        let port = match wanted {
            Ok(p) => p,
            Err(PortError::Missing) if user_data.is_none_or(<[u8]>::is_empty) => {
                tracing::info!(instance = id, "real-proxy mode: no user data, no proxy");
                return ip;
            }
            Err(e) => {
                tracing::warn!(instance = id, "real-proxy mode: no proxy started: {e}");
                return ip;
            }
        };
        let users = basic_auth_from_user_data(user_data);
        let clients = allowed_clients_from_user_data(user_data);
        match self.spawn(id, ip, port, users, clients) {
            Ok(running) => {
                tracing::info!(
                    instance = id,
                    port,
                    kind = self.kind_name(),
                    "real-proxy mode: proxy listening on {ip}:{port}"
                );
                self.lock().insert(id.to_string(), running);
            }
            Err(e) => tracing::warn!(
                instance = id,
                port,
                "real-proxy mode: no proxy started on {ip}:{port}: {e}"
            ),
        }
        ip
    }

    /// Instance `id` stopped running: stop its proxy, if it has one.
    pub fn stop(&self, id: &str) {
        let held = self.addresses.lock().unwrap_or_else(|e| e.into_inner()).remove(id);
        if let Some(ip) = held {
            self.release(ip);
        }
        let running = self.lock().remove(id);
        if let Some(r) = running {
            let port = r.port();
            r.stop();
            tracing::info!(instance = id, port, "real-proxy mode: proxy stopped");
        }
    }

    /// Stop every proxy.
    pub fn stop_all(&self) {
        let held = std::mem::take(&mut *self.addresses.lock().unwrap_or_else(|e| e.into_inner()));
        for (_, ip) in held {
            self.release(ip);
        }
        let all = std::mem::take(&mut *self.lock());
        for (_, r) in all {
            r.stop();
        }
    }

    /// The port of instance `id`'s proxy, while it runs.
    pub fn port_of(&self, id: &str) -> Option<u16> {
        self.lock().get(id).map(Running::port)
    }

    /// The IPv6 address instance `id`'s proxy also listens on: `::1`, when its port was
    /// free there. There is one IPv6 loopback address, so of instances sharing a port only
    /// the first gets it; an emulator reports the others' IPv6 as unreachable.
    pub fn ipv6_of(&self, id: &str) -> Option<Ipv6Addr> {
        self.lock().get(id).filter(|r| r.ipv6()).map(|_| Ipv6Addr::LOCALHOST)
    }

    /// Every running proxy: instance ID and port.
    pub fn listening(&self) -> Vec<(String, u16)> {
        self.lock().iter().map(|(id, r)| (id.clone(), r.port())).collect()
    }

    fn spawn(
        &self,
        id: &str,
        ip: Ipv4Addr,
        port: u16,
        users: Vec<(String, String)>,
        clients: Vec<Network>,
    ) -> Result<Running, String> {
        // tinyproxy would fail to bind a taken port and exit, and a readiness check would
        // then find the other listener; ask first. The built-in proxy binds for real here.
        let listener = TcpListener::bind((ip, port))
            .map_err(|e| format!("port {port} on {ip} is not available: {e}"))?;
        // Dual stack where the IPv6 loopback has the port free, as a cloud instance has
        // both addresses; without it (taken, or no IPv6 on this machine) IPv4 only.
        let v6 = TcpListener::bind((Ipv6Addr::LOCALHOST, port)).ok();
        match &self.kind {
            Resolved::Builtin => {
                let egress = self.own_addresses.then_some(ip);
                BuiltinProxy::start(listener, v6, id, users, clients, egress).map(Running::Builtin)
            }
            Resolved::Tinyproxy(bin) => {
                drop(listener);
                let ipv6 = v6.is_some();
                drop(v6);
                let addr = SocketAddr::from((ip, port));
                self.spawn_tinyproxy(bin, id, addr, ipv6, &users, &clients)
            }
        }
    }

    fn spawn_tinyproxy(
        &self,
        bin: &Path,
        id: &str,
        addr: SocketAddr,
        ipv6: bool,
        users: &[(String, String)],
        clients: &[Network],
    ) -> Result<Running, String> {
        let (ip, port) = (addr.ip(), addr.port());
        let listen_v6 = if ipv6 { "Listen ::1\n" } else { "" };
        // With own addresses, outgoing connections leave from the instance's address.
        let bind = if self.own_addresses { format!("Bind {ip}\n") } else { String::new() };
        // The user data's client networks, or every loopback client.
        let allow: String = if clients.is_empty() {
            "Allow 127.0.0.0/8\nAllow ::1\n".into()
        } else {
            clients.iter().map(|n| format!("Allow {}/{}\n", n.addr, n.prefix)).collect()
        };
        std::fs::create_dir_all(&self.dir)
            .map_err(|e| format!("creating {}: {e}", self.dir.display()))?;
        let safe: String =
            id.chars().map(|c| if c.is_ascii_alphanumeric() { c } else { '_' }).collect();
        let conf = self.dir.join(format!("tinyproxy-{safe}-{port}.conf"));
        let auth: String = users.iter().map(|(u, p)| format!("BasicAuth {u} {p}\n")).collect();
        std::fs::write(
            &conf,
            format!(
                "Port {port}\nListen {ip}\n{listen_v6}{bind}{allow}LogLevel Error\nMaxClients 100\nTimeout 120\n{auth}"
            ),
        )
        .map_err(|e| format!("writing {}: {e}", conf.display()))?;
        let mut child = Command::new(bin)
            .arg("-d")
            .arg("-c")
            .arg(&conf)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .map_err(|e| format!("starting {}: {e}", bin.display()))?;
        let deadline = Instant::now() + START_TIMEOUT;
        loop {
            if let Ok(Some(status)) = child.try_wait() {
                let _ = std::fs::remove_file(&conf);
                return Err(format!("tinyproxy exited at start ({status})"));
            }
            if std::net::TcpStream::connect_timeout(&addr, Duration::from_millis(100)).is_ok() {
                return Ok(Running::Tinyproxy { child, conf, addr, ipv6 });
            }
            if Instant::now() >= deadline {
                let _ = child.kill();
                let _ = child.wait();
                let _ = std::fs::remove_file(&conf);
                return Err(format!("tinyproxy did not listen within {START_TIMEOUT:?}"));
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }
}

impl Drop for RealProxies {
    fn drop(&mut self) {
        self.stop_all();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// The built-in forward proxy: a thread with its own runtime, serving until dropped.
struct BuiltinProxy {
    addr: SocketAddr,
    /// It listens on `[::1]:port` too.
    ipv6: bool,
    shutdown: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

/// Largest request head the built-in proxy reads.
const MAX_HEAD: usize = 16 * 1024;

impl BuiltinProxy {
    fn start(
        listener: TcpListener,
        v6: Option<TcpListener>,
        id: &str,
        users: Vec<(String, String)>,
        clients: Vec<Network>,
        egress: Option<Ipv4Addr>,
    ) -> Result<BuiltinProxy, String> {
        // `Basic base64(user:password)` for each user: what a client's header must carry.
        let accepted: Arc<Vec<String>> = Arc::new(
            users
                .iter()
                .map(|(u, p)| data_encoding::BASE64.encode(format!("{u}:{p}").as_bytes()))
                .collect(),
        );
        let addr = listener.local_addr().map_err(|e| e.to_string())?;
        let ipv6 = v6.is_some();
        let listeners: Vec<TcpListener> = std::iter::once(listener).chain(v6).collect();
        for l in &listeners {
            l.set_nonblocking(true).map_err(|e| format!("non-blocking listener: {e}"))?;
        }
        let (tx, rx) = tokio::sync::oneshot::channel::<()>();
        let thread = std::thread::Builder::new()
            .name(format!("proxy-{id}"))
            .spawn(move || {
                let rt = match tokio::runtime::Builder::new_current_thread().enable_all().build() {
                    Ok(rt) => rt,
                    Err(e) => {
                        tracing::warn!("built-in proxy runtime: {e}");
                        return;
                    }
                };
                rt.block_on(async move {
                    let clients = Arc::new(clients);
                    let accepts = listeners.into_iter().filter_map(|l| {
                        let listener = tokio::net::TcpListener::from_std(l).ok()?;
                        let (accepted, clients) = (accepted.clone(), clients.clone());
                        Some(tokio::spawn(async move {
                            loop {
                                let Ok((stream, peer)) = listener.accept().await else {
                                    continue;
                                };
                                if !peer.ip().is_loopback() {
                                    continue;
                                }
                                // Like tinyproxy: a client outside the Allow networks gets 403.
                                let allowed = clients.is_empty()
                                    || clients.iter().any(|n| n.contains(peer.ip()));
                                tokio::spawn(serve(stream, accepted.clone(), allowed, egress));
                            }
                        }))
                    });
                    let accepts: Vec<_> = accepts.collect();
                    let _ = rx.await;
                    for a in accepts {
                        a.abort();
                    }
                });
                // Dropping the runtime closes every open tunnel.
            })
            .map_err(|e| format!("spawning the proxy thread: {e}"))?;
        Ok(BuiltinProxy { addr, ipv6, shutdown: Some(tx), thread: Some(thread) })
    }
}

impl Drop for BuiltinProxy {
    fn drop(&mut self) {
        if let Some(tx) = self.shutdown.take() {
            let _ = tx.send(());
        }
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

async fn reply(stream: &mut tokio::net::TcpStream, status: &str) {
    let _ = stream
        .write_all(
            format!("HTTP/1.1 {status}\r\ncontent-length: 0\r\nconnection: close\r\n\r\n")
                .as_bytes(),
        )
        .await;
}

/// Whether the request head's `Proxy-Authorization` carries Basic credentials of one of
/// the `accepted` users (each `base64(user:password)`); anything passes when there are none.
fn authorized(head: &str, accepted: &[String]) -> bool {
    if accepted.is_empty() {
        return true;
    }
    head.split("\r\n").skip(1).any(|line| {
        let Some((name, value)) = line.split_once(':') else {
            return false;
        };
        if !name.trim().eq_ignore_ascii_case("proxy-authorization") {
            return false;
        }
        let mut words = value.split_whitespace();
        let (Some(scheme), Some(token), None) = (words.next(), words.next(), words.next()) else {
            return false;
        };
        scheme.eq_ignore_ascii_case("basic") && accepted.iter().any(|a| a == token)
    })
}

/// A connection to `target` (`host:port`), from `egress` when set: with own addresses an
/// instance's traffic leaves from its own address, as it would from a cloud instance's IP.
async fn connect_from(
    egress: Option<Ipv4Addr>,
    target: &str,
) -> std::io::Result<tokio::net::TcpStream> {
    let Some(ip) = egress else {
        return tokio::net::TcpStream::connect(target).await;
    };
    let to = tokio::net::lookup_host(target)
        .await?
        .find(SocketAddr::is_ipv4)
        .ok_or_else(|| std::io::Error::other(format!("{target}: no IPv4 address")))?;
    let socket = tokio::net::TcpSocket::new_v4()?;
    socket.bind(SocketAddr::from((ip, 0)))?;
    socket.connect(to).await
}

/// One client connection: a CONNECT tunnel or one absolute-URI HTTP request, once the
/// client has shown credentials, when the proxy requires them.
async fn serve(
    mut client: tokio::net::TcpStream,
    accepted: Arc<Vec<String>>,
    allowed: bool,
    egress: Option<Ipv4Addr>,
) {
    let mut buf = Vec::with_capacity(1024);
    let head_end = loop {
        if let Some(i) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            break i + 4;
        }
        if buf.len() > MAX_HEAD {
            return reply(&mut client, "431 Request Header Fields Too Large").await;
        }
        let mut chunk = [0u8; 4096];
        match client.read(&mut chunk).await {
            Ok(0) | Err(_) => return,
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
        }
    };
    if !allowed {
        return reply(&mut client, "403 Forbidden").await;
    }
    let head = String::from_utf8_lossy(&buf[..head_end]).into_owned();
    let rest = buf[head_end..].to_vec();
    let mut lines = head.split("\r\n");
    let request_line = lines.next().unwrap_or_default();
    let parts: Vec<&str> = request_line.split(' ').collect();
    let [method, target, version] = parts[..] else {
        return reply(&mut client, "400 Bad Request").await;
    };
    if !authorized(&head, &accepted) {
        let _ = client
            .write_all(
                b"HTTP/1.1 407 Proxy Authentication Required\r\nproxy-authenticate: Basic realm=\"proxy\"\r\ncontent-length: 0\r\nconnection: close\r\n\r\n",
            )
            .await;
        return;
    }
    if method == "CONNECT" {
        let Ok(mut upstream) = connect_from(egress, target).await else {
            return reply(&mut client, "502 Bad Gateway").await;
        };
        if client.write_all(b"HTTP/1.1 200 Connection established\r\n\r\n").await.is_err() {
            return;
        }
        if !rest.is_empty() && upstream.write_all(&rest).await.is_err() {
            return;
        }
        let _ = tokio::io::copy_bidirectional(&mut client, &mut upstream).await;
        return;
    }
    // Plain HTTP through the proxy: `GET http://host:port/path HTTP/1.1`.
    let Some(after_scheme) = target.strip_prefix("http://") else {
        return reply(&mut client, "400 Bad Request").await;
    };
    let (authority, path) = match after_scheme.find('/') {
        Some(i) => (&after_scheme[..i], &after_scheme[i..]),
        None => (after_scheme, "/"),
    };
    let upstream_addr =
        if authority.contains(':') { authority.to_string() } else { format!("{authority}:80") };
    let Ok(mut upstream) = connect_from(egress, &upstream_addr).await else {
        return reply(&mut client, "502 Bad Gateway").await;
    };
    let mut out = format!("{method} {path} {version}\r\n");
    let mut has_host = false;
    for line in lines.filter(|l| !l.is_empty()) {
        let name = line.split(':').next().unwrap_or_default().to_ascii_lowercase();
        if name.starts_with("proxy-") || name == "connection" || name == "keep-alive" {
            continue;
        }
        has_host |= name == "host";
        out.push_str(line);
        out.push_str("\r\n");
    }
    if !has_host {
        out.push_str(&format!("Host: {authority}\r\n"));
    }
    // One request per connection keeps the forwarding a plain byte copy.
    out.push_str("Connection: close\r\n\r\n");
    if upstream.write_all(out.as_bytes()).await.is_err()
        || (!rest.is_empty() && upstream.write_all(&rest).await.is_err())
    {
        return reply(&mut client, "502 Bad Gateway").await;
    }
    let _ = tokio::io::copy_bidirectional(&mut client, &mut upstream).await;
}

#[cfg(test)]
pub(crate) mod tests;
