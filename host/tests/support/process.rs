//! What a process holds of the host, read from /proc: for the sandbox tests that bound the
//! descriptors and memory a hostile plugin can make the operator take.

/// Entries of /proc/PID/fd: the descriptors the process holds (0 when unreadable).
pub fn descriptors(pid: u32) -> u64 {
    std::fs::read_dir(format!("/proc/{pid}/fd"))
        .map(|d| d.count() as u64)
        .unwrap_or(0)
}

/// VmRSS of the process, in bytes (0 when unreadable).
pub fn resident_bytes(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    status
        .lines()
        .find(|l| l.starts_with("VmRSS:"))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|k| k.parse::<u64>().ok())
        .unwrap_or(0)
        * 1024
}
