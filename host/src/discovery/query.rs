//! The query parameters of the collection endpoints: exact-match filters on namespace,
//! provider, region, zone and ProxyPool, and a Kubernetes label selector. Unknown or repeated
//! parameters are refused (400) rather than ignored, so a typo (`labelselector=`) cannot
//! silently widen an answer; an empty value means "no filter".

use super::selector::LabelSelector;
use crate::api::Proxy;

/// The parameters the collection endpoints accept, in the order the OpenAPI document
/// lists them.
pub const PARAMETERS: [&str; 6] = [
    "namespace",
    "provider",
    "region",
    "zone",
    "pool",
    "labelSelector",
];

/// A query parameter the API refuses.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BadParameter {
    pub parameter: String,
    pub value: String,
    pub message: String,
}

/// Parsed filters; all given ones must match.
#[derive(Debug, Clone, Default)]
pub struct Filters {
    pub namespace: Option<String>,
    pub provider: Option<String>,
    pub region: Option<String>,
    pub zone: Option<String>,
    /// The ProxyPool the Proxy belongs to (its [`crate::api::LABEL_POOL`] label).
    pub pool: Option<String>,
    pub selector: LabelSelector,
}

fn is_dns_label(s: &str) -> bool {
    let b = s.as_bytes();
    !b.is_empty()
        && b.len() <= 63
        && b[0].is_ascii_alphanumeric()
        && b[b.len() - 1].is_ascii_alphanumeric()
        && b.iter()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == b'-')
}

impl Filters {
    /// Parses decoded `(name, value)` pairs.
    pub fn parse(pairs: &[(String, String)]) -> Result<Self, BadParameter> {
        let mut f = Filters::default();
        let mut seen: Vec<&str> = Vec::new();
        for (name, value) in pairs {
            let bad = |message: String| BadParameter {
                parameter: name.clone(),
                value: value.clone(),
                message,
            };
            if !PARAMETERS.contains(&name.as_str()) {
                return Err(bad(format!(
                    "unknown query parameter {name:?}; the parameters are {}",
                    PARAMETERS.join(", ")
                )));
            }
            if seen.contains(&name.as_str()) {
                return Err(bad(format!("query parameter {name:?} is given twice")));
            }
            seen.push(name);
            if value.is_empty() {
                continue;
            }
            match name.as_str() {
                "namespace" | "provider" | "pool" => {
                    if !is_dns_label(value) {
                        return Err(bad(format!(
                            "invalid {name} {value:?}: must be a DNS-1123 label (lower-case \
                             alphanumerics and '-', at most 63 characters)"
                        )));
                    }
                    let slot = match name.as_str() {
                        "namespace" => &mut f.namespace,
                        "provider" => &mut f.provider,
                        _ => &mut f.pool,
                    };
                    *slot = Some(value.clone());
                }
                "region" => f.region = Some(value.clone()),
                "zone" => f.zone = Some(value.clone()),
                "labelSelector" => {
                    f.selector = LabelSelector::parse(value)
                        .map_err(|e| bad(format!("invalid labelSelector {value:?}: {e}")))?;
                }
                _ => unreachable!("checked against PARAMETERS"),
            }
        }
        Ok(f)
    }

    /// Whether the Proxy passes every filter (readiness is checked separately).
    pub fn matches(&self, p: &Proxy) -> bool {
        fn eq(want: &Option<String>, have: &str) -> bool {
            want.as_deref().is_none_or(|w| w == have)
        }
        eq(
            &self.namespace,
            p.metadata.namespace.as_deref().unwrap_or(""),
        ) && eq(&self.provider, &p.spec.provider)
            && eq(&self.region, &p.spec.placement.region)
            && eq(&self.zone, &p.spec.placement.zone)
            && self.pool.as_deref().is_none_or(|want| {
                p.metadata
                    .labels
                    .as_ref()
                    .and_then(|l| l.get(crate::api::LABEL_POOL))
                    .is_some_and(|have| have == want)
            })
            && self.selector.matches(p.metadata.labels.as_ref())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pool_matches_the_pool_label_only() {
        let f = q(&[("pool", "web")]).unwrap();
        let mut p = Proxy::new(
            "p",
            serde_json::from_value(serde_json::json!({
                "provider": "hz", "placement": {}, "cloudInit": {"inline": ""}, "port": 3128
            }))
            .unwrap(),
        );
        assert!(!f.matches(&p), "no label: not in the pool");
        p.metadata.labels = Some([(crate::api::LABEL_POOL.to_string(), "web".to_string())].into());
        assert!(f.matches(&p));
        p.metadata.labels = Some([(crate::api::LABEL_POOL.to_string(), "web2".to_string())].into());
        assert!(!f.matches(&p));
    }

    fn q(pairs: &[(&str, &str)]) -> Result<Filters, BadParameter> {
        let owned: Vec<(String, String)> = pairs
            .iter()
            .map(|(a, b)| (a.to_string(), b.to_string()))
            .collect();
        Filters::parse(&owned)
    }

    #[test]
    fn parses_and_refuses() {
        let f = q(&[
            ("namespace", "team-a"),
            ("region", "eu"),
            ("labelSelector", "tier in (gold)"),
        ])
        .unwrap();
        assert_eq!(f.namespace.as_deref(), Some("team-a"));
        assert_eq!(f.region.as_deref(), Some("eu"));
        assert!(!f.selector.is_empty());
        assert!(q(&[("namespace", "")]).unwrap().namespace.is_none());
        assert_eq!(q(&[("pool", "web")]).unwrap().pool.as_deref(), Some("web"));
        let e = q(&[("pool", "Web!")]).unwrap_err();
        assert_eq!((e.parameter.as_str(), e.value.as_str()), ("pool", "Web!"));

        let e = q(&[("labelselector", "x")]).unwrap_err();
        assert_eq!(e.parameter, "labelselector");
        assert!(e.message.contains("unknown"), "{}", e.message);
        let e = q(&[("zone", "a"), ("zone", "b")]).unwrap_err();
        assert!(e.message.contains("twice"), "{}", e.message);
        let e = q(&[("namespace", "Team_A")]).unwrap_err();
        assert_eq!(
            (e.parameter.as_str(), e.value.as_str()),
            ("namespace", "Team_A")
        );
        let e = q(&[("labelSelector", "a in (")]).unwrap_err();
        assert!(
            e.message.starts_with("invalid labelSelector \"a in (\""),
            "{}",
            e.message
        );
    }
}
