//! Registry credentials and challenges. Pure.
//!
//! Credentials come from a docker config file (the `.dockerconfigjson` of a
//! `kubernetes.io/dockerconfigjson` Secret, mounted): `auths` by registry, each an `auth`
//! (base64 `user:password`) or `username` and `password`. A registry asks for them with a
//! `WWW-Authenticate` challenge: `Basic`, or `Bearer realm=...,service=...,scope=...` (the
//! distribution token protocol: the credentials buy a short-lived token at the realm).

use std::collections::BTreeMap;

/// A user name and password for one registry. Never printed.
#[derive(Clone, PartialEq, Eq)]
pub struct Credentials {
    pub username: String,
    pub password: String,
}

impl std::fmt::Debug for Credentials {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Credentials(..)")
    }
}

impl Credentials {
    /// The `Authorization` value for Basic auth.
    pub fn basic(&self) -> String {
        let raw = format!("{}:{}", self.username, self.password);
        format!("Basic {}", data_encoding::BASE64.encode(raw.as_bytes()))
    }
}

/// Largest docker config file read.
pub const MAX_CONFIG_BYTES: u64 = 1 << 20;

#[derive(serde::Deserialize)]
struct DockerConfig {
    #[serde(default)]
    auths: BTreeMap<String, AuthEntry>,
}

#[derive(serde::Deserialize)]
struct AuthEntry {
    #[serde(default)]
    auth: Option<String>,
    #[serde(default)]
    username: Option<String>,
    #[serde(default)]
    password: Option<String>,
}

/// The credentials a docker config holds for `registry` (`host[:port]`). Keys may be
/// written as `host`, `https://host` or `https://host/v1/` (docker's own habit). Errors
/// never quote the file's content.
pub fn credentials_for(config: &[u8], registry: &str) -> Result<Option<Credentials>, String> {
    let parsed: DockerConfig = serde_json::from_slice(config).map_err(|e| {
        format!(
            "is not a docker config (JSON with \"auths\"): line {}, column {}",
            e.line(),
            e.column()
        )
    })?;
    let entry = parsed.auths.iter().find(|(key, _)| {
        let host = key
            .trim_start_matches("https://")
            .trim_start_matches("http://");
        host.split('/').next() == Some(registry)
    });
    let Some((key, entry)) = entry else {
        return Ok(None);
    };
    if let Some(auth) = &entry.auth {
        let decoded = data_encoding::BASE64
            .decode(auth.trim().as_bytes())
            .ok()
            .and_then(|b| String::from_utf8(b).ok())
            .ok_or_else(|| format!("auths[{key:?}].auth is not base64 of user:password"))?;
        let (u, p) = decoded
            .split_once(':')
            .ok_or_else(|| format!("auths[{key:?}].auth is not base64 of user:password"))?;
        return Ok(Some(Credentials {
            username: u.into(),
            password: p.into(),
        }));
    }
    match (&entry.username, &entry.password) {
        (Some(u), Some(p)) => Ok(Some(Credentials {
            username: u.clone(),
            password: p.clone(),
        })),
        _ => Err(format!(
            "auths[{key:?}] has neither auth nor username and password (identity tokens are not supported)"
        )),
    }
}

/// A registry's `WWW-Authenticate` challenge.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Challenge {
    Basic,
    Bearer {
        realm: String,
        service: Option<String>,
        scope: Option<String>,
    },
}

/// Parses `Basic realm="x"` or `Bearer realm="https://auth",service="reg",scope="repository:a:pull"`.
pub fn parse_challenge(header: &str) -> Option<Challenge> {
    let (scheme, rest) = header.trim().split_once(' ').unwrap_or((header.trim(), ""));
    if scheme.eq_ignore_ascii_case("basic") {
        return Some(Challenge::Basic);
    }
    if !scheme.eq_ignore_ascii_case("bearer") {
        return None;
    }
    let params = params(rest);
    Some(Challenge::Bearer {
        realm: params.get("realm")?.clone(),
        service: params.get("service").cloned(),
        scope: params.get("scope").cloned(),
    })
}

/// `k="v",k2=v2` (quoted values may hold commas).
fn params(s: &str) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    let mut rest = s.trim();
    while !rest.is_empty() {
        let Some((key, after)) = rest.split_once('=') else {
            break;
        };
        let key = key
            .trim()
            .trim_start_matches(',')
            .trim()
            .to_ascii_lowercase();
        let after = after.trim_start();
        let (value, next) = if let Some(quoted) = after.strip_prefix('"') {
            match quoted.find('"') {
                Some(end) => (&quoted[..end], &quoted[end + 1..]),
                None => (quoted, ""),
            }
        } else {
            match after.find(',') {
                Some(end) => (&after[..end], &after[end..]),
                None => (after, ""),
            }
        };
        out.insert(key, value.to_string());
        rest = next.trim_start().trim_start_matches(',').trim_start();
    }
    out
}

/// The token of a token endpoint's answer (`token`, or OAuth2's `access_token`).
pub fn token_from(body: &[u8]) -> Option<String> {
    #[derive(serde::Deserialize)]
    struct Answer {
        token: Option<String>,
        access_token: Option<String>,
    }
    let a: Answer = serde_json::from_slice(body).ok()?;
    a.token.or(a.access_token).filter(|t| !t.is_empty())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn credentials_are_found_by_registry_in_any_of_dockers_key_forms() {
        let auth = data_encoding::BASE64.encode(b"robot:s3cret:x");
        let config = format!(
            r#"{{"auths": {{"https://reg.example:5000/v1/": {{"auth": "{auth}"}}, "other.example": {{"username": "u", "password": "p"}}, "broken.example": {{}}}}}}"#
        );
        let c = credentials_for(config.as_bytes(), "reg.example:5000")
            .unwrap()
            .unwrap();
        assert_eq!(
            (c.username.as_str(), c.password.as_str()),
            ("robot", "s3cret:x")
        );
        assert_eq!(format!("{c:?}"), "Credentials(..)");
        let c = credentials_for(config.as_bytes(), "other.example")
            .unwrap()
            .unwrap();
        assert_eq!(c.basic(), "Basic dTpw");
        assert_eq!(
            credentials_for(config.as_bytes(), "reg.example").unwrap(),
            None
        );
        assert!(
            credentials_for(config.as_bytes(), "broken.example")
                .unwrap_err()
                .contains("neither")
        );
        let err = credentials_for(
            b"{\"auths\": {\"r\": {\"auth\": \"pw-in-clear\"}}} junk",
            "r",
        )
        .unwrap_err();
        assert!(!err.contains("pw-in-clear"), "{err}");
    }

    #[test]
    fn challenges_parse() {
        assert_eq!(
            parse_challenge("Basic realm=\"Registry\""),
            Some(Challenge::Basic)
        );
        assert_eq!(
            parse_challenge(
                "Bearer realm=\"https://auth.example/token\",service=\"reg\",scope=\"repository:a/b:pull,push\""
            ),
            Some(Challenge::Bearer {
                realm: "https://auth.example/token".into(),
                service: Some("reg".into()),
                scope: Some("repository:a/b:pull,push".into()),
            })
        );
        assert_eq!(parse_challenge("Bearer service=x"), None);
        assert_eq!(parse_challenge("Negotiate abc"), None);
        assert_eq!(
            token_from(br#"{"access_token": "t"}"#).as_deref(),
            Some("t")
        );
        assert_eq!(token_from(br#"{"token": ""}"#), None);
    }
}
