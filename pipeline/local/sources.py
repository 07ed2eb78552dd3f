"""The local world's repositories: who releases, who builds, who benchmarks.

``benchseal release vX --local`` plays GitHub's three parties on this machine, as issue 25's
adopter path has them:

* the **source** (the adopter): with ``--project`` naming a project of benchseal's own checkout
  (``examples/hello-agent``) or a directory in no git checkout at all, that directory is released
  as ITS OWN repository, ``benchseal-examples/<directory name>``: a git repository under the
  state dir (``<home>/sources/<name>``) whose one commit's tree is the directory (for an example
  of this checkout, the tree HEAD holds: never the work tree, as the wheel is built from the
  commit), tagged with the release tag. Same tree, same commit (fixed author, committer, dates and
  message), so a re-run reuses it and the images. A project in another git checkout is released
  from that checkout as it is (build's rule), named by ``--repository``, else ``$GITHUB_REPOSITORY``,
  else its git remote ``origin`` (``https://HOST/OWNER/NAME(.git)`` or ``git@HOST:OWNER/NAME(.git)``),
  else ``local/<its directory's name>``: the name and where it came from are stated before anything
  runs (``adopter_repository``). Without ``--project``, benchseal's own checkout is the source
  (``$GITHUB_REPOSITORY`` or ``local/benchseal``);
* the **builder**: benchseal's reusable workflows, ``local/benchseal`` at ``refs/heads/main``
  (release.yml signs the images, benchmark.yml seals the evidence) run at this checkout's HEAD.
  An exact branch ref, not a commit, because the infra policy that pins it (policies/infra.yaml)
  is a file of this checkout and cannot name the commit it is part of;
* the **infra** repository: ``local/bench-infra`` on ``refs/heads/main``, whose caller workflow
  runs the builder's benchmark.yml (its policy is this checkout's policies/infra.yaml).

Nothing here touches the user's work tree: the repositories are made under the state dir.
"""

from __future__ import annotations

import fcntl
import io
import os
import re
import shutil
import subprocess
import tarfile
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from pipeline.core.contracts import COMMIT_RE, validate_repository
from pipeline.core.errors import InfrastructureError, UsageError
from pipeline.core.paths import REPO_ROOT, state_dir
from pipeline.imaging.images import source_info
from pipeline.verify.policy import BENCHMARK_WORKFLOW, RELEASE_WORKFLOW, Builder

EXAMPLES_OWNER = "benchseal-examples"
BUILDER = Builder(repository="local/benchseal", ref="refs/heads/main")
INFRA_REPOSITORY = "local/bench-infra"
# The identity the local chain signs every source's images with (a policy's ``signer: {builder: ...}``).
LOCAL_BUILDER_SIGNER = f"{BUILDER.repository}/.github/workflows/{RELEASE_WORKFLOW}@{BUILDER.ref}"
INFRA_REF = "refs/heads/main"
# The callers' own workflow files (the adopter's `uses: .../release.yml@REF`, the infra's
# `uses: .../benchmark.yml@REF`): the certificates' Build Config URI.
SOURCE_CALLER_WORKFLOW = RELEASE_WORKFLOW
INFRA_CALLER_WORKFLOW = BENCHMARK_WORKFLOW
# A directory without history has no commit time: 1980-01-01, the earliest a wheel's zip can hold.
_NO_HISTORY_EPOCH = 315532800
# Git as this module runs it: no user or system configuration (hooks, signing, excludes, autocrlf)
# can change the tree or the commit.
_GIT_ENV = {"GIT_CONFIG_GLOBAL": os.devnull, "GIT_CONFIG_NOSYSTEM": "1", "GIT_TERMINAL_PROMPT": "0",
            "LC_ALL": "C"}
_AUTHOR = ("benchseal", "benchseal@benchseal.invalid")


@dataclass(frozen=True)
class LocalSource:
    """The repository a local release is of."""

    repository: str  # OWNER/NAME
    checkout: Path  # the top of its git checkout
    project: Path | None  # its project file (inside ``checkout``), or None: benchseal's own release
    commit: str  # what the release tag points at

    @property
    def own_repository(self) -> bool:
        """True when the source is a repository of its own (not benchseal's checkout)."""
        return self.checkout.resolve() != REPO_ROOT.resolve()


def _git(root: Path, *args: str, check: bool = True, stdin: bytes | None = None,
         env: dict[str, str] | None = None) -> str:
    done = subprocess.run(["git", "-C", str(root), *args], input=stdin, capture_output=True, check=False,
                          env={**os.environ, **_GIT_ENV, **(env or {})}, timeout=120)
    if check and done.returncode != 0:
        raise InfrastructureError(f"git {' '.join(args)} in {root} failed: "
                                  f"{done.stderr.decode(errors='replace').strip()[-400:]}")
    return done.stdout.decode(errors="replace").strip() if done.returncode == 0 else ""


def _toplevel(directory: Path) -> Path | None:
    found = _git(directory, "rev-parse", "--show-toplevel", check=False)
    return Path(found).resolve() if found else None


def builder_commit() -> str:
    """The builder's commit: this checkout's HEAD (what its reusable workflows run as)."""
    commit = _git(REPO_ROOT, "rev-parse", "HEAD", check=False)
    if not COMMIT_RE.match(commit):
        raise UsageError(f"release --local needs benchseal's git checkout with a commit ({REPO_ROOT}): the builder's "
                         "workflows run at its HEAD")
    return commit


def example_repository_name(project: Path) -> str | None:
    """``benchseal-examples/<dir>`` when ``project`` is released as its own repository (an example of
    this checkout, or a directory in no git checkout); None when another checkout holds it (released
    from that checkout) or when it is none of these."""
    directory = project.resolve().parent
    top = _toplevel(directory)
    if top is not None and top != REPO_ROOT.resolve():
        return None
    return validate_repository(f"{EXAMPLES_OWNER}/{directory.name}", "--project (its directory's name)")


def release_repository(project: Path | None, repository: str | None = None) -> str:
    """The repository ``release --local`` releases, without making anything (checked against the
    infra policy before any work)."""
    return release_repository_origin(project, repository)[0]


def release_repository_origin(project: Path | None, repository: str | None = None) -> tuple[str, str]:
    """(OWNER/NAME, where the name came from) of what ``release --local`` releases, without making
    anything. ``repository`` (``--repository``) names an adopter's checkout only: an example's name and
    benchseal's own are fixed."""
    example = example_repository_name(project) if project is not None else None
    top = _toplevel(project.resolve().parent) if project is not None and example is None else None
    if repository is not None and top is None:
        of = example or "benchseal's own checkout"
        raise UsageError(f"--repository: names the repository of a --project in a git checkout of its own; "
                         f"this release is of {of}")
    if example is not None:
        return example, "an example released as its own repository"
    if top is None:
        return local_source(project).repository, "$GITHUB_REPOSITORY" if os.environ.get("GITHUB_REPOSITORY") \
            else "benchseal's own checkout"
    return adopter_repository(top, repository)


def adopter_repository(checkout: Path, repository: str | None = None) -> tuple[str, str]:
    """(OWNER/NAME, where it came from) of an adopter's checkout: ``--repository``, else
    ``$GITHUB_REPOSITORY`` (what a workflow run has), else the git remote ``origin``, else
    ``local/<the directory's name>``."""
    if repository is not None:
        return validate_repository(repository, "--repository"), "--repository"
    environ = os.environ.get("GITHUB_REPOSITORY")
    if environ:
        return validate_repository(environ, "$GITHUB_REPOSITORY"), "$GITHUB_REPOSITORY"
    remote = remote_repository(_git(checkout, "remote", "get-url", "origin", check=False))
    if remote is not None:
        return remote, "git remote origin"
    name = re.sub(r"[^A-Za-z0-9._-]+", "-", checkout.name).strip("-.") or "repository"
    return validate_repository(f"local/{name[:100]}", "the checkout's directory name"), "the directory's name"


_REMOTE_RE = re.compile(r"\A(?:[a-z][a-z0-9+.-]*://[^/]+/|[^/:@]+@[^/:]+:)(?P<path>[^?#]+?)(?:\.git)?/?\Z")


def remote_repository(url: str) -> str | None:
    """OWNER/NAME of a git remote URL (``https://github.com/acme/widget.git``, ``git@github.com:acme/widget``);
    None when the URL names no such pair (a local path, a deeper path)."""
    match = _REMOTE_RE.match(url.strip())
    if match is None:
        return None
    path = match.group("path")
    if path.count("/") != 1:
        return None
    try:
        return validate_repository(path)
    except UsageError:
        return None


def adopter_checkout(project: Path) -> Path:
    """The top of the git checkout holding ``project`` (released from it as it is), without reading its commit:
    a checkout with none yet is refused by the pre-build checks in one line (pipeline.local.precheck)."""
    top = _toplevel(project.resolve().parent)
    if top is None:
        raise UsageError(f"--project: {project} is in no git checkout")
    return top


def local_source(project: Path | None, repository: str | None = None) -> LocalSource:
    """What a local release without making anything is of: benchseal's checkout, or the checkout
    holding ``project`` (another repository, named by :func:`adopter_repository`). For an example
    use :func:`example_repository`."""
    if project is None:
        info = source_info()
        return LocalSource(repository=info.repository, checkout=REPO_ROOT, project=None, commit=info.commit)
    top = _toplevel(project.resolve().parent)
    if top is None:
        raise UsageError(f"--project: {project} is in no git checkout")
    info = source_info(top)
    return LocalSource(repository=adopter_repository(top, repository)[0], checkout=top, project=project.resolve(),
                       commit=info.commit)


def release_source(project: Path | None, tag: str, repository: str | None = None) -> LocalSource:
    """The source of ``release --local``: an example as its own repository (made, idempotently),
    another checkout as it is, or benchseal's own checkout."""
    if project is None or example_repository_name(project) is None:
        return local_source(project, repository)
    return example_repository(project, tag)


def example_repository(project: Path, tag: str) -> LocalSource:
    """``project``'s directory as the repository ``benchseal-examples/<dir>`` under the state dir, its
    one commit tagged ``tag`` and checked out (detached) at it; made again only when its tree changed."""
    project = project.resolve()
    repository = example_repository_name(project)
    if repository is None:
        raise UsageError(f"--project: {project} belongs to another git checkout; it is released from there")
    name = repository.split("/", 1)[1]
    directory = project.parent
    inside = directory.is_relative_to(REPO_ROOT.resolve())
    if inside:
        relative = directory.relative_to(REPO_ROOT.resolve()).as_posix()
        tree = _git(REPO_ROOT, "rev-parse", "--verify", "--quiet", f"HEAD:{relative}", check=False)
        if not tree or _git(REPO_ROOT, "cat-file", "-t", tree, check=False) != "tree":
            raise UsageError(f"--project: {relative} is not in benchseal's HEAD commit: an example is released from "
                             f"the tree HEAD holds (commit it first), never from the work tree")
        if not _git(REPO_ROOT, "rev-parse", "--verify", "--quiet", f"HEAD:{relative}/{project.name}", check=False):
            raise UsageError(f"--project: {relative}/{project.name} is not in benchseal's HEAD commit (commit it first)")
        epoch = int(_git(REPO_ROOT, "log", "-1", "--format=%ct", "HEAD", "--", relative) or _NO_HISTORY_EPOCH)
        content = _git_archive(tree)
    else:
        tree, epoch, content = None, _NO_HISTORY_EPOCH, _directory_archive(directory)
    root = state_dir("sources")
    with _locked(root / ".lock"):
        dest = root / name
        current = _current(dest, tree, project.name) if tree is not None else None
        if current is None:
            current = _make(root, dest, content, epoch, f"{name}: {repository}", expect_tree=tree,
                            project_name=project.name)
        _tag(dest, current, tag)
    return LocalSource(repository=repository, checkout=dest.resolve(), project=dest.resolve() / project.name,
                       commit=current)


def _git_archive(tree: str) -> bytes:
    done = subprocess.run(["git", "-C", str(REPO_ROOT), "archive", "--format=tar", tree], capture_output=True,
                          check=False, env={**os.environ, **_GIT_ENV}, timeout=120)
    if done.returncode != 0:
        raise InfrastructureError(f"git archive {tree} failed: {done.stderr.decode(errors='replace').strip()[-400:]}")
    return done.stdout


def _directory_archive(directory: Path) -> bytes:
    """The directory's regular files and folders as a tar (no links: a repository's tree holds what is here)."""
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for path in sorted(directory.rglob("*")):
            relative = path.relative_to(directory)
            if path.is_symlink() or ".git" in relative.parts or "__pycache__" in relative.parts:
                continue
            if path.is_file():
                info = tarfile.TarInfo(relative.as_posix())
                info.size = path.stat().st_size
                info.mode = 0o755 if os.access(path, os.X_OK) else 0o644
                with path.open("rb") as handle:
                    tar.addfile(info, handle)
    return raw.getvalue()


def _current(dest: Path, tree: str | None, project_name: str) -> str | None:
    """The commit ``dest`` already holds when it is that tree (any tree when ``tree`` is None), with a
    clean work tree and the project file; else None."""
    if not (dest / ".git").is_dir() or _toplevel(dest) != dest.resolve():
        return None
    commit = _git(dest, "rev-parse", "--verify", "--quiet", "refs/heads/main^{commit}", check=False)
    if not commit or (tree is not None and _git(dest, "rev-parse", f"{commit}^{{tree}}", check=False) != tree):
        return None
    if _git(dest, "status", "--porcelain", "--untracked-files=all", check=False) or \
            not (dest / project_name).is_file():
        return None
    return commit


def _make(root: Path, dest: Path, content: bytes, epoch: int, message: str, *, expect_tree: str | None,
          project_name: str) -> str:
    """A repository at ``dest`` whose one commit on main holds ``content`` (a tar): made aside, and
    put in place unless ``dest`` already holds that very commit (same tree, same stamp)."""
    staging = root / f".{dest.name}.{uuid.uuid4().hex}"
    try:
        staging.mkdir()
        _git(staging, "init", "--quiet", "--initial-branch=main")
        with tarfile.open(fileobj=io.BytesIO(content), mode="r:") as tar:
            tar.extractall(staging, filter="data")
        _git(staging, "add", "--all", "--force", ".")
        stamp = f"@{epoch} +0000"
        _git(staging, "commit", "--quiet", "--no-verify", "--allow-empty-message", "-m", message,
             env={"GIT_AUTHOR_NAME": _AUTHOR[0], "GIT_AUTHOR_EMAIL": _AUTHOR[1], "GIT_AUTHOR_DATE": stamp,
                  "GIT_COMMITTER_NAME": _AUTHOR[0], "GIT_COMMITTER_EMAIL": _AUTHOR[1], "GIT_COMMITTER_DATE": stamp})
        commit = _git(staging, "rev-parse", "HEAD")
        made = _git(staging, "rev-parse", "HEAD^{tree}")
        if expect_tree is not None and made != expect_tree:
            raise InfrastructureError(f"the repository made for {dest.name} holds tree {made}, not {expect_tree}")
        if _current(dest, made, project_name) == commit:
            return commit
        if dest.exists():
            retired = root / f".{dest.name}.old.{uuid.uuid4().hex}"
            dest.rename(retired)
            shutil.rmtree(retired, ignore_errors=True)
        staging.rename(dest)
        return commit
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def _tag(dest: Path, commit: str, tag: str) -> None:
    """``tag`` (lightweight) at ``commit``, checked out detached there: the release's ref."""
    at = _git(dest, "rev-parse", "--verify", "--quiet", f"refs/tags/{tag}^{{commit}}", check=False)
    if at != commit:
        _git(dest, "tag", "--force", tag, commit)
    if _git(dest, "rev-parse", "HEAD", check=False) != commit or _git(dest, "symbolic-ref", "-q", "HEAD", check=False):
        _git(dest, "checkout", "--quiet", "--detach", commit)


@contextmanager
def _locked(path: Path) -> Iterator[None]:
    with path.open("a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


@contextmanager
def releasing(source: LocalSource, tag: str) -> Iterator[None]:
    """The environment the build reads its source repository from ($GITHUB_REPOSITORY, $GITHUB_REF),
    set to ``source`` at ``tag`` while the block runs (what the release workflow's run would have)."""
    if not source.own_repository:
        yield
        return
    saved = {key: os.environ.get(key) for key in ("GITHUB_REPOSITORY", "GITHUB_REF")}
    os.environ["GITHUB_REPOSITORY"] = source.repository
    os.environ["GITHUB_REF"] = f"refs/tags/{tag}"
    try:
        yield
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
