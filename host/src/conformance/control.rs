//! A client for an emulator's `/_emulator/` control surface (see `egress-emulator-protocol`).
//!
//! Plain HTTP/1.1 to one base URL: the suite only ever drives an emulator on a test
//! machine, so there is no TLS, no proxy and no retry. Every failure names the route.

use bytes::Bytes;
use egress_emulator_protocol::{
    Dump, DumpCapacities, DumpInstance, Fault, Plant, Reclaim, SpotCapacity,
};
use http_body_util::{BodyExt, Full};
use hyper_util::rt::TokioIo;
use serde::Serialize;
use serde_json::json;
use std::time::Duration;

/// Why a control call failed.
#[derive(Debug, thiserror::Error)]
pub enum ControlError {
    #[error("emulator URL {url:?}: {why}")]
    Url { url: String, why: &'static str },
    #[error("emulator {route}: {source}")]
    Io {
        route: String,
        #[source]
        source: std::io::Error,
    },
    #[error("emulator {route}: {message}")]
    Http { route: String, message: String },
    #[error("emulator {route}: answered {status}: {body}")]
    Status {
        route: String,
        status: u16,
        body: String,
    },
    #[error("emulator {route}: unexpected answer: {source}")]
    Decode {
        route: String,
        #[source]
        source: serde_json::Error,
    },
    #[error("emulator {route}: no answer within {timeout:?}")]
    Timeout { route: String, timeout: Duration },
}

/// The control surface of one emulator.
#[derive(Debug, Clone)]
pub struct Control {
    authority: String,
}

const CALL_TIMEOUT: Duration = Duration::from_secs(10);

impl Control {
    /// `url` is the emulator's base URL, e.g. `http://127.0.0.1:41234`.
    pub fn new(url: &str) -> Result<Self, ControlError> {
        let uri: http::Uri = url.parse().map_err(|_| ControlError::Url {
            url: url.into(),
            why: "not a URL",
        })?;
        if uri.scheme_str() != Some("http") {
            return Err(ControlError::Url {
                url: url.into(),
                why: "only http:// is supported",
            });
        }
        let authority = uri.authority().ok_or(ControlError::Url {
            url: url.into(),
            why: "no host",
        })?;
        let authority = if authority.port().is_some() {
            authority.to_string()
        } else {
            format!("{authority}:80")
        };
        Ok(Control { authority })
    }

    pub async fn dump(&self) -> Result<Dump, ControlError> {
        let route = "GET /_emulator/dump";
        let body = self.call("GET", "dump", None).await?;
        serde_json::from_slice(&body).map_err(|source| ControlError::Decode {
            route: route.into(),
            source,
        })
    }

    /// Whether each instance named `name` runs on spot capacity, as the dump's `spot` keys
    /// say (`false` from an emulator that writes none).
    pub async fn spot_by_name(&self, name: &str) -> Result<Vec<bool>, ControlError> {
        let body = self.call("GET", "dump", None).await?;
        let caps: DumpCapacities =
            serde_json::from_slice(&body).map_err(|source| ControlError::Decode {
                route: "GET /_emulator/dump".into(),
                source,
            })?;
        Ok(caps
            .instances
            .into_iter()
            .filter(|c| c.name == name)
            .map(|c| c.spot)
            .collect())
    }

    /// The instance the backend holds under `name`, if exactly one exists.
    pub async fn by_name(&self, name: &str) -> Result<Vec<DumpInstance>, ControlError> {
        Ok(self
            .dump()
            .await?
            .instances
            .into_iter()
            .filter(|i| i.name == name)
            .collect())
    }

    pub async fn hold(&self, id: &str, hold: bool) -> Result<(), ControlError> {
        self.post("hold", json!({"id": id, "hold": hold})).await
    }

    pub async fn set_state(&self, id: &str, state: &str) -> Result<(), ControlError> {
        self.post("state", json!({"id": id, "state": state})).await
    }

    pub async fn set_address(&self, id: &str, ip: Option<&str>) -> Result<(), ControlError> {
        self.post("address", json!({"id": id, "ip": ip})).await
    }

    pub async fn start_slow_delete(&self, id: &str) -> Result<(), ControlError> {
        self.post("deleting", json!({"id": id})).await
    }

    pub async fn finish_deletes(&self) -> Result<(), ControlError> {
        self.post("finish-deletes", json!({})).await
    }

    pub async fn lock(&self, id: &str, locked: bool) -> Result<(), ControlError> {
        self.post("lock", json!({"id": id, "locked": locked})).await
    }

    pub async fn plant(&self, plant: &Plant) -> Result<String, ControlError> {
        let body = self.call("POST", "plant", Some(to_json(plant))).await?;
        #[derive(serde::Deserialize)]
        struct Planted {
            id: String,
        }
        serde_json::from_slice::<Planted>(&body)
            .map(|p| p.id)
            .map_err(|source| ControlError::Decode {
                route: "POST /_emulator/plant".into(),
                source,
            })
    }

    pub async fn inject(&self, fault: &Fault) -> Result<(), ControlError> {
        self.post("faults", fault).await
    }

    pub async fn fail_scope(&self, scope: &str, fail: bool) -> Result<(), ControlError> {
        self.post("scope", json!({"scope": scope, "fail": fail}))
            .await
    }

    /// The backend reclaims spot instance `id`; an on-demand one is refused (`409`), as is
    /// every id by an emulator without spot (`501`).
    pub async fn reclaim(&self, id: &str) -> Result<(), ControlError> {
        self.post("reclaim", Reclaim { id: id.into() }).await
    }

    /// Whether spot creates find capacity (`501` from an emulator without spot).
    pub async fn set_spot_capacity(&self, available: bool) -> Result<(), ControlError> {
        self.post("spot-capacity", SpotCapacity { available }).await
    }

    pub async fn reset(&self) -> Result<(), ControlError> {
        self.post("reset", json!({})).await
    }

    async fn post(&self, op: &str, body: impl Serialize) -> Result<(), ControlError> {
        self.call("POST", op, Some(to_json(body))).await.map(drop)
    }

    async fn call(
        &self,
        method: &str,
        op: &str,
        body: Option<Vec<u8>>,
    ) -> Result<Bytes, ControlError> {
        let route = format!("{method} /_emulator/{op}");
        match tokio::time::timeout(CALL_TIMEOUT, self.exchange(&route, method, op, body)).await {
            Ok(r) => r,
            Err(_) => Err(ControlError::Timeout {
                route,
                timeout: CALL_TIMEOUT,
            }),
        }
    }

    async fn exchange(
        &self,
        route: &str,
        method: &str,
        op: &str,
        body: Option<Vec<u8>>,
    ) -> Result<Bytes, ControlError> {
        let http_err = |e: hyper::Error| ControlError::Http {
            route: route.into(),
            message: e.to_string(),
        };
        let stream = tokio::net::TcpStream::connect(&self.authority)
            .await
            .map_err(|source| ControlError::Io {
                route: route.into(),
                source,
            })?;
        let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
            .await
            .map_err(http_err)?;
        let conn = tokio::spawn(conn);
        let req = http::Request::builder()
            .method(method)
            .uri(format!("/_emulator/{op}"))
            .header(http::header::HOST, &self.authority)
            .header(http::header::CONTENT_TYPE, "application/json")
            .body(Full::new(Bytes::from(body.unwrap_or_default())))
            .expect("a valid request");
        let resp = sender.send_request(req).await.map_err(http_err)?;
        let status = resp.status().as_u16();
        let bytes = resp
            .into_body()
            .collect()
            .await
            .map_err(http_err)?
            .to_bytes();
        conn.abort();
        if !(200..300).contains(&status) {
            return Err(ControlError::Status {
                route: route.into(),
                status,
                body: String::from_utf8_lossy(&bytes).chars().take(300).collect(),
            });
        }
        Ok(bytes)
    }
}

fn to_json(v: impl Serialize) -> Vec<u8> {
    serde_json::to_vec(&v).expect("control bodies always serialize")
}
