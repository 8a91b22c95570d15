-- The events API (GET /events) pages through a tenant's events in one fixed order, and a page
-- must never skip an event that commits later with an earlier place in that order.
--
-- `position` numbers the rows as they are inserted, but concurrent transactions commit in
-- another order: a reader could see position 11 before position 10 commits, page past it, and
-- never see 10. So the order is by `writer_xact`, the id of the transaction that wrote the row,
-- then `position`, and a reader shows only rows whose transaction is older than its snapshot's
-- xmin (`pg_snapshot_xmin(pg_current_snapshot())`): every transaction below xmin has ended,
-- so no row can ever appear before one already shown. Rows of a transaction still running, or
-- of one younger than the oldest still running, wait for it; they are never lost.
--
-- Rows already here get the migration's own transaction id, in the order `position` gives them.
ALTER TABLE outbox_events
    ADD COLUMN position    bigint GENERATED ALWAYS AS IDENTITY,
    ADD COLUMN writer_xact xid8   NOT NULL DEFAULT pg_current_xact_id();

CREATE INDEX outbox_events_feed ON outbox_events (tenant_id, writer_xact, position);

-- Without a stream, the events API is the outbox's only reader and the reaper deletes rows by
-- age alone, oldest first, along this index.
CREATE INDEX outbox_events_created ON outbox_events (created_at);
