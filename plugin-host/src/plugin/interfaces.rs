//! The operator's own addresses: every address of every interface of its network
//! namespace (a pod's), which a plugin's request must never be dialled to
//! ([`crate::policy::address_problem`]). On an IPv6 cluster a pod's address is public, so
//! the range checks alone would let a plugin whose allowed name resolves to it reach the
//! operator's own ports (metrics, discovery, the health port).
//!
//! Read with `getifaddrs(3)` and kept for [`REFRESH`]: addresses change rarely (a pod's
//! never), and one read costs a netlink round trip and a descriptor.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// How long a read of the interfaces' addresses is used before it is read again.
pub const REFRESH: Duration = Duration::from_secs(1);

/// The own addresses, read again when the last read is older than [`REFRESH`]. An error
/// (no descriptor left for the netlink socket, say) is returned, never papered over with
/// an empty set: the caller refuses the request then.
pub fn own_addresses() -> std::io::Result<Arc<[IpAddr]>> {
    static CACHE: Mutex<Option<(Instant, Arc<[IpAddr]>)>> = Mutex::new(None);
    let mut cache = CACHE.lock().unwrap_or_else(|e| e.into_inner());
    if let Some((at, addrs)) = &*cache
        && at.elapsed() < REFRESH
    {
        return Ok(addrs.clone());
    }
    let addrs: Arc<[IpAddr]> = read()?.into();
    *cache = Some((Instant::now(), addrs.clone()));
    Ok(addrs)
}

/// Every IPv4 and IPv6 address of every interface, up or down, as `getifaddrs(3)` lists
/// them (duplicates removed).
pub fn read() -> std::io::Result<Vec<IpAddr>> {
    let mut head: *mut libc::ifaddrs = std::ptr::null_mut();
    // SAFETY: getifaddrs fills `head` with a list it allocated, or fails and leaves it.
    if unsafe { libc::getifaddrs(&mut head) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    let mut out = Vec::new();
    let mut cur = head;
    while !cur.is_null() {
        // SAFETY: `cur` is a node of the list getifaddrs returned, not yet freed; its
        // `ifa_addr` is null or points to a sockaddr of the family it names.
        unsafe {
            let ifa = &*cur;
            if !ifa.ifa_addr.is_null() {
                match i32::from((*ifa.ifa_addr).sa_family) {
                    libc::AF_INET => {
                        let sin = &*(ifa.ifa_addr as *const libc::sockaddr_in);
                        out.push(IpAddr::V4(Ipv4Addr::from(
                            sin.sin_addr.s_addr.to_ne_bytes(),
                        )));
                    }
                    libc::AF_INET6 => {
                        let sin6 = &*(ifa.ifa_addr as *const libc::sockaddr_in6);
                        out.push(IpAddr::V6(Ipv6Addr::from(sin6.sin6_addr.s6_addr)));
                    }
                    _ => {}
                }
            }
            cur = ifa.ifa_next;
        }
    }
    // SAFETY: `head` came from getifaddrs and is freed once.
    unsafe { libc::freeifaddrs(head) };
    out.sort();
    out.dedup();
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What `ip addr` shows (here from /proc, which lists the same addresses): the
    /// loopback addresses at least, and every address `/proc/net/if_inet6` has.
    #[test]
    fn lists_this_machines_addresses() {
        let addrs = read().unwrap();
        assert!(
            addrs.contains(&IpAddr::V4(Ipv4Addr::LOCALHOST)),
            "127.0.0.1 is missing from {addrs:?}"
        );
        if let Ok(text) = std::fs::read_to_string("/proc/net/if_inet6") {
            for line in text.lines() {
                let hex = line.split_whitespace().next().unwrap_or_default();
                let Ok(n) = u128::from_str_radix(hex, 16) else {
                    continue;
                };
                let v6 = IpAddr::V6(Ipv6Addr::from(n));
                assert!(addrs.contains(&v6), "{v6} is missing from {addrs:?}");
            }
        }
        let cached = own_addresses().unwrap();
        assert_eq!(&cached[..], &addrs[..]);
    }
}
