"""The Actions harness itself (tests/workflows/harness.py) on small workflows: what it runs
as Actions does, and every way it refuses to pass silently. No Docker needed."""

from __future__ import annotations

import subprocess
import textwrap
from pathlib import Path

import pytest

from tests.workflows.harness import ACTIONS, HarnessError, Runner, Trigger, _read_key_values, run_workflow

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
                            "actions/download-artifact", "docker/login-action"}
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

    def mint(repository: str, permissions: dict[str, str]) -> str:
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
