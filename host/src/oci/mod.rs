//! Plugins from an OCI registry: `oci://registry/repository@sha256:...` in the providers
//! file. Pulled as CNCF Wasm OCI artifacts, verified against cosign signatures, kept in the
//! operator's cache (and served from it while the registry is away); pushed and signed by
//! `proxy-operator plugin push` and `plugin sign` for users without oras or cosign.

pub mod auth;
pub mod client;
pub mod manifest;
pub mod store;

use client::{Client, ClientError};
use egress_plugin_host::config::oci_ref::OciRef;
use egress_plugin_host::config::verify::PublicKey;
use manifest::{
    Descriptor, Manifest, OCI_CONFIG, OCI_MANIFEST, SIGNATURE_ANNOTATION, SIMPLE_SIGNING,
    digest_of, signature_tag,
};
use ring::signature::{ECDSA_P256_SHA256_ASN1_SIGNING, EcdsaKeyPair, KeyPair};
use std::collections::BTreeMap;

/// Pushes `wasm` as a plugin artifact to `reference` (its tag, or only its digest when it
/// names none); the manifest's digest.
pub async fn push_plugin(
    client: &Client,
    reference: &OciRef,
    wasm: &[u8],
    imports: &[String],
    annotations: BTreeMap<String, String>,
) -> Result<String, ClientError> {
    let layer = client.push_blob(&reference.repository, wasm).await?;
    let config = manifest::wasm_config(&layer, imports);
    client.push_blob(&reference.repository, &config).await?;
    let bytes = manifest::wasm_manifest(&config, wasm, annotations);
    let digest = digest_of(&bytes);
    let tag = reference.tag.clone().unwrap_or_else(|| digest.clone());
    client
        .push_manifest(&reference.repository, &tag, &bytes)
        .await
}

/// A signing key: an unencrypted PKCS#8 ECDSA P-256 key (`plugin keygen` writes one;
/// `openssl genpkey -algorithm EC -pkeyopt ec_paramgen_curve:P-256` too).
pub struct SigningKey(EcdsaKeyPair);

impl SigningKey {
    pub fn from_pem(pem: &[u8]) -> Result<SigningKey, String> {
        let item = rustls_pemfile::read_one_from_slice(pem)
            .map_err(|_| "is not PEM".to_string())?
            .map(|(item, _)| item);
        let Some(rustls_pemfile::Item::Pkcs8Key(der)) = item else {
            return Err(
                "is not an unencrypted PKCS#8 PRIVATE KEY (for cosign's encrypted keys, sign with cosign itself)"
                    .into(),
            );
        };
        let rng = ring::rand::SystemRandom::new();
        EcdsaKeyPair::from_pkcs8(
            &ECDSA_P256_SHA256_ASN1_SIGNING,
            der.secret_pkcs8_der(),
            &rng,
        )
        .map(SigningKey)
        .map_err(|_| "is not an ECDSA P-256 key".into())
    }

    /// A new key pair: the private key's PEM and the public key.
    pub fn generate() -> (String, PublicKey) {
        let rng = ring::rand::SystemRandom::new();
        let pkcs8 = EcdsaKeyPair::generate_pkcs8(&ECDSA_P256_SHA256_ASN1_SIGNING, &rng)
            .expect("the system RNG works");
        let pair = EcdsaKeyPair::from_pkcs8(&ECDSA_P256_SHA256_ASN1_SIGNING, pkcs8.as_ref(), &rng)
            .expect("a generated key parses");
        let public = PublicKey::from_point(pair.public_key().as_ref()).expect("a P-256 point");
        let b64 = data_encoding::BASE64.encode(pkcs8.as_ref());
        let mut pem = String::from("-----BEGIN PRIVATE KEY-----\n");
        for line in b64.as_bytes().chunks(64) {
            pem.push_str(std::str::from_utf8(line).unwrap_or_default());
            pem.push('\n');
        }
        pem.push_str("-----END PRIVATE KEY-----\n");
        (pem, public)
    }

    pub fn public(&self) -> PublicKey {
        PublicKey::from_point(self.0.public_key().as_ref()).expect("a P-256 point")
    }

    /// Base64 of the DER signature over `payload`, as cosign's annotation holds it.
    pub fn sign(&self, payload: &[u8]) -> String {
        let rng = ring::rand::SystemRandom::new();
        let sig = self
            .0
            .sign(&rng, payload)
            .expect("signing with a valid key");
        data_encoding::BASE64.encode(sig.as_ref())
    }
}

/// Signs the manifest `digest` of `reference`'s repository as cosign does: a simple
/// signing payload added as a layer of the `sha256-<hex>.sig` manifest (created, or
/// extended when other signatures are there).
pub async fn sign(
    client: &Client,
    reference: &OciRef,
    digest: &str,
    key: &SigningKey,
) -> Result<(), ClientError> {
    let repo = &reference.repository;
    let payload = manifest::payload(&format!("{}/{}", reference.registry, repo), digest);
    let signature = key.sign(&payload);
    let payload_digest = client.push_blob(repo, &payload).await?;
    let tag = signature_tag(digest);
    let mut layers = match client.manifest(repo, &tag).await? {
        Some((bytes, _)) => Manifest::parse(&bytes)
            .map(|m| m.layers)
            .unwrap_or_default(),
        None => Vec::new(),
    };
    layers.push(Descriptor {
        media_type: SIMPLE_SIGNING.into(),
        digest: payload_digest,
        size: payload.len() as u64,
        annotations: [(SIGNATURE_ANNOTATION.to_string(), signature)].into(),
    });
    let diff_ids: Vec<&str> = layers.iter().map(|l| l.digest.as_str()).collect();
    let config = serde_json::to_vec(&serde_json::json!({
        "architecture": "", "os": "", "config": {},
        "rootfs": {"type": "layers", "diff_ids": diff_ids},
    }))
    .expect("JSON serializes");
    client.push_blob(repo, &config).await?;
    let m = Manifest {
        schema_version: 2,
        media_type: Some(OCI_MANIFEST.into()),
        config: Descriptor {
            media_type: OCI_CONFIG.into(),
            digest: digest_of(&config),
            size: config.len() as u64,
            annotations: BTreeMap::new(),
        },
        layers,
        annotations: BTreeMap::new(),
    };
    let bytes = serde_json::to_vec(&m).expect("a manifest serializes");
    client.push_manifest(repo, &tag, &bytes).await?;
    Ok(())
}
