//! Prices as the contract carries them: millionths of a currency unit an hour (`u64`).
//!
//! Why here: catalogues write prices as decimal text (Hetzner's `"0.0080000000"`, EC2's
//! `spotPrice`) or as JSON floats, sometimes `float32`s printed as doubles (DigitalOcean's
//! `price_hourly`, Scaleway's `hourly_price`, Linode's `hourly`). Each plugin converting
//! on its own had its own rounding: `0.0115 * 1e6` truncates to 11,499. One conversion,
//! rounded half up at the seventh decimal, and tested once.

/// Decimal text in millionths, half up at the seventh decimal, with no float on the way:
/// `"0.0080000000"` is 8,000. `None` for anything but plain digits with an optional
/// fraction (no sign, exponent, spaces or leading `.`), or a trillion units or more.
pub fn micros_from_decimal(text: &str) -> Option<u64> {
    let (whole, frac) = text.split_once('.').unwrap_or((text, ""));
    let digits = |s: &str| s.bytes().all(|b| b.is_ascii_digit());
    if whole.is_empty() || whole.len() > 12 || !digits(whole) || !digits(frac) {
        return None;
    }
    let frac = frac.as_bytes();
    let mut micros: u64 = whole.parse().ok()?;
    for i in 0..6 {
        micros = micros * 10 + frac.get(i).map_or(0, |d| u64::from(d - b'0'));
    }
    Some(micros + u64::from(frac.get(6).is_some_and(|d| *d >= b'5')))
}

/// A float amount in millionths, half up, through billionths first: exact for any amount
/// written with at most nine decimals (`0.0115` is 11,500), and a `float32` printed as a
/// double (`0.00743999984115362`) lands on the price it stands for (7,440). `None` for
/// negative, not finite, or a million units or more, which no instance costs an hour.
pub fn micros_from_float(amount: f64) -> Option<u64> {
    (0.0..1e6)
        .contains(&amount)
        .then(|| ((amount * 1e9).round() as u64 + 500) / 1000)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decimal_text() {
        let cases = [
            ("0.0080000000", Some(8_000)),
            ("0.0095200000", Some(9_520)),
            ("0.003500", Some(3_500)),
            ("0.0105", Some(10_500)),
            ("0.0115", Some(11_500)),
            ("0.00001", Some(10)),
            ("0.0000005", Some(1)),
            ("0.00000049", Some(0)),
            ("1.5", Some(1_500_000)),
            ("12", Some(12_000_000)),
            ("2.", Some(2_000_000)),
            ("999999999999.9999994", Some(999_999_999_999_999_999)),
            ("1000000000000", None),
            ("", None),
            (".5", None),
            ("-0.01", None),
            ("-1", None),
            ("1e-3", None),
            ("1e3", None),
            (" 0.01", None),
            ("0.01.1", None),
        ];
        for (text, want) in cases {
            assert_eq!(micros_from_decimal(text), want, "{text:?}");
        }
    }

    #[test]
    fn floats() {
        let cases: [(f64, Option<u64>); 13] = [
            (0.0105, Some(10_500)),
            // 0.0115 * 1e6 is 11499.999999999998: truncation would lose a micro.
            (0.0115, Some(11_500)),
            // float32s printed as doubles.
            (0.00743999984115362, Some(7_440)),
            (0.010499999858438969, Some(10_500)),
            (0.00744047619047619, Some(7_440)),
            (0.0000005, Some(1)),
            (0.00000049, Some(0)),
            (0.0, Some(0)),
            (1.5, Some(1_500_000)),
            (999_999.999_999, Some(999_999_999_999)),
            (1e6, None),
            (-0.01, None),
            (f64::NAN, None),
        ];
        for (amount, want) in cases {
            assert_eq!(micros_from_float(amount), want, "{amount}");
        }
        assert_eq!(micros_from_float(f64::INFINITY), None);
    }
}
