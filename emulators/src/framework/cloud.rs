//! [`Cloud`]: the whole state of an emulator for a REST backend, built from a [`Fleet`], its
//! [`Traffic`] and a small backend-specific [`Adapter`]; it is the [`Model`] of the control
//! surface and the [`Api`] of the gate, so an emulator on it writes neither.

use std::time::Instant;

use axum::http::{HeaderMap, Method};
use axum::response::{IntoResponse, Response};

use super::fleet::{Fleet, Record, States};
use super::gate::Api;
use super::served::Model;
use super::traffic::{Effect, Traffic};
use crate::control::{
    Dump, DumpSecondary, Fault, FaultKind, FaultOp, Plant, RateLimit, Refusal, RequestStats,
};
use crate::rate_limit::Limiter;

/// What one backend decides: its state names, id and address formats, and its answers to
/// each fault, to a bad credential, to a rate-limited call and to a refused plant. The
/// adapter is also where the backend keeps its configuration (token, catalogue).
pub trait Adapter: Send + 'static {
    /// What a record holds beyond the common fields.
    type Extra: Clone + Send + 'static;
    /// The backend's error answer. A plant the backend refuses is answered with it.
    type Error: Clone + IntoResponse + Into<Refusal> + Send + 'static;
    const STATES: States;

    /// The `n`th id (`n` from 1).
    fn id(&self, n: u64) -> String;
    /// The public address of the `n`th instance that starts running.
    fn address(&self, n: u64) -> String;
    /// Where a planted instance without a scope goes.
    fn default_scope(&self) -> String;
    /// Checks a plant as the backend would check a create (its name, its scope), beyond
    /// the name being free, and gives the backend-specific fields.
    fn plant(&self, plant: &Plant, scope: &str) -> Result<Self::Extra, Self::Error>;
    /// The name of a plant is taken.
    fn name_taken(&self) -> Self::Error;
    /// The answer to an injected fault of `kind` (never [`FaultKind::Slow`]).
    fn fault(&self, kind: &FaultKind) -> Self::Error;
    /// See [`Api::classify`].
    fn classify(&self, method: &Method, path: &str) -> (Option<FaultOp>, String);
    fn authorized(&self, headers: &HeaderMap) -> bool;
    fn unauthorized(&self) -> Self::Error;
    fn rate_limited(&self, limit: RateLimit) -> Self::Error;
    /// Headers every answer carries (rate-limit headers, from the bucket when a limit is
    /// enforced).
    fn decorate(&self, _resp: &mut Response, _bucket: Option<&mut Limiter>) {}
    /// Secondary resources for the dump (volumes, addresses).
    fn secondary(&self) -> Vec<DumpSecondary> {
        Vec::new()
    }
    /// Forget what the adapter keeps beyond the fleet (secondary resources) on a reset.
    fn reset(&mut self) {}
    /// Reclaim spot instance `id` of `fleet` as the backend does (see
    /// [`Emulator::reclaim`](crate::control::Emulator::reclaim)): `Ok(false)` when there is
    /// no such instance. By default the backend has no spot, and says so (`501`).
    fn reclaim(&mut self, fleet: &mut Fleet<Self::Extra>, id: &str) -> Result<bool, Refusal> {
        let _ = (fleet, id);
        Err(Refusal::unsupported("reclaim"))
    }
    /// Whether spot creates find capacity; answers whether the backend supports it (by
    /// default it does not).
    fn set_spot_capacity(&mut self, available: bool) -> bool {
        let _ = available;
        false
    }
    /// The record runs on spot or preemptible capacity (the dump's `spot`).
    fn is_spot(&self, record: &Record<Self::Extra>) -> bool {
        let _ = record;
        false
    }
}

/// An emulator's state: instances, calls, and the backend's adapter.
pub struct Cloud<A: Adapter> {
    pub fleet: Fleet<A::Extra>,
    pub traffic: Traffic<A::Error>,
    pub backend: A,
    addresses: u64,
}

impl<A: Adapter> Cloud<A> {
    pub fn new(backend: A, fleet: Fleet<A::Extra>, limit: Option<RateLimit>) -> Self {
        Cloud { fleet, traffic: Traffic::new(limit), backend, addresses: 0 }
    }

    /// A fresh id in the backend's format.
    pub fn new_id(&mut self) -> String {
        let backend = &self.backend;
        self.fleet.allocate(|n| backend.id(n))
    }

    /// The next public address.
    pub fn next_address(&mut self) -> String {
        self.addresses += 1;
        self.backend.address(self.addresses)
    }

    /// A new instance; see [`Fleet::create`].
    pub fn create(&mut self, record: Record<A::Extra>) -> Record<A::Extra> {
        let (backend, n) = (&self.backend, &mut self.addresses);
        self.fleet.create(record, || {
            *n += 1;
            backend.address(*n)
        })
    }

    /// The next `count` calls named `call` (as [`Adapter::classify`] names them) answer the
    /// backend's server error, changing nothing.
    pub fn fail_calls(&mut self, call: &str, count: u32) {
        let effect = Effect::fail(self.backend.fault(&FaultKind::ServerError));
        self.traffic.call_faults.push((call.to_string(), count, effect));
    }

    /// A read returned instance `id`: advance a read-counted schedule.
    pub fn saw(&mut self, id: &str) {
        let (backend, n) = (&self.backend, &mut self.addresses);
        self.fleet.saw(id, || {
            *n += 1;
            backend.address(*n)
        });
    }
}

impl<A: Adapter> Model for Cloud<A> {
    fn hold(&mut self, id: &str, hold: bool) -> bool {
        self.fleet.hold(id, hold)
    }
    fn set_state(&mut self, id: &str, state: &str) -> bool {
        let (backend, n) = (&self.backend, &mut self.addresses);
        self.fleet.set_state(id, state, || {
            *n += 1;
            backend.address(*n)
        })
    }
    fn set_address(&mut self, id: &str, ip: Option<&str>) -> bool {
        self.fleet.set_address(id, ip)
    }
    fn slow_delete(&mut self, id: &str) -> bool {
        self.fleet.slow_delete(id)
    }
    fn finish_deletes(&mut self) {
        self.fleet.finish_deletes()
    }
    fn set_locked(&mut self, id: &str, locked: bool) -> bool {
        self.fleet.set_locked(id, locked)
    }
    fn plant(&mut self, plant: &Plant) -> Result<String, Refusal> {
        let scope = match plant.scope.as_str() {
            "" => self.backend.default_scope(),
            s => s.to_string(),
        };
        let extra = self.backend.plant(plant, &scope).map_err(Into::into)?;
        if self.fleet.name_taken(&plant.name) {
            return Err(self.backend.name_taken().into());
        }
        let id = self.new_id();
        let ip = self.next_address();
        self.fleet.plant(id.clone(), plant, scope, ip, extra);
        Ok(id)
    }
    fn inject(&mut self, fault: Fault) {
        let effect = match &fault.kind {
            FaultKind::Slow { delay_ms } => {
                Effect::delay(std::time::Duration::from_millis(*delay_ms))
            }
            kind => Effect::fail(self.backend.fault(kind)),
        };
        self.traffic.faults.push(fault.op, effect, fault.count);
    }
    fn fail_scope(&mut self, scope: &str, fail: bool) {
        self.fleet.fail_scope(scope, fail)
    }
    fn dump(&mut self) -> Dump {
        self.tick();
        Dump { instances: self.fleet.dump(), secondary: self.backend.secondary() }
    }
    fn reset(&mut self) {
        self.fleet.reset();
        self.traffic.reset();
        self.backend.reset();
    }
    fn set_rate_limit(&mut self, limit: Option<RateLimit>) {
        self.traffic.limits.set(limit);
    }
    fn stats(&self) -> RequestStats {
        self.traffic.stats.clone()
    }
    fn requests(&self) -> Vec<String> {
        self.traffic.requests.clone()
    }
    fn reclaim(&mut self, id: &str) -> Result<bool, Refusal> {
        self.backend.reclaim(&mut self.fleet, id)
    }
    fn set_spot_capacity(&mut self, available: bool) -> bool {
        self.backend.set_spot_capacity(available)
    }
    fn spot_instances(&mut self) -> Vec<String> {
        self.tick();
        let spot = self.fleet.iter().filter(|r| self.backend.is_spot(r));
        spot.map(|r| r.id.clone()).collect()
    }
}

impl<A: Adapter> Api for Cloud<A> {
    type Error = A::Error;
    fn traffic(&mut self) -> &mut Traffic<A::Error> {
        &mut self.traffic
    }
    fn classify(&self, method: &Method, path: &str) -> (Option<FaultOp>, String) {
        self.backend.classify(method, path)
    }
    fn authorized(&self, headers: &HeaderMap) -> bool {
        self.backend.authorized(headers)
    }
    fn unauthorized(&self) -> A::Error {
        self.backend.unauthorized()
    }
    fn rate_limited(&self, limit: RateLimit) -> A::Error {
        self.backend.rate_limited(limit)
    }
    fn tick(&mut self) {
        let (backend, n) = (&self.backend, &mut self.addresses);
        self.fleet.tick(|| {
            *n += 1;
            backend.address(*n)
        });
    }
    fn decorate(&mut self, resp: &mut Response) {
        let bucket = self.traffic.limits.bucket("", Instant::now());
        self.backend.decorate(resp, bucket);
    }
}

impl<A: Adapter> super::Served<Cloud<A>> {
    /// See [`Cloud::fail_calls`]: the calls are named as in the request stats, e.g.
    /// `POST /instance/v1/zones/{zone}/servers/{id}/action`.
    pub fn fail_calls(&self, call: &str, count: u32) {
        self.lock().fail_calls(call, count);
    }

    /// Puts a raw record in (e.g. an instance of an older shape), keeping its id.
    pub fn insert_record(&self, record: Record<A::Extra>) {
        self.lock().fleet.insert(record);
    }
}
