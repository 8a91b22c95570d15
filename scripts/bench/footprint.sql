-- The space one idempotency record takes in PostgreSQL, as one line of space-separated
-- numbers for scripts/bench.sh:
--   rows  avg_row_bytes  heap_bytes  index_bytes  total_bytes  total_bytes_per_row
-- avg_row_bytes is pg_column_size of the whole row (header and data, no page or index
-- overhead); total_bytes is pg_total_relation_size (heap, indexes, TOAST, free space maps).

SELECT count(*),
       round(avg(pg_column_size(r.*)), 1),
       pg_relation_size('idempotency_records'),
       pg_indexes_size('idempotency_records'),
       pg_total_relation_size('idempotency_records'),
       round(pg_total_relation_size('idempotency_records')::numeric / greatest(count(*), 1), 1)
FROM idempotency_records AS r;
