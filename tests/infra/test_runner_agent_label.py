"""The worker reads the release agent a runner carries from its config label (bound to the digest the
signature covers) and refuses a runner that does not carry exactly the payload's artifact, before any
container of it runs. Real images, built and pushed to the local registry."""

from __future__ import annotations

import io
import json
from collections.abc import Callable, Iterator
from typing import Any

import docker
import pytest

from pipeline.core.contracts import DispatchPayload
from pipeline.core.digests import ImageRef
from pipeline.imaging.agentlayers import AGENT_LABEL
from pipeline.infra.worker.config import ImageRefused
from pipeline.infra.worker.images import check_runner_agent

pytestmark = [pytest.mark.docker]

COMMIT = "0123456789abcdef0123456789abcdef01234567"
ARTIFACT = {"name": "qwen-code", "kind": "npm", "package": "@qwen-code/qwen-code", "version": "1.2.3",
            "integrity": "sha512-pmexy/Nj+BKd3Un1ogqGQE8V4GJn5B6N9PQOrU1GH+lMR29kn6Bgf6YdbZa8hNIoTmAKT1LTPK+P8TibZRPPVg==",
            "source_commit": COMMIT}


@pytest.fixture(scope="module")
def client() -> Iterator[Any]:
    engine = docker.from_env()
    yield engine
    engine.close()


def _image(client: Any, registry: str, label: str | None) -> ImageRef:
    """An image whose config carries ``label`` (or none), pushed; its name@digest."""
    dockerfile = "FROM scratch\nLABEL test.benchseal.case=agent-label\n"
    if label is not None:
        dockerfile += f"LABEL {AGENT_LABEL}={json.dumps(label)}\n"
    repository = f"{registry}/benchseal-test/agent-label"
    image, _ = client.images.build(fileobj=io.BytesIO(dockerfile.encode()), tag=f"{repository}:case", rm=True)
    for line in client.images.push(repository, tag="case", stream=True, decode=True):
        if "error" in line:
            raise AssertionError(line["error"])
    image.reload()
    digests = [d for d in image.attrs["RepoDigests"] if d.startswith(repository + "@")]
    assert digests, image.attrs["RepoDigests"]
    return ImageRef(repository, digests[0].rpartition("@")[2])


def _payload(make_payload: Callable[..., dict[str, Any]], ref: ImageRef, **artifact: Any) -> DispatchPayload:
    return DispatchPayload.model_validate(make_payload(runner=ref.ref, agent="qwen-code",
                                                      agent_artifact={**ARTIFACT, **artifact}))


def test_the_payloads_artifact_passes(client: Any, image_registry: str, make_payload: Callable[..., dict[str, Any]]) -> None:
    ref = _image(client, image_registry, json.dumps(ARTIFACT, sort_keys=True))
    check_runner_agent(client, ref, _payload(make_payload, ref))


@pytest.mark.parametrize(("label", "needle"), [
    (None, "carries no release agent"),
    ({**ARTIFACT, "version": "1.2.2"}, "version differ"),
    ({**ARTIFACT, "integrity": "sha512-" + "A" * 86 + "=="}, "integrity differ"),
    ({**ARTIFACT, "source_commit": "f" * 40}, "source_commit differ"),
    ("not json", "is not an agent artifact"),
    ({**ARTIFACT, "extra": 1}, "is not an agent artifact"),
])
def test_a_runner_carrying_anything_else_is_refused(client: Any, image_registry: str,
                                                    make_payload: Callable[..., dict[str, Any]],
                                                    label: Any, needle: str) -> None:
    text = None if label is None else label if isinstance(label, str) else json.dumps(label)
    ref = _image(client, image_registry, text)
    with pytest.raises(ImageRefused, match=needle):
        check_runner_agent(client, ref, _payload(make_payload, ref))


def test_a_calibration_run_ignores_a_baked_agent(client: Any, image_registry: str,
                                                 make_payload: Callable[..., dict[str, Any]]) -> None:
    ref = _image(client, image_registry, json.dumps(ARTIFACT))
    check_runner_agent(client, ref, DispatchPayload.model_validate(make_payload(runner=ref.ref)))
