//! Proxy credentials in discovery answers.
//!
//! Every caller allowed to find proxies gets `ip:port`; the username and password go only
//! to callers a SubjectAccessReview allows `get` on the subresource `proxies/credentials`
//! (a separate permission, so "may see which proxies exist" and "may use them" can be
//! granted apart). They are read from the Proxy's credentials Secret (see
//! `controller::auth`), kept for a few seconds per Secret so a busy client does not turn
//! into a GET per request, and never enter the shared pre-rendered JSON, a log line or
//! the status page.

use crate::api::Proxy;
use crate::controller::auth;
use k8s_openapi::api::core::v1::Secret;
use kube::api::Api;
use serde::Serialize;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// The subresource the SubjectAccessReview asks about.
pub const SUBRESOURCE: &str = "credentials";

/// A proxy's credentials as the API returns them (schema `Credentials`). `Debug` shows
/// neither value.
#[derive(Clone, PartialEq, Eq, Serialize)]
pub struct CredentialsView {
    pub username: String,
    pub password: String,
}

impl std::fmt::Debug for CredentialsView {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("CredentialsView(<redacted>)")
    }
}

type Entry = (Instant, Option<Arc<CredentialsView>>);

/// Reads credentials Secrets, with a short cache.
pub struct CredentialStore {
    client: kube::Client,
    ttl: Duration,
    max_entries: usize,
    /// (namespace, Secret name) -> the answer and when it expires (None: no usable
    /// credentials in it, also kept, so a broken Secret is not read per request).
    map: Mutex<HashMap<(String, String), Entry>>,
}

impl CredentialStore {
    pub fn new(client: kube::Client, ttl: Duration, max_entries: usize) -> Self {
        CredentialStore {
            client,
            ttl,
            max_entries: max_entries.max(1),
            map: Mutex::new(HashMap::new()),
        }
    }

    /// The credentials of `p`, if it has any and they can be read. Failures are logged
    /// (naming the Secret, never a value) and answer None: the caller still gets `ip:port`.
    pub async fn of(&self, p: &Proxy) -> Option<Arc<CredentialsView>> {
        let name = p.metadata.name.as_deref()?;
        let namespace = p.metadata.namespace.as_deref()?;
        let access = auth::access(&p.spec.auth, name).ok()?;
        let secret = access.source.secret_name()?.to_string();
        let key = (namespace.to_string(), secret);
        let now = Instant::now();
        if let Some((expires, v)) = self.lock().get(&key)
            && *expires > now
        {
            return v.clone();
        }
        let api: Api<Secret> = Api::namespaced(self.client.clone(), namespace);
        let value = match api.get_opt(&key.1).await {
            Ok(Some(s)) => {
                let value = |k: &str| {
                    s.data
                        .as_ref()
                        .and_then(|d| d.get(k))
                        .map(|v| v.0.as_slice())
                };
                match auth::from_values(
                    &format!("{}/{}", key.0, key.1),
                    access.source.field(),
                    value(auth::USERNAME_KEY),
                    value(auth::PASSWORD_KEY),
                ) {
                    Ok(c) => Some(Arc::new(CredentialsView {
                        username: c.username,
                        password: c.password,
                    })),
                    Err(e) => {
                        tracing::warn!(proxy = %format!("{namespace}/{name}"), error = %e, "discovery: no usable credentials");
                        None
                    }
                }
            }
            Ok(None) => {
                tracing::debug!(proxy = %format!("{namespace}/{name}"), secret = key.1.as_str(), "discovery: credentials Secret not found");
                None
            }
            Err(e) => {
                // Not kept: the next request tries again.
                tracing::warn!(proxy = %format!("{namespace}/{name}"), secret = key.1.as_str(), error = %e, "discovery: reading the credentials Secret failed");
                return None;
            }
        };
        let mut map = self.lock();
        if map.len() >= self.max_entries {
            map.retain(|_, (expires, _)| *expires > now);
            if map.len() >= self.max_entries {
                map.clear();
            }
        }
        map.insert(key, (now + self.ttl, value.clone()));
        value
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<(String, String), Entry>> {
        self.map.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// One Proxy with its credentials: the usual view, plus `credentials`.
#[derive(Serialize)]
pub struct WithCredentials<'a> {
    #[serde(flatten)]
    pub view: super::view::ProxyView<'a>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub credentials: Option<&'a CredentialsView>,
}
