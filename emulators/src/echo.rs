//! The egress echo: an HTTP server on 127.0.0.1 whose every answer is the caller's IP and a
//! newline, as a cloud's check-IP service answers (e.g. checkip.amazonaws.com). The health
//! probe's egress check asks it through a proxy, so the IP it sees is the proxy's.

use std::io;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;
use tokio::task::JoinHandle;

/// Serves on `127.0.0.1:port` (0: any free port) until the returned task is aborted or the
/// runtime ends; returns the bound port.
pub async fn start(port: u16) -> io::Result<(u16, JoinHandle<()>)> {
    start_at(std::net::Ipv4Addr::LOCALHOST.into(), port).await
}

/// [`start`] on another loopback address: `::1` for clients that come over IPv6.
pub async fn start_at(ip: std::net::IpAddr, port: u16) -> io::Result<(u16, JoinHandle<()>)> {
    let l = TcpListener::bind((ip, port)).await?;
    let port = l.local_addr()?.port();
    let task = tokio::spawn(async move {
        loop {
            let Ok((mut s, peer)) = l.accept().await else {
                tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                continue;
            };
            tokio::spawn(async move {
                // Read the request head (bounded), then answer and close.
                let mut got = Vec::new();
                let mut buf = [0u8; 2048];
                while !got.windows(4).any(|w| w == b"\r\n\r\n") && got.len() < 16 * 1024 {
                    match s.read(&mut buf).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => got.extend_from_slice(&buf[..n]),
                    }
                }
                let body = format!("{}\n", peer.ip());
                let head = format!(
                    "HTTP/1.1 200 OK\r\ncontent-type: text/plain\r\ncontent-length: {}\r\nconnection: close\r\n\r\n",
                    body.len()
                );
                let _ = s.write_all(format!("{head}{body}").as_bytes()).await;
            });
        }
    });
    Ok((port, task))
}

#[cfg(test)]
mod tests {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    #[tokio::test]
    async fn answers_with_the_callers_ip() {
        let (port, task) = super::start(0).await.unwrap();
        let mut s = tokio::net::TcpStream::connect(("127.0.0.1", port)).await.unwrap();
        s.write_all(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n").await.unwrap();
        let mut answer = String::new();
        s.read_to_string(&mut answer).await.unwrap();
        assert!(answer.starts_with("HTTP/1.1 200 OK\r\n"), "{answer}");
        assert!(answer.ends_with("\r\n\r\n127.0.0.1\n"), "{answer}");
        task.abort();
    }
}
