"""The results pages' content, fast (FastAPI's test client over a real SQLite queue, no browser): every
run of a repository whatever its end (passed, gated, FAILED, INFRA_ERROR, queued) with its one-line
reason; re-runs of one tag told apart; the drill-down page per task and per trial (outcome, reward,
durations, tokens, every unresolved trial's reason, the tamper canary marked and not counted); any two
runs side by side; a verify command that ``benchseal verify`` parses as pasted; and every reason,
task and trial name escaped (a ``<script>`` in a trial's reason stays text)."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
import typer
from fastapi.testclient import TestClient

from pipeline.api import pages
from pipeline.api.app import QueueSource, create_app
from pipeline.core.contracts import DispatchPayload, validate_repository
from pipeline.core.digests import parse_ref
from pipeline.core.errors import ValidationError
from pipeline.core.paths import REPO_ROOT
from pipeline.host.api import ApiContainer, docker_argv
from pipeline.infra.queue.reader import open_reader
from pipeline.infra.queue.sql import SqliteQueue
from pipeline.verify.policy import parse_builder
from tests.api.dom import Element, parse
from tests.api.history import (
    API,
    CANARY,
    CRASH_REASON,
    HOSTILE_TASK,
    RUNNER,
    SCRIPT_REASON,
    Outcomes,
    seed,
    seed_outcomes,
)

PINS = pages.VerifyPins("acme/bench-infra", "benchseal/benchseal@refs/tags/v1.0.0")


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, str], Outcomes]:
    db = tmp_path_factory.mktemp("results-pages") / "infra" / "queue.sqlite3"
    with SqliteQueue(db) as queue:
        run_ids = seed(queue).run_ids
        outcomes = seed_outcomes(queue)
        # Another repository's run: never on acme/widget's pages.
        run_ids["other"] = seed(queue, "acme/other", {"v9.0.0": {"hello": (1, 1, 1)}}).run_ids["v9.0.0"]
        # Last (seeding claims the oldest queued run): a run still queued: listed, published nothing yet.
        run_ids["queued"], _ = queue.enqueue(DispatchPayload.model_validate({
            "schema": "benchseal.dispatch/v1", "correlation_id": "pages-queued-0001",
            "source": {"repository": "acme/widget", "commit": "f" * 40, "tag": "v2.0.0"},
            "runner": RUNNER, "api": API, "suite": "smoke", "agent": "oracle"}), max_attempts=2)
    return db, run_ids, outcomes


def _client(db: Path, **kw: object) -> TestClient:
    return TestClient(create_app(QueueSource(lambda: open_reader(db)), **kw))  # type: ignore[arg-type]


@pytest.fixture(scope="module")
def client(world: tuple[Path, dict[str, str], Outcomes]) -> TestClient:
    return _client(world[0], verify_pins=PINS)


def _dom(client: TestClient, path: str) -> tuple[str, Element]:
    r = client.get(path)
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/html"), (path, r.status_code, r.text[:300])
    assert r.headers["content-security-policy"] == pages.CSP
    return r.text, parse(r.text)


def _no_markup_from_data(text: str, dom: Element) -> None:
    """Nothing a run carries became an element: no script, img or b; no handler attribute."""
    assert "<script" not in text and "<img" not in text and "<b>" not in text
    assert not dom.find_all("script") and not dom.find_all("img") and not dom.find_all("b")
    assert all(not name.startswith("on") for e in dom.iter() for name in e.attrs)


def test_every_run_is_listed_with_its_verdict_and_one_line_reason(client: TestClient,
                                                                  world: tuple[Path, dict[str, str], Outcomes]) -> None:
    _, run_ids, outcomes = world
    text, dom = _dom(client, "/repos/acme/widget")
    rows = dom.find("table", "releases").find("tbody").find_all("tr")
    listed = [(r.attrs["data-run"], r.attrs["data-verdict"]) for r in rows]
    assert listed == [(run_ids["queued"], "queued"), (outcomes.crashed, "infra-error"), (outcomes.failed, "failed"), (outcomes.rerun, "passed"),
                      (run_ids["v1.2.0"], "gated"), (run_ids["v1.1.0"], "passed"), (run_ids["v1.0.0"], "first")]
    reasons = {r.attrs["data-run"]: r.attrs.get("data-reason") for r in rows}
    assert reasons[outcomes.failed] == "tampered: the tamper canary canary-contradiction passed"
    assert reasons[outcomes.crashed] == "infrastructure: " + CRASH_REASON
    gated = reasons[run_ids["v1.2.0"]]
    assert gated is not None and f"failing now: {HOSTILE_TASK}" in gated
    assert reasons[run_ids["v1.1.0"]] is None and reasons[outcomes.rerun] is None and reasons[run_ids["queued"]] is None
    by_run = {r.attrs["data-run"]: r for r in rows}
    # The reason is on the row itself, as text (the markup in it escaped).
    assert "infrastructure: " + CRASH_REASON in by_run[outcomes.crashed].text
    assert by_run[outcomes.failed].find(cls="badge").text == "failed"
    assert by_run[outcomes.crashed].find(cls="badge").text == "infra error"
    assert [li.text for li in by_run[run_ids["v1.2.0"]].find_all("li")][1] == f"resolved in v1.1.0, failing now: {HOSTILE_TASK}"
    assert "unscored" in by_run[outcomes.failed].text and "unscored" in by_run[outcomes.crashed].text
    assert "attempt 1 of 2" in by_run[outcomes.failed].text and "2026-" in by_run[outcomes.failed].text
    _no_markup_from_data(text, dom)
    assert "&lt;b&gt;oom&lt;/b&gt;" in text


def test_re_runs_of_one_tag_are_told_apart_in_the_table_and_the_chart(client: TestClient,
                                                                      world: tuple[Path, dict[str, str], Outcomes]) -> None:
    _, run_ids, outcomes = world
    _, dom = _dom(client, "/repos/acme/widget")
    rows = {r.attrs["data-run"]: r for r in dom.find("table", "releases").find("tbody").find_all("tr")}
    first, second = rows[run_ids["v1.1.0"]], rows[outcomes.rerun]
    assert first.find("a", "drill").text == "v1.1.0 #1" and second.find("a", "drill").text == "v1.1.0 #2"
    assert "run 1 of 2 of this tag" in first.text and "run 2 of 2 of this tag" in second.text
    assert run_ids["v1.1.0"] in first.text and outcomes.rerun in second.text
    assert rows[run_ids["v1.0.0"]].find("a", "drill").text == "v1.0.0"
    # The chart: the scored releases only (FAILED and INFRA_ERROR have no score), each with its interval.
    groups = dom.find("svg", "chart").find_all("g", "release")
    assert [g.find("text").text for g in groups] == ["v1.0.0", "v1.1.0 #1", "v1.2.0", "v1.1.0 #2"]
    assert [g.attrs["data-run"] for g in groups] == [run_ids["v1.0.0"], run_ids["v1.1.0"], run_ids["v1.2.0"], outcomes.rerun]
    assert all(len(g.find_all("line", "interval")) == 3 for g in groups)
    assert "v1.1.0 #2 (" + outcomes.rerun + "): score 1.000, 95 % interval" in groups[3].find("title").text


def test_the_drill_down_shows_each_task_and_trial_with_reasons_and_the_canary_not_counted(
        client: TestClient, world: tuple[Path, dict[str, str], Outcomes]) -> None:
    _, _, outcomes = world
    rows = {r.attrs["data-run"]: r for r in _dom(client, "/repos/acme/widget")[1].find("table", "releases").find_all("tr")
            if "data-run" in r.attrs}
    link = rows[outcomes.failed].find("a", "drill").attrs["href"]
    assert link == f"/repos/acme/widget/runs/{outcomes.failed}"
    text, dom = _dom(client, link)
    facts = dict(zip([d.text for d in dom.find("dl", "facts").find_all("dt")],
                     [d.text for d in dom.find("dl", "facts").find_all("dd")], strict=True))
    assert facts["Reason"] == "tampered: the tamper canary canary-contradiction passed"
    assert facts["State"].startswith("FAILED") and facts["Run"] == outcomes.failed and facts["Score"] == "unscored"
    assert facts["Trials"] == "3 scored: 1 resolved, 2 unresolved, 0 infra errors", "the canary is not counted"
    tasks = {r.attrs["data-task"]: r for r in dom.find("table", "tasks").find("tbody").find_all("tr")}
    assert [c.text for c in tasks["hello"].find_all("td")][1] == "1 / 1 resolved"
    assert [c.text for c in tasks["fail-me"].find_all("td")][1] == "0 / 1 resolved"
    assert "canary" in tasks[CANARY].classes and "not counted" in tasks[CANARY].text
    assert "1 / 1 passed (must be 0)" in tasks[CANARY].text
    trials = {r.attrs["data-task"]: r for r in dom.find("table", "trials").find("tbody").find_all("tr")}
    assert set(trials) == {"hello", "fail-me", HOSTILE_TASK, CANARY}
    cells = {task: [c.text for c in row.find_all("td")] for task, row in trials.items()}
    assert cells["fail-me"][1:] == ["unresolved", "0", "5.0 sagent 2.5 s, verifier 1.0 s", "1500 in / 400 out, 4 calls",
                                    SCRIPT_REASON]
    assert cells[HOSTILE_TASK][1] == "unresolved" and cells[HOSTILE_TASK][4] == "n/a"
    assert cells[HOSTILE_TASK][5] == "agent raised KeyError: 'answer'"
    assert cells["hello"][1] == "resolved" and cells["hello"][5] == "", "a resolved trial has no reason"
    assert "canary" in trials[CANARY].classes and cells[CANARY][1] == "resolved"
    assert cells[CANARY][5] == "a tamper canary passed: its tests cannot be passed honestly"
    # The reason with <script> in it is text: escaped in the markup, no element made of it.
    _no_markup_from_data(text, dom)
    assert "verifier exited 1: &lt;script&gt;alert(&#x27;reason&#x27;)&lt;/script&gt; &amp; more" in text
    assert "<script>alert('reason')" not in text


def test_an_infra_error_run_names_each_trial_s_cause(client: TestClient,
                                                     world: tuple[Path, dict[str, str], Outcomes]) -> None:
    _, _, outcomes = world
    text, dom = _dom(client, f"/repos/acme/widget/runs/{outcomes.crashed}")
    trials = dom.find("table", "trials").find("tbody").find_all("tr")
    assert [r.attrs["data-outcome"] for r in trials] == ["infra_error", "infra_error"]
    assert all([c.text for c in r.find_all("td")][5] == CRASH_REASON for r in trials)
    _no_markup_from_data(text, dom)


def test_any_two_runs_side_by_side(client: TestClient, world: tuple[Path, dict[str, str], Outcomes]) -> None:
    _, run_ids, outcomes = world
    # The form offers every run; with no choice it proposes the two newest.
    _, dom = _dom(client, "/repos/acme/widget")
    form = dom.find("form", "compare")
    assert form.attrs["method"] == "get" and "action" not in form.attrs
    selects = {s.attrs["name"]: s for s in form.find_all("select")}
    assert len(selects["a"].find_all("option")) == 7
    assert [o.attrs["value"] for o in selects["b"].find_all("option") if "selected" in o.attrs] == [run_ids["queued"]]
    assert [o.attrs["value"] for o in selects["a"].find_all("option") if "selected" in o.attrs] == [outcomes.crashed]
    # v1.0.0 against the FAILED v1.3.0: any two, not only the newest and its previous.
    _, dom = _dom(client, f"/repos/acme/widget?a={run_ids['v1.0.0']}&b={outcomes.failed}")
    section = dom.find("section", "compare")
    assert (section.attrs["data-a"], section.attrs["data-b"]) == (run_ids["v1.0.0"], outcomes.failed)
    side = {r.find("th").text: [c.text for c in r.find_all("td")] for r in section.find("table", "side").find_all("tr")
            if r.find_all("td")}
    assert side["Score"][0].startswith("0.667") and side["Score"][1] == "unscored"
    assert side["Verdict"][1].startswith("failed") and "tampered" in side["Verdict"][1]
    changes = {r.attrs["data-task"]: [c.text for c in r.find_all("td")] for r in section.find("table", "compared").find_all("tr")
               if "data-task" in r.attrs}
    assert changes["hello"][1:] == ["1 / 1 resolved", "1 / 1 resolved", "unchanged"]
    assert changes["fail-me"][1:] == ["0 / 1 resolved", "0 / 1 resolved", "unchanged"]
    assert changes[HOSTILE_TASK][1:] == ["1 / 1 resolved", "0 / 1 resolved", "regressed"]
    assert CANARY not in changes, "a canary is never compared: it is not scored"
    # The two runs of one tag side by side.
    _, dom = _dom(client, f"/repos/acme/widget?a={run_ids['v1.1.0']}&b={outcomes.rerun}")
    assert dom.find("section", "compare").find("h2").text == "v1.1.0 #1 against v1.1.0 #2"
    # The drill-down links the run before it, compared.
    _, dom = _dom(client, f"/repos/acme/widget/runs/{outcomes.failed}")
    assert dom.find("a", "compare-previous").attrs["href"] == (
        f"/repos/acme/widget?a={outcomes.rerun}&b={outcomes.failed}#compare")


@pytest.mark.parametrize(("query", "status"), [
    ("?a=run-0&b=run-1", 400), ("?a=%3Cscript%3E&b=run-00000000000000000000", 400),
    ("?a=run-00000000000000000000", 400),
    ("?a=run-00000000000000000000&b=run-00000000000000000001", 404)])
def test_a_bad_comparison_is_refused_without_echoing_it(client: TestClient, query: str, status: int) -> None:
    r = client.get("/repos/acme/widget" + query)
    assert r.status_code == status and r.headers["content-type"].startswith("text/html")
    assert "<script" not in r.text.lower() and "%3Cscript" not in r.text


def test_a_run_of_another_repository_or_unknown_is_a_404_and_a_bad_id_a_400(
        client: TestClient, world: tuple[Path, dict[str, str], Outcomes]) -> None:
    _, run_ids, _ = world
    assert client.get(f"/repos/acme/widget/runs/{run_ids['other']}").status_code == 404
    assert client.get(f"/repos/acme/widget?a={run_ids['other']}&b={run_ids['v1.0.0']}").status_code == 404
    assert client.get("/repos/acme/widget/runs/run-00000000000000000000").status_code == 404
    bad = client.get("/repos/acme/widget/runs/%3Cb%3Ex")
    assert bad.status_code == 400 and "<b>" not in bad.text and "&lt;b&gt;" not in bad.text
    assert client.get(f"/repos/acme/other/runs/{run_ids['other']}").status_code == 200


def _verify_argv(line: str) -> list[str]:
    argv = shlex.split(line)
    assert argv[:2] == ["benchseal", "verify"]
    return argv[2:]


def test_the_verify_hint_is_a_command_benchseal_verify_accepts_as_pasted(
        client: TestClient, world: tuple[Path, dict[str, str], Outcomes]) -> None:
    _, run_ids, outcomes = world
    from pipeline.cli.verify import verify

    app = typer.Typer()
    app.command()(verify)
    command = typer.main.get_command(app)
    for path, tag in (("/repos/acme/widget", "v1.4.0"), (f"/repos/acme/widget/runs/{outcomes.rerun}", "v1.1.0")):
        _, dom = _dom(client, path)
        line = dom.find("pre", "verify").text
        assert line == (f"benchseal verify acme/widget@{tag} --infra-repo acme/bench-infra "
                        "--builder benchseal/benchseal@refs/tags/v1.0.0")
        # verify's own parser takes it as pasted, and its own rules accept each pin.
        context = command.make_context("verify", _verify_argv(line))
        assert context.params["target"] == f"acme/widget@{tag}"
        assert context.params["infra_repo"] == PINS.infra_repository and context.params["builder"] == PINS.builder
        assert str(parse_builder(context.params["builder"])) == PINS.builder
        validate_repository(context.params["infra_repo"], "--infra-repo")
    # The newest run ended nowhere yet: the page's command names the newest that ended (v1.4.0, above), and the
    # queued run's own page prints none.
    _, dom = _dom(client, f"/repos/acme/widget/runs/{run_ids['queued']}")
    assert not dom.find_all("pre", "verify") and "has not ended" in dom.find("p", "verify").text
    # GitHub Enterprise: the API URL the fetch needs comes first.
    ghe = _client(world[0], verify_pins=PINS, release_url_base="https://ghe.example.com")
    line = parse(ghe.get("/repos/acme/widget").text).find("pre", "verify").text
    assert line.startswith("GITHUB_API_URL=https://ghe.example.com/api/v3 benchseal verify acme/widget@v1.4.0 ")
    # Without the pins the server prints no command that cannot work, and says why.
    bare = parse(_client(world[0]).get("/repos/acme/widget").text)
    assert not bare.find_all("pre", "verify")
    assert "started without --infra-repo and --builder" in bare.find("p", "verify").text


@pytest.mark.parametrize("builder", [
    "benchseal/benchseal@refs/tags/v1.0.0", "benchseal/benchseal@refs/heads/main", "benchseal/benchseal@" + "a" * 40,
    "benchseal/benchseal@main", "benchseal/benchseal", "benchseal@refs/tags/v1", "a/b@refs/tags/v1@x",
    "benchseal/benchseal@refs/tags/", "benchseal/benchseal@" + "A" * 40, "benchseal/bench seal@refs/heads/main",
    "benchseal/benchseal@refs/pull/1/merge", "benchseal/benchseal@refs/heads/a b"])
def test_the_builder_pin_follows_verify_s_rule(builder: str) -> None:
    try:
        parse_builder(builder)
        accepted = True
    except ValidationError:
        accepted = False
    if accepted:
        assert pages.verify_pins("acme/infra", builder) == pages.VerifyPins("acme/infra", builder)
    else:
        with pytest.raises(ValidationError, match="--builder"):
            pages.verify_pins("acme/infra", builder)


def test_the_pins_come_in_pairs_and_the_infra_repository_is_a_repository() -> None:
    assert pages.verify_pins(None, None) is None and pages.verify_pins("", "") is None
    with pytest.raises(ValidationError, match="--builder"):
        pages.verify_pins("acme/infra", None)
    with pytest.raises(ValidationError, match="--infra-repo"):
        pages.verify_pins(None, PINS.builder)
    with pytest.raises(ValidationError, match="--infra-repo"):
        pages.verify_pins("not a repo", PINS.builder)


def test_the_api_container_passes_the_pins_to_serve(tmp_path: Path) -> None:
    spec = ApiContainer(image=parse_ref(API, "REF"), uid=1000, gid=1000, port=8080, queue_db=tmp_path / "q.sqlite3",
                        infra_repository=PINS.infra_repository, builder=PINS.builder)
    argv = docker_argv(spec)
    serve = argv[argv.index(API) + 1:]
    assert serve[serve.index("--infra-repo") + 1] == PINS.infra_repository
    assert serve[serve.index("--builder") + 1] == PINS.builder
    assert "--infra-repo" not in docker_argv(ApiContainer(image=parse_ref(API, "REF"), uid=1, gid=1, port=1,
                                                          queue_db=tmp_path / "q.sqlite3"))


def test_the_index_lists_a_repository_whose_runs_all_failed(tmp_path: Path) -> None:
    from tests.api.history import Trial, add_run

    db = tmp_path / "infra" / "queue.sqlite3"
    with SqliteQueue(db) as queue:
        failed = add_run(queue, "v0.1.0", [Trial("hello", "unresolved", "<i>no</i> answer")], status="FAILED",
                         reason="tampered", repository="acme/never-scored")
    client = _client(db)
    index = parse(client.get("/").text)
    assert {a.text for a in index.find("ul", "repos").find_all("a")} == {"acme/never-scored"}
    assert "0 scored releases; 1 run in all" in index.find("ul", "repos").text
    text, dom = _dom(client, "/repos/acme/never-scored")
    row = dom.find("table", "releases").find("tr", "failed")
    assert row.attrs["data-run"] == failed and row.attrs["data-reason"] == "tampered"
    assert "No scored release in this suite yet." in text
    text, dom = _dom(client, f"/repos/acme/never-scored/runs/{failed}")
    assert dom.find("table", "trials").find("td", "reason").text == "<i>no</i> answer" and "<i>" not in text


def _cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("BENCHSEAL_QUEUE_URL", "BENCHSEAL_INFRA_REPO",
                                                                      "BENCHSEAL_BUILDER"))}
    return subprocess.run([sys.executable, "-m", "pipeline", "api", *args], cwd=REPO_ROOT, capture_output=True,
                          text=True, timeout=60, check=False, env=clean | (env or {}))


@pytest.mark.parametrize(("args", "field"), [
    (["--infra-repo", "acme/infra"], "--builder"), (["--builder", PINS.builder], "--infra-repo"),
    (["--infra-repo", "acme/infra", "--builder", "acme/benchseal@main"], "--builder"),
    (["--infra-repo", "acme", "--builder", PINS.builder], "--infra-repo")])
def test_api_serve_and_container_refuse_a_bad_pin_in_one_line(world: tuple[Path, dict[str, str], Outcomes],
                                                               args: list[str], field: str) -> None:
    for verb in (["serve", "--port", "1", "--queue-db", str(world[0])], ["container", API, "--print"]):
        done = _cli(*verb, *args)
        assert done.returncode == 2, (verb, done.stdout, done.stderr)
        assert field in done.stderr and len(done.stderr.strip().splitlines()) == 1 and "Traceback" not in done.stderr


def test_api_container_takes_the_pins_from_the_unit_s_environment(tmp_path: Path) -> None:
    done = _cli("container", API, "--print", "--queue-db", str(tmp_path / "q.sqlite3"),
                env={"BENCHSEAL_INFRA_REPOSITORY": PINS.infra_repository, "BENCHSEAL_BUILDER": PINS.builder})
    assert done.returncode == 0, done.stderr
    serve = json.loads(done.stdout)
    serve = serve[serve.index(API) + 1:]
    assert serve[serve.index("--infra-repo") + 1:serve.index("--infra-repo") + 4] == [
        PINS.infra_repository, "--builder", PINS.builder]
