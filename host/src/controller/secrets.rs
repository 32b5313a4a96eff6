//! Cloud-init Secrets: when the reconciler may use what it read before, and when it must
//! read the Secret again. Pure decisions, table-tested; the state and the API calls around
//! them are in [`super::secret_cache`].
//!
//! Why: a Proxy whose cloud-init is a `secretKeyRef` used to GET its Secret on every
//! reconcile, so once per drift poll at rest: at 10,000 Proxies and a 2-minute drift poll,
//! tens of GETs per second on the API server for data that almost never changes. Like
//! cert-manager, the operator now watches the *metadata* of Secrets (names and
//! resourceVersions, no values) and keeps the data of the Secrets Proxies reference, with
//! the resourceVersion it was read at. The metadata watch says when that copy is stale;
//! only then is the Secret read again, by one GET.

use std::collections::BTreeMap;
use std::sync::Arc;

/// A Secret, by namespace and name (the namespace is the referencing Proxy's).
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct SecretKey {
    pub namespace: String,
    pub name: String,
}

impl SecretKey {
    pub fn new(namespace: impl Into<String>, name: impl Into<String>) -> Self {
        SecretKey {
            namespace: namespace.into(),
            name: name.into(),
        }
    }
}

impl std::fmt::Display for SecretKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.namespace, self.name)
    }
}

/// What the metadata watch says about one Secret.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Seen<'a> {
    /// The watch has not finished its first list: its silence means nothing yet.
    NotSynced,
    /// The watch has listed and the Secret is not there.
    Absent,
    /// The Secret exists at this resourceVersion (None: the server sent none, which no
    /// real server does; treated as "cannot tell", so read it).
    Present { resource_version: Option<&'a str> },
}

/// The data of one Secret as a GET returned it, and the resourceVersion of that answer.
///
/// `Debug` shows the resourceVersion and the key names only: the values never reach a
/// log line, an error or a span through this type.
#[derive(Clone, PartialEq, Eq)]
pub struct Held {
    pub resource_version: String,
    /// The Secret's UID.
    pub uid: Option<String>,
    /// The UID of its controller owner (`ownerReferences` with `controller: true`): tells
    /// the credentials Secret the operator generated for a Proxy from a user's Secret that
    /// happens to have the same name.
    pub controller: Option<String>,
    /// Whether it carries the label that lets a Proxy's `spec.auth.type: Secret` use it
    /// ([`super::proxy_auth::labelled_for_proxies`]).
    pub labelled_for_proxies: bool,
    /// Whether it carries the label that lets a Proxy's `spec.cloudInit.secretKeyRef` use
    /// it ([`super::proxy_auth::labelled_for_cloud_init`]).
    pub labelled_for_cloud_init: bool,
    /// Key -> value, `data` over `stringData` (see [`super::input::secret_value`]), sorted
    /// by key. A slice, not a map: a Secret a Proxy references has a key or two, and one
    /// is held per Proxy with generated credentials, where a map's node (544 bytes for
    /// eleven entries) was most of the copy.
    data: Box<[Entry]>,
}

/// One key of a held Secret and its value.
type Entry = (Box<str>, Box<[u8]>);

impl std::fmt::Debug for Held {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Held")
            .field("resource_version", &self.resource_version)
            .field("uid", &self.uid)
            .field("controller", &self.controller)
            .field("labelled_for_proxies", &self.labelled_for_proxies)
            .field("labelled_for_cloud_init", &self.labelled_for_cloud_init)
            .field(
                "keys",
                &self.data.iter().map(|(k, _)| k).collect::<Vec<_>>(),
            )
            .finish()
    }
}

/// The most data (keys and values) of one referenced Secret the cache holds between reads:
/// the cloud-init render limit ([`super::template::MAX_RENDERED_BYTES`]), so a referenced
/// Secret costs the leader no more than an inline cloud-init does. A larger Secret (the API
/// server allows 1 MiB) is read by a GET at each use and held only for that use: a tenant
/// who points each of their Proxies at a Secret of a megabyte costs API reads, not a
/// megabyte of the operator's memory per Proxy.
pub const MAX_HELD_BYTES: usize = super::template::MAX_RENDERED_BYTES;

impl Held {
    /// The bytes of its keys and values.
    pub fn bytes(&self) -> usize {
        self.data.iter().map(|(k, v)| k.len() + v.len()).sum()
    }

    /// Whether the cache may keep it between reads ([`MAX_HELD_BYTES`]).
    pub fn may_be_held(&self) -> bool {
        self.bytes() <= MAX_HELD_BYTES
    }

    pub fn new(resource_version: impl Into<String>, data: BTreeMap<String, Vec<u8>>) -> Self {
        Held {
            resource_version: resource_version.into(),
            uid: None,
            controller: None,
            labelled_for_proxies: false,
            labelled_for_cloud_init: false,
            data: data
                .into_iter()
                .map(|(k, v)| (k.into_boxed_str(), v.into_boxed_slice()))
                .collect(),
        }
    }

    /// What a GET returned, or None without a resourceVersion (it could never be
    /// confirmed fresh, so it is not kept).
    pub fn from_secret(secret: &k8s_openapi::api::core::v1::Secret) -> Option<Self> {
        let rv = secret.metadata.resource_version.clone()?;
        Some(Self::at_version(secret, rv))
    }

    /// What a GET returned, labelled with `resource_version` (empty for an answer without
    /// one, which is then used once and never held).
    pub fn at_version(secret: &k8s_openapi::api::core::v1::Secret, rv: String) -> Self {
        let mut data: BTreeMap<String, Vec<u8>> = secret
            .string_data
            .iter()
            .flatten()
            .map(|(k, v)| (k.clone(), v.clone().into_bytes()))
            .collect();
        for (k, v) in secret.data.iter().flatten() {
            data.insert(k.clone(), v.0.clone());
        }
        let mut held = Held::new(rv, data);
        held.uid = secret.metadata.uid.clone();
        held.controller = secret
            .metadata
            .owner_references
            .iter()
            .flatten()
            .find(|o| o.controller == Some(true))
            .map(|o| o.uid.clone());
        held.labelled_for_proxies =
            super::proxy_auth::labelled_for_proxies(secret.metadata.labels.as_ref());
        held.labelled_for_cloud_init =
            super::proxy_auth::labelled_for_cloud_init(secret.metadata.labels.as_ref());
        held
    }

    /// The value of `key`.
    pub fn value(&self, key: &str) -> Option<&[u8]> {
        self.data
            .binary_search_by(|(k, _)| (**k).cmp(key))
            .ok()
            .map(|i| &*self.data[i].1)
    }
}

/// What to do for one read of a referenced Secret.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Plan {
    /// The held copy is the Secret as the watch last saw it.
    Use(Arc<Held>),
    /// Read it (GET): nothing held, the copy is stale, or the watch cannot tell yet.
    Get,
    /// The watch has listed and the Secret does not exist: the held copy, if any, goes.
    NotFound,
}

/// Whether the held copy of a Secret can be used, from what the metadata watch says.
///
/// | watch | held | plan |
/// |---|---|---|
/// | not synced | anything | Get (fall back to a GET per read until the watch has listed) |
/// | absent | anything | NotFound (deleted, or never created: no GET) |
/// | resourceVersion r | a copy read at r | Use |
/// | resourceVersion r | a copy read at another version | Get (changed) |
/// | resourceVersion r | nothing | Get (first read) |
///
/// A missing Secret costs no GET once the watch has listed: when it appears, the watch
/// event re-runs the Proxies that reference it (see [`on_change`]).
pub fn plan(seen: Seen<'_>, held: Option<&Arc<Held>>) -> Plan {
    match (seen, held) {
        (Seen::NotSynced, _) => Plan::Get,
        (Seen::Absent, _) => Plan::NotFound,
        (
            Seen::Present {
                resource_version: Some(rv),
            },
            Some(h),
        ) if h.resource_version == rv => Plan::Use(h.clone()),
        (Seen::Present { .. }, _) => Plan::Get,
    }
}

/// One event of the metadata watch, as far as the cache cares.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Change<'a> {
    /// Added or modified, or listed (again) after a watch restart.
    Applied {
        resource_version: Option<&'a str>,
    },
    Deleted,
}

/// What one watch event does to the cache.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Reaction {
    /// Re-run the Proxies that reference the Secret: their cloud-init may have changed.
    pub trigger: bool,
    /// Drop the held copy (stale or deleted): it would never be used again.
    pub drop: bool,
}

/// How a watch event of a Secret reaches the Proxies: a Secret some Proxy references
/// (`referenced`) that was deleted or is now at another resourceVersion than the copy
/// held (or has no copy: created after it was found missing, or read while the event was
/// on its way) re-runs those Proxies, whose reconcile then reads it once. A Secret no
/// Proxy references triggers nothing, and an event at the held version (a relist) neither.
pub fn on_change(change: Change<'_>, held: Option<&Held>, referenced: bool) -> Reaction {
    let current = match change {
        Change::Deleted => false,
        Change::Applied { resource_version } => {
            held.is_some_and(|h| resource_version == Some(h.resource_version.as_str()))
        }
    };
    Reaction {
        trigger: referenced && !current,
        drop: held.is_some() && !current,
    }
}

/// Why a Proxy's cloud-init Secret gave no cloud-init. The messages name the Secret and
/// key, never a value.
#[derive(Debug, thiserror::Error)]
pub enum CloudInitError {
    #[error("Secret {secret} not found (spec.cloudInit.secretKeyRef)")]
    NotFound { secret: SecretKey },
    #[error("Secret {secret} has no key {key:?} (spec.cloudInit.secretKeyRef)")]
    NoKey { secret: SecretKey, key: String },
    #[error("reading Secret {secret}: {source}")]
    Api {
        secret: SecretKey,
        #[source]
        source: kube::Error,
    },
}

impl CloudInitError {
    /// A condition the user can fix by creating the Secret or key (retried), as opposed to
    /// an API failure (retried with backoff).
    pub fn is_unavailable(&self) -> bool {
        matches!(
            self,
            CloudInitError::NotFound { .. } | CloudInitError::NoKey { .. }
        )
    }
}

/// The value of `key` in a held copy of `secret`.
pub fn value(secret: &SecretKey, held: &Held, key: &str) -> Result<Vec<u8>, CloudInitError> {
    held.value(key)
        .map(<[u8]>::to_vec)
        .ok_or_else(|| CloudInitError::NoKey {
            secret: secret.clone(),
            key: key.to_string(),
        })
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::ByteString;
    use k8s_openapi::api::core::v1::Secret;

    fn held(rv: &str) -> Arc<Held> {
        Arc::new(Held::new(
            rv,
            [("user-data".to_string(), b"#cloud-config\n".to_vec())].into(),
        ))
    }

    /// One read of `user-data`, as the shell does it: the plan, then the key.
    #[derive(Debug, PartialEq)]
    enum Read {
        Value(&'static [u8]),
        Get,
        NotFound,
        NoKey,
    }

    fn read(seen: Seen<'_>, h: Option<&Arc<Held>>, key: &str) -> Read {
        let secret = SecretKey::new("default", "ci");
        match plan(seen, h) {
            Plan::Get => Read::Get,
            Plan::NotFound => Read::NotFound,
            Plan::Use(h) => match value(&secret, &h, key) {
                Ok(v) => {
                    assert_eq!(v, b"#cloud-config\n");
                    Read::Value(b"#cloud-config\n")
                }
                Err(CloudInitError::NoKey { .. }) => Read::NoKey,
                Err(e) => panic!("{e}"),
            },
        }
    }

    #[test]
    fn reads_use_the_held_copy_only_while_the_watch_confirms_it() {
        let at = |rv| Seen::Present {
            resource_version: Some(rv),
        };
        let h5 = held("5");
        type Case<'a> = (&'a str, Seen<'a>, Option<&'a Arc<Held>>, &'a str, Read);
        let cases: &[Case<'_>] = &[
            (
                "hit",
                at("5"),
                Some(&h5),
                "user-data",
                Read::Value(b"#cloud-config\n"),
            ),
            ("miss: nothing held", at("5"), None, "user-data", Read::Get),
            (
                "stale: the Secret changed",
                at("6"),
                Some(&h5),
                "user-data",
                Read::Get,
            ),
            (
                "deleted Secret",
                Seen::Absent,
                Some(&h5),
                "user-data",
                Read::NotFound,
            ),
            (
                "never created",
                Seen::Absent,
                None,
                "user-data",
                Read::NotFound,
            ),
            ("key missing", at("5"), Some(&h5), "other", Read::NoKey),
            (
                "watch not synced, held",
                Seen::NotSynced,
                Some(&h5),
                "user-data",
                Read::Get,
            ),
            (
                "watch not synced, nothing",
                Seen::NotSynced,
                None,
                "user-data",
                Read::Get,
            ),
            (
                "no resourceVersion from the watch",
                Seen::Present {
                    resource_version: None,
                },
                Some(&h5),
                "user-data",
                Read::Get,
            ),
        ];
        for (name, seen, h, key, want) in cases {
            assert_eq!(read(*seen, *h, key), *want, "{name}");
        }
    }

    #[test]
    fn watch_events_trigger_the_referencing_proxies_only_on_a_change() {
        let h5 = held("5");
        let applied = |rv| Change::Applied {
            resource_version: Some(rv),
        };
        let r = |trigger, drop| Reaction { trigger, drop };
        let cases: &[(&str, Change<'_>, Option<&Held>, bool, Reaction)] = &[
            ("changed", applied("6"), Some(&h5), true, r(true, true)),
            (
                "relist at the held version",
                applied("5"),
                Some(&h5),
                true,
                r(false, false),
            ),
            ("deleted", Change::Deleted, Some(&h5), true, r(true, true)),
            (
                "created after it was missing",
                applied("7"),
                None,
                true,
                r(true, false),
            ),
            (
                "deleted, nothing held",
                Change::Deleted,
                None,
                true,
                r(true, false),
            ),
            (
                "unreferenced Secret",
                applied("7"),
                None,
                false,
                r(false, false),
            ),
            (
                "unreferenced, still held",
                applied("6"),
                Some(&h5),
                false,
                r(false, true),
            ),
            (
                "no resourceVersion",
                Change::Applied {
                    resource_version: None,
                },
                Some(&h5),
                true,
                r(true, true),
            ),
        ];
        for (name, change, h, referenced, want) in cases {
            assert_eq!(on_change(*change, *h, *referenced), *want, "{name}");
        }
    }

    #[test]
    fn held_copies_take_data_over_string_data_and_need_a_version() {
        let mut s = Secret {
            string_data: Some(
                [
                    ("a".to_string(), "plain".to_string()),
                    ("b".to_string(), "plain".to_string()),
                ]
                .into(),
            ),
            data: Some([("b".to_string(), ByteString(b"bytes".to_vec()))].into()),
            ..Secret::default()
        };
        assert_eq!(Held::from_secret(&s), None, "no resourceVersion");
        s.metadata.resource_version = Some("9".into());
        let h = Held::from_secret(&s).unwrap();
        assert_eq!(h.resource_version, "9");
        assert_eq!(h.value("a"), Some(&b"plain"[..]));
        assert_eq!(h.value("b"), Some(&b"bytes"[..]));
        assert_eq!(h.value("c"), None);
    }

    /// Values stay out of anything printed: Debug of the held copy, the plan and the errors.
    #[test]
    fn values_never_print() {
        let sentinel = "SENTINEL-d41d8cd9";
        let h = Arc::new(Held::new(
            "1",
            [("user-data".to_string(), sentinel.as_bytes().to_vec())].into(),
        ));
        let secret = SecretKey::new("ns", "s");
        let printed = [
            format!("{h:?}"),
            format!(
                "{:?}",
                plan(
                    Seen::Present {
                        resource_version: Some("1")
                    },
                    Some(&h)
                )
            ),
            value(&secret, &h, "other").unwrap_err().to_string(),
            CloudInitError::NotFound {
                secret: secret.clone(),
            }
            .to_string(),
        ];
        for p in printed {
            assert!(!p.contains(sentinel), "{p}");
        }
        assert!(format!("{h:?}").contains("user-data"));
        assert_eq!(
            value(&secret, &h, "other").unwrap_err().to_string(),
            "Secret ns/s has no key \"other\" (spec.cloudInit.secretKeyRef)"
        );
    }
}
