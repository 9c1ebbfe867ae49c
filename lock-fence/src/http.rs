//! Fencing for HTTP services: a `tower` layer that refuses a request whose
//! `Fencing-Token` is below the last token it accepted for the request's
//! resource (409 Conflict, with the current token in the response's
//! `Fencing-Token` header), and the client side that sets the header.
//!
//! The resource is the request's `Fencing-Resource` header, or else its
//! path. Requests without a `Fencing-Token` pass unchecked unless the layer
//! is built with [`FencingLayer::require_token`] (then 428 Precondition
//! Required). A token that is not a number is 400.
//!
//! A checked request holds its resource's turn until the inner service's
//! response future ends, so the check and the handler's write are one step
//! for every other fenced request to that resource: a lower token that
//! arrived first cannot land after a higher one. The last tokens live in
//! this process: a service with several instances needs its store's own
//! fence ([`crate::sql`], [`crate::redis`]) instead.

use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex, PoisonError};
use std::task::{Context, Poll};

use http::{HeaderName, HeaderValue, Request, Response, StatusCode};
use lock_core::FencingToken;
use tower_layer::Layer;
use tower_service::Service;

/// The request header carrying the writer's token (and the response
/// header carrying the current one on a 409).
pub const TOKEN_HEADER: HeaderName = HeaderName::from_static("fencing-token");
/// The request header naming the resource (the path when absent).
pub const RESOURCE_HEADER: HeaderName = HeaderName::from_static("fencing-resource");

/// The header pair a client sends for a write under `token` to
/// `resource` (`None`: the request's path is the resource).
pub fn headers(token: FencingToken, resource: Option<&str>) -> Vec<(HeaderName, HeaderValue)> {
    let mut out = vec![(TOKEN_HEADER, HeaderValue::from(token.get()))];
    if let Some(value) = resource.and_then(|r| HeaderValue::from_str(r).ok()) {
        out.push((RESOURCE_HEADER, value));
    }
    out
}

/// Sets the fencing headers on a request being built.
pub trait FencedRequest {
    /// Adds `Fencing-Token: token` (and `Fencing-Resource` when given).
    #[must_use]
    fn fencing(self, token: FencingToken, resource: Option<&str>) -> Self;
}

impl FencedRequest for http::request::Builder {
    fn fencing(mut self, token: FencingToken, resource: Option<&str>) -> Self {
        for (name, value) in headers(token, resource) {
            self = self.header(name, value);
        }
        self
    }
}

type Turn = Arc<tokio::sync::Mutex<Option<u64>>>;

#[derive(Default)]
struct Fences {
    last: Mutex<HashMap<String, Turn>>,
}

impl Fences {
    fn turn(&self, resource: &str) -> Turn {
        let mut last = self.last.lock().unwrap_or_else(PoisonError::into_inner);
        last.entry(resource.to_owned()).or_default().clone()
    }
}

/// The layer: one table of last tokens shared by every service it makes.
#[derive(Clone, Default)]
pub struct FencingLayer {
    fences: Arc<Fences>,
    require: bool,
}

impl std::fmt::Debug for FencingLayer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FencingLayer")
            .field("require", &self.require)
            .finish_non_exhaustive()
    }
}

impl FencingLayer {
    /// A layer that checks requests carrying a token.
    pub fn new() -> Self {
        Self::default()
    }

    /// Refuses requests without a token (428).
    #[must_use]
    pub fn require_token(mut self) -> Self {
        self.require = true;
        self
    }

    /// The last token accepted for `resource`.
    pub async fn current(&self, resource: &str) -> Option<u64> {
        *self.fences.turn(resource).lock().await
    }
}

impl<S> Layer<S> for FencingLayer {
    type Service = Fencing<S>;

    fn layer(&self, inner: S) -> Fencing<S> {
        Fencing {
            inner,
            layer: self.clone(),
        }
    }
}

/// The service [`FencingLayer`] makes.
#[derive(Clone, Debug)]
pub struct Fencing<S> {
    inner: S,
    layer: FencingLayer,
}

fn refusal<B: From<String>>(status: StatusCode, current: Option<u64>, text: String) -> Response<B> {
    let mut response = Response::new(B::from(text));
    *response.status_mut() = status;
    if let Some(current) = current {
        response
            .headers_mut()
            .insert(TOKEN_HEADER, HeaderValue::from(current));
    }
    response
}

impl<S, ReqBody, ResBody> Service<Request<ReqBody>> for Fencing<S>
where
    S: Service<Request<ReqBody>, Response = Response<ResBody>> + Clone + Send + 'static,
    S::Future: Send,
    ReqBody: Send + 'static,
    ResBody: From<String> + Send + 'static,
{
    type Response = Response<ResBody>;
    type Error = S::Error;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, Self::Error>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: Request<ReqBody>) -> Self::Future {
        // The service that was polled ready serves this request; its clone
        // waits for the next one.
        let clone = self.inner.clone();
        let mut inner = std::mem::replace(&mut self.inner, clone);
        let token = match request.headers().get(TOKEN_HEADER) {
            None if self.layer.require => {
                return Box::pin(async {
                    Ok(refusal(
                        StatusCode::PRECONDITION_REQUIRED,
                        None,
                        "a Fencing-Token header is required".into(),
                    ))
                });
            }
            None => return Box::pin(inner.call(request)),
            Some(value) => match value
                .to_str()
                .ok()
                .and_then(|v| v.trim().parse::<u64>().ok())
            {
                Some(token) => token,
                None => {
                    return Box::pin(async {
                        Ok(refusal(
                            StatusCode::BAD_REQUEST,
                            None,
                            "the Fencing-Token header is not a number".into(),
                        ))
                    });
                }
            },
        };
        let resource = request
            .headers()
            .get(RESOURCE_HEADER)
            .and_then(|v| v.to_str().ok())
            .map_or_else(|| request.uri().path().to_owned(), str::to_owned);
        let turn = self.layer.fences.turn(&resource);
        Box::pin(async move {
            let mut last = turn.lock().await;
            if let Some(current) = last.filter(|c| token < *c) {
                return Ok(refusal(
                    StatusCode::CONFLICT,
                    Some(current),
                    format!(
                        "stale fencing token {token} for {resource:?}: token {current} was accepted"
                    ),
                ));
            }
            *last = Some(token);
            // The turn is held until the handler's write is done.
            inner.call(request).await
        })
    }
}
