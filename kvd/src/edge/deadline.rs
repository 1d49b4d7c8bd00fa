//! The write deadline (`--write-timeout`): a peer that reads none of its replies for that
//! long loses its connection.
//!
//! A client that pipelines requests and never reads fills the socket's send buffer; the
//! connection then waits in a write, where the idle timeout (which waits for requests) never
//! looks, and holds its slot and its buffers for ever (the probe held every slot with 100
//! such clients). [`DeadlineWriter`] wraps a connection's write half: while a write makes no
//! progress, a timer runs; any progress stops it; when it fires, the write fails with
//! `TimedOut` and the connection ends, counted as `conns_write_timeout`. The timer is only
//! made when a write would block, so a peer that keeps up costs nothing.

use std::future::Future;
use std::io::IoSlice;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use kvshared::stats::Counter;
use tokio::io::AsyncWrite;
use tokio::time::Sleep;

use crate::counters::Counters;

/// A write half whose writes fail once they have made no progress for a while.
pub(crate) struct DeadlineWriter<W> {
    inner: W,
    limit: Duration,
    /// Runs while writes are blocked.
    stalled: Option<Pin<Box<Sleep>>>,
    /// Where the closing is counted, and under which connection.
    counters: Arc<Counters>,
    id: u64,
    tripped: bool,
}

impl<W> DeadlineWriter<W> {
    /// `inner`, whose writes may block for at most `limit` without progress.
    pub fn new(inner: W, limit: Duration, counters: Arc<Counters>, id: u64) -> DeadlineWriter<W> {
        DeadlineWriter {
            inner,
            limit,
            stalled: None,
            counters,
            id,
            tripped: false,
        }
    }

    /// Whether the deadline has ended the connection.
    #[cfg(test)]
    pub fn tripped(&self) -> bool {
        self.tripped
    }
}

impl<W: AsyncWrite + Unpin> DeadlineWriter<W> {
    /// Runs one poll of the inner writer under the deadline.
    fn guard<T>(
        &mut self,
        cx: &mut Context<'_>,
        poll: impl FnOnce(Pin<&mut W>, &mut Context<'_>) -> Poll<std::io::Result<T>>,
    ) -> Poll<std::io::Result<T>> {
        if self.tripped {
            return Poll::Ready(Err(self.timed_out()));
        }
        match poll(Pin::new(&mut self.inner), cx) {
            Poll::Ready(result) => {
                self.stalled = None;
                Poll::Ready(result)
            }
            Poll::Pending => {
                let limit = self.limit;
                let timer = self.stalled.get_or_insert_with(|| Box::pin(tokio::time::sleep(limit)));
                match timer.as_mut().poll(cx) {
                    Poll::Pending => Poll::Pending,
                    Poll::Ready(()) => {
                        self.tripped = true;
                        self.counters.add(self.id, Counter::ConnsWriteTimeout, 1);
                        Poll::Ready(Err(self.timed_out()))
                    }
                }
            }
        }
    }

    fn timed_out(&self) -> std::io::Error {
        std::io::Error::new(
            std::io::ErrorKind::TimedOut,
            format!(
                "the peer read none of its replies for {:?} (--write-timeout)",
                self.limit
            ),
        )
    }
}

impl<W: AsyncWrite + Unpin> AsyncWrite for DeadlineWriter<W> {
    fn poll_write(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<std::io::Result<usize>> {
        self.get_mut().guard(cx, |w, cx| w.poll_write(cx, buf))
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        self.get_mut().guard(cx, |w, cx| w.poll_write_vectored(cx, bufs))
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        self.get_mut().guard(cx, |w, cx| w.poll_flush(cx))
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        self.get_mut().guard(cx, |w, cx| w.poll_shutdown(cx))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::AsyncWriteExt;

    /// A writer into a pipe nobody reads times out after the limit, and is counted; one
    /// whose reader keeps up never does.
    #[tokio::test(start_paused = true)]
    async fn a_write_that_makes_no_progress_fails_after_the_limit() {
        let counters = Arc::new(Counters::default());
        let (a, _b) = tokio::io::duplex(1024);
        let mut w = DeadlineWriter::new(a, Duration::from_secs(2), counters.clone(), 0);
        let err = w.write_all(&[0u8; 4096]).await.unwrap_err();
        assert_eq!(err.kind(), std::io::ErrorKind::TimedOut);
        assert!(w.tripped());
        assert_eq!(counters.totals().conns_write_timeout, 1);

        let (a, mut b) = tokio::io::duplex(1024);
        let mut w = DeadlineWriter::new(a, Duration::from_secs(2), counters.clone(), 0);
        let reader = tokio::spawn(async move {
            let mut sink = vec![0u8; 64 << 10];
            let mut got = 0;
            while got < 64 << 10 {
                tokio::time::sleep(Duration::from_millis(500)).await;
                got += tokio::io::AsyncReadExt::read(&mut b, &mut sink).await.unwrap();
            }
        });
        w.write_all(&vec![0u8; 64 << 10]).await.unwrap();
        drop(w);
        reader.await.unwrap();
        assert_eq!(counters.totals().conns_write_timeout, 1);
    }
}
