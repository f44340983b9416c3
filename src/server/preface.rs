//! A deadline on a connection's first bytes.
//!
//! hyper's `header_read_timeout` starts once a connection is known to be HTTP/1. Before
//! that, while hyper-util's auto builder reads the first bytes to tell HTTP/1 from the
//! HTTP/2 preface, no timer runs: a client that connects and sends nothing (or sends `P` and
//! stops) would hold its connection forever. [`PrefaceDeadline`] closes that gap: the first
//! [`PREFACE_LEN`] bytes must arrive before the deadline, after which it is a plain stream.
//! It also counts the bytes the client sends, for the shedding rules of `connection.rs`.

use std::{
    io,
    pin::Pin,
    task::{Context, Poll},
    time::Duration,
};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::time::Sleep;

use super::connection::Activity;

/// Length of the HTTP/2 connection preface, all that version detection reads.
const PREFACE_LEN: usize = 24;

/// A stream whose first [`PREFACE_LEN`] bytes must arrive within a deadline.
pub(crate) struct PrefaceDeadline<S> {
    inner: S,
    /// Where the bytes read are counted.
    activity: std::sync::Arc<Activity>,
    /// Bytes still expected before the deadline is lifted.
    remaining: usize,
    /// Armed at accept; dropped once the first bytes are in.
    deadline: Option<Pin<Box<Sleep>>>,
}

impl<S> PrefaceDeadline<S> {
    pub(crate) fn new(inner: S, timeout: Duration, activity: std::sync::Arc<Activity>) -> Self {
        Self {
            inner,
            activity,
            remaining: PREFACE_LEN,
            deadline: Some(Box::pin(tokio::time::sleep(timeout))),
        }
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for PrefaceDeadline<S> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let before = buf.filled().len();
        match Pin::new(&mut this.inner).poll_read(cx, buf) {
            Poll::Ready(Ok(())) => {
                let read = buf.filled().len() - before;
                this.activity.read(read);
                this.remaining = this.remaining.saturating_sub(read);
                if this.remaining == 0 {
                    this.deadline = None;
                }
                Poll::Ready(Ok(()))
            }
            Poll::Ready(Err(error)) => Poll::Ready(Err(error)),
            Poll::Pending => match this.deadline.as_mut().map(|d| d.as_mut().poll(cx)) {
                Some(Poll::Ready(())) => Poll::Ready(Err(io::Error::new(
                    io::ErrorKind::TimedOut,
                    "client did not send its request in time",
                ))),
                _ => Poll::Pending,
            },
        }
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for PrefaceDeadline<S> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().inner).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().inner).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_shutdown(cx)
    }
}
