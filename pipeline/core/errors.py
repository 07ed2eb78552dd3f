"""The one error hierarchy of benchseal.

Every error carries a human message from ``diagnostics()`` and the exit code
the CLI returns for it: 2 for usage errors (bad input from the caller), 1 for
failed checks (the world is not as it must be).

Messages echo caller-controlled text (payload keys and values, tag names, API
answers). ``str()`` and ``diagnostics()`` of every error, subclasses included,
pass through ``escape_text``: no raw newline, CR, ESC, other control or
format character (bidi overrides, zero-width marks) and no line separator ever
reaches a terminal or an Actions log, so input cannot forge a ``::error::`` line
or recolour the terminal. Each message is one line.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any


def _escape_char(char: str) -> str:
    code = ord(char)
    if code < 0x100:
        return f"\\x{code:02x}"
    if code < 0x10000:
        return f"\\u{code:04x}"
    return f"\\U{code:08x}"


def escape_text(text: str) -> str:
    """``text`` with every non-printable character written as a ``\\xNN``/``\\uNNNN`` escape.

    Non-printable is Python's ``str.isprintable`` (categories Cc, Cf, Cs, Co, Cn, Zl, Zp
    and every space other than U+0020): newline, CR, tab, ESC, DEL, C1 controls, bidi
    overrides and isolates, zero-width characters, lone surrogates. Idempotent: the
    result is printable, so escaping it again changes nothing.
    """
    if text.isprintable():
        return text
    return "".join(char if char.isprintable() else _escape_char(char) for char in text)


def _escaping(method: Callable[..., str]) -> Callable[..., str]:
    @functools.wraps(method)
    def wrapper(self: Any) -> str:
        return escape_text(method(self))

    setattr(wrapper, "__benchseal_escaped__", True)  # noqa: B010 -- a marker on the function object
    return wrapper


# How every verb prints an error on stderr, one line; the worker reads the runner's from its log.
CLI_ERROR_PREFIX = "benchseal: error: "


class Error(Exception):
    """Base of every error benchseal raises on purpose."""

    exit_code: int = 1

    def __init_subclass__(cls, **kwargs: Any) -> None:
        # Every subclass's own diagnostics()/__str__ is escaped too, wherever it is defined.
        super().__init_subclass__(**kwargs)
        for name in ("diagnostics", "__str__"):
            method = cls.__dict__.get(name)
            if callable(method) and not getattr(method, "__benchseal_escaped__", False):
                setattr(cls, name, _escaping(method))

    @_escaping
    def __str__(self) -> str:
        return super().__str__()

    @_escaping
    def diagnostics(self) -> str:
        return str(self)


class UsageError(Error):
    """The caller gave input that breaks a rule: exit 2."""

    exit_code = 2


class ValidationError(UsageError):
    """A named field breaks a named rule."""

    def __init__(self, field: str, rule: str, value: object | None = None) -> None:
        self.field = field
        self.rule = rule
        self.value = value
        super().__init__(f"{field}: {rule}")

    def diagnostics(self) -> str:
        shown = "" if self.value is None else f" (got {_shorten(self.value)})"
        return f"invalid {self.field}: {self.rule}{shown}"


class TagIsARef(ValidationError):
    """A git ref (``refs/tags/v1``) where a tag name (``v1``) is required: its own class, so the git tag
    rule's refusal of refs is told apart from its character and component rules
    (``pipeline.core.contracts.validate_git_tag``)."""


class CheckFailed(Error):
    """A check that guards the chain did not pass: exit 1."""

    exit_code = 1


class NotAQueue(CheckFailed):
    """The file or database named as the queue holds no benchseal queue (absent, empty, not SQLite, none
    of the queue's tables): a reader never creates one. A verb whose option named it says so as a
    usage error (``api serve``: exit 2); elsewhere it is a failed check like any unopenable queue."""


class ReleaseRefused(CheckFailed):
    """``benchseal verify`` refused a release: each subclass is one rule, so a caller (and a test) tells the
    rules apart by class, never by message text. ``subject`` names the file (or option) it failed on; the
    message is the one line the CLI prints."""

    def __init__(self, message: str, *, subject: str) -> None:
        self.subject = subject
        super().__init__(message)


class TrustedRootUnavailable(ReleaseRefused):
    """The public-good trusted root could not be loaded (no TUF cache offline, no network online)."""


class EntryNotPlain(ReleaseRefused):
    """An entry of the release is a symbolic link, a FIFO, a device, or a directory where a file must be."""


class EvidenceMissing(ReleaseRefused):
    """A file the release must carry (summary.json, SHA256SUMS and its bundle, a required bundle, the file a
    bundle signs) is absent."""


class NotValidJson(ReleaseRefused):
    """A JSON document of the release is not strict JSON (duplicate keys, NaN/Infinity, bad syntax)."""


class BundleInvalid(ReleaseRefused):
    """A ``*.sigstore.json`` file is not a Sigstore bundle sigstore-python can load."""


class BundleKindWrong(ReleaseRefused):
    """An in-toto statement signed as a message signature, or any other file signed as a DSSE envelope."""


class SignatureRefused(ReleaseRefused):
    """A bundle does not verify for its file against the expected signer (sigstore's VerificationError:
    certificate chain, transparency log, identity, issuer, workflow repository and ref)."""


class SignedStatementMismatch(ReleaseRefused):
    """A verified DSSE envelope carries another payload type than in-toto, or other bytes than its file."""


class ChecksumMismatch(ReleaseRefused):
    """SHA256SUMS (or evidence-SHA256SUMS) is malformed, lists a missing file or another hash, or leaves a
    file of the release uncovered."""


class SummaryInvalid(ReleaseRefused):
    """summary.json breaks its model (``pipeline.core.documents.ReleaseSummary``)."""


class SourceMismatch(ReleaseRefused):
    """summary.json is for another repository or tag than the consumer expects."""


class ProvenanceMismatch(ReleaseRefused):
    """A provenance statement breaks its model or does not bind summary.json, its images and its source."""


class ImageEvidenceMismatch(ReleaseRefused):
    """An image manifest or SBOM of the release is not the one of the digest summary.json names."""


class TrialEvidenceMismatch(ReleaseRefused):
    """trial-results.json does not carry exactly the plan and result.json files evidence-SHA256SUMS lists."""


class ClaimNotSupported(ReleaseRefused):
    """summary.json's trials, counts, score, interval, per-task counts or comparison are not what the trial
    evidence gives when graded again."""


class ReleaseUnavailable(ReleaseRefused):
    """``verify OWNER/REPO@TAG``: the GitHub release cannot be had as benchseal evidence (no such repository
    or release, none of its evidence published, GitHub unreachable, refusing or rate-limiting, a download
    failing); ``subject`` is the reference."""


class AssetRefused(ReleaseRefused):
    """``verify OWNER/REPO@TAG``: an asset is not one plain file name, is listed twice, or is missing while
    SHA256SUMS lists it."""


class AssetTooLarge(AssetRefused):
    """``verify OWNER/REPO@TAG``: an asset above the per-asset bound (``subject`` the asset), or all of them
    above the total bound (``subject`` the reference)."""


class TestResultMismatch(ReleaseRefused):
    """test-result.intoto.json is not the in-toto test-result statement summary.json gives."""

    __test__ = False  # a name pytest would otherwise collect


class PolicyDigestMismatch(ReleaseRefused):
    """The consumer pinned the infra policy (``--infra-policy-digest``) and summary.json records another one, or
    none."""


class DatasetRefused(CheckFailed):
    """A dataset directory breaks a rule of ``pipeline.core.datasets`` (a link, a special file, a name,
    no task): one line naming the path and the rule, and nothing of it is run."""

    what = "dataset file"

    def __init__(self, path: str, rule: str) -> None:
        self.path = path
        self.rule = rule
        super().__init__(f"{self.what} {path}: {rule}")


class DatasetDigestMismatch(DatasetRefused):
    """A staged dataset's bytes are not the ones its pinned digest names."""

    what = "dataset"


class PolicyRefused(CheckFailed):
    """The infra policy a worker would run with is not one it may use: the policy file changed and no longer
    loads (no work is claimed; the policy loaded before is never used instead), or the run was accepted under
    another policy than the one loaded (the run fails, nothing of it runs)."""


class PolicyNotLoaded(PolicyRefused):
    """The installed policy file changed and does not load: this worker claims nothing until it does (its log
    says so once per distinct failure; ``benchseal infra status`` and ``doctor host`` show it at the worker)."""


class InfrastructureError(Error):
    """Something the pipeline depends on (engine, registry, network) failed."""

    exit_code = 1


class AgentFailed(Error):
    """The agent under test failed in its own code (an exception it raised, its process ending early):
    the trial's failure, never the infrastructure's. Raised by the runner for a Python agent that ran
    in its own container (``pipeline.runner.agent_box``); Harbor records it by this type name."""

    exit_code = 1


class ChannelFault(InfrastructureError):
    """The runner could not run a Python agent in its own container or serve its channel (engine, image,
    the box not connecting, an engine error under the agent's operation): an infrastructure fault,
    recorded by this type name (``scoring.INFRA_EXCEPTIONS``)."""


def _shorten(value: object, limit: int = 120) -> str:
    try:
        text = repr(value)
    except ValueError:  # an int beyond sys.get_int_max_str_digits()
        text = f"<{type(value).__name__} too large to show>"
    return text if len(text) <= limit else text[: limit - 3] + "..."
