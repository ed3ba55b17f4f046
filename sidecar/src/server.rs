//! The agent-facing listener: a bounded accept loop serving HTTP/1.1 and h2c on every
//! connection, and graceful shutdown.
//!
//! On shutdown the listener closes first (new connections are refused), idle keep-alive
//! connections are closed, and in-flight requests — streams included — get `shutdown_grace` to
//! finish. Forwarding tasks whose client already left are waited for within the same deadline,
//! because their completion is what gets recorded.

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;

use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use hyper_util::server::graceful::GracefulShutdown;
use hyper_util::service::TowerToHyperService;
use tokio::net::TcpListener;
use tokio::sync::Semaphore;
use tokio::time::Instant;

use crate::app::{self, App};

/// Connections held open at once; past this the accept loop waits for one to close.
const MAX_CONNECTIONS: usize = 16_384;

#[derive(Debug, thiserror::Error)]
pub enum ServerError {
    #[error("could not listen on {addr}: {source}")]
    Bind {
        addr: SocketAddr,
        #[source]
        source: std::io::Error,
    },
}

pub async fn bind(addr: SocketAddr) -> Result<TcpListener, ServerError> {
    TcpListener::bind(addr)
        .await
        .map_err(|source| ServerError::Bind { addr, source })
}

/// Serves `listener` until `shutdown` resolves, then drains.
pub async fn serve(listener: TcpListener, app: Arc<App>, shutdown: impl Future<Output = ()>) {
    let stack = app::build(Arc::clone(&app));
    let mut builder = auto::Builder::new(TokioExecutor::new());
    builder
        .http1()
        .timer(TokioTimer::new())
        .header_read_timeout(app.config.timeouts.header_read)
        .keep_alive(true);
    builder.http2().timer(TokioTimer::new());
    let graceful = GracefulShutdown::new();
    let permits = Arc::new(Semaphore::new(MAX_CONNECTIONS));
    tokio::pin!(shutdown);

    loop {
        let permit = tokio::select! {
            permit = Arc::clone(&permits).acquire_owned() => match permit {
                Ok(permit) => permit,
                Err(_) => break,
            },
            () = &mut shutdown => break,
        };
        let (stream, peer) = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(accepted) => accepted,
                Err(e) => {
                    // Usually EMFILE: back off instead of spinning.
                    tracing::warn!(error = %e, "accept failed");
                    tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                    continue;
                }
            },
            () = &mut shutdown => break,
        };
        let _ = stream.set_nodelay(true);
        let service = TowerToHyperService::new(stack.clone());
        let connection = builder
            .serve_connection(TokioIo::new(stream), service)
            .into_owned();
        let connection = graceful.watch(connection);
        tokio::spawn(async move {
            if let Err(e) = connection.await {
                tracing::debug!(%peer, error = %e, "connection ended with an error");
            }
            drop(permit);
        });
    }

    drop(listener);
    let grace = app.config.timeouts.shutdown_grace;
    let deadline = Instant::now() + grace;
    tracing::info!(?grace, "shutting down: draining in-flight requests");
    if tokio::time::timeout_at(deadline, graceful.shutdown())
        .await
        .is_err()
    {
        tracing::warn!("shutdown grace ran out with connections still open");
    }
    app.tasks.close();
    if tokio::time::timeout_at(deadline, app.tasks.wait())
        .await
        .is_err()
    {
        tracing::warn!(
            tasks = app.tasks.len(),
            "shutdown grace ran out with upstream responses still being read"
        );
    }
    app.close().await;
    tracing::info!("shutdown complete");
}
