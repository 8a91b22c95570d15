#!/usr/bin/env python3
"""Capacity through the HA topology: first-charge and replay-db through HAProxy, with one and
with three instances, and the CPU each request costs each kind of process.

Run by `scripts/bench.sh --ha`. It brings scripts/ha/up.sh's topology up on the release
binaries with no Redis (so a replay is read from PostgreSQL: replay-db) and card-sim without
latency, then for one instance (the other two disabled in HAProxy) and for three runs wrk
with scripts/bench/first-charge.lua and replay.lua, in rounds. Around each run it reads the
CPU time (user + system) of every process of each kind from /proc: the payments-api
instances, the PostgreSQL primary's processes, the standbys' (replication), HAProxy, card-sim
and wrk itself. A row reports the median run's throughput and latency and, per request, the
CPU milliseconds of each kind. Every run must end with 0 errors, and every first charge must
be exactly one charge in the books: otherwise it exits non-zero.

Writes the table to --out (default target/bench/ha-capacity.md) and prints it.
"""

import argparse
import json
import os
import re
import resource
import socket
import statistics
import subprocess
import sys
import time
import uuid

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
HA = os.path.join(ROOT, "scripts", "ha", "ha.sh")
BENCH = os.path.join(ROOT, "scripts", "bench")
RUN = os.environ.get("HA_RUN_DIR", "/tmp/payments-ha")
API = "http://127.0.0.1:25080"
DATABASE = "postgres://postgres@127.0.0.1:25000/payments"
TICKS = os.sysconf("SC_CLK_TCK")
KINDS = ("api", "pg primary", "pg standbys", "haproxy", "card-sim", "wrk")


def ha(*args, env=None):
    done = subprocess.run(["bash", HA, *args], capture_output=True, text=True,
                          env={**os.environ, **(env or {})})
    if done.returncode != 0:
        sys.exit(f"ha-capacity: ha.sh {' '.join(args)} failed: {done.stderr.strip()}")
    return done.stdout.strip()


def pid_of(name):
    with open(os.path.join(RUN, f"{name}.pid")) as f:
        return int(f.read().split()[0])


def postmaster_of(node):
    with open(os.path.join(RUN, node, "data", "postmaster.pid")) as f:
        return int(f.readline())


def cpu_by_kind(primary):
    """CPU seconds so far of every live process of each kind but wrk: an instance, HAProxy and
    card-sim are their sessions (ha.sh starts each in one); a PostgreSQL node is its
    postmaster and the postmaster's children."""
    kind_of_session = {pid_of(f"api{i}"): "api" for i in (1, 2, 3)}
    kind_of_session[pid_of("haproxy")] = "haproxy"
    kind_of_session[pid_of("card-sim")] = "card-sim"
    kind_of_postmaster = {postmaster_of(node): "pg primary" if node == primary else "pg standbys"
                          for node in ("pg1", "pg2", "pg3")}
    totals = dict.fromkeys(KINDS, 0.0)
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                stat = f.read()
        except OSError:
            continue
        # stat(5): the fields after the command, from the state (field 3) on.
        fields = stat[stat.rindex(")") + 2:].split()
        parent, session = int(fields[1]), int(fields[3])
        kind = (kind_of_postmaster.get(int(entry)) or kind_of_postmaster.get(parent)
                or kind_of_session.get(session))
        if kind:
            totals[kind] += (int(fields[11]) + int(fields[12])) / TICKS  # utime + stime
    return totals


def children_cpu():
    """CPU seconds of this script's children that have ended (wrk, once it has)."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def haproxy_command(command):
    with socket.socket(socket.AF_UNIX) as admin:
        admin.connect(os.path.join(RUN, "haproxy.sock"))
        admin.sendall(command.encode() + b"\n")
        return admin.recv(4096).decode()


def instances(count):
    for i in (1, 2, 3):
        state = "enable" if i <= count else "disable"
        haproxy_command(f"{state} server payments/api{i}")


def wrk(script, duration, connections, argument):
    out = subprocess.run(
        ["wrk", "-t2", f"-c{connections}", f"-d{duration}s", "--latency", "-s",
         os.path.join(BENCH, script), API + "/charges", "--", argument],
        capture_output=True, text=True, cwd=BENCH, check=True).stdout
    line = next(line for line in out.splitlines() if line.startswith("BENCH "))
    return {k: float(v) for k, v in re.findall(r"(\w+)=([\d.]+)", line)}


def psql(query):
    return subprocess.run(["psql", DATABASE, "-Atqc", query], capture_output=True, text=True,
                          check=True).stdout.strip()


def measure(scenario, count, duration, connections, replay_key, primary):
    script = "first-charge.lua" if scenario == "first-charge" else "replay.lua"
    argument = f"ha-{uuid.uuid4().hex[:8]}" if scenario == "first-charge" else replay_key
    charges_before = int(psql("SELECT count(*) FROM charges"))
    before, wrk_before = cpu_by_kind(primary), children_cpu()
    result = wrk(script, duration, connections, argument)
    after, wrk_after = cpu_by_kind(primary), children_cpu()
    before["wrk"], after["wrk"] = 0.0, wrk_after - wrk_before
    errors = sum(result[k] for k in ("non2xx", "connect", "read", "write", "timeout"))
    if errors:
        sys.exit(f"ha-capacity: {scenario} with {count} instance(s): {errors:.0f} errors")
    made = int(psql("SELECT count(*) FROM charges")) - charges_before
    # wrk counts the answers it read; the requests in flight when it stopped (one per
    # connection at most) were charged too, unread.
    answered = int(result["requests"])
    low, high = (answered, answered + connections) if scenario == "first-charge" else (0, 0)
    if not low <= made <= high:
        sys.exit(f"ha-capacity: {scenario}: {answered} answered, {made} charges")
    result["cpu_ms"] = {kind: (after[kind] - before[kind]) * 1000 / result["requests"]
                        for kind in KINDS}
    return result


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--duration", type=int, default=10)
    parser.add_argument("--connections", type=int, default=16)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--out", default=os.path.join(ROOT, "target", "bench", "ha-capacity.md"))
    args = parser.parse_args()

    if subprocess.run(["bash", HA, "running"]).returncode == 0:
        sys.exit("ha-capacity: a topology is already running (scripts/ha/down.sh stops it)")
    # What is measured is the service, not its refusals: each tenant's rate is lifted, as in
    # the other scenarios. The instances inherit the PAYMENTS__ variables.
    unlimited = "1000000"
    env = {"HA_BIN": os.environ.get("HA_BIN", os.path.join(ROOT, "target", "bench-build",
                                                           "release")),
           "HA_REDIS": "off", "HA_CARD_SIM_LATENCY_MS": "0", "HA_LOG_FILTER": "error",
           "PAYMENTS__AUTH__RATE_LIMIT_PER_SEC": unlimited,
           "PAYMENTS__AUTH__RATE_LIMIT_BURST": unlimited,
           # replay-db measures the database: no instance holds recent answers.
           "PAYMENTS__IDEMPOTENCY__RECENT_ANSWERS_BYTES": "0"}
    try:
        ha("up", env=env)
        primary = ha("primary")
        replay_key = f"ha-replay-{uuid.uuid4().hex[:8]}"
        subprocess.run(["curl", "-sf", "-o", "/dev/null", API + "/charges",
                        "-H", "Authorization: Bearer sk_test_acme",
                        "-H", f"Idempotency-Key: {replay_key}",
                        "-H", "Content-Type: application/json",
                        "-d", json.dumps({"amount": 100, "currency": "usd",
                                          "source": "tok_visa"})], check=True)
        runs = {}
        for _ in range(args.repeat):
            for count in (1, 3):
                instances(count)
                time.sleep(1)
                for scenario in ("first-charge", "replay-db"):
                    runs.setdefault((scenario, count), []).append(
                        measure(scenario, count, args.duration, args.connections, replay_key,
                                primary))
    finally:
        subprocess.run(["bash", HA, "down"], capture_output=True)

    cpus = os.cpu_count()
    lines = [
        f"Through HAProxy, {args.connections} connections, {args.duration} s runs, median of "
        f"{args.repeat}; CPU ms per request by kind of process; {cpus} cores, everything on "
        "one machine.",
        "",
        "| scenario | instances | req/s | p50 ms | p99 ms | " +
        " | ".join(f"{kind} CPU ms" for kind in KINDS) + " | total CPU ms |",
        "| --- | ---: | ---: | ---: | ---: | " + " | ".join("---:" for _ in KINDS) + " | ---: |",
    ]
    for (scenario, count), results in runs.items():
        median = sorted(results, key=lambda r: r["rps"])[len(results) // 2]
        cpu = {kind: statistics.median(r["cpu_ms"][kind] for r in results) for kind in KINDS}
        lines.append(
            f"| {scenario} | {count} | {median['rps']:.0f} | {median['p50_ms']:.2f} | "
            f"{median['p99_ms']:.2f} | " + " | ".join(f"{cpu[kind]:.3f}" for kind in KINDS) +
            f" | {sum(cpu.values()):.3f} |")
    table = "\n".join(lines) + "\n"
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    with open(args.out, "w") as f:
        f.write(table)
    print(table)


if __name__ == "__main__":
    main()
