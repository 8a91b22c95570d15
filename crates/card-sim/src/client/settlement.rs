//! [`SettlementReport`] over HTTP: the processor's report of a day, read strictly. A report
//! that does not parse in full is `Unavailable`, never read in part: a missing line would look
//! like a difference that does not exist.

use async_trait::async_trait;
use chrono::NaiveDate;
use payments_domain::{ProcessorError, SettlementLine, SettlementReport};
use reqwest::StatusCode;

use super::{HttpCardProcessor, unavailable, unexpected};
use crate::report::{self, DATE_FORMAT};

#[async_trait]
impl SettlementReport for HttpCardProcessor {
    async fn settlement_report(
        &self,
        date: NaiveDate,
    ) -> Result<Vec<SettlementLine>, ProcessorError> {
        let mut url = self.settlement_report_url.clone();
        url.query_pairs_mut()
            .append_pair("date", &date.format(DATE_FORMAT).to_string());
        let response = self
            .http
            .get(url)
            .send()
            .await
            .map_err(|e| self.unreachable(&e))?;
        if response.status() != StatusCode::OK {
            return Err(unexpected(response.status()));
        }
        let text = response.text().await.map_err(|e| self.unreachable(&e))?;
        report::parse(&text).map_err(|e| unavailable(format!("settlement report of {date}: {e}")))
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[test]
    fn the_report_url_appends_to_the_base_path() {
        let client = HttpCardProcessor::new("http://sim.local/prefix", Duration::from_secs(1));
        let url = client.map(|c| c.settlement_report_url.to_string());
        assert_eq!(
            url.ok().as_deref(),
            Some("http://sim.local/prefix/v1/reports/settlement")
        );
    }
}
