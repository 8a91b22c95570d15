//! The daily reconciliation: at `workers.reconcile_at` (UTC) every day, the previous day is
//! reconciled against the processor's settlement report (`reconcile.rs`). Every instance runs
//! it; runs are idempotent by day, so a second run of the same day replaces the counts and
//! adds no exception twice.

use std::time::Duration;

use chrono::{DateTime, Days, NaiveTime, Utc};
use tokio::sync::watch;

use crate::reconcile::yesterday;
use crate::{AppState, error_chain};
use payments_idempotency::lifecycle::stopped;

pub(super) async fn run(state: AppState, at: NaiveTime, mut shutdown: watch::Receiver<bool>) {
    loop {
        tokio::select! {
            () = tokio::time::sleep(until_next(at, Utc::now())) => {}
            () = stopped(&mut shutdown) => return,
        }
        let Some(date) = yesterday() else { continue };
        match state.reconciler().run(date).await {
            Ok(run) => {
                tracing::info!(reconcile.date = %date, reconcile.exceptions = run.exceptions(),
                "reconciliation: the previous day is reconciled")
            }
            Err(error) => tracing::warn!(reconcile.date = %date, error = %error_chain(&error),
                "reconciliation: the run failed; it runs again tomorrow, or by hand with payments-api reconcile"),
        }
    }
}

/// How long from `now` until the next `at` (today's if it is still ahead, else tomorrow's).
fn until_next(at: NaiveTime, now: DateTime<Utc>) -> Duration {
    let today = now.date_naive().and_time(at).and_utc();
    let next = if today > now {
        today
    } else {
        today.checked_add_days(Days::new(1)).unwrap_or(today)
    };
    (next - now).to_std().unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(time: &str) -> NaiveTime {
        NaiveTime::parse_from_str(time, "%H:%M:%S").unwrap_or_else(|e| panic!("{e}"))
    }

    fn now(time: &str) -> DateTime<Utc> {
        format!("2026-12-03T{time}Z")
            .parse()
            .unwrap_or_else(|e| panic!("{e}"))
    }

    #[test]
    fn the_next_run_is_today_while_its_time_is_ahead_and_tomorrow_after() {
        assert_eq!(
            until_next(at("01:00:00"), now("00:30:00")),
            Duration::from_secs(1800)
        );
        assert_eq!(
            until_next(at("01:00:00"), now("01:00:00")),
            Duration::from_secs(86_400)
        );
        assert_eq!(
            until_next(at("01:00:00"), now("23:00:00")),
            Duration::from_secs(7200)
        );
    }
}
