"""A Unix socket under a deep directory (a runner's temp dir in a workflow job) is still bound where it was
asked (pipeline.core.fsutil.bind_unix): the engine proxy's and the model relay's listeners use it."""

from __future__ import annotations

import os
import socket
import stat
from pathlib import Path

import pytest

from pipeline.core.fsutil import UNIX_PATH_MAX, bind_unix


@pytest.mark.parametrize("depth", [1, 12])
def test_a_socket_is_bound_at_its_path_however_deep(tmp_path: Path, depth: int) -> None:
    directory = tmp_path.joinpath(*(["d" * 20] * depth))
    directory.mkdir(parents=True)
    path = directory / "docker.sock"
    assert (len(str(path)) > UNIX_PATH_MAX) is (depth > 1)
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as listener:
        bind_unix(listener, path)
        listener.listen(1)
        assert stat.S_ISSOCK(path.stat().st_mode)
        fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
        try:
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as client:
                client.connect(f"/proc/self/fd/{fd}/docker.sock")
                accepted, _ = listener.accept()
                client.sendall(b"ok")
                assert accepted.recv(2) == b"ok"
                accepted.close()
        finally:
            os.close(fd)
