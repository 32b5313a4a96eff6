//! The host services of the `host` interface, with errors already classified the way the
//! contract asks (a Secret not mounted yet is transient, a misconfigured one permanent).

use crate::ProviderError;
use crate::bindings::egress::provider::host as raw;
use serde::de::DeserializeOwned;

/// This provider's config block, as JSON: the value `validate-config` accepted.
pub fn config() -> String {
    raw::config()
}

/// The config block parsed into the plugin's own config type. A parse failure is
/// permanent: the config will not fix itself.
pub fn config_json<T: DeserializeOwned>() -> Result<T, ProviderError> {
    parse_config(&config())
}

/// Parse a config block; what `validate-config` and [`config_json`] share, so a config
/// that validated also parses at call time. The same as [`crate::config::parse`].
pub fn parse_config<T: DeserializeOwned>(json: &str) -> Result<T, ProviderError> {
    crate::config::parse(json)
}

/// The secret under `key`, read from disk by the host on every call (so rotation works).
///
/// A missing file is transient (an optional Secret mount not populated yet); a key the
/// provider's entry does not name, or a file that cannot be read, is permanent. Messages
/// name the key, never the contents.
pub fn secret(key: &str) -> Result<Vec<u8>, ProviderError> {
    let value = raw::read_secret(key).map_err(|e| secret_error(key, e))?;
    if let Ok(text) = std::str::from_utf8(&value) {
        crate::secrets_seen::remember_secret(text);
    }
    Ok(value)
}

/// [`secret`] as UTF-8 with surrounding whitespace removed: secret files are often
/// written with a trailing newline that would otherwise end up in an auth header.
pub fn secret_string(key: &str) -> Result<String, ProviderError> {
    let bytes = secret(key)?;
    let text = String::from_utf8(bytes).map_err(|_| {
        ProviderError::permanent(format!("secret {key:?} is not valid UTF-8"))
            .with_code("SecretInvalid")
    })?;
    Ok(text.trim().to_string())
}

/// Makes `value` a secret of this provider, as its configured secrets are: the host then
/// removes it from every log line, error and reply of every later call, in every encoding.
/// For what the plugin derives from its secrets: an exchanged access token, a signature,
/// a session cookie. Values under 8 bytes are ignored; one over 2048 bytes ends the call. The
/// host holds the 8 latest values.
#[cfg(not(feature = "contract-v0-1"))]
pub fn mark_sensitive(value: &[u8]) {
    if let Ok(text) = std::str::from_utf8(value) {
        crate::secrets_seen::remember_secret(text);
    }
    raw::mark_sensitive(value);
}

fn secret_error(key: &str, e: raw::SecretError) -> ProviderError {
    match e {
        raw::SecretError::NotConfigured => ProviderError::permanent(format!(
            "secret {key:?} is not configured for this provider"
        ))
        .with_code("SecretNotConfigured"),
        raw::SecretError::Missing(why) => {
            ProviderError::transient(format!("secret {key:?} is missing: {why}"))
                .with_code("SecretMissing")
        }
        raw::SecretError::Unreadable(why) => {
            ProviderError::permanent(format!("secret {key:?} is unreadable: {why}"))
                .with_code("SecretUnreadable")
        }
    }
}

/// A value from the per-provider cache, if present and not expired or evicted.
pub fn cache_get(key: &str) -> Option<Vec<u8>> {
    raw::cache_get(key)
}

/// Store a value in the per-provider cache for up to `ttl_seconds`; it may be evicted
/// earlier, so callers must be able to recompute it.
pub fn cache_set(key: &str, value: &[u8], ttl_seconds: u32) {
    raw::cache_set(key, value, ttl_seconds)
}

/// Write one log line through the host (which redacts secrets and caps volume). Outside
/// a component (native unit tests of plugin code) there is no host, so lines go to
/// stderr instead of hitting an unreachable import.
#[doc(hidden)]
pub fn log(level: crate::Level, message: &str) {
    #[cfg(target_arch = "wasm32")]
    raw::log(level, message);
    #[cfg(not(target_arch = "wasm32"))]
    eprintln!("[{level:?}] {message}");
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ErrorClass;

    #[test]
    fn secret_errors_are_classified_without_contents() {
        let e = secret_error("token", raw::SecretError::NotConfigured);
        assert!(matches!(e.class, ErrorClass::Permanent));
        assert!(e.message.contains("\"token\""));

        let e = secret_error("token", raw::SecretError::Missing("no such file".into()));
        assert!(matches!(e.class, ErrorClass::Transient));
        assert!(e.message.contains("\"token\""));

        let e = secret_error("token", raw::SecretError::Unreadable("permission".into()));
        assert!(matches!(e.class, ErrorClass::Permanent));
    }

    #[test]
    fn parse_config_names_the_problem() {
        #[derive(serde::Deserialize, Debug)]
        #[allow(dead_code)]
        struct C {
            endpoint: String,
        }
        let e = parse_config::<C>("{}").unwrap_err();
        assert!(matches!(e.class, ErrorClass::Permanent));
        assert!(e.message.contains("endpoint"), "{}", e.message);
        assert!(parse_config::<C>(r#"{"endpoint":"x"}"#).is_ok());
    }
}
