//! [`Echo`]: what a successful answer repeats of its request, so that an answer to another
//! request (from whatever stands between the caller and the service) is never taken for this
//! one's, nor kept in the journal.

use serde_json::Value;

/// The fields of a request that its answer names again: the amount and the currency sent
/// (when the request has them), and what the path names (a refund's charge, the charge a
/// capture or a cancel answers with) or the body names otherwise (a capture's amount).
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Echo {
    fields: Vec<(&'static str, Value)>,
}

/// A field of the answer that is not what was sent.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Mismatch {
    pub(crate) field: &'static str,
    pub(crate) sent: Value,
    pub(crate) answered: Value,
}

impl Echo {
    /// The amount and the currency of `request`, as far as it has them.
    pub(crate) fn of(request: &Value) -> Self {
        let fields = ["amount", "currency"]
            .into_iter()
            .filter_map(|field| match request.get(field) {
                None | Some(Value::Null) => None,
                Some(value) => Some((field, value.clone())),
            })
            .collect();
        Self { fields }
    }

    /// The same, and `field` must be `value`.
    pub(crate) fn and(mut self, field: &'static str, value: impl Into<Value>) -> Self {
        self.fields.push((field, value.into()));
        self
    }

    /// Whether `answer`, a successful answer's body, answers the request; strings are
    /// compared without regard to case (a currency sent as `USD` is answered as `usd`).
    pub(crate) fn check(&self, answer: &Value) -> Result<(), Mismatch> {
        for (field, sent) in &self.fields {
            let answered = answer.get(*field).cloned().unwrap_or(Value::Null);
            let same = match (sent, &answered) {
                (Value::String(sent), Value::String(answered)) => {
                    sent.eq_ignore_ascii_case(answered)
                }
                (sent, answered) => sent == answered,
            };
            if !same {
                return Err(Mismatch {
                    field,
                    sent: sent.clone(),
                    answered,
                });
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn an_answer_must_name_the_amount_currency_and_charge_sent() {
        let charge = Echo::of(&json!({ "amount": 100, "currency": "USD", "source": "tok_visa" }));
        let answer = json!({ "id": "ch_1", "amount": 100, "currency": "usd" });
        assert_eq!(charge.check(&answer), Ok(()));
        let other = json!({ "id": "ch_2", "amount": 1, "currency": "usd" });
        assert_eq!(
            charge.check(&other),
            Err(Mismatch {
                field: "amount",
                sent: json!(100),
                answered: json!(1)
            })
        );
        let euros = json!({ "id": "ch_3", "amount": 100, "currency": "eur" });
        assert_eq!(charge.check(&euros).map_err(|m| m.field), Err("currency"));
        assert_eq!(
            charge.check(&json!({})).map_err(|m| m.answered),
            Err(Value::Null)
        );

        // A refund of all that remains names no amount; its charge is in the path.
        let refund = Echo::of(&json!({ "reason": "duplicate" })).and("charge", "ch_1");
        let answer = json!({ "id": "re_1", "charge": "ch_1", "amount": 700 });
        assert_eq!(refund.check(&answer), Ok(()));
        let elsewhere = json!({ "id": "re_2", "charge": "ch_9", "amount": 700 });
        assert_eq!(refund.check(&elsewhere).map_err(|m| m.field), Err("charge"));
        let partial = Echo::of(&json!({ "amount": 500, "reason": null })).and("charge", "ch_1");
        assert_eq!(partial.check(&answer).map_err(|m| m.field), Err("amount"));
    }
}
