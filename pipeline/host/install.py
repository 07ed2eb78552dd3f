"""``benchseal host install``: set up an infra host from deploy/, idempotently.

What it does, under ``prefix`` (``/`` on a real host; another root filesystem for a
chroot or an image being prepared):

* the service user and group (``useradd --system``, no login shell, home
  ``/var/lib/benchseal``), unless they exist;
* ``/var/lib/benchseal`` (service:service 0750) and ``/etc/benchseal`` (root:service 0750);
* the managed files: the wrappers in ``/usr/local/libexec`` (root 0755), the systemd units
  (root 0644, ``User=``/``Group=`` set to the service user), the sudo rule
  ``/etc/sudoers.d/benchseal`` (root 0440, rendered with the runner user and checked with
  ``visudo -cf`` before it is moved into place) and the policy ``/etc/benchseal/infra.yaml``
  (root:service 0640, first copied from the shipped ``policies/infra.yaml``);
* with ``--infra-checkout DIR`` (a checkout of the infra repository, the policy's one home): its
  ``policies/infra.yaml`` as ``/etc/benchseal/infra.yaml`` (replacing whatever is there: the host never
  keeps an edit of its own, and accept refuses a policy that is not the dispatching commit's) and each
  ``suites/<name>`` as ``/opt/benchseal/suites/<name>``, where the worker reads suites (root 0755/0644);
* the credential files ``/etc/benchseal/{worker,publisher}.env`` (root 0600): created empty
  with comments, never rewritten; only their mode and owner are enforced;
* with ``--api-image REF@sha256:...``: ``benchseal-api.service`` naming that image by digest
  (``Environment=BENCHSEAL_API_IMAGE=``), which checks the image like a runner, pulls it by digest
  and runs it read-only on 127.0.0.1 over the queue read-only (``pipeline.host.api``); without it
  the unit is not installed (one that is stays as it is).

Managed files follow the conffile rule of Debian packages: the sha256 of what was
installed is recorded in ``/etc/benchseal/installed.json``. A file that still has the
recorded content is updated to the new version; a file the operator changed (or one that
was there before benchseal) is kept, and the new version is written beside it as
``NAME.benchseal-new`` (a name neither sudo nor systemd reads) and reported. Every write is
a temp file in the target directory, fsync, then ``os.replace``. A second run with the same
inputs changes nothing.

Only the standard library is used, so this runs with a bare ``python3`` inside a chroot.
Exit codes (through pipeline.core.errors): 2 bad input, 1 a failed check.
"""

from __future__ import annotations

import dataclasses
import fcntl
import hashlib
import json
import os
import re
import shutil
import stat
import subprocess
import tempfile
from pathlib import Path, PurePosixPath

from pipeline.core.digests import parse_ref
from pipeline.core.errors import CheckFailed, ValidationError
from pipeline.core.paths import REPO_ROOT
from pipeline.infra.sandbox import engine as sandbox

DEPLOY_DIR = REPO_ROOT / "deploy"
SHIPPED_POLICY = REPO_ROOT / "policies" / "infra.yaml"

STATE_DIR = "/var/lib/benchseal"
CONFIG_DIR = "/etc/benchseal"
LIBEXEC_DIR = "/usr/local/libexec"
UNIT_DIR = "/etc/systemd/system"
SUDOERS_DIR = "/etc/sudoers.d"
SUDOERS_FILE = "/etc/sudoers.d/benchseal"
POLICY_FILE = "/etc/benchseal/infra.yaml"
MANIFEST_FILE = "/etc/benchseal/installed.json"
APP_DIR = "/opt/benchseal"
APP_ENTRY = "/opt/benchseal/.venv/bin/benchseal"
# Where the shipped worker unit reads suites (it runs in APP_DIR with no --suites-dir).
SUITES_DIR = APP_DIR + "/suites"
INFRA_POLICY = "policies/infra.yaml"  # in an infra repository's checkout
WRAPPERS = ("benchseal-accept", "benchseal-status", "benchseal-export", "benchseal-record")
# The label the reusable benchmark.yml's jobs ask for (`runs-on: [self-hosted, benchseal-infra]`).
RUNNER_LABEL = "benchseal-infra"
# Each unit with the lines that name the service user (``KEY=benchseal``, rendered with --service-user).
UNITS = {
    "benchseal-sandbox.service": ("Environment=BENCHSEAL_SANDBOX_CONTROLLER",),
    "benchseal-worker.service": ("User", "Group"),
    "benchseal-publisher.service": ("User", "Group"),
}
# The API's unit (installed with --api-image) and the line that names its image by digest.
API_UNIT = "benchseal-api.service"
API_IMAGE_LINE = "Environment=BENCHSEAL_API_IMAGE="
API_ENV_FILE = "/etc/benchseal/api.env"
API_URL_FILE = "/etc/benchseal/api-queue-url"
API_ROLE = "benchseal_api"
# The worker's TMPDIR (deploy/benchseal-worker.service): inside the state dir, which the sandbox sees.
TMP_DIR = "/var/lib/benchseal/tmp"
NEW_SUFFIX = ".benchseal-new"
NOLOGIN = "/usr/sbin/nologin"

# Portable user names (POSIX portable filename characters, as Debian's useradd accepts by
# default): lowercase, no leading digit or hyphen, at most 32 characters. Nothing that
# sudoers treats specially (%, +, !, :, =, comma, blanks, quotes) can get through.
_USER_NAME = re.compile(r"^[a-z_][a-z0-9_-]{0,31}\Z")

# Lines of deploy/benchseal.sudoers that name the runner and service users (as shipped).
_SHIPPED_RUNNER = "github-runner"
_SHIPPED_SERVICE = "benchseal"

_ENV_TEMPLATES = {
    "worker.env": (
        "# benchseal-worker.service reads this file (EnvironmentFile=) as root before it drops to the\n"
        "# service user. Agent API keys, one KEY=value a line, e.g. BENCHSEAL_AGENT_API_KEY=...\n"
        "# Keep it root-owned, mode 0600. Never put a secret on a command line or in a unit.\n"
    ),
    "publisher.env": (
        "# benchseal-publisher.service reads this file (EnvironmentFile=) as root before it drops to the\n"
        "# service user. GITHUB_TOKEN=... (fine-grained, contents: write on the source repositories);\n"
        "# on GitHub Enterprise also GITHUB_API_URL=https://HOST/api/v3\n"
        "# Keep it root-owned, mode 0600. Never put a secret on a command line or in a unit.\n"
    ),
}


@dataclasses.dataclass(frozen=True)
class InstallOptions:
    runner_user: str
    service_user: str = "benchseal"
    prefix: Path = Path("/")
    dry_run: bool = False
    # The API image by digest (REGISTRY/REPOSITORY@sha256:<64 hex>): installs benchseal-api.service.
    api_image: str | None = None
    # A checkout of the infra repository: its policy and suites are installed (the policy's one home).
    infra_checkout: Path | None = None


@dataclasses.dataclass(frozen=True)
class Action:
    """One thing the install did (or, with --dry-run, would do) to one path."""

    path: str
    action: str  # created | updated | unchanged | kept | fixed | ...
    detail: str = ""


@dataclasses.dataclass(frozen=True)
class InstallReport:
    dry_run: bool
    actions: tuple[Action, ...]
    warnings: tuple[str, ...]
    manual_steps: tuple[str, ...]

    @property
    def changed(self) -> bool:
        return any(a.action not in ("unchanged", "exists", "kept") for a in self.actions)

    def to_json_dict(self) -> dict[str, object]:
        return {
            "dry_run": self.dry_run,
            "changed": self.changed,
            "actions": [dataclasses.asdict(a) for a in self.actions],
            "warnings": list(self.warnings),
            "manual_steps": list(self.manual_steps),
        }


def validate_user_name(field: str, value: str) -> str:
    if not _USER_NAME.match(value):
        raise ValidationError(field, "must be a portable user name: a lowercase letter or _, then up to 31 of "
                              "a-z 0-9 _ -", value)
    if value == "root":
        raise ValidationError(field, "must not be root", value)
    return value


@dataclasses.dataclass(frozen=True)
class _Account:
    name: str
    uid: int
    gid: int


def _read_colon_db(path: Path) -> dict[str, list[str]]:
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except FileNotFoundError:
        return {}
    except OSError as exc:
        raise CheckFailed(f"cannot read {path}: {exc.strerror}") from None
    entries: dict[str, list[str]] = {}
    for line in lines:
        fields = line.split(":")
        if len(fields) >= 4 and fields[0] and not line.startswith(("#", "+", "-")):
            entries.setdefault(fields[0], fields)
    return entries


class _Host:
    """The account databases and files under one prefix."""

    def __init__(self, prefix: Path) -> None:
        self.prefix = prefix

    def path(self, absolute: str) -> Path:
        return self.prefix / PurePosixPath(absolute).relative_to("/")

    def user(self, name: str) -> _Account | None:
        fields = _read_colon_db(self.path("/etc/passwd")).get(name)
        if fields is None or len(fields) < 7:
            return None
        return _Account(name=name, uid=int(fields[2]), gid=int(fields[3]))

    def group_gid(self, name: str) -> int | None:
        fields = _read_colon_db(self.path("/etc/group")).get(name)
        return None if fields is None else int(fields[2])

    def group_members(self, name: str) -> set[str]:
        fields = _read_colon_db(self.path("/etc/group")).get(name)
        return set() if fields is None else {m for m in fields[3].split(",") if m}


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def render_sudoers(text: str, runner_user: str, service_user: str) -> str:
    """deploy/benchseal.sudoers with the runner and service users put in; fails if the shipped
    file no longer has exactly one rule per wrapper in the expected shape."""
    shipped = f"{_SHIPPED_RUNNER} ALL=({_SHIPPED_SERVICE}) NOPASSWD: "
    out: list[str] = [f"# Rendered by `benchseal host install` for runner user {runner_user}, "
                      f"service user {service_user}."]
    rules = 0
    for line in text.splitlines():
        if line.startswith("#"):
            out.append(line.replace(f"(user {_SHIPPED_RUNNER})", f"(user {runner_user})"))
            continue
        if line.startswith(shipped):
            rules += 1
            line = f"{runner_user} ALL=({service_user}) NOPASSWD: " + line[len(shipped):]
        elif line.strip() and not line.startswith("Defaults!"):
            raise CheckFailed(f"deploy/benchseal.sudoers: unexpected line {line!r}: the installer renders only "
                              f"Defaults! lines and the {len(WRAPPERS)} runner rules")
        out.append(line)
    if rules != len(WRAPPERS):
        raise CheckFailed(f"deploy/benchseal.sudoers: expected {len(WRAPPERS)} rules for {_SHIPPED_RUNNER}, "
                          f"found {rules}")
    return "\n".join(out) + "\n"


def render_unit(text: str, service_user: str, keys: tuple[str, ...] = ("User", "Group")) -> str:
    """A deploy/ unit with each ``KEY=benchseal`` line of ``keys`` set to the service user (each must
    appear exactly once)."""
    lines = text.splitlines()
    for key in keys:
        hits = [i for i, line in enumerate(lines) if line == f"{key}={_SHIPPED_SERVICE}"]
        if len(hits) != 1:
            raise CheckFailed(f"deploy unit: expected exactly one {key}={_SHIPPED_SERVICE} line, found {len(hits)}")
        lines[hits[0]] = f"{key}={service_user}"
    return "\n".join(lines) + "\n"


def render_api_unit(text: str, service_user: str, image: str) -> str:
    """deploy/benchseal-api.service for ``service_user``, naming the API ``image`` (checked: by digest)."""
    ref = parse_ref(image, "--api-image").ref
    lines = render_unit(text, service_user).splitlines()
    hits = [i for i, line in enumerate(lines) if line == API_IMAGE_LINE]
    if len(hits) != 1:
        raise CheckFailed(f"deploy/{API_UNIT}: expected exactly one {API_IMAGE_LINE} line, found {len(hits)}")
    lines[hits[0]] = API_IMAGE_LINE + ref
    return "\n".join(lines) + "\n"


def _read_source(path: Path) -> bytes:
    try:
        return path.read_bytes()
    except OSError as exc:
        raise CheckFailed(f"cannot read {path} ({exc.strerror}): run the installer from a benchseal checkout "
                          "that has deploy/ and policies/") from None


def check_visudo(data: bytes) -> None:
    """``visudo -cf`` on ``data`` in a private temp file; CheckFailed when it does not pass."""
    with tempfile.TemporaryDirectory(prefix="benchseal-sudoers.") as tmp:
        candidate = Path(tmp) / "benchseal"
        candidate.write_bytes(data)
        candidate.chmod(0o440)
        _run_visudo(candidate)


def _run_visudo(path: Path) -> None:
    visudo = shutil.which("visudo") or next(
        (p for p in ("/usr/sbin/visudo", "/sbin/visudo") if os.access(p, os.X_OK)), None)
    if visudo is None:
        raise CheckFailed("visudo not found: install the sudo package; the sudo rule is never installed unchecked")
    done = subprocess.run([visudo, "-cf", str(path)], capture_output=True, text=True, check=False, timeout=60)
    if done.returncode != 0:
        raise CheckFailed(f"visudo -cf rejected the rendered sudo rule: {(done.stdout + done.stderr).strip()}")


@dataclasses.dataclass(frozen=True)
class _Managed:
    dest: str
    data: bytes
    mode: int
    uid: int
    gid: int
    sudoers: bool = False
    authoritative: str = ""  # where the content comes from when it replaces an operator's edit (never kept)


class _Installer:
    def __init__(self, options: InstallOptions) -> None:
        self.o = options
        self.host = _Host(options.prefix)
        self.actions: list[Action] = []
        self.warnings: list[str] = []
        self.manual: list[str] = []

    # -- helpers -------------------------------------------------------------------------
    def _act(self, path: str, action: str, detail: str = "") -> None:
        self.actions.append(Action(path=path, action=action, detail=detail))

    def _would(self, verb: str) -> str:
        present = {"created": "create", "updated": "update", "fixed": "fix", "removed": "remove"}[verb]
        return f"would {present}" if self.o.dry_run else verb

    def _fix_meta(self, dest: str, mode: int, uid: int, gid: int) -> None:
        target = self.host.path(dest)
        st = target.lstat()
        if stat.S_ISLNK(st.st_mode):
            raise CheckFailed(f"{dest} is a symbolic link: refusing to install through it")
        wrong = []
        if stat.S_IMODE(st.st_mode) != mode:
            wrong.append(f"mode {stat.S_IMODE(st.st_mode):04o} -> {mode:04o}")
        if uid >= 0 and gid >= 0 and (st.st_uid, st.st_gid) != (uid, gid):
            wrong.append(f"owner {st.st_uid}:{st.st_gid} -> {uid}:{gid}")
        if wrong:
            if not self.o.dry_run:
                os.chown(target, uid, gid, follow_symlinks=False)
                os.chmod(target, mode)
            self._act(dest, self._would("fixed"), "; ".join(wrong))

    def _ensure_dir(self, dest: str, mode: int, uid: int, gid: int, *, enforce: bool) -> None:
        target = self.host.path(dest)
        if target.is_symlink():
            raise CheckFailed(f"{dest} is a symbolic link: refusing to install through it")
        if not target.exists():
            if not self.o.dry_run:
                target.mkdir(parents=True, exist_ok=True)
                os.chown(target, uid, gid)
                os.chmod(target, mode)
            self._act(dest, self._would("created"), f"directory {mode:04o}")
            return
        if not target.is_dir():
            raise CheckFailed(f"{dest} exists and is not a directory")
        if enforce:
            self._fix_meta(dest, mode, uid, gid)
        else:
            self._act(dest, "exists")

    def _write_atomic(self, dest: str, data: bytes, mode: int, uid: int, gid: int, *, sudoers: bool = False) -> None:
        target = self.host.path(dest)
        # A dot in the name: sudo's includedir and systemd skip the temp file if it is ever left behind.
        fd, tmp_name = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
        tmp = Path(tmp_name)
        try:
            with os.fdopen(fd, "wb") as handle:
                handle.write(data)
                handle.flush()
                os.fchown(handle.fileno(), uid, gid)
                os.fchmod(handle.fileno(), mode)
                os.fsync(handle.fileno())
            if sudoers:
                _run_visudo(tmp)
            os.replace(tmp, target)
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise
        dir_fd = os.open(target.parent, os.O_RDONLY)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)

    # -- steps ---------------------------------------------------------------------------
    def check_prefix(self) -> None:
        prefix = self.o.prefix
        if not prefix.is_absolute():
            raise ValidationError("--prefix", "must be an absolute path", str(prefix))
        if not prefix.is_dir():
            raise ValidationError("--prefix", "must be an existing directory", str(prefix))
        if not self.host.path("/etc/passwd").is_file() or not self.host.path("/etc/group").is_file():
            raise CheckFailed(f"{prefix} has no etc/passwd and etc/group: --prefix must be a root filesystem")
        if os.geteuid() != 0:
            raise CheckFailed("host install must run as root, --dry-run included (it creates users and root-owned "
                              "files, and compares files only root may read, such as /etc/sudoers.d/benchseal)")

    def check_app_dir(self) -> None:
        """The code the service user runs must not be writable by anyone but root: otherwise the
        runner user (or anyone) could change what runs as benchseal, and through Docker as root."""
        for absolute in ("/opt", APP_DIR, f"{APP_DIR}/.venv", f"{APP_DIR}/.venv/bin", APP_ENTRY, "/usr",
                         "/usr/local", LIBEXEC_DIR):
            path = self.host.path(absolute)
            try:
                st = path.stat()
            except FileNotFoundError:
                continue
            if st.st_uid != 0 or st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
                raise CheckFailed(f"{absolute} is writable by someone other than root (owner uid {st.st_uid}, "
                                  f"mode {stat.S_IMODE(st.st_mode):04o}): the code that runs as the service user "
                                  "must be root-owned and not group/world-writable")
        unsafe = _unsafe_paths(self.host.path(APP_DIR))
        if unsafe:
            shown = ", ".join(f"{APP_DIR}/{rel}" for rel in unsafe[:5])
            more = f" and {len(unsafe) - 5} more" if len(unsafe) > 5 else ""
            raise CheckFailed(f"files under {APP_DIR} are not root-owned or are group/world-writable: {shown}{more}; "
                              f"fix with `chown -R root:root {APP_DIR} && chmod -R go-w {APP_DIR}`")
        if not self.host.path(APP_ENTRY).is_file():
            self.manual.append(f"Install benchseal at {APP_DIR} (root-owned): `git clone ... {APP_DIR} && cd "
                               f"{APP_DIR} && make setup`, so that {APP_ENTRY} exists; the units and wrappers "
                               "run it.")

    def ensure_accounts(self) -> _Account | None:
        service = self.o.service_user
        gid = self.host.group_gid(service)
        user = self.host.user(service)
        prefix_args = [] if self.o.prefix == Path("/") else ["--prefix", str(self.o.prefix)]
        if gid is None:
            if user is not None:
                raise CheckFailed(f"user {service} exists but group {service} does not: the units run as "
                                  f"{service}:{service}; fix the account by hand")
            if not self.o.dry_run:
                _run_tool(["groupadd", "--system", *prefix_args, service])
                gid = self.host.group_gid(service)
            self._act(f"group {service}", self._would("created"), "groupadd --system")
        else:
            self._act(f"group {service}", "exists", f"gid {gid}")
        if user is None:
            if not self.o.dry_run:
                _run_tool(["useradd", "--system", *prefix_args, "--gid", service, "--home-dir", STATE_DIR,
                           "--no-create-home", "--shell", NOLOGIN, "--comment", "benchseal infra worker", service])
                user = self.host.user(service)
                if user is None:
                    raise CheckFailed(f"useradd reported success but {service} is not in etc/passwd")
            self._act(f"user {service}", self._would("created"), f"useradd --system, home {STATE_DIR}, no login")
        else:
            if gid is not None and user.gid != gid:
                raise CheckFailed(f"user {service} exists with primary gid {user.gid}, not group {service} ({gid}): "
                                  "fix the account by hand")
            if user.uid == 0:
                raise CheckFailed(f"user {service} has uid 0: the service user must not be root")
            self._act(f"user {service}", "exists", f"uid {user.uid}")
        return user

    def ensure_sandbox_account(self) -> None:
        """The rootless sandbox engine's service user (pipeline/infra/sandbox/engine.py) with its subordinate
        uid and gid ranges, so ``benchseal sandbox start`` finds them; in --prefix roots too."""
        name = sandbox.SERVICE_USER
        prefix_args = [] if self.o.prefix == Path("/") else ["--prefix", str(self.o.prefix)]
        account = self.host.user(name)
        if account is None:
            if not self.o.dry_run:
                _run_tool(["useradd", "--system", *prefix_args, "--user-group", "--home-dir", "/nonexistent",
                           "--no-create-home", "--shell", NOLOGIN, "--comment", "benchseal sandbox engine", name])
            self._act(f"user {name}", self._would("created"), "useradd --system, no login (rootless sandbox engine)")
        else:
            if account.uid == 0:
                raise CheckFailed(f"user {name} has uid 0: the sandbox engine's user must not be root")
            self._act(f"user {name}", "exists", f"uid {account.uid}")
        files = [self.host.path("/etc/subuid"), self.host.path("/etc/subgid")]
        start = sandbox.subid_start(files, name)
        if start is None:
            self._act("/etc/subuid, /etc/subgid", "unchanged", f"{name} has ranges")
            return
        if not self.o.dry_run:
            for path in files:
                sandbox.append_line(path, f"{name}:{start}:{sandbox.SUBID_COUNT}")
        self._act("/etc/subuid, /etc/subgid", self._would("updated"), f"{name}:{start}:{sandbox.SUBID_COUNT}")

    def check_runner(self) -> None:
        runner, service = self.o.runner_user, self.o.service_user
        account = self.host.user(runner)
        if account is not None and account.uid == 0:
            raise CheckFailed(f"runner user {runner} has uid 0: the Actions runner must not run as root")
        if account is None:
            self.manual.append(f"Create the runner user {runner} (`useradd --create-home {runner}`) before "
                               "registering the Actions runner as that user (the sudo rule already names it).")
        if self.host.group_gid("docker") is None:
            self.manual.append("Install the Docker Engine (group docker): benchseal-worker.service runs with "
                               "SupplementaryGroups=docker.")
        for group in ("docker", service, "sudo"):
            in_primary = account is not None and account.gid == self.host.group_gid(group)
            if in_primary or runner in self.host.group_members(group):
                self.warnings.append(f"runner user {runner} is a member of group {group}: it then reaches more "
                                     "than the three wrappers; remove it (`gpasswd -d "
                                     f"{runner} {group}`)")

    def install_dirs(self, user: _Account | None) -> None:
        uid, gid = (user.uid, user.gid) if user else (-1, -1)
        self._ensure_dir(STATE_DIR, 0o750, uid, gid, enforce=user is not None)
        self._ensure_dir(TMP_DIR, 0o750, uid, gid, enforce=user is not None)
        self._ensure_dir(CONFIG_DIR, 0o750, 0, gid, enforce=user is not None)
        for parent in (LIBEXEC_DIR, UNIT_DIR):
            self._ensure_dir(parent, 0o755, 0, 0, enforce=False)
        self._ensure_dir(SUDOERS_DIR, 0o755, 0, 0, enforce=False)
        sudoers = self.host.path("/etc/sudoers")
        if not sudoers.is_file():
            self.manual.append("Install sudo (package sudo): the rule in /etc/sudoers.d/benchseal needs it.")
        elif not re.search(r"^[@#]includedir\s+/etc/sudoers\.d\s*$", sudoers.read_text(errors="replace"), re.M):
            self.warnings.append("/etc/sudoers has no `@includedir /etc/sudoers.d` line: sudo will not read the "
                                 "benchseal rule until you add it (with visudo)")

    def managed_files(self, gid: int) -> list[_Managed]:
        files: list[_Managed] = []
        for name in WRAPPERS:
            files.append(_Managed(f"{LIBEXEC_DIR}/{name}", _read_source(DEPLOY_DIR / name), 0o755, 0, 0))
        for name, keys in UNITS.items():
            text = _read_source(DEPLOY_DIR / name).decode("utf-8")
            files.append(_Managed(f"{UNIT_DIR}/{name}", render_unit(text, self.o.service_user, keys).encode(),
                                  0o644, 0, 0))
        if self.o.api_image is not None:
            text = _read_source(DEPLOY_DIR / API_UNIT).decode("utf-8")
            files.append(_Managed(f"{UNIT_DIR}/{API_UNIT}",
                                  render_api_unit(text, self.o.service_user, self.o.api_image).encode(), 0o644, 0, 0))
        sudoers = render_sudoers(_read_source(DEPLOY_DIR / "benchseal.sudoers").decode("utf-8"),
                                 self.o.runner_user, self.o.service_user).encode()
        check_visudo(sudoers)  # also in --dry-run: a rule that would not pass is reported now
        if self.o.infra_checkout is None:
            files.append(_Managed(POLICY_FILE, _read_source(SHIPPED_POLICY), 0o640, 0, gid))
        else:
            source = self.o.infra_checkout / INFRA_POLICY
            files.append(_Managed(POLICY_FILE, _read_source(source), 0o640, 0, gid,
                                  authoritative=f"{source} (sha256:{_sha256(_read_source(source))})"))
        # Last: the rule that opens the door comes after everything behind the door is in place.
        files.append(_Managed(SUDOERS_FILE, sudoers, 0o440, 0, 0, sudoers=True))
        return files

    def install_files(self, files: list[_Managed]) -> None:
        manifest_path = self.host.path(MANIFEST_FILE)
        try:
            recorded: dict[str, str] = json.loads(manifest_path.read_text()).get("files", {})
        except FileNotFoundError:
            recorded = {}
        except (OSError, ValueError, AttributeError) as exc:
            raise CheckFailed(f"{MANIFEST_FILE} is unreadable ({exc}): move it away to start over") from None
        manifest = dict(recorded)
        for item in files:
            target = self.host.path(item.dest)
            new_hash = _sha256(item.data)
            if target.is_symlink() or (target.exists() and not target.is_file()):
                raise CheckFailed(f"{item.dest} exists and is not a regular file: refusing to replace it")
            if not target.exists():
                if not self.o.dry_run:
                    self._write_atomic(item.dest, item.data, item.mode, item.uid, item.gid, sudoers=item.sudoers)
                self._act(item.dest, self._would("created"), f"{item.mode:04o}")
                manifest[item.dest] = new_hash
                continue
            current_hash = _sha256(target.read_bytes())
            if current_hash == new_hash:
                self._fix_meta(item.dest, item.mode, item.uid, item.gid)
                if not any(a.path == item.dest for a in self.actions):
                    self._act(item.dest, "unchanged")
                manifest[item.dest] = new_hash
                self._stale_new(item.dest)
            elif recorded.get(item.dest) == current_hash or item.authoritative:
                if not self.o.dry_run:
                    self._write_atomic(item.dest, item.data, item.mode, item.uid, item.gid, sudoers=item.sudoers)
                self._act(item.dest, self._would("updated"), f"from {item.authoritative}" if item.authoritative
                          else "was as installed; now the new version")
                manifest[item.dest] = new_hash
                self._stale_new(item.dest)
            else:
                # The operator's file: keep it, say so, and put the new version beside it.
                self._fix_meta(item.dest, item.mode, item.uid, item.gid)
                side = item.dest + NEW_SUFFIX
                side_path = self.host.path(side)
                if side_path.is_file() and _sha256(side_path.read_bytes()) == new_hash:
                    pass
                elif not self.o.dry_run:
                    self._write_atomic(side, item.data, 0o600, 0, 0)
                self._act(item.dest, "kept", f"changed by the operator; the shipped version is in {side}")
                self.warnings.append(f"kept your {item.dest} (it differs from what benchseal installed); compare "
                                     f"it with {side} and merge by hand")
        if manifest != recorded:
            data = (json.dumps({"schema": "benchseal.host-install/v1", "files": manifest}, indent=2,
                               sort_keys=True) + "\n").encode()
            if not self.o.dry_run:
                self._write_atomic(MANIFEST_FILE, data, 0o644, 0, 0)
            self._act(MANIFEST_FILE, self._would("updated" if recorded else "created"), "sha256 of installed files")

    def install_suites(self) -> None:
        """Each ``suites/<name>`` of the infra checkout as ``/opt/benchseal/suites/<name>``, replaced only when its
        files differ (a second run changes nothing). The policy pins each dataset by digest: the worker refuses a
        suite that is not those bytes, so a copy here is checked, never trusted."""
        if self.o.infra_checkout is None:
            return
        top = self.o.infra_checkout / "suites"
        if not top.is_dir() or top.is_symlink():
            raise CheckFailed(f"--infra-checkout: {top} is not a directory (the infra repository's suites)")
        self._ensure_dir(SUITES_DIR, 0o755, 0, 0, enforce=False)
        for suite in sorted(top.iterdir()):
            if suite.name.startswith("."):
                continue
            if suite.is_symlink() or not suite.is_dir():
                raise CheckFailed(f"--infra-checkout: {suite} is not a directory (each suite is one)")
            dest = f"{SUITES_DIR}/{suite.name}"
            target = self.host.path(dest)
            if target.is_symlink() or (target.exists() and not target.is_dir()):
                raise CheckFailed(f"{dest} exists and is not a directory: refusing to replace it")
            wanted = _tree(suite)
            existed = target.exists()
            if existed and _tree(target) == wanted:
                self._act(dest, "unchanged")
                continue
            if not self.o.dry_run:
                staged = Path(tempfile.mkdtemp(prefix=f".{suite.name}.", dir=target.parent))
                try:
                    for relative, entry in wanted.items():
                        path = staged / relative
                        if entry is None:
                            path.mkdir()
                            path.chmod(0o755)
                        else:
                            path.write_bytes((suite / relative).read_bytes())
                            path.chmod(0o755 if entry[0] else 0o644)
                    staged.chmod(0o755)
                    if target.exists():
                        shutil.rmtree(target)
                    os.replace(staged, target)
                except BaseException:
                    shutil.rmtree(staged, ignore_errors=True)
                    raise
            self._act(dest, self._would("updated" if existed else "created"), f"from {suite}")

    def _stale_new(self, dest: str) -> None:
        side = self.host.path(dest + NEW_SUFFIX)
        if side.is_file():
            if not self.o.dry_run:
                side.unlink()
            self._act(dest + NEW_SUFFIX, self._would("removed"), "superseded")

    def install_env_files(self, user: _Account | None) -> None:
        for name, template in _ENV_TEMPLATES.items():
            dest = f"{CONFIG_DIR}/{name}"
            target = self.host.path(dest)
            if target.is_symlink() or (target.exists() and not target.is_file()):
                raise CheckFailed(f"{dest} exists and is not a regular file")
            if not target.exists():
                if not self.o.dry_run:
                    self._write_atomic(dest, template.encode(), 0o600, 0, 0)
                self._act(dest, self._would("created"), "0600, comments only: put the credentials in by hand")
            else:
                self._fix_meta(dest, 0o600, 0, 0)
                if not any(a.path == dest for a in self.actions):
                    self._act(dest, "unchanged", "content is yours; never rewritten")
        del user

    def finish_manual_steps(self) -> None:
        runner, service = self.o.runner_user, self.o.service_user
        self.manual.extend([
            f"Register the self-hosted Actions runner on the infra repository as user {runner}, with the label "
            f"{RUNNER_LABEL} (benchmark.yml's jobs run only there; without it a dispatch times out): download the "
            f"runner into its home, then as {runner}: `./config.sh --url https://github.com/OWNER/INFRA --labels "
            f"{RUNNER_LABEL}` (the registration token is asked for interactively; do not pass it with --token in a "
            f"shared shell history), then as root `./svc.sh install {runner} && ./svc.sh start`.",
            f"Credentials, as root, in files only (never in argv or a unit): edit {CONFIG_DIR}/publisher.env "
            f"(GITHUB_TOKEN=..., GITHUB_API_URL on GitHub Enterprise) and {CONFIG_DIR}/worker.env "
            f"(BENCHSEAL_AGENT_API_KEY=...); keep them root:root 0600. Registry credentials for the worker's "
            f"pull: `sudo -u {service} -g docker -H docker login REGISTRY --username USER --password-stdin` "
            f"(writes {STATE_DIR}/.docker/config.json).",
            self._policy_step(),
            f"Install the sandbox engine's apt packages ({' '.join(sandbox.PACKAGES)}): benchseal-sandbox.service "
            f"runs a rootless dockerd as {sandbox.SERVICE_USER} that the runner and every trial container run on, "
            f"sharing {STATE_DIR} (the worker's TMPDIR is {TMP_DIR}) and letting {service} use its socket; the "
            "worker refuses to run without it.",
            "Start the services: `systemctl daemon-reload && systemctl enable --now benchseal-sandbox "
            "benchseal-worker benchseal-publisher`.",
            f"Check the sudo rule: `sudo -l -U {runner}` lists exactly {LIBEXEC_DIR}/benchseal-accept, "
            f"{LIBEXEC_DIR}/benchseal-status, {LIBEXEC_DIR}/benchseal-export and {LIBEXEC_DIR}/benchseal-record, "
            f"run as {service}.",
        ])
        self.manual.extend(self._api_steps())

    def _policy_step(self) -> str:
        if self.o.infra_checkout is not None:
            changed = any(a.path == POLICY_FILE and a.action in ("created", "updated") for a in self.actions)
            # The worker hashes the file at every claim and loads a changed one (pipeline.infra.intake.policy_home).
            reload = (" The policy changed: the running worker uses it from its next claim, without a restart (a "
                      "policy that does not load stops its claims, named in its log)." if changed else "")
            return (f"The policy {POLICY_FILE} and {SUITES_DIR} are the infra repository's ({self.o.infra_checkout}): "
                    "after each change to policies/infra.yaml or suites/ there, pull and run host install again with "
                    "--infra-checkout (until then accept refuses every run, naming both policy digests). Never edit "
                    "the host's copy." + reload)
        return (f"Install the infra repository's policy and suites (their one home; accept refuses a policy at "
                f"{POLICY_FILE} that is not the dispatching commit's): clone the infra repository on this host and "
                "run host install again with --infra-checkout DIR.")

    def _api_steps(self) -> list[str]:
        service = self.o.service_user
        if self.o.api_image is None:
            return [f"The API (run status and results pages): run host install again with --api-image "
                    "REGISTRY/REPOSITORY@sha256:<64 hex>, the api image of a release this infra scored (its "
                    f"release body lists it); that installs {UNIT_DIR}/{API_UNIT}."]
        return [
            f"With a PostgreSQL queue only (SQLite needs nothing: the API mounts its directory read-only): the API "
            f"connects as a role that may only SELECT. As the role that owns the queue's tables run `benchseal api "
            f"grant-reader {API_ROLE} --queue-url-file FILE` (`--sql` prints the GRANT statements for your "
            f"database administrator instead), give {API_ROLE} a password or certificate, put its URL (a host the "
            f"container reaches, TLS verify-full) in {API_URL_FILE} (root:{service} 0640) and "
            f"BENCHSEAL_API_QUEUE_URL_FILE={API_URL_FILE} in {API_ENV_FILE}. Never the worker's URL: the API "
            "refuses a role that may write.",
            f"Start the API: `systemctl enable --now {API_UNIT.removesuffix('.service')}`. Before each start it "
            "checks the image like a runner (a release in the queue carries it, the policy's signer signed it) and "
            "pulls it by digest; it serves http://127.0.0.1:8080/ (BENCHSEAL_API_PORT in "
            f"{API_ENV_FILE}) only: put a TLS reverse proxy in front of it for readers elsewhere.",
        ]


def _unsafe_paths(top: Path) -> list[str]:
    """Paths under ``top`` (symbolic links themselves excepted) not owned by root or writable by group/others."""
    if not top.is_dir():
        return []
    found: list[str] = []
    for dirpath, dirnames, filenames in os.walk(top):
        for name in (*dirnames, *filenames):
            path = os.path.join(dirpath, name)
            st = os.lstat(path)
            if stat.S_ISLNK(st.st_mode):
                continue
            if st.st_uid != 0 or st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
                found.append(os.path.relpath(path, top))
    return sorted(found)


def _tree(top: Path) -> dict[str, tuple[bool, str] | None]:
    """Relative path -> (executable, sha256) of each file, None for a directory; a symbolic link or anything
    else is refused (a suite is plain files, as its dataset digest covers them)."""
    found: dict[str, tuple[bool, str] | None] = {}
    for dirpath, dirnames, filenames in os.walk(top):
        dirnames.sort()
        for name in (*dirnames, *sorted(filenames)):
            path = Path(dirpath) / name
            relative = path.relative_to(top).as_posix()
            st = path.lstat()
            if stat.S_ISDIR(st.st_mode):
                found[relative] = None
            elif stat.S_ISREG(st.st_mode):
                found[relative] = (bool(st.st_mode & stat.S_IXUSR), _sha256(path.read_bytes()))
            else:
                raise CheckFailed(f"--infra-checkout: {path} is not a plain file or directory")
    return found


def _run_tool(argv: list[str]) -> None:
    done = subprocess.run(argv, capture_output=True, text=True, check=False, timeout=120)
    if done.returncode != 0:
        raise CheckFailed(f"{argv[0]} failed (exit {done.returncode}): {(done.stdout + done.stderr).strip()}")


def install(options: InstallOptions) -> InstallReport:
    """Set the host up (see the module docstring); raise UsageError/CheckFailed on bad input/failed checks."""
    validate_user_name("--runner-user", options.runner_user)
    validate_user_name("--service-user", options.service_user)
    if options.api_image is not None:
        parse_ref(options.api_image, "--api-image")
    if options.runner_user == options.service_user:
        raise ValidationError("--runner-user", "must differ from --service-user", options.runner_user)
    if options.infra_checkout is not None and not (options.infra_checkout / INFRA_POLICY).is_file():
        raise ValidationError("--infra-checkout", f"must be a checkout of the infra repository (no {INFRA_POLICY} in it)",
                              str(options.infra_checkout))
    installer = _Installer(options)
    installer.check_prefix()
    lock_fd = os.open(installer.host.path("/etc"), os.O_RDONLY | os.O_DIRECTORY)
    try:
        try:
            fcntl.flock(lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise CheckFailed("another benchseal host install is running on this root filesystem") from None
        return _install_locked(installer, options)
    finally:
        os.close(lock_fd)


def _install_locked(installer: _Installer, options: InstallOptions) -> InstallReport:
    installer.check_app_dir()
    user = installer.ensure_accounts()
    installer.ensure_sandbox_account()
    installer.check_runner()
    installer.install_dirs(user)
    gid = user.gid if user else -1
    installer.install_files(installer.managed_files(gid))
    installer.install_suites()
    installer.install_env_files(user)
    installer.finish_manual_steps()
    return InstallReport(dry_run=options.dry_run, actions=tuple(installer.actions),
                         warnings=tuple(installer.warnings), manual_steps=tuple(installer.manual))
