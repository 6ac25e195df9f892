//! The `GET /metrics` endpoint both agents and the controller serve to Prometheus: each scrape
//! rendered on a blocking thread, one at a time (a scrape that waits past a scraper's usual
//! time-out is answered busy instead of piling up).

use std::{sync::Arc, time::Duration};

use tokio::{
    io::{AsyncReadExt as _, AsyncWriteExt as _},
    net::TcpListener,
};
use tracing::debug;

/// How long a scrape waits for the ones before it (then: 503).
pub const SCRAPE_WAIT: Duration = Duration::from_secs(5);

/// The content type of an OpenMetrics text exposition.
pub const OPENMETRICS: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// Serves `GET /metrics` on `listener` with what `render` returns.
pub fn serve(
    listener: TcpListener,
    render: Arc<dyn Fn() -> String + Send + Sync>,
) -> tokio::task::JoinHandle<()> {
    let one_at_a_time = Arc::new(tokio::sync::Semaphore::new(1));
    tokio::spawn(async move {
        loop {
            let Ok((mut stream, peer)) = listener.accept().await else {
                continue;
            };
            let render = Arc::clone(&render);
            let one_at_a_time = Arc::clone(&one_at_a_time);
            tokio::spawn(async move {
                let mut request = [0u8; 1024];
                let n =
                    match tokio::time::timeout(Duration::from_secs(5), stream.read(&mut request))
                        .await
                    {
                        Ok(Ok(n)) => n,
                        _ => return,
                    };
                let line = String::from_utf8_lossy(&request[..n]);
                let (status, body, kind) = if line.starts_with("GET /metrics ") {
                    let Ok(Ok(_turn)) =
                        tokio::time::timeout(SCRAPE_WAIT, one_at_a_time.acquire()).await
                    else {
                        let busy = "HTTP/1.1 503 Service Unavailable\r\nContent-Length: 0\r\nConnection: close\r\n\r\n";
                        let _ = stream.write_all(busy.as_bytes()).await;
                        return;
                    };
                    let Ok(body) = tokio::task::spawn_blocking(move || render()).await else {
                        return;
                    };
                    ("200 OK", body, OPENMETRICS)
                } else {
                    (
                        "404 Not Found",
                        "try GET /metrics\n".to_owned(),
                        "text/plain",
                    )
                };
                let response = format!(
                    "HTTP/1.1 {status}\r\nContent-Type: {kind}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                    body.len()
                );
                if let Err(err) = stream.write_all(response.as_bytes()).await {
                    debug!(%peer, %err, "metrics client went away");
                }
            });
        }
    })
}
