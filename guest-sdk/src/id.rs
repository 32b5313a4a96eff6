//! Scoped instance IDs: `<scope>/<key>`, e.g. `fsn1/4200001` or `eu-west-1/i-0abc...`.
//!
//! `get` and `delete` receive only the ID, and the config may have changed since
//! `create`, so an ID carries where the instance lives (the scope: a region, a location, a
//! project) next to the backend's own key. Parsing is strict: an ID this plugin never
//! wrote is a permanent `InvalidId` error and never reaches a URL, where `../x` or
//! `1?x=` would address something else.

use crate::ProviderError;
use std::fmt;

/// How one plugin's IDs look: what a valid scope and key are, and a description for the
/// error message. A `const` per plugin, used for both directions.
#[derive(Clone, Copy)]
pub struct IdFormat {
    /// `<location>/<server id>, e.g. fsn1/4200001`: said in every malformed-ID error.
    pub shape: &'static str,
    pub scope: fn(&str) -> bool,
    pub key: fn(&str) -> bool,
}

impl IdFormat {
    /// `<scope>/<key>`. Both parts should pass this format's checks; [`parse`](Self::parse)
    /// refuses an ID built from parts that do not.
    pub fn format(&self, scope: &str, key: impl fmt::Display) -> String {
        format!("{scope}/{key}")
    }

    /// The scope and key of `id`, or `InvalidId` naming the ID and the expected shape.
    pub fn parse<'a>(&self, id: &'a str) -> Result<(&'a str, &'a str), ProviderError> {
        match id.split_once('/') {
            Some((scope, key)) if (self.scope)(scope) && (self.key)(key) => Ok((scope, key)),
            _ => Err(ProviderError::invalid_id(id, self.shape)),
        }
    }
}

/// Whether `s` is a number exactly as `u64::to_string` writes it: digits only, no sign,
/// no leading zero, in range. Backends with numeric IDs use it as the key check, so the
/// key parses and formats back to the same ID.
pub fn is_decimal_id(s: &str) -> bool {
    !s.is_empty()
        && !s.starts_with('0')
        && s.bytes().all(|b| b.is_ascii_digit())
        && s.parse::<u64>().is_ok()
}

/// Whether `s` is 1 to `max` bytes, each an ASCII letter, digit or one of `extra`: the
/// usual shape of a region name or a backend key, and never `/`, `.` or `..` unless
/// `extra` allows them.
pub fn is_word(s: &str, max: usize, extra: &[u8]) -> bool {
    (1..=max).contains(&s.len())
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || extra.contains(&b))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ErrorClass;

    const FORMAT: IdFormat = IdFormat {
        shape: "<location>/<server id>, e.g. fsn1/4200001",
        scope: |s| is_word(s, 32, b"-") && !s.bytes().any(|b| b.is_ascii_uppercase()),
        key: is_decimal_id,
    };

    #[test]
    fn round_trip_and_strict_parse() {
        assert_eq!(FORMAT.format("fsn1", 4_200_001u64), "fsn1/4200001");
        assert_eq!(FORMAT.parse("fsn1/4200001").unwrap(), ("fsn1", "4200001"));
        let bad = [
            "",
            "4200001",
            "fsn1/",
            "/4200001",
            "fsn1/42/1",
            "fsn1/0042",
            "fsn1/0",
            "fsn1/+42",
            "fsn1/-42",
            "fsn1/4e3",
            "FSN1/42",
            "fsn 1/42",
            "fsn1/ 42",
            "fsn1/99999999999999999999",
            "../42",
            "fsn1/..",
        ];
        for id in bad {
            let e = FORMAT.parse(id).unwrap_err();
            assert_eq!(
                (e.class, e.code.as_deref()),
                (ErrorClass::Permanent, Some("InvalidId")),
                "{id:?}"
            );
            assert_eq!(
                e.message,
                format!("malformed id {id:?}: want {}", FORMAT.shape)
            );
        }
    }

    #[test]
    fn words_and_numbers() {
        let cases = [
            ("r1", 64, &b"-"[..], true),
            ("i-00000001", 64, b"-", true),
            ("eu-west-1", 9, b"-", true),
            ("eu-west-1", 8, b"-", false),
            ("", 64, b"-", false),
            ("a.b", 64, b"-", false),
            ("a.b", 64, b"-.", true),
            ("a/b", 64, b"-", false),
            ("ü", 64, b"-", false),
        ];
        for (s, max, extra, want) in cases {
            assert_eq!(is_word(s, max, extra), want, "{s:?} {max}");
        }
        assert!(is_decimal_id("1") && is_decimal_id("18446744073709551615"));
        assert!(
            !is_decimal_id("18446744073709551616") && !is_decimal_id("01") && !is_decimal_id("")
        );
    }
}
