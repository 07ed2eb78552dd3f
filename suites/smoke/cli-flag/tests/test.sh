#!/bin/bash
# Offline verifier: python3 unittest only (nothing is downloaded). benchseal grades by this script's
# exit status (task.toml: [metadata.benchseal] grading = "exit-status"); reward.txt is for plain Harbor.
mkdir -p /logs/verifier
python3 /tests/test_wc.py -v
status=$?
if [ "$status" -eq 0 ]; then echo 1 > /logs/verifier/reward.txt; else echo 0 > /logs/verifier/reward.txt; fi
exit "$status"
