//! Admission: how fast each tenant may send requests, and how many run at once, for the whole
//! instance and for each tenant.
//!
//! Each tenant has a token bucket (`auth.rate_limit_per_sec`, `auth.rate_limit_burst`),
//! checked first, so a tenant over its rate takes no slot at all. One in-flight limit covers
//! every route and method, so slow requests on one route cannot leave the others unbounded;
//! within it, each tenant may hold only its share, so one tenant's slow requests (a stalled
//! body, a slow card) cannot take every slot from the others. A request is admitted or refused
//! at once: queueing would only hold connections until their clients give up and retry. All of
//! it runs before the handler, so a refused request stores nothing and consumes no key. An
//! operator key (`auth.operator_keys`) has a bucket and a share of its own, like a tenant.

use std::collections::HashMap;
use std::num::NonZeroU32;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use axum::extract::{Request, State};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use crate::auth::{Principal, authenticate};
use crate::{ApiError, ApiKeys};

/// The in-flight slots of one instance.
#[derive(Debug, Clone)]
struct InFlight {
    service: Arc<Semaphore>,
    /// One share per configured tenant and operator: they come from the configuration, never
    /// from a request, so this map cannot grow.
    tenants: Arc<HashMap<Principal, Arc<Semaphore>>>,
}

impl InFlight {
    fn new(max: usize, per_tenant: usize, tenants: impl IntoIterator<Item = Principal>) -> Self {
        let tenants = tenants
            .into_iter()
            .map(|tenant| (tenant, Arc::new(Semaphore::new(per_tenant))))
            .collect();
        Self {
            service: Arc::new(Semaphore::new(max)),
            tenants: Arc::new(tenants),
        }
    }

    /// The slots `tenant` (if the request authenticated as one) must hold to run now: its
    /// own share first, so a tenant over it takes nothing from the others.
    fn admit(&self, tenant: Option<&Principal>) -> Result<Admitted, ApiError> {
        let share = match tenant.and_then(|tenant| self.tenants.get(tenant)) {
            Some(share) => Some(
                Arc::clone(share)
                    .try_acquire_owned()
                    .map_err(|_| ApiError::TenantInFlightLimit)?,
            ),
            None => None,
        };
        let service = Arc::clone(&self.service)
            .try_acquire_owned()
            .map_err(|_| ApiError::Overloaded)?;
        crate::metrics::request_admitted();
        Ok(Admitted {
            _slots: Arc::new(Slots {
                _service: service,
                _share: share,
            }),
        })
    }
}

/// A tenant's rate on one instance: `per_sec` requests a second, sustained, and `burst` at once
/// after a quiet spell.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TenantRate {
    per_sec: NonZeroU32,
    burst: NonZeroU32,
}

/// Which rate setting is zero.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ZeroRate {
    PerSec,
    Burst,
}

impl ZeroRate {
    /// The setting that names it.
    pub(crate) fn key(self) -> &'static str {
        match self {
            Self::PerSec => "auth.rate_limit_per_sec",
            Self::Burst => "auth.rate_limit_burst",
        }
    }
}

impl TenantRate {
    pub(crate) fn new(per_sec: u32, burst: u32) -> Result<Self, ZeroRate> {
        Ok(Self {
            per_sec: NonZeroU32::new(per_sec).ok_or(ZeroRate::PerSec)?,
            burst: NonZeroU32::new(burst).ok_or(ZeroRate::Burst)?,
        })
    }
}

/// One tenant's token bucket: full (`burst` tokens) at first, one token a request, refilled
/// at the rate. Under a plain mutex: the critical section is a few arithmetic operations.
#[derive(Debug)]
struct Bucket {
    rate: TenantRate,
    state: Mutex<Tokens>,
}

#[derive(Debug)]
struct Tokens {
    left: f64,
    counted_at: Instant,
}

impl Bucket {
    fn new(rate: TenantRate, now: Instant) -> Self {
        Self {
            rate,
            state: Mutex::new(Tokens {
                left: f64::from(rate.burst.get()),
                counted_at: now,
            }),
        }
    }

    /// Takes a token at `now`, or says how many whole seconds until one is there.
    fn take(&self, now: Instant) -> Result<(), ApiError> {
        let per_sec = f64::from(self.rate.per_sec.get());
        let mut tokens = self
            .state
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        let refilled = now
            .saturating_duration_since(tokens.counted_at)
            .as_secs_f64()
            * per_sec;
        tokens.left = (tokens.left + refilled).min(f64::from(self.rate.burst.get()));
        tokens.counted_at = now;
        if tokens.left >= 1.0 {
            tokens.left -= 1.0;
            return Ok(());
        }
        let wait = (1.0 - tokens.left) / per_sec;
        // Whole seconds, rounded up: a client that waits as told finds a token.
        Err(ApiError::RateLimited {
            retry_after_secs: wait.ceil().max(1.0) as u64,
        })
    }
}

/// Request limits.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    pub body_limit_bytes: usize,
    /// How long a client may take to send its body.
    pub body_timeout: std::time::Duration,
    /// Requests one instance handles at once, over all routes, before shedding load.
    pub max_in_flight: usize,
    /// The most of those one tenant may hold.
    pub max_in_flight_per_tenant: usize,
    /// Total bytes of request header names and values accepted.
    pub header_limit_bytes: usize,
    /// The longest a whole request may take.
    pub request_timeout: std::time::Duration,
    /// Each tenant's token bucket on this instance.
    pub tenant_rate: TenantRate,
}

/// What admission needs: the keys to authenticate with, the tenants' buckets and the instance's
/// slots. Only these (cheap `Arc` clones), not the whole application state, are cloned for
/// every request.
#[derive(Debug, Clone)]
pub(crate) struct Admission {
    api_keys: ApiKeys,
    /// One bucket per configured tenant: the tenants come from the configuration, never from a
    /// request, so this map cannot grow.
    buckets: Arc<HashMap<Principal, Bucket>>,
    in_flight: InFlight,
}

impl Admission {
    /// The slots of `limits`, one share for each tenant `api_keys` authenticates. Built once
    /// per router: every route's copy of the layer counts on the same slots.
    pub(crate) fn new(api_keys: ApiKeys, limits: &Limits) -> Self {
        let in_flight = InFlight::new(
            limits.max_in_flight,
            limits.max_in_flight_per_tenant,
            api_keys.principals(),
        );
        let now = Instant::now();
        let buckets = api_keys
            .principals()
            .map(|tenant| (tenant, Bucket::new(limits.tenant_rate, now)))
            .collect();
        Self {
            api_keys,
            buckets: Arc::new(buckets),
            in_flight,
        }
    }
}

/// A request's slots, held until its response is ready and, through a clone the request
/// carries in its extensions, until the idempotent attempt it started has ended: a client that
/// goes away does not end its attempt ([`crate::handling::run_idempotent`]), nor may it free
/// the slots of one still running.
#[derive(Debug, Clone)]
pub(crate) struct Admitted {
    _slots: Arc<Slots>,
}

#[derive(Debug)]
struct Slots {
    _service: OwnedSemaphorePermit,
    _share: Option<OwnedSemaphorePermit>,
}

impl Drop for Slots {
    fn drop(&mut self) {
        crate::metrics::request_finished();
    }
}

/// Runs a request only if its tenant is within its rate and a slot is free for it: 429
/// `rate_limited` over the rate, 503 `overloaded` when the instance is full, 429
/// `tenant_in_flight_limit` when the tenant holds its whole share.
///
/// The tenant is authenticated here from the headers alone, before the body is read, so a
/// client that stalls its body holds only its own tenant's slots. A request that does not
/// authenticate holds no tenant's share; its handler refuses it before reading any body.
pub(crate) async fn limit_in_flight(
    State(admission): State<Admission>,
    mut request: Request,
    next: Next,
) -> Response {
    let tenant = authenticate(request.headers(), &admission.api_keys).ok();
    let bucket = tenant.as_ref().and_then(|t| admission.buckets.get(t));
    if let Some(Err(refused)) = bucket.map(|bucket| bucket.take(Instant::now())) {
        return refused.into_response();
    }
    let admitted = match admission.in_flight.admit(tenant.as_ref()) {
        Ok(admitted) => admitted,
        Err(refused) => return refused.into_response(),
    };
    if let Some(principal) = tenant {
        request.extensions_mut().insert(principal);
    }
    request.extensions_mut().insert(admitted.clone());
    let response = next.run(request).await;
    drop(admitted);
    response
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use payments_domain::TenantId;

    use super::*;

    fn retry_after(refused: Result<(), ApiError>) -> Option<u64> {
        match refused {
            Err(ApiError::RateLimited { retry_after_secs }) => Some(retry_after_secs),
            _ => None,
        }
    }

    #[test]
    fn a_bucket_lets_its_burst_through_then_its_rate() {
        let start = Instant::now();
        let bucket = Bucket::new(
            TenantRate::new(2, 3).unwrap_or_else(|z| panic!("{z:?}")),
            start,
        );
        for _ in 0..3 {
            assert!(bucket.take(start).is_ok());
        }
        assert_eq!(retry_after(bucket.take(start)), Some(1));
        // Half a second refills one token at two a second: one more request, then none.
        let later = start + Duration::from_millis(500);
        assert!(bucket.take(later).is_ok());
        assert_eq!(retry_after(bucket.take(later)), Some(1));
        // A long quiet spell refills no more than the burst.
        let much_later = later + Duration::from_secs(60);
        for _ in 0..3 {
            assert!(bucket.take(much_later).is_ok());
        }
        assert!(bucket.take(much_later).is_err());
    }

    #[test]
    fn retry_after_is_the_whole_seconds_until_a_token() {
        let start = Instant::now();
        let slow = TenantRate::new(1, 1).unwrap_or_else(|z| panic!("{z:?}"));
        let bucket = Bucket::new(slow, start);
        assert!(bucket.take(start).is_ok());
        assert_eq!(retry_after(bucket.take(start)), Some(1));
        assert!(bucket.take(start + Duration::from_secs(1)).is_ok());
    }

    #[test]
    fn a_zero_rate_or_burst_names_its_setting() {
        assert_eq!(
            TenantRate::new(0, 5).map_err(ZeroRate::key),
            Err("auth.rate_limit_per_sec")
        );
        assert_eq!(
            TenantRate::new(5, 0).map_err(ZeroRate::key),
            Err("auth.rate_limit_burst")
        );
    }

    #[test]
    fn a_tenant_holds_at_most_its_share_and_the_instance_at_most_its_limit() {
        let acme = Principal::Tenant(TenantId::new("acme"));
        let globex = Principal::Tenant(TenantId::new("globex"));
        let slots = InFlight::new(3, 2, [acme.clone(), globex.clone()]);
        let held: Vec<_> = (0..2).map(|_| slots.admit(Some(&acme))).collect();
        assert!(held.iter().all(Result::is_ok));
        assert!(matches!(
            slots.admit(Some(&acme)),
            Err(ApiError::TenantInFlightLimit)
        ));
        let third = slots.admit(Some(&globex));
        assert!(third.is_ok(), "another tenant still gets a slot");
        assert!(matches!(slots.admit(None), Err(ApiError::Overloaded)));
        drop(held);
        assert!(slots.admit(Some(&acme)).is_ok(), "slots come back");
    }

    #[test]
    fn a_tenant_over_its_share_takes_no_slot_of_the_instance() {
        let acme = Principal::Tenant(TenantId::new("acme"));
        let slots = InFlight::new(2, 1, [acme.clone()]);
        let _held = slots.admit(Some(&acme));
        for _ in 0..5 {
            assert!(slots.admit(Some(&acme)).is_err());
        }
        assert!(slots.admit(None).is_ok());
    }
}
