//! Refunds, written once for both backends: [`impl_refund_repository!`] implements
//! `RefundRepository` for a backend's store, with the same statements on PostgreSQL and
//! SQLite but for what each backend's [`Dialect`](crate::fenced::Dialect) supplies (the clock,
//! the row lock, the time binding, the order a ledger transaction is sealed in).
//!
//! A refund's row has the id of its record's generation. While pending, it is the refund's
//! reservation on its charge (`charges.amount_reserved`); the finish makes it succeeded, and a
//! definitive failure deletes it and gives its amount back to the charge, in the same
//! transaction as the record's completion either way.

/// The columns of a `refunds` row ([`RefundRow`](crate::rows::RefundRow)).
pub(crate) const SELECT_REFUNDS: &str = "SELECT id, tenant_id, charge_id, amount, currency, \
                                         reason, processor_refund_id, created_at FROM refunds";

/// A refund row with the processor's id of its charge
/// ([`ReservedRow`](crate::rows::ReservedRow)).
pub(crate) const SELECT_RESERVED: &str = "SELECT r.id AS id, r.tenant_id AS tenant_id, \
     r.charge_id AS charge_id, r.amount AS amount, r.currency AS currency, r.reason AS reason, \
     r.processor_refund_id AS processor_refund_id, r.created_at AS created_at, \
     c.processor_charge_id AS charge_processor_id \
     FROM refunds r JOIN charges c ON c.id = r.charge_id WHERE r.id = ";

/// Implements `RefundRepository` for `$store`, whose `pool` and `policy` are those of database
/// `$db`, and whose method `$begin` opens a write transaction (dereferencing to a connection,
/// with an `async fn commit`).
macro_rules! impl_refund_repository {
    ($store:ty, $db:ty, $begin:ident) => {
        const _: () = {
            use chrono::{DateTime, Utc};
            use payments_domain::{
                LedgerTransaction, PAYMENT_REFUNDED, PaymentRefunded, Refund, RefundId,
                RefundRequest, RefundStatus, TenantId,
            };
            use payments_idempotency::StoredResponse;
            use sqlx::QueryBuilder;
            use uuid::Uuid;

            use $crate::StoreError;
            use $crate::fenced::{self, Dialect};
            use $crate::model::{
                Completion, Fence, Finish, ListRefunds, Owner, RefundPage, RefundRefusal, Reservation,
            };
            use $crate::refunding::{SELECT_REFUNDS, SELECT_RESERVED};
            use $crate::rows::{RefundRow, RefundableRow, ReservedRow};

            impl $store {
                /// Ends the record with `ending` (a fenced statement `RETURNING expires_at`)
                /// and releases the generation's reservation, in one transaction.
                async fn end_without_refund(
                    &self,
                    mut ending: QueryBuilder<'_, $db>,
                    fence: Fence,
                ) -> Result<Completion, StoreError> {
                    let mut tx = self.$begin().await?;
                    let completion = Self::complete_on(&mut tx, &mut ending).await?;
                    if completion == Completion::Fenced {
                        return Ok(completion);
                    }
                    Self::release_reservation(&mut tx, fence.resource_id).await?;
                    tx.commit().await?;
                    Ok(completion)
                }

                /// Deletes the pending refund `refund` and gives its amount back to its charge,
                /// on the caller's transaction. Nothing to do when the generation reserved
                /// nothing.
                async fn release_reservation(
                    conn: &mut <$db as sqlx::Database>::Connection,
                    refund: Uuid,
                ) -> Result<(), StoreError> {
                    let mut delete = QueryBuilder::<$db>::new("DELETE FROM refunds WHERE id = ");
                    delete
                        .push_bind(refund)
                        .push(" AND status = 'pending' RETURNING charge_id, amount");
                    let released: Option<(Uuid, i64)> =
                        delete.build_query_as().fetch_optional(&mut *conn).await?;
                    if let Some((charge, amount)) = released {
                        let mut give_back = QueryBuilder::<$db>::new(
                            "UPDATE charges SET amount_reserved = amount_reserved - ",
                        );
                        give_back
                            .push_bind(amount)
                            .push(" WHERE id = ")
                            .push_bind(charge);
                        give_back.build().execute(&mut *conn).await?;
                    }
                    Ok(())
                }

                /// The reversing ledger transaction of `refund` and its `payment.refunded`
                /// event, on the caller's transaction.
                async fn post_refund(
                    conn: &mut <$db as sqlx::Database>::Connection,
                    refund: &Refund,
                ) -> Result<(), StoreError> {
                    let ledger = LedgerTransaction::for_refund(refund);
                    let tenant = refund.tenant.as_str();
                    let mut entries = QueryBuilder::<$db>::new(
                        "INSERT INTO ledger_entries
                             (transaction_id, line, tenant_id, account, currency, amount) ",
                    );
                    entries.push_values((1_i16..).zip(ledger.entries()), |mut row, (line, e)| {
                        row.push_bind(ledger.id())
                            .push_bind(line)
                            .push_bind(tenant)
                            .push_bind(e.account.name())
                            .push_bind(e.currency.code())
                            .push_bind(e.amount);
                    });
                    let mut transaction = QueryBuilder::<$db>::new(
                        "INSERT INTO ledger_transactions
                             (id, tenant_id, charge_id, refund_id, created_at) VALUES (",
                    );
                    transaction
                        .separated(", ")
                        .push_bind(ledger.id())
                        .push_bind(tenant)
                        .push_bind(refund.charge.as_uuid())
                        .push_bind(refund.id.as_uuid())
                        .push(<$db as Dialect>::NOW);
                    transaction.push(")");
                    if <$db as Dialect>::SEALS_LEDGER_LAST {
                        entries.build().execute(&mut *conn).await?;
                        transaction.build().execute(&mut *conn).await?;
                    } else {
                        transaction.build().execute(&mut *conn).await?;
                        entries.build().execute(&mut *conn).await?;
                    }
                    let event = PaymentRefunded::for_refund(refund);
                    let payload = serde_json::to_value(&event)
                        .map_err(|e| StoreError::Corrupt(format!("event payload: {e}")))?;
                    let mut outbox = QueryBuilder::<$db>::new(
                        "INSERT INTO outbox_events
                             (id, tenant_id, event_type, aggregate_id, payload, created_at)
                         VALUES (",
                    );
                    outbox
                        .separated(", ")
                        .push_bind(event.event_id)
                        .push_bind(tenant)
                        .push_bind(PAYMENT_REFUNDED)
                        .push_bind(refund.id.as_uuid())
                        .push_bind(payload)
                        .push(<$db as Dialect>::NOW);
                    outbox.push(")");
                    outbox.build().execute(&mut *conn).await?;
                    Ok(())
                }
            }

            #[async_trait::async_trait]
            impl $crate::repository::RefundRepository for $store {
                async fn reserve_refund(
                    &self,
                    owner: Owner<'_>,
                    request: &RefundRequest,
                    created_at: DateTime<Utc>,
                ) -> Result<Reservation, StoreError> {
                    let mut tx = self.$begin().await?;
                    // The fence first, which also locks the record until the commit: the
                    // completer cannot fail this generation while its reservation is made.
                    let mut touch = QueryBuilder::<$db>::new(
                        "UPDATE idempotency_records SET locked_until = locked_until",
                    );
                    fenced::push_touched_where_fenced(&mut touch, owner);
                    if Finish::from_rows(touch.build().execute(&mut *tx).await?.rows_affected())
                        == Finish::Fenced
                    {
                        return Ok(Reservation::Fenced);
                    }
                    let mut made = QueryBuilder::<$db>::new(SELECT_RESERVED);
                    made.push_bind(owner.fence.resource_id);
                    let made: Option<ReservedRow> =
                        made.build_query_as().fetch_optional(&mut *tx).await?;
                    if let Some(made) = made {
                        return Ok(Reservation::Reserved {
                            refund: made.refund.into_refund()?,
                            processor_charge_id: made.charge_processor_id,
                        });
                    }
                    let mut charge = QueryBuilder::<$db>::new(
                        "SELECT amount, currency, amount_reserved, processor_charge_id
                         FROM charges WHERE tenant_id = ",
                    );
                    charge
                        .push_bind(owner.scope.tenant.as_str())
                        .push(" AND id = ")
                        .push_bind(request.charge.as_uuid())
                        .push(<$db as Dialect>::LOCK_ROW);
                    let charge: Option<RefundableRow> =
                        charge.build_query_as().fetch_optional(&mut *tx).await?;
                    let Some(charge) = charge else {
                        return Ok(Reservation::Refused(RefundRefusal::NoSuchCharge));
                    };
                    let amount = match RefundRefusal::judge(
                        charge.amount,
                        charge.amount_reserved,
                        request.amount,
                    ) {
                        Ok(amount) => amount,
                        Err(refusal) => return Ok(Reservation::Refused(refusal)),
                    };
                    let money = $crate::rows::money(amount.minor_units(), &charge.currency)?;
                    let refund = Refund {
                        id: RefundId::from_uuid(owner.fence.resource_id),
                        tenant: TenantId::new(owner.scope.tenant.clone()),
                        charge: request.charge,
                        money,
                        reason: request.reason,
                        status: RefundStatus::Pending,
                        created_at,
                    };
                    let mut reserve = QueryBuilder::<$db>::new(
                        "UPDATE charges SET amount_reserved = amount_reserved + ",
                    );
                    reserve
                        .push_bind(amount.minor_units())
                        .push(" WHERE id = ")
                        .push_bind(refund.charge.as_uuid());
                    reserve.build().execute(&mut *tx).await?;
                    let mut insert = QueryBuilder::<$db>::new(
                        "INSERT INTO refunds
                             (id, tenant_id, charge_id, amount, currency, reason, status, created_at)
                         VALUES (",
                    );
                    let mut values = insert.separated(", ");
                    values
                        .push_bind(refund.id.as_uuid())
                        .push_bind(refund.tenant.as_str())
                        .push_bind(refund.charge.as_uuid())
                        .push_bind(amount.minor_units())
                        .push_bind(money.currency.code())
                        .push_bind(refund.reason.map(|r| r.name()))
                        .push("'pending'");
                    insert.push(", ");
                    <$db as Dialect>::push_time(&mut insert, created_at);
                    insert.push(")");
                    insert.build().execute(&mut *tx).await?;
                    tx.commit().await?;
                    Ok(Reservation::Reserved {
                        refund,
                        processor_charge_id: charge.processor_charge_id,
                    })
                }

                async fn finish_refund(
                    &self,
                    owner: Owner<'_>,
                    refund: &Refund,
                    response: &StoredResponse,
                ) -> Result<Completion, StoreError> {
                    let RefundStatus::Succeeded {
                        processor_refund_id,
                    } = &refund.status
                    else {
                        return Err(StoreError::Corrupt(format!(
                            "refund {} finished without a processor refund",
                            refund.id
                        )));
                    };
                    let mut complete =
                        fenced::complete::<$db>(owner, response, self.policy.ttl)?;
                    let mut tx = self.$begin().await?;
                    let completion = Self::complete_on(&mut tx, &mut complete).await?;
                    if completion == Completion::Fenced {
                        return Ok(completion);
                    }
                    let mut succeed = QueryBuilder::<$db>::new(
                        "UPDATE refunds SET status = 'succeeded', processor_refund_id = ",
                    );
                    succeed
                        .push_bind(processor_refund_id.as_str())
                        .push(" WHERE id = ")
                        .push_bind(refund.id.as_uuid())
                        .push(" AND status = 'pending'");
                    let succeeded = succeed.build().execute(&mut *tx).await?;
                    if succeeded.rows_affected() != 1 {
                        return Err(StoreError::Corrupt(format!(
                            "refund {} has no reservation to finish",
                            refund.id
                        )));
                    }
                    let mut refunded = QueryBuilder::<$db>::new(
                        "UPDATE charges SET amount_refunded = amount_refunded + ",
                    );
                    refunded
                        .push_bind(refund.money.amount.minor_units())
                        .push(" WHERE id = ")
                        .push_bind(refund.charge.as_uuid());
                    refunded.build().execute(&mut *tx).await?;
                    Self::post_refund(&mut tx, refund).await?;
                    tx.commit().await?;
                    Ok(completion)
                }

                async fn refuse_refund(
                    &self,
                    owner: Owner<'_>,
                    response: &StoredResponse,
                ) -> Result<Completion, StoreError> {
                    let complete = fenced::complete_without_effect::<$db>(
                        owner,
                        response,
                        self.policy.ttl,
                    )?;
                    self.end_without_refund(complete, owner.fence).await
                }

                async fn fail_refund(
                    &self,
                    owner: Owner<'_>,
                ) -> Result<Finish, StoreError> {
                    let fail = fenced::fail::<$db>(owner, self.policy.ttl);
                    Ok(match self.end_without_refund(fail, owner.fence).await? {
                        Completion::Stored { .. } => Finish::Written,
                        Completion::Fenced => Finish::Fenced,
                    })
                }

                async fn get_refund(
                    &self,
                    tenant: &TenantId,
                    id: RefundId,
                ) -> Result<Option<Refund>, StoreError> {
                    let mut sql = QueryBuilder::<$db>::new(SELECT_REFUNDS);
                    sql.push(" WHERE tenant_id = ")
                        .push_bind(tenant.as_str())
                        .push(" AND id = ")
                        .push_bind(id.as_uuid());
                    let row: Option<RefundRow> =
                        sql.build_query_as().fetch_optional(&self.pool).await?;
                    row.map(RefundRow::into_refund).transpose()
                }

                async fn list_refunds(
                    &self,
                    tenant: &TenantId,
                    page: ListRefunds,
                ) -> Result<Option<RefundPage>, StoreError> {
                    let cursor = match page.starting_after {
                        Some(id) => match self.get_refund(tenant, id).await? {
                            Some(refund) if refund.charge == page.charge => Some(refund),
                            _ => return Ok(None),
                        },
                        None => None,
                    };
                    let mut sql = QueryBuilder::<$db>::new(SELECT_REFUNDS);
                    sql.push(" WHERE tenant_id = ")
                        .push_bind(tenant.as_str())
                        .push(" AND charge_id = ")
                        .push_bind(page.charge.as_uuid());
                    if let Some(cursor) = &cursor {
                        sql.push(" AND (created_at, id) < (");
                        <$db as Dialect>::push_time(&mut sql, cursor.created_at);
                        sql.push(", ").push_bind(cursor.id.as_uuid()).push(")");
                    }
                    sql.push(" ORDER BY created_at DESC, id DESC LIMIT ")
                        .push_bind(i64::from(page.limit) + 1);
                    let rows = sql.build_query_as().fetch_all(&self.pool).await?;
                    $crate::rows::refund_page(rows, page.limit).map(Some)
                }
            }
        };
    };
}

pub(crate) use impl_refund_repository;
