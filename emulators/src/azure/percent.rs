//! Percent-encoding as ARM's paths, OData query values and the token endpoint's forms use
//! it: one place, so the routes, the token endpoint and the price list's `NextPageLink`
//! agree on it.

use percent_encoding::{AsciiSet, NON_ALPHANUMERIC, percent_decode_str, utf8_percent_encode};

/// What a query value keeps as it is: RFC 3986's unreserved characters.
const UNRESERVED: &AsciiSet = &NON_ALPHANUMERIC.remove(b'-').remove(b'.').remove(b'_').remove(b'~');

/// Percent-decodes `s`; with `plus`, a `+` is a space first (HTML forms).
pub(crate) fn decode(s: &str, plus: bool) -> String {
    let s = if plus { s.replace('+', " ") } else { s.to_string() };
    percent_decode_str(&s).decode_utf8_lossy().into_owned()
}

/// Percent-encodes a query value.
pub(crate) fn encode(s: &str) -> String {
    utf8_percent_encode(s, UNRESERVED).to_string()
}

#[cfg(test)]
mod tests {
    #[test]
    fn round_trips_and_forms() {
        let v = "tagName eq 'egress-uid' and tagValue eq 'a/b+c d'";
        assert_eq!(super::decode(&super::encode(v), false), v);
        assert_eq!(super::encode("a b/c"), "a%20b%2Fc");
        assert_eq!(super::decode("a+b%2Bc", true), "a b+c");
        assert_eq!(super::decode("a+b", false), "a+b");
    }
}
