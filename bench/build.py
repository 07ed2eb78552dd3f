"""Cold build benchmark: runner + api from empty benchseal caches, item by item, beside a baseline commit.

    .venv/bin/python bench/build.py [--baseline COMMIT | --no-baseline] [--overlay PATH ...] [--no-rebuild] [--keep]

Each side (the baseline commit, then this working tree) is built from its own snapshot (a clone at
the commit; the working tree's changes copied over a clone of HEAD, so other sessions' later edits
cannot leak in) by a child process running that snapshot's own code:

* a fresh ``BENCHSEAL_HOME`` holding only a link to the default home's ``tools`` (empty layer, blob,
  wheel, bytecode, base-tarball and SBOM caches), its own base lock and a scratch registry on an
  ephemeral loopback port: mmdebstrap, wheel downloads, bytecode, compression and every push happen;
* ``build_images_with_results(("runner", "api"), ...)``: what ``benchseal build`` and the build +
  push stages of ``release --local`` run, bases included;
* then the SBOM of both images (``write_sbom``: the attest stage's scan, not part of the build figure).

Each item (base rootfs, base compress, wheel download, wheel install, bytecode, layer tars, push,
SBOM read) is the wall-clock time during which at least one thread was inside it and not inside a
nested item; "other" is the time no thread was inside any item. Items that ran side by side (the two
bases, the downloads beside mmdebstrap, the runner beside the api) overlap, so they can add up to
more than the wall time.

Determinism: a second child process rebuilds the current side with ``use_cache=False`` (no layer or
bytecode cache; wheels and bases are inputs and stay) into the same registry; every layer digest
and both manifest digests must be equal.

Baseline: the commit issue 27 was filed against (dbf8b71: HEAD at the end of stop 20, when the README
still said "about 4 minutes" and the last full run had 1,296 tests, as the issue quotes).
The engine's image store is the machine's (shared): a base the engine already holds is not
downloaded again on either side. Prints figures only; asserts nothing about time.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

print = functools.partial(print, flush=True)
REPO = Path(__file__).resolve().parent.parent
# bench/queue.py would shadow the standard library's queue (urllib3 imports it).
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != Path(__file__).resolve().parent]
BASELINE = "dbf8b71"
TARGET_SECONDS = 60.0
ITEMS = [
    ("base_rootfs", "base rootfs (mmdebstrap, 2 bases)"),
    ("base_compress", "base layer compress"),
    ("wheel_download", "wheel download / resolution"),
    ("wheel_install", "wheel install (staging tree)"),
    ("bytecode", "bytecode compilation"),
    ("engine_pull", "base pull into the engine (bytecode)"),
    ("layer_tars", "layer tars (tar + gzip)"),
    ("push", "push (blobs + manifests)"),
    ("other", "other"),
]


# --- the child: runs inside a snapshot, with that snapshot's own pipeline ---------------------

class Clock:
    """When each item ran, per thread, excluding the items nested in it: (item, start, end) segments.

    An item's figure is the wall-clock time during which at least one thread was in it (threads
    overlap, so the items can add up to more than the wall time); "other" is the wall-clock time
    during which no thread was in any item.
    """

    def __init__(self) -> None:
        self.segments: list[tuple[str, float, float, str]] = []
        self.local = threading.local()

    @contextlib.contextmanager
    def item(self, name: str, inside_of: frozenset[str] = frozenset()) -> Iterator[None]:
        stack: list[list[Any]] = self.local.__dict__.setdefault("stack", [])
        if stack and stack[-1][0] in inside_of:  # counted as the outer item
            yield
            return
        now = time.monotonic()
        if stack:  # the outer item pauses
            self.segments.append((stack[-1][0], stack[-1][1], now, threading.current_thread().name))
        stack.append([name, now])
        try:
            yield
        finally:
            now = time.monotonic()
            frame = stack.pop()
            self.segments.append((frame[0], frame[1], now, threading.current_thread().name))
            if stack:
                stack[-1][1] = now

    def totals(self, since: float, until: float) -> dict[str, float]:
        names = {name for name, _, _, _ in self.segments}
        out = {name: _union([(s, e) for n, s, e, _ in self.segments if n == name], since, until) for name in names}
        out["other"] = (until - since) - _union([(s, e) for _, s, e, _ in self.segments], since, until)
        return out


def _union(intervals: list[tuple[float, float]], since: float, until: float) -> float:
    total, end = 0.0, since
    for s, e in sorted(intervals):
        s, e = max(s, end, since), min(e, until)
        if e > s:
            total += e - s
            end = e
    return total


def _wrap(clock: Clock, owner: Any, attr: str, name: str, inside_of: frozenset[str] = frozenset()) -> None:
    original = getattr(owner, attr, None)
    if original is None:
        return

    @functools.wraps(original)
    def timed(*args: Any, **kwargs: Any) -> Any:
        with clock.item(name, inside_of):
            return original(*args, **kwargs)

    setattr(owner, attr, timed)


def _instrument(clock: Clock) -> None:
    import importlib

    def module(name: str) -> Any:
        try:
            return importlib.import_module(name)
        except ImportError:
            return None

    base, layers = module("pipeline.imaging.base"), module("pipeline.imaging.layers")
    wheels, bytecode = module("pipeline.imaging.wheels"), module("pipeline.imaging.bytecode")
    push = module("pipeline.imaging.push")
    _wrap(clock, base, "_run_mmdebstrap", "base_rootfs")
    _wrap(clock, base, "compress_tarball", "base_compress")
    _wrap(clock, layers, "compress_tar_stream", "layer_tars", frozenset({"base_compress"}))
    _wrap(clock, wheels, "download", "wheel_download")
    _wrap(clock, wheels, "install", "wheel_install")
    _wrap(clock, bytecode, "compile_tree", "bytecode")
    _wrap(clock, bytecode, "ensure_local", "engine_pull")
    for attr in ("push_blob", "put_manifest"):
        _wrap(clock, push.Registry, attr, "push")
    sbom = module("pipeline.evidence.sbom")
    _wrap(clock, sbom, "read_image", "sbom_read")


def child(args: argparse.Namespace) -> None:
    tree = Path(args.tree)
    sys.path.insert(0, str(tree))
    clock = Clock()
    _instrument(clock)
    import pipeline
    from pipeline.evidence.sbom import write_sbom
    try:  # the build's entry point moved to pipeline.imaging.build with the layout of issue 23
        from pipeline.imaging.build import build_images_with_results
    except ImportError:
        from pipeline.imaging import build_images_with_results  # type: ignore[attr-defined,no-redef]

    if not Path(pipeline.__file__).resolve().is_relative_to(tree.resolve()):
        sys.exit(f"the child imported {pipeline.__file__}, not the snapshot's pipeline")
    started = time.monotonic()
    digests, results = build_images_with_results(("runner", "api"), args.registry, None, (), not args.rebuild)
    build_done = time.monotonic()
    build_wall = build_done - started
    build_items = clock.totals(started, build_done)
    # What the build left running on its own threads (removing staging trees, writing the bytecode
    # cache): off the build's path, it overlaps the next stage. Waited for here, so the SBOM scan is
    # measured alone.
    for thread in threading.enumerate():
        if thread.name in ("staging-cleanup", "bytecode-cache"):
            thread.join()
    deferred = time.monotonic() - build_done
    sbom_started = time.monotonic()
    sbom_dir = Path(args.report).parent / ("sboms-rebuild" if args.rebuild else "sboms")
    if not args.rebuild:
        for role, entry in digests.images.items():
            write_sbom(entry.ref, sbom_dir / f"sbom-{role}.cdx.json")
    sbom_wall = time.monotonic() - sbom_started
    report = {
        "pipeline": pipeline.__file__,
        "build_wall": build_wall,
        "build_items": build_items,
        "deferred": deferred,
        "sbom_wall": sbom_wall,
        "sbom_read": clock.totals(sbom_started, sbom_started + sbom_wall).get("sbom_read", 0.0),
        "segments": [(name, round(a - started, 2), round(b - started, 2), thread) for name, a, b, thread in clock.segments],
        "images": {r.role: {"ref": r.ref.ref, "layers": [d["digest"] for d in json.loads(r.manifest)["layers"]],
                            "push": r.seconds_push, "uploaded": r.stats.bytes_uploaded} for r in results},
    }
    Path(args.report).write_text(json.dumps(report, indent=1))


# --- the driver -------------------------------------------------------------------------------

def _git(*args: str, cwd: Path = REPO, out: bool = True) -> str:
    proc = subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True, check=True)
    return proc.stdout.strip() if out else ""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def snapshot_commit(commit: str, dest: Path) -> Path:
    subprocess.run(["git", "clone", "-q", "--no-hardlinks", "--no-checkout", str(REPO), str(dest)], check=True)
    _git("checkout", "-q", "--detach", commit, cwd=dest)
    return dest


def snapshot_working_tree(dest: Path, overlay: list[str]) -> Path:
    """A clone of HEAD with the working tree's changes (under ``overlay``) copied in and committed."""
    snapshot_commit("HEAD", dest)
    spec = ["--", *overlay] if overlay else []
    changed = _git("ls-files", "-z", "-m", "-o", "--exclude-standard", *spec).split("\0")
    deleted = set(_git("ls-files", "-z", "-d", *spec).split("\0"))
    for name in filter(None, changed):
        target = dest / name
        if name in deleted or not (REPO / name).exists():
            target.unlink(missing_ok=True)
            continue
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(REPO / name, target)
    env = dict(os.environ, GIT_AUTHOR_NAME="bench", GIT_AUTHOR_EMAIL="bench@localhost",
               GIT_COMMITTER_NAME="bench", GIT_COMMITTER_EMAIL="bench@localhost")
    subprocess.run(["git", "add", "-A"], cwd=dest, check=True)
    subprocess.run(["git", "commit", "-q", "--allow-empty", "-m", "bench snapshot of the working tree"], cwd=dest,
                   env=env, check=True)
    return dest


def run_side(label: str, tree: Path, scratch: Path, rebuild: bool) -> tuple[dict[str, Any], dict[str, Any] | None]:
    """A cold build in ``tree`` (and, with ``rebuild``, a no-cache rebuild in a second process)."""
    sys.path.insert(0, str(REPO))
    from pipeline.core import paths
    from pipeline.local import registry as reg

    side = scratch / label
    home = side / "home"
    home.mkdir(parents=True)
    tools = paths.home() / "tools"
    if tools.is_dir():
        (home / "tools").symlink_to(tools, target_is_directory=True)
    registry = reg.Registry(address=f"127.0.0.1:{_free_port()}", state=side / "registry")
    registry.state.mkdir(parents=True)
    reg.start(registry)
    env = dict(os.environ, BENCHSEAL_HOME=str(home), BENCHSEAL_BASE_LOCK=str(side / "base.lock.json"),
               BENCHSEAL_PROJECT_DIR=str(tree), PYTHONPATH=str(tree), NO_PROXY="127.0.0.1,localhost",
               PYTHONDONTWRITEBYTECODE="1")
    env.pop("SOURCE_DATE_EPOCH", None)
    reports: list[dict[str, Any]] = []
    try:
        for again in ([False, True] if rebuild else [False]):
            report = side / ("rebuild.json" if again else "cold.json")
            argv = [sys.executable, str(Path(__file__).resolve()), "--child", "--tree", str(tree),
                    "--registry", registry.address, "--report", str(report), *(["--rebuild"] if again else [])]
            print(f"[{label}] {'no-cache rebuild' if again else 'cold build'} in {tree} ...")
            started, load = time.monotonic(), os.getloadavg()[0]
            proc = subprocess.run(argv, env=env, cwd=tree, capture_output=True, text=True, check=False)
            if proc.returncode != 0:
                sys.exit(f"[{label}] build failed ({proc.returncode}):\n{proc.stderr[-4000:]}")
            data: dict[str, Any] = json.loads(report.read_text())
            data["process_wall"] = time.monotonic() - started
            data["load"] = (load, os.getloadavg()[0])
            reports.append(data)
    finally:
        reg.stop(registry)
        _untag_engine(registry.address)
    return reports[0], (reports[1] if rebuild else None)


def _untag_engine(address: str) -> None:
    """Drop the engine's names for the scratch registry's images (so the next side pulls again)."""
    listed = subprocess.run(["docker", "image", "ls", "--digests", "--format", "{{.Repository}}@{{.Digest}}",
                             f"--filter=reference={address}/*/*"], capture_output=True, text=True, check=False)
    refs = [line for line in listed.stdout.split() if line.startswith(address) and "@sha256:" in line]
    if refs:
        subprocess.run(["docker", "image", "rm", "--no-prune", *refs], capture_output=True, check=False)


def _row(label: str, values: list[float | None], target: str = "") -> str:
    cells = "".join(f"{v:>11.1f}" if v is not None else f"{'-':>11}" for v in values)
    ratio = ""
    if len(values) == 2 and values[0] is not None and values[0] >= 0.05 and values[1] is not None:
        ratio = f"{values[1] / values[0]:>8.2f}x"
    return f"{label:<42}{cells}{ratio:>10}  {target}"


def print_figures(sides: dict[str, dict[str, Any]], baseline: str | None) -> None:
    names = list(sides)
    print()
    print("cold build of runner + api from empty benchseal caches (seconds; ratio = current / baseline)")
    header = "".join(f"{n:>11}" for n in names)
    print(f"{'item':<42}{header}{'ratio' if len(names) == 2 else '':>10}  target")
    for key, label in ITEMS:
        values: list[float | None] = []
        for report in sides.values():
            items = report["build_items"]
            values.append(items.get(key, 0.0))
        print(_row(label, values))
    walls = [r["build_wall"] for r in sides.values()]
    met = "met" if walls[-1] <= TARGET_SECONDS else "NOT met"
    print(_row("items added up (they may overlap)", [sum(v for k, v in r["build_items"].items() if k != "sbom_read")
                                                      for r in sides.values()]))
    print(_row("cold build total (build + push)", list(walls), f"<= {TARGET_SECONDS:.0f} s ({met})"))
    print(_row("left running after the build (cleanup, cache)", [r.get("deferred", 0.0) for r in sides.values()]))
    print(_row("SBOM scan of both images (attest stage)", [r["sbom_wall"] for r in sides.values()]))
    print(_row("  of which reading the layers back", [r["sbom_read"] for r in sides.values()]))
    loads = ", ".join(f"{name} {r['load'][0]:.1f} -> {r['load'][1]:.1f}" for name, r in sides.items())
    print(f"1-minute load average before -> after each cold build (2 cores; other work on the machine counts): {loads}")
    if baseline:
        print(f"baseline: {baseline}; current: the working tree (snapshot)")


def compare(cold: dict[str, Any], again: dict[str, Any]) -> bool:
    same = True
    for role, image in cold["images"].items():
        other = again["images"][role]
        equal = image["ref"] == other["ref"]
        same &= equal
        print(f"no-cache rebuild in a second process, {role}: {'same digest' if equal else 'DIFFERENT digest'} "
              f"({image['ref'].rsplit('@', 1)[1][:19]}...)")
        for i, (a, b) in enumerate(zip(image["layers"], other["layers"], strict=False)):
            if a != b:
                print(f"  layer {i}: {a} != {b}")
    return same


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--baseline", default=BASELINE, help="the commit to measure beside the working tree")
    parser.add_argument("--no-baseline", action="store_true")
    parser.add_argument("--overlay", nargs="*", default=[],
                        help="take only these paths from the working tree (default: every change)")
    parser.add_argument("--no-rebuild", action="store_true", help="skip the no-cache rebuild (determinism)")
    parser.add_argument("--keep", action="store_true")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--tree", help=argparse.SUPPRESS)
    parser.add_argument("--registry", help=argparse.SUPPRESS)
    parser.add_argument("--report", help=argparse.SUPPRESS)
    parser.add_argument("--rebuild", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args)
        return

    scratch = Path(tempfile.mkdtemp(prefix="benchseal-bench-build-"))
    sides: dict[str, dict[str, Any]] = {}
    baseline = None if args.no_baseline else _git("rev-parse", "--short=12", args.baseline)
    same = True
    try:
        if baseline is not None:
            sides["baseline"], _ = run_side("baseline", snapshot_commit(baseline, scratch / "tree-baseline"),
                                            scratch, rebuild=False)
        current_tree = snapshot_working_tree(scratch / "tree-current", args.overlay)
        sides["current"], rebuilt = run_side("current", current_tree, scratch, rebuild=not args.no_rebuild)
        print_figures(sides, baseline)
        if rebuilt is not None:
            print()
            same = compare(sides["current"], rebuilt)
            print(f"no-cache rebuild wall: {rebuilt['build_wall']:.1f} s (bases and wheels cached, every layer "
                  f"and all bytecode made again)")
    finally:
        if args.keep:
            print(f"kept {scratch}")
        else:
            shutil.rmtree(scratch, ignore_errors=True)
    if not same:
        sys.exit("the no-cache rebuild gave other digests")


if __name__ == "__main__":
    main()
