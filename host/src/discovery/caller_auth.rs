//! Authentication and authorisation the way an aggregated API server does them: the bearer
//! token goes to the API server in a TokenReview (authentication.k8s.io/v1), the identity
//! it returns goes back in a SubjectAccessReview (authorization.k8s.io/v1) for the verb,
//! resource and namespace of the request. So the RBAC rules that govern
//! `kubectl get proxies` govern the discovery API too.
//!
//! Both answers are cached for a short TTL, keyed by a SHA-256 digest of the token (the raw
//! token is neither stored nor logged), in maps of bounded size. Negative answers are cached
//! as well, so a client retrying a bad token does not turn into a review per request.
//! Failures to reach the API server are not cached and answer 503.

use crate::api::{GROUP, VERSION};
use futures::FutureExt;
use futures::future::{BoxFuture, Shared};
use http::HeaderMap;
use k8s_openapi::api::authentication::v1::{TokenReview, TokenReviewSpec, UserInfo};
use k8s_openapi::api::authorization::v1::{
    ResourceAttributes, SubjectAccessReview, SubjectAccessReviewSpec,
};
use kube::api::{Api, PostParams};
use sha2::{Digest, Sha256};
use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

/// The resource every review is about.
pub const RESOURCE: &str = "proxies";

/// Tuning of the review caches.
#[derive(Debug, Clone)]
pub struct AuthSettings {
    /// How long a TokenReview or SubjectAccessReview answer (positive or negative) is reused.
    pub ttl: Duration,
    /// Most answers kept in each of the two caches; past it, expired answers are dropped
    /// first, then the ones closest to expiry.
    pub max_entries: usize,
    /// Audiences to ask the TokenReview for; the token must be valid for one of them. Empty:
    /// the API server's own audience (a service-account token as mounted in a pod).
    pub audiences: Vec<String>,
}

impl Default for AuthSettings {
    fn default() -> Self {
        Self {
            ttl: Duration::from_secs(10),
            max_entries: 10_000,
            audiences: Vec::new(),
        }
    }
}

type Key = [u8; 32];

/// The caller, as the TokenReview described it.
#[derive(Debug, Clone)]
pub struct Identity {
    token: Key,
    pub user: Arc<UserInfo>,
}

impl Identity {
    pub fn username(&self) -> &str {
        self.user.username.as_deref().unwrap_or("")
    }
}

/// Why a request was refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AuthError {
    /// No usable bearer token (401).
    NoToken(String),
    /// A bearer token the TokenReview did not authenticate (401, `error="invalid_token"`).
    InvalidToken,
    /// The SubjectAccessReview said no (403); `reason` is the review's.
    Forbidden { message: String, reason: String },
    /// A review could not be made (503); nothing is cached.
    Unavailable(String),
}

#[derive(Clone)]
enum Authn {
    User(Arc<UserInfo>),
    Rejected,
}

#[derive(Clone)]
struct Access {
    allowed: bool,
    reason: Arc<str>,
}

/// A review in flight, shared by every request waiting for the same answer.
type Flight<V> = Shared<BoxFuture<'static, Result<V, AuthError>>>;

enum Slot<V> {
    Ready(Instant, V),
    Pending(Flight<V>),
}

/// Answers by key for `ttl`, with single flight: concurrent misses on one key wait for one
/// review instead of each sending their own (32 clients whose shared answer just expired
/// would otherwise send 32 reviews). Failed reviews are not kept.
struct TtlCache<V> {
    ttl: Duration,
    max: usize,
    map: Mutex<HashMap<Key, Slot<V>>>,
}

impl<V: Clone + Send + Sync + 'static> TtlCache<V> {
    fn new(ttl: Duration, max: usize) -> Self {
        Self {
            ttl,
            max: max.max(1),
            map: Mutex::new(HashMap::new()),
        }
    }

    fn lock(&self) -> MutexGuard<'_, HashMap<Key, Slot<V>>> {
        self.map.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The cached answer, else the one of the review in flight, else the one of a new
    /// review made by `review`.
    async fn get_or_review(
        &self,
        key: Key,
        review: impl FnOnce() -> BoxFuture<'static, Result<V, AuthError>>,
    ) -> Result<V, AuthError> {
        let flight = {
            let mut map = self.lock();
            match map.get(&key) {
                Some(Slot::Ready(expires, v)) if *expires > Instant::now() => {
                    return Ok(v.clone());
                }
                Some(Slot::Pending(f)) => f.clone(),
                _ => {
                    self.make_room(&mut map, &key);
                    let f = review().shared();
                    map.insert(key, Slot::Pending(f.clone()));
                    f
                }
            }
        };
        let result = flight.clone().await;
        let mut map = self.lock();
        // The first waiter to finish settles the slot, if it still holds this flight.
        if let Some(Slot::Pending(f)) = map.get(&key)
            && f.ptr_eq(&flight)
        {
            match &result {
                Ok(v) => {
                    map.insert(key, Slot::Ready(Instant::now() + self.ttl, v.clone()));
                }
                Err(_) => {
                    map.remove(&key);
                }
            }
        }
        result
    }

    /// Keeps the map under `max`: drops expired answers, then the one closest to expiry.
    /// Reviews in flight are never dropped.
    fn make_room(&self, map: &mut HashMap<Key, Slot<V>>, key: &Key) {
        if map.len() < self.max || map.contains_key(key) {
            return;
        }
        let now = Instant::now();
        map.retain(|_, slot| match slot {
            Slot::Ready(expires, _) => *expires > now,
            Slot::Pending(_) => true,
        });
        if map.len() >= self.max {
            let victim = map
                .iter()
                .filter_map(|(k, slot)| match slot {
                    Slot::Ready(e, _) => Some((*e, *k)),
                    Slot::Pending(_) => None,
                })
                .min()
                .map(|(_, k)| k);
            if let Some(k) = victim {
                map.remove(&k);
            }
        }
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        self.lock().len()
    }
}

/// Checks bearer tokens with TokenReview and access with SubjectAccessReview, through the
/// operator's own client. Its service account needs `create` on `tokenreviews` and
/// `subjectaccessreviews` (the built-in ClusterRole `system:auth-delegator`).
pub struct Authenticator {
    client: kube::Client,
    settings: AuthSettings,
    tokens: TtlCache<Authn>,
    access: TtlCache<Access>,
}

/// The token of an `Authorization: Bearer <token>` header (scheme case-insensitive).
fn bearer(headers: &HeaderMap) -> Result<&str, AuthError> {
    let Some(value) = headers.get(http::header::AUTHORIZATION) else {
        return Err(AuthError::NoToken(
            "no bearer token: send `Authorization: Bearer <token>`".into(),
        ));
    };
    let value = value.to_str().unwrap_or("");
    match value.split_once(' ') {
        Some((scheme, token)) if scheme.eq_ignore_ascii_case("bearer") => {
            let token = token.trim();
            if token.is_empty() {
                Err(AuthError::NoToken("empty bearer token".into()))
            } else {
                Ok(token)
            }
        }
        _ => Err(AuthError::NoToken(
            "the Authorization header is not `Bearer <token>`".into(),
        )),
    }
}

impl Authenticator {
    pub fn new(client: kube::Client, settings: AuthSettings) -> Self {
        Self {
            tokens: TtlCache::new(settings.ttl, settings.max_entries),
            access: TtlCache::new(settings.ttl, settings.max_entries),
            client,
            settings,
        }
    }

    /// Who sent the request.
    pub async fn authenticate(&self, headers: &HeaderMap) -> Result<Identity, AuthError> {
        let token = bearer(headers)?;
        let key: Key = Sha256::digest(token.as_bytes()).into();
        let authn = self
            .tokens
            .get_or_review(key, || {
                review_token(
                    self.client.clone(),
                    self.settings.audiences.clone(),
                    token.to_string(),
                )
                .boxed()
            })
            .await?;
        match authn {
            Authn::User(user) => Ok(Identity { token: key, user }),
            Authn::Rejected => Err(AuthError::InvalidToken),
        }
    }

    /// Whether `who` may `verb` proxies in `namespace` ("" = all namespaces), or the one
    /// named `name`.
    pub async fn authorize(
        &self,
        who: &Identity,
        verb: &'static str,
        namespace: &str,
        name: Option<&str>,
    ) -> Result<(), AuthError> {
        let access = self.review(who, verb, None, namespace, name).await?;
        if access.allowed {
            return Ok(());
        }
        let scope = if namespace.is_empty() {
            "at the cluster scope (all namespaces)".to_string()
        } else {
            format!("in the namespace {namespace:?}")
        };
        let what = match name {
            Some(n) => format!("{RESOURCE}.{GROUP} {n:?}"),
            None => format!("{RESOURCE}.{GROUP}"),
        };
        Err(AuthError::Forbidden {
            message: format!(
                "{what} is forbidden: User {:?} cannot {verb} resource {RESOURCE:?} in API \
                 group {GROUP:?} {scope}",
                who.username()
            ),
            reason: access.reason.to_string(),
        })
    }
}

impl Authenticator {
    /// Whether `who` may `verb` the `subresource` of proxies in `namespace` ("" = all
    /// namespaces), or of the one named `name`: a yes or no, not a refusal (a caller not
    /// allowed `get` on `proxies/credentials` still gets its answer, without them).
    pub async fn allows(
        &self,
        who: &Identity,
        verb: &'static str,
        subresource: &'static str,
        namespace: &str,
        name: Option<&str>,
    ) -> Result<bool, AuthError> {
        Ok(self
            .review(who, verb, Some(subresource), namespace, name)
            .await?
            .allowed)
    }

    async fn review(
        &self,
        who: &Identity,
        verb: &'static str,
        subresource: Option<&'static str>,
        namespace: &str,
        name: Option<&str>,
    ) -> Result<Access, AuthError> {
        let mut h = Sha256::new();
        h.update(who.token);
        // Length-prefixed, so `get` + `credentials` never shares a key with another split;
        // the subresource is appended only when there is one, so the keys of plain
        // reviews stay what they were.
        let mut parts = vec![verb, namespace, name.unwrap_or("")];
        if let Some(sub) = subresource {
            parts.push(sub);
        }
        for part in parts {
            h.update((part.len() as u64).to_le_bytes());
            h.update(part.as_bytes());
        }
        let key: Key = h.finalize().into();
        self.access
            .get_or_review(key, || {
                review_access(
                    self.client.clone(),
                    who.user.clone(),
                    verb,
                    subresource,
                    namespace.to_string(),
                    name.map(str::to_string),
                )
                .boxed()
            })
            .await
    }
}

async fn review_token(
    client: kube::Client,
    audiences: Vec<String>,
    token: String,
) -> Result<Authn, AuthError> {
    let review = TokenReview {
        spec: TokenReviewSpec {
            token: Some(token),
            audiences: (!audiences.is_empty()).then(|| audiences.clone()),
        },
        ..Default::default()
    };
    let api: Api<TokenReview> = Api::all(client);
    let answer = api
        .create(&PostParams::default(), &review)
        .await
        .map_err(|e| {
            tracing::warn!(error = %e, "TokenReview failed");
            AuthError::Unavailable(format!("could not review the token: {e}"))
        })?;
    let status = answer.status.unwrap_or_default();
    let audience_ok = audiences.is_empty()
        || status
            .audiences
            .as_ref()
            .is_some_and(|got| got.iter().any(|a| audiences.contains(a)));
    match status.user {
        Some(user)
            if status.authenticated == Some(true)
                && audience_ok
                && user.username.as_deref().is_some_and(|u| !u.is_empty()) =>
        {
            tracing::debug!(user = user.username.as_deref(), "token authenticated");
            Ok(Authn::User(Arc::new(user)))
        }
        _ => {
            tracing::debug!(
                error = status.error.as_deref(),
                audience_ok,
                "token not authenticated"
            );
            Ok(Authn::Rejected)
        }
    }
}

async fn review_access(
    client: kube::Client,
    user: Arc<UserInfo>,
    verb: &'static str,
    subresource: Option<&'static str>,
    namespace: String,
    name: Option<String>,
) -> Result<Access, AuthError> {
    let review = SubjectAccessReview {
        spec: SubjectAccessReviewSpec {
            user: user.username.clone(),
            uid: user.uid.clone(),
            groups: user.groups.clone(),
            extra: user.extra.clone(),
            resource_attributes: Some(ResourceAttributes {
                verb: Some(verb.to_string()),
                group: Some(GROUP.to_string()),
                version: Some(VERSION.to_string()),
                resource: Some(RESOURCE.to_string()),
                subresource: subresource.map(str::to_string),
                namespace: (!namespace.is_empty()).then(|| namespace.clone()),
                name: name.clone(),
                ..Default::default()
            }),
            ..Default::default()
        },
        ..Default::default()
    };
    let api: Api<SubjectAccessReview> = Api::all(client);
    let answer = api
        .create(&PostParams::default(), &review)
        .await
        .map_err(|e| {
            tracing::warn!(error = %e, "SubjectAccessReview failed");
            AuthError::Unavailable(format!("could not review access: {e}"))
        })?;
    let status = answer.status.unwrap_or_default();
    let reason = status
        .reason
        .filter(|r| !r.is_empty())
        .or(status.evaluation_error)
        .unwrap_or_default();
    tracing::debug!(
        user = user.username.as_deref(),
        verb,
        subresource,
        namespace,
        name,
        allowed = status.allowed,
        "access reviewed"
    );
    Ok(Access {
        allowed: status.allowed,
        reason: reason.into(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bearer_header_forms() {
        let mut h = HeaderMap::new();
        assert!(matches!(bearer(&h), Err(AuthError::NoToken(_))));
        for (value, want) in [
            ("Bearer abc", Some("abc")),
            ("bearer  abc ", Some("abc")),
            ("Bearer ", None),
            ("Basic dXNlcjpwYXNz", None),
            ("abc", None),
        ] {
            h.insert(http::header::AUTHORIZATION, value.parse().unwrap());
            assert_eq!(bearer(&h).ok(), want, "{value:?}");
        }
    }

    fn answer(
        n: u32,
        calls: &Arc<std::sync::atomic::AtomicU32>,
    ) -> BoxFuture<'static, Result<u32, AuthError>> {
        let calls = calls.clone();
        async move {
            calls.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            tokio::time::sleep(Duration::from_millis(20)).await;
            if n == 0 {
                Err(AuthError::Unavailable("down".into()))
            } else {
                Ok(n)
            }
        }
        .boxed()
    }

    #[tokio::test]
    async fn cache_expires_stays_bounded_and_keeps_no_failures() {
        let calls = Arc::new(std::sync::atomic::AtomicU32::new(0));
        let count = || calls.load(std::sync::atomic::Ordering::SeqCst);
        let c: TtlCache<u32> = TtlCache::new(Duration::from_millis(60), 3);
        assert_eq!(c.get_or_review([1; 32], || answer(1, &calls)).await, Ok(1));
        assert_eq!(c.get_or_review([1; 32], || answer(2, &calls)).await, Ok(1));
        assert_eq!(count(), 1);
        tokio::time::sleep(Duration::from_millis(70)).await;
        assert_eq!(c.get_or_review([1; 32], || answer(2, &calls)).await, Ok(2));
        assert_eq!(count(), 2);
        // Failures are answered but not kept.
        assert!(
            c.get_or_review([7; 32], || answer(0, &calls))
                .await
                .is_err()
        );
        assert_eq!(c.get_or_review([7; 32], || answer(7, &calls)).await, Ok(7));
        for i in 0..10u8 {
            c.get_or_review([i + 10; 32], || answer(u32::from(i) + 10, &calls))
                .await
                .unwrap();
        }
        assert_eq!(c.len(), 3);
        // The newest survive.
        let before = count();
        assert_eq!(
            c.get_or_review([19; 32], || answer(0, &calls)).await,
            Ok(19)
        );
        assert_eq!(count(), before);
    }

    #[tokio::test]
    async fn concurrent_misses_share_one_review() {
        let calls = Arc::new(std::sync::atomic::AtomicU32::new(0));
        let c: Arc<TtlCache<u32>> = Arc::new(TtlCache::new(Duration::from_secs(10), 100));
        let waiters: Vec<_> = (0..32)
            .map(|_| {
                let (c, calls) = (c.clone(), calls.clone());
                tokio::spawn(async move { c.get_or_review([5; 32], || answer(5, &calls)).await })
            })
            .collect();
        for w in waiters {
            assert_eq!(w.await.unwrap(), Ok(5));
        }
        assert_eq!(calls.load(std::sync::atomic::Ordering::SeqCst), 1);
    }
}
