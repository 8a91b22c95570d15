#!/usr/bin/env python3
"""Faults through docker compose, against a stack that `up` started: three in turn, each
checked with exact counts taken before and after it (so whatever ran against the stack
earlier does not count).

  kill    `docker kill -s KILL` of payments-api while client threads send 200 fresh keys, each
          charged by the `payments` command line, which retries it under its key until it
          has its final answer; then `up -d` again. Every tenth
          key is a tok_slow charge, which the processor takes seconds over, so the kill finds
          charges in flight (the run fails if it finds none); their keys settle once the dead
          attempts' locks expire. Every key answers one charge id (each is sent once more at
          the end), and the processor's new charges == the books' new charges == new ledger
          transactions == new payment.completed events == 200.
  pause   `docker pause` of payments-api for longer than its idempotency lock while a tok_slow
          charge is in flight at the processor, with a client retrying that key throughout;
          then `unpause`. The charge is made and recorded exactly once.
  redis   `docker pause` of Redis while 20 charges are sent: each answers 201 at its first
          try, and once Redis is back every outbox event of the stack is in the stream.

The compose command comes as the arguments after `--`, the project from
COMPOSE_PROJECT_NAME, the API's published port from --port, and the `payments` command line
(crates/client) from --payments. It prints one summary line
and exits non-zero naming every check that failed.

  scripts/compose/faults.py --port 18080 --payments target/debug/payments -- docker-compose
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

API_KEY = "sk_test_acme"
AUTH = f"Bearer {API_KEY}"
STREAM = "payments:events"
# docker-compose.yml runs the service with the default idempotency lock.
LOCK_SECS = 30
KEYS = 200
CLIENTS = 8


class Stack:
    def __init__(self, compose, port, payments):
        self.compose = compose
        self.port = port
        self.payments = payments

    def run(self, *args, timeout=120):
        done = subprocess.run(list(args), capture_output=True, text=True, timeout=timeout)
        if done.returncode != 0:
            raise RuntimeError(f"{' '.join(args)} failed: {done.stderr.strip()[-400:]}")
        return done.stdout

    def exec(self, service, *command):
        return self.run(*self.compose, "exec", "-T", service, *command)

    def container(self, service):
        return self.run(*self.compose, "ps", "-q", service).strip()

    def docker(self, *args):
        return self.run("docker", *args)

    def psql(self, query):
        return self.exec("postgres", "psql", "-U", "postgres", "-d", "payments", "-Atqc",
                         query).split()

    def books(self):
        """What the service holds: charges, ledger transactions, payment.completed events."""
        row = self.psql("SELECT (SELECT count(*) FROM charges), "
                        "(SELECT count(*) FROM ledger_transactions), "
                        "(SELECT count(*) FROM outbox_events "
                        "  WHERE event_type = 'payment.completed')")[0].split("|")
        return dict(zip(("charges", "ledger", "events"), map(int, row)))

    def processor_charges(self):
        stats = self.exec("card-sim", "curl", "-fsS", "http://127.0.0.1:9090/v1/stats")
        return json.loads(stats)["charges_created"]

    def totals(self):
        return {**self.books(), "processor": self.processor_charges()}

    def stream_event_ids(self):
        out = self.exec("redis", "redis-cli", "--raw", "XRANGE", STREAM, "-", "+")
        lines = out.split("\n")
        return [lines[i + 1] for i, line in enumerate(lines[:-1]) if line == "event_id"]

    def outbox(self):
        return set(self.psql("SELECT id FROM outbox_events"))

    def unpublished(self):
        return int(self.psql("SELECT count(*) FROM outbox_events WHERE published_at IS NULL")[0])

    def ready(self):
        try:
            connection = http.client.HTTPConnection("127.0.0.1", self.port, timeout=2)
            connection.request("GET", "/readyz")
            return connection.getresponse().status == 200
        except (OSError, http.client.HTTPException):
            return False

    def post_charge(self, key, body, timeout=10):
        """(status, headers, body bytes), or (None, {}, b"") when no answer came."""
        connection = http.client.HTTPConnection("127.0.0.1", self.port, timeout=timeout)
        try:
            connection.request("POST", "/charges", body=json.dumps(body), headers={
                "Authorization": AUTH, "Idempotency-Key": key,
                "Content-Type": "application/json"})
            response = connection.getresponse()
            return response.status, dict(response.getheaders()), response.read()
        except (OSError, http.client.HTTPException):
            return None, {}, b""
        finally:
            connection.close()

    def settle(self, key, body, seconds=180):
        """Charges under `key` as a caller should, with the `payments` command line: the same
        key on every attempt, Retry-After honoured, backoff otherwise, until its final answer
        or `seconds`. The charge's id."""
        command = [self.payments, "--base-url", f"http://127.0.0.1:{self.port}",
                   "--deadline-secs", str(seconds), "--attempt-timeout-secs", "10",
                   "charge", "--amount", str(body["amount"]), "--currency", body["currency"],
                   "--source", body["source"], "--key", key]
        environment = {**os.environ, "PAYMENTS_API_KEY": API_KEY}
        done = subprocess.run(command, capture_output=True, text=True, env=environment,
                              timeout=seconds + 30)
        if done.returncode != 0:
            raise RuntimeError(f"{key}: payments exited {done.returncode}: "
                               f"{done.stderr.strip()[:300]}")
        return json.loads(done.stdout)["id"]


def log(message):
    print(f"faults: {time.strftime('%H:%M:%S')} {message}", flush=True)


def wait_until(what, seconds, check):
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if check():
            return
        time.sleep(0.2)
    raise RuntimeError(f"timed out after {seconds}s waiting for {what}")


def new_since(before, after):
    return {name: after[name] - before[name] for name in before}


def exact(problems, fault, counts, wanted):
    """Every count must be `wanted`; a line for the summary."""
    for name, count in counts.items():
        if count != wanted:
            problems.append(f"{fault}: {count} new {name}, expected {wanted}")
    return " ".join(f"{name}={count}" for name, count in counts.items())


def body(amount, source="tok_visa"):
    return {"amount": amount, "currency": "usd", "source": source}


def kill_fault(stack, problems):
    run = uuid.uuid4().hex[:8]
    keys = [(f"compose-kill-{run}-{n}", body(1000 + n, "tok_slow" if n % 10 == 0 else "tok_visa"))
            for n in range(KEYS)]
    before = stack.totals()
    answers, failures, lock = {}, [], threading.Lock()
    pending = list(keys)
    in_flight = [0]

    def client():
        while True:
            with lock:
                if not pending:
                    return
                key, charge = pending.pop()
                in_flight[0] += 1
            try:
                charge_id = stack.settle(key, charge)
            except RuntimeError as error:
                with lock:
                    failures.append(str(error))
                continue
            finally:
                with lock:
                    in_flight[0] -= 1
            with lock:
                answers[key] = charge_id

    threads = [threading.Thread(target=client, daemon=True) for _ in range(CLIENTS)]
    for thread in threads:
        thread.start()
    wait_until("50 keys to settle", 120, lambda: len(answers) >= 50 or failures)
    api = stack.container("payments-api")
    with lock:
        settled_at_kill, in_flight_at_kill = len(answers), in_flight[0]
    log(f"kill: SIGKILL of payments-api with {settled_at_kill} of {KEYS} keys settled and "
        f"{in_flight_at_kill} in flight")
    stack.docker("kill", "-s", "KILL", api)
    if in_flight_at_kill == 0:
        problems.append("kill: no charge was in flight when payments-api was killed")
    stack.run(*stack.compose, "up", "-d", "payments-api", timeout=180)
    wait_until("payments-api to be ready again", 120, stack.ready)
    for thread in threads:
        thread.join()
    problems.extend(f"kill: {failure}" for failure in failures)
    # Each key once more: the same id.
    for key, charge in keys:
        status, _, data = stack.post_charge(key, charge)
        again = json.loads(data)["id"] if status == 201 else f"{status}"
        if key in answers and again != answers[key]:
            problems.append(f"kill: {key} answered {answers[key]}, then {again}")
    ids = set(answers.values())
    if len(answers) != KEYS or len(ids) != KEYS:
        problems.append(f"kill: {len(answers)} keys settled with {len(ids)} distinct ids, "
                        f"expected {KEYS}")
    wait_until("the relay to publish every event", 60, lambda: stack.unpublished() == 0)
    counts = new_since(before, stack.totals())
    return (f"kill: in_flight={in_flight_at_kill} keys={len(answers)} ids={len(ids)} " +
            exact(problems, "kill", counts, KEYS))


def pause_fault(stack, problems):
    key = f"compose-pause-{uuid.uuid4().hex[:8]}"
    charge = body(4242, "tok_slow")
    before = stack.totals()
    first = {}
    threading.Thread(target=lambda: first.update(answer=stack.post_charge(key, charge, 120)),
                     daemon=True).start()
    # In flight at the processor: claimed, and tok_slow takes seconds there.
    wait_until("the slow charge to be claimed", 10, lambda: stack.psql(
        f"SELECT count(*) FROM idempotency_records WHERE idempotency_key = '{key}'") == ["1"])
    api = stack.container("payments-api")
    log(f"pause: payments-api paused for {LOCK_SECS + 5}s with a tok_slow charge in flight")
    stack.docker("pause", api)
    retries = []
    retrier = threading.Thread(target=lambda: retries.append(stack.settle(key, charge, 240)),
                               daemon=True)
    retrier.start()
    try:
        time.sleep(LOCK_SECS + 5)
    finally:
        stack.docker("unpause", api)
    retrier.join(240)
    charge_id = stack.settle(key, charge, 60)
    if retries != [charge_id]:
        problems.append(f"pause: the retries answered {retries}, then {charge_id}")
    wait_until("the relay to publish every event", 60, lambda: stack.unpublished() == 0)
    counts = new_since(before, stack.totals())
    status = (first.get("answer") or (None,))[0]
    return f"pause: first answer {status} " + exact(problems, "pause", counts, 1)


def redis_fault(stack, problems):
    run = uuid.uuid4().hex[:8]
    before = stack.totals()
    redis = stack.container("redis")
    log("redis: Redis paused while 20 charges are sent")
    stack.docker("pause", redis)
    statuses = []
    try:
        started = time.monotonic()
        for n in range(20):
            statuses.append(stack.post_charge(f"compose-redis-{run}-{n}", body(500 + n))[0])
        time.sleep(max(0.0, 5 - (time.monotonic() - started)))
    finally:
        stack.docker("unpause", redis)
    first_try = statuses.count(201)
    if first_try != 20:
        problems.append(f"redis: {first_try} of 20 charges answered 201 with Redis paused "
                        f"({statuses})")
    missing = set()

    def all_streamed():
        missing.clear()
        missing.update(stack.outbox() - set(stack.stream_event_ids()))
        return not missing and stack.unpublished() == 0

    try:
        wait_until("every outbox event in the stream", 60, all_streamed)
    except RuntimeError:
        problems.append(f"redis: {len(missing)} outbox events never reached the stream")
    in_stream = stack.stream_event_ids()
    counts = new_since(before, stack.totals())
    return (f"redis: 201s={first_try} " + exact(problems, "redis", counts, 20) +
            f" missing_from_stream={len(missing)} outbox={len(stack.outbox())}"
            f" stream={len(in_stream)} (distinct {len(set(in_stream))})")


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--payments", required=True, help="the payments command line")
    parser.add_argument("compose", nargs="+", help="the compose command, after --")
    args = parser.parse_args()
    stack = Stack(args.compose, args.port, os.path.abspath(args.payments))
    problems, lines = [], []
    for fault in (kill_fault, pause_fault, redis_fault):
        try:
            line = fault(stack, problems)
        except RuntimeError as error:
            line = f"{fault.__name__.removesuffix('_fault')}: stopped: {error}"
            problems.append(line)
        lines.append(line)
        log(line)
    print("faults summary: " + "; ".join(lines), flush=True)
    for problem in problems:
        print(f"faults: FAILED {problem}", file=sys.stderr)
    sys.exit(1 if problems else 0)


if __name__ == "__main__":
    main()
