//! An emulator of the AWS EC2 Query API (version 2016-11-15), close enough on the wire that
//! an EC2 plugin cannot tell it from the real service.
//!
//! Why not just moto: moto skips signature checks by default, ignores `ClientToken`, goes
//! straight to `running` and has no way to hold an instance in a state, lock it, fail one
//! region or inject quota and throttling errors. The conformance suite needs all of that,
//! and needs it in-process and in milliseconds.
//!
//! What a plugin sees:
//! - `POST /` with an `application/x-www-form-urlencoded` body (or `GET /?...`) carrying
//!   `Action=...&Version=2016-11-15`; answers are XML in EC2's namespace with a
//!   `requestId`, errors are `<Response><Errors><Error><Code/><Message/></Error></Errors>
//!   <RequestID/></Response>` with EC2's HTTP status for the code.
//! - Every call must carry a valid SigV4 `Authorization` header for service `ec2`. The
//!   region of the credential scope selects the region the call acts on, so one emulator
//!   serves every configured region (like moto).
//! - Actions: RunInstances, DescribeInstances, TerminateInstances, DescribeVolumes,
//!   DescribeInstanceAttribute, DescribeAvailabilityZones, DescribeRegions,
//!   DescribeSpotPriceHistory.
//! - Lifecycle: `pending` (private IP only) -> `running` (public IP [`Ec2Config::public_ip`])
//!   per [`Ec2Config::launch`]; TerminateInstances -> `shutting-down` -> `terminated` per
//!   [`Ec2Config::shutdown`]; terminated instances stay listed for
//!   [`Ec2Config::terminated_visible_for`] and then answer `InvalidInstanceID.NotFound`.
//! - Volumes: a root volume on [`Ec2Config::root_device_name`] plus one per extra
//!   `BlockDeviceMapping.N`. DeleteOnTermination defaults to **false** (real EC2 takes the
//!   AMI's default, usually true), so a plugin that forgets to set it leaks a volume that
//!   [`Emulator::dump`] and DescribeVolumes show.
//!
//! The control surface ([`crate::control`], served by [`crate::framework`]) maps onto EC2
//! like this:
//! - faults answer as EC2 does: server-error alternates `InternalError` (500) and
//!   `Unavailable` (503), starting with 500; quota is `InstanceLimitExceeded` (400; EC2's
//!   other capacity answers are `InsufficientInstanceCapacity`, 500, and
//!   `VcpuLimitExceeded`, 400); rate-limit is `RequestLimitExceeded` (503); auth is
//!   `AuthFailure` (401). Create is RunInstances, Get is DescribeInstances with
//!   `InstanceId.N` (and DescribeInstanceAttribute), List is DescribeInstances without ids
//!   (and DescribeVolumes), Delete is TerminateInstances.
//! - `fail_scope(region)` answers every call signed for that region with 503 `Unavailable`.
//! - `set_locked`: EC2 has no locks, so a locked instance is one whose state transition is
//!   in progress: its state is frozen (no schedule moves it) and TerminateInstances on it
//!   answers 400 `IncorrectInstanceState`, which a plugin must treat as transient.
//! - `set_backend_state`: the raw state name; `running` assigns the public IP, any other
//!   state removes it, `terminated` also releases the volumes. A forced state is kept (no
//!   automatic transition) until the next TerminateInstances.
//! - `start_slow_delete`: TerminateInstances whose `shutting-down` lasts until
//!   [`Emulator::finish_deletes`].
//! - `plant`: a `running` instance tagged `Name` plus the marks of
//!   [`crate::MARK_MANAGED`] / `MARK_UID` / `MARK_INSTALLATION`, with a root
//!   volume that is deleted on termination.
//! - `dump`: instances not yet `terminated`, and every volume as a secondary resource;
//!   Spot Instances carry `spot: true`.
//! - `reclaim` (Spot Instances only; `409` for an on-demand one): EC2 takes the instance
//!   back. With `InstanceInterruptionBehavior` `terminate` it goes `shutting-down`, then
//!   `terminated` on the [`Ec2Config::shutdown`] schedule, with `stateReason` code
//!   `Server.SpotInstanceTermination`; with `stop` or `hibernate` it is `stopped` at once
//!   with `Server.SpotInstanceShutdown`. TerminateInstances afterwards is the user's again.
//! - `spot-capacity` off: RunInstances of a spot launch answers 500
//!   `InsufficientInstanceCapacity` ("There is no Spot capacity available that matches your
//!   request.") and launches nothing; on-demand launches are untouched. A reset turns
//!   capacity back on.
//!
//! Spot, after the 2016-11-15 model (botocore `ec2/2016-11-15/service-2.json`):
//! RunInstances reads `InstanceMarketOptions.MarketType` (`spot`) and
//! `InstanceMarketOptions.SpotOptions.{SpotInstanceType, InstanceInterruptionBehavior,
//! MaxPrice, ValidUntil}` (`InstanceMarketOptionsRequest`, `SpotMarketOptions`), defaulting
//! to `one-time` and `terminate`. As the model documents: `persistent` only with `stop` or
//! `hibernate`, `ValidUntil` only for `persistent`, `MaxPrice` above USD 0.001; a
//! `MaxPrice` under [`Ec2Config::spot_price`] answers `SpotMaxPriceTooLow`. A spot instance
//! is described with `instanceLifecycle` `spot` (`InstanceLifecycleType`) and a
//! `spotInstanceRequestId`, and the `instance-lifecycle` filter finds it; its `stateReason`
//! codes are the ones `StateReason` lists. Assumed, not verified: the error codes and
//! messages of the combinations EC2 refuses (`InvalidParameterCombination`), the empty
//! `reason` of a reclaimed instance, `Unsupported` for the market types the emulator does
//! not model (`capacity-block`, `interruptible-capacity-reservation`).
//!
//! DescribeSpotPriceHistory, after the same model (github.com/boto/botocore at 0e6e2404;
//! the operation's documentation, `DescribeSpotPriceHistoryRequest`,
//! `DescribeSpotPriceHistoryResult`, `SpotPrice`): `InstanceType.N`, `ProductDescription.N`,
//! `AvailabilityZone` (or `AvailabilityZoneId`, not both), `StartTime`, `EndTime`,
//! `Filter.N` (`availability-zone`, `availability-zone-id`, `instance-type`,
//! `product-description`, `spot-price`, `timestamp`), `MaxResults`, `NextToken` and
//! `DryRun`; the answer is `spotPriceHistorySet/item` with `availabilityZone`,
//! `availabilityZoneId`, `instanceType`, `productDescription`, `spotPrice` (decimal text)
//! and `timestamp`, and `nextToken`. The history holds one price per instance type of the
//! region's catalogue, zone and product (`Linux/UNIX`, and `Windows` at twice the Linux
//! price, the emulator's choice, so that a client that does not ask for its product is
//! caught), all set at [`SPOT_PRICES_SINCE`]: as the reference documents, a start time
//! after it still answers that price ("the last price change before the start time, which
//! is the effective price as of the start time"); an end time before it answers nothing.
//! The Linux price is [`Ec2Config::spot_prices`]' for the type and zone, else
//! [`Ec2Config::spot_price`], the one RunInstances compares `MaxPrice` with. Assumed, not
//! verified: `InvalidParameterValue` for a zone the region does not have and for an
//! unreadable time, an empty history (not an error) for an instance type the region does
//! not offer, `MaxResults` 5 to 1000 as DescribeInstances takes it.
//!
//! Real-proxy mode: with [`Ec2Config::real_proxies`] set, an instance that enters
//! `running` gets a real forward proxy on 127.0.0.1 (port from its user data, see
//! [`crate::real_proxy`]) and 127.0.0.1 as its public IP; the proxy stops when the instance
//! leaves `running` (TerminateInstances, a forced state, a hold, a reset) and when the
//! emulator is dropped.
//!
//! Rate limit: off by default. With [`Ec2Config::rate_limit`] (or `POST
//! /_emulator/rate-limit`) every signed call of a valid action takes a token from the
//! bucket of its action and region (EC2's "request rate limiting", per API, account and
//! Region); a call without one answers 503 `RequestLimitExceeded` ("Request limit
//! exceeded.") and does nothing. EC2 sends no rate-limit headers and no `Retry-After`.
//!
//! HTTP control routes (no SigV4) are the framework's ([`crate::framework`]), plus
//! `GET /_emulator/requests` (the actions called, as a JSON array).

mod api;
mod model;
mod sigv4;
mod xml;

#[cfg(test)]
mod tests;

pub use sigv4::{Credential, SignatureMismatch};

#[cfg(doc)]
use crate::control::Emulator;
use crate::control::{
    Dump, DumpInstance, DumpSecondary, Fault, FaultKind, Plant, RateLimit, Refusal, RequestStats,
};
use crate::framework::{Effect, Model, Served, Shared};
use api::{ApiError, Params};
use axum::Json;
use axum::Router;
use axum::extract::{Request, State as AxState};
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use model::{DiskSpec, LaunchSpec, unix_now};
use std::sync::Arc;
use std::time::{Duration, Instant};

pub use model::State;

/// What one region offers. Anything outside it is refused with EC2's error codes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RegionCatalog {
    pub name: String,
    /// The first zone is where instances land when the request names none.
    pub zones: Vec<String>,
    /// AMI ids; AMIs are regional in EC2, so the same id in another region is unknown.
    pub images: Vec<String>,
    pub instance_types: Vec<String>,
}

impl RegionCatalog {
    /// Zones `{name}a`, `{name}b`, ...; the given AMIs and instance types.
    pub fn new(name: &str, zone_letters: &str, images: &[&str], instance_types: &[&str]) -> Self {
        RegionCatalog {
            name: name.to_string(),
            zones: zone_letters.chars().map(|c| format!("{name}{c}")).collect(),
            images: images.iter().map(|s| s.to_string()).collect(),
            instance_types: instance_types.iter().map(|s| s.to_string()).collect(),
        }
    }
}

/// When an instance leaves `pending` (or `shutting-down`) by itself.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Transition {
    /// After this many DescribeInstances answers have shown it in the state: with 1, the
    /// first Describe shows `pending` and the next `running`, like a fast real launch;
    /// with 0, every call after the one that entered the state sees the next one.
    AfterDescribes(u32),
    /// After this much time in the state.
    After(Duration),
    /// Only through the control surface.
    Manual,
}

#[derive(Debug, Clone)]
pub struct Ec2Config {
    pub credentials: Vec<Credential>,
    pub regions: Vec<RegionCatalog>,
    /// `pending` -> `running`.
    pub launch: Transition,
    /// `shutting-down` -> `terminated`.
    pub shutdown: Transition,
    /// How long terminated instances stay listed (EC2: "usually less than one hour").
    pub terminated_visible_for: Duration,
    /// Eventual consistency: a new instance is invisible to DescribeInstances (and answers
    /// `InvalidInstanceID.NotFound`) for this long after RunInstances. Zero turns it off.
    pub eventual_consistency: Duration,
    /// The public IP a running instance gets. Loopback by default so health probes and
    /// clients in the test process can reach a proxy listening there.
    pub public_ip: String,
    pub root_device_name: String,
    /// Instances (not shutting down or terminated) allowed per region; RunInstances past it
    /// answers `InstanceLimitExceeded`. `None` is unlimited.
    pub instance_limit: Option<u32>,
    pub owner_id: String,
    /// How far `x-amz-date` may be from the emulator's clock (EC2: 15 minutes).
    pub max_clock_skew: Duration,
    pub signature_mismatch: SignatureMismatch,
    /// Real-proxy mode (see the module documentation); `None` by default.
    pub real_proxies: Option<Arc<crate::real_proxy::RealProxies>>,
    /// EC2's request rate limiting, enforced: one bucket per action and region (as EC2
    /// keeps one per API per account and Region); a call past it answers 503
    /// `RequestLimitExceeded`. `None` (the default): never limited.
    pub rate_limit: Option<crate::rate_limit::RateLimit>,
    /// The current spot price (USD an hour, decimal text) of every instance type in every
    /// zone, unless `spot_prices` names another: a spot launch with a lower
    /// `SpotOptions.MaxPrice` answers `SpotMaxPriceTooLow`, and DescribeSpotPriceHistory
    /// shows it for `Linux/UNIX`.
    pub spot_price: String,
    /// Spot prices of single instance types in single zones, over `spot_price`.
    pub spot_prices: Vec<ZoneSpotPrice>,
}

/// The spot price of one instance type in one zone (USD an hour, decimal text).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ZoneSpotPrice {
    pub instance_type: String,
    pub zone: String,
    pub price: String,
}

impl ZoneSpotPrice {
    pub fn new(instance_type: &str, zone: &str, price: &str) -> Self {
        ZoneSpotPrice {
            instance_type: instance_type.into(),
            zone: zone.into(),
            price: price.into(),
        }
    }
}

/// When every spot price of the history took effect (Unix seconds, 2024-01-01T00:00:00Z).
pub const SPOT_PRICES_SINCE: u64 = 1_704_067_200;

/// The access key from AWS's documentation examples.
pub const EXAMPLE_ACCESS_KEY: &str = "AKIAIOSFODNN7EXAMPLE";
/// The secret key from AWS's documentation examples.
pub const EXAMPLE_SECRET_KEY: &str = "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY";

impl Default for Ec2Config {
    /// us-east-1 and eu-west-1 with three zones each, one AMI each, four instance types,
    /// and AWS's documented example key pair.
    fn default() -> Self {
        let types = ["t3.micro", "t3.small", "t3.medium", "m5.large"];
        Ec2Config {
            credentials: vec![Credential {
                access_key: EXAMPLE_ACCESS_KEY.into(),
                secret_key: EXAMPLE_SECRET_KEY.into(),
                session_token: None,
            }],
            regions: vec![
                RegionCatalog::new("us-east-1", "abc", &["ami-0abcdef1234567890"], &types),
                RegionCatalog::new("eu-west-1", "abc", &["ami-0fedcba9876543210"], &types),
            ],
            launch: Transition::AfterDescribes(1),
            shutdown: Transition::AfterDescribes(1),
            terminated_visible_for: Duration::from_secs(3600),
            eventual_consistency: Duration::ZERO,
            public_ip: "127.0.0.1".into(),
            root_device_name: "/dev/xvda".into(),
            instance_limit: None,
            owner_id: "123456789012".into(),
            max_clock_skew: Duration::from_secs(15 * 60),
            signature_mismatch: SignatureMismatch::AuthFailure,
            real_proxies: None,
            rate_limit: None,
            spot_price: "0.0035".into(),
            spot_prices: Vec::new(),
        }
    }
}

impl Ec2Config {
    /// Also accept a long-term key pair.
    pub fn with_credential(mut self, access_key: &str, secret_key: &str) -> Self {
        self.credentials.push(Credential {
            access_key: access_key.into(),
            secret_key: secret_key.into(),
            session_token: None,
        });
        self
    }

    /// Also accept session credentials, which must send `x-amz-security-token`.
    pub fn with_session_credential(
        mut self,
        access_key: &str,
        secret_key: &str,
        session_token: &str,
    ) -> Self {
        self.credentials.push(Credential {
            access_key: access_key.into(),
            secret_key: secret_key.into(),
            session_token: Some(session_token.into()),
        });
        self
    }

    /// The Linux spot price of `instance_type` in `zone`.
    pub fn spot_price_in(&self, instance_type: &str, zone: &str) -> &str {
        let own =
            self.spot_prices.iter().find(|s| s.instance_type == instance_type && s.zone == zone);
        own.map_or(&self.spot_price, |s| &s.price)
    }

    pub(crate) fn region(&self, name: &str) -> Option<&RegionCatalog> {
        self.regions.iter().find(|r| r.name == name)
    }
}

/// A running EC2 emulator on 127.0.0.1. Stops (closing every connection) when dropped.
pub type Ec2Emulator = Served<State>;

impl Served<State> {
    /// Start on an OS-chosen port.
    ///
    /// The server runs on its own thread and runtime, so it works from sync and async tests
    /// alike and keeps answering while the test's runtime is blocked in a synchronous
    /// plugin call.
    ///
    /// # Panics
    /// When the config has no region or a region has no zone: every call needs both.
    pub fn start(config: Ec2Config) -> Ec2Emulator {
        assert!(!config.regions.is_empty(), "Ec2Config needs a region");
        assert!(config.regions.iter().all(|r| !r.zones.is_empty()), "every region needs a zone");
        let (listener, _) = crate::framework::bind(0).expect("bind 127.0.0.1:0");
        let state = Shared::new(State::new(Arc::new(config)));
        let app = Router::new().route("/", get(api_call).post(api_call)).route(
            "/_emulator/requests",
            get(|AxState(s): AxState<Shared<State>>| async move { Json(s.lock().requests()) }),
        );
        Served::serve("ec2-emulator", listener, state, app)
    }
}

impl Drop for State {
    /// Real-proxy mode: the proxies of this emulator's instances stop with it.
    fn drop(&mut self) {
        self.stop_all_proxies();
    }
}

/// The control surface on EC2's terms; see the module documentation.
impl Model for State {
    fn hold(&mut self, id: &str, hold: bool) -> bool {
        self.set_hold(id, hold, Instant::now())
    }

    fn set_state(&mut self, id: &str, state: &str) -> bool {
        if !self.instances.contains_key(id) {
            return false;
        }
        self.force_state(id, state, Instant::now());
        true
    }

    fn set_address(&mut self, id: &str, ip: Option<&str>) -> bool {
        match self.instances.get_mut(id) {
            Some(inst) => {
                inst.public_ip = ip.map(str::to_string);
                true
            }
            None => false,
        }
    }

    fn slow_delete(&mut self, id: &str) -> bool {
        if !self.instances.contains_key(id) {
            return false;
        }
        self.begin_terminate(id, Instant::now());
        if let Some(inst) = self.instances.get_mut(id)
            && inst.state == "shutting-down"
        {
            inst.slow_delete = true;
        }
        true
    }

    fn finish_deletes(&mut self) {
        let now = Instant::now();
        let slow: Vec<String> =
            self.instances.values().filter(|i| i.slow_delete).map(|i| i.id.clone()).collect();
        for id in slow {
            self.enter_terminated(&id, now);
        }
    }

    fn set_locked(&mut self, id: &str, locked: bool) -> bool {
        match self.instances.get_mut(id) {
            Some(inst) => {
                inst.locked = locked;
                true
            }
            None => false,
        }
    }

    /// A `running` instance tagged `Name` and with the marks asked for, in the plant's
    /// region (the first when empty or unknown), with a root volume deleted on
    /// termination.
    fn plant(&mut self, plant: &Plant) -> Result<String, Refusal> {
        let cfg = self.cfg.clone();
        let catalog = cfg.region(&plant.scope).unwrap_or_else(|| &cfg.regions[0]).clone();
        let mut tags = vec![("Name".to_string(), plant.name.clone())];
        tags.extend(crate::framework::marks(plant));
        let reservation = self.launch(
            LaunchSpec {
                region: catalog.name.clone(),
                zone: catalog.zones[0].clone(),
                image_id: catalog.images.first().cloned().unwrap_or_default(),
                instance_type: catalog.instance_types.first().cloned().unwrap_or_default(),
                count: 1,
                user_data: None,
                client_token: String::new(),
                subnet_id: None,
                security_groups: Vec::new(),
                instance_tags: tags,
                volume_tags: Vec::new(),
                disks: vec![DiskSpec {
                    device: cfg.root_device_name.clone(),
                    size: 8,
                    volume_type: "gp3".into(),
                    delete_on_termination: true,
                }],
                launch_time: plant.created_at.unwrap_or_else(unix_now),
                planted: true,
                spot: None,
            },
            Instant::now(),
        );
        Ok(self.reservations[&reservation].instance_ids[0].clone())
    }

    /// Faults keep their kind: the answer is chosen when one hits (server errors alternate).
    fn inject(&mut self, fault: Fault) {
        let effect = match fault.kind {
            FaultKind::Slow { delay_ms } => Effect::delay(Duration::from_millis(delay_ms)),
            kind => Effect::fail(kind),
        };
        self.traffic.faults.push(fault.op, effect, fault.count);
    }

    /// Every call signed for `scope` answers 503 `Unavailable`.
    fn fail_scope(&mut self, scope: &str, fail: bool) {
        if fail {
            self.failing_scopes.insert(scope.to_string());
        } else {
            self.failing_scopes.remove(scope);
        }
    }

    /// Instances not yet `terminated`, and every volume as a secondary resource.
    fn dump(&mut self) -> Dump {
        let instances = self
            .instances
            .values()
            .filter(|i| i.state != "terminated" && !i.expired)
            .map(|i| DumpInstance {
                id: i.id.clone(),
                name: i.tag("Name").unwrap_or("").to_string(),
                scope: i.region.clone(),
                state: i.state.clone(),
                ip: i.public_ip.clone().unwrap_or_default(),
                labels: i.tags.clone(),
                user_data: i.user_data.clone().unwrap_or_default(),
            })
            .collect();
        let secondary = self
            .volumes
            .values()
            .map(|v| DumpSecondary {
                kind: "volume".into(),
                id: v.id.clone(),
                attached_to: v.attachment.as_ref().map(|a| a.instance_id.clone()),
            })
            .collect();
        Dump { instances, secondary }
    }

    /// Forget everything but the configuration; the rate limit is configuration too, and
    /// stays with full buckets.
    fn reset(&mut self) {
        self.stop_all_proxies();
        let limit = self.traffic.limits.spec();
        *self = State::new(self.cfg.clone());
        self.traffic.limits.set(limit);
    }

    fn set_rate_limit(&mut self, limit: Option<RateLimit>) {
        self.traffic.limits.set(limit);
    }

    fn stats(&self) -> RequestStats {
        self.traffic.stats.clone()
    }

    /// The `Action` of every API call so far, in order (calls that failed authentication
    /// included, with `""` when there was no Action).
    fn requests(&self) -> Vec<String> {
        self.traffic.requests.clone()
    }

    /// `409` for an on-demand instance; see [`State::reclaim`](model::State::reclaim).
    fn reclaim(&mut self, id: &str) -> Result<bool, Refusal> {
        match State::reclaim(self, id, Instant::now()) {
            None => Ok(false),
            Some(Ok(())) => Ok(true),
            Some(Err(why)) => Err(Refusal::conflict(id, why)),
        }
    }

    fn set_spot_capacity(&mut self, available: bool) -> bool {
        self.spot_capacity = available;
        true
    }

    /// Spot instances the dump shows (not yet `terminated`).
    fn spot_instances(&mut self) -> Vec<String> {
        let spot = self.instances.values().filter(|i| i.spot.is_some());
        let shown = spot.filter(|i| i.state != "terminated" && !i.expired);
        shown.map(|i| i.id.clone()).collect()
    }
}

// ---------------------------------------------------------------------------------------
// HTTP

fn error_response(err: &ApiError, request_id: &str) -> Response {
    let body = xml::error_document(&err.code, &err.message, request_id);
    xml_response(
        StatusCode::from_u16(err.status).unwrap_or(StatusCode::BAD_REQUEST),
        body,
        request_id,
    )
}

fn xml_response(status: StatusCode, body: String, request_id: &str) -> Response {
    let mut resp = (status, body).into_response();
    let h = resp.headers_mut();
    h.insert(header::CONTENT_TYPE, HeaderValue::from_static("text/xml;charset=UTF-8"));
    h.insert(header::SERVER, HeaderValue::from_static("AmazonEC2"));
    if let Ok(v) = HeaderValue::from_str(request_id) {
        h.insert("x-amzn-requestid", v);
    }
    resp
}

/// Largest request body read; EC2's own limit for a Query request is far below this.
const MAX_BODY: usize = 1 << 20;

/// One API call: record it, verify the signature, apply scope failures and injected
/// faults, then run the action.
async fn api_call(AxState(shared): AxState<Shared<State>>, req: Request) -> Response {
    let (parts, body) = req.into_parts();
    let body = match axum::body::to_bytes(body, MAX_BODY).await {
        Ok(b) => b,
        Err(_) => return StatusCode::PAYLOAD_TOO_LARGE.into_response(),
    };
    let query = parts.uri.query().unwrap_or("");
    let is_form = parts
        .headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|ct| ct.starts_with("application/x-www-form-urlencoded"));
    let params = Params::parse(query, is_form.then_some(&body[..]));
    let action = params.get("Action").unwrap_or("").to_string();
    let headers: Vec<(String, String)> = parts
        .headers
        .iter()
        .map(|(k, v)| (k.as_str().to_string(), String::from_utf8_lossy(v.as_bytes()).into_owned()))
        .collect();

    let (request_id, verified, fault) = {
        let mut st = shared.lock();
        let call = if action.is_empty() { "(none)" } else { &action };
        let op = api::fault_op(&action, &params);
        st.traffic.record(action.clone(), op, call);
        let request_id = st.request_id();
        let cfg = st.cfg.clone();
        let known = |r: &str| cfg.region(r).is_some();
        let signed = sigv4::SignedRequest {
            method: parts.method.as_str(),
            path: parts.uri.path(),
            query,
            headers,
            body: &body,
        };
        let verified = sigv4::verify(
            &signed,
            &sigv4::Policy {
                credentials: &cfg.credentials,
                known_region: &known,
                service: "ec2",
                now: unix_now(),
                max_skew: cfg.max_clock_skew,
                mismatch: cfg.signature_mismatch,
            },
        );
        let verified = match verified {
            Ok(v) => v,
            Err(e) => {
                let err = ApiError::new(e.status, e.code, e.message);
                return error_response(&err, &request_id);
            }
        };
        if action.is_empty() {
            let err = ApiError::new(
                400,
                "MissingAction",
                "The request must contain the parameter Action",
            );
            return error_response(&err, &request_id);
        }
        if !api::ACTIONS.contains(&action.as_str()) {
            let err = ApiError::new(
                400,
                "InvalidAction",
                format!("The action {action} is not valid for this web service."),
            );
            return error_response(&err, &request_id);
        }
        let bucket = format!("{} {action}", verified.region);
        if st.traffic.limits.take(&bucket, Instant::now()).is_some() {
            st.traffic.stats.rate_limited += 1;
            let err = ApiError::new(503, "RequestLimitExceeded", "Request limit exceeded.");
            return error_response(&err, &request_id);
        }
        if st.failing_scopes.contains(&verified.region) {
            let err = ApiError::new(
                503,
                "Unavailable",
                "The service is unavailable. Please try again shortly.",
            );
            return error_response(&err, &request_id);
        }
        let fault = st.traffic.faults.take_counted(op);
        (request_id, verified, fault)
    };

    if let Some((Effect { delay, fail }, index)) = fault {
        tokio::time::sleep(delay).await;
        let err = match fail {
            None | Some(FaultKind::Slow { .. }) => None,
            Some(FaultKind::ServerError) if index % 2 == 0 => {
                Some(ApiError::new(500, "InternalError", "An internal error has occurred"))
            }
            Some(FaultKind::ServerError) => Some(ApiError::new(
                503,
                "Unavailable",
                "The server is overloaded and can't handle the request.",
            )),
            Some(FaultKind::Quota) => Some(api::instance_limit_exceeded(1, 0)),
            Some(FaultKind::RateLimit) => {
                shared.lock().traffic.stats.rate_limited += 1;
                Some(ApiError::new(503, "RequestLimitExceeded", "Request limit exceeded."))
            }
            Some(FaultKind::Auth) => {
                Some(ApiError::new(401, "AuthFailure", sigv4::AUTH_FAILURE_MESSAGE))
            }
        };
        if let Some(err) = err {
            return error_response(&err, &request_id);
        }
    }

    let mut st = shared.lock();
    let now = Instant::now();
    st.advance(now);
    match api::dispatch(&mut st, &action, &params, &verified.region, &request_id, now) {
        Ok(body) => xml_response(StatusCode::OK, body, &request_id),
        Err(err) => error_response(&err, &request_id),
    }
}
