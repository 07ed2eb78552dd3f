"""The production signing path (ambient GitHub Actions OIDC credential) end to end, with the
token endpoint emulated on loopback and the private instance standing in for public-good."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path

import pytest
from sigstore.models import Bundle, ClientTrustConfig, TrustedRoot
from sigstore.verify import Verifier, policy

from pipeline.core.errors import InfrastructureError
from pipeline.evidence.signing import ambient_signer
from pipeline.local import sigstore as sigstore_local

WORKFLOW = "https://github.com/acme/benchseal/.github/workflows/benchmark.yml@refs/heads/main"
REQUEST_TOKEN = "request-token-for-test"


@pytest.fixture()
def actions_token_endpoint(sigstore_instance: object, monkeypatch: pytest.MonkeyPatch) -> Iterator[list[str]]:
    seen: list[str] = []

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            seen.append(self.path)
            if self.headers.get("Authorization") != f"bearer {REQUEST_TOKEN}" or "audience=sigstore" not in self.path:
                self.send_response(403)
                self.end_headers()
                return
            token = sigstore_local.mint_token(sigstore_instance, subject=WORKFLOW,  # type: ignore[arg-type]
                                              claims={"repository": "acme/benchseal", "ref": "refs/heads/main"})
            body = json.dumps({"value": token}).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    server = HTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    monkeypatch.setenv("GITHUB_ACTIONS", "true")
    monkeypatch.setenv("ACTIONS_ID_TOKEN_REQUEST_URL", f"http://127.0.0.1:{server.server_port}/token?api-version=2.0")
    monkeypatch.setenv("ACTIONS_ID_TOKEN_REQUEST_TOKEN", REQUEST_TOKEN)
    yield seen
    server.shutdown()


def test_ambient_credential_signs_as_the_workflow(actions_token_endpoint: list[str], sigstore_instance: object,
                                                  tmp_path: Path) -> None:
    config = ClientTrustConfig.from_json(sigstore_instance.signing_config.read_text())  # type: ignore[attr-defined]
    signer = ambient_signer(trust_config=config, trusted_root=sigstore_instance.trusted_root)  # type: ignore[attr-defined]
    assert signer.identity == WORKFLOW and signer.issuer == sigstore_local.LOCAL_ISSUER
    artifact = tmp_path / "summary.json"
    artifact.write_text("{}\n")
    bundle = signer.sign_file(artifact)
    signer.close()
    verifier = Verifier(trusted_root=TrustedRoot.from_file(str(sigstore_instance.trusted_root)))  # type: ignore[attr-defined]
    verifier.verify_artifact(artifact.read_bytes(), Bundle.from_json(bundle.read_bytes()),
                             policy.Identity(identity=WORKFLOW, issuer=sigstore_local.LOCAL_ISSUER))
    assert actions_token_endpoint and all("audience=sigstore" in p for p in actions_token_endpoint)


def test_missing_id_token_permission_is_reported(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GITHUB_ACTIONS", "true")
    monkeypatch.delenv("ACTIONS_ID_TOKEN_REQUEST_TOKEN", raising=False)
    monkeypatch.delenv("ACTIONS_ID_TOKEN_REQUEST_URL", raising=False)
    with pytest.raises(InfrastructureError, match="ambient OIDC credential"):
        ambient_signer()
