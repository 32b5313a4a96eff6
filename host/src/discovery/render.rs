//! Pre-rendered JSON of each Proxy, keyed by UID and resourceVersion.
//!
//! An answer is a function of the object alone, and an object with the same UID and
//! resourceVersion is the same object, so each Proxy is encoded once per change instead of
//! once per request: a list of 1,000 proxies becomes a sort and a concatenation. Entries
//! of proxies that left the store are dropped when the map outgrows the store.

use super::view::ProxyView;
use crate::api::Proxy;
use kube::runtime::reflector::Store;
use std::collections::{HashMap, HashSet};
use std::sync::{Arc, RwLock};

/// UID -> (resourceVersion, JSON).
type Rendered = HashMap<String, (String, Box<[u8]>)>;

#[derive(Default)]
pub struct RenderCache {
    map: RwLock<Rendered>,
}

fn cache_key(p: &Proxy) -> Option<(&str, &str)> {
    let uid = p.metadata.uid.as_deref().filter(|u| !u.is_empty())?;
    let rv = p
        .metadata
        .resource_version
        .as_deref()
        .filter(|r| !r.is_empty())?;
    Some((uid, rv))
}

impl RenderCache {
    /// Appends the JSON of `items`, comma-separated, to `out`.
    pub fn write_items(&self, items: &[Arc<Proxy>], out: &mut Vec<u8>, store: &Store<Proxy>) {
        let mut fresh: Vec<(usize, std::ops::Range<usize>)> = Vec::new();
        {
            let map = self.map.read().unwrap_or_else(|e| e.into_inner());
            for (i, p) in items.iter().enumerate() {
                if i > 0 {
                    out.push(b',');
                }
                let key = cache_key(p);
                match key.and_then(|(uid, rv)| map.get(uid).filter(|(r, _)| r == rv)) {
                    Some((_, json)) => out.extend_from_slice(json),
                    None => {
                        let start = out.len();
                        serde_json::to_writer(&mut *out, &ProxyView::of(p))
                            .expect("writing JSON to a Vec cannot fail");
                        if key.is_some() {
                            fresh.push((i, start..out.len()));
                        }
                    }
                }
            }
        }
        if fresh.is_empty() {
            return;
        }
        let mut map = self.map.write().unwrap_or_else(|e| e.into_inner());
        for (i, range) in fresh {
            if let Some((uid, rv)) = cache_key(&items[i]) {
                map.insert(uid.to_string(), (rv.to_string(), out[range].into()));
            }
        }
        if map.len() > 2 * store.len() + 64 {
            let all = store.state();
            let live: HashSet<&str> = all
                .iter()
                .filter_map(|p| p.metadata.uid.as_deref())
                .collect();
            map.retain(|uid, _| live.contains(uid.as_str()));
        }
    }
}
