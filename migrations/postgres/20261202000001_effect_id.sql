-- The record keeps the processor's id of whatever effect its operation made (a charge, a
-- refund), not only of charges: the column says so. Data and constraints are kept.
ALTER TABLE idempotency_records RENAME COLUMN processor_charge_id TO effect_id;
