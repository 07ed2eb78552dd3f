#!/bin/bash
# Offline verifier: python3 unittest only (nothing is downloaded).
mkdir -p /logs/verifier
if python3 /tests/probe_check.py -v; then
  echo 1 > /logs/verifier/reward.txt
else
  echo 0 > /logs/verifier/reward.txt
fi
