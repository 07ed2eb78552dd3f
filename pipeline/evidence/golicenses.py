"""Licenses of Go modules from a committed table derived from the modules' own LICENSE files.

A Go binary's build info names its modules (path, version, go.sum ``h1:`` hash) but no licenses.
``go_licenses.json`` beside this file holds, per exact ``module@version`` (and its ``h1:`` hash),
the SPDX ids that ``licensetext.identify`` found in the module's LICENSE file, and where that file
came from (repository, commit, file, sha256 of the file). An entry is used only when path, version
and hash all equal the binary's; any other module stays ``unknown``.

The table is made by ``python -m pipeline.evidence.golicenses BINARY... --repos DIR --out FILE``
from git clones of the modules' repositories (``DIR/OWNER+NAME/repo``):

* the module's own tree at the version's tag (``vX.Y.Z``, ``SUBDIR/vX.Y.Z`` for a nested module) or
  the commit of a pseudo-version; the LICENSE file of the module directory, else of the repository
  root (what ``go mod download`` puts in the module zip);
* else a ``vendor/`` tree of another repository whose ``vendor/modules.txt`` pins exactly
  ``module version``: ``go mod vendor`` copies the module's LICENSE files there.

``h1_verified``: the module tree the LICENSE was read from hashes (``module_h1``) to the binary's
go.sum hash, i.e. it is exactly the code the binary was built from.
"""

from __future__ import annotations

import argparse
import base64
import hashlib
import json
import re
import subprocess
import sys
from dataclasses import dataclass
from functools import cache
from pathlib import Path

from pipeline.evidence import goinfo
from pipeline.evidence.licenses import DeclaredLicense
from pipeline.evidence.licensetext import identify

TABLE = Path(__file__).with_name("go_licenses.json")
_LICENSE_NAME = re.compile(r"(?i)\A(?:licen[cs]e|copying)(?:\.(?:md|txt|markdown|rst))?\Z")

VANITY = {
    "golang.org/x/": "golang/",
    "google.golang.org/grpc": "grpc/grpc-go",
    "google.golang.org/protobuf": "protocolbuffers/protobuf-go",
    "google.golang.org/genproto": "googleapis/go-genproto",
    "go.opentelemetry.io/otel": "open-telemetry/opentelemetry-go",
    "go.opentelemetry.io/contrib": "open-telemetry/opentelemetry-go-contrib",
    "go.opentelemetry.io/auto": "open-telemetry/opentelemetry-go-instrumentation",
    "go.opentelemetry.io/proto": "open-telemetry/opentelemetry-proto-go",
    "go.uber.org/mock": "uber-go/mock",
    "go.yaml.in/yaml/v3": "yaml/go-yaml",
    "gopkg.in/evanphx/json-patch.v4": "evanphx/json-patch",
    "gopkg.in/inf.v0": "go-inf/inf",
    "gopkg.in/ini.v1": "go-ini/ini",
    "gopkg.in/yaml.v3": "go-yaml/yaml",
    "k8s.io/klog": "kubernetes/klog",
    "k8s.io/": "kubernetes/",
    "sigs.k8s.io/": "kubernetes-sigs/",
    "tags.cncf.io/container-device-interface": "cncf-tags/container-device-interface",
}
_PSEUDO = re.compile(r"-(?:\d+\.)?(\d{14})-([0-9a-f]{12})(?:\+incompatible)?\Z")
_MAJOR = re.compile(r"/v\d+\Z")


@dataclass(frozen=True)
class GoLicense:
    licenses: tuple[DeclaredLicense, ...]
    source: str


@cache
def _table() -> dict[str, dict[str, object]]:
    data = json.loads(TABLE.read_text(encoding="utf-8")) if TABLE.exists() else {"modules": []}
    return {f"{m['path']}@{m['version']}": m for m in data["modules"] if m.get("licenses")}


def lookup(path: str, version: str, go_sum: str = "", binary_sha256: str = "") -> GoLicense | None:
    """The table's licenses for exactly ``path@version``: the ``h1:`` hash (modules) or the binary's sha256
    (a main module, which has no hash) must be the one the entry was derived for; ``stdlib`` is the Go
    toolchain version alone."""
    entry = _table().get(f"{path}@{version}")
    if entry is None:
        return None
    recorded_sum = entry.get("sum")
    binaries = entry.get("binary_sha256")
    if recorded_sum:
        if recorded_sum != go_sum:
            return None
    elif path != "stdlib" and not (binary_sha256 and isinstance(binaries, list) and binary_sha256 in binaries):
        return None
    ids, source = entry.get("licenses"), entry.get("source")
    if not isinstance(ids, list) or not ids or not isinstance(source, dict):
        return None
    checked = "module h1 verified" if entry.get("h1_verified") else "module h1 not verified"
    where = f"{source['repository']}@{source['commit']}:{source['file']} (sha256 {source['sha256']}; {checked})"
    return GoLicense(tuple(DeclaredLicense(str(i), "id", f"go_licenses.json: {where}") for i in ids), where)


# ---------------------------------------------------------------- table generation (offline, from git clones)


def repo_of(path: str) -> tuple[str, str]:
    """(OWNER/NAME of the module's repository, the module's directory in it, /vN kept)."""
    if path.startswith("github.com/"):
        parts = path.split("/")
        return f"{parts[1]}/{parts[2]}", "/".join(parts[3:])
    for prefix, repo in sorted(VANITY.items(), key=lambda kv: -len(kv[0])):
        if prefix.endswith("/") and path.startswith(prefix):
            name = path[len(prefix):].split("/")[0]
            return repo + name, path[len(prefix) + len(name):].lstrip("/")
        if path == prefix or path.startswith(prefix + "/"):
            return repo, path[len(prefix):].lstrip("/")
    raise ValueError(f"no repository known for Go module {path!r}")


def _git(repo: Path, *args: str, check: bool = True) -> str:
    proc = subprocess.run(["git", "--git-dir", str(repo), *args], capture_output=True, text=True, check=False)
    if check and proc.returncode != 0:
        raise RuntimeError(f"git {' '.join(args)} in {repo}: {proc.stderr.strip()}")
    return proc.stdout if proc.returncode == 0 else ""


def _git_bytes(repo: Path, spec: str) -> bytes | None:
    proc = subprocess.run(["git", "--git-dir", str(repo), "cat-file", "blob", spec], capture_output=True, check=False)
    return proc.stdout if proc.returncode == 0 else None


def _gitdir(repos: Path, name: str) -> Path | None:
    base = repos / name.replace("/", "+") / "repo"
    for candidate in (base / ".git", base):
        if (candidate / "HEAD").exists() and (candidate / "objects").exists():
            return candidate
    return None


def _commit(repo: Path, version: str, subdirs: list[str]) -> tuple[str, str] | None:
    """(commit, ref) of a module version: its tag (nested modules: SUBDIR/vX), else a pseudo-version's commit."""
    plain = version.removesuffix("+incompatible")
    pseudo = _PSEUDO.search(plain)
    if pseudo:
        sha = _git(repo, "rev-parse", "--verify", "--quiet", f"{pseudo.group(2)}^{{commit}}", check=False).strip()
        return (sha, pseudo.group(2)) if sha else None
    for sub in subdirs:
        tag = f"{sub}/{plain}" if sub else plain
        sha = _git(repo, "rev-parse", "--verify", "--quiet", f"refs/tags/{tag}^{{commit}}", check=False).strip()
        if sha:
            return sha, tag
    return None


def _license_file(repo: Path, commit: str, dirs: list[str]) -> tuple[str, bytes] | None:
    """The first directory's LICENSE/COPYING file (any case, .md/.txt); two candidates in one directory: None."""
    for d in dirs:
        listing = _git(repo, "ls-tree", "--name-only", f"{commit}:{d}" if d else commit, check=False).split("\n")
        names = sorted(n for n in listing if _LICENSE_NAME.match(n))
        if len(names) > 1:
            return None
        if names:
            file = f"{d}/{names[0]}" if d else names[0]
            data = _git_bytes(repo, f"{commit}:{file}")
            if data is not None:
                return file, data
    return None


def _vendored(name: str) -> bool:
    """x/mod/zip's rule: files in subdirectories of a vendor directory are not in the module zip."""
    if name.startswith("vendor/"):
        rest = name[len("vendor/"):]
    elif "/vendor/" in name:
        rest = name[name.index("/vendor/") + len("/vendor/"):]
    else:
        return False
    return "/" in rest


def module_h1(repo: Path, commit: str, subdir: str, path: str, version: str) -> str | None:
    """The go.sum ``h1:`` hash of ``path@version`` as ``go mod download`` would zip it from this tree.

    The zip holds the module directory's regular files, minus subdirectories that have their own
    go.mod and files below ``vendor/*/``, plus the repository root's LICENSE when the module has
    none; h1 is dirhash.Hash1 over ``sha256  path@version/file`` lines. Equal to the binary's hash:
    this tree is exactly the code the binary was built from."""
    listing = subprocess.run(["git", "--git-dir", str(repo), "ls-tree", "-r", "-z", f"{commit}:{subdir}" if subdir
                              else commit], capture_output=True, check=False)
    if listing.returncode != 0:
        return None
    entries: list[tuple[str, str, str]] = []  # mode, object, name
    for record in listing.stdout.split(b"\0"):
        if record:
            meta, name = record.split(b"\t", 1)
            mode, kind, obj = meta.decode().split()
            if kind == "blob":
                entries.append((mode, obj, name.decode("utf-8", "replace")))
    submodules = {n.rsplit("/", 1)[0] + "/" for _, _, n in entries if n.endswith("/go.mod")}
    files = {n: o for m, o, n in entries
             if m in ("100644", "100755") and not _vendored(n) and not any(n.startswith(d) for d in submodules)}
    if subdir and "LICENSE" not in files:
        root = _git(repo, "rev-parse", "--verify", "--quiet", f"{commit}:LICENSE", check=False).strip()
        if root:
            files["LICENSE"] = root
    lines = []
    for rel, obj in files.items():
        data = _git_bytes(repo, obj)
        if data is None:
            return None
        lines.append(f"{hashlib.sha256(data).hexdigest()}  {path}@{version}/{rel}\n")
    summary = hashlib.sha256("".join(sorted(lines, key=lambda line: line.split("  ", 1)[1])).encode()).digest()
    return "h1:" + base64.b64encode(summary).decode()


def _module_dirs(repo: Path, commit: str, path: str, sub: str) -> list[str]:
    """Candidate module directories: the one whose go.mod declares ``module PATH`` first."""
    candidates = [sub] + ([_MAJOR.sub("", "/" + sub).lstrip("/")] if _MAJOR.search("/" + sub) else [])
    for c in candidates:
        gomod = _git_bytes(repo, f"{commit}:{c + '/' if c else ''}go.mod")
        if gomod is not None and re.search(rb"^module\s+\"?" + re.escape(path.encode()) + rb"\"?\s*$", gomod, re.M):
            return [c]
    return candidates


def _vendor_index(repos: Path, names: list[str]) -> dict[str, list[tuple[Path, str, str, str]]]:
    """``module version`` -> (git dir, repository, commit, ref) of vendor/ trees pinning exactly that version."""
    index: dict[str, list[tuple[Path, str, str, str]]] = {}
    for name in names:
        repo = _gitdir(repos, name)
        if repo is None:
            continue
        refs = _git(repo, "for-each-ref", "--sort=-creatordate", "--format=%(objectname) %(refname:short)",
                    "refs/tags").split("\n")
        for line in refs:
            if not line.strip():
                continue
            _, ref = line.split(" ", 1)
            commit = _git(repo, "rev-parse", "--verify", "--quiet", f"{ref}^{{commit}}", check=False).strip()
            modules = _git_bytes(repo, f"{commit}:vendor/modules.txt")
            if not commit or modules is None:
                continue
            for m in re.finditer(rb"^# (\S+) (v\S+)\s*$", modules, re.M):
                key = f"{m.group(1).decode()} {m.group(2).decode()}"
                if sum(1 for c in index.setdefault(key, []) if c[1] == name) < 2:  # two tags per repository
                    index[key].append((repo, name, commit, ref))
    return index


def _entry(path: str, version: str, go_sum: str, repos: Path,
           vendor: dict[str, list[tuple[Path, str, str, str]]], revision: str = "") -> dict[str, object]:
    """One table entry; ``revision``: the main module's ``vcs.revision`` (a ``(devel)`` build of a checkout)."""
    entry: dict[str, object] = {"path": path, "version": version, "sum": go_sum}
    found: tuple[str, str, str, str, bytes] | None = None  # repository, commit, ref, file, data
    if path == "stdlib":
        name, sub = "golang/go", ""
    else:
        name, sub = repo_of(path)
    repo = _gitdir(repos, name)
    if repo is not None:
        subdirs = [sub] + ([_MAJOR.sub("", "/" + sub).lstrip("/")] if _MAJOR.search("/" + sub) else [])
        at = _commit(repo, version, subdirs)
        if at is None and revision and re.fullmatch(r"[0-9a-f]{40}", revision):
            sha = _git(repo, "rev-parse", "--verify", "--quiet", f"{revision}^{{commit}}", check=False).strip()
            at = (sha, "vcs.revision") if sha == revision else None
        if at is not None:
            dirs = _module_dirs(repo, at[0], path, sub) if path != "stdlib" else [""]
            if "" not in dirs:
                dirs.append("")  # the module zip takes the repository root's LICENSE when the module has none
            lic = _license_file(repo, at[0], dirs)
            if lic is not None:
                found = (f"github.com/{name}", at[0], at[1], lic[0], lic[1])
                if go_sum:
                    entry["h1_verified"] = module_h1(repo, at[0], dirs[0], path, version) == go_sum
    for vrepo, vname, commit, ref in vendor.get(f"{path} {version}", []) if found is None else []:
        lic = _license_file(vrepo, commit, [f"vendor/{path}"])
        if lic is not None:
            found = (f"github.com/{vname}", commit, ref, lic[0], lic[1])
            entry["h1_verified"] = False  # a vendor tree holds only the packages used: no whole-module hash
            break
    if found is None:
        entry["licenses"] = []
        entry["unknown"] = "no LICENSE file found for this exact version"
        return entry
    repository, commit, ref, file, data = found
    result = identify(data.decode("utf-8", "replace"))
    entry["source"] = {"repository": repository, "commit": commit, "ref": ref, "file": file,
                       "sha256": hashlib.sha256(data).hexdigest()}
    entry["licenses"] = list(result.spdx)
    if not result.ok:
        entry["unknown"] = f"license text not identified: {result.reason}"
    return entry


def build_table(binaries: list[Path], repos: Path, vendor_repos: list[str], made_from: str = "") -> dict[str, object]:
    vendor = _vendor_index(repos, vendor_repos)
    modules: dict[str, dict[str, object]] = {}
    for binary in binaries:
        data = binary.read_bytes()
        info = goinfo.parse(data)
        if info is None:
            raise ValueError(f"{binary}: no Go build info")
        digest = hashlib.sha256(data).hexdigest()
        if info.main is not None:
            version, _ = info.main_version()
            entry = _entry(info.main.path, version, "", repos, vendor, info.setting("vcs.revision") or "")
            entry["binary_sha256"] = [digest]
            modules[f"{info.main.path}@{version}"] = entry
        stdlib = info.go_version.removeprefix("go")
        modules.setdefault(f"stdlib@{stdlib}", {**_entry("stdlib", info.go_version, "", repos, vendor),
                                                "version": stdlib})
        for dep in info.deps:
            if dep.replaced_by:
                continue  # the SBOM does not look replaced modules up: their code is the replacement's
            modules.setdefault(f"{dep.path}@{dep.version}", _entry(dep.path, dep.version, dep.sum, repos, vendor))
    return {"about": "Licenses of Go modules, identified by pipeline/evidence/licensetext.py from each module's "
                     "own LICENSE file at the exact version (source: repository, commit, file, sha256). "
                     "Made by `python -m pipeline.evidence.golicenses`; see docs/evidence.md.",
            "made_from": made_from, "vendor_repositories": sorted(f"github.com/{n}" for n in vendor_repos),
            "modules": [modules[k] for k in sorted(modules)]}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m pipeline.evidence.golicenses")
    parser.add_argument("binaries", nargs="+", type=Path)
    parser.add_argument("--repos", type=Path, required=True, help="DIR/OWNER+NAME/repo git clones")
    parser.add_argument("--vendor-repo", action="append", default=[], help="OWNER/NAME with vendor/ trees")
    parser.add_argument("--made-from", default="", help="where the binaries came from (recorded in the table)")
    parser.add_argument("--out", type=Path, default=TABLE)
    args = parser.parse_args(argv)
    table = build_table(args.binaries, args.repos, args.vendor_repo, args.made_from)
    args.out.write_text(json.dumps(table, indent=1, sort_keys=True) + "\n", encoding="utf-8")
    mods = table["modules"]
    if not isinstance(mods, list):
        return 1
    known = sum(1 for m in mods if m.get("licenses"))
    print(f"{known}/{len(mods)} modules identified; unknown:", file=sys.stderr)
    for m in mods:
        if not m.get("licenses"):
            print(f"  {m['path']}@{m['version']}: {m.get('unknown')}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
