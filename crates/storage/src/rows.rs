//! What every resource's rows share: a page of rows, and money read from two columns.

use payments_domain::{Amount, Currency, Money};

use crate::StoreError;

/// The first `limit` rows, converted, and whether there were more: a list query asks for one
/// more than `limit`, and that one only says whether another page exists.
pub(crate) fn page<R, T>(
    rows: Vec<R>,
    limit: u32,
    convert: fn(R) -> Result<T, StoreError>,
) -> Result<(Vec<T>, bool), StoreError> {
    let has_more = rows.len() > limit as usize;
    let items = rows
        .into_iter()
        .take(limit as usize)
        .map(convert)
        .collect::<Result<_, _>>()?;
    Ok((items, has_more))
}

/// An `amount` and `currency` pair of columns as the money they hold.
pub(crate) fn money(amount: i64, currency: &str) -> Result<Money, StoreError> {
    let currency: Currency = currency
        .parse()
        .map_err(|_| corrupt("currency", currency))?;
    let amount = Amount::new(amount).map_err(|_| corrupt("amount", amount))?;
    Ok(Money::new(amount, currency))
}

pub(crate) fn corrupt(column: &str, value: impl std::fmt::Debug) -> StoreError {
    StoreError::Corrupt(format!("{column} = {value:?}"))
}
