//! The signer against the `rsa` crate (what this plugin used before, and what the emulator verifies with): the same
//! signatures byte for byte, and the keys `rsa` refused refused here too. The keys are throwaway ones made with
//! `openssl genpkey -algorithm RSA` for these tests.

use super::*;
use rsa::pkcs1v15::{Signature, SigningKey, VerifyingKey};
use rsa::pkcs8::DecodePrivateKey;
use rsa::signature::{SignatureEncoding, Signer, Verifier};

fn der(pem: &str) -> Vec<u8> {
    let body: String = pem.lines().filter(|l| !l.starts_with("-----")).collect();
    data_encoding::BASE64.decode(body.as_bytes()).unwrap()
}

/// DER of one value.
fn tlv(tag: u8, contents: &[u8]) -> Vec<u8> {
    let len = contents.len();
    let mut out = vec![tag];
    match len {
        0..0x80 => out.push(len as u8),
        0x80..0x100 => out.extend([0x81, len as u8]),
        _ => out.extend([0x82, (len >> 8) as u8, len as u8]),
    }
    out.extend_from_slice(contents);
    out
}

/// A PKCS#8 key with these PKCS#1 fields (version, n, e, d, p, q, dp, dq, qinv: big-endian, without sign bytes).
fn pkcs8(fields: &[Vec<u8>]) -> Vec<u8> {
    let ints: Vec<u8> = fields
        .iter()
        .flat_map(|f| match f.first() {
            Some(b) if b & 0x80 != 0 => tlv(0x02, &[&[0][..], f].concat()),
            _ => tlv(0x02, f),
        })
        .collect();
    let algorithm = [tlv(0x06, &RSA_ENCRYPTION), tlv(0x05, &[])].concat();
    let info = [tlv(0x02, &[0]), tlv(0x30, &algorithm), tlv(0x04, &tlv(0x30, &ints))].concat();
    tlv(0x30, &info)
}

/// The PKCS#1 fields of a PKCS#8 key.
fn fields(pem: &str) -> Vec<Vec<u8>> {
    let der = der(pem);
    let mut outer = Der(&der);
    let mut info = Der(outer.take(0x30).unwrap());
    info.uint().unwrap();
    info.take(0x30).unwrap();
    let mut pkcs1 = Der(info.take(0x04).unwrap());
    let mut key = Der(pkcs1.take(0x30).unwrap());
    (0..9).map(|_| key.uint().unwrap().to_vec()).collect()
}

#[test]
fn signatures_are_the_rsa_crates() {
    for pem in [KEY_2048, KEY_1100_E3, KEY_3072] {
        let ours = Key::from_pkcs8_der(&der(pem)).expect("a good key");
        let theirs = rsa::RsaPrivateKey::from_pkcs8_pem(pem).unwrap();
        let verifying = VerifyingKey::<sha2::Sha256>::new(theirs.to_public_key());
        let signing = SigningKey::<sha2::Sha256>::new(theirs);
        for message in [&b""[..], b"a", b"eyJhbGciOiJSUzI1NiJ9.eyJpc3MiOiJhQGIifQ", &[0xff; 1000]] {
            let signature = ours.sign(message).unwrap();
            assert_eq!(signature, signing.sign(message).to_vec(), "{} bytes", message.len());
            assert!(verifying.verify(message, &Signature::try_from(&signature[..]).unwrap()).is_ok());
        }
    }
}

#[test]
fn a_rebuilt_key_is_the_same_key() {
    let key = pkcs8(&fields(KEY_2048));
    assert_eq!(key, der(KEY_2048), "the test's encoder");
    assert_eq!(Key::from_pkcs8_der(&key).unwrap().sign(b"x"), Key::from_pkcs8_der(&der(KEY_2048)).unwrap().sign(b"x"));
}

/// Keys whose numbers do not fit together: refused when the key is read (as `rsa` did) or, where only signing can
/// tell, by the signature's check; never a signature Google would reject.
#[test]
fn inconsistent_keys_are_refused() {
    let good = fields(KEY_2048);
    let changed = |i: usize, f: &dyn Fn(&mut Vec<u8>)| {
        let mut fields = good.clone();
        f(&mut fields[i]);
        pkcs8(&fields)
    };
    let flip = |v: &mut Vec<u8>| *v.last_mut().unwrap() ^= 2;
    let cases = [
        ("n", changed(1, &flip)),
        ("p", changed(4, &flip)),
        ("q", changed(5, &flip)),
        ("e too small", changed(2, &|e| *e = vec![1])),
        ("e too large", changed(2, &|e| *e = vec![2, 0, 0, 0, 1])),
        ("p even", changed(4, &|p| *p.last_mut().unwrap() &= 0xfe)),
        ("multi-prime version", changed(0, &|v| *v = vec![1])),
    ];
    for (what, der) in cases {
        assert!(Key::from_pkcs8_der(&der).is_none(), "{what}");
    }
    for (what, der) in
        [("d", changed(3, &flip)), ("e", changed(2, &|e| *e = vec![1, 0, 3])), ("qinv", changed(8, &flip))]
    {
        let key = Key::from_pkcs8_der(&der).expect(what);
        assert_eq!(key.sign(b"x"), None, "{what}");
    }
    // The ignored CRT exponents, as `rsa` ignored them: d decides.
    assert!(Key::from_pkcs8_der(&changed(6, &flip)).unwrap().sign(b"x").is_some());
}

#[test]
fn what_is_not_a_pkcs8_rsa_key_is_refused() {
    let good = der(KEY_2048);
    for len in 0..good.len() {
        assert!(Key::from_pkcs8_der(&good[..len]).is_none(), "cut at {len}");
    }
    assert!(Key::from_pkcs8_der(&[&good[..], &[0]].concat()).is_none(), "a byte after the key");
    let pkcs1 = {
        let mut info = Der(&good[..]);
        let mut info = Der(info.take(0x30).unwrap());
        info.uint();
        info.take(0x30);
        info.take(0x04).unwrap().to_vec()
    };
    assert!(Key::from_pkcs8_der(&pkcs1).is_none(), "PKCS#1 (BEGIN RSA PRIVATE KEY) is not PKCS#8");
    let mut wrong_oid = good.clone();
    let at = good.windows(RSA_ENCRYPTION.len()).position(|w| w == RSA_ENCRYPTION).unwrap();
    wrong_oid[at + 8] = 0x0a;
    assert!(Key::from_pkcs8_der(&wrong_oid).is_none(), "another algorithm");
    // Non-minimal encodings: a long-form short length, an integer with a needless zero byte.
    assert!(Key::from_pkcs8_der(&tlv(0x30, &[0x02, 0x81, 0x01, 0x00])).is_none());
    assert!(Key::from_pkcs8_der(&tlv(0x30, &[0x02, 0x02, 0x00, 0x01])).is_none());
}

#[test]
fn a_modulus_too_short_for_a_sha256_digest_info_signs_nothing() {
    // 61-byte modulus: 0x00 0x01, 8 bytes of 0xff and 0x00 do not fit beside the 51 bytes of DigestInfo.
    let p = from_be(&[0x3b; 30]);
    let key = Key {
        n: Mont::new(from_be(&[0x3b; 61])).unwrap(),
        e: vec![3],
        p: Mont::new(p.clone()).unwrap(),
        q: Mont::new(p).unwrap(),
        dp: vec![1],
        dq: vec![1],
        qinv: vec![1],
        size: 61,
    };
    assert_eq!(key.sign(b"x"), None);
}

#[test]
fn arithmetic() {
    let m = Mont::new(vec![0xffff_fffb, 0x7]).unwrap(); // 0x7_ffff_fffb
    let value = |x: &[u32]| x.iter().rev().fold(0u128, |v, &l| v << 32 | u128::from(l));
    let modulus = 0x7_ffff_fffbu128;
    assert_eq!(value(&m.pow(&[12345, 0], &[65537, 0])), (0..65537).fold(1, |acc, _| acc * 12345 % modulus));
    assert_eq!(value(&rem(&[0xffff_ffff; 4], &m.m)), u128::MAX % modulus);
    assert_eq!(value(&mul(&[0xffff_ffff, 1], &[3])), 0x1_ffff_ffff * 3);
    assert_eq!(bit_len(&[0, 0x10, 0]), 37);
    assert_eq!(to_be(&from_be(&[1, 2, 3, 4, 5]), 6), [0, 1, 2, 3, 4, 5]);
    assert!(less(&[1, 0], &[2], 0) && !less(&[1, 0], &[2], 1) && !less(&[2, 0], &[2], 0));
}

/// 2048 bits, e = 65537.
const KEY_2048: &str = "\
-----BEGIN PRIVATE KEY-----
MIIEvAIBADANBgkqhkiG9w0BAQEFAASCBKYwggSiAgEAAoIBAQC+s7ttQUZOOCQS
psIHCGA5fxqL9kcirnASMmlTGRNGFA/HMoNdi8QsjyQCbO3cLMRQeRY6o0UuRoCv
UhlARMS/PZITunrO2JHicJIknwwEnK7JwXXZ0jzaPBLMOFiYLW+VrEIWq1E0UmrF
wJI/UwFowNAMuvvs04Yx9Lv7xmOGGpUR/XXiAkA5GGyi0myk2OhnipqWKXgCnVNu
BwlNei3W1dkNIwy6zbG4EWKQqXr9uXtFQMBd8C7x+TXUZAoVPr8JKqh++VHJGaxk
f0HVF7h6igPXYWQCUUVbA9EFtpT1YSH/dYYEjjyA+5TQO9FMbAyR8WffFUoc0jdY
yZewwDA5AgMBAAECggEAFhNTPoYAX/yivF/+dPb0wKMkjRAw0uRzh7+7LonoD8Qx
wWLpDxKnXmshhYBblpG+Ffy2ZIpS71Ts/56W2rg7OFIlz0/WeIxccuSKHmAk8YG7
wBI7lMAAGFk86dQZ+V/FG4Pp0Jr7Vv21a3fr1hXDQ3+Sde7NS/B+h9jnS/F+wt6s
hGMhR/DT5fG0I6RCnfFzi2ll8GpPoOOwY3EK+NuANVRTKA5iJwP2hSapuNMewJp4
xhCV375zJuK6TaKPafYV9R3scwCi6rxPAG3pt3wpqo/zm0PQ/79agnHCnmxPssgi
TfIhpg20nTIitY/TDPORWqGcVyOceteT46CIRetE2wKBgQDyVFiX3OgS1FHIGoKm
zBEdr7DmdRi4BHO1O4Q6maP3IaD9ciKuwoE3Ime6pKouq32ufK186E2EKziY4uAo
VGda8uSIZZhUOEQ+zhr9ik+GJ78BdggndJ0+NnQ2i7yjyoUXNE6ZNAZzWCn8NlUA
ycMHLXtGh2C4hJopsfFu3955wwKBgQDJdcw5YTyrVaNk5W6W4owMWuvDBEGgfGOD
d7BUycnLK8PzTEITpt7GgU8Oo7Srm28YXoFY8YQh1M+Wzn5LqJihLIg+rIAfR83C
mQsgbO9m9OmtUiHwFk31xXpKt0q0X8r7SRINFakEowgYmlskxvACKcPCdmW0YusK
l0p87MUSUwKBgCUc39iaP3yqwb+ot7u94x0tzCTvaBK+s83cyJqE70SpBNPsB/3F
0i5UeZhvIZU2NHBlrdhEZ6LHT8qybGwgyRd3vaJaFONJHsKTpDSSWy2LpsgdgJAy
XuapRlEYQ5K+MHXmT+dMvXQq23tCAvC09caCo6+giiKYRFgAZZ56cMMrAoGAVZ0c
9AmRqdJUBM3HyJFwKNP+uzq01QnnlHgp1G6ItjHcLSnsLsPMiplrSnJhlkgQ109a
Mr04hNQWgCUy4N4+NshhAhl2vVRbaeZ2JwqEVsGgCMsNpyUjbl3E0bnBIpRPA6kS
5cKduF28VBBMyX1Ng+3RxnNgV19uOWr/+cT5HwcCgYBtNrVf8Kb8tbXrUh1PxiFN
ua3iVT8ZlexsfJttqCGfzgO6ALMLuPoSagRAElgaHXVPIAmb9g0x3QwfP7uxzlZ0
WV2zYJoDVi1H5PYXLnz3DTg/ROZcpgCQGkyUqggIYONKPYqJ+CM/4cRgJkzIck3h
9mzcJk6fVFKOJYbOs3/F4Q==
-----END PRIVATE KEY-----
";

/// 1100 bits (primes of 550, not whole limbs), e = 3.
const KEY_1100_E3: &str = "\
-----BEGIN PRIVATE KEY-----
MIICnQIBADANBgkqhkiG9w0BAQEFAASCAocwggKDAgEAAoGKD0ksg17bL+qGeraU
Mf7HVwNhlBGU30ybBbTnK40ha+huGmY8f/f6KCP6Wjr7uooqBI37opE/bFz3IvYG
qpEjY4JvGkcEDaaqd3HIrPuUKcgZ3gTSnf0E8CLuWCfMYpCEfvjHcrtqF/LUUnn8
zhtNiyV592auO3In1bmwME6W9h5B7Jz7HKSqtsmdAgEDAoGKCjDIV5SSH/Gu/Hm4
IVSE5KzruAu4lN28rniaHQjA8pr0EZl9qqVRcBf8PCdSfFwcAwlSbGDU8uikwflZ
xwts7QGfZtoCYFtBGOolsao6AyqVMtCucNo9Ey6VRslmbATEhxzLdnZeEFTh57Mb
Z67BiERfeHRrbO4Ir95/xAOy8ssseF3DCObY3uArAkU/JpTqG41r23ZoIEhMxtJ3
flx4eabeoiMhw7q6/JycRFb/hzIel3fjpKSjx9Uyx8RkOtcmYVSKrowFXKCFmDgR
QPUM3y0CRT33M+f3Aragxrzn8cUE+n03TNrjZ49Xj57FovlQ+aTFhf/sT1hV287w
hpr3FY/wSLPSQ6eKm/+afoSQ3rJ4Hn4JcFuaMQJFKhm4nBJeR+ekRWra3dnhpP7o
UFEZ6cFswS0nJ1MTEtg5/692vw+lQm3DF9qOIdqC7XyPbuuNscmyrj3AWRAlYNX4
sz9zAkUpT3fv+gHPFdnTRUvYrfxTejM8l5pfj7UUg8H7i1EYg66qnYo64+ffSwRn
T2O1StsijC0aXGf/vFRYYJR2+r7+sPWSZssCRRns98hX4WszMhjYVV0WnVpG/tEO
qjAfUN4gIZ6iN3cUJXLEYzut59dzVZ61mdtwdZpczbBaup0tL/GLrlTeTTTONd0E
iw==
-----END PRIVATE KEY-----
";

/// 3072 bits, e = 65537.
const KEY_3072: &str = "\
-----BEGIN PRIVATE KEY-----
MIIG/QIBADANBgkqhkiG9w0BAQEFAASCBucwggbjAgEAAoIBgQCaro3a3QmPwyMy
2eMc0zlZKLmYhakKUf+UQJJpf65dfVaQ2JC+a5azqINFvGILkRdU/g/ZvR2zdOYk
GOYh/xI5eqaBlYl6pOpWNpHCwa/z6O4C2XiR1/efFq34aAM8BXe2+uAJeM5xvAz0
9LDJjpZ9GaFDp3r9z5UOnh850G9cmxDmVKLQS1bZ7DPo+koQ+7lWZKwDc+uQknCK
ADyXCg9fzBfUu0WKCDSHHIXeQWH7FYOY4kv1tJVBNG5a9fqdNtt1zm/SCDJ6FnVo
ZUzE7+y1CqBzZD2iOn/TARS6M7KQ5PLKf8joo5RANo7LMw+82uKSa+VUAPV7uPoX
tvCXqMRcCt8VS7nMnexzBmLf6ALHqbdUdd3yFgpV7skCPdNZ/vlAmHljr8VHOedH
qYr3V0Y64b/TcTuR3rS9uqXh6OR2haspLPNo633fbqRIYOmUsZ0N5Vn+tdOXq0D9
Sh49ieNYuk8asFu1vCxTYTt0RqcHagoXYcSkkia/C97BMjMpfmMCAwEAAQKCAYAv
3rlz9FgTL7bi899/ejcTSrE1bJgF456PCPTGxYb20+VIal1RMQawjwQhPs2w+rQX
z5CkOAzLDvByV2pRNxkyxKxnChpD5GnJSJYPidWkTH/sTdUsfYParjAk4juuBZso
+7b9928cb7Aq1tcnaYNVL+tifqBnkCh3H6RWRhVQuYSfY64HfGlig+EExwDJBL40
6G77mpJaaZd+fdhCfhCH+yec5F/++c8XyVH8mIt0IxJY7B/J6JsQVOOaLuniYalK
FgPl83bQmncpKagpc1+YcLjJYD/kUaLIrmQWiIVf5rnDNPQEaapVbYfJ7/fZD6QU
oMsgaHZHWC6XoFbeBwVlmTDZvho+EmCIa2OxTKfkz4stNUxiRr0xgGKGO2UVsKFG
4xAOqG3i5QA4pwZvQB1U9kEoz9js419TJNq4S9olw5gY4v9/RLuOEfLtyKBy80Aj
AzkWuSoC/MVRetx351dydB1rfdZaazsLwEYgNszoAHpH1njsBWTLZg2UXZYxomEC
gcEA0WPNmFTvoy2gCl7OvslygaGZqOAEb5rBU6QMHBPlCAc9Hpr3XTRTtw8a+LP9
uoqk56mPRAOkrEEm8aaZsk2elggmHzb4jH8Gg1bwLh4xq2saEoBfDcFvUt58uEJl
gwZtMkfpprz8dx/2CWOv20I1YDnCEkJvQ+NM1ICCW591hn71Qw+ex0Chj5coWMax
qjlsKVG11tH0YsGg4DBnPmVe91lZ/fDfQbG1NjUISt39HpccJuFndNNmCYFgJDxg
A8wbAoHBAL0dL2P9+U19bEftLlb81jFJJy2PpJqirwtNOJ7F3AT27sY9VYDcf7ur
T+GlV9I0aFN6uM1TPN68ItJEXHhg/Hdkqe3j1QOtuLBZVtD8UKzf+Xb3KrvMsr0E
SBDBQAiHULaWWXEPABsdkDwWDh/cqctWmlR+kpZg1Xa3wUKZrblzqmgiBWmMBvbW
YtJMt1puQaBZoQ0twIIMbuJ0y8nA/OxgyEioIylsuM/VXKGvYifduve8qZgTKJqL
XaOcJp0rWQKBwQCuV0HszvOEU03ItK3BjutnYc0WHgezgQ/s+08V5b6x040hOXgy
w4nchpg3cW4Wbq/lL3nY8Iug3NJ3K/cWzaf4VaqgHN4P5QfgPXfXfk5u4ssfkoES
a/er8RG5PZdV4/jxf4zcxsgSy6rIoJbgoZzdlNmw6F3KEax71tAzR27MYFMH1i6m
ynp6myn92No+2HblZGJaDhBEVeIEKGkeO7s5iczzMiZBhZxTGQ7hfznsyXaoLM8+
J3HzAiSxpw9uufcCgcB22jTCfweDb+PxgFqzSMvExdjdhX1JwhyI2ctP3cHdTOPb
qwhlqC6O36eghK2g6lb2wBYM1NdYlJy90UDcVvfUgWtamulxGmkMS9mIFksNmuXJ
oqU0yf07VcmE3i9ELObJGcy0hVznrbjMSoAt/hyoMpFjsPinkcwWhH3tQXAxMURT
la4ZG2v1Dd+lk5lYOBr+j9Xr1mk6Ul4N7KF29tb+KAU3xJP0oOO1mr5Qz0y9CVlM
AUIE1WWbWyNKhASwmmECgcB0P0HumhnwIuu5hVqs69akygwf6qGGjytFdGCoGY50
/Z9kVzK4NUSBNDCtjd0GYmo4Dlv3VdPJBeDTlywZdRVkcTHtCCHoc4XukH2Fgct6
5eqIG7wI6cWfDfItllbojhq25GQ3bs2Osy1Rpn8frq45SgniWb0Sv4DsC4vFanbU
4K63wgD4CFh0KgmYoCJxvbPcP3CN9BDqf4F0OPSDc9rRvYVmBXFIQ0kjV1HMg7V8
tac3DIRKZRNkKyFdn5MY1og=
-----END PRIVATE KEY-----
";
