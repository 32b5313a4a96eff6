//! The operator's own endpoints, next to the discovery API: `/metrics`, `/healthz` and
//! `/readyz` (what it reports: [`crate::readiness`]).

use crate::metrics::OperatorMetrics;
use crate::readiness::Readiness;
use axum::Router;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use std::sync::Arc;

/// `/metrics` (OpenMetrics text), `/healthz` (the process answers) and `/readyz`.
pub fn router(metrics: Arc<OperatorMetrics>, readiness: Readiness) -> Router {
    Router::new()
        .route(
            "/metrics",
            get(move || {
                let metrics = metrics.clone();
                async move {
                    match metrics.encode() {
                        Ok(text) => (
                            [(
                                header::CONTENT_TYPE,
                                "application/openmetrics-text; version=1.0.0; charset=utf-8",
                            )],
                            text,
                        )
                            .into_response(),
                        Err(_) => StatusCode::INTERNAL_SERVER_ERROR.into_response(),
                    }
                }
            }),
        )
        .route("/healthz", get(|| async { "ok\n" }))
        .route(
            "/readyz",
            get(move || {
                let readiness = readiness.clone();
                async move { readyz(&readiness) }
            }),
        )
}

fn readyz(readiness: &Readiness) -> Response {
    readiness.verdict().into_response()
}
