//! Instance names derived from the Proxy UID.

use sha2::{Digest, Sha256};

/// `proxy-` followed by 16 lowercase base32 characters of SHA-256(uid).
///
/// Create is idempotent by this name, so it must be the same for a UID every time, on every
/// replica and across versions: the guest SDK implements the same function and both are
/// tested against the same vectors. 16 base32 characters are exactly the first 80 bits of
/// the digest, and the result is a valid DNS label (22 characters).
pub fn name_from_uid(uid: &str) -> String {
    let digest = Sha256::digest(uid.as_bytes());
    let encoded = data_encoding::BASE32_NOPAD.encode(&digest[..10]);
    format!("proxy-{}", encoded.to_ascii_lowercase())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn deterministic_dns_label_of_fixed_length() {
        for uid in ["", "a", "0d9e6f0c-4b9e-4a39-8f55-6a1c6c0f3e21", "ÜNICODE"] {
            let name = name_from_uid(uid);
            assert_eq!(name, name_from_uid(uid));
            assert_eq!(name.len(), 22, "{name}");
            assert!(name.starts_with("proxy-"));
            assert!(
                name[6..]
                    .chars()
                    .all(|c| c.is_ascii_lowercase() || ('2'..='7').contains(&c)),
                "{name}"
            );
        }
        assert_ne!(name_from_uid("a"), name_from_uid("b"));
    }

    /// Vectors computed independently (Python hashlib + base64); the guest SDK's tests use
    /// the same ones, so host and plugins can never disagree on a name.
    #[test]
    fn known_vectors() {
        for (uid, name) in [
            ("", "proxy-4oymiquy7qobjgx3"),
            ("a", "proxy-zklycewkdo64v6wc"),
            (
                "0d9e6f0c-4b9e-4a39-8f55-6a1c6c0f3e21",
                "proxy-cy6mh3pfs5bxaplz",
            ),
        ] {
            assert_eq!(name_from_uid(uid), name, "uid {uid:?}");
        }
    }
}
