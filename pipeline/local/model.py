"""The scripted model for a local release (``benchseal release --local --scripted-model right|wrong``).

Only when asked for: the policy's model endpoint for the suite must be on
127.0.0.1, the server is started there in this process with a fresh random
key, and the key is placed in this process's environment under the policy's
``key_env`` (never argv, never a file outside a 0400 one) for the release only.
Without the option a model-backed agent needs its key in the environment, and
that is checked before anything is built.
"""

from __future__ import annotations

import contextlib
import os
import secrets
from collections.abc import Iterator

from pipeline.core.errors import UsageError, ValidationError
from pipeline.infra.intake.policy import InfraPolicy, load_policy
from pipeline.local.model_server import ModelServer


@contextlib.contextmanager
def scripted_model_for(agent: str, suite: str, mode: str | None,
                       policy: InfraPolicy | None = None) -> Iterator[ModelServer | None]:
    policy = policy or load_policy()
    _, model = policy.agent(agent, suite, field="--agent")
    if mode is not None and mode not in ("right", "wrong"):
        raise ValidationError("--scripted-model", "must be right or wrong", mode)
    if model is None:
        if mode is not None:
            raise UsageError(f"--scripted-model: agent {agent} calls no model")
        yield None
        return
    if mode is None:
        if not os.environ.get(model.key_env):
            raise UsageError(f"agent {agent} calls {model.endpoint}: set {model.key_env}, or pass "
                             "--scripted-model right|wrong to serve that endpoint with the scripted model")
        yield None
        return
    host, port, tls = model.host_port
    if host != "127.0.0.1" or tls:
        raise UsageError(f"--scripted-model: the policy's endpoint for suite {suite} is {model.endpoint}; "
                         "the scripted model serves http://127.0.0.1:PORT only")
    key = "bs-" + secrets.token_urlsafe(32)
    old = os.environ.get(model.key_env)
    try:
        server = ModelServer(key=key, suite=suite, mode=mode, port=port)  # type: ignore[arg-type]
    except OSError as exc:
        raise UsageError(f"--scripted-model: cannot listen on 127.0.0.1:{port}: {exc.strerror}") from None
    os.environ[model.key_env] = key
    try:
        with server:
            yield server
    finally:
        if old is None:
            os.environ.pop(model.key_env, None)
        else:
            os.environ[model.key_env] = old
