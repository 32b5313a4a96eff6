//! Timestamps as the emulated backends write them. Kept on `humantime` rather than the
//! guest SDK: depending on the SDK (and so on wit-bindgen) from a host dev-dependency
//! changes the features of crates wasmtime shares, and every test build would recompile
//! wasmtime.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// Unix seconds now.
pub fn now_secs() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).unwrap_or_default().as_secs()
}

/// `2026-11-29T10:00:00Z` for Unix seconds.
pub fn rfc3339(secs: u64) -> String {
    humantime::format_rfc3339_seconds(UNIX_EPOCH + Duration::from_secs(secs)).to_string()
}

/// Unix seconds of an RFC 3339 time in UTC (`Z`), fractional seconds ignored.
pub fn parse_rfc3339(s: &str) -> Option<u64> {
    let t: SystemTime = humantime::parse_rfc3339_weak(s.trim_end_matches('Z')).ok()?;
    t.duration_since(UNIX_EPOCH).ok().map(|d| d.as_secs())
}

#[cfg(test)]
mod tests {
    #[test]
    fn round_trip() {
        assert_eq!(super::rfc3339(1_764_410_400), "2025-11-29T10:00:00Z");
        assert_eq!(super::parse_rfc3339("2025-11-29T10:00:00Z"), Some(1_764_410_400));
        assert_eq!(super::parse_rfc3339("2025-11-29T10:00:00.250Z"), Some(1_764_410_400));
        assert_eq!(super::parse_rfc3339("nope"), None);
    }
}
