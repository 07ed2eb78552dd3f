"""The private Sigstore instance on 127.0.0.1 (Node server built on @sigstore/mock).

``server.js`` serves Fulcio (with CT log), Rekor v1 and v2, an RFC 3161 TSA and an
OIDC token minter on one loopback port, and writes ``trusted_root.json`` and one
client trust config per Rekor API version into its state directory. This module
starts it with its pid recorded, stops only that pid, and mints identity tokens.

State: ``pipeline.core.paths.state_dir("sigstore")`` unless a directory is given.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from pipeline.core import paths
from pipeline.core.errors import InfrastructureError, ValidationError
from pipeline.core.node import node_binary, node_env
from pipeline.core.polling import poll_until

SERVER_JS = Path(__file__).with_name("sigstore_server.js")
LOCAL_ISSUER = "https://oidc.benchseal.invalid"
LOCAL_IDENTITY = "https://benchseal.invalid/signers/local"


@dataclass(frozen=True)
class GitHubJob:
    """The claims GitHub Actions puts into a job's OIDC token (the ones Fulcio turns into
    certificate extensions). The certificate identity is ``https://github.com/<job_workflow_ref>``."""

    repository: str
    ref: str
    sha: str
    workflow_file: str
    event_name: str = "push"
    # A reusable workflow (benchseal's builder) called by the source repository's workflow:
    # ``workflow_file`` is then the called file, taken from ``workflow_repository`` at
    # ``workflow_ref`` (the ref the caller wrote after ``@``) and commit ``workflow_sha``;
    # ``caller_workflow_file`` is the caller's own file (the ``workflow_ref`` claim, Fulcio's
    # Build Config URI). Defaults: the job runs a workflow of its own repository.
    workflow_repository: str | None = None
    workflow_ref: str | None = None
    workflow_sha: str | None = None
    caller_workflow_file: str | None = None
    runner_environment: str = "github-hosted"
    run_id: str = "1"
    run_attempt: str = "1"
    # Claims whose Fulcio extensions the instance leaves out of the certificate (tests only: a
    # certificate without, e.g., the workflow SHA, which verifiers must refuse).
    certificate_omits: tuple[str, ...] = ()

    @property
    def job_workflow_ref(self) -> str:
        return f"{self.workflow_repository or self.repository}/.github/workflows/{self.workflow_file}@{self.workflow_ref or self.ref}"

    @property
    def identity(self) -> str:
        return f"https://github.com/{self.job_workflow_ref}"

    def claims(self) -> dict[str, str]:
        return {
            "repository": self.repository,
            "repository_owner": self.repository.split("/", 1)[0],
            "ref": self.ref,
            "sha": self.sha,
            "event_name": self.event_name,
            "job_workflow_ref": self.job_workflow_ref,
            "job_workflow_sha": self.workflow_sha or self.sha,
            "workflow_ref": f"{self.repository}/.github/workflows/{self.caller_workflow_file or self.workflow_file}@{self.ref}",
            "workflow_sha": self.sha,
            "runner_environment": self.runner_environment,
            "run_id": self.run_id,
            "run_attempt": self.run_attempt,
            **({"benchseal_certificate_omits": ",".join(self.certificate_omits)} if self.certificate_omits else {}),
        }


@dataclass(frozen=True)
class ActionsTokenSession:
    """What a GitHub Actions job sees in its environment to request OIDC tokens."""

    request_url: str
    request_token: str

    def environ(self) -> dict[str, str]:
        return {"GITHUB_ACTIONS": "true", "ACTIONS_ID_TOKEN_REQUEST_URL": self.request_url,
                "ACTIONS_ID_TOKEN_REQUEST_TOKEN": self.request_token}


@dataclass(frozen=True)
class LocalInstance:
    """A running local instance, as its ``instance.json`` describes it."""

    state: Path
    pid: int
    url: str
    trusted_root: Path
    signing_config: Path  # ClientTrustConfig (trusted root + signing config), Rekor v1
    signing_config_rekor2: Path  # the same with Rekor v2
    issuer: str
    identity: str
    token_url: str
    actions_sessions_url: str

    def client_trust_config(self, rekor_version: int = 1) -> Path:
        if rekor_version not in (1, 2):
            raise ValidationError("rekor_version", "must be 1 or 2", rekor_version)
        return self.signing_config if rekor_version == 1 else self.signing_config_rekor2


def default_state() -> Path:
    """This state dir's instance (where ``paths.local_trusted_root`` expects its root)."""
    state = paths.local_trusted_root().parent
    state.mkdir(parents=True, exist_ok=True)
    return state


# What server.js requires (found through pipeline.core.node: $BENCHSEAL_NODE_MODULES or <project>/node_modules).
SERVER_PACKAGES = ("reflect-metadata", "asn1js", "canonicalize", "jose", "pkijs", "@peculiar/x509", "@sigstore/mock")


def _pid_path(state: Path) -> Path:
    return state / "server.pid"


def _read_instance(state: Path) -> LocalInstance | None:
    try:
        data = json.loads((state / "instance.json").read_text())
        configs = data["client_trust_config"]
        return LocalInstance(
            state=state,
            pid=int(data["pid"]),
            url=str(data["url"]),
            trusted_root=Path(data["trusted_root"]),
            signing_config=Path(configs["1"]),
            signing_config_rekor2=Path(configs["2"]),
            issuer=str(data["issuer"]),
            identity=str(data["identity"]),
            token_url=str(data["token_url"]),
            actions_sessions_url=str(data["actions_sessions_url"]),
        )
    except (FileNotFoundError, KeyError, ValueError, TypeError):
        return None


def _ours(state: Path, pid: int) -> bool:
    """True when ``pid`` is the node server we started for ``state``."""
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except (FileNotFoundError, ProcessLookupError):
        return False
    return str(SERVER_JS).encode() in cmdline and str(state).encode() in cmdline


def _answers(instance: LocalInstance, timeout: float = 2.0) -> bool:
    try:
        with urllib.request.urlopen(f"{instance.url}/healthz", timeout=timeout) as response:  # noqa: S310 - loopback URL
            return bool(json.loads(response.read()).get("pid") == instance.pid)
    except (urllib.error.URLError, OSError, ValueError):
        return False


def running(state: Path | None = None) -> LocalInstance | None:
    """The instance serving ``state``, or None when none answers."""
    state = state or default_state()
    instance = _read_instance(state)
    if instance is not None and _ours(state, instance.pid) and _answers(instance):
        return instance
    return None


def ensure_running(state: Path | None = None, *, port: int = 0, wait_seconds: float = 30.0) -> LocalInstance:
    """Return the running instance for ``state``; start one (pid recorded) if none answers.

    A new start generates new keys, so bundles made by an earlier instance verify
    only against that instance's trusted_root.json (keep it with the release).
    """
    state = (state or default_state()).resolve()
    state.mkdir(parents=True, exist_ok=True)
    found = running(state)
    if found is not None:
        return found
    stop(state)  # our own server from an older build that no longer describes itself fully
    (state / "instance.json").unlink(missing_ok=True)
    node, env = node_binary(), node_env(SERVER_PACKAGES)
    log = (state / "server.log").open("ab")
    try:
        process = subprocess.Popen(
            [node, str(SERVER_JS), "--state", str(state), "--port", str(port)],
            stdin=subprocess.DEVNULL, stdout=log, stderr=log, start_new_session=True,
            cwd=str(paths.REPO_ROOT), env=env,
        )
    finally:
        log.close()
    _pid_path(state).write_text(f"{process.pid}\n")
    def ready() -> LocalInstance | None:
        if process.poll() is not None:
            raise InfrastructureError(f"local Sigstore server exited with {process.returncode}; see {state / 'server.log'}")
        instance = _read_instance(state)
        if instance is not None and instance.pid == process.pid and _answers(instance, timeout=0.5):
            return instance
        return None

    started = poll_until(ready, timeout=wait_seconds, interval=0.1)
    if started is not None:
        return started
    process.kill()
    raise InfrastructureError(f"local Sigstore server did not answer within {wait_seconds:.0f}s; see {state / 'server.log'}")


def stop(state: Path | None = None) -> str:
    """Stop the server we started for ``state`` (by recorded pid); never another process."""
    state = (state or default_state()).resolve()
    try:
        pid = int(_pid_path(state).read_text().strip())
    except (FileNotFoundError, ValueError):
        return "stopped"
    if not _ours(state, pid):
        _pid_path(state).unlink(missing_ok=True)
        return "stopped"
    os.kill(pid, signal.SIGTERM)
    if poll_until(lambda: True if not _ours(state, pid) else None, timeout=5.0, interval=0.1) is None:
        os.kill(pid, signal.SIGKILL)
    _pid_path(state).unlink(missing_ok=True)
    return "stopped"


def status(state: Path | None = None) -> dict[str, object]:
    state = (state or default_state()).resolve()
    instance = running(state)
    return {
        "state": str(state),
        "answers": instance is not None,
        "pid": instance.pid if instance else None,
        "url": instance.url if instance else None,
        "trusted_root": str(instance.trusted_root) if instance else None,
    }


def _post_json(url: str, body: dict[str, object], what: str) -> dict[str, object]:
    request = urllib.request.Request(url, data=json.dumps(body).encode(), method="POST",  # noqa: S310 - loopback URL
                                     headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=10) as response:  # noqa: S310 - loopback URL
            answer = json.loads(response.read())
    except (urllib.error.URLError, OSError, ValueError) as exc:
        raise InfrastructureError(f"local Sigstore instance at {url} did not {what}: {exc}") from None
    if not isinstance(answer, dict):
        raise InfrastructureError(f"local Sigstore instance at {url} did not {what}: not a JSON object")
    return answer


def mint_token(instance: LocalInstance, *, subject: str | None = None, claims: dict[str, object] | None = None,
               ttl_seconds: int = 600) -> str:
    """An ES256 identity token from the instance's own OIDC issuer (accepted by its Fulcio only)."""
    answer = _post_json(instance.token_url, {"sub": subject, "claims": claims or {}, "ttl_seconds": ttl_seconds},
                        "mint a token")
    return _token_of(answer, instance)


def mint_github_token(instance: LocalInstance, job: GitHubJob, *, ttl_seconds: int = 600) -> str:
    """A token shaped exactly like a GitHub Actions job's (issuer, sub, claims), signed by this
    instance's OIDC key: its Fulcio certifies it like public-good Fulcio, under this trust root only."""
    answer = _post_json(instance.token_url, {"github_job": job.claims(), "ttl_seconds": ttl_seconds}, "mint a token")
    return _token_of(answer, instance)


def _token_of(answer: dict[str, object], instance: LocalInstance) -> str:
    token = answer.get("token")
    if not isinstance(token, str) or not token:
        raise InfrastructureError(f"local OIDC issuer at {instance.token_url} did not mint a token: {answer.get('message')}")
    return token


def open_actions_session(instance: LocalInstance, job: GitHubJob) -> ActionsTokenSession:
    """Serve ``job``'s tokens the way Actions does (ACTIONS_ID_TOKEN_REQUEST_URL / _TOKEN)."""
    answer = _post_json(instance.actions_sessions_url, {"job": job.claims()}, "open an Actions token session")
    url, token = answer.get("request_url"), answer.get("request_token")
    if not isinstance(url, str) or not isinstance(token, str):
        raise InfrastructureError(f"local Sigstore instance at {instance.actions_sessions_url} gave no session")
    return ActionsTokenSession(request_url=url, request_token=token)
