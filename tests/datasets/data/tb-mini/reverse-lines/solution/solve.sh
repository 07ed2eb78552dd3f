#!/bin/bash
set -euo pipefail
tac /app/data.txt > /app/reversed.txt
