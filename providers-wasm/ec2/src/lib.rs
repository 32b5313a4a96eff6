//! AWS EC2 provider plugin.
//!
//! Instances are plain EC2 instances, created with RunInstances in a configured region,
//! zone (subnet, security groups), instance type and AMI, and tagged with the operator's
//! marks in the same call. IDs are `<region>/<instance-id>`. Requests go to the EC2 Query
//! API (XML over form POSTs), signed with SigV4 in the guest with credentials read from
//! the provider's secrets on every call. The user guide is `docs/providers/ec2.md`.
//!
//! Spot (`placement.capacity` spot): a one-time Spot Instance that EC2 terminates when it
//! needs the capacity back (`InstanceMarketOptions`, see [`run_params`]). No spot capacity
//! is QuotaExceeded with code [`SPOT_CAPACITY_UNAVAILABLE`] (the operator may fall back to
//! on-demand); a reclaimed instance is Terminated and `interrupted` while it shuts down,
//! then NotFound with code [`INTERRUPTED`] (see [`Provider::get`]).

mod api;
mod config;
mod sigv4;
mod wire;

use api::{Ec2, Ec2Error, classify};
use config::{Config, IpAddress, Launch};
use egress_guest_sdk::id::IdFormat;
use egress_guest_sdk::outcome::{self, Outcomes};
use egress_guest_sdk::paging::{Bounds, Page};
use egress_guest_sdk::time::parse_rfc3339;
use egress_guest_sdk::{self as sdk, *};
use sha2::{Digest, Sha256};
use std::time::Duration;
use wire::Ec2Instance;

struct Ec2Provider;
export_provider!(Ec2Provider);

/// The behaviour profile (provider contract section 4); the guide explains each choice.
const PROFILE: &str = "readiness=provisioning-window create-return=submit \
    delete-return=returns-early ip-source=assigned-at-create gc-mark=native-labels \
    created-at=backend-timestamp list-partial=fail-whole quota=detected not-found=error-code \
    primary-key=allocated-id provisioning-state=native async-ops=backend-lock \
    secondary-resources=cascade credentials=mounted-files client-kind=thin-client \
    timeouts=per-call logging=tiered child-spans=transport-wrapper backend-test=integration-tag";
/// The request budget a provider gets when its entry sets none (requests per hour, burst):
/// EC2's request-rate bucket for non-mutating actions (`Describe*`, every get and list here):
/// 20 tokens a second up to 100, per account and Region.
const BUDGET: (u32, u32) = (72_000, 100);

/// Regions whose public EC2 endpoint is allowed by default. `info` cannot see the config,
/// and the host's wildcard (`*.amazonaws.com`) would also admit every S3 bucket name, a
/// ready exfiltration channel; so the default is the exact endpoint of every region that
/// exists today. A newer region, or a custom endpoint, goes into `additionalHosts`.
const DEFAULT_REGIONS: &[&str] = &[
    "af-south-1",
    "ap-east-1",
    "ap-east-2",
    "ap-northeast-1",
    "ap-northeast-2",
    "ap-northeast-3",
    "ap-south-1",
    "ap-south-2",
    "ap-southeast-1",
    "ap-southeast-2",
    "ap-southeast-3",
    "ap-southeast-4",
    "ap-southeast-5",
    "ap-southeast-7",
    "ca-central-1",
    "ca-west-1",
    "cn-north-1",
    "cn-northwest-1",
    "eu-central-1",
    "eu-central-2",
    "eu-north-1",
    "eu-south-1",
    "eu-south-2",
    "eu-west-1",
    "eu-west-2",
    "eu-west-3",
    "il-central-1",
    "me-central-1",
    "me-south-1",
    "mx-central-1",
    "sa-east-1",
    "us-east-1",
    "us-east-2",
    "us-gov-east-1",
    "us-gov-west-1",
    "us-west-1",
    "us-west-2",
];

/// EC2 refuses user data above 16 KiB (before base64); refusing it here names the cause.
const MAX_USER_DATA: usize = 16 * 1024;

/// How many earlier generations of one name a create walks past (see [`run_instance`]).
const MAX_TOKEN_CHAIN: usize = 16;

/// Waits between DescribeInstances calls until a new instance is visible: about 9 s in
/// all, well inside the host's per-call budget, and long enough for EC2's usual lag.
const VISIBILITY_BACKOFF_MS: &[u64] = &[0, 200, 400, 800, 1600, 2000, 2000, 2000];

/// Instance states `list-by-tag` returns: everything but `terminated` (gone for good).
const LISTED_STATES: &[&str] = &["pending", "running", "stopping", "stopped", "shutting-down"];

/// Instance states that hold a name for adoption; a dying instance is never adopted.
const LIVE_STATES: &[&str] = &["pending", "running", "stopping", "stopped"];

/// The codes the operator acts on: no spot capacity (fall back to on-demand), and a
/// reclaimed instance the backend has removed.
use egress_guest_sdk::error::code::{INTERRUPTED, SPOT_CAPACITY_UNAVAILABLE};
/// EC2's answers to a spot launch it cannot serve now: no capacity
/// (`InsufficientInstanceCapacity`), a price under the spot price (`SpotMaxPriceTooLow`,
/// never from this plugin, which sets no `MaxPrice`), the account's spot limit
/// (`MaxSpotInstanceCountExceeded`). Each passes, or is capacity on-demand may still have.
const SPOT_CAPACITY_CODES: &[&str] = &[
    "InsufficientInstanceCapacity",
    "SpotMaxPriceTooLow",
    "MaxSpotInstanceCountExceeded",
];

/// Largest page DescribeInstances serves, and a bound on pages so a misbehaving endpoint
/// cannot keep a call looping.
const PAGE_SIZE: &str = "1000";
const PAGES: Bounds = Bounds {
    what: "EC2 DescribeInstances",
    max_pages: 100,
    max_items: 100 * 1000,
};
/// A spot price history filtered to one instance type, zone and product holds a few entries
/// from the start time on; EC2 may still hand them out over pages, some empty. More pages
/// than this is an endpoint that loops.
const SPOT_PAGES: usize = 20;

fn load_config() -> Result<Config, ProviderError> {
    Config::parse(&sdk::config())
}

fn client(cfg: &Config, region: &str, creds: sigv4::Credentials) -> Result<Ec2, ProviderError> {
    let r = cfg.region(region)?;
    let endpoint = r
        .endpoint(region)
        .map_err(|why| ProviderError::permanent(format!("endpoint of {region}: {why}")))?;
    Ok(Ec2::new(region, endpoint, creds))
}

/// `<region>/<instance-id>`, parsed strictly: a malformed ID is permanent.
const ID: IdFormat = IdFormat {
    shape: "<region>/i-<hex>, e.g. eu-west-1/i-0123456789abcdef0",
    scope: config::valid_region,
    key: |k| config::valid_id(k, "i"),
};

fn parse_id(id: &str) -> Result<(&str, &str), ProviderError> {
    ID.parse(id)
}

/// EC2's state names onto the operator's four states.
fn map_state(state: &str, has_ip: bool) -> State {
    match state {
        "pending" => State::Provisioning,
        "running" if has_ip => State::Running,
        // Never running without an address: the IP goes straight to clients and probes.
        "running" => State::Provisioning,
        "shutting-down" | "terminated" => State::Terminated,
        // stopping, stopped, and anything EC2 may add: the operator replaces it.
        _ => State::Stopped,
    }
}

fn to_instance(region: &str, inst: &Ec2Instance, mode: IpAddress) -> Instance {
    let ip = match mode {
        IpAddress::Public => inst.public_ip.clone(),
        IpAddress::Private => inst.private_ip.clone(),
    }
    .unwrap_or_default();
    let state = map_state(&inst.state, !ip.is_empty());
    Instance {
        id: ID.format(region, &inst.id),
        // The contract allows it with stopped or terminated only; the state reason stays
        // on an instance that a user restarts, which must not count as interrupted.
        interrupted: inst.interrupted() && matches!(state, State::Stopped | State::Terminated),
        state,
        ip,
        uid: inst.tag(MARK_UID).unwrap_or_default().to_string(),
        // EC2's launchTime; the plugin never restarts a stopped instance, so it is the
        // creation time.
        created_at: parse_rfc3339(&inst.launch_time),
        ..Instance::empty()
    }
}

/// DescribeInstance filters as Query parameters: `Filter.N.Name`, `Filter.N.Value.M`.
fn filters(list: &[(&str, &[&str])]) -> Vec<(String, String)> {
    let mut out = Vec::new();
    for (n, (name, values)) in list.iter().enumerate() {
        out.push((format!("Filter.{}.Name", n + 1), name.to_string()));
        for (m, v) in values.iter().enumerate() {
            out.push((format!("Filter.{}.Value.{}", n + 1, m + 1), v.to_string()));
        }
    }
    out
}

/// Every instance matching `params` (filters), following `nextToken`, each passed
/// through `keep` as its page arrives.
fn describe_all<T>(
    ec2: &Ec2,
    params: &[(String, String)],
    keep: impl FnMut(Ec2Instance) -> Option<T>,
) -> Result<Vec<T>, ProviderError> {
    let fetch = |token: &String| {
        let mut p = params.to_vec();
        p.push(("MaxResults".into(), PAGE_SIZE.into()));
        if !token.is_empty() {
            p.push(("NextToken".into(), token.clone()));
        }
        let page = ec2
            .instances("DescribeInstances", &p)
            .map_err(|e| classify(&e))?;
        Ok(Page {
            items: page.instances,
            next: page.next_token,
        })
    };
    PAGES.collect(String::new(), fetch, keep)
}

/// One instance by ID: `None` when EC2 answered without it.
fn describe_one(ec2: &Ec2, iid: &str) -> Result<Option<Ec2Instance>, Ec2Error> {
    let page = ec2.instances("DescribeInstances", &[("InstanceId.1".into(), iid.into())])?;
    Ok(page.instances.into_iter().find(|i| i.id == iid))
}

/// The live instance already called `name`, if it is ours; someone else's is permanent.
/// Among several of ours (only possible where client tokens are ignored), the oldest wins,
/// so every caller picks the same one.
fn find_by_name(ec2: &Ec2, name: &str, uid: &str) -> Result<Option<String>, ProviderError> {
    let params = filters(&[("tag:Name", &[name]), ("instance-state-name", LIVE_STATES)]);
    // Filtered again here: an endpoint that ignored a filter must not make us adopt.
    let mut named = describe_all(ec2, &params, |i| {
        (i.tag("Name") == Some(name) && !i.is_dead()).then_some(i)
    })?;
    named.sort_by(|a, b| (&a.launch_time, &a.id).cmp(&(&b.launch_time, &b.id)));
    if let Some(mine) = named.iter().find(|i| i.tag(MARK_UID) == Some(uid)) {
        return Ok(Some(mine.id.clone()));
    }
    match named.first() {
        None => Ok(None),
        Some(other) => Err(ProviderError::name_taken(
            name,
            &format!("instance {} in {}", other.id, ec2.region),
            other.tag(MARK_UID).unwrap_or_default(),
            uid,
        )),
    }
}

/// The RunInstances parameters of a request, without the client token.
fn run_params(
    req: &CreateRequest,
    launch: &Launch,
    tags: &std::collections::BTreeMap<String, String>,
) -> Vec<(String, String)> {
    let p = |k: &str, v: &str| (k.to_string(), v.to_string());
    let mut params = vec![
        p("ImageId", &launch.image_id),
        p("InstanceType", &launch.instance_type),
        p("MinCount", "1"),
        p("MaxCount", "1"),
        p("Placement.AvailabilityZone", &launch.zone),
        // The root volume goes with the instance; EC2 would otherwise take the AMI's
        // default, and a volume that outlives its instance is invisible to GC.
        p("BlockDeviceMapping.1.DeviceName", &launch.root_device_name),
        p("BlockDeviceMapping.1.Ebs.DeleteOnTermination", "true"),
    ];
    if let Some(subnet) = &launch.subnet_id {
        params.push(p("SubnetId", subnet));
    }
    if req.placement.capacity == Capacity::Spot {
        // A one-time request that ends with the instance: EC2 terminates it when it takes
        // the capacity back (a stopped or persistent one would come back by itself, which
        // the operator, replacing what stops, does not want). No MaxPrice: the spot price,
        // capped at on-demand, as AWS recommends.
        params.push(p("InstanceMarketOptions.MarketType", "spot"));
        params.push(p(
            "InstanceMarketOptions.SpotOptions.SpotInstanceType",
            "one-time",
        ));
        params.push(p(
            "InstanceMarketOptions.SpotOptions.InstanceInterruptionBehavior",
            "terminate",
        ));
    }
    for (n, g) in launch.security_group_ids.iter().enumerate() {
        params.push(p(&format!("SecurityGroupId.{}", n + 1), g));
    }
    if !req.cloud_init.is_empty() {
        // Byte for byte: base64 of exactly what the operator resolved.
        params.push(p(
            "UserData",
            &data_encoding::BASE64.encode(&req.cloud_init),
        ));
    }
    let mut all_tags: Vec<(&str, &str)> = vec![
        ("Name", &req.name),
        (MARK_MANAGED, MARK_MANAGED_YES),
        (MARK_UID, &req.uid),
        (MARK_INSTALLATION, &req.installation),
    ];
    all_tags.extend(tags.iter().map(|(k, v)| (k.as_str(), v.as_str())));
    // The same marks on the instance and its volume, in the call that creates both.
    for (n, kind) in ["instance", "volume"].iter().enumerate() {
        let spec = format!("TagSpecification.{}", n + 1);
        params.push(p(&format!("{spec}.ResourceType"), kind));
        for (m, (k, v)) in all_tags.iter().enumerate() {
            params.push(p(&format!("{spec}.Tag.{}.Key", m + 1), k));
            params.push(p(&format!("{spec}.Tag.{}.Value", m + 1), v));
        }
    }
    params
}

/// A ClientToken that is the same for every attempt to create this instance, and
/// different for the next instance of the same name.
///
/// EC2 remembers a token for at least 24 hours after the instance it launched has been
/// terminated, and answers a reuse with that dead instance (or IdempotentParameterMismatch
/// when the parameters differ). A Proxy's replacement keeps its name, so the token covers
/// the parameters (a changed spec gets a fresh token) and every dead instance this token
/// chain already produced (a same-spec recreate after a delete walks on to a fresh token).
/// Concurrent creates walk the same chain and so meet at the same instance.
fn client_token(name: &str, params: &[(String, String)], dead: &[String]) -> String {
    let mut h = Sha256::new();
    h.update(b"egress-ec2-client-token/1\n");
    h.update(api::form_body("RunInstances", params).as_bytes());
    for id in dead {
        h.update(b"\n");
        h.update(id.as_bytes());
    }
    let digest = sigv4::hex(&h.finalize());
    let readable = name.len() + 33 <= 64 && name.bytes().all(|b| b.is_ascii_graphic());
    if readable {
        format!("{name}-{}", &digest[..32])
    } else {
        digest[..64].to_string()
    }
}

/// How a failed RunInstances of `req` is reported: for a spot request that EC2 has no
/// spot capacity for, QuotaExceeded with [`SPOT_CAPACITY_UNAVAILABLE`], naming EC2's code;
/// otherwise by [`classify`].
fn launch_error(req: &CreateRequest, e: &Ec2Error) -> ProviderError {
    let spot = req.placement.capacity == Capacity::Spot;
    match e.code() {
        Some(code) if spot && SPOT_CAPACITY_CODES.contains(&code) => ProviderError::quota(format!(
            "placement.capacity Spot: EC2 has no spot capacity for it now ({code}): {e}"
        ))
        .with_code(SPOT_CAPACITY_UNAVAILABLE),
        _ => classify(e),
    }
}

/// RunInstances with the token chain of [`client_token`]; returns a live instance ID.
fn run_instance(
    ec2: &Ec2,
    req: &CreateRequest,
    params: &[(String, String)],
) -> Result<String, ProviderError> {
    let mut dead: Vec<String> = Vec::new();
    for _ in 0..MAX_TOKEN_CHAIN {
        let mut p = params.to_vec();
        p.push(("ClientToken".into(), client_token(&req.name, params, &dead)));
        let page = ec2
            .instances("RunInstances", &p)
            .map_err(|e| launch_error(req, &e))?;
        let Some(inst) = page.instances.into_iter().next() else {
            return Err(ProviderError::transient(format!(
                "EC2 RunInstances in {} answered without an instance",
                ec2.region
            ))
            .with_code("EmptyAnswer"));
        };
        if !inst.is_dead() {
            return Ok(inst.id);
        }
        info!(
            "client token of {} launched {} earlier, now {}; moving on to the next token",
            req.name, inst.id, inst.state
        );
        dead.push(inst.id);
    }
    Err(ProviderError::transient(format!(
        "{} was recreated with the same spec more than {MAX_TOKEN_CHAIN} times within EC2's \
         client-token window (24 hours after termination); retrying later",
        req.name
    ))
    .with_code("ClientTokenChainExhausted"))
}

/// Read-after-write: `get` must never answer not-found for an ID `create` returned, and
/// DescribeInstances can lag RunInstances. An instance still invisible after the wait is a
/// transient error; the retry finds the same instance again through its client token.
fn wait_visible(ec2: &Ec2, iid: &str) -> Result<(), ProviderError> {
    for delay in VISIBILITY_BACKOFF_MS {
        std::thread::sleep(Duration::from_millis(*delay));
        match describe_one(ec2, iid) {
            Ok(Some(_)) => return Ok(()),
            Ok(None) => {}
            Err(e) if e.code() == Some("InvalidInstanceID.NotFound") => {}
            Err(e) => return Err(classify(&e)),
        }
        debug!("{iid} in {} not visible yet", ec2.region);
    }
    let waited: u64 = VISIBILITY_BACKOFF_MS.iter().sum();
    Err(ProviderError::transient(format!(
        "instance {iid} in {} was launched but DescribeInstances does not show it after {} ms",
        ec2.region, waited
    ))
    .with_code("NotYetVisible"))
}

/// The spot price of a spot placement now, in millionths of a US dollar an hour: checked as
/// a create checks it, then DescribeSpotPriceHistory for its instance type in its zone,
/// `Linux/UNIX`, from now on. EC2 answers with "the last price change before the start
/// time, which is the effective price as of the start time" (the API reference); the latest
/// entry wins. `None` when EC2 has no spot price for them.
fn spot_quote(p: &Placement) -> Result<(Option<Price>, String), ProviderError> {
    let cfg = load_config()?;
    let launch = config::resolve(&cfg, p)?;
    let ec2 = Ec2::new(&launch.region, launch.endpoint.clone(), api::credentials()?);
    let (kind, zone) = (&launch.instance_type, &launch.zone);
    let now = Datetime {
        seconds: sdk::time::now().seconds,
        nanoseconds: 0,
    };
    let p = |k: &str, v: &str| (k.to_string(), v.to_string());
    let mut params = vec![
        p("InstanceType.1", kind),
        p("ProductDescription.1", "Linux/UNIX"),
        p("AvailabilityZone", zone),
        p("StartTime", &sdk::time::format_rfc3339(now)),
    ];
    // The latest price over every page; a `nextToken` that never ends fails the quote.
    let mut latest = None;
    for _ in 0..SPOT_PAGES {
        let body = ec2
            .call("DescribeSpotPriceHistory", &params)
            .map_err(|e| classify(&e))?;
        let (found, next) = wire::latest_spot_price(&body, kind, zone)
            .map_err(|what| classify(&ec2.unexpected("DescribeSpotPriceHistory", what)))?;
        latest = latest.max(found);
        let Some(next) = next else {
            let Some((_, text)) = latest else {
                return Ok((None, format!("spot {kind} in {zone}: no spot price")));
            };
            let micros = egress_guest_sdk::money::micros_from_decimal(&text).ok_or_else(|| {
                let msg =
                    format!("EC2 spotPrice {text:?} of {kind} in {zone} is not a decimal amount");
                ProviderError::transient(msg).with_code("BadSpotPrice")
            })?;
            let what = format!("spot {kind} in {zone}: {micros} micro-USD an hour");
            let currency = "USD".into();
            return Ok((
                Some(Price {
                    currency,
                    micros_per_hour: micros,
                }),
                what,
            ));
        };
        params.truncate(4);
        params.push(p("NextToken", &next));
    }
    let msg = format!(
        "EC2 DescribeSpotPriceHistory in {} is longer than {SPOT_PAGES} pages",
        ec2.region
    );
    Err(ProviderError::transient(msg).with_code("BadPagination"))
}

/// The allow-list entry of an endpoint, with the port spelled out as the host prints it.
fn allow_entry(endpoint: &config::Endpoint) -> String {
    let https = endpoint.base.starts_with("https://");
    let has_port = endpoint
        .authority
        .rsplit_once(':')
        .is_some_and(|(_, p)| p.bytes().all(|b| b.is_ascii_digit()));
    let scheme = if https { "https" } else { "http" };
    if has_port {
        format!("{scheme}://{}", endpoint.authority)
    } else {
        let port = if https { 443 } else { 80 };
        format!("{scheme}://{}:{port}", endpoint.authority)
    }
}

fn default_hosts() -> Vec<String> {
    DEFAULT_REGIONS
        .iter()
        .map(|r| allow_entry(&config::default_endpoint(r)))
        .collect()
}

impl Provider for Ec2Provider {
    /// Info per create and delete (the user's actions), debug per get and list (polled):
    /// the `tiered` logging of the profile. Never the request (cloud-init) or credentials.
    const OUTCOMES: Outcomes = Outcomes {
        plugin: "ec2",
        changes: Level::Info,
        reads: Level::Debug,
    };
    /// One-time Spot Instances, terminated on interruption (see [`run_params`]).
    const SPOT: bool = true;

    fn info() -> PluginInfo {
        PluginInfo {
            has_check: true,
            default_hosts: default_hosts(),
            ..PluginInfo::new("ec2", env!("CARGO_PKG_VERSION"))
                .with_profile(PROFILE)
                .with_budget(BUDGET.0, BUDGET.1)
        }
    }

    fn validate_config(json: &str) -> Result<(), ProviderError> {
        let cfg = Config::parse(json)?;
        // Not an error: the operator's allow-list may already name it. But a request to
        // an endpoint that is not allowed fails only at the first call, so say it now.
        let defaults = default_hosts();
        for (name, region) in &cfg.regions {
            if let Ok(ep) = region.endpoint(name) {
                let entry = allow_entry(&ep);
                if !defaults.contains(&entry) {
                    warn!(
                        "region {name}: endpoint {entry} is not among the plugin's default hosts; \
                         calls to it are refused unless the provider's allowedHosts or \
                         additionalHosts lists it"
                    );
                }
            }
        }
        Ok(())
    }

    fn create(req: CreateRequest) -> Result<String, ProviderError> {
        outcome::run(|| {
            let cfg = load_config()?;
            let launch = config::resolve(&cfg, &req.placement)?;
            if req.cloud_init.len() > MAX_USER_DATA {
                let (len, max) = (req.cloud_init.len(), MAX_USER_DATA);
                return Err(ProviderError::user_data_too_large(
                    len,
                    max,
                    " (EC2's limit)",
                ));
            }
            let ec2 = Ec2::new(&launch.region, launch.endpoint.clone(), api::credentials()?);
            if let Some(iid) = find_by_name(&ec2, &req.name, &req.uid)? {
                let id = ID.format(&launch.region, &iid);
                return Ok((id.clone(), format!("adopted {id}")));
            }
            let params = run_params(&req, &launch, &cfg.tags);
            let iid = run_instance(&ec2, &req, &params)?;
            wait_visible(&ec2, &iid)?;
            let id = ID.format(&launch.region, &iid);
            let spot = match req.placement.capacity {
                Capacity::Spot => "spot ",
                Capacity::OnDemand => "",
            };
            let what = format!(
                "created {id} ({spot}{} {} in {}, {} bytes of user data)",
                launch.instance_type,
                launch.image_id,
                launch.zone,
                req.cloud_init.len()
            );
            Ok((id, what))
        })
    }

    /// A terminated instance is gone for the operator (EC2 lists it for up to an hour,
    /// and waiting for that would hold the replacement back): NotFound, with code
    /// [`INTERRUPTED`] when EC2 terminated it to take its spot capacity back, so the
    /// interruption is told apart from a delete. While it shuts down it is Terminated
    /// and `interrupted`.
    fn get(id: &str) -> Result<Instance, ProviderError> {
        outcome::run(|| {
            let (region, iid) = parse_id(id)?;
            let cfg = load_config()?;
            let ec2 = client(&cfg, region, api::credentials()?)?;
            match describe_one(&ec2, iid) {
                Ok(Some(inst)) if inst.state == "terminated" && inst.interrupted() => {
                    let msg = format!(
                        "instance {iid} in {region} was interrupted: EC2 terminated the Spot \
                         Instance to take its capacity back ({})",
                        inst.state_reason
                    );
                    Err(ProviderError::not_found(msg).with_code(INTERRUPTED))
                }
                Ok(Some(inst)) if inst.state == "terminated" => {
                    let msg = format!("instance {iid} in {region} is terminated");
                    Err(ProviderError::not_found(msg).with_code("Terminated"))
                }
                Ok(Some(inst)) => Ok(to_instance(region, &inst, cfg.ip_address)),
                Ok(None) => {
                    let msg = format!("EC2 DescribeInstances in {region} answered without {iid}");
                    Err(ProviderError::not_found(msg).with_code("EmptyAnswer"))
                }
                Err(e) => Err(classify(&e)),
            }
        })
    }

    fn delete(id: &str) -> Result<(), ProviderError> {
        outcome::run(|| {
            let (region, iid) = parse_id(id)?;
            let cfg = load_config()?;
            let ec2 = client(&cfg, region, api::credentials()?)?;
            // Terminating a shutting-down or terminated instance succeeds in EC2, so
            // repeated deletes during the shutdown are one cheap call each.
            match ec2.call("TerminateInstances", &[("InstanceId.1".into(), iid.into())]) {
                Ok(_) => Ok(((), "terminating".to_string())),
                Err(e) if e.code() == Some("InvalidInstanceID.NotFound") => {
                    Ok(((), "already gone".to_string()))
                }
                Err(e) => Err(classify(&e)),
            }
        })
    }

    fn list_by_tag(installation: &str) -> Result<Vec<Instance>, ProviderError> {
        outcome::run(|| {
            let cfg = load_config()?;
            let creds = api::credentials()?;
            let params = filters(&[
                (&format!("tag:{MARK_MANAGED}"), &[MARK_MANAGED_YES]),
                (&format!("tag:{MARK_INSTALLATION}"), &[installation]),
                ("instance-state-name", LISTED_STATES),
            ]);
            let mut out = Vec::new();
            // Fail-whole: a region that cannot be listed fails the list, so GC skips this
            // sweep rather than act on a partial picture.
            for region in cfg.regions.keys() {
                let ec2 = client(&cfg, region, creds.clone())?;
                // Filtered again here: an endpoint that ignored a filter must not hand GC
                // another installation's (or an unmanaged) instance.
                let mine = |i: Ec2Instance| {
                    let ours = i.tag(MARK_MANAGED) == Some(MARK_MANAGED_YES)
                        && i.tag(MARK_INSTALLATION) == Some(installation)
                        && i.state != "terminated";
                    ours.then(|| to_instance(region, &i, cfg.ip_address))
                };
                out.extend(describe_all(&ec2, &params, mine)?);
            }
            Ok(out)
        })
    }

    /// On-demand: `None`, without a call. EC2 publishes on-demand prices only through the
    /// Price List API (another endpoint, another IAM permission), so the providers file's
    /// `prices` carry them. Spot: [`spot_quote`].
    fn quote(placement: Placement) -> Result<Option<Price>, ProviderError> {
        outcome::run(|| match placement.capacity {
            Capacity::Spot => spot_quote(&placement),
            Capacity::OnDemand => Ok((None, "on-demand: no price list EC2 serves".into())),
        })
    }

    fn check() -> Vec<TargetStatus> {
        let cfg = match load_config() {
            Ok(cfg) => cfg,
            Err(e) => return vec![TargetStatus::invalid_config(e)],
        };
        let creds = api::credentials();
        let params = {
            let mut p = filters(&[(&format!("tag:{MARK_MANAGED}"), &[MARK_MANAGED_YES])]);
            p.push(("MaxResults".into(), "5".into()));
            p
        };
        cfg.regions
            .keys()
            .map(|region| {
                let creds = match &creds {
                    Ok(c) => c.clone(),
                    Err(e) => return TargetStatus::failed(region, "Unauthorized", &e.message),
                };
                let ec2 = match client(&cfg, region, creds) {
                    Ok(ec2) => ec2,
                    Err(e) => {
                        return TargetStatus::failed(
                            region,
                            egress_guest_sdk::error::code::INVALID_CONFIG,
                            &e.message,
                        );
                    }
                };
                // The verb and scope list-by-tag uses, one small page.
                match ec2.instances("DescribeInstances", &params) {
                    Ok(page) => {
                        let seen = page.instances.len().to_string()
                            + if page.next_token.is_some() { "+" } else { "" };
                        TargetStatus::ready(
                            region,
                            vec![
                                ("endpoint".into(), ec2.endpoint.authority.clone()),
                                ("managedInstances".into(), seen),
                            ],
                        )
                    }
                    Err(e) => TargetStatus::failed(region, e.reason(), e.to_string()),
                }
            })
            .collect()
    }
}

#[cfg(test)]
mod tests;
