//! An OCI distribution registry, pull side only (Distribution Spec v1.1), for tests of the
//! operator's registry client: plugins pulled from `oci://` references.
//!
//! A real registry in a container is slow to start and cannot be made to misbehave; this one
//! runs on 127.0.0.1 in the test process over HTTPS (a [`TestCa`]'s certificate, so the
//! client's trust is tested too), records every request, and injects the faults a client
//! must survive ([`Fault`]): error statuses, blobs whose bytes no longer match their digest,
//! blobs cut short. [`OciRegistry::start_with_auth`] adds distribution token auth: a 401
//! with a `WWW-Authenticate: Bearer` challenge, and a token endpoint taking Basic credentials.
//!
//! Routes (names may contain slashes; unknown manifests and blobs answer 404 with the spec's
//! error body, `MANIFEST_UNKNOWN` or `BLOB_UNKNOWN`; methods other than GET and HEAD 405):
//! - `GET /v2/` -> 200 `{}`.
//! - `GET|HEAD /v2/<name>/manifests/<tag or digest>` -> the bytes, with the stored media type
//!   as `Content-Type` and `Docker-Content-Digest`.
//! - `GET|HEAD /v2/<name>/blobs/<digest>`.
//! - `GET /token?service=..&scope=..` -> `{"token": ..}` for the right Basic credentials.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{SystemTime, UNIX_EPOCH};

use axum::Router;
use axum::body::Body;
use axum::extract::State;
use axum::http::header::{
    AUTHORIZATION, CONTENT_LENGTH, CONTENT_TYPE, HeaderMap, WWW_AUTHENTICATE,
};
use axum::http::{Method, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use axum::routing::any;
use data_encoding::BASE64;
use serde_json::json;
use sha2::{Digest, Sha256};

use crate::server::ServerThread;
use crate::tls::TestCa;

/// The `service` of the Bearer challenge and the token endpoint.
const SERVICE: &str = "oci-emulator";
const OCI_MANIFEST: &str = "application/vnd.oci.image.manifest.v1+json";
const WASM_CONFIG: &str = "application/vnd.wasm.config.v0+json";
const WASM_LAYER: &str = "application/wasm";

/// What the registry does wrong; applies to every later request until changed.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Fault {
    #[default]
    None,
    /// Every /v2/ request (except the token endpoint) answers this status with an empty body.
    Status(u16),
    /// Blob GETs answer this status; manifests are served normally.
    BlobStatus(u16),
    /// Blob GETs answer the stored bytes with their first byte flipped (same length).
    TamperBlob,
    /// Blob GETs answer only the first half of the bytes (a correct Content-Length for what
    /// is sent).
    TruncateBlob,
}

/// A running registry. Stops (closing every connection) when dropped.
pub struct OciRegistry {
    server: ServerThread,
    state: Shared,
}

type Shared = Arc<Mutex<Registry>>;

#[derive(Clone)]
struct Manifest {
    bytes: Vec<u8>,
    media_type: String,
    digest: String,
}

/// What the registry holds, keyed by (repository, tag or digest).
#[derive(Default)]
struct Registry {
    port: u16,
    blobs: HashMap<(String, String), Vec<u8>>,
    manifests: HashMap<(String, String), Manifest>,
    fault: Fault,
    requests: Vec<String>,
    /// `user:password` when token auth is on.
    credentials: Option<String>,
    tokens: HashSet<String>,
}

/// The state, even after a panic under the lock (as the framework's `Shared::lock`).
fn lock(state: &Mutex<Registry>) -> MutexGuard<'_, Registry> {
    state.lock().unwrap_or_else(|e| e.into_inner())
}

fn digest_of(bytes: &[u8]) -> String {
    format!("sha256:{}", hex::encode(Sha256::digest(bytes)))
}

impl OciRegistry {
    /// HTTPS with a certificate signed by `ca`, anonymous access.
    pub fn start(ca: &TestCa) -> OciRegistry {
        Self::launch(ca, None)
    }

    /// Like [`start`](Self::start), but every /v2/ request needs a Bearer token obtained with
    /// Basic `user:password` from the token endpoint (distribution token auth).
    pub fn start_with_auth(ca: &TestCa, user: &str, password: &str) -> OciRegistry {
        Self::launch(ca, Some(format!("{user}:{password}")))
    }

    fn launch(ca: &TestCa, credentials: Option<String>) -> OciRegistry {
        let (listener, _) = crate::framework::bind(0).expect("bind 127.0.0.1:0");
        let port = listener.local_addr().expect("local addr").port();
        let state = Arc::new(Mutex::new(Registry { port, credentials, ..Registry::default() }));
        let app = Router::new()
            .route("/v2/", any(v2))
            .route("/v2/{*rest}", any(v2))
            .route("/token", any(token))
            .fallback(unknown)
            .with_state(state.clone());
        let server = ServerThread::spawn("oci-registry", listener, app, Some(ca.server_config()));
        OciRegistry { server, state }
    }

    /// `127.0.0.1:PORT`, the registry part of an `oci://` reference.
    pub fn host(&self) -> String {
        self.server.addr().to_string()
    }

    pub fn set_fault(&self, f: Fault) {
        lock(&self.state).fault = f;
    }

    /// Stores a blob, returns its digest `sha256:<hex>`.
    pub fn put_blob(&self, repo: &str, bytes: &[u8]) -> String {
        let digest = digest_of(bytes);
        lock(&self.state).blobs.insert((repo.into(), digest.clone()), bytes.to_vec());
        digest
    }

    /// Stores manifest bytes under `tag` and under their own digest; served with
    /// `Content-Type: media_type` and `Docker-Content-Digest`. Returns the digest.
    pub fn put_manifest(&self, repo: &str, tag: &str, bytes: &[u8], media_type: &str) -> String {
        let digest = digest_of(bytes);
        let m = Manifest { bytes: bytes.to_vec(), media_type: media_type.into(), digest };
        let mut st = lock(&self.state);
        st.manifests.insert((repo.into(), tag.into()), m.clone());
        st.manifests.insert((repo.into(), m.digest.clone()), m.clone());
        m.digest
    }

    /// Stores a CNCF Wasm OCI artifact (an `application/wasm` layer, a
    /// `application/vnd.wasm.config.v0+json` config, an OCI image manifest pointing at both)
    /// under `tag`. Returns the manifest digest.
    pub fn put_plugin(&self, repo: &str, tag: &str, wasm: &[u8]) -> String {
        let config = br#"{"architecture":"wasm","os":"wasip2"}"#;
        let descriptor = |media_type: &str, bytes: &[u8]| {
            let digest = self.put_blob(repo, bytes);
            json!({"mediaType": media_type, "digest": digest, "size": bytes.len()})
        };
        let manifest = json!({
            "schemaVersion": 2,
            "mediaType": OCI_MANIFEST,
            "config": descriptor(WASM_CONFIG, config),
            "layers": [descriptor(WASM_LAYER, wasm)],
        });
        let bytes = serde_json::to_vec(&manifest).expect("manifest JSON");
        self.put_manifest(repo, tag, &bytes, OCI_MANIFEST)
    }

    /// Every request so far as `METHOD /path` (path without query), oldest first.
    pub fn requests(&self) -> Vec<String> {
        lock(&self.state).requests.clone()
    }
}

impl Registry {
    fn record(&mut self, method: &Method, uri: &Uri) {
        self.requests.push(format!("{method} {}", uri.path()));
    }

    /// Whether the request carries a token this registry issued (always, without auth).
    fn authorized(&self, headers: &HeaderMap) -> bool {
        if self.credentials.is_none() {
            return true;
        }
        authorization(headers, "Bearer ").is_some_and(|t| self.tokens.contains(t.trim()))
    }

    /// 401 with the challenge that sends a client to the token endpoint; the scope names the
    /// repository (none for `/v2/` itself, as distribution answers).
    fn challenge(&self, repo: Option<&str>) -> Response {
        let mut value =
            format!("Bearer realm=\"https://127.0.0.1:{}/token\",service=\"{SERVICE}\"", self.port);
        if let Some(repo) = repo {
            value.push_str(&format!(",scope=\"repository:{repo}:pull\""));
        }
        let mut r = error(StatusCode::UNAUTHORIZED, "UNAUTHORIZED", "authentication required");
        r.headers_mut().insert(WWW_AUTHENTICATE, value.parse().expect("header value"));
        r
    }

    /// A token, different for every call and registry (hashed from the port, a counter and
    /// the clock), remembered as valid.
    fn issue_token(&mut self) -> String {
        let nanos = SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_nanos());
        let seed = format!("{}:{}:{nanos}", self.port, self.tokens.len());
        let token = hex::encode(&Sha256::digest(seed.as_bytes())[..20]);
        self.tokens.insert(token.clone());
        token
    }

    fn manifest(&self, method: &Method, repo: &str, reference: &str) -> Response {
        match self.manifests.get(&(repo.into(), reference.into())) {
            Some(m) => content(method, m.bytes.clone(), &m.media_type, &m.digest),
            None => error(StatusCode::NOT_FOUND, "MANIFEST_UNKNOWN", "manifest unknown"),
        }
    }

    fn blob(&self, method: &Method, repo: &str, digest: &str) -> Response {
        let Some(bytes) = self.blobs.get(&(repo.into(), digest.into())) else {
            return error(StatusCode::NOT_FOUND, "BLOB_UNKNOWN", "blob unknown to registry");
        };
        let mut bytes = bytes.clone();
        match self.fault {
            Fault::BlobStatus(code) => return empty(code),
            Fault::TamperBlob => bytes.iter_mut().take(1).for_each(|b| *b ^= 0xff),
            Fault::TruncateBlob => bytes.truncate(bytes.len() / 2),
            Fault::None | Fault::Status(_) => {}
        }
        content(method, bytes, "application/octet-stream", digest)
    }
}

/// `/v2/<name>/<manifests|blobs>/<reference>` as (name, kind, reference).
fn parse(path: &str) -> Option<(&str, &str, &str)> {
    let mut it = path.strip_prefix("/v2/")?.rsplitn(3, '/');
    let (reference, kind, repo) = (it.next()?, it.next()?, it.next()?);
    let ok = !repo.is_empty() && !reference.is_empty() && matches!(kind, "manifests" | "blobs");
    ok.then_some((repo, kind, reference))
}

/// The `Authorization` credentials of `scheme` (with its trailing space).
fn authorization<'a>(headers: &'a HeaderMap, scheme: &str) -> Option<&'a str> {
    headers.get(AUTHORIZATION)?.to_str().ok()?.strip_prefix(scheme)
}

/// The spec's error body: `{"errors": [{"code", "message"}]}`.
fn error(status: StatusCode, code: &str, message: &str) -> Response {
    let body = json!({"errors": [{"code": code, "message": message}]});
    (status, axum::Json(body)).into_response()
}

fn empty(code: u16) -> Response {
    StatusCode::from_u16(code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR).into_response()
}

/// A manifest or blob; HEAD answers the same headers (the full length) without the bytes.
fn content(method: &Method, bytes: Vec<u8>, media_type: &str, digest: &str) -> Response {
    let builder = Response::builder()
        .header(CONTENT_TYPE, media_type)
        .header("docker-content-digest", digest)
        .header(CONTENT_LENGTH, bytes.len());
    let body = if method == Method::HEAD { Body::empty() } else { Body::from(bytes) };
    builder.body(body).expect("response")
}

async fn v2(State(s): State<Shared>, method: Method, uri: Uri, headers: HeaderMap) -> Response {
    let mut st = lock(&s);
    st.record(&method, &uri);
    if let Fault::Status(code) = st.fault {
        return empty(code);
    }
    let target = parse(uri.path());
    if !st.authorized(&headers) {
        return st.challenge(target.map(|(repo, _, _)| repo));
    }
    if method != Method::GET && method != Method::HEAD {
        return error(StatusCode::METHOD_NOT_ALLOWED, "UNSUPPORTED", "pull only");
    }
    match target {
        Some((repo, "manifests", reference)) => st.manifest(&method, repo, reference),
        Some((repo, _, digest)) => st.blob(&method, repo, digest),
        None if uri.path() == "/v2/" => axum::Json(json!({})).into_response(),
        None => error(StatusCode::NOT_FOUND, "NAME_UNKNOWN", "no such route"),
    }
}

/// The token endpoint: a new Bearer token for the right Basic credentials, 401 otherwise.
async fn token(State(s): State<Shared>, method: Method, uri: Uri, headers: HeaderMap) -> Response {
    let mut st = lock(&s);
    st.record(&method, &uri);
    let given =
        authorization(&headers, "Basic ").and_then(|b| BASE64.decode(b.trim().as_bytes()).ok());
    if st.credentials.as_ref().is_some_and(|want| given.as_deref() != Some(want.as_bytes())) {
        let mut r = error(StatusCode::UNAUTHORIZED, "UNAUTHORIZED", "wrong credentials");
        let realm = format!("Basic realm=\"{SERVICE}\"").parse().expect("header value");
        r.headers_mut().insert(WWW_AUTHENTICATE, realm);
        return r;
    }
    axum::Json(json!({"token": st.issue_token()})).into_response()
}

async fn unknown(State(s): State<Shared>, method: Method, uri: Uri) -> Response {
    lock(&s).record(&method, &uri);
    error(StatusCode::NOT_FOUND, "NAME_UNKNOWN", "no such route")
}

#[cfg(test)]
mod tests {
    use super::*;
    use rustls::pki_types::pem::PemObject;
    use rustls::pki_types::{CertificateDer, ServerName};
    use std::io::{Read, Write};
    use std::net::TcpStream;

    const WASM: &[u8] = b"\0asm\x0d\0\x01\0 a component, as far as this test cares";

    /// A registry and the CA its client trusts.
    struct Fixture {
        ca: TestCa,
        reg: OciRegistry,
    }

    /// A response: status, the head (status line and headers) as text, the body.
    struct Answer {
        status: u16,
        head: String,
        body: Vec<u8>,
    }

    impl Answer {
        fn header(&self, name: &str) -> Option<&str> {
            let mut fields = self.head.split("\r\n").filter_map(|l| l.split_once(": "));
            fields.find(|(n, _)| n.eq_ignore_ascii_case(name)).map(|(_, v)| v)
        }

        fn json(&self) -> serde_json::Value {
            serde_json::from_slice(&self.body).unwrap_or(serde_json::Value::Null)
        }

        fn error_code(&self) -> (u16, Option<String>) {
            (self.status, self.json()["errors"][0]["code"].as_str().map(String::from))
        }
    }

    impl Fixture {
        fn new(credentials: Option<(&str, &str)>) -> Fixture {
            let ca = TestCa::new();
            let reg = match credentials {
                None => OciRegistry::start(&ca),
                Some((user, password)) => OciRegistry::start_with_auth(&ca, user, password),
            };
            Fixture { ca, reg }
        }

        fn get(&self, path: &str) -> Answer {
            self.call("GET", path, None)
        }

        /// One HTTP/1.1 request over TLS trusting only the CA, read to the close: the crate
        /// has no HTTP client, and the server runs on its own thread so blocking is fine.
        fn call(&self, method: &str, path: &str, auth: Option<&str>) -> Answer {
            let mut roots = rustls::RootCertStore::empty();
            let ca = CertificateDer::from_pem_slice(self.ca.ca_pem().as_bytes()).unwrap();
            roots.add(ca).unwrap();
            let provider = Arc::new(rustls::crypto::ring::default_provider());
            let config = rustls::ClientConfig::builder_with_provider(provider)
                .with_safe_default_protocol_versions()
                .unwrap()
                .with_root_certificates(roots)
                .with_no_client_auth();
            let name = ServerName::try_from("127.0.0.1").unwrap();
            let conn = rustls::ClientConnection::new(Arc::new(config), name).unwrap();
            let host = self.reg.host();
            let mut tls = rustls::StreamOwned::new(conn, TcpStream::connect(&host).unwrap());
            let auth = auth.map(|a| format!("Authorization: {a}\r\n")).unwrap_or_default();
            let request = format!("{method} {path} HTTP/1.1\r\nHost: {host}\r\n{auth}");
            write!(tls, "{request}Connection: close\r\n\r\n").unwrap();
            let mut raw = Vec::new();
            if let Err(e) = tls.read_to_end(&mut raw) {
                assert_eq!(e.kind(), std::io::ErrorKind::UnexpectedEof, "{e}");
            }
            let end = raw.windows(4).position(|w| w == b"\r\n\r\n").unwrap();
            let head = String::from_utf8(raw[..end].to_vec()).unwrap();
            let status = head[9..12].parse().unwrap();
            Answer { status, head, body: raw[end + 4..].to_vec() }
        }
    }

    #[test]
    fn plugins_are_served_by_tag_and_digest() {
        let f = Fixture::new(None);
        let digest = f.reg.put_plugin("plugins/example", "v1", WASM);
        assert_eq!(f.get("/v2/").json(), json!({}));

        let by_tag = f.get("/v2/plugins/example/manifests/v1");
        assert_eq!(by_tag.status, 200);
        assert_eq!(by_tag.header("content-type"), Some(OCI_MANIFEST));
        assert_eq!(by_tag.header("docker-content-digest"), Some(digest.as_str()));
        assert_eq!(digest_of(&by_tag.body), digest);
        let path = format!("/v2/plugins/example/manifests/{digest}");
        let by_digest = f.get(&path);
        assert_eq!((by_digest.status, &by_digest.body), (200, &by_tag.body));
        let head = f.call("HEAD", &path, None);
        assert_eq!((head.status, head.body.len()), (200, 0));
        assert_eq!(head.header("content-length"), Some(by_tag.body.len().to_string().as_str()));

        let m = by_tag.json();
        assert_eq!((m["schemaVersion"].as_u64(), &m["mediaType"]), (Some(2), &json!(OCI_MANIFEST)));
        let blob = |d: &serde_json::Value| {
            f.get(&format!("/v2/plugins/example/blobs/{}", d.as_str().unwrap()))
        };
        assert_eq!(m["config"]["mediaType"], WASM_CONFIG);
        assert_eq!(
            blob(&m["config"]["digest"]).json(),
            json!({"architecture": "wasm", "os": "wasip2"})
        );
        let layer = &m["layers"][0];
        assert_eq!((&layer["mediaType"], &layer["size"]), (&json!(WASM_LAYER), &json!(WASM.len())));
        let wasm = blob(&layer["digest"]);
        assert_eq!((wasm.status, wasm.body.as_slice()), (200, WASM));
        assert_eq!(digest_of(&wasm.body), layer["digest"].as_str().unwrap());
        assert_eq!(f.reg.requests()[..2], ["GET /v2/", "GET /v2/plugins/example/manifests/v1"]);
    }

    #[test]
    fn unknown_manifests_and_blobs_answer_the_spec_errors() {
        let f = Fixture::new(None);
        f.reg.put_plugin("p", "v1", WASM);
        let manifest_unknown = (404, Some("MANIFEST_UNKNOWN".to_string()));
        assert_eq!(f.get("/v2/p/manifests/v2").error_code(), manifest_unknown);
        assert_eq!(f.get("/v2/other/manifests/v1").error_code(), manifest_unknown);
        let blob = f.get(&format!("/v2/p/blobs/{}", digest_of(b"nope")));
        assert_eq!(blob.error_code(), (404, Some("BLOB_UNKNOWN".to_string())));
        assert_eq!(f.call("DELETE", "/v2/p/manifests/v1", None).status, 405);
    }

    #[test]
    fn faults_break_statuses_and_blob_bytes() {
        let f = Fixture::new(None);
        let blob = vec![7u8; 1000];
        let path = format!("/v2/p/blobs/{}", f.reg.put_blob("p", &blob));
        f.reg.put_manifest("p", "v1", b"{}", OCI_MANIFEST);

        f.reg.set_fault(Fault::Status(500));
        for p in ["/v2/", "/v2/p/manifests/v1", path.as_str()] {
            let a = f.get(p);
            assert_eq!((a.status, a.body.len()), (500, 0), "{p}");
        }
        f.reg.set_fault(Fault::BlobStatus(503));
        assert_eq!(f.get("/v2/p/manifests/v1").status, 200);
        assert_eq!(f.get(&path).status, 503);

        f.reg.set_fault(Fault::TamperBlob);
        let a = f.get(&path);
        assert_eq!((a.status, a.body.len(), a.body[0], a.body[1]), (200, 1000, 7 ^ 0xff, 7));
        f.reg.set_fault(Fault::TruncateBlob);
        let a = f.get(&path);
        assert_eq!((a.status, a.body.as_slice()), (200, &blob[..500]));
        assert_eq!(a.header("content-length"), Some("500"));
        f.reg.set_fault(Fault::None);
        assert_eq!(f.get(&path).body, blob);
        assert_eq!(f.reg.requests().len(), 8);
    }

    #[test]
    fn token_auth_challenges_then_accepts_issued_tokens() {
        let f = Fixture::new(Some(("alice", "s3cret")));
        f.reg.put_plugin("team/plugin", "v1", WASM);
        let a = f.get("/v2/team/plugin/manifests/v1");
        assert_eq!(a.status, 401);
        let realm = format!("Bearer realm=\"https://{}/token\"", f.reg.host());
        let want =
            format!("{realm},service=\"oci-emulator\",scope=\"repository:team/plugin:pull\"");
        assert_eq!(a.header("www-authenticate"), Some(want.as_str()));

        let url = "/token?service=oci-emulator&scope=repository:team/plugin:pull";
        let basic = |creds: &str| format!("Basic {}", BASE64.encode(creds.as_bytes()));
        assert_eq!(f.call("GET", url, Some(&basic("alice:wrong"))).status, 401);
        assert_eq!(f.get(url).status, 401);
        let t = f.call("GET", url, Some(&basic("alice:s3cret")));
        assert_eq!(t.status, 200);
        let token = t.json()["token"].as_str().unwrap().to_string();
        assert!(token.len() >= 16, "{token}");

        let bearer = format!("Bearer {token}");
        let a = f.call("GET", "/v2/team/plugin/manifests/v1", Some(&bearer));
        assert_eq!((a.status, a.header("content-type")), (200, Some(OCI_MANIFEST)));
        assert_eq!(f.call("GET", "/v2/", Some("Bearer forged")).status, 401);
        assert_eq!(f.reg.requests()[1], "GET /token");
    }
}
