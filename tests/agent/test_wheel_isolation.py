"""pipeline.agent.wheel: the adopter's build code runs isolated from benchseal's privileges.

Each hostile ``setup.py`` here is built for real (the isolated build: a dedicated user, namespaces,
a scrubbed environment, the locked backend) and tries one thing benchseal's privileges would give
it: read a secret from the environment or the state home, reach a listener on 127.0.0.1, write
outside its output directory, run as root, hand back a link instead of a wheel. It records what it
got into its own module, which goes into the wheel, so the test reads the outcome from the wheel
and checks the host for the effect. The honest example still builds (tests/agent/test_wheel.py).
"""

from __future__ import annotations

import ast
import json
import os
import pwd
import socket
import subprocess
import sys
import uuid
import zipfile
from pathlib import Path

import pytest

from pipeline.agent.wheel import BUILD_USER, build_wheel
from pipeline.core import paths
from pipeline.core.errors import CheckFailed

CANARY = f"canary-{uuid.uuid4().hex}"
SECRET_ENV = ("GITHUB_TOKEN", "ACTIONS_ID_TOKEN_REQUEST_TOKEN", "ACTIONS_ID_TOKEN_REQUEST_URL", "BENCHSEAL_NPM_TOKEN",
              "BENCHSEAL_CANARY_SECRET", "NPM_TOKEN", "DOCKER_CONFIG")

# setup.py runs ATTACK (which fills the dict ``found``), writes it into the package, then builds.
SETUP = '''
import json, os
from setuptools import setup
found = {{}}
{attack}
with open(os.path.join("evil", "__init__.py"), "w") as handle:
    handle.write("FOUND = " + repr(json.dumps(found)) + "\\n")
setup(name="evil", version="0.1.0", packages=["evil"])
'''
PYPROJECT = '[build-system]\nrequires = ["setuptools"]\nbuild-backend = "setuptools.build_meta"\n'


def _git(repo: Path, *args: str) -> str:
    env = {k: v for k, v in os.environ.items() if not k.startswith("GIT_")}
    return subprocess.run(["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@example.com",
                           "-c", "commit.gpgsign=false", *args],
                          check=True, capture_output=True, text=True, env=env).stdout.strip()


def _hostile(tmp_path: Path, attack: str) -> tuple[Path, str]:
    root = tmp_path / "repo"
    (root / "evil").mkdir(parents=True)
    (root / "evil" / "__init__.py").write_text("")
    (root / "pyproject.toml").write_text(PYPROJECT)
    (root / "setup.py").write_text(SETUP.format(attack=attack))
    _git(root, "init", "-q")
    _git(root, "add", "-A")
    _git(root, "commit", "-q", "-m", "evil")
    return root, _git(root, "rev-parse", "HEAD")


def _found(wheel: Path) -> dict[str, object]:
    with zipfile.ZipFile(wheel) as archive:
        text = archive.read("evil/__init__.py").decode()
    assert text.startswith("FOUND = ")
    found = json.loads(ast.literal_eval(text.removeprefix("FOUND = ").strip()))
    assert isinstance(found, dict)
    return found


def test_secrets_in_the_environment_and_the_state_home_do_not_reach_the_build(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for name in SECRET_ENV:
        monkeypatch.setenv(name, CANARY)
    secret = paths.state_dir("isolation-canary") / f"{uuid.uuid4().hex}.txt"
    secret.write_text(CANARY)
    secret.chmod(0o644)  # readable by anyone who can reach it: only hiding the state home keeps it out
    try:
        attack = f'''
found["env"] = dict(os.environ)
for pid in os.listdir("/proc"):
    try:
        found["proc-" + pid] = open("/proc/" + pid + "/environ", "rb").read().decode("latin-1")
    except OSError as exc:
        found["proc-" + pid] = repr(exc)
try:
    found["state"] = open({str(secret)!r}).read()
except OSError as exc:
    found["state"] = repr(exc)
'''
        root, commit = _hostile(tmp_path, attack)
        built = build_wheel(root, commit, ".", "0.1.0", tmp_path / "out")
    finally:
        secret.unlink()
    found = _found(built.path)
    assert CANARY not in json.dumps(found)
    assert CANARY.encode() not in built.path.read_bytes()
    env = found["env"]
    assert isinstance(env, dict)
    assert not set(SECRET_ENV) & set(env), env
    assert set(env) <= {"HOME", "TMPDIR", "PATH", "SOURCE_DATE_EPOCH", "PYTHONHASHSEED", "PYTHONDONTWRITEBYTECODE",
                        "LC_ALL", "TZ"}, env
    assert "Error" in str(found["state"])  # the state home is hidden
    assert [key for key in found if key.startswith("proc-") and key[5:].isdigit()]  # it looked: only its own PIDs


def test_the_build_reaches_no_listener_on_the_hosts_loopback(tmp_path: Path) -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(8)
        port = listener.getsockname()[1]
        attack = f'''
import socket
try:
    socket.create_connection(("127.0.0.1", {port}), timeout=5).sendall(b"{CANARY}")
    found["connect"] = "connected"
except OSError as exc:
    found["connect"] = repr(exc)
'''
        root, commit = _hostile(tmp_path, attack)
        built = build_wheel(root, commit, ".", "0.1.0", tmp_path / "out")
        listener.setblocking(False)
        with pytest.raises(BlockingIOError):  # the build has finished: any connection would be queued by now
            listener.accept()
    assert str(_found(built.path)["connect"]).startswith("OSError(101")  # ENETUNREACH: loopback down, no host net


def test_the_build_writes_nothing_outside_its_output_dir(tmp_path: Path) -> None:
    mark = uuid.uuid4().hex
    out = tmp_path / "out"
    targets = [Path(sys.prefix) / f"evil-{mark}.pth",  # benchseal's venv
               Path(sys.base_prefix) / f"evil-{mark}",  # its interpreter
               Path("/root") / f"evil-{mark}",
               Path("/tmp") / f"evil-{mark}",  # world-writable on the host: the build's /tmp is its own
               Path("/var/tmp") / f"evil-{mark}",
               paths.home() / f"evil-{mark}",
               out / f"evil-{mark}",  # the caller's output dir: the build writes only into its own
               Path(paths.REPO_ROOT) / f"evil-{mark}"]
    attack = f'''
for target in {[str(t) for t in targets]!r}:
    try:
        with open(target, "w") as handle:
            handle.write("{CANARY}")
        found[target] = "written"
    except OSError as exc:
        found[target] = repr(exc)
'''
    root, commit = _hostile(tmp_path, attack)
    try:
        built = build_wheel(root, commit, ".", "0.1.0", out)
        found = _found(built.path)
        assert [t for t in targets if t.exists()] == []
        # only the private /tmp took it (and vanished with the build); everything else refused
        assert {t for t, outcome in found.items() if outcome == "written"} <= {f"/tmp/evil-{mark}", f"/var/tmp/evil-{mark}"}
        assert sorted(p.name for p in out.iterdir()) == [".built", built.path.name]
    finally:
        for target in targets:
            target.unlink(missing_ok=True)


def test_the_build_does_not_run_as_root(tmp_path: Path) -> None:
    attack = '''
found["uid"] = [os.getuid(), os.geteuid(), os.getgid(), os.getegid()]
found["groups"] = os.getgroups()
try:
    os.setuid(0)
    found["setuid"] = "root"
except OSError as exc:
    found["setuid"] = repr(exc)
found["caps"] = [line for line in open("/proc/self/status") if line.startswith(("CapEff", "CapBnd", "NoNewPrivs"))]
'''
    root, commit = _hostile(tmp_path, attack)
    found = _found(build_wheel(root, commit, ".", "0.1.0", tmp_path / "out").path)
    account = pwd.getpwnam(BUILD_USER)
    assert found["uid"] == [account.pw_uid, account.pw_uid, account.pw_gid, account.pw_gid]
    assert account.pw_uid != 0 and found["groups"] == []
    assert str(found["setuid"]).startswith("PermissionError")
    caps = "".join(str(line) for line in found["caps"])  # type: ignore[attr-defined]
    assert "CapEff:\t0000000000000000" in caps and "CapBnd:\t0000000000000000" in caps and "NoNewPrivs:\t1" in caps


def test_a_build_that_insists_on_root_fails_in_one_line(tmp_path: Path) -> None:
    root, commit = _hostile(tmp_path, 'if os.getuid() != 0:\n    raise SystemExit("this build wants root")')
    with pytest.raises(CheckFailed) as exc:
        build_wheel(root, commit, ".", "0.1.0", tmp_path / "out")
    assert "this build wants root" in str(exc.value) and "\n" not in str(exc.value)
    assert not (tmp_path / "out").exists()


def test_a_link_left_as_the_wheel_is_refused(tmp_path: Path) -> None:
    """The build hands back a symlink named like a wheel (to a file only root can read) and stops:
    benchseal opens the output without following links."""
    attack = '''
import sys
out = "/run/benchseal-build/out"
os.symlink("/etc/shadow", os.path.join(out, "evil-0.1.0-py3-none-any.whl"))
os._exit(0)
'''
    root, commit = _hostile(tmp_path, attack)
    with pytest.raises(CheckFailed) as exc:
        build_wheel(root, commit, ".", "0.1.0", tmp_path / "out")
    assert "cannot be opened as a file" in str(exc.value) and "\n" not in str(exc.value)
