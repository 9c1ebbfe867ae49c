//! A service behind the fencing layer: a write carrying a token below the
//! last one accepted for its resource gets 409 and the current token.
//! Runs with no server (the service is called in-process):
//!
//!     cargo run -p lock-fence --example fenced_http

use std::convert::Infallible;

use lock_fence::FencingToken;
use lock_fence::http::{FencedRequest, FencingLayer, TOKEN_HEADER};
use tower::{ServiceBuilder, ServiceExt};

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let handler = tower::service_fn(|req: http::Request<String>| async move {
        println!("handler writes {:?}", req.body());
        Ok::<_, Infallible>(http::Response::new(String::new()))
    });
    let service = ServiceBuilder::new()
        .layer(FencingLayer::new())
        .service(handler);

    for token in [5, 9, 4] {
        // What a client holding the lock sends (`guard.token()` in practice).
        let request = http::Request::builder()
            .method("PUT")
            .uri("/accounts/42")
            .fencing(FencingToken::new(token), None)
            .body(format!("balance from token {token}"))?;
        let response = service.clone().oneshot(request).await?;
        println!(
            "token {token}: {} {}",
            response.status(),
            response
                .headers()
                .get(TOKEN_HEADER)
                .map(|v| format!("(current token {})", v.to_str().unwrap_or("?")))
                .unwrap_or_default()
        );
    }
    Ok(())
}
