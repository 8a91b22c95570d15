#!/usr/bin/env bash
# Stops every process of the highly available topology and deletes its data and logs.
exec "$(dirname "$0")/ha.sh" down
