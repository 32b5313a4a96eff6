//! Least-recently-given choice among Ready proxies.
//!
//! Every answer of the pick endpoint stamps the chosen Proxy with a sequence number; the
//! next pick takes the candidate with the oldest stamp (never given counts as oldest), ties
//! broken by namespace/name. For a fixed set of candidates that is exact round-robin, and
//! unlike a round-robin counter per filter set it stays even when filter sets overlap
//! (two clients asking for `region=eu` and `zone=fsn1` share the proxies in both) and when
//! the set changes: a new Proxy is handed out next instead of waiting for a counter to
//! wrap, and a removed one does not shift everybody else's turn.
//!
//! Stamps are kept per object UID (a recreated Proxy of the same name starts fresh) and are
//! pruned when the map outgrows the store.

use super::view::sort_key;
use crate::api::Proxy;
use std::borrow::Cow;
use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};

#[derive(Default)]
pub struct Picker {
    state: Mutex<State>,
}

#[derive(Default)]
struct State {
    seq: u64,
    last: HashMap<String, u64>,
}

fn key(p: &Proxy) -> Cow<'_, str> {
    match p.metadata.uid.as_deref() {
        Some(uid) if !uid.is_empty() => Cow::Borrowed(uid),
        _ => Cow::Owned(format!(
            "{}/{}",
            p.metadata.namespace.as_deref().unwrap_or(""),
            p.metadata.name.as_deref().unwrap_or("")
        )),
    }
}

impl Picker {
    /// Chooses among `candidates` (in any order). `store_len` and `all` (a snapshot of the
    /// whole store, taken only when needed) serve to forget proxies that are gone.
    pub fn pick<'a>(
        &self,
        candidates: &'a [Arc<Proxy>],
        store_len: usize,
        all: impl FnOnce() -> Vec<Arc<Proxy>>,
    ) -> Option<&'a Arc<Proxy>> {
        let mut st = self.state.lock().unwrap_or_else(|e| e.into_inner());
        let mut best: Option<(u64, usize)> = None;
        for (i, p) in candidates.iter().enumerate() {
            let stamp = st.last.get(key(p).as_ref()).copied().unwrap_or(0);
            let better = match best {
                None => true,
                Some((s, j)) => stamp < s || (stamp == s && sort_key(p) < sort_key(&candidates[j])),
            };
            if better {
                best = Some((stamp, i));
            }
        }
        let (_, i) = best?;
        st.seq += 1;
        let seq = st.seq;
        st.last.insert(key(&candidates[i]).into_owned(), seq);
        if st.last.len() > 2 * store_len + 64 {
            let all = all();
            let live: HashSet<Cow<'_, str>> = all.iter().map(|p| key(p)).collect();
            st.last.retain(|k, _| live.contains(k.as_str()));
        }
        Some(&candidates[i])
    }

    /// How many proxies carry a stamp (for tests).
    pub fn tracked(&self) -> usize {
        self.state
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .last
            .len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::{CloudInit, Placement, ProxySpec};

    fn proxy(name: &str) -> Arc<Proxy> {
        let mut p = Proxy::new(
            name,
            ProxySpec {
                provider: "fake".into(),
                placement: Placement::default(),
                cloud_init: CloudInit::default(),
                port: 3128,
                auth: Default::default(),
                ip_family: Default::default(),
            },
        );
        p.metadata.namespace = Some("default".into());
        p.metadata.uid = Some(format!("uid-{name}"));
        Arc::new(p)
    }

    fn name(p: Option<&Arc<Proxy>>) -> String {
        p.unwrap().metadata.name.clone().unwrap()
    }

    #[test]
    fn round_robin_over_a_fixed_set_and_new_ones_first() {
        let picker = Picker::default();
        // Candidates come in any order; ties go by namespace/name.
        let set = vec![proxy("c"), proxy("a"), proxy("b")];
        let all = || set.clone();
        let got: Vec<String> = (0..6).map(|_| name(picker.pick(&set, 3, all))).collect();
        assert_eq!(got, ["a", "b", "c", "a", "b", "c"]);
        // An overlapping subset continues where the whole set left off.
        let sub = vec![set[0].clone(), set[1].clone()];
        assert_eq!(name(picker.pick(&sub, 3, all)), "a");
        assert_eq!(name(picker.pick(&set, 3, all)), "b");
        // A newcomer goes next.
        let mut grown = set.clone();
        grown.push(proxy("d"));
        assert_eq!(name(picker.pick(&grown, 4, || grown.clone())), "d");
        assert!(picker.pick(&[], 4, || grown.clone()).is_none());
    }

    #[test]
    fn stamps_of_gone_proxies_are_pruned() {
        let picker = Picker::default();
        let many: Vec<_> = (0..200).map(|i| proxy(&format!("p{i}"))).collect();
        for p in &many {
            picker.pick(std::slice::from_ref(p), 200, || many.clone());
        }
        assert_eq!(picker.tracked(), 200);
        let few = vec![many[0].clone()];
        picker.pick(&few, 1, || few.clone());
        assert_eq!(picker.tracked(), 1);
    }
}
