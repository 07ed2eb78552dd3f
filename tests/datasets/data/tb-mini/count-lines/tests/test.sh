#!/bin/bash
# benchseal grades by this script's exit status (task.toml: [metadata.benchseal] grading = "exit-status");
# reward.txt is for plain Harbor. data.txt exists only in the task's prebuilt image.
mkdir -p /logs/verifier
status=1
if [ "$(cat /app/answer.txt 2>/dev/null)" = "7" ] && [ "$(wc -l < /app/data.txt)" = "7" ]; then status=0; fi
echo $((1 - status)) > /logs/verifier/reward.txt
exit "$status"
