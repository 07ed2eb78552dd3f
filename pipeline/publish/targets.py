"""Publication targets behind one interface: a local directory and a GitHub Release.

Both are idempotent: publishing the same bundle twice changes nothing the second
time, and a publication interrupted at any point is completed by the next attempt
(the outbox retries the whole ``publish`` call, so every step must be safe to repeat).

Both write only for a source repository that the infra policy (policies/infra.yaml
``sources``) lists, re-read at every publication: the run's summary.json names the
repository, which must be listed; the GitHub target also requires the repository the
API answers for (after any rename redirect) to be that same listed repository, and the
release's tag, resolved through the API at publish time with annotated tags peeled, to
point at the run's commit. The release is the one the evidence names: summary.json's
``source.tag`` must be the tag published to. Anything else is refused before the first write.

Both touch only what benchseal wrote. The benchmark section of the body ends with a record of
the assets benchseal put there, by name and sha256 (``body.asset_record``); an asset is
benchseal's only when its name is recorded and its bytes still hash to the recorded digest. A
maintainer's asset (not recorded, or changed since) is never replaced or removed: one that has
the name of an asset benchseal must write is a refusal, before anything is written. The names
benchseal will upload are recorded before the first upload, so an interrupted publication
leaves only assets that the next attempt can prove its own.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal, Protocol

from github import GithubException, UnknownObjectException
from github.GitRelease import GitRelease
from github.GitReleaseAsset import GitReleaseAsset
from github.Repository import Repository

from pipeline.core.contracts import canonical_repository
from pipeline.core.errors import CheckFailed, Error, ValidationError
from pipeline.core.fsutil import atomic_write_text
from pipeline.core.history import tag_key, tag_refusal
from pipeline.core.layout import BODY, CHECKSUMS, SUMMARY
from pipeline.dispatch.client import classify, make_client
from pipeline.dispatch.resolve import peel_tag
from pipeline.infra.intake.policy import InfraPolicy, SourcePolicy, load_policy
from pipeline.publish.body import START, extract, recorded_assets, splice, with_asset_record
from pipeline.publish.bundle import Asset, ReleaseBundle, sha256_file

AssetAction = Literal["kept", "uploaded", "replaced", "removed"]
Strategy = Literal["local", "in-place", "draft", "companion"]
COMPANION_SUFFIX = "-benchmark"


class PublishError(Error):
    """A publication attempt failed. ``retryable`` False means retrying cannot help."""

    exit_code = 1

    def __init__(self, message: str, *, retryable: bool = True) -> None:
        super().__init__(message)
        self.retryable = retryable


@dataclass(frozen=True)
class PublishResult:
    target: Literal["local", "github"]
    tag: str
    location: str
    strategy: Strategy
    body_changed: bool
    assets: dict[str, AssetAction] = field(default_factory=dict)
    asset_location: str | None = None

    def to_json_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class PublishPolicy:
    # Manual (non-tag-triggered) publication may touch only prereleases unless this is set.
    allow_manual_full_release: bool = False
    # Create the release (as a draft) when the tag has none; off by default: a missing release
    # usually means the wrong repository or tag.
    create_missing_release: bool = False


class Target(Protocol):
    def publish(self, bundle: ReleaseBundle, *, manual: bool = False) -> PublishResult: ...


def allowed_source(bundle: ReleaseBundle, sources: InfraPolicy | None = None) -> SourcePolicy:
    """The policy entry for the run's source repository; PublishError (not retryable) otherwise.

    ``sources`` defaults to policies/infra.yaml, read now: a repository removed from the
    policy after the run was accepted is no longer written to.
    """

    try:
        policy = sources if sources is not None else load_policy()
        return policy.source(bundle.facts.source_repository, "summary.json source.repository")
    except ValidationError as exc:
        raise PublishError(f"refusing to publish run {bundle.run_id}: {exc.diagnostics()}", retryable=False) from None


def check_evidence_release(bundle: ReleaseBundle, repository: str | None = None) -> None:
    """The evidence is for this release: summary.json's ``source.tag`` is the tag published to and,
    when the target names one, its ``source.repository`` is that repository (PublishError, not
    retryable, before any write)."""

    if bundle.facts.source_tag != bundle.tag:
        raise PublishError(
            f"refusing to publish run {bundle.run_id}: summary.json source.tag is {bundle.facts.source_tag!r}, "
            f"the release is {bundle.tag!r}", retryable=False)
    if repository is None:
        return
    try:
        same = canonical_repository(repository) == canonical_repository(bundle.facts.source_repository)
    except ValueError:
        same = False
    if not same:
        raise PublishError(
            f"refusing to publish run {bundle.run_id}: summary.json source.repository is "
            f"{bundle.facts.source_repository!r}, the release is in {repository!r}", retryable=False)


def recorded_of(bundle: ReleaseBundle) -> set[tuple[str, str]]:
    return {(a.name, a.sha256) for a in bundle.assets}


def foreign_names_refusal(where: str, names: list[str], body: str) -> PublishError:
    """The one-line refusal for maintainers' assets that have the names of benchseal's."""

    # A section without a record was written before benchseal recorded its assets: what it
    # published then cannot be told from the maintainers' files.
    legacy = "; its benchmark section has no asset record (an older benchseal)" if (
        extract(body) is not None and not recorded_assets(body)) else ""
    return PublishError(
        f"{where} already holds {', '.join(names)}, which benchseal did not write (not in its section's asset "
        f"record, or changed since){legacy}: refusing to replace the maintainers' files; rename or remove them, "
        "or publish under another tag", retryable=False)


# --- local directory -----------------------------------------------------------------

class LocalTarget:
    """``<root>/<tag>/``: body.md plus every asset.

    A new release directory is staged and renamed into place whole. In an existing one only
    benchseal's own files (recorded in body.md's section, bytes unchanged) are replaced (each
    staged and renamed) or removed; body.md is written last; anything else there is left alone.
    A tag is released once: a directory holding benchseal's release of another commit (its own
    summary.json says which), or a tag spelled differently in case, is never replaced.
    """

    def __init__(self, root: Path, *, sources: InfraPolicy | None = None, repository: str | None = None) -> None:
        self.root = root
        self.sources = sources  # None: policies/infra.yaml, read at each publication
        self.repository = repository  # the repository the release is for, when the publication names one

    def release_dir(self, tag: str) -> Path:
        if "/" in tag or tag in {".", ".."} or tag.startswith("."):
            raise CheckFailed(f"tag {tag!r} cannot name a directory under {self.root}")
        return self.root / tag

    def publish(self, bundle: ReleaseBundle, *, manual: bool = False) -> PublishResult:
        dest = self.release_dir(bundle.tag)
        allowed_source(bundle, self.sources)
        check_evidence_release(bundle, self.repository)
        if dest.is_symlink() or (dest.exists() and not dest.is_dir()):
            raise PublishError(f"{dest} is not a directory: refusing to publish there", retryable=False)
        variants = sorted(entry.name for entry in self.root.iterdir() if entry.name != dest.name
                          and tag_key(entry.name) == tag_key(dest.name)) if self.root.is_dir() else []
        if variants:
            raise PublishError(f"refusing to publish run {bundle.run_id} as {bundle.tag}: {self.root} already holds "
                               f"the release {variants[0]} (tags that differ only in case are one tag)", retryable=False)
        if not dest.exists():
            self._create(dest, splice("", bundle.section), bundle.assets)
            return PublishResult("local", bundle.tag, str(dest), "local", True,
                                 dict.fromkeys((a.name for a in bundle.assets), "uploaded"))
        body_path = dest / BODY
        if body_path.is_symlink() or (body_path.exists() and not body_path.is_file()):
            raise PublishError(f"{body_path} is not a regular file: refusing to publish there", retryable=False)
        old_body = body_path.read_text("utf-8") if body_path.exists() else ""
        recorded = recorded_assets(old_body)
        ours: dict[str, str] = {}  # name -> sha256 of benchseal's files in the directory
        present: set[str] = set()
        for entry in dest.iterdir():
            present.add(entry.name)
            if entry.name in {n for n, _ in recorded} and entry.is_file() and not entry.is_symlink():
                digest = sha256_file(entry)
                if (entry.name, digest) in recorded:
                    ours[entry.name] = digest
        foreign = sorted(a.name for a in bundle.assets if a.name in present and a.name not in ours)
        if foreign:
            raise foreign_names_refusal(str(dest), foreign, old_body)
        if recorded:
            self._check_same_commit(dest, bundle, SUMMARY in ours)
        actions: dict[str, AssetAction] = {}
        writes = []
        for asset in bundle.assets:
            if ours.get(asset.name) == asset.sha256:
                actions[asset.name] = "kept"
            else:
                actions[asset.name] = "replaced" if asset.name in ours else "uploaded"
                writes.append(asset)
        if writes:
            pending = recorded | recorded_of(bundle)
            if pending != recorded:
                # Recorded before the first file lands: an interruption leaves only provable files.
                atomic_write_text(body_path, splice(old_body, with_asset_record(extract(old_body) or "", pending)))
            self._write_files(dest, writes)
        wanted = {a.name for a in bundle.assets}
        for name in sorted(set(ours) - wanted):
            (dest / name).unlink()  # benchseal's file of an earlier publication
            actions[name] = "removed"
        body = splice(old_body, bundle.section)
        current = body_path.read_text("utf-8") if body_path.exists() else ""
        if body != current:
            atomic_write_text(body_path, body)
        return PublishResult("local", bundle.tag, str(dest), "local", body != old_body, actions)

    @staticmethod
    def _check_same_commit(dest: Path, bundle: ReleaseBundle, summary_is_ours: bool) -> None:
        """PublishError (not retryable) unless the release benchseal published in ``dest`` is of the
        bundle's commit: a re-run of that commit may replace it, another commit never."""
        commit: object = None
        if summary_is_ours:
            try:
                source = json.loads((dest / SUMMARY).read_text("utf-8")).get("source")
                commit = source.get("commit") if isinstance(source, dict) else None
            except (OSError, UnicodeDecodeError, ValueError, AttributeError):
                commit = None
        if not isinstance(commit, str):
            raise PublishError(f"{dest} holds benchseal's release without a readable {SUMMARY}: cannot tell which "
                               f"commit it is of; refusing to replace it with run {bundle.run_id}", retryable=False)
        refusal = tag_refusal(repository=bundle.facts.source_repository, tag=bundle.tag,
                              commit=bundle.facts.source_commit, released_tag=dest.name, released_commit=commit)
        if refusal is not None:
            raise PublishError(f"{dest}: {refusal}", retryable=False)

    def _stage(self, dest: Path) -> Path:
        self.root.mkdir(parents=True, exist_ok=True)
        return Path(tempfile.mkdtemp(dir=self.root, prefix=f".{dest.name}.staging."))

    @staticmethod
    def _copy(asset: Asset, path: Path) -> None:
        shutil.copyfile(asset.path, path)
        if sha256_file(path) != asset.sha256:
            raise CheckFailed(f"{asset.path} changed while it was being published")
        os.chmod(path, 0o644)

    def _create(self, dest: Path, body: str, assets: tuple[Asset, ...]) -> None:
        stage = self._stage(dest)
        try:
            for asset in assets:
                self._copy(asset, stage / asset.name)
            atomic_write_text(stage / BODY, body)
            os.chmod(stage, 0o755)  # noqa: S103 -- a published release is world-readable
            os.rename(stage, dest)  # fails, keeping what is there, if the directory appeared meanwhile
        finally:
            shutil.rmtree(stage, ignore_errors=True)

    def _write_files(self, dest: Path, assets: list[Asset]) -> None:
        # Staged beside the root (same filesystem), each renamed over benchseal's own old file.
        stage = self._stage(dest)
        try:
            for asset in assets:
                self._copy(asset, stage / asset.name)
                os.replace(stage / asset.name, dest / asset.name)
        finally:
            shutil.rmtree(stage, ignore_errors=True)


# --- GitHub Release ------------------------------------------------------------------

def _content_type(name: str) -> str:
    if name.endswith(".json"):
        return "application/json"
    if name == CHECKSUMS or name.endswith((".txt", ".md")):
        return "text/plain"
    return "application/octet-stream"


def _is_immutable_refusal(exc: Exception) -> bool:
    """GitHub answers 422 naming immutability when assets change on an immutable release."""

    return isinstance(exc, GithubException) and exc.status == 422 and "immutable" in str(exc.data).lower()


def _is_already_exists(exc: Exception) -> bool:

    return isinstance(exc, GithubException) and exc.status == 422 and "already_exists" in str(exc.data)


def _translate(exc: Exception, what: str) -> PublishError:
    """Every client failure becomes a PublishError; only transient ones (5xx, rate limit,
    network, timeout: the github stage's ``classify``) are worth retrying."""


    if isinstance(exc, PublishError):
        return exc
    transient = classify(exc)
    if isinstance(exc, GithubException):
        return PublishError(f"{what}: GitHub answered {exc.status}: {exc.data}", retryable=transient is not None)
    if transient is not None:
        return PublishError(f"{what}: {transient.reason}: {exc}", retryable=True)
    if isinstance(exc, Error):
        return PublishError(f"{what}: {exc.diagnostics()}", retryable=False)
    return PublishError(f"{what}: {type(exc).__name__}: {exc}", retryable=True)


class GitHubTarget:
    """A GitHub Release found by tag.

    Order of work, chosen so that an interruption anywhere is repaired by a re-run:
    0. check, before any write: the repository is listed in the infra policy (by the name
       the API answers with) and is the run's source repository; the tag exists and,
       peeled, points at the run's commit;
    1. find the release; refuse when its tag differs or policy forbids it;
    2. choose where the assets go, from the API's answer: the release itself when it is a
       draft or mutable; when GitHub reports it ``immutable`` (or refuses an asset change
       with 422 naming immutability), a companion release ``<tag>-benchmark`` that is
       filled as a draft and published only when its assets are complete;
    3. sync assets by their ``digest`` (same sha256 kept, different replaced, partial
       ``starter`` uploads deleted, a 422 ``already_exists`` from a lost response resolved
       by re-reading);
    4. PATCH the body section last (notes stay editable on immutable releases), so a
       visible section means the assets are complete.
    """

    def __init__(self, repo: Repository, policy: PublishPolicy | None = None, *, release_id: int | None = None,
                 sources: InfraPolicy | None = None) -> None:
        self.repo = repo
        self.policy = policy or PublishPolicy()
        self.sources = sources  # None: policies/infra.yaml, read at each publication
        # A release named by id (e.g. created by the tag workflow) instead of found by tag;
        # its tag is still checked against the run's.
        self.release_id = release_id

    def publish(self, bundle: ReleaseBundle, *, manual: bool = False) -> PublishResult:
        try:
            return self._publish(bundle, manual=manual)
        except Exception as exc:
            raise _translate(exc, f"publishing {bundle.tag} to {self.repo.full_name}") from exc

    # The steps ----------------------------------------------------------------------

    def _check_source(self, bundle: ReleaseBundle) -> str:
        """Repository and tag checks (step 0); returns the commit the tag resolves to."""
        entry = allowed_source(bundle, self.sources)
        check_evidence_release(bundle)  # the repository: against the API's answer, below
        # The API's own name for the repository: a renamed or transferred repository is
        # redirected by GitHub, so the requested name alone proves nothing.
        answered = self.repo.full_name
        try:
            canonical = canonical_repository(answered)
        except ValueError:
            canonical = None
        if canonical != entry.canonical:
            raise PublishError(
                f"refusing to publish run {bundle.run_id} of {entry.repository} to repository {answered!r}: "
                "a run is published only to its own source repository", retryable=False)
        commit = bundle.facts.source_commit  # 40 lowercase hex: summary.json's model checked it
        resolved = self._resolve_tag(bundle.tag)
        if resolved != commit:
            raise PublishError(
                f"tag {bundle.tag!r} in {answered} points at commit {resolved}, the run benchmarked {commit}: "
                "refusing to publish to a release of another commit", retryable=False)
        return commit

    def _resolve_tag(self, tag: str) -> str:
        """The commit ``refs/tags/<tag>`` points at now, peeling annotated tags (and tags of tags)."""

        try:
            return peel_tag(self.repo, tag)
        except UnknownObjectException:
            # A tag can still be pushed (or a draft published): retried, with backoff.
            raise PublishError(f"tag {tag!r} does not exist in {self.repo.full_name}: nothing to publish to",
                               retryable=True) from None
        except CheckFailed as exc:
            raise PublishError(str(exc), retryable=False) from None

    def _publish(self, bundle: ReleaseBundle, *, manual: bool) -> PublishResult:
        commit = self._check_source(bundle)
        release = self.repo.get_release(self.release_id) if self.release_id is not None else self._find(bundle.tag)
        if release is None:
            if not self.policy.create_missing_release:
                raise PublishError(f"{self.repo.full_name} has no release for tag {bundle.tag}", retryable=True)
            release = self.repo.create_git_release(
                tag=bundle.tag, name=bundle.tag, message="", draft=True, prerelease=manual,
                target_commitish=commit,
            )
        if release.tag_name != bundle.tag:
            raise PublishError(
                f"release {release.id} has tag {release.tag_name!r}, the run is for {bundle.tag!r}: refusing",
                retryable=False,
            )
        if manual and not release.prerelease and not self.policy.allow_manual_full_release:
            raise PublishError(
                f"release {bundle.tag} is not a prerelease; manual publication needs allow_manual_full_release",
                retryable=False,
            )
        strategy: Strategy = "draft" if release.draft else "in-place"
        original = release.body or ""
        holder = release
        if not release.draft and bool(release.raw_data.get("immutable")):
            strategy, holder = "companion", self._companion(release, bundle, commit)
        try:
            actions, holder = self._sync_assets(holder, bundle)
        except Exception as exc:
            if not _is_immutable_refusal(exc):
                raise
            if strategy != "in-place":
                raise PublishError(
                    f"release {holder.tag_name} is immutable and holds other assets than run {bundle.run_id}: "
                    "publish this run under a new tag", retryable=False,
                ) from exc
            # The release did not say it was immutable, but GitHub refused like one.
            release = self.repo.get_release(release.id)  # its body may carry the pending record now
            strategy, holder = "companion", self._companion(release, bundle, commit)
            actions, holder = self._sync_assets(holder, bundle)
        if strategy != "companion":
            release = holder
        section = bundle.section
        if strategy == "companion":
            companion_section = section + (
                f"\n\nThis release is immutable, so the benchmark assets are on the companion release "
                f"`{holder.tag_name}`."
            )
            # The release itself holds none of benchseal's assets: its record says so.
            section = with_asset_record(companion_section, ())
            companion_body = splice(holder.body or "", with_asset_record(companion_section, recorded_of(bundle)))
            if holder.draft or companion_body != (holder.body or ""):
                # Publishing the companion only now: its assets are complete, and on an
                # immutable repository they are locked from here on.
                holder = holder.update_release(name=holder.name or holder.tag_name, message=companion_body,
                                               draft=False, prerelease=holder.prerelease)
        old = release.body or ""
        new = splice(old, section)
        if new != old:
            # PATCH keeps draft/prerelease as they are; PyGithub would otherwise send draft=false.
            release = release.update_release(name=release.name or release.tag_name, message=new,
                                             draft=release.draft, prerelease=release.prerelease)
        return PublishResult(
            "github", bundle.tag, release.html_url, strategy, new != original, actions,
            asset_location=holder.html_url,
        )

    def _find(self, tag: str) -> GitRelease | None:
        try:
            return self.repo.get_release(tag)
        except UnknownObjectException:
            pass
        # Drafts have no tag yet and are invisible to /releases/tags/{tag}: look in the list.
        matches = [r for r in self.repo.get_releases() if r.tag_name == tag]
        return min(matches, key=lambda r: r.id) if matches else None

    def _companion(self, release: GitRelease, bundle: ReleaseBundle, commit: str) -> GitRelease:
        tag = release.tag_name + COMPANION_SUFFIX
        matches = sorted((r for r in self.repo.get_releases() if r.tag_name == tag), key=lambda r: r.id)
        published = [r for r in matches if not r.draft]
        drafts = [r for r in matches if r.draft]
        keep = published[0] if published else drafts[0] if drafts else None
        for extra in drafts:
            # A create whose response was lost may have made a second draft: keep the oldest. Only
            # one that holds nothing but benchseal's own assets is deleted.
            if extra is not keep and START in (extra.body or "") and self._only_ours(extra):
                extra.delete_release()
        if keep is not None:
            if not keep.draft and self._resolve_tag(tag) != commit:
                raise PublishError(f"companion tag {tag!r} does not point at commit {commit}: refusing", retryable=False)
            return keep
        # At the verified commit (the release's target_commitish may name a branch that moved on).
        return self.repo.create_git_release(
            tag=tag, name=f"{release.tag_name} benchmark", message=splice("", bundle.section), draft=True,
            prerelease=release.prerelease, target_commitish=commit,
        )

    def _only_ours(self, release: GitRelease) -> bool:
        recorded = recorded_assets(release.body or "")
        return all(self._owned(remote, recorded) for remote in release.get_assets())

    def _sync_assets(self, release: GitRelease, bundle: ReleaseBundle) -> tuple[dict[str, AssetAction], GitRelease]:
        """Upload what is missing or changed, remove benchseal's files this bundle no longer has;
        returns the actions and the release as it is now (its record may have been updated)."""
        existing: dict[str, GitReleaseAsset] = {a.name: a for a in release.get_assets()}
        body = release.body or ""
        recorded = recorded_assets(body)
        # Read before anything changes: what benchseal wrote, proven by the record and the bytes.
        ours = {name for name, remote in existing.items() if self._owned(remote, recorded)}
        foreign = sorted(a.name for a in bundle.assets if a.name in existing and a.name not in ours)
        if foreign:
            raise foreign_names_refusal(f"release {release.tag_name}", foreign, body)
        writes = [a for a in bundle.assets if a.name not in existing or not self._matches(existing[a.name], a)]
        if writes:
            pending = recorded | recorded_of(bundle)
            if pending != recorded:
                # Recorded before the first upload: an interrupted publication leaves only provable assets.
                marked = splice(body, with_asset_record(extract(body) or "", pending))
                release = release.update_release(name=release.name or release.tag_name, message=marked,
                                                 draft=release.draft, prerelease=release.prerelease)
        actions: dict[str, AssetAction] = dict.fromkeys((a.name for a in bundle.assets), "kept")
        for asset in writes:
            current = existing.get(asset.name)
            if current is not None:
                current.delete_asset()  # benchseal's own (checked above)
            self._upload(release, asset)
            actions[asset.name] = "replaced" if current is not None else "uploaded"
        # Removed only after the new files are in place: an interruption leaves extra, never missing, files.
        for name in sorted(ours - {a.name for a in bundle.assets}):
            existing[name].delete_asset()
            actions[name] = "removed"
        return actions, release

    def _owned(self, remote: GitReleaseAsset, recorded: frozenset[tuple[str, str]]) -> bool:
        """benchseal wrote ``remote``: its name is recorded and its bytes hash to a recorded digest
        (a partial upload of a recorded name is benchseal's interrupted one)."""
        digests = {digest for name, digest in recorded if name == remote.name}
        if not digests:
            return False
        if remote.state != "uploaded":
            return True
        return self._sha256(remote) in digests

    @staticmethod
    def _sha256(remote: GitReleaseAsset) -> str:
        if remote.digest and remote.digest.startswith("sha256:"):
            return str(remote.digest).removeprefix("sha256:")
        # Servers without the digest field: fetch the bytes and hash them.
        with tempfile.TemporaryDirectory() as tmp:
            path = Path(tmp) / "asset"
            remote.download_asset(str(path))
            return sha256_file(path)

    def _matches(self, remote: GitReleaseAsset, asset: Asset) -> bool:
        if remote.state != "uploaded" or remote.size != asset.size:
            return False
        return self._sha256(remote) == asset.sha256

    def _upload(self, release: GitRelease, asset: Asset) -> None:
        try:
            uploaded = release.upload_asset(str(asset.path), label=asset.name, name=asset.name,
                                            content_type=_content_type(asset.name))
        except Exception as exc:
            if not _is_already_exists(exc):
                raise
            # An earlier upload landed but its answer was lost (timeout, retried POST): re-read.
            again = {a.name: a for a in release.get_assets()}.get(asset.name)
            if again is not None and self._matches(again, asset):
                return
            if again is not None:
                again.delete_asset()
            uploaded = release.upload_asset(str(asset.path), label=asset.name, name=asset.name,
                                            content_type=_content_type(asset.name))
        if uploaded.digest and uploaded.digest != asset.digest:
            raise PublishError(f"GitHub stored {asset.name} with digest {uploaded.digest}, expected {asset.digest}")


def github_repo(repository: str, *, base_url: str | None = None, token: str | None = None,
                timeout: int = 30) -> Repository:
    """The repository handle for a GitHubTarget: token from $GITHUB_TOKEN/$GH_TOKEN (never argv).

    The client comes from the github stage's factory, which never retries POSTs at the
    transport (a retried upload races itself); our retry is the outbox, over idempotent steps.
    """

    client = make_client(base_url=base_url, token=token, timeout=timeout)  # no token: a usage error, as is
    try:
        repo: Repository = client.get_repo(repository)
    except Exception as exc:
        # An unreachable or failing GitHub is a publication failure (retryable when transient), not a traceback.
        raise _translate(exc, f"looking up {repository}") from exc
    return repo
