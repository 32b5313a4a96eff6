//! Outcome logging: one line per operation result (`logging=outcome-only` in the
//! behaviour profile).
//!
//! The line names the plugin, the operation, its subject (an instance name, an ID, an
//! installation; never the request, so cloud-init cannot ride along) and either what
//! happened or the error's class, code and message. Secrets this call read through
//! [`crate::secret`] are cut out of the line before it leaves the plugin. The host scrubs
//! them as well, but a plugin that never emits them is the contract, and the host's
//! `[REDACTED]` in a log means a plugin bug.

use crate::{ErrorClass, Level, ProviderError};
use std::cell::RefCell;

thread_local! {
    /// Secret values read during this call. Each call runs in a fresh instance, so the
    /// list never outlives the call it belongs to.
    static SECRETS: RefCell<Vec<String>> = const { RefCell::new(Vec::new()) };
}

/// Shorter values are not cut: a 1-3 character secret would mangle every line, and is no
/// secret worth the name.
const MIN_SECRET_LEN: usize = 4;

/// Remember a secret value so outcome lines never carry it.
pub(crate) fn remember_secret(value: &str) {
    let value = value.trim();
    if value.len() >= MIN_SECRET_LEN {
        SECRETS.with_borrow_mut(|s| {
            if !s.iter().any(|v| v == value) {
                s.push(value.to_string());
            }
        });
    }
}

fn scrub(mut line: String) -> String {
    SECRETS.with_borrow(|secrets| {
        for s in secrets {
            if line.contains(s.as_str()) {
                line = line.replace(s.as_str(), "[secret]");
            }
        }
    });
    line
}

/// A plugin's outcome logger: a `const` per plugin.
#[derive(Clone, Copy, Debug)]
pub struct Outcomes {
    /// Starts every line (`hetzner create proxy-x: ...`), so lines of several plugins in
    /// one operator log can be told apart.
    pub plugin: &'static str,
    /// Outcome lines are routine: `Debug` keeps them out of a default-level log, `Info`
    /// puts every operation in it.
    pub level: Level,
}

impl Outcomes {
    /// Log the result of `op` on `subject` and hand it on. On success `what` (from the
    /// plugin) says what happened (`created fsn1/42`, `already gone`); a failure logs
    /// `class (code): message`, the class as the WIT names it (`quota-exceeded`).
    pub fn log<T>(
        &self,
        op: &str,
        subject: &str,
        result: Result<(T, String), ProviderError>,
    ) -> Result<T, ProviderError> {
        let (line, out) = self.line(op, subject, result);
        crate::host::log(self.level, &line);
        out
    }

    /// The line [`log`](Self::log) writes, and the result it returns.
    fn line<T>(
        &self,
        op: &str,
        subject: &str,
        result: Result<(T, String), ProviderError>,
    ) -> (String, Result<T, ProviderError>) {
        let head = format!("{} {op} {subject}", self.plugin);
        match result {
            Ok((v, what)) => (scrub(format!("{head}: {what}")), Ok(v)),
            Err(e) => {
                let code = e.code.as_deref().unwrap_or("-");
                let class = match e.class {
                    ErrorClass::NotFound => "not-found",
                    ErrorClass::QuotaExceeded => "quota-exceeded",
                    ErrorClass::Transient => "transient",
                    ErrorClass::Permanent => "permanent",
                };
                let line = format!("{head}: {class} ({code}): {}", e.message);
                (scrub(line), Err(e))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const OUT: Outcomes = Outcomes {
        plugin: "test",
        level: Level::Debug,
    };

    #[test]
    fn one_line_per_result() {
        let (line, r) = OUT.line(
            "create",
            "proxy-x",
            Ok(("r1/1".to_string(), "created r1/1".to_string())),
        );
        assert_eq!(
            (line.as_str(), r.unwrap().as_str()),
            ("test create proxy-x: created r1/1", "r1/1")
        );

        let e = ProviderError::quota("limit reached").with_code("rate_limited");
        let (line, r) = OUT.line::<()>("get", "r1/1", Err(e));
        assert_eq!(
            line,
            "test get r1/1: quota-exceeded (rate_limited): limit reached"
        );
        assert_eq!(r.unwrap_err().class, ErrorClass::QuotaExceeded);

        let (line, _) = OUT.line::<()>("delete", "r1/1", Err(ProviderError::transient("t")));
        assert_eq!(line, "test delete r1/1: transient (-): t");
    }

    #[test]
    fn secrets_read_in_the_call_never_reach_the_line() {
        remember_secret(" tok-SENTINEL-123\n");
        remember_secret("abc"); // too short to cut
        let what = "answer mentions tok-SENTINEL-123 twice: tok-SENTINEL-123, abc".to_string();
        let (line, _) = OUT.line("check", "r1", Ok(((), what)));
        assert_eq!(
            line,
            "test check r1: answer mentions [secret] twice: [secret], abc"
        );
        let e = ProviderError::permanent("bad token tok-SENTINEL-123");
        let (line, _) = OUT.line::<()>("get", "r1/1", Err(e));
        assert!(!line.contains("SENTINEL"), "{line}");
        OUT.log("get", "r1/1", Ok(((), "natively to stderr".to_string())))
            .unwrap();
    }
}
