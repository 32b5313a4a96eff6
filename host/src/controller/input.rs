//! Resolving a Proxy's inputs: the cloud-init bytes and the port, as the provider gets them.

use crate::api::{CloudInit, ProxySpec};
use k8s_openapi::api::core::v1::Secret;

/// Where the cloud-init comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Source<'a> {
    Inline(&'a str),
    Secret { name: &'a str, key: &'a str },
}

/// The spec's cloud-init source. The CRD's CEL rule enforces "exactly one" on a real API
/// server; this is the same check for objects that got past it (older CRD, no CEL).
pub fn source(c: &CloudInit) -> Result<Source<'_>, String> {
    match (&c.inline, &c.secret_key_ref) {
        (Some(text), None) => Ok(Source::Inline(text)),
        (None, Some(r)) => Ok(Source::Secret {
            name: &r.name,
            key: &r.key,
        }),
        (Some(_), Some(_)) => {
            Err("spec.cloudInit sets both inline and secretKeyRef; set exactly one".into())
        }
        (None, None) => {
            Err("spec.cloudInit sets neither inline nor secretKeyRef; set exactly one".into())
        }
    }
}

/// The spec's port as a TCP port (the schema bounds it; this guards objects that were not
/// validated).
pub fn port(spec: &ProxySpec) -> Result<u16, String> {
    u16::try_from(spec.port)
        .ok()
        .filter(|p| *p != 0)
        .ok_or_else(|| format!("spec.port {} is not a TCP port (1-65535)", spec.port))
}

/// The value of `key` in a Secret: `data` (what the API server stores) or `stringData`
/// (only present on objects that were never round-tripped through a server).
pub fn secret_value(secret: &Secret, key: &str) -> Option<Vec<u8>> {
    if let Some(v) = secret.data.as_ref().and_then(|d| d.get(key)) {
        return Some(v.0.clone());
    }
    secret
        .string_data
        .as_ref()
        .and_then(|d| d.get(key))
        .map(|s| s.clone().into_bytes())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::{Placement, SecretKeyRef};
    use k8s_openapi::ByteString;

    #[test]
    fn exactly_one_source() {
        let r = SecretKeyRef {
            name: "s".into(),
            key: "k".into(),
        };
        for (inline, secret, want) in [
            (Some("x"), None, Ok(Source::Inline("x"))),
            (
                None,
                Some(r.clone()),
                Ok(Source::Secret {
                    name: "s",
                    key: "k",
                }),
            ),
            (Some("x"), Some(r.clone()), Err("both")),
            (None, None, Err("neither")),
        ] {
            let c = CloudInit {
                inline: inline.map(String::from),
                secret_key_ref: secret,
            };
            match (source(&c), want) {
                (Ok(got), Ok(want)) => assert_eq!(got, want),
                (Err(got), Err(word)) => assert!(got.contains(word), "{got}"),
                (got, want) => panic!("{got:?} vs {want:?}"),
            }
        }
    }

    #[test]
    fn port_bounds() {
        let spec = |port| ProxySpec {
            provider: "p".into(),
            placement: Placement::default(),
            cloud_init: CloudInit::default(),
            port,
            auth: Default::default(),
            ip_family: Default::default(),
        };
        assert_eq!(port(&spec(3128)), Ok(3128));
        assert_eq!(port(&spec(65535)), Ok(65535));
        for bad in [0, -1, 65536] {
            assert!(port(&spec(bad)).is_err(), "{bad}");
        }
    }

    #[test]
    fn secret_data_then_string_data() {
        let mut s = Secret::default();
        assert_eq!(secret_value(&s, "k"), None);
        s.string_data = Some([("k".to_string(), "plain".to_string())].into());
        assert_eq!(secret_value(&s, "k"), Some(b"plain".to_vec()));
        s.data = Some([("k".to_string(), ByteString(b"bytes".to_vec()))].into());
        assert_eq!(secret_value(&s, "k"), Some(b"bytes".to_vec()));
        assert_eq!(secret_value(&s, "other"), None);
    }
}
