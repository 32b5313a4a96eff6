//! The providers file's `prices`: what an instance costs where the plugin cannot say.
//!
//! Some clouds publish no price list a plugin can read with the credentials it has (EC2's
//! on-demand prices live in the Price List API of another endpoint, GCE's in the Cloud
//! Billing catalog, a Proxmox cluster has none), and an account's negotiated discounts are
//! in no public list at all. The operator's administrator writes them here, and they win
//! over the plugin's `quote`: they are what this account pays.
//!
//! A rule names a machine type and, optionally, a region and a capacity; the most specific
//! matching rule prices a placement. Amounts are decimal text (`"0.0104"`), never floats,
//! and are held as millionths of the currency per hour, as the contract's `price` is.

use crate::provider::{Capacity, Placement, Price};
use serde::Deserialize;

/// Rules one provider may have: more than the machine types of any cloud in a region,
/// times its regions, is not a price list anyone keeps by hand.
pub const MAX_RULES: usize = 1024;
/// The largest hourly amount a rule may state: a million units of its currency.
pub const MAX_PER_HOUR_MICROS: u64 = 1_000_000 * 1_000_000;
/// `machineType` and `region`: as long as the Proxy's placement values may be.
pub const MAX_VALUE: usize = 253;

/// One line of `prices`.
#[derive(Debug, Clone, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct PriceRule {
    /// The placement's `machineType` this rule prices.
    pub machine_type: String,
    /// Only placements in this region; absent: every region.
    #[serde(default)]
    pub region: Option<String>,
    /// Only this capacity (`OnDemand` or `Spot`); absent: both.
    #[serde(default)]
    pub capacity: Option<RuleCapacity>,
    /// ISO 4217: three capital letters.
    pub currency: String,
    /// The amount per hour, as decimal text with at most six decimals (`"0.0104"`).
    pub per_hour: String,
}

/// The capacity a rule is for, spelled as the Proxy's `placement.capacity` is.
#[derive(Debug, Clone, Copy, Deserialize, PartialEq, Eq)]
pub enum RuleCapacity {
    OnDemand,
    Spot,
}

/// Why a `prices` entry cannot be used; the message names the entry, the field and value.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PriceError {
    #[error("prices: {count} rules, more than the {MAX_RULES} a provider may have")]
    TooMany { count: usize },
    #[error("prices[{index}].{field}: {value:?} {why}")]
    Field {
        index: usize,
        field: &'static str,
        value: String,
        why: &'static str,
    },
    #[error("prices[{index}] and prices[{first}] price the same machine type, region and capacity")]
    Duplicate { index: usize, first: usize },
}

/// Checks every rule; the first problem is the error.
pub fn validate(rules: &[PriceRule]) -> Result<(), PriceError> {
    if rules.len() > MAX_RULES {
        return Err(PriceError::TooMany { count: rules.len() });
    }
    for (index, r) in rules.iter().enumerate() {
        let field = |field, value: &str, why| PriceError::Field {
            index,
            field,
            value: value.chars().take(MAX_VALUE + 1).collect(),
            why,
        };
        if r.machine_type.is_empty() || r.machine_type.len() > MAX_VALUE {
            return Err(field(
                "machineType",
                &r.machine_type,
                "must be 1 to 253 characters",
            ));
        }
        if let Some(region) = &r.region
            && (region.is_empty() || region.len() > MAX_VALUE)
        {
            return Err(field(
                "region",
                region,
                "must be 1 to 253 characters (leave it out for every region)",
            ));
        }
        if r.currency.len() != 3 || !r.currency.bytes().all(|b| b.is_ascii_uppercase()) {
            return Err(field(
                "currency",
                &r.currency,
                "is not an ISO 4217 code (three capital letters, e.g. EUR)",
            ));
        }
        if micros(&r.per_hour).is_none() {
            return Err(field(
                "perHour",
                &r.per_hour,
                "is not an amount: decimal text such as \"0.0104\", at most six decimals, at most 1000000",
            ));
        }
        if let Some(first) = rules[..index].iter().position(|o| {
            o.machine_type == r.machine_type && o.region == r.region && o.capacity == r.capacity
        }) {
            return Err(PriceError::Duplicate { index, first });
        }
    }
    Ok(())
}

/// `"0.0104"` as millionths (10,400); `None` for anything else than plain decimal text
/// with at most six decimals, up to [`MAX_PER_HOUR_MICROS`].
pub fn micros(text: &str) -> Option<u64> {
    let (whole, frac) = text.split_once('.').unwrap_or((text, ""));
    let digits = |s: &str| s.bytes().all(|b| b.is_ascii_digit());
    if whole.is_empty() || whole.len() > 7 || frac.len() > 6 || !digits(whole) || !digits(frac) {
        return None;
    }
    if text.ends_with('.') {
        return None;
    }
    let whole: u64 = whole.parse().ok()?;
    let frac: u64 = format!("{frac:0<6}").parse().ok()?;
    let total = whole.checked_mul(1_000_000)?.checked_add(frac)?;
    (total <= MAX_PER_HOUR_MICROS).then_some(total)
}

/// Millionths as decimal text without trailing zeros (`10400` -> `"0.0104"`).
pub fn decimal(micros: u64) -> String {
    let (whole, frac) = (micros / 1_000_000, micros % 1_000_000);
    if frac == 0 {
        return whole.to_string();
    }
    let frac = format!("{frac:06}");
    format!("{whole}.{}", frac.trim_end_matches('0'))
}

/// The price of `placement` by the most specific matching rule: a rule naming the region
/// beats one for every region, then one naming the capacity beats one for both.
pub fn price_of(rules: &[PriceRule], placement: &Placement) -> Option<Price> {
    let capacity = match placement.capacity {
        Capacity::OnDemand => RuleCapacity::OnDemand,
        Capacity::Spot => RuleCapacity::Spot,
    };
    rules
        .iter()
        .filter(|r| r.machine_type == placement.machine_type)
        .filter(|r| r.region.as_ref().is_none_or(|g| *g == placement.region))
        .filter(|r| r.capacity.is_none_or(|c| c == capacity))
        .max_by_key(|r| (r.region.is_some(), r.capacity.is_some()))
        .and_then(|r| {
            Some(Price {
                currency: r.currency.clone(),
                micros_per_hour: micros(&r.per_hour)?,
            })
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rule(
        machine_type: &str,
        region: Option<&str>,
        capacity: Option<RuleCapacity>,
        per_hour: &str,
    ) -> PriceRule {
        PriceRule {
            machine_type: machine_type.into(),
            region: region.map(Into::into),
            capacity,
            currency: "USD".into(),
            per_hour: per_hour.into(),
        }
    }

    #[test]
    fn amounts_are_decimal_text_held_as_millionths() {
        for (text, want) in [
            ("0.0104", Some(10_400)),
            ("1", Some(1_000_000)),
            ("12.5", Some(12_500_000)),
            ("0.000001", Some(1)),
            ("1000000", Some(MAX_PER_HOUR_MICROS)),
            ("1000000.000001", None),
            ("0.0000001", None),
            ("-1", None),
            ("1e3", None),
            (".5", None),
            ("5.", None),
            ("", None),
            (" 1", None),
            ("NaN", None),
        ] {
            assert_eq!(micros(text), want, "{text:?}");
        }
        for m in [0, 1, 10_400, 1_000_000, 12_500_000, MAX_PER_HOUR_MICROS] {
            assert_eq!(micros(&decimal(m)), Some(m), "{m}");
        }
        assert_eq!(decimal(10_400), "0.0104");
    }

    #[test]
    fn the_most_specific_rule_prices_a_placement() {
        use RuleCapacity::*;
        let rules = [
            rule("t3.micro", None, None, "0.0104"),
            rule("t3.micro", Some("eu-west-1"), None, "0.0114"),
            rule("t3.micro", Some("eu-west-1"), Some(Spot), "0.0035"),
            rule("t3.micro", None, Some(Spot), "0.0031"),
        ];
        let at = |region: &str, capacity| {
            let p = Placement {
                capacity,
                ..Placement::new(region, "", "t3.micro", "ami")
            };
            price_of(&rules, &p).map(|p| p.micros_per_hour)
        };
        assert_eq!(at("us-east-1", Capacity::OnDemand), Some(10_400));
        assert_eq!(at("eu-west-1", Capacity::OnDemand), Some(11_400));
        assert_eq!(at("eu-west-1", Capacity::Spot), Some(3_500));
        assert_eq!(at("us-east-1", Capacity::Spot), Some(3_100));
        let other = Placement::new("eu-west-1", "", "t3.large", "ami");
        assert_eq!(price_of(&rules, &other), None);
        let _ = OnDemand;
    }

    #[test]
    fn bad_rules_are_refused_naming_index_field_and_value() {
        let cases: Vec<(Vec<PriceRule>, &str)> = vec![
            (
                vec![rule("", None, None, "1")],
                "prices[0].machineType: \"\"",
            ),
            (
                vec![rule("m", Some(""), None, "1")],
                "prices[0].region: \"\"",
            ),
            (
                vec![PriceRule {
                    currency: "usd".into(),
                    ..rule("m", None, None, "1")
                }],
                "prices[0].currency: \"usd\" is not an ISO 4217 code",
            ),
            (
                vec![rule("m", None, None, "0.1"), rule("m", None, None, "one")],
                "prices[1].perHour: \"one\" is not an amount",
            ),
            (
                vec![rule("m", None, None, "0.1"), rule("m", None, None, "0.2")],
                "prices[1] and prices[0] price the same",
            ),
            (
                vec![rule("m", None, None, "1"); MAX_RULES + 1],
                "prices: 1025 rules, more than the 1024",
            ),
        ];
        for (rules, want) in cases {
            let e = validate(&rules).unwrap_err().to_string();
            assert!(e.starts_with(want), "{e}\nwant {want}");
        }
        validate(&[rule("m", Some("r"), Some(RuleCapacity::Spot), "0.5")]).unwrap();
    }
}
