"""``benchseal release vX.Y.Z --local``: the whole chain on this machine, verified at the end.

It drives each stage through the same public API the GitHub flow uses, so the demo
exercises the production code paths:

the source repository (an example project as its own repository, pipeline.local.sources) ->
build_images -> the builder's release.yml signs and attests them -> DispatchPayload -> infra
accept_payload (what the workflow's ``benchseal infra accept`` runs) -> worker run_once, grading
only (the infra host's service) -> what the builder's benchmark.yml seal job does for the infra
repository: export_run (the export wrapper's ``benchseal infra export``), import_run + seal_run
(``benchseal evidence --from-export``) with the local signer as that job's identity,
publish_request (``benchseal publish --builder``) to dist/releases/<tag>/ -> for a PASSED result,
what the builder's release.yml attach_result job does (``benchseal attach-result``): the signed
test-result bundle attached to the runner image -> verify_release and the body's commands on the
published directory.

Who plays whom (all GitHub-shaped certificates from the private instance, under its root only):
the source is ``benchseal-examples/<example>`` (or benchseal's own checkout without
``--project``), the builder ``local/benchseal@refs/heads/main`` at this checkout's HEAD, the infra
repository ``local/bench-infra`` on main (pipeline.local.sources).
"""

from __future__ import annotations

import io
import json
import os
import re
import shlex
import shutil
import subprocess
import threading
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

from rich.console import Console

from pipeline.attest.images import (
    BuildInvocation,
    ImageIdentityPolicy,
    ImageSigner,
    SigstoreEndpoints,
    attest_images,
    image_identity,
    verify_image,
)
from pipeline.attest.passed import check_key, passed_before, record_pass
from pipeline.attest.testresult import attach_test_result
from pipeline.core.contracts import AgentArtifact, DigestsFile, DispatchPayload, Grading, PublicationRequest
from pipeline.core.documents import ReleaseSummary, load_document, result_verdict
from pipeline.core.errors import CheckFailed, InfrastructureError, UsageError
from pipeline.core.fsutil import atomic_write_json, sha256_file
from pipeline.core.layout import SUMMARY
from pipeline.core.paths import REPO_ROOT, state_dir
from pipeline.core.project import load_project, version_for_tag
from pipeline.dispatch.dispatch import build_payload, new_correlation_id
from pipeline.imaging.build import build_images_with_results
from pipeline.imaging.names import ImageNames, as_names, resolve_image_names
from pipeline.infra.intake.accept import accept_payload
from pipeline.infra.intake.policy import InfraPolicy, load_policy
from pipeline.infra.queue.sql import TERMINAL_STATES, SqliteQueue
from pipeline.infra.sandbox import engine as sandbox
from pipeline.infra.worker.export import export_run, import_run
from pipeline.infra.worker.loop import WorkerConfig, run_once
from pipeline.infra.worker.prune import after_work
from pipeline.local import sigstore as sigstore_local
from pipeline.local.admission import LocalAdmission, admit_adopter
from pipeline.local.agents import check_npm_resolvable, local_npm_registry
from pipeline.local.model import scripted_model_for
from pipeline.local.precheck import check_admitted, check_project
from pipeline.local.signing import local_signer
from pipeline.local.sources import (
    BUILDER,
    INFRA_CALLER_WORKFLOW,
    INFRA_REF,
    INFRA_REPOSITORY,
    SOURCE_CALLER_WORKFLOW,
    LocalSource,
    adopter_checkout,
    builder_commit,
    example_repository_name,
    release_repository_origin,
    release_source,
    releasing,
)
from pipeline.local.stages import StageClock
from pipeline.publish.outbox import publish_request
from pipeline.publish.seal import Sealed, seal_run
from pipeline.publish.targets import LocalTarget, PublishError
from pipeline.runner.plan import discover_tasks, select_tasks
from pipeline.verify.external import builder_image_identity, cosign_commands, image_command_lines, local_benchseal
from pipeline.verify.gh import gh_commands, gh_image_lines, gh_path
from pipeline.verify.policy import BENCHMARK_WORKFLOW, RELEASE_WORKFLOW, Builder
from pipeline.verify.release import verify_release

TAG_RE = re.compile(r"\Av\d+\.\d+\.\d+(?:[-+][0-9A-Za-z.-]+)?\Z")


def _queue_wait(events: Sequence[Any]) -> float:
    """Seconds from accept to the (last) claim, from the queue's audit trail."""

    def parse(text: str) -> datetime:
        return datetime.fromisoformat(text)  # Python >= 3.11 reads a "Z" offset

    accepted = next((e.at for e in events if e.event == "accepted"), None)
    claimed = [e.at for e in events if e.event == "claimed"]
    if accepted is None or not claimed:
        return 0.0
    return max(0.0, (parse(claimed[-1]) - parse(accepted)).total_seconds())


@dataclass
class ReleaseReport:
    tag: str
    release_dir: str
    run_id: str
    status: str
    score: float | None
    counts: dict[str, int]
    images: dict[str, str]
    images_reused: bool
    source: dict[str, str]
    stages: dict[str, float]
    trials: dict[str, float] = field(default_factory=dict)
    verified: dict[str, Any] = field(default_factory=dict)
    publication: dict[str, Any] = field(default_factory=dict)
    bytes_pushed: int = 0
    # The comparison with the repository's previous release and the gate's verdict (summary.json's
    # ``comparison``); None for a run without a score.
    comparison: dict[str, Any] | None = None
    # Why the run is not scored (None when it is), and each trial that was not resolved with its reason
    # (the grading rule's one line; canaries marked): what the terminal shows of a failure.
    reason: str | None = None
    failed_trials: list[dict[str, Any]] = field(default_factory=list)
    # The local world's policy for an adopter's repository (pipeline.local.admission): its base, what was added,
    # its sha256 and where it was written; None when the run used a policy file as it is.
    policy: dict[str, Any] | None = None

    @property
    def gated(self) -> bool:
        return bool(self.comparison and self.comparison.get("gated"))

    def to_json_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


def _gh() -> str:
    """This machine's gh with ``attestation verify`` (make setup installs it): the body's gh lines run too."""
    gh = gh_path()
    if gh is None:
        raise InfrastructureError("no gh with 'attestation verify' found: run make setup (it installs a current gh)")
    return str(gh)


def run_commands(commands: Sequence[str], cwd: Path, trusted_root: Path | None = None) -> list[str]:
    """Run the consumer's verification commands exactly as the release body shows them.

    They only read the release directory, so they run side by side; a failure is reported
    for the first failing command in the body's order. A ``cosign verify`` / ``verify-attestation``
    of a digest-pinned image that already passed with the same argv, cosign and ``trusted_root``
    (pipeline.attest.passed: the attest step and the worker checked the same digests) is not run again.
    """

    def run(line: str) -> subprocess.CompletedProcess[str]:
        key = _image_check_key(line, trusted_root)
        if passed_before(key):
            return subprocess.CompletedProcess(line, 0, "", "")
        argv = shlex.split(line)
        done = subprocess.run(argv, cwd=cwd, capture_output=True, text=True, check=False, env=_line_env(argv))
        if done.returncode == 0:
            record_pass(key)
        return done

    with ThreadPoolExecutor(max_workers=max(1, min(8, len(commands)))) as pool:
        results = list(pool.map(run, commands))
    for line, done in zip(commands, results, strict=True):
        if done.returncode != 0:
            raise CheckFailed(f"verification command failed in {cwd}: {line}\n{(done.stderr or done.stdout).strip()}")
    return list(commands)


def _line_env(argv: Sequence[str]) -> dict[str, str] | None:
    """The environment a body line runs with: the inherited one, except for gh's ``--bundle-from-oci`` lines.
    gh insists on a token before it reads a registry's referrers even offline with a custom root, and sends it
    to no one there: it gets a placeholder through its environment (never argv), never a real token this
    process may hold."""
    if "--bundle-from-oci" not in argv or Path(argv[0]).name != "gh":
        return None
    return {**os.environ, "GH_TOKEN": "unused-offline", "GITHUB_TOKEN": "unused-offline"}


def _image_check_key(line: str, trusted_root: Path | None) -> str | None:
    """The passed-check key of a body line that is cosign's check of an image (``cosign verify[-attestation]
    ... REF``, as ``image_command_lines`` prints it), else None (always run). A line naming a private root
    (``--trusted-root``) is keyed only when the caller names that root (``trusted_root``), a line without one
    only under public-good (``trusted_root`` None)."""
    argv = shlex.split(line)
    if ("--trusted-root" in argv) != (trusted_root is not None):
        return None
    if len(argv) < 2 or Path(argv[0]).name != "cosign" or argv[1] not in ("verify", "verify-attestation"):
        return None
    binary = shutil.which(argv[0])
    return check_key(argv[1:], Path(binary), trusted_root) if binary else None


def _attest_as_builder(images: dict[str, str], repository: str, commit: str, tag: str, instance: Any,
                       endpoints: SigstoreEndpoints, policy: ImageIdentityPolicy, sbom_dir: Path,
                       agent: AgentArtifact | None = None) -> None:
    """What the builder's reusable release.yml does in the source's release run: cosign signs and
    attests as that job's identity (the SAN the builder's job_workflow_ref, the workflow repository,
    ref and SHA the source's: ``repository`` at ``refs/tags/<tag>`` and ``commit``).

    The private instance serves the job's OIDC token the way Actions does; images that already
    carry a verified signature and attestations by this exact identity are not signed again.
    """

    unsigned = {}
    for role, ref in images.items():
        try:
            verify_image(ref, policy, endpoints, allow_http_registry=True)
        except CheckFailed:
            unsigned[role] = ref
    if not unsigned:
        return
    job = sigstore_local.GitHubJob(repository=repository, ref=f"refs/tags/{tag}", sha=commit,
                                   workflow_file=RELEASE_WORKFLOW, workflow_repository=BUILDER.repository,
                                   workflow_ref=BUILDER.ref, workflow_sha=builder_commit(),
                                   caller_workflow_file=SOURCE_CALLER_WORKFLOW)
    session = sigstore_local.open_actions_session(instance, job)
    invocation = BuildInvocation(repository=repository, ref=job.ref, commit=commit,
                                 workflow_ref=f"{repository}/.github/workflows/{SOURCE_CALLER_WORKFLOW}@{job.ref}",
                                 run_url=f"https://github.com/{repository}/actions/runs/{job.run_id}/attempts/{job.run_attempt}",
                                 builder_ref=job.job_workflow_ref)
    signer = ImageSigner(endpoints, allow_http_registry=True, actions_env=session.environ())
    attest_images(unsigned, signer, invocation, sbom_dir, agent=agent)


def _verify_images(images: dict[str, str], repository: str, tag: str, commit: str,
                   endpoints: SigstoreEndpoints) -> list[str]:
    """A consumer's cosign checks of both images: the builder's release.yml for the source at the
    release's commit passes; the source's own workflow, the builder at another commit of the
    source, and another version of the builder are refused."""
    policy = builder_image_identity(BUILDER, repository, tag, commit)
    other_commit = format(int(commit, 16) ^ 1, "040x")
    impostors = (image_identity(repository, tag, commit, workflow=SOURCE_CALLER_WORKFLOW),
                 builder_image_identity(BUILDER, repository, tag, other_commit),
                 builder_image_identity(Builder(BUILDER.repository, "refs/heads/impostor"), repository, tag, commit))

    def refused(ref: str, impostor: ImageIdentityPolicy) -> bool:
        try:
            verify_image(ref, impostor, endpoints, allow_http_registry=True, attestations=())
        except CheckFailed:
            return True
        return False

    checked = []
    with ThreadPoolExecutor(max_workers=4) as pool:
        for role, ref in sorted(images.items()):
            verify_image(ref, policy, endpoints, allow_http_registry=True)
            for impostor, was_refused in zip(impostors, pool.map(lambda i, r=ref: refused(r, i), impostors),
                                             strict=True):
                if not was_refused:
                    raise CheckFailed(f"{role} image {ref} verified for the wrong identity {impostor.describe()}")
            checked.append(f"{role}: signature, slsaprovenance1 and cyclonedx by {policy.describe()}; "
                           + " and ".join(i.describe() for i in impostors) + " refused")
    return checked


def release_local(
    tag: str,
    *,
    names: ImageNames | str | None = None,
    dist: Path | None = None,
    suite: str = "smoke",
    agent: str = "oracle",
    console: Console | None = None,
    scripted_model: str | None = None,
    policy: Path | None = None,
    project: Path | None = None,
    repository: str | None = None,
    tasks: tuple[str, ...] | None = None,
) -> ReleaseReport:
    """``names``: the image names (default: the configured ones, pipeline.imaging.names, whose
    local default is 127.0.0.1:5055/benchseal/); ``policy``: the infra policy that must admit
    them (default policies/infra.yaml); ``project``: the source project's benchseal.toml, whose
    agent (at the tag's version) the runner carries and, by default, the run scores;
    ``repository``: the name of a project's own checkout (default: pipeline.local.sources)."""
    if not TAG_RE.match(tag):
        raise UsageError(f"invalid tag: must look like vX.Y.Z (got {tag!r})")
    if project is not None:
        version_for_tag(tag)  # the agent's version comes from the tag: refused before anything runs

    resolved = resolve_image_names() if names is None else as_names(names)
    infra_policy = load_policy(policy)
    policy_file = str(policy) if policy is not None else "the infra policy"
    # Everything checkable before the build is checked before it, each one line (pipeline.local.precheck).
    repository, origin = release_repository_origin(project, repository)
    _say(console, f"Releasing {repository} {tag} (repository name from {origin})")
    field = "--agent"
    admission: LocalAdmission | None = None
    if project is not None:
        adopter = adopter_checkout(project) if example_repository_name(project) is None else None
        project_file = load_project(project)
        commit = check_project(project, project_file, tag, adopter_checkout=adopter)
        field = f"{project.name}: agent.name" if agent == project_file.agent.name else field
        if adopter is not None and commit is not None and policy is None and agent == project_file.agent.name:
            # The adopter's own repository and agent, admitted as the local infra would admit them: no file to write.
            admission = admit_adopter(repository, origin, project, project_file, adopter, commit, resolved)
            infra_policy = admission.policy
            for line in admission.added or ("nothing: it already admits them",):
                _say(console, f"Local infra policy ({admission.base} + {repository}): added {line}")
        check_npm_resolvable(project_file, tag)
    check_admitted(infra_policy, repository, origin, agent, suite, field, policy_file)
    if tasks:
        # The worker refuses a subset its staged dataset lacks a task of; here it is refused before anything is built.
        select_tasks(discover_tasks(REPO_ROOT / "suites" / infra_policy.dataset(suite, "--suite").path), tasks, "--tasks")
    for role in ("runner", "api"):
        infra_policy.check_name(role, resolved.name(role), f"{resolved.origin} ({role} image)", repository=repository)
    # Checked before anything is built: a model-backed agent needs its key (or the scripted model, asked for).
    with scripted_model_for(agent, suite, scripted_model, infra_policy):
        return _release_local(tag, names=resolved, dist=dist, suite=suite, agent=agent, console=console,
                              policy=infra_policy, project=project, repository=repository, tasks=tasks,
                              admission=admission)


def _say(console: Console | None, line: str) -> None:
    """One line on the terminal (never wrapped: a test and a user read it whole)."""
    if console is not None:
        console.print(line, markup=False, highlight=False, soft_wrap=True)


def _release_local(
    tag: str,
    *,
    names: ImageNames,
    dist: Path | None,
    suite: str,
    agent: str,
    console: Console | None,
    policy: InfraPolicy,
    project: Path | None = None,
    repository: str | None = None,
    tasks: tuple[str, ...] | None = None,
    admission: LocalAdmission | None = None,
) -> ReleaseReport:
    dist = dist or REPO_ROOT / "dist" / "releases"
    work = state_dir("release", tag)
    # The policy this run is accepted, graded, sealed and published under, where the report points at it.
    written = admission.write(work) if admission is not None else None
    policy_record = admission.to_json_dict(written) if admission is not None else None
    if written is not None and policy_record is not None:
        _say(console, f"Local infra policy written to {policy_record['path']} (sha256 {policy_record['sha256']})")
        policy = load_policy(written)  # the file written, so the evidence records its digest
    with StageClock(console) as clock, ExitStack() as stack:
        with clock.stage("setup", "Private Sigstore instance"):
            instance = sigstore_local.ensure_running()  # starts the instance unless it answers
        with clock.stage("setup", "Source repository"):
            source_repo = release_source(project, tag, repository)
        built = _build_and_attest(clock, tag, names, work, instance, source_repo)

        # The dispatch stage's payload builder: the same refs, re-validated, as a workflow sends.
        # A new correlation id per invocation: a re-run benchmarks again instead of being
        # folded into the earlier run by accept's idempotency key.
        payload = build_payload(built.digests, correlation_id=new_correlation_id(), tag=tag, suite=suite, agent=agent,
                                tasks=tasks)
        source = payload.source.model_dump()
        with clock.stage("dispatch", "Dispatching to infra accept"):
            # As the production accept step: the run goes with the policy's digest, the worker's must equal it.
            accepted = accept_payload(payload.to_json_dict(), policy=policy, policy_digest=policy.digest)
        run_id = accepted.run_id

        # The worker grades and signs nothing, as the infra host's service does. Then the run is sealed
        # the way the builder's benchmark.yml seal job seals it for the infra repository: exported as
        # the export wrapper streams it, unpacked and checked, signed as that job's identity (the
        # builder's job_workflow_ref as the SAN; the infra repository on main as the workflow
        # repository and ref: the same issuer, identity and certificate claims as production, only
        # under the local root), published. The infra repository's main is this checkout's HEAD
        # (its policy is policies/infra.yaml).
        infra_repository = INFRA_REPOSITORY
        seal_job = sigstore_local.GitHubJob(repository=infra_repository, ref=INFRA_REF, sha=builder_commit(),
                                            workflow_file=BENCHMARK_WORKFLOW, event_name="workflow_dispatch",
                                            workflow_repository=BUILDER.repository, workflow_ref=BUILDER.ref,
                                            workflow_sha=builder_commit(), caller_workflow_file=INFRA_CALLER_WORKFLOW)

        queue = stack.enter_context(SqliteQueue())
        grading, pruning = _grade(clock, queue, run_id, suite=suite, agent=agent, endpoints=built.endpoints,
                                  policy=policy)
        # The worker's prune of the run it just sealed (its staged dataset copy, task images past the rule) runs
        # beside sealing, publishing and verifying (none reads the staged copies or the task images); the
        # release waits for it before it ends, on every path, so it still leaves the sandbox as it found it.
        stack.callback(_finish_prune, clock, pruning)
        sealed = _seal(clock, queue, run_id, work, seal_job, policy)
        publication = _publish(clock, dist, tag, run_id, payload, sealed.evidence.artifacts, instance,
                               infra_repository, policy)
        if sealed.comparison is not None:
            # As the seal job's step after publishing (benchseal-record): the release joins the repository's history.
            queue.record_summary(run_id, f"sha256:{sha256_file(sealed.evidence.summary)}")
        release_dir = dist / tag
        if result_verdict(load_document(ReleaseSummary, release_dir / SUMMARY)) == "PASSED":
            # What release.yml's attach_result job does once the benchmark succeeded and passed its gate: the
            # release's signed test-result bundle, unchanged, attached to the runner image as an OCI referrer.
            with clock.stage("publication", "Attaching the signed test result to the runner image"):
                attach_test_result(release_dir, built.images["runner"])
        verified = _verify(clock, release_dir, payload, instance, infra_repository, built, tag)

    stages = dict(clock.seconds)
    return ReleaseReport(
        tag=tag,
        release_dir=str(release_dir),
        run_id=run_id,
        status=grading.status,
        score=grading.score,
        counts=grading.counts.model_dump(),
        images=built.images,
        images_reused=built.reused,
        source=source,
        stages=stages,
        trials=_trial_seconds(grading),
        verified=verified,
        publication=publication,
        bytes_pushed=built.bytes_pushed,
        comparison=sealed.comparison.to_json_dict() if sealed.comparison is not None else None,
        reason=grading.reason,
        failed_trials=[{"task": t.task, "trial": t.trial_name, "outcome": t.outcome, "canary": t.canary,
                        "reason": t.reason} for t in grading.trials if t.outcome != "resolved"],
        policy=policy_record,
    )


@dataclass(frozen=True)
class _Built:
    """The images the build stage pushed and the attest stage signed, as the later stages need them."""

    digests: DigestsFile
    images: dict[str, str]
    endpoints: SigstoreEndpoints
    reused: bool
    bytes_pushed: int


def _build_and_attest(clock: StageClock, tag: str, names: ImageNames, work: Path,
                      instance: sigstore_local.LocalInstance, source: LocalSource) -> _Built:
    """Build and push both images of ``source`` at ``tag`` (push time counted apart), then sign them
    as the builder's release workflow."""
    registry = None
    project = source.project
    if project is not None:
        with clock.stage("setup", "Local npm registry (the release's npm agent)"):
            registry = local_npm_registry(project, tag)
    with clock.stage("build", f"Building runner and api images as {names.prefix}{{runner,api}}"), releasing(source, tag):
        digests, results = build_images_with_results(("runner", "api"), names, work / "digests.json", (tag,),
                                                     project=project, release_tag=tag, npm_registry=registry)
    if digests.source.repository != source.repository or digests.source.commit != source.commit:
        raise CheckFailed(f"the build describes {digests.source.repository} at {digests.source.commit}, not the release's "
                          f"source {source.repository} at {source.commit}")
    push_seconds = sum(r.seconds_push for r in results)
    clock.add("build", -push_seconds)
    clock.add("push", push_seconds)
    bytes_pushed = sum(r.stats.bytes_uploaded for r in results)
    images: dict[str, str] = {role: entry.ref for role, entry in digests.images.items()}
    image_policy = builder_image_identity(BUILDER, digests.source.repository, tag, digests.source.commit)
    endpoints = SigstoreEndpoints.private(instance.url, instance.trusted_root)
    with clock.stage("attest", f"Signing and attesting both images as {BUILDER}'s release.yml (cosign)"):
        _attest_as_builder(images, digests.source.repository, digests.source.commit, tag, instance,
                           endpoints, image_policy, work / "image-sboms", digests.agent)
    last_path = state_dir("release") / "last-digests.json"
    reused = last_path.is_file() and json.loads(last_path.read_text("utf-8")) == images
    atomic_write_json(last_path, images)
    return _Built(digests=digests, images=images, endpoints=endpoints, reused=reused, bytes_pushed=bytes_pushed)


def _grade(clock: StageClock, queue: SqliteQueue, run_id: str, *, suite: str, agent: str,
           endpoints: SigstoreEndpoints, policy: InfraPolicy) -> tuple[Grading, threading.Thread | None]:
    """The worker's grading of ``run_id`` (CheckFailed unless it reached a terminal state), and the worker's
    prune after it (``after_work``), started and still running: the caller joins it (``_finish_prune``)."""
    grading: Grading | None = None
    pruning: threading.Thread | None = None
    with clock.stage("worker", f"Running the {suite} suite ({agent}) in the runner image"):
        # The worker checks the images' signatures against the private instance, as it would
        # against public-good in production.
        config = WorkerConfig(image_trust=endpoints, policy=policy)
        sandbox.start()  # the rootless engine the runner runs on (no-op when ours answers)
        for _ in range(20):  # other queued runs may be ahead of ours; infra errors requeue ours
            outcome = run_once(config, prune=False)
            if outcome is None:
                break
            sealed = outcome.run_id if outcome.state in TERMINAL_STATES else None
            if outcome.run_id == run_id and sealed is not None:
                grading = outcome.grading
                pruning = threading.Thread(target=after_work, args=(config, sealed), name=f"prune-{run_id}")
                pruning.start()
                break
            after_work(config, sealed)  # another run's piece of work: pruned before ours is taken, as the worker does
    if grading is None:
        if pruning is not None:  # pragma: no cover - a terminal outcome of ours always carries its grading
            pruning.join()
        record = queue.get_run(run_id)
        raise CheckFailed(f"the worker did not finish run {run_id} (state {record.state}: {record.reason})")
    clock.add("queue_wait", _queue_wait(queue.events(run_id)))
    return grading, pruning


def _finish_prune(clock: StageClock, pruning: threading.Thread | None) -> None:
    """Wait for the worker's prune; the wait left after sealing, publishing and verifying is the ``prune`` stage."""
    if pruning is None:
        return
    with clock.stage("prune", "Pruning the sandbox after the run (staged copies, task images)"):
        pruning.join()


def _trial_seconds(grading: Grading) -> dict[str, float]:
    """The trials' agent, verifier and total seconds, and Harbor's overhead around them."""
    trial_agent = sum(t.agent_seconds or 0.0 for t in grading.trials)
    trial_verifier = sum(t.verifier_seconds or 0.0 for t in grading.trials)
    trial_total = sum(t.total_seconds or 0.0 for t in grading.trials)
    return {"agent": trial_agent, "verifier": trial_verifier, "total": trial_total,
            "harbor_overhead": max(0.0, trial_total - trial_agent - trial_verifier)}


def _seal(clock: StageClock, queue: SqliteQueue, run_id: str, work: Path, seal_job: sigstore_local.GitHubJob,
          policy: InfraPolicy) -> Sealed:
    """Export the graded run, unpack and check it, and seal it as the seal job's identity."""
    with clock.stage("evidence", "Sealing the graded run (export, evidence, signatures)"):
        exported = io.BytesIO()
        export_run(queue.get_run(run_id), queue.run_dir(run_id), exported, comparison=queue.comparison(run_id))
        exported.seek(0)
        sealed_dir = import_run(exported, work / "sealed" / run_id, run_id)
        sealed = seal_run(sealed_dir, signer=local_signer(github_job=seal_job), policy=policy)
    clock.add("evidence", -sealed.evidence.signing_seconds)
    clock.add("signing", sealed.evidence.signing_seconds)
    return sealed


def _publish(clock: StageClock, dist: Path, tag: str, run_id: str, payload: DispatchPayload, artifacts: Path,
             instance: sigstore_local.LocalInstance, infra_repository: str, policy: InfraPolicy) -> dict[str, Any]:
    """Publish the sealed run to ``dist/<tag>``; the publication's report. The publisher re-checks the
    repository against the same infra policy the run was accepted under (``--policy``)."""
    with clock.stage("publication", f"Publishing to {dist / tag}"):
        # What the seal job's `benchseal publish` does, to the local target.
        request = PublicationRequest(
            run_id=run_id, target="local", tag=payload.source.tag, artifacts_dir=str(artifacts),
            options={"trigger": "tag", "root": str(dist), "repository": payload.source.repository,
                     "trusted_root": str(instance.trusted_root), "infra_repository": infra_repository,
                     "builder": str(BUILDER)})
        try:
            published = publish_request(request, LocalTarget(dist, sources=policy))
        except PublishError as exc:
            raise CheckFailed(f"publication of run {run_id} failed: {exc.diagnostics()}") from None
    return {"run_id": run_id, **published.to_json_dict()}


def _verify(clock: StageClock, release_dir: Path, payload: DispatchPayload, instance: sigstore_local.LocalInstance,
            infra_repository: str, built: _Built, tag: str) -> dict[str, Any]:
    """Verify the published release as a consumer would; what was verified."""
    with clock.stage("verification", "Verifying the release (benchseal verify + cosign)"):
        # The expectation is what this release was made for (the dispatched payload), stated
        # explicitly, never read back from the release being verified.
        verified = verify_release(release_dir, repository=payload.source.repository, tag=payload.source.tag,
                                  trusted_root=instance.trusted_root, offline=True, profile="production",
                                  infra_repository=infra_repository, builder=BUILDER)
        # The body's commands, with this machine's cosign and benchseal binaries.
        printed = cosign_commands(release_dir, repository=payload.source.repository, tag=payload.source.tag,
                                  trusted_root=instance.trusted_root, profile="production",
                                  benchseal=local_benchseal(), infra_repository=infra_repository, builder=BUILDER)
        printed += image_command_lines(release_dir, payload.source.repository, payload.source.tag,
                                       trusted_root=instance.trusted_root, profile="production", builder=BUILDER,
                                       infra_repository=infra_repository)
        printed += gh_commands(release_dir, repository=payload.source.repository, tag=payload.source.tag,
                               infra_repository=infra_repository, builder=BUILDER, trusted_root=instance.trusted_root,
                               profile="production", gh=_gh())
        printed += gh_image_lines(release_dir, repository=payload.source.repository, tag=payload.source.tag,
                                  builder=BUILDER, trusted_root=instance.trusted_root, profile="production", gh=_gh(),
                                  infra_repository=infra_repository)
        # The consumer's image checks meanwhile: both only read, and the body's `benchseal verify` (a new
        # interpreter) is the longest of the commands.
        digests = built.digests
        with ThreadPoolExecutor(max_workers=1) as pool:
            commands = pool.submit(run_commands, printed, release_dir, instance.trusted_root)
            image_checks = _verify_images(built.images, digests.source.repository, tag, digests.source.commit,
                                          built.endpoints)
            ran = commands.result()
    return {"benchseal_verify": True, "identity": verified.identity, "issuer": verified.issuer,
            "builder": str(BUILDER), "infra_repository": infra_repository,
            "workflow_repository": verified.workflow_repository, "workflow_ref": verified.workflow_ref,
            "repository": verified.repository, "tag": verified.tag, "commit": verified.commit,
            "cosign_commands": ran, "images": image_checks}
