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
    captured: Captured,
}

impl CaptureLayer {
    pub fn new() -> (Self, Captured) {
        let captured = Captured::default();
        (
            CaptureLayer {
                captured: captured.clone(),
            },
            captured,
        )
    }
}

/// Installs a capturing subscriber for the current thread until the guard drops. It uses
/// the operator's own filter ([`crate::telemetry::env_filter`]) at `trace` for everything
/// else, so a leak check sees everything production could ever log.
pub fn capture() -> (tracing::subscriber::DefaultGuard, Captured) {
    use tracing_subscriber::prelude::*;
    let (layer, captured) = CaptureLayer::new();
    let subscriber = tracing_subscriber::registry()
        .with(layer.with_filter(crate::telemetry::env_filter("trace")));
    let guard = tracing::subscriber::set_default(subscriber);
    // tracing caches, per callsite and for the whole process, whether any subscriber wants
    // it. With one thread-local subscriber per test and tests on many threads, a callsite
    // first hit while no capturing subscriber was registered could stay cached as "never"
    // for this one too: a leak check then saw no event at all (one run in three with 16
    // test threads). Rebuilding the cache once this subscriber is in place asks it too.
    tracing::callsite::rebuild_interest_cache();
    (guard, captured)
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
        self.captured.inner.lock().unwrap().0.push(SpanRecord {
            id: id.into_u64(),
            parent,
            name: attrs.metadata().name().to_string(),
            fields,
        });
    }

    fn on_record(&self, id: &Id, values: &Record<'_>, _ctx: Context<'_, S>) {
        let mut guard = self.captured.inner.lock().unwrap();
        if let Some(span) = guard.0.iter_mut().rev().find(|s| s.id == id.into_u64()) {
            values.record(&mut FieldVisitor(&mut span.fields));
        }
    }

    fn on_event(&self, event: &Event<'_>, ctx: Context<'_, S>) {
        let mut fields = HashMap::new();
        event.record(&mut FieldVisitor(&mut fields));
        let span = ctx.event_span(event).map(|s| s.id().into_u64());
        self.captured.inner.lock().unwrap().1.push(EventRecord {
            level: *event.metadata().level(),
            target: event.metadata().target().to_string(),
            span,
            fields,
        });
    }
}
