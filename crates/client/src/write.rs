//! The writes: each one logical operation under one key, recorded in the journal before its
//! first send when it is named for one, and sent only while the service surely holds its key.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use reqwest::{Method, Url};
use serde::Serialize;
use serde::de::DeserializeOwned;
use sha2::{Digest, Sha256};

use crate::client::Client;
use crate::echo::Echo;
use crate::error::Error;
use crate::journal::JournalEntry;
use crate::operation::{Answer, Operation};
use crate::received::{Received, answer, answer_from_journal, recorded_answer};
use crate::retention::Held;
use crate::types::{
    CancelRequest, CaptureRequest, Charge, ChargeRequest, KeyOperation, Payout, PayoutRequest,
    Refund, RefundRequest,
};

/// What a write sends, and to which operation its key belongs at the service.
struct Write<'a> {
    kind: KeyOperation,
    url: Url,
    body: Vec<u8>,
    echo: Echo,
    operation: &'a Operation,
    /// The request that shows whether the write was made, for a caller whose key is gone.
    list: String,
}

impl Client {
    /// `POST /charges`: charges a card, once however often it is retried.
    pub async fn create_charge(
        &self,
        request: &ChargeRequest,
        operation: &Operation,
    ) -> Result<Answer<Charge>, Error> {
        let write = self.write(KeyOperation::Charge, &["charges"], request, operation);
        self.create(write).await
    }

    /// `POST /charges/{id}/refunds`: gives back part or all of a charge, once.
    pub async fn create_refund(
        &self,
        charge: &str,
        request: &RefundRequest,
        operation: &Operation,
    ) -> Result<Answer<Refund>, Error> {
        let path = ["charges", charge, "refunds"];
        let mut write = self.write(KeyOperation::Refund, &path, request, operation);
        write.echo = write.echo.and("charge", charge);
        self.create(write).await
    }

    /// `POST /charges/{id}/capture`: takes all of a hold, or part of it and releases the rest,
    /// once. Its answer is the charge.
    pub async fn capture_charge(
        &self,
        charge: &str,
        request: &CaptureRequest,
        operation: &Operation,
    ) -> Result<Answer<Charge>, Error> {
        let kind = KeyOperation::Capture;
        let mut write = self.write_to_charge(kind, charge, "capture", request, operation);
        if let Some(amount) = request.amount_to_capture {
            write.echo = write.echo.and("amount_captured", amount);
        }
        self.create(write).await
    }

    /// `POST /charges/{id}/cancel`: releases a hold, once. Its answer is the charge.
    pub async fn cancel_charge(
        &self,
        charge: &str,
        request: &CancelRequest,
        operation: &Operation,
    ) -> Result<Answer<Charge>, Error> {
        let kind = KeyOperation::Cancel;
        let mut write = self.write_to_charge(kind, charge, "cancel", request, operation);
        if let Some(reason) = request.cancellation_reason {
            let reason = serde_json::to_value(reason).expect("a reason serialises");
            write.echo = write.echo.and("cancellation_reason", reason);
        }
        self.create(write).await
    }

    /// `POST /payouts`: pays out of the balance to a bank account, once.
    pub async fn create_payout(
        &self,
        request: &PayoutRequest,
        operation: &Operation,
    ) -> Result<Answer<Payout>, Error> {
        let write = self.write(KeyOperation::Payout, &["payouts"], request, operation);
        self.create(write).await
    }

    fn write<'a>(
        &self,
        kind: KeyOperation,
        path: &[&str],
        request: &impl Serialize,
        operation: &'a Operation,
    ) -> Write<'a> {
        let body = serde_json::to_vec(request).expect("a request body serialises");
        let echo = Echo::of(&serde_json::to_value(request).expect("a request serialises"));
        let url = self.url(path);
        Write {
            kind,
            list: format!("GET {}", url.path()),
            url,
            body,
            echo,
            operation,
        }
    }

    /// `POST /charges/{charge}/{action}`, answered with the charge: the answer must be that
    /// charge, and the charge is what shows whether the write was made.
    fn write_to_charge<'a>(
        &self,
        kind: KeyOperation,
        charge: &str,
        action: &str,
        request: &impl Serialize,
        operation: &'a Operation,
    ) -> Write<'a> {
        let mut write = self.write(kind, &["charges", charge, action], request, operation);
        write.echo = write.echo.and("id", charge);
        write.list = format!("GET {}", self.url(&["charges", charge]).path());
        write
    }

    /// A write: one logical operation, under the operation's key (or the one its journal
    /// entry holds), recorded in the journal before the first send when it is named for one.
    async fn create<T: DeserializeOwned>(&self, write: Write<'_>) -> Result<Answer<T>, Error> {
        let Some(name) = write.operation.journal_name() else {
            let key = write.operation.key();
            let held = Held::since_first_send(SystemTime::now(), self.key_retention);
            let received = self.send_write(&write, key, held).await?;
            return answer(received, Some(key));
        };
        let journal = self.journal.as_ref().ok_or_else(|| Error::NoJournal {
            name: name.to_owned(),
        })?;
        let request = format!(
            "POST {} sha256:{}",
            write.url.path(),
            hex::encode(Sha256::digest(&write.body))
        );
        let (entry, resumed) = match journal.entry(name)? {
            Some(entry) => {
                self.check_entry(&entry, &request, write.operation)?;
                (entry, true)
            }
            None => {
                let entry = JournalEntry {
                    name: name.to_owned(),
                    request,
                    key: write.operation.key().to_owned(),
                    base_url: self.base_url.to_string(),
                    api_key_fingerprint: self.api_key_fingerprint.clone(),
                    recorded_at: Some(unix_secs(SystemTime::now())),
                    key_retention_secs: Some(self.key_retention.as_secs()),
                    answer: None,
                };
                // Recorded before the first send: a crash from here on resumes this key.
                journal.record(&entry)?;
                (entry, false)
            }
        };
        if let Some(recorded) = &entry.answer {
            return answer_from_journal(recorded, &entry.key);
        }
        let held = self.held(&entry, &write, resumed).await?;
        let received = self.send_write(&write, &entry.key, held).await?;
        if let Some(recorded) = recorded_answer(&received) {
            journal.record(&JournalEntry {
                answer: Some(recorded),
                ..entry.clone()
            })?;
        }
        answer(received, Some(&entry.key))
    }

    /// Sends the write under `key` while `held` lasts, and checks that a success answers it.
    async fn send_write(
        &self,
        write: &Write<'_>,
        key: &str,
        held: Held,
    ) -> Result<Received, Error> {
        let body = Some(write.body.as_slice());
        let url = write.url.clone();
        let received = self
            .send(Method::POST, url, body, Some((key, held)))
            .await?;
        let body = serde_json::from_slice(&received.body);
        if let (true, Ok(body)) = (received.status.is_success(), body) {
            write
                .echo
                .check(&body)
                .map_err(|mismatch| Error::AnswerMismatch {
                    key: key.to_owned(),
                    field: mismatch.field,
                    sent: mismatch.sent,
                    answered: mismatch.answered,
                })?;
        }
        Ok(received)
    }

    /// Refuses an entry that is not this write's: another service's or another tenant's
    /// first, then another request or another key under the same name.
    fn check_entry(
        &self,
        entry: &JournalEntry,
        request: &str,
        operation: &Operation,
    ) -> Result<(), Error> {
        let name = entry.name.clone();
        if entry.base_url != self.base_url.as_str() {
            let recorded = match entry.base_url.as_str() {
                "" => "a service it does not name".to_owned(),
                url => url.to_owned(),
            };
            let given = self.base_url.to_string();
            return Err(Error::JournalOfAnotherService {
                name,
                recorded,
                given,
            });
        }
        if entry.api_key_fingerprint != self.api_key_fingerprint {
            return Err(Error::JournalOfAnotherTenant { name });
        }
        if entry.request != request {
            let recorded = entry.request.clone();
            return Err(Error::JournalHoldsAnotherRequest { name, recorded });
        }
        if operation.key_given() && entry.key != operation.key() {
            let (recorded, given) = (entry.key.clone(), operation.key().to_owned());
            return Err(Error::JournalHoldsAnotherKey {
                name,
                recorded,
                given,
            });
        }
        Ok(())
    }

    /// Until when the service surely holds the key of an entry without an answer. Counted from
    /// its first send while that covers a whole deadline of sends; after that the key may be
    /// gone, and only the service can say: it is asked, and a key it no longer holds (or not
    /// for long enough to send again) is [`Error::KeyGone`], never sent again.
    async fn held(
        &self,
        entry: &JournalEntry,
        write: &Write<'_>,
        resumed: bool,
    ) -> Result<Held, Error> {
        // Told two retentions, at the first send and now: the shorter holds.
        let retention = entry.key_retention_secs.map_or(self.key_retention, |secs| {
            Duration::from_secs(secs).min(self.key_retention)
        });
        let first_sent = entry
            .recorded_at
            .map(|secs| UNIX_EPOCH + Duration::from_secs(secs));
        let held = Held::since_first_send(first_sent.unwrap_or(UNIX_EPOCH), retention);
        if !resumed || held.covers(SystemTime::now(), self.policy.deadline) {
            return Ok(held);
        }
        let gone = || Error::KeyGone {
            name: entry.name.clone(),
            key: entry.key.clone(),
            first_sent,
            list: write.list.clone(),
        };
        // No answer to the question is no answer to the write either: the outcome stays
        // unknown, and the next run asks again.
        let asked = self.inspect(&entry.key, write.kind).await;
        let asked = asked.map_err(|error| match error {
            Error::OutcomeUnknown { attempts, last, .. } => Error::OutcomeUnknown {
                key: Some(entry.key.clone()),
                attempts,
                last,
                resend_before: None,
            },
            other => other,
        })?;
        let Some((record, service_now)) = asked else {
            return Err(gone());
        };
        let held = Held::from_record(&record, service_now, SystemTime::now(), retention);
        let held = held.ok_or_else(gone)?;
        if held
            .window(SystemTime::now(), self.policy.deadline)
            .is_zero()
        {
            return Err(gone());
        }
        Ok(held)
    }
}

fn unix_secs(at: SystemTime) -> u64 {
    at.duration_since(UNIX_EPOCH)
        .map_or(0, |since| since.as_secs())
}
