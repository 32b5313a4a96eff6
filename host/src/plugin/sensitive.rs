//! What is sensitive for one provider: every secret value the host has handed it and the
//! cloud-init of every Proxy the operator has seen for it.
//!
//! Kept per provider name by the [`super::Runtime`], so it survives a reload of the
//! providers file or the plugin, and shared by all calls of the provider. That is what
//! makes redaction hold across calls: a plugin that caches a Proxy's cloud-init in `create`
//! (in the host cache, in the backend, anywhere) and prints it in a later `get` of another
//! Proxy is still scrubbed, because the redactor of every call knows every document.
//!
//! The compiled [`Redactor`] is rebuilt lazily, on the first use after a new value arrived,
//! so a burst of new Proxies costs one rebuild rather than one per Proxy. And a rebuild
//! compiles only the new values, into a segment of their own: segments are merged as a
//! binary counter carries (the last two merge while the older one is at most twice the
//! newer), so a value is recompiled O(log n) times over the life of the process and a
//! redactor has O(log n) segments. Recompiling everything on every new document made a
//! fleet of 10,000 distinct cloud-inits quadratic: one full rebuild per Proxy created.

use super::redact::{Patterns, Redactor, Segment};
use sha2::{Digest, Sha256};
use std::collections::{BTreeMap, HashSet};
use std::sync::{Arc, Mutex};

#[derive(Default)]
pub struct Sensitive {
    inner: Mutex<Inner>,
}

/// Values per segment at most, once merged: the automaton builder's working memory is
/// several times the automaton's, and a build of all 10,000 documents of a fleet at once
/// is a peak the operator's memory limit would have to allow for.
const SEGMENT_VALUES: usize = 1024;

#[derive(Default)]
struct Inner {
    seen: HashSet<[u8; 32]>,
    /// Values not compiled yet.
    pending: Vec<Value>,
    /// Compiled, oldest (and largest) first.
    segments: Vec<Compiled>,
    /// `None` after a new value arrived, until the next [`Sensitive::redactor`].
    compiled: Option<Arc<Redactor>>,
}

#[derive(Clone)]
enum Value {
    Secret(Arc<[u8]>),
    CloudInit(Arc<[u8]>),
}

/// A segment and the values it was compiled from (for a merge).
struct Compiled {
    values: Vec<Value>,
    segment: Option<Arc<Segment>>,
}

impl Compiled {
    fn new(values: Vec<Value>) -> Self {
        let mut p = Patterns::default();
        for v in &values {
            match v {
                Value::Secret(s) => p.secret(s),
                Value::CloudInit(c) => p.cloud_init(c),
            }
        }
        Compiled {
            segment: p.segment().map(Arc::new),
            values,
        }
    }
}

impl std::fmt::Debug for Sensitive {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let inner = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        f.debug_struct("Sensitive")
            .field("values", &inner.seen.len())
            .field("segments", &inner.segments.len())
            .finish()
    }
}

impl Sensitive {
    /// Adds a secret value; returns whether it was new.
    pub fn add_secret(&self, value: &[u8]) -> bool {
        self.add(value, b's', Value::Secret)
    }

    /// Adds a cloud-init document; returns whether it was new.
    pub fn add_cloud_init(&self, doc: &[u8]) -> bool {
        self.add(doc, b'c', Value::CloudInit)
    }

    fn add(&self, value: &[u8], kind: u8, wrap: fn(Arc<[u8]>) -> Value) -> bool {
        if value.trim_ascii().is_empty() {
            return false;
        }
        let mut h = Sha256::new();
        h.update([kind]);
        h.update(value);
        let key: [u8; 32] = h.finalize().into();
        let mut inner = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        if !inner.seen.insert(key) {
            return false;
        }
        inner.pending.push(wrap(value.into()));
        inner.compiled = None;
        true
    }

    /// The redactor for everything known so far.
    pub fn redactor(&self) -> Arc<Redactor> {
        let mut inner = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(r) = &inner.compiled {
            return r.clone();
        }
        let pending = std::mem::take(&mut inner.pending);
        if !pending.is_empty() {
            inner.segments.push(Compiled::new(pending));
        }
        while let [.., older, newer] = inner.segments.as_slice() {
            if older.values.len() > 2 * newer.values.len()
                || older.values.len() + newer.values.len() > SEGMENT_VALUES
            {
                break;
            }
            let newer = inner.segments.pop().expect("two segments");
            let older = inner.segments.pop().expect("two segments");
            let mut values = older.values;
            values.extend(newer.values);
            inner.segments.push(Compiled::new(values));
        }
        let r = Arc::new(Redactor::from_segments(
            inner
                .segments
                .iter()
                .filter_map(|c| c.segment.clone())
                .collect(),
        ));
        inner.compiled = Some(r.clone());
        r
    }

    /// Compiled segments (for tests of the merge schedule).
    #[cfg(test)]
    fn segment_sizes(&self) -> Vec<usize> {
        let inner = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        inner.segments.iter().map(|c| c.values.len()).collect()
    }
}

/// One [`Sensitive`] per provider name, for the life of the process.
#[derive(Default)]
pub struct SensitiveByProvider {
    by_name: Mutex<BTreeMap<String, Arc<Sensitive>>>,
}

impl SensitiveByProvider {
    pub fn get(&self, provider: &str) -> Arc<Sensitive> {
        self.by_name
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .entry(provider.to_string())
            .or_default()
            .clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn knows_every_document_and_rebuilds_only_when_something_is_new() {
        let s = Sensitive::default();
        assert!(s.add_cloud_init(b"#cloud-config\nrunpass: FIRST-SENTINEL-A\n"));
        let r1 = s.redactor();
        assert!(!s.add_cloud_init(b"#cloud-config\nrunpass: FIRST-SENTINEL-A\n"));
        assert!(Arc::ptr_eq(&r1, &s.redactor()), "no new value, no rebuild");
        assert!(s.add_cloud_init(b"#cloud-config\nrunpass: SECOND-SENTINEL-B\n"));
        assert!(s.add_secret(b"tok-123456"));
        assert!(!s.add_secret(b""));
        let r = s.redactor();
        let out = r.scrub("FIRST-SENTINEL-A SECOND-SENTINEL-B tok-123456");
        assert!(!out.contains("SENTINEL") && !out.contains("tok-"), "{out}");
    }

    /// Adding one document at a time, each followed by a use: every value stays matched,
    /// and the segments stay few (log2 of the values, plus one).
    #[test]
    fn one_document_at_a_time_stays_matched_with_few_segments() {
        let s = Sensitive::default();
        for i in 0..300 {
            s.add_cloud_init(format!("#cloud-config\nrunpass: sentinel-{i:05}-value\n").as_bytes());
            let r = s.redactor();
            for j in [0, i / 2, i] {
                assert!(r.finds(&format!("x sentinel-{j:05}-value y")), "{i}: {j}");
            }
            let sizes = s.segment_sizes();
            assert_eq!(sizes.iter().sum::<usize>(), i + 1);
            let bound = usize::BITS - (i + 1).leading_zeros() + 1;
            assert!(sizes.len() <= bound as usize, "{i}: {sizes:?}");
        }
    }

    #[test]
    fn one_set_per_provider_name() {
        let all = SensitiveByProvider::default();
        all.get("a").add_secret(b"secret-of-a");
        assert!(Arc::ptr_eq(&all.get("a"), &all.get("a")));
        assert!(!all.get("b").redactor().finds("secret-of-a"));
        assert!(all.get("a").redactor().finds("secret-of-a"));
    }

    /// Memory of the process, for the check below (Linux).
    fn resident_bytes() -> u64 {
        let statm = std::fs::read_to_string("/proc/self/statm").unwrap_or_default();
        let pages: u64 = statm
            .split_whitespace()
            .nth(1)
            .and_then(|p| p.parse().ok())
            .unwrap_or(0);
        pages * 4096
    }

    /// A fleet whose Proxies each carry their own credentials in cloud-init (the samples'
    /// tinyproxy `BasicAuth`, one password per Proxy) gives the redactor one distinct
    /// document per Proxy, kept for the life of the process. Each used to cost about
    /// 47 KiB (every document whole in every encoding, two automata, a full rebuild per
    /// new document): 470 MiB at 10,000. Now a document costs its new lines, compiled once
    /// into a segment of at most 1,024 documents. Bounds: the automata at most 2 KiB per
    /// document (measured 1.2), the process at most 6 KiB per document (measured 4.2 in a
    /// debug build, with the rebuilds' freed memory).
    #[test]
    fn distinct_cloud_init_documents_cost_the_redactor_little() {
        let s = Sensitive::default();
        let before = resident_bytes();
        let n = 4000;
        for i in 0..n {
            let doc = format!(
                "#cloud-config\npackages: [tinyproxy]\nwrite_files:\n  - path: /etc/tinyproxy/tinyproxy.conf\n    content: |\n      Port 3128\n      BasicAuth proxyuser pw-{i:08}-Zq7xK2mN9vB4\n      Allow 0.0.0.0/0\nruncmd:\n  - systemctl restart tinyproxy\n"
            );
            s.add_cloud_init(doc.as_bytes());
            if i % 100 == 99 {
                let _ = s.redactor();
            }
        }
        let r = s.redactor();
        for i in [0, 7, n / 2, n - 1] {
            let line = format!("BasicAuth proxyuser pw-{i:08}-Zq7xK2mN9vB4");
            assert!(r.finds(&format!("pw-{i:08}-Zq7xK2mN9vB4")));
            let b64 = data_encoding::BASE64.encode(format!("x{line}\n").as_bytes());
            assert!(!r.scrub(&b64).contains(&b64[8..40]), "{i}: {b64}");
        }
        let automata = r.memory_usage();
        let grew = resident_bytes().saturating_sub(before);
        assert!(
            automata < n * 2048,
            "{n} distinct documents: automata of {} KiB",
            automata >> 10
        );
        assert!(
            grew < (n * 6144) as u64,
            "{n} distinct documents grew the process by {} KiB",
            grew >> 10
        );
    }
}
