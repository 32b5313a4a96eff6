//! `spec.auth`: which credentials a Proxy has and where they live, checked and turned into
//! what the template and the probe need. Pure, table-tested; the Secret reads and the
//! create are in `reconcile.rs`.
//!
//! The credentials always live in a Secret (keys `username` and `password`): one the
//! operator generates (`type: Generated`, the default) or one the user names
//! (`type: Secret`). The reconciler, the probe and the discovery API all read them from
//! there, and nothing else keeps them but memory.
//!
//! Which Secret may give a Proxy its credentials ([`may_use`]) is the same rule for the
//! reconciler and the discovery API: a generated one only when the Proxy controls it, a
//! user's one only when it carries [`CREDENTIALS_LABEL`]. The operator reads every Secret
//! of every namespace; without the label, whoever may create a Proxy (but not read
//! Secrets) could name any Secret with a `username` and `password` and have the operator
//! render it into an instance's user data (a template that sends `{{egress.password}}`
//! anywhere), or get it back from the discovery API with only `proxies/credentials`. The
//! label is the Secret owner's consent; a SubjectAccessReview of the caller could not
//! cover the reconciler, which does not know who wrote the Proxy.

use crate::api::{AuthType, ProxyAuth};
use sha2::{Digest, Sha256};
use std::fmt;
use std::net::IpAddr;

/// The keys of a credentials Secret.
pub const USERNAME_KEY: &str = "username";
pub const PASSWORD_KEY: &str = "password";
/// Suffix of the name of a generated credentials Secret.
pub const GENERATED_SUFFIX: &str = "-credentials";
/// Label on every Secret the operator generates, naming the Proxy it belongs to.
pub const PROXY_LABEL: &str = "egress.proxy-operator.dev/proxy";
/// Label a user's Secret must carry, with the value [`CREDENTIALS_LABEL_VALUE`], for a
/// Proxy's `spec.auth.type: Secret` to use it (see the module docs).
pub const CREDENTIALS_LABEL: &str = "egress.proxy-operator.dev/proxy-credentials";
pub const CREDENTIALS_LABEL_VALUE: &str = "true";
/// Label a Secret must carry, with the value `"true"`, for a Proxy's
/// `spec.cloudInit.secretKeyRef` to use it: a user who may create Proxies but not read
/// Secrets must not render any Secret of the namespace into an instance's user data (which
/// the instance, and whoever reaches its metadata service through the proxy, can read).
pub const CLOUD_INIT_LABEL: &str = "egress.proxy-operator.dev/cloud-init";

/// Where the credentials of one Proxy come from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Source {
    /// The operator's Secret of this name; created when missing.
    Generated(String),
    /// The user's Secret of this name; a missing one is a condition, retried.
    Secret(String),
    /// No credentials.
    None,
}

impl Source {
    /// The Secret the credentials are in, if any.
    pub fn secret_name(&self) -> Option<&str> {
        match self {
            Source::Generated(n) | Source::Secret(n) => Some(n),
            Source::None => None,
        }
    }

    /// The field a problem with the Secret is reported under.
    pub fn field(&self) -> &'static str {
        match self {
            Source::Generated(_) => "spec.auth.type",
            Source::Secret(_) | Source::None => "spec.auth.secretName",
        }
    }
}

/// `spec.auth`, checked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Access {
    pub source: Source,
    /// Canonical CIDRs (`addr/prefix`, host bits zero).
    pub allowed_clients: Vec<String>,
}

impl Access {
    /// No credentials and no allow-list: anyone who reaches `ip:port` may use the proxy.
    pub fn is_open(&self) -> bool {
        self.source == Source::None && self.allowed_clients.is_empty()
    }
}

/// Why `spec.auth` cannot work as written. Names the field and the value.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AuthError {
    #[error("spec.auth.secretName is required with spec.auth.type Secret")]
    SecretNameMissing,
    #[error("spec.auth.secretName {0:?} is set but spec.auth.type is not Secret")]
    SecretNameUnused(String),
    #[error("spec.auth.secretName {0:?} is not a valid Secret name (lowercase DNS subdomain)")]
    SecretNameInvalid(String),
    #[error("spec.auth.allowedClients[{index}] {value:?}: {why}")]
    Cidr {
        index: usize,
        value: String,
        why: String,
    },
}

/// Checks `spec.auth` of the Proxy `proxy_name`.
pub fn access(auth: &ProxyAuth, proxy_name: &str) -> Result<Access, AuthError> {
    let source = match (auth.type_, &auth.secret_name) {
        (AuthType::Secret, None) => return Err(AuthError::SecretNameMissing),
        (AuthType::Secret, Some(n)) if !is_dns_subdomain(n) => {
            return Err(AuthError::SecretNameInvalid(n.clone()));
        }
        (AuthType::Secret, Some(n)) => Source::Secret(n.clone()),
        (_, Some(n)) => return Err(AuthError::SecretNameUnused(n.clone())),
        (AuthType::Generated, None) => Source::Generated(generated_secret_name(proxy_name)),
        (AuthType::None, None) => Source::None,
    };
    let allowed_clients = auth
        .allowed_clients
        .iter()
        .enumerate()
        .map(|(index, value)| {
            canonical_cidr(value).map_err(|why| AuthError::Cidr {
                index,
                value: value.clone(),
                why,
            })
        })
        .collect::<Result<_, _>>()?;
    Ok(Access {
        source,
        allowed_clients,
    })
}

/// `203.0.113.0/24` as written, a single address as `/32` (`/128`); host bits must be zero,
/// since tinyproxy and squid disagree on what they mean.
pub fn canonical_cidr(value: &str) -> Result<String, String> {
    let (addr, prefix) = match value.split_once('/') {
        Some((a, p)) => (a, Some(p)),
        None => (value, None),
    };
    let ip: IpAddr = addr
        .parse()
        .map_err(|_| "not an IP address or CIDR such as 203.0.113.0/24".to_string())?;
    let max = if ip.is_ipv4() { 32 } else { 128 };
    let prefix: u32 = match prefix {
        None => max,
        Some(p) => match p.parse::<u32>() {
            Ok(n) if n <= max && !p.starts_with('+') && (p == "0" || !p.starts_with('0')) => n,
            _ => return Err(format!("prefix length {p:?} is not in 0..={max}")),
        },
    };
    let network = match ip {
        IpAddr::V4(v4) => {
            let mask = u32::MAX.checked_shl(32 - prefix).unwrap_or(0);
            IpAddr::from((u32::from(v4) & mask).to_be_bytes())
        }
        IpAddr::V6(v6) => {
            let mask = u128::MAX.checked_shl(128 - prefix).unwrap_or(0);
            IpAddr::from((u128::from(v6) & mask).to_be_bytes())
        }
    };
    if network != ip {
        return Err(format!(
            "host bits are set; the network is {network}/{prefix}"
        ));
    }
    Ok(format!("{ip}/{prefix}"))
}

/// The name of the Secret the operator generates for the Proxy `proxy_name`:
/// `<name>-credentials`, or, when that would be longer than a Secret name may be, the
/// name cut short plus a hash of the whole name (so two long names never share one).
pub fn generated_secret_name(proxy_name: &str) -> String {
    const MAX: usize = 253;
    if proxy_name.len() + GENERATED_SUFFIX.len() <= MAX {
        return format!("{proxy_name}{GENERATED_SUFFIX}");
    }
    let digest = hex::encode(&Sha256::digest(proxy_name.as_bytes())[..4]);
    let keep = MAX - GENERATED_SUFFIX.len() - digest.len() - 1;
    let mut head = &proxy_name[..keep];
    // A DNS subdomain's parts end in an alphanumeric.
    head = head.trim_end_matches(['-', '.']);
    format!("{head}-{digest}{GENERATED_SUFFIX}")
}

/// Kubernetes' `IsDNS1123Subdomain`, which object names (a Secret's, a Proxy's) must pass:
/// at most 253 characters, dot-separated parts of lowercase letters, digits and `-` that
/// start and end alphanumeric (no per-part length limit, unlike DNS).
fn is_dns_subdomain(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 253
        && s.split('.').all(|label| {
            !label.is_empty()
                && label
                    .bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
                && !label.starts_with('-')
                && !label.ends_with('-')
        })
}

/// Why a Secret may not give a Proxy its credentials. Names the Secret, never a value.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Refused {
    #[error(
        "Secret {secret} exists and is not owned by this Proxy, so it cannot hold the \
         credentials the operator generates for it (spec.auth.type Generated); delete or \
         rename that Secret, or use it with spec.auth.type Secret and spec.auth.secretName"
    )]
    NotOwned { secret: String },
    #[error(
        "Secret {namespace}/{name} (spec.auth.secretName) lacks the label \
         {CREDENTIALS_LABEL}: \"{CREDENTIALS_LABEL_VALUE}\"; the operator uses only Secrets \
         labelled as meant for proxy credentials, so that a Proxy cannot copy any Secret of \
         its namespace into an instance's user data or the discovery API; label it with \
         `kubectl label secret -n {namespace} {name} {CREDENTIALS_LABEL}={CREDENTIALS_LABEL_VALUE}`"
    )]
    NotLabelled { namespace: String, name: String },
    #[error(
        "Secret {namespace}/{name} (spec.cloudInit.secretKeyRef) lacks the label \
         {CLOUD_INIT_LABEL}: \"true\"; the operator renders only Secrets labelled as meant \
         for cloud-init, so that a Proxy cannot copy any Secret of its namespace into an \
         instance's user data; label it with \
         `kubectl label secret -n {namespace} {name} {CLOUD_INIT_LABEL}=true`"
    )]
    CloudInitNotLabelled { namespace: String, name: String },
}

/// Whether a Secret's labels mark it as meant for a Proxy's cloud-init.
pub fn labelled_for_cloud_init(
    labels: Option<&std::collections::BTreeMap<String, String>>,
) -> bool {
    labels
        .and_then(|l| l.get(CLOUD_INIT_LABEL))
        .is_some_and(|v| v == "true")
}

/// Whether a Secret's labels mark it as meant for proxy credentials.
pub fn labelled_for_proxies(labels: Option<&std::collections::BTreeMap<String, String>>) -> bool {
    labels
        .and_then(|l| l.get(CREDENTIALS_LABEL))
        .is_some_and(|v| v == CREDENTIALS_LABEL_VALUE)
}

/// Whether the Secret `namespace/name` may give the Proxy with UID `proxy_uid` its
/// credentials from `source`: a generated one when the Proxy is its controller owner
/// (`controller`: the UID of the Secret's controller owner), a user's one when it is
/// `labelled` ([`labelled_for_proxies`]). The rule of the reconciler and the discovery
/// API alike.
pub fn may_use(
    source: &Source,
    namespace: &str,
    name: &str,
    labelled: bool,
    controller: Option<&str>,
    proxy_uid: &str,
) -> Result<(), Refused> {
    match source {
        Source::Generated(_) if controller != Some(proxy_uid) => Err(Refused::NotOwned {
            secret: format!("{namespace}/{name}"),
        }),
        Source::Secret(_) if !labelled => Err(Refused::NotLabelled {
            namespace: namespace.to_string(),
            name: name.to_string(),
        }),
        _ => Ok(()),
    }
}

/// A username and password. `Debug` prints neither.
#[derive(Clone, PartialEq, Eq)]
pub struct Credentials {
    pub username: String,
    pub password: String,
}

impl fmt::Debug for Credentials {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Credentials(<redacted>)")
    }
}

/// Length of a generated username and password, in characters of [`ALPHABET`]: 24 and
/// 32 characters, about 143 and 190 bits.
const USERNAME_LEN: usize = 24;
const PASSWORD_LEN: usize = 32;
/// Letters and digits only: no character needs quoting in YAML, a shell, a tinyproxy or
/// squid config line or a URL, and none starts an option (`-`) of `htpasswd`.
const ALPHABET: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789";

/// Fresh credentials from the operating system's random number generator.
pub fn generate() -> Result<Credentials, getrandom::Error> {
    Ok(Credentials {
        username: random_string(USERNAME_LEN)?,
        password: random_string(PASSWORD_LEN)?,
    })
}

fn random_string(len: usize) -> Result<String, getrandom::Error> {
    // Rejection sampling: only bytes below the largest multiple of the alphabet's size are
    // used, so every character is equally likely.
    let limit = (256 / ALPHABET.len() * ALPHABET.len()) as u8;
    let mut out = String::with_capacity(len);
    let mut buf = [0u8; 64];
    while out.len() < len {
        getrandom::fill(&mut buf)?;
        for b in buf.iter().filter(|b| **b < limit) {
            if out.len() == len {
                break;
            }
            out.push(ALPHABET[usize::from(*b) % ALPHABET.len()] as char);
        }
    }
    Ok(out)
}

/// Why a credentials Secret's values cannot be used. Names the Secret and key, never the
/// value.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CredentialsError {
    #[error("Secret {secret} ({field}) has no key {key:?}")]
    NoKey {
        secret: String,
        field: &'static str,
        key: &'static str,
    },
    #[error("Secret {secret} ({field}) key {key:?} {why}")]
    Bad {
        secret: String,
        field: &'static str,
        key: &'static str,
        why: &'static str,
    },
}

/// The longest username or password a Proxy takes. Each is redacted from everything a
/// plugin prints in four forms and written into the instance's cloud-init: a password of
/// a megabyte (a Secret allows it) would cost that many times over, for one Proxy.
/// Generated ones are 24 and 32 characters.
pub const MAX_CREDENTIAL_BYTES: usize = 256;
// The error says "256 bytes".
const _: () = assert!(MAX_CREDENTIAL_BYTES == 256);

/// The credentials in a Secret's `username` and `password` values: non-empty UTF-8 without
/// control characters or blanks (they go into config lines and the `Proxy-Authorization`
/// header), a username without `:` (Basic authentication splits on the first one), each at
/// most [`MAX_CREDENTIAL_BYTES`].
pub fn from_values(
    secret: &str,
    field: &'static str,
    username: Option<&[u8]>,
    password: Option<&[u8]>,
) -> Result<Credentials, CredentialsError> {
    let check = |key: &'static str, v: Option<&[u8]>| -> Result<String, CredentialsError> {
        let bad = |why| CredentialsError::Bad {
            secret: secret.to_string(),
            field,
            key,
            why,
        };
        let v = v.ok_or_else(|| CredentialsError::NoKey {
            secret: secret.to_string(),
            field,
            key,
        })?;
        if v.len() > MAX_CREDENTIAL_BYTES {
            return Err(bad("is longer than 256 bytes"));
        }
        let s = std::str::from_utf8(v).map_err(|_| bad("is not UTF-8"))?;
        if s.is_empty() {
            return Err(bad("is empty"));
        }
        if s.chars().any(|c| c.is_control() || c.is_whitespace()) {
            return Err(bad("contains whitespace or control characters"));
        }
        if key == USERNAME_KEY && s.contains(':') {
            return Err(bad("contains ':', which Basic authentication cannot carry"));
        }
        Ok(s.to_string())
    };
    Ok(Credentials {
        username: check(USERNAME_KEY, username)?,
        password: check(PASSWORD_KEY, password)?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn auth(type_: AuthType, secret: Option<&str>, clients: &[&str]) -> ProxyAuth {
        ProxyAuth {
            type_,
            secret_name: secret.map(String::from),
            allowed_clients: clients.iter().map(|s| s.to_string()).collect(),
        }
    }

    #[test]
    fn spec_auth_is_checked_with_errors_naming_field_and_value() {
        use AuthType::*;
        let ok = |source, clients: &[&str]| {
            Ok(Access {
                source,
                allowed_clients: clients.iter().map(|s| s.to_string()).collect(),
            })
        };
        let cases: Vec<(ProxyAuth, Result<Access, &str>)> = vec![
            (
                ProxyAuth::default(),
                ok(Source::Generated("px-credentials".into()), &[]),
            ),
            (
                auth(Secret, Some("mine"), &[]),
                ok(Source::Secret("mine".into()), &[]),
            ),
            (auth(None, Option::None, &[]), ok(Source::None, &[])),
            (
                auth(
                    None,
                    Option::None,
                    &["203.0.113.7", "2001:db8::/32", "0.0.0.0/0"],
                ),
                ok(
                    Source::None,
                    &["203.0.113.7/32", "2001:db8::/32", "0.0.0.0/0"],
                ),
            ),
            (
                auth(Secret, Option::None, &[]),
                Err("spec.auth.secretName is required with spec.auth.type Secret"),
            ),
            (
                auth(Generated, Some("x"), &[]),
                Err("spec.auth.secretName \"x\" is set but spec.auth.type is not Secret"),
            ),
            (
                auth(Secret, Some("Bad_Name"), &[]),
                Err("spec.auth.secretName \"Bad_Name\" is not a valid Secret name"),
            ),
            (
                auth(Generated, Option::None, &["10.0.0.0/8", "10.1.2.3/8"]),
                Err(
                    "spec.auth.allowedClients[1] \"10.1.2.3/8\": host bits are set; the network is 10.0.0.0/8",
                ),
            ),
            (
                auth(Generated, Option::None, &["example.com"]),
                Err("spec.auth.allowedClients[0] \"example.com\": not an IP address"),
            ),
            (
                auth(Generated, Option::None, &["10.0.0.0/33"]),
                Err(
                    "spec.auth.allowedClients[0] \"10.0.0.0/33\": prefix length \"33\" is not in 0..=32",
                ),
            ),
            (
                auth(Generated, Option::None, &["10.0.0.0/08"]),
                Err("spec.auth.allowedClients[0] \"10.0.0.0/08\": prefix length"),
            ),
        ];
        for (a, want) in cases {
            match (access(&a, "px"), want) {
                (Ok(got), Ok(want)) => assert_eq!(got, want, "{a:?}"),
                (Err(got), Err(want)) => {
                    assert!(got.to_string().starts_with(want), "{a:?}: {got}")
                }
                (got, want) => panic!("{a:?}: {got:?} vs {want:?}"),
            }
        }
        assert!(
            access(&auth(None, Option::None, &[]), "px")
                .unwrap()
                .is_open()
        );
        assert!(
            !access(&auth(None, Option::None, &["10.0.0.0/8"]), "px")
                .unwrap()
                .is_open()
        );
        assert!(!access(&ProxyAuth::default(), "px").unwrap().is_open());
    }

    /// A generated Secret only when the Proxy controls it, a user's only when labelled;
    /// the refusals name the Secret (and the label and how to add it).
    #[test]
    fn a_secret_gives_credentials_only_when_meant_for_the_proxy() {
        let generated = Source::Generated("px-credentials".into());
        let given = Source::Secret("db".into());
        let labels = |v: &str| {
            std::collections::BTreeMap::from([(CREDENTIALS_LABEL.to_string(), v.to_string())])
        };
        assert!(labelled_for_proxies(Some(&labels("true"))));
        assert!(!labelled_for_proxies(Some(&labels("yes"))));
        assert!(!labelled_for_proxies(None));
        let cases = [
            (&generated, false, Some("uid-1"), Ok(())),
            (
                &generated,
                true,
                Some("uid-2"),
                Err("Secret ns/px-credentials exists and is not owned by this Proxy"),
            ),
            (&generated, true, None, Err("not owned by this Proxy")),
            (&given, true, None, Ok(())),
            (&given, true, Some("uid-2"), Ok(())),
            (
                &given,
                false,
                Some("uid-1"),
                Err(
                    "Secret ns/db (spec.auth.secretName) lacks the label egress.proxy-operator.dev/proxy-credentials: \"true\"",
                ),
            ),
        ];
        for (source, labelled, controller, want) in cases {
            let name = source.secret_name().unwrap();
            let got = may_use(source, "ns", name, labelled, controller, "uid-1");
            match (got, want) {
                (Ok(()), Ok(())) => {}
                (Err(e), Err(part)) => assert!(e.to_string().contains(part), "{e}"),
                (got, want) => {
                    panic!("{source:?} {labelled} {controller:?}: {got:?}, want {want:?}")
                }
            }
        }
        let e = may_use(&given, "ns", "db", false, None, "uid-1").unwrap_err();
        assert!(
            e.to_string().ends_with(
                "`kubectl label secret -n ns db egress.proxy-operator.dev/proxy-credentials=true`"
            ),
            "{e}"
        );
    }

    #[test]
    fn generated_secret_names_fit_and_differ() {
        assert_eq!(generated_secret_name("a"), "a-credentials");
        let long_a = format!("{}a", "x".repeat(252));
        let long_b = format!("{}b", "x".repeat(252));
        let (a, b) = (
            generated_secret_name(&long_a),
            generated_secret_name(&long_b),
        );
        assert_ne!(a, b);
        for n in [&a, &b] {
            assert!(n.len() <= 253 && is_dns_subdomain(n), "{n}");
            assert!(n.ends_with(GENERATED_SUFFIX));
        }
        // A cut that would end in '-' or '.' is trimmed to stay a valid name.
        let dashes = format!(
            "{}{}",
            "x".repeat(230),
            "-".repeat(10) + "y".repeat(13).as_str()
        );
        assert!(is_dns_subdomain(&generated_secret_name(&dashes)));
    }

    #[test]
    fn generated_credentials_are_long_random_and_plain() {
        let a = generate().unwrap();
        let b = generate().unwrap();
        assert_eq!((a.username.len(), a.password.len()), (24, 32));
        assert_ne!(a, b);
        for s in [&a.username, &a.password, &b.username, &b.password] {
            assert!(s.bytes().all(|c| ALPHABET.contains(&c)), "{s}");
        }
        assert_eq!(format!("{a:?}"), "Credentials(<redacted>)");
        // Every character of the alphabet turns up, and none dominates (a bias in the
        // sampling would show here long before it mattered).
        let mut counts = [0usize; 256];
        for _ in 0..200 {
            for c in generate().unwrap().password.bytes() {
                counts[usize::from(c)] += 1;
            }
        }
        for c in ALPHABET {
            let n = counts[usize::from(*c)];
            assert!((30..=200).contains(&n), "{} seen {n} times", *c as char);
        }
    }

    #[test]
    fn secret_values_are_checked_without_printing_them() {
        let f = "spec.auth.secretName";
        assert_eq!(
            from_values("ns/s", f, Some(b"alice"), Some(b"pa:ss")).unwrap(),
            Credentials {
                username: "alice".into(),
                password: "pa:ss".into()
            }
        );
        for (u, p, want) in [
            (
                None,
                Some(&b"SENTINEL"[..]),
                "Secret ns/s (spec.auth.secretName) has no key \"username\"",
            ),
            (
                Some(&b"a"[..]),
                None,
                "Secret ns/s (spec.auth.secretName) has no key \"password\"",
            ),
            (
                Some(&b""[..]),
                Some(&b"SENTINEL"[..]),
                "key \"username\" is empty",
            ),
            (
                Some(&b"a:b"[..]),
                Some(&b"SENTINEL"[..]),
                "key \"username\" contains ':'",
            ),
            (
                Some(&b"a"[..]),
                Some(&b"SENTINEL\n"[..]),
                "key \"password\" contains whitespace",
            ),
            (
                Some(&b"a"[..]),
                Some(&b"SENTINEL\xff"[..]),
                "key \"password\" is not UTF-8",
            ),
            (
                Some(&[b'u'; MAX_CREDENTIAL_BYTES + 1][..]),
                Some(&b"SENTINEL"[..]),
                "key \"username\" is longer than 256 bytes",
            ),
            (
                Some(&b"a"[..]),
                Some(&[b'S'; 1 << 20][..]),
                "key \"password\" is longer than 256 bytes",
            ),
        ] {
            let err = from_values("ns/s", f, u, p).unwrap_err().to_string();
            assert!(err.contains(want), "{err}");
            assert!(!err.contains("SENTINEL"), "{err}");
        }
    }
}
