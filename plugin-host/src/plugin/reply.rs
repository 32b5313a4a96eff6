//! What a plugin's answer must satisfy before the operator uses it: the one place where
//! data crosses from the guest into the operator's status, events, logs and probes.
//!
//! A reply is accepted whole or not at all. An instance ID, IP or UID that fails a rule
//! fails the call (Transient: the reconciler retries with backoff; the message names the
//! field and the rule), so a hostile or broken plugin can never put a secret into
//! `status.providerID`, point the health prober at the pod network, or crash a formatter
//! with a date past year 9999. Free text (error messages, health-check messages) is not a
//! reason to fail: it is scrubbed, escaped and cut instead.
//!
//! A health check's answer is structured here, because it is published where a Proxy's
//! status is not: `ProviderHealth` is cluster-scoped and readable by everyone with `view`
//! (the discovery-reader role aggregates into it), and its target names are the label of a
//! metric. So a target's name is a bounded identifier that holds no whole sensitive value
//! (else it becomes `invalid#<n>`, not ready, reason `InvalidTargetName`), its reason a
//! CamelCase word that holds none (else `Unknown`), its details bounded tokens under
//! camelCase keys (others are dropped). Its message is scrubbed free text like any other,
//! for the operator's log only: the operator never publishes it.

use super::guest::{GuestError, GuestReply, PluginInfo, RawInstance};
use crate::policy::instance_address_problem;
use crate::provider::{Price, State, TargetStatus};
use crate::redact::{Redactor, cut, escape_controls};
use std::net::IpAddr;

/// Longest instance ID (EC2 `i-` IDs are 19 bytes, region-scoped IDs a few more).
pub const MAX_ID: usize = 256;
/// Longest UID read back from a mark (Kubernetes UIDs are 36).
pub const MAX_UID: usize = 128;
/// Most instances in one `list-by-tag` answer. Below what [`MAX_LIFT_BYTES`] lets through
/// (each instance costs the host 104 bytes before its strings in contract 0.1.0, 160 in
/// 0.2.0 and 0.3.0), so the count is the rule a list that is merely long breaks.
pub const MAX_LIST: usize = 18_000;
/// Defined with the fit, which counts it per call.
pub use crate::config::fit::MAX_LIFT_BYTES;
/// Longest error message or health-check message kept; the rest is cut.
pub const MAX_TEXT: usize = 4096;
/// Longest short label (error code) kept.
pub const MAX_LABEL: usize = 256;
/// Most health-check targets kept.
pub const MAX_TARGETS: usize = 256;
/// Longest health-check target name, reason and detail key (a DNS label's length).
pub const MAX_NAME: usize = 63;
/// Most details of one health-check target kept.
pub const MAX_DETAILS: usize = 16;
/// Longest health-check detail value kept.
pub const MAX_DETAIL_VALUE: usize = 64;
/// The reason of a target whose plugin gave none fit to publish.
pub const UNKNOWN_REASON: &str = "Unknown";
/// The reason of a target whose name the host replaced.
pub const INVALID_TARGET_NAME: &str = "InvalidTargetName";
/// Latest `created-at` accepted: 9999-12-31T23:59:59Z, the end of RFC 3339.
pub const MAX_CREATED_AT: u64 = 253_402_300_799;

/// Per-provider rules.
#[derive(Debug, Clone, Default)]
pub struct Rules {
    /// The provider entry's `allowPrivateAddresses`.
    pub allow_private_addresses: bool,
}

/// Checks and cleans one reply. `Err` says which field broke which rule, without quoting a
/// value that holds something sensitive.
pub(crate) fn check(reply: GuestReply, rules: &Rules, r: &Redactor) -> Result<GuestReply, String> {
    Ok(match reply {
        GuestReply::Info(i) => GuestReply::Info(info(i)?),
        GuestReply::Unit(res) => GuestReply::Unit(res.map_err(|e| error(e, r))),
        GuestReply::Id(Ok(id)) => {
            if id.is_empty() {
                return Err("create returned an empty provider ID".into());
            }
            GuestReply::Id(Ok(ident("id", id, MAX_ID, r)?))
        }
        GuestReply::Id(Err(e)) => GuestReply::Id(Err(error(e, r))),
        GuestReply::Instance(Ok(i)) => GuestReply::Instance(Ok(instance("instance", i, rules, r)?)),
        GuestReply::Instance(Err(e)) => GuestReply::Instance(Err(error(e, r))),
        GuestReply::List(Ok(list)) => {
            if list.len() > MAX_LIST {
                return Err(format!(
                    "list-by-tag returned {} instances, more than {MAX_LIST}",
                    list.len()
                ));
            }
            let mut out = Vec::with_capacity(list.len());
            for (n, i) in list.into_iter().enumerate() {
                out.push(instance(&format!("instances[{n}]"), i, rules, r)?);
            }
            GuestReply::List(Ok(out))
        }
        GuestReply::List(Err(e)) => GuestReply::List(Err(error(e, r))),
        GuestReply::Quote(Ok(p)) => {
            GuestReply::Quote(Ok(p.map(|p| price("quote", p)).transpose()?))
        }
        GuestReply::Quote(Err(e)) => GuestReply::Quote(Err(error(e, r))),
        GuestReply::Check(targets) => {
            let mut names = std::collections::BTreeSet::new();
            GuestReply::Check(
                targets
                    .into_iter()
                    .take(MAX_TARGETS)
                    .enumerate()
                    .map(|(n, t)| target(n, t, &mut names, r))
                    .collect(),
            )
        }
    })
}

/// One health-check target, structured (see the module docs). `names` are the names kept
/// so far: a repeated one is replaced too (ProviderHealth keys its targets by name).
fn target(
    n: usize,
    t: TargetStatus,
    names: &mut std::collections::BTreeSet<String>,
    r: &Redactor,
) -> TargetStatus {
    let message = text(&t.message, MAX_TEXT, r);
    let named = is_name(&t.target, |b| {
        b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.')
    }) && !r.finds_whole(&t.target)
        && !names.contains(&t.target);
    if !named {
        // Never the plugin's name: `#` is outside what a plugin's name may hold, so the
        // replacement cannot be taken by another target.
        let target = format!("invalid#{n}");
        names.insert(target.clone());
        return TargetStatus {
            target,
            ready: false,
            reason: INVALID_TARGET_NAME.into(),
            message: format!(
                "target {n}'s name is not an identifier of 1 to {MAX_NAME} letters, digits, \
                 '-', '_' or '.', repeats another's, or holds a secret of this provider \
                 (value withheld); the plugin said: {message}"
            ),
            details: Vec::new(),
        };
    }
    names.insert(t.target.clone());
    let reason = if t.reason.starts_with(|c: char| c.is_ascii_uppercase())
        && is_name(&t.reason, |b| b.is_ascii_alphanumeric())
        && !r.finds_whole(&t.reason)
    {
        t.reason
    } else {
        UNKNOWN_REASON.into()
    };
    let details = t
        .details
        .into_iter()
        .filter(|(k, v)| {
            k.starts_with(|c: char| c.is_ascii_alphabetic())
                && is_name(k, |b| b.is_ascii_alphanumeric())
                && is_token(v)
                && !r.finds_whole(k)
                && !r.finds_whole(v)
        })
        .take(MAX_DETAILS)
        .collect();
    TargetStatus {
        target: t.target,
        ready: t.ready,
        reason,
        message,
        details,
    }
}

/// 1 to [`MAX_NAME`] bytes, each one `ok` accepts, starting with a letter or digit.
fn is_name(v: &str, ok: impl Fn(u8) -> bool) -> bool {
    (1..=MAX_NAME).contains(&v.len())
        && v.starts_with(|c: char| c.is_ascii_alphanumeric())
        && v.bytes().all(ok)
}

/// A detail value: a number, a version, an endpoint, an account name; 1 to
/// [`MAX_DETAIL_VALUE`] bytes without spaces (no sentences: no free text).
fn is_token(v: &str) -> bool {
    (1..=MAX_DETAIL_VALUE).contains(&v.len())
        && v.bytes().all(|b| {
            b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b':' | b'/' | b'+' | b'@')
        })
}

fn instance(
    field: &str,
    i: RawInstance,
    rules: &Rules,
    r: &Redactor,
) -> Result<RawInstance, String> {
    let id = ident(&format!("{field}.id"), i.id, MAX_ID, r)?;
    let uid = if i.uid.is_empty() {
        i.uid
    } else {
        ident(&format!("{field}.uid"), i.uid, MAX_UID, r)?
    };
    let ip = address(&format!("{field}.ip"), i.ip, rules)?;
    let ipv6 = address(&format!("{field}.ipv6"), i.ipv6, rules)?;
    if !ipv6.is_empty() && !ipv6.contains(':') {
        return Err(format!("{field}.ipv6 {ipv6} is not an IPv6 address"));
    }
    if let Some((seconds, nanoseconds)) = i.created_at
        && (seconds > MAX_CREATED_AT || nanoseconds >= 1_000_000_000)
    {
        return Err(format!(
            "{field}.created-at ({seconds} s, {nanoseconds} ns) is not a date between 1970 and 9999"
        ));
    }
    if i.interrupted && !matches!(i.state, State::Stopped | State::Terminated) {
        return Err(format!(
            "{field}.interrupted is set on a {} instance; only a stopped or terminated one can have been reclaimed",
            i.state.as_str()
        ));
    }
    let hourly_price = i
        .hourly_price
        .map(|p| price(&format!("{field}.hourly-price"), p))
        .transpose()?;
    Ok(RawInstance {
        id,
        ip,
        ipv6,
        uid,
        hourly_price,
        ..i
    })
}

/// A price: an ISO 4217 currency code (three capital letters) and an amount.
fn price(field: &str, p: Price) -> Result<Price, String> {
    if p.currency.len() != 3 || !p.currency.bytes().all(|b| b.is_ascii_uppercase()) {
        return Err(format!(
            "{field}.currency {} is not an ISO 4217 code (three capital letters, e.g. EUR)",
            quote(&p.currency)
        ));
    }
    Ok(p)
}

/// An identifier: non-empty printable ASCII without spaces, at most `max` bytes, holding
/// nothing sensitive.
fn ident(field: &str, v: String, max: usize, r: &Redactor) -> Result<String, String> {
    if r.finds_whole(&v) {
        return Err(format!(
            "{field} holds a secret of this provider: a Proxy's credentials, a provider \
             secret or a cloud-init, in some form (value withheld)"
        ));
    }
    if v.len() > max {
        return Err(format!(
            "{field} is {} bytes long, more than {max}",
            v.len()
        ));
    }
    if v.is_empty() || !v.bytes().all(|b| b.is_ascii_graphic()) {
        return Err(format!(
            "{field} {} must be printable ASCII without spaces or control characters",
            quote(&v)
        ));
    }
    Ok(v)
}

/// An instance address: empty (none yet), or a plain IPv4/IPv6 address that is public
/// unless the provider allows private ones. The unspecified address means "none yet"
/// (backends report `0.0.0.0` while an IP is being assigned) and becomes empty.
fn address(field: &str, v: String, rules: &Rules) -> Result<String, String> {
    if v.is_empty() {
        return Ok(v);
    }
    // No redaction check: a plain address is not text, and cloud-init often names
    // addresses (`Allow 10.0.0.0/8`, `Listen 127.0.0.1`) that instances may have.
    let Ok(ip) = v.parse::<IpAddr>() else {
        return Err(format!(
            "{field} {} is not an IPv4 or IPv6 address",
            quote(&v)
        ));
    };
    if ip.is_unspecified() {
        return Ok(String::new());
    }
    // Never one of the operator's own addresses (a public one on IPv6 clusters): it would
    // be probed with the Proxy's credentials and published as a proxy. Loopback follows
    // the private rule (emulators on 127.0.0.1 in labs and tests).
    if !ip.is_loopback() {
        match super::interfaces::own_addresses() {
            Ok(own) if own.contains(&ip) => {
                return Err(format!(
                    "{field} {ip} is one of the operator's own addresses, never an instance's"
                ));
            }
            Ok(_) => {}
            Err(e) => {
                return Err(format!(
                    "{field} {ip} cannot be checked against the operator's own addresses ({e})"
                ));
            }
        }
    }
    match instance_address_problem(ip, rules.allow_private_addresses) {
        None => Ok(ip.to_string()),
        Some(kind) if matches!(kind, "multicast" | "broadcast") => {
            Err(format!("{field} {ip} is a {kind} address"))
        }
        Some(kind) => Err(format!(
            "{field} {ip} is a {kind} address; the operator probes instance addresses from inside the cluster, so it accepts internal ones only when the provider entry sets allowPrivateAddresses: true"
        )),
    }
}

fn error(e: GuestError, r: &Redactor) -> GuestError {
    GuestError {
        message: text(&e.message, MAX_TEXT, r),
        code: e.code.map(|c| text(&c, MAX_LABEL, r)),
        ..e
    }
}

/// Free text: scrubbed, one line, cut to `max` bytes.
pub(crate) fn text(v: &str, max: usize, r: &Redactor) -> String {
    r.scrub_line(v, max)
}

/// A value for an error message: escaped and short.
fn quote(v: &str) -> String {
    format!("{:?}", cut(&escape_controls(v), 64))
}

fn info(i: PluginInfo) -> Result<PluginInfo, String> {
    if !crate::config::is_dns1123_label(&i.type_name) {
        return Err(format!(
            "info.type-name {} must be a DNS-1123 label (1 to 63 lowercase letters, digits or '-')",
            quote(&i.type_name)
        ));
    }
    let printable = |s: &str, max: usize| {
        s.len() <= max && s.bytes().all(|b| b.is_ascii_graphic() || b == b' ')
    };
    if !printable(&i.version, 64) {
        return Err(format!(
            "info.version {} must be printable ASCII of at most 64 bytes",
            quote(&i.version)
        ));
    }
    if i.default_hosts.len() > 64 || i.default_hosts.iter().any(|h| !printable(h, 300)) {
        return Err(
            "info.default-hosts must be at most 64 printable entries of at most 300 bytes".into(),
        );
    }
    if i.profile.len() > 64
        || i.profile
            .iter()
            .any(|(k, v)| !printable(k, MAX_LABEL) || !printable(v, MAX_LABEL))
    {
        return Err(format!(
            "info.profile must be at most 64 printable pairs of at most {MAX_LABEL} bytes"
        ));
    }
    if let Some(crate::rate::Spec { per_hour, burst }) = i.default_budget
        && (per_hour == 0 || burst == 0)
    {
        return Err(format!(
            "info.default-budget (requests-per-hour = {per_hour}, burst = {burst}) must allow at least one request; leave it out for no default"
        ));
    }
    Ok(i)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn inst(id: &str, ip: &str, uid: &str, secs: Option<u64>) -> RawInstance {
        RawInstance {
            id: id.into(),
            ip: ip.into(),
            ipv6: String::new(),
            state: State::Running,
            uid: uid.into(),
            created_at: secs.map(|seconds| (seconds, 0)),
            interrupted: false,
            hourly_price: None,
        }
    }

    fn redactor() -> Redactor {
        Redactor::new(
            [&b"tok-SECRET-5678"[..]],
            b"#cloud-config\nwrite_files:\n  - content: proxyuser:Hunter2Sentinel\nruncmd:\n  - aws configure set region eu-west-1\n  - echo Allow 10.1.2.3 >> /etc/x\n",
        )
    }

    /// Every rule a reply's instance must satisfy: (case, instance, allow private, error part).
    #[test]
    fn instance_rules() {
        let long = "a".repeat(MAX_ID + 1);
        let cases: Vec<(&str, RawInstance, bool, Option<&str>)> = vec![
            (
                "fine",
                inst("fsn1/42", "95.216.1.2", "u-1", Some(1_700_000_000)),
                false,
                None,
            ),
            ("no ip yet", inst("fsn1/42", "", "", None), false, None),
            (
                "documentation range",
                inst("a", "203.0.113.10", "u", None),
                false,
                None,
            ),
            (
                "loopback",
                inst("a", "127.0.0.1", "u", None),
                false,
                Some("loopback"),
            ),
            (
                "loopback allowed",
                inst("a", "127.0.0.1", "u", None),
                true,
                None,
            ),
            (
                "metadata",
                inst("a", "169.254.169.254", "u", None),
                true,
                None,
            ),
            (
                "metadata refused",
                inst("a", "169.254.169.254", "u", None),
                false,
                Some("allowPrivateAddresses"),
            ),
            (
                "mapped loopback",
                inst("a", "::ffff:127.0.0.1", "u", None),
                false,
                Some("IPv4-mapped"),
            ),
            (
                "ipv6 loopback",
                inst("a", "::1", "u", None),
                false,
                Some("loopback"),
            ),
            (
                "not an ip",
                inst("a", "localhost", "u", None),
                true,
                Some("not an IPv4 or IPv6"),
            ),
            (
                "ip with port",
                inst("a", "1.2.3.4:80", "u", None),
                false,
                Some("not an IPv4"),
            ),
            (
                "bracketed",
                inst("a", "[2a01:4f8::1]", "u", None),
                false,
                Some("not an IPv4"),
            ),
            (
                "octal-looking",
                inst("a", "0127.0.0.1", "u", None),
                false,
                Some("not an IPv4"),
            ),
            (
                "multicast",
                inst("a", "224.0.0.1", "u", None),
                true,
                Some("multicast"),
            ),
            (
                "newline in id",
                inst("a\nb", "", "u", None),
                false,
                Some("control characters"),
            ),
            (
                "space in id",
                inst("a b", "", "u", None),
                false,
                Some("without spaces"),
            ),
            (
                "huge id",
                inst(&long, "", "u", None),
                false,
                Some("more than 256"),
            ),
            (
                "empty id",
                inst("", "", "u", None),
                false,
                Some("printable"),
            ),
            (
                "secret as id",
                inst("tok-SECRET-5678", "", "u", None),
                false,
                Some("value withheld"),
            ),
            (
                "region named in cloud-init",
                inst("eu-west-1/i-0abc", "", "u", None),
                false,
                None,
            ),
            (
                "address named in cloud-init",
                inst("a", "10.1.2.3", "u", None),
                true,
                None,
            ),
            (
                "the secret inside an id",
                inst("x-tok-SECRET-5678-y", "", "u", None),
                false,
                Some("value withheld"),
            ),
            (
                "year 10000",
                inst("a", "", "u", Some(MAX_CREATED_AT + 1)),
                false,
                Some("created-at"),
            ),
            (
                "u64 max",
                inst("a", "", "u", Some(u64::MAX)),
                false,
                Some("created-at"),
            ),
        ];
        let r = redactor();
        for (what, i, allow, want) in cases {
            let rules = Rules {
                allow_private_addresses: allow,
            };
            let got = check(GuestReply::Instance(Ok(i)), &rules, &r);
            match (want, got) {
                (None, Ok(_)) => {}
                (Some(part), Err(e)) => {
                    assert!(e.contains(part), "{what}: {e}");
                    assert!(
                        !e.contains("Hunter2") && !e.contains("SECRET"),
                        "{what}: {e}"
                    );
                }
                (want, got) => panic!("{what}: want {want:?}, got {:?}", got.map(|_| ())),
            }
        }
    }

    /// An address of the operator's own interfaces is never an instance's, even where
    /// private addresses are allowed; loopback follows the private rule.
    #[test]
    fn the_operators_own_addresses_are_never_an_instances() {
        let own = super::super::interfaces::own_addresses().expect("interfaces listed");
        let rules = Rules {
            allow_private_addresses: true,
        };
        let reply = |ip: &str| {
            check(
                GuestReply::Instance(Ok(inst("a", ip, "u", None))),
                &rules,
                &Redactor::default(),
            )
        };
        assert!(
            reply("127.0.0.1").is_ok(),
            "loopback with private addresses allowed"
        );
        let Some(mine) = own.iter().find(|a| !a.is_loopback()) else {
            // Not a missing tool: a machine (a network namespace) with loopback only.
            eprintln!("SKIPPED in part: this machine has no interface address but loopback");
            return;
        };
        let e = reply(&mine.to_string()).map(|_| ()).unwrap_err();
        assert!(e.contains("the operator's own addresses"), "{e}");
    }

    #[test]
    fn unspecified_address_means_none_yet() {
        let got = check(
            GuestReply::Instance(Ok(inst("a", "0.0.0.0", "u", None))),
            &Rules::default(),
            &Redactor::default(),
        );
        let Ok(GuestReply::Instance(Ok(i))) = got else {
            panic!("accepted")
        };
        assert_eq!(i.ip, "");
    }

    #[test]
    fn a_list_is_accepted_whole_or_not_at_all() {
        let r = Redactor::default();
        let good = vec![inst("a", "1.1.1.1", "u", None), inst("b", "", "", None)];
        assert!(check(GuestReply::List(Ok(good.clone())), &Rules::default(), &r).is_ok());
        let mut bad = good;
        bad.push(inst("c", "10.0.0.1", "u", None));
        let e = check(GuestReply::List(Ok(bad)), &Rules::default(), &r)
            .err()
            .unwrap();
        assert!(e.contains("instances[2].ip"), "{e}");
    }

    #[test]
    fn errors_and_check_results_are_scrubbed_escaped_and_cut() {
        let r = redactor();
        let e = GuestError {
            class: crate::provider::Class::Transient,
            retry_after_ms: None,
            message: format!("leak tok-SECRET-5678\nFAKE LOG LINE {}", "x".repeat(10_000)),
            code: Some("tok-SECRET-5678".into()),
        };
        let Ok(GuestReply::Unit(Err(e))) = check(GuestReply::Unit(Err(e)), &Rules::default(), &r)
        else {
            panic!("errors pass")
        };
        assert!(!e.message.contains("SECRET") && !e.message.contains('\n'));
        assert!(e.message.len() < MAX_TEXT + 64, "{}", e.message.len());
        assert_eq!(e.code.as_deref(), Some("[REDACTED]"));
    }

    /// What a check answer may publish: bounded identifiers and tokens holding no whole
    /// sensitive value. A Proxy's password as a name, a reason or a detail, raw or encoded,
    /// is withheld; the honest answers of the shipped plugins pass unchanged.
    #[test]
    fn check_results_are_structured() {
        const PASS: &str = "Kx9qSENTINELpw7Zb2";
        let mut p = crate::redact::Patterns::default();
        p.credentials(b"proxyuserSENTINEL", PASS.as_bytes());
        let r = p.build();
        let t = |target: &str, reason: &str, details: &[(&str, &str)]| TargetStatus {
            target: target.into(),
            ready: true,
            reason: reason.into(),
            message: format!("the password is {PASS}"),
            details: details
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
        };
        let b64 = data_encoding::BASE64URL_NOPAD.encode(PASS.as_bytes());
        let answer = vec![
            t(
                "eu-west-1",
                "Reachable",
                &[
                    ("managedInstances", "5+"),
                    ("endpoint", "ec2.eu-west-1.amazonaws.com:443"),
                    ("version", "pve-manager/8.1.4/ec5affc9e41f1d79"),
                    ("account", "ops@example.com"),
                    ("leak", PASS),
                    ("encoded", &b64),
                    ("sentence", "the password is in the message"),
                    ("bad key", "1"),
                    ("x", &"9".repeat(MAX_DETAIL_VALUE + 1)),
                ],
            ),
            t("api", "X", &[]),
            t(PASS, "Reachable", &[]),
            t(&format!("i-{b64}"), "Reachable", &[]),
            t("api", "Reachable", &[]),
            t("has space", "Reachable", &[]),
            t("fsn1", &format!("K{PASS}"), &[]),
            t("nbg1", "rate_limited", &[]),
            t("hel1", "", &[]),
        ];
        let Ok(GuestReply::Check(got)) = check(GuestReply::Check(answer), &Rules::default(), &r)
        else {
            panic!("checks pass")
        };
        let summary: Vec<(String, bool, String, Vec<String>)> = got
            .iter()
            .map(|t| {
                (
                    t.target.clone(),
                    t.ready,
                    t.reason.clone(),
                    t.details.iter().map(|(k, v)| format!("{k}={v}")).collect(),
                )
            })
            .collect();
        let row = |target: &str, ready, reason: &str, details: &[&str]| {
            (
                target.to_string(),
                ready,
                reason.to_string(),
                details.iter().map(|d| d.to_string()).collect::<Vec<_>>(),
            )
        };
        assert_eq!(
            summary,
            [
                row(
                    "eu-west-1",
                    true,
                    "Reachable",
                    &[
                        "managedInstances=5+",
                        "endpoint=ec2.eu-west-1.amazonaws.com:443",
                        "version=pve-manager/8.1.4/ec5affc9e41f1d79",
                        "account=ops@example.com",
                    ]
                ),
                row("api", true, "X", &[]),
                row("invalid#2", false, INVALID_TARGET_NAME, &[]),
                row("invalid#3", false, INVALID_TARGET_NAME, &[]),
                row("invalid#4", false, INVALID_TARGET_NAME, &[]),
                row("invalid#5", false, INVALID_TARGET_NAME, &[]),
                row("fsn1", true, UNKNOWN_REASON, &[]),
                row("nbg1", true, UNKNOWN_REASON, &[]),
                row("hel1", true, UNKNOWN_REASON, &[]),
            ]
        );
        // The message (for the operator's log) is scrubbed, and says why a name went.
        let all = format!("{got:?}");
        assert!(!all.contains("SENTINEL"), "{all}");
        assert!(
            got[2].message.contains("value withheld"),
            "{}",
            got[2].message
        );
        // Bounded: at most MAX_TARGETS targets of MAX_DETAILS details.
        let many = (0..MAX_TARGETS + 10)
            .map(|i| {
                let details: Vec<(String, String)> =
                    (0..40).map(|d| (format!("k{d}"), d.to_string())).collect();
                TargetStatus {
                    details,
                    ..t(&format!("t{i}"), "Reachable", &[])
                }
            })
            .collect();
        let Ok(GuestReply::Check(got)) = check(GuestReply::Check(many), &Rules::default(), &r)
        else {
            panic!("checks pass")
        };
        assert_eq!(got.len(), MAX_TARGETS);
        assert!(got.iter().all(|t| t.details.len() == MAX_DETAILS));
    }

    #[test]
    fn info_rules() {
        let base = PluginInfo {
            type_name: "hetzner".into(),
            version: "0.1.0".into(),
            has_check: true,
            default_hosts: vec!["https://api.hetzner.cloud".into()],
            profile: vec![("create".into(), "sync".into())],
            default_budget: Some(crate::rate::Spec {
                per_hour: 3600,
                burst: 100,
            }),
            lists_recent: true,
        };
        assert!(info(base.clone()).is_ok());
        let bad = [
            PluginInfo {
                type_name: "Bad Name".into(),
                ..base.clone()
            },
            PluginInfo {
                version: "1\n2".into(),
                ..base.clone()
            },
            PluginInfo {
                profile: vec![("k".into(), "v\u{1b}[31m".into())],
                ..base.clone()
            },
        ];
        for i in bad {
            assert!(info(i.clone()).is_err(), "{i:?}");
        }
    }

    /// What wasmtime's hostcall fuel charges for a `list-by-tag` reply: each element's
    /// host size (its version's generated type) plus the bytes of its strings. The bound
    /// lets the lists the operator must handle through and stops the count rule from
    /// being unreachable, for every version served.
    #[test]
    fn the_lift_bound_fits_the_lists_it_must_carry() {
        let sizes = [
            (
                "0.1.0",
                std::mem::size_of::<super::super::abi::v0_1::egress::provider::types::Instance>(),
            ),
            (
                "0.2.0",
                std::mem::size_of::<super::super::abi::v0_2::egress::provider::types::Instance>(),
            ),
            (
                "0.3.0",
                std::mem::size_of::<super::super::abi::v0_3::egress::provider::types::Instance>(),
            ),
        ];
        assert_eq!(
            sizes.map(|(_, n)| n),
            [104, 160, 160],
            "update MAX_LIST's doc"
        );
        for (version, per_instance) in sizes {
            // The 10,000-Proxy scale run: IDs up to 64 bytes, an IPv4 and the longest IPv6
            // text, a UID.
            let scale = 10_000 * (per_instance + 64 + 15 + 39 + 36);
            assert!(
                scale <= MAX_LIFT_BYTES,
                "{version}: {scale} > {MAX_LIFT_BYTES}"
            );
            // MAX_LIST instances of one-byte IDs pass the lift, so the count rule can fire.
            let longest_count = MAX_LIST * (per_instance + 1);
            assert!(
                longest_count <= MAX_LIFT_BYTES,
                "{version}: {longest_count} > {MAX_LIFT_BYTES}"
            );
        }
    }
}
