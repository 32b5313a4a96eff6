//! Proxy credentials in discovery answers.
//!
//! Every caller allowed to find proxies gets `ip:port`; the username and password go only
//! to callers a SubjectAccessReview allows `get` on the subresource `proxies/credentials`
//! (a separate permission, so "may see which proxies exist" and "may use them" can be
//! granted apart). They are read from the Proxy's credentials Secret (see
//! `controller::auth`), kept for a few seconds per Secret so a busy client does not turn
//! into a GET per request, and never enter the shared pre-rendered JSON, a log line or
//! the status page.
//!
//! Only from a Secret the reconciler would use too ([`auth::may_use`]): a generated one
//! the Proxy controls, or a user's one labelled as meant for proxy credentials. Otherwise
//! `proxies/credentials` would be `get` on any Secret of the namespace that has a
//! `username` and a `password`: a Proxy naming it (`spec.auth.secretName`, or a Proxy
//! whose name makes `<name>-credentials` someone else's Secret) would hand it out.

use crate::api::Proxy;
use crate::controller::proxy_auth;
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
/// (namespace, Secret name, Proxy UID).
type Key = (String, String, String);

/// Reads credentials Secrets, with a short cache.
pub struct CredentialStore {
    client: kube::Client,
    ttl: Duration,
    max_entries: usize,
    /// (namespace, Secret name, Proxy UID) -> the answer and when it expires (None: no
    /// usable credentials in it, also kept, so a broken Secret is not read per request).
    map: Mutex<HashMap<Key, Entry>>,
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
        let uid = p.metadata.uid.as_deref()?;
        let access = proxy_auth::access(&p.spec.auth, name).ok()?;
        let secret = access.source.secret_name()?.to_string();
        // Keyed by the Proxy too: whether the Secret may be used depends on who asks for
        // it (its controller owner must be this Proxy).
        let key = (namespace.to_string(), secret, uid.to_string());
        let now = Instant::now();
        if let Some((expires, v)) = self.lock().get(&key)
            && *expires > now
        {
            return v.clone();
        }
        let api: Api<Secret> = Api::namespaced(self.client.clone(), namespace);
        let value = match api.get_opt(&key.1).await {
            Ok(Some(s)) => view_of(&s, &access.source, namespace, name, uid),
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

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<Key, Entry>> {
        self.map.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// The credentials in `secret` for the Proxy `namespace/name` (UID `uid`), if the Secret
/// may give them ([`auth::may_use`]) and holds usable values. Refusals and bad values are
/// logged, naming the Secret and never a value.
fn view_of(
    secret: &Secret,
    source: &proxy_auth::Source,
    namespace: &str,
    name: &str,
    uid: &str,
) -> Option<Arc<CredentialsView>> {
    let secret_name = secret.metadata.name.as_deref().unwrap_or_default();
    let controller = secret
        .metadata
        .owner_references
        .iter()
        .flatten()
        .find(|o| o.controller == Some(true))
        .map(|o| o.uid.as_str());
    let labelled = proxy_auth::labelled_for_proxies(secret.metadata.labels.as_ref());
    if let Err(refused) =
        proxy_auth::may_use(source, namespace, secret_name, labelled, controller, uid)
    {
        // Its values are not even looked at; the Proxy's condition says the same.
        tracing::warn!(proxy = %format!("{namespace}/{name}"), error = %refused, "discovery: credentials Secret not usable");
        return None;
    }
    let value = |k: &str| {
        secret
            .data
            .as_ref()
            .and_then(|d| d.get(k))
            .map(|v| v.0.as_slice())
    };
    match proxy_auth::from_values(
        &format!("{namespace}/{secret_name}"),
        source.field(),
        value(proxy_auth::USERNAME_KEY),
        value(proxy_auth::PASSWORD_KEY),
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

/// One Proxy with its credentials: the usual view, plus `credentials`.
#[derive(Serialize)]
pub struct WithCredentials<'a> {
    #[serde(flatten)]
    pub view: super::view::ProxyView<'a>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub credentials: Option<&'a CredentialsView>,
}
