//! Instance names derived from the Proxy UID.

use sha2::{Digest, Sha256};

/// `proxy-` followed by 16 lowercase base32 characters of SHA-256(uid).
///
/// Create is idempotent by this name, so it must be the same for a UID every time, on every
/// replica, in every plugin and across versions: the host passes it as the create request's
/// name, and plugins that need it from a UID alone (adoption) call this same function. 16
/// base32 characters are exactly the first 80 bits of the digest (collision-free at any
/// realistic fleet size), and the result is a valid DNS label of 22 characters, short
/// enough for every backend's name limits.
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

    /// Vectors computed independently (Python hashlib + base64): a change of the function
    /// would rename every instance, so it must fail here.
    #[test]
    fn known_vectors() {
        for (uid, name) in [
            ("", "proxy-4oymiquy7qobjgx3"),
            ("a", "proxy-zklycewkdo64v6wc"),
            (
                "0d9e6f0c-4b9e-4a39-8f55-6a1c6c0f3e21",
                "proxy-cy6mh3pfs5bxaplz",
            ),
            (
                "3f1c2a4e-7b1d-4c8e-9a55-0d6f2b9e1c01",
                "proxy-itnbf4wjfyhs3q6u",
            ),
            (
                "00000000-0000-0000-0000-000000000000",
                "proxy-ck4to7f6pzojj2fh",
            ),
            ("abc", "proxy-xj4bnp4pahh6uqkb"),
            ("ünïcødé", "proxy-k4j35uyd5tuoilou"),
        ] {
            assert_eq!(name_from_uid(uid), name, "uid {uid:?}");
        }
    }
}
