#!/usr/bin/env bash
# A guided walk through the idempotency state machine with curl, against a running service,
# and last through reconciliation as an operator sees it.
#
#   cargo run                              # in another terminal: serves on 127.0.0.1:8080
#   scripts/demo.sh                        # talks to http://127.0.0.1:8080
#   scripts/demo.sh http://127.0.0.1:18080 # or to any other instance
#
# Every step prints the request and the response (status line, the headers that matter, the
# body pretty-printed) and checks what it demonstrates: the script exits non-zero naming the
# step whose answer differed, so a test can rely on its exit code.
#
# Keys are fresh on every run, so the script can be run again and again against one service.
# Needs only bash, curl and coreutils; python3 or jq, when present, pretty-print the JSON. Where
# the `payments` command line is built (PAYMENTS_CLI, or `payments` on the PATH), a last step
# shows the caller's half with it.
set -euo pipefail

BASE_URL="${1:-http://127.0.0.1:8080}"
BASE_URL="${BASE_URL%/}"
AUTH="Authorization: Bearer sk_test_acme"
# The demo's operator key (the operator `demo`), which serves beside the demo tenant keys.
OPS_AUTH="Authorization: Bearer sk_test_ops"
# One prefix per run: the service remembers keys for 24 hours, so reusing one would replay an
# earlier run's answer instead of demonstrating a first request.
RUN="demo-$(date +%s)-$RANDOM"

command -v curl >/dev/null 2>&1 || { echo "demo.sh: curl is required" >&2; exit 1; }
PAYMENTS_CLI="${PAYMENTS_CLI:-$(command -v payments || true)}"
STEPS=12

WORK=$(mktemp -d)
BACKGROUND_PID=""
cleanup() {
    # Do not leave the background slow charge running if a step fails mid-way.
    if [ -n "$BACKGROUND_PID" ]; then kill "$BACKGROUND_PID" 2>/dev/null || true; fi
    rm -rf "$WORK"
}
trap cleanup EXIT

CURRENT_STEP="setup"

# ---------------------------------------------------------------------------------------------
# Output helpers
# ---------------------------------------------------------------------------------------------

step() {
    CURRENT_STEP="step $1 ($2)"
    printf '\n=== %s. %s\n' "$1" "$2"
    printf '    %s\n' "$3"
}

fail() {
    printf '\ndemo.sh: FAILED at %s: %s\n' "$CURRENT_STEP" "$*" >&2
    exit 1
}

ok() { printf '  ok: %s\n' "$*"; }

# Pretty-prints a JSON file with whatever is available; anything that is not JSON is shown raw.
pretty() {
    local file=$1
    if [ ! -s "$file" ]; then
        echo "  (empty body)"
        return
    fi
    if command -v python3 >/dev/null 2>&1 && python3 -m json.tool "$file" >"$WORK/pretty" 2>/dev/null; then
        sed 's/^/  /' "$WORK/pretty"
    elif command -v jq >/dev/null 2>&1 && jq . "$file" >"$WORK/pretty" 2>/dev/null; then
        sed 's/^/  /' "$WORK/pretty"
    else
        sed 's/^/  /' "$file"
        echo
    fi
}

# The value of one response header (case-insensitive name), without the trailing CR.
header() {
    local name=$1 file=$2
    grep -i "^$name:" "$file" | head -n1 | cut -d: -f2- | sed 's/^ *//' | tr -d '\r' || true
}

# Shows a response saved by `request`: status line, the headers the demo is about, the body.
show_response() {
    local prefix=$1 name value
    printf '  <- %s\n' "$(head -n1 "$prefix.headers" | tr -d '\r')"
    for name in Content-Type Location Idempotent-Replayed Retry-After; do
        value=$(header "$name" "$prefix.headers")
        if [ -n "$value" ]; then printf '     %s: %s\n' "$name" "$value"; fi
    done
    pretty "$prefix.body"
}

# ---------------------------------------------------------------------------------------------
# HTTP helpers
# ---------------------------------------------------------------------------------------------

# request NAME METHOD PATH [KEY [JSON]]: sends one request and saves NAME.headers, NAME.body
# and NAME.status under $WORK. Only prints the request line; the caller shows the response.
request() {
    local name=$1 method=$2 path=$3 key=${4:-} body=${5:-}
    local args=(-sS --connect-timeout 5 --max-time 30 -X "$method" -H "$AUTH"
        -D "$WORK/$name.headers" -o "$WORK/$name.body" -w '%{http_code}')
    if [ -n "$key" ]; then args+=(-H "Idempotency-Key: $key"); fi
    if [ -n "$body" ]; then args+=(-H 'Content-Type: application/json' --data-raw "$body"); fi
    printf '  -> %s %s%s\n' "$method" "$path" "${key:+  (Idempotency-Key: $key)}"
    if [ -n "$body" ]; then printf '     %s\n' "$body"; fi
    if ! curl "${args[@]}" "$BASE_URL$path" >"$WORK/$name.status" 2>"$WORK/$name.err"; then
        fail "$method $path: no answer from $BASE_URL ($(tr -d '\n' <"$WORK/$name.err"))"
    fi
}

status_of() { cat "$WORK/$1.status"; }

# id_of NAME PREFIX: the first `"id"` with that prefix (ch_, re_, po_) in NAME.body, or nothing.
id_of() {
    grep -o "\"id\"[[:space:]]*:[[:space:]]*\"$2[^\"]*\"" "$WORK/$1.body" | head -n1 |
        sed 's/.*"\([^"]*\)"$/\1/' || true
}

expect_status() {
    local name=$1 want=$2 got
    got=$(status_of "$name")
    [ "$got" = "$want" ] || fail "expected HTTP $want, got HTTP $got: $(head -c 300 "$WORK/$name.body")"
    ok "HTTP $want"
}

expect_header() {
    local name=$1 header_name=$2 want=$3 got
    got=$(header "$header_name" "$WORK/$name.headers")
    [ "$got" = "$want" ] || fail "expected header '$header_name: $want', got '${got:-<absent>}'"
    ok "$header_name: $want"
}

expect_no_header() {
    local name=$1 header_name=$2 got
    got=$(header "$header_name" "$WORK/$name.headers")
    [ -z "$got" ] || fail "a first execution must not carry '$header_name' (got '$got')"
    ok "no $header_name header (a first execution)"
}

expect_header_present() {
    local name=$1 header_name=$2 got
    got=$(header "$header_name" "$WORK/$name.headers")
    [ -n "$got" ] || fail "expected a $header_name header, there was none"
    ok "$header_name: $got"
}

# Problem details carry a stable `code`; checking it shows which rule answered, not just a status.
expect_problem() {
    local name=$1 code=$2 content_type
    content_type=$(header Content-Type "$WORK/$name.headers")
    case "$content_type" in
        application/problem+json*) ;;
        *) fail "expected Content-Type application/problem+json, got '${content_type:-<absent>}'" ;;
    esac
    grep -Eq "\"code\"[[:space:]]*:[[:space:]]*\"$code\"" "$WORK/$name.body" ||
        fail "expected problem code '$code' in: $(head -c 300 "$WORK/$name.body")"
    ok "problem+json with code $code"
}

expect_field() {
    local name=$1 field=$2 value=$3
    grep -Eq "\"$field\"[[:space:]]*:[[:space:]]*$value" "$WORK/$name.body" ||
        fail "expected \"$field\": $value in: $(head -c 300 "$WORK/$name.body")"
    ok "\"$field\": $value"
}

# The replay promise is the same bytes, not merely equivalent JSON: compare the raw bodies.
expect_same_body() {
    local first=$1 second=$2
    cmp -s "$WORK/$first.body" "$WORK/$second.body" ||
        fail "the replayed body differs from the original:
  original: $(cat "$WORK/$first.body")
  replay:   $(cat "$WORK/$second.body")"
    ok "body is byte-for-byte identical to the original ($(wc -c <"$WORK/$first.body" | tr -d ' ') bytes)"
}

charge_body() {
    # amount source description
    printf '{"amount": %s, "currency": "usd", "source": "%s", "description": "%s"}' "$1" "$2" "$3"
}

# available_usd NAME: the USD amount in the `available` list of a GET /balance body (0 when
# the list has no USD entry), read with grep and sed so the demo needs no JSON tool.
available_usd() {
    local list entry amount
    list=$(tr -d ' \n\r\t' <"$WORK/$1.body" | sed -n 's/.*"available":\[\([^]]*\)\].*/\1/p')
    entry=$(printf '%s\n' "$list" | grep -o '{[^{}]*}' | grep -i '"currency":"usd"' | head -n1 || true)
    amount=$(printf '%s\n' "$entry" | sed -n 's/.*"amount":\([0-9][0-9]*\).*/\1/p')
    printf '%s\n' "${amount:-0}"
}

# ---------------------------------------------------------------------------------------------
# The walk
# ---------------------------------------------------------------------------------------------

echo "payments-api idempotency demo against $BASE_URL (keys: $RUN-*)"

step 1 "Health check" "The service is up (/healthz) and its database answers (/readyz)."
printf '  -> GET /healthz\n'
if ! curl -sS --connect-timeout 3 --max-time 10 -D "$WORK/health.headers" -o "$WORK/health.body" \
    -w '%{http_code}' "$BASE_URL/healthz" >"$WORK/health.status" 2>"$WORK/health.err"; then
    fail "nothing answers at $BASE_URL ($(tr -d '\n' <"$WORK/health.err")).
  Start the service first: 'cargo run' serves on http://127.0.0.1:8080,
  or pass the URL of a running instance: scripts/demo.sh http://HOST:PORT"
fi
show_response "$WORK/health"
expect_status health 200
request ready GET /readyz
show_response "$WORK/ready"
[ "$(status_of ready)" = 200 ] || fail "the service answers but is not ready (HTTP $(status_of ready)): is its database up?"
ok "HTTP 200"

KEY_CHARGE="$RUN-charge"
BODY_CHARGE=$(charge_body 2500 tok_visa "Demo order $RUN")

step 2 "First charge" "A new key is claimed, the card is charged once, and the response is stored under the key."
request first POST /charges "$KEY_CHARGE" "$BODY_CHARGE"
show_response "$WORK/first"
expect_status first 201
expect_no_header first Idempotent-Replayed
CHARGE_ID=$(id_of first ch_)
[ -n "$CHARGE_ID" ] || fail "no charge id (ch_...) in the response"
ok "charge $CHARGE_ID"

step 3 "Replay" "Retrying with the same key and body returns the stored response; nothing is charged again."
request replay POST /charges "$KEY_CHARGE" "$BODY_CHARGE"
show_response "$WORK/replay"
expect_status replay 201
expect_header replay Idempotent-Replayed true
expect_same_body first replay

step 4 "Same key, different request" "A key belongs to one request: another amount under it is refused and never executed."
request mismatch POST /charges "$KEY_CHARGE" "$(charge_body 9900 tok_visa "Demo order $RUN")"
show_response "$WORK/mismatch"
expect_status mismatch 422
expect_problem mismatch idempotency_key_reused

KEY_SLOW="$RUN-slow"
BODY_SLOW=$(charge_body 1200 tok_slow "Slow card $RUN")

step 5 "Concurrent duplicate" "While a first attempt is in flight, a duplicate is told to retry later (409) instead of charging twice."
printf '  (background) -> POST /charges  (Idempotency-Key: %s)  tok_slow takes ~2 s\n' "$KEY_SLOW"
curl -sS --connect-timeout 5 --max-time 30 -X POST -H "$AUTH" -H "Idempotency-Key: $KEY_SLOW" \
    -H 'Content-Type: application/json' --data-raw "$BODY_SLOW" \
    -D "$WORK/slow.headers" -o "$WORK/slow.body" -w '%{http_code}' \
    "$BASE_URL/charges" >"$WORK/slow.status" 2>"$WORK/slow.err" &
BACKGROUND_PID=$!
# The duplicate goes once the first request holds the key: "did it go through?" says pending.
for _ in $(seq 1 200); do
    curl -sS --max-time 5 -H "$AUTH" -o "$WORK/slow_key.body" -w '%{http_code}' \
        "$BASE_URL/idempotency-keys/$KEY_SLOW" >"$WORK/slow_key.status" 2>/dev/null || true
    if [ "$(cat "$WORK/slow_key.status")" = 200 ]; then break; fi
    sleep 0.01
done
expect_field slow_key state '"pending"'
request duplicate POST /charges "$KEY_SLOW" "$BODY_SLOW"
show_response "$WORK/duplicate"
expect_status duplicate 409
expect_problem duplicate idempotency_key_in_use
expect_header_present duplicate Retry-After
printf '  ... waiting for the background request to finish\n'
wait "$BACKGROUND_PID" || fail "the background tok_slow request got no answer ($(tr -d '\n' <"$WORK/slow.err"))"
BACKGROUND_PID=""
printf '  (background) finished:\n'
show_response "$WORK/slow"
expect_status slow 201
request slow_replay POST /charges "$KEY_SLOW" "$BODY_SLOW"
show_response "$WORK/slow_replay"
expect_status slow_replay 201
expect_header slow_replay Idempotent-Replayed true
expect_same_body slow slow_replay

KEY_DECLINE="$RUN-decline"
BODY_DECLINE=$(charge_body 2500 tok_chargeDeclined "Declined card $RUN")

step 6 "Decline" "A declined card is a final answer: the 402 is stored and replayed like a success."
request decline POST /charges "$KEY_DECLINE" "$BODY_DECLINE"
show_response "$WORK/decline"
expect_status decline 402
expect_problem decline card_declined
expect_no_header decline Idempotent-Replayed
request decline_replay POST /charges "$KEY_DECLINE" "$BODY_DECLINE"
show_response "$WORK/decline_replay"
expect_status decline_replay 402
expect_header decline_replay Idempotent-Replayed true
expect_same_body decline decline_replay

step 7 "Inspect the keys" "GET /idempotency-keys/{key} answers 'did it go through?' (state, recovery point, attempts) without retrying."
request key_charge GET "/idempotency-keys/$KEY_CHARGE"
show_response "$WORK/key_charge"
expect_status key_charge 200
expect_field key_charge state '"completed"'
expect_field key_charge recovery_point '"finished"'
expect_field key_charge response_status 201
request key_decline GET "/idempotency-keys/$KEY_DECLINE"
show_response "$WORK/key_decline"
expect_status key_decline 200
expect_field key_decline response_status 402

step 8 "Read back" "The charge exists once, the newest charges list it, and the ledger balances show the money."
request charge GET "/charges/$CHARGE_ID"
show_response "$WORK/charge"
expect_status charge 200
grep -q "\"$CHARGE_ID\"" "$WORK/charge.body" || fail "GET /charges/$CHARGE_ID did not return that charge"
ok "same charge id $CHARGE_ID"
request list GET "/charges?limit=3"
show_response "$WORK/list"
expect_status list 200
request balances GET /ledger/balances
show_response "$WORK/balances"
expect_status balances 200

KEY_REFUND="$RUN-refund"
BODY_REFUND='{"amount": 1000, "reason": "requested_by_customer"}'

step 9 "Refund" "Part of the charge is given back once under its own key; the retry is a replay of the same refund."
request refund POST "/charges/$CHARGE_ID/refunds" "$KEY_REFUND" "$BODY_REFUND"
show_response "$WORK/refund"
expect_status refund 201
expect_no_header refund Idempotent-Replayed
REFUND_ID=$(id_of refund re_)
[ -n "$REFUND_ID" ] || fail "no refund id (re_...) in the response"
ok "refund $REFUND_ID"
expect_header refund Location "/refunds/$REFUND_ID"
request refund_replay POST "/charges/$CHARGE_ID/refunds" "$KEY_REFUND" "$BODY_REFUND"
show_response "$WORK/refund_replay"
expect_status refund_replay 201
expect_header refund_replay Idempotent-Replayed true
REPLAYED_REFUND_ID=$(id_of refund_replay re_)
[ "$REPLAYED_REFUND_ID" = "$REFUND_ID" ] ||
    fail "the replay names refund '${REPLAYED_REFUND_ID:-<none>}', the first answer $REFUND_ID: refunded twice?"
ok "same refund id $REFUND_ID"
expect_same_body refund refund_replay
request refunded GET "/charges/$CHARGE_ID"
show_response "$WORK/refunded"
expect_status refunded 200
expect_field refunded amount_refunded 1000

KEY_PAYOUT="$RUN-payout"
BODY_PAYOUT=$(printf '{"amount": 1000, "currency": "usd", "destination": "ba_checking", "description": "%s"}' "Demo payout $RUN")

step 10 "Payout" "Part of the balance goes to a bank account once under its own key; the retry is a replay, and the balance shows it."
request balance_before GET /balance
show_response "$WORK/balance_before"
expect_status balance_before 200
AVAILABLE_BEFORE=$(available_usd balance_before)
ok "available before the payout: $AVAILABLE_BEFORE USD minor units"
request payout POST /payouts "$KEY_PAYOUT" "$BODY_PAYOUT"
show_response "$WORK/payout"
expect_status payout 201
expect_no_header payout Idempotent-Replayed
PAYOUT_ID=$(id_of payout po_)
[ -n "$PAYOUT_ID" ] || fail "no payout id (po_...) in the response"
ok "payout $PAYOUT_ID"
expect_header payout Location "/payouts/$PAYOUT_ID"
expect_field payout status '"paid"'
request payout_replay POST /payouts "$KEY_PAYOUT" "$BODY_PAYOUT"
show_response "$WORK/payout_replay"
expect_status payout_replay 201
expect_header payout_replay Idempotent-Replayed true
REPLAYED_PAYOUT_ID=$(id_of payout_replay po_)
[ "$REPLAYED_PAYOUT_ID" = "$PAYOUT_ID" ] ||
    fail "the replay names payout '${REPLAYED_PAYOUT_ID:-<none>}', the first answer $PAYOUT_ID: paid out twice?"
ok "same payout id $PAYOUT_ID"
expect_same_body payout payout_replay
request balance GET /balance
show_response "$WORK/balance"
expect_status balance 200
expect_field balance object '"balance"'
AVAILABLE_AFTER=$(available_usd balance)
[ "$AVAILABLE_AFTER" = "$((AVAILABLE_BEFORE - 1000))" ] ||
    fail "available went from $AVAILABLE_BEFORE to $AVAILABLE_AFTER, not down by the one payout of 1000"
ok "available is $AVAILABLE_AFTER: down by the payout once, not twice"

step 11 "Events" "A consumer that missed the stream reads the tenant's events from GET /events, oldest first, paging with starting_after: each charge, refund and payout has its event."
# read_events: every event of the tenant into $WORK/all_events.body, 100 a page; CURSOR ends
# as the newest event's id.
read_events() {
    CURSOR=""
    PAGES=0
    : >"$WORK/all_events.body"
    while [ "$PAGES" -lt 1000 ]; do
        PAGES=$((PAGES + 1))
        if [ -n "$CURSOR" ]; then path="/events?limit=100&starting_after=$CURSOR"; else path="/events?limit=100"; fi
        request events GET "$path"
        [ "$(status_of events)" = 200 ] || fail "GET $path: HTTP $(status_of events)"
        cat "$WORK/events.body" >>"$WORK/all_events.body"
        NEXT=$(grep -o '"id":"evt_[^"]*"' "$WORK/events.body" | tail -n1 | sed 's/.*"\(evt_[^"]*\)"$/\1/' || true)
        [ -n "$NEXT" ] && CURSOR=$NEXT
        grep -q '"has_more":true' "$WORK/events.body" || return 0
    done
}
SUBJECTS=("\"charge_id\":\"$CHARGE_ID\"" "\"refund_id\":\"$REFUND_ID\"" "\"payout_id\":\"$PAYOUT_ID\"")
# An event is listed once every event before it has committed: on a busy database the newest
# may take a moment to show.
for attempt in $(seq 1 25); do
    read_events
    missing=""
    for subject in "${SUBJECTS[@]}"; do
        grep -q "$subject" "$WORK/all_events.body" || missing="$subject"
    done
    [ -z "$missing" ] && break
    sleep 0.2
done
[ -z "$missing" ] || fail "no event names $missing"
ok "$(grep -o '"object":"event"' "$WORK/all_events.body" | wc -l) events read in $PAGES page(s): the charge, the refund and the payout each have theirs"
request event GET "/events/$CURSOR"
show_response "$WORK/event"
expect_status event 200
expect_field event object '"event"'

step 12 "Reconciliation" "A processor that charges another amount than asked: the run finds the held charge in its report, and an operator voids it once, under a key of their own."
# tok_amountMismatch: the processor charges one minor unit more than asked; the service never
# records an effect that is not the one requested, so the charge answers 503 and stays pending.
MISMATCH_KEY="$RUN-mismatch"
MISMATCH_BODY=$(charge_body 500 tok_amountMismatch "demo: the processor charges 5.01")
DAY_BEFORE=$(date -u +%F)
request mismatch POST /charges "$MISMATCH_KEY" "$MISMATCH_BODY"
show_response "$WORK/mismatch"
expect_status mismatch 503
expect_problem mismatch processor_unavailable
# The day's run, on the serving instance (the embedded simulator lives in its process); a
# charge made just after midnight UTC is in the next day's report.
for day in $(printf '%s\n' "$DAY_BEFORE" "$(date -u +%F)" | uniq); do
    AUTH="$OPS_AUTH" request run POST /ops/reconciliations "" "{\"date\": \"$day\"}"
    show_response "$WORK/run"
    expect_status run 200
done
# The open exception that holds this run's charge: one line per exception, then its id.
EXCEPTION_ID=""
CURSOR=""
for _ in $(seq 1 100); do
    path="/ops/exceptions?limit=100${CURSOR:+&starting_after=$CURSOR}"
    AUTH="$OPS_AUTH" request exceptions GET "$path"
    [ "$(status_of exceptions)" = 200 ] || fail "GET $path: HTTP $(status_of exceptions)"
    EXCEPTION_ID=$(sed 's/{"id":"exc_/\n&/g' "$WORK/exceptions.body" | grep "\"idempotency_key\":\"$MISMATCH_KEY\"" |
        grep -o '"id":"exc_[^"]*"' | head -n1 | sed 's/.*"\(exc_[^"]*\)"$/\1/' || true)
    [ -n "$EXCEPTION_ID" ] && break
    grep -q '"has_more":true' "$WORK/exceptions.body" || break
    CURSOR=$(grep -o '"id":"exc_[^"]*"' "$WORK/exceptions.body" | tail -n1 | sed 's/.*"\(exc_[^"]*\)"$/\1/')
done
[ -n "$EXCEPTION_ID" ] || fail "no open exception holds the charge under $MISMATCH_KEY"
ok "the run keeps it as $EXCEPTION_ID, a processor_mismatch holding the charge's record"
VOID_KEY="$RUN-void"
VOID_BODY='{"action": "void", "note": "demo: the processor charged 5.01 for 5.00"}'
AUTH="$OPS_AUTH" request void POST "/ops/exceptions/$EXCEPTION_ID/resolve" "$VOID_KEY" "$VOID_BODY"
show_response "$WORK/void"
expect_status void 200
expect_field void status '"resolved"'
expect_field void action '"void"'
expect_field void operator '"demo"'
AUTH="$OPS_AUTH" request void_again POST "/ops/exceptions/$EXCEPTION_ID/resolve" "$VOID_KEY" "$VOID_BODY"
expect_status void_again 200
expect_header void_again Idempotent-Replayed true
expect_same_body void void_again
AUTH="$OPS_AUTH" request void_other POST "/ops/exceptions/$EXCEPTION_ID/resolve" "$RUN-void-2" "$VOID_BODY"
show_response "$WORK/void_other"
expect_status void_other 400
expect_problem void_other exception_already_resolved
# The held charge has its final answer now, replayed to every retry of it.
request mismatch_again POST /charges "$MISMATCH_KEY" "$MISMATCH_BODY"
show_response "$WORK/mismatch_again"
expect_status mismatch_again 402
expect_problem mismatch_again charge_voided

if [ -n "$PAYMENTS_CLI" ] && [ -x "$PAYMENTS_CLI" ]; then
    STEPS=13
    step 13 "The caller's half" "The payments command line sends every attempt of an operation under one key and retries only what is not final; with a journal, the same command run again is the same charge."
    # The API key from the environment: in the arguments every user of the machine would see it.
    payments() { PAYMENTS_API_KEY=sk_test_acme "$PAYMENTS_CLI" --base-url "$BASE_URL" "$@"; }
    CLI_CHARGE=(charge --amount 1300 --currency usd --source tok_visa --description "CLI $RUN")
    printf '  $ payments %s --journal JOURNAL\n' "${CLI_CHARGE[*]}"
    payments "${CLI_CHARGE[@]}" --journal "$WORK/journal" >"$WORK/cli.body" 2>"$WORK/cli.err" ||
        fail "payments exited $?: $(cat "$WORK/cli.err")"
    sed 's/^/  /' "$WORK/cli.err"
    pretty "$WORK/cli.body"
    CLI_ID=$(id_of cli ch_)
    [ -n "$CLI_ID" ] || fail "no charge id on stdout"
    CLI_KEY=$(sed -n 's/^payments: idempotency key \([^ ]*\) .*/\1/p' "$WORK/cli.err")
    ok "charged: $CLI_ID, under the key $CLI_KEY, made before the first send"
    printf '  $ payments %s --journal JOURNAL    (again)\n' "${CLI_CHARGE[*]}"
    payments "${CLI_CHARGE[@]}" --journal "$WORK/journal" >"$WORK/cli_again.body" 2>"$WORK/cli_again.err" ||
        fail "payments exited $?: $(cat "$WORK/cli_again.err")"
    sed 's/^/  /' "$WORK/cli_again.err"
    [ "$(id_of cli_again ch_)" = "$CLI_ID" ] || fail "the second run answered another charge"
    grep -q "from the journal" "$WORK/cli_again.err" || fail "the second run did not answer from its journal"
    ok "the same charge, from the journal: nothing was sent"
    printf '  $ payments charge --amount 1301 ... --key %s\n' "$CLI_KEY"
    status=0
    payments charge --amount 1301 --currency usd --source tok_visa --description "CLI $RUN" \
        --key "$CLI_KEY" >/dev/null 2>"$WORK/cli_changed.body" || status=$?
    pretty "$WORK/cli_changed.body"
    [ "$status" = 4 ] || fail "a changed request under the key exited $status, not 4"
    grep -q '"idempotency_key_reused"' "$WORK/cli_changed.body" || fail "no idempotency_key_reused problem"
    ok "exit 4: the request was changed under one key; never retried"
fi

CURRENT_STEP="summary"
printf '\nOK: all %s steps passed against %s (charge %s, refund %s, payout %s, exception %s; keys %s-*).\n' \
    "$STEPS" "$BASE_URL" "$CHARGE_ID" "$REFUND_ID" "$PAYOUT_ID" "$EXCEPTION_ID" "$RUN"
