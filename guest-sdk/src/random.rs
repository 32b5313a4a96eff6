//! Random bytes from the host (`wasi:random`), for secrets a plugin makes up itself: a
//! root password a backend insists on, an idempotency token. Outside a component (native
//! unit tests of plugin code) they come from the OS.

/// `n` cryptographically secure random bytes.
pub fn random_bytes(n: usize) -> Vec<u8> {
    #[cfg(target_arch = "wasm32")]
    return wasip2::random::random::get_random_bytes(n as u64);
    #[cfg(not(target_arch = "wasm32"))]
    {
        use std::io::Read;
        let mut buf = vec![0; n];
        std::fs::File::open("/dev/urandom")
            .and_then(|mut f| f.read_exact(&mut buf))
            .expect("reading /dev/urandom");
        buf
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn fresh_bytes_of_the_length_asked() {
        let (a, b) = (super::random_bytes(32), super::random_bytes(32));
        assert_eq!((a.len(), b.len()), (32, 32));
        assert_ne!(a, b);
        assert!(super::random_bytes(0).is_empty());
    }
}
