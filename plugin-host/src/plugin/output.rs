//! Capture of a guest's stdout and stderr.
//!
//! Nothing a guest prints reaches the operator's own stdout: it is buffered per call up to
//! a cap (further bytes are counted and dropped, never an error the guest could trip over),
//! then scrubbed and logged line by line when the call ends.

use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use tokio::io::AsyncWrite;
use wasmtime_wasi::cli::{IsTerminal, StdoutStream};

#[derive(Default)]
struct Inner {
    bytes: Vec<u8>,
    dropped: u64,
}

/// A capped, shared buffer usable as a guest's stdout or stderr.
#[derive(Clone)]
pub struct CapturedOutput {
    inner: Arc<Mutex<Inner>>,
    cap: usize,
}

impl CapturedOutput {
    pub fn new(cap: usize) -> Self {
        CapturedOutput {
            inner: Arc::default(),
            cap,
        }
    }

    /// The bytes kept and how many were dropped past the cap.
    pub fn take(&self) -> (Vec<u8>, u64) {
        let mut inner = self.inner.lock().unwrap();
        (
            std::mem::take(&mut inner.bytes),
            std::mem::take(&mut inner.dropped),
        )
    }

    /// The last `max` bytes kept, without taking them.
    pub fn tail(&self, max: usize) -> Vec<u8> {
        let inner = self.inner.lock().unwrap();
        inner.bytes[inner.bytes.len().saturating_sub(max)..].to_vec()
    }

    fn push(&self, buf: &[u8]) {
        let mut inner = self.inner.lock().unwrap();
        let room = self.cap.saturating_sub(inner.bytes.len());
        let keep = room.min(buf.len());
        inner.bytes.extend_from_slice(&buf[..keep]);
        inner.dropped += (buf.len() - keep) as u64;
    }
}

impl IsTerminal for CapturedOutput {
    fn is_terminal(&self) -> bool {
        false
    }
}

impl StdoutStream for CapturedOutput {
    fn async_stream(&self) -> Box<dyn AsyncWrite + Send + Sync> {
        Box::new(self.clone())
    }

    /// Synchronous, unlike the default adapter (which writes from a background task): a
    /// guest that panics right after printing must still have its last words captured
    /// when the trap is reported.
    fn p2_stream(&self) -> Box<dyn wasmtime_wasi::p2::OutputStream> {
        Box::new(self.clone())
    }
}

#[wasmtime_wasi::async_trait]
impl wasmtime_wasi::p2::Pollable for CapturedOutput {
    async fn ready(&mut self) {}
}

#[wasmtime_wasi::async_trait]
impl wasmtime_wasi::p2::OutputStream for CapturedOutput {
    fn write(&mut self, bytes: bytes::Bytes) -> wasmtime_wasi::p2::StreamResult<()> {
        self.push(&bytes);
        Ok(())
    }

    fn flush(&mut self) -> wasmtime_wasi::p2::StreamResult<()> {
        Ok(())
    }

    fn check_write(&mut self) -> wasmtime_wasi::p2::StreamResult<usize> {
        Ok(64 * 1024)
    }
}

impl AsyncWrite for CapturedOutput {
    fn poll_write(
        self: Pin<&mut Self>,
        _: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        self.push(buf);
        Poll::Ready(Ok(buf.len()))
    }

    fn poll_flush(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Poll::Ready(Ok(()))
    }

    fn poll_shutdown(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Poll::Ready(Ok(()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keeps_up_to_cap_and_counts_the_rest() {
        let out = CapturedOutput::new(5);
        out.push(b"abc");
        out.push(b"defgh");
        assert_eq!(out.take(), (b"abcde".to_vec(), 3));
        assert_eq!(out.take(), (Vec::new(), 0));
    }
}
