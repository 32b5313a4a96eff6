//! What a ProxyPool should do next, decided from what it observes: pure, so every rule
//! (fill, scale down, rotation with surge, the `minReady` floor, placement back-off and
//! weighted spreading) is a table row in the tests below.
//!
//! The rules, in the order they apply:
//! 1. A Proxy whose provisioning failed with a quota, permanent or not-configured error
//!    marks its placement failing for `placementBackoff` and is deleted: it would never
//!    become Ready, and the pool fills from the other placements meanwhile.
//! 2. A Proxy is *stale* when its spec no longer matches its placement applied to the
//!    template, its placement is gone, or it is older than its own age limit (`maxAge`
//!    minus a jitter fixed by its UID). The others are *fresh*.
//! 3. Fresh Proxies over `replicas` are deleted (scale down): not Ready ones first, then
//!    from the placement most over its share, youngest first.
//! 4. Stale Proxies are deleted: not Ready ones at once, Ready ones oldest first while the
//!    Ready count stays at or above `minReady`.
//! 5. Proxies are created until `replicas` are fresh, with at most `replicas + maxSurge`
//!    alive at once, each on the usable placement furthest below its weighted share.
//!
//! A spec the plan cannot work from is refused whole, before any rule, with a
//! [`SpecError`] naming the field, its value and the limit ([`read_spec`],
//! [`Resolved::from_spec`]); the controller reports it as `InvalidSpec` (condition, Warning
//! Event, log line). The CRD refuses the same values, but the plan does not rely on it: an
//! older CRD, or none, lets them through.

use crate::api::{
    MAX_JITTER_PERCENT, MAX_MIN_READY, MAX_PLACEMENTS, MAX_REPLICAS, MAX_SURGE, MAX_WEIGHT,
    MIN_MAX_AGE, PlacementFailure, PlacementStatus, PoolPlacement, ProxyPoolSpec, ProxyPoolStatus,
    ProxySpec, pool_condition,
};
use crate::controller::decide::reason as proxy_reason;
use crate::controller::status::set_condition;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use sha2::{Digest, Sha256};
use std::collections::BTreeMap;
use std::time::Duration;

/// `maxAgeJitterPercent` when absent.
pub const DEFAULT_JITTER_PERCENT: i32 = 10;
/// `placementBackoff` when absent.
pub const DEFAULT_PLACEMENT_BACKOFF: Duration = Duration::from_secs(10 * 60);

/// Provisioned reasons that say "this placement cannot take a Proxy now": the Proxy
/// reconciler would retry (quota) or wait for a spec change (permanent) forever.
pub const PLACEMENT_FAILURES: [&str; 3] = [
    proxy_reason::QUOTA_EXCEEDED,
    proxy_reason::PERMANENT_ERROR,
    proxy_reason::PROVIDER_NOT_CONFIGURED,
];

/// One Proxy of the pool, as far as the plan cares.
#[derive(Clone, Debug, PartialEq)]
pub struct Child {
    pub name: String,
    pub uid: String,
    pub created: Timestamp,
    /// Its deletion has started.
    pub deleting: bool,
    /// Its Ready condition is True.
    pub ready: bool,
    /// Its `status.hourlyPrice`.
    pub price: Option<crate::api::HourlyPrice>,
    pub spec: ProxySpec,
    /// The placement annotation it was created with.
    pub placement: Option<String>,
    /// Provisioned=False with one of [`PLACEMENT_FAILURES`]: (reason, message).
    pub failure: Option<(String, String)>,
}

/// Why the plan deletes a Proxy (the event says it, counted).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum DeleteWhy {
    PlacementFailed,
    ScaleDown,
    Outdated,
    Expired,
    /// On a fallback placement while a preferred one takes Proxies again.
    FallenBack,
}

impl DeleteWhy {
    pub fn as_str(self) -> &'static str {
        match self {
            DeleteWhy::PlacementFailed => "placement failed",
            DeleteWhy::ScaleDown => "scale down",
            DeleteWhy::Outdated => "template or placement changed",
            DeleteWhy::Expired => "older than maxAge",
            DeleteWhy::FallenBack => "a preferred placement takes Proxies again",
        }
    }
}

#[derive(Clone, Debug, PartialEq)]
pub struct Deletion {
    pub name: String,
    pub uid: String,
    pub why: DeleteWhy,
}

#[derive(Clone, Debug, PartialEq)]
pub struct Creation {
    pub placement: String,
    pub spec: ProxySpec,
}

/// What to do, and the status to write afterwards.
#[derive(Clone, Debug, PartialEq)]
pub struct Plan {
    pub delete: Vec<Deletion>,
    pub create: Vec<Creation>,
    pub status: ProxyPoolStatus,
    /// Placements that started failing in this plan: (name, reason, message), for events.
    pub newly_failing: Vec<(String, String, String)>,
    /// When to look again if nothing changes before: the next Proxy to expire, the next
    /// placement to come out of back-off.
    pub requeue: Option<Duration>,
}

/// The spec with its defaults resolved.
#[derive(Clone, Debug, PartialEq)]
pub struct Resolved {
    pub replicas: usize,
    pub min_ready: usize,
    pub max_surge: usize,
    pub max_age: Option<Duration>,
    pub jitter_percent: u32,
    pub backoff: Duration,
    /// (name, weight, spec) per placement, in spec order.
    pub placements: Vec<(String, u32, ProxySpec)>,
    /// Names of the placements marked `fallback`: used only while no other can take a
    /// Proxy.
    pub fallbacks: std::collections::BTreeSet<String>,
    /// `strategy: Cheapest`.
    pub cheapest: bool,
    /// What each placement costs an hour, as far as the reconciler knows it without a
    /// provider call (see `pool::reconcile::known_prices`); empty unless `cheapest`.
    pub prices: BTreeMap<String, egress_plugin_host::provider::Price>,
}

/// A spec the plan cannot work from. Each message names the field, the value and the limit.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SpecError {
    #[error("spec.placements[{index}]: the name {name:?} is used twice (name the entries)")]
    DuplicatePlacement { index: usize, name: String },
    #[error("spec.placements[{index}].name: {name:?} is not a valid annotation value")]
    BadPlacementName { index: usize, name: String },
    #[error("spec.{field}: {value} is out of range: it must be from {min} to {max}")]
    OutOfRange {
        field: String,
        value: i64,
        min: i64,
        max: i64,
    },
    #[error("spec.placements: {count} entries, more than the {max} a pool may have")]
    TooManyPlacements { count: usize, max: usize },
    #[error(
        "spec.maxAge: {value} is shorter than {min}: no Proxy could be Ready before its replacement"
    )]
    MaxAgeTooShort { value: String, min: String },
    /// The spec does not even read as a ProxyPool spec (a value of the wrong type, or out of
    /// the type's range: `maxSurge: 4294967295` is not an `int32`).
    #[error("{field}: {found}cannot be read: {why}{expected}")]
    Unreadable {
        field: String,
        /// The value found, quoted and cut short, with a trailing blank; empty when it
        /// could not be found.
        found: String,
        why: String,
        /// What the field takes, with a leading blank, when known.
        expected: String,
    },
}

/// What each numeric or duration field takes, by its name (the last part of its path), for
/// the messages of [`read_spec`].
const FIELD_LIMITS: &[(&str, &str)] = &[
    ("replicas", "an integer from 0 to 10000"),
    ("minReady", "an integer from 0 to 10000"),
    ("maxSurge", "an integer from 0 to 10000"),
    ("maxAgeJitterPercent", "an integer from 0 to 90"),
    ("weight", "an integer from 0 to 1000"),
    ("port", "an integer from 1 to 65535"),
    ("maxAge", "a duration such as 6h or 1h 30m, at least 10s"),
    ("placementBackoff", "a duration such as 10m"),
];

/// `spec` (the pool's `spec` as the API server stored it) read into a [`ProxyPoolSpec`], or
/// why it cannot be, naming the field's path and the value found: a pool whose spec does not
/// deserialize is reported, never skipped.
pub fn read_spec(spec: &serde_json::Value) -> Result<ProxyPoolSpec, SpecError> {
    serde_path_to_error::deserialize(spec).map_err(|e| {
        let path = e.path();
        let field = match path.to_string().as_str() {
            "." => "spec".to_string(),
            p => format!("spec.{p}"),
        };
        let mut at = Some(spec);
        for segment in path.iter() {
            at = match segment {
                serde_path_to_error::Segment::Seq { index } => at.and_then(|v| v.get(*index)),
                serde_path_to_error::Segment::Map { key } => at.and_then(|v| v.get(key)),
                _ => None,
            };
        }
        let found = match at {
            Some(v @ (serde_json::Value::Number(_) | serde_json::Value::Bool(_))) => {
                format!("{v} ")
            }
            Some(serde_json::Value::String(s)) => {
                let mut s = format!("{s:?}");
                crate::controller::truncate(&mut s, 80);
                format!("{s} ")
            }
            _ => String::new(),
        };
        let last = path
            .iter()
            .next_back()
            .map(|s| s.to_string())
            .unwrap_or_default();
        let expected = FIELD_LIMITS
            .iter()
            .find(|(name, _)| *name == last)
            .map(|(_, takes)| format!(" (it takes {takes})"))
            .unwrap_or_default();
        let mut why = e.into_inner().to_string();
        crate::controller::truncate(&mut why, 512);
        SpecError::Unreadable {
            field,
            found,
            why,
            expected,
        }
    })
}

/// `value` of the field `field` as a count, if it is from 0 to `max`.
fn within(field: impl Into<String>, value: i32, max: i32) -> Result<usize, SpecError> {
    match usize::try_from(value) {
        Ok(n) if value <= max => Ok(n),
        _ => Err(SpecError::OutOfRange {
            field: field.into(),
            value: value.into(),
            min: 0,
            max: max.into(),
        }),
    }
}

impl Resolved {
    /// The spec with its defaults resolved, or the first field out of its bounds (the CRD's
    /// bounds, checked again: an older CRD may have let the value through).
    pub fn from_spec(spec: &ProxyPoolSpec) -> Result<Resolved, SpecError> {
        let replicas = within("replicas", spec.replicas, MAX_REPLICAS)?;
        let min_ready = match spec.min_ready {
            Some(v) => within("minReady", v, MAX_MIN_READY)?,
            None => replicas,
        };
        let max_surge = match spec.max_surge {
            Some(v) => within("maxSurge", v, MAX_SURGE)?,
            None => replicas.div_ceil(4).max(1),
        };
        if let Some(age) = spec.max_age
            && age < MIN_MAX_AGE
        {
            return Err(SpecError::MaxAgeTooShort {
                value: humantime::format_duration(age).to_string(),
                min: humantime::format_duration(MIN_MAX_AGE).to_string(),
            });
        }
        let jitter = within(
            "maxAgeJitterPercent",
            spec.max_age_jitter_percent
                .unwrap_or(DEFAULT_JITTER_PERCENT),
            MAX_JITTER_PERCENT,
        )?;
        if spec.placements.len() > MAX_PLACEMENTS {
            return Err(SpecError::TooManyPlacements {
                count: spec.placements.len(),
                max: MAX_PLACEMENTS,
            });
        }
        let defaults = [PoolPlacement::default()];
        let list: &[PoolPlacement] = if spec.placements.is_empty() {
            &defaults
        } else {
            &spec.placements
        };
        let mut placements: Vec<(String, u32, ProxySpec)> = Vec::with_capacity(list.len());
        let mut fallbacks = std::collections::BTreeSet::new();
        for (index, p) in list.iter().enumerate() {
            let weight = within(
                format!("placements[{index}].weight"),
                p.weight.unwrap_or(1),
                MAX_WEIGHT,
            )?;
            let name = p.display_name();
            if name.len() > 253 || name.chars().any(char::is_control) {
                return Err(SpecError::BadPlacementName { index, name });
            }
            if placements.iter().any(|(n, ..)| *n == name) {
                return Err(SpecError::DuplicatePlacement { index, name });
            }
            // At most MAX_WEIGHT, checked above.
            let weight = u32::try_from(weight).unwrap_or(0);
            if p.fallback == Some(true) {
                fallbacks.insert(name.clone());
            }
            placements.push((name, weight, p.apply(&spec.template.spec)));
        }
        Ok(Resolved {
            replicas,
            min_ready: min_ready.min(replicas),
            max_surge,
            max_age: spec.max_age,
            // At most MAX_JITTER_PERCENT, checked above.
            jitter_percent: u32::try_from(jitter).unwrap_or(0),
            backoff: spec.placement_backoff.unwrap_or(DEFAULT_PLACEMENT_BACKOFF),
            placements,
            fallbacks,
            cheapest: spec.strategy == Some(crate::api::Strategy::Cheapest),
            prices: BTreeMap::new(),
        })
    }

    /// A Proxy's own age limit: `maxAge` minus up to `jitter_percent` percent, the share
    /// fixed by its UID (so it survives restarts and differs between Proxies).
    pub fn age_limit(&self, uid: &str) -> Option<Duration> {
        let max = self.max_age?;
        let digest = Sha256::digest(uid.as_bytes());
        let mut first = [0u8; 8];
        first.copy_from_slice(&digest[..8]);
        let unit = u64::from_be_bytes(first) as f64 / (u64::MAX as f64 + 1.0);
        let cut = max.as_secs_f64() * f64::from(self.jitter_percent) / 100.0 * unit;
        Some(max.saturating_sub(Duration::try_from_secs_f64(cut).unwrap_or(Duration::ZERO)))
    }
}

fn age(now: Timestamp, created: Timestamp) -> Duration {
    Duration::try_from(now.duration_since(created)).unwrap_or(Duration::ZERO)
}

fn at(now: Timestamp, after: Duration) -> Time {
    let after = SignedDuration::try_from(after).unwrap_or(SignedDuration::MAX);
    Time(now.saturating_add(after).unwrap_or(Timestamp::MAX))
}

/// The plan for a pool named `pool` with `spec`, its last `status`, at `generation`, given
/// its Proxies `children`, at `now`.
pub fn plan(
    pool: &str,
    spec: &Resolved,
    status: &ProxyPoolStatus,
    generation: i64,
    children: &[Child],
    now: Timestamp,
) -> Plan {
    let now_time = Time(now);
    let index_of = |name: &str| spec.placements.iter().position(|(n, ..)| n == name);

    // Placement back-off carried over from the status, expired entries dropped.
    let mut failing: BTreeMap<String, PlacementFailure> = status
        .placements
        .iter()
        .filter_map(|p| Some((p.name.clone(), p.failing.clone()?)))
        .filter(|(name, f)| index_of(name).is_some() && f.retry_after.0 > now)
        .collect();

    let mut delete: Vec<Deletion> = Vec::new();
    let mut newly_failing = Vec::new();
    let mut alive: Vec<&Child> = Vec::new();
    for c in children.iter().filter(|c| !c.deleting) {
        if let (Some((reason, message)), Some(p)) = (&c.failure, &c.placement)
            && index_of(p).is_some()
        {
            let retry_after = at(now, spec.backoff);
            let since = match failing.get(p) {
                Some(f) => f.since.clone(),
                None => {
                    newly_failing.push((p.clone(), reason.clone(), message.clone()));
                    now_time.clone()
                }
            };
            failing.insert(
                p.clone(),
                PlacementFailure {
                    reason: reason.clone(),
                    message: message.clone(),
                    since,
                    retry_after,
                },
            );
            delete.push(deletion(c, DeleteWhy::PlacementFailed));
            continue;
        }
        alive.push(c);
    }

    // A preferred (not fallback) placement takes Proxies: fallback ones are replaced, as
    // stale ones are (never below minReady), so the pool returns to, say, spot capacity
    // once the backend has it again.
    let preferred_usable = spec
        .placements
        .iter()
        .any(|(name, weight, _)| usable(name, *weight, &failing) && !spec.fallbacks.contains(name));
    let stale_why = |c: &Child| -> Option<DeleteWhy> {
        let fits = c
            .placement
            .as_deref()
            .and_then(index_of)
            .is_some_and(|i| spec.placements[i].2 == c.spec);
        if !fits {
            return Some(DeleteWhy::Outdated);
        }
        if c.placement
            .as_deref()
            .is_some_and(|p| spec.fallbacks.contains(p))
            && preferred_usable
        {
            return Some(DeleteWhy::FallenBack);
        }
        let limit = spec.age_limit(&c.uid)?;
        (age(now, c.created) >= limit).then_some(DeleteWhy::Expired)
    };
    let (mut stale, fresh): (Vec<&Child>, Vec<&Child>) =
        alive.into_iter().partition(|c| stale_why(c).is_some());

    // Scale down: the fresh Proxies over `replicas`.
    let (kept, victims) = scale_down(spec, fresh);
    let fresh = kept;
    for c in victims {
        delete.push(deletion(c, DeleteWhy::ScaleDown));
    }

    // Rotation: stale ones go, never taking Ready below minReady.
    let mut ready = fresh.iter().chain(&stale).filter(|c| c.ready).count();
    stale.sort_by_key(|c| (c.ready, c.created, c.name.clone()));
    let mut kept_stale: Vec<&Child> = Vec::new();
    for c in stale {
        if c.ready {
            if ready == 0 || ready - 1 < spec.min_ready {
                kept_stale.push(c);
                continue;
            }
            ready -= 1;
        }
        delete.push(deletion(c, stale_why(c).unwrap_or(DeleteWhy::Outdated)));
    }

    // Fill: fresh up to `replicas`, alive up to `replicas + maxSurge`.
    let alive_now = fresh.len() + kept_stale.len();
    let need = spec.replicas.saturating_sub(fresh.len());
    let room = spec
        .replicas
        .saturating_add(spec.max_surge)
        .saturating_sub(alive_now);
    let mut per_placement: Vec<usize> = spec
        .placements
        .iter()
        .map(|(name, ..)| {
            fresh
                .iter()
                .filter(|c| c.placement.as_deref() == Some(name.as_str()))
                .count()
        })
        .collect();
    let mut create = Vec::new();
    for _ in 0..need.min(room) {
        let Some(i) = next_placement(spec, &per_placement, &failing) else {
            break;
        };
        per_placement[i] += 1;
        let (name, _, proxy) = &spec.placements[i];
        create.push(Creation {
            placement: name.clone(),
            spec: proxy.clone(),
        });
    }
    let unplaced = need.min(room) - create.len();

    // Status, after the plan's actions.
    let ready_fresh = fresh.iter().filter(|c| c.ready).count();
    let ready_all = ready_fresh + kept_stale.iter().filter(|c| c.ready).count();
    let placements = spec
        .placements
        .iter()
        .map(|(name, ..)| {
            let here = |c: &&&Child| c.placement.as_deref() == Some(name.as_str());
            let stays = || fresh.iter().chain(&kept_stale).filter(here);
            PlacementStatus {
                name: name.clone(),
                replicas: count(
                    stays().count() + create.iter().filter(|c| c.placement == *name).count(),
                ),
                ready_replicas: count(stays().filter(|c| c.ready).count()),
                failing: failing.get(name).cloned(),
            }
        })
        .collect();
    let mut next = ProxyPoolStatus {
        replicas: count(alive_now + create.len()),
        ready_replicas: count(ready_all),
        updated_replicas: count(fresh.len() + create.len()),
        // Fresh ones are young by definition: not due for rotation.
        available_replicas: count(ready_fresh),
        selector: Some(format!("{}={pool}", crate::api::LABEL_POOL)),
        observed_generation: Some(generation),
        placements,
        hourly_prices: price_sum(children.iter().filter(|c| !c.deleting)),
        conditions: status.conditions.clone(),
    };
    let min_ready = spec.min_ready;
    let (ok, reason) = if ready_all >= min_ready {
        ("True", "MinimumReady")
    } else {
        ("False", "BelowMinimumReady")
    };
    set_condition(
        &mut next.conditions,
        pool_condition::AVAILABLE,
        ok,
        reason,
        &format!(
            "{ready_all} of {} Proxies Ready (minReady {min_ready})",
            spec.replicas
        ),
        generation,
        &now_time,
    );
    let (status_, reason, message) =
        progress(spec, &fresh, &kept_stale, &create, &delete, unplaced);
    set_condition(
        &mut next.conditions,
        pool_condition::PROGRESSING,
        status_,
        reason,
        &message,
        generation,
        &now_time,
    );
    let (status_, reason, message) = if failing.is_empty() {
        ("False", "AllPlacementsUsable", String::new())
    } else {
        let list: Vec<String> = failing
            .iter()
            .map(|(n, f)| {
                format!(
                    "{n}: {} until {} ({})",
                    f.reason, f.retry_after.0, f.message
                )
            })
            .collect();
        // Each message is a Proxy's (at most 4 KiB); many placements must still fit the
        // condition, or the API server would refuse the whole status.
        let mut message = list.join("; ");
        crate::controller::truncate(&mut message, crate::controller::CONDITION_MESSAGE_MAX);
        ("True", "PlacementsSkipped", message)
    };
    set_condition(
        &mut next.conditions,
        pool_condition::PLACEMENTS_FAILING,
        status_,
        reason,
        &message,
        generation,
        &now_time,
    );

    let expiries = fresh.iter().filter_map(|c| {
        let limit = spec.age_limit(&c.uid)?;
        Some(limit.saturating_sub(age(now, c.created)))
    });
    let backoffs = failing
        .values()
        .map(|f| Duration::try_from(f.retry_after.0.duration_since(now)).unwrap_or(Duration::ZERO));
    let requeue = expiries.chain(backoffs).min();

    Plan {
        delete,
        create,
        status: next,
        newly_failing,
        requeue,
    }
}

fn count(n: usize) -> i32 {
    i32::try_from(n).unwrap_or(i32::MAX)
}

fn deletion(c: &Child, why: DeleteWhy) -> Deletion {
    Deletion {
        name: c.name.clone(),
        uid: c.uid.clone(),
        why,
    }
}

/// The Progressing condition: True while there is work, False once `replicas` fresh
/// Proxies are all Ready, or when nothing can be placed.
fn progress(
    spec: &Resolved,
    fresh: &[&Child],
    kept_stale: &[&Child],
    create: &[Creation],
    delete: &[Deletion],
    unplaced: usize,
) -> (&'static str, &'static str, String) {
    if unplaced > 0 && create.is_empty() {
        return (
            "False",
            "NoPlacementAvailable",
            format!(
                "{unplaced} Proxies wait for a placement: every placement is failing or has weight 0"
            ),
        );
    }
    let not_ready = fresh.iter().filter(|c| !c.ready).count();
    if !kept_stale.is_empty() || delete.iter().any(|d| d.why >= DeleteWhy::Outdated) {
        let waiting = kept_stale.len();
        return (
            "True",
            "Rotating",
            format!(
                "replacing Proxies; {waiting} old ones wait for their replacements to be Ready"
            ),
        );
    }
    if !create.is_empty() || !delete.is_empty() || not_ready > 0 || fresh.len() != spec.replicas {
        return (
            "True",
            "Scaling",
            format!(
                "{} of {} Proxies Ready",
                fresh.len() - not_ready,
                spec.replicas
            ),
        );
    }
    (
        "False",
        "Stable",
        format!("all {} Proxies Ready and up to date", spec.replicas),
    )
}

/// The fresh Proxies a scale down to `replicas` removes, in the order they go, and the
/// ones kept (in their order). One at a time, the one that goes is: a not Ready one if any;
/// else one from the placement most over its weighted share; the youngest there (as
/// [`scale_down_victim`] picks it). With a heap of placements, each keyed by its share and
/// its youngest candidate, that is O(n log n): Proxies a tenant adds to their own pool by
/// hand (an owner reference) are removed without the operator's CPU paying their square.
fn scale_down<'a>(spec: &Resolved, fresh: Vec<&'a Child>) -> (Vec<&'a Child>, Vec<&'a Child>) {
    let excess = fresh.len().saturating_sub(spec.replicas);
    if excess == 0 {
        return (fresh, vec![]);
    }
    let weight: BTreeMap<&str, u64> = spec
        .placements
        .iter()
        .map(|(name, w, _)| (name.as_str(), u64::from((*w).max(1))))
        .collect();
    // Per placement: how many fresh Proxies it has, and its not Ready and Ready ones
    // sorted oldest first (the youngest is popped).
    #[derive(Default)]
    struct Group {
        count: u64,
        stacks: [Vec<usize>; 2],
    }
    let mut groups: BTreeMap<Option<&str>, Group> = BTreeMap::new();
    for (i, c) in fresh.iter().enumerate() {
        let g = groups.entry(c.placement.as_deref()).or_default();
        g.count += 1;
        g.stacks[usize::from(c.ready)].push(i);
    }
    let age_order = |i: &usize| (fresh[*i].created, fresh[*i].name.as_str());
    for g in groups.values_mut() {
        for stack in &mut g.stacks {
            stack.sort_by_key(age_order);
        }
    }
    /// A placement's claim to give the next Proxy: its share (count / weight; unknown
    /// placements first), then its youngest candidate.
    struct Claim<'a> {
        count: u64,
        weight: u64,
        created: Timestamp,
        name: &'a str,
        placement: Option<&'a str>,
    }
    impl Claim<'_> {
        fn share(&self) -> (u128, u128) {
            (u128::from(self.count), u128::from(self.weight))
        }
    }
    impl Ord for Claim<'_> {
        fn cmp(&self, other: &Self) -> std::cmp::Ordering {
            let ((na, wa), (nb, wb)) = (self.share(), other.share());
            (na * wb)
                .cmp(&(nb * wa))
                .then_with(|| (self.created, self.name).cmp(&(other.created, other.name)))
        }
    }
    impl PartialOrd for Claim<'_> {
        fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
            Some(self.cmp(other))
        }
    }
    impl PartialEq for Claim<'_> {
        fn eq(&self, other: &Self) -> bool {
            self.cmp(other).is_eq()
        }
    }
    impl Eq for Claim<'_> {}
    let claim = |p: Option<&'a str>, g: &Group, ready: usize| -> Option<Claim<'a>> {
        let &i = g.stacks[ready].last()?;
        let (count, weight) = match p.and_then(|n| weight.get(n)) {
            Some(&w) => (g.count, w),
            None => (u64::MAX, 1),
        };
        Some(Claim {
            count,
            weight,
            created: fresh[i].created,
            name: fresh[i].name.as_str(),
            placement: p,
        })
    };
    let mut gone = vec![false; fresh.len()];
    let mut victims = Vec::with_capacity(excess);
    // Not Ready ones first, then Ready ones; within each, by claim.
    for ready in [0, 1] {
        let mut heap: std::collections::BinaryHeap<Claim<'a>> = groups
            .iter()
            .filter_map(|(p, g)| claim(*p, g, ready))
            .collect();
        while victims.len() < excess {
            let Some(top) = heap.pop() else {
                break;
            };
            let g = groups.get_mut(&top.placement).expect("a group of its own");
            let i = g.stacks[ready].pop().expect("its candidate");
            g.count -= 1;
            gone[i] = true;
            victims.push(fresh[i]);
            if let Some(next) = claim(top.placement, g, ready) {
                heap.push(next);
            }
        }
    }
    let kept = fresh
        .iter()
        .zip(&gone)
        .filter(|(_, gone)| !**gone)
        .map(|(c, _)| *c)
        .collect();
    (kept, victims)
}

/// Which fresh Proxy goes on a scale down, one at a time: the reference [`scale_down`] is
/// checked against.
#[cfg(test)]
fn scale_down_victim(spec: &Resolved, fresh: &[&Child]) -> usize {
    let index: BTreeMap<&str, usize> = spec
        .placements
        .iter()
        .enumerate()
        .map(|(i, (name, ..))| (name.as_str(), i))
        .collect();
    let mut counts: BTreeMap<Option<&str>, u64> = BTreeMap::new();
    for c in fresh {
        *counts.entry(c.placement.as_deref()).or_default() += 1;
    }
    // (count, weight) of its placement, compared as count/weight.
    let over = |c: &Child| -> (u64, u64) {
        let Some(&i) = c.placement.as_deref().and_then(|n| index.get(n)) else {
            return (u64::MAX, 1);
        };
        let n = counts.get(&c.placement.as_deref()).copied().unwrap_or(0);
        (n, u64::from(spec.placements[i].1.max(1)))
    };
    let mut best = 0;
    for i in 1..fresh.len() {
        let (a, b) = (fresh[i], fresh[best]);
        let better = match (a.ready, b.ready) {
            (false, true) => true,
            (true, false) => false,
            _ => {
                let ((na, wa), (nb, wb)) = (over(a), over(b));
                let (x, y) = (
                    u128::from(na) * u128::from(wb),
                    u128::from(nb) * u128::from(wa),
                );
                x > y || (x == y && (a.created, &a.name) > (b.created, &b.name))
            }
        };
        if better {
            best = i;
        }
    }
    best
}

/// How `strategy: Cheapest` orders placement `i`: by its price in the currency most of the
/// priced placements use (prices in two currencies cannot be compared), unknown prices
/// last; every placement ranks the same under `Spread`.
fn price_rank(spec: &Resolved) -> impl Fn(usize) -> (bool, u64) + '_ {
    let mut by_currency: BTreeMap<&str, usize> = BTreeMap::new();
    for p in spec.prices.values() {
        *by_currency.entry(p.currency.as_str()).or_default() += 1;
    }
    let currency = by_currency
        .iter()
        .max_by_key(|(c, n)| (**n, std::cmp::Reverse(**c)))
        .map(|(c, _)| c.to_string());
    move |i: usize| {
        if !spec.cheapest {
            return (false, 0);
        }
        let name = &spec.placements[i].0;
        match spec.prices.get(name) {
            Some(p) if Some(&p.currency) == currency.as_ref() => (false, p.micros_per_hour),
            _ => (true, u64::MAX),
        }
    }
}

/// The most currencies a pool's status sums separately; more (no real pool spans eight
/// clouds billing in eight currencies) are left out rather than growing the status.
const MAX_CURRENCIES: usize = 8;

/// The hourly prices of `children`, summed per currency (saturating: no sum overflows).
fn price_sum<'a>(children: impl Iterator<Item = &'a Child>) -> Vec<crate::api::HourlyPrice> {
    let mut sums: BTreeMap<&str, u64> = BTreeMap::new();
    for c in children {
        let Some(p) = &c.price else { continue };
        let Some(m) = p.micros() else { continue };
        if sums.len() < MAX_CURRENCIES || sums.contains_key(p.currency.as_str()) {
            let sum = sums.entry(p.currency.as_str()).or_insert(0);
            *sum = sum.saturating_add(m);
        }
    }
    sums.into_iter()
        .map(|(currency, m)| crate::api::HourlyPrice {
            currency: currency.to_string(),
            per_hour: egress_plugin_host::config::prices::decimal(m),
        })
        .collect()
}

/// Whether a placement may take a new Proxy now: weight above 0, not backing off.
fn usable(name: &str, weight: u32, failing: &BTreeMap<String, PlacementFailure>) -> bool {
    weight > 0 && !failing.contains_key(name)
}

/// The usable placement furthest below its weighted share: least (count + 1) / weight,
/// ties to the earlier entry; a fallback placement only when no other is usable. None when
/// every placement is failing or has weight 0.
fn next_placement(
    spec: &Resolved,
    counts: &[usize],
    failing: &BTreeMap<String, PlacementFailure>,
) -> Option<usize> {
    let preferred = spec
        .placements
        .iter()
        .any(|(n, w, _)| usable(n, *w, failing) && !spec.fallbacks.contains(n));
    let rank = price_rank(spec);
    let mut best: Option<usize> = None;
    for (i, (name, weight, _)) in spec.placements.iter().enumerate() {
        if !usable(name, *weight, failing) || (preferred && spec.fallbacks.contains(name)) {
            continue;
        }
        let better = match best {
            None => true,
            Some(b) if rank(i) != rank(b) => rank(i) < rank(b),
            Some(b) => {
                let wb = u128::from(spec.placements[b].1);
                let load = |n: usize, w: u128| (n as u128 + 1) * w;
                load(counts[i], wb) < load(counts[b], u128::from(*weight))
            }
        };
        if better {
            best = Some(i);
        }
    }
    best
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::{CloudInit, Placement};

    const NOW: i64 = 1_800_000_000;

    fn template() -> ProxySpec {
        ProxySpec {
            provider: "hz".into(),
            placement: Placement {
                region: "eu".into(),
                zone: String::new(),
                machine_type: "cx22".into(),
                image: "debian".into(),
                capacity: Default::default(),
            },
            cloud_init: CloudInit {
                inline: Some("#cloud-config".into()),
                secret_key_ref: None,
            },
            port: 3128,
            auth: Default::default(),
            ip_family: Default::default(),
        }
    }

    /// A pool spec: `replicas`, placements named by zone with weights.
    fn pool(replicas: i32, zones: &[(&str, i32)]) -> ProxyPoolSpec {
        ProxyPoolSpec {
            placements: zones
                .iter()
                .map(|(z, w)| PoolPlacement {
                    zone: Some((*z).into()),
                    weight: Some(*w),
                    ..Default::default()
                })
                .collect(),
            ..ProxyPoolSpec::new(replicas, template())
        }
    }

    fn resolved(spec: &ProxyPoolSpec) -> Resolved {
        Resolved::from_spec(spec).unwrap()
    }

    /// A Proxy in placement `zone`, `age` seconds old, up to date with the template.
    fn child(name: &str, zone: &str, ready: bool, age: i64) -> Child {
        let mut spec = template();
        if zone != "default" {
            spec.placement.zone = zone.into();
        }
        Child {
            name: name.into(),
            uid: format!("uid-{name}"),
            created: Timestamp::from_second(NOW - age).unwrap(),
            deleting: false,
            ready,
            spec,
            placement: Some(zone.into()),
            failure: None,
            price: None,
        }
    }

    fn now() -> Timestamp {
        Timestamp::from_second(NOW).unwrap()
    }

    fn run(spec: &ProxyPoolSpec, children: &[Child]) -> Plan {
        plan(
            "web",
            &resolved(spec),
            &ProxyPoolStatus::default(),
            1,
            children,
            now(),
        )
    }

    fn created(p: &Plan) -> Vec<&str> {
        p.create.iter().map(|c| c.placement.as_str()).collect()
    }

    fn deleted(p: &Plan) -> Vec<(&str, DeleteWhy)> {
        p.delete.iter().map(|d| (d.name.as_str(), d.why)).collect()
    }

    fn cond<'a>(p: &'a Plan, type_: &str) -> (&'a str, &'a str) {
        let c = p
            .status
            .conditions
            .iter()
            .find(|c| c.type_ == type_)
            .unwrap();
        (c.status.as_str(), c.reason.as_str())
    }

    #[test]
    fn fills_by_weight_and_spreads() {
        /// (replicas, placements (zone, weight), expected placements of the new Proxies)
        type Case<'a> = (i32, &'a [(&'a str, i32)], &'a [&'a str]);
        let cases: &[Case] = &[
            (3, &[("a", 1), ("b", 1)], &["a", "b", "a"]),
            (4, &[("a", 3), ("b", 1)], &["a", "a", "a", "b"]),
            (3, &[("a", 0), ("b", 1)], &["b", "b", "b"]),
            (2, &[], &["default", "default"]),
            (0, &[("a", 1)], &[]),
        ];
        for (replicas, zones, want) in cases {
            let p = run(&pool(*replicas, zones), &[]);
            assert_eq!(created(&p), *want, "replicas {replicas} over {zones:?}");
            assert!(p.delete.is_empty());
        }
        // The new Proxies' spec is the template with the placement put in.
        let p = run(&pool(1, &[("b", 1)]), &[]);
        assert_eq!(p.create[0].spec.placement.zone, "b");
        assert_eq!(p.create[0].spec.placement.region, "eu");
    }

    #[test]
    fn a_full_ready_pool_is_left_alone() {
        let spec = pool(2, &[("a", 1), ("b", 1)]);
        let p = run(
            &spec,
            &[child("x", "a", true, 10), child("y", "b", true, 10)],
        );
        assert!(p.create.is_empty() && p.delete.is_empty());
        assert_eq!(cond(&p, pool_condition::PROGRESSING), ("False", "Stable"));
        assert_eq!(
            cond(&p, pool_condition::AVAILABLE),
            ("True", "MinimumReady")
        );
        assert_eq!(
            cond(&p, pool_condition::PLACEMENTS_FAILING),
            ("False", "AllPlacementsUsable")
        );
        let s = &p.status;
        assert_eq!(
            (
                s.replicas,
                s.ready_replicas,
                s.updated_replicas,
                s.available_replicas
            ),
            (2, 2, 2, 2)
        );
        assert_eq!(
            s.selector.as_deref(),
            Some("egress.proxy-operator.dev/pool=web")
        );
        assert_eq!(p.requeue, None, "no maxAge, nothing in back-off: no timer");
    }

    #[test]
    fn scale_down_removes_not_ready_then_the_most_loaded_placement_youngest_first() {
        let spec = pool(2, &[("a", 1), ("b", 1)]);
        let children = [
            child("a-old", "a", true, 300),
            child("a-young", "a", true, 100),
            child("a-mid", "a", true, 200),
            child("b-1", "b", true, 300),
            child("b-sick", "b", false, 300),
        ];
        let p = run(&spec, &children);
        assert_eq!(
            deleted(&p),
            [
                ("b-sick", DeleteWhy::ScaleDown),
                ("a-young", DeleteWhy::ScaleDown),
                ("a-mid", DeleteWhy::ScaleDown)
            ]
        );
        assert!(p.create.is_empty());
        assert_eq!(p.status.replicas, 2);
    }

    /// The heap-ordered scale down removes the same Proxies in the same order as picking
    /// them one at a time, over many mixes of placements, weights, ages and readiness
    /// (unknown placements and equal ages included).
    #[test]
    fn scale_down_matches_picking_one_at_a_time() {
        let mut seed = 0x2545_f491_4f6c_dd1du64;
        let mut next = |n: u64| {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed % n
        };
        for round in 0..300 {
            let zones = ["a", "b", "c", "x"];
            let weights: Vec<(&str, i32)> =
                zones[..3].iter().map(|z| (*z, next(4) as i32)).collect();
            let n = 1 + next(40) as usize;
            let replicas = next(n as u64 + 1) as i32;
            let spec = resolved(&pool(replicas, &weights));
            let children: Vec<Child> = (0..n)
                .map(|i| {
                    child(
                        &format!("p{i:02}"),
                        zones[next(4) as usize],
                        next(3) > 0,
                        next(5) as i64 * 10,
                    )
                })
                .collect();
            let fresh: Vec<&Child> = children.iter().collect();
            let mut one_by_one = fresh.clone();
            let mut want = vec![];
            while one_by_one.len() > spec.replicas {
                let v = scale_down_victim(&spec, &one_by_one);
                want.push(one_by_one.remove(v).name.clone());
            }
            let (kept, victims) = scale_down(&spec, fresh);
            let got: Vec<String> = victims.iter().map(|c| c.name.clone()).collect();
            assert_eq!(got, want, "round {round}");
            let kept: Vec<&str> = kept.iter().map(|c| c.name.as_str()).collect();
            let want_kept: Vec<&str> = one_by_one.iter().map(|c| c.name.as_str()).collect();
            assert_eq!(kept, want_kept, "round {round}");
        }
    }

    /// 20,000 Proxies in a pool of 10: the plan is fast (it was quadratic in them).
    #[test]
    fn a_pool_with_thousands_of_extra_proxies_plans_in_linearithmic_time() {
        let spec = pool(10, &[("a", 1), ("b", 2)]);
        let children: Vec<Child> = (0..20_000)
            .map(|i| {
                child(
                    &format!("p{i:05}"),
                    ["a", "b"][i % 2],
                    i % 3 > 0,
                    (i % 500) as i64,
                )
            })
            .collect();
        let started = std::time::Instant::now();
        let p = run(&spec, &children);
        let took = started.elapsed();
        assert_eq!(p.delete.len(), 20_000 - 10);
        assert!(took < Duration::from_secs(5), "{took:?}");
    }

    #[test]
    fn rotation_surges_first_and_never_drops_below_min_ready() {
        // (minReady, maxSurge, children (name, ready, age s), want deleted, want created)
        type Case<'a> = (
            Option<i32>,
            Option<i32>,
            &'a [(&'a str, bool, i64)],
            &'a [&'a str],
            usize,
        );
        let cases: &[Case] = &[
            // Both expired and Ready, minReady 2 (default): one new first, nobody goes.
            (None, None, &[("o1", true, 700), ("o2", true, 650)], &[], 1),
            // The new one is Ready: the oldest expired goes, another new one comes.
            (
                None,
                None,
                &[("o1", true, 700), ("o2", true, 650), ("n1", true, 5)],
                &["o1"],
                1,
            ),
            // An expired one that is not Ready goes at once.
            (
                None,
                None,
                &[("o1", false, 700), ("o2", true, 650)],
                &["o1"],
                2,
            ),
            // minReady 1: one Ready expired may go before its replacement is Ready.
            (
                Some(1),
                None,
                &[("o1", true, 700), ("o2", true, 650)],
                &["o1"],
                2,
            ),
            // No surge and minReady = replicas: rotation cannot start.
            (
                None,
                Some(0),
                &[("o1", true, 700), ("o2", true, 650)],
                &[],
                0,
            ),
            // Young ones stay.
            (None, None, &[("y1", true, 100), ("y2", true, 200)], &[], 0),
        ];
        for (min_ready, surge, kids, want_deleted, want_created) in cases {
            let mut spec = pool(2, &[("a", 1)]);
            spec.min_ready = *min_ready;
            spec.max_surge = *surge;
            spec.max_age = Some(Duration::from_secs(600));
            spec.max_age_jitter_percent = Some(0);
            let children: Vec<Child> = kids
                .iter()
                .map(|(n, r, age)| child(n, "a", *r, *age))
                .collect();
            let p = run(&spec, &children);
            let names: Vec<&str> = p.delete.iter().map(|d| d.name.as_str()).collect();
            assert_eq!(
                names, *want_deleted,
                "{kids:?} minReady {min_ready:?} surge {surge:?}"
            );
            assert!(p.delete.iter().all(|d| d.why == DeleteWhy::Expired));
            assert_eq!(p.create.len(), *want_created, "{kids:?}");
            // The floor: Ready Proxies left after the deletions.
            let ready_left = children
                .iter()
                .filter(|c| c.ready && !names.contains(&c.name.as_str()))
                .count();
            let floor = min_ready.map_or(2, |m| m as usize).min(2);
            let ready_before = children.iter().filter(|c| c.ready).count();
            assert!(
                ready_left >= floor.min(ready_before),
                "{kids:?}: below minReady"
            );
        }
    }

    #[test]
    fn a_changed_template_or_removed_placement_makes_proxies_outdated() {
        let spec = pool(2, &[("a", 1)]);
        let mut changed = child("c", "a", false, 10);
        changed.spec.port = 8080;
        let gone = child("g", "zz", false, 10);
        let p = run(&spec, &[changed, gone]);
        assert_eq!(
            deleted(&p),
            [("c", DeleteWhy::Outdated), ("g", DeleteWhy::Outdated)]
        );
        assert_eq!(created(&p), ["a", "a"]);
        assert_eq!(cond(&p, pool_condition::PROGRESSING), ("True", "Rotating"));
    }

    #[test]
    fn a_failing_placement_is_skipped_for_the_backoff_then_used_again() {
        let spec = pool(2, &[("a", 1), ("b", 1)]);
        let mut failed = child("f", "a", false, 10);
        failed.failure = Some(("QuotaExceeded".into(), "server limit reached".into()));
        let p = run(&spec, &[failed, child("b1", "b", true, 10)]);
        assert_eq!(deleted(&p), [("f", DeleteWhy::PlacementFailed)]);
        assert_eq!(created(&p), ["b"], "filled from the other placement");
        assert_eq!(
            p.newly_failing,
            [(
                "a".to_string(),
                "QuotaExceeded".to_string(),
                "server limit reached".to_string()
            )]
        );
        let failing = p.status.placements[0].failing.clone().unwrap();
        assert_eq!(
            failing.retry_after.0,
            now()
                .saturating_add(SignedDuration::from_secs(600))
                .unwrap()
        );
        assert_eq!(
            cond(&p, pool_condition::PLACEMENTS_FAILING),
            ("True", "PlacementsSkipped")
        );
        assert_eq!(
            p.requeue,
            Some(Duration::from_secs(600)),
            "back when the back-off ends"
        );

        // Within the back-off, from the status: still skipped, not announced again.
        let later = plan(
            "web",
            &resolved(&spec),
            &p.status,
            1,
            &[child("b1", "b", true, 10)],
            now(),
        );
        assert_eq!(created(&later), ["b"]);
        assert!(later.newly_failing.is_empty());
        // After it: used again.
        let after = Timestamp::from_second(NOW + 601).unwrap();
        let again = plan(
            "web",
            &resolved(&spec),
            &p.status,
            1,
            &[child("b1", "b", true, 10)],
            after,
        );
        assert_eq!(created(&again), ["a"]);
        assert!(again.status.placements.iter().all(|s| s.failing.is_none()));
    }

    /// Spot with an on-demand fallback: spot while it has capacity, on-demand while spot
    /// backs off, and back to spot afterwards without dropping below `minReady`.
    #[test]
    fn a_fallback_placement_serves_only_while_the_preferred_one_cannot() {
        use crate::api::Capacity;
        let placement = |name: &str, capacity, fallback| PoolPlacement {
            name: Some(name.into()),
            zone: Some("z".into()),
            capacity: Some(capacity),
            fallback,
            ..Default::default()
        };
        let spec = ProxyPoolSpec {
            placements: vec![
                placement("spot", Capacity::Spot, None),
                placement("on-demand", Capacity::OnDemand, Some(true)),
            ],
            min_ready: Some(2),
            max_surge: Some(2),
            ..ProxyPoolSpec::new(2, template())
        };
        let r = resolved(&spec);
        let on = |name: &str, placement: &str, ready: bool| {
            let i = r
                .placements
                .iter()
                .position(|(n, ..)| n == placement)
                .unwrap();
            Child {
                spec: r.placements[i].2.clone(),
                placement: Some(placement.into()),
                ..child(name, "z", ready, 100)
            }
        };

        // Spot has capacity: the fallback takes nothing.
        assert_eq!(created(&run(&spec, &[])), ["spot", "spot"]);

        // No spot capacity: the spot placement backs off, the fallback fills.
        let mut refused = on("s1", "spot", false);
        refused.failure = Some(("QuotaExceeded".into(), "SpotCapacityUnavailable".into()));
        let p = run(&spec, &[refused]);
        assert_eq!(deleted(&p), [("s1", DeleteWhy::PlacementFailed)]);
        assert_eq!(created(&p), ["on-demand", "on-demand"]);
        // Within the back-off the fallback's Proxies stay.
        let fallen = [on("o1", "on-demand", true), on("o2", "on-demand", true)];
        let within = plan("web", &r, &p.status, 1, &fallen, now());
        assert!(
            within.delete.is_empty() && within.create.is_empty(),
            "{within:?}"
        );

        // The back-off is over: back to spot, the fallback's Proxies replaced, never
        // below minReady (2): first the surge on spot, then the deletions.
        let after = Timestamp::from_second(NOW + 601).unwrap();
        let back = plan("web", &r, &p.status, 1, &fallen, after);
        assert_eq!(created(&back), ["spot", "spot"]);
        assert!(back.delete.is_empty(), "{:?}", back.delete);
        let both = [
            on("o1", "on-demand", true),
            on("o2", "on-demand", true),
            on("s2", "spot", true),
            on("s3", "spot", true),
        ];
        let done = plan("web", &r, &back.status, 1, &both, after);
        assert_eq!(
            deleted(&done),
            [("o1", DeleteWhy::FallenBack), ("o2", DeleteWhy::FallenBack)]
        );
        assert!(done.create.is_empty());
    }

    /// `strategy: Cheapest`: every new Proxy on the cheapest usable placement, unknown
    /// prices last, prices in a minority currency as unknown; `Spread` ignores prices.
    #[test]
    fn cheapest_fills_the_lowest_known_price_first() {
        let price = |currency: &str, micros_per_hour| egress_plugin_host::provider::Price {
            currency: currency.into(),
            micros_per_hour,
        };
        let mut spec = pool(3, &[("a", 1), ("b", 1), ("c", 1), ("d", 1)]);
        let prices: BTreeMap<String, _> = [
            ("a".to_string(), price("EUR", 20_000)),
            ("b".to_string(), price("EUR", 10_000)),
            ("d".to_string(), price("USD", 1)),
        ]
        .into();
        let plan_with = |spec: &ProxyPoolSpec, status: &ProxyPoolStatus| {
            let mut r = resolved(spec);
            r.prices = prices.clone();
            plan("web", &r, status, 1, &[], now())
        };
        assert_eq!(
            created(&plan_with(&spec, &ProxyPoolStatus::default())),
            ["a", "b", "c"],
            "Spread: prices play no part"
        );
        spec.strategy = Some(crate::api::Strategy::Cheapest);
        assert_eq!(
            created(&plan_with(&spec, &ProxyPoolStatus::default())),
            ["b", "b", "b"]
        );
        // The cheapest backs off: the next cheapest, then the unknown ones.
        let failing = |names: &[&str]| ProxyPoolStatus {
            placements: names
                .iter()
                .map(|n| PlacementStatus {
                    name: n.to_string(),
                    failing: Some(PlacementFailure {
                        reason: "QuotaExceeded".into(),
                        message: "full".into(),
                        since: Time(now()),
                        retry_after: Time(Timestamp::from_second(NOW + 600).unwrap()),
                    }),
                    ..Default::default()
                })
                .collect(),
            ..Default::default()
        };
        assert_eq!(
            created(&plan_with(&spec, &failing(&["b"]))),
            ["a", "a", "a"]
        );
        let only_unknown = plan_with(&spec, &failing(&["a", "b"]));
        assert_eq!(
            created(&only_unknown),
            ["c", "d", "c"],
            "unknown (and USD) spread"
        );
    }

    /// The pool's cost is its Proxies' prices summed per currency; a Proxy without a
    /// price, or being deleted, is not in it.
    #[test]
    fn the_pool_costs_the_sum_of_its_proxies_per_currency() {
        let spec = pool(4, &[("a", 1)]);
        let priced = |name: &str, currency: &str, per_hour: &str| Child {
            price: Some(crate::api::HourlyPrice {
                currency: currency.into(),
                per_hour: per_hour.into(),
            }),
            ..child(name, "a", true, 10)
        };
        let mut gone = priced("d", "EUR", "100");
        gone.deleting = true;
        let p = run(
            &spec,
            &[
                priced("a1", "EUR", "0.0125"),
                priced("a2", "EUR", "0.0075"),
                priced("a3", "USD", "0.0104"),
                child("a4", "a", true, 10),
                gone,
            ],
        );
        let sums: Vec<(&str, &str)> = p
            .status
            .hourly_prices
            .iter()
            .map(|h| (h.currency.as_str(), h.per_hour.as_str()))
            .collect();
        assert_eq!(sums, [("EUR", "0.02"), ("USD", "0.0104")]);
    }

    #[test]
    fn many_failing_placements_still_fit_the_condition() {
        let zones: Vec<(String, i32)> = (0..20).map(|i| (format!("z{i}"), 1)).collect();
        let refs: Vec<(&str, i32)> = zones.iter().map(|(z, w)| (z.as_str(), *w)).collect();
        let spec = pool(20, &refs);
        let children: Vec<Child> = zones
            .iter()
            .map(|(z, _)| {
                let mut c = child(&format!("f-{z}"), z, false, 10);
                c.failure = Some(("QuotaExceeded".into(), "x".repeat(4000)));
                c
            })
            .collect();
        let p = run(&spec, &children);
        let c = p
            .status
            .conditions
            .iter()
            .find(|c| c.type_ == pool_condition::PLACEMENTS_FAILING)
            .unwrap();
        assert!(c.message.len() <= 4096, "{} bytes", c.message.len());
        assert!(
            c.message.starts_with("z0: QuotaExceeded until "),
            "{}",
            &c.message[..40]
        );
    }

    #[test]
    fn nothing_to_place_on_says_so() {
        let spec = pool(1, &[("a", 1)]);
        let mut failed = child("f", "a", false, 10);
        failed.failure = Some(("PermanentError".into(), "image unknown".into()));
        let p = run(&spec, &[failed]);
        assert!(p.create.is_empty());
        assert_eq!(
            cond(&p, pool_condition::PROGRESSING),
            ("False", "NoPlacementAvailable")
        );
        assert_eq!(
            cond(&p, pool_condition::AVAILABLE),
            ("False", "BelowMinimumReady")
        );
    }

    #[test]
    fn proxies_being_deleted_do_not_count() {
        let spec = pool(1, &[("a", 1)]);
        let mut going = child("g", "a", true, 10);
        going.deleting = true;
        let p = run(&spec, &[going]);
        assert_eq!(created(&p), ["a"]);
        assert!(p.delete.is_empty());
    }

    #[test]
    fn age_limits_are_jittered_per_proxy_and_stable() {
        let mut spec = pool(1, &[]);
        spec.max_age = Some(Duration::from_secs(1000));
        let r = resolved(&spec);
        let limits: Vec<Duration> = (0..50)
            .map(|i| r.age_limit(&format!("u{i}")).unwrap())
            .collect();
        assert!(
            limits
                .iter()
                .all(|l| *l > Duration::from_secs(900) && *l <= Duration::from_secs(1000))
        );
        assert!(limits.iter().any(|l| *l != limits[0]), "spread out");
        assert_eq!(r.age_limit("u0"), r.age_limit("u0"));
        // The next expiry is when the plan looks again.
        let c = child("x", "default", true, 100);
        let limit = r.age_limit(&c.uid).unwrap();
        let p = plan("web", &r, &ProxyPoolStatus::default(), 1, &[c], now());
        assert_eq!(p.requeue, Some(limit - Duration::from_secs(100)));
    }

    /// Every value out of the CRD's bounds (which an older CRD let through) is refused with
    /// a message naming the field, the value and the limit; at the bounds the plan neither
    /// panics nor overflows.
    #[test]
    fn out_of_range_values_are_refused_naming_field_value_and_limit() {
        type Case = (&'static str, fn(&mut ProxyPoolSpec), &'static str);
        let cases: &[Case] = &[
            (
                "replicas over",
                |s| s.replicas = 10_001,
                "spec.replicas: 10001 is out of range: it must be from 0 to 10000",
            ),
            (
                "replicas i32::MAX",
                |s| s.replicas = i32::MAX,
                "spec.replicas: 2147483647 is out of range: it must be from 0 to 10000",
            ),
            (
                "replicas negative",
                |s| s.replicas = -1,
                "spec.replicas: -1 is out of range: it must be from 0 to 10000",
            ),
            (
                "minReady i32::MAX",
                |s| s.min_ready = Some(i32::MAX),
                "spec.minReady: 2147483647 is out of range: it must be from 0 to 10000",
            ),
            (
                "minReady negative",
                |s| s.min_ready = Some(i32::MIN),
                "spec.minReady: -2147483648 is out of range: it must be from 0 to 10000",
            ),
            (
                "maxSurge over",
                |s| s.max_surge = Some(10_001),
                "spec.maxSurge: 10001 is out of range: it must be from 0 to 10000",
            ),
            (
                "maxSurge i32::MAX",
                |s| s.max_surge = Some(i32::MAX),
                "spec.maxSurge: 2147483647 is out of range: it must be from 0 to 10000",
            ),
            (
                "maxSurge negative",
                |s| s.max_surge = Some(-1),
                "spec.maxSurge: -1 is out of range: it must be from 0 to 10000",
            ),
            (
                "jitter over",
                |s| s.max_age_jitter_percent = Some(91),
                "spec.maxAgeJitterPercent: 91 is out of range: it must be from 0 to 90",
            ),
            (
                "jitter negative",
                |s| s.max_age_jitter_percent = Some(-1),
                "spec.maxAgeJitterPercent: -1 is out of range: it must be from 0 to 90",
            ),
            (
                "weight over",
                |s| s.placements[0].weight = Some(1001),
                "spec.placements[0].weight: 1001 is out of range: it must be from 0 to 1000",
            ),
            (
                "weight negative",
                |s| s.placements[0].weight = Some(i32::MIN),
                "spec.placements[0].weight: -2147483648 is out of range: it must be from 0 to 1000",
            ),
            (
                "maxAge zero",
                |s| s.max_age = Some(Duration::ZERO),
                "spec.maxAge: 0s is shorter than 10s: no Proxy could be Ready before its replacement",
            ),
            (
                "maxAge 9s",
                |s| s.max_age = Some(Duration::from_secs(9)),
                "spec.maxAge: 9s is shorter than 10s: no Proxy could be Ready before its replacement",
            ),
            (
                "too many placements",
                |s| {
                    s.placements = (0..129)
                        .map(|i| PoolPlacement {
                            name: Some(format!("p{i}")),
                            ..Default::default()
                        })
                        .collect()
                },
                "spec.placements: 129 entries, more than the 128 a pool may have",
            ),
        ];
        for (case, set, want) in cases {
            let mut spec = pool(2, &[("a", 1)]);
            set(&mut spec);
            let got = Resolved::from_spec(&spec).map(|_| ()).unwrap_err();
            assert_eq!(got.to_string(), *want, "{case}");
        }

        // At every bound at once: accepted, planned without a panic or an overflow.
        let zones: Vec<(String, i32)> = (0..128).map(|i| (format!("z{i}"), 1000)).collect();
        let refs: Vec<(&str, i32)> = zones.iter().map(|(z, w)| (z.as_str(), *w)).collect();
        let mut spec = pool(10_000, &refs);
        spec.min_ready = Some(10_000);
        spec.max_surge = Some(10_000);
        spec.max_age = Some(Duration::MAX);
        spec.max_age_jitter_percent = Some(90);
        spec.placement_backoff = Some(Duration::MAX);
        let r = resolved(&spec);
        assert!(r.age_limit("u").is_some());
        let p = run(&spec, &[child("x", "z0", true, 10)]);
        assert_eq!(p.create.len(), 9_999);
        assert_eq!(p.status.updated_replicas, 10_000);
    }

    /// A spec the API server stored but that does not read as a pool spec (a value out of
    /// its type's range, a duration that is not one) is an error naming the path, the value
    /// and what the field takes, not a pool that is skipped.
    #[test]
    fn a_spec_that_does_not_read_names_the_field_its_value_and_what_it_takes() {
        let base = serde_json::to_value(pool(2, &[("a", 1)])).unwrap();
        assert_eq!(read_spec(&base).unwrap(), pool(2, &[("a", 1)]));
        let cases: &[(&str, serde_json::Value, &str)] = &[
            (
                "/maxSurge",
                serde_json::json!(4_294_967_295u64),
                "spec.maxSurge: 4294967295 cannot be read: invalid value: integer `4294967295`, expected i32 (it takes an integer from 0 to 10000)",
            ),
            (
                "/minReady",
                serde_json::json!(4_294_967_295u64),
                "spec.minReady: 4294967295 cannot be read: invalid value: integer `4294967295`, expected i32 (it takes an integer from 0 to 10000)",
            ),
            (
                "/replicas",
                serde_json::json!(-9_223_372_036_854_775_808i64),
                "spec.replicas: -9223372036854775808 cannot be read: invalid value: integer `-9223372036854775808`, expected i32 (it takes an integer from 0 to 10000)",
            ),
            (
                "/placements/0/weight",
                serde_json::json!(18_446_744_073_709_551_615u64),
                "spec.placements[0].weight: 18446744073709551615 cannot be read: invalid value: integer `18446744073709551615`, expected i32 (it takes an integer from 0 to 1000)",
            ),
            (
                "/template/spec/port",
                serde_json::json!(4_294_967_295u64),
                "spec.template.spec.port: 4294967295 cannot be read: invalid value: integer `4294967295`, expected i32 (it takes an integer from 1 to 65535)",
            ),
            (
                "/maxAge",
                serde_json::json!("forever"),
                "spec.maxAge: \"forever\" cannot be read: invalid value: string \"forever\", expected a duration (it takes a duration such as 6h or 1h 30m, at least 10s)",
            ),
        ];
        for (pointer, value, want) in cases {
            let mut spec = base.clone();
            let (parent, key) = pointer.rsplit_once('/').unwrap();
            spec.pointer_mut(parent)
                .and_then(|p| p.as_object_mut())
                .unwrap_or_else(|| panic!("{pointer}"))
                .insert(key.into(), value.clone());
            let got = read_spec(&spec).map(|_| ()).unwrap_err();
            assert_eq!(got.to_string(), *want, "{pointer}");
        }
    }

    #[test]
    fn specs_it_cannot_work_from_name_the_field() {
        let spec = pool(1, &[("a", 1), ("a", 2)]);
        let e = Resolved::from_spec(&spec).unwrap_err();
        assert_eq!(
            e.to_string(),
            "spec.placements[1]: the name \"a\" is used twice (name the entries)"
        );
        let r = resolved(&pool(8, &[]));
        assert_eq!(
            (r.min_ready, r.max_surge),
            (8, 2),
            "defaults: minReady = replicas, surge a quarter"
        );
        let mut s = pool(2, &[]);
        s.min_ready = Some(5);
        assert_eq!(resolved(&s).min_ready, 2, "minReady is capped at replicas");
    }
}
