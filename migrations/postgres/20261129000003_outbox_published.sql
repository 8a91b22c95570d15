-- Published outbox rows by publication time, for the reaper, which deletes those older than
-- workers.outbox_retention_secs a batch at a time. Without it every batch would read the whole
-- table, which holds one row per charge of the retention period. Unpublished rows (the relay's
-- work, served by outbox_events_unpublished) are left out.
CREATE INDEX outbox_events_published ON outbox_events (published_at)
    WHERE published_at IS NOT NULL;
