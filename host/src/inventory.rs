//! The inventory: what each provider's last ListByTag said, so that drift detection costs
//! one list per provider per drift interval instead of one Get per Running Proxy.
//!
//! The core is pure: [`Inventory`] keeps, per provider, `ID -> Instance` and the time the
//! list was taken; [`Inventory::lookup`] answers only from a fresh list (younger than
//! `max_age`, two drift intervals by default, or two of that provider's list intervals if
//! longer) taken from the provider that is configured now. A list that fails leaves the
//! previous one in place, which then ages out: a stale inventory is never used, and the
//! reconciler falls back to Get.
//!
//! A list costs one request per page, so its cost grows with the fleet while the budget
//! does not: [`list_interval`] spaces a provider's lists so that they use at most
//! [`LIST_SHARE`] of its request budget, measured on what its last list actually sent.
//!
//! A plugin that lists recent instances (contract 0.3.0 `lists-recent`) confirms a
//! rollout with short lists of the instances created since the oldest Proxy in transition
//! was made ([`Inventory::recent_listing`], [`recent_interval`]): their cost follows the
//! Proxies they confirm, not the fleet, so whole lists are left to drift detection.
//!
//! An ID missing from a list proves nothing (the contract lets only Get conclude
//! not-found): [`needs_recheck`] names the Running Proxies a new list does not confirm, and
//! the loop ([`run`]) has them reconciled at once, which makes them Get. An instance
//! deleted behind the operator's back is therefore noticed within one drift interval plus
//! one list.

use crate::api::Proxy;
use crate::proxy_cache::ProxyCache;
use crate::registry::ProviderRegistry;
use egress_plugin_host::provider::Priority;
use egress_plugin_host::provider::{Instance, IpFamily, Pacing, Provider, State};
use kube::runtime::reflector::{ObjectRef, Store};
use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, RwLock};
use std::time::{Duration, SystemTime};
use tracing::{debug, warn};

/// One provider's last successful list.
#[derive(Debug, Clone)]
pub struct Listing {
    /// When the list was started: it shows the backend at least as new as this.
    pub at: SystemTime,
    /// The provider that answered ([`provider_key`]): a reloaded provider starts empty.
    provider: usize,
    pub instances: Instances,
    /// How long it stays fresh, when longer than the inventory's `max_age` (a provider
    /// listed less often than every drift poll).
    fresh_for: Duration,
    /// When the list ended: lists confirming transitions are due their interval after
    /// the last one ended, and a Proxy waits for lists only while one ended within that
    /// interval and two polls ([`by_list_view`]).
    pub done: SystemTime,
    /// A list of recent instances: it shows every instance created at or after this time
    /// (the operator's clock, less a margin), and says nothing of older ones. `None`: the
    /// whole fleet.
    pub covers_from: Option<SystemTime>,
}

/// A list's instances by ID: the list itself, sorted, looked up by binary search.
///
/// A map was twice the memory for the same answers (its table beside the instances, and a
/// copy of each ID as its key), and it was built beside the list it came from, while the
/// previous list was still in use: three lists of a 10,000-instance fleet at once, every
/// list interval, the operator's largest transient allocation.
#[derive(Debug, Clone, Default)]
pub struct Instances(Vec<Instance>);

impl From<Vec<Instance>> for Instances {
    /// Sorted in place; of two instances with one ID (a backend that lists one twice
    /// across pages) the later one stands, as the map had it.
    fn from(mut list: Vec<Instance>) -> Self {
        list.reverse();
        // Stable: the later of two equal IDs, first after the reverse, stays first.
        list.sort_by(|a, b| a.id.cmp(&b.id));
        list.dedup_by(|later, kept| later.id == kept.id);
        list.shrink_to_fit();
        Instances(list)
    }
}

impl FromIterator<Instance> for Instances {
    fn from_iter<T: IntoIterator<Item = Instance>>(iter: T) -> Self {
        Instances::from(iter.into_iter().collect::<Vec<_>>())
    }
}

impl Instances {
    pub fn get(&self, id: &str) -> Option<&Instance> {
        self.0
            .binary_search_by(|i| i.id.as_str().cmp(id))
            .ok()
            .map(|at| &self.0[at])
    }

    pub fn contains_key(&self, id: &str) -> bool {
        self.get(id).is_some()
    }

    pub fn values(&self) -> std::slice::Iter<'_, Instance> {
        self.0.iter()
    }

    pub fn len(&self) -> usize {
        self.0.len()
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

impl Listing {
    /// Whether an instance made at `made` would be in this list if it existed.
    pub fn covers(&self, made: SystemTime) -> bool {
        self.covers_from.is_none_or(|from| made >= from)
    }

    pub fn age(&self, now: SystemTime) -> Duration {
        // A clock that went back makes a list look new, never old enough to be dropped
        // early; it still ages out from then on.
        now.duration_since(self.at).unwrap_or_default()
    }
}

/// Identity of a configured provider object: a registry swap that rebuilds a provider
/// (new configuration, new plugin) gives it a new key, so its old list is not used.
pub fn provider_key(p: &Arc<dyn Provider>) -> usize {
    Arc::as_ptr(p) as *const () as usize
}

/// Per provider name, the last successful list. Cheap to share (`Arc`).
#[derive(Debug)]
pub struct Inventory {
    max_age: Duration,
    lists: RwLock<BTreeMap<String, Arc<Listing>>>,
    /// Per provider name, the last successful list of recent instances
    /// ([`Listing::covers_from`]): what confirms its Proxies in transition when its plugin
    /// lists recent instances.
    recent: RwLock<BTreeMap<String, Arc<Listing>>>,
    /// Provider names with a list under way (how many marks each), whole lists (`false`)
    /// apart from lists of recent instances (`true`).
    in_flight: RwLock<BTreeMap<(String, bool), usize>>,
    /// Per provider name, the provider ([`provider_key`]) whose list last finished,
    /// successfully or not.
    tried: RwLock<BTreeMap<String, usize>>,
    /// How many list loops ([`run`]) are running: while one is, a configured provider not
    /// yet tried will be listed shortly.
    loops: std::sync::atomic::AtomicUsize,
    /// Provider names whose Proxies in transition are confirmed by lists now
    /// ([`confirm_by_list`]), as the list loop last decided, and how far apart those
    /// lists are ([`list_interval`] from the provisioning poll).
    by_list: RwLock<BTreeMap<String, Option<Duration>>>,
    /// When this process's creates were asked for and when they returned, per provider
    /// name and instance ID ([`Inventory::created`]): a Proxy's `Provisioned` condition
    /// changes before its Create is sent, so a list that started in between did not miss
    /// the instance; and a list of recent instances must reach back to before the backend
    /// made it. Kept until a list shows the instance, or for [`MADE_KEPT`]; at most
    /// [`MADE_MAX`].
    made: std::sync::Mutex<HashMap<(String, String), (SystemTime, SystemTime)>>,
    /// The wall clock that says when a recorded list ended ([`Listing::done`], never before
    /// it started). Unit tests record lists at fixed dates: there it reads the epoch, so a
    /// list ends when it started and no test depends on today's date.
    clock: fn() -> SystemTime,
}

/// How long [`Inventory::created`] remembers a create no list showed yet.
pub const MADE_KEPT: Duration = Duration::from_secs(3600);
/// The creates remembered at once (about 100 bytes each); past it the oldest go first,
/// and their Proxies fall back to the condition's time (a Get at worst).
pub const MADE_MAX: usize = 65_536;

impl Inventory {
    /// An empty inventory whose lists are used for at most `max_age`.
    pub fn new(max_age: Duration) -> Self {
        Inventory {
            max_age,
            lists: RwLock::new(BTreeMap::new()),
            recent: Default::default(),
            in_flight: Default::default(),
            tried: Default::default(),
            loops: Default::default(),
            by_list: Default::default(),
            made: Default::default(),
            clock: if cfg!(test) {
                || SystemTime::UNIX_EPOCH
            } else {
                SystemTime::now
            },
        }
    }

    /// A create of instance `id` of provider `name` returned at `at`: lists that started
    /// earlier do not show it, and say nothing about it (see [`by_list_view`]).
    pub fn created(&self, name: &str, id: &str, at: SystemTime) {
        self.created_between(name, id, at, at);
    }

    /// [`Inventory::created`] for a create asked for at `asked`: the backend made the
    /// instance in between, so a list of recent instances that reaches back to `asked`
    /// shows it. The return alone was not enough: at x60, a create that returned a poll
    /// after the backend made it was left out of such lists, and its Proxy sent to Get.
    pub fn created_between(&self, name: &str, id: &str, asked: SystemTime, at: SystemTime) {
        let mut made = self.made.lock().unwrap_or_else(|e| e.into_inner());
        if made.len() >= MADE_MAX {
            let horizon = at.checked_sub(MADE_KEPT).unwrap_or(SystemTime::UNIX_EPOCH);
            made.retain(|_, (_, t)| *t > horizon);
            while made.len() >= MADE_MAX {
                let Some(oldest) = made
                    .iter()
                    .min_by_key(|(_, (_, t))| *t)
                    .map(|(k, _)| k.clone())
                else {
                    break;
                };
                made.remove(&oldest);
            }
        }
        made.insert((name.to_string(), id.to_string()), (asked.min(at), at));
    }

    /// When this process's create of `id` was asked for and returned, if remembered.
    fn made_between(&self, name: &str, id: &str) -> Option<(SystemTime, SystemTime)> {
        self.made
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(&(name.to_string(), id.to_string()))
            .copied()
    }

    /// When this process's create of `id` returned, if remembered.
    fn made_at(&self, name: &str, id: &str) -> Option<SystemTime> {
        self.made_between(name, id).map(|(_, at)| at)
    }

    /// How long until a provisioning poll (`poll`) has passed since this process's create
    /// of `id` returned: the first Get of its Proxy waits for that. `None` once it has, or
    /// when the create is not remembered (made before a restart, or already listed: its
    /// Proxy then takes the list's answer).
    pub fn first_look_in(
        &self,
        name: &str,
        id: &str,
        now: SystemTime,
        poll: Duration,
    ) -> Option<Duration> {
        let at = self.made_at(name, id)?;
        let since = now.duration_since(at).unwrap_or_default();
        poll.checked_sub(since).filter(|d| !d.is_zero())
    }

    /// Forgets the creates `listing` shows (their Proxies take its answer from now on)
    /// and those older than [`MADE_KEPT`].
    fn forget_made(&self, name: &str, listing: &Listing) {
        let horizon = listing
            .at
            .checked_sub(MADE_KEPT)
            .unwrap_or(SystemTime::UNIX_EPOCH);
        self.made
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .retain(|(n, id), (_, t)| {
                *t > horizon && !(n == name && listing.instances.contains_key(id.as_str()))
            });
    }

    /// How the reconcile of a Proxy in transition with instance `id` learns how it is
    /// doing (see [`by_list_view`]). `since`: when its `Provisioned` condition last
    /// changed (the create, for a new instance); `fresh`: the provisioning poll.
    pub fn transition(
        &self,
        name: &str,
        provider: &Arc<dyn Provider>,
        id: &str,
        since: Option<SystemTime>,
        now: SystemTime,
        fresh: Duration,
    ) -> ByList {
        let Some(every) = self.confirm_every(name) else {
            return ByList::No;
        };
        let listing = self.listing(name, provider, now);
        let recent = self.recent_listing(name, provider, now);
        let lists: Vec<&Listing> = [listing.as_deref(), recent.as_deref()]
            .into_iter()
            .flatten()
            .collect();
        let since = since.max(self.made_at(name, id));
        let under_way = self.under_way(name, false) || self.under_way(name, true);
        by_list_view(&lists, under_way, id, since, now, fresh, every)
    }

    /// Whether a list of `name` is under way: of recent instances, or a whole one.
    fn under_way(&self, name: &str, recent: bool) -> bool {
        self.in_flight
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .contains_key(&(name.to_string(), recent))
    }

    /// No later than the backend made instance `id` of `name`: when its create was asked
    /// for, as far as remembered, else the time its Proxy's `Provisioned` condition last
    /// changed (`since`, before the create).
    pub fn made(&self, name: &str, id: &str, since: Option<SystemTime>) -> Option<SystemTime> {
        self.made_between(name, id)
            .map(|(asked, _)| asked)
            .or(since)
    }

    /// How far apart the lists that confirm `name`'s Proxies in transition are, while
    /// they do.
    pub fn confirm_every(&self, name: &str) -> Option<Duration> {
        self.by_list
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .get(name)
            .copied()
            .flatten()
    }

    fn set_by_list(&self, name: &str, on: Option<Duration>) {
        self.by_list
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .insert(name.to_string(), on);
    }

    pub fn max_age(&self) -> Duration {
        self.max_age
    }

    /// Records a successful list of `provider` (configured under `name`), started at `at`.
    pub fn record(
        &self,
        name: &str,
        provider: &Arc<dyn Provider>,
        at: SystemTime,
        instances: Vec<Instance>,
    ) -> Arc<Listing> {
        self.record_for(name, provider, at, instances, Duration::ZERO)
    }

    /// [`Inventory::record`], for a list that stays fresh for `fresh_for` if that is
    /// longer than `max_age`.
    pub fn record_for(
        &self,
        name: &str,
        provider: &Arc<dyn Provider>,
        at: SystemTime,
        instances: Vec<Instance>,
        fresh_for: Duration,
    ) -> Arc<Listing> {
        self.keep(name, provider, (at, None), instances, fresh_for)
    }

    /// Records a successful list of the recent instances of `provider` (those made at or
    /// after `from`), started at `at`, used for at most `fresh_for` after it ended.
    pub fn record_recent(
        &self,
        name: &str,
        provider: &Arc<dyn Provider>,
        (at, from): (SystemTime, SystemTime),
        instances: Vec<Instance>,
        fresh_for: Duration,
    ) -> Arc<Listing> {
        self.keep(name, provider, (at, Some(from)), instances, fresh_for)
    }

    /// Keeps a successful list started at `at` (of the instances made from `from`, or of
    /// all): as the provider's list of recent instances or its whole list, unless a newer
    /// one of the same kind is kept already (a slower, older list never replaces it).
    fn keep(
        &self,
        name: &str,
        provider: &Arc<dyn Provider>,
        (at, from): (SystemTime, Option<SystemTime>),
        instances: Vec<Instance>,
        fresh_for: Duration,
    ) -> Arc<Listing> {
        let listing = Arc::new(Listing {
            at,
            provider: provider_key(provider),
            instances: Instances::from(instances),
            fresh_for,
            done: (self.clock)().max(at),
            covers_from: from,
        });
        self.forget_made(name, &listing);
        let kept = if from.is_some() {
            &self.recent
        } else {
            &self.lists
        };
        let mut kept = kept.write().unwrap_or_else(|e| e.into_inner());
        match kept.get(name) {
            Some(old) if old.at > at && old.provider == listing.provider => old.clone(),
            _ => {
                kept.insert(name.to_string(), listing.clone());
                listing
            }
        }
    }

    /// The last list of recent instances of `provider`, while it is fresh: ended at most
    /// its `fresh_for` ago.
    pub fn recent_listing(
        &self,
        name: &str,
        provider: &Arc<dyn Provider>,
        now: SystemTime,
    ) -> Option<Arc<Listing>> {
        let recent = self.recent.read().unwrap_or_else(|e| e.into_inner());
        let l = recent.get(name)?;
        let age = now.duration_since(l.done).unwrap_or_default();
        (l.provider == provider_key(provider) && age <= l.fresh_for).then(|| l.clone())
    }

    /// The fresh list of `provider` (configured under `name`), if there is one.
    pub fn listing(
        &self,
        name: &str,
        provider: &Arc<dyn Provider>,
        now: SystemTime,
    ) -> Option<Arc<Listing>> {
        let lists = self.lists.read().unwrap_or_else(|e| e.into_inner());
        let l = lists.get(name)?;
        let fresh = l.age(now) <= self.max_age.max(l.fresh_for);
        (l.provider == provider_key(provider) && fresh).then(|| l.clone())
    }

    /// When the fresh whole list of `provider` started before `since`, so that it says
    /// nothing of an instance that was not running then: how long until the next one
    /// should have ended (its interval and its own time after the fresh one, zero once
    /// overdue). `None` when the fresh list started after `since`, or there is none.
    pub fn listed_before(
        &self,
        name: &str,
        provider: &Arc<dyn Provider>,
        since: SystemTime,
        now: SystemTime,
    ) -> Option<Duration> {
        self.listing(name, provider, now)
            .filter(|l| l.at < since)
            .map(|l| {
                (l.done + l.fresh_for / 2)
                    .duration_since(now)
                    .unwrap_or_default()
            })
    }

    /// What the newest fresh list that shows instance `id` says of it, a whole list or a
    /// list of recent instances: `None` when none shows it (only Get can tell then). A
    /// Proxy a list of recent instances confirmed is in no whole list until the next one,
    /// and its own status write brings it back at once: without the recent list, it made a
    /// Get (796 for 2,000 Proxies).
    pub fn lookup(
        &self,
        name: &str,
        provider: &Arc<dyn Provider>,
        id: &str,
        now: SystemTime,
    ) -> Option<Instance> {
        [
            self.listing(name, provider, now),
            self.recent_listing(name, provider, now),
        ]
        .into_iter()
        .flatten()
        .filter(|l| l.instances.contains_key(id))
        .max_by_key(|l| l.at)
        .and_then(|l| l.instances.get(id).cloned())
    }

    /// Whether a list of `provider` will come while it has no fresh one: one is under way,
    /// or a list loop runs and has not tried this provider yet (just configured, or
    /// rebuilt by a reload). The reconciler waits for it rather than Get every Running
    /// Proxy (all of them, after a start or a reload).
    pub fn pending(&self, name: &str, provider: &Arc<dyn Provider>, now: SystemTime) -> bool {
        let under_way = self.under_way(name, false);
        let untried = self.loops.load(std::sync::atomic::Ordering::SeqCst) > 0
            && self
                .tried
                .read()
                .unwrap_or_else(|e| e.into_inner())
                .get(name)
                != Some(&provider_key(provider));
        (under_way || untried) && self.listing(name, provider, now).is_none()
    }

    /// Notes that a list of `provider` (configured under `name`) finished, successfully or
    /// not: it is no longer [`Inventory::pending`] for want of a first try.
    fn tried(&self, name: &str, provider: &Arc<dyn Provider>) {
        self.tried
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .insert(name.to_string(), provider_key(provider));
    }

    /// Marks a list loop as running until the guard is dropped.
    fn loop_running(self: &Arc<Self>) -> LoopRunning {
        self.loops.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        LoopRunning(self.clone())
    }

    /// Marks a whole list of `name` as under way until the guard is dropped.
    pub fn listing_under_way(self: &Arc<Self>, name: &str) -> InFlight {
        self.under_way_as(name, false)
    }

    /// Marks a list of `name`, of `recent` instances or whole, as under way until the
    /// guard is dropped.
    fn under_way_as(self: &Arc<Self>, name: &str, recent: bool) -> InFlight {
        let key = (name.to_string(), recent);
        *self
            .in_flight
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .entry(key.clone())
            .or_default() += 1;
        InFlight(self.clone(), key)
    }

    /// Forgets providers no longer configured.
    pub fn retain(&self, names: &[&str]) {
        self.lists
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .retain(|k, _| names.contains(&k.as_str()));
        self.recent
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .retain(|k, _| names.contains(&k.as_str()));
        self.tried
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .retain(|k, _| names.contains(&k.as_str()));
        self.by_list
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .retain(|k, _| names.contains(&k.as_str()));
    }
}

/// Lists confirm a provider's Proxies in transition once one list page replaces at least
/// this many Gets: a list of `p` pages is made only for `CONFIRMS_PER_PAGE x p` Proxies or
/// more. Two: each of those Proxies would Get every provisioning poll until its instance
/// runs, and the list comes at most that often (less often when the budget calls for it,
/// [`list_interval`]), so from there on a list costs at most half the Gets it replaces. At
/// one, a lone Proxy of a small fleet waited on a one-page list that saves nothing over its
/// own Get, and on a backend whose lists show a boot later than its Gets (the Linode
/// and Proxmox emulators move an instance on a Get only) it never ran.
///
/// Issue 29: 10,000 Proxies on Hetzner's 3,600/h spent 10,018 Gets confirming their
/// creates, as many requests as the creates themselves. With four per page, 2,000 Proxies
/// still spent 2,296 Gets: the threshold left every Proxy of a provider with more than a
/// quarter as many Proxies in transition as list pages to Get.
pub const CONFIRMS_PER_PAGE: u64 = 2;

/// Whether a provider with `in_transition` Proxies waiting to be confirmed should list
/// rather than Get each, its last list having sent `list_requests` (pages; one before the
/// first).
pub fn confirm_by_list(in_transition: usize, list_requests: Option<u32>) -> bool {
    in_transition > 0
        && in_transition as u64 >= CONFIRMS_PER_PAGE * u64::from(list_requests.unwrap_or(1).max(1))
}

/// How the reconcile of a Proxy in transition learns how its instance does, while its
/// provider confirms by list.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ByList {
    /// The provider's newest fresh list shows the instance: its answer, no call.
    Listed(Instance),
    /// A list under way, or due, will answer: come back at the provisioning poll.
    Wait,
    /// Ask the provider (Get): lists do not confirm this provider's Proxies now, or a list
    /// that started after the instance was made does not show it (only Get concludes).
    No,
}

/// [`ByList`] for instance `id`, made at `since`, from the provider's fresh `lists` (a
/// whole one, a list of recent instances, or both) and whether one is `under_way`.
///
/// The newest list that speaks of the instance answers: one that shows it, or one that
/// started after it was made and covers that time ([`Listing::covers`]) without showing it
/// (then only Get concludes). When none does, a Proxy waits for lists only while they keep
/// coming: one under way, or one ended within their interval `every` and two provisioning
/// polls (`fresh`); else it Gets.
pub fn by_list_view(
    lists: &[&Listing],
    under_way: bool,
    id: &str,
    since: Option<SystemTime>,
    now: SystemTime,
    fresh: Duration,
    every: Duration,
) -> ByList {
    let age = |l: &Listing| now.duration_since(l.done).unwrap_or_default();
    let speaks = |l: &&&Listing| {
        l.instances.contains_key(id) || since.is_some_and(|s| l.at > s && l.covers(s))
    };
    if let Some(l) = lists.iter().filter(speaks).max_by_key(|l| l.at) {
        return match l.instances.get(id) {
            // Running with no address: some backends' lists never carry one (Proxmox's
            // VM list: the address comes from the guest agent, which only a Get asks), so
            // only a Get concludes. Waiting on lists would keep the Proxy Provisioning.
            Some(inst)
                if inst.state == State::Running && inst.ip.is_empty() && inst.ipv6.is_empty() =>
            {
                ByList::No
            }
            // The newest list: a Proxy listed as still booting is told so until the next
            // list, as a Get would tell it at its next poll.
            Some(inst) => ByList::Listed(inst.clone()),
            // Made before that list started, in what it covers, and not in it.
            None => ByList::No,
        };
    }
    if since.is_none() {
        return ByList::No;
    }
    let coming = under_way || lists.iter().any(|l| age(l) <= every + fresh * 2);
    if coming { ByList::Wait } else { ByList::No }
}

/// When a Proxy's `Provisioned` condition last changed: for a new instance, just before
/// its Create was sent.
pub fn provisioned_since(status: &crate::api::ProxyStatus) -> Option<SystemTime> {
    status
        .conditions
        .iter()
        .find(|c| c.type_ == crate::api::condition::PROVISIONED)
        .map(|c| SystemTime::from(c.last_transition_time.0))
}

/// A list loop that runs (see [`Inventory::loop_running`]).
struct LoopRunning(Arc<Inventory>);

impl Drop for LoopRunning {
    fn drop(&mut self) {
        self.0
            .loops
            .fetch_sub(1, std::sync::atomic::Ordering::SeqCst);
    }
}

/// A list under way (see [`Inventory::listing_under_way`]).
pub struct InFlight(Arc<Inventory>, (String, bool));

impl Drop for InFlight {
    fn drop(&mut self) {
        let mut all = self.0.in_flight.write().unwrap_or_else(|e| e.into_inner());
        if let Some(n) = all.get_mut(&self.1) {
            *n -= 1;
            if *n == 0 {
                all.remove(&self.1);
            }
        }
    }
}

/// A Running Proxy as [`needs_recheck`] sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RunningView {
    pub id: String,
    pub ip: String,
    /// The family `ip` was chosen in (`spec.ipFamily`).
    pub family: IpFamily,
    /// When its `Provisioned` condition last changed ([`provisioned_since`]): a whole
    /// list that started before says nothing of an instance made since.
    pub since: Option<SystemTime>,
}

/// The Running view of a Proxy of provider `name`: not being deleted, `Running` with an
/// ID and an address in its status.
pub fn running_view(p: &Proxy, name: &str) -> Option<RunningView> {
    if p.spec.provider != name || p.metadata.deletion_timestamp.is_some() {
        return None;
    }
    let s = p.status.as_ref()?;
    if s.state.as_deref() != Some(State::Running.as_str()) {
        return None;
    }
    Some(RunningView {
        id: s.provider_id.clone().filter(|i| !i.is_empty())?,
        ip: s.ip.clone().filter(|i| !i.is_empty())?,
        family: p.spec.ip_family.to_provider(),
        since: provisioned_since(s),
    })
}

/// The instance ID of a Proxy of provider `name` in transition: an instance recorded, not
/// Running, not being deleted. Lists confirm these when there are many ([`confirm_by_list`]).
pub fn in_transition_id<'p>(p: &'p Proxy, name: &str) -> Option<&'p str> {
    if p.spec.provider != name {
        return None;
    }
    transition_id(p.metadata.deletion_timestamp.is_some(), p.status.as_ref()?)
}

/// [`in_transition_id`] of a Proxy with this `status`, `deleting` or not.
pub fn transition_id(deleting: bool, s: &crate::api::ProxyStatus) -> Option<&str> {
    if deleting || s.state.as_deref() == Some(State::Running.as_str()) {
        return None;
    }
    s.provider_id.as_deref().filter(|i| !i.is_empty())
}

/// Whether `listing` confirms a Running Proxy as it is: its instance listed, Running, at
/// the same address. Anything else (missing, stopped, another address) needs a Get.
pub fn confirms(listing: &Listing, view: &RunningView) -> bool {
    listed_running_at(listing.instances.get(&view.id), &view.ip, view.family)
}

/// Whether a listed instance runs at `ip`, its address of `family`.
pub fn listed_running_at(listed: Option<&Instance>, ip: &str, family: IpFamily) -> bool {
    listed.is_some_and(|i| {
        i.state == State::Running
            && i.address(family)
                .is_some_and(|a| Ok(a) == ip.parse::<std::net::IpAddr>())
    })
}

/// Whether a new list leaves a Running Proxy unconfirmed, so that it must Get: its
/// instance missing, not Running or at another address. A Proxy made after the list
/// started and missing from it is left out: the list says nothing of it (a list of recent
/// instances confirmed it since), and the next list will.
pub fn needs_recheck(listing: &Listing, view: &RunningView) -> bool {
    let unseen =
        !listing.instances.contains_key(&view.id) && view.since.is_some_and(|s| s > listing.at);
    !unseen && !confirms(listing, view)
}

/// The share of a provider's request budget its periodic lists may use. The rest is for
/// what users wait on (creates, deletes, Proxies in transition) and provider checks.
pub const LIST_SHARE: f64 = 0.5;

/// The share lists may use while creates, deletes or transitions wait
/// ([`Pacing::contended`]): three quarters of what the Background class is guaranteed
/// then (a fifth), the rest left to provider checks and drift Gets. Spaced this way a list
/// gets its pages within its interval however long the rollout, and during a rollout at
/// the budget's floor lists cost the creates at most 15% more time.
pub fn contended_list_share() -> f64 {
    0.75 * egress_plugin_host::provider::priority::guaranteed_share(Priority::Background)
}

/// The share lists of recent instances ([`Provider::list_recent_at`]) may use while
/// creates, deletes or transitions wait, taken from what whole lists get then: a rollout
/// confirmed by them runs at the budget's floor plus [`contended_list_share`] in all.
///
/// Issue 29: confirmed by whole lists, 10,000 Proxies at Hetzner's 3,600/h took 1.53x the
/// floor; each list of 200 pages, paced at 15%, took so long that a Proxy waited several of
/// them. A list of the last minute's instances is a page or two.
pub const RECENT_LIST_SHARE: f64 = 0.05;

/// The share lists of recent instances may use when nothing else waits (a few Proxies in
/// transition, or the tail of a rollout): enough for a page every provisioning poll at
/// Hetzner's 3,600/h, and no more, since whether creates wait flips from one moment to the
/// next during a rollout.
pub const RECENT_LIST_SHARE_AT_REST: f64 = 0.15;

/// The share whole lists may use while a rollout runs and lists of recent instances
/// confirm it. Whole lists then serve only drift detection of the Proxies already Running
/// (a rollout's own Proxies are confirmed by the short lists), and every request they take
/// is one create less: at 10,000 Hetzner Proxies (3,600/h) they were about 1,700 of the
/// rollout's 2,150 list pages at 10%. At 5% a whole list of 10,000 servers (200 pages)
/// comes about every 67 minutes during such a rollout; a lost instance of a Running Proxy
/// is found within that, and within the drift poll again once the rollout is done.
pub const WHOLE_LIST_SHARE_WHILE_RECENT: f64 = 0.05;

/// How long after one list of a provider the next is due: the drift poll, or longer when
/// lists costing what the last one sent would, that often, use more than [`LIST_SHARE`] of
/// the provider's request budget. Without a budget, or before the first list, the drift
/// poll. While creates wait, whole lists get [`contended_list_share`], or
/// [`WHOLE_LIST_SHARE_WHILE_RECENT`] when lists of recent instances confirm the provider's
/// Proxies.
pub fn list_interval(drift_poll: Duration, pacing: Option<Pacing>) -> Duration {
    let Some(p) = pacing else {
        return drift_poll;
    };
    let share = match (p.contended, p.last_recent_requests) {
        (false, _) => LIST_SHARE,
        (true, None) => contended_list_share(),
        (true, Some(_)) => WHOLE_LIST_SHARE_WHILE_RECENT,
    };
    paced(drift_poll, p.requests_per_hour, p.last_list_requests, share)
}

/// How long after one list of recent instances the next is due: the provisioning poll
/// (`poll`), or longer when lists costing what the last one sent (a request before the
/// first) would use more than [`RECENT_LIST_SHARE_AT_REST`] of the budget, or
/// [`RECENT_LIST_SHARE`] while creates wait.
pub fn recent_interval(poll: Duration, pacing: Option<Pacing>) -> Duration {
    let Some(p) = pacing else {
        return poll;
    };
    let share = if p.contended {
        RECENT_LIST_SHARE
    } else {
        RECENT_LIST_SHARE_AT_REST
    };
    let cost = Some(p.last_recent_requests.unwrap_or(1));
    paced(poll, p.requests_per_hour, cost, share)
}

/// `pacing` with `busy` (a rollout under way: Proxies of the provider in transition or
/// still to create) counted as contended. Whether a create waits for a token at the very
/// moment a list is paced flips from one moment to the next during a rollout, and a whole
/// list paced at a moment nobody waited took half the budget: 4,192 pages in a rollout of
/// 10,000 Proxies that needed a tenth of them.
pub fn while_busy(pacing: Option<Pacing>, busy: bool) -> Option<Pacing> {
    pacing.map(|p| Pacing {
        contended: p.contended || busy,
        ..p
    })
}

/// `floor`, or the time `cost` requests take at `share` of `requests_per_hour` if longer
/// (at most a day). No cost known, or no rate: `floor`.
fn paced(floor: Duration, requests_per_hour: f64, cost: Option<u32>, share: f64) -> Duration {
    let Some(cost) = cost else {
        return floor;
    };
    if requests_per_hour <= 0.0 {
        return floor;
    }
    let secs = f64::from(cost) * 3600.0 / (share * requests_per_hour);
    // At most a day: a budget configured absurdly low still gets a list now and then.
    floor.max(Duration::from_secs_f64(secs.min(86_400.0)))
}

/// How long a list taken every `interval`, and taking `took`, stays fresh: two rounds, so
/// that one failed list does not send every Running Proxy to Get.
pub fn fresh_for(interval: Duration, took: Duration) -> Duration {
    (interval + took) * 2
}

/// Lists the recent instances of one provider (those made at or after `from`), records
/// the list, and returns the Proxies in transition it shows in another state than their
/// status. It says nothing of Running Proxies: their instances may be older than `from`.
async fn list_recent(
    inventory: &Arc<Inventory>,
    (name, provider): (&str, &Arc<dyn Provider>),
    installation: &str,
    store: &Store<Proxy>,
    from: SystemTime,
    (poll, busy): (Duration, bool),
) -> Vec<ObjectRef<Proxy>> {
    let at = SystemTime::now();
    let started = std::time::Instant::now();
    let _under_way = inventory.under_way_as(name, true);
    let result = provider
        .list_recent_at(installation, from, Priority::Transition)
        .await;
    let took = started.elapsed();
    let every = recent_interval(poll, while_busy(provider.pacing(), busy));
    match result {
        Ok(instances) => {
            debug!(
                provider.name = name,
                instances = instances.len(),
                took_ms = took.as_millis() as u64,
                next_in_s = every.as_secs(),
                "listed the recent instances"
            );
            let listing = inventory.record_recent(
                name,
                provider,
                (at, from),
                instances,
                fresh_for(every, took),
            );
            changed_in_transition(store, name, &listing)
        }
        Err(e) => {
            // Its Proxies in transition wait for the next one, or Get once the last is
            // no longer fresh (`by_list_view`).
            warn!(provider.name = name, error = %e, "listing the recent instances failed");
            Vec::new()
        }
    }
}

/// The Proxies of provider `name` in transition whose instance `listing` shows in another
/// state than their status (booted, stopped): they take its answer now. Those still
/// booting are told so at their next poll.
fn changed_in_transition(
    store: &Store<Proxy>,
    name: &str,
    listing: &Listing,
) -> Vec<ObjectRef<Proxy>> {
    refs_where(store, |p| {
        in_transition_id(p, name).is_some_and(|id| {
            listing.instances.get(id).is_some_and(|i| {
                p.status.as_ref().and_then(|s| s.state.as_deref()) != Some(i.state.as_str())
            })
        })
    })
}

/// Lists one provider, records the list, and returns the Proxies of `store` it does not
/// confirm (the list loop times the next from when this one ended).
async fn list_one(
    inventory: &Arc<Inventory>,
    name: &str,
    provider: &Arc<dyn Provider>,
    installation: &str,
    store: &Store<Proxy>,
    (drift_poll, probe_refresh, busy): (Duration, Option<Duration>, bool),
    priority: Priority,
) -> Vec<ObjectRef<Proxy>> {
    let at = SystemTime::now();
    let started = std::time::Instant::now();
    // Until the list is recorded (or has failed).
    let _under_way = inventory.listing_under_way(name);
    let result = provider.list_by_tag_at(installation, priority).await;
    let took = started.elapsed();
    inventory.tried(name, provider);
    let interval = list_interval(drift_poll, while_busy(provider.pacing(), busy));
    match result {
        Ok(instances) => {
            debug!(
                provider.name = name,
                instances = instances.len(),
                took_ms = took.as_millis() as u64,
                next_in_s = interval.as_secs(),
                "listed"
            );
            let listing =
                inventory.record_for(name, provider, at, instances, fresh_for(interval, took));
            // One Running Proxy at a time: a view of each of a 10,000-Proxy fleet, with its
            // key, held together was megabytes at every list.
            let mut recheck = refs_where(store, |p| {
                running_view(p, name).is_some_and(|v| needs_recheck(&listing, &v))
            });
            recheck.extend(changed_in_transition(store, name, &listing));
            // Running Proxies the list confirms keep no timer of their own
            // (`decide::Decision::at_rest`): those whose `lastProbe` is due a refresh come
            // back now, to have it written.
            if let Some(refresh) = probe_refresh {
                let now = k8s_openapi::jiff::Timestamp::now();
                recheck.extend(refs_where(store, |p| {
                    running_view(p, name).is_some() && probe_due(p, now, refresh)
                }));
            }
            if !recheck.is_empty() {
                debug!(
                    provider.name = name,
                    proxies = recheck.len(),
                    "not confirmed by the list, in transition and listed, or lastProbe due: reconciling"
                );
            }
            recheck
        }
        Err(e) => {
            warn!(provider.name = name, error = %e, "listing for the inventory failed; Running Proxies of this provider fall back to Get once the last list is stale");
            // A failed list is retried at the drift poll, paced like a successful one.
            // Running Proxies the lists answered for keep no timer of their own
            // (`decide::Decision::at_rest`): once the last list will be stale before the
            // next try, they are all sent back, to Get and go back on the drift poll.
            let next_try = SystemTime::now() + interval;
            let back = if inventory.listing(name, provider, next_try).is_none() {
                refs_where(store, |p| running_view(p, name).is_some())
            } else {
                Vec::new()
            };
            if !back.is_empty() {
                debug!(
                    provider.name = name,
                    proxies = back.len(),
                    "the last list is stale by the next try: Running Proxies back to Get"
                );
            }
            back
        }
    }
}

/// Whether `proxy`'s `lastProbe` is `refresh` old or older at `now` (none: not due; the
/// probe engine's first verdict sends it back itself).
pub fn probe_due(proxy: &Proxy, now: k8s_openapi::jiff::Timestamp, refresh: Duration) -> bool {
    let Some(last) = proxy.status.as_ref().and_then(|s| s.last_probe.as_ref()) else {
        return false;
    };
    let age = now.duration_since(last.time.0);
    !age.is_negative() && age.unsigned_abs() >= refresh
}

/// The Proxies of `store` that `keep` keeps.
fn refs_where(store: &Store<Proxy>, keep: impl Fn(&Proxy) -> bool) -> Vec<ObjectRef<Proxy>> {
    store
        .state()
        .iter()
        .filter(|p| keep(p))
        .map(|p| ObjectRef::from_obj(p.as_ref()))
        .collect()
}

/// Lists each configured provider when its list is due (the first at once, once `proxies`
/// has listed; then every [`list_interval`]) until `stop`, and sends the Proxies a list
/// does not confirm to `recheck`. Providers are listed independently: a long, paced list
/// of a large fleet does not hold back the others.
///
/// From the moment this is called (not when the task first runs), every configured
/// provider not listed yet counts as [`Inventory::pending`]: the reconciles of a start wait
/// for its first list instead of making one Get per Running Proxy. So do those of a reload:
/// a rebuilt provider (new configuration or plugin) is listed at once, on the registry's
/// change, and nothing listed by its predecessor is used.
pub fn run(
    inventory: Arc<Inventory>,
    registry: ProviderRegistry,
    installation: String,
    proxies: ProxyCache,
    polls: Polls,
    recheck: impl Fn(ObjectRef<Proxy>) + Send + 'static,
    stop: tokio_util::sync::CancellationToken,
) -> impl std::future::Future<Output = ()> + Send + 'static {
    let running = inventory.loop_running();
    run_lists(
        inventory,
        registry,
        installation,
        proxies,
        polls,
        recheck,
        stop,
        running,
    )
}

/// The list loop's intervals.
#[derive(Debug, Clone, Copy)]
pub struct Polls {
    /// Lists for drift detection, at least this far apart ([`list_interval`]).
    pub drift: Duration,
    /// While lists confirm Proxies in transition ([`confirm_by_list`]): one this often,
    /// as each of them would Get, or less often when the budget calls for it
    /// ([`list_interval`]).
    pub provisioning: Duration,
    /// How old a Running Proxy's `lastProbe` may get before a list sends it back to be
    /// refreshed ([`probe_due`]); `None` without health probes.
    pub probe_refresh: Option<Duration>,
}

#[allow(clippy::too_many_arguments)]
async fn run_lists(
    inventory: Arc<Inventory>,
    registry: ProviderRegistry,
    installation: String,
    proxies: ProxyCache,
    polls: Polls,
    recheck: impl Fn(ObjectRef<Proxy>),
    stop: tokio_util::sync::CancellationToken,
    _running: LoopRunning,
) {
    let drift_poll = polls.drift;
    let probe_refresh = polls.probe_refresh;
    use futures::StreamExt;
    use tokio::time::Instant;
    // Subscribed before the first snapshot, so no swap goes unseen.
    let mut changes = Box::pin(registry.changes());
    // The first lists wait for the Proxy cache, so their rechecks see every Proxy.
    let ready = tokio::select! {
        _ = stop.cancelled() => return,
        ready = proxies.synced.wait() => ready,
    };
    if !ready {
        return;
    }
    // Per provider name: the provider listed last and when its last whole list ended;
    // absent while one is running. The next is due its interval after that, the interval
    // taken at each turn of the loop: a list that ended during a rollout (paced at a
    // twentieth of the budget) is not waited for at that pace once the rollout is over.
    let mut due: HashMap<String, (usize, Instant)> = HashMap::new();
    // Per provider name, when its last list of recent instances ended, failed or not: a
    // list that fails is not due again before its interval either. Paced only by the last
    // success, a plugin whose lists failed at once was asked again at every turn of the
    // loop, as fast as it could fail, for as long as a Proxy of it was in transition.
    let mut recent_ended: HashMap<String, Instant> = HashMap::new();
    let mut running = futures::stream::FuturesUnordered::new();
    // Provider names with a whole list (`false`) or a list of recent instances (`true`)
    // under way: one of each at most, so a long whole list never holds back the short
    // ones that confirm a rollout.
    let mut listing: std::collections::HashSet<(String, bool)> = Default::default();
    loop {
        let now = Instant::now();
        let wall = SystemTime::now();
        let providers = registry.snapshot();
        let names: Vec<&str> = providers.keys().map(String::as_str).collect();
        inventory.retain(&names);
        due.retain(|n, _| providers.contains_key(n));
        recent_ended.retain(|n, _| providers.contains_key(n));
        let transition = in_transition(&proxies.store, &providers, &inventory, wall, polls);
        let mut next_due: Option<Instant> = None;
        for (name, provider) in providers.iter() {
            let key = provider_key(provider);
            let waiting = transition.get(name.as_str()).copied().unwrap_or_default();
            let busy = waiting.count > 0 || waiting.pending > 0;
            let pacing = while_busy(provider.pacing(), busy);
            // A plugin that lists recent instances confirms with lists of those made since
            // the oldest Proxy in transition (less a poll, for the backend's clock); one
            // that does not, with whole lists.
            let from = waiting
                .oldest
                .filter(|_| provider.lists_recent())
                .map(|t| t.checked_sub(polls.provisioning).unwrap_or(t));
            let (cost, every) = match from {
                Some(_) => (
                    Some(pacing.and_then(|p| p.last_recent_requests).unwrap_or(1)),
                    recent_interval(polls.provisioning, pacing),
                ),
                // Paced like drift lists, from the provisioning poll: while creates wait,
                // at most the contended share of the budget, so confirming does not slow
                // the rollout it confirms by more than that share.
                None => (
                    pacing.and_then(|p| p.last_list_requests),
                    list_interval(polls.provisioning, pacing),
                ),
            };
            let by_list = confirm_by_list(waiting.count, cost);
            inventory.set_by_list(name, by_list.then_some(every));
            // Confirming by list: one every `every`, counted from the end of the last
            // success (a drift list included, for whole lists) and from the end of the
            // last attempt, failed or not, at the priority of the Gets it replaces.
            let last = match from {
                Some(_) => inventory.recent_listing(name, provider, wall),
                None => inventory.listing(name, provider, wall),
            };
            let tried = match from {
                Some(_) => recent_ended.get(name.as_str()),
                None => due.get(name.as_str()).map(|(_, ended)| ended),
            };
            let confirm_due = by_list
                && (from.is_none() || waiting.unanswered > 0)
                && last.is_none_or(|l| wall.duration_since(l.done).unwrap_or_default() >= every)
                && tried.is_none_or(|ended| now.duration_since(*ended) >= every);
            if let Some(from) = from
                && confirm_due
                && listing.insert((name.clone(), true))
            {
                let (inventory, store, installation) = (
                    inventory.clone(),
                    proxies.store.clone(),
                    installation.clone(),
                );
                let (name, provider) = (name.clone(), provider.clone());
                let poll = polls.provisioning;
                running.push(Box::pin(async move {
                    let refs = list_recent(
                        &inventory,
                        (&name, &provider),
                        &installation,
                        &store,
                        from,
                        (poll, busy),
                    )
                    .await;
                    (name, provider_key(&provider), refs, false)
                })
                    as std::pin::Pin<Box<dyn std::future::Future<Output = _> + Send>>);
            }
            let confirm_whole = confirm_due && from.is_none();
            let whole_due = due
                .get(name)
                .filter(|(k, _)| *k == key)
                .map(|(_, ended)| *ended + list_interval(drift_poll, pacing));
            let not_yet = whole_due.is_some_and(|at| at > now);
            if not_yet {
                next_due = next_due.into_iter().chain(whole_due).min();
            }
            if listing.contains(&(name.clone(), false)) || (not_yet && !confirm_whole) {
                continue;
            }
            let priority = if confirm_whole {
                Priority::Transition
            } else {
                Priority::Background
            };
            due.remove(name);
            listing.insert((name.clone(), false));
            let (inventory, store, installation) = (
                inventory.clone(),
                proxies.store.clone(),
                installation.clone(),
            );
            let (name, provider) = (name.clone(), provider.clone());
            running.push(Box::pin(async move {
                let refs = list_one(
                    &inventory,
                    &name,
                    &provider,
                    &installation,
                    &store,
                    (drift_poll, probe_refresh, busy),
                    priority,
                )
                .await;
                (name, provider_key(&provider), refs, true)
            }));
        }
        // Wake for the next due list, and at least every provisioning poll: to count the
        // Proxies in transition again (a rollout that starts must not wait for the drift
        // poll to be confirmed by lists: its first Proxy ran 5 s late in 6 at x60) and to
        // pick up providers configured since.
        let wake = next_due
            .unwrap_or(now + drift_poll)
            .min(now + drift_poll)
            .min(now + polls.provisioning);
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = tokio::time::sleep_until(wake) => {}
            Some(()) = changes.next() => {}
            Some((name, key, refs, whole)) = running.next(), if !running.is_empty() => {
                // A whole list is due again its interval after it ended; a list of recent
                // instances, by the time of its own (see `confirm_due`).
                if whole {
                    listing.remove(&(name.clone(), false));
                    due.insert(name, (key, Instant::now()));
                } else {
                    listing.remove(&(name.clone(), true));
                    recent_ended.insert(name, Instant::now());
                }
                for r in refs {
                    recheck(r);
                }
            }
        }
    }
}

/// A provider's Proxies in transition, as the list loop counts them.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Waiting {
    /// How many.
    pub count: usize,
    /// The oldest time one of them was made ([`Inventory::made`]), among those made within
    /// [`RECENT_HORIZON_POLLS`] provisioning polls: what a list of recent instances must
    /// cover. Older ones are left to whole lists and Gets.
    pub oldest: Option<SystemTime>,
    /// Proxies of the provider with no instance yet (not being deleted): creates to come.
    pub pending: usize,
    /// How many of them the last fresh list of recent instances does not show running:
    /// made since, or still booting. With none, another list would only repeat it (the
    /// others wait for their reconcile), so none is made.
    pub unanswered: usize,
}

/// How far back, in provisioning polls, lists of recent instances reach for a Proxy in
/// transition: one that has waited longer (an instance that boots for ten minutes at the
/// default poll) would make each of them as long as a whole list.
pub const RECENT_HORIZON_POLLS: u32 = 60;

/// Per provider name, its Proxies in transition ([`Waiting`]), at `now`.
fn in_transition<'a>(
    store: &Store<Proxy>,
    providers: &'a std::collections::BTreeMap<String, Arc<dyn Provider>>,
    inventory: &Inventory,
    now: SystemTime,
    polls: Polls,
) -> HashMap<&'a str, Waiting> {
    let horizon = now
        .checked_sub(polls.provisioning * RECENT_HORIZON_POLLS)
        .unwrap_or(SystemTime::UNIX_EPOCH);
    // Per provider, its fresh lists: the newest first.
    let lists: HashMap<&str, [Option<Arc<Listing>>; 2]> = providers
        .iter()
        .map(|(n, p)| {
            let (recent, whole) = (
                inventory.recent_listing(n, p, now),
                inventory.listing(n, p, now),
            );
            let newest_first = if whole.as_ref().map(|l| l.at) > recent.as_ref().map(|l| l.at) {
                [whole, recent]
            } else {
                [recent, whole]
            };
            (n.as_str(), newest_first)
        })
        .collect();
    let mut out: HashMap<&str, Waiting> = HashMap::new();
    for p in store.state() {
        let Some((name, _)) = providers.get_key_value(&p.spec.provider) else {
            continue;
        };
        let Some(id) = in_transition_id(&p, name) else {
            let no_instance = p.metadata.deletion_timestamp.is_none()
                && p.status
                    .as_ref()
                    .and_then(|s| s.provider_id.as_deref())
                    .is_none_or(str::is_empty);
            if no_instance {
                out.entry(name.as_str()).or_default().pending += 1;
            }
            continue;
        };
        let w = out.entry(name.as_str()).or_default();
        w.count += 1;
        let listed = lists
            .get(name.as_str())
            .into_iter()
            .flatten()
            .flatten()
            .find_map(|l| l.instances.get(id));
        if !listed.is_some_and(|i| i.state != State::Provisioning) {
            w.unanswered += 1;
        }
        // When the backend made it, as a list showed it; else when the create returned, or
        // the condition changed. Not the condition alone: it changes when the Proxy is
        // admitted, not when its create is sent, and the whole rollout would look as old
        // as its first Proxy.
        let since = p.status.as_ref().and_then(provisioned_since);
        let made = listed
            .and_then(|i| i.created_at)
            .or_else(|| inventory.made(name, id, since));
        if let Some(made) = made.filter(|t| *t >= horizon) {
            w.oldest = Some(w.oldest.map_or(made, |o| o.min(made)));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::fake_provider::FakeProvider;

    fn inst(id: &str, state: State, ip: &str) -> Instance {
        Instance::new(id, ip, state, &format!("uid-{id}"), None)
    }

    fn provider(name: &str) -> Arc<dyn Provider> {
        Arc::new(FakeProvider::new(name))
    }

    /// A Proxy Running since the fresh whole list began waits for the next one: until the
    /// time that one should have ended (the interval and the list's own time, which
    /// `fresh_for` holds twice), not a drift poll at a time.
    #[test]
    fn a_proxy_newer_than_the_whole_list_waits_until_the_next_should_end() {
        let s = Duration::from_secs;
        let t0 = SystemTime::now();
        // The list below ends now (t0 is now), as the list loop's lists do.
        let inv = Inventory {
            clock: SystemTime::now,
            ..Inventory::new(s(240))
        };
        let a = provider("a");
        assert_eq!(inv.listed_before("a", &a, t0, t0), None, "no list yet");
        // A list of 100 s, due every 4,000 s during a rollout.
        inv.record_for("a", &a, t0 - s(100), vec![], fresh_for(s(4000), s(100)));
        let wait = inv.listed_before("a", &a, t0 - s(50), t0 + s(10));
        let want = s(4000 + 100 - 10);
        assert!(
            wait.is_some_and(|w| w >= want && w < want + s(5)),
            "{wait:?}, want about {want:?}"
        );
        assert_eq!(
            inv.listed_before("a", &a, t0 - s(150), t0 + s(10)),
            None,
            "Running before the list began: the list answers for it"
        );
        assert_eq!(
            inv.listed_before("a", &a, t0 - s(50), t0 + s(5000)),
            Some(Duration::ZERO),
            "overdue"
        );
    }

    #[test]
    fn lookup_answers_only_from_a_fresh_list_of_the_configured_provider() {
        let t0 = SystemTime::UNIX_EPOCH + Duration::from_secs(1_800_000_000);
        let inv = Inventory::new(Duration::from_secs(240));
        let a = provider("a");
        let a_reloaded = provider("a");
        assert_eq!(inv.lookup("a", &a, "i-1", t0), None, "nothing listed yet");
        inv.record("a", &a, t0, vec![inst("i-1", State::Running, "192.0.2.1")]);
        let at = |secs| t0 + Duration::from_secs(secs);
        assert_eq!(
            inv.lookup("a", &a, "i-1", at(10)).map(|i| i.ip),
            Some("192.0.2.1".into())
        );
        assert_eq!(inv.lookup("a", &a, "i-2", at(10)), None, "missing: ask Get");
        assert!(
            inv.lookup("a", &a, "i-1", at(240)).is_some(),
            "max age is inclusive"
        );
        assert_eq!(inv.lookup("a", &a, "i-1", at(241)), None, "stale");
        assert_eq!(
            inv.lookup("a", &a_reloaded, "i-1", at(10)),
            None,
            "a reloaded provider does not read its predecessor's list"
        );
        assert_eq!(inv.lookup("b", &a, "i-1", at(10)), None);
        // A clock that went back: the list counts as new.
        assert!(
            inv.lookup("a", &a, "i-1", t0 - Duration::from_secs(5))
                .is_some()
        );
        // An older list finishing late does not replace a newer one.
        inv.record("a", &a, at(100), vec![]);
        inv.record("a", &a, at(50), vec![inst("i-1", State::Running, "x")]);
        assert_eq!(inv.lookup("a", &a, "i-1", at(110)), None);
        // A list of recent instances answers for what it shows, the newer list winning.
        inv.record_recent(
            "a",
            &a,
            (at(105), at(90)),
            vec![inst("i-9", State::Running, "192.0.2.9")],
            Duration::from_secs(60),
        );
        assert_eq!(
            inv.lookup("a", &a, "i-9", at(110)).map(|i| i.ip),
            Some("192.0.2.9".into())
        );
        inv.record(
            "a",
            &a,
            at(120),
            vec![inst("i-9", State::Stopped, "192.0.2.9")],
        );
        assert_eq!(
            inv.lookup("a", &a, "i-9", at(121)).map(|i| i.state),
            Some(State::Stopped),
            "the newer whole list"
        );
        inv.retain(&["b"]);
        assert!(
            inv.listing("a", &a, at(110)).is_none(),
            "unconfigured: forgotten"
        );
        assert!(inv.recent_listing("a", &a, at(110)).is_none());
    }

    /// Issue 12: lists use at most half the budget, whatever the fleet; the drift poll is
    /// the floor. Hetzner's default budget is 3,600/h and 50 servers a page.
    #[test]
    fn list_interval_table() {
        let min = |m: u64| Duration::from_secs(m * 60);
        let poll = min(2);
        let paced = |rph: f64, cost: Option<u32>| {
            list_interval(
                poll,
                Some(Pacing {
                    requests_per_hour: rph,
                    last_list_requests: cost,
                    last_recent_requests: None,
                    contended: false,
                }),
            )
        };
        let contended = list_interval(
            poll,
            Some(Pacing {
                requests_per_hour: 3600.0,
                last_list_requests: Some(200),
                last_recent_requests: None,
                contended: true,
            }),
        );
        // During a rollout: 200 pages at 15% of 3,600/h, every 1333 s.
        assert_eq!(contended.as_secs(), 1333);
        let cases = [
            ("no budget", list_interval(poll, None), poll),
            ("before the first list", paced(3600.0, None), poll),
            (
                "1,000 servers: 20 pages fit every poll",
                paced(3600.0, Some(20)),
                poll,
            ),
            (
                "10,000 servers: 200 pages, every 400 s",
                paced(3600.0, Some(200)),
                Duration::from_secs(400),
            ),
            (
                "the backend halved the rate",
                paced(1800.0, Some(200)),
                Duration::from_secs(800),
            ),
            ("a zero rate does not divide", paced(0.0, Some(200)), poll),
            (
                "absurdly low budget: a day at most",
                paced(1.0, Some(1000)),
                min(24 * 60),
            ),
        ];
        for (what, got, want) in cases {
            assert_eq!(got, want, "{what}");
        }
        // Lists every 400 s of 200 requests: 1,800 an hour, half of 3,600.
        assert_eq!(3600 / 400 * 200, 1800);
    }

    #[test]
    fn a_paced_list_stays_fresh_for_two_of_its_rounds() {
        let inv = Inventory::new(Duration::from_secs(240));
        let a = provider("a");
        let at = |secs: u64| SystemTime::UNIX_EPOCH + Duration::from_secs(1_000_000 + secs);
        let fresh = fresh_for(Duration::from_secs(400), Duration::from_secs(100));
        assert_eq!(fresh, Duration::from_secs(1000));
        inv.record_for(
            "a",
            &a,
            at(0),
            vec![inst("i-1", State::Running, "x")],
            fresh,
        );
        assert!(inv.lookup("a", &a, "i-1", at(999)).is_some());
        assert!(inv.lookup("a", &a, "i-1", at(1001)).is_none());
        // A short one keeps the inventory's own max_age.
        inv.record_for("a", &a, at(2000), vec![], Duration::from_secs(1));
        assert!(inv.listing("a", &a, at(2239)).is_some());
    }

    #[test]
    fn pending_while_a_list_is_under_way_and_none_is_fresh() {
        let inv = Arc::new(Inventory::new(Duration::from_secs(240)));
        let a = provider("a");
        let now = SystemTime::now();
        assert!(!inv.pending("a", &a, now), "nothing under way");
        {
            let _g = inv.listing_under_way("a");
            let g2 = inv.listing_under_way("a");
            drop(g2);
            assert!(inv.pending("a", &a, now), "marks are counted");
            assert!(!inv.pending("b", &a, now), "per provider name");
            inv.record("a", &a, now, vec![]);
            assert!(!inv.pending("a", &a, now), "a fresh list answers instead");
        }
        let later = now + Duration::from_secs(1000);
        assert!(
            !inv.pending("a", &a, later),
            "the list ended (or failed): Get"
        );
    }

    #[test]
    fn pending_for_a_provider_the_running_loop_has_not_tried() {
        let inv = Arc::new(Inventory::new(Duration::from_secs(240)));
        let a = provider("a");
        let now = SystemTime::now();
        assert!(!inv.pending("a", &a, now), "no loop runs: Get");
        let running = inv.loop_running();
        assert!(inv.pending("a", &a, now), "configured, not listed yet");
        inv.tried("a", &a);
        assert!(!inv.pending("a", &a, now), "tried and failed: Get");
        inv.record("a", &a, now, vec![]);
        let rebuilt = provider("a");
        assert!(
            inv.pending("a", &rebuilt, now),
            "a reload rebuilt it: its first list is awaited"
        );
        inv.tried("a", &rebuilt);
        assert!(!inv.pending("a", &rebuilt, now));
        let other = provider("b");
        assert!(inv.pending("b", &other, now), "per provider name");
        drop(running);
        assert!(!inv.pending("b", &other, now), "the loop stopped: Get");
    }

    #[test]
    fn recheck_table() {
        let listing = Listing {
            at: SystemTime::UNIX_EPOCH,
            provider: 0,
            instances: [
                inst("running", State::Running, "192.0.2.1"),
                inst("moved", State::Running, "192.0.2.9"),
                inst("stopped", State::Stopped, "192.0.2.3"),
                inst("booting", State::Running, ""),
                Instance {
                    ipv6: "2001:db8::1".into(),
                    ..inst("dual", State::Running, "192.0.2.5")
                },
            ]
            .into_iter()
            .collect(),
            fresh_for: Duration::ZERO,
            done: SystemTime::UNIX_EPOCH,
            covers_from: None,
        };
        let view = |id: &str, ip: &str| RunningView {
            id: id.into(),
            ip: ip.into(),
            family: IpFamily::V4,
            since: Some(SystemTime::UNIX_EPOCH - Duration::from_secs(1)),
        };
        let view6 = |id: &str, ip: &str| RunningView {
            family: IpFamily::V6,
            ..view(id, ip)
        };
        for (name, v, confirmed) in [
            (
                "listed, Running, same address",
                view("running", "192.0.2.1"),
                true,
            ),
            (
                "missing from the list: Get decides",
                view("gone", "192.0.2.2"),
                false,
            ),
            (
                "listed at another address",
                view("moved", "192.0.2.2"),
                false,
            ),
            ("listed Stopped", view("stopped", "192.0.2.3"), false),
            (
                "listed without an address",
                view("booting", "192.0.2.4"),
                false,
            ),
            (
                "IPv4 of a dual-stack instance",
                view("dual", "192.0.2.5"),
                true,
            ),
            (
                "IPv6 of a dual-stack instance",
                view6("dual", "2001:db8::1"),
                true,
            ),
            (
                "IPv6 written another way",
                view6("dual", "2001:0db8:0::1"),
                true,
            ),
            (
                "an IPv6 Proxy at the instance's IPv4 address",
                view6("dual", "192.0.2.5"),
                false,
            ),
            (
                "an IPv6 Proxy of an IPv4-only instance",
                view6("running", "192.0.2.1"),
                false,
            ),
        ] {
            assert_eq!(confirms(&listing, &v), confirmed, "{name}");
        }
        // Made after the list started and missing from it: the list says nothing (a list
        // of recent instances confirmed it since); made after and listed elsewhere: checked.
        let after = |v: RunningView| RunningView {
            since: Some(SystemTime::UNIX_EPOCH + Duration::from_secs(1)),
            ..v
        };
        let running = [
            (1, view("running", "192.0.2.1")),
            (2, view("gone", "x")),
            (3, after(view("new", "192.0.2.7"))),
            (4, after(view("moved", "192.0.2.2"))),
            (
                5,
                RunningView {
                    since: None,
                    ..view("gone", "x")
                },
            ),
        ];
        assert_eq!(
            running
                .iter()
                .filter(|(_, v)| needs_recheck(&listing, v))
                .map(|(k, _)| *k)
                .collect::<Vec<_>>(),
            vec![2, 4, 5]
        );
    }

    /// A list's instances are found by ID as a map found them, the later of two with one
    /// ID standing, and the list keeps no room beyond its instances.
    #[test]
    fn instances_are_looked_up_by_id() {
        let list: Instances = vec![
            inst("b", State::Running, "192.0.2.2"),
            inst("a", State::Running, "192.0.2.1"),
            inst("c", State::Provisioning, ""),
            inst("a", State::Stopped, "192.0.2.9"),
        ]
        .into_iter()
        .collect();
        assert_eq!(list.len(), 3);
        assert_eq!(list.get("a").map(|i| i.state), Some(State::Stopped));
        assert_eq!(list.get("b").map(|i| i.ip.as_str()), Some("192.0.2.2"));
        assert!(list.contains_key("c"));
        assert!(!list.contains_key("d") && !list.contains_key(""));
        let ids: Vec<&str> = list.values().map(|i| i.id.as_str()).collect();
        assert_eq!(ids, ["a", "b", "c"]);
        let mut big: Vec<Instance> = Vec::with_capacity(4096);
        big.extend((0..1000).map(|n| inst(&format!("i-{n}"), State::Running, "")));
        let big = Instances::from(big);
        assert_eq!(big.0.capacity(), 1000);
        assert!((0..1000).all(|n| big.contains_key(&format!("i-{n}"))));
    }

    /// A list sends back a Proxy whose `lastProbe` is `refresh` old or older; none, or a
    /// newer one (also one from a clock ahead), is not due.
    #[test]
    fn probe_due_table() {
        use crate::api::{LastProbe, ProxyStatus};
        use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
        use k8s_openapi::jiff::{SignedDuration, Timestamp};
        let now = Timestamp::from_second(1_800_000_000).unwrap();
        let refresh = Duration::from_secs(1800);
        let spec = || crate::api::ProxySpec {
            provider: "a".into(),
            placement: Default::default(),
            cloud_init: Default::default(),
            port: 3128,
            auth: Default::default(),
            ip_family: Default::default(),
        };
        let with = |age: Option<i64>| {
            let mut p = Proxy::new("p", spec());
            p.status = Some(ProxyStatus {
                last_probe: age.map(|secs| LastProbe {
                    time: Time(now - SignedDuration::from_secs(secs)),
                    latency_ms: None,
                    error: None,
                }),
                ..Default::default()
            });
            p
        };
        for (age, due) in [
            (None, false),
            (Some(0), false),
            (Some(1799), false),
            (Some(1800), true),
            (Some(86_400), true),
            (Some(-60), false),
        ] {
            assert_eq!(probe_due(&with(age), now, refresh), due, "age {age:?}");
        }
        assert!(!probe_due(&Proxy::new("p", spec()), now, refresh));
    }

    #[test]
    fn running_view_needs_running_with_id_and_address_and_not_deleting() {
        use crate::api::{CloudInit, ProxySpec, ProxyStatus};
        let mut p = Proxy::new(
            "p",
            ProxySpec {
                provider: "a".into(),
                placement: Default::default(),
                cloud_init: CloudInit::default(),
                port: 3128,
                auth: Default::default(),
                ip_family: Default::default(),
            },
        );
        assert_eq!(running_view(&p, "a"), None, "no status");
        p.status = Some(ProxyStatus {
            provider_id: Some("i-1".into()),
            ip: Some("192.0.2.1".into()),
            state: Some("Running".into()),
            ..Default::default()
        });
        assert_eq!(
            running_view(&p, "a"),
            Some(RunningView {
                id: "i-1".into(),
                ip: "192.0.2.1".into(),
                family: IpFamily::V4,
                since: None,
            })
        );
        assert_eq!(running_view(&p, "b"), None, "another provider's");
        let mut q = p.clone();
        q.status.as_mut().unwrap().state = Some("Provisioning".into());
        assert_eq!(running_view(&q, "a"), None, "in transition");
        let mut q = p.clone();
        q.status.as_mut().unwrap().ip = None;
        assert_eq!(running_view(&q, "a"), None);
        let mut q = p.clone();
        q.metadata.deletion_timestamp = Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
            k8s_openapi::jiff::Timestamp::now(),
        ));
        assert_eq!(running_view(&q, "a"), None, "deleting");
    }

    #[test]
    fn lists_confirm_transitions_once_a_page_replaces_two_gets() {
        let cases = [
            (0, None, false),
            (1, None, false),
            (2, None, true),
            (39, Some(20), false),
            (40, Some(20), true),
            (400, Some(200), true),
            (399, Some(200), false),
            (2, Some(0), true),
        ];
        for (n, pages, want) in cases {
            assert_eq!(
                confirm_by_list(n, pages),
                want,
                "{n} in transition, {pages:?} pages"
            );
        }
    }

    /// A Proxy's condition changes before its Create is sent: a list that started in
    /// between does not show the instance, and must not send the Proxy to Get. Issue 29:
    /// 172 Gets for 400 Proxies at x60.
    #[test]
    fn a_list_that_started_before_the_create_returned_says_nothing_of_it() {
        let t0 = SystemTime::UNIX_EPOCH + Duration::from_secs(1_800_000_000);
        let s = Duration::from_secs;
        let inv = Inventory::new(s(600));
        let a = provider("a");
        inv.set_by_list("a", Some(s(10)));
        // Condition at t0; the list starts at t0 + 1 s; the create returns at t0 + 2 s.
        inv.record_for("a", &a, t0 + s(1), vec![], s(600));
        let ask = |now| inv.transition("a", &a, "i-1", Some(t0), now, s(10));
        assert_eq!(ask(t0 + s(3)), ByList::No, "without the create's time");
        inv.created("a", "i-1", t0 + s(2));
        assert_eq!(ask(t0 + s(3)), ByList::Wait);
        // The next list shows it, and the create is forgotten.
        let booting = inst("i-1", State::Provisioning, "");
        inv.record_for("a", &a, t0 + s(12), vec![booting.clone()], s(600));
        assert_eq!(ask(t0 + s(13)), ByList::Listed(booting));
        assert_eq!(inv.made_at("a", "i-1"), None);
    }

    /// A create this process saw return holds its Proxy's first Get until a provisioning
    /// poll after it; one it does not remember (before a restart, of another provider,
    /// or already listed) holds nothing.
    #[test]
    fn the_first_look_comes_a_poll_after_the_create_returned() {
        let t0 = SystemTime::UNIX_EPOCH + Duration::from_secs(1_800_000_000);
        let (ms, s) = (Duration::from_millis, Duration::from_secs);
        let inv = Inventory::new(s(600));
        let a = provider("a");
        let look = |id: &str, name: &str, now| inv.first_look_in(name, id, now, s(10));
        assert_eq!(look("i-1", "a", t0), None, "not made here");
        inv.created("a", "i-1", t0);
        let cases = [
            (t0 - s(1), Some(s(10))),
            (t0, Some(s(10))),
            (t0 + ms(3), Some(ms(9_997))),
            (t0 + s(10), None),
            (t0 + s(60), None),
        ];
        for (now, want) in cases {
            assert_eq!(look("i-1", "a", now), want, "{now:?}");
        }
        assert_eq!(look("i-1", "b", t0 + ms(3)), None, "another provider's");
        inv.record_for(
            "a",
            &a,
            t0 + s(1),
            vec![inst("i-1", State::Provisioning, "")],
            s(600),
        );
        assert_eq!(
            look("i-1", "a", t0 + s(2)),
            None,
            "listed: the list answers"
        );
    }

    #[test]
    fn remembered_creates_stay_bounded() {
        let t0 = SystemTime::UNIX_EPOCH + Duration::from_secs(1_800_000_000);
        let inv = Inventory::new(Duration::from_secs(600));
        for i in 0..MADE_MAX + 10 {
            inv.created("a", &format!("i-{i}"), t0 + Duration::from_millis(i as u64));
        }
        let made = inv.made.lock().unwrap();
        assert!(made.len() <= MADE_MAX, "{}", made.len());
        assert!(
            !made.contains_key(&("a".to_string(), "i-0".to_string())),
            "the oldest go first"
        );
        assert!(made.contains_key(&("a".to_string(), format!("i-{}", MADE_MAX + 9))));
    }

    /// Contract 0.3.0: a list of recent instances answers for what it covers, the newest
    /// list that speaks of an instance wins, and what it does not cover is left to the
    /// whole list (or Get).
    #[test]
    fn lists_of_recent_instances_answer_for_what_they_cover() {
        let t0 = SystemTime::UNIX_EPOCH + Duration::from_secs(1_000_000);
        let s = Duration::from_secs;
        let poll = s(10);
        let list = |at: SystemTime, from: Option<SystemTime>, shown: Vec<Instance>| Listing {
            at,
            provider: 0,
            instances: shown.into_iter().collect(),
            fresh_for: s(600),
            done: at + s(1),
            covers_from: from,
        };
        let booting = inst("a", State::Provisioning, "");
        let running = inst("a", State::Running, "192.0.2.1");
        // A whole list at t0 shows "a" booting; a recent one at t0 + 20 s, covering what
        // was made from t0 - 5 s, shows it running.
        let whole = list(t0, None, vec![booting.clone()]);
        let recent = list(t0 + s(20), Some(t0 - s(5)), vec![running.clone()]);
        let now = t0 + s(22);
        let view = |lists: &[&Listing], id: &str, made: u64| {
            by_list_view(lists, false, id, Some(t0 - s(made)), now, poll, poll)
        };
        assert_eq!(
            view(&[&whole, &recent], "a", 1),
            ByList::Listed(running.clone()),
            "the newer list answers"
        );
        assert_eq!(
            view(&[&recent, &whole], "a", 1),
            ByList::Listed(running),
            "whatever the order"
        );
        assert_eq!(
            view(&[&whole, &recent], "b", 1),
            ByList::No,
            "made in what the recent list covers, before it started, not in it: Get"
        );
        assert_eq!(
            view(&[&recent], "b", 60),
            ByList::Wait,
            "made before what it covers: it says nothing, and lists keep coming"
        );
        assert_eq!(
            view(&[&whole, &recent], "b", 60),
            ByList::No,
            "then the whole list, which started after it was made, answers"
        );
        assert!(recent.covers(t0 - s(5)) && !recent.covers(t0 - s(6)));
        assert!(whole.covers(SystemTime::UNIX_EPOCH));
    }

    /// Lists of recent instances come every provisioning poll unless the budget calls
    /// for fewer: [`RECENT_LIST_SHARE`] while creates wait, [`RECENT_LIST_SHARE_AT_REST`]
    /// otherwise; and whole lists get [`WHOLE_LIST_SHARE_WHILE_RECENT`] while they run.
    #[test]
    fn recent_interval_table() {
        let poll = Duration::from_secs(10);
        let pacing = |recent: Option<u32>, contended: bool| {
            Some(Pacing {
                requests_per_hour: 3600.0,
                last_list_requests: Some(200),
                last_recent_requests: recent,
                contended,
            })
        };
        let cases = [
            ("no budget", recent_interval(poll, None), 10),
            (
                "before the first: a page, while creates wait",
                recent_interval(poll, pacing(None, true)),
                20,
            ),
            (
                "two pages while creates wait: 5% of 3,600/h",
                recent_interval(poll, pacing(Some(2), true)),
                40,
            ),
            (
                "a page, nothing waiting: the poll",
                recent_interval(poll, pacing(Some(1), false)),
                10,
            ),
            (
                "two pages, nothing waiting: 15%",
                recent_interval(poll, pacing(Some(2), false)),
                13,
            ),
            (
                "forty pages, nothing waiting: 15% of the budget",
                recent_interval(poll, pacing(Some(40), false)),
                266,
            ),
            (
                "whole lists while creates wait, none recent: 15%",
                list_interval(poll, pacing(None, true)),
                1333,
            ),
            (
                "whole lists while recent ones confirm: 5%",
                list_interval(poll, pacing(Some(2), true)),
                4000,
            ),
            (
                "whole lists, nothing waiting: half",
                list_interval(poll, pacing(Some(2), false)),
                400,
            ),
        ];
        for (what, got, want) in cases {
            assert_eq!(got.as_secs(), want, "{what}");
        }
    }

    /// What the list loop counts of a provider's Proxies in transition: their age from the
    /// instance's `created-at` once a list showed it (not the condition, which changes at
    /// admission), none past the horizon, and those the newest list does not show running.
    #[test]
    fn in_transition_ages_proxies_by_their_instances() {
        use crate::api::ProxyStatus;
        use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
        let s = Duration::from_secs;
        let now = SystemTime::now();
        let polls = Polls {
            drift: s(300),
            provisioning: s(10),
            probe_refresh: None,
        };
        let admitted = now - s(3600);
        let proxy = |name: &str, id: &str| {
            let mut p = Proxy::new(
                name,
                crate::api::ProxySpec {
                    provider: "a".into(),
                    placement: Default::default(),
                    cloud_init: Default::default(),
                    port: 3128,
                    auth: Default::default(),
                    ip_family: Default::default(),
                },
            );
            p.metadata.namespace = Some("ns".into());
            p.status = Some(ProxyStatus {
                provider_id: Some(id.into()),
                state: Some("Provisioning".into()),
                conditions: vec![Condition {
                    type_: crate::api::condition::PROVISIONED.into(),
                    status: "False".into(),
                    reason: "Creating".into(),
                    message: String::new(),
                    observed_generation: None,
                    last_transition_time: Time(
                        k8s_openapi::jiff::Timestamp::try_from(admitted).unwrap(),
                    ),
                }],
                ..Default::default()
            });
            p
        };
        let (store, mut writer) = kube::runtime::reflector::store::<Proxy>();
        for (name, id) in [
            ("booted", "i-1"),
            ("booting", "i-2"),
            ("unlisted", "i-3"),
            ("stuck", "i-4"),
            ("pending", ""),
        ] {
            writer.apply_watcher_event(&kube::runtime::watcher::Event::Apply(proxy(name, id)));
        }
        let inv = Inventory::new(s(600));
        let a = provider("a");
        let made = |age: u64| Some(now - s(age));
        inv.record_recent(
            "a",
            &a,
            (now - s(5), now - s(100)),
            vec![
                Instance::new("i-1", "192.0.2.1", State::Running, "u1", made(40)),
                Instance::new("i-2", "", State::Provisioning, "u2", made(30)),
            ],
            s(600),
        );
        // "unlisted" was created 20 s ago by this process; "stuck" only has its condition,
        // an hour old: past the horizon (60 polls, 600 s).
        inv.created("a", "i-3", now - s(20));
        let providers: BTreeMap<String, Arc<dyn Provider>> = [("a".to_string(), a)].into();
        let got = in_transition(&store, &providers, &inv, now, polls);
        let w = got.get("a").copied().unwrap_or_default();
        assert_eq!(w.count, 4);
        assert_eq!(
            w.oldest,
            made(40),
            "the oldest instance the lists showed, not the condition"
        );
        assert_eq!(w.unanswered, 3, "all but the one listed running");
        assert_eq!(
            w.pending, 1,
            "the one with no instance yet: a create to come"
        );
    }

    #[test]
    fn by_list_view_table() {
        let t0 = SystemTime::UNIX_EPOCH + Duration::from_secs(1_000_000);
        let s = Duration::from_secs;
        let poll = s(10);
        // A list that started at t0 and ended 5 s later, showing "a" (booting).
        let listing = |done_after: u64| Listing {
            at: t0,
            provider: 0,
            instances: [inst("a", State::Provisioning, "")].into_iter().collect(),
            fresh_for: Duration::ZERO,
            done: t0 + s(done_after),
            covers_from: None,
        };
        let recent = listing(5);
        let listed_a = ByList::Listed(inst("a", State::Provisioning, ""));
        // A list that shows "r" running without an address, and "v6" with only IPv6.
        let mut addressless = listing(5);
        addressless.instances = addressless
            .instances
            .values()
            .cloned()
            .chain([
                inst("r", State::Running, ""),
                Instance {
                    ipv6: "2001:db8::6".into(),
                    ..inst("v6", State::Running, "")
                },
            ])
            .collect();
        let before = Some(t0 - s(30));
        let after = Some(t0 + s(2));
        type Case<'a> = (
            &'a str,
            Option<&'a Listing>,
            bool,
            &'a str,
            Option<SystemTime>,
            SystemTime,
            ByList,
        );
        let cases: Vec<Case> = vec![
            (
                "listed, ended within the poll",
                Some(&recent),
                false,
                "a",
                before,
                t0 + s(12),
                listed_a.clone(),
            ),
            (
                "listed, ended longer ago: still the newest answer",
                Some(&recent),
                false,
                "a",
                before,
                t0 + s(20),
                listed_a.clone(),
            ),
            (
                "listed Running without an address (Proxmox's VM list): Get",
                Some(&addressless),
                false,
                "r",
                before,
                t0 + s(12),
                ByList::No,
            ),
            (
                "listed Running with IPv6 only: listed",
                Some(&addressless),
                false,
                "v6",
                before,
                t0 + s(12),
                ByList::Listed(Instance {
                    ipv6: "2001:db8::6".into(),
                    ..inst("v6", State::Running, "")
                }),
            ),
            (
                "made before the list started, not in it: Get",
                Some(&recent),
                false,
                "b",
                before,
                t0 + s(12),
                ByList::No,
            ),
            (
                "made after the list started: the next list",
                Some(&recent),
                false,
                "b",
                after,
                t0 + s(12),
                ByList::Wait,
            ),
            (
                "no list for three polls, none under way: Get",
                Some(&recent),
                false,
                "b",
                after,
                t0 + s(36),
                ByList::No,
            ),
            (
                "no list for three polls, one under way: wait",
                Some(&recent),
                true,
                "b",
                after,
                t0 + s(36),
                ByList::Wait,
            ),
            (
                "no list yet, one under way",
                None,
                true,
                "b",
                after,
                t0,
                ByList::Wait,
            ),
            (
                "no list yet, none under way: Get",
                None,
                false,
                "b",
                after,
                t0,
                ByList::No,
            ),
            (
                "no transition time known: Get",
                None,
                true,
                "b",
                None,
                t0,
                ByList::No,
            ),
        ];
        for (what, l, under_way, id, since, now, want) in cases {
            let every = poll;
            assert_eq!(
                by_list_view(l.as_slice(), under_way, id, since, now, poll, every),
                want,
                "{what}"
            );
        }
        // Lists paced to a minute by the budget: a Proxy made after the last one waits
        // for the next through that minute (and two polls), rather than Get after three
        // polls as it would with lists every poll.
        let paced = |now| by_list_view(&[&recent], false, "b", after, now, poll, s(60));
        assert_eq!(paced(t0 + s(50)), ByList::Wait);
        assert_eq!(paced(t0 + s(85)), ByList::Wait);
        assert_eq!(paced(t0 + s(86)), ByList::No, "lists stopped coming");
    }
}
