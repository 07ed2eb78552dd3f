"""Benchmark ``benchseal verify OWNER/REPO@TAG`` against what a consumer does by hand, side by side in one run.

A sealed local release (``make demo``'s ``dist/releases/<tag>/``: its assets and body.md) is served by the
GitHub emulator (tests/doubles/github, real HTTP, OpenAPI-checked). Each repetition times:

  (a) ``benchseal verify OWNER/REPO@TAG`` with the expectation the body's ``benchseal verify`` line states;
  (b) by hand: download every asset (plain HTTP of each browser_download_url: ``gh release download`` speaks
      only HTTPS to a GitHub Enterprise host, and the emulator is plain HTTP), then run the body's commands as
      printed (``pipeline.local.release.run_commands``: sha256sum, cosign, benchseal verify on the directory).

Prints both medians and the ratio (a) / (b). Needs cosign (``scripts/install-tools.sh``) and the local
Sigstore instance's trusted root the body names.

Usage: .venv/bin/python bench/verify_remote.py [--release dist/releases/v0.1.0] [--runs 5]
"""

from __future__ import annotations

import argparse
import os
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
# bench/queue.py would shadow the standard library's queue (urllib3 needs it): bench/ off the path.
sys.path[:] = [entry for entry in sys.path if Path(entry or ".").resolve() != REPO / "bench"]
sys.path.insert(0, str(REPO))


def main() -> None:
    import requests

    from pipeline.local.release import run_commands
    from pipeline.publish.body import extract
    from tests.doubles.github import GitHubEmulator
    from tests.doubles.github.emulator import Asset, Release

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--release", type=Path, default=REPO / "dist" / "releases" / "v0.1.0")
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()

    section = extract((args.release / "body.md").read_text(encoding="utf-8"))
    if section is None:
        raise SystemExit(f"{args.release}/body.md has no benchseal section")
    commands = section.split("```sh\n", 1)[1].split("\n```", 1)[0].splitlines()
    words = shlex.split(next(c for c in commands if c.startswith("benchseal verify ")))
    repository, tag = words[words.index("--repo") + 1], words[words.index("--tag") + 1]
    rest = [w for i, w in enumerate(words[3:], 3) if w not in ("--repo", "--tag")
            and words[i - 1] not in ("--repo", "--tag")]
    remote = [sys.executable, "-m", "pipeline", "verify", f"{repository}@{tag}", *rest]
    tools = [REPO / ".benchseal" / "tools" / "bin", Path(sys.executable).parent]
    path = os.pathsep.join([*map(str, tools), os.environ.get("PATH", "")])

    with GitHubEmulator(validate=False) as emulator, tempfile.TemporaryDirectory(prefix="bench-verify-") as scratch:
        emulator.add_repo(repository)
        now = emulator.clock.now()
        release = Release(1, tag, "main", tag, (args.release / "body.md").read_text(encoding="utf-8"), False, False,
                          now, now, now)
        release.assets = [Asset(i, p.name, "", "application/octet-stream", p.read_bytes(), now, now)
                          for i, p in enumerate(sorted(args.release.iterdir()), 100) if p.name != "body.md"]
        emulator.repo(repository).releases[release.id] = release
        env = dict(os.environ, GITHUB_API_URL=emulator.base_url, GITHUB_TOKEN=emulator.token, PATH=path)
        os.environ["PATH"] = path  # run_commands: the consumer's cosign and benchseal

        def by_tool() -> None:
            done = subprocess.run(remote, env=env, capture_output=True, text=True, check=False)
            if done.returncode != 0:
                raise SystemExit(f"benchseal verify {repository}@{tag} failed: {done.stderr.strip()}")

        def by_hand() -> None:
            directory = Path(tempfile.mkdtemp(dir=scratch, prefix="hand-"))
            with requests.Session() as http:
                for asset in release.assets:
                    url = f"{emulator.origin}/{repository}/releases/download/{tag}/{asset.name}"
                    answer = http.get(url, timeout=30)
                    answer.raise_for_status()
                    (directory / asset.name).write_bytes(answer.content)
            run_commands(commands, directory)

        tool: list[float] = []
        hand: list[float] = []
        for _ in range(args.runs):
            for timed, step in ((tool, by_tool), (hand, by_hand)):
                started = time.perf_counter()
                step()
                timed.append(time.perf_counter() - started)
    a, b = statistics.median(tool), statistics.median(hand)
    print(f"release {repository}@{tag}: {len(release.assets)} assets, {len(commands)} body commands, "
          f"{args.runs} runs each, interleaved")
    for label, median, times in (("(a) benchseal verify OWNER/REPO@TAG", a, tool),
                                 ("(b) download by hand + the body's commands", b, hand)):
        print(f"  {label:<44} median {median:.2f} s  (min {min(times):.2f}, max {max(times):.2f})")
    print(f"  ratio (a) / (b): {a / b:.2f}")


if __name__ == "__main__":
    main()
