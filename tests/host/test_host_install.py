"""``benchseal host install``: into a --prefix root on this machine, and for real inside a Debian
container built from the project's own base image (sudo and systemd added with apt, cached as a
local image). In the container: the accounts, modes and owners, ``visudo -c``, ``sudo -l -U``, the
runner user running the wrappers through sudo (and nothing else), ``systemd-analyze verify``,
idempotence, and an operator-edited policy that is kept and then used."""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import sysconfig
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from pipeline.core.errors import CheckFailed, ValidationError
from pipeline.host import install as hi
from tests.fixtures.hostfs import root_fs

REPO = Path(__file__).resolve().parents[2]
RUNNER = "actions-ci"  # deliberately not the shipped example name (github-runner)
SHIM = '#!/bin/sh\nexport PYTHONPATH=/src:/site PYTHONDONTWRITEBYTECODE=1\nexec /usr/bin/python3 -m pipeline "$@"\n'

needs_root = pytest.mark.needs_root("host install creates users and root-owned files")


def _cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "pipeline", "host", "install", *args], cwd=REPO,
                          capture_output=True, text=True, check=False, timeout=120, env=env)


def _root_fs(tmp_path: Path) -> Path:
    return root_fs(tmp_path, RUNNER)


def _snapshot(root: Path) -> dict[str, tuple[int, int, int, int, bytes]]:
    out = {}
    for path in sorted(root.rglob("*")):
        st = path.lstat()
        out[str(path.relative_to(root))] = (st.st_mode, st.st_uid, st.st_gid, st.st_mtime_ns,
                                            path.read_bytes() if path.is_file() else b"")
    return out


# -- bad input and failed checks (exit 2 / exit 1) --------------------------------------------

@pytest.mark.parametrize("name", ["root", "GitHub", "a b", "x,y", "%sudo", "ALL", "-x", "", "9lives", "a" * 33,
                                  "ghr\n", "ghr:x", "ghr!", "ü", "ghr ALL=(ALL) ALL", "../x"])
def test_runner_user_must_be_a_portable_user_name(tmp_path: Path, name: str) -> None:
    done = _cli("--runner-user", name, "--prefix", str(_root_fs(tmp_path)))
    assert done.returncode == 2, done.stderr
    assert "invalid --runner-user" in done.stderr
    assert not (tmp_path / "root" / "etc" / "sudoers.d").exists(), "nothing may be installed on bad input"


def test_service_user_rules(tmp_path: Path) -> None:
    root = str(_root_fs(tmp_path))
    same = _cli("--runner-user", "benchseal", "--prefix", root)
    assert same.returncode == 2 and "must differ from --service-user" in same.stderr
    bad = _cli("--runner-user", RUNNER, "--service-user", "root", "--prefix", root)
    assert bad.returncode == 2 and "invalid --service-user: must not be root" in bad.stderr


def test_prefix_must_be_an_absolute_root_filesystem(tmp_path: Path) -> None:
    relative = _cli("--runner-user", RUNNER, "--prefix", "some/dir")
    assert relative.returncode == 2 and "invalid --prefix: must be an absolute path" in relative.stderr
    (tmp_path / "empty").mkdir()
    empty = _cli("--runner-user", RUNNER, "--prefix", str(tmp_path / "empty"))
    assert empty.returncode == 1 and "no etc/passwd" in empty.stderr


def test_render_sudoers_puts_in_both_users_and_refuses_a_drifted_template() -> None:
    text = (REPO / "deploy" / "benchseal.sudoers").read_text()
    rendered = hi.render_sudoers(text, "ci-runner", "bench")
    rules = [line for line in rendered.splitlines() if line and not line.startswith(("#", "Defaults"))]
    assert rules == ['ci-runner ALL=(bench) NOPASSWD: /usr/local/libexec/benchseal-accept ""',
                     'ci-runner ALL=(bench) NOPASSWD: /usr/local/libexec/benchseal-status ""',
                     'ci-runner ALL=(bench) NOPASSWD: /usr/local/libexec/benchseal-export ""',
                     'ci-runner ALL=(bench) NOPASSWD: /usr/local/libexec/benchseal-record ""']
    assert "github-runner ALL" not in rendered
    with pytest.raises(CheckFailed, match="expected 4 rules"):
        hi.render_sudoers(text.replace("github-runner ALL=(benchseal) NOPASSWD: /usr/local/libexec/benchseal-status",
                                       "# gone"), "ci-runner", "bench")
    with pytest.raises(CheckFailed, match="unexpected line"):
        hi.render_sudoers(text + "github-runner ALL=(ALL) NOPASSWD: ALL\n", "ci-runner", "bench")
    with pytest.raises(ValidationError):
        hi.validate_user_name("--runner-user", "ci runner")


@pytest.mark.skipif(shutil.which("visudo") is None, reason="visudo (package sudo) is not installed")
def test_visudo_rejects_a_broken_rule_and_nothing_is_installed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(CheckFailed, match="visudo -cf rejected"):
        hi.check_visudo(b"Defaults!/usr/local/libexec/benchseal-accept env_reset,, !!\n")
    deploy = tmp_path / "deploy"
    shutil.copytree(REPO / "deploy", deploy)
    sudoers = deploy / "benchseal.sudoers"
    sudoers.write_text(sudoers.read_text().replace("env_reset, !setenv", "env_reset,, !setenv"))
    monkeypatch.setattr(hi, "DEPLOY_DIR", deploy)
    root = _root_fs(tmp_path)
    with pytest.raises(CheckFailed, match="visudo"):
        hi.install(hi.InstallOptions(runner_user=RUNNER, prefix=root))
    assert not (root / "etc" / "sudoers.d" / "benchseal").exists()
    assert list((root / "etc" / "sudoers.d").iterdir()) == [], "a temp file was left behind"
    assert not (root / "etc" / "systemd" / "system" / "benchseal-worker.service").exists()


API_IMAGE = "127.0.0.1:5055/benchseal/api@sha256:" + "c" * 64


def test_render_api_unit_names_the_image_by_digest_and_the_service_user() -> None:
    text = (REPO / "deploy" / hi.API_UNIT).read_text()
    rendered = hi.render_api_unit(text, "bench", API_IMAGE)
    lines = rendered.splitlines()
    assert f"Environment=BENCHSEAL_API_IMAGE={API_IMAGE}" in lines
    assert "User=bench" in lines and "Group=bench" in lines and "User=benchseal" not in lines
    assert "ExecStartPre=/opt/benchseal/.venv/bin/benchseal api check-image ${BENCHSEAL_API_IMAGE}" in lines
    assert "ExecStart=/opt/benchseal/.venv/bin/benchseal api container ${BENCHSEAL_API_IMAGE}" in lines
    assert "SupplementaryGroups=docker" in lines and "NoNewPrivileges=yes" in lines
    for bad in ("127.0.0.1:5055/benchseal/api:latest", "api@sha256:" + "C" * 64, API_IMAGE + " ", "x@sha512:" + "c" * 128):
        with pytest.raises(ValidationError, match="--api-image"):
            hi.render_api_unit(text, "bench", bad)
    with pytest.raises(CheckFailed, match="BENCHSEAL_API_IMAGE"):
        hi.render_api_unit(text.replace("Environment=BENCHSEAL_API_IMAGE=\n", ""), "bench", API_IMAGE)


def test_api_image_must_be_pinned_by_digest(tmp_path: Path) -> None:
    done = _cli("--runner-user", RUNNER, "--prefix", str(_root_fs(tmp_path)), "--api-image", "ghcr.io/acme/api:v1")
    assert done.returncode == 2 and "invalid --api-image: must be pinned by digest" in done.stderr
    assert not (tmp_path / "root" / "etc" / "benchseal").exists(), "nothing may be installed on bad input"


# -- into a --prefix root on this machine -----------------------------------------------------

@needs_root
def test_prefix_install_modes_owners_and_idempotence(tmp_path: Path) -> None:
    root = _root_fs(tmp_path)
    dry = _cli("--runner-user", RUNNER, "--prefix", str(root), "--dry-run", "--json")
    assert dry.returncode == 0, dry.stderr
    assert json.loads(dry.stdout)["changed"] is True
    assert not (root / "etc" / "benchseal").exists(), "--dry-run changed the filesystem"

    first = _cli("--runner-user", RUNNER, "--prefix", str(root))
    assert first.returncode == 0, first.stderr
    assert "Left to do by hand:" in first.stdout and f"as user {RUNNER}" in first.stdout
    passwd = {line.split(":")[0]: line.split(":") for line in (root / "etc/passwd").read_text().splitlines()}
    uid, gid = int(passwd["benchseal"][2]), int(passwd["benchseal"][3])
    assert uid < 1000 and passwd["benchseal"][5] == "/var/lib/benchseal" and passwd["benchseal"][6] == "/usr/sbin/nologin"
    expected = {
        "var/lib/benchseal": (0o750, uid, gid),
        "var/lib/benchseal/tmp": (0o750, uid, gid),
        "etc/benchseal": (0o750, 0, gid),
        "etc/benchseal/infra.yaml": (0o640, 0, gid),
        "etc/benchseal/worker.env": (0o600, 0, 0),
        "etc/benchseal/publisher.env": (0o600, 0, 0),
        "etc/sudoers.d/benchseal": (0o440, 0, 0),
        "etc/systemd/system/benchseal-sandbox.service": (0o644, 0, 0),
        "etc/systemd/system/benchseal-worker.service": (0o644, 0, 0),
        "etc/systemd/system/benchseal-publisher.service": (0o644, 0, 0),
        "usr/local/libexec/benchseal-accept": (0o755, 0, 0),
        "usr/local/libexec/benchseal-status": (0o755, 0, 0),
        "usr/local/libexec/benchseal-export": (0o755, 0, 0),
    }
    for rel, (mode, owner, group) in expected.items():
        st = (root / rel).stat()
        assert (st.st_mode & 0o7777, st.st_uid, st.st_gid) == (mode, owner, group), rel
    assert (root / "etc/benchseal/infra.yaml").read_bytes() == (REPO / "policies/infra.yaml").read_bytes()
    assert f"{RUNNER} ALL=(benchseal) NOPASSWD:" in (root / "etc/sudoers.d/benchseal").read_text()

    before = _snapshot(root)
    again = _cli("--runner-user", RUNNER, "--prefix", str(root), "--json")
    assert again.returncode == 0, again.stderr
    report = json.loads(again.stdout)
    assert report["changed"] is False, report["actions"]
    assert _snapshot(root) == before, "a second install touched the filesystem"


@needs_root
def test_prefix_install_names_another_service_user_in_every_unit(tmp_path: Path) -> None:
    root = _root_fs(tmp_path)
    done = _cli("--runner-user", RUNNER, "--service-user", "benchworker", "--prefix", str(root))
    assert done.returncode == 0, done.stderr
    units = root / "etc" / "systemd" / "system"
    assert "\nEnvironment=BENCHSEAL_SANDBOX_CONTROLLER=benchworker\n" in (units / "benchseal-sandbox.service").read_text()
    for name in ("benchseal-worker.service", "benchseal-publisher.service"):
        text = (units / name).read_text()
        assert "\nUser=benchworker\n" in text and "\nGroup=benchworker\n" in text, name
    assert "CONTROLLER=benchseal\n" not in (units / "benchseal-sandbox.service").read_text()
    assert "enable --now benchseal-sandbox benchseal-worker" in done.stdout
    # The runner label printed is the one benchmark.yml's self-hosted jobs ask for (else a dispatch times out).
    benchmark = (REPO / ".github/workflows/benchmark.yml").read_text()
    labels = set(re.findall(r"runs-on: \[self-hosted, ([\w-]+)\]", benchmark))
    assert labels == {"benchseal-infra"} and "--labels benchseal-infra`" in done.stdout


@needs_root
def test_prefix_install_of_the_api_unit(tmp_path: Path) -> None:
    root = _root_fs(tmp_path)
    unit = root / "etc/systemd/system/benchseal-api.service"
    without = _cli("--runner-user", RUNNER, "--prefix", str(root))
    assert without.returncode == 0 and not unit.exists()
    assert "run host install again with --api-image" in without.stdout
    done = _cli("--runner-user", RUNNER, "--prefix", str(root), "--api-image", API_IMAGE, "--json")
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert {"path": "/etc/systemd/system/benchseal-api.service", "action": "created", "detail": "0644"} in report["actions"]
    st = unit.stat()
    assert (st.st_mode & 0o7777, st.st_uid, st.st_gid) == (0o644, 0, 0)
    assert f"\nEnvironment=BENCHSEAL_API_IMAGE={API_IMAGE}\n" in unit.read_text()
    steps = "\n".join(report["manual_steps"])
    assert "benchseal api grant-reader benchseal_api" in steps and "systemctl enable --now benchseal-api" in steps
    assert "/etc/benchseal/api-queue-url" in steps
    # The same image again: nothing changes; a new image: the untouched unit is updated.
    before = _snapshot(root)
    again = _cli("--runner-user", RUNNER, "--prefix", str(root), "--api-image", API_IMAGE, "--json")
    assert json.loads(again.stdout)["changed"] is False and _snapshot(root) == before
    newer = API_IMAGE.replace("c" * 64, "d" * 64)
    moved = _cli("--runner-user", RUNNER, "--prefix", str(root), "--api-image", newer)
    assert moved.returncode == 0 and f"Environment=BENCHSEAL_API_IMAGE={newer}\n" in unit.read_text()
    # Installing without --api-image later keeps the unit as it is.
    assert _cli("--runner-user", RUNNER, "--prefix", str(root)).returncode == 0 and newer in unit.read_text()


@needs_root
def test_prefix_install_tightens_secret_files_and_keeps_their_content(tmp_path: Path) -> None:
    root = _root_fs(tmp_path)
    assert _cli("--runner-user", RUNNER, "--prefix", str(root)).returncode == 0
    env = root / "etc/benchseal/publisher.env"
    env.write_text("GITHUB_TOKEN=operator-secret-value\n")
    env.chmod(0o644)
    done = _cli("--runner-user", RUNNER, "--prefix", str(root), "--json")
    assert done.returncode == 0, done.stderr
    assert env.read_text() == "GITHUB_TOKEN=operator-secret-value\n"
    assert env.stat().st_mode & 0o7777 == 0o600
    assert "operator-secret-value" not in done.stdout + done.stderr
    assert {"path": "/etc/benchseal/publisher.env", "action": "fixed", "detail": "mode 0644 -> 0600"} in \
        json.loads(done.stdout)["actions"]


@needs_root
def test_prefix_install_refuses_symlinks_and_writable_code(tmp_path: Path) -> None:
    root = _root_fs(tmp_path)
    (root / "etc/sudoers.d").mkdir(parents=True)
    victim = tmp_path / "victim"
    victim.write_text("untouched\n")
    (root / "etc/sudoers.d/benchseal").symlink_to(victim)
    linked = _cli("--runner-user", RUNNER, "--prefix", str(root))
    assert linked.returncode == 1 and "not a regular file" in linked.stderr
    assert victim.read_text() == "untouched\n"

    root2 = _root_fs(tmp_path / "second")
    app = root2 / "opt/benchseal/.venv/bin"
    app.mkdir(parents=True)
    (root2 / "opt").chmod(0o755)
    (root2 / "opt/benchseal").chmod(0o777)
    writable = _cli("--runner-user", RUNNER, "--prefix", str(root2))
    assert writable.returncode == 1 and "/opt/benchseal is writable by someone other than root" in writable.stderr
    assert not (root2 / "etc/benchseal").exists()


@needs_root
def test_prefix_install_keeps_an_operator_sudo_rule_and_updates_an_untouched_one(tmp_path: Path) -> None:
    root = _root_fs(tmp_path)
    assert _cli("--runner-user", RUNNER, "--prefix", str(root)).returncode == 0
    sudoers = root / "etc/sudoers.d/benchseal"
    # Untouched since install: a new runner user updates it.
    moved = _cli("--runner-user", "ci-two", "--prefix", str(root))
    assert moved.returncode == 0, moved.stderr
    assert "ci-two ALL=(benchseal)" in sudoers.read_text() and f"{RUNNER} ALL" not in sudoers.read_text()
    # The operator edits it: the next install keeps it and says so.
    edited = sudoers.read_text() + "# reviewed by ops\n"
    sudoers.chmod(0o640)
    sudoers.write_text(edited)
    kept = _cli("--runner-user", RUNNER, "--prefix", str(root))
    assert kept.returncode == 0, kept.stderr
    assert sudoers.read_text() == edited and sudoers.stat().st_mode & 0o7777 == 0o440
    assert "kept your /etc/sudoers.d/benchseal" in kept.stderr
    side = root / "etc/sudoers.d/benchseal.benchseal-new"
    assert f"{RUNNER} ALL=(benchseal)" in side.read_text() and side.stat().st_mode & 0o7777 == 0o600


@needs_root
def test_prefix_install_refuses_unsafe_application_tree_and_root_runner(tmp_path: Path) -> None:
    root = _root_fs(tmp_path)
    deep = root / "opt/benchseal/.venv/lib/python3.13/site-packages/pkg"
    deep.mkdir(parents=True)
    for part in (root / "opt", *[p for p in deep.parents if str(p).startswith(str(root / "opt/"))], deep):
        part.chmod(0o755)
    planted = deep / "__init__.py"
    planted.write_text("")
    planted.chmod(0o664)  # group-writable code the service user would import
    unsafe = _cli("--runner-user", RUNNER, "--prefix", str(root))
    assert unsafe.returncode == 1, unsafe.stderr
    assert "/opt/benchseal/.venv/lib/python3.13/site-packages/pkg/__init__.py" in unsafe.stderr
    assert not (root / "etc/benchseal").exists()
    planted.chmod(0o644)
    os.chown(planted, 1001, 1001)  # owned by the runner user
    assert _cli("--runner-user", RUNNER, "--prefix", str(root)).returncode == 1
    os.chown(planted, 0, 0)

    passwd = root / "etc/passwd"
    passwd.write_text(passwd.read_text() + "toor:x:0:0::/root:/bin/sh\n")
    as_root = _cli("--runner-user", "toor", "--prefix", str(root))
    assert as_root.returncode == 1 and "runner user toor has uid 0" in as_root.stderr


@needs_root
def test_prefix_install_warns_about_a_runner_in_powerful_groups(tmp_path: Path) -> None:
    root = _root_fs(tmp_path)
    group = root / "etc/group"
    group.write_text(group.read_text().replace("docker:x:998:", f"docker:x:998:{RUNNER}"))
    done = _cli("--runner-user", RUNNER, "--prefix", str(root))
    assert done.returncode == 0, done.stderr
    assert f"runner user {RUNNER} is a member of group docker" in done.stderr
    passwd = root / "etc/passwd"
    passwd.write_text(passwd.read_text().replace(f"{RUNNER}:x:1001:1001:", f"{RUNNER}:x:1001:998:"))
    group.write_text(group.read_text().replace(f"docker:x:998:{RUNNER}", "docker:x:998:"))
    primary = _cli("--runner-user", RUNNER, "--prefix", str(root))
    assert f"runner user {RUNNER} is a member of group docker" in primary.stderr


@needs_root
def test_one_installer_at_a_time(tmp_path: Path) -> None:
    import fcntl

    root = _root_fs(tmp_path)
    fd = os.open(root / "etc", os.O_RDONLY | os.O_DIRECTORY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        busy = _cli("--runner-user", RUNNER, "--prefix", str(root))
        assert busy.returncode == 1 and "another benchseal host install is running" in busy.stderr
    finally:
        os.close(fd)
    assert _cli("--runner-user", RUNNER, "--prefix", str(root)).returncode == 0


# -- for real, inside a Debian container ------------------------------------------------------

def _docker(*args: str, check: bool = True, timeout: float = 300, **kw: Any) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(["docker", *args], capture_output=True, text=True, check=False, timeout=timeout, **kw)
    if check and done.returncode != 0:
        raise AssertionError(f"docker {' '.join(args[:3])} failed: {done.stderr[-2000:]}")
    return done


@pytest.fixture(scope="module")
def host_image(base_refs: dict[str, Any]) -> str:
    """The project's Debian base plus sudo and systemd (for visudo, sudo -l, systemd-analyze), cached."""
    from pipeline.imaging.build import ensure_local

    base = base_refs["base"]
    tag = f"benchseal-test/host-install:{base.digest.split(':')[1][:12]}"
    if _docker("image", "inspect", tag, check=False).returncode == 0:
        return tag
    ensure_local(base)
    name = f"benchseal-host-image-{uuid.uuid4().hex[:8]}"
    try:
        _docker("run", "--name", name, base.ref, "sh", "-c",
                "apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "
                "sudo systemd && apt-get clean", timeout=600)
        _docker("commit", "--change", 'CMD ["sleep", "infinity"]', name, tag)
    finally:
        _docker("rm", "-f", name, check=False)
    return tag


class Box:
    def __init__(self, cid: str) -> None:
        self.cid = cid

    def sh(self, script: str, *, user: str = "root", stdin: str | None = None) -> subprocess.CompletedProcess[str]:
        return subprocess.run(["docker", "exec", "-i", "-u", user, self.cid, "sh", "-c", script], input=stdin,
                              capture_output=True, text=True, check=False, timeout=180)

    def install(self, *args: str) -> subprocess.CompletedProcess[str]:
        return self.sh(" ".join(["/opt/benchseal/.venv/bin/benchseal", "host", "install", *args]))


@pytest.fixture(scope="module")
def box(host_image: str) -> Iterator[Box]:
    if shutil.which("docker") is None:
        pytest.skip("no docker CLI")
    site = sysconfig.get_paths()["purelib"]
    cid = _docker("run", "-d", "--network", "none", "-v", f"{REPO}:/src:ro", "-v", f"{site}:/site:ro",
                  host_image, "sleep", "infinity").stdout.strip()
    try:
        b = Box(cid)
        # The stand-ins for what an operator has before running host install: benchseal at
        # /opt/benchseal (here the checkout, run by the container's python3), the Docker Engine's
        # group and unit, and the Actions runner's user.
        setup = b.sh("set -e; mkdir -p /opt/benchseal/.venv/bin; cat > /opt/benchseal/.venv/bin/benchseal; "
                     "chmod 0755 /opt/benchseal/.venv/bin/benchseal; groupadd --system docker; "
                     f"useradd --create-home {RUNNER}; "
                     "printf '[Unit]\\nDescription=stand-in for the Docker Engine unit\\n[Service]\\nExecStart=/bin/true\\n' "
                     "> /etc/systemd/system/docker.service", stdin=SHIM)
        assert setup.returncode == 0, setup.stderr
        yield b
    finally:
        _docker("rm", "-f", cid, check=False)


@pytest.fixture(scope="module")
def first_install(box: Box) -> dict[str, Any]:
    done = box.install("--runner-user", RUNNER, "--json")
    assert done.returncode == 0, done.stderr
    report: dict[str, Any] = json.loads(done.stdout)
    return report


def _payload(correlation: str, policy: bytes | None = None) -> str:
    """The accept wrapper's stdin as benchmark.yml sends it: the dispatching commit's policy digest (by
    default the shipped policy's, which a first install puts on the host), then the payload."""
    from tests.fixtures.infra import _BASE_PAYLOAD

    policy = (REPO / "policies" / "infra.yaml").read_bytes() if policy is None else policy
    return f"sha256:{hashlib.sha256(policy).hexdigest()}\n" + json.dumps({**_BASE_PAYLOAD, "correlation_id": correlation})


def test_container_accounts_modes_and_owners(box: Box, first_install: dict[str, Any]) -> None:
    assert first_install["changed"] is True
    user = box.sh("getent passwd benchseal").stdout.strip().split(":")
    assert int(user[2]) < 1000 and user[5:] == ["/var/lib/benchseal", "/usr/sbin/nologin"]
    assert box.sh("id -gn benchseal").stdout.strip() == "benchseal"
    assert box.sh("id -Gn benchseal").stdout.split() == ["benchseal"], "the service user joins no other group"
    stat = box.sh("stat -c '%a %U %G %n' /var/lib/benchseal /var/lib/benchseal/tmp /etc/benchseal "
                  "/etc/benchseal/infra.yaml /etc/benchseal/worker.env /etc/benchseal/publisher.env "
                  "/etc/sudoers.d/benchseal /etc/systemd/system/benchseal-sandbox.service "
                  "/etc/systemd/system/benchseal-worker.service /etc/systemd/system/benchseal-publisher.service "
                  "/usr/local/libexec/benchseal-accept /usr/local/libexec/benchseal-status "
                  "/usr/local/libexec/benchseal-export").stdout.splitlines()
    assert stat == [
        "750 benchseal benchseal /var/lib/benchseal",
        "750 benchseal benchseal /var/lib/benchseal/tmp",
        "750 root benchseal /etc/benchseal",
        "640 root benchseal /etc/benchseal/infra.yaml",
        "600 root root /etc/benchseal/worker.env",
        "600 root root /etc/benchseal/publisher.env",
        "440 root root /etc/sudoers.d/benchseal",
        "644 root root /etc/systemd/system/benchseal-sandbox.service",
        "644 root root /etc/systemd/system/benchseal-worker.service",
        "644 root root /etc/systemd/system/benchseal-publisher.service",
        "755 root root /usr/local/libexec/benchseal-accept",
        "755 root root /usr/local/libexec/benchseal-status",
        "755 root root /usr/local/libexec/benchseal-export",
    ]
    steps = "\n".join(first_install["manual_steps"])
    assert f"as user {RUNNER}" in steps and "/etc/benchseal/publisher.env" in steps and "/etc/benchseal/infra.yaml" in steps
    assert "Install benchseal" not in steps and "Docker Engine" not in steps  # both are there already


def test_container_sudo_rule_is_exactly_the_four_wrappers(box: Box, first_install: dict[str, Any]) -> None:
    checked = box.sh("visudo -c")
    assert checked.returncode == 0, checked.stdout + checked.stderr
    listing = box.sh(f"sudo -l -U {RUNNER}").stdout
    commands = [line.strip() for line in listing.split("may run the following commands")[1].splitlines()[1:]
                if line.strip()]
    assert commands == ['(benchseal) NOPASSWD: /usr/local/libexec/benchseal-accept ""',
                        '(benchseal) NOPASSWD: /usr/local/libexec/benchseal-status ""',
                        '(benchseal) NOPASSWD: /usr/local/libexec/benchseal-export ""',
                        '(benchseal) NOPASSWD: /usr/local/libexec/benchseal-record ""']
    assert "is not allowed to run sudo" in box.sh("sudo -l -U benchseal").stdout


def test_container_runner_reaches_the_queue_through_sudo_and_nothing_else(box: Box, first_install: dict[str, Any]) -> None:
    sudo = "sudo -n -u benchseal"
    accepted = box.sh(f"{sudo} /usr/local/libexec/benchseal-accept", user=RUNNER, stdin=_payload("host-install-0001"))
    assert accepted.returncode == 0, accepted.stderr
    run_id = json.loads(accepted.stdout)["run_id"]
    assert box.sh("stat -c '%U %a' /var/lib/benchseal/infra/queue.sqlite3").stdout.strip() == "benchseal 640"
    shown = box.sh(f"{sudo} /usr/local/libexec/benchseal-status", user=RUNNER, stdin=run_id + "\n")
    assert shown.returncode == 0 and json.loads(shown.stdout)["state"] == "QUEUED", shown.stderr
    refused = {
        "an argument": f"{sudo} /usr/local/libexec/benchseal-accept --db /tmp/other.sqlite3",
        "an environment variable": f"{sudo} BENCHSEAL_HOME=/tmp/evil /usr/local/libexec/benchseal-accept",
        "a shell": f"{sudo} /bin/sh -c id",
        "benchseal itself": f"{sudo} /opt/benchseal/.venv/bin/benchseal infra status",
        "root": "sudo -n /usr/local/libexec/benchseal-accept",
        "another user": f"sudo -n -u {RUNNER} /usr/local/libexec/benchseal-accept",
    }
    for what, command in refused.items():
        done = box.sh(command, user=RUNNER, stdin=_payload("host-install-0002"))
        assert done.returncode == 1 and "sudo:" in done.stderr, f"sudo let the runner pass {what}: {done.stderr}"
    assert box.sh("cat /etc/benchseal/worker.env", user=RUNNER).returncode != 0
    assert box.sh("ls /var/lib/benchseal", user=RUNNER).returncode != 0


def test_container_units_verify(box: Box, first_install: dict[str, Any]) -> None:
    done = box.sh("systemd-analyze verify /etc/systemd/system/benchseal-sandbox.service "
                  "/etc/systemd/system/benchseal-worker.service /etc/systemd/system/benchseal-publisher.service")
    assert done.returncode == 0 and done.stdout + done.stderr == "", done.stdout + done.stderr
    unit = box.sh("cat /etc/systemd/system/benchseal-worker.service").stdout
    assert "User=benchseal" in unit and "Environment=BENCHSEAL_INFRA_POLICY=/etc/benchseal/infra.yaml" in unit
    assert "Requires=docker.service benchseal-sandbox.service" in unit
    sandbox_unit = box.sh("cat /etc/systemd/system/benchseal-sandbox.service").stdout
    assert "Environment=BENCHSEAL_SANDBOX_CONTROLLER=benchseal" in sandbox_unit and "User=" not in sandbox_unit


def test_container_second_install_changes_nothing(box: Box, first_install: dict[str, Any]) -> None:
    listing = ("find /etc/benchseal /etc/sudoers.d /etc/systemd/system /usr/local/libexec /var/lib/benchseal "
               "/etc/passwd /etc/group /etc/shadow -printf '%p %m %U %G %T@ %s\\n' | sort; "
               "sha256sum /etc/benchseal/* /etc/sudoers.d/* /etc/systemd/system/benchseal-* /etc/passwd /etc/group")
    before = box.sh(listing).stdout
    again = box.install("--runner-user", RUNNER, "--json")
    assert again.returncode == 0, again.stderr
    report = json.loads(again.stdout)
    assert report["changed"] is False and report["warnings"] == [], report
    assert {a["action"] for a in report["actions"]} <= {"exists", "unchanged"}
    assert box.sh(listing).stdout == before


def test_container_operator_policy_is_kept_and_is_what_accept_reads(box: Box, first_install: dict[str, Any]) -> None:
    # The operator drops acme/widget from the sources (keeps local/benchseal).
    edit = box.sh("python3 - <<'EOF'\n"
                  "import re\n"
                  "p = '/etc/benchseal/infra.yaml'\n"
                  "t = open(p).read()\n"
                  "t2 = re.sub(r'  # The demo repository.*?images: \\*local-images\\n', '', t, flags=re.S)\n"
                  "assert t2 != t\n"
                  "open(p, 'w').write(t2 + '# edited by ops\\n')\n"
                  "EOF")
    assert edit.returncode == 0, edit.stderr
    edited = box.sh("sha256sum /etc/benchseal/infra.yaml").stdout
    again = box.install("--runner-user", RUNNER)
    assert again.returncode == 0, again.stderr
    assert "kept your /etc/benchseal/infra.yaml" in again.stderr
    assert box.sh("sha256sum /etc/benchseal/infra.yaml").stdout == edited
    side = box.sh("cat /etc/benchseal/infra.yaml.benchseal-new").stdout
    assert side == (REPO / "policies" / "infra.yaml").read_text()
    # A policy edited on the host alone is never used: the dispatching commit's (the shipped one) is not it.
    drifted = box.sh("sudo -n -u benchseal /usr/local/libexec/benchseal-accept", user=RUNNER,
                     stdin=_payload("host-install-0003"))
    assert drifted.returncode == 1 and "not the infra repository's policies/infra.yaml at the dispatching commit" \
        in drifted.stderr, drifted.stderr
    # The same edit committed to the infra repository: the wrapper reads it, and acme/widget is now refused.
    committed = box.sh("cat /etc/benchseal/infra.yaml").stdout.encode()
    refused = box.sh("sudo -n -u benchseal /usr/local/libexec/benchseal-accept", user=RUNNER,
                     stdin=_payload("host-install-0003", committed))
    assert refused.returncode == 2 and "not allowed by the infra policy" in refused.stderr, refused.stderr
    # And a third install still keeps it and changes nothing more.
    third = box.install("--runner-user", RUNNER, "--json")
    assert json.loads(third.stdout)["changed"] is False
    assert box.sh("sha256sum /etc/benchseal/infra.yaml").stdout == edited


def test_container_api_unit_verifies(box: Box, first_install: dict[str, Any]) -> None:
    done = box.install("--runner-user", RUNNER, "--api-image", API_IMAGE, "--json")
    assert done.returncode == 0, done.stderr
    verified = box.sh("systemd-analyze verify /etc/systemd/system/benchseal-api.service")
    assert verified.returncode == 0 and verified.stdout + verified.stderr == "", verified.stdout + verified.stderr
    unit = box.sh("cat /etc/systemd/system/benchseal-api.service").stdout
    assert f"Environment=BENCHSEAL_API_IMAGE={API_IMAGE}" in unit and "User=benchseal" in unit
    assert box.sh("stat -c '%a %U %G' /etc/systemd/system/benchseal-api.service").stdout.strip() == "644 root root"


def test_policy_from_environment_has_no_fallback(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from pipeline.infra.intake.policy import load_policy

    monkeypatch.setenv("BENCHSEAL_INFRA_POLICY", "etc/benchseal/infra.yaml")
    with pytest.raises(ValidationError, match="BENCHSEAL_INFRA_POLICY: must be an absolute path"):
        load_policy()
    monkeypatch.setenv("BENCHSEAL_INFRA_POLICY", str(tmp_path / "missing.yaml"))
    with pytest.raises(ValidationError, match=r"missing\.yaml: file does not exist"):
        load_policy()
    shipped = (REPO / "policies" / "infra.yaml").read_text()
    narrowed = shipped.replace("agents:\n  - oracle\n", "agents:\n")
    assert narrowed != shipped, "policies/infra.yaml no longer lists oracle first under agents"
    (tmp_path / "infra.yaml").write_text(narrowed)
    monkeypatch.setenv("BENCHSEAL_INFRA_POLICY", str(tmp_path / "infra.yaml"))
    assert "oracle" not in load_policy().agents and "nop" in load_policy().agents


def test_container_needs_root_and_dry_run_changes_nothing(box: Box, first_install: dict[str, Any]) -> None:
    listing = "find /etc/benchseal /etc/sudoers.d /etc/systemd/system -printf '%p %m %T@\\n' | sort"
    before = box.sh(listing).stdout
    cmd = "/opt/benchseal/.venv/bin/benchseal host install --runner-user other-ci"
    refused = box.sh(cmd, user=RUNNER)
    assert refused.returncode == 1 and "must run as root" in refused.stderr, refused.stderr
    dry_user = box.sh(cmd + " --dry-run", user=RUNNER)
    assert dry_user.returncode == 1 and "must run as root, --dry-run included" in dry_user.stderr
    dry = box.sh(cmd + " --dry-run --json")
    assert dry.returncode == 0, dry.stderr
    assert {"path": "/etc/sudoers.d/benchseal", "action": "would update",
            "detail": "was as installed; now the new version"} in json.loads(dry.stdout)["actions"]
    assert box.sh(listing).stdout == before
