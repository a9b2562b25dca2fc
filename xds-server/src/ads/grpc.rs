//! gRPC framing of the two ADS methods over hyper's HTTP/2, in place of tonic's codec on
//! the response path.
//!
//! tonic copies every response into a per-stream buffer that keeps the capacity of the
//! largest message the stream ever sent. Here a response is a chain of [`Bytes`] chunks
//! ([`Encoded`]) that hyper hands to h2 as they are, so the bytes shared by many streams
//! are never copied per stream. [`AdsBody`] is the response body: it asks the stream for
//! its next message only when hyper polls it, which hyper does only when h2 has send
//! capacity for the stream — so a stream's responses are computed as fast as its socket
//! drains, never ahead of it ([`Outbox::wanted`]). The request side ([`RequestStream`])
//! decodes messages from hyper's body chunks without keeping a buffer sized to the
//! largest request (a SotW ACK repeats every subscribed name).
//!
//! Status codes, `grpc-message` and trailers are tonic's: errors before the stream starts
//! are trailers-only responses ([`tonic::Status::into_http`]), errors after it are
//! trailers ([`tonic::Status::add_header`]).

use std::collections::VecDeque;
use std::future::poll_fn;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, Waker};

use bytes::{Buf, Bytes, BytesMut};
use hyper::body::{Body, Frame, Incoming, SizeHint};
use hyper::header::{CONTENT_TYPE, HeaderValue};
use hyper::{HeaderMap, Response};
use serde::Serialize;
use tokio::sync::Notify;
use tonic::Status;

use super::request::RequestMessage;
use super::wire::{Encoded, GRPC_PREFIX};
use crate::metrics;

/// `StreamAggregatedResources` (SotW).
pub const SOTW_PATH: &str =
    "/envoy.service.discovery.v3.AggregatedDiscoveryService/StreamAggregatedResources";
/// `DeltaAggregatedResources`.
pub const DELTA_PATH: &str =
    "/envoy.service.discovery.v3.AggregatedDiscoveryService/DeltaAggregatedResources";

/// Largest request accepted (tonic's default).
pub const MAX_REQUEST_BYTES: usize = 4 * 1024 * 1024;

/// Bytes a stream's responses occupy on their way to the socket, for the admin pages
/// and the backpressure tests.
#[derive(Debug, Default)]
pub struct StreamMeter {
    /// Handed to the body and not yet taken by hyper.
    queued: AtomicU64,
    /// Taken by hyper (so in h2's buffers or on the wire).
    sent: AtomicU64,
    /// Responses handed to the body.
    messages: AtomicU64,
}

impl StreamMeter {
    pub fn queued_bytes(&self) -> u64 {
        self.queued.load(Ordering::Relaxed)
    }

    pub fn sent_bytes(&self) -> u64 {
        self.sent.load(Ordering::Relaxed)
    }

    pub fn messages(&self) -> u64 {
        self.messages.load(Ordering::Relaxed)
    }
}

impl Serialize for StreamMeter {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeStruct;
        let mut s = serializer.serialize_struct("StreamMeter", 3)?;
        s.serialize_field("responses", &self.messages())?;
        s.serialize_field("sent_bytes", &self.sent_bytes())?;
        s.serialize_field("queued_bytes", &self.queued_bytes())?;
        s.end()
    }
}

/// What a stream and its body share: at most one message, and who is still there. A
/// mutex and two notifiers rather than a channel: a stream holds one of these for its
/// whole life, so its size is paid per stream.
#[derive(Debug, Default)]
struct Slot {
    state: Mutex<SlotState>,
    /// Body → stream: it has nothing in hand and wants the next message.
    demand: Notify,
    /// Body → stream: the body is gone.
    body_gone: Notify,
}

#[derive(Debug, Default)]
struct SlotState {
    message: Option<Encoded>,
    body_waker: Option<Waker>,
    /// The stream dropped its outbox: the body ends after the message in the slot.
    stream_done: bool,
    /// The status the body ends with (OK when unset).
    ending: Option<Status>,
    body_dropped: bool,
}

impl Slot {
    fn lock(&self) -> std::sync::MutexGuard<'_, SlotState> {
        // Each critical section is a few field updates: a poisoned slot is still valid.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// The stream's side of its response body.
#[derive(Debug)]
pub struct Outbox {
    slot: Arc<Slot>,
    meter: Arc<StreamMeter>,
}

/// The response body of one ADS stream: the messages its stream hands over, then the
/// trailers. An empty body (trailers-only responses) ends at once.
#[derive(Debug)]
pub struct AdsBody {
    stream: Option<BodyStream>,
}

#[derive(Debug)]
struct BodyStream {
    slot: Arc<Slot>,
    meter: Arc<StreamMeter>,
    current: Option<Encoded>,
    done: bool,
}

/// A body and the outbox that feeds it.
pub fn response_channel() -> (AdsBody, Outbox) {
    let slot = Arc::new(Slot::default());
    let meter = Arc::new(StreamMeter::default());
    let body = AdsBody {
        stream: Some(BodyStream {
            slot: slot.clone(),
            meter: meter.clone(),
            current: None,
            done: false,
        }),
    };
    (body, Outbox { slot, meter })
}

impl Outbox {
    /// Completes when the body wants the next message: hyper polled it with nothing in
    /// hand, so h2 has room for this stream. Cancel-safe.
    pub async fn wanted(&self) {
        self.slot.demand.notified().await
    }

    /// Hands a message to the body. `false` when the body is gone or still holds one —
    /// then nothing was handed over (call it only after [`Outbox::wanted`]).
    pub fn try_send(&self, message: Encoded) -> bool {
        let len = message.len() as u64;
        let waker = {
            let mut state = self.slot.lock();
            if state.message.is_some() || state.body_dropped {
                return false;
            }
            state.message = Some(message);
            state.body_waker.take()
        };
        self.meter.queued.fetch_add(len, Ordering::Relaxed);
        self.meter.messages.fetch_add(1, Ordering::Relaxed);
        metrics::QUEUED_BYTES.add(len as i64);
        if let Some(waker) = waker {
            waker.wake();
        }
        true
    }

    /// Whether the body has room for a message now.
    pub fn has_room(&self) -> bool {
        self.slot.lock().message.is_none()
    }

    /// Ends the response with `status` (after the message in hand, if any) once the
    /// outbox is dropped.
    pub fn end(&self, status: Status) {
        self.slot.lock().ending.get_or_insert(status);
    }

    /// Completes when the body is gone (the client reset the stream or the connection
    /// closed). Cancel-safe.
    pub async fn closed(&self) {
        loop {
            let notified = self.slot.body_gone.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            if self.slot.lock().body_dropped {
                return;
            }
            notified.await;
        }
    }

    pub fn meter(&self) -> &Arc<StreamMeter> {
        &self.meter
    }
}

impl Drop for Outbox {
    fn drop(&mut self) {
        let waker = {
            let mut state = self.slot.lock();
            state.stream_done = true;
            state.body_waker.take()
        };
        if let Some(waker) = waker {
            waker.wake();
        }
    }
}

impl AdsBody {
    /// A body with no data: the response ends with its headers.
    pub fn empty() -> Self {
        AdsBody { stream: None }
    }
}

impl Body for AdsBody {
    type Data = Bytes;
    type Error = std::convert::Infallible;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        let Some(stream) = self.stream.as_mut() else {
            return Poll::Ready(None);
        };
        if stream.done {
            return Poll::Ready(None);
        }
        loop {
            if let Some(message) = stream.current.as_mut() {
                if let Some(chunk) = message.next_chunk() {
                    let len = chunk.len() as u64;
                    stream.meter.queued.fetch_sub(len, Ordering::Relaxed);
                    stream.meter.sent.fetch_add(len, Ordering::Relaxed);
                    metrics::QUEUED_BYTES.sub(len as i64);
                    return Poll::Ready(Some(Ok(Frame::data(chunk))));
                }
                stream.current = None;
            }
            let mut state = stream.slot.lock();
            if let Some(message) = state.message.take() {
                drop(state);
                stream.current = Some(message);
                continue;
            }
            if state.stream_done {
                // The stream is over: its status goes in the trailers.
                let status = state.ending.take().unwrap_or_else(|| Status::ok(""));
                drop(state);
                stream.done = true;
                return Poll::Ready(Some(Ok(Frame::trailers(trailers(&status)))));
            }
            // Nothing in hand: this is when the stream may compute its next response.
            state.body_waker = Some(cx.waker().clone());
            drop(state);
            stream.slot.demand.notify_one();
            return Poll::Pending;
        }
    }

    fn is_end_stream(&self) -> bool {
        self.stream.as_ref().is_none_or(|s| s.done)
    }

    fn size_hint(&self) -> SizeHint {
        SizeHint::default()
    }
}

impl Drop for BodyStream {
    fn drop(&mut self) {
        // What was never sent leaves the queued-bytes gauge with the body.
        let left = self.meter.queued.swap(0, Ordering::Relaxed);
        metrics::QUEUED_BYTES.sub(left as i64);
        let unsent = {
            let mut state = self.slot.lock();
            state.body_dropped = true;
            state.body_waker = None;
            state.message.take()
        };
        drop(unsent);
        self.slot.body_gone.notify_waiters();
    }
}

fn trailers(status: &Status) -> HeaderMap {
    let mut map = HeaderMap::new();
    if status.add_header(&mut map).is_err() {
        map.insert(Status::GRPC_STATUS, HeaderValue::from_static("13"));
    }
    map
}

/// The headers of a gRPC response whose messages follow in `body`.
pub fn streaming_response(body: AdsBody) -> Response<AdsBody> {
    let mut response = Response::new(body);
    response
        .headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static("application/grpc"));
    response
}

/// A trailers-only response: the call failed before any message.
pub fn status_response(status: Status) -> Response<AdsBody> {
    status.into_http()
}

impl Default for AdsBody {
    fn default() -> Self {
        AdsBody::empty()
    }
}

/// The messages of a request stream, decoded from hyper's body chunks. Holds only the
/// chunks of the message being received; a message split across chunks is copied into a
/// buffer of its own size that is dropped once decoded.
#[derive(Debug)]
pub struct RequestStream<T> {
    body: Incoming,
    chunks: VecDeque<Bytes>,
    buffered: usize,
    ended: bool,
    _message: std::marker::PhantomData<fn() -> T>,
}

impl<T: RequestMessage> RequestStream<T> {
    pub fn new(body: Incoming) -> Self {
        RequestStream {
            body,
            chunks: VecDeque::new(),
            buffered: 0,
            ended: false,
            _message: std::marker::PhantomData,
        }
    }

    /// The next message; `Ok(None)` when the client ended the stream. Cancel-safe: what
    /// was received stays in `self`.
    pub async fn message(&mut self) -> Result<Option<T>, Status> {
        loop {
            if let Some(message) = self.decode()? {
                return Ok(Some(message));
            }
            if self.ended {
                return if self.buffered == 0 {
                    Ok(None)
                } else {
                    Err(Status::internal(
                        "the request stream ended inside a message",
                    ))
                };
            }
            let frame = poll_fn(|cx| Pin::new(&mut self.body).poll_frame(cx)).await;
            match frame {
                None => self.ended = true,
                Some(Err(e)) => return Err(Status::from_error(Box::new(e))),
                Some(Ok(frame)) => {
                    if let Ok(data) = frame.into_data()
                        && !data.is_empty()
                    {
                        self.buffered += data.len();
                        self.chunks.push_back(data);
                    }
                }
            }
        }
    }

    /// Decodes one message if all of it has arrived.
    fn decode(&mut self) -> Result<Option<T>, Status> {
        if self.buffered < GRPC_PREFIX {
            return Ok(None);
        }
        let mut prefix = [0u8; GRPC_PREFIX];
        self.peek(&mut prefix);
        match prefix[0] {
            0 => {}
            1 => {
                return Err(Status::internal(
                    "protocol error: received message with compressed-flag but no grpc-encoding was specified",
                ));
            }
            f => {
                return Err(Status::internal(format!(
                    "protocol error: received message with invalid compression flag: {f} (valid flags are 0 and 1), while sending request"
                )));
            }
        }
        let len = u32::from_be_bytes([prefix[1], prefix[2], prefix[3], prefix[4]]) as usize;
        if len > MAX_REQUEST_BYTES {
            return Err(Status::out_of_range(format!(
                "Error, decoded message length too large: found {len} bytes, the limit is: {MAX_REQUEST_BYTES} bytes"
            )));
        }
        if self.buffered < GRPC_PREFIX + len {
            return Ok(None);
        }
        self.advance(GRPC_PREFIX);
        let message = match self.chunks.front() {
            // All of it in one chunk: decode in place.
            Some(front) if front.len() >= len => {
                let decoded = T::decode(front.slice(..len));
                self.advance(len);
                decoded
            }
            _ => {
                let mut whole = BytesMut::with_capacity(len);
                while whole.len() < len {
                    let Some(front) = self.chunks.front_mut() else {
                        break;
                    };
                    let take = (len - whole.len()).min(front.len());
                    whole.extend_from_slice(&front[..take]);
                    front.advance(take);
                    self.buffered -= take;
                    if front.is_empty() {
                        self.chunks.pop_front();
                    }
                }
                T::decode(whole.freeze())
            }
        };
        message
            .map(Some)
            .map_err(|e| Status::internal(e.to_string()))
    }

    fn peek(&self, out: &mut [u8]) {
        let mut filled = 0;
        for chunk in &self.chunks {
            let take = (out.len() - filled).min(chunk.len());
            out[filled..filled + take].copy_from_slice(&chunk[..take]);
            filled += take;
            if filled == out.len() {
                break;
            }
        }
    }

    fn advance(&mut self, mut n: usize) {
        self.buffered -= n;
        while n > 0 {
            let Some(front) = self.chunks.front_mut() else {
                return;
            };
            let take = n.min(front.len());
            front.advance(take);
            n -= take;
            if front.is_empty() {
                self.chunks.pop_front();
            }
        }
    }
}
