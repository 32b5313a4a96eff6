//! The instances of a backend and every control-surface rule about them: provisioning and
//! its schedule, holds, raw states, addresses, locks, slow deletes, planted instances,
//! failing scopes, the dump, and real-proxy mode. `X` is what a backend stores beyond the
//! common fields (machine type, image, its own flags).

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::control::{DumpInstance, Plant};
use crate::real_proxy::RealProxies;

/// When a new instance leaves its provisioning state by itself.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Schedule {
    /// After this many reads have returned it provisioning. `AfterReads(1)` makes the
    /// first poll see it provisioning and the second running: the provisioning window
    /// exists but costs no wall time.
    AfterReads(u32),
    /// Once this long has passed since the create (checked whenever the API is called).
    After(Duration),
    /// Never by itself: only the control surface moves it.
    Manual,
}

/// The backend's names of the three states the framework moves instances between.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct States {
    pub provisioning: &'static str,
    pub running: &'static str,
    pub deleting: &'static str,
}

/// One instance.
#[derive(Debug, Clone, PartialEq)]
pub struct Record<X> {
    /// The backend's id.
    pub id: String,
    pub name: String,
    /// Region / location / zone: what [`Fleet::fail_scope`] names.
    pub scope: String,
    /// The raw backend state.
    pub state: String,
    pub ip: Option<String>,
    pub labels: BTreeMap<String, String>,
    pub user_data: Vec<u8>,
    /// Unix seconds.
    pub created_at: u64,
    pub extra: X,
    /// Held provisioning by the control surface.
    pub held: bool,
    /// Locked as during a backend action.
    pub locked: bool,
    /// A slow delete is in progress.
    pub deleting: bool,
    reads: u32,
    born: Instant,
}

impl<X> Record<X> {
    /// A provisioning instance without an address, created now.
    pub fn new(id: String, name: String, scope: String, extra: X) -> Self {
        Record {
            id,
            name,
            scope,
            state: String::new(),
            ip: None,
            labels: BTreeMap::new(),
            user_data: Vec::new(),
            created_at: crate::time::now_secs(),
            extra,
            held: false,
            locked: false,
            deleting: false,
            reads: 0,
            born: Instant::now(),
        }
    }
}

/// What a `DELETE` of an instance meets.
#[derive(Debug, Clone, PartialEq)]
pub enum Deletion<X> {
    /// It is gone; here is what it was.
    Done(Record<X>),
    /// A delete of it is already in progress; it stays until that ends.
    InProgress(Record<X>),
    /// It is locked; nothing changed.
    Locked,
    NotFound,
}

/// The instances of one emulator.
#[derive(Debug)]
pub struct Fleet<X> {
    pub states: States,
    pub schedule: Schedule,
    records: BTreeMap<String, Record<X>>,
    next: u64,
    failing: BTreeSet<String>,
    proxies: Option<Arc<RealProxies>>,
}

/// The marks a planted instance carries, as a plugin would write them: managed, uid and
/// installation, each only when `plant` asks for it.
pub fn marks(plant: &Plant) -> Vec<(String, String)> {
    let mut marks = Vec::new();
    if plant.managed {
        marks.push((crate::MARK_MANAGED.into(), crate::MARK_MANAGED_YES.into()));
    }
    if let Some(uid) = &plant.uid {
        marks.push((crate::MARK_UID.into(), uid.clone()));
    }
    if let Some(installation) = &plant.installation {
        marks.push((crate::MARK_INSTALLATION.into(), installation.clone()));
    }
    marks
}

/// The id a control request names: the backend's, also from a plugin's `scope/id`.
pub fn backend_id(id: &str) -> &str {
    id.rsplit('/').next().unwrap_or(id)
}

impl<X: Clone> Fleet<X> {
    pub fn new(states: States, schedule: Schedule, proxies: Option<Arc<RealProxies>>) -> Self {
        Fleet {
            states,
            schedule,
            records: BTreeMap::new(),
            next: 1,
            failing: BTreeSet::new(),
            proxies,
        }
    }

    /// A fresh id from `format` (given 1, 2, ...); ids in use are skipped, and the counter
    /// survives [`Fleet::reset`], so an id a test still holds never names a new instance.
    pub fn allocate(&mut self, format: impl Fn(u64) -> String) -> String {
        loop {
            let id = format(self.next);
            self.next += 1;
            if !self.records.contains_key(&id) {
                return id;
            }
        }
    }

    /// Every instance, ordered by id.
    pub fn iter(&self) -> impl Iterator<Item = &Record<X>> {
        self.records.values()
    }

    pub fn get(&self, id: &str) -> Option<&Record<X>> {
        self.records.get(backend_id(id))
    }

    pub fn get_mut(&mut self, id: &str) -> Option<&mut Record<X>> {
        self.records.get_mut(backend_id(id))
    }

    pub fn name_taken(&self, name: &str) -> bool {
        self.records.values().any(|r| r.name == name)
    }

    /// Puts `record` in as it is (replacing one with its id); a running one with user data
    /// gets its real proxy.
    pub fn insert(&mut self, record: Record<X>) {
        let id = record.id.clone();
        let running = record.state == self.states.running;
        self.records.insert(id.clone(), record);
        if running {
            self.start_proxy(&id);
        }
    }

    /// A new instance in the provisioning state, without an address, as the create
    /// answers it (with `AfterReads(0)` it runs, with address `ip`, right after).
    pub fn create(&mut self, mut record: Record<X>, ip: impl FnOnce() -> String) -> Record<X> {
        record.state = self.states.provisioning.into();
        record.ip = None;
        self.records.insert(record.id.clone(), record.clone());
        if self.schedule == Schedule::AfterReads(0) {
            self.run(&record.id, Some(ip()));
        }
        record
    }

    /// A read has just returned this instance: advance a read-counted schedule. Called
    /// after the answer is rendered, so the read that sees the change is the next one.
    pub fn saw(&mut self, id: &str, address: impl FnOnce() -> String) {
        let Schedule::AfterReads(n) = self.schedule else {
            return;
        };
        let Some(r) = self.records.get_mut(id) else {
            return;
        };
        if r.state == self.states.provisioning && !r.held && !r.deleting {
            r.reads += 1;
            if r.reads >= n {
                self.run(id, Some(address()));
            }
        }
    }

    /// Runs time-based schedules; `address` gives each instance that starts running its IP.
    pub fn tick(&mut self, mut address: impl FnMut() -> String) {
        let Schedule::After(d) = self.schedule else {
            return;
        };
        let due: Vec<String> = self
            .records
            .values()
            .filter(|r| r.state == self.states.provisioning && !r.held && !r.deleting)
            .filter(|r| r.born.elapsed() >= d)
            .map(|r| r.id.clone())
            .collect();
        for id in due {
            self.run(&id, Some(address()));
        }
    }

    /// The instance runs, with `ip` unless it has an address; in real-proxy mode its proxy
    /// starts and its address becomes 127.0.0.1.
    fn run(&mut self, id: &str, ip: Option<String>) {
        let Some(r) = self.records.get_mut(id) else {
            return;
        };
        let was_running = r.state == self.states.running;
        r.state = self.states.running.into();
        r.reads = 0;
        if r.ip.is_none() {
            r.ip = ip;
        }
        if !was_running {
            self.start_proxy(id);
        }
    }

    fn start_proxy(&mut self, id: &str) {
        let Some(proxies) = self.proxies.clone() else {
            return;
        };
        if let Some(r) = self.records.get_mut(id) {
            let data = (!r.user_data.is_empty()).then_some(r.user_data.as_slice());
            r.ip = Some(proxies.start(id, data).to_string());
        }
    }

    fn stop_proxy(&self, id: &str) {
        if let Some(proxies) = &self.proxies {
            proxies.stop(id);
        }
    }

    // ---- the control surface ------------------------------------------------------------

    /// Held: provisioning without an address until released (then the schedule starts
    /// afresh). An instance being deleted stays so.
    pub fn hold(&mut self, id: &str, hold: bool) -> bool {
        let provisioning = self.states.provisioning;
        let Some(r) = self.get_mut(id) else {
            return false;
        };
        if r.deleting {
            return true;
        }
        r.held = hold;
        r.reads = 0;
        if hold {
            r.state = provisioning.into();
            r.ip = None;
            let id = r.id.clone();
            self.stop_proxy(&id);
        }
        true
    }

    /// A raw state; the running state also gives an instance without an address `ip`.
    pub fn set_state(&mut self, id: &str, state: &str, ip: impl FnOnce() -> String) -> bool {
        let Some(r) = self.get_mut(id) else {
            return false;
        };
        r.held = false;
        let id = r.id.clone();
        if state == self.states.running {
            self.run(&id, Some(ip()));
        } else {
            if let Some(r) = self.records.get_mut(&id) {
                r.state = state.into();
            }
            self.stop_proxy(&id);
        }
        true
    }

    pub fn set_address(&mut self, id: &str, ip: Option<&str>) -> bool {
        let Some(r) = self.get_mut(id) else {
            return false;
        };
        r.ip = ip.map(str::to_string);
        true
    }

    /// A delete that stays in progress until [`Fleet::finish_deletes`].
    pub fn slow_delete(&mut self, id: &str) -> bool {
        let deleting = self.states.deleting;
        let Some(r) = self.get_mut(id) else {
            return false;
        };
        r.held = false;
        r.deleting = true;
        r.state = deleting.into();
        let id = r.id.clone();
        self.stop_proxy(&id);
        true
    }

    pub fn finish_deletes(&mut self) {
        let ids: Vec<String> = self.iter().filter(|r| r.deleting).map(|r| r.id.clone()).collect();
        for id in ids {
            self.remove(&id);
        }
    }

    pub fn set_locked(&mut self, id: &str, locked: bool) -> bool {
        let Some(r) = self.get_mut(id) else {
            return false;
        };
        r.locked = locked;
        true
    }

    /// The API's delete: refused while locked, left alone while a delete is in progress.
    pub fn delete(&mut self, id: &str) -> Deletion<X> {
        match self.records.get(id) {
            None => Deletion::NotFound,
            Some(r) if r.locked => Deletion::Locked,
            Some(r) if r.deleting => Deletion::InProgress(r.clone()),
            Some(_) => match self.remove(id) {
                Some(r) => Deletion::Done(r),
                None => Deletion::NotFound,
            },
        }
    }

    pub fn remove(&mut self, id: &str) -> Option<Record<X>> {
        self.stop_proxy(id);
        self.records.remove(id)
    }

    /// A running instance behind the plugin's back, with the marks `plant` asks for; the
    /// caller has checked the name.
    pub fn plant(&mut self, id: String, plant: &Plant, scope: String, ip: String, extra: X) {
        let mut r = Record::new(id, plant.name.clone(), scope, extra);
        r.labels = marks(plant).into_iter().collect();
        r.state = self.states.running.into();
        r.ip = Some(ip);
        if let Some(t) = plant.created_at {
            r.created_at = t;
        }
        self.insert(r);
    }

    pub fn fail_scope(&mut self, scope: &str, fail: bool) {
        if fail {
            self.failing.insert(scope.to_string());
        } else {
            self.failing.remove(scope);
        }
    }

    /// The first failing scope among `scopes`: a list touching it fails whole.
    pub fn failing_scope<'a>(&self, mut scopes: impl Iterator<Item = &'a str>) -> Option<&'a str> {
        scopes.find(|s| self.failing.contains(*s))
    }

    pub fn dump(&self) -> Vec<DumpInstance> {
        self.iter()
            .map(|r| DumpInstance {
                id: r.id.clone(),
                name: r.name.clone(),
                scope: r.scope.clone(),
                state: r.state.clone(),
                ip: r.ip.clone().unwrap_or_default(),
                labels: r.labels.clone().into_iter().collect(),
                user_data: r.user_data.clone(),
            })
            .collect()
    }

    /// Forgets every instance and failing scope; the id counter keeps counting.
    pub fn reset(&mut self) {
        for id in self.records.keys() {
            self.stop_proxy(id);
        }
        self.records.clear();
        self.failing.clear();
    }
}

impl<X> Drop for Fleet<X> {
    /// Real-proxy mode: the proxies of these instances stop with them.
    fn drop(&mut self) {
        if let Some(proxies) = &self.proxies {
            for id in self.records.keys() {
                proxies.stop(id);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const STATES: States = States { provisioning: "new", running: "active", deleting: "archive" };

    fn fleet(schedule: Schedule) -> (Fleet<()>, String) {
        let mut f = Fleet::new(STATES, schedule, None);
        let id = f.allocate(|n| format!("{n:09}"));
        f.create(Record::new(id.clone(), "a".into(), "r1".into(), ()), || "203.0.113.1".into());
        (f, id)
    }

    /// What each schedule shows after a number of reads, and after time passes.
    #[test]
    fn schedules_move_provisioning_instances_to_running() {
        let cases = [
            (Schedule::AfterReads(0), 0, Duration::ZERO, "active"),
            (Schedule::AfterReads(1), 0, Duration::ZERO, "new"),
            (Schedule::AfterReads(1), 1, Duration::ZERO, "active"),
            (Schedule::AfterReads(3), 2, Duration::ZERO, "new"),
            (Schedule::Manual, 5, Duration::from_millis(30), "new"),
            (Schedule::After(Duration::from_millis(20)), 0, Duration::ZERO, "new"),
            (Schedule::After(Duration::from_millis(20)), 0, Duration::from_millis(30), "active"),
        ];
        for (schedule, reads, wait, want) in cases {
            let (mut f, id) = fleet(schedule);
            for _ in 0..reads {
                f.saw(&id, || "203.0.113.1".into());
            }
            std::thread::sleep(wait);
            f.tick(|| "203.0.113.1".into());
            let r = f.get(&id).unwrap();
            assert_eq!(r.state, want, "{schedule:?} after {reads} reads, {wait:?}");
            assert_eq!(r.ip.is_some(), want == "active", "{schedule:?}");
        }
    }

    #[test]
    fn holds_locks_and_slow_deletes() {
        let (mut f, id) = fleet(Schedule::AfterReads(1));
        assert!(f.hold(&format!("r1/{id}"), true), "scope prefix accepted");
        f.saw(&id, || "ip".into());
        assert_eq!(f.get(&id).unwrap().state, "new", "held");
        assert!(f.set_state(&id, "active", || "203.0.113.7".into()));
        assert_eq!(f.get(&id).unwrap().ip.as_deref(), Some("203.0.113.7"));
        assert!(f.set_locked(&id, true));
        assert_eq!(f.delete(&id), Deletion::Locked);
        assert!(f.set_locked(&id, false));
        assert!(f.slow_delete(&id));
        assert!(f.hold(&id, true), "a delete in progress is not held");
        assert!(matches!(f.delete(&id), Deletion::InProgress(r) if r.state == "archive"));
        assert!(f.name_taken("a"));
        f.finish_deletes();
        assert_eq!(f.delete(&id), Deletion::NotFound);
        assert!(!f.hold("000000099", true));
        f.reset();
        assert_ne!(f.allocate(|n| format!("{n:09}")), id, "ids are not reused");
    }

    #[test]
    fn plants_carry_the_marks_asked_for_and_scopes_fail() {
        let mut f: Fleet<()> = Fleet::new(STATES, Schedule::Manual, None);
        let plant = Plant {
            name: "p".into(),
            managed: true,
            uid: Some(String::new()),
            created_at: Some(7),
            ..Plant::default()
        };
        f.plant("x".into(), &plant, "r2".into(), "203.0.113.9".into(), ());
        let dump = f.dump();
        assert_eq!(dump[0].state, "active");
        assert_eq!(
            dump[0].labels,
            [
                (crate::MARK_MANAGED.to_string(), "true".to_string()),
                (crate::MARK_UID.to_string(), String::new()),
            ]
        );
        assert_eq!(f.get("x").unwrap().created_at, 7);
        f.fail_scope("r2", true);
        assert_eq!(f.failing_scope(["r1", "r2"].into_iter()), Some("r2"));
        f.fail_scope("r2", false);
        assert_eq!(f.failing_scope(["r2"].into_iter()), None);
    }
}
