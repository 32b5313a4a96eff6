//! Whole values made of letters, digits, `-` and `_` (a generated username or password, an
//! API token), matched by table lookup instead of by automaton.
//!
//! Why: an Aho-Corasick automaton costs about 12 bytes per pattern byte and 128 per
//! pattern, and a value is matched in several forms (itself and its base64 at three
//! alignments: 158 pattern bytes for a 32-character password). A Proxy's generated username
//! and password cost about 5 KiB of automaton, so the default `--redaction-memory` held
//! about 6,900 Proxies. A value of this alphabet needs no automaton: JSON-escaping and
//! percent-encoding leave it as it is, and its base64 is letters and digits only (the same
//! in both alphabets: four forms in all). So every form of it lies inside a run of
//! [`in_class`] bytes of the text, and it is enough to look each window of
//! such a run up by its first [`ANCHOR`] bytes: a hash table of about 60 bytes per form.
//!
//! A text costs one lookup per byte of its runs, plus a comparison per form that shares
//! the anchor found: [`crate::sensitive`] lets at most `MAX_FORMS_PER_ANCHOR` forms share
//! one (values given one prefix on purpose go to the automaton instead), so no set of
//! values a user chooses makes a scrub slower than that.
//!
//! Matching is exact (a hit is compared byte for byte), so it finds what the automaton
//! found: every occurrence, overlapping ones included
//! (`redact::tests::tokens_match_what_the_automaton_matched`).

use super::spans::Spans;
use std::collections::HashMap;

/// Bytes of a form that index it; every form is at least this long.
pub const ANCHOR: usize = 16;
/// Shortest value matched by table: its base64 forms (21 to 23 characters) are longer than
/// [`ANCHOR`] too.
pub const MIN_TOKEN: usize = ANCHOR;

/// End of a chain of forms that share an anchor.
const NONE: u32 = u32::MAX;

/// Whether `v` is matched by table rather than by automaton.
pub fn is_token(v: &[u8]) -> bool {
    v.len() >= MIN_TOKEN
        && u32::try_from(v.len()).is_ok()
        && v.iter()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_'))
}

/// Bytes a form of a token can hold: a token's own, since its base64 has none of `+`, `/`
/// (see `tests::every_form_of_a_token_is_indexed`).
pub fn in_class(b: u8) -> bool {
    b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_')
}

/// One form: `bytes[start..start + len]`, and the next form with the same anchor.
#[derive(Clone, Copy)]
struct Form {
    start: u32,
    len: u32,
    next: u32,
}

/// The forms of some tokens, indexed by anchor. Immutable once built, like an automaton:
/// [`crate::sensitive`] builds one per segment.
pub struct Tokens {
    index: HashMap<[u8; ANCHOR], u32, foldhash::fast::RandomState>,
    forms: Vec<Form>,
    bytes: Vec<u8>,
}

impl Tokens {
    /// A table of every form of every token in `values` (each [`is_token`]); `None` when
    /// there are none.
    pub fn build<'a>(values: impl IntoIterator<Item = &'a [u8]>) -> Option<Tokens> {
        let forms: Vec<Vec<u8>> = values.into_iter().flat_map(forms_of).collect();
        if forms.is_empty() {
            return None;
        }
        let mut t = Tokens {
            index: HashMap::with_capacity_and_hasher(forms.len(), Default::default()),
            forms: Vec::with_capacity(forms.len()),
            bytes: Vec::with_capacity(forms.iter().map(Vec::len).sum()),
        };
        for f in forms {
            let anchor = anchor_of(&f);
            let id = u32::try_from(t.forms.len()).expect("fewer than 4 G forms");
            let next = t.index.insert(anchor, id).unwrap_or(NONE);
            t.forms.push(Form {
                start: u32::try_from(t.bytes.len()).expect("under 4 GiB of forms"),
                len: u32::try_from(f.len()).expect("checked by is_token"),
                next,
            });
            t.bytes.extend_from_slice(&f);
        }
        Some(t)
    }

    /// Heap bytes of the table (what an automaton's `memory_usage` is to it).
    pub fn memory_usage(&self) -> usize {
        // A hash table entry, plus its control byte.
        let entry = std::mem::size_of::<([u8; ANCHOR], u32)>() + 1;
        self.index.capacity() * entry
            + self.forms.capacity() * std::mem::size_of::<Form>()
            + self.bytes.capacity()
    }

    /// The most forms that share one anchor (what a text starting with it costs to check).
    #[cfg(test)]
    pub fn longest_chain(&self) -> usize {
        self.index
            .values()
            .map(|&first| {
                let (mut n, mut id) = (0, first);
                while id != NONE {
                    n += 1;
                    id = self.forms[id as usize].next;
                }
                n
            })
            .max()
            .unwrap_or(0)
    }

    /// The longest form held.
    pub fn longest_form(&self) -> usize {
        self.forms.iter().map(|f| f.len as usize).max().unwrap_or(0)
    }

    /// Spans of every occurrence of every form in `text`, into `out`; `false` once `out`
    /// has taken all the matches it takes.
    pub fn spans(&self, text: &[u8], out: &mut Spans) -> bool {
        let mut i = 0;
        while i < text.len() {
            if !in_class(text[i]) {
                i += 1;
                continue;
            }
            let start = i;
            while i < text.len() && in_class(text[i]) {
                i += 1;
            }
            if !self.spans_in_run(text, start, i, out) {
                return false;
            }
        }
        true
    }

    /// Whether `text` holds any form: the search ends at the first.
    pub fn finds(&self, text: &[u8]) -> bool {
        let mut out = Spans::with_budget(1);
        self.spans(text, &mut out);
        !out.is_empty()
    }

    /// Occurrences inside the run `text[start..end]` of [`in_class`] bytes.
    fn spans_in_run(&self, text: &[u8], start: usize, end: usize, out: &mut Spans) -> bool {
        if end - start < ANCHOR {
            return true;
        }
        for at in start..=end - ANCHOR {
            let anchor: &[u8; ANCHOR] = text[at..at + ANCHOR].try_into().expect("in range");
            let Some(&first) = self.index.get(anchor) else {
                continue;
            };
            let mut id = first;
            while id != NONE {
                let f = self.forms[id as usize];
                let len = f.len as usize;
                let form = &self.bytes[f.start as usize..f.start as usize + len];
                if at + len <= end && &text[at..at + len] == form && !out.visit(Some(at..at + len))
                {
                    return false;
                }
                id = f.next;
            }
        }
        true
    }
}

/// The anchor a table indexes a form by: its first [`ANCHOR`] bytes.
pub fn anchor_of(form: &[u8]) -> [u8; ANCHOR] {
    form[..ANCHOR]
        .try_into()
        .expect("a token's forms are at least an anchor long")
}

/// A token as it may appear in text: itself (also its JSON-escaped and percent-encoded
/// form), and its base64 at every alignment in both alphabets.
pub fn forms_of(v: &[u8]) -> Vec<Vec<u8>> {
    debug_assert!(is_token(v));
    let mut out = vec![v.to_vec()];
    for alphabet in [&data_encoding::BASE64, &data_encoding::BASE64URL] {
        out.extend(
            super::base64_at_every_offset(alphabet, v)
                .into_iter()
                .map(String::into_bytes),
        );
    }
    out.sort_unstable();
    out.dedup();
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn what_is_a_token() {
        for (v, token) in [
            ("Zq7xK2mN9vB4wR8tY3uP6sLd", true),
            ("abcdefghijklmnop", true),
            ("abcdefghijklmno", false),
            ("api_key-0123456789", true),
            ("pa\"ss\\w0rd/SENT+INEL=9a4f", false),
            ("with a space in it, long", false),
            ("dGhpcyBpcyBiYXNlNjQ=", false),
        ] {
            assert_eq!(is_token(v.as_bytes()), token, "{v}");
        }
    }

    /// Every form is at least an anchor long, or the table could not index it; and every
    /// byte of it is of the class a run is made of, or a scan would not reach it. The two
    /// base64 alphabets agree on a token: no 6-bit group of these bytes reaches 62 (`+`,
    /// `-`) or 63 (`/`, `_`), so a token has four forms.
    #[test]
    fn every_form_of_a_token_is_indexed() {
        for v in [
            "0123456789abcdef",
            "_-_-_-_-_-_-_-_-",
            "zzzzzzzzzzzzzzzzzzzzzzzz",
            "9o9o9o9o9o9o9o9o9o9o9o9o9o9o9o9o",
            "Zq7xK2mN9vB4wR8tY3uP6sLd",
        ] {
            let forms = forms_of(v.as_bytes());
            assert_eq!(forms.len(), 4, "{v}: {forms:?}");
            assert!(forms.iter().all(|f| f.len() >= ANCHOR), "{forms:?}");
            assert!(forms.iter().all(|f| f.iter().all(|b| in_class(*b))));
        }
    }

    /// Two forms with one anchor (tokens that share their first 16 bytes) are both found.
    #[test]
    fn forms_sharing_an_anchor_are_chained() {
        let a = b"0123456789abcdefAAAA";
        let b = b"0123456789abcdefBBBBBBBB";
        let t = Tokens::build([&a[..], &b[..]]).unwrap();
        let text = b"x 0123456789abcdefBBBBBBBB 0123456789abcdefAAAA y";
        let mut out = Spans::for_text(text.len());
        assert!(t.spans(text, &mut out));
        assert_eq!(out.merged(), vec![2..26, 27..47]);
        // A run that ends inside a form does not match it.
        let mut out = Spans::for_text(19);
        t.spans(b"0123456789abcdefBBB", &mut out);
        assert!(out.is_empty());
    }
}
