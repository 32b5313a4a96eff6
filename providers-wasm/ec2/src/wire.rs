//! Reading EC2's XML answers: instances, page tokens and error documents.
//!
//! Only the few fields the plugin uses are read, by their path from the root, so that an
//! `item` of a nested set (tags, groups, block devices) is never mistaken for an instance.
//! Unknown elements are ignored: EC2 adds fields over time.

use roxmltree::{Document, Node};

/// An instance as EC2 describes it, reduced to what the operator needs.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Ec2Instance {
    pub id: String,
    /// The state name: pending, running, shutting-down, terminated, stopping, stopped.
    pub state: String,
    pub public_ip: Option<String>,
    pub private_ip: Option<String>,
    /// RFC 3339 with milliseconds, as EC2 writes it.
    pub launch_time: String,
    pub tags: Vec<(String, String)>,
    /// `instanceLifecycle`: `spot` for a Spot Instance, empty for on-demand.
    pub lifecycle: String,
    /// `stateReason/code`: why it last changed state (`Server.SpotInstanceTermination`).
    pub state_reason: String,
}

impl Ec2Instance {
    pub fn tag(&self, key: &str) -> Option<&str> {
        self.tags
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.as_str())
    }

    /// Terminated, or on its way there: no longer an instance anyone can use or adopt.
    pub fn is_dead(&self) -> bool {
        matches!(self.state.as_str(), "shutting-down" | "terminated")
    }

    /// EC2 took this Spot Instance back: terminated, or stopped, for want of spot capacity
    /// or price (the `StateReason` codes of the 2016-11-15 API reference).
    pub fn interrupted(&self) -> bool {
        matches!(
            self.state_reason.as_str(),
            "Server.SpotInstanceTermination" | "Server.SpotInstanceShutdown"
        )
    }
}

/// One page of DescribeInstances, or the instances RunInstances launched.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Page {
    pub instances: Vec<Ec2Instance>,
    pub next_token: Option<String>,
}

/// An EC2 error document (`<Response><Errors><Error>...`).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ApiError {
    pub code: String,
    pub message: String,
    pub request_id: String,
}

/// Parse a DescribeInstances or RunInstances answer.
pub fn parse_instances(body: &str) -> Result<Page, String> {
    let doc = Document::parse(body).map_err(|e| format!("answer is not XML: {e}"))?;
    let root = doc.root_element();
    let mut page = Page::default();
    // DescribeInstances nests instances in reservations; RunInstances is one reservation.
    if let Some(set) = child(root, "reservationSet") {
        for reservation in children(set, "item") {
            if let Some(instances) = child(reservation, "instancesSet") {
                page.instances
                    .extend(children(instances, "item").map(instance));
            }
        }
    } else if let Some(instances) = child(root, "instancesSet") {
        page.instances
            .extend(children(instances, "item").map(instance));
    } else {
        return Err(format!(
            "answer <{}> has neither reservationSet nor instancesSet",
            root.tag_name().name()
        ));
    }
    if let Some(bad) = page.instances.iter().find(|i| i.id.is_empty()) {
        return Err(format!(
            "answer has an instance without instanceId: {bad:?}"
        ));
    }
    page.next_token = Some(text(root, "nextToken")).filter(|t| !t.is_empty());
    Ok(page)
}

fn instance(item: Node<'_, '_>) -> Ec2Instance {
    let state = child(item, "instanceState")
        .map(|s| text(s, "name"))
        .unwrap_or_default();
    let opt = |name| Some(text(item, name)).filter(|v| !v.is_empty());
    let tags = child(item, "tagSet")
        .map(|set| {
            children(set, "item")
                .map(|t| (text(t, "key"), text(t, "value")))
                .collect()
        })
        .unwrap_or_default();
    Ec2Instance {
        id: text(item, "instanceId"),
        state,
        public_ip: opt("ipAddress"),
        private_ip: opt("privateIpAddress"),
        launch_time: text(item, "launchTime"),
        tags,
        lifecycle: text(item, "instanceLifecycle"),
        state_reason: child(item, "stateReason")
            .map(|r| text(r, "code"))
            .unwrap_or_default(),
    }
}

/// A spot price history entry: its `timestamp` and `spotPrice`, as EC2 writes them.
pub type SpotPrice = (String, String);

/// From a DescribeSpotPriceHistory answer, the latest `Linux/UNIX` price of `instance_type`
/// in `zone` (its `timestamp` and `spotPrice`), and the answer's `nextToken`. Items are
/// filtered again here: an endpoint may ignore a parameter (moto ignores the zone and the
/// product). EC2 writes every timestamp alike (`2026-08-01T10:00:00.000Z`), so the latest is
/// the greatest as text.
pub fn latest_spot_price(
    body: &str,
    instance_type: &str,
    zone: &str,
) -> Result<(Option<SpotPrice>, Option<String>), String> {
    let doc = Document::parse(body).map_err(|e| format!("answer is not XML: {e}"))?;
    let root = doc.root_element();
    let set = child(root, "spotPriceHistorySet").ok_or_else(|| {
        format!(
            "answer <{}> has no spotPriceHistorySet",
            root.tag_name().name()
        )
    })?;
    let latest = children(set, "item")
        .filter(|i| {
            let is = |name, want: &str| {
                child(*i, name).and_then(|n| n.text()).map(str::trim) == Some(want)
            };
            is("instanceType", instance_type)
                && is("availabilityZone", zone)
                && text(*i, "productDescription").starts_with("Linux/UNIX")
        })
        .map(|i| (text(i, "timestamp"), text(i, "spotPrice")))
        .max();
    Ok((
        latest,
        Some(text(root, "nextToken")).filter(|t| !t.is_empty()),
    ))
}

/// The error of a non-2xx answer, if the body is an EC2 error document. Also reads the
/// older `<ErrorResponse><Error>` shape that some AWS front ends answer with.
pub fn parse_error(body: &str) -> Option<ApiError> {
    let doc = Document::parse(body).ok()?;
    let error = doc
        .descendants()
        .find(|n| n.has_tag_name("Error") && child(*n, "Code").is_some())?;
    let request_id = doc
        .descendants()
        .find(|n| n.has_tag_name("RequestID") || n.has_tag_name("RequestId"))
        .and_then(|n| n.text())
        .unwrap_or_default();
    Some(ApiError {
        code: text(error, "Code"),
        message: text(error, "Message"),
        request_id: request_id.trim().to_string(),
    })
}

fn child<'a, 'i>(node: Node<'a, 'i>, name: &str) -> Option<Node<'a, 'i>> {
    node.children()
        .find(|n| n.is_element() && n.tag_name().name() == name)
}

fn children<'a, 'i: 'a>(
    node: Node<'a, 'i>,
    name: &'a str,
) -> impl Iterator<Item = Node<'a, 'i>> + 'a {
    node.children()
        .filter(move |n| n.is_element() && n.tag_name().name() == name)
}

/// The trimmed text of a child element; empty when absent (EC2 writes `<x/>` for none).
fn text(node: Node<'_, '_>, name: &str) -> String {
    child(node, name)
        .and_then(|n| n.text())
        .unwrap_or_default()
        .trim()
        .to_string()
}
