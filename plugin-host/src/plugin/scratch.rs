//! Each call's private `/tmp`, and the few empty ones a provider keeps for its next calls.
//!
//! Every call gets a directory no other call can see while it runs. Making one and
//! removing it afterwards cost two directory operations per call plus a hand-off to a
//! blocking thread, about a tenth of a plugin `get`'s whole price, though the shipped
//! plugins never touch `/tmp`. So a provider keeps up to `limits.concurrency` directories
//! that are known to be empty and hands them out again: a call that left nothing behind
//! (no byte and no entry charged to its `/tmp` quota, which counts every file, directory
//! and link the guest creates; and the directory found empty once its files are closed)
//! returns its directory to the pool. Anything else is removed off the call's path, as
//! before. A pool belongs to one provider object, so no directory ever passes between
//! providers, and only an empty one between calls of the same provider.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

/// Empty `/tmp` directories of one provider, ready for its next calls.
pub struct ScratchPool {
    parent: PathBuf,
    keep: usize,
    free: Mutex<Vec<PathBuf>>,
}

impl ScratchPool {
    /// A pool making directories under `parent` and keeping at most `keep` empty ones.
    pub fn new(parent: &Path, keep: usize) -> Arc<Self> {
        Arc::new(ScratchPool {
            parent: parent.to_path_buf(),
            keep,
            free: Mutex::new(Vec::new()),
        })
    }

    /// An empty directory for one call: a kept one, or a new one.
    pub fn take(self: &Arc<Self>) -> std::io::Result<ScratchDir> {
        let kept = self.free.lock().unwrap_or_else(|e| e.into_inner()).pop();
        let path = match kept {
            Some(p) => p,
            None => tempfile::Builder::new()
                .prefix("call-")
                .tempdir_in(&self.parent)?
                .keep(),
        };
        Ok(ScratchDir {
            path,
            pool: self.clone(),
            untouched: false,
        })
    }

    #[cfg(test)]
    fn kept(&self) -> usize {
        self.free.lock().unwrap_or_else(|e| e.into_inner()).len()
    }
}

impl Drop for ScratchPool {
    fn drop(&mut self) {
        // Empty directories: removing them is one syscall each.
        for p in self
            .free
            .get_mut()
            .unwrap_or_else(|e| e.into_inner())
            .drain(..)
        {
            let _ = std::fs::remove_dir(&p);
        }
    }
}

/// One call's `/tmp`. Dropped, it goes back to its pool if the call left it untouched
/// ([`ScratchDir::untouched`]), else it is removed on a blocking thread, off the call's
/// path: a guest that filled it with many entries cannot make its call return late, nor
/// hold up the task that dropped it (a call cancelled by its caller). At shutdown the
/// removal is best effort: a removal not started when the runtime stops is skipped, and
/// the directory stays in the pod's scratch volume until the pod goes.
pub struct ScratchDir {
    path: PathBuf,
    pool: Arc<ScratchPool>,
    untouched: bool,
}

impl ScratchDir {
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Says that the call is over (its Store, and with it every descriptor the guest held,
    /// is gone) and that its quota charged nothing: the directory may serve another call
    /// if it is found empty.
    pub fn untouched(&mut self) {
        self.untouched = true;
    }
}

impl Drop for ScratchDir {
    fn drop(&mut self) {
        let path = std::mem::take(&mut self.path);
        if self.untouched && is_empty(&path) {
            let mut free = self.pool.free.lock().unwrap_or_else(|e| e.into_inner());
            if free.len() < self.pool.keep {
                free.push(path);
                return;
            }
        }
        let remove = move || {
            if let Err(e) = super::fs::remove_tree(&path) {
                tracing::warn!(dir = %path.display(), error = %e, "cannot remove a plugin call's /tmp");
            }
        };
        match tokio::runtime::Handle::try_current() {
            Ok(rt) => {
                rt.spawn_blocking(remove);
            }
            Err(_) => remove(),
        }
    }
}

/// Reads at most one entry: a directory full of them costs no more than an empty one.
fn is_empty(dir: &Path) -> bool {
    std::fs::read_dir(dir).is_ok_and(|mut d| d.next().is_none())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_untouched_empty_directories_are_kept_and_at_most_keep_of_them() {
        let parent = tempfile::tempdir().unwrap();
        let pool = ScratchPool::new(parent.path(), 2);
        let count = || std::fs::read_dir(parent.path()).unwrap().count();

        // Not marked untouched: removed.
        let a = pool.take().unwrap();
        drop(a);
        assert_eq!(pool.kept(), 0);
        assert_eq!(count(), 0);

        // Untouched and empty: kept, and handed out again.
        let mut b = pool.take().unwrap();
        let b_path = b.path().to_path_buf();
        b.untouched();
        drop(b);
        assert_eq!(pool.kept(), 1);
        let c = pool.take().unwrap();
        assert_eq!(c.path(), b_path, "the kept directory is reused");
        drop(c);

        // Marked untouched but not empty (a count that missed a file): removed.
        let mut d = pool.take().unwrap();
        std::fs::write(d.path().join("left-behind"), b"x").unwrap();
        d.untouched();
        drop(d);
        assert_eq!(pool.kept(), 0);
        assert_eq!(count(), 0);

        // At most `keep` are kept.
        let mut held: Vec<ScratchDir> = (0..3).map(|_| pool.take().unwrap()).collect();
        held.iter_mut().for_each(ScratchDir::untouched);
        drop(held);
        assert_eq!(pool.kept(), 2);
        assert_eq!(count(), 2);

        // The pool's end removes what it kept.
        drop(pool);
        assert_eq!(count(), 0);
    }
}
