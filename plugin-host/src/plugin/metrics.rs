//! What each plugin call cost and how it ended, by provider and operation.
//!
//! Counted here, in the runtime, rather than in the provider decorator: only the runtime
//! sees fuel and the trap behind a failed call, and load-time calls (`info`,
//! `validate-config`) never pass through the decorator. The labels are the configured
//! provider name and the operation; never anything a plugin or a user wrote.

use super::limits::LimitHit;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;
use std::time::Duration;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct CallLabels {
    pub provider: String,
    pub op: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct TrapLabels {
    pub provider: String,
    pub op: String,
    /// One of [`TrapKind::as_str`].
    pub kind: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct PriorityLabels {
    pub provider: String,
    /// One of [`Priority::as_str`](crate::provider::priority::Priority::as_str).
    pub priority: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ProviderLabels {
    pub provider: String,
}

/// Why the sandbox stopped a call. A fixed set, so the label cannot grow without bound.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TrapKind {
    /// A limit of the sandbox stopped the call (see `plugin::limits`).
    Limit(LimitHit),
    /// Native stack overflow, or an out-of-bounds access (a Rust guest's stack overflow).
    Stack,
    /// The guest panicked (`unreachable`).
    Panic,
    /// Any other trap (division by zero, bad conversion, ...).
    Other,
    /// The call was cut short because the operator is shutting down.
    Shutdown,
}

impl TrapKind {
    /// Every kind, each limit's first.
    pub fn all() -> Vec<TrapKind> {
        LimitHit::ALL
            .into_iter()
            .map(TrapKind::Limit)
            .chain([
                TrapKind::Stack,
                TrapKind::Panic,
                TrapKind::Other,
                TrapKind::Shutdown,
            ])
            .collect()
    }

    pub fn as_str(self) -> &'static str {
        match self {
            TrapKind::Limit(hit) => hit.label(),
            TrapKind::Stack => "stack",
            TrapKind::Panic => "panic",
            TrapKind::Other => "other",
            TrapKind::Shutdown => "shutdown",
        }
    }
}

/// Metrics the [`Runtime`](super::Runtime) feeds once [`Runtime::set_metrics`](super::Runtime::set_metrics) is called.
#[derive(Clone)]
pub struct PluginMetrics {
    duration: Family<CallLabels, Histogram>,
    fuel: Family<CallLabels, Histogram>,
    memory: Family<CallLabels, Histogram>,
    traps: Family<TrapLabels, Counter>,
    budget: BudgetMetrics,
    slot_wait: Family<PriorityLabels, Histogram>,
    slots: Family<SlotLabels, Gauge>,
}

/// A provider's call slots of one kind (`wanted`: what its budget calls for, at least its
/// own `limits.concurrency`; `borrowed`: held on the pod's left-over room).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct SlotLabels {
    pub provider: String,
    pub kind: &'static str,
}

/// The request budget's families, fed by the HTTP hooks.
#[derive(Clone)]
pub struct BudgetMetrics {
    requests: Family<PriorityLabels, Counter>,
    wait: Family<PriorityLabels, Histogram>,
    tokens: Family<ProviderLabels, Gauge<f64, std::sync::atomic::AtomicU64>>,
    rate_limited: Family<ProviderLabels, Counter>,
}

impl BudgetMetrics {
    fn labels(provider: &str, priority: &str) -> PriorityLabels {
        PriorityLabels {
            provider: provider.to_string(),
            priority: priority.to_string(),
        }
    }

    /// A request got its token after `waited` (sent or not: counted once it may go).
    /// Records requests let through (the budget does; public for the operator's label check).
    pub fn granted(&self, provider: &str, priority: &str, waited: Duration, tokens: f64) {
        let l = Self::labels(provider, priority);
        self.requests.get_or_create(&l).inc();
        self.wait.get_or_create(&l).observe(waited.as_secs_f64());
        self.tokens(provider, tokens);
    }

    pub(crate) fn tokens(&self, provider: &str, tokens: f64) {
        self.tokens
            .get_or_create(&ProviderLabels {
                provider: provider.to_string(),
            })
            .set(tokens);
    }

    /// Records a rate-limited answer (the budget does; public for the operator's label check).
    pub fn rate_limited(&self, provider: &str) {
        self.rate_limited
            .get_or_create(&ProviderLabels {
                provider: provider.to_string(),
            })
            .inc();
    }
}

impl PluginMetrics {
    /// Registers `proxy_operator_plugin_call_duration_seconds`,
    /// `proxy_operator_plugin_call_fuel` and `proxy_operator_plugin_traps_total`.
    pub fn register(registry: &mut Registry) -> Self {
        // 1 ms .. ~65 s: a call is a few HTTP round trips, bounded by limits.timeout.
        let duration = Family::<CallLabels, Histogram>::new_with_constructor(|| {
            Histogram::new(exponential_buckets(0.001, 2.0, 17))
        });
        // 10k .. ~10^10 fuel units: the default budget is in the billions; a typical call
        // burns millions. The buckets show how close calls come to `limits.fuel`.
        let fuel = Family::<CallLabels, Histogram>::new_with_constructor(|| {
            Histogram::new(exponential_buckets(1e4, 4.0, 12))
        });
        // 64 KiB .. 256 MiB: what a call's linear memory grew to, against limits.memoryMib
        // (and what the host holds for it while it runs).
        let memory = Family::<CallLabels, Histogram>::new_with_constructor(|| {
            Histogram::new(exponential_buckets(65536.0, 2.0, 13))
        });
        let traps = Family::<TrapLabels, Counter>::default();
        // 1 ms .. ~35 min: during a rollout a background call may wait several calls'
        // time for its class's turn; the buckets show that it is bounded.
        let slot_wait = Family::<PriorityLabels, Histogram>::new_with_constructor(|| {
            Histogram::new(exponential_buckets(0.001, 2.0, 22))
        });
        let budget = BudgetMetrics {
            requests: Family::default(),
            // 1 ms .. ~65 s: a wait is bounded by the call's limits.timeout.
            wait: Family::new_with_constructor(|| {
                Histogram::new(exponential_buckets(0.001, 2.0, 17))
            }),
            tokens: Family::default(),
            rate_limited: Family::default(),
        };
        registry.register(
            "proxy_operator_plugin_call_duration_seconds",
            "Wall time of plugin calls (sandbox set-up included), by provider and operation",
            duration.clone(),
        );
        registry.register(
            "proxy_operator_plugin_call_fuel",
            "Fuel (wasm instructions, roughly) each plugin call used, by provider and operation",
            fuel.clone(),
        );
        registry.register(
            "proxy_operator_plugin_call_memory_bytes",
            "Linear memory each plugin call grew to (its peak), by provider and operation: compare with limits.memoryMib",
            memory.clone(),
        );
        registry.register(
            "proxy_operator_plugin_traps",
            "Plugin calls the sandbox stopped, by provider, operation and kind (fuel, deadline, memory, tmp, files, handles, requests, headers, budget, stack, panic, other, shutdown)",
            traps.clone(),
        );
        registry.register(
            "proxy_operator_plugin_http_requests",
            "Backend requests plugins were let send under their provider's request budget, by provider and priority (urgent, transition, background)",
            budget.requests.clone(),
        );
        registry.register(
            "proxy_operator_plugin_slot_wait_seconds",
            "Time plugin calls waited for one of their provider's call slots (limits.concurrency), by provider and priority",
            slot_wait.clone(),
        );
        let slots = Family::<SlotLabels, Gauge>::default();
        registry.register(
            "proxy_operator_plugin_call_slots",
            "Each provider's call slots as of its last call: wanted (what its request budget calls for, within limits.concurrency and limits.maxConcurrency) and borrowed (held on the room the pod's fit leaves over)",
            slots.clone(),
        );
        registry.register(
            "proxy_operator_plugin_budget_wait_seconds",
            "Time backend requests waited for a token of their provider's request budget, by provider and priority",
            budget.wait.clone(),
        );
        registry.register(
            "proxy_operator_plugin_budget_tokens",
            "Tokens left in each provider's request budget, as of its last request or backend answer",
            budget.tokens.clone(),
        );
        registry.register(
            "proxy_operator_plugin_http_rate_limited",
            "Backend answers 429 (Too Many Requests) received, by provider",
            budget.rate_limited.clone(),
        );
        PluginMetrics {
            duration,
            fuel,
            memory,
            traps,
            budget,
            slot_wait,
            slots,
        }
    }

    /// A provider's slots after a call: how many its budget wants, how many are borrowed.
    pub fn slots(&self, provider: &str, wanted: usize, borrowed: usize) {
        for (kind, n) in [("wanted", wanted), ("borrowed", borrowed)] {
            self.slots
                .get_or_create(&SlotLabels {
                    provider: provider.to_string(),
                    kind,
                })
                .set(i64::try_from(n).unwrap_or(i64::MAX));
        }
    }

    /// A call got its slot after `waited`.
    pub fn slot_waited(&self, provider: &str, priority: &str, waited: Duration) {
        self.slot_wait
            .get_or_create(&BudgetMetrics::labels(provider, priority))
            .observe(waited.as_secs_f64());
    }

    /// Records one call (the runtime does; public for the operator's label check).
    pub fn observe(
        &self,
        provider: &str,
        op: &str,
        duration: Duration,
        fuel: u64,
        memory_bytes: usize,
        trap: Option<TrapKind>,
    ) {
        let labels = CallLabels {
            provider: provider.to_string(),
            op: op.to_string(),
        };
        self.duration
            .get_or_create(&labels)
            .observe(duration.as_secs_f64());
        self.fuel.get_or_create(&labels).observe(fuel as f64);
        self.memory
            .get_or_create(&labels)
            .observe(memory_bytes as f64);
        if let Some(kind) = trap {
            self.traps
                .get_or_create(&TrapLabels {
                    provider: labels.provider,
                    op: labels.op,
                    kind: kind.as_str().to_string(),
                })
                .inc();
        }
    }

    /// The request budget's families.
    pub fn budget(&self) -> &BudgetMetrics {
        &self.budget
    }

    /// Backend requests of `provider` let through at `priority` so far (for tests).
    pub fn budget_requests(&self, provider: &str, priority: &str) -> u64 {
        self.budget
            .requests
            .get_or_create(&BudgetMetrics::labels(provider, priority))
            .get()
    }

    /// 429 answers `provider` received so far (for tests).
    pub fn rate_limited(&self, provider: &str) -> u64 {
        self.budget
            .rate_limited
            .get_or_create(&ProviderLabels {
                provider: provider.into(),
            })
            .get()
    }

    /// Calls stopped with `kind` so far (for tests).
    pub fn traps(&self, provider: &str, op: &str, kind: TrapKind) -> u64 {
        self.traps
            .get_or_create(&TrapLabels {
                provider: provider.into(),
                op: op.into(),
                kind: kind.as_str().into(),
            })
            .get()
    }
}
