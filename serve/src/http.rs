//! The HTTP edge: a bounded accept loop on a loopback-or-given address, hyper connections,
//! the route table, and the one place where a [`ServeError`] becomes vLLM's error response.
//!
//! A request meets, in order: body collection (size-limited) → the route's handler → the
//! error mapping. Streams are bodies fed by a channel: the handler's task writes SSE frames
//! into it, and when the client goes away the channel closes, the task ends, and the model
//! worker drops the sequence.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::Bytes;
use http::{header, Method, Request, Response, StatusCode};
use http_body::{Body, Frame};
use http_body_util::{BodyExt, Limited};
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto;
use serde_json::{json, Value};
use tokio::net::TcpListener;
use tokio::sync::{mpsc, watch, Semaphore};

use super::app::App;
use super::error::ServeError;
use super::{admin, chat, completions};

/// Largest request body accepted (long agent conversations with tool schemas fit easily).
const MAX_BODY_BYTES: usize = 32 * 1024 * 1024;
/// Connections served at once; further ones wait in the accept queue.
const MAX_CONNECTIONS: usize = 1024;
/// SSE frames buffered per stream before the producer waits for the client.
const STREAM_BUFFER: usize = 64;

/// A response body: a whole buffer, or SSE frames as a task produces them.
pub enum ServeBody {
    Full(Option<Bytes>),
    Stream(mpsc::Receiver<Bytes>),
}

impl Body for ServeBody {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        match self.get_mut() {
            ServeBody::Full(bytes) => Poll::Ready(bytes.take().map(|b| Ok(Frame::data(b)))),
            ServeBody::Stream(frames) => {
                frames.poll_recv(cx).map(|f| f.map(|b| Ok(Frame::data(b))))
            }
        }
    }
}

pub type Reply = Result<Response<ServeBody>, ServeError>;

pub fn json_response(status: StatusCode, value: &Value) -> Response<ServeBody> {
    let mut response = Response::new(ServeBody::Full(Some(Bytes::from(value.to_string()))));
    *response.status_mut() = status;
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        header::HeaderValue::from_static("application/json"),
    );
    response
}

pub fn text_response(status: StatusCode, text: String) -> Response<ServeBody> {
    let mut response = Response::new(ServeBody::Full(Some(Bytes::from(text))));
    *response.status_mut() = status;
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        header::HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    response
}

/// A channel for SSE frames and the streaming response that sends them.
pub fn sse_response() -> (SseSender, Response<ServeBody>) {
    let (tx, rx) = mpsc::channel(STREAM_BUFFER);
    let mut response = Response::new(ServeBody::Stream(rx));
    let headers = response.headers_mut();
    headers.insert(
        header::CONTENT_TYPE,
        header::HeaderValue::from_static("text/event-stream; charset=utf-8"),
    );
    headers.insert(
        header::CACHE_CONTROL,
        header::HeaderValue::from_static("no-cache"),
    );
    (SseSender(tx), response)
}

/// The producer side of a stream.
pub struct SseSender(mpsc::Sender<Bytes>);

impl SseSender {
    /// Sends `data: {json}`; false once the client has gone.
    pub async fn data(&self, value: &Value) -> bool {
        let frame = format!("data: {value}\n\n");
        self.0.send(Bytes::from(frame)).await.is_ok()
    }

    pub async fn done(&self) {
        let _ = self.0.send(Bytes::from_static(b"data: [DONE]\n\n")).await;
    }
}

/// A server accepting on its listener until stopped.
pub struct Listening {
    pub addr: SocketAddr,
    stop: watch::Sender<bool>,
    task: Option<tokio::task::JoinHandle<()>>,
}

impl Listening {
    /// Stops accepting and closes open connections.
    pub fn stop(&self) {
        let _ = self.stop.send(true);
    }

    /// Waits until the accept loop has ended.
    pub async fn finished(mut self) {
        if let Some(task) = self.task.take() {
            let _ = task.await;
        }
    }
}

impl Drop for Listening {
    fn drop(&mut self) {
        let _ = self.stop.send(true);
    }
}

/// Binds `addr` and serves `app` on it.
pub async fn listen(app: Arc<App>, addr: SocketAddr) -> Result<Listening, ServeError> {
    let bind_error = |source| ServeError::Bind { addr, source };
    let listener = TcpListener::bind(addr).await.map_err(bind_error)?;
    let addr = listener.local_addr().map_err(bind_error)?;
    let (stop, stopped) = watch::channel(false);
    let task = tokio::spawn(accept_loop(app, listener, stopped));
    Ok(Listening {
        addr,
        stop,
        task: Some(task),
    })
}

async fn accept_loop(app: Arc<App>, listener: TcpListener, mut stopped: watch::Receiver<bool>) {
    let permits = Arc::new(Semaphore::new(MAX_CONNECTIONS));
    loop {
        let permit = tokio::select! {
            permit = Arc::clone(&permits).acquire_owned() => match permit {
                Ok(permit) => permit,
                Err(_) => return,
            },
            _ = stopped.changed() => return,
        };
        let stream = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => stream,
                // A connection that failed during accept is that client's problem.
                Err(_) => continue,
            },
            _ = stopped.changed() => return,
        };
        let _ = stream.set_nodelay(true);
        let app = Arc::clone(&app);
        let mut stopped = stopped.clone();
        tokio::spawn(async move {
            let service = service_fn(move |request| {
                let app = Arc::clone(&app);
                async move { Ok::<_, Infallible>(route(app, request).await) }
            });
            let builder = auto::Builder::new(TokioExecutor::new());
            let connection = builder.serve_connection(TokioIo::new(stream), service);
            tokio::select! {
                _ = connection => {},
                _ = stopped.changed() => {},
            }
            drop(permit);
        });
    }
}

async fn route(app: Arc<App>, request: Request<Incoming>) -> Response<ServeBody> {
    let (parts, body) = request.into_parts();
    let path = parts.uri.path().to_owned();
    let body = match Limited::new(body, MAX_BODY_BYTES).collect().await {
        Ok(collected) => collected.to_bytes(),
        Err(e) => {
            let error = ServeError::BadRequest(format!("cannot read the request body: {e}"));
            return json_response(error.status(), &error.body());
        }
    };
    let reply = match (&parts.method, path.as_str()) {
        (&Method::GET, "/health") => Ok(text_response(StatusCode::OK, String::new())),
        (&Method::GET, "/v1/models") => admin::models(&app).await,
        (&Method::POST, "/v1/chat/completions") => chat::handle(app, &body).await,
        (&Method::POST, "/v1/completions") => completions::handle(app, &body).await,
        (&Method::POST, "/v1/load_lora_adapter") => admin::load_adapter(&app, &body).await,
        (&Method::POST, "/v1/unload_lora_adapter") => admin::unload_adapter(&app, &body).await,
        (&Method::POST, "/update_weights_from_disk") => admin::update_weights(&app, &body).await,
        // FastAPI's answer to an unknown route, as vLLM and SGLang give it.
        _ => Ok(json_response(
            StatusCode::NOT_FOUND,
            &json!({"detail": "Not Found"}),
        )),
    };
    reply.unwrap_or_else(|error| json_response(error.status(), &error.body()))
}
