-- The request a record was claimed for, as canonical JSON. The completer needs it to finish an
-- abandoned charge without the client (amount, currency, source, description); the fingerprint
-- alone cannot give them back. Card sources are tokens, never card numbers.
ALTER TABLE idempotency_records ADD COLUMN request_body bytea;
