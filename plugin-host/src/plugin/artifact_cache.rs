//! On-disk cache of compiled plugins.
//!
//! Compiling a provider takes about half a second; loading its compiled form takes about a
//! millisecond. The cache key is the SHA-256 of the `.wasm` file plus a hash of everything
//! in the engine that affects code generation, so a changed plugin or a new operator build
//! never picks up a stale artifact.
//!
//! A compiled artifact is native code that wasmtime loads without verification, so the
//! cache only accepts a directory that this process's user owns and nobody else can write
//! to, and only ever reads files it wrote there itself (atomically, via rename).

use super::compiler::{CompileError, CompileStats, Compiler};
use sha2::{Digest, Sha256};
use std::hash::{Hash, Hasher};
use std::io::Write;
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use wasmtime::Engine;
use wasmtime::component::Component;

/// How a component was obtained.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CacheOutcome {
    /// Loaded from the cache.
    Hit,
    /// Compiled and written to the cache.
    Miss,
    /// Compiled; no cache configured or it could not be used.
    Uncached,
}

#[derive(Debug, thiserror::Error)]
pub enum CacheError {
    #[error("compile cache directory {dir}: {reason}")]
    Unsafe { dir: PathBuf, reason: String },
    #[error("compile cache directory {dir}: {source}")]
    Io {
        dir: PathBuf,
        source: std::io::Error,
    },
}

#[derive(Debug, Clone)]
pub struct ArtifactCache {
    dir: Option<PathBuf>,
    engine_hash: String,
}

/// Feeds `Hash` output into SHA-256, so the key is stable across processes (unlike
/// `DefaultHasher`, whose algorithm may change between Rust releases).
struct ShaHasher(Sha256);

impl Hasher for ShaHasher {
    fn write(&mut self, bytes: &[u8]) {
        self.0.update(bytes);
    }
    fn finish(&self) -> u64 {
        unreachable!("only the full digest is used")
    }
}

impl ArtifactCache {
    /// Opens (creating if needed) a cache in `dir`, or a disabled cache for `None`.
    pub fn open(engine: &Engine, dir: Option<&Path>) -> Result<Self, CacheError> {
        let mut hasher = ShaHasher(Sha256::new());
        engine.precompile_compatibility_hash().hash(&mut hasher);
        let engine_hash = hex::encode(&hasher.0.finalize()[..16]);
        let Some(dir) = dir else {
            return Ok(ArtifactCache {
                dir: None,
                engine_hash,
            });
        };
        let io = |source| CacheError::Io {
            dir: dir.to_path_buf(),
            source,
        };
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(dir)
            .map_err(io)?;
        let meta = std::fs::symlink_metadata(dir).map_err(io)?;
        let me = std::fs::metadata("/proc/self").map_err(io)?.uid();
        let reason = if !meta.is_dir() {
            Some("is not a directory (or is a symlink)".to_string())
        } else if meta.uid() != me {
            Some(format!(
                "is owned by uid {}, not by this process (uid {me})",
                meta.uid()
            ))
        } else if meta.permissions().mode() & 0o022 != 0 {
            Some(format!(
                "is writable by group or others (mode {:o})",
                meta.permissions().mode() & 0o777
            ))
        } else {
            None
        };
        if let Some(reason) = reason {
            return Err(CacheError::Unsafe {
                dir: dir.to_path_buf(),
                reason,
            });
        }
        Ok(ArtifactCache {
            dir: Some(dir.to_path_buf()),
            engine_hash,
        })
    }

    /// A compiled component for `bytes`, from the cache when possible, else compiled by
    /// `compiler` (and then cached), with what the compile used when it ran in a child.
    pub async fn component(
        &self,
        engine: &Engine,
        compiler: &Compiler,
        bytes: &Arc<[u8]>,
        sha256: &str,
    ) -> Result<(Component, CacheOutcome, Option<CompileStats>), CompileError> {
        let unusable = |e: wasmtime::Error| CompileError::Invalid(format!("{e:#}"));
        let Some(dir) = &self.dir else {
            let (artifact, stats) = compiler.compile(engine, bytes.clone()).await?;
            let component = deserialize(engine, &artifact).map_err(unusable)?;
            return Ok((component, CacheOutcome::Uncached, stats));
        };
        let path = dir.join(format!("{sha256}-{}.cwasm", self.engine_hash));
        if path.is_file() {
            match deserialize_file(engine, &path) {
                Ok(c) => return Ok((c, CacheOutcome::Hit, None)),
                Err(e) => {
                    tracing::warn!(path = %path.display(), error = %e, "ignoring unusable cached plugin artifact")
                }
            }
        }
        let (artifact, stats) = compiler.compile(engine, bytes.clone()).await?;
        match store(dir, &path, &artifact) {
            // Mapped from the file: its code pages are the file's, which the kernel can
            // drop and reread, not anonymous memory of this process.
            Ok(()) => {
                drop(artifact);
                let component = deserialize_file(engine, &path).map_err(unusable)?;
                Ok((component, CacheOutcome::Miss, stats))
            }
            Err(e) => {
                tracing::warn!(dir = %dir.display(), error = %e, "could not write plugin compile cache");
                let component = deserialize(engine, &artifact).map_err(unusable)?;
                Ok((component, CacheOutcome::Uncached, stats))
            }
        }
    }
}

/// SAFETY (of the `unsafe` below): wasmtime loads an artifact's native code unverified.
/// Every artifact here was produced by [`Compiler::compile`], by this process or by a child
/// running this same executable with the same engine options, and cached files sit in a
/// directory only this user can write to (checked in `open`), under names only `store`
/// writes; wasmtime still checks that the artifact fits the engine.
fn deserialize(engine: &Engine, artifact: &[u8]) -> wasmtime::Result<Component> {
    // SAFETY: see above.
    unsafe { Component::deserialize(engine, artifact) }
}

fn deserialize_file(engine: &Engine, path: &Path) -> wasmtime::Result<Component> {
    // SAFETY: see `deserialize`.
    unsafe { Component::deserialize_file(engine, path) }
}

fn store(dir: &Path, path: &Path, artifact: &[u8]) -> std::io::Result<()> {
    let tmp = tempfile::Builder::new()
        .prefix(".partial-")
        .tempfile_in(dir)?;
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .mode(0o600)
        .open(tmp.path())?;
    f.write_all(artifact)?;
    f.sync_all()?;
    tmp.persist(path).map_err(|e| e.error)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn refuses_a_directory_others_can_write() {
        let engine = Engine::default();
        let d = tempfile::tempdir().unwrap();
        std::fs::set_permissions(d.path(), std::fs::Permissions::from_mode(0o777)).unwrap();
        let err = ArtifactCache::open(&engine, Some(d.path()))
            .unwrap_err()
            .to_string();
        assert!(err.contains("writable by group or others"), "{err}");
        std::fs::set_permissions(d.path(), std::fs::Permissions::from_mode(0o700)).unwrap();
        ArtifactCache::open(&engine, Some(d.path())).unwrap();
    }
}
