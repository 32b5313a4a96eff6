//! One health probe: a real `CONNECT` through the proxy, as a client of the proxy would
//! do it, and optionally a request through the tunnel to an echo service to see which
//! address the traffic leaves from.
//!
//! A TCP connect alone would call a proxy healthy that accepts connections and refuses to
//! tunnel (wrong `ConnectPort`, auth required, a crashed upstream); only the CONNECT
//! answer says whether users get through.

use data_encoding::BASE64;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpStream;

/// What to probe, and how.
#[derive(Clone)]
pub struct ProbeSpec {
    /// The proxy (`ip:port` from the Proxy's status).
    pub proxy: SocketAddr,
    /// Whether `proxy` may be an internal address (loopback, private, link-local): only
    /// when the provider's entry allows private addresses. Otherwise the probe refuses to
    /// connect, so a plugin cannot aim the operator at the pod network or the metadata
    /// service by reporting such an IP.
    pub allow_internal: bool,
    /// `host:port` to open a tunnel to.
    pub target: String,
    /// Basic credentials for the proxy, if it needs them.
    pub auth: Option<(String, String)>,
    /// An `http://` or `https://` URL reached through the tunnel whose body is the caller's
    /// IP address (like `https://checkip.amazonaws.com/`). Its host and port replace
    /// `target` when set.
    pub egress_echo: Option<http::Uri>,
    /// The whole probe, connect to verdict.
    pub timeout: Duration,
    /// TLS for an `https://` echo URL.
    pub tls: Option<Arc<rustls::ClientConfig>>,
}

impl std::fmt::Debug for ProbeSpec {
    /// Without the credentials.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ProbeSpec")
            .field("proxy", &self.proxy)
            .field("allow_internal", &self.allow_internal)
            .field("target", &self.target)
            .field("auth", &self.auth.as_ref().map(|_| "<set>"))
            .field("egress_echo", &self.egress_echo)
            .field("timeout", &self.timeout)
            .finish()
    }
}

/// A probe that got through.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProbeOk {
    pub latency: Duration,
    /// What the echo service saw, when one is configured.
    pub egress_ip: Option<String>,
}

/// Why a probe failed. [`ProbeError::reason`] is the condition reason.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ProbeError {
    #[error(
        "not probing {addr}: it is a {kind} address and the provider does not allow private addresses (allowPrivateAddresses)"
    )]
    InternalAddress {
        addr: SocketAddr,
        kind: &'static str,
    },
    #[error("connecting to the proxy at {addr}: {message}")]
    Connect { addr: SocketAddr, message: String },
    #[error("no verdict within {0:?}")]
    Timeout(Duration),
    /// 407, or 401 from proxies (tinyproxy) that answer wrong credentials that way.
    #[error("the proxy refused our credentials or wants some ({status})")]
    AuthRequired { status: u16 },
    #[error("the proxy refused the tunnel to {target}: {status} {text}")]
    Refused {
        target: String,
        status: u16,
        text: String,
    },
    #[error("the proxy answered something that is not HTTP: {0}")]
    BadAnswer(String),
    #[error("egress check through the tunnel: {0}")]
    Echo(String),
    #[error("traffic leaves from {got}, not from the instance's address {want}")]
    EgressMismatch { got: String, want: String },
}

impl ProbeError {
    /// A CamelCase reason for the `Healthy` condition.
    pub fn reason(&self) -> &'static str {
        match self {
            ProbeError::InternalAddress { .. } => "InternalAddress",
            ProbeError::Connect { .. } => "ConnectFailed",
            ProbeError::Timeout(_) => "Timeout",
            ProbeError::AuthRequired { .. } => "ProxyAuthRequired",
            ProbeError::Refused { .. } => "TunnelRefused",
            ProbeError::BadAnswer(_) => "BadProxyAnswer",
            ProbeError::Echo(_) => "EgressCheckFailed",
            ProbeError::EgressMismatch { .. } => "EgressMismatch",
        }
    }
}

/// The largest proxy or echo answer head read; real ones are a few hundred bytes.
const MAX_HEAD: usize = 16 * 1024;
/// The largest echo body read: an IP address and a newline.
const MAX_ECHO_BODY: usize = 1024;

/// Probes once. `want_ip` is the instance's address; when an echo URL is configured the
/// address it reports must equal it.
pub async fn probe(spec: &ProbeSpec, want_ip: &str) -> Result<ProbeOk, ProbeError> {
    if !spec.allow_internal
        && let Some(kind) =
            egress_plugin_host::policy::instance_address_problem(spec.proxy.ip(), false)
    {
        return Err(ProbeError::InternalAddress {
            addr: spec.proxy,
            kind,
        });
    }
    let started = Instant::now();
    match tokio::time::timeout(spec.timeout, run(spec, want_ip, started)).await {
        Ok(r) => r,
        Err(_) => Err(ProbeError::Timeout(spec.timeout)),
    }
}

async fn run(spec: &ProbeSpec, want_ip: &str, started: Instant) -> Result<ProbeOk, ProbeError> {
    let mut sock = TcpStream::connect(spec.proxy)
        .await
        .map_err(|e| ProbeError::Connect {
            addr: spec.proxy,
            message: e.to_string(),
        })?;
    let _ = sock.set_nodelay(true);
    let target = match &spec.egress_echo {
        Some(uri) => authority_of(uri).map_err(ProbeError::Echo)?,
        None => spec.target.clone(),
    };
    sock.write_all(connect_request(&target, spec.auth.as_ref()).as_bytes())
        .await
        .map_err(|e| ProbeError::BadAnswer(format!("writing CONNECT: {e}")))?;
    let (head, rest) = read_head(&mut sock).await.map_err(ProbeError::BadAnswer)?;
    let (status, text) = status_line(&head).map_err(ProbeError::BadAnswer)?;
    match status {
        200..=299 => {}
        401 | 407 => return Err(ProbeError::AuthRequired { status }),
        _ => {
            return Err(ProbeError::Refused {
                target,
                status,
                text,
            });
        }
    }
    let latency = started.elapsed();
    let Some(uri) = &spec.egress_echo else {
        return Ok(ProbeOk {
            latency,
            egress_ip: None,
        });
    };
    if !rest.is_empty() {
        return Err(ProbeError::BadAnswer(
            "the proxy sent data before the tunnel was used".into(),
        ));
    }
    let got = match uri.scheme_str() {
        Some("https") => {
            let tls = spec
                .tls
                .clone()
                .ok_or_else(|| ProbeError::Echo("no TLS configuration for https".into()))?;
            let host = uri.host().unwrap_or_default().to_string();
            let name = rustls::pki_types::ServerName::try_from(host)
                .map_err(|e| ProbeError::Echo(e.to_string()))?;
            let stream = tokio_rustls::TlsConnector::from(tls)
                .connect(name, sock)
                .await
                .map_err(|e| ProbeError::Echo(format!("TLS: {e}")))?;
            echo(stream, uri).await
        }
        _ => echo(sock, uri).await,
    }
    .map_err(ProbeError::Echo)?;
    if got != want_ip {
        return Err(ProbeError::EgressMismatch {
            got,
            want: want_ip.to_string(),
        });
    }
    Ok(ProbeOk {
        latency: started.elapsed(),
        egress_ip: Some(got),
    })
}

/// `host:port` of a URL, with the scheme's default port.
fn authority_of(uri: &http::Uri) -> Result<String, String> {
    let host = uri
        .host()
        .ok_or_else(|| format!("echo URL {uri} has no host"))?;
    let port = uri.port_u16().unwrap_or(match uri.scheme_str() {
        Some("https") => 443,
        Some("http") => 80,
        other => return Err(format!("echo URL scheme {other:?} is not http or https")),
    });
    Ok(format!("{host}:{port}"))
}

/// The CONNECT request line and headers.
pub fn connect_request(target: &str, auth: Option<&(String, String)>) -> String {
    let mut req = format!("CONNECT {target} HTTP/1.1\r\nHost: {target}\r\n");
    if let Some((user, pass)) = auth {
        let token = BASE64.encode(format!("{user}:{pass}").as_bytes());
        req.push_str(&format!("Proxy-Authorization: Basic {token}\r\n"));
    }
    req.push_str("\r\n");
    req
}

/// Reads up to the blank line ending an HTTP head; returns the head and any bytes after it.
async fn read_head(s: &mut (impl AsyncRead + Unpin)) -> Result<(String, Vec<u8>), String> {
    let mut buf = Vec::with_capacity(512);
    let mut chunk = [0u8; 1024];
    loop {
        if let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            let rest = buf.split_off(end + 4);
            return Ok((String::from_utf8_lossy(&buf).into_owned(), rest));
        }
        if buf.len() > MAX_HEAD {
            return Err(format!("no end of headers in {MAX_HEAD} bytes"));
        }
        let n = s.read(&mut chunk).await.map_err(|e| e.to_string())?;
        if n == 0 {
            return Err(if buf.is_empty() {
                "the connection closed without an answer".into()
            } else {
                "the connection closed in the middle of the answer".into()
            });
        }
        buf.extend_from_slice(&chunk[..n]);
    }
}

/// The status code and reason of an HTTP/1.x status line.
pub fn status_line(head: &str) -> Result<(u16, String), String> {
    let line = head.lines().next().unwrap_or_default();
    let mut parts = line.splitn(3, ' ');
    let version = parts.next().unwrap_or_default();
    if !version.starts_with("HTTP/1.") {
        return Err(format!("status line {:?}", truncate(line)));
    }
    let code = parts
        .next()
        .and_then(|c| c.parse::<u16>().ok())
        .filter(|c| (100..=599).contains(c))
        .ok_or_else(|| format!("status line {:?}", truncate(line)))?;
    Ok((code, parts.next().unwrap_or_default().trim().to_string()))
}

fn truncate(s: &str) -> String {
    s.chars().take(80).collect()
}

/// A GET of the echo URL over the tunnel; the body, trimmed, is the address.
async fn echo(
    mut s: impl AsyncRead + AsyncWrite + Unpin,
    uri: &http::Uri,
) -> Result<String, String> {
    let path = uri.path_and_query().map(|p| p.as_str()).unwrap_or("/");
    let host = uri.authority().map(|a| a.as_str()).unwrap_or_default();
    let req = format!(
        "GET {path} HTTP/1.1\r\nHost: {host}\r\nUser-Agent: proxy-operator-health\r\nAccept: text/plain\r\nConnection: close\r\n\r\n"
    );
    s.write_all(req.as_bytes())
        .await
        .map_err(|e| e.to_string())?;
    let (head, mut body) = read_head(&mut s).await?;
    let (status, text) = status_line(&head)?;
    if status != 200 {
        return Err(format!("echo answered {status} {text}"));
    }
    let mut chunk = [0u8; 256];
    while body.len() <= MAX_ECHO_BODY {
        match s.read(&mut chunk).await {
            Ok(0) => break,
            Ok(n) => body.extend_from_slice(&chunk[..n]),
            // A TLS peer that closes without close_notify still sent the whole body.
            Err(_) if !body.is_empty() => break,
            Err(e) => return Err(e.to_string()),
        }
    }
    let text = String::from_utf8_lossy(&body[..body.len().min(MAX_ECHO_BODY)])
        .trim()
        .to_string();
    text.parse::<std::net::IpAddr>()
        .map(|ip| ip.to_string())
        .map_err(|_| format!("echo answered {:?}, not an IP address", truncate(&text)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn connect_request_carries_basic_auth_only_when_set() {
        assert_eq!(
            connect_request("example.com:443", None),
            "CONNECT example.com:443 HTTP/1.1\r\nHost: example.com:443\r\n\r\n"
        );
        let auth = ("user".to_string(), "pa:ss".to_string());
        let req = connect_request("10.0.0.1:80", Some(&auth));
        assert!(
            req.contains("Proxy-Authorization: Basic dXNlcjpwYTpzcw==\r\n"),
            "{req}"
        );
    }

    #[test]
    fn status_lines() {
        for (head, want) in [
            (
                "HTTP/1.1 200 Connection established\r\n\r\n",
                Ok((200, "Connection established")),
            ),
            (
                "HTTP/1.0 407 Proxy Authentication Required\r\n",
                Ok((407, "Proxy Authentication Required")),
            ),
            ("HTTP/1.1 403\r\n", Ok((403, ""))),
            ("SSH-2.0-OpenSSH_9.2\r\n", Err(())),
            ("HTTP/1.1 abc Nope\r\n", Err(())),
            ("HTTP/1.1 999 Nope\r\n", Err(())),
            ("", Err(())),
        ] {
            let got = status_line(head);
            match want {
                Ok((code, text)) => assert_eq!(got, Ok((code, text.to_string())), "{head:?}"),
                Err(()) => assert!(got.is_err(), "{head:?}: {got:?}"),
            }
        }
    }

    #[test]
    fn echo_authority_defaults_the_port_by_scheme() {
        let a = |u: &str| authority_of(&u.parse().unwrap());
        assert_eq!(
            a("https://checkip.example/"),
            Ok("checkip.example:443".into())
        );
        assert_eq!(a("http://127.0.0.1:8080/ip"), Ok("127.0.0.1:8080".into()));
        assert!(a("ftp://x/").is_err());
    }

    #[test]
    fn debug_hides_credentials() {
        let spec = ProbeSpec {
            proxy: "127.0.0.1:3128".parse().unwrap(),
            allow_internal: true,
            target: "x:443".into(),
            auth: Some(("u".into(), "sentinel-password".into())),
            egress_echo: None,
            timeout: Duration::from_secs(1),
            tls: None,
        };
        assert!(!format!("{spec:?}").contains("sentinel-password"));
    }

    #[test]
    fn each_error_has_a_condition_reason() {
        let errs = [
            ProbeError::InternalAddress {
                addr: "10.0.0.1:3128".parse().unwrap(),
                kind: "private (RFC 1918)",
            },
            ProbeError::Connect {
                addr: "127.0.0.1:1".parse().unwrap(),
                message: "refused".into(),
            },
            ProbeError::Timeout(Duration::from_secs(1)),
            ProbeError::AuthRequired { status: 407 },
            ProbeError::Refused {
                target: "t:1".into(),
                status: 403,
                text: "Forbidden".into(),
            },
            ProbeError::BadAnswer("x".into()),
            ProbeError::Echo("x".into()),
            ProbeError::EgressMismatch {
                got: "1.1.1.1".into(),
                want: "2.2.2.2".into(),
            },
        ];
        let reasons: std::collections::BTreeSet<&str> = errs.iter().map(|e| e.reason()).collect();
        assert_eq!(reasons.len(), errs.len(), "distinct reasons");
    }
}
