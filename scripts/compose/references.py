"""What the Compose schema cannot say about a compose file, and this project relies on: every
`depends_on` names a defined service, `service_healthy` is only asked of a service with a
healthcheck, and a dependency that has a healthcheck is waited for with it (a started
container is not a ready one). Prints each problem and exits 1 if there is any."""

import sys

import yaml

with open(sys.argv[1], encoding="utf-8") as f:
    services = (yaml.safe_load(f) or {}).get("services") or {}
problems = []
for name, service in services.items():
    depends_on = service.get("depends_on") or {}
    if isinstance(depends_on, list):
        depends_on = {target: {"condition": "service_started"} for target in depends_on}
    for target, how in depends_on.items():
        condition = (how or {}).get("condition", "service_started")
        if target not in services:
            problems.append(f"{name} depends on {target}, which is not a service")
        elif "healthcheck" not in services[target]:
            if condition == "service_healthy":
                problems.append(f"{name} waits for {target}'s healthcheck, which it has not")
        elif condition != "service_healthy":
            problems.append(f"{name} does not wait for {target}'s healthcheck ({condition})")
for problem in problems:
    print(f"{sys.argv[1]}: {problem}", file=sys.stderr)
sys.exit(1 if problems else 0)
