//! The provider plugin runtime: loads WebAssembly provider components and runs each call in a
//! sandbox of its own. It knows nothing of Kubernetes; the operator drives it through the
//! [`provider::Provider`] trait.
//!
//! Its modules stand in layers, each using only those below it (`xtask/src/layering.rs`
//! checks it): `fdlimit`, `policy` and `redact`; `sensitive`; `provider`; `rate`; `config`;
//! `plugin`.

/// The providers file, its limits, and their fit to the pod's resources.
pub mod config;
/// The open-file limit: raised at start, and the descriptors the providers may use.
pub mod fdlimit;
/// The wasmtime runtime: engine, compile and cache, loading, the per-call sandbox.
pub mod plugin;
/// Where a plugin may send requests: allow-list rules and the address checks.
pub mod policy;
/// The `Provider` trait the operator calls, its types and errors, and its metrics.
pub mod provider;
/// A provider's request budget: a token bucket with priorities, and what the backend said.
pub mod rate;
/// Scrubbing secrets, cloud-init and credentials out of text, in every encoding.
pub mod redact;
/// What is sensitive for each provider, bounded, and the redactor compiled from it.
pub mod sensitive;

/// Heap bytes allocated and not yet freed by the current thread, in test builds: what a
/// test on a current-thread runtime measures of the work it drives (its futures, and the
/// tasks it spawns there), whatever other tests do on other threads at the same time.
/// The operator's tests count with it too (feature `thread-heap`, a dev-dependency only:
/// a test binary declares [`thread_heap::Counting`] its allocator).
#[cfg(any(test, feature = "thread-heap"))]
pub mod thread_heap {
    use std::alloc::{GlobalAlloc, Layout, System};
    use std::cell::Cell;

    thread_local! {
        static LIVE: Cell<isize> = const { Cell::new(0) };
    }

    /// Live bytes of this thread (allocated here minus freed here).
    pub fn live() -> isize {
        LIVE.with(Cell::get)
    }

    /// The system allocator, counting per thread.
    pub struct Counting;

    fn add(n: isize) {
        // `try_with`: a thread being torn down has no counter left; nothing to count.
        let _ = LIVE.try_with(|l| l.set(l.get() + n));
    }

    // SAFETY: every call is passed to `System` unchanged; the counter allocates nothing.
    unsafe impl GlobalAlloc for Counting {
        unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
            add(layout.size() as isize);
            unsafe { System.alloc(layout) }
        }
        unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
            add(layout.size() as isize);
            unsafe { System.alloc_zeroed(layout) }
        }
        unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
            add(-(layout.size() as isize));
            unsafe { System.dealloc(ptr, layout) }
        }
        unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
            add(new_size as isize - layout.size() as isize);
            unsafe { System.realloc(ptr, layout, new_size) }
        }
    }

    #[cfg(test)]
    #[global_allocator]
    static COUNTING: Counting = Counting;
}
