//! The descriptors the providers may hold, against the process's open-file limit: the fit's
//! third resource, beside memory and scratch space. Pure: the caller passes the limit
//! ([`crate::fdlimit::nofile_limit`]).

use super::{Limits, ProvidersFile};
use crate::fdlimit::OPERATOR_FD_RESERVE;

/// Descriptors one call may hold at worst: its open files (`limits.openFiles`), one
/// socket per request in flight (`limits.http.maxInFlight`), and its `/tmp` preopen.
pub fn descriptors_per_call(limits: &Limits) -> u64 {
    u64::from(limits.open_files) + u64::from(limits.http.max_in_flight) + 1
}

/// Descriptors one provider may hold at worst: `limits.concurrency` calls, each at
/// [`descriptors_per_call`], and its idle kept-alive connections (`limits.http.maxIdle`),
/// which outlive the calls.
pub fn descriptors_per_provider(limits: &Limits) -> u64 {
    u64::from(limits.concurrency) * descriptors_per_call(limits) + u64::from(limits.http.max_idle)
}

/// Descriptors all plugins may hold at once: every provider at
/// [`descriptors_per_provider`].
pub fn plugin_descriptors(file: &ProvidersFile) -> u64 {
    file.providers
        .iter()
        .map(|p| descriptors_per_provider(&p.limits))
        .sum()
}

/// Refuses a providers file whose plugins could together take more descriptors than
/// `nofile` (the soft `RLIMIT_NOFILE`, see [`crate::fdlimit::nofile_limit`]) minus
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
        .max_by_key(|p| descriptors_per_provider(&p.limits))
        .map(|p| format!(" (the most: provider {:?})", p.name))
        .unwrap_or_default();
    Err(format!(
        "the providers' file descriptors do not fit: the sum over providers of limits.concurrency x (limits.openFiles + limits.http.maxInFlight + 1) + limits.http.maxIdle is {plugins}{worst}, plus {OPERATOR_FD_RESERVE} kept for the operator, is {needed}, above the process's open-file limit (RLIMIT_NOFILE) of {nofile}; lower those limits or raise the limit"
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn file(yaml: &str) -> ProvidersFile {
        ProvidersFile::parse(yaml).unwrap()
    }

    #[test]
    fn the_budget_counts_every_call_of_every_provider_plus_the_reserve() {
        let f = file(
            "providers:\n- name: a\n  plugin: a.wasm\n- name: b\n  plugin: b.wasm\n  limits: {concurrency: 2, openFiles: 10, http: {maxInFlight: 3}}\n",
        );
        // a at the defaults; b: 2 x (10 + 3 + 1) = 28, plus 4 idle connections = 32.
        let d = Limits::default();
        let a = u64::from(d.concurrency)
            * (u64::from(d.open_files) + u64::from(d.http.max_in_flight) + 1)
            + u64::from(d.http.max_idle);
        let a = a + 4;
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
