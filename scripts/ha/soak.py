#!/usr/bin/env python3
"""The HA soak: load through HAProxy while the topology's nodes are killed and frozen in turn.

Client threads charge fresh keys through HAProxy, each retried (with the same key and body)
until it is answered 201; every tenth charge is then partly refunded under a key of its own,
retried the same way. Meanwhile, one after another:

  pg_kill     SIGKILL of the PostgreSQL primary's node (Patroni and postgres); Patroni
              promotes the synchronous standby; the node is started again and rejoins as a
              standby
  pg_stop     SIGSTOP of the primary's node for longer than Patroni's ttl, then SIGCONT: the
              node wakes up demoted
  redis_kill  SIGKILL of the Redis master; Sentinel promotes the replica; the node comes back
              as a replica
  api_kill    SIGKILL of one payments-api instance, started again
  api_stop    SIGSTOP of one instance for longer than the idempotency lock, then SIGCONT; it
              is frozen inside a batch of finishes: acme's balances are held by a session of
              the soak's own while a burst of acme charges goes to that instance, and it is
              stopped once its finishes wait on them (tried up to three times, until its log
              shows, once it is let go, that a batch had been open). Meanwhile another tenant
              (globex) charges through the two other instances, and every 5xx it gets counts

Each fault waits for the topology to be whole again before the next. Then the load stops, the
relay drains the outbox, and the soak checks, with exact counts:

  - every key answers exactly one id (each is sent once more at the end: the same id);
  - processor charges == the books' charges == payment.completed events == settled keys, and
    the same for refunds;
  - every outbox event id is in the Redis stream of the master the Sentinels name;
  - the other tenant got no 5xx while an instance was frozen inside a batch.

It prints one summary line and exits non-zero if any check fails. Run it on a topology that
scripts/ha/up.sh brought up: scripts/ha/soak.sh does both.

With --asynchronous (on a topology brought up with HA_SYNCHRONOUS_MODE=false), it measures the
failure mode that synchronous_mode prevents instead: the primary's WAL senders are held for a
few seconds while the load goes on, then the primary is killed and a standby that lacks those
acknowledged commits is promoted. The checks then say what the processor and the books hold.
"""

import argparse
import http.client
import json
import os
import subprocess
import sys
import threading
import time
import uuid

HERE = os.path.dirname(os.path.abspath(__file__))
API = ("127.0.0.1", 25080)
DATABASE = "postgres://postgres@127.0.0.1:25000/payments"
CARD_SIM = ("127.0.0.1", 25090)
STREAM = "payments:events"
AUTH = "Bearer sk_test_acme"
OTHER_TENANT = "Bearer sk_test_globex"
RUN_DIR = os.environ.get("HA_RUN_DIR", "/tmp/payments-ha")
# The instances' own ports (ha.sh: api1 -> 25081).
API_PORTS = {"api1": 25081, "api2": 25082, "api3": 25083}
# Patroni's ttl and the instances' lock (scripts/ha/conf/patroni.yml, ha.sh).
PATRONI_TTL_SECS = 8
LOCK_SECS = 5
# How long the Sentinels must agree on a new master before the killed one is started again:
# three times their down-after time (ha.sh).
SENTINELS_SETTLE_SECS = 3
# How long the standbys receive nothing before the primary is killed, in --asynchronous.
WAL_HOLD_SECS = 3


def ha(*args, timeout=120):
    done = subprocess.run(["bash", os.path.join(HERE, "ha.sh"), *args], capture_output=True,
                          text=True, timeout=timeout)
    if done.returncode != 0:
        raise RuntimeError(f"ha.sh {' '.join(args)} failed: {done.stderr.strip()}")
    return done.stdout.strip()


def log(message):
    print(f"soak: {time.strftime('%H:%M:%S')} {message}", flush=True)


class Tally:
    """What the clients saw, shared by their threads."""

    def __init__(self):
        self.lock = threading.Lock()
        self.statuses = {}
        self.errors = 0
        self.longest = 0.0
        self.charges = {}  # key -> charge id
        self.refunds = {}  # key -> refund id
        self.refused = []  # final answers that were not 201: a soak bug or a service bug
        self.other_tenant = set()  # globex's keys
        self.other_tenant_5xx = 0  # globex's 5xx while an instance was frozen

    def saw(self, status):
        with self.lock:
            if status is None:
                self.errors += 1
            else:
                self.statuses[status] = self.statuses.get(status, 0) + 1

    def saw_other_tenant(self, status):
        self.saw(status)
        with self.lock:
            if status is None or status >= 500:
                self.other_tenant_5xx += 1

    def settled(self, book, key, object_id, seconds):
        with self.lock:
            book[key] = object_id
            self.longest = max(self.longest, seconds)


def post(path, key, body, timeout=15, to=API, auth=AUTH):
    connection = http.client.HTTPConnection(*to, timeout=timeout)
    try:
        connection.request("POST", path, body=json.dumps(body), headers={
            "Authorization": auth, "Idempotency-Key": key, "Content-Type": "application/json"})
        response = connection.getresponse()
        return response.status, response.getheader("Retry-After"), response.read()
    except (OSError, http.client.HTTPException):
        return None, None, b""
    finally:
        connection.close()


def settle(tally, path, key, body, stop_by, auth=AUTH):
    """Sends the request until it is answered 201, as a client with an Idempotency-Key may."""
    started = time.monotonic()
    while time.monotonic() < stop_by:
        status, retry_after, data = post(path, key, body, auth=auth)
        tally.saw(status)
        if status == 201:
            return json.loads(data)["id"], time.monotonic() - started
        if status is not None and status < 500 and status not in (409, 429):
            with tally.lock:
                tally.refused.append((key, status, data[:200].decode(errors="replace")))
            return None, 0.0
        wait = float(retry_after) if retry_after and retry_after.isdigit() else 0.2
        time.sleep(min(wait, 1.0))
    with tally.lock:
        tally.refused.append((key, "unsettled", ""))
    return None, 0.0


def charge_body(key):
    """The same body for every send of one key: its amount is the key's number."""
    return {"amount": 1000 + int(key.rsplit("-", 1)[1]), "currency": "usd", "source": "tok_visa"}


def client(tally, run, number, stop, stop_by):
    n = 0
    while not stop.is_set():
        n += 1
        key = f"soak-{run}-{number}-{n}"
        charge, seconds = settle(tally, "/charges", key, charge_body(key), stop_by)
        if charge is None:
            continue
        tally.settled(tally.charges, key, charge, seconds)
        if n % 10 == 0:
            refund_key = f"{key}-refund"
            refund, seconds = settle(tally, f"/charges/{charge}/refunds", refund_key,
                                     {"amount": 100}, stop_by)
            if refund is not None:
                tally.settled(tally.refunds, refund_key, refund, seconds)


def wait_until(what, seconds, check):
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            if check():
                return
        except RuntimeError:
            pass
        time.sleep(0.2)
    raise RuntimeError(f"timed out after {seconds}s waiting for {what}")


def healthy():
    ha("wait-healthy", "90", timeout=100)
    time.sleep(2)


def run_asynchronous_failover(counts, _tally):
    primary = ha("primary")
    log(f"pg_kill_async: the standbys receive nothing for {WAL_HOLD_SECS}s; then SIGKILL of "
        f"{primary}, the PostgreSQL primary")
    ha("hold-wal")
    time.sleep(WAL_HOLD_SECS)
    kill_and_fail_over(counts, "pg_kill_async", primary, "primary", "PostgreSQL primary")


def kill_and_fail_over(counts, fault, node, which, what, settled=lambda: True):
    """SIGKILL of `node`, until `ha.sh which` names another and `settled()` holds; then `node`
    is started again."""
    ha("kill", node)
    counts[fault] += 1
    wait_until(f"another {what}", 60, lambda: ha(which) not in ("", node))
    wait_until(f"the failover from {node} to settle", 60, settled)
    log(f"{fault}: {ha(which)} promoted; {node} started again")
    ha("start", node)
    healthy()


def sentinels_agree_for(seconds):
    """A check that holds once every Sentinel has named the same master for `seconds`.

    A Redis node that comes back empty (it keeps nothing on disk) while a Sentinel may still
    start another failover can be promoted, and the stream is then gone: the soak saw it once,
    4,559 events lost, when a Sentinel that had not heard from the new master within its
    down-after time failed over again, to the node just restarted. So the killed node is
    started only once the failover has settled."""
    agreed, since = None, 0.0

    def check():
        nonlocal agreed, since
        try:
            current = ha("sentinels-agree")
        except RuntimeError:
            current = None
        now = time.monotonic()
        if current != agreed:
            agreed, since = current, now
        return bool(current) and now - since >= seconds

    return check


def run_faults(counts, tally):
    primary = ha("primary")
    log(f"pg_kill: SIGKILL of {primary}, the PostgreSQL primary")
    kill_and_fail_over(counts, "pg_kill", primary, "primary", "PostgreSQL primary")

    primary = ha("primary")
    log(f"pg_stop: SIGSTOP of {primary} for {PATRONI_TTL_SECS + 4}s")
    ha("stop", primary)
    counts["pg_stop"] += 1
    time.sleep(PATRONI_TTL_SECS + 4)
    ha("cont", primary)
    log(f"pg_stop: SIGCONT of {primary}; the primary is now {ha('primary')}")
    healthy()

    master = ha("redis-master")
    log(f"redis_kill: SIGKILL of {master}, the Redis master")
    kill_and_fail_over(counts, "redis_kill", master, "redis-master", "Redis master",
                       settled=sentinels_agree_for(SENTINELS_SETTLE_SECS))

    log("api_kill: SIGKILL of api2")
    ha("kill", "api2")
    counts["api_kill"] += 1
    time.sleep(1)
    ha("start", "api2")
    healthy()

    for attempt in range(1, 4):
        if freeze_inside_a_batch(tally, counts, "api3", attempt):
            break
        healthy()
    healthy()


class Holder:
    """A psql session of the soak's own holding every part of acme's USD balances in a
    transaction it leaves open: every finish of an acme charge waits on it."""

    def __init__(self):
        self.psql = subprocess.Popen(["psql", DATABASE, "-Atq", "-v", "ON_ERROR_STOP=1"],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        self.send("BEGIN;\n"
                  "INSERT INTO ledger_balances (tenant_id, account, currency, part, amount)\n"
                  "SELECT 'acme', account, 'USD', part, 0\n"
                  "FROM (VALUES ('customer_payments'), ('processor_receivable')) a(account),\n"
                  "     generate_series(0, 63) AS part\n"
                  "ON CONFLICT (tenant_id, account, currency, part)\n"
                  "DO UPDATE SET amount = ledger_balances.amount;\n"
                  "SELECT pg_backend_pid();")
        self.pid = self.psql.stdout.readline().strip()

    def send(self, sql):
        self.psql.stdin.write(sql + "\n")
        self.psql.stdin.flush()

    def let_go(self):
        self.send("ROLLBACK;\n\\q")
        self.psql.wait(timeout=30)


def waiting_on(holder, instance):
    """The sessions of `instance` that wait for a row `holder` holds, each with when its
    transaction began."""
    return set(psql(f"SELECT pid || '@' || xact_start FROM pg_stat_activity "
                    f"WHERE application_name = '{instance}' "
                    f"AND {holder.pid} = ANY(pg_blocking_pids(pid))"))


def log_size(instance):
    return os.path.getsize(os.path.join(RUN_DIR, f"{instance}.log"))


def log_since(instance, offset):
    with open(os.path.join(RUN_DIR, f"{instance}.log"), errors="replace") as log_file:
        log_file.seek(offset)
        return log_file.read()


def freeze_inside_a_batch(tally, counts, instance, attempt):
    """SIGSTOP of `instance` while a batch of its finishes waits on acme's held balances, for
    longer than the idempotency lock, while globex charges through the other instances; then
    SIGCONT. Returns whether a batch was open at the freeze (the instance logs, once let go,
    that a batch of finishes failed)."""
    stop_by = time.monotonic() + 120
    burst_keys = [f"soak-burst-{uuid.uuid4().hex[:8]}-{n}" for n in range(9)]
    to = ("127.0.0.1", API_PORTS[instance])
    holder = Holder()
    burst = []

    def send(key):
        thread = threading.Thread(target=post, args=("/charges", key, charge_body(key)),
                                  kwargs={"to": to, "timeout": 60}, daemon=True)
        thread.start()
        burst.append(thread)

    # One charge first: its finish waits on the balances and holds the instance's queue of
    # finishes, and the burst's finishes queue behind it, to be written as one batch.
    send(burst_keys[0])
    wait_until("a finish waiting on the held balances", 20,
               lambda: waiting_on(holder, instance))
    first = waiting_on(holder, instance)
    for key in burst_keys[1:]:
        send(key)
    wait_until("the burst's finishes waiting on the held balances", 20,
               lambda: waiting_on(holder, instance) - first)
    offset = log_size(instance)
    ha("stop", instance)
    counts["api_stop"] += 1
    frozen_at = time.monotonic()
    holder.let_go()
    log(f"api_stop: SIGSTOP of {instance} with its finishes waiting on acme's held balances "
        f"(attempt {attempt}); globex charges through the other instances")
    others = [("127.0.0.1", port) for name, port in API_PORTS.items() if name != instance]
    n = 0
    while time.monotonic() - frozen_at < LOCK_SECS + 3:
        n += 1
        key = f"soak-globex-{uuid.uuid4().hex[:8]}-{n}"
        status, _, data = post("/charges", key, charge_body(key), to=others[n % len(others)],
                               auth=OTHER_TENANT)
        tally.saw_other_tenant(status)
        charge, seconds = (json.loads(data)["id"], 0.0) if status == 201 else \
            settle(tally, "/charges", key, charge_body(key), stop_by, auth=OTHER_TENANT)
        if charge is not None:
            tally.settled(tally.charges, key, charge, seconds)
            tally.other_tenant.add(key)
    ha("cont", instance)
    for thread in burst:
        thread.join()
    for key in burst_keys:
        charge, seconds = settle(tally, "/charges", key, charge_body(key), stop_by)
        if charge is not None:
            tally.settled(tally.charges, key, charge, seconds)
    in_batch = "a batch of finishes failed" in log_since(instance, offset)
    if in_batch:
        counts["api_stop_in_batch"] += 1
    log(f"api_stop: SIGCONT of {instance}; a batch was open at the freeze: "
        f"{'yes' if in_batch else 'no'}")
    return in_batch


def psql(query):
    done = subprocess.run(["psql", DATABASE, "-Atqc", query], capture_output=True, text=True,
                          timeout=30)
    if done.returncode != 0:
        raise RuntimeError(f"psql failed: {done.stderr.strip()}")
    return done.stdout.split()


def card_sim_stats():
    connection = http.client.HTTPConnection(*CARD_SIM, timeout=5)
    connection.request("GET", "/v1/stats")
    return json.loads(connection.getresponse().read())


def stream_event_ids():
    master = ha("redis-master")
    port = str(26378 + int(master.removeprefix("redis")))
    out = subprocess.run(["redis-cli", "-p", port, "--raw", "XRANGE", STREAM, "-", "+"],
                         capture_output=True, text=True, timeout=60, check=True).stdout
    lines = out.split("\n")
    return {lines[i + 1] for i, line in enumerate(lines[:-1]) if line == "event_id"}


def bare(object_id):
    """A charge or refund id as the books hold it: the UUID without its prefix."""
    return str(uuid.UUID(object_id.split("_", 1)[-1]))


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--clients", type=int, default=6)
    parser.add_argument("--asynchronous", action="store_true",
                        help="measure a failover without synchronous_mode (see above)")
    args = parser.parse_args()

    run = uuid.uuid4().hex[:8]
    tally = Tally()
    if args.asynchronous:
        faults, counts = run_asynchronous_failover, {"pg_kill_async": 0}
    else:
        faults = run_faults
        counts = {"pg_kill": 0, "pg_stop": 0, "redis_kill": 0, "api_kill": 0, "api_stop": 0,
                  "api_stop_in_batch": 0}
    stop = threading.Event()
    stop_by = time.monotonic() + 600
    threads = [threading.Thread(target=client, args=(tally, run, i, stop, stop_by), daemon=True)
               for i in range(args.clients)]
    started = time.monotonic()
    for thread in threads:
        thread.start()
    time.sleep(3)
    fault_error = None
    try:
        faults(counts, tally)
    except RuntimeError as error:
        fault_error = error
    stop.set()
    for thread in threads:
        thread.join()
    log(f"load stopped after {time.monotonic() - started:.0f}s; checking")

    problems = []
    if fault_error:
        problems.append(f"faults stopped early: {fault_error}")
    for key, status, body in tally.refused:
        problems.append(f"{key} ended with {status} {body}")

    # Every key once more: a replay, with the same id.
    doubles = 0
    replayed = set()
    requests = [(key, "/charges", charge_body(key), charge)
                for key, charge in tally.charges.items() if key not in tally.other_tenant]
    requests += [(key, "/charges", charge_body(key), charge, OTHER_TENANT)
                 for key, charge in tally.charges.items() if key in tally.other_tenant]
    requests += [(key, f"/charges/{tally.charges[key.removesuffix('-refund')]}/refunds",
                  {"amount": 100}, refund) for key, refund in tally.refunds.items()]
    for key, path, body, object_id, *auth in requests:
        status, _, data = post(path, key, body, auth=auth[0] if auth else AUTH)
        again = json.loads(data)["id"] if status == 201 else None
        if again == object_id:
            replayed.add(bare(object_id))
        else:
            doubles += 1
            problems.append(f"{key} answered {object_id}, then {again} ({status})")

    wait_until("the relay to publish every event", 60,
               lambda: psql("SELECT count(*) FROM outbox_events WHERE published_at IS NULL")
               == ["0"])
    books_charges = set(psql("SELECT id FROM charges"))
    books_refunds = set(psql("SELECT id FROM refunds"))
    events = {kind: int(psql(f"SELECT count(*) FROM outbox_events WHERE event_type = '{kind}'")[0])
              for kind in ("payment.completed", "payment.refunded")}
    outbox_ids = set(psql("SELECT id FROM outbox_events"))
    processor = card_sim_stats()
    in_stream = stream_event_ids()

    settled_charges = {bare(i) for i in tally.charges.values()}
    settled_refunds = {bare(i) for i in tally.refunds.values()}
    lost_ids = (settled_charges - books_charges) | (settled_refunds - books_refunds)
    lost = len(lost_ids)
    # Answers the replay cache still served after the books lost them.
    replayed_lost = len(lost_ids & replayed)
    # A processor charge or refund beyond the keys that settled: one key paid twice.
    charged_twice = max(0, processor["charges_created"] - len(tally.charges)) + \
        max(0, processor["refunds_created"] - len(tally.refunds))
    missing_from_stream = len(outbox_ids - in_stream)
    charges = (processor["charges_created"], len(books_charges), events["payment.completed"],
               len(tally.charges))
    refunds = (processor["refunds_created"], len(books_refunds), events["payment.refunded"],
               len(tally.refunds))
    if len(set(charges)) != 1:
        problems.append("charges: processor {} books {} events {} settled keys {}"
                        .format(*charges))
    if len(set(refunds)) != 1:
        problems.append("refunds: processor {} books {} events {} settled keys {}"
                        .format(*refunds))
    if lost:
        problems.append(f"{lost} settled ids are not in the books")
    if missing_from_stream:
        problems.append(f"{missing_from_stream} outbox events are not in the stream")
    if tally.other_tenant_5xx:
        problems.append(f"globex got {tally.other_tenant_5xx} 5xx or unanswered charges while "
                        "an instance was frozen inside a batch")
    missing_faults = [name for name, count in counts.items() if count == 0]
    if missing_faults:
        problems.append(f"faults not run: {', '.join(missing_faults)}")

    faults = " ".join(f"{name}={count}" for name, count in counts.items())
    statuses = " ".join(f"{status}:{count}" for status, count in sorted(tally.statuses.items()))
    print(f"soak summary: {faults}; keys {len(tally.charges)} charged, {len(tally.refunds)} "
          f"refunded; charges processor={charges[0]} books={charges[1]} events={charges[2]}; "
          f"refunds processor={refunds[0]} books={refunds[1]} events={refunds[2]}; "
          f"doubles={doubles} lost={lost} (replayed from the cache: {replayed_lost}) "
          f"charged_twice={charged_twice} missing_from_stream={missing_from_stream} "
          f"(stream holds {len(in_stream)}); answers {statuses} connection_errors={tally.errors}"
          f"; 503s={tally.statuses.get(503, 0)}; longest settle {tally.longest:.1f}s"
          f"; other tenant while frozen: {len(tally.other_tenant)} charged, "
          f"{tally.other_tenant_5xx} 5xx",
          flush=True)
    for problem in problems[:10]:
        print(f"soak: FAILED: {problem}", file=sys.stderr)
    if len(problems) > 10:
        print(f"soak: FAILED: ... and {len(problems) - 10} more", file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
