//! The backend's state and every rule that changes it. Handlers in `api` and the shared control
//! surface only lock, call one method here and render the result, so the HTTP API and the Rust
//! control surface can never disagree about what an operation does.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::net::Ipv4Addr;
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use super::create::{CreateRequest, check_hostname, check_labels};
use super::error::HetznerError;
use super::query::{ListQuery, SortKey};
use super::{
    DeleteSchedule, HetznerConfig, ImageSpec, LocationSpec, RunSchedule, RunningServer,
    ServerTypeSpec,
};
use crate::control::{
    Dump, DumpInstance, DumpSecondary, Fault, FaultKind, FaultOp, Plant, RateLimit, Refusal,
    RequestStats,
};
use crate::framework::{Effect, Model, Traffic};

pub(crate) use crate::time::now_secs;

/// The documented status values, for validating the `status` filter.
const SERVER_STATUSES: [&str; 9] = [
    "running",
    "initializing",
    "starting",
    "stopping",
    "off",
    "deleting",
    "migrating",
    "rebuilding",
    "unknown",
];

/// The first ID of each kind. Disjoint ranges make a plugin that passes an action ID
/// where a server ID belongs hit `not_found` instead of another resource.
const FIRST_SERVER_ID: u64 = 4_200_001;
const FIRST_PRIMARY_IP_ID: u64 = 8_700_001;
const FIRST_ACTION_ID: u64 = 1_300_001;

pub(crate) struct Server {
    pub id: u64,
    pub name: String,
    /// Raw status; the control surface may set values Hetzner never sends.
    pub status: String,
    /// Unix seconds, rendered as RFC 3339.
    pub created: u64,
    /// When the emulator made it, for time-based schedules (independent of `created`,
    /// which a planted server may set in the past).
    pub born: Instant,
    pub location: LocationSpec,
    pub server_type: ServerTypeSpec,
    pub image: ImageSpec,
    pub labels: BTreeMap<String, String>,
    pub user_data: Option<String>,
    pub locked: bool,
    pub ipv4: Option<u64>,
    pub ipv6: Option<u64>,
    pub start_after_create: bool,
    /// `hold_provisioning`: stays `initializing` whatever the schedule says.
    pub held: bool,
    /// Reads that returned it while `initializing`.
    pub reads: u32,
    /// `create_server` / `start_server` actions still running.
    pub pending: Vec<u64>,
    pub deleting: Option<Deleting>,
}

pub(crate) struct Deleting {
    pub action: u64,
    /// `start_slow_delete`: only `finish_deletes` completes it.
    pub held: bool,
    pub reads: u32,
    pub since: Instant,
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(super) enum IpKind {
    V4,
    V6,
}

impl IpKind {
    pub(super) fn as_str(self) -> &'static str {
        match self {
            IpKind::V4 => "ipv4",
            IpKind::V6 => "ipv6",
        }
    }
}

pub(crate) struct PrimaryIp {
    pub id: u64,
    pub name: String,
    pub kind: IpKind,
    pub ip: String,
    pub location: LocationSpec,
    pub created: u64,
    pub labels: BTreeMap<String, String>,
    pub auto_delete: bool,
    pub assignee: Option<u64>,
}

pub(crate) struct Action {
    pub id: u64,
    pub command: &'static str,
    /// `running`, `success` or `error`.
    pub status: &'static str,
    pub started: u64,
    pub finished: Option<u64>,
    pub resources: Vec<(u64, &'static str)>,
    pub error: Option<(String, String)>,
}

/// A list answer: the body plus the `Link` header the reference says lists carry.
pub(crate) struct Listing {
    pub body: Value,
    pub link: String,
}

/// The emulated Hetzner project: servers, Primary IPs, actions, and the calls made.
pub struct Backend {
    pub cfg: HetznerConfig,
    /// `http://127.0.0.1:PORT`, for absolute `Link` URLs.
    pub base_url: String,
    pub(super) servers: BTreeMap<u64, Server>,
    /// Server IDs by name: names are unique and never change. Scanning every server for
    /// the name at each create made a create cost the size of the fleet.
    names: HashMap<String, u64>,
    /// IDs of servers that may still be initializing, in creation order (and so in `born`
    /// order), or being deleted: what [`Backend::tick`] looks at instead of every server.
    /// Entries that no longer apply are dropped when `tick` meets them.
    booting: BTreeSet<u64>,
    deleting: BTreeSet<u64>,
    pub(super) ips: BTreeMap<u64, PrimaryIp>,
    pub(super) actions: BTreeMap<u64, Action>,
    next_server: u64,
    next_ip: u64,
    next_action: u64,
    next_v4: u32,
    next_v6: u32,
    failing_scopes: BTreeSet<String>,
    /// Request log, stats, faults and the enforced rate limit.
    pub(crate) traffic: Traffic<HetznerError>,
}

/// Hetzner writes timestamps with an explicit `+00:00` offset, not `Z`; plugins must
/// accept both, so the emulator sends the form the real API sends.
pub(crate) fn rfc3339(secs: u64) -> String {
    let s = crate::time::rfc3339(secs);
    match s.strip_suffix('Z') {
        Some(base) => format!("{base}+00:00"),
        None => s,
    }
}

/// `4200001`, and also the tail of a plugin's `location/4200001`-shaped provider ID, so a
/// conformance suite can pass either.
pub(crate) fn parse_id(id: &str) -> Option<u64> {
    id.rsplit('/').next()?.trim().parse().ok()
}

impl Backend {
    pub(crate) fn new(cfg: HetznerConfig, base_url: String) -> Self {
        Backend {
            traffic: Traffic::new(cfg.rate_limit),
            cfg,
            base_url,
            servers: BTreeMap::new(),
            names: HashMap::new(),
            booting: BTreeSet::new(),
            deleting: BTreeSet::new(),
            ips: BTreeMap::new(),
            actions: BTreeMap::new(),
            next_server: FIRST_SERVER_ID,
            next_ip: FIRST_PRIMARY_IP_ID,
            next_action: FIRST_ACTION_ID,
            next_v4: 0,
            next_v6: 0,
            failing_scopes: BTreeSet::new(),
        }
    }

    /// Forget everything but the configuration. ID counters keep counting, so an ID a test
    /// still holds from before the reset never names a new resource.
    fn forget(&mut self) {
        self.stop_all_proxies();
        self.servers.clear();
        self.names.clear();
        self.booting.clear();
        self.deleting.clear();
        self.ips.clear();
        self.actions.clear();
        self.failing_scopes.clear();
        self.traffic.reset();
    }

    // ---- faults -------------------------------------------------------------------------

    pub(crate) fn inject(&mut self, op: FaultOp, kind: &FaultKind, count: u32) {
        let effect = match kind {
            FaultKind::ServerError => Effect::fail(HetznerError::server_error()),
            FaultKind::Slow { delay_ms } => Effect::delay(Duration::from_millis(*delay_ms)),
            FaultKind::Quota => Effect::fail(HetznerError::server_limit()),
            FaultKind::RateLimit => Effect::fail(HetznerError::rate_limited()),
            FaultKind::Auth => Effect::fail(HetznerError::unauthorized()),
        };
        self.traffic.faults.push(op, effect, count);
    }

    pub(crate) fn inject_error(&mut self, op: FaultOp, error: HetznerError, count: u32) {
        self.traffic.faults.push(op, Effect::fail(error), count);
    }

    fn fail_location(&mut self, scope: &str, fail: bool) {
        if fail {
            self.failing_scopes.insert(scope.to_string());
        } else {
            self.failing_scopes.remove(scope);
        }
    }

    // ---- lifecycle ----------------------------------------------------------------------

    /// Apply the time-based schedules. Called before every API call and every dump: time
    /// only matters when someone looks.
    pub(crate) fn tick(&mut self) {
        let now = Instant::now();
        if let RunSchedule::After(d) = self.cfg.run_schedule {
            let (mut due, mut gone) = (Vec::new(), Vec::new());
            for &id in &self.booting {
                match self.servers.get(&id) {
                    Some(s) if s.status == "initializing" => {
                        if s.held || s.deleting.is_some() {
                            continue;
                        }
                        if now.duration_since(s.born) < d {
                            // Born no earlier than this one: not due either.
                            break;
                        }
                        due.push(id);
                    }
                    _ => gone.push(id),
                }
            }
            for id in gone {
                self.booting.remove(&id);
            }
            for id in due {
                self.become_ready(id);
            }
        }
        if let DeleteSchedule::After(d) = self.cfg.delete_schedule {
            let (mut due, mut gone) = (Vec::new(), Vec::new());
            for &id in &self.deleting {
                match self.servers.get(&id).and_then(|s| s.deleting.as_ref()) {
                    Some(del) if !del.held && now.duration_since(del.since) >= d => due.push(id),
                    Some(_) => {}
                    None => gone.push(id),
                }
            }
            for id in gone {
                self.deleting.remove(&id);
            }
            for id in due {
                self.finish_delete(id);
            }
        }
    }

    /// A read has just returned this server: advance read-counted schedules. Called after
    /// the answer is rendered, so the read that sees a state change is the one after it.
    fn saw(&mut self, id: u64) {
        let run_after = match self.cfg.run_schedule {
            RunSchedule::AfterReads(n) => Some(n),
            _ => None,
        };
        let delete_after = match self.cfg.delete_schedule {
            DeleteSchedule::AfterReads(n) => Some(n),
            _ => None,
        };
        let Some(s) = self.servers.get_mut(&id) else {
            return;
        };
        if let Some(del) = s.deleting.as_mut() {
            if del.held {
                return;
            }
            del.reads += 1;
            if delete_after.is_some_and(|n| del.reads >= n) {
                self.finish_delete(id);
            }
            return;
        }
        if s.status == "initializing" && !s.held {
            s.reads += 1;
            if run_after.is_some_and(|n| s.reads >= n) {
                self.become_ready(id);
            }
        }
    }

    /// Creation finished: `running` (or `off` without `start_after_create`), its actions
    /// succeed, and the `on_running` hook may replace the IPv4 address.
    fn become_ready(&mut self, id: u64) {
        let Some(s) = self.servers.get_mut(&id) else {
            return;
        };
        let status = if s.start_after_create { "running" } else { "off" };
        s.status = status.to_string();
        s.reads = 0;
        let pending = std::mem::take(&mut s.pending);
        for a in pending {
            self.finish_action(a, None);
        }
        if status == "running" {
            self.run_hook(id);
        }
    }

    fn run_hook(&mut self, id: u64) {
        self.start_proxy(id);
        let Some(hook) = self.cfg.on_running.clone() else {
            return;
        };
        let Some(s) = self.servers.get(&id) else {
            return;
        };
        let ipv4 = s.ipv4.and_then(|i| self.ips.get(&i));
        let info = RunningServer {
            id,
            name: s.name.clone(),
            location: s.location.name.clone(),
            labels: s.labels.clone(),
            user_data: s.user_data.clone(),
            ipv4: ipv4.map(|ip| ip.ip.clone()),
        };
        let ip_id = s.ipv4;
        if let (Some(new_ip), Some(ip_id)) = (hook(&info), ip_id)
            && let Some(ip) = self.ips.get_mut(&ip_id)
        {
            ip.ip = new_ip.to_string();
        }
    }

    /// Real-proxy mode: the server runs, so does its proxy, at 127.0.0.1.
    fn start_proxy(&mut self, id: u64) {
        let Some(proxies) = self.cfg.real_proxies.clone() else {
            return;
        };
        let Some(s) = self.servers.get(&id) else {
            return;
        };
        let ip = proxies.start(&id.to_string(), s.user_data.as_deref().map(str::as_bytes));
        let ipv6 = s.ipv6;
        if let Some(addr) = s.ipv4.and_then(|i| self.ips.get_mut(&i)) {
            addr.ip = ip.to_string();
        }
        // Hetzner gives a server a /64 and its images configure the network's `::1` on it:
        // `::/64` makes that `::1`, where the proxy listens too (when the port was free).
        if proxies.ipv6_of(&id.to_string()).is_some()
            && let Some(net) = ipv6.and_then(|i| self.ips.get_mut(&i))
        {
            net.ip = "::/64".into();
        }
    }

    /// Real-proxy mode: the server no longer runs, nor does its proxy.
    fn stop_proxy(&self, id: u64) {
        if let Some(proxies) = &self.cfg.real_proxies {
            proxies.stop(&id.to_string());
        }
    }

    /// Real-proxy mode: stop the proxy of every server (emulator dropped or reset).
    pub(crate) fn stop_all_proxies(&self) {
        for id in self.servers.keys() {
            self.stop_proxy(*id);
        }
    }

    fn finish_action(&mut self, id: u64, error: Option<(&str, &str)>) {
        if let Some(a) = self.actions.get_mut(&id)
            && a.status == "running"
        {
            a.finished = Some(now_secs());
            match error {
                None => a.status = "success",
                Some((code, message)) => {
                    a.status = "error";
                    a.error = Some((code.to_string(), message.to_string()));
                }
            }
        }
    }

    fn new_action(&mut self, command: &'static str, resources: Vec<(u64, &'static str)>) -> u64 {
        let id = self.next_action;
        self.next_action += 1;
        self.actions.insert(
            id,
            Action {
                id,
                command,
                status: "running",
                started: now_secs(),
                finished: None,
                resources,
                error: None,
            },
        );
        id
    }

    /// Put the server into `deleting` behind a running `delete_server` action.
    fn start_delete(&mut self, id: u64, held: bool) -> Option<u64> {
        if self.servers.get(&id)?.deleting.is_some() {
            return None;
        }
        let action = self.new_action("delete_server", vec![(id, "server")]);
        self.stop_proxy(id);
        let s = self.servers.get_mut(&id)?;
        s.status = "deleting".into();
        s.deleting = Some(Deleting { action, held, reads: 0, since: Instant::now() });
        self.deleting.insert(id);
        Some(action)
    }

    /// The server is gone: its delete action succeeds, creation actions still running fail,
    /// auto-delete Primary IPs go with it and the others are unassigned.
    fn finish_delete(&mut self, id: u64) {
        self.stop_proxy(id);
        let Some(s) = self.servers.remove(&id) else {
            return;
        };
        self.names.remove(&s.name);
        if let Some(del) = &s.deleting {
            self.finish_action(del.action, None);
        }
        for a in s.pending {
            self.finish_action(a, Some(("action_failed", "Action failed")));
        }
        self.release_ips(id);
    }

    fn release_ips(&mut self, server: u64) {
        self.ips.retain(|_, ip| ip.assignee != Some(server) || !ip.auto_delete);
        for ip in self.ips.values_mut() {
            if ip.assignee == Some(server) {
                ip.assignee = None;
            }
        }
    }

    // ---- control surface ----------------------------------------------------------------

    /// `None` deletes the server's primary IPs, IPv4 and IPv6 (as if it had been created
    /// without any: no address at all); `Some` gives it that IPv4 address, creating an
    /// auto-delete primary IP when it has none.
    fn set_address_server(&mut self, id: u64, ip: Option<&str>) -> bool {
        let Some(s) = self.servers.get(&id) else {
            return false;
        };
        let (current, location) = (s.ipv4, s.location.clone());
        if ip.is_none()
            && let Some(v6) = s.ipv6
        {
            self.ips.remove(&v6);
            if let Some(s) = self.servers.get_mut(&id) {
                s.ipv6 = None;
            }
        }
        match (ip, current) {
            (None, Some(iid)) => {
                self.ips.remove(&iid);
                if let Some(s) = self.servers.get_mut(&id) {
                    s.ipv4 = None;
                }
            }
            (None, None) => {}
            (Some(addr), Some(iid)) => {
                if let Some(p) = self.ips.get_mut(&iid) {
                    p.ip = addr.to_string();
                }
            }
            (Some(addr), None) => {
                let iid = self.new_ip(IpKind::V4, &location, Some(id), true);
                if let Some(p) = self.ips.get_mut(&iid) {
                    p.ip = addr.to_string();
                }
                if let Some(s) = self.servers.get_mut(&id) {
                    s.ipv4 = Some(iid);
                }
            }
        }
        true
    }

    fn hold_server(&mut self, id: u64, hold: bool) -> bool {
        let Some(s) = self.servers.get_mut(&id) else {
            return false;
        };
        if s.deleting.is_some() {
            return true;
        }
        s.held = hold;
        s.reads = 0;
        if hold {
            s.status = "initializing".into();
            self.booting.insert(id);
            self.stop_proxy(id);
        }
        true
    }

    fn set_state_server(&mut self, id: u64, state: &str) -> bool {
        let Some(s) = self.servers.get_mut(&id) else {
            return false;
        };
        let was_running = s.status == "running";
        s.status = state.to_string();
        s.held = false;
        s.reads = 0;
        if state == "initializing" {
            self.booting.insert(id);
        }
        if state != "initializing" {
            // Creation is over one way or the other: the server exists, so create_server
            // succeeded; the power-on only did if the server now runs.
            let pending = std::mem::take(&mut s.pending);
            for a in pending {
                let cmd = self.actions.get(&a).map(|a| a.command);
                let failed = cmd == Some("start_server") && state != "running";
                self.finish_action(a, failed.then_some(("action_failed", "Action failed")));
            }
        }
        match (was_running, state == "running") {
            (false, true) => self.run_hook(id),
            (true, false) => self.stop_proxy(id),
            _ => {}
        }
        true
    }

    fn slow_delete_server(&mut self, id: u64) -> bool {
        let Some(s) = self.servers.get_mut(&id) else {
            return false;
        };
        match s.deleting.as_mut() {
            Some(del) => del.held = true,
            None => {
                self.start_delete(id, true);
            }
        }
        true
    }

    fn finish_all_deletes(&mut self) {
        let ids: Vec<u64> =
            self.servers.values().filter(|s| s.deleting.is_some()).map(|s| s.id).collect();
        for id in ids {
            self.finish_delete(id);
        }
    }

    fn set_locked_server(&mut self, id: u64, locked: bool) -> bool {
        match self.servers.get_mut(&id) {
            Some(s) => {
                s.locked = locked;
                true
            }
            None => false,
        }
    }

    /// Creation failed inside Hetzner after the API accepted it: the `create_server` action
    /// ends in `error` and the server disappears with its auto-delete IPs.
    pub(crate) fn fail_create(&mut self, id: u64) -> bool {
        self.stop_proxy(id);
        let Some(s) = self.servers.remove(&id) else {
            return false;
        };
        self.names.remove(&s.name);
        for a in s.pending {
            self.finish_action(a, Some(("action_failed", "Action failed")));
        }
        if let Some(del) = s.deleting {
            self.finish_action(del.action, None);
        }
        self.release_ips(id);
        true
    }

    fn plant_server(&mut self, p: &Plant) -> Result<u64, HetznerError> {
        let location =
            if p.scope.is_empty() { self.cfg.default_location.clone() } else { p.scope.clone() };
        let location = self
            .find_location(&location)
            .ok_or_else(|| HetznerError::invalid_input("location not found"))?;
        let labels: BTreeMap<String, String> = crate::framework::marks(p).into_iter().collect();
        let mut errs = Vec::new();
        check_hostname(&p.name, &mut errs);
        check_labels(&labels, &mut errs);
        if !errs.is_empty() {
            return Err(HetznerError::invalid_fields(&errs));
        }
        if self.names.contains_key(&p.name) {
            return Err(HetznerError::name_taken());
        }
        let server_type = self
            .cfg
            .server_types
            .iter()
            .find(|t| t.available_in(&location.name))
            .cloned()
            .ok_or_else(|| HetznerError::invalid_input("unsupported location for server type"))?;
        let image = self
            .cfg
            .images
            .first()
            .cloned()
            .ok_or_else(|| HetznerError::invalid_input("image not found"))?;
        let id = self.next_server;
        self.next_server += 1;
        let created = p.created_at.unwrap_or_else(now_secs);
        let ipv4 = Some(self.new_ip(IpKind::V4, &location, Some(id), true));
        let ipv6 = Some(self.new_ip(IpKind::V6, &location, Some(id), true));
        self.names.insert(p.name.clone(), id);
        self.servers.insert(
            id,
            Server {
                id,
                name: p.name.clone(),
                status: "running".into(),
                created,
                born: Instant::now(),
                location,
                server_type,
                image,
                labels,
                user_data: None,
                locked: false,
                ipv4,
                ipv6,
                start_after_create: true,
                held: false,
                reads: 0,
                pending: Vec::new(),
                deleting: None,
            },
        );
        self.start_proxy(id);
        Ok(id)
    }

    /// An unassigned Primary IP the caller owns (`auto_delete: false`), for creating a
    /// server with `public_net.ipv4` set.
    pub(crate) fn plant_primary_ip(&mut self, location: &str, v6: bool) -> Option<u64> {
        let loc = self.find_location(location)?;
        let kind = if v6 { IpKind::V6 } else { IpKind::V4 };
        Some(self.new_ip(kind, &loc, None, false))
    }

    fn dump_all(&mut self) -> Dump {
        self.tick();
        let instances = self
            .servers
            .values()
            .map(|s| DumpInstance {
                id: s.id.to_string(),
                name: s.name.clone(),
                scope: s.location.name.clone(),
                state: s.status.clone(),
                ip: self.ipv4_of(s).unwrap_or_default(),
                labels: s.labels.iter().map(|(k, v)| (k.clone(), v.clone())).collect(),
                user_data: s.user_data.clone().unwrap_or_default().into_bytes(),
            })
            .collect();
        let secondary = self
            .ips
            .values()
            .map(|ip| DumpSecondary {
                kind: "primary_ip".into(),
                id: ip.id.to_string(),
                attached_to: ip.assignee.map(|a| a.to_string()),
            })
            .collect();
        Dump { instances, secondary }
    }

    // ---- the API ------------------------------------------------------------------------

    pub(crate) fn create_server(&mut self, body: &[u8]) -> Result<Value, HetznerError> {
        let body: Value =
            serde_json::from_slice(body).map_err(|e| HetznerError::json_error(&e.to_string()))?;
        let Value::Object(obj) = body else {
            return Err(HetznerError::json_error("expected a JSON object"));
        };
        let req = CreateRequest::parse(&obj)?;

        let server_type = self
            .cfg
            .server_types
            .iter()
            .find(|t| t.name == req.server_type || t.id.to_string() == req.server_type)
            .cloned()
            .ok_or_else(|| HetznerError::invalid_input("server type not found"))?;
        let image = self
            .cfg
            .images
            .iter()
            .find(|i| i.name == req.image || i.id.to_string() == req.image)
            .cloned()
            .ok_or_else(|| HetznerError::invalid_input("image not found"))?;
        let location = match (&req.location, &req.datacenter) {
            (Some(l), _) => self
                .find_location(l)
                .ok_or_else(|| HetznerError::invalid_input("location not found"))?,
            (None, Some(dc)) => self
                .cfg
                .locations
                .iter()
                .find(|l| &l.datacenter == dc || l.datacenter_id().to_string() == *dc)
                .cloned()
                .ok_or_else(|| HetznerError::invalid_input("datacenter not found"))?,
            (None, None) => {
                let name = self.cfg.default_location.clone();
                self.find_location(&name)
                    .ok_or_else(|| HetznerError::invalid_input("location not found"))?
            }
        };
        if !server_type.available_in(&location.name) {
            // Message captured from the real API.
            return Err(HetznerError::invalid_input("unsupported location for server type"));
        }
        if self.names.contains_key(&req.name) {
            return Err(HetznerError::name_taken());
        }
        if self.cfg.server_limit.is_some_and(|max| self.servers.len() >= max) {
            return Err(HetznerError::server_limit());
        }
        if !location.available {
            // Status, code and message captured from the real API.
            return Err(HetznerError::new(412, "resource_unavailable", "server location disabled"));
        }
        for (want, kind) in [(req.ipv4, IpKind::V4), (req.ipv6, IpKind::V6)] {
            let Some(ip_id) = want else { continue };
            let ip = self
                .ips
                .get(&ip_id)
                .ok_or_else(|| HetznerError::not_found("primary_ip", &ip_id.to_string()))?;
            if ip.kind != kind {
                return Err(HetznerError::new(
                    412,
                    "primary_ip_version_mismatch",
                    "The specified Primary IP has the wrong IP Version",
                ));
            }
            if ip.assignee.is_some() {
                return Err(HetznerError::new(
                    422,
                    "primary_ip_assigned",
                    "The specified Primary IP is already assigned to a server",
                ));
            }
            if ip.location.name != location.name {
                return Err(HetznerError::new(
                    422,
                    "primary_ip_datacenter_mismatch",
                    "The specified Primary IP is in a different datacenter",
                ));
            }
        }

        let id = self.next_server;
        self.next_server += 1;
        let attach = |this: &mut Self, want: Option<u64>, enable: bool, kind: IpKind| match want {
            Some(ip_id) => {
                if let Some(ip) = this.ips.get_mut(&ip_id) {
                    ip.assignee = Some(id);
                }
                Some(ip_id)
            }
            None if enable => Some(this.new_ip(kind, &location, Some(id), true)),
            None => None,
        };
        let ipv4 = attach(self, req.ipv4, req.enable_ipv4, IpKind::V4);
        let ipv6 = attach(self, req.ipv6, req.enable_ipv6, IpKind::V6);
        let create = self.new_action("create_server", vec![(id, "server")]);
        let mut pending = vec![create];
        if req.start_after_create {
            pending.push(self.new_action("start_server", vec![(id, "server")]));
        }
        let server = Server {
            id,
            name: req.name,
            status: "initializing".into(),
            created: now_secs(),
            born: Instant::now(),
            location,
            server_type,
            image,
            labels: req.labels,
            user_data: req.user_data,
            locked: false,
            ipv4,
            ipv6,
            start_after_create: req.start_after_create,
            held: false,
            reads: 0,
            pending: pending.clone(),
            deleting: None,
        };
        let server_json = self.server_json(&server);
        self.names.insert(server.name.clone(), id);
        self.booting.insert(id);
        self.servers.insert(id, server);
        let root_password = (!req.has_ssh_keys).then(|| root_password(id));
        let body = json!({
            "server": server_json,
            "action": self.action_json(create),
            "next_actions": pending[1..].iter().map(|a| self.action_json(*a)).collect::<Vec<_>>(),
            "root_password": root_password,
        });
        if self.cfg.run_schedule == RunSchedule::AfterReads(0) {
            self.become_ready(id);
        }
        Ok(body)
    }

    pub(crate) fn get_server(&mut self, id: &str) -> Result<Value, HetznerError> {
        let sid = parse_path_id(id, "server")?;
        let s = self.servers.get(&sid).ok_or_else(|| HetznerError::not_found("server", id))?;
        let body = json!({ "server": self.server_json(s) });
        self.saw(sid);
        Ok(body)
    }

    pub(crate) fn list_servers(
        &mut self,
        query: &[(String, String)],
    ) -> Result<Listing, HetznerError> {
        let q = ListQuery::parse(query, &["id", "name", "created"])?;
        let mut statuses = Vec::new();
        for (k, v) in query {
            if k == "status" {
                if !SERVER_STATUSES.contains(&v.as_str()) {
                    return Err(HetznerError::invalid_fields(&[(
                        "status".into(),
                        format!("'{v}' is not a valid status"),
                    )]));
                }
                statuses.push(v.clone());
            }
        }
        let mut matched: Vec<&Server> = self
            .servers
            .values()
            .filter(|s| q.name.as_ref().is_none_or(|n| &s.name == n))
            .filter(|s| q.selector.matches(&s.labels))
            .filter(|s| statuses.is_empty() || statuses.contains(&s.status))
            .collect();
        self.check_scopes(matched.iter().map(|s| s.location.name.as_str()))?;
        matched.sort_by(|a, b| {
            q.compare(|field| match field {
                "name" => SortKey::Text(&a.name, &b.name),
                "created" => SortKey::Num(a.created, b.created),
                _ => SortKey::Num(a.id, b.id),
            })
        });
        let (page, range, meta) = q.page(matched.len());
        let shown: Vec<u64> = matched[range].iter().map(|s| s.id).collect();
        let servers: Vec<Value> =
            shown.iter().map(|id| self.server_json(&self.servers[id])).collect();
        let link = q.link(&self.base_url, "/v1/servers", query, page, &meta);
        for id in shown {
            self.saw(id);
        }
        Ok(Listing { body: json!({ "servers": servers, "meta": { "pagination": meta } }), link })
    }

    pub(crate) fn delete_server(&mut self, id: &str) -> Result<Value, HetznerError> {
        let sid = parse_path_id(id, "server")?;
        let s = self.servers.get(&sid).ok_or_else(|| HetznerError::not_found("server", id))?;
        if s.locked || s.deleting.is_some() {
            // A server being deleted has a running action, which locks it.
            return Err(HetznerError::locked("server"));
        }
        let action = self.start_delete(sid, false).ok_or_else(|| HetznerError::locked("server"))?;
        let body = json!({ "action": self.action_json(action) });
        if matches!(
            self.cfg.delete_schedule,
            DeleteSchedule::Immediate | DeleteSchedule::AfterReads(0)
        ) {
            self.finish_delete(sid);
        }
        Ok(body)
    }

    pub(crate) fn get_action(&mut self, id: &str) -> Result<Value, HetznerError> {
        let aid = parse_path_id(id, "action")?;
        if !self.actions.contains_key(&aid) {
            return Err(HetznerError::not_found("action", id));
        }
        Ok(json!({ "action": self.action_json(aid) }))
    }

    pub(crate) fn get_server_action(
        &mut self,
        server: &str,
        action: &str,
    ) -> Result<Value, HetznerError> {
        let sid = parse_path_id(server, "server")?;
        let aid = parse_path_id(action, "action")?;
        let belongs =
            self.actions.get(&aid).is_some_and(|a| a.resources.contains(&(sid, "server")));
        if !belongs {
            return Err(HetznerError::not_found("action", action));
        }
        Ok(json!({ "action": self.action_json(aid) }))
    }

    pub(crate) fn list_primary_ips(
        &mut self,
        query: &[(String, String)],
    ) -> Result<Listing, HetznerError> {
        let q = ListQuery::parse(query, &["id", "created"])?;
        let ip_filter = query.iter().find(|(k, _)| k == "ip").map(|(_, v)| v.clone());
        let mut matched: Vec<&PrimaryIp> = self
            .ips
            .values()
            .filter(|ip| q.name.as_ref().is_none_or(|n| &ip.name == n))
            .filter(|ip| ip_filter.as_ref().is_none_or(|f| &ip.ip == f))
            .filter(|ip| q.selector.matches(&ip.labels))
            .collect();
        self.check_scopes(matched.iter().map(|ip| ip.location.name.as_str()))?;
        matched.sort_by(|a, b| {
            q.compare(|field| match field {
                "created" => SortKey::Num(a.created, b.created),
                _ => SortKey::Num(a.id, b.id),
            })
        });
        let (page, range, meta) = q.page(matched.len());
        let ips: Vec<Value> = matched[range].iter().map(|ip| self.ip_json(ip)).collect();
        Ok(Listing {
            body: json!({ "primary_ips": ips, "meta": { "pagination": meta } }),
            link: q.link(&self.base_url, "/v1/primary_ips", query, page, &meta),
        })
    }

    pub(crate) fn get_primary_ip(&mut self, id: &str) -> Result<Value, HetznerError> {
        let iid = parse_path_id(id, "primary_ip")?;
        let ip = self.ips.get(&iid).ok_or_else(|| HetznerError::not_found("primary_ip", id))?;
        Ok(json!({ "primary_ip": self.ip_json(ip) }))
    }

    pub(crate) fn delete_primary_ip(&mut self, id: &str) -> Result<(), HetznerError> {
        let iid = parse_path_id(id, "primary_ip")?;
        let ip = self.ips.get(&iid).ok_or_else(|| HetznerError::not_found("primary_ip", id))?;
        if let Some(server) = ip.assignee.and_then(|s| self.servers.get(&s)) {
            // The reference: an assigned IP is unassigned by the delete, and the server
            // must be powered off for that.
            if server.status != "off" {
                return Err(HetznerError::new(
                    422,
                    "server_not_stopped",
                    "The action requires a stopped server",
                ));
            }
        }
        let ip = self.ips.remove(&iid).expect("checked above");
        if let Some(server) = ip.assignee.and_then(|s| self.servers.get_mut(&s)) {
            if server.ipv4 == Some(iid) {
                server.ipv4 = None;
            }
            if server.ipv6 == Some(iid) {
                server.ipv6 = None;
            }
        }
        Ok(())
    }

    // ---- helpers ------------------------------------------------------------------------

    fn find_location(&self, name: &str) -> Option<LocationSpec> {
        self.cfg.locations.iter().find(|l| l.name == name || l.id.to_string() == name).cloned()
    }

    /// A failed scope makes any list touching it fail whole; see `Emulator::fail_scope`
    /// on [`super::HetznerEmulator`] for why there is no partial answer.
    fn check_scopes<'a>(
        &self,
        mut locations: impl Iterator<Item = &'a str>,
    ) -> Result<(), HetznerError> {
        if locations.any(|l| self.failing_scopes.contains(l)) {
            return Err(HetznerError::unavailable(
                "A service or product is currently not available",
            ));
        }
        Ok(())
    }

    fn new_ip(
        &mut self,
        kind: IpKind,
        location: &LocationSpec,
        assignee: Option<u64>,
        auto_delete: bool,
    ) -> u64 {
        let id = self.next_ip;
        self.next_ip += 1;
        let ip = match kind {
            IpKind::V4 => {
                let base = u32::from(self.cfg.first_ipv4);
                let addr = Ipv4Addr::from(base.wrapping_add(self.next_v4));
                self.next_v4 += 1;
                addr.to_string()
            }
            IpKind::V6 => {
                self.next_v6 += 1;
                format!("2001:db8:{:x}::/64", self.next_v6)
            }
        };
        self.ips.insert(
            id,
            PrimaryIp {
                id,
                // The name Hetzner gives a Primary IP it creates along with a server.
                name: format!("primary_ip-{id}"),
                kind,
                ip,
                location: location.clone(),
                created: now_secs(),
                labels: BTreeMap::new(),
                auto_delete,
                assignee,
            },
        );
        id
    }

    fn ipv4_of(&self, s: &Server) -> Option<String> {
        s.ipv4.and_then(|i| self.ips.get(&i)).map(|ip| ip.ip.clone())
    }
}

/// Path IDs are int64 in the reference; anything else names nothing, so `not_found`.
fn parse_path_id(id: &str, kind: &str) -> Result<u64, HetznerError> {
    id.parse().map_err(|_| HetznerError::not_found(kind, id))
}

/// A 20-character password (the reference's example length), derived from the ID so runs
/// are reproducible.
fn root_password(id: u64) -> String {
    const ALPHABET: &[u8] = b"abcdefghijkmnopqrstuvwxyzABCDEFGHJKLMNPQRSTUVWXYZ23456789";
    let mut x = id ^ 0x9e37_79b9_7f4a_7c15;
    (0..20)
        .map(|_| {
            // splitmix64
            x = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
            let mut z = x;
            z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
            z ^= z >> 31;
            ALPHABET[(z % ALPHABET.len() as u64) as usize] as char
        })
        .collect()
}

/// The control surface on Hetzner's terms; see "Control surface" in the module docs.
impl Model for Backend {
    fn hold(&mut self, id: &str, hold: bool) -> bool {
        parse_id(id).is_some_and(|n| self.hold_server(n, hold))
    }
    fn set_state(&mut self, id: &str, state: &str) -> bool {
        parse_id(id).is_some_and(|n| self.set_state_server(n, state))
    }
    fn set_address(&mut self, id: &str, ip: Option<&str>) -> bool {
        parse_id(id).is_some_and(|n| self.set_address_server(n, ip))
    }
    fn slow_delete(&mut self, id: &str) -> bool {
        parse_id(id).is_some_and(|n| self.slow_delete_server(n))
    }
    fn finish_deletes(&mut self) {
        self.finish_all_deletes()
    }
    fn set_locked(&mut self, id: &str, locked: bool) -> bool {
        parse_id(id).is_some_and(|n| self.set_locked_server(n, locked))
    }
    /// Refused as Hetzner would refuse the server (name taken or not a hostname, labels
    /// invalid, unknown location).
    fn plant(&mut self, plant: &Plant) -> Result<String, Refusal> {
        Ok(self.plant_server(plant)?.to_string())
    }
    fn inject(&mut self, fault: Fault) {
        Backend::inject(self, fault.op, &fault.kind, fault.count)
    }
    /// See "Partial failures" in the module documentation.
    fn fail_scope(&mut self, scope: &str, fail: bool) {
        self.fail_location(scope, fail)
    }
    fn dump(&mut self) -> Dump {
        self.dump_all()
    }
    fn reset(&mut self) {
        self.forget()
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
}

impl Drop for Backend {
    /// Real-proxy mode: the proxies of this emulator's servers stop with it.
    fn drop(&mut self) {
        self.stop_all_proxies();
    }
}
