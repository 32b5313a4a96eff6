//! `verify` and `approved`: what a plugin must prove (a signature) and what it may ask for
//! (hosts, imports) before it loads.
//!
//! Public keys are cosign's: an ECDSA P-256 key as a PEM `PUBLIC KEY` (what
//! `cosign generate-key-pair` writes to `cosign.pub`, and `proxy-operator plugin keygen`
//! too). They are parsed when the providers file is, so a pasted key with a typo is an
//! error naming the entry and the key's position, not a plugin that never verifies.

use serde::Deserialize;

/// `verify: {publicKeys: [...]}`: a plugin from a registry loads only with a signature of
/// one of these keys over its manifest digest.
#[derive(Debug, Clone, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct Verify {
    /// PEM `PUBLIC KEY` blocks (ECDSA P-256), inline.
    pub public_keys: Vec<String>,
}

/// Most keys one `verify` may list: verification tries each against each signature.
pub const MAX_KEYS: usize = 16;

impl Verify {
    /// The parsed keys, or which one is not a key.
    pub fn keys(&self) -> Result<Vec<PublicKey>, KeyError> {
        if self.public_keys.is_empty() {
            return Err(KeyError::None);
        }
        if self.public_keys.len() > MAX_KEYS {
            return Err(KeyError::TooMany(self.public_keys.len()));
        }
        self.public_keys
            .iter()
            .enumerate()
            .map(|(i, pem)| PublicKey::from_pem(pem).map_err(|why| KeyError::Key { index: i, why }))
            .collect()
    }
}

/// `approved: {hosts: [...], imports: [...]}`: what the operator's admin reviewed. A
/// plugin version whose default hosts or imports go beyond it does not load.
#[derive(Debug, Clone, Default, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct Approved {
    /// Default hosts the plugin may declare (`plugin-info.default-hosts`), as it writes them.
    #[serde(default)]
    pub hosts: Vec<String>,
    /// Interfaces the component may import, without their `@version`
    /// (`wasi:http/outgoing-handler`): a toolchain's version bump is not a new permission.
    #[serde(default)]
    pub imports: Vec<String>,
}

/// Most entries of `approved.hosts` or `approved.imports`.
pub const MAX_APPROVED: usize = 256;

/// What a plugin asks for beyond its approval.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Excess {
    pub hosts: Vec<String>,
    pub imports: Vec<String>,
}

impl Excess {
    pub fn is_empty(&self) -> bool {
        self.hosts.is_empty() && self.imports.is_empty()
    }
}

impl std::fmt::Display for Excess {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mut parts = Vec::new();
        if !self.hosts.is_empty() {
            parts.push(format!(
                "default hosts not approved: {}",
                self.hosts.join(", ")
            ));
        }
        if !self.imports.is_empty() {
            parts.push(format!("imports not approved: {}", self.imports.join(", ")));
        }
        f.write_str(&parts.join("; "))
    }
}

/// An interface name without its version: `wasi:http/types@0.2.6` -> `wasi:http/types`.
pub fn unversioned(import: &str) -> &str {
    import.split_once('@').map_or(import, |(name, _)| name)
}

impl Approved {
    /// What `hosts` and `imports` ask for beyond this approval (sorted, deduplicated).
    /// Pure.
    pub fn excess(&self, hosts: &[String], imports: &[String]) -> Excess {
        let approved_imports: std::collections::BTreeSet<&str> =
            self.imports.iter().map(|i| unversioned(i)).collect();
        let hosts: std::collections::BTreeSet<String> = hosts
            .iter()
            .filter(|h| !self.hosts.contains(h))
            .cloned()
            .collect();
        let imports: std::collections::BTreeSet<String> = imports
            .iter()
            .map(|i| unversioned(i))
            .filter(|i| !approved_imports.contains(i))
            .map(String::from)
            .collect();
        Excess {
            hosts: hosts.into_iter().collect(),
            imports: imports.into_iter().collect(),
        }
    }

    /// The approval that covers exactly `hosts` and `imports` (`plugin inspect --approve`).
    pub fn covering(hosts: &[String], imports: &[String]) -> Approved {
        let imports: std::collections::BTreeSet<String> =
            imports.iter().map(|i| unversioned(i).to_string()).collect();
        Approved {
            hosts: hosts.to_vec(),
            imports: imports.into_iter().collect(),
        }
    }
}

/// An ECDSA P-256 public key.
#[derive(Clone, PartialEq, Eq)]
pub struct PublicKey {
    /// The uncompressed point (0x04, X, Y).
    point: [u8; 65],
}

impl std::fmt::Debug for PublicKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "PublicKey({})", self.fingerprint())
    }
}

/// Why a key is refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum KeyError {
    #[error("publicKeys is empty")]
    None,
    #[error("publicKeys lists {0} keys; at most {MAX_KEYS}")]
    TooMany(usize),
    #[error("publicKeys[{index}]: {why}")]
    Key { index: usize, why: &'static str },
}

/// DER of a P-256 SubjectPublicKeyInfo up to its point: SEQUENCE { SEQUENCE { id-ecPublicKey,
/// prime256v1 }, BIT STRING (0 unused bits) }. Every P-256 key has exactly this prefix.
const P256_SPKI_PREFIX: [u8; 26] = [
    0x30, 0x59, 0x30, 0x13, 0x06, 0x07, 0x2a, 0x86, 0x48, 0xce, 0x3d, 0x02, 0x01, 0x06, 0x08, 0x2a,
    0x86, 0x48, 0xce, 0x3d, 0x03, 0x01, 0x07, 0x03, 0x42, 0x00,
];

/// Largest PEM text accepted for one key (a P-256 key is about 180 bytes).
const MAX_PEM: usize = 4096;

impl PublicKey {
    pub fn from_pem(pem: &str) -> Result<Self, &'static str> {
        if pem.len() > MAX_PEM {
            return Err("longer than 4096 bytes; a P-256 public key is about 180");
        }
        let item = rustls_pemfile::read_one_from_slice(pem.as_bytes())
            .map_err(|_| "is not PEM")?
            .map(|(item, _)| item);
        let Some(rustls_pemfile::Item::SubjectPublicKeyInfo(spki)) = item else {
            return Err("is not a PEM PUBLIC KEY block (cosign.pub)");
        };
        Self::from_spki_der(spki.as_ref())
    }

    pub fn from_spki_der(der: &[u8]) -> Result<Self, &'static str> {
        let point = der
            .strip_prefix(&P256_SPKI_PREFIX[..])
            .filter(|p| p.len() == 65 && p[0] == 0x04)
            .ok_or(
                "is not an ECDSA P-256 key (cosign's default; other key types are not supported)",
            )?;
        let mut out = [0; 65];
        out.copy_from_slice(point);
        Ok(PublicKey { point: out })
    }

    /// The point as ring takes it.
    pub fn from_point(point: &[u8]) -> Option<Self> {
        (point.len() == 65 && point[0] == 0x04).then(|| {
            let mut out = [0; 65];
            out.copy_from_slice(point);
            PublicKey { point: out }
        })
    }

    pub fn spki_der(&self) -> Vec<u8> {
        let mut der = P256_SPKI_PREFIX.to_vec();
        der.extend_from_slice(&self.point);
        der
    }

    /// The PEM text (`cosign.pub`'s format).
    pub fn to_pem(&self) -> String {
        let b64 = data_encoding::BASE64.encode(&self.spki_der());
        let mut out = String::from("-----BEGIN PUBLIC KEY-----\n");
        for line in b64.as_bytes().chunks(64) {
            out.push_str(std::str::from_utf8(line).unwrap_or_default());
            out.push('\n');
        }
        out.push_str("-----END PUBLIC KEY-----\n");
        out
    }

    /// `sha256:` and the first 16 hex digits of the key's DER: names a key in messages.
    pub fn fingerprint(&self) -> String {
        use sha2::Digest;
        let d = sha2::Sha256::digest(self.spki_der());
        format!("sha256:{}", &hex::encode(d)[..16])
    }

    /// Whether `signature` (ASN.1 DER ECDSA, as cosign writes it) signs `message` with
    /// SHA-256.
    pub fn verifies(&self, message: &[u8], signature: &[u8]) -> bool {
        ring::signature::UnparsedPublicKey::new(
            &ring::signature::ECDSA_P256_SHA256_ASN1,
            &self.point,
        )
        .verify(message, signature)
        .is_ok()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ring::signature::{ECDSA_P256_SHA256_ASN1_SIGNING, EcdsaKeyPair, KeyPair};

    fn key_pair() -> EcdsaKeyPair {
        let rng = ring::rand::SystemRandom::new();
        let pkcs8 = EcdsaKeyPair::generate_pkcs8(&ECDSA_P256_SHA256_ASN1_SIGNING, &rng).unwrap();
        EcdsaKeyPair::from_pkcs8(&ECDSA_P256_SHA256_ASN1_SIGNING, pkcs8.as_ref(), &rng).unwrap()
    }

    #[test]
    fn a_key_round_trips_through_pem_and_verifies_only_its_own_signatures() {
        let rng = ring::rand::SystemRandom::new();
        let pair = key_pair();
        let key = PublicKey::from_point(pair.public_key().as_ref()).unwrap();
        let parsed = PublicKey::from_pem(&key.to_pem()).unwrap();
        assert_eq!(parsed, key);
        let sig = pair.sign(&rng, b"payload").unwrap();
        assert!(key.verifies(b"payload", sig.as_ref()));
        assert!(!key.verifies(b"payloaD", sig.as_ref()));
        let other = PublicKey::from_point(key_pair().public_key().as_ref()).unwrap();
        assert!(!other.verifies(b"payload", sig.as_ref()));
        assert_ne!(other.fingerprint(), key.fingerprint());
    }

    #[test]
    fn what_is_not_a_p256_public_key_is_refused() {
        // An RSA key's SPKI (2048 bits, from openssl), truncated: the algorithm is wrong.
        let rsa = "-----BEGIN PUBLIC KEY-----\nMIIBIjANBgkqhkiG9w0BAQEFAAOCAQ8AMIIBCgKCAQEAu1SU1LfVLPHCozMxH2Mo\n-----END PUBLIC KEY-----\n";
        assert!(PublicKey::from_pem(rsa).unwrap_err().contains("P-256"));
        assert!(PublicKey::from_pem("hello").unwrap_err().contains("PEM"));
        let cert = "-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n";
        assert!(
            PublicKey::from_pem(cert)
                .unwrap_err()
                .contains("PUBLIC KEY")
        );
        assert!(PublicKey::from_pem(&"A".repeat(5000)).is_err());
        let v = Verify {
            public_keys: vec![key_pem(), "nope".into()],
        };
        assert!(matches!(v.keys(), Err(KeyError::Key { index: 1, .. })));
        assert_eq!(
            Verify {
                public_keys: vec![]
            }
            .keys(),
            Err(KeyError::None)
        );
        let many = Verify {
            public_keys: vec![key_pem(); 17],
        };
        assert_eq!(many.keys(), Err(KeyError::TooMany(17)));
    }

    fn key_pem() -> String {
        PublicKey::from_point(key_pair().public_key().as_ref())
            .unwrap()
            .to_pem()
    }

    #[test]
    fn the_excess_names_what_goes_beyond_the_approval_and_ignores_versions() {
        let approved = Approved {
            hosts: vec!["https://api.example.com".into()],
            imports: vec![
                "wasi:http/outgoing-handler".into(),
                "egress:provider/host@0.2.0".into(),
            ],
        };
        let hosts = vec![
            "https://api.example.com".to_string(),
            "https://exfil.example.net".to_string(),
        ];
        let imports = vec![
            "wasi:http/outgoing-handler@0.2.6".to_string(),
            "egress:provider/host@0.2.1".to_string(),
            "wasi:sockets/tcp@0.2.6".to_string(),
        ];
        let e = approved.excess(&hosts, &imports);
        assert_eq!(e.hosts, ["https://exfil.example.net"]);
        assert_eq!(e.imports, ["wasi:sockets/tcp"]);
        assert_eq!(
            e.to_string(),
            "default hosts not approved: https://exfil.example.net; imports not approved: wasi:sockets/tcp"
        );
        let all = Approved::covering(&hosts, &imports);
        assert!(all.excess(&hosts, &imports).is_empty());
        assert_eq!(all.imports.len(), 3);
    }
}
