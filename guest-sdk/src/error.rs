//! Constructors for [`ProviderError`], so that a plugin picks a class by name at the
//! place it understands the failure, and a default class for HTTP failures it does not
//! look at.

use crate::http::HttpError;
use crate::{ErrorClass, ProviderError};

impl ProviderError {
    fn new(class: ErrorClass, message: impl Into<String>) -> Self {
        ProviderError {
            class,
            message: message.into(),
            code: None,
        }
    }

    /// Retrying cannot help until the spec or config changes (bad placement, bad config,
    /// auth denied, malformed ID). Name the field and value in `message`.
    pub fn permanent(message: impl Into<String>) -> Self {
        Self::new(ErrorClass::Permanent, message)
    }

    /// May pass by itself: network, 5xx, timeouts, anything unknown.
    pub fn transient(message: impl Into<String>) -> Self {
        Self::new(ErrorClass::Transient, message)
    }

    /// The backend says the instance is gone. Never use it for "cannot tell".
    pub fn not_found(message: impl Into<String>) -> Self {
        Self::new(ErrorClass::NotFound, message)
    }

    /// Quota, rate limit or no capacity: the operator waits instead of backing off.
    pub fn quota(message: impl Into<String>) -> Self {
        Self::new(ErrorClass::QuotaExceeded, message)
    }

    /// Attach the backend's own error code (e.g. `InvalidInstanceID.NotFound`).
    pub fn with_code(mut self, code: impl Into<String>) -> Self {
        self.code = Some(code.into());
        self
    }
}

/// A default for failures the plugin does not classify itself: transport errors are
/// transient (the network or the backend may recover), a malformed request is the
/// plugin's or config's fault and permanent. For backend answers only the unambiguous
/// statuses are classified; a 404 is permanent here because only the plugin knows
/// whether it means "instance gone" (not-found) or "wrong URL" — classify it yourself.
impl From<HttpError> for ProviderError {
    fn from(err: HttpError) -> Self {
        let code = err.code_name();
        let message = err.to_string();
        let e = match &err {
            HttpError::Transport(_) | HttpError::Json(_) => ProviderError::transient(message),
            HttpError::Status { status, .. } => match *status {
                429 => ProviderError::quota(message),
                408 | 500..=599 => ProviderError::transient(message),
                400..=499 => ProviderError::permanent(message),
                _ => ProviderError::transient(message),
            },
            HttpError::InvalidUrl(_) | HttpError::Header { .. } => {
                ProviderError::permanent(message)
            }
        };
        e.with_code(code)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::http::ErrorCode;

    #[test]
    fn constructors_set_class_and_code() {
        let e = ProviderError::permanent("placement.region \"x\" unknown").with_code("BadRegion");
        assert!(matches!(e.class, ErrorClass::Permanent));
        assert_eq!(e.code.as_deref(), Some("BadRegion"));
        assert!(matches!(
            ProviderError::transient("t").class,
            ErrorClass::Transient
        ));
        assert!(matches!(
            ProviderError::not_found("n").class,
            ErrorClass::NotFound
        ));
        assert!(matches!(
            ProviderError::quota("q").class,
            ErrorClass::QuotaExceeded
        ));
        assert_eq!(ProviderError::quota("q").code, None);
    }

    #[test]
    fn http_errors_default_classes() {
        let e: ProviderError = HttpError::Transport(ErrorCode::ConnectionReadTimeout).into();
        assert!(matches!(e.class, ErrorClass::Transient));
        assert_eq!(e.code.as_deref(), Some("ConnectionReadTimeout"));

        let status = |s| HttpError::Status {
            status: s,
            body: b"oops".to_vec(),
        };
        let class = |s| ProviderError::from(status(s)).class;
        assert!(matches!(class(429), ErrorClass::QuotaExceeded));
        assert!(matches!(class(503), ErrorClass::Transient));
        assert!(matches!(class(403), ErrorClass::Permanent));
        assert!(matches!(class(404), ErrorClass::Permanent));

        let e: ProviderError = HttpError::InvalidUrl("no scheme".into()).into();
        assert!(matches!(e.class, ErrorClass::Permanent));
    }
}
