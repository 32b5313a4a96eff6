//! A read-only status page: every Proxy (Ready or not) with its state, health, probe
//! latency and age, and every provider with its ProviderHealth targets. Rendered on the
//! server from the same reflector caches the discovery API answers from, so a page view
//! costs no API-server call (besides the cached auth reviews).
//!
//! - `GET /status`: the page. A self-contained HTML document (inline CSS and script, no
//!   external resources) that refreshes its content every few seconds. It carries no
//!   cluster data when auth is on, so it can be public.
//! - `GET /status/fragment`: the page's content as an HTML fragment, behind the same
//!   TokenReview + SubjectAccessReview auth as the API (`list` on proxies across all
//!   namespaces). The page's script fetches it with the bearer token the user pastes or
//!   passes in the URL fragment (`/status#token=...`, which browsers never send to a
//!   server); the token is kept in the tab's sessionStorage only.
//!
//! With auth disabled, `/status` embeds the content directly, so the page shows data even
//! before its script runs.
//!
//! Every text that comes from the cluster goes through [`escape`]; the page's script puts
//! only server-rendered fragments or its own fixed strings into the document, and a
//! Content-Security-Policy allows only the page's own script (by hash) and connections to
//! this origin.

use crate::api::{ProviderHealth, Proxy};
use crate::discovery::view::{self, ProxyView};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::runtime::reflector::Store;
use std::fmt::Write;
use std::sync::Arc;

/// How often the page fetches fresh content, in milliseconds.
pub const REFRESH_MS: u32 = 5000;

/// Class of the badge that marks a Ready proxy or target; its colour is [`READY_RGB`].
pub const READY_CLASS: &str = "ok";
/// The Ready badge's background colour (the screenshot test looks for it).
pub const READY_RGB: [u8; 3] = [0x1a, 0x7f, 0x37];

/// HTML-escapes `s` for text and for double- or single-quoted attribute values.
pub fn escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

/// `kubectl`-style age: 45s, 12m, 5h, 3d.
pub fn age(seconds: i64) -> String {
    let s = seconds.max(0);
    match s {
        0..60 => format!("{s}s"),
        60..3600 => format!("{}m", s / 60),
        3600..86400 => format!("{}h", s / 3600),
        _ => format!("{}d", s / 86400),
    }
}

fn age_of(t: Option<&Time>, now: i64) -> String {
    match t {
        Some(t) => age(now - t.0.as_second()),
        None => "-".to_string(),
    }
}

fn now_seconds() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs() as i64)
        .unwrap_or(0)
}

fn badge(out: &mut String, ok: bool, text: &str) {
    let class = if ok { READY_CLASS } else { "bad" };
    let _ = write!(
        out,
        r#"<span class="badge {class}">{}</span>"#,
        escape(text)
    );
}

/// The page's content: the proxies table and the providers table.
pub fn fragment(proxies: &Store<Proxy>, providers: Option<&Store<ProviderHealth>>) -> String {
    fragment_at(
        &proxies.state(),
        providers.map(|s| s.state()).as_deref(),
        now_seconds(),
    )
}

/// `namespace/pool` of a Proxy a ProxyPool made.
fn pool_of(p: &Proxy) -> Option<String> {
    let pool = p.metadata.labels.as_ref()?.get(crate::api::LABEL_POOL)?;
    Some(format!(
        "{}/{pool}",
        p.metadata.namespace.as_deref().unwrap_or("")
    ))
}

/// What the fleet costs per hour, per provider and currency (the Proxies' `hourlyPrice`
/// summed, as `proxy_operator_cost_per_hour` serves it by placement).
fn cost_section(out: &mut String, proxies: &[&Arc<Proxy>]) {
    let mut sums: std::collections::BTreeMap<(String, String), (u64, usize)> = Default::default();
    for ((provider, _, _, currency), micros) in
        crate::metrics::costs(proxies.iter().map(|p| p.as_ref()))
    {
        let e = sums.entry((provider, currency)).or_default();
        e.0 = e.0.saturating_add(micros);
    }
    for p in proxies {
        if let Some(h) = p.status.as_ref().and_then(|s| s.hourly_price.as_ref())
            && p.metadata.deletion_timestamp.is_none()
            && let Some(e) = sums.get_mut(&(p.spec.provider.clone(), h.currency.clone()))
        {
            e.1 += 1;
        }
    }
    out.push_str(r#"<section id="cost"><h2>Cost</h2>"#);
    if sums.is_empty() {
        out.push_str(
            r#"<p class="empty">No prices known: set <code>prices</code> in the providers file, or use a plugin that quotes them.</p>"#,
        );
    } else {
        out.push_str(
            "<table><thead><tr><th>Provider</th><th>Per hour</th><th>Proxies priced</th></tr></thead><tbody>",
        );
        for ((provider, currency), (micros, n)) in sums {
            let _ = write!(
                out,
                r#"<tr class="cost"><td>{}</td><td>{} {}</td><td>{n}</td></tr>"#,
                escape(&provider),
                egress_plugin_host::config::prices::decimal(micros),
                escape(&currency),
            );
        }
        out.push_str("</tbody></table>");
    }
    out.push_str("</section>");
}

/// [`fragment`] over plain lists, at `now` (seconds since the epoch).
pub fn fragment_at(
    proxies: &[Arc<Proxy>],
    providers: Option<&[Arc<ProviderHealth>]>,
    now: i64,
) -> String {
    let mut proxies: Vec<&Arc<Proxy>> = proxies.iter().collect();
    // Grouped by ProxyPool (namespace/pool), pools first, then the Proxies of no pool.
    proxies.sort_by(|a, b| {
        (pool_of(a).is_none(), pool_of(a), view::sort_key(a)).cmp(&(
            pool_of(b).is_none(),
            pool_of(b),
            view::sort_key(b),
        ))
    });
    let pooled = proxies.iter().any(|p| pool_of(p).is_some());
    let mut group: Option<Option<String>> = None;
    let ready = proxies
        .iter()
        .filter(|p| view::readiness(p).is_ok())
        .count();
    let mut out = String::with_capacity(1024 + proxies.len() * 400);
    let _ = write!(
        out,
        r#"<section id="proxies"><h2>Proxies <small>{ready} of {} Ready</small></h2>"#,
        proxies.len()
    );
    if proxies.is_empty() {
        out.push_str(r#"<p class="empty">No Proxy objects.</p>"#);
    } else {
        out.push_str(
            "<table><thead><tr><th>Namespace/Name</th><th>Ready</th><th>Address</th>\
             <th>State</th><th>Healthy</th><th>Latency</th><th>Provider</th>\
             <th>Placement</th><th>Age</th></tr></thead><tbody>",
        );
        for p in &proxies {
            let this = pool_of(p);
            if pooled && group.as_ref() != Some(&this) {
                let members = proxies.iter().filter(|q| pool_of(q) == this);
                let (n, ready) = members.fold((0, 0), |(n, r), q| {
                    (n + 1, r + usize::from(view::readiness(q).is_ok()))
                });
                let title = match &this {
                    Some(pool) => format!("Pool {pool}"),
                    None => "Not in a pool".to_string(),
                };
                let _ = write!(
                    out,
                    r#"<tr class="pool" data-pool="{}"><th colspan="9">{} <small>{ready} of {n} Ready</small></th></tr>"#,
                    escape(this.as_deref().unwrap_or("")),
                    escape(&title)
                );
                group = Some(this);
            }
            let v = ProxyView::of(p);
            let _ = write!(
                out,
                r#"<tr class="proxy" data-name="{}/{}"><td>{}/{}</td><td>"#,
                escape(v.namespace),
                escape(v.name),
                escape(v.namespace),
                escape(v.name)
            );
            match (v.ready, v.reason) {
                (true, _) => badge(&mut out, true, "Ready"),
                (false, reason) => badge(&mut out, false, reason.unwrap_or("NotReady")),
            }
            if let Some(m) = v.message {
                let _ = write!(out, r#"<div class="msg">{}</div>"#, escape(m));
            }
            out.push_str("</td><td class=\"addr\">");
            match &v.address {
                // IPv6 addresses take brackets, as in a proxy URL.
                Some(a) => out.push_str(&escape(a)),
                None => out.push('-'),
            }
            let latency = match &v.last_probe {
                Some(lp) => match (lp.latency_ms, lp.error) {
                    (Some(ms), _) => format!("{ms} ms"),
                    (None, Some(e)) => format!("failed: {e}"),
                    (None, None) => "-".to_string(),
                },
                None => "-".to_string(),
            };
            // Providers without zones (Hetzner) leave the zone empty.
            let place = match (v.region, v.zone) {
                (r, "") => r.to_string(),
                (r, z) => format!("{r}/{z}"),
            };
            let _ = write!(
                out,
                "</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
                escape(v.state.unwrap_or("-")),
                if v.healthy { "yes" } else { "no" },
                escape(&latency),
                escape(v.provider),
                escape(&place),
                age_of(p.metadata.creation_timestamp.as_ref(), now),
            );
        }
        out.push_str("</tbody></table>");
    }
    out.push_str("</section>");
    cost_section(&mut out, &proxies);
    out.push_str(r#"<section id="providers"><h2>Providers</h2>"#);
    match providers {
        None => out.push_str(r#"<p class="empty">Provider health is not available here.</p>"#),
        Some([]) => out.push_str(r#"<p class="empty">No ProviderHealth objects yet.</p>"#),
        Some(list) => {
            let mut list: Vec<&Arc<ProviderHealth>> = list.iter().collect();
            list.sort_by(|a, b| a.metadata.name.cmp(&b.metadata.name));
            out.push_str(
                "<table><thead><tr><th>Provider</th><th>Type</th><th>Target</th>\
                 <th>Ready</th><th>Reason</th><th>Message</th><th>Checked</th></tr></thead><tbody>",
            );
            for ph in list {
                let name = ph.metadata.name.as_deref().unwrap_or("");
                let status = ph.status.clone().unwrap_or_default();
                let type_name = status.type_.as_deref().unwrap_or("-");
                let checked = match &status.last_check_time {
                    Some(t) => format!("{} ago", age(now - t.0.as_second())),
                    None => "never".to_string(),
                };
                // A provider that failed to (re)load says why under its name.
                let load_error = match &status.load_error {
                    Some(e) => format!(r#"<div class="msg load-error">{}</div>"#, escape(e)),
                    None => String::new(),
                };
                let provider_cells = format!(
                    "<td>{}{load_error}</td><td>{}</td>",
                    escape(name),
                    escape(type_name)
                );
                if status.targets.is_empty() {
                    let what = if status.check_supported == Some(false) {
                        "no health check"
                    } else {
                        "no targets reported"
                    };
                    let _ = write!(
                        out,
                        r#"<tr class="provider" data-name="{}">{provider_cells}<td colspan="4">{what}</td><td>{checked}</td></tr>"#,
                        escape(name)
                    );
                }
                for t in &status.targets {
                    let _ = write!(
                        out,
                        r#"<tr class="provider" data-name="{}">{provider_cells}<td class="target">{}</td><td>"#,
                        escape(name),
                        escape(&t.target)
                    );
                    badge(
                        &mut out,
                        t.ready,
                        if t.ready { "Ready" } else { "NotReady" },
                    );
                    let _ = write!(
                        out,
                        "</td><td>{}</td><td>{}</td><td>{checked}</td></tr>",
                        escape(&t.reason),
                        escape(&t.message)
                    );
                }
            }
            out.push_str("</tbody></table>");
        }
    }
    out.push_str("</section>");
    out
}

const STYLE: &str = "\
body{font:14px/1.4 system-ui,-apple-system,'Segoe UI',sans-serif;margin:1.5rem;color:#1f2328;background:#fff}\
h1{font-size:1.4rem;margin:0 0 .25rem}h2{font-size:1.1rem;margin:1.5rem 0 .5rem}h2 small{font-weight:normal;color:#59636e}\
table{border-collapse:collapse;width:100%}th,td{text-align:left;padding:.35rem .6rem;border-bottom:1px solid #d1d9e0;vertical-align:top}\
th{background:#f6f8fa;font-weight:600}td.addr{font-family:ui-monospace,monospace}\
.badge{display:inline-block;padding:.15rem .6rem;border-radius:1rem;color:#fff;font-weight:600;font-size:12px}\
.badge.ok{background:#1a7f37}.badge.bad{background:#cf222e}\
.msg{color:#59636e;font-size:12px}.empty{color:#59636e}#meta{color:#59636e}#error{color:#cf222e}\
form{margin:.75rem 0}input{width:28rem;max-width:100%}";

/// The page's script. It only ever inserts server-rendered fragments (escaped on the
/// server) or fixed strings; error messages go in with textContent.
const SCRIPT: &str = r#"(function(){
var KEY='proxy-operator-status-token';
var m=/(?:^#|&)token=([^&]+)/.exec(location.hash);
if(m){sessionStorage.setItem(KEY,decodeURIComponent(m[1]));history.replaceState(null,'',location.pathname+location.search);}
var content=document.getElementById('content'),meta=document.getElementById('meta'),err=document.getElementById('error'),form=document.getElementById('token-form');
var busy=false;
function refresh(){
  if(busy)return;busy=true;
  var token=sessionStorage.getItem(KEY),headers={};
  if(token)headers['Authorization']='Bearer '+token;
  fetch('status/fragment',{headers:headers,cache:'no-store',credentials:'omit'}).then(function(r){
    return r.text().then(function(body){
      if(r.ok){content.innerHTML=body;err.textContent='';form.hidden=true;meta.textContent='Updated '+new Date().toLocaleTimeString();return;}
      var msg='HTTP '+r.status;try{msg+=': '+JSON.parse(body).message;}catch(e){}
      err.textContent=msg;
      if(r.status===401||r.status===403){content.textContent='';form.hidden=false;}
    });
  }).catch(function(e){err.textContent='Cannot reach the operator: '+e;}).then(function(){busy=false;});
}
form.addEventListener('submit',function(e){e.preventDefault();var t=document.getElementById('token').value.trim();if(t){sessionStorage.setItem(KEY,t);}refresh();});
refresh();setInterval(refresh,REFRESH_MS);
})();"#;

fn script() -> String {
    SCRIPT.replace("REFRESH_MS", &REFRESH_MS.to_string())
}

/// The Content-Security-Policy of the page: its own inline style and script (by hash)
/// only, fetches to this origin only, no framing.
pub fn content_security_policy() -> String {
    use sha2::{Digest, Sha256};
    let hash = data_encoding::BASE64.encode(&Sha256::digest(script().as_bytes()));
    format!(
        "default-src 'none'; script-src 'sha256-{hash}'; style-src 'unsafe-inline'; \
         connect-src 'self'; img-src data:; base-uri 'none'; form-action 'none'; \
         frame-ancestors 'none'"
    )
}

/// The whole page. `content` is the initial fragment (only when auth is off); with auth
/// on, the page asks for a token and fetches the fragment with it.
pub fn page(content: Option<&str>) -> String {
    let hint = if content.is_some() {
        "Authentication is disabled on this operator."
    } else {
        "Open as <code>/status#token=TOKEN</code> or paste a bearer token (e.g. <code>kubectl create token NAME</code>) that may list proxies in every namespace."
    };
    format!(
        r#"<!doctype html>
<html lang="en"><head><meta charset="utf-8"><meta name="viewport" content="width=device-width,initial-scale=1">
<meta name="referrer" content="no-referrer"><title>proxy-operator status</title><style>{STYLE}</style></head>
<body><h1>proxy-operator status</h1><div id="meta">Loading…</div><div id="error" role="alert"></div>
<form id="token-form"{hidden}><label>Bearer token <input id="token" type="password" autocomplete="off"></label> <button type="submit">Show</button><div class="msg">{hint}</div></form>
<main id="content">{content}</main>
<script>{script}</script></body></html>
"#,
        hidden = if content.is_some() { " hidden" } else { "" },
        content = content.unwrap_or(""),
        script = script(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::{CloudInit, Placement, ProviderHealthStatus, ProxySpec, TargetHealth};
    use k8s_openapi::jiff::Timestamp;
    use serde_json::json;

    const NOW: i64 = 1_800_000_000;

    fn proxy(name: &str, ready: bool) -> Arc<Proxy> {
        let mut p = Proxy::new(
            name,
            ProxySpec {
                provider: "hetzner".into(),
                placement: Placement {
                    region: "eu-central".into(),
                    zone: "fsn1".into(),
                    machine_type: "cx22".into(),
                    image: "debian-12".into(),
                    capacity: Default::default(),
                },
                cloud_init: CloudInit {
                    inline: Some(String::new()),
                    secret_key_ref: None,
                },
                port: 3128,
                auth: Default::default(),
                ip_family: Default::default(),
            },
        );
        p.metadata.namespace = Some("team-a".into());
        p.metadata.creation_timestamp = Some(Time(Timestamp::from_second(NOW - 7200).unwrap()));
        let status = if ready { "True" } else { "False" };
        p.status = Some(
            serde_json::from_value(json!({
                "ip": "203.0.113.7", "port": 3128, "state": "Running",
                "conditions": [{"type": "Ready", "status": status, "reason": if ready {"Ready"} else {"Unhealthy"},
                                "message": "probe <failed>", "lastTransitionTime": "2026-11-01T10:00:00Z"}],
                "lastProbe": {"time": "2026-11-01T10:00:00Z", "latencyMs": 42},
            }))
            .unwrap(),
        );
        Arc::new(p)
    }

    #[test]
    fn proxies_are_grouped_by_pool_with_their_counts() {
        let in_pool = |name: &str, pool: &str, ready: bool| {
            let mut p = (*proxy(name, ready)).clone();
            p.metadata.labels =
                Some([(crate::api::LABEL_POOL.to_string(), pool.to_string())].into());
            Arc::new(p)
        };
        let html = fragment_at(
            &[
                proxy("alone", true),
                in_pool("web-b", "web", false),
                in_pool("api-a", "api", true),
                in_pool("web-a", "web", true),
            ],
            None,
            NOW,
        );
        let order: Vec<&str> = [
            "data-pool=\"team-a/api\"",
            "team-a/api-a",
            "data-pool=\"team-a/web\"",
            "team-a/web-a",
            "team-a/web-b",
            "data-pool=\"\"",
            "team-a/alone",
        ]
        .into_iter()
        .collect();
        let at: Vec<usize> = order
            .iter()
            .map(|s| {
                html.find(s)
                    .unwrap_or_else(|| panic!("{s} missing: {html}"))
            })
            .collect();
        assert!(
            at.windows(2).all(|w| w[0] < w[1]),
            "grouped in order: {html}"
        );
        assert!(
            html.contains("Pool team-a/web <small>1 of 2 Ready</small>"),
            "{html}"
        );
        assert!(
            html.contains("Not in a pool <small>1 of 1 Ready</small>"),
            "{html}"
        );
        // No pools, no group rows.
        assert!(!fragment_at(&[proxy("alone", true)], None, NOW).contains("class=\"pool\""));
    }

    #[test]
    fn escapes_markup_and_quotes() {
        assert_eq!(
            escape(r#"<script>alert('x')</script>&"#),
            "&lt;script&gt;alert(&#39;x&#39;)&lt;/script&gt;&amp;"
        );
        assert_eq!(escape(r#"a"b"#), "a&quot;b");
    }

    #[test]
    fn ages_like_kubectl() {
        assert_eq!(age(-5), "0s");
        assert_eq!(age(59), "59s");
        assert_eq!(age(60), "1m");
        assert_eq!(age(7200), "2h");
        assert_eq!(age(3 * 86400 + 5), "3d");
    }

    #[test]
    fn fragment_shows_ready_and_not_ready_proxies_escaped() {
        let mut hostile = (*proxy("evil", false)).clone();
        hostile.spec.provider = "<img src=x onerror=alert(1)>".into();
        let html = fragment_at(&[proxy("web", true), Arc::new(hostile)], None, NOW);
        assert!(html.contains("1 of 2 Ready"), "{html}");
        assert!(html.contains(r#"<span class="badge ok">Ready</span>"#));
        assert!(html.contains("203.0.113.7:3128"));
        assert!(html.contains("42 ms"));
        assert!(html.contains("<td>2h</td>"));
        assert!(html.contains(r#"<span class="badge bad">Unhealthy</span>"#));
        assert!(html.contains("probe &lt;failed&gt;"));
        assert!(!html.contains("<img"), "{html}");
        assert!(html.contains("&lt;img src=x onerror=alert(1)&gt;"));
        assert!(html.contains("Provider health is not available"));
    }

    #[test]
    fn fragment_lists_provider_targets() {
        let mut ph = ProviderHealth::new("hetzner", Default::default());
        ph.status = Some(ProviderHealthStatus {
            type_: Some("hetzner".into()),
            check_supported: Some(true),
            targets: vec![TargetHealth {
                target: "api.hetzner.cloud".into(),
                ready: true,
                reason: "Reachable".into(),
                message: String::new(),
                details: Default::default(),
                last_transition_time: Time(Timestamp::from_second(NOW - 30).unwrap()),
            }],
            last_check_time: Some(Time(Timestamp::from_second(NOW - 30).unwrap())),
            load_error: Some("hetzner.wasm: <bad> component".into()),
            plugin: None,
        });
        let html = fragment_at(&[], Some(&[Arc::new(ph)]), NOW);
        assert!(
            html.contains(
                r#"<div class="msg load-error">hetzner.wasm: &lt;bad&gt; component</div>"#
            ),
            "{html}"
        );
        assert!(html.contains("No Proxy objects."));
        assert!(
            html.contains(r#"<td class="target">api.hetzner.cloud</td>"#),
            "{html}"
        );
        assert!(html.contains("<td>Reachable</td>"));
        assert!(html.contains("<td>30s ago</td>"));
    }

    #[test]
    fn the_fleets_cost_is_shown_per_provider_and_currency() {
        let html = fragment_at(&[proxy("a", true)], None, NOW);
        assert!(html.contains("No prices known"), "{html}");
        let priced = |name: &str, per_hour: &str| {
            let mut p = (*proxy(name, true)).clone();
            p.status.as_mut().unwrap().hourly_price = Some(crate::api::HourlyPrice {
                currency: "EUR".into(),
                per_hour: per_hour.into(),
            });
            Arc::new(p)
        };
        let html = fragment_at(
            &[
                priced("a", "0.0125"),
                priced("b", "0.0075"),
                proxy("c", true),
            ],
            None,
            NOW,
        );
        assert!(
            html.contains(r#"<tr class="cost"><td>hetzner</td><td>0.02 EUR</td><td>2</td></tr>"#),
            "{html}"
        );
    }

    #[test]
    fn page_embeds_content_only_when_given() {
        let with = page(Some("<p>DATA</p>"));
        assert!(with.contains("<p>DATA</p>"));
        let without = page(None);
        assert!(!without.contains("DATA"));
        assert!(without.contains("#token=TOKEN"));
        // The CSP hash matches the script as embedded.
        assert!(content_security_policy().contains("script-src 'sha256-"));
        assert!(with.contains(&script()));
    }
}
