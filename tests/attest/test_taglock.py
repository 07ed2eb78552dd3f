"""pipeline.attest.taglock: writers of one digest's tags take turns, so none drops another's entry.

Real cosign, the private Sigstore instance and the local registry: four jobs (four identities) sign
and attest ONE image digest at the same moment; afterwards every identity's signature and both of
its attestations verify. cosign rewrites the digest's .sig tag whole (read, append, write), and so does
attaching a bundle the referrers fallback index (``sha256-<hex>``, pipeline.attest.referrers), so
without the lock some of them are lost (seen in a parallel test run, when the attestations were
cosign's .att: "none of the attestations matched the predicate type: cyclonedx").
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

from pipeline.attest.images import BuildInvocation, ImageSigner, SigstoreEndpoints, provenance_predicate, verify_image
from pipeline.attest.taglock import digest_tags_locked
from pipeline.core.digests import parse_ref
from pipeline.local import sigstore as sigstore_local
from pipeline.local.sigstore import GitHubJob
from pipeline.verify.external import image_identity
from tests.attest.test_image_attestations import _unique_image

COMMIT = "e" * 40


def test_concurrent_signers_of_one_digest_keep_every_entry(sigstore_instance: Any, tmp_path: Path) -> None:
    endpoints = SigstoreEndpoints.private(sigstore_instance.url, sigstore_instance.trusted_root)
    ref = _unique_image("taglock")
    sbom = tmp_path / "sbom.cdx.json"
    sbom.write_text(json.dumps({"bomFormat": "CycloneDX", "specVersion": "1.6", "version": 1, "components": []}))
    repositories = [f"acme/app{k}" for k in range(4)]
    errors: list[BaseException] = []
    start = threading.Barrier(len(repositories))

    def sign(repository: str) -> None:
        job = GitHubJob(repository=repository, ref="refs/tags/v1.0.0", sha=COMMIT, workflow_file="tag.yml")
        session = sigstore_local.open_actions_session(sigstore_instance, job)
        invocation = BuildInvocation(repository=repository, ref=job.ref, commit=COMMIT,
                                     workflow_ref=f"{repository}/.github/workflows/tag.yml@{job.ref}",
                                     run_url=f"https://github.com/{repository}/actions/runs/1/attempts/1")
        signer = ImageSigner(endpoints, allow_http_registry=True, actions_env=session.environ())
        start.wait()
        try:
            signer.sign_and_attest(ref, provenance=provenance_predicate(parse_ref(ref), "runner", invocation), sbom=sbom)
        except BaseException as exc:  # reported below, with the others
            errors.append(exc)

    threads = [threading.Thread(target=sign, args=(repository,)) for repository in repositories]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    for repository in repositories:
        verify_image(ref, image_identity(repository, "v1.0.0", COMMIT), endpoints, allow_http_registry=True)


def _flocks() -> list[tuple[bool, int, str]]:
    """``/proc/locks``' flock entries: (blocked waiter, pid, device:inode)."""
    found = []
    for line in Path("/proc/locks").read_text().splitlines():
        fields = line.split()[1:]
        waiting = fields[:1] == ["->"]
        fields = fields[1:] if waiting else fields
        if fields and fields[0] == "FLOCK":
            found.append((waiting, int(fields[3]), fields[4]))
    return found


def test_the_lock_is_one_holder_at_a_time_across_processes(tmp_path: Path) -> None:
    """Another process (another home, another test worker) holds the lock; this one waits for it, then
    gets it. Waits on events, never on a time: the child says when it holds the lock, and the kernel's
    lock table shows this process blocked on that same file before the child is let go."""
    image = parse_ref("127.0.0.1:5055/benchseal-taglock/x@sha256:" + "1" * 64)
    order = tmp_path / "order"
    child = ("import sys; from pipeline.attest.taglock import digest_tags_locked; "
             "from pipeline.core.digests import parse_ref\n"
             "with digest_tags_locked(parse_ref(sys.argv[1])):\n"
             "    print('held', flush=True)\n"
             "    sys.stdin.readline()\n"
             "    open(sys.argv[2], 'a').write('child\\n')\n")
    proc = subprocess.Popen([sys.executable, "-c", child, image.ref, str(order)], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True, cwd=Path(__file__).resolve().parents[2],
                            env=dict(os.environ))
    acquired = threading.Event()

    def holder() -> None:
        with digest_tags_locked(image):
            acquired.set()
            with order.open("a") as handle:
                handle.write("holder\n")

    waiter = threading.Thread(target=holder)
    try:
        assert proc.stdout is not None and proc.stdin is not None
        assert proc.stdout.readline() == "held\n"  # the child holds the lock from here until told to go on
        (inode,) = {inode for waiting, pid, inode in _flocks() if pid == proc.pid and not waiting}
        waiter.start()
        deadline = time.monotonic() + 60  # a bound for a wedged machine, not a pace: the loop ends on the event
        while (True, os.getpid(), inode) not in _flocks():
            assert not acquired.is_set(), "took the lock while another process held it"
            assert time.monotonic() < deadline, "never blocked on the held lock"
            time.sleep(0.01)
        assert not acquired.is_set()
        proc.stdin.write("go\n")
        proc.stdin.close()
        assert proc.wait(timeout=30) == 0
        assert acquired.wait(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        if waiter.is_alive():
            waiter.join(timeout=30)
    assert order.read_text().splitlines() == ["child", "holder"]
    with digest_tags_locked(parse_ref("127.0.0.1:5055/benchseal-taglock/y@sha256:" + "2" * 64)):
        with digest_tags_locked(image):  # another digest's lock does not hold this one
            pass
