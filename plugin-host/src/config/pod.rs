//! Where the fit check's [`PodResources`](super::fit::PodResources) comes from: the process's cgroup
//! memory limit and the size of the scratch filesystem, each overridable by a flag. A thin
//! I/O shell; the parsing is pure and tested on sample files.

use std::path::{Path, PathBuf};

/// A Kubernetes quantity as bytes: plain bytes, or a number with `Ki`/`Mi`/`Gi`/`Ti`
/// (powers of 1024) or `k`/`M`/`G`/`T` (powers of 1000). A decimal fraction is allowed
/// (`1.5Gi`); the result is rounded down to whole bytes.
pub fn parse_quantity(s: &str) -> Result<u64, String> {
    let s = s.trim();
    let split = s
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(s.len());
    let (number, suffix) = s.split_at(split);
    let factor: u64 = match suffix {
        "" => 1,
        "Ki" => 1 << 10,
        "Mi" => 1 << 20,
        "Gi" => 1 << 30,
        "Ti" => 1 << 40,
        "k" => 1_000,
        "M" => 1_000_000,
        "G" => 1_000_000_000,
        "T" => 1_000_000_000_000,
        _ => {
            return Err(format!(
                "{s:?} is not a quantity (bytes, or a number with Ki, Mi, Gi, Ti, k, M, G or T)"
            ));
        }
    };
    let bad = || {
        format!("{s:?} is not a quantity (bytes, or a number with Ki, Mi, Gi, Ti, k, M, G or T)")
    };
    let (whole, frac) = number.split_once('.').unwrap_or((number, ""));
    if whole.is_empty() && frac.is_empty() || frac.contains('.') {
        return Err(bad());
    }
    let whole: u64 = if whole.is_empty() {
        0
    } else {
        whole.parse().map_err(|_| bad())?
    };
    let mut bytes = whole.checked_mul(factor).ok_or_else(bad)?;
    if !frac.is_empty() {
        let digits = frac.len().min(9) as u32;
        let n: u64 = frac[..digits as usize].parse().map_err(|_| bad())?;
        let scale = 10u64.pow(digits);
        let part = u128::from(n) * u128::from(factor) / u128::from(scale);
        bytes = bytes.checked_add(part as u64).ok_or_else(bad)?;
    }
    Ok(bytes)
}

/// A v1 limit at or above this means "no limit" (the kernel reports about 2^63 rounded to a
/// page then).
const V1_UNLIMITED: u64 = 1 << 60;

/// The memory limit of this process's cgroup, or `None` when there is none (or no cgroup
/// file system to ask). `root` is `/` except in tests.
///
/// cgroup v2: `memory.max` of the process's cgroup (from `/proc/self/cgroup`, line `0::`)
/// and each of its ancestors, smallest wins; `max` means no limit. cgroup v1: the same with
/// `memory.limit_in_bytes` under the memory hierarchy. A path from `/proc/self/cgroup` that
/// is not visible (a cgroup namespace shows the container's own cgroup as the mount's
/// root) falls back to the mount's root.
pub fn cgroup_memory_limit(root: &Path) -> Option<u64> {
    let text = std::fs::read_to_string(root.join("proc/self/cgroup")).ok()?;
    let mut v1 = None;
    let mut v2 = None;
    for line in text.lines() {
        let mut it = line.splitn(3, ':');
        let (Some(id), Some(controllers), Some(path)) = (it.next(), it.next(), it.next()) else {
            continue;
        };
        if id == "0" && controllers.is_empty() {
            v2 = Some(path.to_string());
        } else if controllers.split(',').any(|c| c == "memory") {
            v1 = Some(path.to_string());
        }
    }
    let cgroup = root.join("sys/fs/cgroup");
    // A v1 memory controller wins over a v2 line (hybrid hosts mount v2 without memory).
    if let Some(path) = v1 {
        return smallest(
            &cgroup.join("memory"),
            &path,
            "memory.limit_in_bytes",
            |s| s.parse::<u64>().ok().filter(|&v| v < V1_UNLIMITED),
        );
    }
    let path = v2?;
    smallest(&cgroup, &path, "memory.max", |s| match s {
        "max" => None,
        n => n.parse::<u64>().ok(),
    })
}

/// The smallest limit in `file` of `mount/path` and its ancestors up to `mount`; the mount
/// itself alone when `path` is not visible under it.
fn smallest(
    mount: &Path,
    path: &str,
    file: &str,
    parse: impl Fn(&str) -> Option<u64>,
) -> Option<u64> {
    let mut dirs: Vec<PathBuf> = Vec::new();
    let mut dir = mount.join(path.trim_start_matches('/'));
    if !dir.is_dir() {
        dir = mount.to_path_buf();
    }
    while dir.starts_with(mount) {
        dirs.push(dir.clone());
        if !dir.pop() {
            break;
        }
    }
    dirs.iter()
        .filter_map(|d| std::fs::read_to_string(d.join(file)).ok())
        .filter_map(|s| parse(s.trim()))
        .min()
}

/// The size of `dir`'s file system when it is a tmpfs (a memory-backed or size-limited
/// volume: its size is the cap); `None` for a disk, whose free space says nothing about
/// an emptyDir's `sizeLimit`.
pub fn tmpfs_size(dir: &Path) -> Option<u64> {
    use std::os::unix::ffi::OsStrExt;
    const TMPFS_MAGIC: i64 = 0x0102_1994;
    let mut p = dir.to_path_buf();
    // The scratch directory may not exist yet: ask its nearest existing ancestor.
    while !p.exists() {
        if !p.pop() {
            return None;
        }
    }
    let c = std::ffi::CString::new(p.as_os_str().as_bytes()).ok()?;
    let mut st: libc::statfs = unsafe { std::mem::zeroed() };
    // SAFETY: `c` is a valid NUL-terminated path and `st` a writable statfs.
    if unsafe { libc::statfs(c.as_ptr(), &mut st) } != 0 {
        return None;
    }
    #[allow(clippy::unnecessary_cast)]
    let (ftype, blocks, bsize) = (st.f_type as i64, st.f_blocks as u64, st.f_bsize as u64);
    (ftype == TMPFS_MAGIC).then(|| blocks.saturating_mul(bsize))
}

/// The budget the fit check uses: `--memory-limit` or else the cgroup's limit, minus
/// `--memory-reserve`; `--scratch-limit` or else the size of `scratch_dir`'s file system
/// when it is a tmpfs. Says in the log what it found and what it will not check.
pub fn resolve(
    memory_limit: Option<u64>,
    reserve: u64,
    scratch_limit: Option<u64>,
    scratch_dir: &Path,
) -> super::fit::PodResources {
    use super::fit::Mib;
    let (memory, memory_from) = match memory_limit {
        Some(m) => (Some(m), "--memory-limit"),
        None => (
            cgroup_memory_limit(Path::new("/")),
            "the cgroup's memory limit",
        ),
    };
    let (scratch, scratch_from) = match scratch_limit {
        Some(s) => (Some(s), "--scratch-limit"),
        None => (
            tmpfs_size(scratch_dir),
            "the size of the tmpfs holding the scratch directory",
        ),
    };
    match memory {
        Some(m) => tracing::info!(
            limit = %Mib(m), reserve = %Mib(reserve), from = memory_from,
            "providers must fit the memory limit minus the operator's reserve"
        ),
        None => tracing::info!(
            "no memory limit known (no cgroup limit, no --memory-limit): providers' memory is not checked against the pod"
        ),
    }
    match scratch {
        Some(s) => tracing::info!(
            limit = %Mib(s), from = scratch_from, dir = %scratch_dir.display(),
            "providers' /tmp must fit the scratch space"
        ),
        None => tracing::info!(
            dir = %scratch_dir.display(),
            "no scratch limit known (no --scratch-limit, scratch directory not on a tmpfs): providers' /tmp is not checked"
        ),
    }
    super::fit::PodResources {
        memory_bytes: memory,
        reserve_bytes: reserve,
        scratch_bytes: scratch,
        descriptors: Some(crate::fdlimit::nofile_limit()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantities() {
        for (s, want) in [
            ("0", Some(0)),
            ("1048576", Some(1 << 20)),
            ("256Mi", Some(256 << 20)),
            ("1Gi", Some(1 << 30)),
            ("1.5Gi", Some(3 << 29)),
            ("64Ki", Some(64 << 10)),
            ("128M", Some(128_000_000)),
            ("2G", Some(2_000_000_000)),
            ("1k", Some(1000)),
            ("1Ti", Some(1 << 40)),
            (" 8Mi ", Some(8 << 20)),
            ("", None),
            ("Mi", None),
            ("-1", None),
            ("1.2.3Mi", None),
            ("12MB", None),
            ("12m", None),
            ("99999999999999999999", None),
            ("99999999999Ti", None),
        ] {
            assert_eq!(parse_quantity(s).ok(), want, "{s:?}");
        }
    }

    /// A fake root: `/proc/self/cgroup` and files under `/sys/fs/cgroup`.
    fn root(cgroup: &str, files: &[(&str, &str)]) -> tempfile::TempDir {
        let d = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(d.path().join("proc/self")).unwrap();
        std::fs::write(d.path().join("proc/self/cgroup"), cgroup).unwrap();
        for (path, content) in files {
            let p = d.path().join("sys/fs/cgroup").join(path);
            std::fs::create_dir_all(p.parent().unwrap()).unwrap();
            std::fs::write(p, content).unwrap();
        }
        d
    }

    #[test]
    fn cgroup_limits() {
        let pod = "kubepods.slice/kubepods-burstable.slice/pod1.slice/cri-abc.scope";
        let v1 = "12:pids:/x\n4:memory:/kubepods/pod1/abc\n0::/\n";
        /// (case, /proc/self/cgroup, files under /sys/fs/cgroup, the limit)
        type Case<'a> = (&'a str, &'a str, Vec<(String, &'a str)>, Option<u64>);
        let cases: Vec<Case> = vec![
            (
                "v2 in a cgroup namespace",
                "0::/\n",
                vec![("memory.max".into(), "268435456\n")],
                Some(256 << 20),
            ),
            (
                "v2 unlimited",
                "0::/\n",
                vec![("memory.max".into(), "max\n")],
                None,
            ),
            (
                "v2 without a namespace: own cgroup and ancestors, smallest wins",
                "0::/kubepods.slice/kubepods-burstable.slice/pod1.slice/cri-abc.scope\n",
                vec![
                    (format!("{pod}/memory.max"), "max\n"),
                    (
                        "kubepods.slice/kubepods-burstable.slice/pod1.slice/memory.max".into(),
                        "335544320\n",
                    ),
                    ("kubepods.slice/memory.max".into(), "8589934592\n"),
                ],
                Some(320 << 20),
            ),
            (
                "v2 path not visible: the mount's root",
                "0::/somewhere/else\n",
                vec![("memory.max".into(), "134217728\n")],
                Some(128 << 20),
            ),
            (
                "v1",
                v1,
                vec![
                    (
                        "memory/kubepods/pod1/abc/memory.limit_in_bytes".into(),
                        "268435456\n",
                    ),
                    (
                        "memory/memory.limit_in_bytes".into(),
                        "9223372036854771712\n",
                    ),
                ],
                Some(256 << 20),
            ),
            (
                "v1 unlimited (absurd value)",
                v1,
                vec![(
                    "memory/kubepods/pod1/abc/memory.limit_in_bytes".into(),
                    "9223372036854771712\n",
                )],
                None,
            ),
            ("no cgroup files", "0::/\n", vec![], None),
            (
                "garbage",
                "0::/\n",
                vec![("memory.max".into(), "lots\n")],
                None,
            ),
        ];
        for (name, cgroup, files, want) in cases {
            let files: Vec<(&str, &str)> = files.iter().map(|(p, c)| (p.as_str(), *c)).collect();
            let r = root(cgroup, &files);
            assert_eq!(cgroup_memory_limit(r.path()), want, "{name}");
        }
        let none = tempfile::tempdir().unwrap();
        assert_eq!(cgroup_memory_limit(none.path()), None, "no /proc");
    }

    #[test]
    fn tmpfs_size_is_none_for_a_disk_and_finds_an_existing_ancestor() {
        // /dev/shm is a tmpfs on Linux; the test tree's directory usually is not.
        if let Some(n) = tmpfs_size(Path::new("/dev/shm/does/not/exist")) {
            assert!(n > 0);
        }
        let target = Path::new(env!("CARGO_MANIFEST_DIR"));
        if tmpfs_size(Path::new("/dev/shm")).is_some() {
            // Only meaningful where the checkout is on a disk.
            let _ = tmpfs_size(target);
        }
        assert_eq!(tmpfs_size(Path::new("/proc/nonexistent-xyz")), None);
    }
}
