"""scripts/install-tools.sh: the trixie and forky lists are derived from the machine's own sources; cosign 3.1 works."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from pipeline.verify.external import cosign_path

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "install-tools.sh"


def test_trixie_sources_derived_from_configured_bookworm_entries(tmp_path: Path) -> None:
    etc = tmp_path / "apt"
    (etc / "sources.list.d").mkdir(parents=True)
    (etc / "sources.list.d" / "debian.sources").write_text(
        "Types: deb\n# a comment\nURIs: http://mirror.invalid/debian\nSuites: bookworm bookworm-updates\n"
        "Components: main contrib\nSigned-By: /usr/share/keyrings/debian-archive-keyring.gpg\n\n"
        "Types: deb\nURIs: http://mirror.invalid/debian-security\nSuites: bookworm-security\nComponents: main\n\n"
        "Types: deb-src\nURIs: http://mirror.invalid/debian\nSuites: bookworm\nComponents: main\n")
    (etc / "sources.list").write_text(
        "# deb http://old.invalid/debian bookworm main\n"
        "deb [signed-by=/k.gpg] http://mirror2.invalid/debian bookworm main\n"
        "deb http://mirror2.invalid/debian bookworm-updates main\n")
    done = subprocess.run(["bash", str(SCRIPT), "--print-trixie-sources"], capture_output=True, text=True,
                          check=False, env={**os.environ, "APT_ETC": str(etc), "BENCHSEAL_HOME": str(tmp_path / "home")})
    assert done.returncode == 0, done.stderr
    out = done.stdout
    assert "deb [signed-by=/k.gpg] http://mirror2.invalid/debian trixie main\n" in out
    assert "URIs: http://mirror.invalid/debian\nSuites: trixie\nComponents: main contrib\n" in out
    assert "Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg" in out
    assert "debian-security" not in out and "bookworm" not in out and "old.invalid" not in out
    assert out.count("trixie") == 2


def test_a_newer_suite_is_derived_from_the_machines_own_suite(tmp_path: Path) -> None:
    """cosign's suite (forky) from either Debian 12's or 13's entries: only the plain suite is renamed."""
    etc = tmp_path / "apt"
    (etc / "sources.list.d").mkdir(parents=True)
    (etc / "sources.list.d" / "debian.sources").write_text(
        "Types: deb\nURIs: http://mirror.invalid/debian\nSuites: trixie trixie-updates\nComponents: main\n"
        "Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg\n\n"
        "Types: deb\nURIs: http://mirror.invalid/debian-security\nSuites: trixie-security\nComponents: main\n")
    (etc / "sources.list").write_text("deb http://mirror2.invalid/debian trixie main\n")
    env = {**os.environ, "APT_ETC": str(etc), "BENCHSEAL_HOME": str(tmp_path / "home")}
    done = subprocess.run(["bash", str(SCRIPT), "--print-sources", "trixie", "forky"], capture_output=True, text=True,
                          check=False, env=env)
    assert done.returncode == 0, done.stderr
    assert "deb http://mirror2.invalid/debian forky main\n" in done.stdout
    assert "URIs: http://mirror.invalid/debian\nSuites: forky\nComponents: main\n" in done.stdout
    assert "trixie" not in done.stdout and "debian-security" not in done.stdout
    # No entry of the named suite: one clear line, no list.
    done = subprocess.run(["bash", str(SCRIPT), "--print-sources", "bookworm", "forky"], capture_output=True, text=True,
                          check=False, env=env)
    assert done.returncode == 1 and done.stdout == ""
    assert "no bookworm entry in the machine's apt sources to derive a forky list from" in done.stderr


def test_cosign_installed_and_rerun_is_a_no_op() -> None:
    cosign = cosign_path()
    assert cosign is not None, "run scripts/install-tools.sh"
    assert "GitVersion:" in subprocess.run([str(cosign), "version"], capture_output=True, text=True, check=True).stdout
    # Debian's build reports "devel"; the script records the package version.
    recorded = (cosign.parent.parent / "cosign.version").read_text().strip()
    # 3.1: the first series that compares --type with a bundle's predicate type (GHSA-w6c6-c85g-mmv6).
    assert recorded.startswith("3.1."), recorded
    lists = set(os.listdir("/var/lib/apt/lists")) if os.path.isdir("/var/lib/apt/lists") else set()
    done = subprocess.run(["bash", str(SCRIPT)], capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr
    assert done.stderr == ""  # nothing to do: no apt call, nothing printed
    after = set(os.listdir("/var/lib/apt/lists")) if os.path.isdir("/var/lib/apt/lists") else set()
    assert after == lists
    if Path("/etc/debian_version").read_text().startswith("12"):
        # the private trixie and forky lists never reached the system's apt state
        assert not any("trixie" in name or "forky" in name for name in after)
