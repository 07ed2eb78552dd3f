#!/bin/bash
set -euo pipefail
# Prove the secret arrived without printing it: only its hash leaves the container.
test -n "${BENCHSEAL_AGENT_API_KEY:-}"
printf '%s' "$BENCHSEAL_AGENT_API_KEY" | python3 -c 'import hashlib, sys; print(hashlib.sha256(sys.stdin.buffer.read()).hexdigest())' > /app/secret.sha256
ls /sys/class/net | tr '\n' ' ' > /app/net.txt
# Stay a moment so the argv scan on the host sees this exec's whole process tree.
sleep 2
