"""Shared test setup. Stage fixtures live in tests/fixtures/*.py (loaded below)
and tests/<stage>/conftest.py."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from hypothesis import settings

os.environ.setdefault("NO_PROXY", "127.0.0.1,localhost")
os.environ.setdefault("no_proxy", "127.0.0.1,localhost")
os.environ.setdefault("HARBOR_TELEMETRY", "0")
# LiteLLM (imported by Harbor) otherwise fetches its model cost map from the network, three attempts, and logs a
# warning into whichever test's captured stderr is current when it gives up.
os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

# One Hypothesis profile for every module (loaded before any test module is imported, so
# each @settings(...) inherits it): no per-example deadline, which a busy 2-core machine
# would trip at random; more examples than Hypothesis' default.
settings.register_profile("benchseal", max_examples=200, deadline=None)
settings.load_profile(os.environ.get("BENCHSEAL_HYPOTHESIS_PROFILE", "benchseal"))

# Fixture modules import one another (tests.fixtures.datasets uses tests.fixtures.infra): each is rewritten for
# pytest's assertion messages whichever imports it first.
pytest.register_assert_rewrite("tests.fixtures")
pytest_plugins = sorted(
    f"tests.fixtures.{p.stem}" for p in (Path(__file__).parent / "fixtures").glob("*.py") if p.stem != "__init__"
)


# --- tests that need root --------------------------------------------------------------------------
# A security test that cannot run must not pass as a skip: ``@pytest.mark.needs_root("why")`` (or a
# module's ``pytestmark``) fails the test when not root, naming the reason, unless the machine truly
# cannot run it and says so (BENCHSEAL_TESTS_ALLOW_UNPRIVILEGED=1: then it is skipped). CI runs as root.
ALLOW_UNPRIVILEGED = "BENCHSEAL_TESTS_ALLOW_UNPRIVILEGED"


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "needs_root(reason): fails when not root, unless "
                            f"{ALLOW_UNPRIVILEGED}=1 (then skipped)")


@pytest.hookimpl(tryfirst=True)  # before any fixture of the test is set up
def pytest_runtest_setup(item: pytest.Item) -> None:
    marker = item.get_closest_marker("needs_root")
    if marker is None or os.geteuid() == 0:
        return
    reason = str(marker.args[0]) if marker.args else "needs root"
    if os.environ.get(ALLOW_UNPRIVILEGED) == "1":
        pytest.skip(f"not root ({ALLOW_UNPRIVILEGED}=1): {reason}")
    pytest.fail(f"needs root ({reason}): run the suite as root, or set {ALLOW_UNPRIVILEGED}=1 on a machine "
                "that cannot, to skip it", pytrace=False)
