"""The Actions harness itself (tests/workflows/harness.py) on small workflows: what it runs
as Actions does, and every way it refuses to pass silently. No Docker needed."""

from __future__ import annotations

import hashlib
import json
import re
import subprocess
import textwrap
from collections.abc import Mapping
from pathlib import Path

import pytest

from tests.workflows.harness import (
    ACTIONS,
    HarnessError,
    Runner,
    RunResult,
    Trigger,
    _read_key_values,
    run_workflow,
)

CHECKOUT = "actions/checkout@11bd71901bbe5b1630ceea73d27597364c9af683"
UPLOAD = "actions/upload-artifact@ea165f8d65b6e75b540449e92b4886f43607fa02"
DOWNLOAD = "actions/download-artifact@d3f86a106a0bac45b974a628896c90dbdf5c8093"


@pytest.fixture
def source(tmp_path: Path) -> tuple[Path, str]:
    repo = tmp_path / "source"
    repo.mkdir()
    for args in (["init", "-q", "-b", "main"], ["config", "user.email", "t@example.test"],
                 ["config", "user.name", "t"]):
        subprocess.run(["git", *args], cwd=repo, check=True)
    (repo / "hello.txt").write_text("hello\n")
    subprocess.run(["git", "add", "."], cwd=repo, check=True)
    subprocess.run(["git", "commit", "-qm", "one"], cwd=repo, check=True)
    subprocess.run(["git", "tag", "v1.0.0"], cwd=repo, check=True)
    sha = subprocess.run(["git", "rev-parse", "HEAD"], cwd=repo, check=True, capture_output=True,
                         text=True).stdout.strip()
    return repo, sha


def _run(tmp_path: Path, source: tuple[Path, str], text: str, **trigger: object):  # type: ignore[no-untyped-def]
    path = tmp_path / "wf.yml"
    path.write_text(textwrap.dedent(text))
    repo, sha = source
    fields: dict[str, object] = {"event_name": "push", "repository": "acme/widget", "sha": sha,
                                 "ref": "refs/tags/v1.0.0"}
    fields.update(trigger)
    return run_workflow(path, Trigger(**fields), Runner(root=tmp_path / "runner", source=repo))  # type: ignore[arg-type]


GOOD = f"""
name: t
on: push
env:
  WORKFLOW_LEVEL: ${{{{ vars.LEVEL }}}}
jobs:
  one:
    runs-on: ubuntu-24.04
    strategy:
      matrix:
        image: [runner, api]
    outputs:
      word: ${{{{ steps.w.outputs.word }}}}
      multi: ${{{{ steps.w.outputs.multi }}}}
    steps:
      - uses: {CHECKOUT}
        with:
          ref: ${{{{ github.sha }}}}
      - id: w
        shell: bash
        env:
          IMAGE: ${{{{ matrix.image }}}}
          SECRET: ${{{{ secrets.TOKEN }}}}
        run: |
          test "$(cat hello.txt)" = hello
          test "$WORKFLOW_LEVEL" = high
          test -n "$SECRET"
          echo "word=$IMAGE-${{{{ github.ref_name }}}}" >> "$GITHUB_OUTPUT"
          {{ echo "multi<<EOF_X"; echo "a=b"; echo "line two"; echo "EOF_X"; }} >> "$GITHUB_OUTPUT"
          echo "FROM_ENV_FILE=yes" >> "$GITHUB_ENV"
          mkdir -p bin && printf '#!/bin/sh\\necho tool\\n' > bin/mytool && chmod +x bin/mytool
          echo "$PWD/bin" >> "$GITHUB_PATH"
          echo "out-$IMAGE" > "out-$IMAGE.txt"
      - shell: bash
        run: |
          test "$FROM_ENV_FILE" = yes
          test "$(mytool)" = tool
          echo "summary of ${{{{ matrix.image }}}}" >> "$GITHUB_STEP_SUMMARY"
      - uses: {UPLOAD}
        with:
          name: out-${{{{ matrix.image }}}}
          path: out-${{{{ matrix.image }}}}.txt
          if-no-files-found: error
  two:
    needs: one
    if: ${{{{ needs.one.result == 'success' && startsWith(needs.one.outputs.word, 'api') }}}}
    runs-on: ubuntu-24.04
    steps:
      - uses: {DOWNLOAD}
        with:
          name: out-runner
          path: got
      - env:
          WORD: ${{{{ needs.one.outputs.word }}}}
          MULTI: ${{{{ needs.one.outputs.multi }}}}
        run: |
          test "$(cat got/out-runner.txt)" = out-runner
          test "$WORD" = api-v1.0.0
          test "$MULTI" = "$(printf 'a=b\\nline two')"
          exit 3
  three:
    needs: two
    runs-on: ubuntu-24.04
    steps:
      - run: echo never
  report:
    needs: [one, two, three]
    if: ${{{{ always() }}}}
    runs-on: ubuntu-24.04
    steps:
      - run: echo "two=${{{{ needs.two.result }}}} three=${{{{ needs.three.result }}}}" >> "$GITHUB_STEP_SUMMARY"
      - if: ${{{{ failure() }}}}
        run: echo "not reached"
"""


def test_a_workflow_runs_as_actions_runs_it(tmp_path: Path, source: tuple[Path, str]) -> None:
    run = _run(tmp_path, source, GOOD, vars={"LEVEL": "high"}, secrets={"TOKEN": "s3cr3t-value"})
    assert run.order == ["one", "two", "three", "report"]
    assert run.jobs["one"].result == "success", run.describe()
    assert len(run.jobs["one"].legs) == 2
    # Matrix legs: the last leg's outputs win, as in Actions.
    assert run.jobs["one"].outputs == {"word": "api-v1.0.0", "multi": "a=b\nline two"}
    assert run.jobs["two"].result == "failure" and "exit code 3" in run.jobs["two"].log
    assert run.jobs["three"].result == "skipped"
    assert run.jobs["report"].result == "success"
    assert "summary of runner\nsummary of api\n" in run.summary
    assert "two=failure three=skipped" in run.summary
    assert run.jobs["report"].legs[0][1].conclusion == "skipped"  # failure() is about this job's steps
    assert run.unresolved == [] and run.secret_leaks == []
    assert ("two: needs.one.outputs.word", "api-v1.0.0") in run.references
    assert run.conclusion == "failure"


def test_an_output_never_written_is_reported(tmp_path: Path, source: tuple[Path, str]) -> None:
    broken = GOOD.replace("word: ${{ steps.w.outputs.word }}", "word: ${{ steps.w.outputs.wrod }}")
    run = _run(tmp_path, source, broken, vars={"LEVEL": "high"}, secrets={"TOKEN": "x"})
    assert "one (runner): steps.w.outputs.wrod (never written)" in run.unresolved
    assert any("needs.one.outputs.word" in entry for entry in run.unresolved)


def test_a_secret_in_a_log_is_reported(tmp_path: Path, source: tuple[Path, str]) -> None:
    run = _run(tmp_path, source, """
        on: push
        jobs:
          leak:
            runs-on: ubuntu-24.04
            steps:
              - env: {T: "${{ secrets.TOKEN }}"}
                run: echo "token is $T"
        """, secrets={"TOKEN": "s3cr3t-value"})
    assert run.secret_leaks == ["leak"]


@pytest.mark.parametrize(("snippet", "message"), [
    ("- uses: actions/cache@0400d5f644dc74513175e3cd8d07132dd4860809", "no local equivalent"),
    ("- uses: actions/checkout@v4", "not pinned to a commit SHA"),
    (f"- uses: {CHECKOUT}\n                with: {{fetch-depth: 0}}", "does not implement"),
    ("- run: echo ${{ hashFiles('x') }}", r"hashFiles\(\) is not supported"),
    ("- run: echo ${{ github.event['x'] }}", "cannot parse"),
    ("- run: echo ${{ nosuch.context }}", "unknown context"),
    ("- run: echo ${{ steps.nope.outputs.x }}", "names no step id"),
    ("- run: echo ${{ needs.other.outputs.x }}", "not in needs"),
    ("- run: echo x\n                continue-on-error: true", "does not implement"),
    ("- run: echo x\n                shell: pwsh", "bash only"),
    ("- run: echo 'x' >> \"$GITHUB_OUTPUT\"", "invalid format"),
    ("- run: printf 'x<<EOF\\nnever closed\\n' >> \"$GITHUB_OUTPUT\"", "matching delimiter not found"),
])
def test_what_the_harness_cannot_run_fails_loudly(tmp_path: Path, source: tuple[Path, str], snippet: str,
                                                  message: str) -> None:
    text = f"""
        on: push
        jobs:
          other:
            runs-on: ubuntu-24.04
            steps:
              - run: "true"
          job:
            runs-on: ubuntu-24.04
            steps:
              {snippet}
        """
    with pytest.raises(HarnessError, match=message):
        _run(tmp_path, source, text)


def test_upload_with_no_files_fails_only_when_asked(tmp_path: Path, source: tuple[Path, str]) -> None:
    run = _run(tmp_path, source, f"""
        on: push
        jobs:
          up:
            runs-on: ubuntu-24.04
            steps:
              - uses: {UPLOAD}
                with: {{name: a, path: missing.json}}
              - uses: {UPLOAD}
                with: {{name: b, path: missing.json, if-no-files-found: error}}
              - run: echo unreachable
        """)
    steps = run.jobs["up"].legs[0]
    assert [s.conclusion for s in steps] == ["success", "failure", "skipped"]
    assert "no files were found" in steps[1].log


def test_sudo_admits_only_the_sudoers_rules(tmp_path: Path, source: tuple[Path, str]) -> None:
    run = _run(tmp_path, source, """
        on: push
        jobs:
          s:
            runs-on: ubuntu-24.04
            steps:
              - id: refused
                shell: bash
                run: |
                  for argv in "-n -u root /bin/true" "-n -u benchseal /usr/local/libexec/benchseal-accept --db x" \\
                              "-u benchseal /usr/local/libexec/benchseal-status" "-n -u benchseal /bin/sh"; do
                    if sudo $argv </dev/null; then echo "admitted: $argv"; exit 1; fi
                  done
                  echo ok=yes >> "$GITHUB_OUTPUT"
        """)
    assert run.jobs["s"].result == "success", run.describe()
    assert run.jobs["s"].step("refused").outputs == {"ok": "yes"}


def test_key_value_files_follow_the_runner_format(tmp_path: Path) -> None:
    path = tmp_path / "out"
    path.write_text("a=1\nb=x=y\nc<<EOF\nline\n\nEOF\nd=\n")
    assert _read_key_values(path, "GITHUB_OUTPUT") == {"a": "1", "b": "x=y", "c": "line\n", "d": ""}


def test_the_table_documents_every_action() -> None:
    assert set(ACTIONS) == {"actions/checkout", "actions/setup-python", "actions/upload-artifact",
                            "actions/download-artifact", "docker/login-action", "sigstore/cosign-installer"}
    assert all(a.equivalent for a in ACTIONS.values())


LOGIN = "docker/login-action@74a5d142397b4f367a81961eba4e8cd7edddf772"


def test_docker_login_writes_the_test_registry_credentials(tmp_path: Path, source: tuple[Path, str]) -> None:
    repo, sha = source
    path = tmp_path / "wf.yml"
    path.write_text(textwrap.dedent(f"""
        on: push
        jobs:
          login:
            runs-on: ubuntu-24.04
            steps:
              - uses: {LOGIN}
                with: {{registry: "127.0.0.1:5056", username: bot, password: "${{{{ secrets.REGISTRY_PASSWORD }}}}"}}
              - id: cfg
                name: the job's Docker config holds the credentials
                shell: bash
                env: {{EXPECTED: "bot:${{{{ secrets.REGISTRY_PASSWORD }}}}"}}
                run: |
                  test "$(jq -r '.auths["127.0.0.1:5056"].auth' "$DOCKER_CONFIG/config.json" | base64 -d)" = "$EXPECTED"
                  echo "mode=$(stat -c %a "$DOCKER_CONFIG/config.json")" >> "$GITHUB_OUTPUT"
          wrong:
            runs-on: ubuntu-24.04
            steps:
              - uses: {LOGIN}
                with: {{registry: "127.0.0.1:5056", username: bot, password: nope}}
        """))
    runner = Runner(root=tmp_path / "runner", source=repo, registry_auth={"127.0.0.1:5056": ("bot", "pw-1")})
    run = run_workflow(path, Trigger("push", "acme/widget", sha, "refs/heads/main",
                                     secrets={"REGISTRY_PASSWORD": "pw-1"}), runner)
    assert run.jobs["login"].result == "success", run.describe()
    assert run.jobs["login"].step("cfg").outputs == {"mode": "600"}
    assert run.jobs["wrong"].result == "failure" and "refused these credentials" in run.jobs["wrong"].log
    assert run.secret_leaks == [], run.jobs["login"].log


def test_ghcr_login_takes_the_jobs_github_token_only_with_packages_write(tmp_path: Path,
                                                                        source: tuple[Path, str]) -> None:
    """ghcr.io as a workflow sees it: username github.actor, password the job's GITHUB_TOKEN,
    accepted only when the job has packages: write; the job's Docker config then holds the
    stand-in registry's credentials."""
    repo, sha = source
    path = tmp_path / "wf.yml"
    login = (f"      - uses: {LOGIN}\n"
             "        with: {registry: ghcr.io, username: '${{ github.actor }}', password: '${{ github.token }}'}\n")
    check = ("      - shell: bash\n"
             "        run: test \"$(jq -r '.auths[\"127.0.0.1:5057\"].auth' \"$DOCKER_CONFIG/config.json\" | base64 -d)\""
             " = stand-in:pw-2\n")
    path.write_text("on: push\njobs:\n"
                    "  pusher:\n    runs-on: ubuntu-24.04\n    permissions: {contents: read, packages: write}\n"
                    f"    steps:\n{login}{check}"
                    "  reader:\n    runs-on: ubuntu-24.04\n    permissions: {contents: read}\n"
                    f"    steps:\n{login}"
                    "  stranger:\n    runs-on: ubuntu-24.04\n    permissions: {packages: write}\n"
                    "    steps:\n"
                    f"      - uses: {LOGIN}\n"
                    "        with: {registry: ghcr.io, username: '${{ github.actor }}', password: not-the-token}\n"
                    "  defaults:\n    runs-on: ubuntu-24.04\n    steps:\n      - run: 'true'\n")
    minted: list[dict[str, str]] = []

    def mint(repository: str, permissions: Mapping[str, str]) -> str:
        minted.append(dict(permissions))
        return f"ghs_job{len(minted)}"

    runner = Runner(root=tmp_path / "runner", source=repo, github_token=mint, ghcr=("127.0.0.1:5057", "stand-in", "pw-2"))
    with pytest.raises(HarnessError, match="no permissions key"):
        run_workflow(path, Trigger("push", "acme/widget", sha, "refs/heads/main"), runner)
    path.write_text(path.read_text().split("  defaults:")[0])
    run = run_workflow(path, Trigger("push", "acme/widget", sha, "refs/heads/main"), runner)
    assert run.jobs["pusher"].result == "success", run.describe()
    assert run.jobs["reader"].result == "failure" and "permission_denied" in run.jobs["reader"].log
    assert run.jobs["stranger"].result == "failure" and "not this job's GITHUB_TOKEN" in run.jobs["stranger"].log
    assert {"contents": "read", "packages": "write"} in minted and {"contents": "read"} in minted


def test_id_token_permission_serves_tokens_from_the_local_issuer(tmp_path: Path, source: tuple[Path, str]) -> None:
    repo, sha = source
    path = tmp_path / "wf.yml"
    path.write_text(textwrap.dedent("""
        on: push
        jobs:
          sign:
            runs-on: ubuntu-24.04
            permissions: {id-token: write}
            steps:
              - id: token
                shell: bash
                run: |
                  body="$(curl -fsS -H "Authorization: bearer $ACTIONS_ID_TOKEN_REQUEST_TOKEN" \\
                    "$ACTIONS_ID_TOKEN_REQUEST_URL&audience=sigstore")"
                  echo "value=$(jq -r .value <<<"$body")" >> "$GITHUB_OUTPUT"
                  ! curl -fsS "$ACTIONS_ID_TOKEN_REQUEST_URL&audience=sigstore" 2>/dev/null
          plain:
            runs-on: ubuntu-24.04
            steps:
              - run: test -z "${ACTIONS_ID_TOKEN_REQUEST_URL:-}"
        """))
    minted: list[tuple[str, dict[str, str]]] = []

    def mint(audience: str, claims: object) -> str:
        minted.append((audience, dict(claims)))  # type: ignore[call-overload]
        return "jwt-for-" + audience

    runner = Runner(root=tmp_path / "runner", source=repo, oidc=mint)
    run = run_workflow(path, Trigger("push", "acme/widget", sha, "refs/heads/main"), runner)
    assert run.jobs["sign"].result == "success" and run.jobs["plain"].result == "success", run.describe()
    assert run.jobs["sign"].step("token").outputs == {"value": "jwt-for-sigstore"}
    ((audience, claims),) = minted
    assert audience == "sigstore"
    assert claims["repository"] == "acme/widget" and claims["workflow_ref"].endswith("wf.yml@refs/heads/main")
    with pytest.raises(HarnessError, match="no OIDC issuer"):
        run_workflow(path, Trigger("push", "acme/widget", sha, "refs/heads/main"),
                     Runner(root=tmp_path / "runner2", source=repo))


@pytest.mark.slow
def test_id_token_from_the_private_sigstore_issuer(tmp_path: Path, source: tuple[Path, str],
                                                   sigstore_instance: object) -> None:
    from tests.workflows.harness import local_issuer

    repo, sha = source
    path = tmp_path / "benchmark.yml"
    path.write_text(textwrap.dedent("""
        on: push
        jobs:
          sign:
            runs-on: ubuntu-24.04
            permissions: {id-token: write}
            steps:
              - id: token
                shell: bash
                run: |
                  jwt="$(curl -fsS -H "Authorization: bearer $ACTIONS_ID_TOKEN_REQUEST_TOKEN" \\
                    "$ACTIONS_ID_TOKEN_REQUEST_URL&audience=sigstore" | jq -r .value)"
                  python3 - "$jwt" >> "$GITHUB_OUTPUT" <<'PY'
                  import base64, json, sys
                  part = sys.argv[1].split(".")[1]
                  claims = json.loads(base64.urlsafe_b64decode(part + "=" * (-len(part) % 4)))
                  print(f"iss={claims['iss']}")
                  print(f"sub={claims['sub']}")
                  print(f"job_workflow_ref={claims['job_workflow_ref']}")
                  PY
        """))
    runner = Runner(root=tmp_path / "runner", source=repo, oidc=local_issuer(sigstore_instance))
    run = run_workflow(path, Trigger("push", "acme/infra", sha, "refs/heads/main"), runner)
    assert run.jobs["sign"].result == "success", run.describe()
    # Shaped as GitHub's own: its issuer, sub and job_workflow_ref (the certificate identity is
    # https://github.com/<job_workflow_ref>), under the private instance's key only.
    assert run.jobs["sign"].step("token").outputs == {
        "iss": "https://token.actions.githubusercontent.com", "sub": "repo:acme/infra:ref:refs/heads/main",
        "job_workflow_ref": "acme/infra/.github/workflows/benchmark.yml@refs/heads/main"}


def test_an_if_without_a_status_function_also_needs_success(tmp_path: Path, source: tuple[Path, str]) -> None:
    run = _run(tmp_path, source, """
        on: push
        jobs:
          fails:
            runs-on: ubuntu-24.04
            steps:
              - run: exit 1
              - if: ${{ github.ref_name == 'v1.0.0' }}
                run: echo "implicit success() keeps me out"
              - if: ${{ always() && github.ref_name == 'v1.0.0' }}
                run: echo "explicit always() lets me run"
          after:
            needs: fails
            if: ${{ github.ref_name == 'v1.0.0' }}
            runs-on: ubuntu-24.04
            steps:
              - run: echo never
        """)
    assert [s.conclusion for s in run.jobs["fails"].legs[0]] == ["failure", "skipped", "success"]
    assert run.jobs["after"].result == "skipped"


# --- reusable workflows (on: workflow_call) --------------------------------------------------------


def _commit(repo: Path, files: dict[str, str], *, tag: str | None = None) -> str:
    """Commit ``files`` (path -> text) into the git repository ``repo`` (created if missing)."""
    if not (repo / ".git").exists():
        repo.mkdir(parents=True, exist_ok=True)
        for args in (["init", "-q", "-b", "main"], ["config", "user.email", "t@example.test"],
                     ["config", "user.name", "t"]):
            subprocess.run(["git", *args], cwd=repo, check=True)
    for name, text in files.items():
        (repo / name).parent.mkdir(parents=True, exist_ok=True)
        (repo / name).write_text(textwrap.dedent(text))
    subprocess.run(["git", "add", "-A"], cwd=repo, check=True)
    subprocess.run(["git", "commit", "-qm", "c"], cwd=repo, check=True)
    if tag:
        subprocess.run(["git", "tag", tag], cwd=repo, check=True)
    return subprocess.run(["git", "rev-parse", "HEAD"], cwd=repo, check=True, capture_output=True,
                          text=True).stdout.strip()


def _call(tmp_path: Path, source: tuple[Path, str], caller: str, called: dict[str, str] | None = None,
          *, runner: dict[str, object] | None = None, **trigger: object) -> RunResult:
    """Run ``caller`` (written as caller.yml) after committing ``called`` (path -> text) into the
    source repository; the run's commit is that one."""
    repo, sha = source
    if called:
        sha = _commit(repo, {f".github/workflows/{name}": text for name, text in called.items()})
    path = tmp_path / "caller.yml"
    path.write_text(textwrap.dedent(caller).replace("CHECKOUT", CHECKOUT))
    fields: dict[str, object] = {"event_name": "push", "repository": "acme/widget", "sha": sha,
                                 "ref": "refs/heads/main"}
    fields.update(trigger)
    return run_workflow(path, Trigger(**fields),  # type: ignore[arg-type]
                        Runner(root=tmp_path / f"runner-{len(list(tmp_path.glob('runner-*')))}", source=repo,
                               **(runner or {})))  # type: ignore[arg-type]


def _digest(value: str) -> str:
    return hashlib.sha256(value.encode()).hexdigest()[:16]


CALLED = """
on:
  workflow_call:
    inputs:
      name: {type: string, required: true}
      flag: {type: boolean, default: true}
      count: {type: number, default: 3}
      quiet: {type: boolean}
      note: {type: string}
    secrets:
      TOKEN: {required: true}
      OPTIONAL:
    outputs:
      greeting:
        value: ${{ jobs.greet.outputs.greeting }}
      greet_result:
        value: ${{ jobs.greet.result }}
env:
  CALLED_LEVEL: called-${{ inputs.name }}
jobs:
  greet:
    runs-on: ubuntu-24.04
    outputs:
      greeting: ${{ steps.g.outputs.greeting }}
      seen: ${{ steps.g.outputs.seen }}
      inputs: ${{ steps.g.outputs.inputs }}
    steps:
      - uses: CHECKOUT
      - id: g
        shell: bash
        env:
          INPUTS: ${{ toJSON(inputs) }}
          TYPED: ${{ inputs.flag == true && inputs.count > 2 && !inputs.quiet }}
          TOKEN: ${{ secrets.TOKEN }}
          OPTIONAL: ${{ secrets.OPTIONAL }}
          OTHER: ${{ secrets.OTHER }}
          CALLER_ENV: ${{ env.WORKFLOW_LEVEL }}
        run: |
          test "$(cat hello.txt)" = hello
          test "$TYPED" = true
          test "$CALLED_LEVEL" = "called-${{ inputs.name }}"
          test -z "${WORKFLOW_LEVEL:-}" && test -z "$CALLER_ENV"
          h() { if [ -n "$1" ]; then printf %s "$1" | sha256sum | cut -c1-16; else echo -; fi; }
          echo "seen=TOKEN:$(h "$TOKEN") OPTIONAL:$(h "$OPTIONAL") OTHER:$(h "$OTHER")" >> "$GITHUB_OUTPUT"
          echo "inputs=$(jq -c . <<<"$INPUTS")" >> "$GITHUB_OUTPUT"
          echo "greeting=hi ${{ inputs.name }} x${{ inputs.count }}" >> "$GITHUB_OUTPUT"
          echo "called workflow sees ${{ github.workflow_ref }} at ${{ github.sha }}" >> "$GITHUB_STEP_SUMMARY"
  after:
    needs: greet
    runs-on: ubuntu-24.04
    steps:
      - run: test "${{ needs.greet.outputs.greeting }}" = "hi ${{ inputs.name }} x${{ inputs.count }}"
  never:
    if: ${{ inputs.quiet }}
    runs-on: ubuntu-24.04
    steps:
      - run: exit 1
"""


def test_a_local_reusable_workflow_gets_typed_inputs_passed_secrets_and_gives_outputs(
        tmp_path: Path, source: tuple[Path, str]) -> None:
    run = _call(tmp_path, source, """
        on: push
        env:
          WORKFLOW_LEVEL: caller
        jobs:
          call:
            uses: ./.github/workflows/called.yml
            with:
              name: ${{ github.ref_name }}
              count: 5
              quiet: ${{ github.ref_name == 'nope' }}
            secrets:
              TOKEN: ${{ secrets.TOKEN }}
          inherit:
            uses: ./.github/workflows/called.yml
            with: {name: inherited}
            secrets: inherit
          use:
            needs: [call, inherit]
            runs-on: ubuntu-24.04
            steps:
              - env:
                  G: ${{ needs.call.outputs.greeting }}
                  R: ${{ needs.call.outputs.greet_result }}
                  I: ${{ needs.inherit.outputs.greeting }}
                run: test "$G" = "hi main x5" && test "$R" = success && test "$I" = "hi inherited x3"
        """, {"called.yml": CALLED.replace("CHECKOUT", CHECKOUT)},
        secrets={"TOKEN": "tok-123456", "OTHER": "other-7890", "OPTIONAL": "opt-0000"})
    assert run.order == ["call", "call/greet", "call/never", "call/after",
                         "inherit", "inherit/greet", "inherit/never", "inherit/after", "use"], run.describe()
    assert {j: run.jobs[j].result for j in run.order} == {
        "call": "success", "call/greet": "success", "call/after": "success", "call/never": "skipped",
        "inherit": "success", "inherit/greet": "success", "inherit/after": "success", "inherit/never": "skipped",
        "use": "success"}, run.describe()
    # The caller's entry: the workflow_call outputs, evaluated from the called jobs.
    assert run.jobs["call"].outputs == {"greeting": "hi main x5", "greet_result": "success"}
    # Typed inputs, defaults applied (flag, note: unset -> '', quiet: a boolean expression).
    assert json.loads(run.jobs["call/greet"].outputs["inputs"]) == {
        "name": "main", "flag": True, "count": 5, "quiet": False, "note": ""}
    assert json.loads(run.jobs["inherit/greet"].outputs["inputs"])["count"] == 3
    # Only what the caller passed; `inherit`: every secret of the caller.
    assert run.jobs["call/greet"].outputs["seen"] == f"TOKEN:{_digest('tok-123456')} OPTIONAL:- OTHER:-"
    assert run.jobs["inherit/greet"].outputs["seen"] == (
        f"TOKEN:{_digest('tok-123456')} OPTIONAL:{_digest('opt-0000')} OTHER:{_digest('other-7890')}")
    # The called workflow's github context is the caller's (its workflow_ref, the run's commit).
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=source[0], check=True, capture_output=True,
                          text=True).stdout.strip()
    assert run.summary.count(f"called workflow sees acme/widget/.github/workflows/caller.yml@refs/heads/main "
                             f"at {head}\n") == 2
    assert run.secret_leaks == [] and run.unresolved == []
    assert ("call (on.workflow_call.outputs): jobs.greet.outputs.greeting", "hi main x5") in run.references


BUILD = """
on:
  workflow_call:
    inputs:
      builder-sha: {type: string, required: true}
    outputs:
      built:
        value: ${{ jobs.build.outputs.built }}
permissions: {}
jobs:
  build:
    runs-on: ubuntu-24.04
    permissions: {contents: read, id-token: write}
    outputs:
      built: ${{ steps.b.outputs.built }}
    steps:
      - uses: CHECKOUT
      - uses: CHECKOUT
        with: {repository: acme/builder, ref: "${{ inputs.builder-sha }}", path: builder}
      - id: b
        shell: bash
        run: |
          test "$(cat hello.txt)" = hello
          curl -fsS -H "Authorization: bearer $ACTIONS_ID_TOKEN_REQUEST_TOKEN" \\
            "$ACTIONS_ID_TOKEN_REQUEST_URL&audience=sigstore" >/dev/null
          echo "built=$(cat builder/builder.txt) $(git -C builder rev-parse HEAD)" >> "$GITHUB_OUTPUT"
  publish:
    needs: build
    runs-on: ubuntu-24.04
    permissions: {packages: write}
    steps:
      - uses: LOGIN
        with: {registry: ghcr.io, username: "${{ github.actor }}", password: "${{ github.token }}"}
      - run: test -z "${ACTIONS_ID_TOKEN_REQUEST_URL:-}"
"""


@pytest.fixture
def builder(tmp_path: Path) -> tuple[Path, str, str]:
    """acme/builder: the reusable workflow at v1 (tagged), then main moves on to v2."""
    repo = tmp_path / "builder"
    files = {".github/workflows/build.yml": BUILD.replace("CHECKOUT", CHECKOUT).replace("LOGIN", LOGIN)}
    first = _commit(repo, {**files, "builder.txt": "v1\n"}, tag="v1")
    second = _commit(repo, {"builder.txt": "v2\n"})
    return repo, first, second


def test_a_reusable_workflow_of_another_repository_runs_at_the_ref_it_is_called_by(
        tmp_path: Path, source: tuple[Path, str], builder: tuple[Path, str, str]) -> None:
    repo, v1, main = builder
    minted: list[dict[str, str]] = []
    tokens: list[dict[str, str]] = []

    def mint(audience: str, claims: object) -> str:
        minted.append(dict(claims))  # type: ignore[call-overload]
        return "jwt"

    def github_token(repository: str, permissions: Mapping[str, str]) -> str:
        tokens.append(dict(permissions, repository=repository))
        return f"ghs_{len(tokens)}"

    run = _call(tmp_path, source, f"""
        on: push
        permissions: {{}}
        jobs:
          by_sha:
            uses: acme/builder/.github/workflows/build.yml@{v1}
            permissions: {{contents: read, id-token: write, packages: write}}
            with: {{builder-sha: {v1}}}
          by_branch:
            uses: acme/builder/.github/workflows/build.yml@main
            permissions: {{contents: read, id-token: write, packages: write}}
            with: {{builder-sha: main}}
          by_tag:
            uses: acme/builder/.github/workflows/build.yml@v1
            permissions: {{contents: read, id-token: write, packages: write}}
            with: {{builder-sha: v1}}
          report:
            needs: [by_sha, by_branch, by_tag]
            runs-on: ubuntu-24.04
            permissions: {{}}
            steps:
              - run: test "${{{{ needs.by_sha.outputs.built }}}}" = "v1 {v1}"
        """, runner={"repositories": {"acme/builder": repo}, "oidc": mint, "github_token": github_token,
                     "ghcr": ("127.0.0.1:5057", "stand-in", "pw-2")})
    assert {j: run.jobs[j].result for j in run.order} == {
        "by_sha": "success", "by_sha/build": "success", "by_sha/publish": "success",
        "by_branch": "success", "by_branch/build": "success", "by_branch/publish": "success",
        "by_tag": "success", "by_tag/build": "success", "by_tag/publish": "success",
        "report": "success"}, run.describe()
    # The builder checked out at the commit it was called at (the caller's repository beside it).
    assert run.jobs["by_sha"].outputs == {"built": f"v1 {v1}"}
    assert run.jobs["by_branch"].outputs == {"built": f"v2 {main}"}
    assert run.jobs["by_tag"].outputs == {"built": f"v1 {v1}"}
    # Each called job's token: its own permissions, within the caller's (id-token is no token permission).
    assert tokens.count({"contents": "read", "repository": "acme/widget"}) == 3
    assert tokens.count({"packages": "write", "repository": "acme/widget"}) == 3
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=source[0], check=True, capture_output=True,
                          text=True).stdout.strip()
    by_ref = {c["job_workflow_ref"]: c for c in minted}
    assert set(by_ref) == {f"acme/builder/.github/workflows/build.yml@{v1}",
                           "acme/builder/.github/workflows/build.yml@main", "acme/builder/.github/workflows/build.yml@v1"}
    for ref, sha in ((v1, v1), ("main", main), ("v1", v1)):
        claims = by_ref[f"acme/builder/.github/workflows/build.yml@{ref}"]
        # GitHub's claims for a called workflow's job: the called file and its commit, the caller's run.
        assert claims["job_workflow_sha"] == sha
        assert claims["workflow_ref"] == "acme/widget/.github/workflows/caller.yml@refs/heads/main"
        assert (claims["workflow_sha"], claims["sha"], claims["repository"], claims["ref"]) == (
            head, head, "acme/widget", "refs/heads/main")
        assert claims["sub"] == "repo:acme/widget:ref:refs/heads/main"


def test_the_local_issuer_mints_a_called_jobs_token_as_github_does(monkeypatch: pytest.MonkeyPatch) -> None:
    """local_issuer builds the GitHubJob whose claims are the ones the job was given: the called
    file, repository, ref and commit; the caller's file as workflow_ref."""
    from pipeline.local import sigstore as sigstore_local
    from tests.workflows.harness import _oidc_claims, _Workflow, local_issuer

    jobs: list[sigstore_local.GitHubJob] = []

    def mint_github_token(instance: object, job: sigstore_local.GitHubJob) -> str:
        jobs.append(job)
        return "jwt"

    monkeypatch.setattr(sigstore_local, "mint_github_token", mint_github_token)
    github = {"repository": "acme/widget", "ref": "refs/tags/v1.0.0", "sha": "a" * 40, "event_name": "push",
              "workflow_ref": "acme/widget/.github/workflows/release.yml@refs/tags/v1.0.0", "run_id": "7",
              "run_attempt": "1"}
    called = _oidc_claims(github, _Workflow("benchseal/benchseal/.github/workflows/build.yml@v2.1.0", "b" * 40))
    top = _oidc_claims(github, _Workflow(github["workflow_ref"], "a" * 40))
    mint = local_issuer(object())
    assert mint("sigstore", called) == "jwt" and mint("sigstore", top) == "jwt"
    job, own = jobs
    assert (job.workflow_file, job.workflow_repository, job.workflow_ref, job.workflow_sha,
            job.caller_workflow_file) == ("build.yml", "benchseal/benchseal", "v2.1.0", "b" * 40, "release.yml")
    assert job.identity == "https://github.com/benchseal/benchseal/.github/workflows/build.yml@v2.1.0"
    assert {k: v for k, v in job.claims().items() if k in called} == {k: v for k, v in called.items() if k != "sub"}
    assert own.identity == "https://github.com/acme/widget/.github/workflows/release.yml@refs/tags/v1.0.0"
    assert own.claims()["job_workflow_sha"] == own.claims()["workflow_sha"] == "a" * 40


STRICT = """
on:
  workflow_call:
    inputs:
      name: {type: string, required: true}
      flag: {type: boolean, default: false}
      count: {type: number, default: 1}
    secrets:
      TOKEN: {required: true}
      OPTIONAL: {required: false}
jobs:
  work:
    runs-on: ubuntu-24.04
    permissions: {contents: read}
    steps:
      - run: echo ran >> "$GITHUB_STEP_SUMMARY"
  sign:
    runs-on: ubuntu-24.04
    permissions: {id-token: ID_TOKEN}
    steps:
      - run: echo ran >> "$GITHUB_STEP_SUMMARY"
  push:
    runs-on: ubuntu-24.04
    permissions: {packages: PACKAGES}
    steps:
      - run: echo ran >> "$GITHUB_STEP_SUMMARY"
"""


@pytest.mark.parametrize(("call", "called", "message"), [
    ("with: {name: x, bogus: 1}\n  secrets: {TOKEN: t}", {},
     "Invalid input, bogus is not defined in the referenced workflow."),
    ("with: {flag: true}\n  secrets: {TOKEN: t}", {}, "Input name is required, but not provided while calling."),
    ("with: {name: x, flag: 'true'}\n  secrets: {TOKEN: t}", {},
     "input flag (type: boolean): Unexpected value 'true'"),
    ("with: {name: x, count: '${{ github.ref_name }}'}\n  secrets: {TOKEN: t}", {},
     "input count (type: number): Unexpected value 'main'"),
    ("with: {name: x}\n  secrets: {TOKEN: t, NOPE: n}", {},
     "Invalid secret, NOPE is not defined in the referenced workflow."),
    ("with: {name: x}\n  secrets: {OPTIONAL: o}", {}, "Secret TOKEN is required, but not provided while calling."),
    ("with: {name: x}\n  secrets: inherit", {}, "Secret TOKEN is required, but not provided while calling."),
    ("with: {name: x}\n  secrets: {TOKEN: t}", {"PACKAGES": "write"},
     "The nested job 'push' is requesting 'packages: write', but is only allowed 'packages: read'."),
    ("with: {name: x}\n  secrets: {TOKEN: t}", {"ID_TOKEN": "write"},
     "The nested job 'sign' is requesting 'id-token: write', but is only allowed 'id-token: none'."),
])
def test_github_refuses_a_bad_call_before_any_job_runs(tmp_path: Path, source: tuple[Path, str], call: str,
                                                      called: dict[str, str], message: str) -> None:
    text = STRICT.replace("ID_TOKEN", called.get("ID_TOKEN", "none")).replace("PACKAGES", called.get("PACKAGES", "read"))
    caller = ("on: push\njobs:\n"
              "  first:\n    runs-on: ubuntu-24.04\n    permissions: {}\n    steps:\n"
              "      - run: echo first ran >> \"$GITHUB_STEP_SUMMARY\"\n"
              "  call:\n    uses: ./.github/workflows/strict.yml\n    needs: first\n"
              "    permissions: {contents: read, packages: read}\n"
              f"    {call.replace(chr(10), chr(10) + '  ')}\n")
    run = _call(tmp_path, source, caller, {"strict.yml": text})
    assert run.jobs["call"].result == "failure" and run.conclusion == "failure"
    (note,) = run.jobs["call"].notes
    assert note.endswith(message), note
    # Nothing ran: not the called jobs, not even the caller workflow's other jobs.
    assert run.order == ["first", "call"] and run.jobs["first"].result == "skipped"
    assert run.summary == "" and not (run.run_dir / "first-0").exists()  # type: ignore[operator]


def test_an_allowed_call_of_the_strict_workflow_runs(tmp_path: Path, source: tuple[Path, str]) -> None:
    """The counterpart of the refusals: the same caller, all within the rules."""
    run = _call(tmp_path, source, """
        on: push
        permissions: {contents: read, packages: read}
        jobs:
          call:
            uses: ./.github/workflows/strict.yml
            with: {name: x, flag: true, count: 2.5}
            secrets: {TOKEN: t}
        """, {"strict.yml": STRICT.replace("ID_TOKEN", "none").replace("PACKAGES", "read")})
    assert [run.jobs[j].result for j in run.order] == ["success"] * 4, run.describe()
    assert run.summary == "ran\n" * 3


def test_an_input_built_from_needs_is_checked_when_the_caller_starts(tmp_path: Path,
                                                                    source: tuple[Path, str]) -> None:
    run = _call(tmp_path, source, """
        on: push
        permissions: {}
        jobs:
          first:
            runs-on: ubuntu-24.04
            outputs:
              flag: ${{ steps.f.outputs.flag }}
            steps:
              - id: f
                run: echo flag=true >> "$GITHUB_OUTPUT"
          call:
            needs: first
            uses: ./.github/workflows/strict.yml
            with: {name: x, flag: "${{ needs.first.outputs.flag }}"}
            secrets: {TOKEN: t}
          fixed:
            needs: first
            uses: ./.github/workflows/strict.yml
            with: {name: x, flag: "${{ needs.first.outputs.flag == 'true' }}"}
            secrets: {TOKEN: t}
          after:
            needs: call
            runs-on: ubuntu-24.04
            steps:
              - run: "true"
        """, {"strict.yml": STRICT.replace("ID_TOKEN", "none").replace("PACKAGES", "none")
              .replace("permissions: {contents: read}", "permissions: {}")})
    # A job output is a string: a boolean input refuses it; the comparison is a boolean.
    assert run.jobs["first"].result == "success"
    assert run.jobs["call"].result == "failure"
    assert run.jobs["call"].notes == ["GitHub refused to call ./.github/workflows/strict.yml: "
                                      "input flag (type: boolean): Unexpected value 'true'"]
    assert not any(j.startswith("call/") for j in run.order)
    assert run.jobs["after"].result == "skipped"
    assert [run.jobs[f"fixed/{j}"].result for j in ("work", "sign", "push")] == ["success"] * 3, run.describe()


def test_a_failing_called_job_fails_the_caller(tmp_path: Path, source: tuple[Path, str]) -> None:
    run = _call(tmp_path, source, """
        on: push
        permissions: {}
        jobs:
          call:
            uses: ./.github/workflows/flaky.yml
          next:
            needs: call
            runs-on: ubuntu-24.04
            steps:
              - run: echo never
          report:
            needs: call
            if: ${{ always() }}
            runs-on: ubuntu-24.04
            steps:
              - run: echo "call=${{ needs.call.result }} out=${{ needs.call.outputs.partial }}" >> "$GITHUB_STEP_SUMMARY"
        """, {"flaky.yml": """
        on:
          workflow_call:
            outputs:
              partial: {value: "${{ jobs.ok.outputs.word }}"}
        jobs:
          ok:
            runs-on: ubuntu-24.04
            outputs: {word: "${{ steps.w.outputs.word }}"}
            steps:
              - id: w
                run: echo word=fine >> "$GITHUB_OUTPUT"
          bad:
            needs: ok
            runs-on: ubuntu-24.04
            steps:
              - run: exit 4
          after_bad:
            needs: bad
            runs-on: ubuntu-24.04
            steps:
              - run: echo never
        """})
    assert {j: run.jobs[j].result for j in run.order} == {
        "call": "failure", "call/ok": "success", "call/bad": "failure", "call/after_bad": "skipped",
        "next": "skipped", "report": "success"}
    assert "exit code 4" in run.jobs["call/bad"].log
    assert "call=failure out=fine" in run.summary


def test_checkout_takes_a_path_in_the_workspace_and_a_known_repository(
        tmp_path: Path, source: tuple[Path, str], builder: tuple[Path, str, str]) -> None:
    repo, v1, main = builder
    run = _call(tmp_path, source, """
        on: push
        jobs:
          co:
            runs-on: ubuntu-24.04
            steps:
              - uses: CHECKOUT
                with: {path: sub/own}
              - uses: CHECKOUT
                with: {repository: acme/builder, path: b}
              - uses: CHECKOUT
                with: {repository: acme/builder, ref: v1, path: b1}
              - id: files
                shell: bash
                run: |
                  { echo "own=$(cat sub/own/hello.txt)"; echo "b=$(cat b/builder.txt)"; echo "b1=$(cat b1/builder.txt)"; } \\
                    >> "$GITHUB_OUTPUT"
                  test ! -e hello.txt
              - uses: CHECKOUT
                with: {path: ../outside}
          unknown:
            runs-on: ubuntu-24.04
            steps:
              - uses: CHECKOUT
                with: {repository: acme/nope}
        """, runner={"repositories": {"acme/builder": repo}})
    co = run.jobs["co"]
    # Another repository without ref: its default branch; with ref: that tag.
    assert co.step("files").outputs == {"own": "hello", "b": "v2", "b1": "v1"}, run.describe()
    assert f"-> {main} in {run.run_dir}/co-0/workspace/b\n" in co.log and f"-> {v1} in " in co.log
    assert co.legs[0][-1].conclusion == "failure" and "is not under" in co.legs[0][-1].log
    assert not (run.run_dir / "co-0" / "outside").exists()  # type: ignore[operator]
    assert run.jobs["unknown"].result == "failure" and "'acme/nope' not found" in run.jobs["unknown"].log


@pytest.mark.parametrize(("uses", "extra", "message"), [
    ("acme/other/.github/workflows/build.yml@v1", "", "repository acme/other is not in Runner.repositories"),
    ("acme/builder/.github/workflows/missing.yml@v1", "", r"no \.github/workflows/missing\.yml in acme/builder"),
    ("acme/builder/.github/workflows/build.yml@v9", "", "'v9' is no commit, tag or branch of acme/builder"),
    ("./.github/workflows/plain.yml", "", "has no `on: workflow_call`"),
    ("./.github/workflows/nested.yml", "", "a called workflow calling another is not implemented"),
    ("./.github/workflows/nested.yml", "\n    runs-on: ubuntu-24.04", r"keys the harness does not implement: \['runs-on'\]"),
    ("./.github/workflows/plain.yml@main", "", "is neither"),
    ("./.github/workflows/stated.yml", "", "states permissions but its caller call states none"),
])
def test_a_call_the_harness_cannot_run_fails_loudly(tmp_path: Path, source: tuple[Path, str],
                                                    builder: tuple[Path, str, str], uses: str, extra: str,
                                                    message: str) -> None:
    called = {
        "plain.yml": "on: push\njobs:\n  a:\n    runs-on: ubuntu-24.04\n    steps:\n      - run: 'true'\n",
        "nested.yml": "on: workflow_call\njobs:\n  a:\n    uses: ./.github/workflows/plain.yml\n",
        "stated.yml": ("on: {workflow_call: {}}\njobs:\n  a:\n    runs-on: ubuntu-24.04\n    permissions: {}\n"
                       "    steps:\n      - run: 'true'\n"),
    }
    with pytest.raises(HarnessError, match=message):
        _call(tmp_path, source, f"on: push\njobs:\n  call:\n    uses: {uses}{extra}\n", called,
              runner={"repositories": {"acme/builder": builder[0]}})


COSIGN_INSTALLER = "sigstore/cosign-installer@6f9f17788090df1f26f669e9d70d6ae9567deba6"


def test_the_cosign_installer_stands_in_only_for_the_machines_own_release(tmp_path: Path,
                                                                          source: tuple[Path, str]) -> None:
    run = _run(tmp_path, source, f"""
        on: push
        jobs:
          c:
            runs-on: ubuntu-24.04
            steps:
              - uses: {COSIGN_INSTALLER}
                with: {{cosign-release: v3.1.1}}
              - id: found
                shell: bash
                run: echo "cosign=$(command -v cosign)" >> "$GITHUB_OUTPUT"
              - uses: {COSIGN_INSTALLER}
                with: {{cosign-release: v2.5.0}}
        """)
    steps = run.jobs["c"].legs[0]
    assert [s.conclusion for s in steps] == ["success", "success", "failure"], run.describe()
    assert run.jobs["c"].step("found").outputs["cosign"].endswith("/cosign-bin/cosign")
    assert re.search(r"cosign-release v2\.5\.0, this machine has v3\.1\.[0-9]+", steps[2].log), steps[2].log
