//! RFC 3339 <-> WIT `datetime`. Backends report creation times as RFC 3339 strings and
//! orphan GC compares them with its own clock, so every plugin must read them the same
//! way. A hand-written parser: a date crate would be most of a small plugin's size.

use crate::Datetime;

/// The current wall-clock time. On wasm32-wasip2 std reads `wasi:clocks/wall-clock`.
pub fn now() -> Datetime {
    let d = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default();
    Datetime {
        seconds: d.as_secs(),
        nanoseconds: d.subsec_nanos(),
    }
}

/// Parse an RFC 3339 timestamp (`2024-05-01T12:00:00Z`, `...T12:00:00.5+02:00`).
///
/// Returns `None` for anything malformed or before the Unix epoch, which callers report
/// as `created-at: none` ("very old" for GC) rather than inventing a time.
pub fn parse_rfc3339(s: &str) -> Option<Datetime> {
    let b = s.as_bytes();
    if b.len() < 20 {
        return None;
    }
    let year = digits(b, 0, 4)?;
    let month = digits(b, 5, 2)?;
    let day = digits(b, 8, 2)?;
    let hour = digits(b, 11, 2)?;
    let minute = digits(b, 14, 2)?;
    let second = digits(b, 17, 2)?;
    if b[4] != b'-' || b[7] != b'-' || !matches!(b[10], b'T' | b't' | b' ') {
        return None;
    }
    if b[13] != b':' || b[16] != b':' {
        return None;
    }
    if !(1..=12).contains(&month) || day == 0 || day > days_in_month(year, month) {
        return None;
    }
    // 60 is a leap second; it is counted as the first second of the next minute.
    if hour > 23 || minute > 59 || second > 60 {
        return None;
    }

    let mut i = 19;
    let mut nanos: u32 = 0;
    if b.get(i) == Some(&b'.') {
        i += 1;
        let start = i;
        while i < b.len() && b[i].is_ascii_digit() {
            if i - start < 9 {
                nanos = nanos * 10 + u32::from(b[i] - b'0');
            }
            i += 1;
        }
        let n = i - start;
        if n == 0 {
            return None;
        }
        for _ in n..9 {
            nanos *= 10;
        }
    }

    let offset_seconds: i64 = match b.get(i)? {
        b'Z' | b'z' if i + 1 == b.len() => 0,
        sign @ (b'+' | b'-') if i + 6 == b.len() && b[i + 3] == b':' => {
            let oh = digits(b, i + 1, 2)?;
            let om = digits(b, i + 4, 2)?;
            if oh > 23 || om > 59 {
                return None;
            }
            let off = i64::from(oh * 3600 + om * 60);
            if *sign == b'+' { off } else { -off }
        }
        _ => return None,
    };

    let days = days_from_civil(i64::from(year), month, day);
    let local = days * 86_400 + i64::from(hour * 3600 + minute * 60 + second);
    let utc = local - offset_seconds;
    Some(Datetime {
        seconds: u64::try_from(utc).ok()?,
        nanoseconds: nanos,
    })
}

/// Format as RFC 3339 in UTC (`Z`), with a fraction only when there are nanoseconds.
pub fn format_rfc3339(t: Datetime) -> String {
    let days = (t.seconds / 86_400) as i64;
    let rem = t.seconds % 86_400;
    let (y, m, d) = civil_from_days(days);
    let mut out = format!(
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}",
        rem / 3600,
        (rem % 3600) / 60,
        rem % 60
    );
    if t.nanoseconds != 0 {
        let frac = format!("{:09}", t.nanoseconds);
        out.push('.');
        out.push_str(frac.trim_end_matches('0'));
    }
    out.push('Z');
    out
}

fn digits(b: &[u8], at: usize, n: usize) -> Option<u32> {
    let mut v = 0u32;
    for &c in b.get(at..at + n)? {
        if !c.is_ascii_digit() {
            return None;
        }
        v = v * 10 + u32::from(c - b'0');
    }
    Some(v)
}

fn is_leap(y: u32) -> bool {
    (y.is_multiple_of(4) && !y.is_multiple_of(100)) || y.is_multiple_of(400)
}

fn days_in_month(y: u32, m: u32) -> u32 {
    match m {
        2 if is_leap(y) => 29,
        2 => 28,
        4 | 6 | 9 | 11 => 30,
        _ => 31,
    }
}

/// Days since 1970-01-01 of a proleptic Gregorian date (H. Hinnant's algorithm).
fn days_from_civil(y: i64, m: u32, d: u32) -> i64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let m = i64::from(m);
    let doy = (153 * (if m > 2 { m - 3 } else { m + 9 }) + 2) / 5 + i64::from(d) - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

fn civil_from_days(z: i64) -> (i64, u32, u32) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    let y = yoe + era * 400 + i64::from(m <= 2);
    (y, m, d)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn secs(s: &str) -> Option<(u64, u32)> {
        parse_rfc3339(s).map(|d| (d.seconds, d.nanoseconds))
    }

    #[test]
    fn parses_utc_and_offsets() {
        assert_eq!(secs("1970-01-01T00:00:00Z"), Some((0, 0)));
        assert_eq!(secs("2024-05-01T12:00:00Z"), Some((1_714_564_800, 0)));
        assert_eq!(secs("2024-05-01T14:00:00+02:00"), Some((1_714_564_800, 0)));
        assert_eq!(secs("2024-05-01T07:30:00-04:30"), Some((1_714_564_800, 0)));
        assert_eq!(secs("2024-05-01t12:00:00z"), Some((1_714_564_800, 0)));
        assert_eq!(secs("2024-02-29T00:00:00Z"), Some((1_709_164_800, 0)));
        assert_eq!(secs("2000-03-01T00:00:00Z"), Some((951_868_800, 0)));
    }

    #[test]
    fn parses_fractions() {
        assert_eq!(
            secs("2024-05-01T12:00:00.5Z"),
            Some((1_714_564_800, 500_000_000))
        );
        assert_eq!(
            secs("2024-05-01T12:00:00.123456789Z"),
            Some((1_714_564_800, 123_456_789))
        );
        // Digits past nanoseconds are truncated, not rounded.
        assert_eq!(
            secs("2024-05-01T12:00:00.1234567891Z"),
            Some((1_714_564_800, 123_456_789))
        );
        assert_eq!(
            secs("2024-05-01T14:00:00.25+02:00"),
            Some((1_714_564_800, 250_000_000))
        );
    }

    #[test]
    fn rejects_bad_input() {
        for bad in [
            "",
            "2024-05-01",
            "2024-05-01T12:00:00",
            "2024-05-01T12:00:00+0200",
            "2024-13-01T12:00:00Z",
            "2023-02-29T12:00:00Z",
            "2024-05-01T24:00:00Z",
            "2024-05-01T12:00:00.Z",
            "2024-05-01T12:00:00Zjunk",
            "2024/05/01T12:00:00Z",
            "1969-12-31T23:59:59Z",
            "not a time at all!!!",
            "2024-05-01T12:00:00+24:00",
        ] {
            assert_eq!(parse_rfc3339(bad).map(|d| d.seconds), None, "{bad:?}");
        }
    }

    #[test]
    fn format_round_trips() {
        for s in [
            "1970-01-01T00:00:00Z",
            "2024-02-29T23:59:59Z",
            "2024-05-01T12:00:00.5Z",
            "2099-12-31T00:00:00.000000001Z",
        ] {
            assert_eq!(format_rfc3339(parse_rfc3339(s).unwrap()), s);
        }
    }

    #[test]
    fn now_is_after_2024() {
        assert!(now().seconds > 1_700_000_000);
    }
}
