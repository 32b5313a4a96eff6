//! What is sensitive for one provider: every secret value the host has handed it, and the
//! cloud-init and the credentials of every Proxy the operator holds for it.
//!
//! Kept per provider name by the [`super::Runtime`], so it survives a reload of the
//! providers file or the plugin, and shared by all calls of the provider. That is what
//! makes redaction hold across calls: a plugin that caches a Proxy's cloud-init in `create`
//! (in the host cache, in the backend, anywhere) and prints it in a later `get` of another
//! Proxy is still scrubbed, because the redactor of every call knows every document.
//!
//! **Bounded.** What a user controls (how many Proxies, how distinct their documents) must
//! not grow the operator without limit: about 1.2 MiB of automaton for a random 16 KiB
//! document, kept for the life of the process, let a user who may create Proxies take the
//! operator past its memory limit. So:
//! - Values are held by **owners** (a Proxy's UID), one cloud-init and one pair of
//!   credentials each ([`Sensitive::hold_cloud_init`], [`Sensitive::hold_credentials`]): a
//!   new document replaces the owner's previous one, and [`Sensitive::forget`] (the Proxy
//!   is gone) releases both.
//! - A value no owner holds is **retired**, not dropped: its instance may still run, and a
//!   plugin may still print it. Retired values are kept, oldest dropped first, while they
//!   cost at most an eighth of the limit, or until a held value needs the room.
//! - Everything held counts against one [`MemoryLimit`] shared by all providers
//!   (`--redaction-memory`): a value that does not fit is **refused** ([`Full`], naming the
//!   limit), and the reconciler keeps that Proxy from being created (a document the host
//!   could not scrub is never handed to a plugin) and says so on it.
//! - The unit of sharing and cost is the pattern ([`Unit`]: a line, a word, a credential),
//!   not the document: documents of one fleet share most of their lines, so a Proxy costs
//!   only what its document adds (a fleet rendered from one template with a name or a
//!   password in it costs a line or two per Proxy).
//!
//! A Proxy's credentials are held on their own, not only as part of its document: inside
//! the document they are fragments, matched raw only and not at all in an identifier;
//! held, they are whole values in every encoding (see [`crate::redact`]), so no ID, UID or
//! health-check name can hold them and no text shows them encoded. A document is then
//! compiled without the credentials it holds (each one cut out, see [`cut_credentials`]):
//! their own patterns cover them in every form, and what is left of the documents of a
//! fleet rendered from one template is the same for every Proxy.
//!
//! The compiled [`Redactor`] is rebuilt lazily, on the first use after a new value arrived,
//! so a burst of new Proxies costs one rebuild rather than one per Proxy. And a rebuild
//! compiles only the new units, into a segment of their own: segments are merged as a
//! binary counter carries (the last two merge while the older one is at most twice the
//! newer), so a unit is recompiled O(log n) times and a redactor has O(log n) segments. A
//! segment whose dropped units cost more than the half of it is recompiled without them.

use crate::redact::tokens::{self, ANCHOR, anchor_of};
use crate::redact::{
    MIN_ENCODED, Patterns, Redactor, Segment, Unit, cloud_init_units, credential_units,
    secret_units,
};
use sha2::{Digest, Sha256};
use std::borrow::Cow;
use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

/// The default of `--redaction-memory`, part of the operator's own `--memory-reserve`:
/// room for a fleet of about 20,000 Proxies each with its own generated credentials
/// (1.6 KiB each, measured by
/// `tests::a_fleet_of_10000_with_generated_credentials_fits_the_default_limit`). A fleet of
/// distinct documents raises it with the pod's memory limit.
pub const DEFAULT_LIMIT_BYTES: usize = 32 << 20;

/// Bytes of automaton per byte of pattern, with margin over what
/// `tests::the_cost_estimate_covers_the_automata` measures (about 11 for random lines, 8
/// for credentials: a contiguous NFA's states and transitions, and its match lists).
const AUTOMATON_BYTES_PER_PATTERN_BYTE: usize = 12;
/// Automaton bytes per pattern besides its bytes (its match list, the start of its path):
/// what short patterns, such as credentials in their encodings, cost most of.
const AUTOMATON_BYTES_PER_PATTERN: usize = 128;
/// Table bytes per form of a token besides its bytes: an entry of the table's hash map
/// (21 bytes, at a load between 7/16 and 7/8), the form's place (12 bytes), and its count
/// in `Inner::anchors` (another 21-byte entry).
const TABLE_BYTES_PER_FORM: usize = 112;
/// Automaton bytes of a segment besides its patterns (measured: 7.0 KiB for one pattern).
const SEGMENT_OVERHEAD: usize = 8 << 10;
/// Bookkeeping of one unit: its map entry, key and copy.
const UNIT_OVERHEAD: usize = 128;
/// Bookkeeping of one held value, besides a 16-byte key per unit.
const HOLDING_OVERHEAD: usize = 128;
/// Pattern bytes per segment at most, once merged: the automaton builder's working memory
/// is several times the automaton's, and one build of everything is a peak the limit
/// would have to allow for.
const SEGMENT_WEIGHT: usize = 256 << 10;

/// The memory all providers' sensitive values may use together.
#[derive(Debug)]
pub struct MemoryLimit {
    limit: usize,
    used: AtomicUsize,
}

impl MemoryLimit {
    pub fn new(limit_bytes: usize) -> Arc<Self> {
        Arc::new(MemoryLimit {
            limit: limit_bytes,
            used: AtomicUsize::new(0),
        })
    }

    /// Bytes counted now (an estimate of automata and bookkeeping, see the constants).
    pub fn used(&self) -> usize {
        self.used.load(Ordering::Relaxed)
    }

    pub fn limit(&self) -> usize {
        self.limit
    }

    /// Takes `n` bytes if they fit; `Err(used)` if not.
    fn try_take(&self, n: usize) -> Result<(), usize> {
        self.used
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |used| {
                used.checked_add(n).filter(|t| *t <= self.limit)
            })
            .map(|_| ())
    }

    /// Takes `n` bytes whatever the limit: a provider's own secrets (few and small, set by
    /// the operator's administrator) are never refused.
    fn force_take(&self, n: usize) {
        self.used.fetch_add(n, Ordering::AcqRel);
    }

    fn give(&self, n: usize) {
        let _ = self
            .used
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |u| {
                Some(u.saturating_sub(n))
            });
    }
}

/// A value the limit has no room for.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "the operator cannot take on this Proxy's cloud-init and credentials for redaction: they need {} more and the sensitive values of all Proxies already use {} of the limit {} (--redaction-memory); Proxies whose cloud-init shares its lines (one template) cost far less",
    Kib(*needed), Kib(*used), Kib(*limit)
)]
pub struct Full {
    pub needed: usize,
    pub used: usize,
    pub limit: usize,
}

/// Bytes as KiB (rounded up), or MiB from 10 MiB.
struct Kib(usize);

impl std::fmt::Display for Kib {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.0 >= 10 << 20 {
            write!(f, "{} MiB", self.0.div_ceil(1 << 20))
        } else {
            write!(f, "{} KiB", self.0.div_ceil(1 << 10))
        }
    }
}

pub struct Sensitive {
    inner: Mutex<Inner>,
    limit: Arc<MemoryLimit>,
}

impl Default for Sensitive {
    fn default() -> Self {
        Sensitive::new(MemoryLimit::new(DEFAULT_LIMIT_BYTES))
    }
}

type Key = u128;

/// Which of an owner's values.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum Slot {
    CloudInit,
    Credentials,
    /// One of the [`DERIVED_VALUES`] places of what the plugin marked sensitive itself.
    Derived(u8),
}

/// What a plugin marks sensitive itself (`host.mark-sensitive`, contract 0.2.0): its
/// latest this many values are held, and an older one is dropped at once (a token replaced
/// by its successor), never kept as retired: the redaction memory is shared by every
/// provider, and what a plugin marks must not take another provider's room. At
/// [`MAX_DERIVED_BYTES`] a value costs about 130 KiB of automaton, so a plugin holds at most
/// about 1 MiB (`tests::a_flood_of_derived_values_stays_within_the_ring`).
pub const DERIVED_VALUES: u8 = 8;
/// The longest value a plugin may mark sensitive: an access token, a signed assertion or a
/// signature is shorter; a longer value ends the call (see `host_services`).
pub const MAX_DERIVED_BYTES: usize = 2048;
/// Shorter values are ignored: they would match ordinary text everywhere.
pub const MIN_DERIVED_BYTES: usize = 8;
/// The owner of derived values: a Proxy's UID is never empty.
const DERIVED_OWNER: &str = "";

struct UnitEntry {
    unit: Unit,
    /// Holdings (held or retired) that have this unit.
    holdings: u32,
    /// The segment it is compiled into; `None` while pending.
    segment: Option<u64>,
    cost: usize,
    weight: usize,
}

/// One registered value (a secret, a document without its credentials, a pair of
/// credentials) as its units.
struct Holding {
    units: Box<[Key]>,
    /// Owners holding it; 0 once retired.
    owners: u32,
    /// Secrets of the provider's configuration: never retired.
    permanent: bool,
    retired: bool,
    /// Credential parts it put into `Inner::cut`.
    cut: Vec<Arc<[u8]>>,
    /// While retired: what dropping it was estimated to free when it was retired.
    retired_cost: usize,
}

#[derive(Default)]
struct Inner {
    units: HashMap<Key, UnitEntry>,
    holdings: HashMap<Key, Holding>,
    owners: HashMap<(Arc<str>, Slot), Key>,
    /// Every held credential part long enough to be a whole value, with the number of
    /// holdings that have it: what [`cut_credentials`] cuts out of documents.
    cut: HashMap<Arc<[u8]>, u32>,
    /// Units not compiled yet (may repeat, or name units dropped since).
    pending: Vec<Key>,
    /// Compiled, oldest (and largest) first.
    segments: Vec<Compiled>,
    next_segment: u64,
    /// Holdings no owner holds, oldest first (may name some held again since).
    retired: VecDeque<Key>,
    retired_cost: usize,
    /// `None` after the units changed, until the next [`Sensitive::redactor`].
    compiled: Option<Arc<Redactor>>,
    /// Segments whose [`SEGMENT_OVERHEAD`] the limit counts.
    counted_segments: usize,
    /// The [`Slot::Derived`] place the next marked value takes.
    next_derived: u8,
    /// Forms of held [`Unit::Token`]s per anchor (the first [`ANCHOR`] bytes a table
    /// indexes a form by): see [`MAX_FORMS_PER_ANCHOR`].
    anchors: HashMap<[u8; ANCHOR], u32>,
}

/// Forms of tokens that may share an anchor. A table compares every form of an anchor at
/// each place of a text that starts with it, so a user who gives many Proxies passwords
/// with one 16-byte prefix (`AAAAAAAAAAAAAAAA0001`, `...0002`) would make every run of
/// those letters in a plugin's output cost a comparison per password. A value whose forms
/// would pass the bound is held as a [`Unit::Value`] instead, matched and counted as
/// automaton. Random credentials never share an anchor.
pub const MAX_FORMS_PER_ANCHOR: u32 = 4;

/// A segment and the units it was compiled from (for a merge or a recompile).
struct Compiled {
    id: u64,
    units: Vec<Key>,
    weight: usize,
    cost: usize,
    /// Cost of its units dropped since it was compiled (still in the automaton).
    dead: usize,
    segment: Option<Arc<Segment>>,
}

impl std::fmt::Debug for Sensitive {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let inner = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        f.debug_struct("Sensitive")
            .field("units", &inner.units.len())
            .field("holdings", &inner.holdings.len())
            .field("segments", &inner.segments.len())
            .finish()
    }
}

fn key(kind: u8, parts: &[&[u8]]) -> Key {
    let mut h = Sha256::new();
    h.update([kind]);
    for p in parts {
        h.update(p);
    }
    let d = h.finalize();
    u128::from_le_bytes(d[..16].try_into().expect("16 bytes"))
}

fn unit_key(u: &Unit) -> Key {
    match u {
        Unit::Value(v) => key(b'v', &[v]),
        Unit::Fragment(v) => key(b'f', &[v]),
        Unit::EncodedFragment(v) => key(b'e', &[v]),
        Unit::Token(v) => key(b't', &[v]),
    }
}

/// What a unit counts against the limit: its automaton (or table) and its bookkeeping.
fn unit_cost(unit: &Unit) -> usize {
    let (patterns, bytes) = unit.size();
    let matcher = match unit {
        Unit::Token(_) => bytes + patterns * TABLE_BYTES_PER_FORM,
        _ => bytes * AUTOMATON_BYTES_PER_PATTERN_BYTE + patterns * AUTOMATON_BYTES_PER_PATTERN,
    };
    matcher + unit.len() + UNIT_OVERHEAD
}

impl Sensitive {
    pub fn new(limit: Arc<MemoryLimit>) -> Self {
        Sensitive {
            inner: Mutex::default(),
            limit,
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Adds a secret of the provider's configuration, for good; returns whether it was new.
    pub fn add_secret(&self, value: &[u8]) -> bool {
        if value.trim_ascii().is_empty() {
            return false;
        }
        let k = key(b's', &[value]);
        let mut inner = self.lock();
        if inner.holdings.contains_key(&k) {
            return false;
        }
        let (units, cost) = inner.new_units(secret_units(value));
        self.limit.force_take(cost);
        inner.insert_holding(k, units, vec![], true);
        true
    }

    /// Holds `doc` as `owner`'s cloud-init (replacing the one it held), so that every later
    /// call of the provider scrubs it; returns whether the value was new to the provider.
    /// What is compiled is the document without the credentials held so far (see the
    /// module docs).
    pub fn hold_cloud_init(&self, owner: &str, doc: &[u8]) -> Result<bool, Full> {
        if doc.trim_ascii().is_empty() {
            return Ok(false);
        }
        let mut inner = self.lock();
        let rest = cut_credentials(doc, |v| inner.cut.contains_key(v)).into_owned();
        let k = key(b'r', &[&rest]);
        self.hold(&mut inner, owner, Slot::CloudInit, k, |_| {
            (cloud_init_units(&rest), vec![])
        })
    }

    /// Holds a Proxy's username and password as `owner`'s credentials (each a whole value,
    /// see the module docs); returns whether the pair was new to the provider. The
    /// reconciler calls it for every Proxy as soon as it has read the Proxy's credentials,
    /// before any call that could show them.
    pub fn hold_credentials(
        &self,
        owner: &str,
        username: &[u8],
        password: &[u8],
    ) -> Result<bool, Full> {
        if username.is_empty() && password.is_empty() {
            return Ok(false);
        }
        // The length goes into the key too: ("ab", "c") and ("a", "bc") are two pairs.
        let k = key(b'u', &[&username.len().to_le_bytes(), username, password]);
        let mut inner = self.lock();
        self.hold(&mut inner, owner, Slot::Credentials, k, |_| {
            let cut = [username, password]
                .into_iter()
                .filter(|v| v.len() >= MIN_ENCODED)
                .map(Arc::from)
                .collect();
            (credential_units(username, password), cut)
        })
    }

    /// Releases what `owner` holds (its Proxy is gone): retired, then dropped when room is
    /// needed (see the module docs).
    pub fn forget(&self, owner: &str) {
        let mut inner = self.lock();
        for slot in [Slot::CloudInit, Slot::Credentials] {
            if let Some(k) = inner.owners.remove(&(Arc::from(owner), slot)) {
                inner.release(k);
            }
        }
        self.trim_retired(&mut inner, self.limit.limit / 8);
    }

    /// Bytes this provider's values count against the limit.
    pub fn cost(&self) -> usize {
        let inner = self.lock();
        inner.charged()
    }

    fn hold(
        &self,
        inner: &mut Inner,
        owner: &str,
        slot: Slot,
        k: Key,
        make: impl FnOnce(&Inner) -> (Vec<Unit>, Vec<Arc<[u8]>>),
    ) -> Result<bool, Full> {
        let owner: Arc<str> = Arc::from(owner);
        let previous = inner.owners.get(&(owner.clone(), slot)).copied();
        if previous == Some(k) {
            return Ok(false);
        }
        let new = if let Some(h) = inner.holdings.get_mut(&k) {
            h.owners += 1;
            if h.retired {
                h.retired = false;
                inner.retired_cost = inner.retired_cost.saturating_sub(h.retired_cost);
            }
            false
        } else {
            let (units, cut) = make(inner);
            let units = inner.tokens_within_bound(units);
            let (units, cost) = inner.new_units(units);
            if let Err(used) = self.limit.try_take(cost) {
                // Room held by values no one holds any more goes first.
                self.trim_retired(inner, 0);
                self.compact(inner);
                self.limit.try_take(cost).map_err(|_| Full {
                    needed: cost,
                    used: used.min(self.limit.used()),
                    limit: self.limit.limit,
                })?;
            }
            inner.insert_holding(k, units, cut, false);
            true
        };
        inner.owners.insert((owner, slot), k);
        if let Some(p) = previous {
            inner.release(p);
            self.trim_retired(inner, self.limit.limit / 8);
        }
        Ok(new)
    }

    /// Drops retired holdings, oldest first, until they cost at most `keep`.
    fn trim_retired(&self, inner: &mut Inner, keep: usize) {
        while inner.retired_cost > keep {
            let Some(k) = inner.retired.pop_front() else {
                break;
            };
            if inner.holdings.get(&k).is_some_and(|h| h.retired) {
                let freed = inner.drop_holding(k);
                self.limit.give(freed);
            }
        }
        // A segment mostly made of dropped units is rebuilt without them (at the next use).
        if inner.segments.iter().any(|c| c.dead * 2 > c.cost) {
            inner.compiled = None;
        }
    }

    /// Recompiles every segment holding dropped units, giving their cost back.
    fn compact(&self, inner: &mut Inner) {
        for i in 0..inner.segments.len() {
            if inner.segments[i].dead > 0 {
                self.limit.give(inner.recompile(i));
            }
        }
        inner.segments.retain(|c| !c.units.is_empty());
        self.count_segments(inner);
        inner.compiled = None;
    }

    /// Holds a value the plugin derived from its secrets (`host.mark-sensitive`) in the
    /// place of the oldest of its last [`DERIVED_VALUES`]; returns whether it was new. A
    /// value already held there keeps its place (a plugin marks the same cached token on
    /// every call).
    pub fn mark_derived(&self, value: &[u8]) -> Result<bool, Full> {
        if value.len() < MIN_DERIVED_BYTES || value.trim_ascii().is_empty() {
            return Ok(false);
        }
        let k = key(b'd', &[value]);
        let mut inner = self.lock();
        let owner: Arc<str> = Arc::from(DERIVED_OWNER);
        if (0..DERIVED_VALUES)
            .any(|i| inner.owners.get(&(owner.clone(), Slot::Derived(i))) == Some(&k))
        {
            return Ok(false);
        }
        let place = inner.next_derived % DERIVED_VALUES;
        let previous = inner
            .owners
            .get(&(owner.clone(), Slot::Derived(place)))
            .copied();
        let new = self.hold(&mut inner, DERIVED_OWNER, Slot::Derived(place), k, |_| {
            (secret_units(value), vec![])
        })?;
        inner.next_derived = (place + 1) % DERIVED_VALUES;
        // The value pushed out of the ring goes now, unless something else holds it.
        if let Some(p) = previous
            && inner.holdings.get(&p).is_some_and(|h| h.retired)
        {
            let freed = inner.drop_holding(p);
            self.limit.give(freed);
            if inner.segments.iter().any(|c| c.dead * 2 > c.cost) {
                inner.compiled = None;
            }
        }
        Ok(new)
    }

    /// Counts each segment's fixed cost against the limit.
    fn count_segments(&self, inner: &mut Inner) {
        let n = inner.segments.len();
        if n > inner.counted_segments {
            self.limit
                .force_take((n - inner.counted_segments) * SEGMENT_OVERHEAD);
        } else {
            self.limit
                .give((inner.counted_segments - n) * SEGMENT_OVERHEAD);
        }
        inner.counted_segments = n;
    }

    /// The redactor for everything known so far.
    pub fn redactor(&self) -> Arc<Redactor> {
        let mut inner = self.lock();
        if let Some(r) = &inner.compiled {
            return r.clone();
        }
        let mut pending = std::mem::take(&mut inner.pending);
        pending.sort_unstable();
        pending.dedup();
        pending.retain(|k| inner.units.get(k).is_some_and(|u| u.segment.is_none()));
        // In pieces of at most SEGMENT_WEIGHT: one build of a burst is a peak too.
        let mut piece = vec![];
        let mut weight = 0;
        for k in pending {
            weight += inner.units.get(&k).map_or(0, |e| e.weight);
            piece.push(k);
            if weight >= SEGMENT_WEIGHT {
                let id = inner.new_segment_id();
                let c = inner.compile(id, std::mem::take(&mut piece));
                inner.segments.push(c);
                weight = 0;
            }
        }
        if !piece.is_empty() {
            let id = inner.new_segment_id();
            let c = inner.compile(id, piece);
            inner.segments.push(c);
        }
        while let [.., older, newer] = inner.segments.as_slice() {
            if older.weight > 2 * newer.weight || older.weight + newer.weight > SEGMENT_WEIGHT {
                break;
            }
            let newer = inner.segments.pop().expect("two segments");
            let older = inner.segments.pop().expect("two segments");
            let mut live = inner.live_of(&older.units, older.id);
            live.extend(inner.live_of(&newer.units, newer.id));
            let id = inner.new_segment_id();
            let c = inner.compile(id, live);
            inner.segments.push(c);
            self.limit.give(older.dead + newer.dead);
        }
        for i in 0..inner.segments.len() {
            if inner.segments[i].dead * 2 > inner.segments[i].cost {
                self.limit.give(inner.recompile(i));
            }
        }
        inner.segments.retain(|c| !c.units.is_empty());
        self.count_segments(&mut inner);
        let r = Arc::new(Redactor::from_segments(
            inner
                .segments
                .iter()
                .filter_map(|c| c.segment.clone())
                .collect(),
        ));
        inner.compiled = Some(r.clone());
        r
    }

    /// Compiled segments, as unit counts (for tests of the merge schedule).
    #[cfg(test)]
    fn segment_sizes(&self) -> Vec<usize> {
        let inner = self.lock();
        inner.segments.iter().map(|c| c.units.len()).collect()
    }

    /// Holds a document for good (tests without owners).
    #[cfg(test)]
    fn add_cloud_init(&self, doc: &[u8]) -> bool {
        let owner = format!("doc-{:x}", key(b'o', &[doc]));
        self.hold_cloud_init(&owner, doc).expect("room")
    }

    /// Holds a pair for good (tests without owners).
    #[cfg(test)]
    fn add_credentials(&self, username: &[u8], password: &[u8]) -> bool {
        let owner = format!("pair-{:x}", key(b'o', &[username, b"\0", password]));
        self.hold_credentials(&owner, username, password)
            .expect("room")
    }
}

impl Inner {
    /// `units` with each new token whose forms would share an anchor with
    /// [`MAX_FORMS_PER_ANCHOR`] others held as a plain value.
    fn tokens_within_bound(&self, units: Vec<Unit>) -> Vec<Unit> {
        units
            .into_iter()
            .map(|u| match u {
                Unit::Token(v)
                    if !self.units.contains_key(&key(b't', &[&v]))
                        && tokens::forms_of(&v).iter().any(|f| {
                            self.anchors.get(&anchor_of(f)).copied().unwrap_or(0)
                                >= MAX_FORMS_PER_ANCHOR
                        }) =>
                {
                    Unit::Value(v)
                }
                u => u,
            })
            .collect()
    }

    /// Counts (`up`) or uncounts a token's forms against their anchors.
    fn count_anchors(&mut self, unit: &Unit, up: bool) {
        let Unit::Token(v) = unit else {
            return;
        };
        for f in tokens::forms_of(v) {
            let a = anchor_of(&f);
            if up {
                *self.anchors.entry(a).or_default() += 1;
            } else if let Some(n) = self.anchors.get_mut(&a) {
                *n -= 1;
                if *n == 0 {
                    self.anchors.remove(&a);
                }
            }
        }
    }

    /// Every unit's key, and the cost of those not known yet (and of the holding).
    fn new_units(&self, mut units: Vec<Unit>) -> (Vec<(Key, Unit)>, usize) {
        units.sort_unstable();
        units.dedup();
        let mut cost = HOLDING_OVERHEAD + 16 * units.len();
        let keyed: Vec<(Key, Unit)> = units.into_iter().map(|u| (unit_key(&u), u)).collect();
        for (k, u) in &keyed {
            if !self.units.contains_key(k) {
                cost += unit_cost(u);
            }
        }
        (keyed, cost)
    }

    fn insert_holding(
        &mut self,
        k: Key,
        units: Vec<(Key, Unit)>,
        cut: Vec<Arc<[u8]>>,
        permanent: bool,
    ) {
        let mut keys = Vec::with_capacity(units.len());
        for (uk, unit) in units {
            keys.push(uk);
            match self.units.get_mut(&uk) {
                Some(e) => e.holdings += 1,
                None => {
                    self.count_anchors(&unit, true);
                    let weight = unit.weight();
                    let c = unit_cost(&unit);
                    self.units.insert(
                        uk,
                        UnitEntry {
                            unit,
                            holdings: 1,
                            segment: None,
                            cost: c,
                            weight,
                        },
                    );
                    self.pending.push(uk);
                    self.compiled = None;
                }
            }
        }
        for part in &cut {
            *self.cut.entry(part.clone()).or_default() += 1;
        }
        self.holdings.insert(
            k,
            Holding {
                retired_cost: 0,
                units: keys.into_boxed_slice(),
                owners: 1,
                permanent,
                retired: false,
                cut,
            },
        );
    }

    /// One owner fewer for `k`; retired at none.
    fn release(&mut self, k: Key) {
        let Some(h) = self.holdings.get_mut(&k) else {
            return;
        };
        h.owners = h.owners.saturating_sub(1);
        if h.owners > 0 || h.permanent || h.retired {
            return;
        }
        // What dropping it would free: itself and the units only it has.
        let own: usize = h
            .units
            .iter()
            .filter_map(|u| self.units.get(u))
            .filter(|e| e.holdings == 1)
            .map(|e| e.cost)
            .sum();
        let cost = own + HOLDING_OVERHEAD + 16 * h.units.len();
        let h = self.holdings.get_mut(&k).expect("present");
        h.retired = true;
        h.retired_cost = cost;
        self.retired_cost += cost;
        self.retired.push_back(k);
    }

    /// Drops a holding and every unit only it had; returns the cost freed now (units
    /// compiled into a segment are freed when it is recompiled).
    fn drop_holding(&mut self, k: Key) -> usize {
        let Some(h) = self.holdings.remove(&k) else {
            return 0;
        };
        if h.retired {
            self.retired_cost = self.retired_cost.saturating_sub(h.retired_cost);
        }
        let mut freed = HOLDING_OVERHEAD + 16 * h.units.len();
        for uk in h.units.iter() {
            let Some(e) = self.units.get_mut(uk) else {
                continue;
            };
            e.holdings -= 1;
            if e.holdings == 0 {
                let e = self.units.remove(uk).expect("present");
                self.count_anchors(&e.unit, false);
                match e.segment {
                    Some(id) => {
                        if let Some(c) = self.segments.iter_mut().find(|c| c.id == id) {
                            c.dead += e.cost;
                        }
                    }
                    None => freed += e.cost,
                }
            }
        }
        for part in h.cut {
            if let Some(n) = self.cut.get_mut(&part) {
                *n -= 1;
                if *n == 0 {
                    self.cut.remove(&part);
                }
            }
        }
        freed
    }

    /// Those of `units` still compiled into segment `id`.
    fn live_of(&self, units: &[Key], id: u64) -> Vec<Key> {
        units
            .iter()
            .filter(|k| self.units.get(k).is_some_and(|e| e.segment == Some(id)))
            .copied()
            .collect()
    }

    /// Recompiles segment `i` without its dropped units; returns the cost that frees.
    fn recompile(&mut self, i: usize) -> usize {
        let id = self.segments[i].id;
        let live = self.live_of(&self.segments[i].units, id);
        let c = self.compile(id, live);
        std::mem::replace(&mut self.segments[i], c).dead
    }

    fn new_segment_id(&mut self) -> u64 {
        self.next_segment += 1;
        self.next_segment
    }

    /// Compiles `keys` (all present) as segment `id`.
    fn compile(&mut self, id: u64, keys: Vec<Key>) -> Compiled {
        let mut p = Patterns::default();
        let (mut weight, mut cost) = (0, 0);
        for k in &keys {
            if let Some(e) = self.units.get_mut(k) {
                p.add(&e.unit);
                weight += e.weight;
                cost += e.cost;
                e.segment = Some(id);
            }
        }
        Compiled {
            id,
            segment: p.segment().map(Arc::new),
            units: keys,
            weight,
            cost,
            dead: 0,
        }
    }

    /// Everything counted: units (compiled, pending, or dropped but still in an automaton)
    /// and holdings.
    fn charged(&self) -> usize {
        let units: usize = self.units.values().map(|e| e.cost).sum();
        let dead: usize = self.segments.iter().map(|c| c.dead).sum();
        let holdings: usize = self
            .holdings
            .values()
            .map(|h| HOLDING_OVERHEAD + 16 * h.units.len())
            .sum();
        units + dead + holdings + self.segments.len() * SEGMENT_OVERHEAD
    }
}

/// `doc` with every occurrence of a `known` credential cut out (each replaced by a line
/// break, so a line holding one is compiled as the pieces around it); borrowed when it
/// holds none. Only what a template puts there is looked for: a whitespace-separated word,
/// or a run between the separators [`crate::redact`] splits cloud-init words on (`user:pass`,
/// `"pass",`). A credential elsewhere stays in the document, which is then compiled as
/// before: at a higher cost, never with less coverage. Sound because each registered part
/// is a whole value in every encoding of its own: whatever form of the document a plugin
/// prints holds each cut part in that form, and the rest of the document is matched as
/// always.
fn cut_credentials<'a>(doc: &'a [u8], known: impl Fn(&[u8]) -> bool) -> Cow<'a, [u8]> {
    let is_sep = |b: &u8| {
        matches!(
            b,
            b':' | b'=' | b'"' | b'\'' | b',' | b'[' | b']' | b'{' | b'}' | b'(' | b')' | b';'
        )
    };
    let mut cuts: Vec<std::ops::Range<usize>> = Vec::new();
    let mut consider = |at: usize, run: &[u8]| {
        if run.len() >= MIN_ENCODED && known(run) {
            cuts.push(at..at + run.len());
        }
    };
    let mut at = 0;
    for word in doc.split(|b| b.is_ascii_whitespace()) {
        consider(at, word);
        if word.iter().any(is_sep) {
            let mut inner = at;
            for run in word.split(is_sep) {
                consider(inner, run);
                inner += run.len() + 1;
            }
        }
        at += word.len() + 1;
    }
    if cuts.is_empty() {
        return Cow::Borrowed(doc);
    }
    cuts.sort_unstable_by_key(|r| r.start);
    let mut out = Vec::with_capacity(doc.len());
    let mut from = 0;
    for cut in cuts {
        if cut.start >= from {
            out.extend_from_slice(&doc[from..cut.start]);
            out.push(b'\n');
            from = cut.end;
        }
    }
    out.extend_from_slice(&doc[from..]);
    Cow::Owned(out)
}

/// One [`Sensitive`] per provider name, for the life of the process.
pub struct SensitiveByProvider {
    by_name: Mutex<BTreeMap<String, Arc<Sensitive>>>,
    limit: Arc<MemoryLimit>,
}

impl Default for SensitiveByProvider {
    fn default() -> Self {
        SensitiveByProvider::new(DEFAULT_LIMIT_BYTES)
    }
}

impl SensitiveByProvider {
    /// All providers' values together may cost `limit_bytes`.
    pub fn new(limit_bytes: usize) -> Self {
        SensitiveByProvider {
            by_name: Mutex::default(),
            limit: MemoryLimit::new(limit_bytes),
        }
    }

    pub fn get(&self, provider: &str) -> Arc<Sensitive> {
        self.by_name
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .entry(provider.to_string())
            .or_insert_with(|| Arc::new(Sensitive::new(self.limit.clone())))
            .clone()
    }

    /// The limit all providers share (for the metrics).
    pub fn limit(&self) -> &Arc<MemoryLimit> {
        &self.limit
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What a plugin marks sensitive is held in a ring of its latest values: the same value
    /// marked again (a cached token, on every call) keeps its place and costs nothing; one
    /// pushed out of the ring is dropped at once.
    #[test]
    fn derived_values_are_held_in_a_ring() {
        let s = Sensitive::new(MemoryLimit::new(DEFAULT_LIMIT_BYTES));
        assert_eq!(
            s.mark_derived(b"short"),
            Ok(false),
            "under MIN_DERIVED_BYTES"
        );
        assert_eq!(s.mark_derived(b"token-number-0000"), Ok(true));
        let cost = s.cost();
        for _ in 0..100 {
            assert_eq!(s.mark_derived(b"token-number-0000"), Ok(false));
        }
        assert_eq!(s.cost(), cost, "marking the same value again is free");
        for i in 1..=u32::from(DERIVED_VALUES) {
            assert_eq!(
                s.mark_derived(format!("token-number-{i:04}").as_bytes()),
                Ok(true)
            );
        }
        let r = s.redactor();
        assert!(!r.finds_whole("token-number-0000"), "pushed out, dropped");
        assert!(r.finds_whole("token-number-0001"));
        assert!(r.finds_whole(&format!("token-number-{:04}", DERIVED_VALUES)));
        let held = s
            .lock()
            .owners
            .keys()
            .filter(|(o, _)| &**o == DERIVED_OWNER)
            .count();
        assert_eq!(
            held,
            usize::from(DERIVED_VALUES),
            "the ring holds its latest values"
        );
    }

    /// A hostile plugin marking a new value of the largest size on and on (what a call of
    /// `mark-flood` does) holds no more of the shared redaction memory than its ring: about
    /// 1 MiB, whatever the number of values.
    #[test]
    fn a_flood_of_derived_values_stays_within_the_ring() {
        let limit = MemoryLimit::new(DEFAULT_LIMIT_BYTES);
        let s = Sensitive::new(limit.clone());
        let mut seed = 7u64;
        let mut value = || {
            (0..MAX_DERIVED_BYTES)
                .map(|_| {
                    seed = seed.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1);
                    b'a' + ((seed >> 33) % 26) as u8
                })
                .collect::<Vec<u8>>()
        };
        let mut peak = 0;
        for _ in 0..300 {
            s.mark_derived(&value()).unwrap();
            let _ = s.redactor();
            peak = peak.max(limit.used());
        }
        assert!(peak < 3 << 20, "the ring's values took {} KiB", peak >> 10);
        assert!(
            s.cost() < 3 << 19,
            "held after the flood: {} KiB",
            s.cost() >> 10
        );
    }

    #[test]
    fn knows_every_document_and_rebuilds_only_when_something_is_new() {
        let s = Sensitive::default();
        assert!(s.add_cloud_init(b"#cloud-config\nrunpass: FIRST-SENTINEL-A\n"));
        let r1 = s.redactor();
        assert!(!s.add_cloud_init(b"#cloud-config\nrunpass: FIRST-SENTINEL-A\n"));
        assert!(Arc::ptr_eq(&r1, &s.redactor()), "no new value, no rebuild");
        assert!(s.add_cloud_init(b"#cloud-config\nrunpass: SECOND-SENTINEL-B\n"));
        assert!(s.add_secret(b"tok-123456"));
        assert!(!s.add_secret(b""));
        let r = s.redactor();
        let out = r.scrub("FIRST-SENTINEL-A SECOND-SENTINEL-B tok-123456");
        assert!(!out.contains("SENTINEL") && !out.contains("tok-"), "{out}");
    }

    /// Adding one document at a time, each followed by a use: every value stays matched,
    /// and the segments stay few (log2 of the values, plus one).
    #[test]
    fn one_document_at_a_time_stays_matched_with_few_segments() {
        let s = Sensitive::default();
        for i in 0..300 {
            s.add_cloud_init(format!("#cloud-config\nrunpass: sentinel-{i:05}-value\n").as_bytes());
            let r = s.redactor();
            for j in [0, i / 2, i] {
                assert!(r.finds(&format!("x sentinel-{j:05}-value y")), "{i}: {j}");
            }
            // Each document's units: its line and its value; `runpass` is shared.
            let sizes = s.segment_sizes();
            assert_eq!(sizes.iter().sum::<usize>(), 2 * (i + 1) + 1);
            let bound = usize::BITS - (2 * i + 3).leading_zeros() + 1;
            assert!(sizes.len() <= bound as usize, "{i}: {sizes:?}");
        }
    }

    /// A pair is registered once; the same bytes split differently are another pair.
    #[test]
    fn credentials_are_known_once_as_whole_values() {
        let s = Sensitive::default();
        assert!(s.add_credentials(b"proxyuser-SENTINEL", b"password-SENTINEL"));
        assert!(!s.add_credentials(b"proxyuser-SENTINEL", b"password-SENTINEL"));
        assert!(s.add_credentials(b"proxyuser-SENTINELp", b"assword-SENTINEL"));
        assert!(!s.add_credentials(b"", b""));
        let r = s.redactor();
        assert!(r.finds_whole("i-proxyuser-SENTINEL"));
        assert!(r.finds_whole(&data_encoding::BASE64.encode(b"password-SENTINEL")));
        assert_eq!(r.scrub("x password-SENTINEL y"), "x [REDACTED] y");
    }

    /// A fleet rendered from one template: each document is cut at its credentials, and
    /// what is left is the same for every Proxy, so it is compiled once. The whole
    /// document, in any encoding, is still scrubbed of every credential.
    #[test]
    fn documents_are_compiled_without_their_credentials_once_per_template() {
        let s = Sensitive::default();
        let doc = |user: &str, pass: &str| {
            format!(
                "#cloud-config\nwrite_files:\n  - content: |\n      BasicAuth {user} {pass}\n      htpasswd: {user}:{pass}\n"
            )
        };
        let mut one = 0;
        for i in 0..50 {
            let (user, pass) = generated_like(i);
            s.add_credentials(user.as_bytes(), pass.as_bytes());
            // New once: the others are the same document but for the credentials.
            assert_eq!(s.add_cloud_init(doc(&user, &pass).as_bytes()), i == 0);
            if i == 0 {
                let _ = s.redactor();
                one = s.segment_sizes().iter().sum::<usize>();
            }
        }
        let r = s.redactor();
        assert_eq!(
            s.segment_sizes().iter().sum::<usize>(),
            one + 49 * 2,
            "a user and a password more per Proxy, nothing of its document"
        );
        let (user, pass) = generated_like(7);
        let whole = doc(&user, &pass);
        let b64 = data_encoding::BASE64.encode(whole.as_bytes());
        let json = serde_json::to_string(&whole).unwrap();
        for text in [whole.clone(), b64, json] {
            let out = r.scrub(&text);
            for (what, form) in [
                ("user", user.clone()),
                ("password", pass.clone()),
                (
                    "b64 user",
                    data_encoding::BASE64.encode(user.as_bytes())[4..20].to_string(),
                ),
                (
                    "b64 password",
                    data_encoding::BASE64.encode(pass.as_bytes())[4..30].to_string(),
                ),
            ] {
                assert!(!out.contains(&form), "{what} in {out}");
            }
        }
        // An ID holding the whole document holds its credentials.
        assert!(r.finds_whole(&whole));
        // A document whose credentials were not registered first is compiled whole.
        let s = Sensitive::default();
        s.add_cloud_init(doc(&user, &pass).as_bytes());
        s.add_credentials(user.as_bytes(), pass.as_bytes());
        let r = s.redactor();
        assert!(r.finds_whole(&format!("BasicAuth {user} {pass}")));
    }

    #[test]
    fn cut_credentials_finds_what_a_template_puts_there() {
        let known: std::collections::HashSet<Arc<[u8]>> =
            [&b"userSENTINEL"[..], &b"pa\"ss:w0rd"[..]]
                .into_iter()
                .map(Arc::from)
                .collect();
        let cut = |doc: &str| {
            String::from_utf8(cut_credentials(doc.as_bytes(), |v| known.contains(v)).into_owned())
                .unwrap()
        };
        assert_eq!(
            cut("BasicAuth userSENTINEL pa\"ss:w0rd\n"),
            "BasicAuth \n \n\n"
        );
        assert_eq!(
            cut("auth: userSENTINEL:x,\"userSENTINEL\""),
            "auth: \n:x,\"\n\""
        );
        // Inside another word it stays (and the document is compiled with it).
        assert_eq!(cut("xuserSENTINEL"), "xuserSENTINEL");
        assert!(matches!(
            cut_credentials(b"nothing here", |v| known.contains(v)),
            Cow::Borrowed(_)
        ));
    }

    #[test]
    fn one_set_per_provider_name() {
        let all = SensitiveByProvider::default();
        all.get("a").add_secret(b"secret-of-a");
        assert!(Arc::ptr_eq(&all.get("a"), &all.get("a")));
        assert!(!all.get("b").redactor().finds("secret-of-a"));
        assert!(all.get("a").redactor().finds("secret-of-a"));
    }

    /// Memory of the process, for the check below (Linux).
    fn resident_bytes() -> u64 {
        let statm = std::fs::read_to_string("/proc/self/statm").unwrap_or_default();
        let pages: u64 = statm
            .split_whitespace()
            .nth(1)
            .and_then(|p| p.parse().ok())
            .unwrap_or(0);
        pages * 4096
    }

    /// Credentials as the operator generates them (24 and 32 letters and digits), different
    /// for every `i`, without a random number generator.
    fn generated_like(i: usize) -> (String, String) {
        const ALPHABET: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789";
        let digest = Sha256::digest(i.to_le_bytes());
        let digest2 = Sha256::digest(digest);
        let chars: Vec<char> = digest
            .iter()
            .chain(digest2.iter())
            .map(|b| ALPHABET[usize::from(*b) % ALPHABET.len()] as char)
            .collect();
        (chars[..24].iter().collect(), chars[24..56].iter().collect())
    }

    /// A fleet whose Proxies each carry their own credentials (the samples' tinyproxy
    /// `BasicAuth`, generated per Proxy) gives the redactor, per Proxy, one distinct
    /// document and one username and password, kept for the life of the process. Each
    /// document used to cost about 47 KiB (every document whole in every encoding, two
    /// automata, a full rebuild per new document): 470 MiB at 10,000. Then a document cost
    /// its new lines, compiled once into a segment of at most 1,024 values: 1.2 KiB for a
    /// short distinct password sharing most of its characters with the others', but
    /// 5.0 KiB with credentials as the operator generates them (56 random characters on
    /// one line, in every encoding). Now the credentials are whole values of their own (the
    /// username and the password, raw and base64 at three alignments: 8 patterns, the
    /// pair needs none) and are cut out of the document, whose remainder is the same for
    /// the whole fleet and compiled once: 3.9 KiB of automata per Proxy. Now the username
    /// and the password are tokens ([`crate::redact::tokens`]), looked up in a table of
    /// four forms each instead of matched by automaton. Bounds per Proxy: the automata and
    /// tables at most 1 KiB (measured 576 B), the process at most 10 KiB (measured 2.2 KiB
    /// alone, more with other tests running beside it: the process is shared).
    #[test]
    fn distinct_cloud_init_documents_cost_the_redactor_little() {
        let s = Sensitive::default();
        let before = resident_bytes();
        let n = 4000;
        for i in 0..n {
            let (user, pass) = generated_like(i);
            // As the reconciler registers them: the credentials as soon as it has read
            // them, then the rendered document.
            s.add_credentials(user.as_bytes(), pass.as_bytes());
            let doc = format!(
                "#cloud-config\npackages: [tinyproxy]\nwrite_files:\n  - path: /etc/tinyproxy/tinyproxy.conf\n    content: |\n      Port 3128\n      BasicAuth {user} {pass}\n      Allow 0.0.0.0/0\nruncmd:\n  - systemctl restart tinyproxy\n"
            );
            s.add_cloud_init(doc.as_bytes());
            if i % 100 == 99 {
                let _ = s.redactor();
            }
        }
        let r = s.redactor();
        for i in [0, 7, n / 2, n - 1] {
            let (user, pass) = generated_like(i);
            let line = format!("BasicAuth {user} {pass}");
            assert!(r.finds(&pass));
            let b64 = data_encoding::BASE64.encode(format!("x{line}\n").as_bytes());
            assert!(!r.scrub(&b64).contains(&b64[8..40]), "{i}: {b64}");
            // Whole values: an ID may hold none of them, in any encoding.
            for id in [
                user.clone(),
                pass.clone(),
                format!("{user}:{pass}"),
                format!(
                    "Basic {}",
                    data_encoding::BASE64.encode(format!("{user}:{pass}").as_bytes())
                ),
                data_encoding::BASE64URL.encode(format!("i-{pass}").as_bytes()),
            ] {
                assert!(r.finds_whole(&id), "{i}: {id}");
            }
        }
        let automata = r.memory_usage();
        let grew = resident_bytes().saturating_sub(before);
        eprintln!(
            "{n} Proxies: automata {} KiB ({} B per Proxy), process grew {} KiB ({} B per Proxy)",
            automata >> 10,
            automata / n,
            grew >> 10,
            grew / n as u64
        );
        assert!(
            automata < n * 1024,
            "{n} Proxies: automata of {} KiB",
            automata >> 10
        );
        assert!(
            grew < (n * 10240) as u64,
            "{n} Proxies grew the process by {} KiB",
            grew >> 10
        );
    }
    /// A document of `lines` random lines of 40 letters and digits (about 41 bytes each),
    /// different for every `seed`: the costliest kind for the redactor, every line its own
    /// whole value in every encoding.
    fn random_document(seed: usize, lines: usize) -> String {
        let mut doc = String::from("#cloud-config\nruncmd:\n");
        for l in 0..lines {
            let (a, b) = generated_like(seed * 100_000 + l);
            doc.push_str(&format!("  - {a}{}\n", &b[..16]));
        }
        doc
    }

    /// What the limit counts covers what the automata really take, for the costliest
    /// documents and for credentials, without counting more than twice as much.
    #[test]
    fn the_cost_estimate_covers_the_automata() {
        for (what, fill) in [
            (
                "random documents",
                &(|s: &Sensitive, i: usize| {
                    s.hold_cloud_init(&format!("p{i}"), random_document(i, 100).as_bytes())
                        .unwrap();
                }) as &dyn Fn(&Sensitive, usize),
            ),
            ("generated credentials", &|s: &Sensitive, i: usize| {
                let (u, p) = generated_like(i);
                s.hold_credentials(&format!("p{i}"), u.as_bytes(), p.as_bytes())
                    .unwrap();
            }),
        ] {
            let s = Sensitive::new(MemoryLimit::new(usize::MAX));
            for i in 0..300 {
                fill(&s, i);
                if i % 50 == 49 {
                    let _ = s.redactor();
                }
            }
            let automata = s.redactor().memory_usage();
            let counted = s.cost();
            eprintln!(
                "{what}: automata {} KiB, counted {} KiB",
                automata >> 10,
                counted >> 10
            );
            assert!(counted >= automata, "{what}: {counted} < {automata}");
            // Tables are small beside the bookkeeping of their units and holdings, which
            // `memory_usage` does not see: the bound is looser for them.
            let times = if what == "generated credentials" {
                3
            } else {
                2
            };
            assert!(
                counted <= times * automata,
                "{what}: {counted} > {times} x {automata}"
            );
        }
    }

    /// A user who creates Proxies with random 16 KiB documents (about 1.2 MiB of automaton
    /// each) is refused at the limit, with a message naming it, and the automata stay
    /// within it; every document held before is still scrubbed.
    #[test]
    fn distinct_documents_are_refused_at_the_limit() {
        let limit = 8 << 20;
        let s = Sensitive::new(MemoryLimit::new(limit));
        let mut held = 0;
        let err = loop {
            match s.hold_cloud_init(&format!("p{held}"), random_document(held, 390).as_bytes()) {
                Ok(_) => held += 1,
                Err(e) => break e,
            }
            assert!(held < 100, "never refused");
        };
        assert!(held >= 3, "only {held} documents held");
        let text = err.to_string();
        assert!(text.contains("--redaction-memory"), "{text}");
        assert!(
            text.contains("8 MiB") || text.contains("8192 KiB"),
            "{text}"
        );
        let r = s.redactor();
        assert!(r.memory_usage() <= limit, "{} > {limit}", r.memory_usage());
        for i in 0..held {
            let line = random_document(i, 390).lines().nth(7).unwrap().to_string();
            assert!(r.finds_whole(&line), "document {i} no longer scrubbed");
        }
        // Refused means not held: the same owner may try again when there is room.
        s.forget("p0");
        s.forget("p1");
        assert!(
            s.hold_cloud_init(&format!("p{held}"), random_document(held, 390).as_bytes())
                .is_ok(),
            "room made by two deleted Proxies"
        );
    }

    /// Proxies created and deleted without end, each with its own document, and one Proxy
    /// whose document is edited without end: the cost stays within the limit and no held
    /// document is ever refused; the last ones forgotten are still scrubbed.
    #[test]
    fn churn_stays_within_the_limit() {
        let limit = 4 << 20;
        let s = Sensitive::new(MemoryLimit::new(limit));
        for i in 0..400 {
            let doc = random_document(i, 40);
            s.hold_cloud_init(&format!("p{i}"), doc.as_bytes())
                .unwrap_or_else(|e| panic!("{i}: {e}"));
            s.hold_cloud_init("edited", random_document(1_000_000 + i, 40).as_bytes())
                .unwrap_or_else(|e| panic!("edit {i}: {e}"));
            let _ = s.redactor();
            if i >= 5 {
                s.forget(&format!("p{}", i - 5));
            }
            assert!(s.cost() <= limit, "{i}: {} > {limit}", s.cost());
        }
        let r = s.redactor();
        assert!(r.memory_usage() <= limit);
        // Held now: the last five, and the edited Proxy's last document.
        for i in 395..400 {
            let line = random_document(i, 40).lines().nth(3).unwrap().to_string();
            assert!(r.finds_whole(&line), "held document {i} not scrubbed");
        }
        let line = random_document(1_000_399, 40)
            .lines()
            .nth(3)
            .unwrap()
            .to_string();
        assert!(r.finds_whole(&line));
        // Forgotten last: retired, still scrubbed.
        let line = random_document(394, 40).lines().nth(3).unwrap().to_string();
        assert!(r.finds_whole(&line), "the last one deleted is kept a while");
    }

    /// A user who gives many Proxies passwords with one 16-byte prefix does not make a
    /// table compare them all at each place of a text: past [`MAX_FORMS_PER_ANCHOR`] forms
    /// per anchor, such a password is held as a value (an automaton, counted as one), and
    /// every password is still scrubbed in every form.
    #[test]
    fn passwords_sharing_a_prefix_do_not_make_a_long_chain() {
        let s = Sensitive::new(MemoryLimit::new(usize::MAX));
        let n = 300;
        let pass = |i: usize| format!("AAAAAAAAAAAAAAAA{i:04}");
        for i in 0..n {
            s.hold_credentials(&format!("uid-{i}"), b"proxyuser", pass(i).as_bytes())
                .unwrap();
            if i % 50 == 49 {
                let _ = s.redactor();
            }
        }
        let r = s.redactor();
        // 300 without the bound (measured: 200 in one table); with it, the bound and at
        // most one more (two tokens of one holding pass the check together).
        let chain = r.longest_token_chain();
        assert!(chain <= 5, "{chain} forms share an anchor");
        for i in [0, 1, 7, n / 2, n - 1] {
            let p = pass(i);
            for text in [
                p.clone(),
                data_encoding::BASE64.encode(format!("proxyuser:{p}").as_bytes()),
                data_encoding::BASE64.encode(format!("x{p}").as_bytes()),
            ] {
                assert!(r.finds_whole(&text), "{i}: {text}");
            }
        }
    }

    /// A fleet from one template, each Proxy with its own generated credentials, costs under
    /// 2 KiB a Proxy (measured 1.6): 10,000 of them fit the default limit with room to
    /// spare. At 5 KiB each (an automaton per credential) the default held 6,900.
    #[test]
    fn a_fleet_of_10000_with_generated_credentials_fits_the_default_limit() {
        let s = Sensitive::default();
        let n = 10_000;
        for i in 0..n {
            let (user, pass) = generated_like(i);
            let owner = format!("uid-{i}");
            s.hold_credentials(&owner, user.as_bytes(), pass.as_bytes())
                .unwrap_or_else(|e| panic!("{i}: {e}"));
            let doc = format!(
                "#cloud-config\nwrite_files:\n  - content: |\n      BasicAuth {user} {pass}\n"
            );
            s.hold_cloud_init(&owner, doc.as_bytes())
                .unwrap_or_else(|e| panic!("{i}: {e}"));
        }
        let r = s.redactor();
        eprintln!(
            "{n} Proxies: {} KiB counted of {} KiB, automata and tables {} KiB",
            s.cost() >> 10,
            DEFAULT_LIMIT_BYTES >> 10,
            r.memory_usage() >> 10
        );
        assert!(s.cost() < n * 2048, "{} B per Proxy", s.cost() / n);
        let (user, pass) = generated_like(n / 2);
        assert!(r.finds_whole(&format!("i-{user}")) && r.finds_whole(&pass));
    }
}
