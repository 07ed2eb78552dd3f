"""Issue 38 "Done when": ``benchseal doctor`` finds each missing piece of a deliberately incomplete production
setup, one line each with its fix. The setup is complete but for one piece: the adopter's and the infra
repository's settings on the OpenAPI-checked GitHub emulator, and an infra host installed under a prefix with
``--infra-checkout`` (its policy naming a local registry that asks for a password), a worker heartbeat in its
queue as a polling worker writes it, and something answering as Sigstore."""

from __future__ import annotations

import base64
import http.server
import json
import os
import shutil
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from pipeline.core.doctor import Finding
from pipeline.dispatch.client import make_client
from pipeline.dispatch.doctor import check_repository
from pipeline.host import install as hi
from pipeline.host.doctor import WORKER_SILENT_SECONDS, HostOptions, check_host
from pipeline.infra.queue.sql import SqliteQueue
from tests.doubles.github import GitHubEmulator
from tests.fixtures.hostfs import root_fs
from tests.registry import helpers as registry_helpers
from tests.registry.helpers import AuthRegistry

REPO = Path(__file__).resolve().parents[2]
ADOPTER, INFRA, RUNNER = "acme/widget", "acme/bench-infra", "actions-ci"
COMMIT = "0123456789abcdef0123456789abcdef01234567"

registry = registry_helpers.htpasswd_registry  # the session's registry that asks for a password (htpasswd)

# piece -> the one line doctor prints without it (its start, and what its fix says)
PIECES = {
    "variable": ("MISSING adopter: variable BENCHSEAL_IMAGE_PREFIX: not set on acme/widget",
                 "set the repository variable BENCHSEAL_IMAGE_PREFIX"),
    "secret": ("MISSING infra: secret BENCHSEAL_PUBLISH_TOKEN: not set on acme/bench-infra",
               "set the repository secret BENCHSEAL_PUBLISH_TOKEN"),
    "runner label": ("MISSING infra: self-hosted runner labelled benchseal-infra: none of the 1 runners",
                     "`./config.sh --labels benchseal-infra`"),
    "registry auth": ("MISSING host: registry credentials for 127.0.0.1:", "docker login 127.0.0.1:"),
    "policy agent entry": ("MISSING host: policy agent for acme/widget: no agents entry of /etc/benchseal/infra.yaml",
                           "add an agents entry {name, kind, package, repositories: [acme/widget]}"),
    "suites": ("MISSING host: suite smoke dataset: /opt/benchseal/suites/smoke: ",
               "--infra-checkout DIR` with a checkout of the infra repository"),
    "sigstore": ("MISSING host: Sigstore reachable: http://127.0.0.1:", "allow the host HTTPS to Sigstore"),
    "worker not running": ("MISSING host: worker polling the queue: the newest heartbeat (worker-1) is",
                           "systemctl enable --now benchseal-sandbox benchseal-worker"),
}


@pytest.fixture
def sigstore() -> Iterator[str]:
    """Something answering HTTP on 127.0.0.1, as a Sigstore service would (any answer is reachable)."""
    class Quiet(http.server.BaseHTTPRequestHandler):
        def log_message(self, format: str, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Quiet)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_port}/"
    server.shutdown()
    server.server_close()


def _github(em: GitHubEmulator, tmp_path: Path, without: str) -> dict[str, Path]:
    checkouts = {}
    for side, repository, source, rel in (
            ("adopter", ADOPTER, "examples/hello-agent/.github/workflows/release.yml", ".github/workflows/release.yml"),
            ("infra", INFRA, "examples/bench-infra/.github/workflows/benchmark.yml", ".github/workflows/benchmark.yml")):
        em.add_repo(repository)
        top = tmp_path / side
        (top / rel).parent.mkdir(parents=True)
        (top / rel).write_text((REPO / source).read_text().replace("BENCHSEAL_COMMIT", COMMIT))
        em.add_workflow(repository, rel, (top / rel).read_text())
        checkouts[side] = top
    em.set_variable(ADOPTER, "BENCHSEAL_INFRA_REPOSITORY", INFRA)
    if without != "variable":
        em.set_variable(ADOPTER, "BENCHSEAL_IMAGE_PREFIX", "ghcr.io/acme/widget-")
    em.set_secret(ADOPTER, "BENCHSEAL_INFRA_DISPATCH_TOKEN")
    if without != "secret":
        em.set_secret(INFRA, "BENCHSEAL_PUBLISH_TOKEN")
    em.add_runner(INFRA, "infra-1", () if without == "runner label" else ("benchseal-infra",))
    em.oauth_scopes = "repo, workflow"
    # The infra repository's policy and suites (as `benchseal init --infra` writes them), its images on the
    # local registry that asks for a password.
    infra = checkouts["infra"]
    (infra / "policies").mkdir()
    shutil.copytree(REPO / "suites/smoke", infra / "suites/smoke")
    return checkouts


def _host(tmp_path: Path, infra: Path, registry: AuthRegistry, without: str) -> Path:
    policy = (REPO / "examples/bench-infra/policies/infra.yaml").read_text().replace("BENCHSEAL_COMMIT", COMMIT)
    policy = policy.replace("registry: ghcr.io", f"registry: {registry.address}")
    (infra / "policies/infra.yaml").write_text(policy)
    root = root_fs(tmp_path, RUNNER)
    hi.install(hi.InstallOptions(runner_user=RUNNER, prefix=root, infra_checkout=infra))
    state = root / "var/lib/benchseal"
    owner = state.stat()
    if without != "registry auth":  # the service user's Docker config with the registry's credentials
        user, password = next(iter(registry.users.items()))
        config = state / ".docker/config.json"
        config.parent.mkdir()
        token = base64.b64encode(f"{user}:{password}".encode()).decode()
        config.write_text(json.dumps({"auths": {registry.address: {"auth": token}}}))
        config.chmod(0o600)
        for path in (config.parent, config):
            os.chown(path, owner.st_uid, owner.st_gid)
    if without == "policy agent entry":
        host_policy = root / "etc/benchseal/infra.yaml"
        host_policy.write_text(host_policy.read_text().replace("    repositories: [acme/widget]\n",
                                                               "    repositories: [acme/other]\n"))
    if without == "suites":
        shutil.rmtree(root / "opt/benchseal/suites/smoke")
    # The worker's heartbeat, written by the queue code a polling worker runs (claim: nothing queued).
    (state / "infra").mkdir()
    db = state / "infra/queue.sqlite3"
    queue = SqliteQueue(db)
    try:
        queue.claim("worker-1", 60)
    finally:
        queue.close()
    for path in (state / "infra", *(state / "infra").iterdir()):
        os.chown(path, owner.st_uid, owner.st_gid)
    return root


def _findings(em: GitHubEmulator, checkouts: dict[str, Path], root: Path, sigstore: str,
              monkeypatch: pytest.MonkeyPatch, now: float | None = None) -> list[Finding]:
    monkeypatch.setenv("GITHUB_API_URL", em.base_url)
    monkeypatch.setenv("GITHUB_TOKEN", em.token)
    client = make_client()
    found = check_repository("adopter", ADOPTER, checkouts["adopter"], client)
    found += check_repository("infra", INFRA, checkouts["infra"], client)
    found += check_host(HostOptions(prefix=root, sigstore_url=sigstore, source=ADOPTER, now=now))
    return found


@pytest.mark.needs_root("host install creates users and root-owned files")
@pytest.mark.parametrize("without", ["none", *PIECES])
def test_each_missing_piece_is_one_line_with_its_fix(github_emulator: GitHubEmulator, registry: AuthRegistry,
                                                     sigstore: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                     without: str) -> None:
    checkouts = _github(github_emulator, tmp_path, without)
    root = _host(tmp_path, checkouts["infra"], registry, without)
    if without == "sigstore":
        sigstore = "http://127.0.0.1:9/"  # the discard port: nothing listens there
    # The worker stopped WORKER_SILENT_SECONDS + 1 s ago: its last heartbeat is that old.
    now = time.time() + WORKER_SILENT_SECONDS + 1 if without == "worker not running" else None
    failed = [f.line() for f in _findings(github_emulator, checkouts, root, sigstore, monkeypatch, now)
              if f.status == "missing"]
    if without == "none":
        assert failed == []
        return
    start, fix = PIECES[without]
    assert len(failed) == 1 and failed[0].startswith(start), failed
    assert "-> fix: " in failed[0] and fix in failed[0].split("-> fix: ", 1)[1], failed[0]
