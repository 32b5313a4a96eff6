//! Labels, label selectors and provider IDs: the identity of a server as the operator
//! sees it.
//!
//! Hetzner label values are at most 63 characters of `[A-Za-z0-9._-]`, alphanumeric at
//! both ends, or empty. A Kubernetes UID (a UUID) always fits; the installation identity is
//! free text chosen by the operator's deployment and may not, so it is mapped
//! deterministically (see [`installation_value`]).

use data_encoding::BASE32_NOPAD;
use egress_guest_sdk::id::{IdFormat, is_decimal_id};
use egress_guest_sdk::{
    MARK_INSTALLATION, MARK_MANAGED, MARK_MANAGED_YES, MARK_UID, ProviderError,
};
use sha2::{Digest, Sha256};
use std::collections::BTreeMap;

/// The location a server was created in. Not one of the operator's marks: it exists so the
/// health check can count and probe managed servers per location with a server-side
/// filter, since `GET /servers` has no location parameter.
pub const MARK_LOCATION: &str = "egress.proxy-operator.dev/location";

/// Prefix of a hashed installation value. A value that needed hashing can never collide
/// with one used verbatim unless someone chose this exact form as an installation name.
const HASHED_PREFIX: &str = "sha256-";

/// Whether Hetzner accepts `s` as a label value.
pub fn is_label_value(s: &str) -> bool {
    let b = s.as_bytes();
    b.is_empty()
        || (b.len() <= 63
            && b[0].is_ascii_alphanumeric()
            && b[b.len() - 1].is_ascii_alphanumeric()
            && b.iter()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, b'-' | b'_' | b'.')))
}

/// The label value that stands for an installation identity.
///
/// Used verbatim when Hetzner accepts it (readable in the console, and equal to what other
/// providers write for the same installation); otherwise `sha256-` plus 32 lowercase
/// base32 characters (160 bits) of its SHA-256, so the same installation always maps to the
/// same value and GC finds exactly the servers created under it.
pub fn installation_value(installation: &str) -> String {
    if is_label_value(installation) {
        return installation.to_string();
    }
    let digest = Sha256::digest(installation.as_bytes());
    format!(
        "{HASHED_PREFIX}{}",
        BASE32_NOPAD.encode(&digest[..20]).to_ascii_lowercase()
    )
}

/// The labels a server is created with: the three marks plus [`MARK_LOCATION`], all in the
/// create call itself so no unmarked server ever exists.
pub fn create_labels(
    uid: &str,
    installation: &str,
    location: &str,
) -> Result<BTreeMap<String, String>, ProviderError> {
    if !is_label_value(uid) {
        let msg = format!(
            "uid {uid:?} cannot be stored as a Hetzner label value (at most 63 of [A-Za-z0-9._-])"
        );
        return Err(ProviderError::permanent(msg).with_code("InvalidUid"));
    }
    Ok(BTreeMap::from([
        (MARK_MANAGED.to_string(), MARK_MANAGED_YES.to_string()),
        (MARK_UID.to_string(), uid.to_string()),
        (
            MARK_INSTALLATION.to_string(),
            installation_value(installation),
        ),
        (MARK_LOCATION.to_string(), location.to_string()),
    ]))
}

/// A `label_selector` requiring every pair (Hetzner's comma means AND). Values must be
/// label values already; the caller encodes the result for the query string.
pub fn selector(pairs: &[(&str, &str)]) -> String {
    pairs
        .iter()
        .map(|(k, v)| format!("{k}={v}"))
        .collect::<Vec<_>>()
        .join(",")
}

/// What GC lists: managed servers of one installation.
pub fn gc_selector(installation: &str) -> String {
    let inst = installation_value(installation);
    selector(&[(MARK_MANAGED, MARK_MANAGED_YES), (MARK_INSTALLATION, &inst)])
}

/// Whether a listed server really carries the marks asked for. Checked again on the
/// client so a backend (or proxy) that ignored the selector cannot hand GC someone else's
/// servers.
pub fn is_gc_match(labels: &BTreeMap<String, String>, installation: &str) -> bool {
    labels
        .get(MARK_MANAGED)
        .is_some_and(|v| v == MARK_MANAGED_YES)
        && labels
            .get(MARK_INSTALLATION)
            .is_some_and(|v| *v == installation_value(installation))
}

/// `<location>/<server id>`. Hetzner server IDs are global, so the location is not needed
/// to find the server; it is there so an ID read in a Proxy status says where it runs.
/// The ID is a decimal exactly as Hetzner's number prints, so it parses back to the same.
pub const ID: IdFormat = IdFormat {
    shape: "<location>/<server id>, e.g. fsn1/4200001",
    scope: crate::config::is_location,
    key: is_decimal_id,
};

pub fn format_id(location: &str, server_id: u64) -> String {
    ID.format(location, server_id)
}

/// Parse a provider ID strictly: a malformed one is permanent (the operator then stops
/// retrying and, when deleting, gives up cleanly) rather than a lookup of something else.
pub fn parse_id(id: &str) -> Result<(&str, u64), ProviderError> {
    let (location, num) = ID.parse(id)?;
    // Cannot fail: `is_decimal_id` admits only what `u64` parses.
    let n = num
        .parse()
        .map_err(|_| ProviderError::invalid_id(id, ID.shape))?;
    Ok((location, n))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn label_values_follow_hetzner_rules() {
        for ok in [
            "",
            "true",
            "3f6c5a4e-1b2c-4d5e-8f90-a1b2c3d4e5f6",
            "v1.2_x",
            &"a".repeat(63),
        ] {
            assert!(is_label_value(ok), "{ok:?}");
        }
        for bad in ["-x", "x.", "a/b", "a b", "ü", &"a".repeat(64)] {
            assert!(!is_label_value(bad), "{bad:?}");
        }
    }

    #[test]
    fn installation_mapping_is_verbatim_when_valid_and_hashed_otherwise() {
        assert_eq!(installation_value("prod-eu"), "prod-eu");
        assert_eq!(
            installation_value("0b6c1a2e-0000-4000-8000-000000000001"),
            "0b6c1a2e-0000-4000-8000-000000000001"
        );
        let cases = [
            "cluster/prod",
            "kube-system:abc",
            "-leading",
            &"x".repeat(64),
            "ünïcødé",
        ];
        for inst in cases {
            let v = installation_value(inst);
            assert!(is_label_value(&v), "{inst:?} -> {v:?}");
            assert!(v.starts_with("sha256-") && v.len() == 7 + 32, "{v}");
            assert_eq!(v, installation_value(inst), "deterministic");
        }
        assert_ne!(installation_value("a/b"), installation_value("a/c"));
        // A fixed vector, so a change of the mapping (which would orphan every server made
        // under the old one) cannot slip through.
        assert_eq!(
            installation_value("cluster/prod"),
            "sha256-2x5dphpyg63fkszwlmxq6gercwdggdzb"
        );
    }

    #[test]
    fn selectors_and_matching() {
        assert_eq!(
            gc_selector("inst-a"),
            "egress.proxy-operator.dev/managed=true,egress.proxy-operator.dev/installation=inst-a"
        );
        let labels = create_labels("uid-1", "cluster/prod", "fsn1").unwrap();
        assert_eq!(labels.len(), 4);
        assert_eq!(labels[MARK_LOCATION], "fsn1");
        assert!(is_gc_match(&labels, "cluster/prod"));
        assert!(!is_gc_match(&labels, "cluster/dev"));
        let mut unmanaged = labels.clone();
        unmanaged.remove(MARK_MANAGED);
        assert!(!is_gc_match(&unmanaged, "cluster/prod"));

        let e = create_labels("not/a/label", "i", "fsn1").unwrap_err();
        assert_eq!(e.code.as_deref(), Some("InvalidUid"));
        assert!(e.message.contains("not/a/label"));
    }

    #[test]
    fn ids_are_parsed_strictly() {
        assert_eq!(parse_id("fsn1/4200001").unwrap(), ("fsn1", 4_200_001));
        assert_eq!(parse_id(&format_id("ash", 7)).unwrap(), ("ash", 7));
        for bad in [
            "",
            "4200001",
            "fsn1/",
            "/4200001",
            "fsn1/42/1",
            "fsn1/0042",
            "fsn1/0",
            "fsn1/+42",
            "fsn1/-42",
            "fsn1/4e3",
            "FSN1/42",
            "fsn 1/42",
            "fsn1/ 42",
            "fsn1/99999999999999999999",
            "../42",
        ] {
            let e = parse_id(bad).unwrap_err();
            assert_eq!(e.class, egress_guest_sdk::ErrorClass::Permanent, "{bad:?}");
            assert_eq!(e.code.as_deref(), Some("InvalidId"), "{bad:?}");
        }
    }
}
