"""Image names are configuration: one prefix (``--image-prefix`` / $BENCHSEAL_IMAGE_PREFIX) names every image.

Checked here without building: resolution order and conflicts, the one validator's errors
(named setting, exit 2), the infra policy admitting a ghcr.io-shaped name through
``infra validate`` and ``infra accept``, release --local refusing names its policy does not
admit before anything is built, and the worker taking its base from the configured lock.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from pipeline.core.digests import validate_name_prefix
from pipeline.core.errors import UsageError, ValidationError
from pipeline.core.paths import REPO_ROOT
from pipeline.imaging.names import ImageNames, configured_names, resolve_image_names
from pipeline.infra.intake.accept import accept_payload, validate_payload
from pipeline.infra.intake.policy import load_policy

HEX = "0123456789abcdef" * 4
GHCR = "ghcr.io/acme/benchseal-"
NO_ENV: dict[str, str] = {}


def test_prefix_names_every_image() -> None:
    names = resolve_image_names(GHCR, environ=NO_ENV)
    assert [names.name(i) for i in ("runner", "api", "base", "runner-base")] == [
        "ghcr.io/acme/benchseal-runner", "ghcr.io/acme/benchseal-api",
        "ghcr.io/acme/benchseal-base", "ghcr.io/acme/benchseal-runner-base"]
    assert names.registry == "ghcr.io" and names.repository("runner") == "acme/benchseal-runner"
    nested = resolve_image_names("registry.example.com:5000/team/bench/", environ=NO_ENV)
    assert nested.name("api") == "registry.example.com:5000/team/bench/api"


def test_resolution_order_and_the_local_default() -> None:
    assert resolve_image_names(environ=NO_ENV).prefix == "127.0.0.1:5055/benchseal/"
    assert resolve_image_names(registry="127.0.0.1:6000", environ=NO_ENV).name("runner") == "127.0.0.1:6000/benchseal/runner"
    env = {"BENCHSEAL_IMAGE_PREFIX": GHCR}
    assert resolve_image_names(environ=env).prefix == GHCR
    # the command line wins over the environment
    assert resolve_image_names(registry="127.0.0.1:6000", environ=env).registry == "127.0.0.1:6000"
    assert resolve_image_names(environ={"BENCHSEAL_REGISTRY": "127.0.0.1:6001"}).prefix == "127.0.0.1:6001/benchseal/"
    # both variables, same registry: the prefix names the repositories
    assert resolve_image_names(environ={"BENCHSEAL_IMAGE_PREFIX": "127.0.0.1:6001/acme/x-",
                                        "BENCHSEAL_REGISTRY": "127.0.0.1:6001"}).name("api") == "127.0.0.1:6001/acme/x-api"
    # an empty $BENCHSEAL_REGISTRY (an unset Actions variable) beside a prefix names nothing
    assert resolve_image_names(environ={"BENCHSEAL_IMAGE_PREFIX": GHCR, "BENCHSEAL_REGISTRY": ""}).prefix == GHCR
    assert configured_names(NO_ENV) is None
    assert configured_names(env) == ImageNames(GHCR, "BENCHSEAL_IMAGE_PREFIX")


def test_conflicting_settings_are_usage_errors_not_fallbacks() -> None:
    with pytest.raises(UsageError, match="give one"):
        resolve_image_names(GHCR, "127.0.0.1:5055", environ=NO_ENV)
    with pytest.raises(ValidationError, match=r"BENCHSEAL_IMAGE_PREFIX: names registry 'ghcr.io' but \$BENCHSEAL_REGISTRY"):
        resolve_image_names(environ={"BENCHSEAL_IMAGE_PREFIX": GHCR, "BENCHSEAL_REGISTRY": "127.0.0.1:5055"})
    # a set but invalid variable is an error, never replaced by the default
    for env in ({"BENCHSEAL_IMAGE_PREFIX": ""}, {"BENCHSEAL_IMAGE_PREFIX": "", "BENCHSEAL_REGISTRY": "127.0.0.1:5055"}):
        with pytest.raises(ValidationError) as caught:
            resolve_image_names(environ=env)
        assert caught.value.field == "BENCHSEAL_IMAGE_PREFIX"
    with pytest.raises(ValidationError) as caught:
        resolve_image_names(environ={"BENCHSEAL_REGISTRY": ""})
    assert caught.value.field == "BENCHSEAL_REGISTRY"


@pytest.mark.parametrize(("prefix", "rule"), [
    ("ghcr.io/Acme/benchseal-", "repository component 'Acme"),
    ("GHCR.io/acme/benchseal-", "registry host 'GHCR.io'"),
    ("ghcr.io/acme/benchseal", "must end in '/', '-', '_' or '.'"),
    ("acme/benchseal-", "registry host 'acme'"),  # no implied Docker Hub
    ("ghcr.io/acme/benchseal:v1-", "must not carry a tag"),
    ("ghcr.io/acme@sha256-", "must not contain '@'"),
    ("ghcr.io/acme/bench seal-", "whitespace"),
    ("ghcr.io/acme//", "repository component ''"),
    ("ghcr.io-", "must name a registry host and a repository"),
    ("ghcr.io/acme/-", "repository component '-runner"),
    ("ghcr.io/acme/" + "x" * 250 + "-", "at most 255"),
])
def test_invalid_prefixes_name_the_setting_and_the_rule(prefix: str, rule: str) -> None:
    with pytest.raises(ValidationError) as caught:
        resolve_image_names(environ={"BENCHSEAL_IMAGE_PREFIX": prefix})
    assert caught.value.field == "BENCHSEAL_IMAGE_PREFIX"
    assert rule in caught.value.rule
    with pytest.raises(ValidationError):
        validate_name_prefix(prefix, ("runner",))


def test_registry_shorthand_is_only_a_host() -> None:
    with pytest.raises(ValidationError, match="host"):
        resolve_image_names(registry="ghcr.io/acme", environ=NO_ENV)
    with pytest.raises(ValidationError, match="registry host"):
        resolve_image_names(registry="Not.A.Host", environ=NO_ENV)


def _cli(*args: str, env: dict[str, str] | None = None, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    full = {**{k: v for k, v in os.environ.items() if k not in ("BENCHSEAL_IMAGE_PREFIX", "BENCHSEAL_REGISTRY")}, **(env or {})}
    return subprocess.run([sys.executable, "-m", "pipeline", *args], capture_output=True, text=True, env=full,
                          input=stdin, cwd=REPO_ROOT, check=False, timeout=120)


@pytest.mark.parametrize("argv", [
    ("build", "--image-prefix", "ghcr.io/Acme/benchseal-"),
    ("base", "build", "--image-prefix", "ghcr.io/Acme/benchseal-"),
    ("release", "v1.2.3", "--local", "--image-prefix", "ghcr.io/Acme/benchseal-"),
])
def test_cli_rejects_a_bad_prefix_with_exit_2(argv: tuple[str, ...], tmp_path: Path) -> None:
    done = _cli(*argv, env={"BENCHSEAL_HOME": str(tmp_path)})
    assert done.returncode == 2, done.stderr
    assert "--image-prefix" in done.stderr and "'Acme'" in done.stderr
    env_done = _cli(*argv[:-2], env={"BENCHSEAL_IMAGE_PREFIX": "ghcr.io/acme", "BENCHSEAL_HOME": str(tmp_path)})
    assert env_done.returncode == 2 and "BENCHSEAL_IMAGE_PREFIX" in env_done.stderr
    both = _cli(*argv, "--registry", "127.0.0.1:5055", env={"BENCHSEAL_HOME": str(tmp_path)})
    assert both.returncode == 2 and "give one" in both.stderr


def _ghcr_policy(tmp_path: Path, repository: str = "acme/widget") -> Path:
    data = yaml.safe_load((REPO_ROOT / "policies" / "infra.yaml").read_text())
    data["sources"] = [{"repository": repository, "signer": {"workflow": "tag.yml"},
                        "images": {"runner": [{"registry": "ghcr.io", "repository": "acme/benchseal-runner"}],
                                   "api": [{"registry": "ghcr.io", "repository": "acme/benchseal-api"}]}}]
    path = tmp_path / "infra.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def _payload(**images: str) -> dict[str, Any]:
    return {"schema": "benchseal.dispatch/v1", "correlation_id": "release-v1.2.3-000001",
            "source": {"repository": "acme/widget", "commit": "0123456789abcdef0123456789abcdef01234567", "tag": "v1.2.3"},
            "runner": images.get("runner", f"{GHCR}runner@sha256:{HEX}"),
            "api": images.get("api", f"{GHCR}api@sha256:{HEX}"), "suite": "smoke", "agent": "oracle"}


def test_policy_admits_ghcr_names_through_validate_and_accept(tmp_path: Path) -> None:
    policy_path = _ghcr_policy(tmp_path)
    policy = load_policy(policy_path)
    assert validate_payload(_payload(), policy).runner == f"{GHCR}runner@sha256:{HEX}"
    done = _cli("infra", "validate", "--payload", "-", "--policy", str(policy_path), stdin=json.dumps(_payload()))
    assert done.returncode == 0, done.stderr
    accepted = accept_payload(_payload(), db=tmp_path / "q.sqlite3", policy=policy)
    assert accepted.created
    # the local default is not admitted by this policy, and another owner on ghcr.io is not either
    for bad in ("127.0.0.1:5055/benchseal/runner", "ghcr.io/evil/benchseal-runner", "ghcr.io/acme/benchseal-api"):
        refused = _cli("infra", "validate", "--payload", "-", "--policy", str(policy_path),
                       stdin=json.dumps(_payload(runner=f"{bad}@sha256:{HEX}")))
        assert refused.returncode == 2 and "payload.runner" in refused.stderr and "not an allowed runner image" in refused.stderr
    policy.check_name("api", "ghcr.io/acme/benchseal-api", repository="acme/widget")
    with pytest.raises(ValidationError, match="not an allowed api image for source acme/widget"):
        policy.check_name("api", "127.0.0.1:5055/benchseal/api", repository="acme/widget")


def test_release_local_refuses_names_the_policy_does_not_admit_before_building(tmp_path: Path) -> None:
    # local/benchseal (no $GITHUB_REPOSITORY) admits only 127.0.0.1:5055/benchseal/* in the shipped policy
    env = {"BENCHSEAL_HOME": str(tmp_path), "GITHUB_REPOSITORY": ""}
    done = _cli("release", "v9.9.9-names", "--local", "--image-prefix", "127.0.0.1:1/acme/benchseal-", env=env)
    assert done.returncode == 2, done.stderr
    assert "--image-prefix (runner image)" in done.stderr and "127.0.0.1:1/acme/benchseal-runner" in done.stderr
    assert not (tmp_path / "release").exists()  # nothing was started or built


def _entry(ref: str) -> dict[str, str]:
    """A user-supplied base lock entry (no spec_hash): name, digest and ref of one image."""
    name, _, digest = ref.partition("@")
    return {"name": name, "digest": digest, "ref": ref}


def test_worker_takes_the_base_from_the_configured_lock(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from pipeline.core.digests import parse_ref
    from pipeline.infra.worker.loop import WorkerConfig, resolve_base_ref

    ref = f"127.0.0.1:1/acme/benchseal-base@sha256:{HEX}"
    lock = tmp_path / "base.lock.json"
    lock.write_text(json.dumps({"schema": "benchseal.base-lock/v1", "images": {"base": _entry(ref)}}))
    monkeypatch.setenv("BENCHSEAL_BASE_LOCK", str(lock))
    assert resolve_base_ref(WorkerConfig(), parse_ref(f"127.0.0.1:1/acme/benchseal-runner@sha256:{HEX}")).ref == ref


def test_worker_refuses_a_locked_base_outside_the_configured_prefix(tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    from pipeline.core.digests import parse_ref
    from pipeline.infra.worker.loop import InfraFailure, WorkerConfig, resolve_base_ref

    lock = tmp_path / "base.lock.json"
    lock.write_text(json.dumps({"schema": "benchseal.base-lock/v1",
                                "images": {"base": _entry(f"127.0.0.1:5055/benchseal/base@sha256:{HEX}")}}))
    monkeypatch.setenv("BENCHSEAL_BASE_LOCK", str(lock))
    monkeypatch.delenv("BENCHSEAL_REGISTRY", raising=False)
    monkeypatch.setenv("BENCHSEAL_IMAGE_PREFIX", GHCR)
    with pytest.raises(InfraFailure, match=r"names 127.0.0.1:5055/benchseal/base, not ghcr.io/acme/benchseal-base"):
        resolve_base_ref(WorkerConfig(), parse_ref(f"{GHCR}runner@sha256:{HEX}"))
