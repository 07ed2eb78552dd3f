"""policies/verify.yaml: the signer identity and OIDC issuer a consumer must expect."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pipeline.errors import ValidationError
from pipeline.paths import REPO_ROOT

DEFAULT_POLICY = REPO_ROOT / "policies" / "verify.yaml"
POLICY_SCHEMA = "benchseal.verify-policy/v1"
_PLACEHOLDER = re.compile(r"\{([a-z_]+)\}")


@dataclass(frozen=True)
class Expectation:
    profile: str
    identity: str
    issuer: str


def load_policy(path: Path | None = None) -> dict[str, dict[str, str]]:
    import yaml

    path = path or DEFAULT_POLICY
    try:
        data: Any = yaml.safe_load(path.read_text("utf-8"))
    except FileNotFoundError:
        raise ValidationError("--policy", "file does not exist", str(path)) from None
    except yaml.YAMLError as exc:
        raise ValidationError(str(path), f"is not valid YAML: {exc}") from None
    if not isinstance(data, dict) or data.get("schema") != POLICY_SCHEMA:
        raise ValidationError(f"{path}: schema", f"must be {POLICY_SCHEMA!r}", data.get("schema") if isinstance(data, dict) else data)
    profiles = data.get("profiles")
    if not isinstance(profiles, dict) or not profiles:
        raise ValidationError(f"{path}: profiles", "must map profile names to {identity, issuer}")
    out: dict[str, dict[str, str]] = {}
    for name, entry in profiles.items():
        if not isinstance(entry, dict):
            raise ValidationError(f"{path}: profiles.{name}", "must be a mapping")
        for key in ("identity", "issuer"):
            value = entry.get(key)
            if not isinstance(value, str) or not value or value != value.strip():
                raise ValidationError(f"{path}: profiles.{name}.{key}", "must be a non-empty string without surrounding spaces", value)
        out[str(name)] = {"identity": entry["identity"], "issuer": entry["issuer"]}
    return out


def expectation(policy: Path | None, profile: str, summary: dict[str, Any]) -> Expectation:
    """The identity and issuer of ``profile``, placeholders filled from summary.json."""
    profiles = load_policy(policy)
    if profile not in profiles:
        raise ValidationError("--profile", f"must be one of {sorted(profiles)}", profile)
    raw_source = summary.get("source")
    source: dict[str, Any] = raw_source if isinstance(raw_source, dict) else {}
    facts = {"repository": source.get("repository"), "tag": source.get("tag"), "commit": source.get("commit")}

    def fill(template: str) -> str:
        def one(match: re.Match[str]) -> str:
            value = facts.get(match.group(1))
            if not isinstance(value, str) or not value:
                raise ValidationError(f"policy {profile}", f"placeholder {{{match.group(1)}}} needs summary.json source.{match.group(1)}")
            return value

        return _PLACEHOLDER.sub(one, template)

    entry = profiles[profile]
    return Expectation(profile=profile, identity=fill(entry["identity"]), issuer=fill(entry["issuer"]))
