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
//! so a burst of new Proxies costs one rebuild rather than one per Proxy.

use super::redact::{Patterns, Redactor};
use sha2::{Digest, Sha256};
use std::collections::{BTreeMap, HashSet};
use std::sync::{Arc, Mutex};

#[derive(Default)]
pub struct Sensitive {
    inner: Mutex<Inner>,
}

#[derive(Default)]
struct Inner {
    seen: HashSet<[u8; 32]>,
    secrets: Vec<Arc<[u8]>>,
    cloud_inits: Vec<Arc<[u8]>>,
    /// `None` after a new value arrived, until the next [`Sensitive::redactor`].
    compiled: Option<Arc<Redactor>>,
}

impl std::fmt::Debug for Sensitive {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let inner = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        f.debug_struct("Sensitive")
            .field("secrets", &inner.secrets.len())
            .field("cloud_inits", &inner.cloud_inits.len())
            .finish()
    }
}

impl Sensitive {
    /// Adds a secret value; returns whether it was new.
    pub fn add_secret(&self, value: &[u8]) -> bool {
        self.add(value, b's', |i| &mut i.secrets)
    }

    /// Adds a cloud-init document; returns whether it was new.
    pub fn add_cloud_init(&self, doc: &[u8]) -> bool {
        self.add(doc, b'c', |i| &mut i.cloud_inits)
    }

    fn add(
        &self,
        value: &[u8],
        kind: u8,
        list: impl Fn(&mut Inner) -> &mut Vec<Arc<[u8]>>,
    ) -> bool {
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
        list(&mut inner).push(value.into());
        inner.compiled = None;
        true
    }

    /// The redactor for everything known so far.
    pub fn redactor(&self) -> Arc<Redactor> {
        let mut inner = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(r) = &inner.compiled {
            return r.clone();
        }
        let mut p = Patterns::default();
        for s in &inner.secrets {
            p.secret(s);
        }
        for c in &inner.cloud_inits {
            p.cloud_init(c);
        }
        let r = Arc::new(p.build());
        inner.compiled = Some(r.clone());
        r
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

    /// Issue 12, still open: a fleet whose Proxies each carry their own credentials in
    /// cloud-init (the samples' tinyproxy `BasicAuth`, one password per Proxy) gives the
    /// redactor one distinct document per Proxy, and it keeps every one in every encoding
    /// for the life of the process: measured 47 MiB (debug build) and 4.8 s of rebuilds
    /// for 1,000 documents of 250 bytes, so about 470 MiB at 10,000. The scale benchmark
    /// gives every Proxy the same document and does not show it. The bound below is what
    /// a 10,000-Proxy fleet can afford; run with `--ignored` to measure.
    #[test]
    #[ignore = "issue 12, open: the redactor grows by ~47 KiB per distinct cloud-init document (fails today)"]
    fn distinct_cloud_init_documents_cost_the_redactor_little() {
        let s = Sensitive::default();
        let before = resident_bytes();
        for i in 0..1000 {
            let doc = format!(
                "#cloud-config\npackages: [tinyproxy]\nwrite_files:\n  - path: /etc/tinyproxy/tinyproxy.conf\n    content: |\n      Port 3128\n      BasicAuth proxyuser pw-{i:08}-Zq7xK2mN9vB4\n      Allow 0.0.0.0/0\nruncmd:\n  - systemctl restart tinyproxy\n"
            );
            s.add_cloud_init(doc.as_bytes());
            if i % 100 == 99 {
                let _ = s.redactor();
            }
        }
        let r = s.redactor();
        assert!(r.finds("pw-00000007-Zq7xK2mN9vB4"));
        let grew = resident_bytes().saturating_sub(before);
        assert!(
            grew < 4 << 20,
            "1,000 distinct documents grew the process by {} KiB",
            grew >> 10
        );
    }
}
