"""OpenAPI validation of every emulator request and response.

The spec is GitHub's official description (subset, see openapi/PROVENANCE.md).
``SPEC_CORRECTIONS`` is the one place where it is changed: each entry names a
real difference between the document and what GitHub and PyGithub do.
"""

from __future__ import annotations

import copy
import json
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

SPEC_FILE = Path(__file__).with_name("openapi") / "github-rest-subset.json"
# openapi-core matches the request URL against a server; the emulator's real
# host:port varies, so validation always uses this fixed origin.
VALIDATION_ORIGIN = "http://github.emulator"
# Error statuses the emulator (or an injected fault) may answer with. GitHub
# documents only some per operation; a GitHub-shaped error body is still checked.
ERROR_STATUSES = ("400", "401", "403", "404", "409", "422", "429", "500", "502", "503", "504")

Spec = dict[str, Any]


def _servers(spec: Spec) -> None:
    spec["servers"] = [{"url": VALIDATION_ORIGIN}]
    for item in spec["paths"].values():
        for operation in item.values():
            if isinstance(operation, dict):
                operation.pop("servers", None)


def _upload_content_types(spec: Spec) -> None:
    body = spec["paths"]["/repos/{owner}/{repo}/releases/{release_id}/assets"]["post"]["requestBody"]
    body["content"]["*/*"] = copy.deepcopy(body["content"]["application/octet-stream"])


def _created_filter(spec: Spec) -> None:
    spec["components"]["parameters"]["created"]["schema"].pop("format", None)


def _nullable_enums(spec: Spec) -> None:
    def walk(node: object) -> None:
        if isinstance(node, dict):
            if node.get("nullable") is True and isinstance(node.get("enum"), list) and None not in node["enum"]:
                node["enum"].append(None)
            for value in node.values():
                walk(value)
        elif isinstance(node, list):
            for value in node:
                walk(value)

    walk(spec["components"]["schemas"])


def _error_statuses(spec: Spec) -> None:
    spec["components"]["responses"]["emulator-error"] = {
        "description": "GitHub error body (status not documented for this operation)",
        "content": {"application/json": {"schema": {"$ref": "#/components/schemas/basic-error"}}},
    }
    for item in spec["paths"].values():
        for operation in item.values():
            if isinstance(operation, dict) and "responses" in operation:
                for status in ERROR_STATUSES:
                    operation["responses"].setdefault(status, {"$ref": "#/components/responses/emulator-error"})


# (name, why, function). Keep this list short; docs/github.md repeats it.
SPEC_CORRECTIONS: tuple[tuple[str, str, Callable[[Spec], None]], ...] = (
    ("servers", "one fixed validation origin; the upload operation's own server (uploads.github.com) is dropped: "
     "in the GitHub Enterprise layout uploads live under /api/uploads on the same host", _servers),
    ("upload-content-type", "PyGithub sends the Content-Type guessed from the file name, not only "
     "application/octet-stream (GitHub accepts any media type)", _upload_content_types),
    ("created-filter", "workflow-run `created` takes search syntax ('>=2026-01-01T00:00:00Z'), "
     "but is typed format: date-time", _created_filter),
    ("nullable-enums", "nullable enums (check run / workflow run conclusion) lack null in their enum list",
     _nullable_enums),
    ("error-statuses", "real error statuses (401, 404 on GET release, 403/429 rate limits, 5xx) are "
     "undocumented for many operations; they are added with the basic-error body", _error_statuses),
)


def _drop_empty_label(operation: str, query: Any) -> Any:
    if operation == "repos/upload-release-asset" and query.get("label") == "":
        from werkzeug.datastructures import ImmutableMultiDict

        return ImmutableMultiDict([(k, v) for k, v in query.items(multi=True) if k != "label"])
    return query


# Request-side corrections (openapi-core's allowEmptyValue is deprecated, so
# this one is applied to the request before validation).
REQUEST_CORRECTIONS: tuple[tuple[str, str, Callable[[str, Any], Any]], ...] = (
    ("upload-empty-label", "PyGithub always sends `label=` (empty) on upload; openapi-core rejects empty values",
     _drop_empty_label),
)

# Not a spec change but handled by the router: `{ref}` in git ref paths may
# contain '/' (x-multi-segment: true); the router passes path parameters to
# openapi-core directly, so its single-segment template matching is bypassed.


@cache
def corrected_spec() -> str:
    spec: Spec = json.loads(SPEC_FILE.read_text(encoding="utf-8"))
    for _name, _why, apply in SPEC_CORRECTIONS:
        apply(spec)
    return json.dumps(spec)


@dataclass(frozen=True)
class Violation:
    """One request or response that does not match the spec."""

    operation: str
    method: str
    path: str
    kind: str  # "request" | "response" | "unrouted"
    message: str

    def __str__(self) -> str:
        return f"{self.kind} {self.method} {self.path} ({self.operation}): {self.message}"


class _Request:
    def __init__(
        self,
        method: str,
        path_pattern: str,
        path_params: Mapping[str, str],
        query: Any,
        headers: Any,
        body: bytes | None,
        content_type: str,
    ) -> None:
        from openapi_core.datatypes import RequestParameters
        from werkzeug.datastructures import ImmutableMultiDict

        self.host_url = VALIDATION_ORIGIN
        self.path = path_pattern
        self.path_pattern = path_pattern
        self.method = method.lower()
        self.parameters = RequestParameters(
            path=dict(path_params), query=query, header=headers, cookie=ImmutableMultiDict()
        )
        self.body = body
        self.content_type = content_type


class _Response:
    def __init__(self, status: int, headers: Any, data: bytes, content_type: str) -> None:
        self.status_code = status
        self.headers = headers
        self.data = data
        self.content_type = content_type


class SpecValidator:
    """Validates request/response pairs; thread-safe after construction."""

    _lock = threading.Lock()
    _shared: Any = None

    def __init__(self) -> None:
        with SpecValidator._lock:
            if SpecValidator._shared is None:
                from openapi_core import OpenAPI

                SpecValidator._shared = OpenAPI.from_dict(json.loads(corrected_spec()))
        self._api = SpecValidator._shared

    def validate(
        self,
        *,
        operation: str,
        method: str,
        path_pattern: str,
        path_params: Mapping[str, str],
        query: Any,
        request_headers: Any,
        request_body: bytes | None,
        request_content_type: str,
        status: int,
        response_headers: Any,
        response_body: bytes,
        response_content_type: str,
        check_request: bool = True,
    ) -> list[Violation]:
        for _name, _why, correct in REQUEST_CORRECTIONS:
            query = correct(operation, query)
        request = _Request(method, path_pattern, path_params, query, request_headers, request_body,
                           request_content_type)
        response = _Response(status, response_headers, response_body, response_content_type)
        found: list[Violation] = []
        if check_request:
            try:
                self._api.validate_request(request)
            except Exception as exc:  # openapi-core raises a family of errors; all are violations
                found.append(Violation(operation, method, path_pattern, "request", _describe(exc)))
        try:
            self._api.validate_response(request, response)
        except Exception as exc:
            found.append(Violation(operation, method, path_pattern, "response", _describe(exc)))
        return found


def _describe(exc: BaseException) -> str:
    parts = [f"{type(exc).__name__}: {exc}"]
    cause = exc.__cause__ or exc.__context__
    for error in getattr(cause, "schema_errors", None) or getattr(exc, "schema_errors", None) or ():
        parts.append(f"  {'/'.join(str(p) for p in error.path)}: {error.message}")
    if cause is not None and len(parts) == 1:
        parts.append(f"  caused by {type(cause).__name__}: {cause}")
    return "\n".join(parts)[:4000]
