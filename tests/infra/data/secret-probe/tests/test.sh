#!/bin/bash
# Offline verifier: python3 unittest only (nothing is downloaded); benchseal grades by this exit status.
mkdir -p /logs/verifier
python3 /tests/probe_check.py -v
status=$?
if [ "$status" -eq 0 ]; then echo 1 > /logs/verifier/reward.txt; else echo 0 > /logs/verifier/reward.txt; fi
exit "$status"
