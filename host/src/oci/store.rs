//! Pulling a plugin from its registry into the operator's cache, verified, and serving it
//! from there when the registry is away.
//!
//! The cache holds content by digest, so what it holds is what the registry held when it
//! was pulled, checked again each time it is read:
//!
//! - `manifests/<hex>`: a plugin's manifest;
//! - `plugins/<hex>.wasm`: its component (the layer);
//! - `signatures/<hex>.json`: the cosign signatures found for a manifest, kept so that a
//!   restart verifies offline against the keys configured then;
//! - `pins.json`: each `:tag` reference and the digest it was resolved to the first time.
//!   A tag is never resolved again while its pin is there: a tag moved in the registry
//!   does not change what runs (name the new digest, or a new tag, to upgrade).

use super::client::{Client, ClientError};
use super::manifest::{
    MAX_PAYLOAD_BYTES, MAX_SIGNATURES, Manifest, ManifestError, SIGNATURE_ANNOTATION,
    SIMPLE_SIGNING, Signature, Verdict, digest_of, signature_tag, verify,
};
use egress_plugin_host::config::oci_ref::OciRef;
use egress_plugin_host::config::verify::PublicKey;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

/// A plugin ready to load from the cache.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Pulled {
    /// The component's file in the cache.
    pub path: PathBuf,
    /// The reference pinned to the manifest's digest.
    pub reference: OciRef,
    /// The manifest's digest.
    pub digest: String,
    /// The fingerprint of the key whose signature verified, when keys were asked for.
    pub signed_by: Option<String>,
    /// Nothing was asked of the registry.
    pub from_cache: bool,
}

/// Why a plugin could not be pulled or was refused. Every message names the reference.
#[derive(Debug, thiserror::Error)]
pub enum PullError {
    #[error("plugin {reference}: {source}")]
    Registry {
        reference: String,
        source: ClientError,
    },
    #[error("plugin {reference}: the registry has no manifest {what} (404)")]
    NotFound { reference: String, what: String },
    #[error("plugin {reference}: {source}")]
    Manifest {
        reference: String,
        source: ManifestError,
    },
    #[error("plugin {reference}: refused, {why}")]
    Signature { reference: String, why: String },
    #[error("plugin {reference}: {why}")]
    Setup { reference: String, why: String },
}

impl PullError {
    /// The `reason` label of the reload error metric.
    pub fn reason(&self) -> &'static str {
        match self {
            PullError::Signature { .. } => "signature",
            _ => "pull",
        }
    }
}

/// What every pull needs besides the reference.
pub struct PullOptions<'a> {
    /// The registry's trust (the entry's `tls`).
    pub tls: Arc<rustls::ClientConfig>,
    /// A docker config file with registry credentials; missing: anonymous.
    pub auth_file: Option<&'a Path>,
    pub max_plugin_bytes: u64,
    /// Keys one of which must have signed the manifest; `None`: no signature asked for.
    pub keys: Option<&'a [PublicKey]>,
}

/// The cache of pulled plugins.
pub struct Store {
    dir: PathBuf,
    pins: Mutex<BTreeMap<String, String>>,
}

impl Store {
    /// Opens (creating) the cache at `dir`, with the pins kept there.
    pub fn open(dir: &Path) -> std::io::Result<Store> {
        for sub in ["manifests", "plugins", "signatures"] {
            std::fs::create_dir_all(dir.join(sub))?;
        }
        let pins = std::fs::read(dir.join("pins.json"))
            .ok()
            .and_then(|b| serde_json::from_slice(&b).ok())
            .unwrap_or_default();
        Ok(Store {
            dir: dir.to_path_buf(),
            pins: Mutex::new(pins),
        })
    }

    /// The digest `reference` runs: its own, or its tag's pin; `None` for a tag not resolved
    /// yet. No I/O.
    pub fn resolved(&self, reference: &OciRef) -> Option<String> {
        reference.digest.clone().or_else(|| {
            self.pins
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .get(&reference.to_string())
                .cloned()
        })
    }

    fn pin(&self, reference: &OciRef, digest: &str) {
        let mut pins = self.pins.lock().unwrap_or_else(|e| e.into_inner());
        pins.insert(reference.to_string(), digest.to_string());
        let text = serde_json::to_vec_pretty(&*pins).unwrap_or_default();
        drop(pins);
        if let Err(e) = write_atomic(&self.dir, "pins.json", &text) {
            tracing::warn!(error = %e, "keeping the tag pins in the cache failed; they hold until a restart");
        }
    }

    /// The plugin `reference` names, from the cache when it is there, else from its
    /// registry; verified with `opts.keys` when given.
    pub async fn fetch(
        &self,
        reference: &OciRef,
        opts: &PullOptions<'_>,
    ) -> Result<Pulled, PullError> {
        let name = reference.to_string();
        let setup = |why: String| PullError::Setup {
            reference: name.clone(),
            why,
        };
        let registry_err = |source| PullError::Registry {
            reference: name.clone(),
            source,
        };
        let not_found = |what: &str| PullError::NotFound {
            reference: name.clone(),
            what: what.to_string(),
        };
        let client = Lazy::new(reference, opts);
        let mut from_cache = true;

        let digest = match self.resolved(reference) {
            Some(d) => d,
            None => {
                let tag = reference.tag.as_deref().unwrap_or_default();
                from_cache = false;
                let (bytes, digest) = client
                    .get()
                    .map_err(&setup)?
                    .manifest(&reference.repository, tag)
                    .await
                    .map_err(registry_err)?
                    .ok_or_else(|| not_found(tag))?;
                self.keep(&format!("manifests/{}", hex_of(&digest)), &bytes);
                self.pin(reference, &digest);
                tracing::info!(plugin = %reference, %digest, "tag resolved; pinned to this digest from now on");
                digest
            }
        };
        let pinned = reference.pinned(&digest);
        let manifest_path = format!("manifests/{}", hex_of(&digest));
        let bytes = match self.read_checked(&manifest_path, &digest) {
            Some(b) => b,
            None => {
                from_cache = false;
                let (bytes, _) = client
                    .get()
                    .map_err(&setup)?
                    .manifest(&reference.repository, &digest)
                    .await
                    .map_err(registry_err)?
                    .ok_or_else(|| not_found(&digest))?;
                self.keep(&manifest_path, &bytes);
                bytes
            }
        };
        let manifest_err = |source| PullError::Manifest {
            reference: name.clone(),
            source,
        };
        let manifest = Manifest::parse(&bytes).map_err(manifest_err)?;
        let layer = manifest
            .plugin_layer(opts.max_plugin_bytes)
            .map_err(manifest_err)?;
        let plugin_path = format!("plugins/{}.wasm", hex_of(&layer.digest));
        if self.read_checked(&plugin_path, &layer.digest).is_none() {
            from_cache = false;
            let wasm = client
                .get()
                .map_err(&setup)?
                .blob(
                    &reference.repository,
                    &layer.digest,
                    layer.size,
                    opts.max_plugin_bytes,
                )
                .await
                .map_err(registry_err)?;
            write_atomic(
                &self.dir.join("plugins"),
                &format!("{}.wasm", hex_of(&layer.digest)),
                &wasm,
            )
            .map_err(|e| {
                setup(format!(
                    "keeping it in the cache {}: {e}",
                    self.dir.display()
                ))
            })?;
        }

        let signed_by = match opts.keys {
            None => None,
            Some(keys) => {
                let sig_path = format!("signatures/{}.json", hex_of(&digest));
                let cached: Vec<Signature> = std::fs::read(self.dir.join(&sig_path))
                    .ok()
                    .and_then(|b| serde_json::from_slice(&b).ok())
                    .unwrap_or_default();
                let verdict = match verify(&digest, &cached, keys) {
                    Verdict::Signed(k) => Verdict::Signed(k),
                    Verdict::Refused(_) => {
                        // Signatures may have been added since (a key rotated): ask again.
                        from_cache = false;
                        let found = self
                            .signatures(client.get().map_err(&setup)?, reference, &digest)
                            .await
                            .map_err(registry_err)?;
                        self.keep(&sig_path, &serde_json::to_vec(&found).unwrap_or_default());
                        verify(&digest, &found, keys)
                    }
                };
                match verdict {
                    Verdict::Signed(k) => Some(k),
                    Verdict::Refused(why) => {
                        return Err(PullError::Signature {
                            reference: pinned.to_string(),
                            why,
                        });
                    }
                }
            }
        };
        Ok(Pulled {
            path: self.dir.join(plugin_path),
            reference: pinned,
            digest,
            signed_by,
            from_cache,
        })
    }

    /// The cosign signatures the registry holds for `digest` (none: an empty list).
    async fn signatures(
        &self,
        client: &Client,
        reference: &OciRef,
        digest: &str,
    ) -> Result<Vec<Signature>, ClientError> {
        let Some((bytes, _)) = client
            .manifest(&reference.repository, &signature_tag(digest))
            .await?
        else {
            return Ok(Vec::new());
        };
        let Ok(manifest) = Manifest::parse(&bytes) else {
            return Ok(Vec::new());
        };
        let mut found = Vec::new();
        for layer in manifest
            .layers
            .iter()
            .filter(|l| l.media_type == SIMPLE_SIGNING)
            .take(MAX_SIGNATURES)
        {
            let Some(sig) = layer.annotations.get(SIGNATURE_ANNOTATION) else {
                continue;
            };
            let payload = client
                .blob(
                    &reference.repository,
                    &layer.digest,
                    layer.size,
                    MAX_PAYLOAD_BYTES,
                )
                .await?;
            found.push(Signature {
                payload: data_encoding::BASE64.encode(&payload),
                signature: sig.clone(),
            });
        }
        Ok(found)
    }

    /// `rel`'s content when its digest is `digest` (a damaged file reads as absent).
    fn read_checked(&self, rel: &str, digest: &str) -> Option<Vec<u8>> {
        let bytes = std::fs::read(self.dir.join(rel)).ok()?;
        (digest_of(&bytes) == digest).then_some(bytes)
    }

    /// Keeps `bytes` at `rel`; a failure only costs a later pull.
    fn keep(&self, rel: &str, bytes: &[u8]) {
        let path = self.dir.join(rel);
        let (Some(dir), Some(file)) = (path.parent(), path.file_name()) else {
            return;
        };
        if let Err(e) = write_atomic(dir, &file.to_string_lossy(), bytes) {
            tracing::warn!(file = %path.display(), error = %e, "keeping a registry document in the cache failed");
        }
    }

    /// Removes the plugins, manifests and signatures of digests not in `keep` (manifest
    /// digests), so that the cache holds what serves and nothing older.
    pub fn retain(&self, keep: &[String]) {
        let keep_manifests: Vec<String> = keep.iter().map(|d| hex_of(d).to_string()).collect();
        let mut keep_layers = Vec::new();
        for d in keep {
            if let Some(m) = self
                .read_checked(&format!("manifests/{}", hex_of(d)), d)
                .and_then(|b| Manifest::parse(&b).ok())
                && let Some(l) = m.layers.first()
            {
                keep_layers.push(format!("{}.wasm", hex_of(&l.digest)));
            }
        }
        let pinned: Vec<String> = self
            .pins
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .values()
            .map(|d| hex_of(d).to_string())
            .collect();
        let sweep = |sub: &str, keep: &dyn Fn(&str) -> bool| {
            let Ok(rd) = std::fs::read_dir(self.dir.join(sub)) else {
                return;
            };
            for e in rd.flatten() {
                let name = e.file_name().to_string_lossy().into_owned();
                if !keep(&name) {
                    let _ = std::fs::remove_file(e.path());
                }
            }
        };
        let stem = |n: &str| n.split('.').next().unwrap_or_default().to_string();
        sweep("manifests", &|n| {
            keep_manifests.contains(&stem(n)) || pinned.contains(&stem(n))
        });
        sweep("signatures", &|n| keep_manifests.contains(&stem(n)));
        sweep("plugins", &|n| keep_layers.iter().any(|l| l == n));
    }
}

/// The hex part of `sha256:<hex>` (already checked to be hex).
fn hex_of(digest: &str) -> &str {
    digest.strip_prefix("sha256:").unwrap_or(digest)
}

/// Writes `name` in `dir` through a temporary file and a rename: a reader never sees half
/// a file, and two replicas sharing the directory never mix their writes.
fn write_atomic(dir: &Path, name: &str, bytes: &[u8]) -> std::io::Result<()> {
    use std::io::Write;
    let mut tmp = tempfile::NamedTempFile::new_in(dir)?;
    tmp.write_all(bytes)?;
    tmp.persist(dir.join(name)).map_err(|e| e.error)?;
    Ok(())
}

/// The registry client, made on first use: a pull served from the cache reads no
/// credentials and opens no connection.
struct Lazy<'a> {
    reference: &'a OciRef,
    opts: &'a PullOptions<'a>,
    client: std::sync::OnceLock<Result<Client, String>>,
}

impl<'a> Lazy<'a> {
    fn new(reference: &'a OciRef, opts: &'a PullOptions<'a>) -> Self {
        Lazy {
            reference,
            opts,
            client: std::sync::OnceLock::new(),
        }
    }

    fn get(&self) -> Result<&Client, String> {
        self.client
            .get_or_init(|| {
                let credentials = match self.opts.auth_file {
                    None => None,
                    Some(path) => match read_small(path) {
                        None => None,
                        Some(bytes) => {
                            super::auth::credentials_for(&bytes, &self.reference.registry).map_err(
                                |e| format!("--registry-auth-file {}: {e}", path.display()),
                            )?
                        }
                    },
                };
                Client::new(&self.reference.registry, self.opts.tls.clone(), credentials)
                    .map_err(|e| e.to_string())
            })
            .as_ref()
            .map_err(Clone::clone)
    }
}

/// A credentials file's content; `None` when there is none (an optional Secret not
/// created: anonymous pulls), or it is larger than any docker config.
fn read_small(path: &Path) -> Option<Vec<u8>> {
    let file = std::fs::File::open(path).ok()?;
    let mut bytes = Vec::new();
    std::io::Read::read_to_end(
        &mut std::io::Read::take(file, super::auth::MAX_CONFIG_BYTES),
        &mut bytes,
    )
    .ok()?;
    Some(bytes)
}
