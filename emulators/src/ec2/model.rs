//! What the emulated EC2 holds: instances, their volumes, reservations and client tokens,
//! and the lifecycle that moves instances between states.
//!
//! Everything is keyed by region so one emulator serves every region, as moto does: the
//! region of a call comes from its SigV4 credential scope.

use super::{Ec2Config, Transition};
use crate::control::FaultKind;
use crate::framework::Traffic;
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// EC2's documented state codes (the low byte of `instanceState/code`).
pub(crate) fn state_code(name: &str) -> u16 {
    match name {
        "pending" => 0,
        "running" => 16,
        "shutting-down" => 32,
        "terminated" => 48,
        "stopping" => 64,
        "stopped" => 80,
        // A state EC2 does not document, forced through the control surface to test how
        // a plugin maps states it does not know. 112 is no documented code.
        _ => 112,
    }
}

pub(crate) struct Instance {
    pub id: String,
    pub region: String,
    pub zone: String,
    pub reservation_id: String,
    pub image_id: String,
    pub instance_type: String,
    pub state: String,
    pub public_ip: Option<String>,
    pub private_ip: Option<String>,
    /// Unix seconds.
    pub launch_time: u64,
    /// Launch order, the stable sort key for listings and pagination.
    pub seq: u64,
    pub launch_index: u32,
    pub tags: Vec<(String, String)>,
    pub user_data: Option<Vec<u8>>,
    pub client_token: String,
    pub subnet_id: Option<String>,
    pub security_groups: Vec<String>,
    /// Set when TerminateInstances (or the control surface) started the shutdown, for
    /// `reason` / `stateReason`.
    pub terminate_requested_at: Option<u64>,
    /// Control surface: stay `pending` until released.
    pub hold: bool,
    /// Control surface: a state transition is in progress; the state is frozen and
    /// TerminateInstances is refused.
    pub locked: bool,
    /// Control surface: the state was forced; no automatic transition until the next
    /// TerminateInstances.
    pub forced: bool,
    /// Control surface: stays `shutting-down` until `finish_deletes`.
    pub slow_delete: bool,
    phase_since: Instant,
    phase_seen: u32,
    terminated_at: Option<Instant>,
    /// Past `terminated_visible_for`: gone from every Describe, kept only so a ClientToken
    /// retry still answers with the original launch, as EC2 does for at least 24 hours.
    pub expired: bool,
    visible_from: Instant,
    /// A Spot Instance (`instanceLifecycle` spot), with what its request asked for.
    pub spot: Option<Spot>,
    /// EC2 took it back (control surface `reclaim`): its `stateReason` is the spot one.
    pub reclaimed: bool,
}

/// What a Spot Instance was launched with (`InstanceMarketOptions.SpotOptions`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Spot {
    /// `spotInstanceRequestId`: `sir-` and 8 characters.
    pub request_id: String,
    /// `one-time` or `persistent`.
    pub request_type: String,
    /// `terminate`, `stop` or `hibernate`.
    pub interruption: String,
}

impl Instance {
    pub(crate) fn tag(&self, key: &str) -> Option<&str> {
        self.tags.iter().find(|(k, _)| k == key).map(|(_, v)| v.as_str())
    }

    pub(crate) fn visible(&self, region: &str, now: Instant) -> bool {
        self.region == region && !self.expired && now >= self.visible_from
    }
}

pub(crate) struct Attachment {
    pub instance_id: String,
    pub device: String,
    pub attach_time: u64,
    pub delete_on_termination: bool,
}

pub(crate) struct Volume {
    pub id: String,
    pub region: String,
    pub zone: String,
    pub size: u32,
    pub volume_type: String,
    pub create_time: u64,
    pub tags: Vec<(String, String)>,
    pub attachment: Option<Attachment>,
    /// Creation order, the stable sort key for listings and pagination.
    pub seq: u64,
}

impl Volume {
    pub(crate) fn status(&self) -> &'static str {
        if self.attachment.is_some() { "in-use" } else { "available" }
    }
}

pub(crate) struct Reservation {
    pub id: String,
    pub groups: Vec<String>,
    pub instance_ids: Vec<String>,
}

pub(crate) struct TokenRecord {
    pub fingerprint: String,
    pub reservation_id: String,
}

/// One root or extra EBS volume requested at launch.
pub(crate) struct DiskSpec {
    pub device: String,
    pub size: u32,
    pub volume_type: String,
    pub delete_on_termination: bool,
}

/// Everything RunInstances needs once the request is validated.
pub(crate) struct LaunchSpec {
    pub region: String,
    pub zone: String,
    pub image_id: String,
    pub instance_type: String,
    pub count: u32,
    pub user_data: Option<Vec<u8>>,
    pub client_token: String,
    pub subnet_id: Option<String>,
    pub security_groups: Vec<String>,
    pub instance_tags: Vec<(String, String)>,
    pub volume_tags: Vec<(String, String)>,
    pub disks: Vec<DiskSpec>,
    pub launch_time: u64,
    /// Planted instances start running and visible.
    pub planted: bool,
    /// `InstanceMarketOptions` of a spot launch: request type and interruption behavior.
    pub spot: Option<(String, String)>,
}

/// The emulated EC2 account, every region of it, and the calls made.
pub struct State {
    pub(crate) cfg: Arc<Ec2Config>,
    pub(crate) instances: BTreeMap<String, Instance>,
    pub(crate) volumes: BTreeMap<String, Volume>,
    pub(crate) reservations: HashMap<String, Reservation>,
    /// (region, client token) -> the launch it made. Tokens are per region in EC2.
    pub(crate) tokens: HashMap<(String, String), TokenRecord>,
    pub(crate) failing_scopes: BTreeSet<String>,
    /// The action log, stats, faults (as their kind: server errors alternate by hit) and
    /// the enforced rate limit, one bucket per region and action (see
    /// `Ec2Config::rate_limit`).
    pub(crate) traffic: Traffic<FaultKind>,
    seq: u64,
    rng: u64,
    next_ip: u32,
    /// Control surface `spot-capacity`: while false, spot launches answer
    /// `InsufficientInstanceCapacity`. A reset makes capacity available again.
    pub(crate) spot_capacity: bool,
}

pub(crate) fn unix_now() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default().as_secs()
}

impl State {
    pub(crate) fn new(cfg: Arc<Ec2Config>) -> State {
        // Seeded from the clock so two emulators in one test binary hand out different
        // ids, as two accounts would.
        let seed = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default()
            .as_nanos() as u64;
        State {
            traffic: Traffic::new(cfg.rate_limit),
            cfg,
            instances: BTreeMap::new(),
            volumes: BTreeMap::new(),
            reservations: HashMap::new(),
            tokens: HashMap::new(),
            failing_scopes: BTreeSet::new(),
            seq: 0,
            rng: seed,
            next_ip: 10,
            spot_capacity: true,
        }
    }

    /// splitmix64: well-spread ids from a counter, no dependency.
    fn next_u64(&mut self) -> u64 {
        self.rng = self.rng.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.rng;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// A long-format EC2 id: prefix, `-0`, 16 hex digits (17 in all, like real ids).
    pub(crate) fn new_id(&mut self, prefix: &str) -> String {
        format!("{prefix}-0{:016x}", self.next_u64())
    }

    pub(crate) fn request_id(&mut self) -> String {
        let a = self.next_u64();
        let b = self.next_u64();
        format!(
            "{:08x}-{:04x}-4{:03x}-{:04x}-{:012x}",
            a >> 32,
            (a >> 16) & 0xffff,
            a & 0xfff,
            ((b >> 48) & 0x3fff) | 0x8000,
            b & 0xffff_ffff_ffff
        )
    }

    fn next_private_ip(&mut self) -> String {
        let n = self.next_ip;
        self.next_ip += 1;
        format!("10.0.{}.{}", (n >> 8) & 0xff, n & 0xff)
    }

    /// Create the instances and volumes of one launch; returns the reservation id.
    pub(crate) fn launch(&mut self, spec: LaunchSpec, now: Instant) -> String {
        let reservation_id = self.new_id("r");
        let mut ids = Vec::new();
        let visible_from = if spec.planted { now } else { now + self.cfg.eventual_consistency };
        for index in 0..spec.count {
            let id = self.new_id("i");
            self.seq += 1;
            let seq = self.seq;
            for disk in &spec.disks {
                let vol_id = self.new_id("vol");
                self.seq += 1;
                let vol_seq = self.seq;
                self.volumes.insert(
                    vol_id.clone(),
                    Volume {
                        id: vol_id,
                        region: spec.region.clone(),
                        zone: spec.zone.clone(),
                        size: disk.size,
                        volume_type: disk.volume_type.clone(),
                        create_time: spec.launch_time,
                        tags: spec.volume_tags.clone(),
                        attachment: Some(Attachment {
                            instance_id: id.clone(),
                            device: disk.device.clone(),
                            attach_time: spec.launch_time,
                            delete_on_termination: disk.delete_on_termination,
                        }),
                        seq: vol_seq,
                    },
                );
            }
            let running = spec.planted;
            let spot = spec.spot.clone().map(|(request_type, interruption)| Spot {
                request_id: format!("sir-{:08x}", self.next_u64() as u32),
                request_type,
                interruption,
            });
            let instance = Instance {
                id: id.clone(),
                region: spec.region.clone(),
                zone: spec.zone.clone(),
                reservation_id: reservation_id.clone(),
                image_id: spec.image_id.clone(),
                instance_type: spec.instance_type.clone(),
                state: if running { "running" } else { "pending" }.into(),
                public_ip: running.then(|| self.cfg.public_ip.clone()),
                private_ip: Some(self.next_private_ip()),
                launch_time: spec.launch_time,
                seq,
                launch_index: index,
                tags: spec.instance_tags.clone(),
                user_data: spec.user_data.clone(),
                client_token: spec.client_token.clone(),
                subnet_id: spec.subnet_id.clone(),
                security_groups: spec.security_groups.clone(),
                terminate_requested_at: None,
                hold: false,
                locked: false,
                forced: false,
                slow_delete: false,
                phase_since: now,
                phase_seen: 0,
                terminated_at: None,
                expired: false,
                visible_from,
                spot,
                reclaimed: false,
            };
            self.instances.insert(id.clone(), instance);
            if running {
                self.start_proxy(&id);
            }
            ids.push(id);
        }
        self.reservations.insert(
            reservation_id.clone(),
            Reservation {
                id: reservation_id.clone(),
                groups: spec.security_groups.clone(),
                instance_ids: ids,
            },
        );
        reservation_id
    }

    /// Time-driven transitions and the expiry of long-terminated instances; run before
    /// every call so each answer reflects the schedule.
    pub(crate) fn advance(&mut self, now: Instant) {
        let launch = self.cfg.launch.clone();
        let shutdown = self.cfg.shutdown.clone();
        let keep = self.cfg.terminated_visible_for;
        let mut to_run = Vec::new();
        let mut to_terminate = Vec::new();
        for inst in self.instances.values_mut() {
            if let Some(t) = inst.terminated_at
                && !inst.expired
                && now.duration_since(t) >= keep
            {
                inst.expired = true;
            }
            if inst.locked || inst.forced {
                continue;
            }
            let elapsed = now.duration_since(inst.phase_since);
            match inst.state.as_str() {
                "pending" if !inst.hold && due_by_time(&launch, elapsed) => {
                    to_run.push(inst.id.clone())
                }
                "shutting-down" if !inst.slow_delete && due_by_time(&shutdown, elapsed) => {
                    to_terminate.push(inst.id.clone())
                }
                _ => {}
            }
        }
        for id in to_run {
            self.enter_running(&id, now);
        }
        for id in to_terminate {
            self.enter_terminated(&id, now);
        }
    }

    /// A DescribeInstances answer showed these instances: count it towards
    /// describe-driven transitions, which then show from the next call on.
    pub(crate) fn observe(&mut self, ids: &[String], now: Instant) {
        let launch = self.cfg.launch.clone();
        let shutdown = self.cfg.shutdown.clone();
        let mut to_run = Vec::new();
        let mut to_terminate = Vec::new();
        for id in ids {
            let Some(inst) = self.instances.get_mut(id) else {
                continue;
            };
            inst.phase_seen += 1;
            if inst.locked || inst.forced {
                continue;
            }
            match inst.state.as_str() {
                "pending" if !inst.hold && due_by_describes(&launch, inst.phase_seen) => {
                    to_run.push(id.clone())
                }
                "shutting-down"
                    if !inst.slow_delete && due_by_describes(&shutdown, inst.phase_seen) =>
                {
                    to_terminate.push(id.clone())
                }
                _ => {}
            }
        }
        for id in to_run {
            self.enter_running(&id, now);
        }
        for id in to_terminate {
            self.enter_terminated(&id, now);
        }
    }

    fn enter(&mut self, id: &str, state: &str, now: Instant) {
        if state != "running" {
            self.stop_proxy(id);
        }
        if let Some(inst) = self.instances.get_mut(id) {
            inst.state = state.to_string();
            inst.phase_since = now;
            inst.phase_seen = 0;
        }
    }

    pub(crate) fn enter_running(&mut self, id: &str, now: Instant) {
        let was_running = self.instances.get(id).is_some_and(|i| i.state == "running");
        self.enter(id, "running", now);
        let ip = self.cfg.public_ip.clone();
        if let Some(inst) = self.instances.get_mut(id) {
            inst.public_ip = Some(ip);
        }
        if !was_running {
            self.start_proxy(id);
        }
    }

    /// Real-proxy mode: the instance runs, so does its proxy, and 127.0.0.1 is its address.
    fn start_proxy(&mut self, id: &str) {
        let Some(proxies) = self.cfg.real_proxies.clone() else {
            return;
        };
        if let Some(inst) = self.instances.get_mut(id) {
            let ip = proxies.start(id, inst.user_data.as_deref());
            inst.public_ip = Some(ip.to_string());
        }
    }

    /// Real-proxy mode: the instance left `running`, so its proxy stops.
    fn stop_proxy(&self, id: &str) {
        if let Some(proxies) = &self.cfg.real_proxies {
            proxies.stop(id);
        }
    }

    /// Real-proxy mode: stop the proxy of every instance (emulator dropped or reset).
    pub(crate) fn stop_all_proxies(&self) {
        for id in self.instances.keys() {
            self.stop_proxy(id);
        }
    }

    /// The instance is gone: addresses released, volumes deleted or detached according to
    /// their DeleteOnTermination flag.
    pub(crate) fn enter_terminated(&mut self, id: &str, now: Instant) {
        self.enter(id, "terminated", now);
        if let Some(inst) = self.instances.get_mut(id) {
            inst.public_ip = None;
            inst.private_ip = None;
            inst.terminated_at = Some(now);
            inst.slow_delete = false;
            inst.hold = false;
            if inst.terminate_requested_at.is_none() {
                inst.terminate_requested_at = Some(unix_now());
            }
        }
        let attached: Vec<String> = self
            .volumes
            .values()
            .filter(|v| v.attachment.as_ref().is_some_and(|a| a.instance_id == id))
            .map(|v| v.id.clone())
            .collect();
        for vol_id in attached {
            let delete =
                self.volumes[&vol_id].attachment.as_ref().is_some_and(|a| a.delete_on_termination);
            if delete {
                self.volumes.remove(&vol_id);
            } else if let Some(v) = self.volumes.get_mut(&vol_id) {
                v.attachment = None;
            }
        }
    }

    /// Hold or release an instance in `pending`; on release its schedule starts afresh.
    pub(crate) fn set_hold(&mut self, id: &str, hold: bool, now: Instant) -> bool {
        let Some(inst) = self.instances.get_mut(id) else {
            return false;
        };
        inst.hold = hold;
        let stopped = hold && inst.state == "running";
        if stopped {
            // Back to provisioning, as the control surface promises: no address, not running.
            inst.public_ip = None;
            inst.state = "pending".into();
        }
        if !hold {
            inst.phase_since = now;
            inst.phase_seen = 0;
        }
        if stopped {
            self.stop_proxy(id);
        }
        true
    }

    /// TerminateInstances on one instance: start shutting down unless already on the way.
    pub(crate) fn begin_terminate(&mut self, id: &str, now: Instant) {
        let Some(inst) = self.instances.get_mut(id) else {
            return;
        };
        if matches!(inst.state.as_str(), "shutting-down" | "terminated") {
            return;
        }
        inst.forced = false;
        inst.hold = false;
        inst.reclaimed = false;
        inst.terminate_requested_at = Some(unix_now());
        self.enter(id, "shutting-down", now);
    }

    /// EC2 takes back Spot Instance `id` (control surface `reclaim`): with interruption
    /// behavior `terminate` it shuts down and terminates on the [`Ec2Config::shutdown`]
    /// schedule, with `stop` or `hibernate` it is stopped at once (volumes kept); either
    /// way its `stateReason` is the spot one. `None` when there is no such instance;
    /// `Some(Err)` names why an on-demand instance cannot be reclaimed.
    pub(crate) fn reclaim(&mut self, id: &str, now: Instant) -> Option<Result<(), String>> {
        let inst = self.instances.get_mut(id).filter(|i| !i.expired)?;
        let Some(spot) = inst.spot.clone() else {
            return Some(Err(format!(
                "instance {id} is not a Spot Instance (launched without \
                 InstanceMarketOptions.MarketType spot): EC2 reclaims only spot capacity"
            )));
        };
        if matches!(inst.state.as_str(), "shutting-down" | "terminated" | "stopped") {
            return Some(Ok(()));
        }
        inst.reclaimed = true;
        inst.forced = false;
        inst.hold = false;
        inst.locked = false;
        if spot.interruption == "terminate" {
            self.enter(id, "shutting-down", now);
        } else {
            self.enter(id, "stopped", now);
            if let Some(inst) = self.instances.get_mut(id) {
                inst.public_ip = None;
            }
        }
        Some(Ok(()))
    }

    /// Force a raw state (control surface).
    pub(crate) fn force_state(&mut self, id: &str, state: &str, now: Instant) {
        if !self.instances.contains_key(id) {
            return;
        }
        match state {
            "running" => self.enter_running(id, now),
            "terminated" => self.enter_terminated(id, now),
            other => {
                self.enter(id, other, now);
                if let Some(inst) = self.instances.get_mut(id) {
                    inst.public_ip = None;
                }
            }
        }
        if let Some(inst) = self.instances.get_mut(id) {
            inst.forced = state != "terminated";
        }
    }

    /// Instances that count against the instance limit in `region`.
    pub(crate) fn active_in(&self, region: &str) -> u32 {
        self.instances
            .values()
            .filter(|i| {
                i.region == region && !matches!(i.state.as_str(), "shutting-down" | "terminated")
            })
            .count() as u32
    }
}

/// Due before the next call: time-based schedules, and `AfterDescribes(0)` (immediately).
fn due_by_time(t: &Transition, elapsed: Duration) -> bool {
    match t {
        Transition::After(d) => elapsed >= *d,
        Transition::AfterDescribes(n) => *n == 0,
        Transition::Manual => false,
    }
}

fn due_by_describes(t: &Transition, seen: u32) -> bool {
    matches!(t, Transition::AfterDescribes(n) if seen >= *n)
}

/// `prefix-` followed by 8 or 17 lowercase hex digits, the two id formats EC2 issues.
pub(crate) fn valid_id(id: &str, prefix: &str) -> bool {
    let Some(rest) = id.strip_prefix(prefix).and_then(|r| r.strip_prefix('-')) else {
        return false;
    };
    matches!(rest.len(), 8 | 17)
        && rest.bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
}

/// EC2's timestamp format: RFC 3339 with milliseconds.
pub(crate) fn iso_time(secs: u64) -> String {
    let s = crate::time::rfc3339(secs);
    format!("{}.000Z", s.trim_end_matches('Z'))
}
