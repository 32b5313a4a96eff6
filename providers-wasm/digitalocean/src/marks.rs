//! Tags and provider IDs: the identity of a Droplet as the operator sees it.
//!
//! DigitalOcean tags are plain strings of `[A-Za-z0-9:_-]`, 1 to 255 characters, and they
//! are case-insensitive: the first spelling of a tag is its canonical one ("case stable").
//! The contract's marks are key/value pairs (`egress.proxy-operator.dev/uid` = the Proxy's
//! UID), so each becomes one tag `egress:<name>:<value>`: `<name>` is the key without
//! `egress.proxy-operator.dev/`, and both parts are escaped so that lowercase letters,
//! digits and `-` stand for themselves and every other byte is `_` plus two lowercase hex
//! digits. The result is lowercase only (case folding cannot change it), the two `:` are
//! the only unescaped ones, and it decodes back to exactly the key and value written: a
//! UUID stays readable (`egress:uid:3f1c2a4e-7b1d-...`), `cluster/Prod` becomes
//! `cluster_2f_50rod`.
//!
//! Only the UID must be read back; the installation is only ever matched. An installation
//! whose tag would be longer than 255 is tagged `egress:installation:__` plus 32 base32
//! characters of its SHA-256 instead: `__` never comes out of the escaping, so the hashed
//! form cannot collide with a verbatim one.

use data_encoding::BASE32_NOPAD;
use egress_guest_sdk::id::{IdFormat, is_decimal_id};
use egress_guest_sdk::{MARK_INSTALLATION, MARK_MANAGED, MARK_MANAGED_YES, MARK_UID, ProviderError};
use sha2::{Digest, Sha256};
use std::fmt::Write;

const PREFIX: &str = "egress:";
const MARK_PREFIX: &str = "egress.proxy-operator.dev/";
const MAX_TAG: usize = 255;

/// Whether DigitalOcean accepts `s` as a tag name (`^[a-zA-Z0-9_\-\:]+$`, at most 255).
pub fn is_tag(s: &str) -> bool {
    (1..=MAX_TAG).contains(&s.len()) && s.bytes().all(|b| b.is_ascii_alphanumeric() || matches!(b, b':' | b'-' | b'_'))
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
                let hex =
                    tail.get(..2).filter(|h| h.iter().all(|c| c.is_ascii_digit() || (b'a'..=b'f').contains(c)))?;
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

/// The tag for a mark, or `None` when the key is not one of the operator's or the tag
/// would be longer than DigitalOcean allows.
pub fn tag(key: &str, value: &str) -> Option<String> {
    let name = key.strip_prefix(MARK_PREFIX)?;
    let t = format!("{PREFIX}{}:{}", escape(name), escape(value));
    (t.len() <= MAX_TAG).then_some(t)
}

/// The mark a tag stands for; `None` for any other tag. Reads a canonical spelling in
/// another case as well, since DigitalOcean may answer with one.
pub fn parse_tag(tag: &str) -> Option<(String, String)> {
    let t = tag.to_ascii_lowercase();
    let (name, value) = t.strip_prefix(PREFIX)?.split_once(':')?;
    Some((format!("{MARK_PREFIX}{}", unescape(name)?), unescape(value)?))
}

/// The tag GC lists by (`tag_name`): the installation, verbatim or hashed (module docs).
pub fn installation_tag(installation: &str) -> String {
    tag(MARK_INSTALLATION, installation).unwrap_or_else(|| {
        let digest = Sha256::digest(installation.as_bytes());
        format!("{PREFIX}installation:__{}", BASE32_NOPAD.encode(&digest[..20]).to_ascii_lowercase())
    })
}

/// The tag every managed Droplet carries.
pub fn managed_tag() -> String {
    tag(MARK_MANAGED, MARK_MANAGED_YES).unwrap_or_default()
}

/// Whether `tags` hold `want` (tags compare without regard to case).
pub fn has(tags: &[String], want: &str) -> bool {
    tags.iter().any(|t| t.eq_ignore_ascii_case(want))
}

/// The UID mark's value, `""` when the Droplet has none.
pub fn uid(tags: &[String]) -> String {
    tags.iter().filter_map(|t| parse_tag(t)).find(|(k, _)| k == MARK_UID).map(|(_, v)| v).unwrap_or_default()
}

/// Whether a listed Droplet is managed by this installation: checked on every Droplet of
/// a list, so a backend (or proxy) that ignored `tag_name` cannot hand GC another one's.
pub fn is_gc_match(tags: &[String], installation: &str) -> bool {
    has(tags, &managed_tag()) && has(tags, &installation_tag(installation))
}

/// The tags a Droplet is created with: the three marks, then the config's own tags.
pub fn create_tags(uid: &str, installation: &str, extra: &[String]) -> Result<Vec<String>, ProviderError> {
    let Some(uid_tag) = tag(MARK_UID, uid) else {
        let msg = format!("uid {uid:?} does not fit in a DigitalOcean tag (255 characters once escaped)");
        return Err(ProviderError::permanent(msg).with_code("InvalidUid"));
    };
    let mut tags = vec![managed_tag(), uid_tag, installation_tag(installation)];
    tags.extend(extra.iter().cloned());
    Ok(tags)
}

/// `<region>/<droplet id>`. Droplet IDs are global; the region is there so an ID read in a
/// Proxy's status says where it runs, and it keeps working if the region leaves the config.
pub const ID: IdFormat =
    IdFormat { shape: "<region>/<droplet id>, e.g. nyc3/3164444", scope: crate::config::is_region, key: is_decimal_id };

/// The region and Droplet ID of a provider ID; malformed is permanent `InvalidId`.
pub fn parse_id(id: &str) -> Result<(&str, u64), ProviderError> {
    let (region, key) = ID.parse(id)?;
    Ok((region, key.parse().map_err(|_| ProviderError::invalid_id(id, ID.shape))?))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Any key and value of the operator's round-trip exactly, through DigitalOcean's
    /// charset and its case folding.
    #[test]
    fn marks_round_trip_through_tags() {
        let values = [
            "",
            "true",
            "3f1c2a4e-7b1d-4c8e-9a55-0d6f2b9e1c01",
            "cluster/Prod",
            "a:b_c d.e",
            "ünïcødé",
            "_2f",
            "UPPER-lower-123",
        ];
        for v in values {
            for key in [MARK_UID, MARK_INSTALLATION, MARK_MANAGED] {
                let t = tag(key, v).unwrap();
                assert!(is_tag(&t) || v.is_empty(), "{t}");
                assert_eq!(t, t.to_ascii_lowercase(), "lowercase only: {t}");
                assert_eq!(parse_tag(&t), Some((key.to_string(), v.to_string())), "{t}");
                assert_eq!(parse_tag(&t.to_ascii_uppercase()), Some((key.to_string(), v.to_string())));
            }
        }
        assert_eq!(tag(MARK_UID, "3f1c2a4e-7b1d").unwrap(), "egress:uid:3f1c2a4e-7b1d");
        assert_eq!(installation_tag("cluster/Prod"), "egress:installation:cluster_2f_50rod");
        assert_eq!(managed_tag(), "egress:managed:true");
        assert_eq!(tag("other/key", "v"), None);
        for bad in
            ["web", "egress:uid", "egress:uid:_zz", "egress:uid:a_2", "egress:uid:a.b", "egress:installation:__x"]
        {
            assert_eq!(parse_tag(bad), None, "{bad}");
        }
    }

    #[test]
    fn long_installations_are_hashed_and_uids_refused() {
        let long = "x/".repeat(100);
        let t = installation_tag(&long);
        assert!(t.starts_with("egress:installation:__") && t.len() == 22 + 32 && is_tag(&t), "{t}");
        assert_eq!(t, installation_tag(&long), "deterministic");
        assert_ne!(t, installation_tag(&"x/".repeat(101)));
        // A fixed vector: changing the mapping would orphan every Droplet made under it.
        assert_eq!(installation_tag(&long), "egress:installation:__fpopsbjmy5mwua65ni7zs3kpoid2dt3a");
        let e = create_tags(&"u/".repeat(100), "i", &[]).unwrap_err();
        assert_eq!(e.code.as_deref(), Some("InvalidUid"));
        let tags = create_tags("u-1", "inst", &["fw:proxies".into()]).unwrap();
        assert_eq!(tags, ["egress:managed:true", "egress:uid:u-1", "egress:installation:inst", "fw:proxies"]);
        assert!(is_gc_match(&tags, "inst") && !is_gc_match(&tags, "other"));
        assert!(is_gc_match(&["EGRESS:MANAGED:TRUE".into(), "egress:installation:inst".into()], "inst"));
        assert!(!is_gc_match(&tags[1..], "inst"), "unmanaged");
        assert_eq!(uid(&tags), "u-1");
        assert_eq!(uid(&tags[2..]), "");
    }

    #[test]
    fn ids_are_parsed_strictly() {
        assert_eq!(parse_id("nyc3/3164444").unwrap(), ("nyc3", 3_164_444));
        for bad in ["", "3164444", "nyc3/", "/1", "nyc3/1/2", "nyc3/01", "NYC3/1", "nyc3/-1", "../1", "nyc3/1\n"] {
            assert_eq!(parse_id(bad).unwrap_err().code.as_deref(), Some("InvalidId"), "{bad:?}");
        }
    }
}
