"""``benchseal doctor host``: an installed infra host (or a root under ``--prefix``) checked against what
the worker needs, one finding a line with its fix (``pipeline.core.doctor``).

The paths are the installer's (``pipeline.host.install``) and the shipped worker unit's: the policy
``/etc/benchseal/infra.yaml`` (parsed with the same ``load_policy`` the worker uses), the suites the
worker reads (``/opt/benchseal/suites``: the unit runs in ``/opt/benchseal`` with no ``--suites-dir``),
each suite's dataset hashed with ``pipeline.core.datasets`` against its pinned digest, the units, the
SQLite queue's directory writable by the service user, and Sigstore reachable (``--offline``: skipped).
"""

from __future__ import annotations

import json
import shutil
import stat
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from pipeline.core.contracts import canonical_repository
from pipeline.core.datasets import dataset_entries, digest_entries
from pipeline.core.doctor import Finding, Side, missing, ok, unknown
from pipeline.core.errors import Error
from pipeline.host.install import API_UNIT, POLICY_FILE, STATE_DIR, SUITES_DIR, UNIT_DIR, UNITS

if TYPE_CHECKING:
    from pipeline.infra.intake.policy import InfraPolicy

QUEUE_DIR = STATE_DIR + "/infra"  # the SQLite queue (queue.sqlite3) the worker creates there
QUEUE_URL_FILE = QUEUE_DIR + "/queue-url"
DOCKER_CONFIG = STATE_DIR + "/.docker/config.json"  # the service user's (its home is the state dir)  # a PostgreSQL queue instead (deploy/benchseal-worker.service)
# Where cosign's public-good signatures are logged: reachable, or the worker cannot check an image.
PUBLIC_GOOD_REKOR = "https://rekor.sigstore.dev"
_INSTALL = "run `benchseal host install --runner-user RUNNER` (docs/host.md step 2)"
_INSTALL_INFRA = ("run `benchseal host install --runner-user RUNNER --infra-checkout DIR` with a checkout of the infra "
                  "repository (docs/host.md step 2)")


@dataclass(frozen=True)
class HostOptions:
    prefix: Path = Path("/")
    service_user: str = "benchseal"
    suites_dir: str = SUITES_DIR
    sigstore_url: str = PUBLIC_GOOD_REKOR
    offline: bool = False
    timeout: float = 5.0
    source: str | None = None  # an adopter repository the policy must admit, with its agent
    now: float | None = None  # the clock the worker's heartbeat is judged by (None: time.time())


def _under(prefix: Path, path: str) -> Path:
    return prefix / path.lstrip("/")


@dataclass(frozen=True)
class PolicyPlace:
    """Where a policy and its suites are (the host's paths, or an infra repository's checkout) and how to fix them."""

    side: Side
    root: Path  # what the shown paths are under
    policy: str  # shown path of the policy file
    suites: str  # shown path of the suites root
    fix_policy: str
    fix_suites: str


def host_place(prefix: Path, suites_dir: str) -> PolicyPlace:
    return PolicyPlace("host", prefix, POLICY_FILE, suites_dir, _INSTALL_INFRA,
                       _INSTALL_INFRA if suites_dir == SUITES_DIR else f"copy the infra repository's suites/ to {suites_dir}")


def checkout_place(checkout: Path) -> PolicyPlace:
    """An infra repository's checkout: policies/infra.yaml and suites/ (docs/github.md step 1)."""
    return PolicyPlace("infra", checkout, "policies/infra.yaml", "suites",
                       "copy examples/bench-infra/policies/infra.yaml there and edit it (docs/github.md step 7)",
                       "copy benchseal's suites/smoke into suites/, or write your own")


def policy_findings(place: PolicyPlace, source: str | None = None) -> tuple[list[Finding], InfraPolicy | None]:
    """The policy parses as the worker parses it, its agents; with ``source``: that repository is a
    source with an agent admitted for it (its release's agent)."""
    # lazy: the policy model (and yaml) cost ~110 ms at every CLI start (python -X importtime, 2026-12-07)
    from pipeline.infra.intake.policy import ReleaseAgentPolicy, load_policy

    side, path = place.side, _under(place.root, place.policy)
    if not path.is_file():
        return [missing(side, "policy", f"{place.policy} is missing", place.fix_policy)], None
    try:
        policy = load_policy(path)
    except Error as exc:
        return [missing(side, "policy", exc.diagnostics(), f"correct {place.policy} (docs/infra.md)")], None
    out = [ok(side, "policy", place.policy), ok(side, "policy agents", ", ".join(policy.agent_names))]
    if source is not None:
        wanted = canonical_repository(source)
        listed = any(canonical_repository(s.repository) == wanted for s in policy.sources)
        out.append(ok(side, f"policy source {source}") if listed else
                   missing(side, f"policy source {source}", f"not in {place.policy}'s sources",
                           f"add a sources entry for {source} with its signer and images (docs/github.md step 7)"))
        agents = [a.name for a in policy.agents if isinstance(a, ReleaseAgentPolicy) and a.admits(source)]
        out.append(ok(side, f"policy agent for {source}", ", ".join(agents)) if agents else
                   missing(side, f"policy agent for {source}", f"no agents entry of {place.policy} lists {source}",
                           f"add an agents entry {{name, kind, package, repositories: [{source}]}} "
                           "(`benchseal init` prints it)"))
    return out, policy


def suites_findings(place: PolicyPlace, policy: InfraPolicy) -> list[Finding]:
    """Each policy suite's dataset under the suites root, hashed as the worker hashes it, against its pinned digest."""
    side, root = place.side, _under(place.root, place.suites)
    if not root.is_dir():
        return [missing(side, "suites directory", f"{place.suites} is missing", place.fix_suites)]
    out = [ok(side, "suites directory", place.suites)]
    for name, suite in sorted(policy.suites.items()):
        check = f"suite {name} dataset"
        where = f"{place.suites}/{suite.dataset.path}"
        try:
            actual = digest_entries(dataset_entries(root / suite.dataset.path))
        except Error as exc:
            out.append(missing(side, check, f"{where}: {exc.diagnostics()}", place.fix_suites))
            continue
        out.append(ok(side, check, f"{where} {actual}") if actual == suite.dataset.digest else
                   missing(side, check, f"{where} has digest {actual}, the policy pins {suite.dataset.digest}",
                           place.fix_suites if side == "host" else  # the host's policy is the repository's
                           f"commit the suite the policy pins, or pin `benchseal dataset digest {where}` in it"))
    return out


def _units(prefix: Path) -> list[Finding]:
    out = []
    live = str(prefix) == "/" and shutil.which("systemctl") is not None
    for unit in (*UNITS, API_UNIT):
        path = _under(prefix, f"{UNIT_DIR}/{unit}")
        if not path.is_file():
            if unit == API_UNIT:
                continue  # optional: installed with --api-image only
            out.append(missing("host", f"unit {unit}", "not installed", _INSTALL))
            continue
        out.append(ok("host", f"unit {unit}", "installed"))
        if not live:
            continue
        state = subprocess.run(["systemctl", "is-active", unit], capture_output=True, text=True, check=False,
                               timeout=30).stdout.strip()
        out.append(ok("host", f"service {unit}", state) if state == "active" else
                   missing("host", f"service {unit}", state or "not running",
                           f"systemctl enable --now {unit}; journalctl -u {unit} says why it stopped"))
    if not live:
        out.append(unknown("host", "services running", "not checked (no systemctl here, or --prefix)"))
    return out


def _account(prefix: Path, user: str) -> tuple[int, set[int]] | None:
    """(uid, gids) of ``user`` from the root's own /etc/passwd and /etc/group."""
    uid = gid = None
    for line in _under(prefix, "/etc/passwd").read_text(encoding="utf-8").splitlines():
        fields = line.split(":")
        if len(fields) > 3 and fields[0] == user:
            uid, gid = int(fields[2]), int(fields[3])
    if uid is None or gid is None:
        return None
    gids = {gid}
    for line in _under(prefix, "/etc/group").read_text(encoding="utf-8").splitlines():
        fields = line.split(":")
        if len(fields) > 3 and user in fields[3].split(","):
            gids.add(int(fields[2]))
    return uid, gids


def _writable(st_mode: int, st_uid: int, st_gid: int, uid: int, gids: set[int]) -> bool:
    if st_uid == uid:
        return bool(st_mode & stat.S_IWUSR)
    if st_gid in gids:
        return bool(st_mode & stat.S_IWGRP)
    return bool(st_mode & stat.S_IWOTH)


def _queue(prefix: Path, user: str) -> Finding:
    check = f"queue writable by {user}"
    if _under(prefix, QUEUE_URL_FILE).is_file():
        return unknown("host", check, f"PostgreSQL queue ({QUEUE_URL_FILE}): not checked here",
                       "run `benchseal infra migrate` as the worker's role to check it")
    account = _account(prefix, user) if _under(prefix, "/etc/passwd").is_file() else None
    if account is None:
        return missing("host", check, f"no user {user} in /etc/passwd", _INSTALL)
    uid, gids = account
    # The worker creates infra/ and the database in it: the nearest existing of them must be writable.
    for path in (QUEUE_DIR + "/queue.sqlite3", QUEUE_DIR, STATE_DIR):
        target = _under(prefix, path)
        if target.exists():
            st = target.stat()
            if _writable(st.st_mode, st.st_uid, st.st_gid, uid, gids):
                return ok("host", check, path)
            return missing("host", check, f"{path} (owner {st.st_uid}, mode {stat.S_IMODE(st.st_mode):04o})",
                           f"chown -R {user}:{user} {STATE_DIR}, or {_INSTALL}")
    return missing("host", check, f"{STATE_DIR} is missing", _INSTALL)


def _registry_answer(registry: str, timeout: float) -> tuple[int | None, str]:
    """(HTTP status of the registry's ``GET /v2/``, its WWW-Authenticate scheme), or (None, why it did not answer).
    Plain HTTP for a loopback registry (as the Docker Engine treats 127.0.0.0/8), HTTPS otherwise."""
    # lazy: urllib.request (http.client, ssl) costs ~20 ms at every CLI start (python -X importtime, 2026-12-07)
    import urllib.error
    import urllib.request

    host = registry.rsplit(":", 1)[0] if registry.count(":") == 1 else registry
    scheme = "http" if host in ("localhost", "::1", "[::1]") or host.startswith("127.") else "https"
    try:
        with urllib.request.urlopen(f"{scheme}://{registry}/v2/", timeout=timeout) as answer:  # noqa: S310
            return int(answer.status), ""
    except urllib.error.HTTPError as exc:
        return exc.code, (exc.headers.get("WWW-Authenticate") or "").split(" ", 1)[0].lower()
    except (urllib.error.URLError, OSError) as exc:
        return None, str(getattr(exc, "reason", exc))


def _registry_auth(prefix: Path, user: str, policy: InfraPolicy, offline: bool = True,
                   timeout: float = 5.0) -> list[Finding]:
    """The worker pulls by digest with its own Docker config: credentials for each registry the policy names,
    in a file no one else can read. Without credentials the registry is asked (not ``--offline``): one that
    answers ``/v2/`` anonymously needs none (OK), one that asks for a password (HTTP 401, Basic) is MISSING,
    a token service (Bearer: public packages get anonymous tokens) stays UNKNOWN, no answer is MISSING."""
    account = _account(prefix, user) if _under(prefix, "/etc/passwd").is_file() else None
    registries = sorted({image.registry for source in policy.sources
                         for image in (*source.images.runner, *source.images.api)})
    config = DOCKER_CONFIG
    path = _under(prefix, config)
    auths: dict[str, object] = {}
    out = []
    if path.is_file():
        st = path.stat()
        if account is not None and (st.st_uid != account[0] or stat.S_IMODE(st.st_mode) & 0o077):
            out.append(missing("host", "registry credentials file", f"{config} (owner {st.st_uid}, mode "
                               f"{stat.S_IMODE(st.st_mode):04o}) is readable by others than {user}",
                               f"chown {user} {config} && chmod 0600 {config}"))
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError) as exc:
            return [*out, missing("host", "registry credentials file", f"{config}: not JSON ({exc})",
                                  f"log in again as {user} (docs/host.md step 3.2)")]
        if isinstance(data, dict):
            for key in ("auths", "credHelpers"):
                if isinstance(data.get(key), dict):
                    auths.update(data[key])
            store = data.get("credsStore")
            if isinstance(store, str) and store:
                auths.update(dict.fromkeys(registries, store))
    for registry in registries:
        check = f"registry credentials for {registry}"
        login = f"`sudo -u {user} -g docker -H docker login {registry} --password-stdin` (docs/host.md step 3.2)"
        if registry in auths:
            out.append(ok("host", check, config))
            continue
        status, scheme = (None, "offline") if offline else _registry_answer(registry, timeout)
        if status is None and scheme != "offline":
            out.append(missing("host", check, f"{registry} does not answer ({scheme})",
                               f"allow the host to reach {registry} (the worker pulls every image from it)"))
        elif status == 200:
            out.append(ok("host", check, f"none needed: {registry}/v2/ answers anonymously"))
        elif status == 401 and scheme == "basic":
            out.append(missing("host", check, f"{registry} asks for a password (HTTP 401) and {config} has none",
                               login))
        else:
            out.append(unknown("host", check, f"none in {config}: fine when the packages are public",
                               f"for private packages: {login}"))
    return out


# A polling worker records a heartbeat at every claim attempt (every 2 s idle; at least every lease/3 while it
# runs trials): one older than this means no worker is running against this queue.
WORKER_SILENT_SECONDS = 300.0


def _worker_heartbeat(prefix: Path, now: float | None = None) -> Finding:
    """A worker is running: the queue's newest worker heartbeat is recent (what the worker itself writes, so it
    holds under --prefix and without systemd)."""
    check = "worker polling the queue"
    fix = ("systemctl enable --now benchseal-sandbox benchseal-worker; `journalctl -u benchseal-worker` says why it "
           "stopped")
    if _under(prefix, QUEUE_URL_FILE).is_file():
        return unknown("host", check, "PostgreSQL queue: `benchseal infra status` lists the workers' heartbeats")
    db = _under(prefix, QUEUE_DIR + "/queue.sqlite3")
    if not db.is_file():
        return missing("host", check, f"no worker has opened the queue ({QUEUE_DIR}/queue.sqlite3 is missing)", fix)
    # lazy: the queue package (sqlite3, the schema) costs ~40 ms at every CLI start; only doctor host reads it
    from pipeline.infra.queue.reader import open_reader

    try:
        with open_reader(db) as queue:
            workers = queue.stats().workers
    except Error as exc:
        return missing("host", check, exc.diagnostics(), fix)
    if not workers:
        return missing("host", check, "no worker has ever polled the queue", fix)
    newest = max(workers, key=lambda w: w.last_seen)
    clock = time.time() if now is None else now
    age = clock - newest.last_seen.timestamp()
    if age > WORKER_SILENT_SECONDS:
        return missing("host", check, f"the newest heartbeat ({newest.worker}) is {age:.0f} s old", fix)
    # A worker that polls but claims nothing says why beside its heartbeat (its installed policy does not load).
    stuck = [w for w in workers if w.problem and clock - w.last_seen.timestamp() <= WORKER_SILENT_SECONDS]
    if stuck:
        return missing("host", check, f"{stuck[0].worker} claims nothing: {stuck[0].problem}",
                       f"{_INSTALL_INFRA}; the worker loads {POLICY_FILE} at its next claim, no restart")
    return ok("host", check, f"{newest.worker}, {max(age, 0):.0f} s ago")


def _sigstore(url: str, timeout: float, offline: bool) -> Finding:
    check = "Sigstore reachable"
    if offline:
        return Finding(side="host", check=check, status="skipped", detail="--offline")
    # lazy: urllib.request (http.client, ssl) costs ~20 ms at every CLI start (python -X importtime, 2026-12-07)
    import urllib.error
    import urllib.request

    try:
        with urllib.request.urlopen(url, timeout=timeout):  # noqa: S310 - an http(s) URL the operator names
            pass
    except urllib.error.HTTPError:
        pass  # it answered: reachable
    except (urllib.error.URLError, OSError) as exc:
        reason = getattr(exc, "reason", exc)
        return missing("host", check, f"{url}: {reason}",
                       "allow the host HTTPS to Sigstore (the worker checks every image's signature there)")
    return ok("host", check, url)


def check_host(options: HostOptions) -> list[Finding]:
    place = host_place(options.prefix, options.suites_dir)
    found, policy = policy_findings(place, options.source)
    if policy is not None:
        found += suites_findings(place, policy)
        found += _registry_auth(options.prefix, options.service_user, policy, options.offline, options.timeout)
    found += _units(options.prefix)
    found.append(_queue(options.prefix, options.service_user))
    found.append(_worker_heartbeat(options.prefix, options.now))
    found.append(_sigstore(options.sigstore_url, options.timeout, options.offline))
    return found
