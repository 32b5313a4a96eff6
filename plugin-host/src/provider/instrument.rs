//! The decorator every provider is wrapped in: one client span and one counter per call.
//!
//! Plugins must not open their own operation spans or count their own requests; doing it
//! here once means every backend gets the same names and labels. The plugin's outgoing
//! HTTP requests become child spans of the span opened here (see `plugin::http`).

use super::{
    CreateRequest, Instance, Placement, Price, Priority, Provider, ProviderError, TargetStatus,
};
use async_trait::async_trait;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::registry::Registry;
use std::sync::Arc;
use tracing::{Instrument, field};

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RequestLabels {
    pub provider: String,
    pub op: String,
    /// `ok` or the error class.
    pub result: String,
}

/// Metrics fed by [`Instrumented`].
#[derive(Clone, Default)]
pub struct ProviderMetrics {
    pub requests: Family<RequestLabels, Counter>,
}

impl ProviderMetrics {
    /// Registers `proxy_operator_provider_requests_total`.
    pub fn register(registry: &mut Registry) -> Self {
        let metrics = ProviderMetrics::default();
        registry.register(
            "proxy_operator_provider_requests",
            "Provider operations by provider, operation and result (ok or the error class)",
            metrics.requests.clone(),
        );
        metrics
    }

    /// Counts one operation's result (recorded by [`Instrumented`]; public for the
    /// operator's check that every family's labels agree).
    pub fn count(&self, provider: &str, op: &str, result: &str) {
        self.requests
            .get_or_create(&RequestLabels {
                provider: provider.to_string(),
                op: op.to_string(),
                result: result.to_string(),
            })
            .inc();
    }
}

/// Wraps a provider with tracing and metrics.
pub struct Instrumented<P> {
    inner: P,
    metrics: ProviderMetrics,
}

impl<P: Provider> Instrumented<P> {
    pub fn new(inner: P, metrics: ProviderMetrics) -> Self {
        Instrumented { inner, metrics }
    }

    pub fn inner(&self) -> &P {
        &self.inner
    }

    async fn run<T>(
        &self,
        op: &'static str,
        span_name: &'static str,
        id: &str,
        fut: impl Future<Output = Result<T, ProviderError>>,
    ) -> Result<T, ProviderError> {
        let span = match span_name {
            "provider.create" => client_span!("provider.create", self.inner.name(), id),
            "provider.get" => client_span!("provider.get", self.inner.name(), id),
            "provider.delete" => client_span!("provider.delete", self.inner.name(), id),
            "provider.quote" => client_span!("provider.quote", self.inner.name(), id),
            _ => client_span!("provider.list", self.inner.name(), id),
        };
        let result = fut.instrument(span.clone()).await;
        let label = match &result {
            Ok(_) => "ok",
            Err(e) => e.class.as_str(),
        };
        span.record("provider.result", label);
        // Polling Get until NotFound is expected: only other classes mark the span failed.
        if let Err(e) = &result
            && e.class != super::Class::NotFound
        {
            span.record("otel.status_code", "ERROR");
            span.record("otel.status_message", e.message.as_str());
        }
        self.metrics.count(self.inner.name(), op, label);
        result
    }
}

/// `tracing` needs span names as literals; one arm per operation keeps them static.
macro_rules! client_span {
    ($name:literal, $provider:expr, $id:expr) => {
        tracing::info_span!(
            $name,
            otel.kind = "client",
            provider.name = $provider,
            provider.id = $id,
            provider.result = field::Empty,
            otel.status_code = field::Empty,
            otel.status_message = field::Empty,
        )
    };
}
use client_span;

#[async_trait]
impl<P: Provider> Provider for Instrumented<P> {
    fn name(&self) -> &str {
        self.inner.name()
    }

    async fn create_at(
        &self,
        req: &CreateRequest,
        priority: Priority,
    ) -> Result<String, ProviderError> {
        self.run(
            "create",
            "provider.create",
            &req.name,
            self.inner.create_at(req, priority),
        )
        .await
    }

    async fn get_at(&self, id: &str, priority: Priority) -> Result<Instance, ProviderError> {
        self.run("get", "provider.get", id, self.inner.get_at(id, priority))
            .await
    }

    async fn delete_at(&self, id: &str, priority: Priority) -> Result<(), ProviderError> {
        self.run(
            "delete",
            "provider.delete",
            id,
            self.inner.delete_at(id, priority),
        )
        .await
    }

    async fn list_by_tag_at(
        &self,
        installation: &str,
        priority: Priority,
    ) -> Result<Vec<Instance>, ProviderError> {
        self.run(
            "list",
            "provider.list",
            "",
            self.inner.list_by_tag_at(installation, priority),
        )
        .await
    }

    fn lists_recent(&self) -> bool {
        self.inner.lists_recent()
    }

    async fn list_recent_at(
        &self,
        installation: &str,
        since: std::time::SystemTime,
        priority: Priority,
    ) -> Result<Vec<Instance>, ProviderError> {
        self.run(
            "list",
            "provider.list",
            "",
            self.inner.list_recent_at(installation, since, priority),
        )
        .await
    }

    /// Health checks run under the monitor's own span and feed their own gauges.
    async fn check(&self) -> Option<Vec<TargetStatus>> {
        self.inner.check().await
    }

    async fn quote(&self, placement: &Placement) -> Result<Option<Price>, ProviderError> {
        self.run("quote", "provider.quote", "", self.inner.quote(placement))
            .await
    }

    fn known_price(&self, placement: &Placement) -> Option<Price> {
        self.inner.known_price(placement)
    }

    fn remember_cloud_init(&self, owner: &str, doc: &[u8]) -> Result<(), crate::sensitive::Full> {
        self.inner.remember_cloud_init(owner, doc)
    }

    fn remember_credentials(
        &self,
        owner: &str,
        username: &str,
        password: &str,
    ) -> Result<(), crate::sensitive::Full> {
        self.inner.remember_credentials(owner, username, password)
    }

    fn forget(&self, owner: &str) {
        self.inner.forget(owner)
    }

    fn private_addresses_allowed(&self) -> bool {
        self.inner.private_addresses_allowed()
    }

    fn pacing(&self) -> Option<super::Pacing> {
        self.inner.pacing()
    }
}

impl<P: Provider> Instrumented<P> {
    /// Shared handle, as the loops hold providers.
    pub fn into_arc(self) -> Arc<dyn Provider>
    where
        P: 'static,
    {
        Arc::new(self)
    }
}
