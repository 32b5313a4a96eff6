//! What the operator's watches read, and keep, of the objects users write.
//!
//! Users write the Proxies, ProxyPools and Secrets the operator watches, and Kubernetes
//! bounds little of their metadata: annotations to 256 KiB an object, labels and
//! finalizers by each one's length but not by their count, so in the end only by the size
//! of the object (etcd's 1.5 MiB a request). Two costs follow, and each has its bound here:
//!
//! - **A list page** is read and parsed whole before anything of it is dropped, at about
//!   three times its size at once (kube collects the body, copies it into a string, then
//!   parses it). kube's default page is 500 objects: 500 Proxies with 256 KiB of
//!   annotations each are 125 MiB a page, several times the Deployment's memory left
//!   over. Every watch and list pages at [`LIST_PAGE`], so a page is at most 24 MiB
//!   whatever users write (4 MiB with annotations at their limit).
//! - **A cached copy** keeps only the metadata the operator reads ([`trim_metadata`]):
//!   without it, one tenant's Proxies with large annotations held a quarter of a MiB each
//!   in the leader's cache for as long as they existed.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};
use kube::runtime::watcher;
use std::collections::BTreeMap;

/// Objects a watch's list page carries. With objects at etcd's limit (1.5 MiB) a page is
/// 24 MiB; at the operator's own sizes (a Proxy is about 1 KiB) 10,000 Proxies list in 625
/// pages, once at start and after a watch falls too far behind.
pub const LIST_PAGE: u32 = 16;

/// Labels a cached copy keeps (the API server checks each label's length, not their
/// count). The pool label comes first; discovery's selectors see the others.
pub const MAX_LABELS: usize = 32;
/// The API server's limits on a label: a 253-byte prefix, `/`, a 63-byte name; a 63-byte
/// value. A real server never sends longer ones; the cache does not keep them either.
pub const MAX_LABEL_KEY: usize = 317;
pub const MAX_LABEL_VALUE: usize = 63;
/// A kept annotation's value (the operator's own annotations are far shorter).
pub const MAX_ANNOTATION_VALUE: usize = 2048;
/// Finalizers a cached copy keeps whole. A copy with more keeps only the operator's own
/// and says so in [`TRIMMED`]: whoever rewrites the list reads the server's first.
pub const MAX_FINALIZERS: usize = 16;
/// Owner references a cached copy keeps (the controller's first, then ProxyPools').
pub const MAX_OWNERS: usize = 4;

/// Set on a cached copy, never written to the server: what [`trim_metadata`] cut that the
/// operator needs whole elsewhere (`finalizers`). Users cannot set it: every annotation
/// not asked for is dropped first.
pub const TRIMMED: &str = "egress.proxy-operator.dev/cache-trimmed";

/// Every watch of the operator lists with this configuration.
pub fn watcher_config() -> watcher::Config {
    watcher::Config::default().page_size(LIST_PAGE)
}

/// Every list the operator makes outside a watch (the orphan GC's live set) pages the
/// same way: its pages carry what users wrote just as a watch's do.
pub fn list_params() -> kube::api::ListParams {
    kube::api::ListParams::default().limit(LIST_PAGE)
}

/// What to keep of an object's metadata besides its identity (name, namespace, uid,
/// resourceVersion, generation, timestamps).
#[derive(Clone, Copy, Debug, Default)]
pub struct Keep<'a> {
    /// Annotations the operator reads.
    pub annotations: &'a [&'a str],
    /// Labels kept before any other.
    pub labels_first: &'a [&'a str],
    /// The operator's finalizer, kept when the others are cut.
    pub finalizer: Option<&'a str>,
}

/// What [`trim_metadata`] cut beyond what the operator never reads, for the log: counts and
/// sizes, never values.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Cut {
    pub labels: usize,
    pub annotations: usize,
    pub finalizers: usize,
    pub owners: usize,
}

impl Cut {
    pub fn any(&self) -> bool {
        *self != Cut::default()
    }
}

/// Trims `meta` to what the operator reads, each part to its bound: managedFields dropped,
/// annotations only those in `keep` with short values, labels of valid length up to
/// [`MAX_LABELS`], owner references up to [`MAX_OWNERS`], finalizers whole up to
/// [`MAX_FINALIZERS`] (else the operator's own and the [`TRIMMED`] mark).
pub fn trim_metadata(meta: &mut ObjectMeta, keep: Keep<'_>) -> Cut {
    let mut cut = Cut::default();
    meta.managed_fields = None;

    let mut annotations: BTreeMap<String, String> = BTreeMap::new();
    for (k, v) in meta.annotations.take().unwrap_or_default() {
        if keep.annotations.contains(&k.as_str()) {
            if v.len() <= MAX_ANNOTATION_VALUE {
                annotations.insert(k, v);
            } else {
                cut.annotations += 1;
            }
        }
    }

    if let Some(labels) = meta.labels.take() {
        let total = labels.len();
        let valid = |k: &String, v: &String| k.len() <= MAX_LABEL_KEY && v.len() <= MAX_LABEL_VALUE;
        let mut kept: BTreeMap<String, String> = labels
            .iter()
            .filter(|(k, v)| keep.labels_first.contains(&k.as_str()) && valid(k, v))
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        for (k, v) in labels {
            if kept.len() >= MAX_LABELS {
                break;
            }
            if valid(&k, &v) && !kept.contains_key(&k) {
                kept.insert(k, v);
            }
        }
        cut.labels = total - kept.len();
        meta.labels = (!kept.is_empty()).then_some(kept);
    }

    if let Some(owners) = meta.owner_references.take() {
        let total = owners.len();
        let (mut kept, rest): (Vec<OwnerReference>, Vec<OwnerReference>) =
            owners.into_iter().partition(|o| o.controller == Some(true));
        kept.truncate(1);
        kept.extend(rest.into_iter().filter(|o| o.kind == "ProxyPool"));
        kept.truncate(MAX_OWNERS);
        cut.owners = total - kept.len();
        meta.owner_references = (!kept.is_empty()).then_some(kept);
    }

    if let Some(finalizers) = meta.finalizers.as_mut()
        && (finalizers.len() > MAX_FINALIZERS || finalizers.iter().any(|f| f.len() > MAX_LABEL_KEY))
    {
        let total = finalizers.len();
        finalizers.retain(|f| Some(f.as_str()) == keep.finalizer);
        finalizers.truncate(1);
        cut.finalizers = total - finalizers.len();
        annotations.insert(TRIMMED.into(), "finalizers".into());
    }

    meta.annotations = (!annotations.is_empty()).then_some(annotations);
    cut
}

/// Whether the cached copy `meta` lacks finalizers the server has.
pub fn finalizers_trimmed(meta: &ObjectMeta) -> bool {
    meta.annotations
        .as_ref()
        .is_some_and(|a| a.get(TRIMMED).is_some_and(|v| v == "finalizers"))
}

#[cfg(test)]
mod tests {
    use super::*;

    const OURS: &str = "egress.proxy-operator.dev/instance";
    const KEEP: Keep<'static> = Keep {
        annotations: &["egress.proxy-operator.dev/skip-cleanup"],
        labels_first: &["egress.proxy-operator.dev/pool"],
        finalizer: Some(OURS),
    };

    fn map(pairs: impl IntoIterator<Item = (String, String)>) -> Option<BTreeMap<String, String>> {
        Some(pairs.into_iter().collect())
    }

    fn owner(kind: &str, name: &str, controller: bool) -> OwnerReference {
        OwnerReference {
            kind: kind.into(),
            name: name.into(),
            controller: Some(controller),
            ..Default::default()
        }
    }

    /// An object of ordinary size keeps everything the operator reads, as it was.
    #[test]
    fn ordinary_metadata_keeps_what_the_operator_reads() {
        let mut meta = ObjectMeta {
            name: Some("p".into()),
            labels: map([
                ("egress.proxy-operator.dev/pool".into(), "web".into()),
                ("team".into(), "edge".into()),
            ]),
            annotations: map([
                (
                    "egress.proxy-operator.dev/skip-cleanup".into(),
                    "true".into(),
                ),
                (
                    "kubectl.kubernetes.io/last-applied-configuration".into(),
                    "{}".into(),
                ),
                ("team".into(), "edge".into()),
            ]),
            finalizers: Some(vec![OURS.into(), "other.example/keep".into()]),
            owner_references: Some(vec![owner("ProxyPool", "web", true)]),
            ..Default::default()
        };
        let before = meta.clone();
        assert_eq!(
            trim_metadata(&mut meta, KEEP),
            Cut::default(),
            "nothing the operator reads is cut"
        );
        assert_eq!(meta.labels, before.labels);
        assert_eq!(meta.finalizers, before.finalizers);
        assert_eq!(meta.owner_references, before.owner_references);
        let kept: Vec<_> = meta.annotations.unwrap().into_keys().collect();
        assert_eq!(kept, ["egress.proxy-operator.dev/skip-cleanup"]);
        assert!(!finalizers_trimmed(&ObjectMeta::default()));
    }

    /// A hostile object's metadata is cut to the bounds, the parts the operator needs
    /// first, and the trim says what it cut (a user's own TRIMMED annotation is dropped).
    #[test]
    fn hostile_metadata_is_cut_to_its_bounds() {
        let big = "x".repeat(200 * 1024);
        let mut labels: Vec<(String, String)> = (0..5000)
            .map(|i| (format!("l{i:05}"), "v".into()))
            .collect();
        labels.push(("egress.proxy-operator.dev/pool".into(), "web".into()));
        labels.push(("long".into(), big.clone()));
        let mut meta = ObjectMeta {
            labels: map(labels),
            annotations: map([
                ("egress.proxy-operator.dev/skip-cleanup".into(), big.clone()),
                ("huge".into(), big.clone()),
                (TRIMMED.into(), "finalizers".into()),
            ]),
            finalizers: Some(
                (0..100)
                    .map(|i| format!("f{i}"))
                    .chain([OURS.into()])
                    .collect(),
            ),
            owner_references: Some(
                (0..50)
                    .map(|i| owner("ConfigMap", &format!("c{i}"), false))
                    .chain([
                        owner("ProxyPool", "web", true),
                        owner("ProxyPool", "b", true),
                    ])
                    .collect(),
            ),
            ..Default::default()
        };
        let cut = trim_metadata(&mut meta, KEEP);
        let labels = meta.labels.as_ref().unwrap();
        assert_eq!(labels.len(), MAX_LABELS);
        assert_eq!(
            labels
                .get("egress.proxy-operator.dev/pool")
                .map(String::as_str),
            Some("web")
        );
        assert!(!labels.contains_key("long"));
        assert_eq!(meta.finalizers.as_deref(), Some(&[OURS.to_string()][..]));
        assert!(finalizers_trimmed(&meta));
        let owners: Vec<_> = meta
            .owner_references
            .iter()
            .flatten()
            .map(|o| o.name.as_str())
            .collect();
        assert_eq!(owners, ["web"], "one controller, no other kinds");
        assert_eq!(
            cut,
            Cut {
                labels: 5002 - MAX_LABELS,
                annotations: 1,
                finalizers: 100,
                owners: 51
            }
        );
        let kept: Vec<_> = meta.annotations.as_ref().unwrap().keys().cloned().collect();
        assert_eq!(kept, [TRIMMED]);

        // A user's TRIMMED alone is not kept.
        let mut meta = ObjectMeta {
            annotations: map([(TRIMMED.into(), "finalizers".into())]),
            ..Default::default()
        };
        assert!(!trim_metadata(&mut meta, KEEP).any());
        assert!(!finalizers_trimmed(&meta));
    }

    #[test]
    fn every_watch_pages() {
        assert_eq!(watcher_config().page_size, Some(LIST_PAGE));
        // Every watcher of the operator takes its configuration from here.
        let src = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
        let mut stack = vec![src];
        let mut offenders = Vec::new();
        while let Some(dir) = stack.pop() {
            for e in std::fs::read_dir(&dir).unwrap() {
                let path = e.unwrap().path();
                if path.is_dir() {
                    stack.push(path);
                } else if path.extension().is_some_and(|x| x == "rs")
                    && !path.ends_with("watched.rs")
                {
                    let text = std::fs::read_to_string(&path).unwrap();
                    if text.contains("watcher::Config::default()")
                        || text.contains("ListParams::default()")
                        || text.contains("Controller::new(")
                        || text.contains("Controller::new_with(")
                    {
                        offenders.push(path.display().to_string());
                    }
                }
            }
        }
        assert!(
            offenders.is_empty(),
            "watches or lists not paged by watched::watcher_config or list_params: {offenders:?}"
        );
    }
}
