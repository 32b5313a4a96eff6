//! The documents a registry holds for a plugin, and what is accepted of them. Pure.
//!
//! - The plugin is a CNCF Wasm OCI artifact: an OCI image manifest whose config has media
//!   type `application/vnd.wasm.config.v0+json` and whose one layer is the component,
//!   `application/wasm`. Anything else (a container image, a second layer, an unknown
//!   media type) is refused, naming what was found.
//! - A signature is stored as cosign stores it: a manifest tagged `sha256-<hex>.sig` in the
//!   same repository, each layer a "simple signing" payload naming the signed manifest's
//!   digest, its signature in the layer's `dev.cosignproject.cosign/signature` annotation
//!   (base64 DER ECDSA over the payload's bytes).

use egress_plugin_host::config::oci_ref::is_digest;
use egress_plugin_host::config::verify::PublicKey;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

pub const OCI_MANIFEST: &str = "application/vnd.oci.image.manifest.v1+json";
pub const DOCKER_MANIFEST: &str = "application/vnd.docker.distribution.manifest.v2+json";
pub const WASM_CONFIG: &str = "application/vnd.wasm.config.v0+json";
pub const WASM_LAYER: &str = "application/wasm";
pub const OCI_CONFIG: &str = "application/vnd.oci.image.config.v1+json";
pub const SIMPLE_SIGNING: &str = "application/vnd.dev.cosign.simplesigning.v1+json";
pub const SIGNATURE_ANNOTATION: &str = "dev.cosignproject.cosign/signature";
pub const SIGNATURE_TYPE: &str = "cosign container image signature";

/// Largest manifest read (ours are under 1 KiB; the distribution spec suggests 4 MiB as a
/// registry's own limit, far more than a plugin's two descriptors need).
pub const MAX_MANIFEST_BYTES: u64 = 64 * 1024;
/// Largest signature payload read (cosign's are about 250 bytes).
pub const MAX_PAYLOAD_BYTES: u64 = 16 * 1024;
/// Most signatures one artifact's `.sig` manifest may hold that are tried.
pub const MAX_SIGNATURES: usize = 16;

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct Descriptor {
    pub media_type: String,
    pub digest: String,
    pub size: u64,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub annotations: BTreeMap<String, String>,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct Manifest {
    pub schema_version: u32,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub media_type: Option<String>,
    pub config: Descriptor,
    pub layers: Vec<Descriptor>,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub annotations: BTreeMap<String, String>,
}

/// Why a manifest is not a plugin (or not a signature manifest).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ManifestError {
    #[error("the manifest is not JSON of an OCI image manifest: {0}")]
    NotJson(String),
    #[error("the manifest has schemaVersion {0}, not 2")]
    Schema(u32),
    #[error("the manifest's media type is {0:?}, not {OCI_MANIFEST}")]
    MediaType(String),
    #[error(
        "the artifact's config has media type {0:?}, not {WASM_CONFIG}: this is not a Wasm plugin (a container image?)"
    )]
    Config(String),
    #[error("the artifact has {0} layers; a plugin has exactly one, {WASM_LAYER}")]
    LayerCount(usize),
    #[error("the artifact's layer has media type {0:?}, not {WASM_LAYER}")]
    LayerType(String),
    #[error("a descriptor's digest {0:?} is not sha256:<64 hex>")]
    Digest(String),
    #[error(
        "the plugin layer is {size} bytes, more than the largest plugin accepted ({limit} bytes, --max-plugin-bytes)"
    )]
    TooLarge { size: u64, limit: u64 },
}

impl Manifest {
    pub fn parse(bytes: &[u8]) -> Result<Manifest, ManifestError> {
        let m: Manifest =
            serde_json::from_slice(bytes).map_err(|e| ManifestError::NotJson(e.to_string()))?;
        if m.schema_version != 2 {
            return Err(ManifestError::Schema(m.schema_version));
        }
        for d in std::iter::once(&m.config).chain(&m.layers) {
            if !is_digest(&d.digest) {
                return Err(ManifestError::Digest(d.digest.clone()));
            }
        }
        Ok(m)
    }

    /// The plugin layer of a Wasm artifact, after every check: media types, one layer, its
    /// size within `max_bytes`.
    pub fn plugin_layer(&self, max_bytes: u64) -> Result<&Descriptor, ManifestError> {
        if let Some(t) = &self.media_type
            && t != OCI_MANIFEST
        {
            return Err(ManifestError::MediaType(t.clone()));
        }
        if self.config.media_type != WASM_CONFIG {
            return Err(ManifestError::Config(self.config.media_type.clone()));
        }
        let [layer] = &self.layers[..] else {
            return Err(ManifestError::LayerCount(self.layers.len()));
        };
        if layer.media_type != WASM_LAYER {
            return Err(ManifestError::LayerType(layer.media_type.clone()));
        }
        if layer.size > max_bytes {
            return Err(ManifestError::TooLarge {
                size: layer.size,
                limit: max_bytes,
            });
        }
        Ok(layer)
    }
}

/// `sha256:<hex>` of `bytes`.
pub fn digest_of(bytes: &[u8]) -> String {
    use sha2::Digest;
    format!("sha256:{}", hex::encode(sha2::Sha256::digest(bytes)))
}

/// The tag cosign stores `digest`'s signatures under: `sha256-<hex>.sig`.
pub fn signature_tag(digest: &str) -> String {
    format!("{}.sig", digest.replacen(':', "-", 1))
}

/// The config blob of a plugin artifact (the CNCF Wasm OCI artifact's config). No creation
/// time: the same component always makes the same manifest digest.
pub fn wasm_config(layer_digest: &str, imports: &[String]) -> Vec<u8> {
    serde_json::to_vec(&serde_json::json!({
        "architecture": "wasm",
        "os": "wasip2",
        "layerDigests": [layer_digest],
        "component": {"imports": imports, "exports": ["egress:provider/plugin", "egress:provider/provider"]},
    }))
    .expect("a JSON value serializes")
}

/// The manifest of a plugin artifact.
pub fn wasm_manifest(
    config: &[u8],
    layer: &[u8],
    annotations: BTreeMap<String, String>,
) -> Vec<u8> {
    let m = Manifest {
        schema_version: 2,
        media_type: Some(OCI_MANIFEST.into()),
        config: Descriptor {
            media_type: WASM_CONFIG.into(),
            digest: digest_of(config),
            size: config.len() as u64,
            annotations: BTreeMap::new(),
        },
        layers: vec![Descriptor {
            media_type: WASM_LAYER.into(),
            digest: digest_of(layer),
            size: layer.len() as u64,
            annotations: BTreeMap::new(),
        }],
        annotations,
    };
    serde_json::to_vec(&m).expect("a manifest serializes")
}

/// cosign's simple signing payload.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct Payload {
    pub critical: Critical,
    #[serde(default)]
    pub optional: Option<serde_json::Value>,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct Critical {
    pub identity: Identity,
    pub image: Image,
    #[serde(rename = "type")]
    pub type_: String,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct Identity {
    #[serde(rename = "docker-reference")]
    pub docker_reference: String,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct Image {
    #[serde(rename = "docker-manifest-digest")]
    pub docker_manifest_digest: String,
}

/// The payload cosign signs for `digest` in `repository` (`registry/repo`).
pub fn payload(repository: &str, digest: &str) -> Vec<u8> {
    serde_json::to_vec(&Payload {
        critical: Critical {
            identity: Identity {
                docker_reference: repository.into(),
            },
            image: Image {
                docker_manifest_digest: digest.into(),
            },
            type_: SIGNATURE_TYPE.into(),
        },
        optional: None,
    })
    .expect("a payload serializes")
}

/// One signature as the cache keeps it: the payload's bytes and the base64 signature.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct Signature {
    /// The payload, base64.
    pub payload: String,
    /// The annotation's value: base64 of the DER signature.
    pub signature: String,
}

/// What verifying `digest` against `signatures` with `keys` found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// Signed by the key with this fingerprint.
    Signed(String),
    /// No signature verifies: why, for the message (each signature's reason).
    Refused(String),
}

/// Whether one of `signatures` is a valid cosign signature of `digest` by one of `keys`.
/// Pure.
pub fn verify(digest: &str, signatures: &[Signature], keys: &[PublicKey]) -> Verdict {
    if signatures.is_empty() {
        return Verdict::Refused("it is not signed".into());
    }
    let mut why = Vec::new();
    for s in signatures.iter().take(MAX_SIGNATURES) {
        let b64 = data_encoding::BASE64;
        let (Ok(payload), Ok(sig)) = (
            b64.decode(s.payload.as_bytes()),
            b64.decode(s.signature.trim().as_bytes()),
        ) else {
            why.push("a signature that is not base64".to_string());
            continue;
        };
        let parsed: Payload = match serde_json::from_slice(&payload) {
            Ok(p) => p,
            Err(_) => {
                why.push("a payload that is not cosign's simple signing JSON".into());
                continue;
            }
        };
        if parsed.critical.type_ != SIGNATURE_TYPE {
            why.push(format!("a payload of type {:?}", parsed.critical.type_));
            continue;
        }
        if parsed.critical.image.docker_manifest_digest != digest {
            why.push(format!(
                "a signature of another artifact ({})",
                parsed.critical.image.docker_manifest_digest
            ));
            continue;
        }
        match keys.iter().find(|k| k.verifies(&payload, &sig)) {
            Some(k) => return Verdict::Signed(k.fingerprint()),
            None => why.push("a signature by a key not in verify.publicKeys".into()),
        }
    }
    why.dedup();
    let keys: Vec<String> = keys.iter().map(PublicKey::fingerprint).collect();
    Verdict::Refused(format!(
        "no signature verifies with the keys {} (found {})",
        keys.join(", "),
        why.join(", ")
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use ring::signature::{ECDSA_P256_SHA256_ASN1_SIGNING, EcdsaKeyPair, KeyPair};

    const D: &str = "sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";

    fn pair() -> (EcdsaKeyPair, PublicKey) {
        let rng = ring::rand::SystemRandom::new();
        let pkcs8 = EcdsaKeyPair::generate_pkcs8(&ECDSA_P256_SHA256_ASN1_SIGNING, &rng).unwrap();
        let p = EcdsaKeyPair::from_pkcs8(&ECDSA_P256_SHA256_ASN1_SIGNING, pkcs8.as_ref(), &rng)
            .unwrap();
        let k = PublicKey::from_point(p.public_key().as_ref()).unwrap();
        (p, k)
    }

    fn sign(pair: &EcdsaKeyPair, payload: &[u8]) -> Signature {
        let rng = ring::rand::SystemRandom::new();
        Signature {
            payload: data_encoding::BASE64.encode(payload),
            signature: data_encoding::BASE64.encode(pair.sign(&rng, payload).unwrap().as_ref()),
        }
    }

    #[test]
    fn a_plugin_manifest_is_accepted_and_anything_else_refused_by_name() {
        let m = wasm_manifest(b"{}", b"\0asm", BTreeMap::new());
        let parsed = Manifest::parse(&m).unwrap();
        assert_eq!(
            parsed.plugin_layer(1 << 20).unwrap().digest,
            digest_of(b"\0asm")
        );
        assert_eq!(
            parsed.plugin_layer(3),
            Err(ManifestError::TooLarge { size: 4, limit: 3 })
        );
        let edit = |f: &dyn Fn(&mut Manifest)| {
            let mut x = parsed.clone();
            f(&mut x);
            x.plugin_layer(1 << 20).unwrap_err().to_string()
        };
        assert!(edit(&|m| m.config.media_type = OCI_CONFIG.into()).contains("not a Wasm plugin"));
        assert!(edit(&|m| m.layers.push(m.layers[0].clone())).contains("2 layers"));
        assert!(edit(&|m| m.layers.clear()).contains("0 layers"));
        assert!(
            edit(&|m| m.layers[0].media_type = "application/vnd.oci.image.layer.v1.tar".into())
                .contains("vnd.oci.image.layer.v1.tar")
        );
        assert!(edit(&|m| m.media_type = Some(DOCKER_MANIFEST.into())).contains("media type"));
        assert!(matches!(
            Manifest::parse(b"<html>"),
            Err(ManifestError::NotJson(_))
        ));
        let bad_digest = String::from_utf8(m)
            .unwrap()
            .replace(&digest_of(b"\0asm"), "sha256:../../etc");
        assert!(matches!(
            Manifest::parse(bad_digest.as_bytes()),
            Err(ManifestError::Digest(_))
        ));
    }

    #[test]
    fn only_a_signature_of_this_digest_by_a_listed_key_verifies() {
        let (p, k) = pair();
        let (other, other_key) = pair();
        let good = sign(&p, &payload("r/x", D));
        assert_eq!(
            verify(D, std::slice::from_ref(&good), std::slice::from_ref(&k)),
            Verdict::Signed(k.fingerprint())
        );
        // Any listed key will do, and a bad signature next to a good one does not matter.
        assert!(matches!(
            verify(
                D,
                &[sign(&other, b"junk"), good.clone()],
                &[other_key.clone(), k.clone()]
            ),
            Verdict::Signed(_)
        ));
        let refused = |sigs: &[Signature]| match verify(D, sigs, std::slice::from_ref(&k)) {
            Verdict::Refused(why) => why,
            v => panic!("verified: {v:?}"),
        };
        assert_eq!(refused(&[]), "it is not signed");
        assert!(
            refused(&[sign(&other, &payload("r/x", D))]).contains("a key not in verify.publicKeys")
        );
        let other_digest = D.replace("0123", "9999");
        assert!(refused(&[sign(&p, &payload("r/x", &other_digest))]).contains("another artifact"));
        let mut tampered = good.clone();
        tampered.payload = data_encoding::BASE64.encode(&payload("r/y", D));
        assert!(refused(&[tampered]).contains("a key not in"));
        let mut not_b64 = good;
        not_b64.signature = "%%%".into();
        assert!(refused(&[not_b64]).contains("not base64"));
        let typed = serde_json::to_vec(&serde_json::json!({"critical": {"identity": {"docker-reference": "r"}, "image": {"docker-manifest-digest": D}, "type": "other"}})).unwrap();
        assert!(refused(&[sign(&p, &typed)]).contains("of type \"other\""));
    }

    #[test]
    fn the_signature_tag_is_cosigns() {
        assert_eq!(
            signature_tag(D),
            "sha256-0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef.sig"
        );
    }
}
