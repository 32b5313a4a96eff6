//! What one call's Store holds, and the limits enforced while the guest runs.
//!
//! Every call gets a fresh [`CallState`]: a WASI context with no environment, no arguments,
//! captured stdio and a new `/tmp`; the HTTP hooks with this provider's allow-list; the host
//! API with this provider's config, secrets and cache; and a resource limiter. Nothing in it
//! outlives the call except what the host deliberately shares (the per-provider cache and
//! the set of secret values to redact).

use super::fs::{CountedFsView, FsLimits};
use super::http::HttpHooks;
use super::limits::{LimitHit, Tripwire};
use super::output::CapturedOutput;
use crate::config::Limits;
use crate::redact::Redactor;
use crate::sensitive::Sensitive;
use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use wasmtime::ResourceLimiter;
use wasmtime::component::ResourceTable;
use wasmtime_wasi::{WasiCtx, WasiCtxView, WasiView};
use wasmtime_wasi_http::{WasiHttpCtx, WasiHttpCtxView, WasiHttpView};

/// Per-provider state shared by all its calls.
pub struct ProviderShared {
    pub name: String,
    pub config_json: String,
    pub secrets: BTreeMap<String, PathBuf>,
    pub limits: Limits,
    pub cache: Mutex<KvCache>,
    /// Every secret value handed to this provider and every cloud-init seen for it:
    /// scrubbed from all its output. Outlives reloads (kept by the runtime, per name).
    pub sensitive: Arc<Sensitive>,
    /// What a reply must satisfy to be accepted.
    pub reply_rules: super::reply::Rules,
    /// The providers file's `prices`, which win over the plugin's `quote`.
    pub prices: Vec<crate::config::prices::PriceRule>,
    /// The plugin's answers to `quote`, by placement.
    pub quotes: Mutex<super::quotes::QuoteCache>,
}

/// The small per-provider key-value cache behind `cache-get`/`cache-set`.
pub struct KvCache {
    entries: HashMap<String, (Vec<u8>, Instant)>,
    bytes: usize,
}

impl KvCache {
    const MAX_ENTRIES: usize = 256;
    const MAX_BYTES: usize = 1 << 20;

    pub fn new() -> Self {
        KvCache {
            entries: HashMap::new(),
            bytes: 0,
        }
    }

    pub fn get(&mut self, key: &str, now: Instant) -> Option<Vec<u8>> {
        match self.entries.get(key) {
            Some((v, exp)) if *exp > now => Some(v.clone()),
            Some(_) => {
                self.remove(key);
                None
            }
            None => None,
        }
    }

    pub fn set(&mut self, key: String, value: Vec<u8>, ttl: Duration, now: Instant) {
        self.remove(&key);
        let size = key.len() + value.len();
        if size > Self::MAX_BYTES / 4 || ttl.is_zero() {
            return;
        }
        self.entries.retain(|_, (_, exp)| *exp > now);
        self.bytes = self
            .entries
            .iter()
            .map(|(k, (v, _))| k.len() + v.len())
            .sum();
        while self.entries.len() >= Self::MAX_ENTRIES || self.bytes + size > Self::MAX_BYTES {
            // Evict the entry closest to expiry.
            let Some(victim) = self
                .entries
                .iter()
                .min_by_key(|(_, (_, exp))| *exp)
                .map(|(k, _)| k.clone())
            else {
                break;
            };
            self.remove(&victim);
        }
        self.bytes += size;
        self.entries.insert(key, (value, now + ttl));
    }

    fn remove(&mut self, key: &str) {
        if let Some((v, _)) = self.entries.remove(key) {
            self.bytes -= key.len() + v.len();
        }
    }
}

impl Default for KvCache {
    fn default() -> Self {
        Self::new()
    }
}

/// The Store's data for one call.
pub struct CallState {
    pub(super) wasi: WasiCtx,
    pub(super) http_ctx: WasiHttpCtx,
    pub(super) table: ResourceTable,
    pub(super) hooks: HttpHooks,
    pub(super) limiter: MemoryLimiter,
    pub(super) shared: Arc<ProviderShared>,
    pub(super) redactor: Arc<Redactor>,
    pub(super) log_lines: u32,
    pub(super) log_dropped: u32,
    /// The call's wall clock (its deadline moves back by the time spent waiting for the
    /// request budget).
    pub(super) clock: Arc<super::clock::CallClock>,
    /// `/tmp` quota and open files.
    pub(super) fs: FsLimits,
    /// Which limit stopped the call (shared with the HTTP hooks and the `/tmp` streams).
    pub(super) stop: Arc<Tripwire>,
    pub(super) stdout: CapturedOutput,
    pub(super) stderr: CapturedOutput,
}

impl WasiView for CallState {
    fn ctx(&mut self) -> WasiCtxView<'_> {
        WasiCtxView {
            ctx: &mut self.wasi,
            table: &mut self.table,
        }
    }
}

impl WasiHttpView for CallState {
    fn http(&mut self) -> WasiHttpCtxView<'_> {
        WasiHttpCtxView {
            ctx: &mut self.http_ctx,
            table: &mut self.table,
            hooks: &mut self.hooks,
        }
    }
}

/// Caps linear memory and tables; a refused growth trips the call's [`Tripwire`] so the
/// error names the limit.
///
/// The cap is on the **sum** of every linear memory of the call's instance (a component
/// can hold several core instances, each with its own memory), so `limits.memoryMib` bounds
/// the whole call, not each memory. wasmtime asks the limiter when a memory is created
/// (from 0) and on every growth, so the sum of the differences is the total.
pub struct MemoryLimiter {
    pub max_memory: usize,
    pub stop: Arc<Tripwire>,
    /// Bytes of linear memory of all the instance's memories so far.
    pub total: usize,
    /// Table elements of all the instance's tables so far.
    pub table_elements: usize,
}

impl MemoryLimiter {
    pub fn new(max_memory: usize, stop: Arc<Tripwire>) -> Self {
        MemoryLimiter {
            max_memory,
            stop,
            total: 0,
            table_elements: 0,
        }
    }
}

/// Table elements (function references) one call may hold across all its tables: a Rust
/// plugin needs a few hundred; each costs the host a pointer or two.
pub const MAX_TABLE_ELEMENTS: usize = 65_536;

impl ResourceLimiter for MemoryLimiter {
    fn memory_growing(
        &mut self,
        current: usize,
        desired: usize,
        _max: Option<usize>,
    ) -> wasmtime::Result<bool> {
        let total = self.total.saturating_add(desired.saturating_sub(current));
        if total > self.max_memory {
            self.stop.trip(LimitHit::Memory);
            return Err(wasmtime::format_err!(
                "memory cap reached: growing to {total} bytes in all exceeds limits.memoryMib ({} bytes)",
                self.max_memory
            ));
        }
        self.total = total;
        Ok(true)
    }

    fn table_growing(
        &mut self,
        current: usize,
        desired: usize,
        _max: Option<usize>,
    ) -> wasmtime::Result<bool> {
        let total = self
            .table_elements
            .saturating_add(desired.saturating_sub(current));
        if total > MAX_TABLE_ELEMENTS {
            return Ok(false);
        }
        self.table_elements = total;
        Ok(true)
    }

    fn instances(&self) -> usize {
        64
    }

    fn tables(&self) -> usize {
        64
    }

    fn memories(&self) -> usize {
        16
    }
}

impl CallState {
    /// Called on every epoch tick while the guest runs: stop it if a limit tripped
    /// (possibly outside the Store, in an HTTP future) or its wall-clock deadline passed,
    /// and otherwise let other tasks run.
    pub(super) fn on_tick(&mut self) -> wasmtime::Result<wasmtime::UpdateDeadline> {
        if let Some(hit) = self.stop.hit() {
            return Err(wasmtime::format_err!("limit reached: {hit:?}"));
        }
        if self.clock.expired(Instant::now()) {
            self.stop.trip(if self.clock.is_waiting() {
                LimitHit::Budget
            } else {
                LimitHit::Deadline
            });
            return Err(wasmtime::format_err!("call deadline reached"));
        }
        Ok(wasmtime::UpdateDeadline::Yield(1))
    }

    /// The filesystem view the linker hands `wasi:filesystem/types`: wasmtime-wasi's,
    /// counted against this call's `/tmp` and open-file limits.
    pub(super) fn counted_fs(&mut self) -> CountedFsView<'_> {
        CountedFsView::new(
            wasmtime_wasi::filesystem::WasiFilesystemCtxView {
                ctx: self.wasi.filesystem(),
                table: &mut self.table,
            },
            &mut self.fs,
        )
    }
}

pub(super) use crate::redact::cut as truncate;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kv_cache_expires_and_stays_bounded() {
        let now = Instant::now();
        let mut c = KvCache::new();
        c.set("a".into(), b"1".to_vec(), Duration::from_secs(10), now);
        assert_eq!(c.get("a", now), Some(b"1".to_vec()));
        assert_eq!(c.get("a", now + Duration::from_secs(11)), None);
        for i in 0..1000 {
            c.set(
                format!("k{i}"),
                vec![0; 100],
                Duration::from_secs(60 + i),
                now,
            );
        }
        assert!(c.entries.len() <= KvCache::MAX_ENTRIES);
        assert!(c.bytes <= KvCache::MAX_BYTES);
        // The newest survive.
        assert!(c.get("k999", now).is_some());
        c.set(
            "huge".into(),
            vec![0; KvCache::MAX_BYTES],
            Duration::from_secs(1),
            now,
        );
        assert_eq!(c.get("huge", now), None);
    }

    #[test]
    fn truncate_on_char_boundary() {
        assert_eq!(truncate("abc", 5), "abc");
        assert!(truncate("ééé", 3).starts_with("é…"));
    }
}
