//! Scrubbing of secrets and cloud-init from everything that leaves a guest.
//!
//! A plugin can be careless or hostile: it can log its token, echo user data in an error,
//! return a credential as an instance ID, or cache a Proxy's cloud-init and print it in a
//! later call. The host does not trust it to behave: every byte string a plugin hands back
//! (log lines, stdout/stderr, error messages and codes, replies, health-check results) is
//! scrubbed here before it reaches a log, a span, an event or a status.
//!
//! What counts as sensitive is decided per provider, not per call (see
//! [`crate::sensitive`]): every secret the host has handed to the provider, the cloud-init
//! of every Proxy the operator has seen for it, and the credentials (username and password)
//! of every such Proxy. For each value the redactor matches more than the raw bytes,
//! because a plugin transforms what it sends:
//!
//! | form | why |
//! |---|---|
//! | the value, and trimmed | a secret file ends in a newline |
//! | each line of a multi-line value | a PEM key printed line by line |
//! | base64 (standard and URL-safe) at any byte offset | user data is base64 in most APIs, often inside a larger encoded body |
//! | JSON-escaped | a plugin builds an API body with the document as a JSON string |
//! | percent-encoded | a value in a query string or form body |
//! | cloud-init: each line, and each value after `:`, `=` or whitespace | a password inside `user:PASSWORD`, `BasicAuth user PASSWORD` |
//! | credentials: the username and the password each as a whole value, in every encoding above | a plugin that read them in the rendered cloud-init returns them as an ID, or prints `Basic base64(user:password)` |
//!
//! A credential is a whole value, not a fragment of a document: an identifier a plugin
//! returns ([`Redactor::finds_whole`]) must not contain it in any form. `user:password`,
//! `Basic base64(user:password)` and `user%3Apassword` need no patterns of their own when
//! both parts are long enough to be encoded ([`MIN_ENCODED`]): each of them, in each
//! encoding, contains both parts in that encoding (base64 of a longer text contains the
//! base64 of every part of it at one of the three alignments). With a shorter part the
//! pair is added whole, in every encoding; the short part alone is then a fragment (scrubbed
//! from text, not refused in an ID: a 4-byte username such as `root` would refuse honest
//! IDs).
//!
//! Encodings are generated for the trimmed value only: every form of it lies inside the same
//! form of the untrimmed value (each encoding maps bytes, or base64 three-byte blocks at the
//! matching alignment, one to one).
//! A multi-line cloud-init document is not matched as a whole at all: every line of it that
//! is not public is matched in every encoding (lines of [`MIN_ENCODED`]` * 2` bytes or more
//! as whole values, shorter ones as fragments), and the document in any encoding contains
//! its lines in that encoding. Documents of one fleet share most lines (a template with a
//! password or a name in it), so a new document costs its new lines only: at 10,000
//! Proxies each with its own document, the whole-document patterns were most of the
//! ~47 KiB the redactor grew per document.
//!
//! Every occurrence of every pattern is scrubbed, overlapping ones included (the union of
//! their spans becomes one [`REDACTED`]), so one value cannot hide another by overlapping
//! its start; and the patterns can be split over several automata ([`Segment`]s), which is
//! how [`crate::sensitive`] adds documents without recompiling all the others.
//!
//! Short fragments would match ordinary text (every log line has `port` or `true` in it), so
//! a cloud-init fragment must be at least [`MIN_FRAGMENT`] bytes and must not be one of the
//! cloud-init schema's own keywords (public knowledge, not user data). Whole lines count
//! from [`MIN_LINE`] bytes, values after a separator from [`MIN_VALUE`].

use aho_corasick::{AhoCorasick, AhoCorasickKind, MatchKind};
use std::collections::BTreeSet;
use std::ops::Range;

mod spans;
pub mod tokens;
use spans::Spans;
use tokens::Tokens;

/// Replacement text for a scrubbed value.
pub const REDACTED: &str = "[REDACTED]";

/// Replacement for a whole text that matches sensitive values at more places than one
/// scrub looks at (see [`Spans`]): a run of one byte against several values made of it.
pub const WITHHELD: &str =
    "[REDACTED: the whole text, which matches sensitive values at too many places]";

/// Shortest cloud-init line (trimmed) that is scrubbed on its own.
pub const MIN_LINE: usize = 4;
/// Shortest value after `:` or `=` in a cloud-init line that is scrubbed on its own.
pub const MIN_VALUE: usize = 4;
/// Shortest other cloud-init word (separated by whitespace or punctuation) scrubbed.
pub const MIN_FRAGMENT: usize = 6;
/// Shortest line of a multi-line secret scrubbed on its own.
const MIN_SECRET_LINE: usize = 8;
/// Shortest value whose encodings (base64, JSON, percent) are matched too: the encoding of
/// a few bytes is a few characters that ordinary base64 text would match by chance.
pub const MIN_ENCODED: usize = 6;
/// Shortest part of a credential scrubbed on its own when it is too short to be a whole
/// value; shorter ones are covered only inside `user:password`.
pub const MIN_CREDENTIAL_FRAGMENT: usize = 4;

/// Words of the cloud-init schema, YAML and everyday shell that say nothing about a user:
/// not treated as fragments of a user's document. Whole lines and whole documents are
/// always scrubbed.
const PUBLIC_WORDS: &[&str] = &[
    "#cloud-config",
    "append",
    "apt-get",
    "bootcmd",
    "content",
    "daemon-reload",
    "defer",
    "enable",
    "encoding",
    "false",
    "final_message",
    "groups",
    "hostname",
    "install",
    "owner",
    "package_reboot_if_required",
    "package_update",
    "package_upgrade",
    "packages",
    "permissions",
    "power_state",
    "restart",
    "runcmd",
    "shell",
    "systemctl",
    "timezone",
    "users",
    "write_files",
];

/// A set of sensitive values, compiled for fast replacement: one or more [`Segment`]s.
#[derive(Clone, Default)]
pub struct Redactor {
    segments: Vec<std::sync::Arc<Segment>>,
}

/// One compiled automaton over some of the patterns, and a table of some tokens.
pub struct Segment {
    /// Every pattern, all occurrences reported (overlapping search).
    matcher: Option<AhoCorasick>,
    /// Whole values of letters and digits, looked up rather than matched (see [`tokens`]).
    tokens: Option<Tokens>,
    /// Patterns `0..whole` are whole values (secrets, documents, long lines, and their
    /// encodings); the rest are short fragments. An identifier must not contain a whole
    /// value; fragments would reject honest IDs (`eu-west-1/i-...` when a cloud-init
    /// mentions `eu-west-1`).
    whole: usize,
    /// The longest pattern or form: how far past a cut a value that starts before it can
    /// reach (see [`Redactor::scrub_line`]).
    longest: usize,
}

impl std::fmt::Debug for Redactor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Redactor {{ segments: {} }}", self.segments.len())
    }
}

/// Collects the patterns for a [`Redactor`].
#[derive(Default)]
pub struct Patterns {
    /// Whole values and their encodings.
    set: BTreeSet<Vec<u8>>,
    /// Fragments of cloud-init (words, values, short lines).
    fragments: BTreeSet<Vec<u8>>,
    /// Whole values matched by table, as themselves (their forms are the table's).
    tokens: BTreeSet<Vec<u8>>,
}

/// One thing the redactor matches, with every form of it: the unit in which
/// [`crate::sensitive`] shares, counts and forgets patterns. Documents of one fleet share
/// most of their units (lines, words), so a unit known from another document costs nothing
/// more.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Unit {
    /// A whole value: as is, and in every encoding when long enough ([`MIN_ENCODED`]).
    Value(Vec<u8>),
    /// A fragment: only as is.
    Fragment(Vec<u8>),
    /// A short line's encodings, as fragments (see [`Patterns::add`]).
    EncodedFragment(Vec<u8>),
    /// A whole value of letters, digits, `-` and `_` ([`tokens::is_token`]): in the same
    /// forms as a [`Unit::Value`], looked up in a table instead of an automaton.
    Token(Vec<u8>),
}

/// What one form of a token weighs in a segment, against the pattern bytes of an automaton:
/// a form costs about 60 bytes of table and next to nothing to build, where a pattern byte
/// costs 12 of automaton and several times that while it is built. A full segment then
/// holds about 4,700 tokens in about 2 MiB.
const TOKEN_FORM_WEIGHT: usize = 8;

impl Unit {
    /// The bytes of every pattern the unit adds: what its share of an automaton grows with.
    pub fn weight(&self) -> usize {
        match self {
            Unit::Token(_) => self.size().0 * TOKEN_FORM_WEIGHT,
            _ => self.size().1,
        }
    }

    /// How many patterns the unit adds, and their bytes.
    pub fn size(&self) -> (usize, usize) {
        let forms: BTreeSet<Vec<u8>> = match self {
            Unit::Value(v) if v.len() < MIN_ENCODED => return (1, v.len()),
            Unit::Value(v) => encodings(v).chain([v.clone()]).collect(),
            Unit::Fragment(v) => return (1, v.len()),
            Unit::EncodedFragment(v) => encodings(v).collect(),
            Unit::Token(v) => tokens::forms_of(v).into_iter().collect(),
        };
        (forms.len(), forms.iter().map(Vec::len).sum())
    }

    /// Bytes the unit itself holds.
    pub fn len(&self) -> usize {
        match self {
            Unit::Value(v) | Unit::Fragment(v) | Unit::EncodedFragment(v) | Unit::Token(v) => {
                v.len()
            }
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// The units of a secret: the value in every form listed in the module docs, and each
/// line of it.
pub fn secret_units(value: &[u8]) -> Vec<Unit> {
    let mut out = vec![];
    let trimmed = value.trim_ascii();
    push_value(&mut out, trimmed);
    if trimmed.contains(&b'\n') {
        for line in trimmed.split(|b| *b == b'\n') {
            let line = line.trim_ascii();
            if line.len() >= MIN_SECRET_LINE {
                push_value(&mut out, line);
            }
        }
    }
    out
}

/// The units of a cloud-init document: the whole when no line stands for it, each line,
/// and each value in it.
pub fn cloud_init_units(doc: &[u8]) -> Vec<Unit> {
    let mut out = vec![];
    let trimmed = doc.trim_ascii();
    // A one-line document is a line; a longer one is covered line by line below (every
    // line that is not public is matched in every encoding).
    // An identifier is checked against whole values only: a document none of whose
    // lines is one (all short or public) is one itself, or an ID could carry it whole.
    let has_whole_line = trimmed.split(|b| *b == b'\n').any(|line| {
        let line = line.trim_ascii();
        line.len() >= MIN_ENCODED * 2 && !is_public(line)
    });
    if !trimmed.contains(&b'\n') || !has_whole_line {
        push_value(&mut out, trimmed);
    }
    for line in doc.split(|b| *b == b'\n') {
        let line = line.trim_ascii();
        if line.len() >= MIN_LINE && !is_public(line) {
            if line.len() >= MIN_ENCODED * 2 {
                push_value(&mut out, line);
            } else {
                push_fragment(&mut out, line, MIN_LINE);
                out.push(Unit::EncodedFragment(line.to_vec()));
            }
            // Without a YAML list marker: `- echo x` is logged as `echo x`.
            if let Some(rest) = line.strip_prefix(b"- ") {
                push_fragment(&mut out, rest.trim_ascii(), MIN_LINE);
            }
        }
        for (value, after_separator) in words(line) {
            let min = if after_separator {
                MIN_VALUE
            } else {
                MIN_FRAGMENT
            };
            if !is_public(value) && !is_small_number(value) {
                push_fragment(&mut out, value, min);
            }
        }
    }
    out.sort_unstable();
    out.dedup();
    out
}

/// The units of a Proxy's credentials: the username and the password as whole values in
/// every form (see the module docs for why `user:password` and `Basic ...` are covered
/// without patterns of their own when both parts are long enough).
pub fn credential_units(username: &[u8], password: &[u8]) -> Vec<Unit> {
    let mut out = vec![];
    let mut short = false;
    for part in [username, password] {
        if part.len() >= MIN_ENCODED {
            push_value(&mut out, part);
        } else {
            short = true;
            push_fragment(&mut out, part, MIN_CREDENTIAL_FRAGMENT);
        }
    }
    if short {
        push_value(&mut out, &[username, b":", password].concat());
    }
    out
}

/// A whole value: a [`Unit::Token`] when it is one, else a [`Unit::Value`].
fn push_value(out: &mut Vec<Unit>, v: &[u8]) {
    if tokens::is_token(v) {
        out.push(Unit::Token(v.to_vec()));
    } else if !v.is_empty() {
        out.push(Unit::Value(v.to_vec()));
    }
}

fn push_fragment(out: &mut Vec<Unit>, v: &[u8], min: usize) {
    if v.len() >= min {
        out.push(Unit::Fragment(v.to_vec()));
    }
}

impl Patterns {
    /// A secret: the value in every form listed in the module docs, and each line of it.
    pub fn secret(&mut self, value: &[u8]) {
        secret_units(value).iter().for_each(|u| self.add(u));
    }

    /// A cloud-init document: the whole in every form, each line, and each value in it.
    pub fn cloud_init(&mut self, doc: &[u8]) {
        cloud_init_units(doc).iter().for_each(|u| self.add(u));
    }

    /// A Proxy's credentials (see [`credential_units`]).
    pub fn credentials(&mut self, username: &[u8], password: &[u8]) {
        credential_units(username, password)
            .iter()
            .for_each(|u| self.add(u));
    }

    /// Every pattern of one unit.
    pub fn add(&mut self, unit: &Unit) {
        match unit {
            Unit::Value(v) => self.value(v),
            Unit::Fragment(v) => {
                self.fragments.insert(v.clone());
            }
            // A short line's encodings, as fragments: inside an encoded document nothing
            // else covers it. Too short to be a whole value (an identifier could hold its
            // few base64 characters by chance), long enough that ordinary encoded text
            // rarely does.
            Unit::EncodedFragment(v) => self.fragments.extend(encodings(v)),
            Unit::Token(v) => {
                self.tokens.insert(v.clone());
            }
        }
    }

    /// A value as is, and JSON-escaped, percent-encoded and base64 at every offset.
    fn value(&mut self, v: &[u8]) {
        if v.is_empty() {
            return;
        }
        self.set.insert(v.to_vec());
        if v.len() < MIN_ENCODED {
            return;
        }
        let encoded: Vec<Vec<u8>> = encodings(v).filter(|e| e != v).collect();
        self.set.extend(encoded);
    }

    pub fn build(self) -> Redactor {
        Redactor {
            segments: self
                .segment()
                .map(std::sync::Arc::new)
                .into_iter()
                .collect(),
        }
    }

    /// The patterns as one automaton and one table; `None` when there are none.
    pub fn segment(self) -> Option<Segment> {
        let whole = self.set.len();
        let fragments = self
            .fragments
            .difference(&self.set)
            .cloned()
            .collect::<Vec<_>>();
        let longest = self.set.iter().chain(&fragments).map(Vec::len).max();
        let longest = longest.unwrap_or(0);
        let matcher = (whole + fragments.len() > 0).then(|| {
            AhoCorasick::builder()
                // Every occurrence, overlapping ones included (see the module docs).
                .match_kind(MatchKind::Standard)
                // A contiguous NFA builds in time linear in the patterns; a DFA (what the
                // builder picks for small sets) takes minutes for one 16 KiB document.
                .kind(Some(AhoCorasickKind::ContiguousNFA))
                .build(self.set.into_iter().chain(fragments))
                .expect("literal patterns always build")
        });
        let tokens = Tokens::build(self.tokens.iter().map(Vec::as_slice));
        let longest = longest.max(tokens.as_ref().map_or(0, Tokens::longest_form));
        (matcher.is_some() || tokens.is_some()).then_some(Segment {
            matcher,
            tokens,
            whole,
            longest,
        })
    }
}

impl Segment {
    /// Spans of every occurrence of a pattern (`whole_only`: of a whole value), into `out`;
    /// `false` once `out` has taken all the matches it takes (see [`Spans`]).
    fn spans(&self, text: &[u8], whole_only: bool, out: &mut Spans) -> bool {
        if let Some(m) = &self.matcher {
            for m in m.find_overlapping_iter(text) {
                // A fragment counts against the budget too: it costs the same to find.
                let r = if !whole_only || m.pattern().as_usize() < self.whole {
                    Some(m.range())
                } else {
                    None
                };
                if !out.visit(r) {
                    return false;
                }
            }
        }
        self.tokens.as_ref().is_none_or(|t| t.spans(text, out))
    }

    /// Whether `text` holds any pattern or token.
    fn finds(&self, text: &[u8]) -> bool {
        self.matcher.as_ref().is_some_and(|m| m.is_match(text))
            || self.tokens.as_ref().is_some_and(|t| t.finds(text))
    }

    /// Heap bytes of the automaton and the table.
    fn memory_usage(&self) -> usize {
        self.matcher.as_ref().map_or(0, |m| m.memory_usage())
            + self.tokens.as_ref().map_or(0, Tokens::memory_usage)
    }
}

/// The words of a cloud-init line, each with whether it follows a `:` or `=` (a value).
fn words(line: &[u8]) -> Vec<(&[u8], bool)> {
    let is_sep = |b: u8| {
        b.is_ascii_whitespace()
            || matches!(
                b,
                b':' | b'=' | b'"' | b'\'' | b',' | b'[' | b']' | b'{' | b'}' | b'(' | b')' | b';'
            )
    };
    let mut out = Vec::new();
    let mut after_separator = false;
    let mut start = None;
    for (i, &b) in line.iter().enumerate() {
        if is_sep(b) {
            if let Some(s) = start.take() {
                out.push((&line[s..i], after_separator));
                after_separator = false;
            }
            if b == b':' || b == b'=' {
                after_separator = true;
            }
        } else if start.is_none() {
            start = Some(i);
        }
    }
    if let Some(s) = start {
        out.push((&line[s..], after_separator));
    }
    out
}

fn is_public(word: &[u8]) -> bool {
    let w = word.strip_suffix(b":").unwrap_or(word);
    PUBLIC_WORDS.iter().any(|p| p.as_bytes() == w)
}

/// Ports and counts (`3128`, `0644`): matching them would scrub every number in a log.
fn is_small_number(word: &[u8]) -> bool {
    word.len() <= 5 && word.iter().all(u8::is_ascii_digit)
}

/// `v` JSON-escaped (without the quotes), percent-encoded, and base64 at every offset in
/// both alphabets (see [`base64_at_every_offset`]).
fn encodings(v: &[u8]) -> impl Iterator<Item = Vec<u8>> {
    let json =
        serde_json::to_string(&String::from_utf8_lossy(v)).expect("a string always serializes");
    let json = json.as_bytes()[1..json.len() - 1].to_vec();
    let mut b64 = base64_at_every_offset(&data_encoding::BASE64, v);
    b64.extend(base64_at_every_offset(&data_encoding::BASE64URL, v));
    let b64 = b64.into_iter().map(String::into_bytes);
    [json, percent_encode(v).into_bytes()]
        .into_iter()
        .chain(b64)
}

fn percent_encode(v: &[u8]) -> String {
    let mut out = String::with_capacity(v.len());
    for &b in v {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~') {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// The base64 text that `v` becomes inside any larger encoded text: for each of the three
/// alignments, only the characters that depend on `v`'s bytes alone (the first and last
/// characters also carry bits of the neighbours, so they are dropped).
fn base64_at_every_offset(alphabet: &data_encoding::Encoding, v: &[u8]) -> Vec<String> {
    let mut out = Vec::with_capacity(3);
    for offset in 0..3usize {
        let mut buf = vec![0u8; offset];
        buf.extend_from_slice(v);
        let enc = alphabet.encode(&buf);
        // Bits of v start at bit 8*offset and end at bit 8*(offset+len).
        let first = (8 * offset).div_ceil(6);
        let last = (8 * (offset + v.len())) / 6;
        if last > first + 3 {
            out.push(enc[first..last].to_string());
        }
    }
    out
}

impl Redactor {
    /// Builds a redactor for the given secrets and one cloud-init document. Empty values are
    /// ignored.
    pub fn new<'a>(secrets: impl IntoIterator<Item = &'a [u8]>, cloud_init: &[u8]) -> Self {
        let mut p = Patterns::default();
        for s in secrets {
            p.secret(s);
        }
        if !cloud_init.is_empty() {
            p.cloud_init(cloud_init);
        }
        p.build()
    }

    /// Heap bytes of the compiled automata.
    pub fn memory_usage(&self) -> usize {
        self.segments.iter().map(|s| s.memory_usage()).sum()
    }

    /// The most token forms that share an anchor in any one table.
    #[cfg(test)]
    pub(crate) fn longest_token_chain(&self) -> usize {
        self.segments
            .iter()
            .filter_map(|s| s.tokens.as_ref())
            .map(Tokens::longest_chain)
            .max()
            .unwrap_or(0)
    }

    /// A redactor over these segments together.
    pub fn from_segments(segments: Vec<std::sync::Arc<Segment>>) -> Self {
        Redactor { segments }
    }

    /// The text with every sensitive value replaced by [`REDACTED`]: the union of the
    /// spans of all occurrences, each run of it replaced once. A text that matches at more
    /// places than [`Spans`] looks at is [`WITHHELD`] whole.
    pub fn scrub(&self, text: &str) -> String {
        let bytes = text.as_bytes();
        let Some(spans) = self.union(bytes, false) else {
            return WITHHELD.to_string();
        };
        if spans.is_empty() {
            return text.to_string();
        }
        replace(bytes, &spans, bytes.len())
    }

    /// What a caller that keeps at most `max` bytes of `text` may show of it: scrubbed,
    /// control characters escaped ([`escape_controls`]) and [`cut`] to `max`, saying how
    /// much was cut.
    ///
    /// Only the first `max` bytes plus the longest sensitive value are looked at: a plugin
    /// hands the host texts of up to `MAX_LIFT_BYTES` (3 MiB) in one log call or error
    /// message, and scrubbing all of it, 200 log lines a call, only to keep 4 KiB of each,
    /// was the host's CPU spent at the plugin's choice. A value that starts inside what is
    /// kept ends inside what is looked at, so it is still found whole.
    pub fn scrub_line(&self, text: &str, max: usize) -> String {
        let longest = self.longest();
        let look = max.saturating_add(longest);
        if text.len() <= look {
            return cut(&escape_controls(&self.scrub(text)), max);
        }
        let end = floor_char_boundary(text, look);
        let window = &text.as_bytes()[..end];
        // Every occurrence that starts before `keep` ends inside the window.
        let keep = floor_char_boundary(text, end.saturating_sub(longest));
        let start = match self.union(window, false) {
            None => WITHHELD.to_string(),
            Some(spans) => replace(window, &spans, keep),
        };
        let clean = escape_controls(&start);
        let shown = floor_char_boundary(&clean, max.min(clean.len()));
        format!(
            "{}… ({} bytes cut)",
            &clean[..shown],
            clean.len() - shown + text.len() - keep
        )
    }

    /// The longest pattern or form held: how far a value reaches past where it starts.
    fn longest(&self) -> usize {
        self.segments.iter().map(|s| s.longest).max().unwrap_or(0)
    }

    /// The merged spans of every occurrence (`whole_only`: of a whole value) in `bytes`;
    /// `None` when it matches at more places than [`Spans`] looks at.
    fn union(&self, bytes: &[u8], whole_only: bool) -> Option<Vec<Range<usize>>> {
        let mut spans = Spans::for_text(bytes.len());
        self.segments
            .iter()
            .all(|s| s.spans(bytes, whole_only, &mut spans))
            .then(|| spans.merged())
    }

    /// Whether `text` holds any sensitive value, fragments included.
    pub fn finds(&self, text: &str) -> bool {
        self.segments.iter().any(|s| s.finds(text.as_bytes()))
    }

    /// Whether `text` holds a whole sensitive value: a secret, a line of one, a cloud-init
    /// document or one of its long lines, a Proxy's username or password, in any encoding.
    /// For identifiers, which a fragment of ordinary words could match by chance.
    /// A text that matches at more places than [`Spans`] looks at counts as holding one.
    pub fn finds_whole(&self, text: &str) -> bool {
        self.union(text.as_bytes(), true)
            .is_none_or(|spans| !spans.is_empty())
    }

    /// Like [`Redactor::scrub`] for raw bytes (guest stdout), returned as lossy UTF-8.
    pub fn scrub_bytes(&self, bytes: &[u8]) -> String {
        self.scrub(&String::from_utf8_lossy(bytes))
    }
}

/// `bytes[..upto]` with the merged `spans` that start before `upto` replaced by
/// [`REDACTED`] (a span that starts before `upto` is replaced whole), as lossy UTF-8.
fn replace(bytes: &[u8], spans: &[Range<usize>], upto: usize) -> String {
    let mut out = Vec::with_capacity(upto);
    let mut at = 0;
    for span in spans.iter().take_while(|s| s.start < upto) {
        out.extend_from_slice(&bytes[at..span.start.max(at)]);
        out.extend_from_slice(REDACTED.as_bytes());
        at = span.end;
    }
    if at < upto {
        out.extend_from_slice(&bytes[at..upto]);
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// The largest character boundary of `s` at or below `i`.
fn floor_char_boundary(s: &str, i: usize) -> usize {
    let mut end = i.min(s.len());
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    end
}

/// `s` cut to at most `max` bytes on a character boundary, saying how much was cut.
pub fn cut(s: &str, max: usize) -> String {
    if s.len() <= max {
        return s.to_string();
    }
    let end = floor_char_boundary(s, max);
    format!("{}… ({} bytes cut)", &s[..end], s.len() - end)
}

/// Makes a plugin-supplied string safe to print as one log field: control characters
/// (newlines above all, which would forge a separate log line, and terminal escapes) and
/// Unicode line separators become visible escapes.
pub fn escape_controls(text: &str) -> String {
    if !text
        .chars()
        .any(|c| c.is_control() || matches!(c, '\u{2028}' | '\u{2029}'))
    {
        return text.to_string();
    }
    let mut out = String::with_capacity(text.len() + 8);
    for c in text.chars() {
        match c {
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if c.is_control() || matches!(c, '\u{2028}' | '\u{2029}') => {
                out.push_str(&format!("\\u{{{:x}}}", c as u32))
            }
            c => out.push(c),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    const CLOUD_INIT: &[u8] = b"#cloud-config\npackages: [tinyproxy]\nwrite_files:\n  - path: /etc/tinyproxy/auth\n    content: |\n      BasicAuth proxyuser Hunter2Sentinel\n      pw=kx9q\n      Port 3128\nruncmd:\n  - echo SENTINEL-CLOUD-INIT-1234 > /etc/x\n  - ab12\n";

    fn redactor() -> Redactor {
        let pem = b"-----BEGIN PRIVATE KEY-----\nMIIEvQIBADANBgkqhkiG9w0BAQEFAASCBKcwggSjAgEAAoIBAQC7\nVJTUt9Us8cKjMzEfYyjiWA4R4/M2bS1GB4t7NXp98C3SC6dVMvDu\n-----END PRIVATE KEY-----\n";
        Redactor::new([&b"tok-SECRET-5678\n"[..], &pem[..]], CLOUD_INIT)
    }

    /// Every way a plugin might hand back a sensitive value, and text that must survive.
    #[test]
    fn scrubs_every_form_and_keeps_ordinary_text() {
        let r = redactor();
        let b64 = |v: &[u8]| data_encoding::BASE64.encode(v);
        let json = |v: &[u8]| serde_json::to_string(&String::from_utf8_lossy(v)).unwrap();
        let leaks: Vec<(&str, String)> = vec![
            ("secret", "token tok-SECRET-5678 here".into()),
            ("secret base64", format!("x{}y", b64(b"tok-SECRET-5678\n"))),
            (
                "secret base64 at offset 1",
                b64(b"{\"token\":\"tok-SECRET-5678\"}"),
            ),
            (
                "secret base64 at offset 2",
                b64(b"ab tok-SECRET-5678 and more"),
            ),
            (
                "secret url-safe base64",
                data_encoding::BASE64URL.encode(b"..tok-SECRET-5678"),
            ),
            ("secret percent-encoded", "q=tok-SECRET-5678%0A".into()),
            (
                "PEM line",
                "line: VJTUt9Us8cKjMzEfYyjiWA4R4/M2bS1GB4t7NXp98C3SC6dVMvDu".into(),
            ),
            (
                "whole cloud-init",
                String::from_utf8_lossy(CLOUD_INIT).into(),
            ),
            ("cloud-init JSON-escaped", json(CLOUD_INIT)),
            ("cloud-init base64", b64(CLOUD_INIT)),
            (
                "cloud-init base64 inside a JSON body",
                b64(&[b"{\"user_data\":\"".as_slice(), CLOUD_INIT, b"\"}"].concat()),
            ),
            (
                "long line",
                "- echo SENTINEL-CLOUD-INIT-1234 > /etc/x".into(),
            ),
            (
                "value in a line",
                "auth is proxyuser Hunter2Sentinel".into(),
            ),
            ("value alone", "Hunter2Sentinel".into()),
            ("value after =", "got kx9q".into()),
            ("short line", "line was: pw=kx9q!".into()),
            ("short list item", "ran ab12".into()),
        ];
        for (what, leak) in leaks {
            let out = r.scrub(&leak);
            for needle in [
                "SECRET",
                "SENTINEL",
                "Hunter2",
                "kx9q",
                "ab12",
                "VJTUt9Us8",
                "dG9rLVNFQ1JFVC01Njc4",
            ] {
                assert!(!out.contains(needle), "{what}: {out}");
            }
            assert!(out.contains(REDACTED), "{what}: {out}");
            assert!(r.finds(&leak), "{what}");
        }
        for fine in [
            "created server egress-abc in fsn1 on port 3128",
            "packages installed, runcmd done",
            "GET /v1/servers?page=2 -> 200",
            "tinyproxy",
        ] {
            assert_eq!(r.scrub(fine), fine.replace("tinyproxy", REDACTED));
        }
    }

    /// A document is matched line by line, not as a whole: in every encoding of it, what
    /// is left unscrubbed is at most the few characters at each line break (which carry
    /// the newline, indentation and a few bits of the neighbouring bytes), never a line.
    #[test]
    fn an_encoded_document_is_scrubbed_line_by_line() {
        let r = redactor();
        let lines: Vec<&[u8]> = CLOUD_INIT.split(|b| *b == b'\n').collect();
        // What may stay: the public lines (schema keywords), the indentation of the others,
        // and a few characters at each line break.
        let public: Vec<u8> = lines
            .iter()
            .flat_map(|l| {
                let t = l.trim_ascii();
                let keep = if is_public(t) || t.len() < MIN_LINE {
                    l.len()
                } else {
                    l.len() - l.trim_ascii_start().len()
                };
                l[..keep].iter().chain(b"\n")
            })
            .copied()
            .collect();
        let b64 = |v: &[u8]| data_encoding::BASE64.encode(v);
        let json = |v: &[u8]| serde_json::to_string(&String::from_utf8_lossy(v)).unwrap();
        type Encode<'a> = &'a dyn Fn(&[u8]) -> String;
        let encodings: [(&str, Encode, usize); 3] = [
            ("base64", &b64, 4),
            ("json", &json, 8),
            ("percent", &percent_encode, 16),
        ];
        for (what, encode, per_break) in encodings {
            let out = r.scrub(&encode(CLOUD_INIT));
            let left = out.replace(REDACTED, "");
            let allowed = encode(&public).len() + lines.len() * per_break;
            assert!(
                left.len() <= allowed,
                "{what}: {} characters left (at most {allowed}): {out}",
                left.len(),
            );
        }
    }

    /// An identifier holding a whole document is refused, in any encoding, also when no
    /// line of it is long enough to be a whole value on its own.
    #[test]
    fn a_document_of_short_lines_is_a_whole_value() {
        let doc = b"#cloud-config\npw=kx9q\nab12\n";
        let r = Redactor::new(std::iter::empty(), doc);
        for id in [
            String::from_utf8_lossy(doc).into_owned(),
            data_encoding::BASE64.encode(doc),
        ] {
            assert!(r.finds_whole(&id), "{id}");
        }
        assert!(!r.finds_whole("eu-west-1/i-0abc"));
    }

    /// A Proxy's credentials are whole values: an identifier holding the username, the
    /// password or the pair in any form the module docs list is refused, and text holding
    /// them is scrubbed of every character that depends on them alone.
    #[test]
    fn credentials_are_whole_values_in_every_form() {
        const USER: &str = "Zq7xK2mN9vB4wR8tY3uP6sLd";
        // A user's password with characters that JSON and percent-encoding change.
        const PASS: &str = "pa\"ss\\w0rd/SENT+INEL=9a4f";
        let mut p = Patterns::default();
        p.credentials(USER.as_bytes(), PASS.as_bytes());
        let r = p.build();
        let pair = format!("{USER}:{PASS}");
        let b64 = |v: &str| data_encoding::BASE64.encode(v.as_bytes());
        let b64url = |v: &str| data_encoding::BASE64URL_NOPAD.encode(v.as_bytes());
        let json = |v: &str| serde_json::to_string(v).unwrap();
        let forms: Vec<(&str, String)> = vec![
            ("username", USER.into()),
            ("password", PASS.into()),
            ("user:password", pair.clone()),
            ("Basic", format!("Basic {}", b64(&pair))),
            ("password base64", b64(PASS)),
            ("password base64 at offset 1", b64(&format!("x{PASS}"))),
            ("password base64 at offset 2", b64(&format!("xy{PASS}"))),
            ("password url-safe base64", b64url(PASS)),
            (
                "password url-safe base64 at offset 1",
                b64url(&format!("x{PASS}")),
            ),
            (
                "password url-safe base64 at offset 2",
                b64url(&format!("xy{PASS}")),
            ),
            ("username base64", b64(USER)),
            ("password percent-encoded", percent_encode(PASS.as_bytes())),
            ("pair percent-encoded", percent_encode(pair.as_bytes())),
            ("password JSON-escaped", json(PASS)),
            ("pair JSON-escaped", json(&pair)),
        ];
        for (what, form) in forms {
            for id in [form.clone(), format!("i-{form}-x")] {
                assert!(r.finds_whole(&id), "{what}: {id}");
            }
            let out = r.scrub(&format!("got {form} back"));
            assert!(out.contains(REDACTED), "{what}: {out}");
            let left = out.replace(REDACTED, "");
            // What may stay: the surrounding words, `Basic `, and at the ends of an
            // encoded form (and at the `:` of an encoded pair) the few characters that
            // also carry bits of their neighbours.
            assert!(
                left.len() <= "got  back".len() + 12 && !left.contains("SENT"),
                "{what}: {out}"
            );
        }
        for fine in ["i-0abc123", "fsn1/42", "Zq7xK2", "pa-ss"] {
            assert!(!r.finds_whole(fine), "{fine}");
        }
    }

    /// A credential part too short to be a whole value on its own (a user's `root`) is a
    /// fragment: scrubbed from text, not refused in an identifier; the pair is whole.
    #[test]
    fn a_short_credential_part_is_covered_by_the_pair() {
        let mut p = Patterns::default();
        p.credentials(b"root", b"pw-SENTINEL-77");
        let r = p.build();
        assert!(
            !r.finds_whole("i-root-1"),
            "root alone is not a whole value"
        );
        assert_eq!(r.scrub("user root"), format!("user {REDACTED}"));
        for id in [
            "root:pw-SENTINEL-77".to_string(),
            format!(
                "Basic {}",
                data_encoding::BASE64.encode(b"root:pw-SENTINEL-77")
            ),
            "pw-SENTINEL-77".into(),
        ] {
            assert!(r.finds_whole(&id), "{id}");
        }
    }

    /// A token looked up in a table is found exactly where the automaton found it as a whole
    /// value: the same spans, overlapping ones included, in every form a plugin could print
    /// it, inside longer runs, cut short, and in noise.
    #[test]
    fn tokens_match_what_the_automaton_matched() {
        let values = [
            "Zq7xK2mN9vB4wR8tY3uP6sLd",
            "hG5tQ1zX8cV3bN6mK9jL2pW4rT7yU0eA",
            // Overlaps the next one by ten characters, and shares an anchor with none.
            "abcdefghijklmnopqrst",
            "klmnopqrstuvwxyz0123",
            // Shares its first 16 characters (its anchor) with the one before it.
            "abcdefghijklmnopWXYZ",
            "api_key-0123456789-_",
        ];
        let (mut by_automaton, mut by_table) = (Patterns::default(), Patterns::default());
        for v in values {
            assert!(tokens::is_token(v.as_bytes()));
            by_automaton.add(&Unit::Value(v.as_bytes().to_vec()));
            by_table.add(&Unit::Token(v.as_bytes().to_vec()));
        }
        let (a, t) = (by_automaton.build(), by_table.build());
        let b64 = |v: &[u8]| data_encoding::BASE64.encode(v);
        let b64url = |v: &[u8]| data_encoding::BASE64URL_NOPAD.encode(v);
        let mut texts = vec![
            "abcdefghijklmnopqrstuvwxyz0123".to_string(),
            "abcdefghijklmnopWXYZabcdefghijklmnopqrst".to_string(),
            "no secret here, just words and i-0abc123def456".to_string(),
            "abcdefghijklmnopqrs".to_string(),
            String::new(),
        ];
        for v in values {
            let user_pass = format!("{}:{v}", values[0]);
            for pad in 0..3 {
                let prefix = "x".repeat(pad);
                texts.push(b64(format!("{prefix}{v}\n").as_bytes()));
                texts.push(b64url(format!("{prefix}{v}").as_bytes()));
                texts.push(format!(
                    "Basic {}",
                    b64(format!("{prefix}{user_pass}").as_bytes())
                ));
            }
            texts.push(format!("{{\"password\":\"{v}\"}}"));
            texts.push(format!("user%3A{v}%0A"));
            texts.push(format!("AAAA{v}BBBB{v}"));
            texts.push(format!("{}…{}", &v[..10], &v[10..]));
            texts.push(v[1..].to_string());
        }
        // Noise: every text of the base64 alphabet, sliced where forms would start.
        let noise = b64(&(0u8..=255).cycle().take(3000).collect::<Vec<u8>>());
        texts.push(noise.clone());
        texts.push(format!("{noise}{}", b64(values[1].as_bytes())));
        let spans = |r: &Redactor, text: &str, whole: bool| {
            let mut out = Spans::for_text(text.len());
            for s in &r.segments {
                assert!(s.spans(text.as_bytes(), whole, &mut out));
            }
            out.unmerged()
        };
        for text in &texts {
            assert_eq!(spans(&a, text, false), spans(&t, text, false), "{text}");
            assert_eq!(a.scrub(text), t.scrub(text), "{text}");
            assert_eq!(a.finds(text), t.finds(text), "{text}");
            assert_eq!(a.finds_whole(text), t.finds_whole(text), "{text}");
        }
        // And the texts above are not all misses.
        let found = texts.iter().filter(|x| t.finds_whole(x)).count();
        assert!(found > texts.len() / 2, "{found} of {}", texts.len());
    }

    #[test]
    fn base64_offsets_cover_every_alignment() {
        let v = b"SENTINEL-VALUE";
        for pad in 0..6 {
            let mut text = vec![b'x'; pad];
            text.extend_from_slice(v);
            text.extend_from_slice(b"tail");
            let enc = data_encoding::BASE64.encode(&text);
            let pats = base64_at_every_offset(&data_encoding::BASE64, v);
            assert!(
                pats.iter().any(|p| enc.contains(p.as_str())),
                "pad {pad}: {enc} {pats:?}"
            );
        }
    }

    #[test]
    fn words_mark_values_after_separators() {
        let w = words(b"BasicAuth user:pass word=x1 [a, b]");
        let got: Vec<(String, bool)> = w
            .into_iter()
            .map(|(v, s)| (String::from_utf8_lossy(v).into_owned(), s))
            .collect();
        let want = [
            ("BasicAuth", false),
            ("user", false),
            ("pass", true),
            ("word", false),
            ("x1", true),
            ("a", false),
            ("b", false),
        ];
        assert_eq!(
            got,
            want.iter()
                .map(|(v, s)| (v.to_string(), *s))
                .collect::<Vec<_>>()
        );
    }

    #[test]
    fn empty_redactor_is_identity() {
        let r = Redactor::new(std::iter::empty(), b"");
        assert_eq!(r.scrub("abc"), "abc");
        assert!(!r.finds("abc"));
    }

    #[test]
    fn control_characters_are_escaped() {
        let cases = [
            ("plain", "plain"),
            ("a\nb", "a\\nb"),
            (
                "x\r\n2026-01-01 INFO forged",
                "x\\r\\n2026-01-01 INFO forged",
            ),
            ("\u{1b}[31mred", "\\u{1b}[31mred"),
            ("sep\u{2028}x", "sep\\u{2028}x"),
            ("tab\there", "tab\\there"),
        ];
        for (input, want) in cases {
            assert_eq!(escape_controls(input), want, "{input:?}");
        }
    }
}

#[cfg(test)]
mod hostile_texts {
    use super::*;

    /// Values made of one byte at eight lengths, as a plugin marks them
    /// (`host.mark-sensitive` takes 8 bytes and up, and keeps the 8 latest), below and
    /// above the table's 16 bytes.
    fn run_values(from: usize) -> Redactor {
        let vals: Vec<Vec<u8>> = (from..from + 8).map(|n| vec![b'a'; n]).collect();
        Redactor::new(vals.iter().map(Vec::as_slice), b"")
    }

    /// A run of that byte matches every value at every place: 8 spans a byte. 3 MiB of it
    /// (what one log call can hand over) took the host to 389 MiB for one line. Now it is
    /// withheld whole, after at most `MATCHES_PER_BYTE` matches a byte.
    #[test]
    fn a_run_matching_everywhere_is_withheld_whole() {
        for from in [8, 16] {
            let r = run_values(from);
            let text = format!("head {} tail", "a".repeat(3 << 20));
            let started = std::time::Instant::now();
            assert_eq!(r.scrub(&text), WITHHELD, "values from {from}");
            eprintln!("values from {from}: scrub {:?}", started.elapsed());
            assert!(r.finds_whole(&text), "values from {from}");
            let line = r.scrub_line(&text, 4096);
            assert!(
                line.starts_with(WITHHELD) || !line.contains("aaaa"),
                "{line}"
            );
            // The three searches stop at the budget (debug build: about a second each).
            let took = started.elapsed();
            assert!(
                took < std::time::Duration::from_secs(20),
                "{from}: {took:?}"
            );
            // Ordinary text with the values in it is scrubbed as before.
            let v = "a".repeat(from + 3);
            assert_eq!(
                r.scrub(&format!("x {v} y {v}")),
                "x [REDACTED] y [REDACTED]"
            );
        }
    }

    /// A log line or error keeps `max` bytes: only those, plus the longest value, are
    /// looked at, and a value that starts inside them is still found whole.
    #[test]
    fn a_line_is_scrubbed_as_far_as_it_is_kept() {
        let secret = "tok-SECRET-5678-abcdefghij";
        let r = Redactor::new([secret.as_bytes()], b"");
        let max = 100;
        // A value across the cut, a value past it, and megabytes after.
        for at in [0, 50, 90, 99, 100, 120] {
            let text = format!("{}{secret}{}", "x".repeat(at), "z".repeat(1 << 20));
            let line = r.scrub_line(&text, max);
            for cut in 4..secret.len() {
                assert!(!line.contains(&secret[..cut]), "at {at}: {line}");
            }
            assert!(line.len() < max + 40, "at {at}: {} bytes", line.len());
            assert!(line.ends_with("bytes cut)"), "at {at}: {line}");
            if at + 5 <= max {
                assert!(line.contains("[REDA"), "at {at}: {line}");
            }
        }
        // Values that shrink to the marker bring later text into the line: still scrubbed.
        let text = format!("{} {}", secret.repeat(40), "z".repeat(1 << 20));
        let line = r.scrub_line(&text, max);
        assert!(!line.contains("tok-"), "{line}");
        // A short text is cut exactly as `cut` would.
        assert_eq!(
            r.scrub_line(&format!("a {secret}\n"), max),
            "a [REDACTED]\\n"
        );
        assert_eq!(
            r.scrub_line(&"y".repeat(150), max),
            cut(&"y".repeat(150), max)
        );
    }
}

#[cfg(test)]
mod build_time {
    /// A large, repetitive user data (EC2 accepts 16 KiB) once made the matcher build take
    /// minutes (a DFA over periodic patterns) and hung every call of that provider.
    #[test]
    fn a_16_kib_document_compiles_quickly() {
        let started = std::time::Instant::now();
        let r = super::Redactor::new(std::iter::empty(), &vec![b'#'; 16 * 1024 + 1]);
        assert!(r.finds(&"#".repeat(16 * 1024 + 1)));
        let took = started.elapsed();
        assert!(took < std::time::Duration::from_secs(5), "took {took:?}");
    }
}
