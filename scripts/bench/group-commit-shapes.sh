#!/usr/bin/env bash
# What grouping a first charge's writes could buy on PostgreSQL, measured with pgbench on the
# database alone (no service, no processor): the same rows written in ten shapes, BATCH
# charges per pgbench transaction (8 unless set), against the bench floor's one statement per
# charge.
#
#   scripts/bench/group-commit-shapes.sh [SECONDS]
#   BATCH=16 CLIENTS=1 SHAPES="floor unguarded rows" scripts/bench/group-commit-shapes.sh 8
#
#   floor     the charge's rows in one statement and one commit (POST /bench/charge)
#   alone     a first charge as the service writes it: the lock-free read, the claim's
#             INSERT, and the finish's transaction (BEGIN, the record's SELECT .. FOR UPDATE,
#             the charge's statement, the record's completion, COMMIT)
#   claims    the same, the batch's claims in one INSERT .. SELECT FROM UNNEST (what the
#             service wrote until its finish stopped taking the record's lock first)
#   noread    the same without the lock-free reads (what a claim costs that is not read first)
#   reads     the claims in one statement, and the batch's lock-free reads in one SELECT
#   shared    the claims in one statement, the batch's finishes in one transaction, each under
#             a SAVEPOINT of its own (the shape of SQLite's group commit)
#   unguarded the same without the savepoints (one member's error fails them all)
#   nolock    claims, with each finish's transaction taking no lock first (the record's
#             fenced completion locks it): what the service writes
#   one       the claims in one statement, and each finish as ONE statement in a transaction of
#             its own (the record's fenced completion with the charge's rows)
#   onenoread the same without the lock-free reads
#   claimread nolock, with the lock-free reads in the claims' statement (each claim's insert,
#             or the record that was there before it)
#   rows      the claims in one statement, the batch's finishes as one statement per kind of
#             row (records locked, charges with their ledger and events, records completed)
#
# Each shape runs for SECONDS (default 10) with CLIENTS clients (16 unless set; a client is
# one connection, whose statements run one after another) on a database made from
# migrations/postgres and preloaded (then analyzed) with a few thousand charges. It prints
# charges per second and the machine's CPU per charge (every process: pgbench too).
# PostgreSQL from BENCH_DATABASE_URL (default postgres://postgres@127.0.0.1:5432).
set -euo pipefail
command -v pgbench >/dev/null || { echo "group-commit-shapes.sh: needs pgbench (Debian: postgresql-client)" >&2; exit 1; }
cd "$(dirname "$0")/../.."
SECONDS_PER_SHAPE="${1:-10}"
SERVER="${BENCH_DATABASE_URL:-postgres://postgres@127.0.0.1:5432}"
DB="shapes_$$"
URL="$SERVER/$DB"
WORK="$(mktemp -d)"
cleanup() { psql -q "$SERVER/postgres" -c "DROP DATABASE IF EXISTS $DB WITH (FORCE)" || true; rm -rf "$WORK"; }
trap cleanup EXIT
psql -q "$SERVER/postgres" -c "CREATE DATABASE $DB"
for migration in migrations/postgres/*.sql; do psql -q -v ON_ERROR_STOP=1 "$URL" -f "$migration"; done

BATCH="${BATCH:-8}"
python3 - "$WORK" "$BATCH" <<'EOF'
import sys
out = sys.argv[1]
N = int(sys.argv[2])
record = "tenant_id = 't1' AND operation = 'charges.create'"
read = "SELECT r.*, now() AS db_now FROM idempotency_records r WHERE " + record + " AND idempotency_key = :K::text;"
claim = ("INSERT INTO idempotency_records (tenant_id, operation, idempotency_key, fingerprint, request_version, state, recovery_point, locked_until, attempts, resource_id, processor_key, created_at, expires_at, updated_at, request_body) "
         "VALUES ('t1', 'charges.create', :K::text, sha256(:K::text::bytea), 1, 'pending', 'started', now() + make_interval(secs => 30), 1, md5(:K::text)::uuid, 'effect_' || :K, now(), now() + make_interval(secs => 86400), now(), '{\"amount\":1000,\"currency\":\"USD\",\"source\":\"tok_visa\"}'::bytea) "
         "ON CONFLICT (tenant_id, operation, idempotency_key) DO NOTHING RETURNING attempts;")
lock = "SELECT attempts FROM idempotency_records WHERE " + record + " AND idempotency_key = :K::text AND attempts = 1 AND resource_id = md5(:K::text)::uuid AND state = 'pending' FOR UPDATE;"
entries = "UNNEST('{1,2}'::smallint[], '{processor_receivable,customer_payments}'::text[], '{USD,USD}'::text[], '{1000,-1000}'::bigint[]) AS e(line, account, currency, amount)"
charge = ("WITH charge AS (INSERT INTO charges (id, tenant_id, amount, currency, source, description, status, processor_charge_id, created_at) VALUES (md5(:K::text)::uuid, 't1', 1000, 'USD', 'tok_visa', NULL, 'succeeded', 'ch_' || :K, now()) RETURNING id, tenant_id), "
          "ledger AS (INSERT INTO ledger_transactions (id, tenant_id, charge_id) SELECT gen_random_uuid(), charge.tenant_id, charge.id FROM charge RETURNING id, tenant_id), "
          "entries AS (INSERT INTO ledger_entries (transaction_id, line, tenant_id, account, currency, amount) SELECT ledger.id, e.line, ledger.tenant_id, e.account, e.currency, e.amount FROM ledger, " + entries + ") "
          "INSERT INTO outbox_events (id, tenant_id, event_type, aggregate_id, payload) SELECT gen_random_uuid(), charge.tenant_id, 'payment.completed', charge.id, '{\"type\":\"payment.completed\"}'::jsonb FROM charge;")
completion = ("SET state = 'completed', recovery_point = 'finished', locked_until = NULL, response_status = 201, response_headers = '{\"content-type\":\"application/json\"}'::jsonb, "
              "response_body = '{\"object\":\"charge\",\"amount\":1000,\"currency\":\"USD\",\"status\":\"succeeded\"}'::bytea, response_schema_version = 1, expires_at = now() + make_interval(secs => 86400), updated_at = now()")
complete = "UPDATE idempotency_records " + completion + " WHERE " + record + " AND idempotency_key = :K::text AND attempts = 1 AND resource_id = md5(:K::text)::uuid AND state = 'pending' RETURNING expires_at;"
keys = "ARRAY[" + ",".join(f":k{i}::text" for i in range(N)) + "]"
claims = (claim.split(" VALUES ")[0] + " SELECT 't1', 'charges.create', k, sha256(k::bytea), 1, 'pending', 'started', now() + make_interval(secs => 30), 1, md5(k)::uuid, 'effect_' || k, now(), now() + make_interval(secs => 86400), now(), '{}'::bytea "
          f"FROM UNNEST({keys}) AS k ON CONFLICT (tenant_id, operation, idempotency_key) DO NOTHING RETURNING resource_id, attempts;")
lock_rows = f"SELECT r.attempts FROM UNNEST({keys}) AS b(k) JOIN idempotency_records r ON r.tenant_id = 't1' AND r.operation = 'charges.create' AND r.idempotency_key = b.k WHERE r.attempts = 1 AND r.state = 'pending' FOR UPDATE OF r;"
charge_rows = (f"WITH b AS (SELECT k, md5(k)::uuid AS id, gen_random_uuid() AS tx FROM UNNEST({keys}) AS k), "
               "charge AS (INSERT INTO charges (id, tenant_id, amount, currency, source, description, status, processor_charge_id, created_at) SELECT b.id, 't1', 1000, 'USD', 'tok_visa', NULL, 'succeeded', 'ch_' || b.k, now() FROM b), "
               "ledger AS (INSERT INTO ledger_transactions (id, tenant_id, charge_id) SELECT b.tx, 't1', b.id FROM b), "
               "entries AS (INSERT INTO ledger_entries (transaction_id, line, tenant_id, account, currency, amount) SELECT b.tx, e.line, 't1', e.account, e.currency, e.amount FROM b, " + entries + ") "
               "INSERT INTO outbox_events (id, tenant_id, event_type, aggregate_id, payload) SELECT gen_random_uuid(), 't1', 'payment.completed', b.id, '{\"type\":\"payment.completed\"}'::jsonb FROM b;")
# The finish as ONE statement, in a transaction of its own: the record's fenced completion, and
# the charge's rows inserted only if the completion matched (the rows read the record's
# RETURNING, so a fenced-off finish inserts nothing).
finish_one = ("WITH record AS (UPDATE idempotency_records " + completion + " WHERE " + record + " AND idempotency_key = :K::text AND attempts = 1 AND resource_id = md5(:K::text)::uuid AND state = 'pending' RETURNING resource_id, expires_at), "
              "charge AS (INSERT INTO charges (id, tenant_id, amount, currency, source, description, status, processor_charge_id, created_at) SELECT record.resource_id, 't1', 1000, 'USD', 'tok_visa', NULL, 'succeeded', 'ch_' || :K, now() FROM record RETURNING id, tenant_id), "
              "ledger AS (INSERT INTO ledger_transactions (id, tenant_id, charge_id) SELECT gen_random_uuid(), charge.tenant_id, charge.id FROM charge RETURNING id, tenant_id), "
              "entries AS (INSERT INTO ledger_entries (transaction_id, line, tenant_id, account, currency, amount) SELECT ledger.id, e.line, ledger.tenant_id, e.account, e.currency, e.amount FROM ledger, " + entries + "), "
              "event AS (INSERT INTO outbox_events (id, tenant_id, event_type, aggregate_id, payload) SELECT gen_random_uuid(), charge.tenant_id, 'payment.completed', charge.id, '{\"type\":\"payment.completed\"}'::jsonb FROM charge) "
              "SELECT expires_at FROM record;")
# The claims' inserts and the records already there, in one statement: the outer SELECT reads
# the snapshot from before the inserts.
claim_read = ("WITH claim AS (SELECT k, md5(k)::uuid AS resource_id FROM UNNEST(" + keys + ") AS k), "
              "inserted AS (" + claim.split(" VALUES ")[0] + " SELECT 't1', 'charges.create', k, sha256(k::bytea), 1, 'pending', 'started', now() + make_interval(secs => 30), 1, resource_id, 'effect_' || k, now(), now() + make_interval(secs => 86400), now(), '{}'::bytea "
              "FROM claim ON CONFLICT (tenant_id, operation, idempotency_key) DO NOTHING RETURNING resource_id, attempts) "
              "SELECT claim.k, inserted.attempts, r.*, now() AS db_now FROM claim LEFT JOIN inserted ON inserted.resource_id = claim.resource_id "
              "LEFT JOIN idempotency_records r ON r.tenant_id = 't1' AND r.operation = 'charges.create' AND r.idempotency_key = claim.k;")
complete_rows = f"UPDATE idempotency_records r {completion} FROM UNNEST({keys}) AS b(k) WHERE r.tenant_id = 't1' AND r.operation = 'charges.create' AND r.idempotency_key = b.k AND r.attempts = 1 AND r.state = 'pending' RETURNING r.expires_at;"

read_all = f"SELECT r.*, now() AS db_now FROM UNNEST({keys}) AS b(k) JOIN idempotency_records r ON r.tenant_id = 't1' AND r.operation = 'charges.create' AND r.idempotency_key = b.k;"
def each(statement): return "".join(statement.replace(":K", f":k{i}") + "\n" for i in range(N))
def members(savepoint):
    return "".join(("SAVEPOINT member;\n" if savepoint else "") + "\n".join(s.replace(":K", f":k{i}") for s in (lock, charge, complete)) + "\n" + ("RELEASE member;\n" if savepoint else "") for i in range(N))
head = "\\set k random(1, 99999999999)\n" + "".join(f"\\set k{i} :k * {N} + {i}\n" for i in range(N))
finish_alone = "".join("BEGIN;\n" + "\n".join(s.replace(":K", f":k{i}") for s in (lock, charge, complete)) + "\nCOMMIT;\n" for i in range(N))
finish_unlocked = "".join("BEGIN;\n" + "\n".join(s.replace(":K", f":k{i}") for s in (charge, complete)) + "\nCOMMIT;\n" for i in range(N))
shapes = {
    "floor": "\\set k random(1, 999999999999)\n" + charge.replace(":K", ":k") + "\n",
    "alone": head + "".join("\n".join(s.replace(":K", f":k{i}") for s in (read, claim, "BEGIN;", lock, charge, complete, "COMMIT;")) + "\n" for i in range(N)),
    "claims": head + each(read) + claims + "\n" + finish_alone,
    "noread": head + claims + "\n" + finish_alone,
    "reads": head + read_all + "\n" + claims + "\n" + finish_alone,
    "shared": head + each(read) + claims + "\nBEGIN;\n" + members(True) + "COMMIT;\n",
    "unguarded": head + each(read) + claims + "\nBEGIN;\n" + members(False) + "COMMIT;\n",
    "nolock": head + each(read) + claims + "\n" + finish_unlocked,
    "claimread": head + claim_read + "\n" + finish_unlocked,
    "one": head + each(read) + claims + "\n" + each(finish_one),
    "onenoread": head + claims + "\n" + each(finish_one),
    "rows": head + each(read) + claims + "\nBEGIN;\n" + lock_rows + "\n" + charge_rows + "\n" + complete_rows + "\nCOMMIT;\n",
}
for name, script in shapes.items():
    open(f"{out}/{name}.sql", "w").write(script)
EOF

busy() { awk '/^cpu /{print $2+$3+$4+$7+$8}' /proc/stat; }
run() {
    local clients="${CLIENTS:-16}"
    pgbench -n -M prepared -c "$clients" -j "$((clients < 2 ? 1 : 2))" -T "$2" -f "$WORK/$1.sql" "$URL" 2>&1
}
# Preload, so that the plans are made on analyzed tables of some size.
run unguarded 5 >/dev/null
psql -q "$URL" -c ANALYZE
printf '| shape | charges/s | machine CPU µs per charge | x floor |\n| --- | ---: | ---: | ---: |\n'
floor_rate=""
for shape in ${SHAPES:-floor alone claims nolock noread reads shared unguarded claimread one onenoread rows}; do
    per=$BATCH; [ "$shape" = floor ] && per=1
    psql -q "$URL" -c CHECKPOINT
    before=$(busy)
    out="$(run "$shape" "$SECONDS_PER_SHAPE")"
    after=$(busy)
    grep -q "number of failed transactions: 0 " <<<"$out" || { echo "$shape failed: $out" >&2; exit 1; }
    txns=$(awk '/processed:/{print $NF}' <<<"$out" | cut -d/ -f1)
    tps=$(awk '/^tps/{print $3}' <<<"$out")
    rate=$(python3 -c "print(round($tps * $per))")
    [ -z "$floor_rate" ] && floor_rate=$rate
    python3 -c "
ticks = $after - $before; charges = $txns * $per
print('| $shape | {:,} | {:,.0f} | {:.2f} |'.format($rate, ticks * 1e6 / $(getconf CLK_TCK) / charges, $rate / $floor_rate))"
done
