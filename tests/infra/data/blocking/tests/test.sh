#!/bin/bash
# benchseal grades by this exit status.
mkdir -p /logs/verifier
if [ -e /app/answer.txt ]; then echo 1 > /logs/verifier/reward.txt; exit 0; else echo 0 > /logs/verifier/reward.txt; exit 1; fi
