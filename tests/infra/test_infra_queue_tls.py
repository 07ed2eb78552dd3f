"""The multi-host queue as docs/infra.md tells operators to reach it: a password the server asks
for (SCRAM), TLS with the server's name verified (``sslmode=verify-full``), the URL from a file.

A real cluster that accepts nothing else (a ``hostssl`` entry only): the documented URL works
for every benchseal process, the password never appears in any process's argv or environment, in
any output or error, and a URL that would skip TLS, trust another CA or carry a wrong password is
refused in one line."""

from __future__ import annotations

import datetime
import ipaddress
import json
import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from pipeline.core.errors import InfrastructureError
from pipeline.infra.queue.postgres import PostgresQueue
from tests.doubles.postgres import PgCluster, pg_bindir
from tests.fixtures.infra import proc_hits

# The one secret here: checked absent everywhere. Per process, so the /proc scan finds only this test's own
# processes (a neighbour, or another session, running this module holds its own).
PASSWORD = f"Queue-pw-{os.urandom(8).hex()}"


def _ca(name: str) -> tuple[ec.EllipticCurvePrivateKey, x509.Certificate]:
    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
    now = datetime.datetime.now(datetime.UTC)
    cert = (x509.CertificateBuilder().subject_name(subject).issuer_name(subject).public_key(key.public_key())
            .serial_number(x509.random_serial_number()).not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
            .sign(key, hashes.SHA256()))
    return key, cert


def _server(ca_key: ec.EllipticCurvePrivateKey, ca: x509.Certificate) -> tuple[bytes, bytes]:
    key = ec.generate_private_key(ec.SECP256R1())
    now = datetime.datetime.now(datetime.UTC)
    cert = (x509.CertificateBuilder().subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "localhost")]))
            .issuer_name(ca.subject).public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5)).not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.SubjectAlternativeName([x509.DNSName("localhost"),
                                                         x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), critical=False)
            .sign(ca_key, hashes.SHA256()))
    return (cert.public_bytes(serialization.Encoding.PEM),
            key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()))


@pytest.fixture(scope="module")
def secure(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    bindir = pg_bindir()
    if bindir is None:
        pytest.fail("PostgreSQL is not installed (no /usr/lib/postgresql/*/bin/initdb): run `make setup`")
    root = tmp_path_factory.mktemp("queue-tls")
    ca_key, ca = _ca("benchseal test queue CA")
    _, other_ca = _ca("some other CA")
    (root / "ca.pem").write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    (root / "other-ca.pem").write_bytes(other_ca.public_bytes(serialization.Encoding.PEM))
    cluster = PgCluster(bindir, password=PASSWORD, tls=_server(ca_key, ca))
    try:
        with psycopg.connect(cluster.url("postgres"), autocommit=True) as conn:
            conn.execute('CREATE DATABASE "secured"')
        yield {"cluster": cluster, "root": root, "port": cluster.port}
    finally:
        cluster.close()


def _url(secure: dict[str, Any], *, password: str = PASSWORD, host: str = "localhost", query: str | None = None) -> str:
    query = query if query is not None else f"sslmode=verify-full&sslrootcert={secure['root'] / 'ca.pem'}"
    return f"postgresql://benchseal:{password}@{host}:{secure['port']}/secured?{query}"


class _SecretScanner(threading.Thread):
    """Every process's argv and environment, scanned for the password until stopped."""

    def __init__(self) -> None:
        super().__init__(daemon=True)
        self.hits: list[str] = []
        self.scans = 0
        self.stop = threading.Event()

    def run(self) -> None:
        while not self.stop.is_set():
            # This test process holds the password in memory, not in its argv or environment.
            self.hits.extend(proc_hits([PASSWORD.encode()], skip={os.getpid()}))
            self.scans += 1


def test_every_process_reaches_the_tls_queue_by_url_file_and_the_password_shows_nowhere(secure, tmp_path, make_payload):
    url_file = tmp_path / "queue-url"
    url_file.write_text(_url(secure) + "\n")
    url_file.chmod(0o600)
    payload = tmp_path / "payload.json"
    payload.write_text(json.dumps(make_payload(correlation_id="queue-tls-000001")))
    env = {k: v for k, v in os.environ.items() if not k.startswith("BENCHSEAL_QUEUE_URL")}
    env["BENCHSEAL_HOME"] = str(tmp_path / "home")
    scanner = _SecretScanner()
    scanner.start()
    results = []
    # Control: the scanner does see the password where it IS in an argv (one process that never forks).
    control = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(2)", PASSWORD])
    try:
        # By option, and by environment reference (the file's path, never the URL).
        for args, extra in ((["infra", "migrate", "--queue-url-file", str(url_file)], {}),
                            (["infra", "accept", "--payload", str(payload), "--json"],
                             {"BENCHSEAL_QUEUE_URL_FILE": str(url_file)}),
                            (["infra", "status", "--summary", "--queue-url-file", str(url_file)], {})):
            results.append(subprocess.run([sys.executable, "-m", "pipeline", *args], capture_output=True, text=True,
                                          env={**env, **extra}, timeout=120, check=False))
            assert results[-1].returncode == 0, results[-1].stderr
        control.wait(timeout=30)
    finally:
        scanner.stop.set()
        scanner.join()
        if control.poll() is None:
            control.kill()
    assert scanner.scans > 3 and {hit.split("/")[2] for hit in scanner.hits} == {str(control.pid)}
    assert json.loads(results[0].stdout)["to"] >= 4
    run_id = json.loads(results[1].stdout)["run_id"]
    queue = json.loads(results[2].stdout)["queue"]
    assert queue["backend"] == "postgresql" and queue["depth"] == 1 and PASSWORD not in queue["location"]
    for result in results:
        assert PASSWORD not in result.stdout + result.stderr
    # The session really is TLS, on the verified server.
    with PostgresQueue(_url(secure), runs_dir=tmp_path / "runs") as q:
        assert [r.run_id for r in q.list_runs()] == [run_id]
    with psycopg.connect(_url(secure)) as conn:
        assert conn.execute("SELECT ssl FROM pg_stat_ssl WHERE pid = pg_backend_pid()").fetchone() == (True,)
    log = secure["cluster"].log.read_text(errors="replace")
    assert PASSWORD not in log


@pytest.mark.parametrize(("case", "build", "says"), [
    ("no TLS", lambda s: _url(s, query="sslmode=disable"), "no encryption"),
    ("another CA", lambda s: _url(s, query=f"sslmode=verify-full&sslrootcert={s['root'] / 'other-ca.pem'}"),
     "certificate verify failed"),
    ("wrong password", lambda s: _url(s, password="Not-the-pw-0000"), "password authentication failed"),
    # The right server, reached under a name its certificate does not carry (verify-full checks it).
    ("another name", lambda s: _url(s, host="queue.example", query=f"hostaddr=127.0.0.1&sslmode=verify-full"
                                                                  f"&sslrootcert={s['root'] / 'ca.pem'}"),
     "does not match host name"),
])
def test_a_url_that_skips_or_fails_tls_or_auth_is_refused_in_one_line(secure, tmp_path, case, build, says):
    url = build(secure)
    with pytest.raises(InfrastructureError) as refused:
        PostgresQueue(url, runs_dir=tmp_path / "runs", reconnect_seconds=0.3)
    message = refused.value.diagnostics()
    assert says in message and "\n" not in message.strip()
    assert PASSWORD not in message and "Not-the-pw" not in message
