-- Bulk-loads completed idempotency records for tenant acme, shaped like the ones the service
-- writes for a 201 charge: the same key length (a UUID, as client libraries generate),
-- fingerprint, processor key and charge id, the two stored headers, a 260-byte response body
-- and the canonical request body. Then it vacuums, analyzes and checkpoints, so that neither
-- autovacuum nor a checkpoint caused by the load runs during the measurement.
--
-- psql variables:
--   rows     how many records
--   expired  'false': created within the last hour, expiring in 24 h (the growth scenarios)
--            'true':  created two days ago, expired a day ago (the reaper scenario), each
--                     with the charge row its processor charge id stands for: the reaper
--                     never deletes a record holding a processor charge id without one
--
--   psql -v rows=1000000 -v expired=false -f preload.sql

\set ON_ERROR_STOP on

INSERT INTO idempotency_records
    (tenant_id, operation, idempotency_key, fingerprint, state, recovery_point, locked_until,
     attempts, resource_id, processor_key, effect_id, response_status,
     response_headers, response_body, response_schema_version, created_at, expires_at,
     updated_at, request_body)
SELECT 'acme', 'charges.create', v.idem_key, sha256(convert_to(v.idem_key, 'UTF8')),
       'completed', 'finished', NULL,
       1, v.resource_id, 'pay_' || replace(v.resource_id::text, '-', ''), v.processor_charge_id,
       201,
       jsonb_build_array(jsonb_build_array('content-type', 'application/json'),
                         jsonb_build_array('location', '/charges/ch_' || v.resource_id)),
       convert_to(
           '{"id":"ch_' || v.resource_id || '","object":"charge","amount":100,'
           || '"currency":"USD","source":"tok_visa","description":null,"status":"succeeded",'
           || '"processor_charge_id":"' || v.processor_charge_id || '","created_at":"'
           || to_char(v.created_at AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US"Z"') || '"}',
           'UTF8'),
       1, v.created_at, v.created_at + interval '24 hours', v.created_at,
       convert_to('{"amount":100,"currency":"usd","source":"tok_visa"}', 'UTF8')
FROM generate_series(1, :rows) AS n,
     LATERAL (
         SELECT md5('key' || n)::uuid::text AS idem_key,
                md5('resource' || n)::uuid AS resource_id,
                'sim_' || md5('charge' || n) AS processor_charge_id,
                CASE WHEN :'expired'::boolean
                     THEN now() - interval '48 hours' - make_interval(secs => n % 3600)
                     ELSE now() - make_interval(secs => n % 3600)
                END AS created_at
     ) AS v;

\if :expired
INSERT INTO charges
    (id, tenant_id, amount, currency, source, description, status, processor_charge_id, created_at)
SELECT resource_id, tenant_id, 100, 'USD', 'tok_visa', NULL, 'succeeded', effect_id,
       created_at
FROM idempotency_records
WHERE expires_at <= now() AND effect_id IS NOT NULL
ON CONFLICT DO NOTHING;
VACUUM (ANALYZE) charges;
\endif

VACUUM (ANALYZE) idempotency_records;
CHECKPOINT;
