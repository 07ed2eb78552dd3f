"""The hostile-agent corpus (issue 35, point 9): releases of agents that attack the grader instead of
solving the task score 0 on every task, each failed trial with its cause in one line, and the chain holds.

Every agent is a real release (``benchseal release --local --project``), run where an adopter's runs:

* npm kind: ONE tiny Node CLI (tests/fixtures/hostile_npm, no dependencies) published to a real
  npm registry (verdaccio); each agent is its own project file whose ``args`` name its attacks
  (``--attack a,b <instruction>``), so each is its own repository, runner image and run. It runs
  in the task container as root with the baked Node.
* Python kind: ONE package (tests/fixtures/hostile_python), one Harbor agent class per agent (its
  ``import_path``), built into the runner from each agent's own commit.

The READMEs beside the fixtures list agent -> attacks -> expected cause. For each release: the
published ``summary.json`` (read as ``ReleaseSummary``) and every trial's ``result.json`` in
``trial-results.json`` graded again with the one rule (``grade_result``): nothing resolved among
the scored tasks, no infrastructure error, each trial's ``reason`` one non-empty line naming the
expected cause; the release verified (``benchseal verify`` and cosign, run by ``release --local``).
Two agents are special: ``npm-canary-state`` tries the generic trick against the contradictory canary
(state kept between the tests' processes, a counter in /tmp), which passed a canary whose contradictory
calls came in a fixed order; the canary now draws their order in the root test process, so the trick
leaves it unresolved (the run is scored 0.0; the tamper path itself is tested at the grading and claim
level in tests/infra/test_infra_grading*.py); ``npm-honest`` (the control, released last in the home where
``npm-leave-state`` and ``py-leave-state`` ran) solves the three scored tasks honestly: 1.0, and
it finds nothing those runs left behind. (The honest example agent's 1.0 through the same path:
tests/e2e/test_e2e_release_agent.py::test_hello_agent_release_scores_one.)

The releases run in LANES lanes at once, each lane with a BENCHSEAL_HOME of its own sharing the
build caches; the cross-run pair shares one lane, in order.
"""

from __future__ import annotations

import base64
import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from pipeline.core.contracts import DigestsFile
from pipeline.core.documents import ReleaseSummary, TrialResults, load_document
from pipeline.core.paths import REPO_ROOT
from pipeline.core.scoring import grade_result, is_result_name
from pipeline.infra.sandbox.engine import default_sandbox
from pipeline.local.npmregistry import LocalNpmRegistry, npm_pack
from tests.fixtures.homes import shared_home

# The releases are made once, in the first test's setup: 18-23 min measured on a 2-core machine at load 11-16.
pytestmark = [pytest.mark.docker, pytest.mark.slow, pytest.mark.timeout(2700)]

BENCHSEAL = str(Path(sys.executable).with_name("benchseal"))
NPM_FIXTURE = REPO_ROOT / "tests" / "fixtures" / "hostile_npm"
PY_FIXTURE = REPO_ROOT / "tests" / "fixtures" / "hostile_python"
NPM_PACKAGE, NPM_TAG = "@hostile/corpus", "v1.0.0"
PY_PACKAGE, PY_TAG = "hostile-python", "v0.0.1"
LANES = 3
SCORED = ("cli-flag", "fix-mean", "write-answer")
CANARY = "dedupe-lines"
VERIFIER_TIMEOUT = "the tests did not finish within the verifier's time limit"
TESTS_FAILED = "the tests failed (exit status"


@dataclass(frozen=True)
class Agent:
    name: str
    kind: str  # npm | python
    attacks: str  # npm: the --attack list; python: the class in hostile_python.agents
    # Each task's expected cause, a substring of its trial's reason (default: its tests failed).
    causes: tuple[tuple[str, str], ...] = ()
    lane: int | None = None  # None: any lane
    # Its planted module hogs the limits (memory, processes) when the tests import it: the tests are killed
    # (they fail) or, where the engine swaps or reaps slowly, run into the verifier's limit. Unresolved either way.
    hogs: bool = False

    def cause(self, task: str) -> str:
        return dict(self.causes).get(task, TESTS_FAILED)

    def causes_of(self, task: str) -> tuple[str, ...]:
        """Each cause its trial's reason may name: the canary's ten calls, or a hog, may cost the verifier's limit."""
        return (self.cause(task), VERIFIER_TIMEOUT) if self.hogs or task == CANARY else (self.cause(task),)


def _all(cause: str) -> tuple[tuple[str, str], ...]:
    return tuple((task, cause) for task in (*SCORED, CANARY))


AGENTS = (
    # (3) the two that cost a verifier's time limit first, on their own lanes
    # (each of its modules' calls runs to the tests' 20 s bound: fix-mean's four pass the verifier's limit)
    Agent("npm-hang-verifier", "npm", "hang-import", (("fix-mean", VERIFIER_TIMEOUT),), lane=0),
    Agent("py-hang", "python", "HangAgent",
          (("write-answer", "agent phase: AgentTimeoutError"), ("fix-mean", "agent phase: AgentTimeoutError")), lane=1),
    # (1) the reward written by the graded code
    Agent("npm-reward-files", "npm", "reward-files,agent-phase-rewriter"),
    Agent("npm-import-reward", "npm", "import-writes-reward"),
    Agent("npm-exit-zero", "npm", "exit-zero"),
    Agent("npm-patch-unittest", "npm", "patch-unittest"),
    Agent("npm-fake-output", "npm", "fake-output"),
    Agent("npm-forked-rewriter", "npm", "forked-rewriter"),
    Agent("npm-site-hooks", "npm", "site-hooks"),
    Agent("npm-symlinks", "npm", "symlinks"),
    Agent("npm-fifo", "npm", "fifo"),
    Agent("py-reward-exec", "python", "RewardExecAgent"),
    # (2) the tests tampered with, the grader's files looked for
    Agent("npm-tamper-tests", "npm", "look-for-answers,tamper-tests"),
    # (3) failures laundered into infrastructure errors
    Agent("npm-bad-reward", "npm", "bad-reward"),
    Agent("npm-crash", "npm", "import-writes-reward,crash"),
    Agent("npm-kill-all", "npm", "kill-all"),
    Agent("py-keyerror", "python", "KeyErrorAgent", _all("agent phase: AgentFailed: KeyError")),
    Agent("py-infra-names", "python", "InfraNamedAgent",
          (("fix-mean", "EngineFault"), ("cli-flag", "GraderFault"), ("write-answer", "EnvironmentStartTimeoutError"),
           (CANARY, "AgentBoxFault"))),
    Agent("py-base-exceptions", "python", "BaseExceptionAgent", _all("agent phase:")),
    Agent("py-bad-context", "python", "BadContextAgent"),
    # (5) limits
    Agent("npm-memory", "npm", "memory", hogs=True),
    Agent("npm-fork-loop", "npm", "fork-loop", hogs=True),
    Agent("npm-disk", "npm", "disk"),
    Agent("py-limits", "python", "LimitsAgent", hogs=True),
    # (4) state left for a later run, then (8) the canary, then the control, in that order on one lane
    Agent("npm-leave-state", "npm", "leave-state", lane=2),
    Agent("py-leave-state", "python", "LeaveStateAgent", lane=2),
    Agent("npm-canary-state", "npm", "canary-state", lane=1),
    Agent("npm-honest", "npm", "solve,check-leftovers", lane=2),
)
HOSTILE = tuple(a for a in AGENTS if a.name not in ("npm-canary-state", "npm-honest"))


@dataclass
class Released:
    agent: Agent
    report: dict[str, Any]
    summary: ReleaseSummary | None
    trials: dict[str, tuple[str, str | None]]  # task -> (outcome, reason), graded again from the published results
    outputs: dict[str, dict[str, Any]]  # task -> what the agent reported (its findings line / findings.json)
    seconds: float
    stderr: str
    error: str | None = None  # the release ended without a report (nothing published)


def _fresh_home(root: Path) -> Path:
    assert not root.exists(), root
    return shared_home(root)


def _policy(path: Path) -> Path:
    """policies/infra.yaml admitting every corpus agent (no model) for its own example repository."""
    data = yaml.safe_load((REPO_ROOT / "policies" / "infra.yaml").read_text())
    template = next(s for s in data["sources"] if s["repository"] == "benchseal-examples/hello-agent")
    data["suites"]["smoke"]["trial_concurrency"] = 4  # the four trials of a run at once: one wave, not two
    for agent in AGENTS:
        repository = f"benchseal-examples/{agent.name}"
        data["sources"].append({**template, "repository": repository})
        data["agents"].append({"name": agent.name, "kind": agent.kind, "repositories": [repository], "model": False,
                               "package": NPM_PACKAGE if agent.kind == "npm" else PY_PACKAGE})
    path.write_text(yaml.safe_dump(data))
    return path


def _project(src: Path, agent: Agent) -> Path:
    """The agent's own project dir (in no git checkout: released as benchseal-examples/<name>)."""
    project = src / agent.name
    if agent.kind == "npm":
        project.mkdir(parents=True)
        args = json.dumps(["--attack", agent.attacks, "{instruction}"])
        (project / "benchseal.toml").write_text(
            f'schema = "benchseal.project/v1"\n[agent]\nname = "{agent.name}"\nkind = "npm"\n'
            f'package = "{NPM_PACKAGE}"\nbin = "cli.js"\nargs = {args}\npublish_wait_seconds = 5\n')
    else:
        shutil.copytree(PY_FIXTURE, project, ignore=shutil.ignore_patterns("__pycache__", "*.md"))
        (project / "benchseal.toml").write_text(
            f'schema = "benchseal.project/v1"\n[agent]\nname = "{agent.name}"\nkind = "python"\npath = "."\n'
            f'import_path = "hostile_python.agents:{agent.attacks}"\n')
    return project / "benchseal.toml"


def _outputs(run_dir: Path, kind: str) -> dict[str, dict[str, Any]]:
    """What the agent said in each trial: the CLI's last JSON line, or the Python agent's findings.json."""
    found: dict[str, dict[str, Any]] = {}
    for trial in sorted((run_dir / "harbor").glob("*__*")):
        task = trial.name.split("__", 1)[0]
        if kind == "npm":
            out = trial / "agent" / "cli-output.txt"
            lines = [ln for ln in (out.read_text(errors="replace").splitlines() if out.is_file() else [])
                     if ln.startswith("{")]
            found[task] = json.loads(lines[-1]) if lines else {}
        else:
            path = trial / "agent" / "findings.json"
            found[task] = json.loads(path.read_text()) if path.is_file() else {}
    return found


def _release(agent: Agent, home: Path, policy: Path, registry: str, root: Path) -> Released:
    project = _project(root / "src", agent)
    tag = NPM_TAG if agent.kind == "npm" else PY_TAG
    dist = root / "dist" / agent.name
    env = {k: v for k, v in os.environ.items()
           if k not in ("BENCHSEAL_AGENT_API_KEY", "BENCHSEAL_PROJECT_DIR", "BENCHSEAL_NPM_REGISTRY")}
    env.update(BENCHSEAL_HOME=str(home), HARBOR_TELEMETRY="0", BENCHSEAL_NPM_REGISTRY=registry)
    runs = home / "infra" / "runs"
    before = set(runs.iterdir()) if runs.is_dir() else set()
    started = time.monotonic()
    done = subprocess.run([BENCHSEAL, "release", tag, "--local", "--project", str(project), "--dist", str(dist),
                           "--policy", str(policy), "--json"], capture_output=True, text=True, env=env, check=False,
                          timeout=900)
    seconds = time.monotonic() - started
    new_runs = sorted(set(runs.iterdir()) - before) if runs.is_dir() else []
    outputs = _outputs(new_runs[0], agent.kind) if len(new_runs) == 1 else {}
    if not done.stdout.strip():  # the release stopped before its report: that agent's test says why
        return Released(agent, {}, None, {}, outputs, seconds, done.stderr,
                        f"exit {done.returncode}: {done.stderr[-2000:]}")
    report: dict[str, Any] = json.loads(done.stdout)
    release_dir = Path(report["release_dir"])
    summary = load_document(ReleaseSummary, release_dir / "summary.json")
    results = load_document(TrialResults, release_dir / "trial-results.json")
    trials: dict[str, tuple[str, str | None]] = {}
    for embedded in results.files:
        if is_result_name(embedded.name):
            grade = grade_result(base64.b64decode(embedded.content))
            trials[embedded.name.split("/")[2].split("__", 1)[0]] = (grade.outcome, grade.reason)
    assert [r.name for r in new_runs] == [summary.run_id], (agent.name, new_runs)
    return Released(agent, report, summary, trials, outputs, seconds, done.stderr)


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory, built_images: DigestsFile) -> Iterator[dict[str, Released]]:
    """Every agent released once (module scope: the tests below only read the results)."""
    from pipeline.local import sigstore as sigstore_local

    root = tmp_path_factory.mktemp("hostile-corpus")
    homes = [_fresh_home(root / f"home{lane}") for lane in range(LANES)]
    policy = _policy(root / "infra.yaml")
    lanes: list[list[Agent]] = [[] for _ in range(LANES)]
    for agent in AGENTS:  # pinned agents keep their lane and their order; the rest fill the shortest lane
        lanes[agent.lane if agent.lane is not None else min(range(LANES), key=lambda i: len(lanes[i]))].append(agent)
    started = time.monotonic()
    try:
        with LocalNpmRegistry(root / "npm") as registry:
            tarball, _ = npm_pack(NPM_FIXTURE, root / "packed")
            registry.publish(tarball)

            def run_lane(lane: int) -> list[Released]:
                return [_release(a, homes[lane], policy, registry.url, root / f"lane{lane}") for a in lanes[lane]]

            with ThreadPoolExecutor(max_workers=LANES) as pool:
                done = [r for rs in pool.map(run_lane, range(LANES)) for r in rs]
        timing = {r.agent.name: round(r.seconds, 1) for r in done}
        (root / "timings.json").write_text(json.dumps({"wall": round(time.monotonic() - started, 1), **timing}))
        print(f"\nhostile corpus: {len(done)} releases in {time.monotonic() - started:.0f} s: {timing}")
        yield {r.agent.name: r for r in done}
    finally:
        for home in homes:
            sigstore_local.stop(home / "sigstore")


def _one_line(reason: str | None) -> bool:
    return bool(reason) and "\n" not in str(reason) and str(reason).strip() == reason


def test_the_corpus_covers_both_kinds_and_twenty_hostile_agents() -> None:
    assert len(HOSTILE) >= 20
    assert {a.kind for a in HOSTILE} == {"npm", "python"}
    assert len({a.name for a in AGENTS}) == len(AGENTS)


# Known defects, named where they are (strict: the mark must go when the defect is fixed).
# (npm-disk's /app of 2 x 300 MiB kept its run from being sealed until a download out of a container was
# bounded: pipeline.runner.engine_env.MAX_DOWNLOAD_BYTES.)
DEFECTS: dict[str, str] = {}


@pytest.mark.parametrize("name", [pytest.param(a.name, marks=pytest.mark.xfail(strict=True, reason=DEFECTS[a.name]))
                                  if a.name in DEFECTS else a.name for a in HOSTILE])
def test_a_hostile_agent_scores_zero_with_each_cause_named(corpus: dict[str, Released], name: str) -> None:
    released = corpus[name]
    assert released.error is None, f"{name}: the release was not published: {released.error}"
    report, summary = released.report, released.summary
    assert summary is not None
    context = f"{name}: {report.get('status')} {summary.reason} {released.trials}"
    # The run is the agent's failure, sealed and scored: 0 over the three scored tasks, no infrastructure error.
    assert summary.status == "SUCCEEDED" and summary.score == 0.0, context
    assert summary.counts.total == 3 and summary.counts.resolved == 0 and summary.counts.unresolved == 3, context
    assert summary.counts.infra_errors == 0, context
    assert report["verified"], context  # benchseal verify and cosign passed on the published directory
    assert "Traceback" not in released.stderr
    # Graded again from the published results by the one rule: the same, each failure's cause in one line.
    assert sorted(released.trials) == sorted((*SCORED, CANARY)), context
    for task, (outcome, reason) in released.trials.items():
        assert outcome == "unresolved", f"{name} {task}: {outcome} ({reason})"
        assert _one_line(reason), f"{name} {task}: {reason!r}"
        assert any(cause in str(reason) for cause in released.agent.causes_of(task)), f"{name} {task}: {reason!r}"
    # It ran: every trial's agent reported what it did.
    assert sorted(released.outputs) == sorted(released.trials), released.outputs
    for task, said in released.outputs.items():
        assert said, f"{name} {task}: the agent left no findings"


def test_the_grader_s_files_are_absent_where_the_npm_agent_runs(corpus: dict[str, Released]) -> None:
    for task, said in corpus["npm-tamper-tests"].outputs.items():
        assert said["found"] == [], (task, said)
        assert "/tests" not in said["dirs"] and "/solution" not in said["dirs"], (task, said)


def test_the_limits_held_and_each_run_was_sealed(corpus: dict[str, Released]) -> None:
    for task, said in corpus["npm-memory"].outputs.items():  # killed before it had 512 MiB past its bound
        assert said["memory"]["status"] != 0 and not said["memory"]["out"].startswith("allocated"), (task, said)
    for task, said in corpus["npm-disk"].outputs.items():
        assert not said["sparse"].startswith("0\n"), (task, said)  # a 2 GiB sparse file is refused (EFBIG)
        _no_full_disk(said["huge"])
        assert said["huge"].startswith("153\n"), (task, said)  # a write past 1 GiB is stopped (SIGXFSZ)
    for task, said in corpus["py-limits"].outputs.items():
        assert said["memory"]["exit"] != 0 and "allocated" not in said["memory"]["out"], (task, said)
        _no_full_disk(said["huge"]["out"])
        assert said["sparse"]["out"].startswith("153\n") and said["huge"]["out"].startswith("153\n"), (task, said)


def _no_full_disk(out: str) -> None:
    """A write stopped by a full disk says nothing of the file-size bound: the machine, not the rule, is named."""
    if "No space left on device" in out:
        free = shutil.disk_usage(default_sandbox().data_dir).free >> 30
        pytest.fail(f"the sandbox engine's disk filled before the 1 GiB file-size bound was reached ({free} GiB free "
                    f"now; the corpus writes about 8 GiB at once): free space on this machine, then run again ({out!r})")


def test_a_stateful_trick_does_not_pass_the_canary(corpus: dict[str, Released]) -> None:
    """A counter in /tmp answered the canary's contradictory calls in their fixed order (found by this corpus);
    the canary's test now draws the order in root's process, which the candidate cannot read."""
    released = corpus["npm-canary-state"]
    summary = released.summary
    assert summary is not None, released.error
    assert summary.status == "SUCCEEDED" and summary.score == 0.0 and summary.counts.infra_errors == 0, summary
    assert released.trials[CANARY][0] == "unresolved", released.trials
    assert all(released.trials[t][0] == "unresolved" for t in SCORED), released.trials
    assert released.report["verified"]


def test_the_honest_control_scores_one_after_the_runs_that_left_state(corpus: dict[str, Released]) -> None:
    released = corpus["npm-honest"]
    assert released.summary is not None, released.error
    assert released.summary.status == "SUCCEEDED" and released.summary.score == 1.0, released.trials
    assert released.summary.counts.infra_errors == 0 and released.report["verified"]
    assert released.trials[CANARY][0] == "unresolved"  # the canary per its instruction: its tests contradict
    for task, said in released.outputs.items():
        assert said["leftovers"] == [], (task, said)
