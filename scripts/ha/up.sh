#!/usr/bin/env bash
# Brings the highly available topology up on this machine (see ha.sh and docs/DEPLOYMENT.md):
# installs what is missing from Debian's packages, then starts etcd, three PostgreSQL nodes under
# Patroni, HAProxy, Redis with a replica and three Sentinels, card-sim and three instances.
#
#   scripts/ha/up.sh     # then: curl http://127.0.0.1:25080/readyz
exec "$(dirname "$0")/ha.sh" up
