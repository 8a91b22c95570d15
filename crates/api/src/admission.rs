//! Admission: how many requests run at once, for the whole instance and for each tenant.
//!
//! One limit covers every route and method, so slow requests on one route cannot leave the
//! others unbounded; within it, each tenant may hold only its share, so one tenant's slow
//! requests (a stalled body, a slow card) cannot take every slot from the others. A request is
//! admitted or refused at once: queueing would only hold connections until their clients give
//! up and retry.

use std::collections::HashMap;
use std::sync::Arc;

use axum::extract::{Request, State};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use payments_domain::TenantId;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use crate::extract::{Tenant, authenticate};
use crate::state::Limits;
use crate::{ApiError, ApiKeys};

/// The in-flight slots of one instance.
#[derive(Debug, Clone)]
struct InFlight {
    service: Arc<Semaphore>,
    /// One share per configured tenant: the tenants come from the configuration, never from a
    /// request, so this map cannot grow.
    tenants: Arc<HashMap<TenantId, Arc<Semaphore>>>,
}

impl InFlight {
    fn new(max: usize, per_tenant: usize, tenants: impl IntoIterator<Item = TenantId>) -> Self {
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
    fn admit(&self, tenant: Option<&TenantId>) -> Result<Admitted, ApiError> {
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
            _service: service,
            _share: share,
        })
    }
}

/// What admission needs: the keys to authenticate with and the instance's slots. Only these
/// two (cheap `Arc` clones), not the whole application state, are cloned for every request.
#[derive(Debug, Clone)]
pub(crate) struct Admission {
    api_keys: ApiKeys,
    in_flight: InFlight,
}

impl Admission {
    /// The slots of `limits`, one share for each tenant `api_keys` authenticates. Built once
    /// per router: every route's copy of the layer counts on the same slots.
    pub(crate) fn new(api_keys: ApiKeys, limits: &Limits) -> Self {
        let in_flight = InFlight::new(
            limits.max_in_flight,
            limits.max_in_flight_per_tenant,
            api_keys.tenants(),
        );
        Self {
            api_keys,
            in_flight,
        }
    }
}

/// Slots held until the response is ready.
struct Admitted {
    _service: OwnedSemaphorePermit,
    _share: Option<OwnedSemaphorePermit>,
}

impl Drop for Admitted {
    fn drop(&mut self) {
        crate::metrics::request_finished();
    }
}

/// Runs a request only if a slot is free for it: 503 `overloaded` when the instance is full,
/// 429 `tenant_in_flight_limit` when the tenant holds its whole share.
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
    let admitted = match admission.in_flight.admit(tenant.as_ref()) {
        Ok(admitted) => admitted,
        Err(refused) => return refused.into_response(),
    };
    if let Some(tenant) = tenant {
        request.extensions_mut().insert(Tenant(tenant));
    }
    let response = next.run(request).await;
    drop(admitted);
    response
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_tenant_holds_at_most_its_share_and_the_instance_at_most_its_limit() {
        let acme = TenantId::new("acme");
        let globex = TenantId::new("globex");
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
        let acme = TenantId::new("acme");
        let slots = InFlight::new(2, 1, [acme.clone()]);
        let _held = slots.admit(Some(&acme));
        for _ in 0..5 {
            assert!(slots.admit(Some(&acme)).is_err());
        }
        assert!(slots.admit(None).is_ok());
    }
}
