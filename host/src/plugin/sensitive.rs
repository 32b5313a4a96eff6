//! What is sensitive for one provider: every secret value the host has handed it, and the
//! cloud-init and the credentials of every Proxy the operator has seen for it.
//!
//! Kept per provider name by the [`super::Runtime`], so it survives a reload of the
//! providers file or the plugin, and shared by all calls of the provider. That is what
//! makes redaction hold across calls: a plugin that caches a Proxy's cloud-init in `create`
//! (in the host cache, in the backend, anywhere) and prints it in a later `get` of another
//! Proxy is still scrubbed, because the redactor of every call knows every document.
//!
//! A Proxy's credentials are registered on their own ([`Sensitive::add_credentials`]), not
//! only as part of its document: inside the document they are fragments, matched raw only
//! and not at all in an identifier; registered, they are whole values in every encoding
//! (see [`super::redact`]), so no ID, UID or health-check name can hold them and no text
//! shows them encoded. A document is then compiled without the credentials it holds
//! (each one cut out, see [`cut_credentials`]): their own patterns cover them in every
//! form, and what is left of the documents of a fleet rendered from one template is the
//! same for every Proxy, so it is compiled once. Compiled whole, each document's line
//! `BasicAuth <user> <password>` was a distinct whole value in every encoding: about
//! 5 KiB of automaton per Proxy, more than its credentials' own patterns.
//!
//! The compiled [`Redactor`] is rebuilt lazily, on the first use after a new value arrived,
//! so a burst of new Proxies costs one rebuild rather than one per Proxy. And a rebuild
//! compiles only the new values, into a segment of their own: segments are merged as a
//! binary counter carries (the last two merge while the older one is at most twice the
//! newer), so a value is recompiled O(log n) times over the life of the process and a
//! redactor has O(log n) segments. Recompiling everything on every new document made a
//! fleet of 10,000 distinct cloud-inits quadratic: one full rebuild per Proxy created.

use super::redact::{MIN_ENCODED, Patterns, Redactor, Segment};
use sha2::{Digest, Sha256};
use std::borrow::Cow;
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
    /// Every registered credential part long enough to be a whole value, shared with its
    /// [`Value::Credentials`]: what [`cut_credentials`] cuts out of documents.
    credentials: HashSet<Arc<[u8]>>,
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
    Credentials {
        username: Arc<[u8]>,
        password: Arc<[u8]>,
    },
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
                Value::Credentials { username, password } => p.credentials(username, password),
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

    /// Adds a cloud-init document; returns whether it was new. What is compiled is the
    /// document without the credentials registered so far (see the module docs), once per
    /// distinct remainder.
    pub fn add_cloud_init(&self, doc: &[u8]) -> bool {
        if doc.trim_ascii().is_empty() {
            return false;
        }
        let key = Self::key(b'c', &[doc]);
        let mut inner = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        if !inner.seen.insert(key) {
            return false;
        }
        let rest = cut_credentials(doc, &inner.credentials);
        if let Cow::Owned(rest) = &rest
            && !inner.seen.insert(Self::key(b'r', &[rest]))
        {
            // Another Proxy's document, but for the credentials: nothing new to compile.
            return true;
        }
        inner
            .pending
            .push(Value::CloudInit(rest.into_owned().into()));
        inner.compiled = None;
        true
    }

    /// Adds a Proxy's username and password (each a whole value, see the module docs);
    /// returns whether the pair was new. The reconciler calls it for every Proxy as soon as
    /// it has read the Proxy's credentials, before any call that could show them.
    pub fn add_credentials(&self, username: &[u8], password: &[u8]) -> bool {
        if username.is_empty() && password.is_empty() {
            return false;
        }
        // The length goes into the key too: ("ab", "c") and ("a", "bc") are two pairs.
        let key = Self::key(b'u', &[&username.len().to_le_bytes(), username, password]);
        self.insert(key, |inner| {
            let mut part = |v: &[u8]| -> Arc<[u8]> {
                if let Some(known) = inner.credentials.get(v) {
                    return known.clone();
                }
                let part: Arc<[u8]> = v.into();
                if v.len() >= MIN_ENCODED {
                    inner.credentials.insert(part.clone());
                }
                part
            };
            Value::Credentials {
                username: part(username),
                password: part(password),
            }
        })
    }

    fn add(&self, value: &[u8], kind: u8, wrap: fn(Arc<[u8]>) -> Value) -> bool {
        if value.trim_ascii().is_empty() {
            return false;
        }
        let key = Self::key(kind, &[value]);
        self.insert(key, |_| wrap(value.into()))
    }

    fn key(kind: u8, parts: &[&[u8]]) -> [u8; 32] {
        let mut h = Sha256::new();
        h.update([kind]);
        for p in parts {
            h.update(p);
        }
        h.finalize().into()
    }

    /// Queues `value()` for the next build unless `key` was seen (a value already known
    /// costs a hash, no copy).
    fn insert(&self, key: [u8; 32], value: impl FnOnce(&mut Inner) -> Value) -> bool {
        let mut inner = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        if !inner.seen.insert(key) {
            return false;
        }
        let value = value(&mut inner);
        inner.pending.push(value);
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

/// `doc` with every occurrence of a `known` credential cut out (each replaced by a line
/// break, so a line holding one is compiled as the pieces around it); borrowed when it
/// holds none. Only what a template puts there is looked for: a whitespace-separated word,
/// or a run between the separators [`super::redact`] splits cloud-init words on (`user:pass`,
/// `"pass",`). A credential elsewhere stays in the document, which is then compiled as
/// before: at a higher cost, never with less coverage. Sound because each registered part
/// is a whole value in every encoding of its own: whatever form of the document a plugin
/// prints holds each cut part in that form, and the rest of the document is matched as
/// always.
fn cut_credentials<'a>(doc: &'a [u8], known: &HashSet<Arc<[u8]>>) -> Cow<'a, [u8]> {
    if known.is_empty() {
        return Cow::Borrowed(doc);
    }
    let is_sep = |b: &u8| {
        matches!(
            b,
            b':' | b'=' | b'"' | b'\'' | b',' | b'[' | b']' | b'{' | b'}' | b'(' | b')' | b';'
        )
    };
    let mut cuts: Vec<std::ops::Range<usize>> = Vec::new();
    let mut consider = |at: usize, run: &[u8]| {
        if run.len() >= MIN_ENCODED && known.contains(run) {
            cuts.push(at..at + run.len());
        }
    };
    let mut at = 0;
    for word in doc.split(|b| b.is_ascii_whitespace()) {
        consider(at, word);
        if word.iter().any(is_sep) {
            let mut inner = at;
            for run in word.split(is_sep) {
                consider(inner, run);
                inner += run.len() + 1;
            }
        }
        at += word.len() + 1;
    }
    if cuts.is_empty() {
        return Cow::Borrowed(doc);
    }
    cuts.sort_unstable_by_key(|r| r.start);
    let mut out = Vec::with_capacity(doc.len());
    let mut from = 0;
    for cut in cuts {
        if cut.start >= from {
            out.extend_from_slice(&doc[from..cut.start]);
            out.push(b'\n');
            from = cut.end;
        }
    }
    out.extend_from_slice(&doc[from..]);
    Cow::Owned(out)
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

    /// A pair is registered once; the same bytes split differently are another pair.
    #[test]
    fn credentials_are_known_once_as_whole_values() {
        let s = Sensitive::default();
        assert!(s.add_credentials(b"proxyuser-SENTINEL", b"password-SENTINEL"));
        assert!(!s.add_credentials(b"proxyuser-SENTINEL", b"password-SENTINEL"));
        assert!(s.add_credentials(b"proxyuser-SENTINELp", b"assword-SENTINEL"));
        assert!(!s.add_credentials(b"", b""));
        let r = s.redactor();
        assert!(r.finds_whole("i-proxyuser-SENTINEL"));
        assert!(r.finds_whole(&data_encoding::BASE64.encode(b"password-SENTINEL")));
        assert_eq!(r.scrub("x password-SENTINEL y"), "x [REDACTED] y");
    }

    /// A fleet rendered from one template: each document is cut at its credentials, and
    /// what is left is the same for every Proxy, so it is compiled once. The whole
    /// document, in any encoding, is still scrubbed of every credential.
    #[test]
    fn documents_are_compiled_without_their_credentials_once_per_template() {
        let s = Sensitive::default();
        let doc = |user: &str, pass: &str| {
            format!(
                "#cloud-config\nwrite_files:\n  - content: |\n      BasicAuth {user} {pass}\n      htpasswd: {user}:{pass}\n"
            )
        };
        for i in 0..50 {
            let (user, pass) = generated_like(i);
            s.add_credentials(user.as_bytes(), pass.as_bytes());
            assert!(s.add_cloud_init(doc(&user, &pass).as_bytes()));
        }
        let r = s.redactor();
        assert_eq!(
            s.segment_sizes().iter().sum::<usize>(),
            50 + 1,
            "50 pairs, 1 document"
        );
        let (user, pass) = generated_like(7);
        let whole = doc(&user, &pass);
        let b64 = data_encoding::BASE64.encode(whole.as_bytes());
        let json = serde_json::to_string(&whole).unwrap();
        for text in [whole.clone(), b64, json] {
            let out = r.scrub(&text);
            for (what, form) in [
                ("user", user.clone()),
                ("password", pass.clone()),
                (
                    "b64 user",
                    data_encoding::BASE64.encode(user.as_bytes())[4..20].to_string(),
                ),
                (
                    "b64 password",
                    data_encoding::BASE64.encode(pass.as_bytes())[4..30].to_string(),
                ),
            ] {
                assert!(!out.contains(&form), "{what} in {out}");
            }
        }
        // An ID holding the whole document holds its credentials.
        assert!(r.finds_whole(&whole));
        // A document whose credentials were not registered first is compiled whole.
        let s = Sensitive::default();
        s.add_cloud_init(doc(&user, &pass).as_bytes());
        s.add_credentials(user.as_bytes(), pass.as_bytes());
        let r = s.redactor();
        assert!(r.finds_whole(&format!("BasicAuth {user} {pass}")));
    }

    #[test]
    fn cut_credentials_finds_what_a_template_puts_there() {
        let known: HashSet<Arc<[u8]>> = [&b"userSENTINEL"[..], &b"pa\"ss:w0rd"[..]]
            .into_iter()
            .map(Arc::from)
            .collect();
        let cut = |doc: &str| {
            String::from_utf8(cut_credentials(doc.as_bytes(), &known).into_owned()).unwrap()
        };
        assert_eq!(
            cut("BasicAuth userSENTINEL pa\"ss:w0rd\n"),
            "BasicAuth \n \n\n"
        );
        assert_eq!(
            cut("auth: userSENTINEL:x,\"userSENTINEL\""),
            "auth: \n:x,\"\n\""
        );
        // Inside another word it stays (and the document is compiled with it).
        assert_eq!(cut("xuserSENTINEL"), "xuserSENTINEL");
        assert!(matches!(
            cut_credentials(b"nothing here", &known),
            Cow::Borrowed(_)
        ));
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

    /// Credentials as the operator generates them (24 and 32 letters and digits), different
    /// for every `i`, without a random number generator.
    fn generated_like(i: usize) -> (String, String) {
        const ALPHABET: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789";
        let digest = Sha256::digest(i.to_le_bytes());
        let digest2 = Sha256::digest(digest);
        let chars: Vec<char> = digest
            .iter()
            .chain(digest2.iter())
            .map(|b| ALPHABET[usize::from(*b) % ALPHABET.len()] as char)
            .collect();
        (chars[..24].iter().collect(), chars[24..56].iter().collect())
    }

    /// A fleet whose Proxies each carry their own credentials (the samples' tinyproxy
    /// `BasicAuth`, generated per Proxy) gives the redactor, per Proxy, one distinct
    /// document and one username and password, kept for the life of the process. Each
    /// document used to cost about 47 KiB (every document whole in every encoding, two
    /// automata, a full rebuild per new document): 470 MiB at 10,000. Then a document cost
    /// its new lines, compiled once into a segment of at most 1,024 values: 1.2 KiB for a
    /// short distinct password sharing most of its characters with the others', but
    /// 5.0 KiB with credentials as the operator generates them (56 random characters on
    /// one line, in every encoding). Now the credentials are whole values of their own (the
    /// username and the password, raw and base64 at three alignments: 8 patterns, the
    /// pair needs none) and are cut out of the document, whose remainder is the same for
    /// the whole fleet and compiled once. Bounds per Proxy: the automata at most 5 KiB
    /// (measured 3.9: about 14 bytes of automaton per pattern character), the process at
    /// most 10 KiB (measured 4.2 to 7.4 in a debug build, with the rebuilds' freed
    /// memory): at 10,000 Proxies, 39 MiB of automata.
    #[test]
    fn distinct_cloud_init_documents_cost_the_redactor_little() {
        let s = Sensitive::default();
        let before = resident_bytes();
        let n = 4000;
        for i in 0..n {
            let (user, pass) = generated_like(i);
            // As the reconciler registers them: the credentials as soon as it has read
            // them, then the rendered document.
            s.add_credentials(user.as_bytes(), pass.as_bytes());
            let doc = format!(
                "#cloud-config\npackages: [tinyproxy]\nwrite_files:\n  - path: /etc/tinyproxy/tinyproxy.conf\n    content: |\n      Port 3128\n      BasicAuth {user} {pass}\n      Allow 0.0.0.0/0\nruncmd:\n  - systemctl restart tinyproxy\n"
            );
            s.add_cloud_init(doc.as_bytes());
            if i % 100 == 99 {
                let _ = s.redactor();
            }
        }
        let r = s.redactor();
        for i in [0, 7, n / 2, n - 1] {
            let (user, pass) = generated_like(i);
            let line = format!("BasicAuth {user} {pass}");
            assert!(r.finds(&pass));
            let b64 = data_encoding::BASE64.encode(format!("x{line}\n").as_bytes());
            assert!(!r.scrub(&b64).contains(&b64[8..40]), "{i}: {b64}");
            // Whole values: an ID may hold none of them, in any encoding.
            for id in [
                user.clone(),
                pass.clone(),
                format!("{user}:{pass}"),
                format!(
                    "Basic {}",
                    data_encoding::BASE64.encode(format!("{user}:{pass}").as_bytes())
                ),
                data_encoding::BASE64URL.encode(format!("i-{pass}").as_bytes()),
            ] {
                assert!(r.finds_whole(&id), "{i}: {id}");
            }
        }
        let automata = r.memory_usage();
        let grew = resident_bytes().saturating_sub(before);
        eprintln!(
            "{n} Proxies: automata {} KiB ({} B per Proxy), process grew {} KiB ({} B per Proxy)",
            automata >> 10,
            automata / n,
            grew >> 10,
            grew / n as u64
        );
        assert!(
            automata < n * 5120,
            "{n} Proxies: automata of {} KiB",
            automata >> 10
        );
        assert!(
            grew < (n * 10240) as u64,
            "{n} Proxies grew the process by {} KiB",
            grew >> 10
        );
    }
}
