"""How the infra host runs the API image (deploy/benchseal-api.service, ``benchseal api container``).

The image runs BY DIGEST (``--pull never``: ``benchseal api check-image`` pulled it by digest and
checked its signatures just before), as the service user's uid and gid, with a read-only root
filesystem, no capability, no new privileges, bounded processes and memory, published on
127.0.0.1 only. It sees the queue and nothing else of the host, read-only: the SQLite queue's
directory (the file, its ``-wal`` and ``-shm``), or the read-only role's PostgreSQL URL file. The API
inside opens the queue read-only as well (``pipeline.infra.queue.reader``).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from pipeline.core.digests import ImageRef

CONTAINER_NAME = "benchseal-api"
CONTAINER_PORT = 8080
QUEUE_MOUNT = "/queue"
URL_MOUNT = "/run/benchseal/queue-url"


@dataclass(frozen=True)
class ApiContainer:
    image: ImageRef
    uid: int
    gid: int
    port: int
    queue_db: Path | None  # the SQLite queue; None with ``queue_url_file``
    queue_url_file: Path | None = None  # PostgreSQL: the read-only role's URL (never in argv)
    release_url_base: str = "https://github.com"
    name: str = CONTAINER_NAME
    # Who seals the releases (checked by pipeline.api.pages.verify_pins): the pages' verify command.
    infra_repository: str | None = None
    builder: str | None = None


def docker_argv(spec: ApiContainer) -> list[str]:
    """The ``docker run`` command of the API container (see the module docstring)."""
    if (spec.queue_db is None) == (spec.queue_url_file is None):
        raise ValueError("the API container reads exactly one queue: a SQLite file or a PostgreSQL URL file")
    for path in (spec.queue_db, spec.queue_url_file):
        if path is not None and (not path.is_absolute() or any(c in str(path) for c in ",=\n")):
            raise ValueError(f"{path}: a mount source must be an absolute path without ',' '=' or a newline")
    argv = ["docker", "run", "--rm", "--name", spec.name, "--pull", "never", "--read-only",
            "--cap-drop", "ALL", "--security-opt", "no-new-privileges", "--user", f"{spec.uid}:{spec.gid}",
            "--pids-limit", "128", "--memory", "512m", "--publish", f"127.0.0.1:{spec.port}:{CONTAINER_PORT}"]
    serve = ["benchseal", "api", "serve", "--host", "0.0.0.0", "--port", str(CONTAINER_PORT),  # noqa: S104 -- inside its own network namespace; published on 127.0.0.1 only
             "--release-url-base", spec.release_url_base]
    if spec.infra_repository is not None and spec.builder is not None:
        serve += ["--infra-repo", spec.infra_repository, "--builder", spec.builder]
    if spec.queue_db is not None:
        argv += ["--mount", f"type=bind,source={spec.queue_db.parent},target={QUEUE_MOUNT},readonly"]
        serve += ["--queue-db", f"{QUEUE_MOUNT}/{spec.queue_db.name}"]
    elif spec.queue_url_file is not None:
        argv += ["--mount", f"type=bind,source={spec.queue_url_file},target={URL_MOUNT},readonly"]
        serve += ["--queue-url-file", URL_MOUNT]
    return [*argv, spec.image.ref, *serve]
