-- The events API (GET /events) pages through a tenant's events in one fixed order: `position`.
--
-- SQLite has one writer at a time, so a row's position, taken inside its write transaction,
-- is also the order the rows commit in: a reader that sees position 11 has seen 10. A trigger
-- numbers each new row one past the highest, so the statements that insert events are the
-- same as PostgreSQL's. The rowid is not used: VACUUM may renumber it.
ALTER TABLE outbox_events ADD COLUMN position INTEGER;

UPDATE outbox_events SET position = rowid;

CREATE UNIQUE INDEX outbox_events_position ON outbox_events (position);

CREATE INDEX outbox_events_feed ON outbox_events (tenant_id, position);

CREATE TRIGGER outbox_events_numbered
    AFTER INSERT ON outbox_events
BEGIN
    UPDATE outbox_events
    SET position = (SELECT coalesce(max(position), 0) + 1 FROM outbox_events)
    WHERE rowid = NEW.rowid;
END;

-- Without a stream, the events API is the outbox's only reader and the reaper deletes rows by
-- age alone, oldest first, along this index.
CREATE INDEX outbox_events_created ON outbox_events (created_at);
