//! The EC2 Query API actions: parameter parsing, validation with EC2's error codes, and the
//! XML answers.

use super::SPOT_PRICES_SINCE;
use super::model::{
    DiskSpec, Instance, LaunchSpec, State, TokenRecord, Volume, iso_time, state_code, unix_now,
    valid_id,
};
use super::sigv4::percent_decode;
use super::xml::Xml;
use crate::control::FaultOp;
use data_encoding::BASE64;
use std::collections::{BTreeMap, BTreeSet};
use std::time::Instant;

/// An EC2 error answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ApiError {
    pub status: u16,
    pub code: String,
    pub message: String,
}

impl ApiError {
    pub(crate) fn new(status: u16, code: &str, message: impl Into<String>) -> Self {
        ApiError { status, code: code.to_string(), message: message.into() }
    }

    fn bad(code: &str, message: impl Into<String>) -> Self {
        ApiError::new(400, code, message)
    }

    fn invalid_value(message: impl Into<String>) -> Self {
        ApiError::bad("InvalidParameterValue", message)
    }

    fn missing(param: &str) -> Self {
        ApiError::bad("MissingParameter", format!("The request must contain the parameter {param}"))
    }
}

type ApiResult = Result<String, ApiError>;

/// The actions the emulator implements.
pub(crate) const ACTIONS: &[&str] = &[
    "RunInstances",
    "DescribeInstances",
    "TerminateInstances",
    "DescribeVolumes",
    "DescribeInstanceAttribute",
    "DescribeAvailabilityZones",
    "DescribeRegions",
    "DescribeSpotPriceHistory",
];

/// Query parameters, from the query string and a form body together.
#[derive(Debug, Default, Clone)]
pub(crate) struct Params {
    map: BTreeMap<String, String>,
}

impl Params {
    pub(crate) fn parse(query: &str, form_body: Option<&[u8]>) -> Params {
        let mut map = BTreeMap::new();
        let body = form_body.map(String::from_utf8_lossy);
        for source in [Some(query), body.as_deref()].into_iter().flatten() {
            for pair in source.split('&').filter(|p| !p.is_empty()) {
                let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
                map.insert(percent_decode(k, true), percent_decode(v, true));
            }
        }
        Params { map }
    }

    pub(crate) fn get(&self, key: &str) -> Option<&str> {
        self.map.get(key).map(String::as_str)
    }

    /// `Prefix.1`, `Prefix.2`, ... in index order.
    fn list(&self, prefix: &str) -> Vec<String> {
        let mut items: Vec<(u32, String)> = self
            .map
            .iter()
            .filter_map(|(k, v)| {
                let n = k.strip_prefix(prefix)?.strip_prefix('.')?.parse().ok()?;
                Some((n, v.clone()))
            })
            .collect();
        items.sort_by_key(|(n, _)| *n);
        items.into_iter().map(|(_, v)| v).collect()
    }

    /// `Prefix.N.Rest=v` as one [`Params`] per N holding `Rest=v`, in index order.
    fn groups(&self, prefix: &str) -> Vec<(u32, Params)> {
        let mut groups: BTreeMap<u32, Params> = BTreeMap::new();
        for (k, v) in &self.map {
            let Some(rest) = k.strip_prefix(prefix).and_then(|r| r.strip_prefix('.')) else {
                continue;
            };
            let Some((n, sub)) = rest.split_once('.') else {
                continue;
            };
            let Ok(n) = n.parse() else {
                continue;
            };
            groups.entry(n).or_default().map.insert(sub.to_string(), v.clone());
        }
        groups.into_iter().collect()
    }

    fn bool(&self, key: &str) -> Result<Option<bool>, ApiError> {
        match self.get(key) {
            None => Ok(None),
            Some(v) if v.eq_ignore_ascii_case("true") => Ok(Some(true)),
            Some(v) if v.eq_ignore_ascii_case("false") => Ok(Some(false)),
            Some(v) => Err(ApiError::invalid_value(format!(
                "Value ({v}) for parameter {key} is invalid. Expected a boolean."
            ))),
        }
    }

    fn dry_run(&self) -> Result<(), ApiError> {
        if self.bool("DryRun")? == Some(true) {
            return Err(ApiError::new(
                412,
                "DryRunOperation",
                "Request would have succeeded, but DryRun flag is set.",
            ));
        }
        Ok(())
    }
}

/// Which provider operation a call serves, for faults aimed at one operation.
pub(crate) fn fault_op(action: &str, params: &Params) -> Option<FaultOp> {
    match action {
        "RunInstances" => Some(FaultOp::Create),
        "TerminateInstances" => Some(FaultOp::Delete),
        "DescribeInstances" if !params.list("InstanceId").is_empty() => Some(FaultOp::Get),
        "DescribeInstances" | "DescribeVolumes" => Some(FaultOp::List),
        "DescribeInstanceAttribute" => Some(FaultOp::Get),
        _ => None,
    }
}

/// Run one action for a caller signed for `region`.
pub(crate) fn dispatch(
    st: &mut State,
    action: &str,
    params: &Params,
    region: &str,
    request_id: &str,
    now: Instant,
) -> ApiResult {
    match action {
        "RunInstances" => run_instances(st, params, region, request_id, now),
        "DescribeInstances" => describe_instances(st, params, region, request_id, now),
        "TerminateInstances" => terminate_instances(st, params, region, request_id, now),
        "DescribeVolumes" => describe_volumes(st, params, region, request_id),
        "DescribeInstanceAttribute" => {
            describe_instance_attribute(st, params, region, request_id, now)
        }
        "DescribeAvailabilityZones" => describe_zones(st, params, region, request_id),
        "DescribeRegions" => describe_regions(st, params, request_id),
        "DescribeSpotPriceHistory" => describe_spot_price_history(st, params, region, request_id),
        other => Err(ApiError::bad(
            "InvalidAction",
            format!("The action {other} is not valid for this web service."),
        )),
    }
}

// ---------------------------------------------------------------------------------------
// RunInstances

const MAX_USER_DATA: usize = 16 * 1024;

fn run_instances(
    st: &mut State,
    p: &Params,
    region: &str,
    request_id: &str,
    now: Instant,
) -> ApiResult {
    let token = p.get("ClientToken").unwrap_or("").to_string();
    if token.len() > 64 {
        return Err(ApiError::invalid_value(format!(
            "Value ({token}) for parameter clientToken is invalid. Length exceeds maximum \
             of 64 characters."
        )));
    }
    // A retry with the same token answers with the original launch, before anything else
    // is checked: the catalogue may have changed since, the launch has not.
    if !token.is_empty()
        && let Some(rec) = st.tokens.get(&(region.to_string(), token.clone()))
    {
        if rec.fingerprint != fingerprint(p) {
            return Err(ApiError::bad(
                "IdempotentParameterMismatch",
                "Arguments on this idempotent request are inconsistent with arguments used \
                 in previous request(s).",
            ));
        }
        p.dry_run()?;
        let reservation_id = rec.reservation_id.clone();
        return Ok(render_run(st, &reservation_id, request_id));
    }

    let cfg = st.cfg.clone();
    let catalog = cfg.region(region).expect("verified regions are in the catalogue");

    let image = p.get("ImageId").ok_or_else(|| ApiError::missing("ImageId"))?;
    if !valid_id(image, "ami") {
        return Err(ApiError::bad(
            "InvalidAMIID.Malformed",
            format!("Invalid id: \"{image}\" (expecting \"ami-...\")"),
        ));
    }
    if !catalog.images.iter().any(|i| i == image) {
        return Err(ApiError::bad(
            "InvalidAMIID.NotFound",
            format!("The image id '[{image}]' does not exist"),
        ));
    }
    let min = count(p, "MinCount")?;
    let max = count(p, "MaxCount")?;
    if max < min {
        return Err(ApiError::invalid_value(format!(
            "Value ({max}) for parameter maxCount is invalid. Must be greater than or equal \
             to minCount ({min})."
        )));
    }
    // EC2's default instance type when none is given.
    let instance_type = p.get("InstanceType").unwrap_or("m1.small");
    if !catalog.instance_types.iter().any(|t| t == instance_type) {
        return Err(ApiError::invalid_value(format!(
            "Invalid value '{instance_type}' for InstanceType."
        )));
    }
    let zone = match p.get("Placement.AvailabilityZone") {
        Some(z) if !catalog.zones.iter().any(|k| k == z) => {
            return Err(ApiError::invalid_value(format!("Invalid availability zone: [{z}]")));
        }
        Some(z) => z.to_string(),
        None => catalog.zones[0].clone(),
    };
    let user_data = match p.get("UserData") {
        None => None,
        Some(b64) => {
            let raw = BASE64
                .decode(b64.trim().as_bytes())
                .map_err(|_| ApiError::invalid_value("Invalid BASE64 encoding of user data."))?;
            if raw.len() > MAX_USER_DATA {
                return Err(ApiError::invalid_value(format!(
                    "User data is limited to {MAX_USER_DATA} bytes"
                )));
            }
            Some(raw)
        }
    };
    let subnet_id = p.get("SubnetId").map(str::to_string);
    if let Some(s) = &subnet_id
        && !valid_id(s, "subnet")
    {
        return Err(ApiError::bad("InvalidSubnetID.Malformed", format!("Invalid id: \"{s}\"")));
    }
    let security_groups = p.list("SecurityGroupId");
    if let Some(bad) = security_groups.iter().find(|g| !valid_id(g, "sg")) {
        return Err(ApiError::bad("InvalidGroupId.Malformed", format!("Invalid id: \"{bad}\"")));
    }
    let (instance_tags, volume_tags) = tag_specifications(p)?;
    let disks = block_devices(p, &cfg.root_device_name)?;
    let spot = market_options(p, cfg.spot_price_in(instance_type, &zone))?;

    if let Some(limit) = cfg.instance_limit {
        let available = limit.saturating_sub(st.active_in(region));
        if available < min {
            return Err(instance_limit_exceeded(max, limit));
        }
    }
    p.dry_run()?;
    if spot.is_some() && !st.spot_capacity {
        return Err(no_spot_capacity());
    }

    let count = match cfg.instance_limit {
        Some(limit) => max.min(limit.saturating_sub(st.active_in(region))),
        None => max,
    };
    let reservation_id = st.launch(
        LaunchSpec {
            region: region.to_string(),
            zone,
            image_id: image.to_string(),
            instance_type: instance_type.to_string(),
            count,
            user_data,
            client_token: token.clone(),
            subnet_id,
            security_groups,
            instance_tags,
            volume_tags,
            disks,
            launch_time: unix_now(),
            planted: false,
            spot,
        },
        now,
    );
    if !token.is_empty() {
        st.tokens.insert(
            (region.to_string(), token),
            TokenRecord { fingerprint: fingerprint(p), reservation_id: reservation_id.clone() },
        );
    }
    Ok(render_run(st, &reservation_id, request_id))
}

/// What RunInstances answers a spot launch when EC2 has no spot capacity for it: a server
/// error code (the EC2 API reference lists `InsufficientInstanceCapacity` among them) with
/// the message EC2 gives a Spot request.
pub(crate) fn no_spot_capacity() -> ApiError {
    ApiError::new(
        500,
        "InsufficientInstanceCapacity",
        "There is no Spot capacity available that matches your request.",
    )
}

/// `InstanceMarketOptions` as RunInstances reads it (`InstanceMarketOptionsRequest`,
/// `SpotMarketOptions` in the 2016-11-15 model): `Some((SpotInstanceType,
/// InstanceInterruptionBehavior))` for a spot launch, `None` for on-demand. Checked as EC2
/// documents it: `persistent` only with `stop` or `hibernate`, `ValidUntil` only for
/// `persistent`, a `MaxPrice` above USD 0.001, and one below the current spot price
/// (`spot_price`) is `SpotMaxPriceTooLow`.
fn market_options(p: &Params, spot_price: &str) -> Result<Option<(String, String)>, ApiError> {
    const M: &str = "InstanceMarketOptions";
    let market = p.get(&format!("{M}.MarketType"));
    let opt = |k: &str| p.get(&format!("{M}.SpotOptions.{k}"));
    let any_spot_option = p.map.keys().any(|k| k.starts_with(&format!("{M}.SpotOptions.")));
    match market {
        None if any_spot_option => {
            return Err(ApiError::bad(
                "InvalidParameterCombination",
                "InstanceMarketOptions.SpotOptions requires InstanceMarketOptions.MarketType spot",
            ));
        }
        None => return Ok(None),
        Some("spot") => {}
        // Valid in EC2, but capacity the emulator does not model.
        Some(m @ ("capacity-block" | "interruptible-capacity-reservation")) => {
            return Err(ApiError::bad(
                "Unsupported",
                format!("The emulator models no {m} capacity (InstanceMarketOptions.MarketType)"),
            ));
        }
        Some(m) => {
            return Err(ApiError::invalid_value(format!(
                "Value ({m}) for parameter InstanceMarketOptions.MarketType is invalid. \
                 Expected one of spot, capacity-block, interruptible-capacity-reservation."
            )));
        }
    }
    let one_of = |key: &str, default: &str, allowed: &[&str]| match opt(key) {
        None => Ok(default.to_string()),
        Some(v) if allowed.contains(&v) => Ok(v.to_string()),
        Some(v) => Err(ApiError::invalid_value(format!(
            "Value ({v}) for parameter InstanceMarketOptions.SpotOptions.{key} is invalid. \
             Expected one of {}.",
            allowed.join(", ")
        ))),
    };
    let kind = one_of("SpotInstanceType", "one-time", &["one-time", "persistent"])?;
    let behavior =
        one_of("InstanceInterruptionBehavior", "terminate", &["hibernate", "stop", "terminate"])?;
    if kind == "persistent" && behavior == "terminate" {
        return Err(ApiError::bad(
            "InvalidParameterCombination",
            "For RunInstances, persistent Spot Instance requests are only supported when \
             InstanceInterruptionBehavior is hibernate or stop",
        ));
    }
    if kind == "one-time" && behavior != "terminate" {
        return Err(ApiError::bad(
            "InvalidParameterCombination",
            format!(
                "InstanceInterruptionBehavior {behavior} requires a persistent Spot Instance \
                 request (SpotInstanceType persistent)"
            ),
        ));
    }
    if kind == "one-time" && opt("ValidUntil").is_some() {
        return Err(ApiError::bad(
            "InvalidParameterCombination",
            "ValidUntil is supported only for persistent Spot Instance requests",
        ));
    }
    if let Some(max) = opt("MaxPrice") {
        let price = |s: &str| s.trim().parse::<f64>().ok().filter(|v| v.is_finite());
        let Some(v) = price(max).filter(|v| *v > 0.001) else {
            return Err(ApiError::invalid_value(format!(
                "Value ({max}) for parameter InstanceMarketOptions.SpotOptions.MaxPrice is \
                 invalid. It must be more than USD 0.001."
            )));
        };
        if price(spot_price).is_some_and(|now| v < now) {
            return Err(ApiError::bad(
                "SpotMaxPriceTooLow",
                format!(
                    "Your Spot request price of {max} is lower than the minimum required Spot \
                     request fulfillment price of {spot_price}."
                ),
            ));
        }
    }
    Ok(Some((kind, behavior)))
}

pub(crate) fn instance_limit_exceeded(requested: u32, limit: u32) -> ApiError {
    ApiError::bad(
        "InstanceLimitExceeded",
        format!(
            "You have requested more instances ({requested}) than your current instance \
             limit of {limit} allows for the specified instance type. Please visit \
             http://aws.amazon.com/contact-us/ec2-request to request an adjustment to this \
             limit."
        ),
    )
}

/// What must be identical for a ClientToken retry. EC2 lets the Region and Availability
/// Zone differ; everything else must match.
fn fingerprint(p: &Params) -> String {
    p.map
        .iter()
        .filter(|(k, _)| {
            !matches!(
                k.as_str(),
                "Action" | "Version" | "ClientToken" | "DryRun" | "Placement.AvailabilityZone"
            )
        })
        .map(|(k, v)| format!("{k}={v}"))
        .collect::<Vec<_>>()
        .join("\n")
}

fn count(p: &Params, key: &str) -> Result<u32, ApiError> {
    let v = p.get(key).ok_or_else(|| ApiError::missing(key))?;
    match v.parse::<u32>() {
        Ok(n) if n >= 1 => Ok(n),
        _ => Err(ApiError::invalid_value(format!(
            "Value ({v}) for parameter {key} is invalid. Expected a positive integer."
        ))),
    }
}

/// Tag sets for the instance and for its volumes, from `TagSpecification.N`.
type TagSets = (Vec<(String, String)>, Vec<(String, String)>);

fn tag_specifications(p: &Params) -> Result<TagSets, ApiError> {
    let mut instance = Vec::new();
    let mut volume = Vec::new();
    for (_, spec) in p.groups("TagSpecification") {
        let kind = spec
            .get("ResourceType")
            .ok_or_else(|| ApiError::missing("TagSpecification.N.ResourceType"))?;
        let mut tags = Vec::new();
        for (_, tag) in spec.groups("Tag") {
            let key = tag.get("Key").unwrap_or("");
            if key.is_empty() {
                return Err(ApiError::invalid_value("Tag key cannot be empty"));
            }
            if key.starts_with("aws:") {
                return Err(ApiError::invalid_value(
                    "Tag keys starting with 'aws:' are reserved for internal use",
                ));
            }
            tags.push((key.to_string(), tag.get("Value").unwrap_or("").to_string()));
        }
        match kind {
            "instance" => instance.extend(tags),
            "volume" => volume.extend(tags),
            // Taggable at launch in EC2, but the emulator models no such resources.
            "network-interface" | "spot-instances-request" | "elastic-gpu" => {}
            other => {
                return Err(ApiError::invalid_value(format!(
                    "'{other}' is not a valid taggable resource type for this operation."
                )));
            }
        }
    }
    Ok((instance, volume))
}

/// The root volume plus any extra EBS volumes. DeleteOnTermination defaults to false
/// (real EC2 takes the AMI's default, usually true) so that a plugin that does not set it
/// leaks a volume the conformance suite can see.
fn block_devices(p: &Params, root_device: &str) -> Result<Vec<DiskSpec>, ApiError> {
    let mut root = DiskSpec {
        device: root_device.to_string(),
        size: 8,
        volume_type: "gp3".into(),
        delete_on_termination: false,
    };
    let mut extra = Vec::new();
    for (_, m) in p.groups("BlockDeviceMapping") {
        let device = m
            .get("DeviceName")
            .ok_or_else(|| ApiError::missing("BlockDeviceMapping.N.DeviceName"))?;
        if m.get("NoDevice").is_some() || m.get("VirtualName").is_some() {
            continue;
        }
        let size = match m.get("Ebs.VolumeSize") {
            None => None,
            Some(v) => Some(v.parse::<u32>().ok().filter(|n| *n >= 1).ok_or_else(|| {
                ApiError::invalid_value(format!(
                    "Value ({v}) for parameter volumeSize is invalid. Expected a positive \
                     integer."
                ))
            })?),
        };
        let dot = m.bool("Ebs.DeleteOnTermination")?.unwrap_or(false);
        let volume_type = m.get("Ebs.VolumeType").map(str::to_string);
        if device == root_device {
            root.delete_on_termination = dot;
            root.size = size.unwrap_or(root.size);
            root.volume_type = volume_type.unwrap_or(root.volume_type);
        } else {
            extra.push(DiskSpec {
                device: device.to_string(),
                size: size.unwrap_or(8),
                volume_type: volume_type.unwrap_or_else(|| "gp3".into()),
                delete_on_termination: dot,
            });
        }
    }
    let mut disks = vec![root];
    disks.extend(extra);
    Ok(disks)
}

fn render_run(st: &State, reservation_id: &str, request_id: &str) -> String {
    let r = &st.reservations[reservation_id];
    let mut x = Xml::response("RunInstances", request_id);
    x.leaf("reservationId", &r.id).leaf("ownerId", &st.cfg.owner_id);
    group_set(&mut x, &r.groups);
    x.open("instancesSet");
    for id in &r.instance_ids {
        render_instance(&mut x, st, &st.instances[id]);
    }
    x.close("instancesSet");
    x.finish("RunInstances")
}

// ---------------------------------------------------------------------------------------
// DescribeInstances / TerminateInstances / DescribeInstanceAttribute

fn instance_ids(p: &Params) -> Result<Vec<String>, ApiError> {
    let ids = p.list("InstanceId");
    if let Some(bad) = ids.iter().find(|id| !valid_id(id, "i")) {
        return Err(ApiError::bad("InvalidInstanceID.Malformed", format!("Invalid id: \"{bad}\"")));
    }
    Ok(ids)
}

/// EC2 names every missing id in one error, singular or plural.
fn require_visible(st: &State, ids: &[String], region: &str, now: Instant) -> Result<(), ApiError> {
    let missing: Vec<&str> = ids
        .iter()
        .filter(|id| !st.instances.get(id.as_str()).is_some_and(|i| i.visible(region, now)))
        .map(String::as_str)
        .collect();
    match missing.len() {
        0 => Ok(()),
        1 => Err(ApiError::bad(
            "InvalidInstanceID.NotFound",
            format!("The instance ID '{}' does not exist", missing[0]),
        )),
        _ => Err(ApiError::bad(
            "InvalidInstanceID.NotFound",
            format!("The instance IDs '{}' do not exist", missing.join(", ")),
        )),
    }
}

fn describe_instances(
    st: &mut State,
    p: &Params,
    region: &str,
    request_id: &str,
    now: Instant,
) -> ApiResult {
    let ids = instance_ids(p)?;
    if !ids.is_empty() && p.get("MaxResults").is_some() {
        return Err(ApiError::bad(
            "InvalidParameterCombination",
            "The parameter instancesSet cannot be used with the parameter maxResults",
        ));
    }
    let filters = filters(p, INSTANCE_FILTERS)?;
    let page_size = page_size(p, 1000, false)?;
    let after = cursor(p, region)?;
    require_visible(st, &ids, region, now)?;
    p.dry_run()?;

    let wanted: BTreeSet<&str> = ids.iter().map(String::as_str).collect();
    let mut matching: Vec<&Instance> = st
        .instances
        .values()
        .filter(|i| i.visible(region, now))
        .filter(|i| wanted.is_empty() || wanted.contains(i.id.as_str()))
        .filter(|i| filters.iter().all(|f| f.matches(&instance_field(i, &f.name))))
        .filter(|i| after.is_none_or(|a| i.seq > a))
        .collect();
    matching.sort_by_key(|i| i.seq);
    let more = page_size.is_some_and(|n| matching.len() > n);
    if let Some(n) = page_size {
        matching.truncate(n);
    }
    let next = more.then(|| make_token(region, matching.last().map_or(0, |i| i.seq)));

    // One reservationSet item per reservation, in launch order of their first instance.
    let mut order: Vec<&str> = Vec::new();
    let mut by_reservation: BTreeMap<&str, Vec<&Instance>> = BTreeMap::new();
    for i in &matching {
        if !by_reservation.contains_key(i.reservation_id.as_str()) {
            order.push(&i.reservation_id);
        }
        by_reservation.entry(&i.reservation_id).or_default().push(i);
    }
    let mut x = Xml::response("DescribeInstances", request_id);
    x.open("reservationSet");
    for rid in order {
        let r = &st.reservations[rid];
        x.open("item").leaf("reservationId", rid).leaf("ownerId", &st.cfg.owner_id);
        group_set(&mut x, &r.groups);
        x.open("instancesSet");
        for i in &by_reservation[rid] {
            render_instance(&mut x, st, i);
        }
        x.close("instancesSet").close("item");
    }
    x.close("reservationSet");
    if let Some(t) = &next {
        x.leaf("nextToken", t);
    }
    let shown: Vec<String> = matching.iter().map(|i| i.id.clone()).collect();
    let body = x.finish("DescribeInstances");
    st.observe(&shown, now);
    Ok(body)
}

fn terminate_instances(
    st: &mut State,
    p: &Params,
    region: &str,
    request_id: &str,
    now: Instant,
) -> ApiResult {
    let ids = instance_ids(p)?;
    if ids.is_empty() {
        return Err(ApiError::missing("InstanceId"));
    }
    require_visible(st, &ids, region, now)?;
    // Nothing is terminated when any instance cannot be.
    if let Some(locked) = ids.iter().find(|id| st.instances[id.as_str()].locked) {
        return Err(ApiError::bad(
            "IncorrectInstanceState",
            format!("The instance '{locked}' is not in a state from which it can be terminated."),
        ));
    }
    p.dry_run()?;
    let mut x = Xml::response("TerminateInstances", request_id);
    x.open("instancesSet");
    let mut seen = BTreeSet::new();
    for id in ids.iter().filter(|id| seen.insert(id.as_str())) {
        let previous = st.instances[id].state.clone();
        st.begin_terminate(id, now);
        let current = st.instances[id].state.clone();
        x.open("item").leaf("instanceId", id);
        instance_state(&mut x, "currentState", &current);
        instance_state(&mut x, "previousState", &previous);
        x.close("item");
    }
    x.close("instancesSet");
    Ok(x.finish("TerminateInstances"))
}

fn describe_instance_attribute(
    st: &mut State,
    p: &Params,
    region: &str,
    request_id: &str,
    now: Instant,
) -> ApiResult {
    let id = p.get("InstanceId").ok_or_else(|| ApiError::missing("InstanceId"))?;
    let attribute = p.get("Attribute").ok_or_else(|| ApiError::missing("Attribute"))?;
    if !valid_id(id, "i") {
        return Err(ApiError::bad("InvalidInstanceID.Malformed", format!("Invalid id: \"{id}\"")));
    }
    require_visible(st, &[id.to_string()], region, now)?;
    p.dry_run()?;
    let inst = &st.instances[id];
    let mut x = Xml::response("DescribeInstanceAttribute", request_id);
    x.leaf("instanceId", id);
    let value = |x: &mut Xml, tag: &str, v: &str| {
        x.open(tag).leaf("value", v).close(tag);
    };
    match attribute {
        "userData" => match &inst.user_data {
            Some(data) => value(&mut x, "userData", &BASE64.encode(data)),
            None => {
                x.empty("userData");
            }
        },
        "instanceType" => value(&mut x, "instanceType", &inst.instance_type),
        "rootDeviceName" => value(&mut x, "rootDeviceName", &st.cfg.root_device_name),
        "disableApiTermination" => value(&mut x, "disableApiTermination", "false"),
        "instanceInitiatedShutdownBehavior" => {
            value(&mut x, "instanceInitiatedShutdownBehavior", "stop")
        }
        other => {
            return Err(ApiError::invalid_value(format!(
                "Value ({other}) for parameter attribute is invalid. Unknown attribute."
            )));
        }
    }
    Ok(x.finish("DescribeInstanceAttribute"))
}

fn instance_state(x: &mut Xml, tag: &str, state: &str) {
    x.open(tag).leaf("code", &state_code(state).to_string()).leaf("name", state).close(tag);
}

fn group_set(x: &mut Xml, groups: &[String]) {
    x.open("groupSet");
    for g in groups {
        x.open("item").leaf("groupId", g).close("item");
    }
    x.close("groupSet");
}

fn tag_set(x: &mut Xml, tags: &[(String, String)]) {
    if tags.is_empty() {
        return;
    }
    x.open("tagSet");
    for (k, v) in tags {
        x.open("item").leaf("key", k).leaf("value", v).close("item");
    }
    x.close("tagSet");
}

fn render_instance(x: &mut Xml, st: &State, i: &Instance) {
    let shutting = matches!(i.state.as_str(), "shutting-down" | "terminated");
    x.open("item").leaf("instanceId", &i.id).leaf("imageId", &i.image_id);
    instance_state(x, "instanceState", &i.state);
    let private_dns = i
        .private_ip
        .as_ref()
        .map(|ip| format!("ip-{}.ec2.internal", ip.replace('.', "-")))
        .unwrap_or_default();
    let public_dns = i
        .public_ip
        .as_ref()
        .map(|ip| format!("ec2-{}.compute-1.amazonaws.com", ip.replace('.', "-")))
        .unwrap_or_default();
    // A reclaim is EC2's doing: no "User initiated" (the emulator leaves the reason empty).
    let reason = match (shutting && !i.reclaimed, i.terminate_requested_at) {
        (true, Some(t)) => format!("User initiated ({} GMT)", iso_time(t)[..19].replace('T', " ")),
        _ => String::new(),
    };
    x.leaf("privateDnsName", &private_dns)
        .leaf("dnsName", &public_dns)
        .leaf("reason", &reason)
        .leaf("amiLaunchIndex", &i.launch_index.to_string())
        .empty("productCodes")
        .leaf("instanceType", &i.instance_type)
        .leaf("launchTime", &iso_time(i.launch_time));
    x.open("placement")
        .leaf("availabilityZone", &i.zone)
        .empty("groupName")
        .leaf("tenancy", "default")
        .close("placement");
    x.open("monitoring").leaf("state", "disabled").close("monitoring");
    if let Some(subnet) = &i.subnet_id {
        x.leaf("subnetId", subnet).leaf("vpcId", &format!("vpc-{}", &subnet["subnet-".len()..]));
    }
    if let Some(ip) = &i.private_ip {
        x.leaf("privateIpAddress", ip);
    }
    if let Some(ip) = &i.public_ip {
        x.leaf("ipAddress", ip);
    }
    x.leaf("sourceDestCheck", "true");
    group_set(x, &i.security_groups);
    // `StateReason.Code` as the API reference lists them: the spot ones when EC2 took the
    // instance back (terminated, or stopped for `stop` / `hibernate`).
    let state_reason = match (i.reclaimed, i.state.as_str()) {
        (true, "stopped") => Some((
            "Server.SpotInstanceShutdown",
            "Server.SpotInstanceShutdown: Spot instance shutdown",
        )),
        (true, _) => Some((
            "Server.SpotInstanceTermination",
            "Server.SpotInstanceTermination: Spot instance termination",
        )),
        (false, _) if shutting => Some((
            "Client.UserInitiatedShutdown",
            "Client.UserInitiatedShutdown: User initiated shutdown",
        )),
        _ => None,
    };
    if let Some((code, message)) = state_reason {
        x.open("stateReason").leaf("code", code).leaf("message", message).close("stateReason");
    }
    x.leaf("architecture", "x86_64")
        .leaf("rootDeviceType", "ebs")
        .leaf("rootDeviceName", &st.cfg.root_device_name);
    x.open("blockDeviceMapping");
    let mut attached: Vec<&Volume> = st
        .volumes
        .values()
        .filter(|v| v.attachment.as_ref().is_some_and(|a| a.instance_id == i.id))
        .collect();
    attached.sort_by(|a, b| {
        let da = &a.attachment.as_ref().expect("filtered").device;
        let db = &b.attachment.as_ref().expect("filtered").device;
        da.cmp(db)
    });
    for v in attached {
        let a = v.attachment.as_ref().expect("filtered on attachment");
        x.open("item").leaf("deviceName", &a.device).open("ebs");
        x.leaf("volumeId", &v.id)
            .leaf("status", "attached")
            .leaf("attachTime", &iso_time(a.attach_time))
            .leaf("deleteOnTermination", bool_str(a.delete_on_termination));
        x.close("ebs").close("item");
    }
    x.close("blockDeviceMapping");
    if let Some(spot) = &i.spot {
        x.leaf("instanceLifecycle", "spot").leaf("spotInstanceRequestId", &spot.request_id);
    }
    x.leaf("virtualizationType", "hvm").leaf("clientToken", &i.client_token);
    tag_set(x, &i.tags);
    x.leaf("hypervisor", "xen").empty("networkInterfaceSet").leaf("ebsOptimized", "false");
    x.close("item");
}

fn bool_str(b: bool) -> &'static str {
    if b { "true" } else { "false" }
}

// ---------------------------------------------------------------------------------------
// DescribeVolumes

fn describe_volumes(st: &mut State, p: &Params, region: &str, request_id: &str) -> ApiResult {
    let ids = p.list("VolumeId");
    if let Some(bad) = ids.iter().find(|id| !valid_id(id, "vol")) {
        return Err(ApiError::bad(
            "InvalidVolumeID.Malformed",
            format!("Invalid id: \"{bad}\" (expecting \"vol-...\")"),
        ));
    }
    if !ids.is_empty() && p.get("MaxResults").is_some() {
        return Err(ApiError::bad(
            "InvalidParameterCombination",
            "The parameter volumeSet cannot be used with the parameter maxResults",
        ));
    }
    let filters = filters(p, VOLUME_FILTERS)?;
    // DescribeVolumes clamps MaxResults above 500 rather than refusing it.
    let page_size = page_size(p, 500, true)?;
    let after = cursor(p, region)?;
    let missing: Vec<&str> = ids
        .iter()
        .filter(|id| st.volumes.get(id.as_str()).is_none_or(|v| v.region != region))
        .map(String::as_str)
        .collect();
    if !missing.is_empty() {
        let quoted: Vec<String> = missing.iter().map(|m| format!("'{m}'")).collect();
        let message = if missing.len() == 1 {
            format!("The volume {} does not exist.", quoted[0])
        } else {
            format!("The volumes {} do not exist.", quoted.join(", "))
        };
        return Err(ApiError::bad("InvalidVolume.NotFound", message));
    }
    p.dry_run()?;

    let wanted: BTreeSet<&str> = ids.iter().map(String::as_str).collect();
    let mut matching: Vec<&Volume> = st
        .volumes
        .values()
        .filter(|v| v.region == region)
        .filter(|v| wanted.is_empty() || wanted.contains(v.id.as_str()))
        .filter(|v| filters.iter().all(|f| f.matches(&volume_field(v, &f.name))))
        .collect();
    matching.sort_by_key(|v| v.seq);
    let mut matching: Vec<&Volume> =
        matching.into_iter().filter(|v| after.is_none_or(|a| v.seq > a)).collect();
    let more = page_size.is_some_and(|n| matching.len() > n);
    if let Some(n) = page_size {
        matching.truncate(n);
    }
    let next = more.then(|| make_token(region, matching.last().map_or(0, |v| v.seq)));
    let mut x = Xml::response("DescribeVolumes", request_id);
    x.open("volumeSet");
    for v in matching {
        x.open("item")
            .leaf("volumeId", &v.id)
            .leaf("size", &v.size.to_string())
            .empty("snapshotId")
            .leaf("availabilityZone", &v.zone)
            .leaf("status", v.status())
            .leaf("createTime", &iso_time(v.create_time));
        x.open("attachmentSet");
        if let Some(a) = &v.attachment {
            x.open("item")
                .leaf("volumeId", &v.id)
                .leaf("instanceId", &a.instance_id)
                .leaf("device", &a.device)
                .leaf("status", "attached")
                .leaf("attachTime", &iso_time(a.attach_time))
                .leaf("deleteOnTermination", bool_str(a.delete_on_termination))
                .close("item");
        }
        x.close("attachmentSet");
        tag_set(&mut x, &v.tags);
        x.leaf("volumeType", &v.volume_type);
        if v.volume_type == "gp3" {
            x.leaf("iops", "3000").leaf("throughput", "125");
        }
        x.leaf("encrypted", "false").leaf("multiAttachEnabled", "false").close("item");
    }
    x.close("volumeSet");
    if let Some(t) = &next {
        x.leaf("nextToken", t);
    }
    Ok(x.finish("DescribeVolumes"))
}

// ---------------------------------------------------------------------------------------
// DescribeAvailabilityZones / DescribeRegions

fn zone_id(region: &str, index: usize) -> String {
    // EC2 zone ids look like `use1-az1`: an abbreviation of the region and a number.
    let abbrev: String = region
        .split('-')
        .enumerate()
        .map(|(n, part)| {
            if n == 0 || part.chars().all(|c| c.is_ascii_digit()) {
                part.to_string()
            } else {
                part[..1].to_string()
            }
        })
        .collect();
    format!("{abbrev}-az{}", index + 1)
}

fn describe_zones(st: &mut State, p: &Params, region: &str, request_id: &str) -> ApiResult {
    let cfg = st.cfg.clone();
    let catalog = cfg.region(region).expect("verified regions are in the catalogue");
    let names = p.list("ZoneName");
    if let Some(bad) = names.iter().find(|n| !catalog.zones.contains(n)) {
        return Err(ApiError::invalid_value(format!("Invalid availability zone: [{bad}]")));
    }
    let filters = filters(p, ZONE_FILTERS)?;
    p.dry_run()?;
    let mut x = Xml::response("DescribeAvailabilityZones", request_id);
    x.open("availabilityZoneInfo");
    for (n, zone) in catalog.zones.iter().enumerate() {
        let id = zone_id(region, n);
        let field = |name: &str| -> Vec<String> {
            match name {
                "zone-name" => vec![zone.clone()],
                "zone-id" => vec![id.clone()],
                "region-name" => vec![region.to_string()],
                "state" => vec!["available".into()],
                _ => Vec::new(),
            }
        };
        if !(names.is_empty() || names.contains(zone))
            || !filters.iter().all(|f| f.matches(&field(&f.name)))
        {
            continue;
        }
        x.open("item")
            .leaf("zoneName", zone)
            .leaf("zoneState", "available")
            .leaf("regionName", region)
            .leaf("zoneId", &id)
            .leaf("zoneType", "availability-zone")
            .leaf("optInStatus", "opt-in-not-required")
            .leaf("groupName", region)
            .leaf("networkBorderGroup", region)
            .empty("messageSet")
            .close("item");
    }
    x.close("availabilityZoneInfo");
    Ok(x.finish("DescribeAvailabilityZones"))
}

/// See the module documentation of [`crate::ec2`] for what the history holds.
fn describe_spot_price_history(
    st: &mut State,
    p: &Params,
    region: &str,
    request_id: &str,
) -> ApiResult {
    let cfg = st.cfg.clone();
    let catalog = cfg.region(region).expect("verified regions are in the catalogue");
    let zone_ids: Vec<String> = (0..catalog.zones.len()).map(|n| zone_id(region, n)).collect();
    let (zone, zone_id_wanted) = (p.get("AvailabilityZone"), p.get("AvailabilityZoneId"));
    if zone.is_some() && zone_id_wanted.is_some() {
        return Err(ApiError::bad(
            "InvalidParameterCombination",
            "Either AvailabilityZone or AvailabilityZoneId can be specified, but not both",
        ));
    }
    if let Some(z) = zone.filter(|z| !catalog.zones.iter().any(|k| k == z)) {
        return Err(ApiError::invalid_value(format!("Invalid availability zone: [{z}]")));
    }
    if let Some(z) = zone_id_wanted.filter(|z| !zone_ids.iter().any(|k| k == z)) {
        return Err(ApiError::invalid_value(format!("Invalid availability zone id: [{z}]")));
    }
    let time = |key: &str| match p.get(key) {
        None => Ok(None),
        Some(v) => crate::time::parse_rfc3339(v).map(Some).ok_or_else(|| {
            ApiError::invalid_value(format!("Value ({v}) for parameter {key} is invalid."))
        }),
    };
    let (_start, end) = (time("StartTime")?, time("EndTime")?);
    let (types, products) = (p.list("InstanceType"), p.list("ProductDescription"));
    let filters = filters(p, SPOT_PRICE_FILTERS)?;
    let page_size = page_size(p, 1000, false)?.unwrap_or(1000);
    let after = cursor(p, region)?.unwrap_or(0);
    p.dry_run()?;

    // Every price took effect at SPOT_PRICES_SINCE: after any start time it is still the
    // effective one, and it is in the history unless the end time is before it.
    let since = iso_time(SPOT_PRICES_SINCE);
    let in_time = end.is_none_or(|e| e >= SPOT_PRICES_SINCE);
    let mut history = Vec::new();
    for (n, z) in catalog.zones.iter().enumerate() {
        for t in &catalog.instance_types {
            let linux = cfg.spot_price_in(t, z);
            let windows = linux.parse::<f64>().map_or(String::new(), |v| format!("{:.6}", v * 2.0));
            for (product, price) in [("Linux/UNIX", linux.to_string()), ("Windows", windows)] {
                history.push((z, &zone_ids[n], t, product, price));
            }
        }
    }
    let field = |(z, id, t, product, price): &(&String, &String, &String, &str, String),
                 name: &str| {
        let one = |s: &str| vec![s.to_string()];
        match name {
            "availability-zone" => one(z),
            "availability-zone-id" => one(id),
            "instance-type" => one(t),
            "product-description" => one(product),
            "spot-price" => one(price),
            "timestamp" => one(&since),
            _ => Vec::new(),
        }
    };
    let matching: Vec<(usize, _)> = history
        .into_iter()
        .enumerate()
        .map(|(n, h)| (n + 1, h))
        .filter(|(n, _)| *n as u64 > after)
        .filter(|(_, h)| {
            in_time && zone.is_none_or(|z| h.0 == z) && zone_id_wanted.is_none_or(|z| h.1 == z)
        })
        .filter(|(_, h)| types.is_empty() || types.contains(h.2))
        .filter(|(_, h)| products.is_empty() || products.iter().any(|p| p == h.3))
        .filter(|(_, h)| filters.iter().all(|f| f.matches(&field(h, &f.name))))
        .collect();
    let mut x = Xml::response("DescribeSpotPriceHistory", request_id);
    x.open("spotPriceHistorySet");
    for (_, (z, id, t, product, price)) in matching.iter().take(page_size) {
        x.open("item")
            .leaf("availabilityZone", z)
            .leaf("availabilityZoneId", id)
            .leaf("instanceType", t)
            .leaf("productDescription", product)
            .leaf("spotPrice", price)
            .leaf("timestamp", &since)
            .close("item");
    }
    x.close("spotPriceHistorySet");
    match matching.get(page_size) {
        Some(_) => x.leaf("nextToken", &make_token(region, matching[page_size - 1].0 as u64)),
        None => x.empty("nextToken"),
    };
    Ok(x.finish("DescribeSpotPriceHistory"))
}

fn describe_regions(st: &mut State, p: &Params, request_id: &str) -> ApiResult {
    let names = p.list("RegionName");
    let cfg = st.cfg.clone();
    if let Some(bad) = names.iter().find(|n| !cfg.regions.iter().any(|r| &r.name == *n)) {
        return Err(ApiError::invalid_value(format!("Invalid region: {bad}")));
    }
    let filters = filters(p, REGION_FILTERS)?;
    p.dry_run()?;
    let mut x = Xml::response("DescribeRegions", request_id);
    x.open("regionInfo");
    for r in &cfg.regions {
        let endpoint = format!("ec2.{}.amazonaws.com", r.name);
        let field = |name: &str| -> Vec<String> {
            match name {
                "region-name" => vec![r.name.clone()],
                "endpoint" => vec![endpoint.clone()],
                "opt-in-status" => vec!["opt-in-not-required".into()],
                _ => Vec::new(),
            }
        };
        if !(names.is_empty() || names.contains(&r.name))
            || !filters.iter().all(|f| f.matches(&field(&f.name)))
        {
            continue;
        }
        x.open("item")
            .leaf("regionName", &r.name)
            .leaf("regionEndpoint", &endpoint)
            .leaf("optInStatus", "opt-in-not-required")
            .close("item");
    }
    x.close("regionInfo");
    Ok(x.finish("DescribeRegions"))
}

// ---------------------------------------------------------------------------------------
// Filters and pagination

const INSTANCE_FILTERS: &[&str] = &[
    "availability-zone",
    "client-token",
    "image-id",
    "instance-id",
    "instance-lifecycle",
    "instance-state-code",
    "instance-state-name",
    "instance-type",
    "ip-address",
    "private-ip-address",
    "reservation-id",
    "subnet-id",
    "tag-key",
    "tag-value",
];
const VOLUME_FILTERS: &[&str] = &[
    "attachment.delete-on-termination",
    "attachment.device",
    "attachment.instance-id",
    "attachment.status",
    "availability-zone",
    "size",
    "status",
    "tag-key",
    "tag-value",
    "volume-id",
    "volume-type",
];
const ZONE_FILTERS: &[&str] = &["region-name", "state", "zone-id", "zone-name"];
const SPOT_PRICE_FILTERS: &[&str] = &[
    "availability-zone",
    "availability-zone-id",
    "instance-type",
    "product-description",
    "spot-price",
    "timestamp",
];
const REGION_FILTERS: &[&str] = &["endpoint", "opt-in-status", "region-name"];

struct Filter {
    name: String,
    values: Vec<String>,
}

impl Filter {
    /// Any value matches any of the resource's values for this filter (EC2 ORs the values
    /// of one filter and ANDs the filters).
    fn matches(&self, actual: &[String]) -> bool {
        self.values.iter().any(|pattern| actual.iter().any(|a| glob(pattern, a)))
    }
}

fn filters(p: &Params, known: &[&str]) -> Result<Vec<Filter>, ApiError> {
    let mut out = Vec::new();
    for (_, f) in p.groups("Filter") {
        let name = f.get("Name").ok_or_else(|| ApiError::missing("Filter.N.Name"))?;
        let tag_filter =
            name.strip_prefix("tag:").is_some_and(|k| !k.is_empty()) && known.contains(&"tag-key");
        if !tag_filter && !known.contains(&name) {
            return Err(ApiError::invalid_value(format!("The filter '{name}' is invalid")));
        }
        out.push(Filter { name: name.to_string(), values: f.list("Value") });
    }
    Ok(out)
}

/// EC2 filter wildcards: `*` is any run of characters, `?` exactly one.
fn glob(pattern: &str, text: &str) -> bool {
    let p: Vec<char> = pattern.chars().collect();
    let t: Vec<char> = text.chars().collect();
    let (mut pi, mut ti) = (0, 0);
    let mut star: Option<(usize, usize)> = None;
    while ti < t.len() {
        if pi < p.len() && (p[pi] == '?' || p[pi] == t[ti]) {
            pi += 1;
            ti += 1;
        } else if pi < p.len() && p[pi] == '*' {
            star = Some((pi, ti));
            pi += 1;
        } else if let Some((sp, st)) = star {
            pi = sp + 1;
            ti = st + 1;
            star = Some((sp, st + 1));
        } else {
            return false;
        }
    }
    p[pi..].iter().all(|c| *c == '*')
}

fn tag_values(tags: &[(String, String)], name: &str) -> Option<Vec<String>> {
    if let Some(key) = name.strip_prefix("tag:") {
        return Some(tags.iter().filter(|(k, _)| k == key).map(|(_, v)| v.clone()).collect());
    }
    match name {
        "tag-key" => Some(tags.iter().map(|(k, _)| k.clone()).collect()),
        "tag-value" => Some(tags.iter().map(|(_, v)| v.clone()).collect()),
        _ => None,
    }
}

fn instance_field(i: &Instance, name: &str) -> Vec<String> {
    if let Some(v) = tag_values(&i.tags, name) {
        return v;
    }
    let one = |s: &str| vec![s.to_string()];
    match name {
        "availability-zone" => one(&i.zone),
        "client-token" => one(&i.client_token),
        "image-id" => one(&i.image_id),
        "instance-id" => one(&i.id),
        "instance-lifecycle" => i.spot.iter().map(|_| "spot".to_string()).collect(),
        "instance-state-code" => one(&state_code(&i.state).to_string()),
        "instance-state-name" => one(&i.state),
        "instance-type" => one(&i.instance_type),
        "ip-address" => i.public_ip.iter().cloned().collect(),
        "private-ip-address" => i.private_ip.iter().cloned().collect(),
        "reservation-id" => one(&i.reservation_id),
        "subnet-id" => i.subnet_id.iter().cloned().collect(),
        _ => Vec::new(),
    }
}

fn volume_field(v: &Volume, name: &str) -> Vec<String> {
    if let Some(t) = tag_values(&v.tags, name) {
        return t;
    }
    let a = v.attachment.as_ref();
    match name {
        "attachment.delete-on-termination" => {
            a.map(|a| bool_str(a.delete_on_termination).to_string()).into_iter().collect()
        }
        "attachment.device" => a.map(|a| a.device.clone()).into_iter().collect(),
        "attachment.instance-id" => a.map(|a| a.instance_id.clone()).into_iter().collect(),
        "attachment.status" => a.map(|_| "attached".to_string()).into_iter().collect(),
        "availability-zone" => vec![v.zone.clone()],
        "size" => vec![v.size.to_string()],
        "status" => vec![v.status().to_string()],
        "volume-id" => vec![v.id.clone()],
        "volume-type" => vec![v.volume_type.clone()],
        _ => Vec::new(),
    }
}

/// `MaxResults`: EC2 refuses values below 5; above `max` it refuses or clamps by action.
fn page_size(p: &Params, max: usize, clamp: bool) -> Result<Option<usize>, ApiError> {
    let Some(v) = p.get("MaxResults") else {
        return Ok(None);
    };
    match v.parse::<usize>() {
        Ok(n) if n >= 5 && n <= max => Ok(Some(n)),
        Ok(n) if n > max && clamp => Ok(Some(max)),
        _ => Err(ApiError::invalid_value(format!(
            "Value ( {v} ) for parameter maxResults is invalid. Expecting a value between 5 \
             and {max}."
        ))),
    }
}

/// Page tokens are opaque to callers: a version, the region and the launch sequence of
/// the last item shown, base64url-encoded.
fn make_token(region: &str, last_seq: u64) -> String {
    data_encoding::BASE64URL_NOPAD.encode(format!("v1|{region}|{last_seq}").as_bytes())
}

fn cursor(p: &Params, region: &str) -> Result<Option<u64>, ApiError> {
    let Some(token) = p.get("NextToken").filter(|t| !t.is_empty()) else {
        return Ok(None);
    };
    let invalid = || {
        ApiError::bad(
            "InvalidPaginationToken",
            format!("The pagination token '{token}' is invalid."),
        )
    };
    let raw = data_encoding::BASE64URL_NOPAD.decode(token.as_bytes()).map_err(|_| invalid())?;
    let text = String::from_utf8(raw).map_err(|_| invalid())?;
    let mut parts = text.split('|');
    match (parts.next(), parts.next(), parts.next(), parts.next()) {
        (Some("v1"), Some(r), Some(seq), None) if r == region => {
            seq.parse().map(Some).map_err(|_| invalid())
        }
        _ => Err(invalid()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn params_lists_and_groups() {
        let p = Params::parse(
            "InstanceId.2=i-b&InstanceId.1=i-a",
            Some(b"Filter.1.Name=tag%3Ak&Filter.1.Value.1=a+b&Filter.2.Name=x&Filter.10.Name=z"),
        );
        assert_eq!(p.list("InstanceId"), ["i-a", "i-b"]);
        let g = p.groups("Filter");
        assert_eq!(g.len(), 3);
        assert_eq!(g[0].1.get("Name"), Some("tag:k"));
        assert_eq!(g[0].1.list("Value"), ["a b"]);
        assert_eq!(g[2].0, 10);
    }

    #[test]
    fn globs() {
        for (p, t, want) in [
            ("*", "", true),
            ("a*c", "abbc", true),
            ("a?c", "abc", true),
            ("a?c", "ac", false),
            ("proxy-*", "proxy-x", true),
            ("proxy-*", "other", false),
            ("exact", "exact", true),
            ("*b*", "abc", true),
        ] {
            assert_eq!(glob(p, t), want, "{p} vs {t}");
        }
    }

    #[test]
    fn tokens_round_trip_and_are_region_bound() {
        let t = make_token("us-east-1", 42);
        let p = Params::parse(&format!("NextToken={t}"), None);
        assert_eq!(cursor(&p, "us-east-1"), Ok(Some(42)));
        assert_eq!(cursor(&p, "eu-west-1").unwrap_err().code, "InvalidPaginationToken");
        let p = Params::parse("NextToken=garbage!", None);
        assert!(cursor(&p, "us-east-1").is_err());
    }

    #[test]
    fn zone_ids_look_like_ec2s() {
        assert_eq!(zone_id("us-east-1", 0), "use1-az1");
        assert_eq!(zone_id("eu-west-1", 2), "euw1-az3");
    }
}
