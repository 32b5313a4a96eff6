//! Constructors for [`ProviderError`], so that a plugin picks a class by name at the
//! place it understands the failure, and a default class for HTTP failures it does not
//! look at.
//!
//! The typed constructors further down exist because the same failures (a bad config, a
//! malformed ID, a name held by another Proxy, a placement outside the catalogue) occur in
//! every plugin: built here, they carry the same class and the same [`code`] everywhere,
//! so the operator's user and its dashboards see one vocabulary whatever the backend.

use crate::http::HttpError;
use crate::{ErrorClass, ProviderError};
use std::fmt;

/// The `code` values the SDK's constructors set, for plugins that match on them.
pub mod code {
    /// The provider's config block is unusable.
    pub const INVALID_CONFIG: &str = "InvalidConfig";
    /// An instance ID that this plugin never wrote.
    pub const INVALID_ID: &str = "InvalidId";
    /// The instance name is held by an instance of another Proxy.
    pub const NAME_TAKEN: &str = "NameTaken";
    /// The cloud-init is larger than the backend accepts.
    pub const USER_DATA_TOO_LARGE: &str = "UserDataTooLarge";
    /// The codes the operator acts on, as the contract crate defines them.
    pub use egress_contract::codes::{INTERRUPTED, SPOT_CAPACITY_UNAVAILABLE, UNSUPPORTED};
}

/// A field of the Proxy's `spec.placement`, for [`ProviderError::invalid_placement`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PlacementField {
    Region,
    Zone,
    MachineType,
    Image,
}

impl PlacementField {
    /// The field as the user wrote it in the Proxy (`placement.machineType`).
    pub fn name(self) -> &'static str {
        match self {
            PlacementField::Region => "region",
            PlacementField::Zone => "zone",
            PlacementField::MachineType => "machineType",
            PlacementField::Image => "image",
        }
    }

    /// The error code of a value this field cannot take (`InvalidMachineType`).
    pub fn code(self) -> &'static str {
        match self {
            PlacementField::Region => "InvalidRegion",
            PlacementField::Zone => "InvalidZone",
            PlacementField::MachineType => "InvalidMachineType",
            PlacementField::Image => "InvalidImage",
        }
    }
}

impl ProviderError {
    /// An error of a class decided elsewhere (a classification table, a backend's action
    /// status).
    pub fn new(class: ErrorClass, message: impl Into<String>) -> Self {
        ProviderError {
            class,
            message: message.into(),
            code: None,
            #[cfg(not(feature = "contract-v0-1"))]
            retry_after_ms: None,
        }
    }

    /// The backend said it is rate limiting this account, and for how long (a code in the
    /// body, a documented back-off the host cannot read from the headers): the host pauses
    /// every request of this provider for `ms` (at most an hour). Use it with a
    /// quota-exceeded or transient error.
    #[cfg(not(feature = "contract-v0-1"))]
    pub fn with_retry_after(mut self, ms: u32) -> Self {
        self.retry_after_ms = Some(ms);
        self
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

    /// The config block cannot be used: permanent, `InvalidConfig`. The message must name
    /// the field and the value; [`crate::config`](mod@crate::config) builds such messages.
    pub fn invalid_config(message: impl Into<String>) -> Self {
        Self::permanent(message).with_code(code::INVALID_CONFIG)
    }

    /// `id` is not an ID this plugin writes: permanent, `InvalidId`, never a lookup of
    /// something else. `want` describes the shape (`<region>/<id>, e.g. r1/i-1`).
    pub fn invalid_id(id: &str, want: &str) -> Self {
        Self::permanent(format!("malformed id {id:?}: want {want}")).with_code(code::INVALID_ID)
    }

    /// The instance called `name` (`holder`, e.g. `server 42`) carries another Proxy's
    /// uid: permanent, `NameTaken`. The name derives from the Proxy's UID, so retrying
    /// cannot free it, and adopting it would give one machine to two Proxies.
    pub fn name_taken(name: &str, holder: &str, found_uid: &str, uid: &str) -> Self {
        let msg = format!(
            "{holder} already has the name {name:?} with uid {found_uid:?}, not {uid:?}: it is not this Proxy's"
        );
        Self::permanent(msg).with_code(code::NAME_TAKEN)
    }

    /// `placement.<field>` holds `value`, which can never work here: permanent, with the
    /// field's code. `why` completes the sentence and says what is accepted (`is not one
    /// of the configured locations ["fsn1"]`); the Proxy's spec is not validated by
    /// Kubernetes, so this is the user's only feedback.
    pub fn invalid_placement(field: PlacementField, value: &str, why: impl fmt::Display) -> Self {
        let msg = format!("placement.{} {value:?} {why}", field.name());
        Self::permanent(msg).with_code(field.code())
    }

    /// The cloud-init of `len` bytes is over the backend's `max`: permanent,
    /// `UserDataTooLarge`, refused before the call so the message names the sizes instead
    /// of a backend field error. `note` is appended to the size (e.g. how it was encoded).
    pub fn user_data_too_large(len: usize, max: usize, note: &str) -> Self {
        let msg = format!(
            "cloud-init is {len} bytes{note}; the backend accepts at most {max} bytes of user data"
        );
        Self::permanent(msg).with_code(code::USER_DATA_TOO_LARGE)
    }

    /// For requests that do not address the instance (a list, the create call), where
    /// not-found cannot mean "the instance is gone": something the request names does not
    /// exist, which retrying cannot fix. Turns not-found into permanent with `hint` (what
    /// to check) added; other classes pass unchanged. Keeps not-found out of create and
    /// list, where it would mislead the reconciler.
    pub fn not_found_is_permanent(self, hint: &str) -> Self {
        match self.class {
            ErrorClass::NotFound => ProviderError {
                class: ErrorClass::Permanent,
                message: format!("{} ({hint})", self.message),
                ..self
            },
            _ => self,
        }
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

    /// Every typed constructor: its class, its code and a message that names the value.
    #[test]
    fn typed_constructors() {
        use ErrorClass::*;
        let cases = [
            (
                ProviderError::invalid_config("config.x 1 is invalid: no"),
                Permanent,
                "InvalidConfig",
                "config.x 1 is invalid: no",
            ),
            (
                ProviderError::invalid_id("r1/../x", "<region>/<id>"),
                Permanent,
                "InvalidId",
                r#"malformed id "r1/../x": want <region>/<id>"#,
            ),
            (
                ProviderError::name_taken("proxy-a", "server 42", "u-2", "u-1"),
                Permanent,
                "NameTaken",
                r#"server 42 already has the name "proxy-a" with uid "u-2", not "u-1": it is not this Proxy's"#,
            ),
            (
                ProviderError::invalid_placement(PlacementField::MachineType, "cx99", "is unknown"),
                Permanent,
                "InvalidMachineType",
                r#"placement.machineType "cx99" is unknown"#,
            ),
            (
                ProviderError::invalid_placement(PlacementField::Zone, "", "is not one of []"),
                Permanent,
                "InvalidZone",
                r#"placement.zone "" is not one of []"#,
            ),
            (
                ProviderError::user_data_too_large(20, 16, " (28 bytes base64)"),
                Permanent,
                "UserDataTooLarge",
                "cloud-init is 20 bytes (28 bytes base64); the backend accepts at most 16 bytes of user data",
            ),
        ];
        for (e, class, code, message) in cases {
            assert_eq!(
                (e.class, e.code.as_deref(), e.message.as_str()),
                (class, Some(code), message)
            );
        }
        let codes = [
            (PlacementField::Region, "region", "InvalidRegion"),
            (PlacementField::Image, "image", "InvalidImage"),
        ];
        for (f, name, code) in codes {
            assert_eq!((f.name(), f.code()), (name, code));
        }
    }

    #[test]
    fn not_found_is_permanent_only_for_not_found() {
        let e = ProviderError::not_found("no such collection")
            .with_code("not_found")
            .not_found_is_permanent("check config.endpoint");
        assert_eq!(
            (e.class, e.code.as_deref()),
            (ErrorClass::Permanent, Some("not_found"))
        );
        assert_eq!(e.message, "no such collection (check config.endpoint)");
        for e in [
            ProviderError::transient("t"),
            ProviderError::quota("q"),
            ProviderError::permanent("p"),
        ] {
            let class = e.class;
            let after = e.not_found_is_permanent("hint");
            assert_eq!(after.class, class);
            assert!(!after.message.contains("hint"));
        }
    }

    #[test]
    fn http_errors_default_classes() {
        let e: ProviderError = HttpError::Transport(ErrorCode::ConnectionReadTimeout).into();
        assert!(matches!(e.class, ErrorClass::Transient));
        assert_eq!(e.code.as_deref(), Some("ConnectionReadTimeout"));

        let status = |s| HttpError::Status {
            status: s,
            body: b"oops".to_vec(),
            retry_after: None,
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
