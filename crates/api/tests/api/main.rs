//! Black-box tests: the real `payments-api` binary, started on a random port against its own
//! fresh database, driven over HTTP. Each test that needs a database runs once per backend
//! (`<module>::postgres::<test>` and `<module>::sqlite::<test>`), from one definition.

/// Generates `postgres::<test>` and `sqlite::<test>` for each `async fn <test>(Backend)` named.
macro_rules! on_every_backend {
    ($($test:ident),* $(,)?) => {
        mod postgres {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $test() {
                    super::$test(crate::helpers::Backend::Postgres).await;
                }
            )*
        }
        mod sqlite {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $test() {
                    super::$test(crate::helpers::Backend::Sqlite).await;
                }
            )*
        }
    };
}

// The bench-only floors exist only with `--features bench`.
#[cfg(feature = "bench")]
mod bench_endpoints;
mod captures;
mod card_sim;
mod charges;
mod client;
mod clients_that_leave;
mod concurrency;
// Crash injection needs the service built with `--features failpoints`.
#[cfg(feature = "failpoints")]
mod crash;
#[cfg(feature = "failpoints")]
mod crash_captures;
#[cfg(feature = "failpoints")]
mod crash_payouts;
#[cfg(feature = "failpoints")]
mod crash_refunds;
#[cfg(feature = "failpoints")]
mod crash_resolutions;
mod database;
mod embedded;
mod event_feed;
mod events;
mod frozen_instance;
mod helpers;
mod hostile;
mod keys;
mod metrics;
mod ops;
mod payouts;
mod reads;
mod recent_answers;
mod reconciliation;
mod recovery;
mod redis_server;
mod refunds;
mod relay;
mod resolutions;
mod retention;
// Two builds of a fleet mid-deploy, one of them killed at a failpoint's pause.
#[cfg(feature = "failpoints")]
mod rolling_deploy;
mod security;
mod shutdown;
mod soak;
mod startup;
mod stream;
mod unknown_outcomes;
mod validation;
// The deployed build: only meaningful without `--features failpoints`.
#[cfg(not(feature = "failpoints"))]
mod without_failpoints;
