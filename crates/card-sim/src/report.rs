//! The settlement report as CSV, written by the server and read by
//! [`HttpCardProcessor`](crate::HttpCardProcessor): one definition for both ends, so they
//! cannot drift apart.
//!
//! A header line, then one record per [`SettlementLine`], fields quoted as RFC 4180 says: a
//! field holding a comma, a quote or a line break is enclosed in quotes, and its quotes are
//! doubled. The metadata is whatever a caller sent, so no value may break the layout. Records
//! end with CRLF; the reader also takes a bare LF. Reading is strict: a record that does not
//! parse in full is an error, never skipped, since a missing line would look like a
//! difference that does not exist.

use chrono::{DateTime, NaiveDate, SecondsFormat, Utc};
use payments_domain::{
    Amount, Currency, CurrencyError, Money, ProcessorChargeStatus, ProcessorMetadata,
    SettlementKind, SettlementLine, TenantId,
};

/// The first line of every report.
pub(crate) const HEADER: &str =
    "type,processor_id,processor_key,amount,currency,status,created_at,tenant,resource_id";

/// How the report's `date` is written: `YYYY-MM-DD`.
pub(crate) const DATE_FORMAT: &str = "%Y-%m-%d";

/// The number of fields of every record.
const FIELDS: usize = 9;

/// Why a report cannot be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum ReportError {
    /// The first record is not [`HEADER`] (an empty body has none).
    #[error("the report does not start with its header line")]
    MissingHeader,
    /// A record (1 is the header) is not CSV, or a field of it is not what its column holds.
    #[error("record {record} of the report is malformed: {reason}")]
    Malformed { record: usize, reason: String },
}

/// A `YYYY-MM-DD` date, exactly (no missing zeros, nothing around it).
pub(crate) fn parse_date(text: &str) -> Option<NaiveDate> {
    let date = NaiveDate::parse_from_str(text, DATE_FORMAT).ok()?;
    (date.format(DATE_FORMAT).to_string() == text).then_some(date)
}

/// The whole report: the header and one record per line, in the order given.
pub(crate) fn write(lines: &[SettlementLine]) -> String {
    let mut out = String::with_capacity(HEADER.len() + 2 + lines.len() * 160);
    out.push_str(HEADER);
    out.push_str("\r\n");
    for line in lines {
        let (tenant, resource_id) = match &line.metadata {
            Some(metadata) => (metadata.tenant.as_str(), metadata.resource_id.as_str()),
            None => ("", ""),
        };
        let amount = line.money.amount.minor_units().to_string();
        let created_at = line.created_at.to_rfc3339_opts(SecondsFormat::AutoSi, true);
        let fields = [
            line.kind.as_str(),
            &line.processor_id,
            &line.processor_key,
            &amount,
            line.money.currency.code(),
            line.status.as_str(),
            &created_at,
            tenant,
            resource_id,
        ];
        for (i, field) in fields.into_iter().enumerate() {
            if i > 0 {
                out.push(',');
            }
            push_field(&mut out, field);
        }
        out.push_str("\r\n");
    }
    out
}

/// Reads a whole report: its header, then every record as a line.
pub(crate) fn parse(text: &str) -> Result<Vec<SettlementLine>, ReportError> {
    let mut records = Records::new(text);
    let header = records.next().transpose()?;
    let is_header = |fields: &Vec<String>| fields.iter().map(String::as_str).eq(HEADER.split(','));
    if !header.as_ref().is_some_and(is_header) {
        return Err(ReportError::MissingHeader);
    }
    let mut lines = Vec::new();
    while let Some(fields) = records.next().transpose()? {
        let line = parse_line(fields).map_err(|reason| ReportError::Malformed {
            record: records.number,
            reason,
        })?;
        lines.push(line);
    }
    Ok(lines)
}

/// Appends `value`, quoted if it holds anything that would otherwise end it.
fn push_field(out: &mut String, value: &str) {
    if value.contains([',', '"', '\r', '\n']) {
        out.push('"');
        out.push_str(&value.replace('"', "\"\""));
        out.push('"');
    } else {
        out.push_str(value);
    }
}

/// One record's fields as a line; the error says which field is wrong.
fn parse_line(fields: Vec<String>) -> Result<SettlementLine, String> {
    let [
        kind,
        id,
        key,
        amount,
        currency,
        status,
        created_at,
        tenant,
        resource_id,
    ]: [String; FIELDS] = fields
        .try_into()
        .map_err(|fields: Vec<String>| format!("{} fields, not {FIELDS}", fields.len()))?;
    let kind = SettlementKind::parse(&kind).ok_or_else(|| format!("unknown type {kind:?}"))?;
    let amount = amount
        .parse()
        .ok()
        .and_then(|units| Amount::new(units).ok())
        .ok_or_else(|| format!("amount {amount:?} is not a positive whole number"))?;
    let currency: Currency = currency.parse().map_err(|e: CurrencyError| e.to_string())?;
    let status = ProcessorChargeStatus::parse(&status)
        .ok_or_else(|| format!("unknown status {status:?}"))?;
    let created_at = DateTime::parse_from_rfc3339(&created_at)
        .map_err(|e| format!("created_at {created_at:?}: {e}"))?
        .with_timezone(&Utc);
    let metadata = match (tenant.is_empty(), resource_id.is_empty()) {
        (true, true) => None,
        (false, false) => Some(ProcessorMetadata::new(TenantId::new(tenant), resource_id)),
        _ => return Err("tenant and resource_id must both be given or both be empty".into()),
    };
    if id.is_empty() || key.is_empty() {
        return Err("processor_id and processor_key must not be empty".into());
    }
    Ok(SettlementLine {
        kind,
        processor_id: id,
        processor_key: key,
        money: Money::new(amount, currency),
        status,
        created_at,
        metadata,
    })
}

/// The records of a CSV text, one at a time, numbered from 1.
struct Records<'a> {
    chars: std::iter::Peekable<std::str::Chars<'a>>,
    /// The number of the record last read.
    number: usize,
}

/// What ended a field.
enum End {
    Field,
    Record,
}

impl<'a> Records<'a> {
    fn new(text: &'a str) -> Self {
        Self {
            chars: text.chars().peekable(),
            number: 0,
        }
    }

    fn read_record(&mut self) -> Result<Vec<String>, String> {
        let mut fields = Vec::with_capacity(FIELDS);
        loop {
            let (field, end) = self.read_field()?;
            fields.push(field);
            if let End::Record = end {
                return Ok(fields);
            }
        }
    }

    fn read_field(&mut self) -> Result<(String, End), String> {
        let mut field = String::new();
        if self.chars.next_if_eq(&'"').is_some() {
            loop {
                match self.chars.next() {
                    None => return Err("a quoted field is not closed".into()),
                    // A doubled quote is one quote of the value; a single one closes it.
                    Some('"') if self.chars.next_if_eq(&'"').is_some() => field.push('"'),
                    Some('"') => break,
                    Some(c) => field.push(c),
                }
            }
            return match self.end_of_field() {
                Some(end) => Ok((field, end)),
                None => Err("text after the closing quote of a field".into()),
            };
        }
        loop {
            if let Some(end) = self.end_of_field() {
                return Ok((field, end));
            }
            match self.chars.next() {
                // Only a quoted field may hold a quote or a line break.
                Some('"' | '\r') => return Err("a quote or a CR in an unquoted field".into()),
                Some(c) => field.push(c),
                None => return Ok((field, End::Record)),
            }
        }
    }

    /// Consumes what ends a field (a comma, CRLF, LF, or the end of the text), if it is next.
    fn end_of_field(&mut self) -> Option<End> {
        match self.chars.peek() {
            None => Some(End::Record),
            Some(',') => {
                self.chars.next();
                Some(End::Field)
            }
            Some('\n') => {
                self.chars.next();
                Some(End::Record)
            }
            Some('\r') => {
                let mut ahead = self.chars.clone();
                ahead.next();
                if ahead.peek() != Some(&'\n') {
                    return None;
                }
                self.chars.nth(1);
                Some(End::Record)
            }
            Some(_) => None,
        }
    }
}

impl Iterator for Records<'_> {
    type Item = Result<Vec<String>, ReportError>;

    /// The next record; `None` at the end of the text (a final line break ends the last record
    /// and starts none).
    fn next(&mut self) -> Option<Self::Item> {
        self.chars.peek()?;
        self.number += 1;
        let number = self.number;
        Some(self.read_record().map_err(|reason| ReportError::Malformed {
            record: number,
            reason,
        }))
    }
}

#[cfg(test)]
mod tests {
    use chrono::TimeZone;

    use super::*;

    fn usd(minor_units: i64) -> Money {
        Money::new(
            Amount::new(minor_units).unwrap_or_else(|e| panic!("{e}")),
            Currency::Usd,
        )
    }

    fn line(kind: SettlementKind, metadata: Option<ProcessorMetadata>) -> SettlementLine {
        let created_at = Utc
            .with_ymd_and_hms(2025, 3, 14, 23, 59, 59)
            .single()
            .unwrap_or_else(|| panic!("a valid time"))
            + chrono::TimeDelta::nanoseconds(123_456_789);
        SettlementLine {
            kind,
            processor_id: "sim_1".into(),
            processor_key: "key-1".into(),
            money: usd(1999),
            status: ProcessorChargeStatus::Succeeded,
            created_at,
            metadata,
        }
    }

    fn lines() -> Vec<SettlementLine> {
        let hostile = ProcessorMetadata::new(
            TenantId::new("acme, \"the\" company\r\nline two"),
            "ch_1,\"x\"\ny",
        );
        let plain = ProcessorMetadata::new(TenantId::new("acme"), "re_2");
        vec![
            line(SettlementKind::Charge, Some(hostile)),
            line(SettlementKind::Refund, Some(plain)),
            line(SettlementKind::Payout, None),
        ]
    }

    #[test]
    fn a_report_round_trips_even_with_a_comma_a_quote_and_a_newline_in_its_metadata() {
        let written = write(&lines());
        assert_eq!(parse(&written), Ok(lines()));
        // The hostile values are quoted, so the report still has one record per line.
        assert!(written.contains(r#""acme, ""the"" company"#), "{written}");
    }

    #[test]
    fn a_report_is_a_header_and_one_crlf_record_per_line() {
        let plain = line(
            SettlementKind::Charge,
            Some(ProcessorMetadata::new(TenantId::new("acme"), "ch_9")),
        );
        assert_eq!(
            write(&[plain]),
            format!(
                "{HEADER}\r\ncharge,sim_1,key-1,1999,USD,succeeded,\
                 2025-03-14T23:59:59.123456789Z,acme,ch_9\r\n"
            )
        );
        assert_eq!(parse(&format!("{HEADER}\n")), Ok(vec![]));
    }

    #[test]
    fn a_record_that_does_not_parse_in_full_is_an_error_never_skipped() {
        let good = "charge,sim_1,k,1999,USD,succeeded,2025-03-14T10:00:00Z,acme,ch_1";
        let malformed = [
            "charge,sim_1,k,1999,USD,succeeded,2025-03-14T10:00:00Z,acme",
            "charge,sim_1,k,1999,USD,succeeded,2025-03-14T10:00:00Z,acme,ch_1,extra",
            "transfer,sim_1,k,1999,USD,succeeded,2025-03-14T10:00:00Z,acme,ch_1",
            "charge,sim_1,k,0,USD,succeeded,2025-03-14T10:00:00Z,acme,ch_1",
            "charge,sim_1,k,19.99,USD,succeeded,2025-03-14T10:00:00Z,acme,ch_1",
            "charge,sim_1,k,1999,XXX,succeeded,2025-03-14T10:00:00Z,acme,ch_1",
            "charge,sim_1,k,1999,USD,refunded,2025-03-14T10:00:00Z,acme,ch_1",
            "charge,sim_1,k,1999,USD,succeeded,yesterday,acme,ch_1",
            "charge,sim_1,k,1999,USD,succeeded,2025-03-14T10:00:00Z,acme,",
            "charge,,k,1999,USD,succeeded,2025-03-14T10:00:00Z,acme,ch_1",
            "charge,sim_1,k,1999,USD,succeeded,2025-03-14T10:00:00Z,\"acme,ch_1",
            "charge,sim_1,k,1999,USD,succeeded,2025-03-14T10:00:00Z,\"acme\"x,ch_1",
            "charge,sim_1,k,1999,USD,succeeded,2025-03-14T10:00:00Z,ac\"me,ch_1",
        ];
        for record in malformed {
            let text = format!("{HEADER}\r\n{good}\r\n{record}\r\n");
            assert!(
                matches!(parse(&text), Err(ReportError::Malformed { record: 3, .. })),
                "{record} -> {:?}",
                parse(&text)
            );
        }
        for text in ["", "type,processor_id\r\n", &format!("{good}\r\n")] {
            assert_eq!(parse(text), Err(ReportError::MissingHeader), "{text}");
        }
    }

    #[test]
    fn a_date_is_exactly_year_month_day() {
        assert_eq!(
            parse_date("2025-03-04"),
            NaiveDate::from_ymd_opt(2025, 3, 4)
        );
        for bad in [
            "2025-3-4",
            "2025-02-30",
            "20250304",
            " 2025-03-04",
            "yesterday",
            "",
        ] {
            assert_eq!(parse_date(bad), None, "{bad:?}");
        }
    }
}
