//! Does a providers file fit the pod? Pure arithmetic over the per-call limits, checked at
//! start, on every reload and by `proxy-operator providers`.
//!
//! Every provider may run `limits.concurrency` calls at once, and each call may use up to
//! `limits.memoryMib` of linear memory plus what the host holds for it (see
//! [`Limits::host_bytes_per_call`]), and up to `limits.tmpMib` of `/tmp`. Loading a plugin or
//! a provider (`info`, `validate-config`) runs one more call at a time, next to the
//! providers that keep serving. The sum must fit what the pod has:
//!
//! - memory: the pod's memory limit minus what the operator itself needs (the reserve);
//! - scratch: the `/tmp` volume, which also holds the compiled-plugin cache.
//!
//! A check that cannot know a budget (no memory limit, no scratch size) is skipped: the
//! caller says so in the log.

use super::{Limits, ProvidersFile};
use std::collections::BTreeSet;
use std::fmt;

pub const KIB: u64 = 1 << 10;
pub const MIB: u64 = 1 << 20;

/// Largest chunk of an outgoing request body the host takes from the guest at once (the
/// `wasi:http` output stream's write budget); one per request in flight.
pub const OUTGOING_BODY_CHUNK_BYTES: u64 = 64 * KIB;

/// Response bytes the host may hold for one request in flight before the guest reads them:
/// the TLS and HTTP/1 read buffers and the body frames queued in the `wasi:http` stream.
pub const RESPONSE_BUFFER_BYTES: u64 = 512 * KIB;

/// What one kept-alive connection idle in a provider's pool (`limits.http.maxIdle`) may
/// hold: hyper's HTTP/1 read and write buffers and rustls' record buffers, which keep the
/// capacity the largest response on that connection made them grow to. Bounded by the
/// same figure as a request's response buffers in flight ([`RESPONSE_BUFFER_BYTES`]).
/// Measured (`plugin::http::tests::an_idle_connection_holds_less_than_the_fit_counts`, each
/// connection idle after a 4 MiB response, its TLS state, buffers and driver task): 434 KiB
/// for an HTTP/1.1 connection over TLS, 67 KiB for an HTTP/2 one.
pub const IDLE_CONNECTION_BYTES: u64 = RESPONSE_BUFFER_BYTES;

/// A provider's TLS session cache (resumption tickets, rustls' in-memory store: a few
/// server names, each with a handful of TLS 1.3 tickets and the certificate chain they
/// were issued with).
pub const TLS_SESSION_CACHE_BYTES: u64 = 256 * KIB;

/// Host memory every call costs whatever the plugin does: the Store and its instances
/// (vmctx, tables, the WASI and HTTP contexts, the redactor), and the async stack the guest
/// runs on, which wasm frames may fill up to 1 MiB (`max_wasm_stack`). Measured: about
/// 0.1 MiB per Store (32 calls of the hostile test plugin parked in a clock wait, pooling
/// allocator: RSS +3.0 MiB), so 1 MiB of stack plus 1 MiB covers it with margin.
pub const STORE_OVERHEAD_BYTES: u64 = 2 * MIB;

/// Most a plugin can make the host copy out of its sandbox at once: one reply, or the
/// arguments of one host call (a log line, a cache value, a header list, a file write).
/// wasmtime copies strings and lists into host memory before any rule here sees them, and
/// a list can point each of its strings at the same guest bytes, so without this bound a
/// plugin with 64 KiB of memory made the host allocate over 100 MB for one reply.
/// Enforced as the Store's hostcall fuel (`Store::set_hostcall_fuel`), which counts every
/// string's bytes and every list element's host size; past it the call fails, naming
/// this bound. Counted once per call in the pod's memory fit
/// ([`crate::config::Limits::host_bytes_per_call`], as [`LIFT_BYTES`]). 3 MiB holds a `list-by-tag` of
/// 10,000 instances with IDs of up to 64 bytes (the 10,000-Proxy scale run's list) in
/// either contract version.
pub const MAX_LIFT_BYTES: usize = 3 << 20;

/// [`MAX_LIFT_BYTES`] in the fit's unit.
pub const LIFT_BYTES: u64 = MAX_LIFT_BYTES as u64;

/// `/tmp` room kept for the compile cache, per plugin file the providers file names. The
/// cache writes one artifact (`*.cwasm`) per plugin version; measured for the shipped
/// plugins: hetzner.wasm 310 KiB -> 1.05 MiB, ec2.wasm 336 KiB -> 1.16 MiB. 4 MiB each
/// leaves room for the artifact of the running version and of one update next to it.
pub const COMPILE_CACHE_BYTES_PER_PLUGIN: u64 = 4 * MIB;

/// `/tmp` room kept for the plugin store, per `oci://` plugin the providers file names:
/// the store keeps the component of the version serving and of one being pulled next to
/// it (the shipped plugins are 190-410 KiB), its manifest and signatures (a few KiB).
pub const STORE_BYTES_PER_PLUGIN: u64 = MIB;

/// Calls that load a plugin or a provider (`info`, `validate-config`) run one at a time
/// (the plugin runtime's load slots: as many as this), next to the providers already
/// serving.
pub const LOAD_SLOTS: u64 = 1;

impl Limits {
    /// Host memory one call may hold outside its linear memory, in bytes: the worst case
    /// that the per-call limits allow.
    ///
    /// - `handles x http.maxHeaderBytes`: `wasi:http` header fields live in the host, and
    ///   every resource-table entry the call holds could be one of up to maxHeaderBytes;
    /// - `http.maxInFlight x (64 KiB + 512 KiB)`: per outgoing request in flight, one body
    ///   chunk taken from the guest ([`OUTGOING_BODY_CHUNK_BYTES`]) and the response bytes
    ///   buffered ahead of the guest ([`RESPONSE_BUFFER_BYTES`]);
    /// - `2 x logLines x logLineBytes`: captured stdout and stderr;
    /// - [`STORE_OVERHEAD_BYTES`]: the Store, its instances and its stack;
    /// - [`LIFT_BYTES`]: a reply, or one host call's arguments, copied out of the guest
    ///   before they are checked (one at a time: a call runs one host call or returns once).
    pub fn host_bytes_per_call(&self) -> u64 {
        u64::from(self.handles) * u64::from(self.http.max_header_bytes)
            + u64::from(self.http.max_in_flight)
                * (OUTGOING_BODY_CHUNK_BYTES + RESPONSE_BUFFER_BYTES)
            + 2 * u64::from(self.log_lines) * u64::from(self.log_line_bytes)
            + STORE_OVERHEAD_BYTES
            + LIFT_BYTES
    }

    /// Everything one call may hold: `memoryMib` of linear memory plus the host side.
    pub fn memory_bytes_per_call(&self) -> u64 {
        (u64::from(self.memory_mib) << 20) + self.host_bytes_per_call()
    }

    /// Host memory a provider holds between its calls: its idle kept-alive connections
    /// (`http.maxIdle x` [`IDLE_CONNECTION_BYTES`]) and its TLS session cache
    /// ([`TLS_SESSION_CACHE_BYTES`]).
    pub fn pool_bytes(&self) -> u64 {
        u64::from(self.http.max_idle) * IDLE_CONNECTION_BYTES + TLS_SESSION_CACHE_BYTES
    }

    /// `/tmp` one call may fill.
    pub fn tmp_bytes_per_call(&self) -> u64 {
        u64::from(self.tmp_mib) << 20
    }
}

/// What the pod gives the sandboxes. `None`: not known, that part is not checked.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct PodResources {
    /// The pod's (the process's cgroup's) memory limit.
    pub memory_bytes: Option<u64>,
    /// What the operator needs for itself; taken off `memory_bytes`.
    pub reserve_bytes: u64,
    /// Size of the filesystem holding the per-call `/tmp` directories and the compile cache.
    pub scratch_bytes: Option<u64>,
    /// The process's open-file limit (soft `RLIMIT_NOFILE`, after raising it at start):
    /// the plugins' worst case plus the operator's own reserve must fit
    /// ([`super::descriptors::check_descriptor_budget`]).
    pub descriptors: Option<u64>,
}

/// One provider's share of a need, for the message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Part {
    /// Provider name, or what the part is (`load-time calls`, `compile cache`).
    pub who: String,
    /// How it is computed, in the providers file's words.
    pub how: String,
    pub bytes: u64,
}

impl fmt::Display for Part {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {} = {}", self.who, self.how, Mib(self.bytes))
    }
}

/// The parts of a need, `; `-separated.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Parts(pub Vec<Part>);

impl fmt::Display for Parts {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, p) in self.0.iter().enumerate() {
            if i > 0 {
                f.write_str("; ")?;
            }
            write!(f, "{p}")?;
        }
        Ok(())
    }
}

impl Parts {
    pub fn total(&self) -> u64 {
        self.0.iter().map(|p| p.bytes).sum()
    }
}

/// Bytes as MiB: whole when exact, else one decimal, rounded up (a need never looks smaller
/// than it is).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Mib(pub u64);

impl fmt::Display for Mib {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.0.is_multiple_of(MIB) {
            write!(f, "{} MiB", self.0 / MIB)
        } else {
            let tenths = self.0.saturating_mul(10).div_ceil(MIB);
            write!(f, "{}.{} MiB", tenths / 10, tenths % 10)
        }
    }
}

/// Why a providers file does not fit the pod. Names the providers, the fields and the
/// numbers, and what to change.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FitError {
    #[error(
        "providers need up to {} of sandbox memory ({parts}) but the pod's memory limit {} minus the operator's reserve {} leaves {}: lower limits.concurrency or limits.memoryMib, or raise the pod's memory limit",
        Mib(parts.total()), Mib(*limit), Mib(*reserve), Mib(limit.saturating_sub(*reserve))
    )]
    Memory {
        parts: Parts,
        limit: u64,
        reserve: u64,
    },
    #[error(
        "providers need up to {} of /tmp ({parts}) but the scratch space is {}: lower limits.concurrency or limits.tmpMib, or raise the /tmp volume's sizeLimit (and --scratch-limit)",
        Mib(parts.total()), Mib(*limit)
    )]
    Scratch { parts: Parts, limit: u64 },
    #[error("{0}")]
    Descriptors(String),
    #[error("{memory}; and {scratch}")]
    Both {
        memory: Box<FitError>,
        scratch: Box<FitError>,
    },
}

/// The memory limit of a plugin compile child (`RLIMIT_DATA`, see
/// `plugin::compiler::CompileLimits`): `requested` (`--plugin-compile-memory`), but never
/// more than the pod's memory limit minus the operator's reserve, all the sandboxes could
/// ever have. The compile is not a term of the need: it runs in place of nothing, next to
/// the providers, and is the OOM killer's first choice in the pod (`oom_score_adj` 1000),
/// so a pod that runs out of memory during a compile loses the compile (that plugin fails,
/// naming the pod's memory), never the operator or a call. `(limit, capped)`: `capped`
/// when the pod's budget lowered it.
pub fn compile_memory(budget: &PodResources, requested: u64) -> (u64, bool) {
    match budget.memory_bytes {
        Some(limit) => {
            let room = limit.saturating_sub(budget.reserve_bytes);
            if room < requested {
                (room, true)
            } else {
                (requested, false)
            }
        }
        None => (requested, false),
    }
}

/// What a file needs, for the log when it fits.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Need {
    pub memory: Parts,
    pub scratch: Parts,
}

/// The worst-case memory of a providers file: every provider at full concurrency, plus the
/// load-time calls.
pub fn memory_need(file: &ProvidersFile) -> Parts {
    let mut parts: Vec<Part> = file
        .providers
        .iter()
        .map(|p| {
            let l = &p.limits;
            Part {
                who: p.name.clone(),
                how: format!(
                    "limits.concurrency {} x (limits.memoryMib {} + {} host-side) + {} of kept-alive connections (limits.http.maxIdle {}) and TLS sessions",
                    l.concurrency,
                    l.memory_mib,
                    Mib(l.host_bytes_per_call()),
                    Mib(l.pool_bytes()),
                    l.http.max_idle
                ),
                bytes: u64::from(l.concurrency) * l.memory_bytes_per_call() + l.pool_bytes(),
            }
        })
        .collect();
    // `info` runs with the default limits, `validate-config` with the entry's.
    let load = load_time_limits(file, Limits::memory_bytes_per_call);
    parts.push(Part {
        who: "load-time calls (info, validate-config)".into(),
        how: format!(
            "{LOAD_SLOTS} x (memoryMib {} + {} host-side)",
            load.memory_mib,
            Mib(load.host_bytes_per_call())
        ),
        bytes: LOAD_SLOTS * load.memory_bytes_per_call(),
    });
    Parts(parts)
}

/// The worst-case `/tmp` use of a providers file: every provider at full concurrency, the
/// load-time calls, and the compile cache.
pub fn scratch_need(file: &ProvidersFile) -> Parts {
    let mut parts: Vec<Part> = file
        .providers
        .iter()
        .map(|p| {
            let l = &p.limits;
            Part {
                who: p.name.clone(),
                how: format!(
                    "limits.concurrency {} x limits.tmpMib {}",
                    l.concurrency, l.tmp_mib
                ),
                bytes: u64::from(l.concurrency) * l.tmp_bytes_per_call(),
            }
        })
        .collect();
    let load = load_time_limits(file, Limits::tmp_bytes_per_call);
    parts.push(Part {
        who: "load-time calls".into(),
        how: format!("{LOAD_SLOTS} x tmpMib {}", load.tmp_mib),
        bytes: LOAD_SLOTS * load.tmp_bytes_per_call(),
    });
    let plugins: BTreeSet<&str> = file.providers.iter().map(|p| p.plugin.as_str()).collect();
    parts.push(Part {
        who: "compile cache".into(),
        how: format!(
            "{} plugin file(s) x {}",
            plugins.len(),
            Mib(COMPILE_CACHE_BYTES_PER_PLUGIN)
        ),
        bytes: plugins.len() as u64 * COMPILE_CACHE_BYTES_PER_PLUGIN,
    });
    let pulled = plugins
        .iter()
        .filter(|p| super::oci_ref::OciRef::is_oci(p))
        .count() as u64;
    if pulled > 0 {
        parts.push(Part {
            who: "plugin store".into(),
            how: format!(
                "{pulled} oci:// plugin(s) x {}",
                Mib(STORE_BYTES_PER_PLUGIN)
            ),
            bytes: pulled * STORE_BYTES_PER_PLUGIN,
        });
    }
    Parts(parts)
}

/// The limits of the largest load-time call by `size`: `info` runs with the defaults,
/// `validate-config` with each entry's limits.
fn load_time_limits(file: &ProvidersFile, size: fn(&Limits) -> u64) -> Limits {
    let default = Limits::default();
    file.providers
        .iter()
        .map(|p| &p.limits)
        .chain(std::iter::once(&default))
        .max_by_key(|l| size(l))
        .cloned()
        .unwrap_or_default()
}

/// Checks `file` against `budget`; `Ok` carries the needs (for the log). A part of the
/// budget that is `None` is not checked.
pub fn check(file: &ProvidersFile, budget: &PodResources) -> Result<Need, FitError> {
    let need = Need {
        memory: memory_need(file),
        scratch: scratch_need(file),
    };
    let memory = budget.memory_bytes.and_then(|limit| {
        (need.memory.total() > limit.saturating_sub(budget.reserve_bytes)).then(|| {
            FitError::Memory {
                parts: need.memory.clone(),
                limit,
                reserve: budget.reserve_bytes,
            }
        })
    });
    let scratch = budget.scratch_bytes.and_then(|limit| {
        (need.scratch.total() > limit).then(|| FitError::Scratch {
            parts: need.scratch.clone(),
            limit,
        })
    });
    match (memory, scratch) {
        (None, None) => match budget.descriptors {
            Some(nofile) => super::descriptors::check_descriptor_budget(file, nofile)
                .map(|()| need)
                .map_err(FitError::Descriptors),
            None => Ok(need),
        },
        (Some(e), None) | (None, Some(e)) => Err(e),
        (Some(m), Some(s)) => Err(FitError::Both {
            memory: Box::new(m),
            scratch: Box::new(s),
        }),
    }
}

/// What the pod has left once every provider's own calls, the load-time call and the
/// operator's reserve are counted: the room that providers borrow further calls from, one
/// call's worst case at a time (`plugin::headroom`). `None` where the budget is not known.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct LeftOver {
    pub memory: Option<u64>,
    pub scratch: Option<u64>,
    pub descriptors: Option<u64>,
}

/// The [`LeftOver`] of `file` in `budget`: zero, not negative, for a part that does not fit
/// (such a file is refused by [`check`] anyway).
pub fn left_over(file: &ProvidersFile, budget: &PodResources) -> LeftOver {
    LeftOver {
        memory: budget.memory_bytes.map(|limit| {
            limit
                .saturating_sub(budget.reserve_bytes)
                .saturating_sub(memory_need(file).total())
        }),
        scratch: budget
            .scratch_bytes
            .map(|limit| limit.saturating_sub(scratch_need(file).total())),
        descriptors: budget.descriptors.map(|nofile| {
            nofile
                .saturating_sub(crate::fdlimit::OPERATOR_FD_RESERVE)
                .saturating_sub(super::descriptors::plugin_descriptors(file))
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn file(yaml: &str) -> ProvidersFile {
        ProvidersFile::parse(yaml).unwrap()
    }

    const TWO: &str = "
providers:
  - name: hetzner
    plugin: hetzner.wasm
  - name: aws
    plugin: ec2.wasm
";

    #[test]
    fn host_bytes_per_call_adds_up_the_documented_terms() {
        let l = Limits {
            handles: 100,
            log_lines: 10,
            log_line_bytes: 100,
            ..Limits::default()
        };
        let mut want = 100 * u64::from(l.http.max_header_bytes);
        want += u64::from(l.http.max_in_flight) * (64 + 512) * KIB;
        want += 2 * 10 * 100;
        want += STORE_OVERHEAD_BYTES;
        want += LIFT_BYTES;
        assert_eq!(l.host_bytes_per_call(), want);
        assert_eq!(
            l.memory_bytes_per_call(),
            (u64::from(l.memory_mib) << 20) + want
        );
    }

    #[test]
    fn mib_is_exact_or_rounded_up() {
        for (bytes, text) in [
            (0, "0 MiB"),
            (MIB, "1 MiB"),
            (352 * MIB, "352 MiB"),
            (MIB + 1, "1.1 MiB"),
            (MIB + MIB / 2, "1.5 MiB"),
            (12 * MIB - 1, "12.0 MiB"),
        ] {
            assert_eq!(Mib(bytes).to_string(), text, "{bytes}");
        }
    }

    #[test]
    fn table() {
        let per_call = Limits::default().memory_bytes_per_call();
        // 2 providers x 2 calls + their pools, and 1 load-time call.
        let default_need = 5 * per_call + 2 * Limits::default().pool_bytes();
        let big = "
providers:
  - name: hetzner
    plugin: hetzner.wasm
    limits: {memoryMib: 512, concurrency: 8}
  - name: aws
    plugin: ec2.wasm
";
        let tmp = "
providers:
  - name: hetzner
    plugin: hetzner.wasm
    limits: {tmpMib: 16, concurrency: 8}
";
        let pulled = "
providers:
  - name: a
    plugin: oci://registry.example/egress/a:v1
    limits: {tmpMib: 8, concurrency: 4}
  - name: b
    plugin: oci://registry.example/egress/a:v1
  - name: c
    plugin: oci://registry.example/egress/c@sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef
";
        /// (case, file, budget, Ok or the substrings of the error)
        type Case<'a> = (&'a str, &'a str, PodResources, Result<(), Vec<&'a str>>);
        let cases: Vec<Case> = vec![
            ("nothing known", big, PodResources::default(), Ok(())),
            (
                "defaults fit 328 MiB minus 96",
                TWO,
                PodResources {
                    memory_bytes: Some(328 * MIB),
                    reserve_bytes: 96 * MIB,
                    scratch_bytes: Some(64 * MIB),
                    descriptors: None,
                },
                Ok(()),
            ),
            (
                "defaults within a 1024-descriptor process",
                TWO,
                PodResources {
                    descriptors: Some(1024 + 2 * (2 * (32 + 4 + 1) + 4)),
                    ..PodResources::default()
                },
                Ok(()),
            ),
            (
                "descriptors short",
                TWO,
                PodResources {
                    descriptors: Some(1024 + 2 * (2 * (32 + 4 + 1) + 4) - 1),
                    ..PodResources::default()
                },
                Err(vec![
                    "limits.concurrency x (limits.openFiles + limits.http.maxInFlight + 1) + limits.http.maxIdle is 156",
                    "RLIMIT_NOFILE",
                ]),
            ),
            (
                "exactly enough",
                TWO,
                PodResources {
                    memory_bytes: Some(default_need + 10),
                    reserve_bytes: 10,
                    scratch_bytes: None,
                    descriptors: None,
                },
                Ok(()),
            ),
            (
                "one byte short",
                TWO,
                PodResources {
                    memory_bytes: Some(default_need + 9),
                    reserve_bytes: 10,
                    scratch_bytes: None,
                    descriptors: None,
                },
                Err(vec!["sandbox memory", "hetzner: limits.concurrency 2 x"]),
            ),
            (
                "memoryMib 512 x concurrency 8",
                big,
                PodResources {
                    memory_bytes: Some(328 * MIB),
                    reserve_bytes: 96 * MIB,
                    scratch_bytes: Some(64 * MIB),
                    descriptors: None,
                },
                Err(vec![
                    "hetzner: limits.concurrency 8 x (limits.memoryMib 512 + ",
                    "aws: limits.concurrency 2 x (limits.memoryMib 32 + ",
                    "load-time calls (info, validate-config): 1 x (memoryMib 512 + ",
                    "the pod's memory limit 328 MiB minus the operator's reserve 96 MiB leaves 232 MiB",
                    "lower limits.concurrency or limits.memoryMib, or raise the pod's memory limit",
                ]),
            ),
            (
                "reserve above the limit",
                TWO,
                PodResources {
                    memory_bytes: Some(64 * MIB),
                    reserve_bytes: 96 * MIB,
                    scratch_bytes: None,
                    descriptors: None,
                },
                Err(vec!["leaves 0 MiB"]),
            ),
            (
                "tmpMib 16 x concurrency 8 against 64 MiB",
                tmp,
                PodResources {
                    memory_bytes: None,
                    reserve_bytes: 0,
                    scratch_bytes: Some(64 * MIB),
                    descriptors: None,
                },
                Err(vec![
                    "providers need up to 148 MiB of /tmp",
                    "hetzner: limits.concurrency 8 x limits.tmpMib 16 = 128 MiB",
                    "load-time calls: 1 x tmpMib 16 = 16 MiB",
                    "compile cache: 1 plugin file(s) x 4 MiB = 4 MiB",
                    "but the scratch space is 64 MiB",
                    "limits.tmpMib",
                ]),
            ),
            (
                "both short",
                big,
                PodResources {
                    memory_bytes: Some(128 * MIB),
                    reserve_bytes: 96 * MIB,
                    scratch_bytes: Some(16 * MIB),
                    descriptors: None,
                },
                Err(vec![
                    "sandbox memory",
                    "; and providers need up to",
                    "of /tmp",
                ]),
            ),
            (
                "oci:// plugins take room in the store, once per reference",
                pulled,
                PodResources {
                    memory_bytes: None,
                    reserve_bytes: 0,
                    scratch_bytes: Some(32 * MIB),
                    descriptors: None,
                },
                Err(vec![
                    "plugin store: 2 oci:// plugin(s) x 1 MiB = 2 MiB",
                    "compile cache: 2 plugin file(s) x 4 MiB = 8 MiB",
                ]),
            ),
            (
                "an empty file needs one load slot",
                "providers: []",
                PodResources {
                    memory_bytes: Some(per_call),
                    reserve_bytes: 0,
                    scratch_bytes: Some(8 * MIB),
                    descriptors: None,
                },
                Ok(()),
            ),
        ];
        for (name, yaml, budget, want) in cases {
            let got = check(&file(yaml), &budget);
            match (got, want) {
                (Ok(_), Ok(())) => {}
                (Err(e), Err(needles)) => {
                    let msg = e.to_string();
                    for n in needles {
                        assert!(msg.contains(n), "{name}: {msg:?} lacks {n:?}");
                    }
                }
                (got, want) => panic!("{name}: got {got:?}, want {want:?}"),
            }
        }
    }

    #[test]
    fn compile_memory_never_exceeds_what_the_sandboxes_could_have() {
        let budget = |memory| PodResources {
            memory_bytes: memory,
            reserve_bytes: 96 * MIB,
            ..PodResources::default()
        };
        // The shipped Deployment: 512 MiB minus 96 leaves 416, above the default 128.
        assert_eq!(
            compile_memory(&budget(Some(512 * MIB)), 128 * MIB),
            (128 * MIB, false)
        );
        assert_eq!(
            compile_memory(&budget(Some(192 * MIB)), 128 * MIB),
            (96 * MIB, true)
        );
        assert_eq!(
            compile_memory(&budget(Some(64 * MIB)), 128 * MIB),
            (0, true)
        );
        assert_eq!(compile_memory(&budget(None), 128 * MIB), (128 * MIB, false));
    }

    #[test]
    fn the_message_adds_up() {
        let f = file(
            "
providers:
  - name: hetzner
    plugin: hetzner.wasm
    limits: {memoryMib: 32, concurrency: 8}
",
        );
        let e = check(
            &f,
            &PodResources {
                memory_bytes: Some(256 * MIB),
                reserve_bytes: 96 * MIB,
                scratch_bytes: None,
                descriptors: None,
            },
        )
        .unwrap_err();
        let FitError::Memory { parts, .. } = &e else {
            panic!("{e}")
        };
        assert_eq!(parts.0.len(), 2);
        let d = Limits::default();
        assert_eq!(
            parts.0[0].bytes,
            8 * d.memory_bytes_per_call() + d.pool_bytes()
        );
        assert_eq!(
            parts.total(),
            9 * d.memory_bytes_per_call() + d.pool_bytes()
        );
        assert!(
            e.to_string().starts_with(&format!(
                "providers need up to {} of sandbox memory (hetzner: limits.concurrency 8 x (limits.memoryMib 32 + {} host-side) + {} of kept-alive connections (limits.http.maxIdle 4) and TLS sessions = ",
                Mib(parts.total()),
                Mib(d.host_bytes_per_call()),
                Mib(d.pool_bytes())
            )),
            "{e}"
        );
    }

    #[test]
    fn what_is_left_over_is_the_budget_less_every_providers_own_calls() {
        let f = file(TWO);
        let budget = PodResources {
            memory_bytes: Some(512 * MIB),
            reserve_bytes: 96 * MIB,
            scratch_bytes: Some(128 * MIB),
            descriptors: Some(4096),
        };
        assert!(check(&f, &budget).is_ok());
        let left = left_over(&f, &budget);
        assert_eq!(
            left.memory,
            Some(416 * MIB - memory_need(&f).total()),
            "{left:?}"
        );
        assert_eq!(left.scratch, Some(128 * MIB - scratch_need(&f).total()));
        assert_eq!(
            left.descriptors,
            Some(
                4096 - crate::fdlimit::OPERATOR_FD_RESERVE
                    - super::super::descriptors::plugin_descriptors(&f)
            )
        );
        // Unknown parts bound nothing; a part that does not fit leaves nothing.
        let unknown = left_over(&f, &PodResources::default());
        assert_eq!(unknown, LeftOver::default());
        let small = left_over(
            &f,
            &PodResources {
                memory_bytes: Some(100 * MIB),
                reserve_bytes: 96 * MIB,
                ..PodResources::default()
            },
        );
        assert_eq!(small.memory, Some(0));
    }
}
