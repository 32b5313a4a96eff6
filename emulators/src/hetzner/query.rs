//! The parameters every list shares (`name`, `label_selector`, `sort`, `page`,
//! `per_page`) and the `meta.pagination` / `Link` answer.

use serde_json::{Value, json};

use super::error::HetznerError;
use super::labels::Selector;

/// Per-page default and maximum from the pagination reference.
const PER_PAGE_DEFAULT: usize = 25;
const PER_PAGE_MAX: usize = 50;

pub(super) enum SortKey<'a> {
    Num(u64, u64),
    Text(&'a str, &'a str),
}

/// The query parameters every list shares: `name`, `label_selector`, `sort`, `page`,
/// `per_page`.
pub(super) struct ListQuery {
    pub(super) name: Option<String>,
    pub(super) selector: Selector,
    pub(super) sort: Vec<(String, bool)>,
    pub(super) page: usize,
    pub(super) per_page: usize,
}

impl ListQuery {
    pub(super) fn parse(
        query: &[(String, String)],
        sortable: &[&str],
    ) -> Result<ListQuery, HetznerError> {
        let mut q = ListQuery {
            name: None,
            selector: Selector::default(),
            sort: Vec::new(),
            page: 1,
            per_page: PER_PAGE_DEFAULT,
        };
        let bad = |field: &str, msg: String| HetznerError::invalid_fields(&[(field.into(), msg)]);
        for (k, v) in query {
            match k.as_str() {
                "name" => q.name = Some(v.clone()),
                "label_selector" => {
                    q.selector = Selector::parse(v).map_err(|e| bad("label_selector", e))?
                }
                "sort" => {
                    let (field, desc) = match v.split_once(':') {
                        Some((f, "asc")) => (f, false),
                        Some((f, "desc")) => (f, true),
                        Some(_) => return Err(bad("sort", format!("'{v}' is not a valid sort"))),
                        None => (v.as_str(), false),
                    };
                    if !sortable.contains(&field) {
                        return Err(bad("sort", format!("'{v}' is not a valid sort")));
                    }
                    q.sort.push((field.to_string(), desc));
                }
                "page" => {
                    q.page = v
                        .parse()
                        .ok()
                        .filter(|p| *p >= 1)
                        .ok_or_else(|| bad("page", "must be a positive integer".into()))?
                }
                "per_page" => {
                    let n: usize = v
                        .parse()
                        .ok()
                        .filter(|p| *p >= 1)
                        .ok_or_else(|| bad("per_page", "must be a positive integer".into()))?;
                    // The reference states a maximum of 50 without saying what a larger
                    // value does; the emulator caps it, which a plugin must survive either
                    // way by following `next_page`.
                    q.per_page = n.min(PER_PAGE_MAX);
                }
                _ => {}
            }
        }
        Ok(q)
    }

    /// Order by the `sort` keys in turn, then by ID so pages never overlap.
    pub(super) fn compare<'a>(&self, key: impl Fn(&str) -> SortKey<'a>) -> std::cmp::Ordering {
        for (field, desc) in self.sort.iter().map(|(f, d)| (f.as_str(), *d)).chain([("id", false)])
        {
            let ord = match key(field) {
                SortKey::Num(a, b) => a.cmp(&b),
                SortKey::Text(a, b) => a.cmp(b),
            };
            let ord = if desc { ord.reverse() } else { ord };
            if ord.is_ne() {
                return ord;
            }
        }
        std::cmp::Ordering::Equal
    }

    /// The page number, the slice of matches it shows, and `meta.pagination`.
    pub(super) fn page(&self, total: usize) -> (usize, std::ops::Range<usize>, Value) {
        let last = total.div_ceil(self.per_page).max(1);
        let start = (self.page - 1).saturating_mul(self.per_page).min(total);
        let end = start.saturating_add(self.per_page).min(total);
        let meta = json!({
            "page": self.page,
            "per_page": self.per_page,
            "previous_page": (self.page > 1).then(|| (self.page - 1).min(last)),
            "next_page": (self.page < last).then_some(self.page + 1),
            "last_page": last,
            "total_entries": total,
        });
        (self.page, start..end, meta)
    }

    /// `Link: <url>; rel="prev", <url>; rel="next", <url>; rel="last"`, keeping the
    /// caller's other query parameters.
    pub(super) fn link(
        &self,
        base: &str,
        path: &str,
        query: &[(String, String)],
        page: usize,
        meta: &Value,
    ) -> String {
        let others: Vec<String> = query
            .iter()
            .filter(|(k, _)| k != "page" && k != "per_page")
            .map(|(k, v)| format!("{}={}", encode(k), encode(v)))
            .collect();
        let url = |p: u64| {
            let mut parts = others.clone();
            parts.push(format!("page={p}"));
            parts.push(format!("per_page={}", self.per_page));
            format!("<{base}{path}?{}>", parts.join("&"))
        };
        let mut rels = Vec::new();
        if page > 1
            && let Some(p) = meta["previous_page"].as_u64()
        {
            rels.push(format!("{}; rel=\"prev\"", url(p)));
        }
        if let Some(p) = meta["next_page"].as_u64() {
            rels.push(format!("{}; rel=\"next\"", url(p)));
        }
        if let Some(p) = meta["last_page"].as_u64() {
            rels.push(format!("{}; rel=\"last\"", url(p)));
        }
        rels.join(", ")
    }
}

/// Percent-encoding for query values in `Link` URLs (label selectors carry `=`, `,`, `!`,
/// spaces and parentheses).
fn encode(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b'~' | b'/') {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}
