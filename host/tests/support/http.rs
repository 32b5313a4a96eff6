//! A minimal HTTP/1.1 GET client for tests that talk to the operator's own server.

use bytes::Bytes;
use http_body_util::{BodyExt, Empty};
use hyper_util::rt::TokioIo;
use std::net::SocketAddr;

/// One answer: status, headers and the raw body.
#[derive(Debug)]
pub struct Answer {
    pub status: u16,
    pub headers: http::HeaderMap,
    pub body: String,
}

/// `GET path` on `addr`, with `Authorization: Bearer token` when given.
pub async fn get(addr: SocketAddr, path: &str, token: Option<&str>) -> Answer {
    request(addr, path, token.map(|t| format!("Bearer {t}")).as_deref()).await
}

/// `GET path` on `addr` with this `Authorization` header value, verbatim (for malformed ones).
pub async fn request(addr: SocketAddr, path: &str, authorization: Option<&str>) -> Answer {
    let stream = tokio::net::TcpStream::connect(addr).await.unwrap();
    over(stream, path, authorization).await
}

/// `GET path` without a token; `None` while nothing accepts connections on `addr` (a
/// server not up yet, or gone).
pub async fn try_get(addr: SocketAddr, path: &str) -> Option<Answer> {
    let stream = tokio::net::TcpStream::connect(addr).await.ok()?;
    Some(over(stream, path, None).await)
}

async fn over(stream: tokio::net::TcpStream, path: &str, authorization: Option<&str>) -> Answer {
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .unwrap();
    tokio::spawn(conn);
    let mut req = http::Request::get(path).header(http::header::HOST, "localhost");
    if let Some(a) = authorization {
        req = req.header(http::header::AUTHORIZATION, a);
    }
    let resp = sender
        .send_request(req.body(Empty::<Bytes>::new()).unwrap())
        .await
        .unwrap();
    let status = resp.status().as_u16();
    let headers = resp.headers().clone();
    let bytes = resp.into_body().collect().await.unwrap().to_bytes();
    Answer {
        status,
        headers,
        body: String::from_utf8_lossy(&bytes).into_owned(),
    }
}
