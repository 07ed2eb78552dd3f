"""A throwaway PostgreSQL cluster for tests and benchmarks (the queue's multi-host backend).

``initdb`` refuses to run as root, so the cluster belongs to the ``postgres`` user and lives in
its own temp dir (not under pytest's, which is mode 0700 root); it serves on a Unix socket only
(``listen_addresses=''``). Its postmaster pid is recorded and only that cluster is ever stopped.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
from pathlib import Path


def pg_bindir() -> Path | None:
    """The newest installed PostgreSQL's bin dir (Debian 12 ships 15, 13 ships 17): never hard-coded."""
    import glob

    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"), key=lambda p: tuple(int(x) for x in Path(p).parts[-3].split(".") if x.isdigit()))
    return Path(found[-1]).parent if found else None


class PgCluster:
    """A throwaway cluster owned by the postgres user, on a Unix socket in its own temp dir.

    Only this cluster is ever stopped (by its data dir, then by its recorded pid).
    """

    def __init__(self, bindir: Path, *, durable: bool = False, parent: Path | None = None,
                 password: str | None = None, tls: tuple[bytes, bytes] | None = None) -> None:
        """``password``: the ``benchseal`` role needs it (SCRAM) on every connection. ``tls`` (server
        certificate and key, PEM): the cluster also listens on 127.0.0.1:``self.port``, TLS only
        (a ``hostssl`` entry and no plain ``host`` one)."""
        import pwd
        import socket
        import tempfile

        self.bindir = bindir
        # Not under pytest's tmp dir: that is mode 0700 root, which the postgres user cannot traverse.
        # ``parent`` (default: the system temp dir) must be traversable by the postgres user.
        self.root = Path(tempfile.mkdtemp(prefix="benchseal-pg-", dir=parent))
        self.data, self.sock, self.log = self.root / "data", self.root / "sock", self.root / "postgres.log"
        pw = pwd.getpwnam("postgres")
        for path in (self.root, self.sock):
            path.mkdir(exist_ok=True)
            os.chown(path, pw.pw_uid, pw.pw_gid)
        self.pid: int | None = None
        # Tests trade durability for speed (fsync=off); a benchmark measures the durable default.
        self.durable = durable
        self._count = 0
        self.password = password
        self.port: int | None = None
        method = "trust" if password is None else "scram-sha-256"
        pwfile = self.root / "pwfile"
        if password is not None:
            pwfile.write_text(password + "\n")
            os.chown(pwfile, pw.pw_uid, pw.pw_gid)
            pwfile.chmod(0o600)
        self._run("initdb", "-D", str(self.data), "-A", method, *(["--pwfile", str(pwfile)] if password else []),
                  "-U", "benchseal", "-E", "UTF8", "--no-sync")
        pwfile.unlink(missing_ok=True)
        if tls is not None:
            for name, data, mode in (("server.crt", tls[0], 0o644), ("server.key", tls[1], 0o600)):
                (self.data / name).write_bytes(data)
                os.chown(self.data / name, pw.pw_uid, pw.pw_gid)
                (self.data / name).chmod(mode)
            (self.data / "pg_hba.conf").write_text(f"local all all {method}\nhostssl all all 127.0.0.1/32 {method}\n")
            with socket.socket() as probe:  # a free loopback port (the cluster binds it right after)
                probe.bind(("127.0.0.1", 0))
                self.port = int(probe.getsockname()[1])
        self.start()

    def _run(self, tool: str, *args: str) -> subprocess.CompletedProcess[str]:
        result = subprocess.run(["runuser", "-u", "postgres", "--", str(self.bindir / tool), *args],
                                capture_output=True, text=True, timeout=120, check=False)
        if result.returncode != 0:
            raise RuntimeError(f"{tool} failed: {result.stdout}{result.stderr}")
        return result

    def start(self) -> None:
        options = f"-k {self.sock} -c max_connections=100"
        if self.port is None:
            options += " -c listen_addresses=''"
        else:
            options += (f" -c listen_addresses=127.0.0.1 -p {self.port}"
                        " -c ssl=on -c ssl_cert_file=server.crt -c ssl_key_file=server.key")
        if not self.durable:
            options += " -c fsync=off"
        self._run("pg_ctl", "-D", str(self.data), "-o", options, "-l", str(self.log), "-w", "-t", "60", "start")
        self.pid = int((self.data / "postmaster.pid").read_text().splitlines()[0])

    def stop(self, mode: str = "fast") -> None:
        if self.pid is None:
            return
        subprocess.run(["runuser", "-u", "postgres", "--", str(self.bindir / "pg_ctl"), "-D", str(self.data),
                        "-m", mode, "-w", "-t", "60", "stop"], capture_output=True, text=True, timeout=120, check=False)
        try:
            os.kill(self.pid, 0)
        except ProcessLookupError:
            pass
        else:
            os.kill(self.pid, signal.SIGKILL)  # our own postmaster only, by its recorded pid
        self.pid = None

    def restart(self, mode: str = "immediate") -> None:
        """Stop (``immediate``: like a crash, no checkpoint) and start again on the same socket."""
        self.stop(mode)
        self.start()

    def url(self, database: str) -> str:
        user = "benchseal" if self.password is None else f"benchseal:{self.password}"
        return f"postgresql://{user}@/{database}?host={self.sock}" + ("" if self.port is None else f"&port={self.port}")

    def new_database(self) -> str:
        """A fresh database at the current schema version; returns its URL."""
        import psycopg

        from pipeline.infra.queue.postgres import PostgresQueue

        self._count += 1
        name = f"q{os.getpid()}_{self._count}"
        with psycopg.connect(self.url("postgres"), autocommit=True) as conn:
            conn.execute(f'CREATE DATABASE "{name}"')
        url = self.url(name)
        with PostgresQueue(url, check_schema=False) as queue:
            queue.migrate()
        return url

    def cpu_seconds(self) -> float:
        """CPU time (user + system) used so far by this cluster: its postmaster, its live processes
        and every process of it that has exited (reaped by the postmaster, so in its children's time)."""
        if self.pid is None:
            raise RuntimeError("the cluster is not running")
        ticks = 0
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit():
                continue
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue  # exited meanwhile: counted in the postmaster's children's time
            fields = stat[stat.rindex(")") + 2:].split()
            pid, ppid = int(entry.name), int(fields[1])
            if pid == self.pid:
                ticks += sum(int(v) for v in fields[11:15])  # utime, stime, cutime, cstime
            elif ppid == self.pid:
                ticks += int(fields[11]) + int(fields[12])
        return ticks / os.sysconf("SC_CLK_TCK")

    def close(self) -> None:
        self.stop()
        shutil.rmtree(self.root, ignore_errors=True)


