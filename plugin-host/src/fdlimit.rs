//! File descriptors: the operator's own reserve, and what the plugins may take at worst.
//!
//! At start the soft `RLIMIT_NOFILE` is raised to the hard limit ([`raise_nofile`]); the
//! result is kept ([`nofile_limit`]) so that a configuration whose plugins could, all at
//! once, take more descriptors than the limit minus a reserve for the operator itself is
//! refused ([`check_descriptor_budget`]). One provider can then never starve the kube
//! client, the probes, the discovery API or the reloader.

use std::sync::OnceLock;

/// Descriptors kept for the operator itself: the kube client and its watches, the health
/// probes, the discovery API and metrics listeners and their clients, the reloader, the
/// compile cache, logs and traces.
pub const OPERATOR_FD_RESERVE: u64 = 1024;

/// What `RLIMIT_NOFILE` was and became at start.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NofileLimit {
    /// The soft limit found at start.
    pub before: u64,
    /// The soft limit now in force (the hard limit, if raising worked).
    pub soft: u64,
    pub hard: u64,
}

static NOFILE: OnceLock<u64> = OnceLock::new();

/// Raises the soft `RLIMIT_NOFILE` to the hard limit, and remembers the result for
/// [`nofile_limit`]. Call once, at process start (the limit is the whole process's).
pub fn raise_nofile() -> std::io::Result<NofileLimit> {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: `lim` is a valid rlimit for getrlimit/setrlimit to read and write.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    let before = lim.rlim_cur;
    if lim.rlim_cur < lim.rlim_max {
        let raised = libc::rlimit {
            rlim_cur: lim.rlim_max,
            rlim_max: lim.rlim_max,
        };
        // SAFETY: as above.
        if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &raised) } == 0 {
            lim = raised;
        }
    }
    let result = NofileLimit {
        before: to_u64(before),
        soft: to_u64(lim.rlim_cur),
        hard: to_u64(lim.rlim_max),
    };
    let _ = NOFILE.set(result.soft);
    Ok(result)
}

// rlim_t is u64 on Linux but not on every unix.
#[allow(clippy::unnecessary_cast, clippy::useless_conversion)]
fn to_u64(v: libc::rlim_t) -> u64 {
    if v == libc::RLIM_INFINITY {
        u64::MAX
    } else {
        v as u64
    }
}

/// The soft `RLIMIT_NOFILE` in force: what [`raise_nofile`] set, or else the current one.
pub fn nofile_limit() -> u64 {
    if let Some(n) = NOFILE.get() {
        return *n;
    }
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: `lim` is a valid rlimit for getrlimit to write.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) } != 0 {
        return 1024;
    }
    to_u64(lim.rlim_cur)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn raising_reaches_the_hard_limit_and_is_remembered() {
        let l = raise_nofile().unwrap();
        assert!(l.soft >= l.before);
        assert_eq!(l.soft, l.hard);
        assert_eq!(nofile_limit(), l.soft);
        let mut cur = libc::rlimit {
            rlim_cur: 0,
            rlim_max: 0,
        };
        assert_eq!(unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut cur) }, 0);
        assert_eq!(to_u64(cur.rlim_cur), l.soft);
    }
}
