//! The contract's marks as ARM tags.
//!
//! ARM refuses tag names containing `<`, `>`, `%`, `&`, `\`, `?` or `/` (400
//! `InvalidTagNameCharacters`), so the contract's keys (`egress.proxy-operator.dev/uid`)
//! cannot be tag names as they are. The emulator, and a plugin written against it, write
//! the mark `egress.proxy-operator.dev/<name>` as the tag `egress-<name>` with the value
//! unchanged; a value longer than ARM's 256 characters is written as `__` followed by the
//! lowercase unpadded base32 of the first 20 bytes of its SHA-256 (like the GCE plugin's
//! labels). The dump shows such tags decoded back to the contract's keys.

use sha2::{Digest, Sha256};

use crate::MARK_PREFIX;

/// The prefix of every tag that carries a mark.
pub const TAG_PREFIX: &str = "egress-";

/// ARM's limits: 512 characters per tag name, 256 per value, 50 tags per resource.
pub const MAX_NAME: usize = 512;
pub const MAX_VALUE: usize = 256;
pub const MAX_TAGS: usize = 50;

/// Characters ARM refuses in tag names.
pub const RESERVED: [char; 7] = ['<', '>', '%', '&', '\\', '?', '/'];

/// The tag of a mark; `None` for a key that is not the operator's.
pub fn encode(key: &str, value: &str) -> Option<(String, String)> {
    let name = key.strip_prefix(MARK_PREFIX)?;
    let value = if value.chars().count() > MAX_VALUE {
        let hash = data_encoding::BASE32_NOPAD.encode(&Sha256::digest(value)[..20]);
        format!("__{}", hash.to_ascii_lowercase())
    } else {
        value.to_string()
    };
    Some((format!("{TAG_PREFIX}{name}"), value))
}

/// The mark a tag stands for (a hashed value stays hashed); `None` for other tags.
pub fn decode(name: &str, value: &str) -> Option<(String, String)> {
    let mark = name.strip_prefix(TAG_PREFIX)?;
    (!mark.is_empty()).then(|| (format!("{MARK_PREFIX}{mark}"), value.to_string()))
}

/// A tag name ARM accepts (no reserved or control characters).
pub fn valid_name(name: &str) -> bool {
    !name.is_empty() && !name.chars().any(|c| RESERVED.contains(&c) || c.is_control())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn marks_round_trip_and_long_values_hash() {
        let (k, v) = encode(crate::MARK_UID, "abc").unwrap();
        assert_eq!((k.as_str(), v.as_str()), ("egress-uid", "abc"));
        assert!(valid_name(&k));
        assert_eq!(decode(&k, &v), Some((crate::MARK_UID.to_string(), "abc".to_string())));
        let long = "x".repeat(300);
        let (_, v) = encode(crate::MARK_INSTALLATION, &long).unwrap();
        assert!(v.starts_with("__") && v.len() == 34, "{v}");
        assert_eq!(encode("other/key", "v"), None);
        assert_eq!(decode("owner", "me"), None);
        assert!(!valid_name(crate::MARK_MANAGED), "the contract's key has a '/'");
    }
}
