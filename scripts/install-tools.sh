#!/usr/bin/env bash
# Extra tools from Debian packages:
#   cosign (3.1.x): the evidence stage's signer of images and independent verifier. Debian 12 and 13
#                 ship 2.5 at most, which ignores --type with --new-bundle-format (GHSA-w6c6-c85g-mmv6)
#                 and whose `cosign tree` shows no OCI referrers: it comes from the newer suite
#                 $COSIGN_SUITE (default forky);
#   docker-buildx (0.13.x): BuildKit's client, for the adopter's own Dockerfile images
#                 (pipeline/imaging/buildkit.py; it drives the engine's embedded BuildKit).
# Run by scripts/setup.sh. Idempotent and fast once done: it returns at once when the tools dir
# already holds a working cosign of the wanted series (its recorded package version) and docker-buildx.
#   docker-buildx: Debian 13 apt-get installs it, linked into the tools dir; Debian 12 downloads it
#                  from a trixie list.
#   cosign:        downloaded on either from a $COSIGN_SUITE list.
# Such a list is derived from this machine's own apt sources (the entries of its own suite, with the
# suite renamed; private apt state under the tools dir, the system's sources and lists stay untouched);
# the .deb is unpacked with dpkg -x. Both are Go binaries that need only libc6 >= 2.34 (Debian 12 has
# 2.36), so a newer suite's package runs on Debian 12 and 13 alike.
set -euo pipefail
shopt -s inherit_errexit  # a failure inside $(fetch_debs ...) stops the script too
cd "$(dirname "$0")/.."
STATE=${BENCHSEAL_HOME:-$PWD/.benchseal}
TOOLS=$STATE/tools
BIN=$TOOLS/bin
COSIGN_SUITE=${COSIGN_SUITE:-forky}
COSIGN_SERIES=3.1.  # the package version cosign.version must start with
log() { printf '[install-tools] %s\n' "$*" >&2; }

# APT_ETC (default /etc/apt), --print-trixie-sources and --print-sources FROM TO exist for the tests
# of the source-list derivation; setup never passes them.
APT_ETC=${APT_ETC:-/etc/apt}
PRINT_FROM=""
PRINT_TO=""
case "${1:-}" in
  --print-trixie-sources) PRINT_FROM=bookworm PRINT_TO=trixie ;;
  --print-sources) PRINT_FROM=${2:?--print-sources FROM TO} PRINT_TO=${3:?--print-sources FROM TO} ;;
  "") ;;
  *) log "usage: install-tools.sh [--print-trixie-sources | --print-sources FROM TO]"; exit 2 ;;
esac

# derive_sources FROM TO DIR: DIR/sources.list and DIR/sources.list.d/*.sources hold the machine's
# entries for suite FROM (plain FROM only: not FROM-updates or FROM-security), renamed to suite TO.
derive_sources() {
  local from=$1 to=$2 dir=$3 f
  mkdir -p "$dir/sources.list.d"
  : > "$dir/sources.list"
  # deb822 (*.sources): keep stanzas of Types deb whose Suites include FROM; write them with
  # Suites: TO and the same URIs, Components and Signed-By.
  for f in "$APT_ETC"/sources.list.d/*.sources; do
    [ -f "$f" ] || continue
    awk -v from="$from" -v to="$to" -v out="$dir/sources.list.d/$to-$(basename "$f")" '
      function flush() {
        if (types ~ /(^| )deb( |$)/ && (" " suites " ") ~ (" " from " ") && uris != "") {
          printf "Types: deb\nURIs: %s\nSuites: %s\nComponents: %s\n", uris, to, comps >> out
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
  # One-line format (sources.list and *.list): "deb [opts] URI FROM COMPONENTS".
  for f in "$APT_ETC"/sources.list "$APT_ETC"/sources.list.d/*.list; do
    [ -f "$f" ] || continue
    awk -v from="$from" -v to="$to" '$1 == "deb" {
           for (i = 2; i <= NF; i++) if ($i == from) { $i = to; print; break }
         }' "$f" >> "$dir/sources.list"
  done
  if ! grep -qs . "$dir/sources.list" "$dir"/sources.list.d/*.sources; then
    log "error: no $from entry in the machine's apt sources to derive a $to list from"
    return 1
  fi
}

if [ -n "$PRINT_FROM" ]; then
  dir=$(mktemp -d)
  derive_sources "$PRINT_FROM" "$PRINT_TO" "$dir" || { rm -rf "$dir"; exit 1; }
  cat "$dir/sources.list" "$dir"/sources.list.d/*.sources 2>/dev/null || true
  rm -rf "$dir"
  exit 0
fi

cosign_ready() {
  [ -x "$BIN/cosign" ] && [ -s "$TOOLS/cosign.version" ] && [[ "$(cat "$TOOLS/cosign.version")" == "$COSIGN_SERIES"* ]] &&
    "$BIN/cosign" version >/dev/null 2>&1
}
buildx_ready() { [ -x "$BIN/docker-buildx" ] && "$BIN/docker-buildx" version >/dev/null 2>&1; }
if cosign_ready && buildx_ready; then
  exit 0
fi
mkdir -p "$BIN"
codename=$(. "${OS_RELEASE:-/etc/os-release}" && echo "${VERSION_CODENAME:-}")
[ -n "$codename" ] || { log "error: no VERSION_CODENAME in /etc/os-release"; exit 1; }

# fetch_debs SUITE PKG...: download the packages from a SUITE list derived from the machine's own suite
# (private apt state under $TOOLS/apt-SUITE); prints the .deb paths, one a line, in argument order.
fetch_debs() {
  local suite=$1; shift
  local apt=$TOOLS/apt-$suite pkg
  rm -rf "$apt"
  mkdir -p "$apt/lists/partial" "$apt/cache/archives/partial" "$apt/pkg"
  derive_sources "$codename" "$suite" "$apt"
  local opts=(
    -o "Dir::Etc::SourceList=$apt/sources.list"
    -o "Dir::Etc::SourceParts=$apt/sources.list.d"
    -o "Dir::State::Lists=$apt/lists"
    -o "Dir::Cache=$apt/cache"
    -o "Dir::State::status=/dev/null"
    -o "APT::Get::List-Cleanup=0"
  )
  log "fetching the $suite package list (private apt state under $apt)"
  apt-get "${opts[@]}" update -qq >"$apt/update.log" 2>&1 || { cat "$apt/update.log" >&2; return 1; }
  (cd "$apt/pkg" && apt-get "${opts[@]}" download "$@" >"$apt/download.log" 2>&1) ||
    { cat "$apt/download.log" >&2; return 1; }
  # Keep only the downloaded packages; the lists are large and not needed again.
  rm -rf "$apt/lists" "$apt/cache"
  for pkg in "$@"; do ls "$apt"/pkg/"${pkg}"_*.deb; done
}

# unpack DEB TOOL PATH: the package's files under $TOOLS/TOOL-root, its binary PATH linked as $BIN/TOOL.
unpack() {
  local deb=$1 tool=$2 binary=$3
  rm -rf "$TOOLS/$tool-root"
  dpkg -x "$deb" "$TOOLS/$tool-root"
  ln -sf "$TOOLS/$tool-root/$binary" "$BIN/$tool"
  "$BIN/$tool" version >/dev/null
  log "$tool ready: $BIN/$tool ($(basename "$deb"))"
}

if ! buildx_ready; then
  if [ "$codename" = "bookworm" ]; then
    deb=$(fetch_debs trixie docker-buildx)
    unpack "$deb" docker-buildx usr/libexec/docker/cli-plugins/docker-buildx
  else
    # Debian 13 (or later) carries it itself.
    if [ ! -x /usr/libexec/docker/cli-plugins/docker-buildx ]; then
      log "installing with apt: docker-buildx"
      export DEBIAN_FRONTEND=noninteractive
      apt-get install -y -qq --no-install-recommends docker-buildx >/dev/null 2>&1 || {
        apt-get update -qq && apt-get install -y -qq --no-install-recommends docker-buildx >/dev/null; }
    fi
    ln -sf /usr/libexec/docker/cli-plugins/docker-buildx "$BIN/docker-buildx"
    "$BIN/docker-buildx" version >/dev/null
    log "docker-buildx ready: $BIN/docker-buildx"
  fi
fi

if ! cosign_ready; then
  deb=$(fetch_debs "$COSIGN_SUITE" cosign)
  version=$(dpkg-deb -f "$deb" Version)
  if [[ "$version" != "$COSIGN_SERIES"* ]]; then
    log "error: $COSIGN_SUITE carries cosign $version, not ${COSIGN_SERIES}x (set COSIGN_SUITE to a suite that does)"
    exit 1
  fi
  unpack "$deb" cosign usr/bin/cosign
  # cosign built by Debian reports "devel": record the package version beside it.
  printf '%s\n' "$version" > "$TOOLS/cosign.version"
fi
