//! A stateful, in-memory [`Provider`] with fault injection, for testing the loops
//! (reconciler, orphan GC) without Wasm or a backend.
//!
//! It keeps the contract the loops rely on: Create is idempotent by name (and refuses to
//! adopt an instance of another UID), Get answers NotFound only once an instance is gone
//! and keeps showing a deleting instance for a while, Delete is idempotent, a malformed ID
//! is Permanent, and ListByTag returns only this installation's instances with their UID
//! and creation time.

use async_trait::async_trait;
use egress_plugin_host::provider::{
    Class, CreateRequest, Instance, Op, Placement, Price, Priority, Provider, ProviderError, State,
    TargetStatus,
};
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, SystemTime};

/// How instances evolve between calls.
#[derive(Debug, Clone)]
pub struct Behaviour {
    /// Gets that answer Provisioning before a new instance runs (with an IP).
    pub provisioning_gets: u32,
    /// Gets that still show a deleted instance (as Terminated) before it is gone.
    pub deleting_gets: u32,
    /// Added to every call, to hold reconcile workers like a slow backend does.
    pub latency: Duration,
    /// Lists recent instances (contract 0.3.0 `lists-recent`): a list with a time
    /// returns only the instances created at or after it, and its call is logged as
    /// `Op::List` with the installation followed by [`RECENT_LIST_MARK`].
    pub lists_recent: bool,
}

/// What follows the installation in the call log of a list of recent instances.
pub const RECENT_LIST_MARK: &str = " (recent)";

impl Default for Behaviour {
    fn default() -> Self {
        Behaviour {
            provisioning_gets: 1,
            deleting_gets: 1,
            latency: Duration::ZERO,
            lists_recent: false,
        }
    }
}

/// A stored instance.
#[derive(Debug, Clone)]
pub struct FakeInstance {
    pub id: String,
    pub name: String,
    pub uid: String,
    pub installation: String,
    pub ip: String,
    pub state: State,
    pub created_at: Option<SystemTime>,
    /// The create request's cloud-init size (the content is not kept).
    pub cloud_init_bytes: usize,
    pub port: u16,
    provisioning_left: u32,
    /// `Some(n)`: being deleted, gone after `n` more Gets.
    deleting_left: Option<u32>,
}

struct Fault {
    op: Op,
    class: Class,
    remaining: usize,
}

/// Random faults: each call fails with this probability, cycling through the classes.
struct RandomFaults {
    rate: f64,
    classes: Vec<Class>,
    rng: u64,
    next_class: usize,
}

#[derive(Default)]
struct Inner {
    instances: BTreeMap<String, FakeInstance>,
    faults: Vec<Fault>,
    random: Option<RandomFaults>,
    calls: Vec<(Op, String)>,
    /// How many instances each list of recent instances returned, in order.
    recent_sizes: Vec<usize>,
    injected: usize,
    created: usize,
    next_ip: u32,
    /// Every instance gets this address instead of a TEST-NET one (a local proxy, so
    /// health probes through it succeed).
    fixed_ip: Option<String>,
    last_create: Option<CreateRequest>,
    /// What `known_price` answers, by placement zone.
    known_prices: BTreeMap<String, Price>,
    /// What `quote` answers, by placement zone (absent: no price).
    quotes: BTreeMap<String, Price>,
    /// Prices `quote` answered, which `known_price` then knows (as the plugin adapter
    /// keeps its quotes).
    quoted: BTreeMap<String, Price>,
    quote_calls: usize,
}

/// The fake provider. Instance IDs are `fake/<name>`.
pub struct FakeProvider {
    name: String,
    // Shared with [`FakeProvider::rebuilt`] copies: one backend, several provider objects.
    behaviour: Arc<Mutex<Behaviour>>,
    inner: Arc<Mutex<Inner>>,
    hold_creates: Arc<AtomicBool>,
    hold_quotes: Arc<AtomicBool>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

const ID_PREFIX: &str = "fake/";

impl FakeProvider {
    pub fn new(name: &str) -> Self {
        Self::with_behaviour(name, Behaviour::default())
    }

    pub fn with_behaviour(name: &str, behaviour: Behaviour) -> Self {
        FakeProvider {
            name: name.to_string(),
            behaviour: Arc::new(Mutex::new(behaviour)),
            inner: Arc::new(Mutex::new(Inner::default())),
            hold_creates: Arc::new(AtomicBool::new(false)),
            hold_quotes: Arc::new(AtomicBool::new(false)),
        }
    }

    /// A new provider object over the same backend (instances, faults, call log), as a
    /// reload of the providers file rebuilds a provider: to the loops it is a different
    /// provider (another `inventory::provider_key`).
    pub fn rebuilt(&self) -> FakeProvider {
        FakeProvider {
            name: self.name.clone(),
            behaviour: self.behaviour.clone(),
            inner: self.inner.clone(),
            hold_creates: self.hold_creates.clone(),
            hold_quotes: self.hold_quotes.clone(),
        }
    }

    /// Instances created from now on get `ip` (e.g. `127.0.0.1`, where a test runs a real
    /// proxy) instead of a unique TEST-NET-1 address.
    pub fn set_fixed_ip(&self, ip: &str) {
        lock(&self.inner).fixed_ip = Some(ip.to_string());
    }

    /// `known_price` of a placement in `zone` answers `price` (as the providers file's
    /// `prices` would make a real provider answer).
    pub fn set_known_price(&self, zone: &str, price: Price) {
        lock(&self.inner)
            .known_prices
            .insert(zone.to_string(), price);
    }

    /// `quote` of a placement in `zone` answers `price` (as a plugin's catalogue would);
    /// once it has, `known_price` knows it too.
    pub fn set_quote(&self, zone: &str, price: Price) {
        lock(&self.inner).quotes.insert(zone.to_string(), price);
    }

    /// While on, `quote` does not return (a slow catalogue).
    pub fn hold_quotes(&self, on: bool) {
        self.hold_quotes.store(on, Ordering::SeqCst);
    }

    /// How many times `quote` was called.
    pub fn quote_calls(&self) -> usize {
        lock(&self.inner).quote_calls
    }

    pub fn set_behaviour(&self, behaviour: Behaviour) {
        *lock(&self.behaviour) = behaviour;
    }

    /// While on, Create makes the instance and then never returns: dropping the call (a
    /// crashing operator) loses the ID, as a crash between Create and the status write does.
    pub fn hold_after_create(&self, on: bool) {
        self.hold_creates.store(on, Ordering::SeqCst);
    }

    /// The next `times` calls of `op` fail with `class`.
    pub fn fail_next(&self, op: Op, class: Class, times: usize) {
        lock(&self.inner).faults.push(Fault {
            op,
            class,
            remaining: times,
        });
    }

    /// From now on every call fails with probability `rate` (deterministic for a `seed`),
    /// with the classes taken in turn.
    pub fn set_random_faults(&self, rate: f64, classes: &[Class], seed: u64) {
        lock(&self.inner).random = Some(RandomFaults {
            rate,
            classes: classes.to_vec(),
            rng: seed.max(1),
            next_class: 0,
        });
    }

    pub fn clear_faults(&self) {
        let mut inner = lock(&self.inner);
        inner.faults.clear();
        inner.random = None;
    }

    /// The backend stops an instance (it will not recover by itself).
    pub fn stop(&self, id: &str) {
        if let Some(i) = lock(&self.inner).instances.get_mut(id) {
            i.state = State::Stopped;
        }
    }

    /// The instance disappears from the backend (deleted behind the operator's back).
    pub fn vanish(&self, id: &str) {
        lock(&self.inner).instances.remove(id);
    }

    /// Puts a running instance on the backend directly, e.g. an orphan for GC.
    pub fn insert(
        &self,
        name: &str,
        uid: &str,
        installation: &str,
        created_at: Option<SystemTime>,
    ) -> String {
        let mut inner = lock(&self.inner);
        inner.next_ip += 1;
        let id = format!("{ID_PREFIX}{name}");
        let ip = inner.fixed_ip.clone().unwrap_or_else(|| ip(inner.next_ip));
        inner.instances.insert(
            id.clone(),
            FakeInstance {
                id: id.clone(),
                name: name.to_string(),
                uid: uid.to_string(),
                installation: installation.to_string(),
                ip,
                state: State::Running,
                created_at,
                cloud_init_bytes: 0,
                port: 3128,
                provisioning_left: 0,
                deleting_left: None,
            },
        );
        id
    }

    /// Every instance still on the backend (deleting ones included).
    pub fn instances(&self) -> Vec<FakeInstance> {
        lock(&self.inner).instances.values().cloned().collect()
    }

    pub fn instance(&self, id: &str) -> Option<FakeInstance> {
        lock(&self.inner).instances.get(id).cloned()
    }

    /// Instances actually created by Create (an idempotent repeat does not count).
    pub fn created(&self) -> usize {
        lock(&self.inner).created
    }

    /// Every call so far: operation and ID (the name, for Create; the installation, for
    /// ListByTag).
    pub fn calls(&self) -> Vec<(Op, String)> {
        lock(&self.inner).calls.clone()
    }

    /// Calls failed by injected faults so far.
    pub fn injected(&self) -> usize {
        lock(&self.inner).injected
    }

    /// The instances of `installation` (created at or after `since`, when given), after
    /// letting the deletions and boots of those it shows progress, as a Get of each would.
    fn list(&self, installation: &str, since: Option<SystemTime>) -> Vec<Instance> {
        let mut inner = lock(&self.inner);
        let shown = |i: &FakeInstance| {
            i.installation == installation
                && since.is_none_or(|s| i.created_at.is_none_or(|c| c >= s))
        };
        inner.instances.retain(|_, i| {
            if !shown(i) {
                return true;
            }
            match &mut i.deleting_left {
                Some(0) => false,
                Some(n) => {
                    *n -= 1;
                    true
                }
                None => true,
            }
        });
        for i in inner.instances.values_mut() {
            if i.state == State::Provisioning && shown(i) {
                if i.provisioning_left == 0 {
                    i.state = State::Running;
                } else {
                    i.provisioning_left -= 1;
                }
            }
        }
        inner
            .instances
            .values()
            .filter(|i| shown(i))
            .map(view)
            .collect()
    }

    /// How many instances each list of recent instances so far returned
    /// ([`Behaviour::lists_recent`]).
    pub fn recent_list_sizes(&self) -> Vec<usize> {
        lock(&self.inner).recent_sizes.clone()
    }

    pub fn count_calls(&self, op: Op) -> usize {
        lock(&self.inner)
            .calls
            .iter()
            .filter(|(o, _)| *o == op)
            .count()
    }

    pub fn last_create_request(&self) -> Option<CreateRequest> {
        lock(&self.inner).last_create.clone()
    }

    fn error(&self, class: Class, op: Op, id: &str, message: &str) -> ProviderError {
        ProviderError::new(class, op, &self.name, id, message)
    }

    /// Records the call, waits the configured latency, and returns an injected fault if
    /// one applies.
    async fn enter(&self, op: Op, id: &str) -> Result<(), ProviderError> {
        let latency = lock(&self.behaviour).latency;
        if !latency.is_zero() {
            tokio::time::sleep(latency).await;
        }
        let mut inner = lock(&self.inner);
        inner.calls.push((op, id.to_string()));
        if let Some(pos) = inner.faults.iter().position(|f| f.op == op) {
            let f = &mut inner.faults[pos];
            f.remaining -= 1;
            let class = f.class;
            if f.remaining == 0 {
                inner.faults.remove(pos);
            }
            inner.injected += 1;
            return Err(self.error(class, op, id, "injected fault"));
        }
        let inner = &mut *inner;
        if let Some(r) = &mut inner.random {
            // xorshift64: deterministic per seed, no dependency.
            r.rng ^= r.rng << 13;
            r.rng ^= r.rng >> 7;
            r.rng ^= r.rng << 17;
            let draw = (r.rng >> 11) as f64 / (1u64 << 53) as f64;
            if draw < r.rate && !r.classes.is_empty() {
                let class = r.classes[r.next_class % r.classes.len()];
                r.next_class += 1;
                inner.injected += 1;
                return Err(self.error(class, op, id, "injected random fault"));
            }
        }
        Ok(())
    }

    /// The synchronous part of Create: the ID, and whether to hold the call afterwards.
    fn create_now(&self, req: &CreateRequest) -> Result<(String, bool), ProviderError> {
        let behaviour = lock(&self.behaviour).clone();
        let mut inner = lock(&self.inner);
        inner.last_create = Some(req.clone());
        let id = format!("{ID_PREFIX}{}", req.name);
        if let Some(existing) = inner.instances.get(&id) {
            if existing.uid != req.uid {
                return Err(self.error(
                    Class::Permanent,
                    Op::Create,
                    &req.name,
                    "name taken by an instance of another UID",
                ));
            }
            return Ok((id, false));
        }
        inner.next_ip += 1;
        inner.created += 1;
        let ip = inner.fixed_ip.clone().unwrap_or_else(|| ip(inner.next_ip));
        let provisioning_left = behaviour.provisioning_gets;
        inner.instances.insert(
            id.clone(),
            FakeInstance {
                id: id.clone(),
                name: req.name.clone(),
                uid: req.uid.clone(),
                installation: req.installation.clone(),
                ip,
                state: if provisioning_left == 0 {
                    State::Running
                } else {
                    State::Provisioning
                },
                created_at: Some(SystemTime::now()),
                cloud_init_bytes: req.cloud_init.len(),
                port: req.port,
                provisioning_left,
                deleting_left: None,
            },
        );
        Ok((id, self.hold_creates.load(Ordering::SeqCst)))
    }

    fn check_id(&self, op: Op, id: &str) -> Result<(), ProviderError> {
        match id.strip_prefix(ID_PREFIX) {
            Some(name) if !name.is_empty() && !name.contains('/') => Ok(()),
            _ => Err(self.error(Class::Permanent, op, id, "malformed instance ID")),
        }
    }
}

fn ip(n: u32) -> String {
    format!("192.0.2.{}", n % 250 + 1)
}

fn view(i: &FakeInstance) -> Instance {
    Instance {
        id: i.id.clone(),
        ip: if i.state == State::Running {
            i.ip.clone()
        } else {
            String::new()
        },
        state: i.state,
        uid: i.uid.clone(),
        created_at: i.created_at,
        ipv6: String::new(),
        interrupted: false,
        hourly_price: None,
    }
}

#[async_trait]
impl Provider for FakeProvider {
    /// Its instances are local proxies on loopback in the loops' tests.
    fn private_addresses_allowed(&self) -> bool {
        true
    }

    fn known_price(&self, placement: &Placement) -> Option<Price> {
        let inner = lock(&self.inner);
        (inner.known_prices.get(&placement.zone))
            .or_else(|| inner.quoted.get(&placement.zone))
            .cloned()
    }

    async fn quote(&self, placement: &Placement) -> Result<Option<Price>, ProviderError> {
        lock(&self.inner).quote_calls += 1;
        while self.hold_quotes.load(Ordering::SeqCst) {
            tokio::time::sleep(std::time::Duration::from_millis(5)).await;
        }
        let mut inner = lock(&self.inner);
        let price = inner.quotes.get(&placement.zone).cloned();
        if let Some(p) = &price {
            inner.quoted.insert(placement.zone.clone(), p.clone());
        }
        Ok(price)
    }

    fn name(&self) -> &str {
        &self.name
    }

    async fn create_at(
        &self,
        req: &CreateRequest,
        _priority: Priority,
    ) -> Result<String, ProviderError> {
        self.enter(Op::Create, &req.name).await?;
        let (id, hold) = self.create_now(req)?;
        if hold {
            std::future::pending::<()>().await;
        }
        Ok(id)
    }

    async fn get_at(&self, id: &str, _priority: Priority) -> Result<Instance, ProviderError> {
        self.enter(Op::Get, id).await?;
        self.check_id(Op::Get, id)?;
        let mut inner = lock(&self.inner);
        let Some(i) = inner.instances.get_mut(id) else {
            return Err(self.error(Class::NotFound, Op::Get, id, "no such instance"));
        };
        if let Some(left) = &mut i.deleting_left {
            if *left == 0 {
                inner.instances.remove(id);
                return Err(self.error(Class::NotFound, Op::Get, id, "no such instance"));
            }
            *left -= 1;
            return Ok(view(i));
        }
        if i.state == State::Provisioning {
            if i.provisioning_left == 0 {
                i.state = State::Running;
            } else {
                i.provisioning_left -= 1;
            }
        }
        Ok(view(i))
    }

    async fn delete_at(&self, id: &str, _priority: Priority) -> Result<(), ProviderError> {
        self.enter(Op::Delete, id).await?;
        self.check_id(Op::Delete, id)?;
        let deleting_gets = lock(&self.behaviour).deleting_gets;
        let mut inner = lock(&self.inner);
        if let Some(i) = inner.instances.get_mut(id)
            && i.deleting_left.is_none()
        {
            if deleting_gets == 0 {
                inner.instances.remove(id);
            } else {
                i.state = State::Terminated;
                i.deleting_left = Some(deleting_gets);
            }
        }
        Ok(())
    }

    /// A listing also lets deletions and boots progress (like a Get of each instance), so
    /// instances deleted by GC, which never calls Get, eventually go away, and instances
    /// confirmed by lists rather than Gets (many in transition) eventually run.
    async fn list_by_tag_at(
        &self,
        installation: &str,
        _priority: Priority,
    ) -> Result<Vec<Instance>, ProviderError> {
        self.enter(Op::List, installation).await?;
        Ok(self.list(installation, None))
    }

    fn lists_recent(&self) -> bool {
        lock(&self.behaviour).lists_recent
    }

    async fn list_recent_at(
        &self,
        installation: &str,
        since: SystemTime,
        priority: Priority,
    ) -> Result<Vec<Instance>, ProviderError> {
        if !self.lists_recent() {
            return self.list_by_tag_at(installation, priority).await;
        }
        self.enter(Op::List, &format!("{installation}{RECENT_LIST_MARK}"))
            .await?;
        let listed = self.list(installation, Some(since));
        lock(&self.inner).recent_sizes.push(listed.len());
        Ok(listed)
    }

    async fn check(&self) -> Option<Vec<TargetStatus>> {
        Some(vec![TargetStatus {
            target: "fake".into(),
            ready: true,
            reason: "Reachable".into(),
            message: String::new(),
            details: vec![],
        }])
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use egress_plugin_host::provider::Placement;

    fn req(name: &str, uid: &str) -> CreateRequest {
        CreateRequest {
            name: name.into(),
            uid: uid.into(),
            namespace: "default".into(),
            proxy_name: "p".into(),
            installation: "inst".into(),
            placement: Placement::default(),
            cloud_init: b"secret".to_vec(),
            port: 3128,
            ip_family: Default::default(),
        }
    }

    #[tokio::test]
    async fn keeps_the_contract_the_loops_rely_on() {
        let p = FakeProvider::new("fake");
        let id = p.create(&req("proxy-a", "u1")).await.unwrap();
        assert_eq!(p.create(&req("proxy-a", "u1")).await.unwrap(), id);
        assert_eq!(p.created(), 1, "Create is idempotent by name");
        assert_eq!(
            p.create(&req("proxy-a", "u2")).await.unwrap_err().class,
            Class::Permanent,
            "another UID's instance is not adopted"
        );
        assert_eq!(p.get(&id).await.unwrap().state, State::Provisioning);
        let running = p.get(&id).await.unwrap();
        assert_eq!(running.state, State::Running);
        assert!(!running.ip.is_empty());
        assert_eq!(running.uid, "u1");
        assert!(running.created_at.is_some());
        assert_eq!(p.list_by_tag("inst").await.unwrap().len(), 1);
        assert!(p.list_by_tag("other").await.unwrap().is_empty());

        p.delete(&id).await.unwrap();
        p.delete(&id).await.unwrap();
        assert_eq!(
            p.get(&id).await.unwrap().state,
            State::Terminated,
            "still shown while deleting"
        );
        assert_eq!(p.get(&id).await.unwrap_err().class, Class::NotFound);
        p.delete(&id).await.unwrap();
        for bad in ["", "fake/", "x/y", "fake/a/b"] {
            assert_eq!(p.get(bad).await.unwrap_err().class, Class::Permanent);
            assert_eq!(p.delete(bad).await.unwrap_err().class, Class::Permanent);
        }
    }

    #[tokio::test]
    async fn faults_are_injected_per_operation() {
        let p = FakeProvider::new("fake");
        p.fail_next(Op::Create, Class::QuotaExceeded, 2);
        for _ in 0..2 {
            assert_eq!(
                p.create(&req("n", "u")).await.unwrap_err().class,
                Class::QuotaExceeded
            );
        }
        let id = p.create(&req("n", "u")).await.unwrap();
        p.fail_next(Op::Get, Class::Transient, 1);
        assert_eq!(p.get(&id).await.unwrap_err().class, Class::Transient);
        p.get(&id).await.unwrap();

        p.set_random_faults(0.5, &[Class::Transient], 7);
        let mut failed = 0;
        for _ in 0..200 {
            failed += p.get(&id).await.is_err() as usize;
        }
        assert!((60..140).contains(&failed), "{failed}");
        p.clear_faults();
        p.get(&id).await.unwrap();
    }
}
