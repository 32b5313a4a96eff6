//! Test support: a `tracing` layer that records every span and event, so tests can assert
//! on the trace tree and prove that no secret reaches a log line or span attribute.
//! Behind the `test-support` feature rather than `cfg(test)`, so integration tests,
//! benchmarks and the demo can use it too; the operator binary is built without it.
//!
//! [`fake_provider`] is an in-memory provider with fault injection for testing the loops;
//! [`browser`] drives headless Chromium (DOM dumps and screenshots of a page).

pub mod browser;
pub mod fake_provider;

use std::collections::HashMap;
use std::fmt::Write;
use std::sync::{Arc, Mutex};
use tracing::field::{Field, Visit};
use tracing::span::{Attributes, Id, Record};
use tracing::{Event, Subscriber};
use tracing_subscriber::Layer;
use tracing_subscriber::layer::Context;
use tracing_subscriber::registry::LookupSpan;

/// A span as recorded: name, parent and every field ever recorded on it.
#[derive(Debug, Clone)]
pub struct SpanRecord {
    pub id: u64,
    pub parent: Option<u64>,
    pub name: String,
    pub fields: HashMap<String, String>,
}

/// An event as recorded: level, target, the span it happened in, and its fields
/// (`message` included).
#[derive(Debug, Clone)]
pub struct EventRecord {
    pub level: tracing::Level,
    pub target: String,
    pub span: Option<u64>,
    pub fields: HashMap<String, String>,
}

impl EventRecord {
    pub fn message(&self) -> &str {
        self.fields
            .get("message")
            .map(String::as_str)
            .unwrap_or_default()
    }
}

/// Everything captured so far.
#[derive(Default, Clone)]
pub struct Captured {
    inner: Arc<Mutex<(Vec<SpanRecord>, Vec<EventRecord>)>>,
}

impl Captured {
    pub fn spans(&self) -> Vec<SpanRecord> {
        self.inner.lock().unwrap().0.clone()
    }

    pub fn events(&self) -> Vec<EventRecord> {
        self.inner.lock().unwrap().1.clone()
    }

    /// Every recorded string (span names, all field values, event messages), one per line:
    /// what a leak check greps.
    pub fn all_text(&self) -> String {
        let guard = self.inner.lock().unwrap();
        let mut out = String::new();
        for s in &guard.0 {
            let _ = writeln!(out, "{}", s.name);
            for (k, v) in &s.fields {
                let _ = writeln!(out, "{k}={v}");
            }
        }
        for e in &guard.1 {
            for (k, v) in &e.fields {
                let _ = writeln!(out, "{k}={v}");
            }
        }
        out
    }
}

/// The layer; install with `tracing_subscriber::registry().with(layer)`.
pub struct CaptureLayer {
    /// `None`: whatever [`capture`] installed for the current thread.
    captured: Option<Captured>,
}

impl CaptureLayer {
    pub fn new() -> (Self, Captured) {
        let captured = Captured::default();
        (
            CaptureLayer {
                captured: Some(captured.clone()),
            },
            captured,
        )
    }

    fn sink(&self) -> Option<Captured> {
        self.captured
            .clone()
            .or_else(|| CURRENT.with(|c| c.borrow().last().cloned()))
    }
}

thread_local! {
    /// The captures [`capture`] installed on this thread, innermost last.
    static CURRENT: std::cell::RefCell<Vec<Captured>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// Ends a [`capture`] when dropped.
pub struct CaptureGuard {
    _thread_local: Option<tracing::subscriber::DefaultGuard>,
    routed: bool,
}

impl Drop for CaptureGuard {
    fn drop(&mut self) {
        if self.routed {
            CURRENT.with(|c| c.borrow_mut().pop());
        }
    }
}

/// Records what this thread emits until the guard drops. It uses the operator's own filter
/// ([`crate::telemetry::env_filter`]) at `trace` for everything else, so a leak check sees
/// everything production could ever log.
///
/// One process-wide subscriber routes each thread's spans and events to the capture
/// installed on that thread. A thread-local subscriber per test lost events now and then
/// (a leak check saw none of the plugin's lines, one run in six): tracing caches, per
/// callsite and for the whole process, whether any subscriber wants it, and that cache does
/// not keep up with subscribers coming and going on many test threads. A global subscriber
/// always wants everything. If the process already has another global subscriber, the
/// capture falls back to a thread-local one.
pub fn capture() -> (CaptureGuard, Captured) {
    use tracing_subscriber::prelude::*;
    let subscriber = |layer: CaptureLayer| {
        tracing_subscriber::registry()
            .with(layer.with_filter(crate::telemetry::env_filter("trace")))
    };
    static GLOBAL: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    let routed = *GLOBAL.get_or_init(|| {
        tracing::subscriber::set_global_default(subscriber(CaptureLayer { captured: None })).is_ok()
    });
    if routed {
        let captured = Captured::default();
        CURRENT.with(|c| c.borrow_mut().push(captured.clone()));
        return (
            CaptureGuard {
                _thread_local: None,
                routed: true,
            },
            captured,
        );
    }
    let (layer, captured) = CaptureLayer::new();
    let guard = tracing::subscriber::set_default(subscriber(layer));
    (
        CaptureGuard {
            _thread_local: Some(guard),
            routed: false,
        },
        captured,
    )
}

struct FieldVisitor<'a>(&'a mut HashMap<String, String>);

impl Visit for FieldVisitor<'_> {
    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        self.0
            .insert(field.name().to_string(), format!("{value:?}"));
    }
    fn record_str(&mut self, field: &Field, value: &str) {
        self.0.insert(field.name().to_string(), value.to_string());
    }
}

impl<S> Layer<S> for CaptureLayer
where
    S: Subscriber + for<'a> LookupSpan<'a>,
{
    fn on_new_span(&self, attrs: &Attributes<'_>, id: &Id, ctx: Context<'_, S>) {
        let mut fields = HashMap::new();
        attrs.record(&mut FieldVisitor(&mut fields));
        let parent = if let Some(p) = attrs.parent() {
            Some(p.into_u64())
        } else if attrs.is_contextual() {
            ctx.current_span().id().map(|i| i.into_u64())
        } else {
            None
        };
        let Some(captured) = self.sink() else {
            return;
        };
        captured.inner.lock().unwrap().0.push(SpanRecord {
            id: id.into_u64(),
            parent,
            name: attrs.metadata().name().to_string(),
            fields,
        });
    }

    fn on_record(&self, id: &Id, values: &Record<'_>, _ctx: Context<'_, S>) {
        let Some(captured) = self.sink() else {
            return;
        };
        let mut guard = captured.inner.lock().unwrap();
        if let Some(span) = guard.0.iter_mut().rev().find(|s| s.id == id.into_u64()) {
            values.record(&mut FieldVisitor(&mut span.fields));
        }
    }

    fn on_event(&self, event: &Event<'_>, ctx: Context<'_, S>) {
        let mut fields = HashMap::new();
        event.record(&mut FieldVisitor(&mut fields));
        let span = ctx.event_span(event).map(|s| s.id().into_u64());
        let Some(captured) = self.sink() else {
            return;
        };
        captured.inner.lock().unwrap().1.push(EventRecord {
            level: *event.metadata().level(),
            target: event.metadata().target().to_string(),
            span,
            fields,
        });
    }
}
