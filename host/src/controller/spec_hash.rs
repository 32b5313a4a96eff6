//! The spec hash: decides whether the running instance still matches its Proxy.

use crate::api::{Capacity, IpFamily, Placement};
use sha2::{Digest, Sha256};

/// Domain separator and encoding version. Changing the encoding changes every hash, which
/// replaces every instance on upgrade, so it is versioned and covered by known vectors.
const DOMAIN: &[u8] = b"egress.proxy-operator.dev/spec-hash/v1\n";

/// SHA-256, in lowercase hex, over what the instance was built from: the placement, the
/// resolved cloud-init bytes, the port and the address family.
///
/// Deliberately not a hash of the serialized spec: it covers the resolved cloud-init (an
/// edit of the referenced Secret replaces the instance, a switch from inline text to an
/// identical Secret does not), and it must not change when the CRD gains fields or serde
/// changes its output. Each field is length-prefixed, so no two different inputs encode to
/// the same bytes. The provider name is left out: it is immutable.
///
/// The family and the capacity are hashed only when they are not the default: a Proxy from
/// before `ipFamily` and `capacity` existed keeps its hash, so an upgrade replaces nothing.
/// Each appends a tagged line after the fixed-length port, so no two of the four
/// combinations encode to the same bytes.
pub fn spec_hash(placement: &Placement, cloud_init: &[u8], port: u16, family: IpFamily) -> String {
    let mut h = Sha256::new();
    h.update(DOMAIN);
    for field in [
        placement.region.as_bytes(),
        placement.zone.as_bytes(),
        placement.machine_type.as_bytes(),
        placement.image.as_bytes(),
        cloud_init,
    ] {
        h.update((field.len() as u64).to_be_bytes());
        h.update(field);
    }
    h.update(port.to_be_bytes());
    if family == IpFamily::IPv6 {
        h.update(b"\nipFamily=IPv6");
    }
    if placement.capacity == Capacity::Spot {
        h.update(b"\ncapacity=Spot");
    }
    hex::encode(h.finalize())
}

/// Domain separator of [`keyed`].
const KEYED_DOMAIN: &[u8] = b"egress.proxy-operator.dev/spec-hash/keyed/v1\n";

/// The spec hash of a cloud-init that carries credentials, bound to `key` (the UID of the
/// Secret holding them) before it goes into the status.
///
/// Why: the status is readable by everyone who may read the Proxy, and the template is in
/// its spec, so an unkeyed hash of the rendered bytes would let them test guesses of a
/// weak password (one a user put in their own Secret) offline. Bound to the Secret's UID,
/// which only those who may read the Secret (and so the password anyway) can see, the hash
/// confirms nothing. Generated passwords (190 bits) could not be guessed either way.
/// Recreating the Secret changes its UID and so replaces the instance, like an edit does.
pub fn keyed(spec_hash: &str, key: &str) -> String {
    let mut h = Sha256::new();
    h.update(KEYED_DOMAIN);
    h.update((key.len() as u64).to_be_bytes());
    h.update(key.as_bytes());
    h.update(spec_hash.as_bytes());
    hex::encode(h.finalize())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keyed_hashes_depend_on_the_key_and_the_hash() {
        let a = keyed("h1", "uid-1");
        assert_eq!(a.len(), 64);
        assert_eq!(a, keyed("h1", "uid-1"));
        assert_ne!(a, keyed("h1", "uid-2"));
        assert_ne!(a, keyed("h2", "uid-1"));
        assert_ne!(a, "h1");
        // Moving bytes between key and hash must not collide.
        assert_ne!(keyed("1h", "uid-"), keyed("h", "uid-1"));
    }

    fn placement(region: &str, zone: &str, machine_type: &str, image: &str) -> Placement {
        Placement::new(region, zone, machine_type, image)
    }

    fn spot(region: &str, zone: &str, machine_type: &str, image: &str) -> Placement {
        Placement {
            capacity: Capacity::Spot,
            ..placement(region, zone, machine_type, image)
        }
    }

    /// Computed independently (Python: hashlib + struct.pack(">Q"/">H")), so a change of the
    /// encoding cannot go unnoticed: it would replace every instance in every cluster.
    #[test]
    fn known_vectors() {
        let ci = &b"#cloud-config\npackages: [tinyproxy]\n"[..];
        for (p, ci, port, family, want) in [
            (
                placement("", "", "", ""),
                &b""[..],
                1,
                IpFamily::IPv4,
                "44e581b2e84385a57c0751743c4da4e1b50513d9ecb0408508d8c35494600d80",
            ),
            (
                placement("eu-central", "fsn1", "cx22", "debian-12"),
                ci,
                3128,
                IpFamily::IPv4,
                "f232c86732b95dddd2dcb284626969ecadda061cb97c6ccc8730510a181e9620",
            ),
            // The same bytes and `\nipFamily=IPv6` after them.
            (
                placement("eu-central", "fsn1", "cx22", "debian-12"),
                ci,
                3128,
                IpFamily::IPv6,
                "21a5d5a52e2aba052e99c39479ef18b4d354d4910c265c3ded94910eb6e60804",
            ),
            // `\ncapacity=Spot`.
            (
                spot("eu-central", "fsn1", "cx22", "debian-12"),
                ci,
                3128,
                IpFamily::IPv4,
                "78891f0125316e3f113ae569eafe396d9a1b0c6024972aeafc268eb4448b61bf",
            ),
            // Both.
            (
                spot("eu-central", "fsn1", "cx22", "debian-12"),
                ci,
                3128,
                IpFamily::IPv6,
                "de75295d7b785c991e1bb181c41ab4b69b531ed9c4df9b0123b76cc6ad9cc64c",
            ),
        ] {
            assert_eq!(spec_hash(&p, ci, port, family), want);
        }
    }

    #[test]
    fn every_input_matters_and_boundaries_are_unambiguous() {
        let base = placement("r", "z", "m", "i");
        let h = spec_hash(&base, b"ci", 3128, IpFamily::IPv4);
        let variants = [
            spec_hash(&placement("r2", "z", "m", "i"), b"ci", 3128, IpFamily::IPv4),
            spec_hash(&placement("r", "z2", "m", "i"), b"ci", 3128, IpFamily::IPv4),
            spec_hash(&placement("r", "z", "m2", "i"), b"ci", 3128, IpFamily::IPv4),
            spec_hash(&placement("r", "z", "m", "i2"), b"ci", 3128, IpFamily::IPv4),
            spec_hash(&base, b"ci2", 3128, IpFamily::IPv4),
            spec_hash(&base, b"ci", 3129, IpFamily::IPv4),
            spec_hash(&base, b"ci", 3128, IpFamily::IPv6),
            spec_hash(&spot("r", "z", "m", "i"), b"ci", 3128, IpFamily::IPv4),
            spec_hash(&spot("r", "z", "m", "i"), b"ci", 3128, IpFamily::IPv6),
            // Moving bytes across a field boundary must not collide.
            spec_hash(&placement("rz", "", "m", "i"), b"ci", 3128, IpFamily::IPv4),
            spec_hash(&placement("r", "z", "m", "ic"), b"i", 3128, IpFamily::IPv4),
        ];
        for (i, v) in variants.iter().enumerate() {
            assert_ne!(&h, v, "variant {i}");
        }
        assert_eq!(
            h,
            spec_hash(&base, b"ci", 3128, IpFamily::IPv4),
            "deterministic"
        );
        assert_eq!(h.len(), 64);
    }
}
