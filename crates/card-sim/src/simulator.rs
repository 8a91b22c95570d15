//! The in-process simulator the service uses by default.

use std::collections::HashMap;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use async_trait::async_trait;
use payments_domain::{CardProcessor, ProcessorCharge, ProcessorChargeRequest, ProcessorError};
use uuid::Uuid;

use crate::TestToken;

/// What the simulator remembers under one idempotency key.
#[derive(Debug, Clone)]
enum Outcome {
    Charged(ProcessorCharge),
    Declined {
        decline_code: String,
        message: String,
    },
    /// A transient failure was reported once; the next attempt goes through.
    FailedOnce,
}

/// A processor that lives in the service's memory. It forgets everything when the service
/// restarts, so it cannot show exactly-once across crashes; a processor in its own process,
/// reached over HTTP, is what crash tests need.
#[derive(Debug, Default)]
pub struct InMemoryCardProcessor {
    outcomes: Mutex<HashMap<String, Outcome>>,
    charges_created: AtomicU64,
    latency: Duration,
}

impl InMemoryCardProcessor {
    /// A simulator that adds `latency` to every charge.
    pub fn with_latency(latency: Duration) -> Self {
        Self {
            latency,
            ..Self::default()
        }
    }

    /// The number of distinct charges ever created.
    pub fn charges_created(&self) -> u64 {
        self.charges_created.load(Ordering::SeqCst)
    }

    /// Decides and records the outcome for a key atomically, so concurrent calls with one key
    /// see one outcome. Latency is applied afterwards, outside the lock.
    fn settle(&self, request: &ProcessorChargeRequest) -> Result<ProcessorCharge, ProcessorError> {
        let mut outcomes = self
            .outcomes
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        let token = TestToken::from_source(request.source.as_str());
        match (outcomes.get(&request.idempotency_key), token) {
            (Some(Outcome::Charged(charge)), _) => return Ok(charge.clone()),
            (
                Some(Outcome::Declined {
                    decline_code,
                    message,
                }),
                _,
            ) => {
                return Err(ProcessorError::Declined {
                    decline_code: decline_code.clone(),
                    message: message.clone(),
                });
            }
            (Some(Outcome::FailedOnce), _) | (None, _) => {}
        }
        let first_attempt = !outcomes.contains_key(&request.idempotency_key);
        let outcome = match token {
            TestToken::FailsTransiently => {
                return Err(ProcessorError::Unavailable {
                    reason: "simulated processing error".into(),
                });
            }
            TestToken::FailsOnceThenSucceeds if first_attempt => {
                outcomes.insert(request.idempotency_key.clone(), Outcome::FailedOnce);
                return Err(ProcessorError::Unavailable {
                    reason: "simulated processing error (once)".into(),
                });
            }
            TestToken::Declined => Outcome::Declined {
                decline_code: "generic_decline".into(),
                message: "The card was declined.".into(),
            },
            TestToken::Unknown => Outcome::Declined {
                decline_code: "invalid_token".into(),
                message: "The card token is not recognised.".into(),
            },
            TestToken::Succeeds | TestToken::SucceedsSlowly | TestToken::FailsOnceThenSucceeds => {
                self.charges_created.fetch_add(1, Ordering::SeqCst);
                Outcome::Charged(ProcessorCharge {
                    id: format!("sim_{}", Uuid::new_v4().simple()),
                    money: request.money,
                })
            }
        };
        outcomes.insert(request.idempotency_key.clone(), outcome.clone());
        match outcome {
            Outcome::Charged(charge) => Ok(charge),
            Outcome::Declined {
                decline_code,
                message,
            } => Err(ProcessorError::Declined {
                decline_code,
                message,
            }),
            Outcome::FailedOnce => Err(ProcessorError::Unavailable {
                reason: "unreachable".into(),
            }),
        }
    }
}

#[async_trait]
impl CardProcessor for InMemoryCardProcessor {
    async fn charge(
        &self,
        request: ProcessorChargeRequest,
    ) -> Result<ProcessorCharge, ProcessorError> {
        let result = self.settle(&request);
        let mut latency = self.latency;
        if TestToken::from_source(request.source.as_str()) == TestToken::SucceedsSlowly {
            latency += TestToken::SLOW_LATENCY;
        }
        if !latency.is_zero() {
            tokio::time::sleep(latency).await;
        }
        result
    }

    async fn find_charge(
        &self,
        idempotency_key: &str,
    ) -> Result<Option<ProcessorCharge>, ProcessorError> {
        let outcomes = self
            .outcomes
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        Ok(match outcomes.get(idempotency_key) {
            Some(Outcome::Charged(charge)) => Some(charge.clone()),
            _ => None,
        })
    }
}

#[cfg(test)]
mod tests {
    use payments_domain::{Amount, Currency, Money, PaymentSource};

    use super::*;

    fn request(key: &str, token: &str) -> ProcessorChargeRequest {
        ProcessorChargeRequest {
            idempotency_key: key.into(),
            money: Money::new(
                Amount::new(100).unwrap_or_else(|e| panic!("{e}")),
                Currency::Usd,
            ),
            source: PaymentSource::new(token).unwrap_or_else(|e| panic!("{e}")),
        }
    }

    #[tokio::test]
    async fn the_same_key_returns_the_same_charge_and_creates_one() {
        let sim = InMemoryCardProcessor::default();
        let first = sim.charge(request("k", "tok_visa")).await;
        let second = sim.charge(request("k", "tok_visa")).await;
        assert!(first.is_ok());
        assert_eq!(first, second);
        assert_eq!(sim.charges_created(), 1);
    }

    #[tokio::test]
    async fn different_keys_create_different_charges() {
        let sim = InMemoryCardProcessor::default();
        let a = sim.charge(request("a", "tok_visa")).await.map(|c| c.id);
        let b = sim
            .charge(request("b", "tok_mastercard"))
            .await
            .map(|c| c.id);
        assert_ne!(a, b);
        assert_eq!(sim.charges_created(), 2);
    }

    #[tokio::test]
    async fn a_decline_is_remembered_and_creates_nothing() {
        let sim = InMemoryCardProcessor::default();
        for _ in 0..2 {
            let result = sim.charge(request("k", "tok_chargeDeclined")).await;
            assert!(matches!(result, Err(ProcessorError::Declined { .. })));
        }
        assert_eq!(sim.charges_created(), 0);
        assert_eq!(sim.find_charge("k").await, Ok(None));
    }

    #[tokio::test]
    async fn a_processing_error_is_transient_every_time() {
        let sim = InMemoryCardProcessor::default();
        for _ in 0..3 {
            let result = sim.charge(request("k", "tok_processingError")).await;
            assert!(matches!(result, Err(ProcessorError::Unavailable { .. })));
        }
        assert_eq!(sim.charges_created(), 0);
    }

    #[tokio::test]
    async fn fail_once_then_succeeds_under_the_same_key() {
        let sim = InMemoryCardProcessor::default();
        let first = sim.charge(request("k", "tok_processingErrorOnce")).await;
        assert!(matches!(first, Err(ProcessorError::Unavailable { .. })));
        let second = sim.charge(request("k", "tok_processingErrorOnce")).await;
        assert!(second.is_ok());
        assert_eq!(
            sim.find_charge("k").await.map(|c| c.map(|c| c.id)),
            Ok(second.map(|c| c.id).ok())
        );
        assert_eq!(sim.charges_created(), 1);
    }
}
