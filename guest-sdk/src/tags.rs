//! The contract's marks on backends whose tags are plain strings, not key/value labels
//! (DigitalOcean; Vultr and Linode tags are alike).
//!
//! Each mark becomes one tag `<prefix><name>:<value>`: `<name>` is the mark key without
//! `egress.proxy-operator.dev/`, and in both parts lowercase letters, digits and `-` stand
//! for themselves while every other byte is `_` plus two lowercase hex digits. The result
//! uses only `[a-z0-9_:-]` (plus the prefix), so a backend that folds case or allows only
//! a tag-ish charset keeps it intact; its only unescaped `:` after the prefix separates
//! name and value; and it decodes back to exactly the key and value written. A UUID stays
//! readable (`egress:uid:3f1c2a4e-7b1d-...`); `cluster/Prod` is `cluster_2f_50rod`.
//!
//! A value that only has to be matched, never read back (the installation), may be too
//! long for a tag: [`TagScheme::matching`] then writes `__` plus 32 base32 characters of
//! its SHA-256. `__` never comes out of the escaping, so a hashed tag cannot equal a
//! verbatim one.

use sha2::{Digest, Sha256};
use std::fmt::Write;

use crate::MARK_PREFIX;

/// How one backend's tags carry the marks: a `const` per plugin.
#[derive(Clone, Copy, Debug)]
pub struct TagScheme {
    /// Starts every mark tag (`egress:`); lowercase, so case folding keeps it.
    pub prefix: &'static str,
    /// The backend's longest tag.
    pub max_len: usize,
}

fn escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' {
            out.push(b as char);
        } else {
            let _ = write!(out, "_{b:02x}");
        }
    }
    out
}

fn unescape(s: &str) -> Option<String> {
    let (mut bytes, mut rest) = (Vec::with_capacity(s.len()), s.as_bytes());
    while let Some((&b, tail)) = rest.split_first() {
        match b {
            b'_' => {
                let hex = tail.get(..2).filter(|h| {
                    h.iter()
                        .all(|c| c.is_ascii_digit() || (b'a'..=b'f').contains(c))
                })?;
                bytes.push(u8::from_str_radix(std::str::from_utf8(hex).ok()?, 16).ok()?);
                rest = &tail[2..];
            }
            b'a'..=b'z' | b'0'..=b'9' | b'-' => {
                bytes.push(b);
                rest = tail;
            }
            _ => return None,
        }
    }
    String::from_utf8(bytes).ok()
}

impl TagScheme {
    /// The tag of a mark; `None` for a key that is not the operator's, or a tag longer
    /// than the backend allows.
    pub fn encode(&self, key: &str, value: &str) -> Option<String> {
        let name = key.strip_prefix(MARK_PREFIX)?;
        let t = format!("{}{}:{}", self.prefix, escape(name), escape(value));
        (t.len() <= self.max_len).then_some(t)
    }

    /// The mark a tag stands for; `None` for any other tag. A spelling in another case is
    /// read too (a backend may answer with a tag's first, canonical spelling).
    pub fn decode(&self, tag: &str) -> Option<(String, String)> {
        let t = tag.to_ascii_lowercase();
        let (name, value) = t.strip_prefix(self.prefix)?.split_once(':')?;
        Some((
            format!("{MARK_PREFIX}{}", unescape(name)?),
            unescape(value)?,
        ))
    }

    /// The value of mark `key` among `tags`, if one carries it.
    pub fn value(&self, tags: &[String], key: &str) -> Option<String> {
        tags.iter()
            .filter_map(|t| self.decode(t))
            .find(|(k, _)| k == key)
            .map(|(_, v)| v)
    }

    /// The tag to write and list by for a mark that is only ever matched: [`encode`]d, or
    /// hashed when that would be too long (module docs). Empty for a key that is not the
    /// operator's.
    ///
    /// [`encode`]: Self::encode
    pub fn matching(&self, key: &str, value: &str) -> String {
        let Some(name) = key.strip_prefix(MARK_PREFIX) else {
            return String::new();
        };
        self.encode(key, value).unwrap_or_else(|| {
            let digest = Sha256::digest(value.as_bytes());
            let hash = data_encoding::BASE32_NOPAD.encode(&digest[..20]);
            format!(
                "{}{}:__{}",
                self.prefix,
                escape(name),
                hash.to_ascii_lowercase()
            )
        })
    }
}

/// Whether `tags` hold `want`, without regard to case (tags of such backends compare so).
pub fn has(tags: &[String], want: &str) -> bool {
    tags.iter().any(|t| t.eq_ignore_ascii_case(want))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{MARK_INSTALLATION, MARK_MANAGED, MARK_UID};

    const TAGS: TagScheme = TagScheme {
        prefix: "egress:",
        max_len: 255,
    };

    /// Any key and value of the operator's round-trip exactly, through a tag charset and
    /// case folding.
    #[test]
    fn marks_round_trip() {
        let values = [
            "",
            "true",
            "3f1c2a4e-7b1d-4c8e-9a55-0d6f2b9e1c01",
            "cluster/Prod",
            "a:b_c d.e",
            "ünïcødé",
            "_2f",
        ];
        for v in values {
            for key in [MARK_UID, MARK_INSTALLATION, MARK_MANAGED] {
                let t = TAGS.encode(key, v).unwrap();
                assert!(
                    t.bytes().all(|b| b.is_ascii_lowercase()
                        || b.is_ascii_digit()
                        || b"-_:".contains(&b)),
                    "{t}"
                );
                let want = Some((key.to_string(), v.to_string()));
                assert_eq!(TAGS.decode(&t), want, "{t}");
                assert_eq!(TAGS.decode(&t.to_ascii_uppercase()), want, "{t}");
                assert_eq!(TAGS.matching(key, v), t);
            }
        }
        assert_eq!(
            TAGS.encode(MARK_UID, "3f1c-7b1d").unwrap(),
            "egress:uid:3f1c-7b1d"
        );
        assert_eq!(
            TAGS.encode(MARK_INSTALLATION, "cluster/Prod").unwrap(),
            "egress:installation:cluster_2f_50rod"
        );
        assert_eq!(TAGS.encode("other/key", "v"), None);
        assert_eq!(TAGS.matching("other/key", "v"), "");
        for bad in [
            "web",
            "egress:uid",
            "egress:uid:_zz",
            "egress:uid:a_2",
            "egress:uid:a.b",
            "egress:installation:__x",
        ] {
            assert_eq!(TAGS.decode(bad), None, "{bad}");
        }
        let tags = vec!["web".to_string(), "EGRESS:UID:U-1".to_string()];
        assert_eq!(TAGS.value(&tags, MARK_UID).as_deref(), Some("u-1"));
        assert_eq!(TAGS.value(&tags, MARK_INSTALLATION), None);
        assert!(has(&tags, "egress:uid:u-1") && !has(&tags, "egress:uid:u-2"));
    }

    #[test]
    fn long_values_are_hashed_for_matching_only() {
        let long = "x/".repeat(100);
        assert_eq!(TAGS.encode(MARK_INSTALLATION, &long), None);
        let t = TAGS.matching(MARK_INSTALLATION, &long);
        // A fixed vector: changing the mapping would orphan every instance made under it.
        assert_eq!(t, "egress:installation:__fpopsbjmy5mwua65ni7zs3kpoid2dt3a");
        assert!(t.len() <= 255 && TAGS.decode(&t).is_none());
        assert_ne!(t, TAGS.matching(MARK_INSTALLATION, &"x/".repeat(101)));
    }
}
