//! A counted `wasi:filesystem`: the call's `/tmp` quota and open-file cap, enforced where
//! the guest writes and opens, not by looking at the directory afterwards.
//!
//! [`CountedFs`] replaces wasmtime-wasi's `wasi:filesystem/types` host. Every method
//! delegates to wasmtime-wasi's own implementation; the ones that add bytes or entries to
//! `/tmp`, or hold a host descriptor, are counted first:
//!
//! - bytes passed to `write`, and to streams from `write-via-stream`/`append-via-stream`
//!   (wrapped in a [`CountingStream`]), each time they are written: overwriting a file or
//!   writing to one already unlinked costs as much as writing a new one;
//! - growth from `set-size`;
//! - [`ENTRY_BYTES`] per file, directory, symlink or hard link created;
//! - host descriptors that `open-at` made, alive as long as anything (the descriptor, a
//!   stream of it) still holds the file open.
//!
//! Past a cap the guest traps at once (not an error code it could ignore and retry), after
//! the limit is recorded on the call's [`Tripwire`]. The path names do not matter, so
//! nothing can hide from the count: not unlinked files, not paths longer than `PATH_MAX`,
//! not directories.
//!
//! [`remove_tree`] removes a call's `/tmp` afterwards with a bounded number of descriptors
//! and no recursion, however deep the tree.

use super::limits::{LimitHit, Tripwire};
use bytes::Bytes;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Weak};
use wasmtime::component::{HasData, Resource};
use wasmtime_wasi::filesystem::{Descriptor, WasiFilesystemCtxView};
use wasmtime_wasi::p2::bindings::filesystem::types::{
    self, ErrorCode, HostDescriptor, HostDirectoryEntryStream,
};
use wasmtime_wasi::p2::{FsError, FsResult};
use wasmtime_wasi_io::poll::Pollable;
use wasmtime_wasi_io::streams::{DynOutputStream, OutputStream, StreamError, StreamResult};

/// What creating one file, directory or link costs against `limits.tmpMib`: about one
/// inode and one directory block on the file systems a pod's `/tmp` lives on.
pub const ENTRY_BYTES: u64 = 4096;

/// Bytes a call has written to its `/tmp`, against its cap. Shared with the streams the
/// guest writes through, which live in the resource table.
#[derive(Debug)]
pub struct TmpQuota {
    used: AtomicU64,
    cap: u64,
    stop: Arc<Tripwire>,
}

impl TmpQuota {
    pub fn new(cap: u64, stop: Arc<Tripwire>) -> Self {
        TmpQuota {
            used: AtomicU64::new(0),
            cap,
            stop,
        }
    }

    /// Counts `bytes`; past the cap, trips the call's tripwire and refuses.
    pub fn charge(&self, bytes: u64) -> Result<(), QuotaExceeded> {
        let before = self.used.fetch_add(bytes, Ordering::Relaxed);
        if before.saturating_add(bytes) > self.cap {
            self.stop.trip(LimitHit::Tmp);
            return Err(QuotaExceeded);
        }
        Ok(())
    }

    /// Bytes counted so far (written plus [`ENTRY_BYTES`] per entry created): 0 when the
    /// call created nothing in its `/tmp`.
    pub fn used(&self) -> u64 {
        self.used.load(Ordering::Relaxed)
    }
}

/// A cap was reached: the call must stop.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QuotaExceeded;

impl QuotaExceeded {
    fn trap(what: &str) -> FsError {
        FsError::trap(wasmtime::format_err!("{what} cap reached"))
    }
}

/// The host files `open-at` made for a call. A file counts while anything still holds it
/// open (its descriptor, or a stream the guest made from it), which is exactly while the
/// host descriptor exists.
#[derive(Debug)]
pub struct OpenFiles {
    max: usize,
    live: Vec<Weak<std::fs::File>>,
}

impl OpenFiles {
    pub fn new(max: usize) -> Self {
        OpenFiles {
            max,
            live: Vec::new(),
        }
    }

    /// Files still open.
    pub fn count(&mut self) -> usize {
        self.live.retain(|w| w.strong_count() > 0);
        self.live.len()
    }

    /// Whether one more may be opened.
    pub fn admits_one_more(&mut self) -> bool {
        self.count() < self.max
    }

    pub fn track(&mut self, file: &Arc<std::fs::File>) {
        self.live.push(Arc::downgrade(file));
    }
}

/// The filesystem limits of one call.
pub struct FsLimits {
    pub quota: Arc<TmpQuota>,
    pub open: OpenFiles,
    pub stop: Arc<Tripwire>,
}

impl FsLimits {
    pub fn new(tmp_cap: u64, open_files: usize, stop: Arc<Tripwire>) -> Self {
        FsLimits {
            quota: Arc::new(TmpQuota::new(tmp_cap, stop.clone())),
            open: OpenFiles::new(open_files),
            stop,
        }
    }
}

/// The [`HasData`] of the counted `wasi:filesystem/types`.
pub struct CountedFs;

impl HasData for CountedFs {
    type Data<'a> = CountedFsView<'a>;
}

/// wasmtime-wasi's filesystem view plus this call's limits.
pub struct CountedFsView<'a> {
    inner: WasiFilesystemCtxView<'a>,
    limits: &'a mut FsLimits,
}

impl<'a> CountedFsView<'a> {
    pub(super) fn new(inner: WasiFilesystemCtxView<'a>, limits: &'a mut FsLimits) -> Self {
        CountedFsView { inner, limits }
    }
}

/// A second (borrowed) handle to a resource the guest passed in, for a delegated call
/// that consumes its argument.
fn again<T: 'static>(r: &Resource<T>) -> Resource<T> {
    Resource::new_borrow(r.rep())
}

impl CountedFsView<'_> {
    fn charge(&self, bytes: u64) -> FsResult<()> {
        self.limits
            .quota
            .charge(bytes)
            .map_err(|_| QuotaExceeded::trap("/tmp"))
    }

    /// Replaces the output stream at `res` with one that counts what is written to it.
    fn count_stream(
        &mut self,
        res: Resource<DynOutputStream>,
    ) -> FsResult<Resource<DynOutputStream>> {
        // wasmtime-wasi pushes file streams without a parent; the wrapper is pushed the
        // same way.
        let inner = self.inner.table.delete(res)?;
        let counted: DynOutputStream = Box::new(CountingStream {
            inner,
            quota: self.limits.quota.clone(),
        });
        Ok(self.inner.table.push(counted)?)
    }
}

impl types::Host for CountedFsView<'_> {
    fn convert_error_code(&mut self, err: FsError) -> wasmtime::Result<ErrorCode> {
        types::Host::convert_error_code(&mut self.inner, err)
    }

    fn filesystem_error_code(
        &mut self,
        err: Resource<wasmtime::Error>,
    ) -> wasmtime::Result<Option<ErrorCode>> {
        types::Host::filesystem_error_code(&mut self.inner, err)
    }
}

impl HostDescriptor for CountedFsView<'_> {
    async fn advise(
        &mut self,
        fd: Resource<types::Descriptor>,
        offset: types::Filesize,
        len: types::Filesize,
        advice: types::Advice,
    ) -> FsResult<()> {
        self.inner.advise(fd, offset, len, advice).await
    }

    async fn sync_data(&mut self, fd: Resource<types::Descriptor>) -> FsResult<()> {
        self.inner.sync_data(fd).await
    }

    async fn get_flags(
        &mut self,
        fd: Resource<types::Descriptor>,
    ) -> FsResult<types::DescriptorFlags> {
        self.inner.get_flags(fd).await
    }

    async fn get_type(
        &mut self,
        fd: Resource<types::Descriptor>,
    ) -> FsResult<types::DescriptorType> {
        self.inner.get_type(fd).await
    }

    async fn set_size(
        &mut self,
        fd: Resource<types::Descriptor>,
        size: types::Filesize,
    ) -> FsResult<()> {
        // Growth counts like a write: a sparse file still claims that much of the quota.
        let current = match self.inner.table.get(&fd)? {
            Descriptor::File(f) => f.file.metadata().map_err(ErrorCode::from)?.len(),
            Descriptor::Dir(_) => return Err(ErrorCode::BadDescriptor.into()),
        };
        self.charge(size.saturating_sub(current))?;
        self.inner.set_size(fd, size).await
    }

    async fn set_times(
        &mut self,
        fd: Resource<types::Descriptor>,
        atim: types::NewTimestamp,
        mtim: types::NewTimestamp,
    ) -> FsResult<()> {
        self.inner.set_times(fd, atim, mtim).await
    }

    async fn read(
        &mut self,
        fd: Resource<types::Descriptor>,
        len: types::Filesize,
        offset: types::Filesize,
    ) -> FsResult<(Vec<u8>, bool)> {
        self.inner.read(fd, len, offset).await
    }

    async fn write(
        &mut self,
        fd: Resource<types::Descriptor>,
        buf: Vec<u8>,
        offset: types::Filesize,
    ) -> FsResult<types::Filesize> {
        self.charge(buf.len() as u64)?;
        self.inner.write(fd, buf, offset).await
    }

    async fn read_directory(
        &mut self,
        fd: Resource<types::Descriptor>,
    ) -> FsResult<Resource<types::DirectoryEntryStream>> {
        self.inner.read_directory(fd).await
    }

    async fn sync(&mut self, fd: Resource<types::Descriptor>) -> FsResult<()> {
        self.inner.sync(fd).await
    }

    async fn create_directory_at(
        &mut self,
        fd: Resource<types::Descriptor>,
        path: String,
    ) -> FsResult<()> {
        self.inner.create_directory_at(fd, path).await?;
        self.charge(ENTRY_BYTES)
    }

    async fn stat(&mut self, fd: Resource<types::Descriptor>) -> FsResult<types::DescriptorStat> {
        self.inner.stat(fd).await
    }

    async fn stat_at(
        &mut self,
        fd: Resource<types::Descriptor>,
        path_flags: types::PathFlags,
        path: String,
    ) -> FsResult<types::DescriptorStat> {
        self.inner.stat_at(fd, path_flags, path).await
    }

    async fn set_times_at(
        &mut self,
        fd: Resource<types::Descriptor>,
        path_flags: types::PathFlags,
        path: String,
        atim: types::NewTimestamp,
        mtim: types::NewTimestamp,
    ) -> FsResult<()> {
        self.inner
            .set_times_at(fd, path_flags, path, atim, mtim)
            .await
    }

    async fn link_at(
        &mut self,
        fd: Resource<types::Descriptor>,
        old_path_flags: types::PathFlags,
        old_path: String,
        new_descriptor: Resource<types::Descriptor>,
        new_path: String,
    ) -> FsResult<()> {
        self.inner
            .link_at(fd, old_path_flags, old_path, new_descriptor, new_path)
            .await?;
        self.charge(ENTRY_BYTES)
    }

    async fn open_at(
        &mut self,
        fd: Resource<types::Descriptor>,
        path_flags: types::PathFlags,
        path: String,
        oflags: types::OpenFlags,
        flags: types::DescriptorFlags,
    ) -> FsResult<Resource<types::Descriptor>> {
        if !self.limits.open.admits_one_more() {
            self.limits.stop.trip(LimitHit::Files);
            return Err(QuotaExceeded::trap("open files"));
        }
        // Only a new entry costs: opening an existing file with `create` (what
        // `std::fs::write` does) is free.
        let creates = oflags.contains(types::OpenFlags::CREATE)
            && match self
                .inner
                .stat_at(again(&fd), path_flags, path.clone())
                .await
            {
                Ok(_) => false,
                Err(e) => matches!(e.downcast_ref(), Some(ErrorCode::NoEntry)),
            };
        let opened = self
            .inner
            .open_at(fd, path_flags, path, oflags, flags)
            .await?;
        match self.inner.table.get(&opened)? {
            Descriptor::File(f) => self.limits.open.track(&f.file),
            Descriptor::Dir(d) => self.limits.open.track(&d.dir),
        }
        if creates {
            self.charge(ENTRY_BYTES)?;
        }
        Ok(opened)
    }

    fn drop(&mut self, fd: Resource<types::Descriptor>) -> wasmtime::Result<()> {
        HostDescriptor::drop(&mut self.inner, fd)
    }

    async fn readlink_at(
        &mut self,
        fd: Resource<types::Descriptor>,
        path: String,
    ) -> FsResult<String> {
        self.inner.readlink_at(fd, path).await
    }

    async fn remove_directory_at(
        &mut self,
        fd: Resource<types::Descriptor>,
        path: String,
    ) -> FsResult<()> {
        self.inner.remove_directory_at(fd, path).await
    }

    async fn rename_at(
        &mut self,
        fd: Resource<types::Descriptor>,
        old_path: String,
        new_fd: Resource<types::Descriptor>,
        new_path: String,
    ) -> FsResult<()> {
        self.inner.rename_at(fd, old_path, new_fd, new_path).await
    }

    async fn symlink_at(
        &mut self,
        fd: Resource<types::Descriptor>,
        src_path: String,
        dest_path: String,
    ) -> FsResult<()> {
        self.inner.symlink_at(fd, src_path, dest_path).await?;
        self.charge(ENTRY_BYTES)
    }

    async fn unlink_file_at(
        &mut self,
        fd: Resource<types::Descriptor>,
        path: String,
    ) -> FsResult<()> {
        self.inner.unlink_file_at(fd, path).await
    }

    fn read_via_stream(
        &mut self,
        fd: Resource<types::Descriptor>,
        offset: types::Filesize,
    ) -> FsResult<Resource<wasmtime_wasi_io::streams::DynInputStream>> {
        self.inner.read_via_stream(fd, offset)
    }

    fn write_via_stream(
        &mut self,
        fd: Resource<types::Descriptor>,
        offset: types::Filesize,
    ) -> FsResult<Resource<DynOutputStream>> {
        let stream = self.inner.write_via_stream(fd, offset)?;
        self.count_stream(stream)
    }

    fn append_via_stream(
        &mut self,
        fd: Resource<types::Descriptor>,
    ) -> FsResult<Resource<DynOutputStream>> {
        let stream = self.inner.append_via_stream(fd)?;
        self.count_stream(stream)
    }

    async fn is_same_object(
        &mut self,
        a: Resource<types::Descriptor>,
        b: Resource<types::Descriptor>,
    ) -> wasmtime::Result<bool> {
        self.inner.is_same_object(a, b).await
    }

    async fn metadata_hash(
        &mut self,
        fd: Resource<types::Descriptor>,
    ) -> FsResult<types::MetadataHashValue> {
        self.inner.metadata_hash(fd).await
    }

    async fn metadata_hash_at(
        &mut self,
        fd: Resource<types::Descriptor>,
        path_flags: types::PathFlags,
        path: String,
    ) -> FsResult<types::MetadataHashValue> {
        self.inner.metadata_hash_at(fd, path_flags, path).await
    }
}

impl HostDirectoryEntryStream for CountedFsView<'_> {
    async fn read_directory_entry(
        &mut self,
        stream: Resource<types::DirectoryEntryStream>,
    ) -> FsResult<Option<types::DirectoryEntry>> {
        self.inner.read_directory_entry(stream).await
    }

    fn drop(&mut self, stream: Resource<types::DirectoryEntryStream>) -> wasmtime::Result<()> {
        HostDirectoryEntryStream::drop(&mut self.inner, stream)
    }
}

/// A file stream that counts every byte written through it against the call's quota.
/// Only `write` (and `write-zeroes`) add bytes; the blocking and splice helpers of
/// `wasi:io` are built on them.
struct CountingStream {
    inner: DynOutputStream,
    quota: Arc<TmpQuota>,
}

impl CountingStream {
    fn charge(&self, bytes: usize) -> StreamResult<()> {
        self.quota
            .charge(bytes as u64)
            .map_err(|_| StreamError::trap("/tmp cap reached"))
    }
}

#[async_trait::async_trait]
impl Pollable for CountingStream {
    async fn ready(&mut self) {
        self.inner.ready().await
    }
}

#[async_trait::async_trait]
impl OutputStream for CountingStream {
    fn write(&mut self, bytes: Bytes) -> StreamResult<()> {
        self.charge(bytes.len())?;
        self.inner.write(bytes)
    }

    fn flush(&mut self) -> StreamResult<()> {
        self.inner.flush()
    }

    fn check_write(&mut self) -> StreamResult<usize> {
        self.inner.check_write()
    }

    fn write_zeroes(&mut self, nelem: usize) -> StreamResult<()> {
        self.charge(nelem)?;
        self.inner.write_zeroes(nelem)
    }

    async fn cancel(&mut self) {
        self.inner.cancel().await
    }
}

/// Removes `root` and everything below it without following symlinks, holding at most
/// two directory descriptors at a time and without recursion: a guest may leave a chain
/// of directories far deeper than `PATH_MAX` or than any stack, and the cleanup must not
/// take the operator's descriptors or its stack with it.
#[cfg(unix)]
pub fn remove_tree(root: &std::path::Path) -> std::io::Result<()> {
    use std::ffi::{CStr, CString};
    use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
    use std::os::unix::ffi::OsStrExt;

    fn check(r: libc::c_int) -> std::io::Result<libc::c_int> {
        if r < 0 {
            Err(std::io::Error::last_os_error())
        } else {
            Ok(r)
        }
    }
    fn open_dir(at: libc::c_int, name: &CStr) -> std::io::Result<OwnedFd> {
        let fd = check(unsafe {
            libc::openat(
                at,
                name.as_ptr(),
                libc::O_RDONLY | libc::O_DIRECTORY | libc::O_NOFOLLOW | libc::O_CLOEXEC,
            )
        })?;
        // SAFETY: `fd` was just opened and is owned by nothing else.
        Ok(unsafe { OwnedFd::from_raw_fd(fd) })
    }
    /// Up to `BATCH` entries of `dir` (not `.`/`..`), with whether each is a directory.
    fn entries(dir: &OwnedFd) -> std::io::Result<Vec<(CString, bool)>> {
        const BATCH: usize = 512;
        let dup = check(unsafe { libc::fcntl(dir.as_raw_fd(), libc::F_DUPFD_CLOEXEC, 0) })?;
        // SAFETY: `dup` is a fresh descriptor; the stream owns it from here on.
        let stream = unsafe { libc::fdopendir(dup) };
        if stream.is_null() {
            let e = std::io::Error::last_os_error();
            unsafe { libc::close(dup) };
            return Err(e);
        }
        unsafe { libc::rewinddir(stream) };
        let mut out = Vec::new();
        while out.len() < BATCH {
            let ent = unsafe { libc::readdir(stream) };
            if ent.is_null() {
                break;
            }
            // SAFETY: readdir returned a valid entry, alive until the next readdir.
            let (name, ty) = unsafe { (CStr::from_ptr((*ent).d_name.as_ptr()), (*ent).d_type) };
            if name.to_bytes() == b"." || name.to_bytes() == b".." {
                continue;
            }
            let is_dir = match ty {
                libc::DT_DIR => true,
                libc::DT_UNKNOWN => {
                    let mut st: libc::stat = unsafe { std::mem::zeroed() };
                    let r = unsafe {
                        libc::fstatat(
                            dir.as_raw_fd(),
                            name.as_ptr(),
                            &mut st,
                            libc::AT_SYMLINK_NOFOLLOW,
                        )
                    };
                    r == 0 && (st.st_mode & libc::S_IFMT) == libc::S_IFDIR
                }
                _ => false,
            };
            out.push((name.to_owned(), is_dir));
        }
        unsafe { libc::closedir(stream) };
        Ok(out)
    }

    let root_c = CString::new(root.as_os_str().as_bytes())?;
    let mut cur = open_dir(libc::AT_FDCWD, &root_c)?;
    // Names from the root down to `cur`.
    let mut path: Vec<CString> = Vec::new();
    loop {
        let batch = entries(&cur)?;
        let mut descend = None;
        for (name, is_dir) in &batch {
            if *is_dir {
                descend.get_or_insert_with(|| name.clone());
            } else {
                check(unsafe { libc::unlinkat(cur.as_raw_fd(), name.as_ptr(), 0) })?;
            }
        }
        if let Some(name) = descend {
            let child = open_dir(cur.as_raw_fd(), &name)?;
            path.push(name);
            cur = child;
            continue;
        }
        if !batch.is_empty() {
            // A full batch of files: there may be more.
            continue;
        }
        // `cur` is empty: remove it from its parent and go up.
        let Some(name) = path.pop() else { break };
        let parent = open_dir(cur.as_raw_fd(), c"..")?;
        check(unsafe { libc::unlinkat(parent.as_raw_fd(), name.as_ptr(), libc::AT_REMOVEDIR) })?;
        cur = parent;
    }
    drop(cur);
    std::fs::remove_dir(root)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quota_counts_every_byte_and_trips_once_past_the_cap() {
        let stop = Arc::new(Tripwire::default());
        let q = TmpQuota::new(10_000, stop.clone());
        assert_eq!(q.charge(ENTRY_BYTES), Ok(()));
        assert_eq!(q.charge(5_000), Ok(()));
        assert_eq!(stop.hit(), None);
        // The same bytes again (an overwrite, an unlinked file) count again.
        assert_eq!(q.charge(5_000), Err(QuotaExceeded));
        assert_eq!(stop.hit(), Some(LimitHit::Tmp));
        assert_eq!(q.used(), ENTRY_BYTES + 10_000);
    }

    #[test]
    fn a_zero_cap_refuses_the_first_byte_but_not_nothing() {
        let stop = Arc::new(Tripwire::default());
        let q = TmpQuota::new(0, stop.clone());
        assert_eq!(q.charge(0), Ok(()));
        assert_eq!(q.charge(1), Err(QuotaExceeded));
    }

    #[test]
    fn the_first_limit_to_trip_is_the_one_reported() {
        let stop = Arc::new(Tripwire::default());
        let q = TmpQuota::new(0, stop.clone());
        stop.trip(LimitHit::Files);
        assert_eq!(q.charge(1), Err(QuotaExceeded));
        assert_eq!(stop.hit(), Some(LimitHit::Files));
    }

    #[test]
    fn open_files_count_while_anything_holds_them() {
        let dir = tempfile::tempdir().unwrap();
        let mut open = OpenFiles::new(2);
        let a = Arc::new(std::fs::File::create(dir.path().join("a")).unwrap());
        let b = Arc::new(std::fs::File::create(dir.path().join("b")).unwrap());
        open.track(&a);
        assert!(open.admits_one_more());
        open.track(&b);
        assert!(!open.admits_one_more());
        // A stream still holding `a` keeps it counted after its descriptor is dropped.
        let stream = a.clone();
        drop(a);
        assert!(!open.admits_one_more());
        drop(stream);
        assert_eq!(open.count(), 1);
        assert!(open.admits_one_more());
    }

    #[test]
    fn remove_tree_removes_a_chain_deeper_than_path_max_with_few_descriptors() {
        let scratch = tempfile::tempdir().unwrap();
        let root = scratch.path().join("call");
        std::fs::create_dir(&root).unwrap();
        // 200 levels of 100-byte names: 20 KB of path, five times PATH_MAX.
        let name = "d".repeat(100);
        let mut cur = std::fs::File::open(&root).unwrap();
        {
            use std::os::fd::AsRawFd;
            for i in 0..200 {
                let c = std::ffi::CString::new(name.clone()).unwrap();
                assert_eq!(
                    unsafe { libc::mkdirat(cur.as_raw_fd(), c.as_ptr(), 0o700) },
                    0
                );
                let fd = unsafe {
                    libc::openat(
                        cur.as_raw_fd(),
                        c.as_ptr(),
                        libc::O_RDONLY | libc::O_DIRECTORY,
                    )
                };
                assert!(fd >= 0);
                let f = c"f";
                let ffd =
                    unsafe { libc::openat(fd, f.as_ptr(), libc::O_CREAT | libc::O_WRONLY, 0o600) };
                assert!(ffd >= 0);
                unsafe { libc::close(ffd) };
                if i % 50 == 0 {
                    let s = c"link";
                    unsafe { libc::symlinkat(c"/etc".as_ptr(), fd, s.as_ptr()) };
                }
                cur = unsafe { std::os::fd::FromRawFd::from_raw_fd(fd) };
            }
        }
        drop(cur);
        // Plus a wide directory with more entries than one batch.
        let wide = root.join("wide");
        std::fs::create_dir(&wide).unwrap();
        for i in 0..1500 {
            std::fs::write(wide.join(i.to_string()), b"x").unwrap();
        }
        // (The descriptor bound holds by construction, two at a time; a count of the
        // process's descriptors here would race with the other tests of this binary.)
        remove_tree(&root).unwrap();
        assert!(!root.exists());
        // The symlink was removed, not followed.
        assert!(std::path::Path::new("/etc").exists());
    }
}
