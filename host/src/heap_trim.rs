//! Gives the heap's free pages back to the kernel every [`INTERVAL`] (glibc's
//! `malloc_trim`).
//!
//! glibc returns memory to the kernel only from the top of an arena, and on its own only
//! when a large free block sits there. Pages freed in the middle stay resident. A rollout
//! leaves many of those behind: list pages, status writes, Events, and the transient maps of
//! each list. `malloc_trim(0)` releases every whole free page of every arena with
//! `MADV_DONTNEED`, and keeps the address space.
//!
//! Issue 29, 10,000 Proxies on Hetzner: the RSS without it varied from run to run by more
//! than its margin under the 128 MiB goal (125.6 to 135.1 MiB at the peak), with it
//! docs/benchmarks.md ("Heap trimming") has the runs. A trim holds each arena's lock while
//! it walks that arena; a 64 MiB arena it gave 63 MiB back from took 1.7 ms
//! (`a_trim_gives_freed_pages_back` prints it), so one every 2 s holds an arena well under
//! 0.1% of the time, and on a blocking thread, never a runtime worker.
//!
//! A no-op off glibc: other allocators return memory their own way.

use std::time::Duration;
use tokio_util::sync::CancellationToken;

/// How often the heap is trimmed.
pub const INTERVAL: Duration = Duration::from_secs(2);

/// Trims the heap once; `true` when some memory went back to the kernel.
pub fn trim() -> bool {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        // SAFETY: `malloc_trim` takes no pointers; it locks each arena while it walks it,
        // as malloc and free do.
        unsafe { libc::malloc_trim(0) == 1 }
    }
    #[cfg(not(all(target_os = "linux", target_env = "gnu")))]
    {
        false
    }
}

/// Trims the heap every [`INTERVAL`] until `stop`.
pub async fn run(stop: CancellationToken) {
    let mut ticks = tokio::time::interval(INTERVAL);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = ticks.tick() => {
                // On a blocking thread: the walk must not hold up a runtime worker.
                let _ = tokio::task::spawn_blocking(trim).await;
            }
        }
    }
}

#[cfg(all(test, target_os = "linux", target_env = "gnu"))]
mod tests {
    use super::*;

    fn resident_bytes() -> u64 {
        let statm = std::fs::read_to_string("/proc/self/statm").unwrap();
        let pages: u64 = statm.split_whitespace().nth(1).unwrap().parse().unwrap();
        pages * 4096
    }

    /// 64 MiB of small blocks, all freed but the last (which keeps the arena's top in
    /// place, as a live object does in the operator): the freed pages stay resident until
    /// a trim gives them back.
    #[test]
    fn a_trim_gives_freed_pages_back() {
        const MIB: u64 = 1 << 20;
        // Blocks of 16 KiB, below any mmap threshold: they come from an arena.
        let mut blocks: Vec<Box<[u8]>> = (0..4096)
            .map(|i| vec![i as u8 | 1; 16 << 10].into_boxed_slice())
            .collect();
        let last = blocks.pop();
        drop(blocks);
        let before = resident_bytes();
        let started = std::time::Instant::now();
        let trimmed = trim();
        let took = started.elapsed();
        let after = resident_bytes();
        eprintln!(
            "trim: {} MiB resident before, {} after, in {took:?}",
            before / MIB,
            after / MIB
        );
        assert!(trimmed, "malloc_trim released nothing");
        assert!(
            before.saturating_sub(after) >= 32 * MIB,
            "{} MiB resident before the trim, {} after",
            before / MIB,
            after / MIB
        );
        std::hint::black_box(last);
    }
}
