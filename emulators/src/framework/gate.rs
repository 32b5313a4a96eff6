//! The gate every API call of an HTTP backend passes before its handler: log and count it,
//! enforce the rate limit, apply an injected fault, check the credentials, advance the
//! time-based schedules. An emulator implements [`Api`] for its state and wraps its routes
//! with [`gated`].
//!
//! The order is the one a plugin meets in front of a real API: the rate limiter stands in
//! front of everything (a limited call reaches nothing behind it, faults included), then
//! the failures of the path to the API (injected faults, which therefore win over
//! authentication), then the API's own authentication.

use axum::Router;
use axum::extract::{OriginalUri, Request, State};
use axum::http::{HeaderMap, Method, StatusCode};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};

use super::served::{Model, Shared};
use super::traffic::{Effect, Traffic};
use crate::control::{FaultOp, RateLimit};

/// What the gate needs from an emulator's state: its [`Traffic`] and the backend's answers.
pub trait Api: Model {
    /// The backend's error answer, as injected faults carry it.
    type Error: Clone + IntoResponse + Send + 'static;
    fn traffic(&mut self) -> &mut Traffic<Self::Error>;
    /// The shared operation a call belongs to (`None`: only [`FaultOp::Any`] faults hit
    /// it) and the backend's name of the call for [`RequestStats::by_call`].
    ///
    /// [`RequestStats::by_call`]: crate::control::RequestStats::by_call
    fn classify(&self, method: &Method, path: &str) -> (Option<FaultOp>, String);
    fn authorized(&self, headers: &HeaderMap) -> bool;
    fn unauthorized(&self) -> Self::Error;
    /// The answer to a call over the enforced limit.
    fn rate_limited(&self, limit: RateLimit) -> Self::Error;
    /// Before a call that passed the gate reaches its handler: time-based schedules.
    fn tick(&mut self) {}
    /// After every answer: headers the backend adds to all of them.
    fn decorate(&mut self, _resp: &mut Response) {}
}

/// `routes` behind the gate.
pub fn gated<S: Api>(routes: Router<Shared<S>>, state: &Shared<S>) -> Router<Shared<S>> {
    routes.layer(middleware::from_fn_with_state(state.clone(), gate::<S>))
}

async fn gate<S: Api>(State(state): State<Shared<S>>, req: Request, next: Next) -> Response {
    // Nesting strips a prefix from `req.uri()`; log and classify what the client sent.
    let uri = req
        .extensions()
        .get::<OriginalUri>()
        .map(|u| u.0.clone())
        .unwrap_or_else(|| req.uri().clone());
    let line = match uri.query() {
        Some(q) => format!("{} {}?{q}", req.method(), uri.path()),
        None => format!("{} {}", req.method(), uri.path()),
    };
    let (limited, fault, authorized) = {
        let mut s = state.lock();
        let (op, call) = s.classify(req.method(), uri.path());
        let t = s.traffic();
        t.record(line, op, &call);
        let limited = t.limits.take("", std::time::Instant::now());
        // A limited call never reaches what stands behind the limiter: its faults wait.
        let fault = if limited.is_none() { t.take_fault(op, &call) } else { None };
        (limited, fault, s.authorized(req.headers()))
    };
    let mut resp = match (limited, fault) {
        (Some(limit), _) => state.lock().rate_limited(limit).into_response(),
        (None, Some(Effect { delay, fail })) => {
            if !delay.is_zero() {
                tokio::time::sleep(delay).await;
            }
            match fail {
                Some(e) => e.into_response(),
                None => pass(&state, authorized, req, next).await,
            }
        }
        (None, None) => pass(&state, authorized, req, next).await,
    };
    let mut s = state.lock();
    if resp.status() == StatusCode::TOO_MANY_REQUESTS {
        s.traffic().stats.rate_limited += 1;
    }
    s.decorate(&mut resp);
    resp
}

async fn pass<S: Api>(state: &Shared<S>, authorized: bool, req: Request, next: Next) -> Response {
    if !authorized {
        return state.lock().unauthorized().into_response();
    }
    state.lock().tick();
    next.run(req).await
}
