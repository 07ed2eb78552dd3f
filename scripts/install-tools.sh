#!/usr/bin/env bash
# Extra tools from Debian 13 packages:
#   cosign (2.5.x): the evidence stage's independent verifier;
#   docker-buildx (0.13.x): BuildKit's client, for the adopter's own Dockerfile images
#                 (pipeline/imaging/buildkit.py; it drives the engine's embedded BuildKit).
# Run by scripts/setup.sh. Idempotent and fast once done: it returns at once when
# the tools dir already holds a working cosign and docker-buildx.
#   Debian 13: apt-get install the missing ones, linked into the tools dir.
#   Debian 12: apt-get download them from a trixie list derived from this machine's
#              own apt sources (private apt state; the system's lists stay untouched),
#              then dpkg -x into the tools dir. Both are Go binaries that need only
#              libc6 >= 2.34, which bookworm has.
set -euo pipefail
cd "$(dirname "$0")/.."
STATE=${BENCHSEAL_HOME:-$PWD/.benchseal}
TOOLS=$STATE/tools
BIN=$TOOLS/bin
log() { printf '[install-tools] %s\n' "$*" >&2; }

# APT_ETC (default /etc/apt) and --print-trixie-sources exist for the tests of the
# source-list derivation; setup never passes them.
APT_ETC=${APT_ETC:-/etc/apt}
PRINT_ONLY=0
[ "${1:-}" = "--print-trixie-sources" ] && PRINT_ONLY=1

cosign_ready() { [ -x "$BIN/cosign" ] && [ -s "$TOOLS/cosign.version" ] && "$BIN/cosign" version >/dev/null 2>&1; }
buildx_ready() { [ -x "$BIN/docker-buildx" ] && "$BIN/docker-buildx" version >/dev/null 2>&1; }
if [ "$PRINT_ONLY" = 0 ] && cosign_ready && buildx_ready; then
  exit 0
fi
mkdir -p "$BIN"
codename=$(. /etc/os-release && echo "${VERSION_CODENAME:-}")
# Debian package of each tool that is still missing.
wanted=()
cosign_ready || wanted+=(cosign)
buildx_ready || wanted+=(docker-buildx)
# Where each package puts its binary.
binary_of() { case "$1" in cosign) echo usr/bin/cosign ;; docker-buildx) echo usr/libexec/docker/cli-plugins/docker-buildx ;; esac; }
tool_of() { case "$1" in cosign) echo cosign ;; docker-buildx) echo docker-buildx ;; esac; }

if [ "$PRINT_ONLY" = 0 ] && [ "$codename" != "bookworm" ]; then
  # Debian 13 (or later) carries both itself.
  missing=()
  for pkg in "${wanted[@]}"; do
    [ -x "/$(binary_of "$pkg")" ] || missing+=("$pkg")
  done
  if ((${#missing[@]})); then
    log "installing with apt: ${missing[*]}"
    export DEBIAN_FRONTEND=noninteractive
    apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null 2>&1 || {
      apt-get update -qq && apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null; }
  fi
  for pkg in "${wanted[@]}"; do
    ln -sf "/$(binary_of "$pkg")" "$BIN/$(tool_of "$pkg")"
    "$BIN/$(tool_of "$pkg")" version >/dev/null
    log "$pkg ready: $BIN/$(tool_of "$pkg")"
  done
  if [[ " ${wanted[*]} " == *" cosign "* ]]; then
    dpkg-query -W -f='${Version}\n' cosign > "$TOOLS/cosign.version"
  fi
  exit 0
fi

# --- Debian 12: derive a trixie source list from the configured bookworm entries ----
APT=$TOOLS/apt-trixie
[ "$PRINT_ONLY" = 1 ] && APT=$(mktemp -d)
rm -rf "$APT"
mkdir -p "$APT/sources.list.d" "$APT/lists/partial" "$APT/cache/archives/partial" "$APT/pkg"
: > "$APT/sources.list"

# deb822 (*.sources): keep stanzas of Types deb whose Suites include plain "bookworm";
# write them with Suites: trixie and the same URIs, Components and Signed-By.
for f in "$APT_ETC"/sources.list.d/*.sources; do
  [ -f "$f" ] || continue
  awk -v out="$APT/sources.list.d/trixie-$(basename "$f")" '
    function flush() {
      if (types ~ /(^| )deb( |$)/ && suites ~ /(^| )bookworm( |$)/ && uris != "") {
        printf "Types: deb\nURIs: %s\nSuites: trixie\nComponents: %s\n", uris, comps >> out
        if (signed != "") printf "Signed-By: %s\n", signed >> out
        printf "\n" >> out
      }
      types = ""; suites = ""; uris = ""; comps = ""; signed = ""
    }
    /^[[:space:]]*$/ { flush(); next }
    /^[[:space:]]*#/ { next }
    {
      key = $1; sub(/:$/, "", key); val = $0; sub(/^[^:]*:[[:space:]]*/, "", val)
      if (key == "Types") types = val
      else if (key == "Suites") suites = val
      else if (key == "URIs") uris = val
      else if (key == "Components") comps = val
      else if (key == "Signed-By") signed = val
    }
    END { flush() }
  ' "$f"
done
# One-line format (sources.list and *.list): "deb [opts] URI bookworm COMPONENTS".
for f in "$APT_ETC"/sources.list "$APT_ETC"/sources.list.d/*.list; do
  [ -f "$f" ] || continue
  awk '$1 == "deb" {
         for (i = 2; i <= NF; i++) if ($i == "bookworm") { $i = "trixie"; print; break }
       }' "$f" >> "$APT/sources.list"
done
if ! grep -qs . "$APT/sources.list" "$APT"/sources.list.d/*.sources; then
  log "error: no bookworm entry in the machine's apt sources to derive a trixie list from"
  exit 1
fi

if [ "$PRINT_ONLY" = 1 ]; then
  cat "$APT/sources.list" "$APT"/sources.list.d/*.sources 2>/dev/null || true
  rm -rf "$APT"
  exit 0
fi

apt_opts=(
  -o "Dir::Etc::SourceList=$APT/sources.list"
  -o "Dir::Etc::SourceParts=$APT/sources.list.d"
  -o "Dir::State::Lists=$APT/lists"
  -o "Dir::Cache=$APT/cache"
  -o "Dir::State::status=/dev/null"
  -o "APT::Get::List-Cleanup=0"
)
log "fetching the trixie package list (private apt state under $APT)"
apt-get "${apt_opts[@]}" update -qq >"$APT/update.log" 2>&1 || { cat "$APT/update.log" >&2; exit 1; }
(cd "$APT/pkg" && apt-get "${apt_opts[@]}" download "${wanted[@]}" >"$APT/download.log" 2>&1) ||
  { cat "$APT/download.log" >&2; exit 1; }
for pkg in "${wanted[@]}"; do
  deb=$(ls "$APT"/pkg/"${pkg}"_*.deb)
  tool=$(tool_of "$pkg")
  rm -rf "$TOOLS/$tool-root"
  dpkg -x "$deb" "$TOOLS/$tool-root"
  ln -sf "$TOOLS/$tool-root/$(binary_of "$pkg")" "$BIN/$tool"
  "$BIN/$tool" version >/dev/null
  # cosign built by Debian reports "devel": record the package version beside it.
  if [ "$pkg" = cosign ]; then dpkg-deb -f "$deb" Version > "$TOOLS/cosign.version"; fi
  log "$pkg ready: $BIN/$tool ($(basename "$deb"))"
done
# Keep only the unpacked packages; the lists are large and not needed again.
rm -rf "$APT/lists" "$APT/cache"
