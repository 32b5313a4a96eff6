//! What the `host` interface gives a plugin, whatever contract version it was built
//! against: each version's bindings (`abi/`) convert their types and call these.

use super::sandbox::{CallState, truncate};
use crate::redact::escape_controls;
use crate::sensitive::{MAX_DERIVED_BYTES, MIN_DERIVED_BYTES};
use std::time::{Duration, Instant};

/// A guest log line's level.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum LogLevel {
    Trace,
    Debug,
    Info,
    Warn,
    Error,
}

/// Why `read-secret` failed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum SecretProblem {
    NotConfigured,
    Missing(String),
    Unreadable(String),
}

impl CallState {
    /// Emits one guest log line, scrubbed and capped (`limits.logLines`,
    /// `limits.logLineBytes`).
    pub(crate) fn guest_log(&mut self, level: LogLevel, message: &str) {
        let limits = &self.shared.limits;
        if self.log_lines >= limits.log_lines {
            self.log_dropped += 1;
            return;
        }
        self.log_lines += 1;
        // Scrub before escaping (a secret may hold a newline), escape before cutting; only
        // what the line can keep is looked at (a message can be 3 MiB).
        let text = self
            .redactor
            .scrub_line(message, limits.log_line_bytes as usize);
        let provider = self.shared.name.as_str();
        match level {
            LogLevel::Trace => tracing::trace!(target: "plugin", provider, "{text}"),
            LogLevel::Debug => tracing::debug!(target: "plugin", provider, "{text}"),
            LogLevel::Info => tracing::info!(target: "plugin", provider, "{text}"),
            LogLevel::Warn => tracing::warn!(target: "plugin", provider, "{text}"),
            LogLevel::Error => tracing::error!(target: "plugin", provider, "{text}"),
        }
    }

    pub(crate) fn guest_config(&self) -> String {
        self.shared.config_json.clone()
    }

    /// Reads a configured secret file now (a rotated Secret takes effect at once); the
    /// value becomes sensitive before the guest sees it.
    pub(crate) fn guest_read_secret(&mut self, key: &str) -> Result<Vec<u8>, SecretProblem> {
        let Some(path) = self.shared.secrets.get(key) else {
            return Err(SecretProblem::NotConfigured);
        };
        match std::fs::read(path) {
            Ok(value) => {
                if self.shared.sensitive.add_secret(&value) {
                    self.redactor = self.shared.sensitive.redactor();
                }
                Ok(value)
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                Err(SecretProblem::Missing(format!(
                    "secret {key:?}: file {} does not exist (is the Secret mounted?)",
                    path.display()
                )))
            }
            Err(e) => Err(SecretProblem::Unreadable(format!(
                "secret {key:?}: cannot read {}: {}",
                path.display(),
                e.kind()
            ))),
        }
    }

    pub(crate) fn guest_cache_get(&mut self, key: &str) -> Option<Vec<u8>> {
        self.shared
            .cache
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(key, Instant::now())
    }

    pub(crate) fn guest_cache_set(&mut self, key: String, value: Vec<u8>, ttl_seconds: u32) {
        self.shared
            .cache
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .set(
                key,
                value,
                Duration::from_secs(ttl_seconds.into()),
                Instant::now(),
            );
    }

    /// Makes a value the plugin derived (a token, a signature) sensitive for this call and
    /// every later one of the provider. A value too long to hold ends the call: a quiet
    /// refusal would leave it unscrubbed. One the redactor has no room for ends it too, for
    /// the same reason.
    pub(crate) fn guest_mark_sensitive(&mut self, value: &[u8]) -> wasmtime::Result<()> {
        if value.len() > MAX_DERIVED_BYTES {
            return Err(wasmtime::format_err!(
                "mark-sensitive got a value of {} bytes, more than the {MAX_DERIVED_BYTES} a plugin may mark",
                value.len()
            ));
        }
        if value.len() < MIN_DERIVED_BYTES {
            return Ok(());
        }
        match self.shared.sensitive.mark_derived(value) {
            Ok(true) => {
                self.redactor = self.shared.sensitive.redactor();
                Ok(())
            }
            Ok(false) => Ok(()),
            Err(full) => Err(wasmtime::format_err!(
                "mark-sensitive: the redactor has no room for the value ({} KiB used of {} KiB, --redaction-memory)",
                full.used >> 10,
                full.limit >> 10
            )),
        }
    }

    /// Logs what the guest printed, then how much was dropped. Runs when the call ends,
    /// whatever way it ended.
    pub(super) fn flush_output(&mut self) {
        for (stream, out) in [
            ("stdout", self.stdout.clone()),
            ("stderr", self.stderr.clone()),
        ] {
            let (bytes, dropped) = out.take();
            // The whole capture is scrubbed before it is split into lines: a multi-line
            // secret printed as is must not come out line by line, unmatched.
            let text = self.redactor.scrub_bytes(&bytes);
            for line in text.lines().filter(|l| !l.trim().is_empty()) {
                self.guest_log(
                    super::host_services::LogLevel::Info,
                    &format!("[{stream}] {line}"),
                );
            }
            if dropped > 0 {
                tracing::warn!(target: "plugin", provider = self.shared.name.as_str(), stream, dropped_bytes = dropped, "plugin output past the capture cap was dropped");
            }
        }
        if self.log_dropped > 0 {
            tracing::warn!(
                target: "plugin",
                provider = self.shared.name.as_str(),
                dropped_lines = self.log_dropped,
                limit = self.shared.limits.log_lines,
                "plugin log lines past limits.logLines were dropped"
            );
            self.log_dropped = 0;
        }
    }

    /// The last lines the guest wrote to stderr (a panic message lands there), scrubbed.
    pub(super) fn stderr_tail(&self) -> String {
        // Scrub the whole capture before cutting: a cut could split a secret and defeat the match.
        let bytes = self.stderr.tail(usize::MAX);
        let text = self.redactor.scrub_bytes(&bytes);
        let last: Vec<&str> = text.lines().filter(|l| !l.trim().is_empty()).collect();
        truncate(
            &escape_controls(&last[last.len().saturating_sub(2)..].join(" / ")),
            512,
        )
    }
}
