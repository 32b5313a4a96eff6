//! A small client of the OCI distribution API: manifests and blobs, pulled and pushed,
//! with the registry's Basic or token authentication.
//!
//! Hand-written over reqwest (already in the operator for OTLP) rather than `oci-client`:
//! that crate brings reqwest 0.12 next to our 0.13 (a second HTTP stack to build) and
//! reads whole bodies without a size cap, and a plugin needs only four of its calls.
//! Every body read here is capped before it is buffered, HTTPS only, and a redirect
//! (registries send blobs to object storage) is followed at most 5 times, with reqwest
//! dropping the credentials when it leaves the registry's host.

use super::auth::{Challenge, Credentials, parse_challenge, token_from};
use super::manifest::{DOCKER_MANIFEST, MAX_MANIFEST_BYTES, OCI_MANIFEST, digest_of};
use reqwest::{Method, StatusCode};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// Why a registry request failed. Never carries credentials or a token.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ClientError {
    #[error("the registry answered {status} for {what}")]
    Status { what: String, status: u16 },
    #[error("the registry refused the credentials for {what} ({status}){hint}")]
    Unauthorized {
        what: String,
        status: u16,
        hint: &'static str,
    },
    #[error("{what}: {message}")]
    Transport { what: String, message: String },
    #[error("{what} is larger than {limit} bytes")]
    TooLarge { what: String, limit: u64 },
    #[error("{what} was cut short: {got} of {want} bytes")]
    Truncated { what: String, got: u64, want: u64 },
    #[error("{what} does not match its digest: expected {want}, got {got}")]
    Digest {
        what: String,
        want: String,
        got: String,
    },
}

/// How long one registry request may take, from connect to its last byte.
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// Largest token endpoint answer read.
const MAX_TOKEN_BYTES: u64 = 64 * 1024;

/// A client of one registry.
pub struct Client {
    http: reqwest::Client,
    base: String,
    credentials: Option<Credentials>,
    /// The `Authorization` value that worked last (a token or Basic), reused until a 401.
    authorization: Mutex<Option<String>>,
}

impl Client {
    /// `registry` is `host[:port]`; `tls` the trust (a private CA, or the system roots).
    pub fn new(
        registry: &str,
        tls: Arc<rustls::ClientConfig>,
        credentials: Option<Credentials>,
    ) -> Result<Client, ClientError> {
        let http = reqwest::Client::builder()
            .tls_backend_preconfigured((*tls).clone())
            .https_only(true)
            .redirect(reqwest::redirect::Policy::limited(5))
            .connect_timeout(CONNECT_TIMEOUT)
            .timeout(REQUEST_TIMEOUT)
            .build()
            .map_err(|e| ClientError::Transport {
                what: format!("registry {registry}"),
                message: format!("building the HTTP client: {e}"),
            })?;
        Ok(Client {
            http,
            base: format!("https://{registry}/v2"),
            credentials,
            authorization: Mutex::new(None),
        })
    }

    /// Sends the request `build` makes, answering one authentication challenge.
    async fn send(
        &self,
        what: &str,
        build: impl Fn(&reqwest::Client) -> reqwest::RequestBuilder,
    ) -> Result<reqwest::Response, ClientError> {
        let transport = |e: reqwest::Error| ClientError::Transport {
            what: what.into(),
            message: without_url(&e),
        };
        let known = self
            .authorization
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone();
        let mut request = build(&self.http);
        if let Some(a) = &known {
            request = request.header(reqwest::header::AUTHORIZATION, a);
        }
        let response = request.send().await.map_err(transport)?;
        if response.status() != StatusCode::UNAUTHORIZED {
            return Ok(response);
        }
        let challenge = response
            .headers()
            .get(reqwest::header::WWW_AUTHENTICATE)
            .and_then(|v| v.to_str().ok())
            .and_then(parse_challenge);
        let authorization = match challenge {
            Some(Challenge::Basic) => match &self.credentials {
                Some(c) => c.basic(),
                None => return Err(self.unauthorized(what, 401)),
            },
            Some(Challenge::Bearer {
                realm,
                service,
                scope,
            }) => format!("Bearer {}", self.token(what, &realm, service, scope).await?),
            None => return Err(self.unauthorized(what, 401)),
        };
        *self.authorization.lock().unwrap_or_else(|e| e.into_inner()) = Some(authorization.clone());
        let response = build(&self.http)
            .header(reqwest::header::AUTHORIZATION, authorization)
            .send()
            .await
            .map_err(transport)?;
        match response.status() {
            StatusCode::UNAUTHORIZED | StatusCode::FORBIDDEN => {
                Err(self.unauthorized(what, response.status().as_u16()))
            }
            _ => Ok(response),
        }
    }

    fn unauthorized(&self, what: &str, status: u16) -> ClientError {
        ClientError::Unauthorized {
            what: what.into(),
            status,
            hint: if self.credentials.is_some() {
                ""
            } else {
                "; no credentials for this registry in --registry-auth-file"
            },
        }
    }

    /// A token from the realm a Bearer challenge names, bought with the credentials (or
    /// anonymously, as public registries allow).
    async fn token(
        &self,
        what: &str,
        realm: &str,
        service: Option<String>,
        scope: Option<String>,
    ) -> Result<String, ClientError> {
        let what_token = format!("{what} (its token from {})", host_of(realm));
        let mut url = reqwest::Url::parse(realm).map_err(|e| ClientError::Transport {
            what: what_token.clone(),
            message: format!("the challenge's realm is not a URL: {e}"),
        })?;
        {
            let mut q = url.query_pairs_mut();
            if let Some(s) = &service {
                q.append_pair("service", s);
            }
            if let Some(s) = &scope {
                q.append_pair("scope", s);
            }
        }
        let mut request = self.http.get(url);
        if let Some(c) = &self.credentials {
            request = request.header(reqwest::header::AUTHORIZATION, c.basic());
        }
        let response = request.send().await.map_err(|e| ClientError::Transport {
            what: what_token.clone(),
            message: without_url(&e),
        })?;
        let status = response.status();
        if status == StatusCode::UNAUTHORIZED || status == StatusCode::FORBIDDEN {
            return Err(self.unauthorized(&what_token, status.as_u16()));
        }
        if !status.is_success() {
            return Err(ClientError::Status {
                what: what_token,
                status: status.as_u16(),
            });
        }
        let body = read_capped(response, &what_token, MAX_TOKEN_BYTES, None).await?;
        token_from(&body).ok_or(ClientError::Transport {
            what: what_token,
            message: "the answer holds no token".into(),
        })
    }

    /// The manifest `reference` (a tag or digest) of `repository`: its bytes and digest,
    /// or `None` when the registry has no such manifest (404).
    pub async fn manifest(
        &self,
        repository: &str,
        reference: &str,
    ) -> Result<Option<(Vec<u8>, String)>, ClientError> {
        let url = format!("{}/{repository}/manifests/{reference}", self.base);
        let what = format!("manifest {reference}");
        let response = self
            .send(&what, |c| {
                c.get(&url).header(
                    reqwest::header::ACCEPT,
                    format!("{OCI_MANIFEST}, {DOCKER_MANIFEST}"),
                )
            })
            .await?;
        match response.status() {
            StatusCode::NOT_FOUND => return Ok(None),
            s if !s.is_success() => {
                return Err(ClientError::Status {
                    what,
                    status: s.as_u16(),
                });
            }
            _ => {}
        }
        let body = read_capped(response, &what, MAX_MANIFEST_BYTES, None).await?;
        let digest = digest_of(&body);
        if reference.starts_with("sha256:") && digest != reference {
            return Err(ClientError::Digest {
                what,
                want: reference.into(),
                got: digest,
            });
        }
        Ok(Some((body, digest)))
    }

    /// The blob `digest` of `repository`, exactly `size` bytes (at most `limit`), checked
    /// against its digest.
    pub async fn blob(
        &self,
        repository: &str,
        digest: &str,
        size: u64,
        limit: u64,
    ) -> Result<Vec<u8>, ClientError> {
        let url = format!("{}/{repository}/blobs/{digest}", self.base);
        let what = format!("blob {digest}");
        if size > limit {
            return Err(ClientError::TooLarge { what, limit });
        }
        let response = self.send(&what, |c| c.get(&url)).await?;
        if !response.status().is_success() {
            return Err(ClientError::Status {
                what,
                status: response.status().as_u16(),
            });
        }
        let body = read_capped(response, &what, size, Some(size)).await?;
        let got = digest_of(&body);
        if got != digest {
            return Err(ClientError::Digest {
                what,
                want: digest.into(),
                got,
            });
        }
        Ok(body)
    }

    /// Uploads `bytes` as a blob (monolithic: one POST, one PUT), unless the registry has it.
    pub async fn push_blob(&self, repository: &str, bytes: &[u8]) -> Result<String, ClientError> {
        let digest = digest_of(bytes);
        let what = format!("blob {digest}");
        let head = format!("{}/{repository}/blobs/{digest}", self.base);
        let exists = self.send(&what, |c| c.head(&head)).await?;
        if exists.status().is_success() {
            return Ok(digest);
        }
        let start = format!("{}/{repository}/blobs/uploads/", self.base);
        let started = self.send(&what, |c| c.post(&start)).await?;
        if started.status() != StatusCode::ACCEPTED {
            return Err(ClientError::Status {
                what: format!("{what} (starting its upload)"),
                status: started.status().as_u16(),
            });
        }
        let location = started
            .headers()
            .get(reqwest::header::LOCATION)
            .and_then(|l| l.to_str().ok())
            .ok_or_else(|| ClientError::Transport {
                what: what.clone(),
                message: "the upload has no Location".into(),
            })?;
        let mut url = started
            .url()
            .join(location)
            .map_err(|e| ClientError::Transport {
                what: what.clone(),
                message: format!("the upload's Location is not a URL: {e}"),
            })?;
        url.query_pairs_mut().append_pair("digest", &digest);
        let body = bytes.to_vec();
        let done = self
            .send(&what, |c| {
                c.request(Method::PUT, url.clone())
                    .header(reqwest::header::CONTENT_TYPE, "application/octet-stream")
                    .body(body.clone())
            })
            .await?;
        created(&done, what)?;
        Ok(digest)
    }

    /// Stores `bytes` as the manifest `reference` (a tag or its digest); its digest.
    pub async fn push_manifest(
        &self,
        repository: &str,
        reference: &str,
        bytes: &[u8],
    ) -> Result<String, ClientError> {
        let url = format!("{}/{repository}/manifests/{reference}", self.base);
        let what = format!("manifest {reference}");
        let body = bytes.to_vec();
        let done = self
            .send(&what, |c| {
                c.put(&url)
                    .header(reqwest::header::CONTENT_TYPE, OCI_MANIFEST)
                    .body(body.clone())
            })
            .await?;
        created(&done, what)?;
        Ok(digest_of(bytes))
    }
}

/// A push's answer: 201 Created, or the status named.
fn created(response: &reqwest::Response, what: String) -> Result<(), ClientError> {
    match response.status() {
        StatusCode::CREATED => Ok(()),
        s => Err(ClientError::Status {
            what,
            status: s.as_u16(),
        }),
    }
}

/// Reads at most `limit` bytes of `response`; with `exact`, exactly that many.
async fn read_capped(
    mut response: reqwest::Response,
    what: &str,
    limit: u64,
    exact: Option<u64>,
) -> Result<Vec<u8>, ClientError> {
    let too_large = || ClientError::TooLarge {
        what: what.into(),
        limit,
    };
    if response.content_length().is_some_and(|n| n > limit) {
        return Err(too_large());
    }
    let mut body = Vec::new();
    loop {
        let chunk = response.chunk().await.map_err(|e| match exact {
            Some(want) => ClientError::Truncated {
                what: what.into(),
                got: body.len() as u64,
                want,
            },
            None => ClientError::Transport {
                what: what.into(),
                message: without_url(&e),
            },
        })?;
        let Some(chunk) = chunk else { break };
        if body.len() as u64 + chunk.len() as u64 > limit {
            return Err(too_large());
        }
        body.extend_from_slice(&chunk);
    }
    if let Some(want) = exact
        && body.len() as u64 != want
    {
        return Err(ClientError::Truncated {
            what: what.into(),
            got: body.len() as u64,
            want,
        });
    }
    Ok(body)
}

/// reqwest's message and its causes (the I/O or TLS error), without the URL: a redirect
/// may have filled it with a presigned query string.
fn without_url(e: &reqwest::Error) -> String {
    let mut out = e.to_string();
    if let Some(at) = out.find(" for url (") {
        out.truncate(at);
    }
    let mut source = std::error::Error::source(e);
    while let Some(s) = source {
        out.push_str(": ");
        out.push_str(&s.to_string());
        source = s.source();
    }
    out
}

/// `https://host:port/path` -> `host:port`, for messages.
fn host_of(url: &str) -> &str {
    let rest = url.split_once("://").map_or(url, |(_, r)| r);
    rest.split(['/', '?']).next().unwrap_or(rest)
}
