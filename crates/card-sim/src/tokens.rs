//! The test card tokens and the outcome each one produces, for the charge (or the
//! authorisation) and for its refunds, captures and voids.

use std::time::Duration;

/// What a token makes the simulator do.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TestToken {
    /// `tok_visa`, `tok_mastercard`: the charge succeeds.
    Succeeds,
    /// `tok_slow`: the charge succeeds after [`TestToken::SLOW_LATENCY`] more than the
    /// configured latency, to show in-flight duplicates; so do its refunds, captures and voids.
    SucceedsSlowly,
    /// `tok_chargeDeclined`: a definitive decline.
    Declined,
    /// `tok_processingError`: a transient failure, every time.
    FailsTransiently,
    /// `tok_processingErrorOnce`: a transient failure on the first attempt under a key, then
    /// success, like a processor that timed out once.
    FailsOnceThenSucceeds,
    /// `tok_amountMismatch`: the charge succeeds, but the processor records and reports an
    /// amount one minor unit larger than requested (one smaller at the maximum amount), like a
    /// misbehaving processor. The service must never post such a charge.
    ReportsWrongAmount,
    /// `tok_refundDeclined`: the charge succeeds, and every refund of it is declined
    /// (`refund_declined`), like a processor that will not give back this charge's money.
    DeclinesRefunds,
    /// Any other token: declined as unknown.
    Unknown,
}

impl TestToken {
    /// How much longer than the configured latency `tok_slow` takes.
    pub const SLOW_LATENCY: Duration = Duration::from_secs(2);

    /// The outcome a card token produces; any unrecognised token is [`TestToken::Unknown`].
    pub fn from_source(source: &str) -> Self {
        match source {
            "tok_visa" | "tok_mastercard" => Self::Succeeds,
            "tok_slow" => Self::SucceedsSlowly,
            "tok_chargeDeclined" => Self::Declined,
            "tok_processingError" => Self::FailsTransiently,
            "tok_processingErrorOnce" => Self::FailsOnceThenSucceeds,
            "tok_amountMismatch" => Self::ReportsWrongAmount,
            "tok_refundDeclined" => Self::DeclinesRefunds,
            _ => Self::Unknown,
        }
    }
}

/// What a test bank account (a payout's `destination`) makes the simulator do.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TestDestination {
    /// Any `ba_` reference not named below: the payout is paid.
    Pays,
    /// `ba_slow`: paid after [`TestToken::SLOW_LATENCY`] more than the configured latency.
    PaysSlowly,
    /// `ba_declined`: a definitive decline (`account_closed`), like a closed account.
    Declined,
}

impl TestDestination {
    /// The outcome a destination produces.
    pub fn from_destination(destination: &str) -> Self {
        match destination {
            "ba_slow" => Self::PaysSlowly,
            "ba_declined" => Self::Declined,
            _ => Self::Pays,
        }
    }
}
