//! Scrubbing of secrets and cloud-init from everything that leaves a guest.
//!
//! A plugin can be careless or hostile: it can log its token, echo user data in an error,
//! or put a credential in a health-check message. The host does not trust it to behave and
//! replaces every known sensitive byte string before a log line, error message or status
//! leaves the call. Besides the raw values it also scrubs their base64 forms (providers
//! base64-encode user data for most APIs) and each substantial line of the cloud-init, so a
//! plugin that logs part of it is caught too.

use aho_corasick::{AhoCorasick, MatchKind};

/// Replacement text for a scrubbed value.
pub const REDACTED: &str = "[REDACTED]";

/// Lines of cloud-init shorter than this are not scrubbed on their own (they would match
/// ordinary words like `runcmd:`); the whole document and its longer lines always are.
const MIN_LINE: usize = 12;

/// A set of sensitive values, compiled for fast replacement.
#[derive(Clone, Default)]
pub struct Redactor {
    matcher: Option<AhoCorasick>,
}

impl std::fmt::Debug for Redactor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Redactor { .. }")
    }
}

impl Redactor {
    /// Builds a redactor for the given secrets and cloud-init. Empty values are ignored.
    pub fn new<'a>(secrets: impl IntoIterator<Item = &'a [u8]>, cloud_init: &[u8]) -> Self {
        let mut patterns: Vec<Vec<u8>> = Vec::new();
        let mut add = |value: &[u8]| {
            if value.is_empty() {
                return;
            }
            patterns.push(value.to_vec());
            let b64 = data_encoding::BASE64.encode(value);
            // Without padding too: a value embedded in a longer base64 text loses it.
            patterns.push(b64.trim_end_matches('=').as_bytes().to_vec());
        };
        for secret in secrets {
            add(secret);
            let trimmed = secret.trim_ascii();
            if trimmed.len() != secret.len() {
                add(trimmed);
            }
        }
        add(cloud_init);
        for line in cloud_init.split(|b| *b == b'\n') {
            let line = line.trim_ascii();
            if line.len() >= MIN_LINE {
                patterns.push(line.to_vec());
            }
        }
        patterns.retain(|p| !p.is_empty());
        if patterns.is_empty() {
            return Redactor::default();
        }
        let matcher = AhoCorasick::builder()
            .match_kind(MatchKind::LeftmostLongest)
            .build(&patterns)
            .expect("literal patterns always build");
        Redactor {
            matcher: Some(matcher),
        }
    }

    /// The text with every sensitive value replaced by [`REDACTED`].
    pub fn scrub(&self, text: &str) -> String {
        match &self.matcher {
            None => text.to_string(),
            Some(m) => {
                let bytes = m.replace_all_bytes(
                    text.as_bytes(),
                    &[REDACTED.as_bytes()].repeat(m.patterns_len()),
                );
                String::from_utf8_lossy(&bytes).into_owned()
            }
        }
    }

    /// Like [`Redactor::scrub`] for raw bytes (guest stdout), returned as lossy UTF-8.
    pub fn scrub_bytes(&self, bytes: &[u8]) -> String {
        self.scrub(&String::from_utf8_lossy(bytes))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scrubs_values_their_base64_and_cloud_init_lines() {
        let cloud_init = b"#cloud-config\nruncmd:\n  - echo SENTINEL-CLOUD-INIT-1234 > /etc/x\n";
        let r = Redactor::new([&b"tok-SECRET-5678\n"[..]], cloud_init);
        let b64_secret = data_encoding::BASE64.encode(b"tok-SECRET-5678\n");
        let b64_ci = data_encoding::BASE64.encode(cloud_init);
        let cases = [
            ("token tok-SECRET-5678 here", "token [REDACTED] here"),
            ("nothing to see", "nothing to see"),
            (
                "line - echo SENTINEL-CLOUD-INIT-1234 > /etc/x!",
                "line [REDACTED]!",
            ),
            ("runcmd: stays", "runcmd: stays"),
        ];
        for (input, want) in cases {
            assert_eq!(r.scrub(input), want);
        }
        for leak in [
            b64_secret,
            b64_ci,
            String::from_utf8_lossy(cloud_init).into_owned(),
        ] {
            let out = r.scrub(&format!("x{leak}y"));
            assert!(
                !out.contains("SENTINEL") && !out.contains("SECRET"),
                "{out}"
            );
            assert!(out.contains(REDACTED), "{out}");
        }
    }

    #[test]
    fn empty_redactor_is_identity() {
        let r = Redactor::new(std::iter::empty(), b"");
        assert_eq!(r.scrub("abc"), "abc");
    }
}
