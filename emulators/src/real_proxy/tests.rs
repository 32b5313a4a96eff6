use super::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// An HTTP server on 127.0.0.1 whose every answer is `hello from <client ip>`.
pub(crate) async fn echo_server() -> u16 {
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = l.local_addr().unwrap().port();
    tokio::spawn(async move {
        loop {
            let Ok((mut s, peer)) = l.accept().await else {
                return;
            };
            tokio::spawn(async move {
                let mut got = Vec::new();
                let mut buf = [0u8; 1024];
                while !got.windows(4).any(|w| w == b"\r\n\r\n") {
                    match s.read(&mut buf).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => got.extend_from_slice(&buf[..n]),
                    }
                }
                let first = String::from_utf8_lossy(&got).lines().next().unwrap_or("").to_string();
                let body = format!("hello from {} ({first})", peer.ip());
                let _ = s
                    .write_all(
                        format!(
                            "HTTP/1.1 200 OK\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
                            body.len()
                        )
                        .as_bytes(),
                    )
                    .await;
            });
        }
    });
    port
}

/// CONNECT through the proxy on `proxy_port` to the echo server, then GET / in the tunnel.
pub(crate) async fn get_through_tunnel(proxy_port: u16, target_port: u16) -> String {
    get_through_tunnel_at(LOOPBACK, proxy_port, target_port).await
}

/// [`get_through_tunnel`] to a proxy on `ip`.
async fn get_through_tunnel_at(ip: Ipv4Addr, proxy_port: u16, target_port: u16) -> String {
    let mut s = TcpStream::connect((ip, proxy_port)).await.unwrap();
    s.write_all(
        format!(
            "CONNECT 127.0.0.1:{target_port} HTTP/1.1\r\nHost: 127.0.0.1:{target_port}\r\n\r\n"
        )
        .as_bytes(),
    )
    .await
    .unwrap();
    let mut head = Vec::new();
    let mut b = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        assert_eq!(s.read(&mut b).await.unwrap(), 1, "proxy closed during CONNECT");
        head.push(b[0]);
    }
    let head = String::from_utf8_lossy(&head).to_string();
    assert!(head.starts_with("HTTP/1.1 200") || head.starts_with("HTTP/1.0 200"), "{head}");
    s.write_all(b"GET / HTTP/1.1\r\nHost: echo\r\nConnection: close\r\n\r\n").await.unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).await.unwrap();
    out.split("\r\n\r\n").nth(1).unwrap_or_default().to_string()
}

pub(crate) fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

pub(crate) fn closed(port: u16) -> bool {
    std::net::TcpStream::connect((LOOPBACK, port)).is_err()
}

/// tinyproxy, or a skip message (a failure under CI=true, where it must be installed).
fn tinyproxy_or_skip() -> Option<PathBuf> {
    let found = find_tinyproxy();
    if found.is_none() {
        let msg = "tinyproxy is not installed (apt-get install tinyproxy)";
        if std::env::var("CI").is_ok_and(|v| v == "true") {
            panic!("{msg}");
        }
        eprintln!("\n!!! SKIPPING: {msg}\n");
    }
    found
}

#[test]
fn port_comes_from_the_first_port_line() {
    let cases: &[(Option<&str>, Result<u16, PortError>)] = &[
        (None, Err(PortError::Missing)),
        (Some(""), Err(PortError::Missing)),
        (Some("#cloud-config\nruncmd: [echo hi]\n"), Err(PortError::Missing)),
        (Some("Port 3128\n"), Ok(3128)),
        (
            Some(
                "#cloud-config\nwrite_files:\n  - path: /etc/tinyproxy/tinyproxy.conf\n    content: |\n      Port 31281\n      Listen 0.0.0.0\n",
            ),
            Ok(31281),
        ),
        (Some("Port 1\nPort 2\n"), Ok(1)),
        (Some("\tPort   8888  \r\n"), Ok(8888)),
        (Some("# Port 9 is in a comment\nPort 10\n"), Ok(10)),
        (Some("ListenPort 5\nPorts 6\nPort 7"), Ok(7)),
        (Some("Port\n"), Err(PortError::Invalid(String::new()))),
        (Some("Port 0\n"), Err(PortError::Invalid("0".into()))),
        (Some("Port 65536\n"), Err(PortError::Invalid("65536".into()))),
        (Some("Port +80\n"), Err(PortError::Invalid("+80".into()))),
        (Some("Port 80 81\n"), Err(PortError::Invalid("80 81".into()))),
        (Some("Port abc\nPort 80\n"), Err(PortError::Invalid("abc".into()))),
    ];
    for (input, want) in cases {
        assert_eq!(&port_from_user_data(input.map(str::as_bytes)), want, "user data {input:?}");
    }
    // Not UTF-8 around the line: still found.
    assert_eq!(port_from_user_data(Some(b"\xff\xfe\nPort 99\n")), Ok(99));
    assert!(
        PortError::Invalid("abc".into()).to_string().contains("\"abc\""),
        "the error names the value"
    );
}

async fn start_connect_stop(proxies: Arc<RealProxies>) {
    let echo = echo_server().await;
    let port = free_port();
    let ud = format!("#cloud-config\nwrite_files:\n  - content: |\n      Port {port}\n");
    let p = proxies.clone();
    let ip =
        tokio::task::spawn_blocking(move || p.start("i-1", Some(ud.as_bytes()))).await.unwrap();
    assert_eq!(ip, LOOPBACK);
    assert_eq!(proxies.port_of("i-1"), Some(port));
    assert_eq!(proxies.listening(), vec![("i-1".to_string(), port)]);
    let body = get_through_tunnel(port, echo).await;
    assert!(body.starts_with("hello from 127.0.0.1"), "{body}");
    let p = proxies.clone();
    tokio::task::spawn_blocking(move || p.stop("i-1")).await.unwrap();
    assert!(closed(port), "port {port} still open after stop");
    assert_eq!(proxies.port_of("i-1"), None);
}

#[tokio::test(flavor = "multi_thread")]
async fn builtin_proxy_tunnels_and_stops() {
    let proxies = RealProxies::new(ProxyKind::Builtin);
    assert_eq!(proxies.kind_name(), "built-in");
    start_connect_stop(proxies).await;
}

/// With own addresses, instances share a port the way cloud instances do: each on its own
/// loopback address, each reachable there, each one's traffic leaving from that address;
/// a stopped instance's address is free again.
async fn own_addresses_share_a_port(proxies: Arc<RealProxies>) {
    let echo = echo_server().await;
    let port = free_port();
    let ud = format!("Port {port}\n");
    let start = |id: &'static str| {
        let (p, ud) = (proxies.clone(), ud.clone());
        tokio::task::spawn_blocking(move || p.start(id, Some(ud.as_bytes())))
    };
    let a = start("i-a").await.unwrap();
    let b = start("i-b").await.unwrap();
    assert!(a != b && a != LOOPBACK && b != LOOPBACK, "{a} {b}");
    assert!(a.is_loopback() && b.is_loopback(), "{a} {b}");
    for ip in [a, b] {
        let body = get_through_tunnel_at(ip, port, echo).await;
        assert!(body.starts_with(&format!("hello from {ip} ")), "{ip}: {body}");
    }
    let p = proxies.clone();
    tokio::task::spawn_blocking(move || p.stop("i-a")).await.unwrap();
    assert!(!HELD.lock().unwrap().contains(&a), "{a} released");
    assert!(HELD.lock().unwrap().contains(&b), "{b} still held");
    let p = proxies.clone();
    tokio::task::spawn_blocking(move || p.stop_all()).await.unwrap();
    assert!(!HELD.lock().unwrap().contains(&b), "{b} released by stop_all");
}

#[tokio::test(flavor = "multi_thread")]
async fn builtin_proxies_with_own_addresses_share_a_port() {
    own_addresses_share_a_port(RealProxies::with_own_addresses(ProxyKind::Builtin)).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn tinyproxies_with_own_addresses_share_a_port() {
    let Some(bin) = tinyproxy_or_skip() else {
        return;
    };
    own_addresses_share_a_port(RealProxies::with_own_addresses(ProxyKind::Tinyproxy(bin))).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn tinyproxy_tunnels_and_stops() {
    let Some(bin) = tinyproxy_or_skip() else {
        return;
    };
    let proxies = RealProxies::new(ProxyKind::Tinyproxy(bin));
    assert_eq!(proxies.kind_name(), "tinyproxy");
    start_connect_stop(proxies).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn builtin_proxy_forwards_absolute_uri_get() {
    let echo = echo_server().await;
    let port = free_port();
    let proxies = RealProxies::new(ProxyKind::Builtin);
    let p = proxies.clone();
    tokio::task::spawn_blocking(move || p.start("a", Some(format!("Port {port}").as_bytes())))
        .await
        .unwrap();
    let mut s = TcpStream::connect((LOOPBACK, port)).await.unwrap();
    s.write_all(
        format!("GET http://127.0.0.1:{echo}/x?y=1 HTTP/1.1\r\nHost: 127.0.0.1:{echo}\r\nProxy-Connection: keep-alive\r\n\r\n")
            .as_bytes(),
    )
    .await
    .unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).await.unwrap();
    assert!(out.starts_with("HTTP/1.1 200"), "{out}");
    assert!(out.ends_with("hello from 127.0.0.1 (GET /x?y=1 HTTP/1.1)"), "{out}");

    // Not a proxy request: refused with a status, not a hang.
    let mut s = TcpStream::connect((LOOPBACK, port)).await.unwrap();
    s.write_all(b"GET /relative HTTP/1.1\r\n\r\n").await.unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).await.unwrap();
    assert!(out.starts_with("HTTP/1.1 400"), "{out}");
    drop(proxies);
    assert!(closed(port), "dropping RealProxies stops its proxies");
}

#[tokio::test(flavor = "multi_thread")]
async fn no_port_or_taken_port_runs_without_a_proxy() {
    let proxies = RealProxies::new(ProxyKind::Builtin);
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = taken.local_addr().unwrap().port();
    let p = proxies.clone();
    let (a, b) = tokio::task::spawn_blocking(move || {
        (
            p.start("no-port", Some(b"#cloud-config\n")),
            p.start("taken", Some(format!("Port {port}").as_bytes())),
        )
    })
    .await
    .unwrap();
    assert_eq!((a, b), (LOOPBACK, LOOPBACK), "still running, at 127.0.0.1");
    assert!(proxies.listening().is_empty(), "{:?}", proxies.listening());
}

#[test]
fn users_come_from_basic_auth_lines() {
    type Case<'a> = (Option<&'a str>, &'a [(&'a str, &'a str)]);
    let cases: &[Case<'_>] = &[
        (None, &[]),
        (Some("#cloud-config\nPort 3128\n"), &[]),
        (Some("      BasicAuth alice s3cret\n"), &[("alice", "s3cret")]),
        (Some("BasicAuth a b\n\tBasicAuth  c  d \r\n"), &[("a", "b"), ("c", "d")]),
        // Not three words, or not the directive: not a user.
        (Some("BasicAuth alice\nBasicAuth a b c\n# BasicAuth x y\nBasicAuthX x y\n"), &[]),
    ];
    for (input, want) in cases {
        let got = basic_auth_from_user_data(input.map(str::as_bytes));
        let want: Vec<(String, String)> =
            want.iter().map(|(u, p)| (u.to_string(), p.to_string())).collect();
        assert_eq!(got, want, "user data {input:?}");
    }
}

/// The status line of a CONNECT through the proxy on `proxy_port`, with `auth` as the
/// `Proxy-Authorization` value if given.
async fn connect_status(proxy_port: u16, target_port: u16, auth: Option<String>) -> String {
    let mut s = TcpStream::connect((LOOPBACK, proxy_port)).await.unwrap();
    let auth = auth.map(|a| format!("Proxy-Authorization: {a}\r\n")).unwrap_or_default();
    s.write_all(
        format!(
            "CONNECT 127.0.0.1:{target_port} HTTP/1.1\r\nHost: 127.0.0.1:{target_port}\r\n{auth}\r\n"
        )
        .as_bytes(),
    )
    .await
    .unwrap();
    let mut head = Vec::new();
    let mut b = [0u8; 1];
    while !head.ends_with(b"\r\n") {
        match s.read(&mut b).await {
            Ok(1) => head.push(b[0]),
            _ => break,
        }
    }
    String::from_utf8_lossy(&head).trim().to_string()
}

fn basic(user: &str, pass: &str) -> String {
    format!("Basic {}", data_encoding::BASE64.encode(format!("{user}:{pass}").as_bytes()))
}

/// A proxy whose user data has a `BasicAuth` line lets through exactly the clients that
/// send those credentials.
async fn requires_credentials(proxies: Arc<RealProxies>) {
    let echo = echo_server().await;
    let port = free_port();
    let ud = format!(
        "#cloud-config\nwrite_files:\n  - content: |\n      Port {port}\n      BasicAuth alice s3cret\n"
    );
    let p = proxies.clone();
    tokio::task::spawn_blocking(move || p.start("i-1", Some(ud.as_bytes()))).await.unwrap();
    assert_eq!(proxies.port_of("i-1"), Some(port));
    for (auth, ok) in [
        (None, false),
        (Some(basic("alice", "wrong")), false),
        (Some(basic("bob", "s3cret")), false),
        (Some("Bearer s3cret".to_string()), false),
        (Some(basic("alice", "s3cret")), true),
    ] {
        let status = connect_status(port, echo, auth.clone()).await;
        let code = status.split(' ').nth(1).unwrap_or_default().to_string();
        if ok {
            assert_eq!(code, "200", "{auth:?}: {status}");
        } else {
            assert!(code == "407" || code == "401", "{auth:?}: {status}");
        }
    }
    let p = proxies.clone();
    tokio::task::spawn_blocking(move || p.stop("i-1")).await.unwrap();
}

#[tokio::test(flavor = "multi_thread")]
async fn builtin_proxy_requires_the_credentials_of_the_user_data() {
    let proxies = RealProxies::new(ProxyKind::Builtin);
    requires_credentials(proxies.clone()).await;
    // And says 407, as a proxy should (tinyproxy says 401 to wrong credentials).
    let echo = echo_server().await;
    let port = free_port();
    let ud = format!("Port {port}\nBasicAuth u p\n");
    let p = proxies.clone();
    tokio::task::spawn_blocking(move || p.start("i-2", Some(ud.as_bytes()))).await.unwrap();
    assert!(connect_status(port, echo, None).await.starts_with("HTTP/1.1 407 "));
}

#[tokio::test(flavor = "multi_thread")]
async fn tinyproxy_requires_the_credentials_of_the_user_data() {
    let Some(bin) = tinyproxy_or_skip() else {
        return;
    };
    requires_credentials(RealProxies::new(ProxyKind::Tinyproxy(bin))).await;
}

#[test]
fn client_networks_come_from_allow_lines() {
    let net = |s: &str| Network::parse(s).unwrap();
    let cases: &[(&str, &[&str])] = &[
        ("Port 3128\n", &[]),
        ("      Allow 203.0.113.0/24\n  Allow 127.0.0.1\n", &["203.0.113.0/24", "127.0.0.1/32"]),
        ("Allow 2001:db8::/32\n", &["2001:db8::/32"]),
        // Not one network, or not the directive: left out.
        ("Allow\nAllow a b\nAllow 10.0.0.0/33\nAllow example.com\n# Allow 10.0.0.1\n", &[]),
    ];
    for (input, want) in cases {
        let got = allowed_clients_from_user_data(Some(input.as_bytes()));
        let want: Vec<Network> = want.iter().map(|s| net(s)).collect();
        assert_eq!(got, want, "user data {input:?}");
    }
    let lan = net("203.0.113.0/24");
    assert!(lan.contains("203.0.113.77".parse().unwrap()));
    assert!(!lan.contains("203.0.114.1".parse().unwrap()));
    assert!(!lan.contains("::1".parse().unwrap()));
    assert!(net("0.0.0.0/0").contains("198.51.100.1".parse().unwrap()));
}

/// A proxy whose user data has `Allow` lines serves clients from those networks only
/// (the tests' client is 127.0.0.1), as tinyproxy does.
async fn serves_allowed_clients_only(proxies: Arc<RealProxies>) {
    let echo = echo_server().await;
    for (allow, want) in [("127.0.0.1", "200"), ("127.0.0.0/8", "200"), ("192.0.2.0/24", "403")] {
        let port = free_port();
        let ud = format!("Port {port}\nAllow {allow}\n");
        let p = proxies.clone();
        tokio::task::spawn_blocking(move || p.start("i-1", Some(ud.as_bytes()))).await.unwrap();
        let status = connect_status(port, echo, None).await;
        assert_eq!(status.split(' ').nth(1), Some(want), "Allow {allow}: {status}");
        let p = proxies.clone();
        tokio::task::spawn_blocking(move || p.stop("i-1")).await.unwrap();
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn builtin_proxy_serves_allowed_clients_only() {
    serves_allowed_clients_only(RealProxies::new(ProxyKind::Builtin)).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn tinyproxy_serves_allowed_clients_only() {
    let Some(bin) = tinyproxy_or_skip() else {
        return;
    };
    serves_allowed_clients_only(RealProxies::new(ProxyKind::Tinyproxy(bin))).await;
}
