//! RS256 (RSASSA-PKCS1-v1_5 over SHA-256, RFC 8017 section 8.2) with a PKCS#8 RSA key: the one RSA operation this
//! plugin needs, for the JWTs it trades for access tokens.
//!
//! Written here rather than taken from the `rsa` crate, for size: that crate's general big-number arithmetic, key
//! validation and prime recovery took 67 KB of the component, 59 KB with its features cut to `sha2` alone (measured
//! 2026-12 at opt-level z, after wasm-opt -Oz); signing with this file takes 10 KB. The signatures are the same, byte for
//! byte (RS256 is deterministic, and the tests compare them with `rsa`'s), and so are the keys refused: a strict DER
//! parse of a two-prime key, the public exponent in 2..2^33, the modulus at most 4096 bits and equal to the product of
//! the primes. A `d` that does not fit the rest is found when the signature is verified with the public exponent before
//! it leaves (as `rsa` verifies it too) rather than when the key is read; and the key's own `q^-1 mod p` is used, so a
//! wrong one fails that check, where `rsa` computed its own. Like `rsa` it signs with the Chinese remainder theorem,
//! `d mod (p-1)` and `d mod (q-1)` computed from `d`, and needs no randomness.
//!
//! Arithmetic is on little-endian 32-bit limbs (wasm32 multiplies 32x32 -> 64 bits natively), with no branch and no
//! table index that depends on a secret value: Montgomery multiplication, a fixed 4-bit-window exponentiation that reads
//! its whole table at every step, bit-by-bit reductions. Simple rather than fast: a 2048-bit signature takes about 9 ms
//! natively (`rsa`: 2 ms), once per token, which lives an hour.

use sha2::{Digest, Sha256};

/// The DER DigestInfo prefix of a SHA-256 hash (RFC 8017 section 9.2, note 1).
const SHA256_INFO: [u8; 19] =
    [0x30, 0x31, 0x30, 0x0d, 0x06, 0x09, 0x60, 0x86, 0x48, 0x01, 0x65, 0x03, 0x04, 0x02, 0x01, 0x05, 0x00, 0x04, 0x20];
/// The content of the OID rsaEncryption, 1.2.840.113549.1.1.1.
const RSA_ENCRYPTION: [u8; 9] = [0x2a, 0x86, 0x48, 0x86, 0xf7, 0x0d, 0x01, 0x01, 0x01];
/// The largest modulus accepted, in bits (the `rsa` crate's limit).
const MAX_BITS: usize = 4096;
/// The largest public exponent accepted, 2^33 - 1 (the `rsa` crate's limit).
const MAX_E: u64 = (1 << 33) - 1;

/// A two-prime RSA private key, its numbers as little-endian 32-bit limbs.
pub struct Key {
    n: Mont,
    e: Vec<u32>,
    p: Mont,
    q: Mont,
    /// `d mod (p-1)`, `d mod (q-1)` and `q^-1 mod p`.
    dp: Vec<u32>,
    dq: Vec<u32>,
    qinv: Vec<u32>,
    /// The modulus's length in bytes, which is every signature's.
    size: usize,
}

impl Key {
    /// A PKCS#8 `PrivateKeyInfo` holding a two-prime PKCS#1 `RSAPrivateKey`, DER-encoded; `None` for anything else or
    /// for a key whose numbers do not fit together.
    pub fn from_pkcs8_der(der: &[u8]) -> Option<Key> {
        let mut outer = Der(der);
        let mut info = Der(outer.take(0x30)?);
        // v1 (0) or v2 (1, RFC 5958, which may add a public key after the private one: ignored, as the rest of the
        // structure after the private key).
        if !matches!(info.uint()?, [0] | [1]) || !outer.0.is_empty() {
            return None;
        }
        let mut algorithm = Der(info.take(0x30)?);
        let (oid, null) = (algorithm.take(0x06)?, algorithm.take(0x05)?);
        if oid != RSA_ENCRYPTION || !null.is_empty() || !algorithm.0.is_empty() {
            return None;
        }
        let mut pkcs1 = Der(info.take(0x04)?);
        let mut key = Der(pkcs1.take(0x30)?);
        // Version 0: two primes (1 is a multi-prime key).
        if key.uint()? != [0] || !pkcs1.0.is_empty() {
            return None;
        }
        let mut next = || key.uint().map(from_be);
        let (n, e, d, p, q) = (next()?, next()?, next()?, next()?, next()?);
        let (_dp, _dq, qinv) = (next()?, next()?, next()?);
        if !key.0.is_empty() {
            return None;
        }
        let e_value = match e[..] {
            [low] => u64::from(low),
            [low, high] => u64::from(high) << 32 | u64::from(low),
            _ => u64::MAX,
        };
        let (bits, one) = (bit_len(&n), [1u32]);
        if !(2..=MAX_E).contains(&e_value) || bits > MAX_BITS || bit_len(&p) < 2 || bit_len(&q) < 2 {
            return None;
        }
        // qinv is only read as a number below 2^(32 * p's limbs); a wrong one fails the signature's check.
        if !same(&mul(&p, &q), &n) || qinv.len() > p.len() {
            return None;
        }
        let (n, p, q) = (Mont::new(n)?, Mont::new(p)?, Mont::new(q)?);
        // p and q are odd (Mont::new), so p - 1 is p with its lowest bit cleared.
        let minus_one = |m: &Mont| sub(&m.m, &one);
        let (dp, dq) = (rem(&d, &minus_one(&p)), rem(&d, &minus_one(&q)));
        Some(Key { size: bits.div_ceil(8), n, e, p, q, dp, dq, qinv })
    }

    /// The RS256 signature of `message`: `None` when the modulus is too short for a SHA-256 DigestInfo or the signature
    /// does not verify (the key's numbers disagree).
    pub fn sign(&self, message: &[u8]) -> Option<Vec<u8>> {
        let k = self.size;
        let t = SHA256_INFO.len() + 32;
        if k < t + 11 {
            return None;
        }
        // EM = 0x00 0x01 0xff..0xff 0x00 DigestInfo(SHA-256(message)).
        let mut em = vec![0xff; k];
        em[0] = 0;
        em[1] = 1;
        em[k - t - 1] = 0;
        em[k - t..k - 32].copy_from_slice(&SHA256_INFO);
        em[k - 32..].copy_from_slice(&Sha256::digest(message));
        let c = from_be(&em);
        // s = m2 + q * (qinv * (m1 - m2) mod p), with m1 = c^dp mod p and m2 = c^dq mod q.
        let m1 = self.p.pow(&rem(&c, &self.p.m), &self.dp);
        let m2 = self.q.pow(&rem(&c, &self.q.m), &self.dq);
        let m2p = rem(&m2, &self.p.m);
        let diff = add_if(&sub(&m1, &m2p), &self.p.m, less(&m1, &m2p, 0));
        let h = self.p.mul(&self.p.mul(&pad(&self.qinv, self.p.len()), &diff), &self.p.rr);
        // h < p and m2 < q, so s < n: the limbs cut off are zero.
        let mut hq = mul(&h, &self.q.m);
        hq.resize(self.n.len(), 0);
        let s = add_if(&hq, &m2, true);
        // The check the `rsa` crate makes too: s^e mod n must give back the encoded message.
        if !same(&self.n.pow(&s, &self.e), &c) {
            return None;
        }
        Some(to_be(&s, k))
    }
}

/// A DER reader over the contents of one constructed value.
struct Der<'a>(&'a [u8]);

impl<'a> Der<'a> {
    /// The contents of the next value, which must have the tag `tag` and a definite, minimal length.
    fn take(&mut self, tag: u8) -> Option<&'a [u8]> {
        let [t, first, rest @ ..] = self.0 else { return None };
        let (len, rest) = match *first {
            short @ 0..=0x7f => (usize::from(short), rest),
            0x81..=0x83 => {
                let (bytes, rest) = rest.split_at_checked(usize::from(first & 0x7f))?;
                let len = bytes.iter().fold(0, |len, &b| len << 8 | usize::from(b));
                (len >= 0x80 && bytes[0] != 0).then_some((len, rest))?
            }
            _ => return None,
        };
        let (contents, rest) = rest.split_at_checked(len)?;
        self.0 = rest;
        (*t == tag).then_some(contents)
    }

    /// The big-endian bytes of the next INTEGER, which must be non-negative and minimally encoded; without the sign
    /// byte.
    fn uint(&mut self) -> Option<&'a [u8]> {
        match self.take(0x02)? {
            [0, rest @ ..] if rest.first().is_some_and(|b| b & 0x80 != 0) => Some(rest),
            [0, _, ..] | [] => None,
            [b, ..] if b & 0x80 != 0 => None,
            bytes => Some(bytes),
        }
    }
}

/// Arithmetic modulo an odd `m` in Montgomery form, R = 2^(32 * limbs).
struct Mont {
    m: Vec<u32>,
    /// -m^-1 mod 2^32.
    m_inv: u32,
    /// R^2 mod m.
    rr: Vec<u32>,
}

impl Mont {
    fn new(m: Vec<u32>) -> Option<Mont> {
        let m0 = *m.first().filter(|&&m0| m0 & 1 == 1)?;
        // Newton's iteration doubles the correct low bits of the inverse: 1, 2, 4, 8, 16, 32.
        let inv = (0..5).fold(1u32, |inv, _| inv.wrapping_mul(2u32.wrapping_sub(m0.wrapping_mul(inv))));
        let mut r2 = vec![0; 2 * m.len() + 1];
        r2[2 * m.len()] = 1;
        let rr = rem(&r2, &m);
        Some(Mont { m_inv: inv.wrapping_neg(), rr, m })
    }

    fn len(&self) -> usize {
        self.m.len()
    }

    /// a * b / R mod m, for a and b of `len` limbs with a * b < R * m (CIOS).
    fn mul(&self, a: &[u32], b: &[u32]) -> Vec<u32> {
        let (m, n) = (&self.m, self.m.len());
        let mut t = vec![0u32; n + 2];
        for &ai in a {
            let mut carry = 0u64;
            for j in 0..n {
                let s = u64::from(t[j]) + u64::from(ai) * u64::from(b[j]) + carry;
                (t[j], carry) = (s as u32, s >> 32);
            }
            let s = u64::from(t[n]) + carry;
            (t[n], t[n + 1]) = (s as u32, (s >> 32) as u32);
            let u = t[0].wrapping_mul(self.m_inv);
            let mut carry = (u64::from(t[0]) + u64::from(u) * u64::from(m[0])) >> 32;
            for j in 1..n {
                let s = u64::from(t[j]) + u64::from(u) * u64::from(m[j]) + carry;
                (t[j - 1], carry) = (s as u32, s >> 32);
            }
            let s = u64::from(t[n]) + carry;
            (t[n - 1], t[n]) = (s as u32, t[n + 1] + (s >> 32) as u32);
        }
        let top = t[n];
        t.truncate(n);
        sub_if_ge(&mut t, top, m);
        t
    }

    /// base^exp mod m, for base < m: fixed 4-bit windows, the table read in full at every step.
    fn pow(&self, base: &[u32], exp: &[u32]) -> Vec<u32> {
        let n = self.len();
        let one = self.mul(&pad(&[1], n), &self.rr);
        let base = self.mul(&pad(base, n), &self.rr);
        let mut table = vec![one.clone(), base.clone()];
        for i in 2..16 {
            table.push(self.mul(&table[i - 1], &base));
        }
        let mut acc = one;
        for i in (0..exp.len() * 8).rev() {
            for _ in 0..4 {
                acc = self.mul(&acc, &acc);
            }
            let window = exp[i / 8] >> (4 * (i % 8)) & 15;
            let mut entry = vec![0u32; n];
            for (k, t) in (0u32..).zip(&table) {
                let mask = mask(k == window);
                entry.iter_mut().zip(t).for_each(|(e, &t)| *e |= t & mask);
            }
            acc = self.mul(&acc, &entry);
        }
        self.mul(&acc, &pad(&[1], n))
    }
}

/// All ones when `yes`, else zero.
fn mask(yes: bool) -> u32 {
    u32::from(yes).wrapping_neg()
}

/// The limbs of a big-endian number.
fn from_be(bytes: &[u8]) -> Vec<u32> {
    bytes.rchunks(4).map(|c| c.iter().fold(0, |v, &b| v << 8 | u32::from(b))).collect()
}

/// `x` as `len` big-endian bytes (x < 2^(8 * len)).
fn to_be(x: &[u32], len: usize) -> Vec<u8> {
    let le = x.iter().flat_map(|l| l.to_le_bytes());
    let mut out: Vec<u8> = le.chain(std::iter::repeat(0)).take(len).collect();
    out.reverse();
    out
}

/// `x` with zero limbs added up to `len`.
fn pad(x: &[u32], len: usize) -> Vec<u32> {
    let mut out = x.to_vec();
    out.resize(len.max(x.len()), 0);
    out
}

fn bit_len(x: &[u32]) -> usize {
    x.iter().rposition(|&l| l != 0).map_or(0, |i| 32 * i + 32 - x[i].leading_zeros() as usize)
}

/// Whether a == b as numbers (either may have high zero limbs).
fn same(a: &[u32], b: &[u32]) -> bool {
    let n = a.len().max(b.len());
    pad(a, n) == pad(b, n)
}

/// Whether top * 2^(32 * a.len()) + a < b, for b no longer than a (branch-free).
fn less(a: &[u32], b: &[u32], top: u32) -> bool {
    let mut borrow = 0u32;
    for (i, &x) in a.iter().enumerate() {
        let (d, b1) = x.overflowing_sub(b.get(i).copied().unwrap_or(0));
        let (_, b2) = d.overflowing_sub(borrow);
        borrow = u32::from(b1 | b2);
    }
    borrow > top
}

/// a - b mod 2^(32 * a.len()), for b no longer than a.
fn sub(a: &[u32], b: &[u32]) -> Vec<u32> {
    let mut borrow = 0u32;
    let out = a.iter().enumerate().map(|(i, &x)| {
        let (d, b1) = x.overflowing_sub(b.get(i).copied().unwrap_or(0));
        let (d, b2) = d.overflowing_sub(borrow);
        borrow = u32::from(b1 | b2);
        d
    });
    out.collect()
}

/// a + b when `yes`, else a (branch-free; mod 2^(32 * a.len()), b no longer than a).
fn add_if(a: &[u32], b: &[u32], yes: bool) -> Vec<u32> {
    let mask = mask(yes);
    let mut carry = 0u64;
    let out = a.iter().enumerate().map(|(i, &x)| {
        let s = u64::from(x) + u64::from(b.get(i).copied().unwrap_or(0) & mask) + carry;
        carry = s >> 32;
        s as u32
    });
    out.collect()
}

/// t := t - m when top * 2^(32 * t.len()) + t >= m (branch-free); m as long as t.
fn sub_if_ge(t: &mut [u32], top: u32, m: &[u32]) {
    let keep = mask(less(t, m, top));
    let d = sub(t, m);
    t.iter_mut().zip(d).for_each(|(t, d)| *t = (*t & keep) | (d & !keep));
}

/// x mod m, one bit of x at a time (m odd or even, m > 1): slow but small, and branch-free.
fn rem(x: &[u32], m: &[u32]) -> Vec<u32> {
    let mut r = vec![0u32; m.len()];
    for i in (0..x.len() * 32).rev() {
        let mut carry = x[i / 32] >> (i % 32) & 1;
        for limb in r.iter_mut() {
            (*limb, carry) = (*limb << 1 | carry, *limb >> 31);
        }
        sub_if_ge(&mut r, carry, m);
    }
    r
}

/// a * b, schoolbook.
fn mul(a: &[u32], b: &[u32]) -> Vec<u32> {
    let mut out = vec![0u32; a.len() + b.len()];
    for (i, &x) in a.iter().enumerate() {
        let mut carry = 0u64;
        for (j, &y) in b.iter().enumerate() {
            let s = u64::from(out[i + j]) + u64::from(x) * u64::from(y) + carry;
            (out[i + j], carry) = (s as u32, s >> 32);
        }
        out[i + b.len()] = carry as u32;
    }
    out
}

#[cfg(test)]
mod tests;
