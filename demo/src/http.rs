//! The two HTTP requests the demo makes itself, over plain sockets: a GET (HTTP/1.0, so
//! the answer ends with the connection and is never chunked), and a GET through a forward
//! proxy's CONNECT tunnel.

use anyhow::{Context, Result, bail, ensure};
use std::net::SocketAddr;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

const TIMEOUT: Duration = Duration::from_secs(5);
const MAX_ANSWER: usize = 4 << 20;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Answer {
    pub status: u16,
    pub body: String,
}

/// Splits a raw HTTP/1.x answer into status and body.
pub fn parse_answer(raw: &[u8]) -> Result<Answer> {
    let end = raw
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .context("the answer has no end of headers")?;
    let head = String::from_utf8_lossy(&raw[..end]);
    let status_line = head.lines().next().unwrap_or_default();
    let mut parts = status_line.split(' ');
    let version = parts.next().unwrap_or_default();
    ensure!(
        version.starts_with("HTTP/1."),
        "not an HTTP/1 answer: {status_line:?}"
    );
    let status = parts
        .next()
        .and_then(|s| s.parse().ok())
        .with_context(|| format!("no status code in {status_line:?}"))?;
    Ok(Answer {
        status,
        body: String::from_utf8_lossy(&raw[end + 4..]).into_owned(),
    })
}

async fn read_all(s: &mut TcpStream) -> Result<Vec<u8>> {
    let mut out = Vec::new();
    let mut buf = [0u8; 8192];
    loop {
        let n = s.read(&mut buf).await?;
        if n == 0 {
            return Ok(out);
        }
        out.extend_from_slice(&buf[..n]);
        ensure!(
            out.len() <= MAX_ANSWER,
            "answer larger than {MAX_ANSWER} bytes"
        );
    }
}

/// `GET path` on `addr`, with a bearer token when given.
pub async fn get(addr: SocketAddr, path: &str, token: Option<&str>) -> Result<Answer> {
    tokio::time::timeout(TIMEOUT, async {
        let mut s = TcpStream::connect(addr).await?;
        let auth = token
            .map(|t| format!("Authorization: Bearer {t}\r\n"))
            .unwrap_or_default();
        s.write_all(format!("GET {path} HTTP/1.0\r\nHost: {addr}\r\n{auth}\r\n").as_bytes())
            .await?;
        parse_answer(&read_all(&mut s).await?)
    })
    .await
    .with_context(|| format!("GET http://{addr}{path}: no answer within {TIMEOUT:?}"))?
    .with_context(|| format!("GET http://{addr}{path}"))
}

/// `CONNECT target` through the proxy, with Basic proxy credentials when given, then
/// `GET /` inside the tunnel. A refused CONNECT is an answer too (its status, no body).
pub async fn get_through_proxy(
    proxy: SocketAddr,
    target: SocketAddr,
    credentials: Option<(&str, &str)>,
) -> Result<Answer> {
    tokio::time::timeout(TIMEOUT, async {
        let mut s = TcpStream::connect(proxy)
            .await
            .with_context(|| format!("connecting to the proxy {proxy}"))?;
        let auth = credentials
            .map(|(u, p)| {
                format!(
                    "Proxy-Authorization: Basic {}\r\n",
                    data_encoding::BASE64.encode(format!("{u}:{p}").as_bytes())
                )
            })
            .unwrap_or_default();
        s.write_all(
            format!("CONNECT {target} HTTP/1.1\r\nHost: {target}\r\n{auth}\r\n").as_bytes(),
        )
        .await?;
        // Read the CONNECT answer byte by byte: the tunnel's bytes follow it directly.
        let mut head = Vec::new();
        let mut b = [0u8; 1];
        while !head.ends_with(b"\r\n\r\n") {
            if s.read(&mut b).await? == 0 {
                bail!("the proxy closed the connection during CONNECT");
            }
            head.push(b[0]);
            ensure!(head.len() < 16 * 1024, "CONNECT answer too long");
        }
        let connect = parse_answer(&head)?;
        if connect.status != 200 {
            return Ok(connect);
        }
        s.write_all(format!("GET / HTTP/1.0\r\nHost: {target}\r\n\r\n").as_bytes())
            .await?;
        parse_answer(&read_all(&mut s).await?)
    })
    .await
    .with_context(|| format!("through {proxy}: no answer within {TIMEOUT:?}"))?
    .with_context(|| format!("GET http://{target}/ through the proxy {proxy}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn answers_split_into_status_and_body() {
        assert_eq!(
            parse_answer(b"HTTP/1.1 200 OK\r\ncontent-length: 10\r\n\r\n127.0.0.1\n").unwrap(),
            Answer {
                status: 200,
                body: "127.0.0.1\n".into()
            }
        );
        assert_eq!(
            parse_answer(b"HTTP/1.0 403 Forbidden\r\n\r\n")
                .unwrap()
                .status,
            403
        );
        assert!(
            parse_answer(b"HTTP/1.1 200 OK\r\n").is_err(),
            "no header end"
        );
        assert!(parse_answer(b"SSH-2.0-OpenSSH\r\n\r\n").is_err());
        assert!(parse_answer(b"HTTP/1.1 abc\r\n\r\n").is_err());
    }

    #[tokio::test]
    async fn a_refused_connection_names_the_proxy() {
        let free = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = free.local_addr().unwrap();
        drop(free);
        let e = get_through_proxy(addr, addr, None).await.unwrap_err();
        assert!(format!("{e:#}").contains(&addr.to_string()), "{e:#}");
    }
}
