//! The error every provider operation returns, whatever went wrong underneath.

use std::fmt;

/// How the reconciler reacts to a failure. The only thing it branches on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Class {
    /// Gone. From Get: recreate, advance a replacement, or release a deleted Proxy.
    NotFound,
    /// Quota, rate limit, capacity: wait QuotaRetry, not an error.
    QuotaExceeded,
    /// May pass by itself: exponential backoff. Also anything unclassified.
    Transient,
    /// Needs a spec or config change: latched until the Proxy's generation changes.
    Permanent,
}

impl Class {
    /// The label used in metrics and span attributes.
    pub fn as_str(self) -> &'static str {
        match self {
            Class::NotFound => "not_found",
            Class::QuotaExceeded => "quota_exceeded",
            Class::Transient => "transient",
            Class::Permanent => "permanent",
        }
    }
}

impl fmt::Display for Class {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The provider operation that failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Op {
    Create,
    Get,
    Delete,
    List,
    Check,
    /// The price of a placement.
    Quote,
    /// Loading a plugin: `info` and `validate-config`.
    Load,
}

impl Op {
    pub fn as_str(self) -> &'static str {
        match self {
            Op::Create => "create",
            Op::Get => "get",
            Op::Delete => "delete",
            Op::List => "list",
            Op::Check => "check",
            Op::Quote => "quote",
            Op::Load => "load",
        }
    }
}

impl fmt::Display for Op {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A classified failure of one provider operation.
///
/// Every guest error and every trap ends up as one of these, with the operation, the
/// configured provider name and the instance ID (or name, for Create) filled in by the
/// host. `message` has already been scrubbed of secrets and cloud-init.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub struct ProviderError {
    pub class: Class,
    pub op: Op,
    pub provider: String,
    pub id: String,
    pub message: String,
    /// The backend's own error code, if it gave one.
    pub code: Option<String>,
}

impl ProviderError {
    pub fn new(class: Class, op: Op, provider: &str, id: &str, message: impl Into<String>) -> Self {
        ProviderError {
            class,
            op,
            provider: provider.to_string(),
            id: id.to_string(),
            message: message.into(),
            code: None,
        }
    }

    pub fn with_code(mut self, code: impl Into<String>) -> Self {
        self.code = Some(code.into());
        self
    }

    pub fn is(&self, class: Class) -> bool {
        self.class == class
    }
}

impl fmt::Display for ProviderError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "provider {:?} {}", self.provider, self.op)?;
        if !self.id.is_empty() {
            write!(f, " {:?}", self.id)?;
        }
        write!(f, ": {}: {}", self.class, self.message)?;
        if let Some(code) = &self.code {
            write!(f, " (code {code})")?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn display_names_provider_op_id_class_and_code() {
        let e = ProviderError::new(Class::Permanent, Op::Get, "hetzner-eu", "fsn1/42", "bad id")
            .with_code("invalid_input");
        assert_eq!(
            e.to_string(),
            r#"provider "hetzner-eu" get "fsn1/42": permanent: bad id (code invalid_input)"#
        );
        let e = ProviderError::new(Class::Transient, Op::List, "p", "", "boom");
        assert_eq!(e.to_string(), r#"provider "p" list: transient: boom"#);
    }
}
