//! Pure outbound-HTTP policy: which URLs a provider may request and which addresses it may
//! connect to. No I/O here, so every rule is a table test.
//!
//! Two checks, because a name can resolve anywhere: the allow-list is matched against the
//! request's scheme, host and port before anything is sent, and every resolved address is
//! checked again before connecting. Loopback, private, link-local (cloud metadata) and other
//! internal ranges are refused unless the matching allow-list entry is that IP literal, so a
//! plugin allowed `api.example.com` cannot reach the cluster network by DNS tricks.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

/// One allow-list entry: scheme, host (or `*.` suffix pattern, or IP literal) and port.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AllowRule {
    pub scheme: Scheme,
    pub host: HostPattern,
    pub port: u16,
    /// From the plugin's own `default-hosts` (public DNS names only): looked up as an
    /// absolute name, never under the pod's search domains (see [`lookup_name`]).
    pub public_name: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scheme {
    Http,
    Https,
}

impl Scheme {
    fn default_port(self) -> u16 {
        match self {
            Scheme::Http => 80,
            Scheme::Https => 443,
        }
    }

    fn parse(s: &str) -> Option<Scheme> {
        match s.to_ascii_lowercase().as_str() {
            "http" => Some(Scheme::Http),
            "https" => Some(Scheme::Https),
            _ => None,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HostPattern {
    /// An exact DNS name, lowercase.
    Name(String),
    /// `*.example.com`: any name with at least one more label in front.
    Suffix(String),
    /// An IP literal: also permits connecting to that address even when it is internal.
    Ip(IpAddr),
}

/// Why an allow-list entry did not parse.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("allow-list entry {entry:?}: {reason}")]
pub struct RuleError {
    pub entry: String,
    pub reason: &'static str,
}

impl std::str::FromStr for AllowRule {
    type Err = RuleError;

    /// Accepts `scheme://host[:port]`; the scheme is required so that `http` is never
    /// allowed by accident where `https` was meant.
    fn from_str(entry: &str) -> Result<Self, RuleError> {
        let err = |reason| RuleError {
            entry: entry.to_string(),
            reason,
        };
        let (scheme, rest) = entry
            .split_once("://")
            .ok_or_else(|| err("expected scheme://host[:port]"))?;
        let scheme = Scheme::parse(scheme).ok_or_else(|| err("scheme must be http or https"))?;
        let rest = rest.strip_suffix('/').unwrap_or(rest);
        if rest.contains(['/', '?', '#', '@']) {
            return Err(err(
                "only scheme, host and port are allowed (no path or user)",
            ));
        }
        let (host, port) = split_host_port(rest).ok_or_else(|| err("bad port"))?;
        let port = port.unwrap_or(scheme.default_port());
        if host.is_empty() {
            return Err(err("empty host"));
        }
        let host = if let Some(ip) = parse_ip(host) {
            HostPattern::Ip(ip)
        } else if let Some(suffix) = host.strip_prefix("*.") {
            if !valid_dns_name(suffix) || !suffix.contains('.') {
                return Err(err(
                    "wildcard needs a domain with at least two labels after *.",
                ));
            }
            HostPattern::Suffix(suffix.to_ascii_lowercase())
        } else if valid_dns_name(host) {
            HostPattern::Name(host.to_ascii_lowercase())
        } else {
            return Err(err("host is neither a DNS name nor an IP address"));
        };
        Ok(AllowRule {
            scheme,
            host,
            port,
            public_name: false,
        })
    }
}

impl std::fmt::Display for AllowRule {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let scheme = match self.scheme {
            Scheme::Http => "http",
            Scheme::Https => "https",
        };
        match &self.host {
            HostPattern::Name(n) => write!(f, "{scheme}://{n}:{}", self.port),
            HostPattern::Suffix(s) => write!(f, "{scheme}://*.{s}:{}", self.port),
            HostPattern::Ip(IpAddr::V6(ip)) => write!(f, "{scheme}://[{ip}]:{}", self.port),
            HostPattern::Ip(ip) => write!(f, "{scheme}://{ip}:{}", self.port),
        }
    }
}

fn split_host_port(s: &str) -> Option<(&str, Option<u16>)> {
    if let Some(rest) = s.strip_prefix('[') {
        let (host, after) = rest.split_once(']')?;
        return match after.strip_prefix(':') {
            Some(p) => Some((host, Some(p.parse().ok()?))),
            None if after.is_empty() => Some((host, None)),
            None => None,
        };
    }
    match s.rsplit_once(':') {
        Some((h, p)) => Some((h, Some(p.parse().ok()?))),
        None => Some((s, None)),
    }
}

fn parse_ip(host: &str) -> Option<IpAddr> {
    host.trim_start_matches('[')
        .trim_end_matches(']')
        .parse()
        .ok()
}

/// Dot-separated labels of letters, digits and '-' (not at either end), 63 each, 253 in all.
pub(crate) fn valid_dns_name(name: &str) -> bool {
    name.len() <= 253
        && name.split('.').all(|label| {
            !label.is_empty()
                && label.len() <= 63
                && label
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'-')
                && !label.starts_with('-')
                && !label.ends_with('-')
        })
}

/// The request as the policy sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Target<'a> {
    pub scheme: Scheme,
    pub host: &'a str,
    pub port: u16,
}

impl<'a> Target<'a> {
    /// From the parts of a request URI; `None` when the URI lacks a usable scheme or host.
    pub fn from_parts(scheme: &str, host: &'a str, port: Option<u16>) -> Option<Self> {
        let scheme = Scheme::parse(scheme)?;
        if host.is_empty() {
            return None;
        }
        Some(Target {
            scheme,
            host,
            port: port.unwrap_or(scheme.default_port()),
        })
    }
}

/// A provider's allow-list. Deny by default: an empty list allows nothing.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct AllowList {
    rules: Vec<AllowRule>,
}

/// The decision for a request target, before any DNS.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decision {
    /// Not on the allow-list.
    Denied,
    /// Allowed; connect only to addresses [`address_problem`] finds nothing wrong with.
    Allowed {
        /// IP literals named by the matching entries: the only internal addresses allowed.
        explicit: Vec<IpAddr>,
        /// Only plugin default hosts match: the name is looked up as an absolute name.
        absolute: bool,
    },
}

/// The name to look up for `host`: with a final dot (absolute, so the resolver never tries
/// it under the pod's search domains first) when `absolute`. With the `ndots:5` of a
/// Kubernetes pod, `api.hetzner.cloud` is first tried as `api.hetzner.cloud.<ns>.svc...`,
/// names a tenant's Service could answer; an admin's entry may mean a short Service name and
/// is looked up as written.
pub fn lookup_name(host: &str, absolute: bool) -> std::borrow::Cow<'_, str> {
    if absolute && !host.ends_with('.') && parse_ip(host).is_none() && !host.starts_with('[') {
        std::borrow::Cow::Owned(format!("{host}."))
    } else {
        std::borrow::Cow::Borrowed(host)
    }
}

impl AllowList {
    pub fn new(rules: Vec<AllowRule>) -> Self {
        AllowList { rules }
    }

    pub fn rules(&self) -> &[AllowRule] {
        &self.rules
    }

    pub fn decide(&self, target: &Target<'_>) -> Decision {
        let host = target.host.trim_start_matches('[').trim_end_matches(']');
        let host_ip = parse_ip(host);
        let host_lower = host.to_ascii_lowercase();
        let host_lower = host_lower.strip_suffix('.').unwrap_or(&host_lower);
        let mut allowed = false;
        let mut absolute = true;
        let mut explicit = Vec::new();
        for rule in &self.rules {
            if rule.scheme != target.scheme || rule.port != target.port {
                continue;
            }
            let matches = match (&rule.host, host_ip) {
                (HostPattern::Ip(ip), Some(host_ip)) => *ip == host_ip,
                (HostPattern::Ip(_), None) => false,
                (_, Some(_)) => false,
                (HostPattern::Name(n), None) => n == host_lower,
                (HostPattern::Suffix(s), None) => host_lower
                    .strip_suffix(s.as_str())
                    .is_some_and(|front| front.len() > 1 && front.ends_with('.')),
            };
            if matches {
                allowed = true;
                absolute &= rule.public_name;
                if let HostPattern::Ip(ip) = rule.host {
                    explicit.push(ip);
                }
            }
        }
        if allowed {
            Decision::Allowed { explicit, absolute }
        } else {
            Decision::Denied
        }
    }
}

/// Why a resolved address may not be connected to, or `None` when it may. An address an
/// allow-list entry names literally always may (the operator opened it: emulators on
/// 127.0.0.1, a private cloud's API). Otherwise neither one of the operator's own addresses
/// (`own`: every address of the host's interfaces, from `plugin/interfaces.rs`), which may be
/// public (a pod's IPv6 address) and would let a plugin reach the operator's own ports,
/// nor an internal one ([`internal_kind`]). IPv4-mapped forms count as the IPv4 address.
pub fn address_problem(addr: IpAddr, explicit: &[IpAddr], own: &[IpAddr]) -> Option<&'static str> {
    if explicit.contains(&addr) {
        return None;
    }
    let canonical = addr.to_canonical();
    if own.iter().any(|o| o.to_canonical() == canonical) {
        return Some(OWN_ADDRESS);
    }
    internal_kind(addr)
}

/// The reason [`address_problem`] gives for one of the operator's own addresses.
pub const OWN_ADDRESS: &str = "one of the operator's own addresses";

/// Addresses a plugin must not reach by name: the host itself, the pod and cluster
/// networks, cloud metadata services, and anything not globally routable.
pub fn is_internal(addr: IpAddr) -> bool {
    internal_kind(addr).is_some()
}

/// What kind of internal address `addr` is (`"loopback"`, `"link-local"`, ...), or `None`
/// for a public one. The name goes into error messages.
pub fn internal_kind(addr: IpAddr) -> Option<&'static str> {
    match addr {
        IpAddr::V4(v4) => internal_kind_v4(v4),
        IpAddr::V6(v6) => {
            if let Some(v4) = v6.to_ipv4_mapped() {
                return internal_kind_v4(v4).map(|_| "IPv4-mapped internal");
            }
            internal_kind_v6(v6)
        }
    }
}

/// Whether an instance may report `addr` as its IP without `allowPrivateAddresses`: public
/// addresses, and the documentation ranges (they route nowhere, so probing them reaches
/// nothing; emulators hand them out). Never the unspecified, multicast or broadcast
/// address: no instance has those.
pub fn instance_address_problem(addr: IpAddr, allow_private: bool) -> Option<&'static str> {
    let kind = internal_kind(addr)?;
    match kind {
        "documentation" => None,
        "unspecified" | "multicast" | "broadcast" => Some(kind),
        _ if allow_private => None,
        _ => Some(kind),
    }
}

fn internal_kind_v4(ip: Ipv4Addr) -> Option<&'static str> {
    let o = ip.octets();
    Some(if ip.is_unspecified() {
        "unspecified"
    } else if ip.is_loopback() {
        "loopback"
    } else if ip.is_private() {
        "private (RFC 1918)"
    } else if ip.is_link_local() {
        "link-local (cloud metadata)"
    } else if ip.is_broadcast() {
        "broadcast"
    } else if ip.is_multicast() {
        "multicast"
    } else if ip.is_documentation() {
        "documentation"
    } else if o[0] == 0 {
        "this-network"
    } else if o[0] == 100 && (64..128).contains(&o[1]) {
        "shared address space (CGNAT)"
    } else if o[0] == 192 && o[1] == 0 && o[2] == 0 {
        "IETF protocol assignments"
    } else if o[0] == 198 && (18..20).contains(&o[1]) {
        "benchmarking"
    } else if o[0] >= 240 {
        "reserved"
    } else {
        return None;
    })
}

fn internal_kind_v6(ip: Ipv6Addr) -> Option<&'static str> {
    let s = ip.segments();
    Some(if ip.is_unspecified() {
        "unspecified"
    } else if ip.is_loopback() {
        "loopback"
    } else if ip.is_multicast() {
        "multicast"
    } else if ip.is_unique_local() {
        // fc00::/7, including AWS's fd00:ec2::254 metadata
        "unique local"
    } else if ip.is_unicast_link_local() {
        "link-local (cloud metadata)"
    } else if s[0] == 0x2001 && s[1] == 0x0db8 {
        "documentation"
    } else if s[0] == 0x0064 && s[1] == 0xff9b {
        // NAT64 can reach IPv4 internals
        "NAT64"
    } else if s[..6].iter().all(|x| *x == 0) {
        "IPv4-compatible"
    } else {
        return None;
    })
}

/// Why a plugin's own `default-hosts` entry cannot be used, if it cannot. A plugin may only
/// name public DNS hosts: an IP literal or a local name would let a plugin open the way to
/// internal addresses for itself. Only the operator's providers file can do that.
///
/// The connect-time check ([`address_problem`]) refuses internal addresses whatever the
/// name; this check refuses, at load and naming the rule, names that are plainly not
/// public, so that such a plugin never loads rather than failing at its first request.
/// The providers file's own entries (`allowedHosts`, `additionalHosts`) are not held to it:
/// an operator may name a Proxmox server as `pve.lan` or an emulator as `localhost`.
pub fn plugin_default_problem(rule: &AllowRule) -> Option<&'static str> {
    let name = match &rule.host {
        HostPattern::Ip(_) => {
            return Some("is an IP address; a plugin may only name DNS hosts");
        }
        HostPattern::Name(n) | HostPattern::Suffix(n) => n.trim_end_matches('.'),
    };
    let last = name.rsplit('.').next().unwrap_or(name);
    if last.bytes().all(|b| b.is_ascii_digit()) || last.starts_with("0x") {
        return Some("looks like a numeric address, not a DNS name");
    }
    let under = |domains: &[&str]| {
        domains
            .iter()
            .any(|d| name == *d || name.strip_suffix(d).is_some_and(|f| f.ends_with('.')))
    };
    if THIS_HOST.contains(&name) || under(&["localhost"]) {
        return Some(
            "names this host (localhost, localhost6, ip6-localhost, ip6-loopback or a .localhost name)",
        );
    }
    if under(CLUSTER_DOMAINS) {
        return Some(
            "names a cluster-internal domain (Kubernetes service DNS: .svc, .cluster.local, or <service>.<namespace> of a system namespace)",
        );
    }
    if under(LOCAL_DOMAINS) {
        return Some("names a local or internal domain");
    }
    if under(WILDCARD_DNS) {
        return Some(
            "names a wildcard-DNS service (nip.io, sslip.io, ...), whose names resolve to any address they spell, internal ones included",
        );
    }
    if embedded_internal_ip(name).is_some() {
        return Some(
            "spells an internal IP address in its labels (as 127.0.0.1.x, 10-0-0-1.x or 7f000001.x), which wildcard-DNS services resolve to that address",
        );
    }
    if matches!(rule.host, HostPattern::Name(_)) && !name.contains('.') {
        return Some(
            "is a single-label name, which the pod's DNS search list resolves inside the cluster (<name>.<namespace>.svc.cluster.local, ...)",
        );
    }
    None
}

/// Names of the host itself in `/etc/hosts` (Debian's and Kubernetes' defaults).
const THIS_HOST: &[&str] = &[
    "localhost",
    "localhost6",
    "localhost.localdomain",
    "localhost6.localdomain6",
    "ip6-localhost",
    "ip6-loopback",
];

/// Domains only a cluster's DNS answers: service DNS, and `<service>.<namespace>` of the
/// namespaces every cluster has (the search list completes `kubernetes.default`).
const CLUSTER_DOMAINS: &[&str] = &[
    "svc",
    "cluster.local",
    "default",
    "kube-system",
    "kube-public",
    "kube-node-lease",
];

/// Link-local (mDNS), private-use (RFC 6762 appendix G, RFC 8375, ICANN's `.internal`) and
/// reverse-lookup domains.
const LOCAL_DOMAINS: &[&str] = &[
    "local",
    "internal",
    "localdomain",
    "home.arpa",
    "arpa",
    "lan",
    "intranet",
    "corp",
    "home",
    "private",
];

/// Services whose every name resolves to the address it spells (`10-0-0-1.nip.io`), to
/// loopback (`anything.lvh.me`), or to two addresses in turn (DNS rebinding: `rbndr.us`).
const WILDCARD_DNS: &[&str] = &[
    "nip.io",
    "sslip.io",
    "xip.io",
    "traefik.me",
    "localtest.me",
    "lvh.me",
    "vcap.me",
    "lacolhost.com",
    "localhost.direct",
    "rbndr.us",
    "1u.ms",
];

/// An internal address spelled in `name` the way wildcard-DNS services read names: four
/// decimal octets in a row, separated by dots or dashes (`127.0.0.1.x`, `ip-10-0-0-1.x`);
/// eight hex digits in one piece (`7f000001.x`, `app-c0a80101.x`); or a label that is an
/// IPv6 address with dashes for colons (`fe80--1.x`). Only internal addresses count: a
/// public one is no more than any public name (the connect-time check still applies).
fn embedded_internal_ip(name: &str) -> Option<IpAddr> {
    let tokens: Vec<&str> = name.split(['.', '-']).collect();
    let octet = |t: &str| {
        (!t.is_empty() && t.len() <= 3 && t.bytes().all(|b| b.is_ascii_digit()))
            .then(|| t.parse::<u8>().ok())
            .flatten()
    };
    let quads = tokens.windows(4).filter_map(|w| {
        let o: Vec<u8> = w.iter().filter_map(|t| octet(t)).collect();
        (o.len() == 4).then(|| IpAddr::V4(Ipv4Addr::new(o[0], o[1], o[2], o[3])))
    });
    let hex = tokens.iter().filter_map(|t| {
        let h = t.strip_prefix("0x").unwrap_or(t);
        (h.len() == 8 && h.bytes().all(|b| b.is_ascii_hexdigit()))
            .then(|| u32::from_str_radix(h, 16).ok())
            .flatten()
            .map(|n| IpAddr::V4(Ipv4Addr::from(n)))
    });
    let v6 = name
        .split('.')
        .filter(|l| l.contains('-'))
        .filter_map(|l| l.replace('-', ":").parse::<Ipv6Addr>().ok().map(IpAddr::V6));
    quads.chain(hex).chain(v6).find(|ip| is_internal(*ip))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn list(entries: &[&str]) -> AllowList {
        AllowList::new(entries.iter().map(|e| e.parse().unwrap()).collect())
    }

    #[test]
    fn parse_rules() {
        let cases: &[(&str, Result<&str, &str>)] = &[
            (
                "https://api.hetzner.cloud",
                Ok("https://api.hetzner.cloud:443"),
            ),
            ("http://Example.COM:8080/", Ok("http://example.com:8080")),
            ("https://*.amazonaws.com", Ok("https://*.amazonaws.com:443")),
            ("http://127.0.0.1:9000", Ok("http://127.0.0.1:9000")),
            ("http://[::1]:9000", Ok("http://[::1]:9000")),
            ("api.hetzner.cloud", Err("expected scheme://host[:port]")),
            ("ftp://x.example", Err("scheme must be http or https")),
            (
                "https://x.example/path",
                Err("only scheme, host and port are allowed (no path or user)"),
            ),
            (
                "https://user@x.example",
                Err("only scheme, host and port are allowed (no path or user)"),
            ),
            ("https://x.example:99999", Err("bad port")),
            (
                "https://*.com",
                Err("wildcard needs a domain with at least two labels after *."),
            ),
            (
                "https://bad_name.example",
                Err("host is neither a DNS name nor an IP address"),
            ),
            ("https://", Err("empty host")),
        ];
        for (entry, want) in cases {
            let got = entry.parse::<AllowRule>();
            match (got, want) {
                (Ok(rule), Ok(text)) => assert_eq!(rule.to_string(), *text, "{entry}"),
                (Err(e), Err(reason)) => {
                    assert_eq!(e.reason, *reason, "{entry}");
                    assert!(e.to_string().contains(entry), "error names the entry: {e}");
                }
                (got, want) => panic!("{entry}: got {got:?}, want {want:?}"),
            }
        }
    }

    #[test]
    fn decide() {
        let l = list(&[
            "https://api.hetzner.cloud",
            "https://*.amazonaws.com",
            "http://127.0.0.1:8080",
        ]);
        let t = |scheme, host, port| Target::from_parts(scheme, host, port).unwrap();
        let allowed = Decision::Allowed {
            explicit: vec![],
            absolute: false,
        };
        let cases = [
            (t("https", "api.hetzner.cloud", None), allowed.clone()),
            (t("https", "API.Hetzner.Cloud.", Some(443)), allowed.clone()),
            (t("http", "api.hetzner.cloud", None), Decision::Denied), // scheme differs
            (
                t("https", "api.hetzner.cloud", Some(8443)),
                Decision::Denied,
            ), // port differs
            (t("https", "evil.example", None), Decision::Denied),
            (
                t("https", "ec2.eu-west-1.amazonaws.com", None),
                allowed.clone(),
            ),
            (t("https", "amazonaws.com", None), Decision::Denied), // wildcard needs a label
            (t("https", "evilamazonaws.com", None), Decision::Denied),
            (
                t("http", "127.0.0.1", Some(8080)),
                Decision::Allowed {
                    explicit: vec!["127.0.0.1".parse().unwrap()],
                    absolute: false,
                },
            ),
            (t("http", "127.0.0.1", Some(8081)), Decision::Denied),
            (t("http", "localhost", Some(8080)), Decision::Denied), // a name is not the IP entry
        ];
        for (target, want) in cases {
            assert_eq!(l.decide(&target), want, "{target:?}");
        }
        assert_eq!(
            AllowList::default().decide(&t("https", "x.example", None)),
            Decision::Denied
        );
    }

    /// A plugin's default host is looked up as an absolute name unless an entry of the
    /// providers file matches too (an admin may mean a Service's short name).
    #[test]
    fn default_hosts_are_looked_up_as_absolute_names() {
        let mut rules = list(&["https://api.hetzner.cloud", "https://*.amazonaws.com"])
            .rules()
            .to_vec();
        for r in &mut rules {
            r.public_name = true;
        }
        rules.push("https://emulator.test:8443".parse().unwrap());
        rules.push("https://ec2.eu-west-1.amazonaws.com".parse().unwrap());
        let l = AllowList::new(rules);
        let absolute =
            |host: &str, port| match l.decide(&Target::from_parts("https", host, port).unwrap()) {
                Decision::Allowed { absolute, .. } => absolute,
                Decision::Denied => panic!("{host} denied"),
            };
        assert!(absolute("api.hetzner.cloud", None));
        assert!(absolute("ec2.us-east-1.amazonaws.com", None));
        assert!(
            !absolute("ec2.eu-west-1.amazonaws.com", None),
            "an admin entry matches"
        );
        assert!(!absolute("emulator.test", Some(8443)));
        assert_eq!(lookup_name("api.hetzner.cloud", true), "api.hetzner.cloud.");
        assert_eq!(
            lookup_name("api.hetzner.cloud.", true),
            "api.hetzner.cloud."
        );
        assert_eq!(lookup_name("api.hetzner.cloud", false), "api.hetzner.cloud");
        assert_eq!(lookup_name("203.0.113.7", true), "203.0.113.7");
        assert_eq!(lookup_name("[2001:db8::1]", true), "[2001:db8::1]");
    }

    #[test]
    fn internal_addresses() {
        let internal = [
            "127.0.0.1",
            "127.1.2.3",
            "10.0.0.1",
            "172.16.5.4",
            "192.168.1.1",
            "169.254.169.254",
            "0.0.0.0",
            "100.64.0.1",
            "255.255.255.255",
            "224.0.0.1",
            "192.0.0.1",
            "198.18.0.1",
            "::1",
            "::",
            "fd00:ec2::254",
            "fe80::1",
            "::ffff:127.0.0.1",
            "::ffff:10.1.1.1",
            "64:ff9b::a00:1",
            "::127.0.0.1",
        ];
        for a in internal {
            assert!(is_internal(a.parse().unwrap()), "{a} should be internal");
        }
        for a in [
            "1.1.1.1",
            "95.216.1.2",
            "52.94.1.1",
            "2a01:4f8::1",
            "::ffff:1.1.1.1",
        ] {
            assert!(!is_internal(a.parse().unwrap()), "{a} should be public");
        }
    }

    #[test]
    fn instance_addresses() {
        let cases = [
            ("95.216.1.2", false, None),
            ("203.0.113.10", false, None),
            ("2001:db8::1", false, None),
            ("127.0.0.1", false, Some("loopback")),
            ("127.0.0.1", true, None),
            (
                "169.254.169.254",
                false,
                Some("link-local (cloud metadata)"),
            ),
            ("10.1.2.3", true, None),
            ("::ffff:127.0.0.1", false, Some("IPv4-mapped internal")),
            ("fd00:ec2::254", false, Some("unique local")),
            ("0.0.0.0", true, Some("unspecified")),
            ("224.0.0.1", true, Some("multicast")),
        ];
        for (ip, allow, want) in cases {
            assert_eq!(
                instance_address_problem(ip.parse().unwrap(), allow),
                want,
                "{ip} allow={allow}"
            );
        }
    }

    #[test]
    fn plugin_defaults_only_public_dns_names() {
        // (entry, None: usable, or a word the reason must contain: the rule it names)
        let cases = [
            // The shipped plugins' defaults, and names that merely look odd.
            ("https://api.hetzner.cloud", None),
            ("https://*.amazonaws.com", None),
            ("https://ec2.eu-west-1.amazonaws.com", None),
            ("https://ec2.cn-north-1.amazonaws.com.cn", None),
            ("https://api.digitalocean.com", None),
            ("https://compute.googleapis.com", None),
            ("https://oauth2.googleapis.com", None),
            ("https://api.linode.com", None),
            ("https://api.scaleway.com", None),
            ("https://api.vultr.com", None),
            ("https://deadbeef.example.com", None), // hex of a public address
            ("https://1-2-3-4.example.com", None),  // a public address spelled out
            ("https://ec2-52-1-2-3.compute-1.amazonaws.com", None),
            ("https://20240101.example.com", None), // a date: 32.36.1.1
            ("https://2a01-4f8-c17-b8f--2.example.com", None),
            ("https://xn--80ak6aa92e.com", None), // punycode has dashes, not an address
            ("https://local.example.com", None),  // "local" as a label, not the domain
            ("https://svc.example.com", None),
            // IP literals and numeric names.
            ("http://169.254.169.254:80", Some("IP address")),
            ("http://127.0.0.1:8080", Some("IP address")),
            ("http://[::1]:8080", Some("IP address")),
            ("http://127.1", Some("numeric")),
            ("http://0x7f000001", Some("numeric")),
            // The host itself.
            ("http://localhost:8080", Some("this host")),
            ("http://localhost6", Some("this host")),
            ("http://ip6-localhost", Some("this host")),
            ("http://ip6-loopback", Some("this host")),
            ("http://localhost.localdomain", Some("this host")),
            ("http://x.localhost", Some("this host")),
            ("https://*.app.localhost", Some("this host")),
            // Single labels: completed by the pod's search list.
            ("http://metadata", Some("single-label")),
            ("http://vm", Some("single-label")),
            ("https://kubernetes", Some("single-label")),
            // The cluster's own DNS.
            ("https://kubernetes.default.svc", Some("cluster-internal")),
            ("https://kubernetes.default", Some("cluster-internal")),
            (
                "https://kubernetes.default.svc.cluster.local",
                Some("cluster-internal"),
            ),
            ("http://kube-dns.kube-system", Some("cluster-internal")),
            ("http://api.ns.svc", Some("cluster-internal")),
            ("https://*.svc.cluster.local", Some("cluster-internal")),
            ("https://*.cluster.local", Some("cluster-internal")),
            ("https://*.ns.svc", Some("cluster-internal")),
            // Local and private-use domains.
            ("http://metadata.google.internal", Some("local or internal")),
            ("http://printer.local", Some("local or internal")),
            ("https://*.corp.internal", Some("local or internal")),
            ("http://router.home.arpa", Some("local or internal")),
            ("http://1.0.0.127.in-addr.arpa", Some("local or internal")),
            ("http://nas.lan", Some("local or internal")),
            ("http://wiki.corp", Some("local or internal")),
            // Wildcard DNS, whatever the name spells.
            ("http://127.0.0.1.nip.io", Some("wildcard-DNS")),
            ("http://10-0-0-1.sslip.io", Some("wildcard-DNS")),
            ("http://7f000001.nip.io", Some("wildcard-DNS")),
            ("http://1-2-3-4.nip.io", Some("wildcard-DNS")),
            ("https://*.nip.io", Some("wildcard-DNS")),
            ("http://anything.lvh.me", Some("wildcard-DNS")),
            ("http://7f000001.c0a80001.rbndr.us", Some("wildcard-DNS")),
            // Internal addresses spelled in any other name.
            ("http://127.0.0.1.example.com", Some("internal IP")),
            ("http://app.10.0.0.1.example.com", Some("internal IP")),
            ("http://10-0-0-1.example.com", Some("internal IP")),
            ("http://ip-172-16-0-9.example.com", Some("internal IP")),
            ("http://169-254-169-254.example.com", Some("internal IP")),
            ("http://7f000001.example.com", Some("internal IP")),
            ("http://app-c0a80101.example.com", Some("internal IP")),
            ("http://0x0a000001.example.com", Some("internal IP")),
            ("http://fe80--1.example.com", Some("internal IP")),
            ("http://0--1.example.com", Some("internal IP")),
            ("http://fd00-ec2--254.example.com", Some("internal IP")),
            ("https://*.10.0.0.1.example.com", Some("internal IP")),
        ];
        let mut wrong = Vec::new();
        for (entry, want) in cases {
            let rule: AllowRule = entry.parse().unwrap_or_else(|e| panic!("{entry}: {e}"));
            let got = plugin_default_problem(&rule);
            let ok = match want {
                None => got.is_none(),
                Some(w) => got.is_some_and(|g| g.contains(w)),
            };
            if !ok {
                wrong.push(format!("{entry}: got {got:?}, want {want:?}"));
            }
        }
        assert!(wrong.is_empty(), "{}", wrong.join("\n"));
    }

    /// The providers file's own entries are the operator's choice: each name the plugin
    /// check refuses loads there (and still connects only to what the connect-time check
    /// allows), so labs, emulators and private clouds keep working.
    #[test]
    fn the_operators_entries_may_name_internal_hosts() {
        let names = [
            "http://localhost:8080",
            "http://127.0.0.1:8080",
            "https://pve:8006",
            "https://pve.lan:8006",
            "https://proxmox.corp.internal:8006",
            "http://emulator.default.svc:8080",
            "http://10-0-0-1.nip.io",
        ];
        for h in names {
            let yaml = format!(
                "providers: [{{name: a, plugin: a.wasm, additionalHosts: ['{h}'], allowPrivateAddresses: true}}]"
            );
            let file = crate::config::ProvidersFile::parse(&yaml).unwrap();
            let entry = &file.providers[0];
            let rules = entry
                .allow_rules(&[])
                .unwrap_or_else(|e| panic!("{h}: {e}"));
            assert_eq!(rules.len(), 1, "{h}");
            let err = entry.allow_rules(&[h.to_string()]).unwrap_err();
            assert!(
                err.to_string().contains("the plugin's default host"),
                "{h} as a plugin default: {err}"
            );
        }
    }

    #[test]
    fn connect_only_to_listed_or_public_addresses_never_to_our_own() {
        let ip = |s: &str| -> IpAddr { s.parse().unwrap() };
        let own = [
            ip("127.0.0.1"),
            ip("10.1.2.3"),
            ip("2a01:4f8::7"),
            ip("::1"),
        ];
        // (address, explicit entries, want)
        let cases = [
            ("8.8.8.8", vec![], None),
            ("2a01:4f8::8", vec![], None), // a neighbour of ours: public, not ours
            ("2a01:4f8::7", vec![], Some(OWN_ADDRESS)), // ours, public (IPv6 pod)
            ("10.1.2.3", vec![], Some(OWN_ADDRESS)),
            ("::ffff:10.1.2.3", vec![], Some(OWN_ADDRESS)), // mapped form of ours
            ("127.0.0.1", vec![], Some(OWN_ADDRESS)),
            ("127.0.0.2", vec![], Some("loopback")),
            ("10.0.0.1", vec![], Some("private (RFC 1918)")),
            (
                "10.0.0.1",
                vec![ip("127.0.0.1")],
                Some("private (RFC 1918)"),
            ),
            // What the operator names literally is allowed, ours or not (emulators).
            ("127.0.0.1", vec![ip("127.0.0.1")], None),
            ("2a01:4f8::7", vec![ip("2a01:4f8::7")], None),
            ("10.0.0.1", vec![ip("10.0.0.1")], None),
        ];
        for (addr, explicit, want) in cases {
            assert_eq!(
                address_problem(ip(addr), &explicit, &own),
                want,
                "{addr} explicit={explicit:?}"
            );
        }
        // Without knowing our own addresses, only the ranges decide.
        assert_eq!(address_problem(ip("2a01:4f8::7"), &[], &[]), None);
    }
}
