//! File descriptors: the operator's own reserve, and what the plugins may take at worst.
//!
//! At start the soft `RLIMIT_NOFILE` is raised to the hard limit ([`raise_nofile`]); the
//! result is kept ([`nofile_limit`]) so that a configuration whose plugins could, all at
//! once, take more descriptors than the limit minus a reserve for the operator itself is
//! refused ([`check_descriptor_budget`]). One provider can then never starve the kube
//! client, the probes, the discovery API or the reloader.

use crate::config::{Limits, ProvidersFile};
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

/// Descriptors one call may hold at worst: its open files (`limits.openFiles`), one
/// socket per request in flight (`limits.http.maxInFlight`), and its `/tmp` preopen.
pub fn descriptors_per_call(limits: &Limits) -> u64 {
    u64::from(limits.open_files) + u64::from(limits.http.max_in_flight) + 1
}

/// Descriptors all plugins may hold at once: every provider running `limits.concurrency`
/// calls, each at [`descriptors_per_call`].
pub fn plugin_descriptors(file: &ProvidersFile) -> u64 {
    file.providers
        .iter()
        .map(|p| u64::from(p.limits.concurrency) * descriptors_per_call(&p.limits))
        .sum()
}

/// Refuses a providers file whose plugins could together take more descriptors than
/// `nofile` (the soft `RLIMIT_NOFILE`, see [`nofile_limit`]) minus
/// [`OPERATOR_FD_RESERVE`]. Pure: the caller passes the limit. The error names the
/// fields to lower.
pub fn check_descriptor_budget(file: &ProvidersFile, nofile: u64) -> Result<(), String> {
    let plugins = plugin_descriptors(file);
    let needed = plugins.saturating_add(OPERATOR_FD_RESERVE);
    if needed <= nofile {
        return Ok(());
    }
    let worst = file
        .providers
        .iter()
        .max_by_key(|p| u64::from(p.limits.concurrency) * descriptors_per_call(&p.limits))
        .map(|p| format!(" (the most: provider {:?})", p.name))
        .unwrap_or_default();
    Err(format!(
        "the providers' file descriptors do not fit: the sum over providers of limits.concurrency x (limits.openFiles + limits.http.maxInFlight + 1) is {plugins}{worst}, plus {OPERATOR_FD_RESERVE} kept for the operator, is {needed}, above the process's open-file limit (RLIMIT_NOFILE) of {nofile}; lower those limits or raise the limit"
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn file(yaml: &str) -> ProvidersFile {
        ProvidersFile::parse(yaml).unwrap()
    }

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

    #[test]
    fn the_budget_counts_every_call_of_every_provider_plus_the_reserve() {
        let f = file(
            "providers:\n- name: a\n  plugin: a.wasm\n- name: b\n  plugin: b.wasm\n  limits: {concurrency: 2, openFiles: 10, http: {maxInFlight: 3}}\n",
        );
        // a at the defaults; b: 2 x (10 + 3 + 1) = 28.
        let d = Limits::default();
        let a = u64::from(d.concurrency)
            * (u64::from(d.open_files) + u64::from(d.http.max_in_flight) + 1);
        assert_eq!(plugin_descriptors(&f), a + 28);
        assert_eq!(check_descriptor_budget(&f, a + 28 + 1024), Ok(()));
        let err = check_descriptor_budget(&f, a + 28 + 1023).unwrap_err();
        assert!(err.contains("limits.openFiles"), "{err}");
        assert!(err.contains("provider \"a\""), "{err}");
        assert!(err.contains(&(a + 28 + 1024).to_string()), "{err}");
    }

    #[test]
    fn the_default_open_file_limit_fits_the_defaults() {
        // 1024 is the usual default soft limit and fits nothing next to the reserve; the
        // usual hard limits (524288 on systemd hosts, 1048576 in containerd) fit a lot.
        let f = file("providers:\n- name: a\n  plugin: a.wasm\n");
        assert!(check_descriptor_budget(&f, 1024).is_err());
        assert!(check_descriptor_budget(&f, 524_288).is_ok());
    }
}
