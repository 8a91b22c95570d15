//! Request extractors whose rejections are problem+json like every other error.

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{FromRequest, FromRequestParts, Query, Request};
use axum::http::request::Parts;
use axum::http::uri::PathAndQuery;
use payments_domain::TenantId;
use payments_idempotency::IdempotencyKey;
use payments_idempotency_axum::{
    self as adapter, BodyRejection, JsonBody, KeyRejection, PreferWait,
};
use serde::de::DeserializeOwned;

use crate::admission::Admitted;
use crate::auth::{OperatorName, Principal, authenticate};
use crate::{ApiError, AppState};

/// The tenant authenticated by `Authorization: Bearer <api key>`; an operator key is refused
/// (403).
#[derive(Debug, Clone)]
pub(crate) struct Tenant(pub TenantId);

impl FromRequestParts<AppState> for Tenant {
    type Rejection = ApiError;

    async fn from_request_parts(
        parts: &mut Parts,
        state: &AppState,
    ) -> Result<Self, Self::Rejection> {
        match principal(parts, state)? {
            Principal::Tenant(tenant) => Ok(Self(tenant)),
            Principal::Operator(_) => Err(ApiError::Forbidden(
                "This endpoint takes a tenant's API key; an operator key cannot use it.",
            )),
        }
    }
}

/// The operator authenticated by `Authorization: Bearer <operator key>`; a tenant's key is
/// refused (403).
#[derive(Debug, Clone)]
pub(crate) struct Operator(pub OperatorName);

impl FromRequestParts<AppState> for Operator {
    type Rejection = ApiError;

    async fn from_request_parts(
        parts: &mut Parts,
        state: &AppState,
    ) -> Result<Self, Self::Rejection> {
        match principal(parts, state)? {
            Principal::Operator(name) => Ok(Self(name)),
            Principal::Tenant(_) => Err(ApiError::Forbidden(
                "This endpoint takes an operator key (auth.operator_keys); a tenant's API key \
                 cannot use it.",
            )),
        }
    }
}

/// Whom the request's key authenticates: admission authenticated it already, before its body
/// was read, and left the answer in the extensions.
fn principal(parts: &Parts, state: &AppState) -> Result<Principal, ApiError> {
    if let Some(principal) = parts.extensions.get::<Principal>() {
        return Ok(principal.clone());
    }
    authenticate(&parts.headers, &state.api_keys).inspect_err(|_| {
        // The key itself is never logged.
        tracing::info!("authentication failed");
    })
}

/// The validated `Idempotency-Key` header (the adapter's), which may not hold a card number.
#[derive(Debug, Clone)]
pub(crate) struct IdempotencyKeyHeader(pub IdempotencyKey);

impl<S: Send + Sync> FromRequestParts<S> for IdempotencyKeyHeader {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, Self::Rejection> {
        let adapter::IdempotencyKeyHeader(key) =
            adapter::IdempotencyKeyHeader::from_request_parts(parts, state)
                .await
                .map_err(|rejection| match rejection {
                    KeyRejection::Missing => ApiError::IdempotencyKeyMissing,
                    KeyRejection::Invalid(reason) => ApiError::IdempotencyKeyInvalid(reason),
                })?;
        // A key is stored with its record, named in the replay cache and logged: a card number
        // used as one (an order's card, say) would sit in all three for the retention.
        if payments_domain::contains_card_number(key.as_str()) {
            return Err(ApiError::CardNumberNotAllowed {
                field: "Idempotency-Key",
                reason: "looks like a card number; use a random value such as a UUID".into(),
            });
        }
        Ok(Self(key))
    }
}

/// A JSON request body as raw bytes, after checking its media type and size (the adapter's
/// `JsonBody`, its refusals as this service's errors). Parsing is left
/// to the handler, which needs both the typed request and the canonical form.
#[derive(Debug)]
pub(crate) struct JsonBytes(pub Bytes);

impl FromRequest<AppState> for JsonBytes {
    type Rejection = ApiError;

    async fn from_request(request: Request, state: &AppState) -> Result<Self, Self::Rejection> {
        let limit = state.limits.body_limit_bytes;
        let JsonBody(bytes) =
            JsonBody::from_request(request, state)
                .await
                .map_err(|rejection| {
                    match rejection {
                    BodyRejection::NotJson => ApiError::UnsupportedMediaType,
                    BodyRejection::TooLarge => ApiError::PayloadTooLarge { limit },
                    BodyRejection::Unreadable(rejection) if caused_by_body_timeout(&rejection) => {
                        ApiError::RequestTimeout
                    }
                    BodyRejection::HoldsNul => ApiError::InvalidRequest(
                        "The request body holds a NUL character (\\u0000), which no field may hold."
                            .into(),
                    ),
                    BodyRejection::Unreadable(_) => {
                        ApiError::InvalidRequest("The request body could not be read.".into())
                    }
                }
                })?;
        Ok(Self(bytes))
    }
}

/// Whether reading the body failed because the client was too slow (the body timeout layer).
fn caused_by_body_timeout(rejection: &BytesRejection) -> bool {
    let mut source: Option<&(dyn std::error::Error + 'static)> = Some(rejection);
    while let Some(error) = source {
        if error.is::<tower_http::timeout::TimeoutError>() {
            return true;
        }
        source = error.source();
    }
    false
}

/// What the headers of every idempotent `POST` carry, checked in this order: the tenant, its
/// `Idempotency-Key`, and how long it would wait for a duplicate in flight.
#[derive(Debug, Clone)]
pub(crate) struct IdempotentCall {
    pub tenant: TenantId,
    pub key: IdempotencyKey,
    /// The path and query the request was sent to, part of the request as sent.
    pub target: PathAndQuery,
    pub wait: Option<std::time::Duration>,
    pub admitted: Option<Admitted>,
}

impl FromRequestParts<AppState> for IdempotentCall {
    type Rejection = ApiError;

    async fn from_request_parts(
        parts: &mut Parts,
        state: &AppState,
    ) -> Result<Self, Self::Rejection> {
        let Tenant(tenant) = Tenant::from_request_parts(parts, state).await?;
        let IdempotencyKeyHeader(key) =
            IdempotencyKeyHeader::from_request_parts(parts, state).await?;
        let Ok(PreferWait(wait)) = PreferWait::from_request_parts(parts, state).await;
        Ok(Self {
            tenant,
            key,
            target: target(parts),
            wait,
            admitted: parts.extensions.get::<Admitted>().cloned(),
        })
    }
}

/// What the headers of an operator's idempotent `POST` carry: the operator, its
/// `Idempotency-Key`, and how long it would wait for a duplicate in flight. An operator's keys
/// are its own, as a tenant's are.
#[derive(Debug, Clone)]
pub(crate) struct OperatorCall {
    pub operator: OperatorName,
    pub key: IdempotencyKey,
    /// The path and query the request was sent to, part of the request as sent.
    pub target: PathAndQuery,
    pub wait: Option<std::time::Duration>,
    pub admitted: Option<Admitted>,
}

impl FromRequestParts<AppState> for OperatorCall {
    type Rejection = ApiError;

    async fn from_request_parts(
        parts: &mut Parts,
        state: &AppState,
    ) -> Result<Self, Self::Rejection> {
        let Operator(operator) = Operator::from_request_parts(parts, state).await?;
        let IdempotencyKeyHeader(key) =
            IdempotencyKeyHeader::from_request_parts(parts, state).await?;
        let Ok(PreferWait(wait)) = PreferWait::from_request_parts(parts, state).await;
        Ok(Self {
            operator,
            key,
            target: target(parts),
            wait,
            admitted: parts.extensions.get::<Admitted>().cloned(),
        })
    }
}

/// Whose keys an idempotent call is under (a tenant's or an operator's), the key, and the
/// wait: what the engine runs it with; and the in-flight slots its attempt holds until it ends.
#[derive(Debug, Clone)]
pub(crate) struct KeyedCall {
    pub owner: String,
    pub key: IdempotencyKey,
    pub target: PathAndQuery,
    pub wait: Option<std::time::Duration>,
    pub admitted: Option<Admitted>,
}

impl From<IdempotentCall> for KeyedCall {
    fn from(call: IdempotentCall) -> Self {
        Self {
            owner: call.tenant.as_str().to_owned(),
            key: call.key,
            target: call.target,
            wait: call.wait,
            admitted: call.admitted,
        }
    }
}

impl From<OperatorCall> for KeyedCall {
    fn from(call: OperatorCall) -> Self {
        Self {
            owner: call.operator.as_str().to_owned(),
            key: call.key,
            target: call.target,
            wait: call.wait,
            admitted: call.admitted,
        }
    }
}

/// The path and query of the request `parts` are of.
fn target(parts: &Parts) -> PathAndQuery {
    parts
        .uri
        .path_and_query()
        .cloned()
        .unwrap_or_else(|| PathAndQuery::from_static("/"))
}

/// A query string parsed into `T`, rejected as a problem+json 400.
#[derive(Debug)]
pub(crate) struct ApiQuery<T>(pub T);

impl<T: DeserializeOwned, S: Send + Sync> FromRequestParts<S> for ApiQuery<T> {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, Self::Rejection> {
        Query::<T>::from_request_parts(parts, state)
            .await
            .map(|Query(value)| Self(value))
            .map_err(|e| {
                ApiError::InvalidRequest(format!("Invalid query string: {}", e.body_text()))
            })
    }
}
