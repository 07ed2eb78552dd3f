"""``benchseal doctor adopter|infra``: a production repository checked against what the chain needs.

Two sources, each what it alone can say: the repository's checkout (its caller workflow calls
benchseal's reusable workflow pinned by a 40-hex commit: GitHub's API subset we use has no
file contents) and the GitHub API (the workflow is registered and active, the variables and
secrets of docs/github.md step 6 exist (names only: GitHub never returns a secret's value), a
self-hosted runner with the label benchseal's benchmark.yml asks for is registered, the token's
scopes when GitHub reports them). Every finding is one line with its fix (``pipeline.core.doctor``).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import github
import requests

from pipeline.core.doctor import SETTINGS, Finding, Side, missing, ok, unknown
from pipeline.core.errors import Error
from pipeline.core.paths import REPO_ROOT
from pipeline.core.yamlfile import load_yaml

# docs/github.md step 6: what each repository must define (one home: pipeline.core.doctor.SETTINGS, which init prints).
REQUIRED = {side: {kind + "s": tuple(s.name for s in settings if s.kind == kind) for kind in ("variable", "secret")}
            for side, settings in SETTINGS.items()}
REUSABLE = {"adopter": "release.yml", "infra": "benchmark.yml"}
FIX_CALLER = {"adopter": "write .github/workflows/benchseal.yml with `benchseal init` (docs/github.md step 2)",
              "infra": "write .github/workflows/benchmark.yml with `benchseal init --infra` (docs/github.md step 3)"}
# What each listing needs from the doctor's own token, for the fix of an unreadable one.
_NEEDS = {"variables": "Variables: Read", "secrets": "Secrets: Read", "runners": "Administration: Read"}
_COMMIT = re.compile(r"\A[0-9a-f]{40}\Z")
_PAGE = 100


def _uses_pattern(reusable: str) -> re.Pattern[str]:
    return re.compile(rf"\A[A-Za-z0-9_.-]+/[A-Za-z0-9_.-]+/\.github/workflows/{re.escape(reusable)}@(?P<ref>.+)\Z")


def find_caller(checkout: Path, reusable: str) -> tuple[str, str] | None:
    """(workflow path, ref) of the first job in .github/workflows/ that calls benchseal's ``reusable``."""
    pattern = _uses_pattern(reusable)
    folder = checkout / ".github" / "workflows"
    files = sorted(p for p in folder.glob("*") if p.suffix in (".yml", ".yaml")) if folder.is_dir() else []
    for path in files:
        try:
            data = load_yaml(path, what="workflow", max_bytes=1 << 20)
        except Error:
            continue  # another workflow of the repository that does not parse is not ours to judge
        jobs = data.get("jobs") if isinstance(data, dict) else None
        for job in (jobs or {}).values() if isinstance(jobs, dict) else ():
            uses = job.get("uses") if isinstance(job, dict) else None
            if isinstance(uses, str) and (m := pattern.match(uses.strip())):
                return f".github/workflows/{path.name}", m.group("ref")
    return None


def runner_labels(workflow: Path = REPO_ROOT / ".github" / "workflows" / "benchmark.yml") -> set[str]:
    """The labels benchseal's reusable benchmark.yml's jobs ask for (``runs-on``), beyond ``self-hosted``."""
    data = load_yaml(workflow, what="workflow", max_bytes=1 << 20)
    labels: set[str] = set()
    for job in (data.get("jobs") or {}).values():
        runs_on = job.get("runs-on") if isinstance(job, dict) else None
        labels.update([runs_on] if isinstance(runs_on, str) else runs_on or [])
    return labels - {"self-hosted"}


def caller_findings(side: Side, checkout: Path) -> tuple[list[Finding], str | None]:
    found = find_caller(checkout, REUSABLE[side])
    if found is None:
        return [missing(side, "caller workflow", f"no workflow in {checkout}/.github/workflows calls benchseal's "
                        f"{REUSABLE[side]}", FIX_CALLER[side])], None
    path, ref = found
    out = [ok(side, "caller workflow", f"{path} calls benchseal's {REUSABLE[side]}")]
    if _COMMIT.match(ref):
        out.append(ok(side, "pinned by commit", ref))
    else:
        out.append(missing(side, "pinned by commit", f"{path} uses {REUSABLE[side]}@{ref}",
                           f"pin it to the 40-hex benchseal commit you adopt ({REUSABLE[side]}@<commit>)"))
    return out, path


class _Api:
    def __init__(self, client: github.Github, repository: str) -> None:
        self._requester = client.requester
        self.root = f"/repos/{repository}"

    def get(self, path: str, **params: Any) -> tuple[dict[str, Any], Any]:
        return self._requester.requestJsonAndCheck("GET", self.root + path, parameters=params or None)

    def names(self, path: str, key: str, keep: Callable[[dict[str, Any]], bool] = lambda _: True) -> set[str]:
        found: set[str] = set()
        page = 1
        while True:
            _, data = self.get(path, per_page=_PAGE, page=page)
            items = data.get(key) or []
            found.update(str(item["name"]) for item in items if keep(item))
            if len(items) < _PAGE:
                return found
            page += 1


def _unreadable(side: Side, check: str, what: str, repository: str, exc: github.GithubException) -> Finding:
    page = "Actions -> Runners" if what == "runners" else "Secrets and variables -> Actions"
    return unknown(side, check, f"the token cannot list {repository}'s {what} (HTTP {exc.status})",
                   f"give the token you run doctor with {_NEEDS[what]} on {repository}, or check Settings -> "
                   f"{page} by hand")


def api_findings(side: Side, repository: str, client: github.Github, caller: str | None) -> list[Finding]:
    api = _Api(client, repository)
    try:
        headers, _ = api.get("")
    except github.GithubException as exc:
        return [missing(side, "repository", f"{repository}: HTTP {exc.status}",
                        f"check the name, and that GITHUB_TOKEN can read {repository}")]
    out = [ok(side, "repository", repository)]
    scopes = {k.lower(): v for k, v in headers.items()}.get("x-oauth-scopes")
    out.append(ok(side, "token scopes", scopes or "(none)") if scopes is not None else
               unknown(side, "token scopes", "not reported (a fine-grained token or GITHUB_TOKEN)",
                       "compare its permissions with docs/github.md step 5 in the token's settings"))
    if caller is not None:
        try:
            active = api.names("/actions/workflows", "workflows", lambda w: w.get("state") == "active"
                               and w.get("path") == caller)
            out.append(ok(side, "workflow active on GitHub", caller) if active else
                       missing(side, "workflow active on GitHub", f"{caller} is not an active workflow of {repository}",
                               "commit and push it to the default branch, and enable it under Actions"))
        except github.GithubException as exc:
            out.append(unknown(side, "workflow active on GitHub", f"HTTP {exc.status}",
                               f"give the token Actions: Read on {repository}"))
    for kind in ("variables", "secrets"):
        required = REQUIRED[side][kind]
        if not required:
            continue
        try:
            have = api.names(f"/actions/{kind}", kind)
        except github.GithubException as exc:
            out.append(_unreadable(side, kind, kind, repository, exc))
            continue
        for name in required:
            singular = kind[:-1]
            out.append(ok(side, f"{singular} {name}") if name in have else
                       missing(side, f"{singular} {name}", f"not set on {repository}",
                               f"set the repository {singular} {name} (docs/github.md step 6)"))
    if side == "infra":
        out.append(_runner_finding(api, repository))
    return out


def _runner_finding(api: _Api, repository: str) -> Finding:
    labels = runner_labels()
    check = f"self-hosted runner labelled {', '.join(sorted(labels))}"
    try:
        _, data = api.get("/actions/runners", per_page=_PAGE)
    except github.GithubException as exc:
        return _unreadable("infra", check, "runners", repository, exc)
    runners = data.get("runners") or []
    matching = [r for r in runners if labels <= {str(label.get("name")) for label in r.get("labels") or []}]
    online = [r for r in matching if r.get("status") == "online"]
    fix = (f"register a runner on {repository} as the runner user with `./config.sh --labels "
           f"{','.join(sorted(labels))}` (docs/host.md step 3.1)")
    if online:
        return ok("infra", check, ", ".join(sorted(str(r["name"]) for r in online)))
    if matching:
        return missing("infra", check, f"{len(matching)} registered, none online",
                       "start it on the infra host (`./svc.sh start` in the runner's directory)")
    return missing("infra", check, f"none of the {len(runners)} runners of {repository} has the label", fix)


def check_repository(side: Side, repository: str, checkout: Path, client: github.Github) -> list[Finding]:
    found, caller = caller_findings(side, checkout)
    try:
        return found + api_findings(side, repository, client, caller)
    except requests.exceptions.RequestException as exc:  # no answer at all (after the transport's retries)
        return [*found, missing(side, "GitHub API", f"{client.requester.base_url}: no answer ({type(exc).__name__})",
                                "check GITHUB_API_URL (GitHub Enterprise: https://HOST/api/v3) and the network")]
