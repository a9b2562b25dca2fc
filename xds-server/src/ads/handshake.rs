//! The start of an HTTP/2 connection, bounded in time: the client's connection preface and
//! the header of its first frame (which must be SETTINGS) are read before hyper gets the
//! connection, within the listener's handshake timeout, then replayed to hyper
//! ([`Prefaced`]). hyper has no handshake timeout of its own: without this, a TCP
//! connection that never sends anything is held until its maximum age.

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, ReadBuf};

/// What every HTTP/2 client sends first (RFC 9113 §3.4).
const PREFACE: &[u8; 24] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
/// The preface and the 9-byte header of the client's first frame.
const HEAD: usize = PREFACE.len() + 9;
/// The type of a SETTINGS frame, the one a client must send right after the preface.
const SETTINGS: u8 = 0x4;

/// Why a connection is not HTTP/2.
#[derive(Debug, thiserror::Error)]
pub(crate) enum PrefaceError {
    #[error("the connection ended before the HTTP/2 preface: {0}")]
    Io(#[from] io::Error),
    #[error("the connection does not start with the HTTP/2 preface and SETTINGS")]
    NotHttp2,
}

/// Reads the preface and the first frame's header from `io` (the caller bounds the time).
pub(crate) async fn read_preface<Io: AsyncRead + Unpin>(
    mut io: Io,
) -> Result<Prefaced<Io>, PrefaceError> {
    let mut head = [0u8; HEAD];
    io.read_exact(&mut head).await?;
    if head[..PREFACE.len()] != PREFACE[..] || head[PREFACE.len() + 3] != SETTINGS {
        return Err(PrefaceError::NotHttp2);
    }
    Ok(Prefaced {
        head,
        replayed: 0,
        io,
    })
}

/// A connection whose first bytes were read already: they are read again first.
#[derive(Debug)]
pub(crate) struct Prefaced<Io> {
    head: [u8; HEAD],
    replayed: usize,
    io: Io,
}

impl<Io: AsyncRead + Unpin> AsyncRead for Prefaced<Io> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        if self.replayed < HEAD {
            let rest = &self.head[self.replayed..];
            let n = rest.len().min(buf.remaining());
            buf.put_slice(&rest[..n]);
            self.replayed += n;
            return Poll::Ready(Ok(()));
        }
        Pin::new(&mut self.io).poll_read(cx, buf)
    }
}

impl<Io: AsyncWrite + Unpin> AsyncWrite for Prefaced<Io> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.io).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.io).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::AsyncWriteExt;

    #[tokio::test]
    async fn the_preface_is_checked_and_replayed() {
        let (mut client, server) = tokio::io::duplex(1024);
        let mut sent = PREFACE.to_vec();
        sent.extend_from_slice(&[0, 0, 0, SETTINGS, 0, 0, 0, 0, 0]);
        sent.extend_from_slice(b"more");
        client.write_all(&sent).await.unwrap();
        let mut prefaced = read_preface(server).await.expect("HTTP/2");
        let mut read = vec![0u8; sent.len()];
        prefaced.read_exact(&mut read).await.unwrap();
        assert_eq!(read, sent);

        let (mut client, server) = tokio::io::duplex(1024);
        client
            .write_all(b"GET / HTTP/1.1\r\nHost: example.com\r\nAccept: */*\r\n\r\n")
            .await
            .unwrap();
        assert!(matches!(
            read_preface(server).await,
            Err(PrefaceError::NotHttp2)
        ));
        let (client, server) = tokio::io::duplex(1024);
        drop(client);
        assert!(matches!(
            read_preface(server).await,
            Err(PrefaceError::Io(_))
        ));
    }
}
