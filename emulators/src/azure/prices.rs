//! The Azure Retail Prices API (learn.microsoft.com/rest/api/cost-management/retail-prices/
//! azure-retail-prices): `GET /api/retail/prices?$filter=...` without authentication,
//! answering `{"BillingCurrency", "CustomerEntityId", "CustomerEntityType", "Items",
//! "NextPageLink", "Count"}` with at most `prices_page_size` items (Azure: 100) and a
//! `NextPageLink` carrying `$skip`. Items come from
//! [`AzureConfig::prices`](super::AzureConfig::prices), with every field of the documented
//! item (`meterId`, `productId`, `skuId` made up, stable per meter).
//!
//! `$filter` takes `field eq 'value'` terms joined by `and`, plus `contains(field,
//! 'value')`, on `armRegionName`, `location`, `meterName`, `productName`, `skuName`,
//! `serviceName`, `serviceFamily`, `priceType`, `armSkuName` (the documented filter fields
//! whose values the configuration holds; a term on another field matches nothing). Values
//! compare case-sensitively, as from API version 2023-01-01-preview on. Only USD is served:
//! another `currencyCode` answers no items. A filter that does not parse is 400.

use axum::Json;
use axum::extract::{Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};

use super::RetailPrice;
use super::model::Backend;
use crate::framework::Shared;

fn item(p: &RetailPrice, n: usize) -> Value {
    let product = format!("DZH318Z0{:04X}", p.product_name.len() * 31 + p.arm_sku_name.len());
    json!({
        "currencyCode": "USD",
        "tierMinimumUnits": 0.0,
        "retailPrice": p.retail_price,
        "unitPrice": p.retail_price,
        "armRegionName": p.arm_region_name,
        "location": p.location,
        "effectiveStartDate": "2024-01-01T00:00:00Z",
        "meterId": format!("00000000-0000-4000-8000-{n:012x}"),
        "meterName": p.meter_name,
        "productId": product,
        "skuId": format!("{product}/{:04X}", n),
        "productName": p.product_name,
        "skuName": p.sku_name,
        "serviceName": p.service_name,
        "serviceId": "DZH313Z7MMC8",
        "serviceFamily": "Compute",
        "unitOfMeasure": p.unit_of_measure,
        "type": p.price_type,
        "isPrimaryMeterRegion": true,
        "armSkuName": p.arm_sku_name,
    })
}

/// One term of `$filter`: `field eq 'v'` or `contains(field, 'v')`.
enum Term {
    Eq(String, String),
    Contains(String, String),
}

fn parse(filter: &str) -> Option<Vec<Term>> {
    let mut out = Vec::new();
    for t in split_and(filter) {
        let t = t.trim();
        if let Some(inner) = t.strip_prefix("contains(").and_then(|r| r.strip_suffix(')')) {
            let (f, v) = inner.split_once(',')?;
            out.push(Term::Contains(f.trim().to_string(), unquote(v.trim())?));
        } else {
            let (f, v) = t.split_once(" eq ")?;
            out.push(Term::Eq(f.trim().to_string(), unquote(v.trim())?));
        }
    }
    Some(out)
}

fn unquote(v: &str) -> Option<String> {
    Some(v.strip_prefix('\'')?.strip_suffix('\'')?.replace("''", "'"))
}

/// Splits on ` and ` outside quotes.
pub(crate) fn split_and(filter: &str) -> Vec<String> {
    let (mut out, mut cur, mut quoted) = (Vec::new(), String::new(), false);
    let chars: Vec<char> = filter.chars().collect();
    let mut i = 0;
    while i < chars.len() {
        let c = chars[i];
        if c == '\'' {
            quoted = !quoted;
        }
        if !quoted
            && chars[i..].iter().collect::<String>().to_ascii_lowercase().starts_with(" and ")
        {
            out.push(std::mem::take(&mut cur));
            i += 5;
            continue;
        }
        cur.push(c);
        i += 1;
    }
    if !cur.trim().is_empty() {
        out.push(cur);
    }
    out
}

fn field<'a>(p: &'a RetailPrice, name: &str) -> Option<&'a str> {
    Some(match name {
        "armRegionName" => &p.arm_region_name,
        "location" | "Location" => &p.location,
        "meterName" => &p.meter_name,
        "productName" => &p.product_name,
        "skuName" => &p.sku_name,
        "serviceName" => &p.service_name,
        "serviceFamily" => "Compute",
        "priceType" | "type" => &p.price_type,
        "armSkuName" => &p.arm_sku_name,
        "unitOfMeasure" => &p.unit_of_measure,
        _ => return None,
    })
}

pub(crate) async fn prices(
    State(state): State<Shared<Backend>>,
    Query(query): Query<Vec<(String, String)>>,
) -> Response {
    let b = state.lock();
    let q = |k: &str| query.iter().find(|(n, _)| n == k).map(|(_, v)| v.clone());
    let filter = q("$filter").unwrap_or_default();
    let currency =
        q("currencyCode").map(|c| c.trim_matches('\'').to_string()).unwrap_or_else(|| "USD".into());
    let Some(terms) = parse(&filter) else {
        let body = json!({"Error": {"Code": "BadRequest", "Message": format!("Invalid OData parameters supplied: $filter={filter}")}});
        return (StatusCode::BAD_REQUEST, Json(body)).into_response();
    };
    let matches = |p: &RetailPrice| {
        terms.iter().all(|t| match t {
            Term::Eq(f, v) => field(p, f) == Some(v.as_str()),
            Term::Contains(f, v) => field(p, f).is_some_and(|x| x.contains(v.as_str())),
        })
    };
    let all: Vec<(usize, &RetailPrice)> = if currency == "USD" {
        b.cfg.prices.iter().enumerate().filter(|(_, p)| matches(p)).collect()
    } else {
        Vec::new()
    };
    let skip: usize = q("$skip").and_then(|s| s.parse().ok()).unwrap_or(0);
    let size = b.cfg.prices_page_size.max(1);
    let items: Vec<Value> = all.iter().skip(skip).take(size).map(|(n, p)| item(p, *n)).collect();
    let next = (skip + size < all.len()).then(|| {
        let mut url = format!("{}/api/retail/prices?", b.base_url);
        if !filter.is_empty() {
            url.push_str(&format!("$filter={}&", super::percent::encode(&filter)));
        }
        format!("{url}$skip={}", skip + size)
    });
    Json(json!({
        "BillingCurrency": currency,
        "CustomerEntityId": "Default",
        "CustomerEntityType": "Retail",
        "Items": items,
        "NextPageLink": next,
        "Count": items.len(),
    }))
    .into_response()
}
