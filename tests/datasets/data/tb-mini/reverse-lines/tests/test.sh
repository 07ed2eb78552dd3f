#!/bin/bash
# benchseal grades by this script's exit status (task.toml: [metadata.benchseal] grading = "exit-status");
# reward.txt is for plain Harbor. data.txt exists only in the task's prebuilt image.
mkdir -p /logs/verifier
expected=$'golf\nfoxtrot\necho\ndelta\ncharlie\nbravo\nalpha'
status=1
if [ "$(cat /app/reversed.txt 2>/dev/null)" = "$expected" ]; then status=0; fi
echo $((1 - status)) > /logs/verifier/reward.txt
exit "$status"
