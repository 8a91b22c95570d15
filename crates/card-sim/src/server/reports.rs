//! `GET /v1/reports/settlement`: the simulator's settlement report of one UTC day, as CSV.

use axum::extract::rejection::QueryRejection;
use axum::extract::{Query, State};
use axum::http::header;
use axum::response::IntoResponse;

use super::error::SimError;
use super::routes::Sim;
use crate::report;
use crate::wire::ReportQuery;

/// The media type of the report.
const CSV: &str = "text/csv; charset=utf-8";

/// `GET /v1/reports/settlement?date=YYYY-MM-DD`: a header line, then one line per charge,
/// refund and payout that came into existence that day and is still remembered, in the order
/// they did. A missing or malformed date is a 400.
pub(crate) async fn settlement_report(
    State(sim): State<Sim>,
    query: Result<Query<ReportQuery>, QueryRejection>,
) -> Result<impl IntoResponse, SimError> {
    let Query(query) =
        query.map_err(|rejection| SimError::InvalidRequest(rejection.body_text()))?;
    let date = report::parse_date(&query.date).ok_or_else(|| {
        SimError::InvalidRequest(format!(
            "date must be a day as YYYY-MM-DD, got {:?}.",
            query.date
        ))
    })?;
    let lines = sim.settlement_lines(date);
    Ok(([(header::CONTENT_TYPE, CSV)], report::write(&lines)))
}
