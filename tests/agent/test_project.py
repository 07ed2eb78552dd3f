"""The project file (benchseal.toml) and the one version rule: bad input is a one-line exit 2 naming the key."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from pipeline.core.contracts import AgentArtifact, sri_hex, sri_of, sri_problem
from pipeline.core.errors import ValidationError
from pipeline.core.paths import REPO_ROOT
from pipeline.core.project import (
    IMAGE_NAME_PATTERN,
    RESERVED_IMAGE_NAMES,
    NpmAgent,
    ProjectImage,
    PythonAgent,
    load_project,
    version_for_tag,
)

BENCHSEAL = str(Path(sys.executable).with_name("benchseal"))
QWEN_INTEGRITY = "sha512-pmexy/Nj+BKd3Un1ogqGQE8V4GJn5B6N9PQOrU1GH+lMR29kn6Bgf6YdbZa8hNIoTmAKT1LTPK+P8TibZRPPVg=="
NPM = '''schema = "benchseal.project/v1"
[agent]
name = "qwen-code"
kind = "npm"
package = "@qwen-code/qwen-code"
bin = "cli-entry.js"
args = ["-p", "{instruction}"]
'''


def test_the_examples_load() -> None:
    qwen = load_project(REPO_ROOT / "examples" / "qwen-code" / "benchseal.toml").agent
    hello = load_project(REPO_ROOT / "examples" / "hello-agent" / "benchseal.toml").agent
    assert isinstance(qwen, NpmAgent) and qwen.package == "@qwen-code/qwen-code" and qwen.env["OPENAI_API_KEY"] == "{model_key}"
    assert isinstance(hello, PythonAgent) and hello.import_path == "hello_agent.agent:HelloAgent"


@pytest.mark.parametrize(("tag", "version"), [("v0.24.4", "0.24.4"), ("0.24.4", "0.24.4"), ("v1.0.0-rc.1", "1.0.0-rc.1"),
                                              ("v1.2", "1.2")])
def test_version_is_the_tag_without_one_leading_v(tag: str, version: str) -> None:
    assert version_for_tag(tag) == version


@pytest.mark.parametrize("tag", ["vv1.0.0", "release-1", "v", "latest", "v1..2", "v1.0.0/x", "v1 0", "v1.0\n"])
def test_a_tag_that_names_no_version_is_refused(tag: str) -> None:
    with pytest.raises(ValidationError) as caught:
        version_for_tag(tag)
    assert caught.value.field == "tag"


@pytest.mark.parametrize(("edit", "field"), [
    (lambda t: t.replace('kind = "npm"', 'kind = "pip"'), "agent"),
    (lambda t: t.replace('"@qwen-code/qwen-code"', '"../evil"'), "agent.npm.package"),
    (lambda t: t.replace('"@qwen-code/qwen-code"', '"@Qwen/Code"'), "agent.npm.package"),
    (lambda t: t.replace('"{instruction}"', '"{instructions}"'), "agent.npm.args.1"),
    (lambda t: t.replace('"cli-entry.js"', '"../cli.js"'), "agent.npm.bin"),
    (lambda t: t.replace('"cli-entry.js"', '"/usr/bin/node"'), "agent.npm.bin"),
    (lambda t: t + 'publish_wait_seconds = -1\n', "agent.npm.publish_wait_seconds"),
    (lambda t: t + 'surprise = 1\n', "agent.npm.surprise"),
    (lambda t: t + '[agent.env]\n"lower" = "x"\n', "agent.npm.env"),
    (lambda t: t.replace('benchseal.project/v1', 'benchseal.project/v2'), "schema"),
    (lambda t: t.replace('name = "qwen-code"', 'name = "Qwen Code"'), "agent.npm.name"),
    (lambda t: t.replace('args = ["-p", "{instruction}"]', 'args = []'), "agent.npm.args"),
])
def test_a_bad_project_file_names_the_key(tmp_path: Path, edit: object, field: str) -> None:
    path = tmp_path / "benchseal.toml"
    path.write_text(edit(NPM))  # type: ignore[operator]
    with pytest.raises(ValidationError) as caught:
        load_project(path)
    assert caught.value.field.removeprefix("benchseal.toml: ") .startswith(field), caught.value.diagnostics()


def test_the_python_kind_refuses_a_path_out_of_the_project(tmp_path: Path) -> None:
    path = tmp_path / "benchseal.toml"
    path.write_text('schema = "benchseal.project/v1"\n[agent]\nname = "a"\nkind = "python"\npath = "../other"\n'
                    'import_path = "a.b:C"\n')
    with pytest.raises(ValidationError, match=r"agent\.python\.path"):
        load_project(path)


@pytest.mark.parametrize("content", [b"\xff\xfe", b"schema = \n", b"x" * (65 * 1024)])
def test_unreadable_project_files_are_one_line_errors(tmp_path: Path, content: bytes) -> None:
    path = tmp_path / "benchseal.toml"
    path.write_bytes(content)
    with pytest.raises(ValidationError):
        load_project(path)


def test_the_cli_refuses_a_bad_project_file_with_exit_2_and_one_line(tmp_path: Path) -> None:
    path = tmp_path / "benchseal.toml"
    path.write_text(NPM.replace('"{instruction}"', '"{oops}"'))
    done = subprocess.run([BENCHSEAL, "build", "--image", "runner", "--project", str(path), "--release-tag", "v1.0.0"],
                          capture_output=True, text=True, check=False, timeout=120)
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "agent.npm.args.1" in lines[0] and "unknown placeholder {oops}" in lines[0]
    assert "Traceback" not in done.stderr


def test_a_release_tag_without_a_version_is_refused_before_anything_is_built(tmp_path: Path) -> None:
    done = subprocess.run([BENCHSEAL, "build", "--image", "runner", "--project",
                           str(REPO_ROOT / "examples" / "hello-agent" / "benchseal.toml"), "--release-tag", "nightly"],
                          capture_output=True, text=True, check=False, timeout=120)
    assert done.returncode == 2 and "names no agent version" in done.stderr and "Traceback" not in done.stderr


def test_sri_is_checked_by_length_and_alphabet() -> None:
    assert sri_problem(QWEN_INTEGRITY) is None
    algorithm, digest = sri_hex(QWEN_INTEGRITY)
    assert algorithm == "sha512" and len(digest) == 128
    assert sri_of("sha512", bytes.fromhex(digest)) == QWEN_INTEGRITY
    for bad in ["sha1-" + "A" * 28, "sha512-" + "A" * 20 + "==", "md5-abc", QWEN_INTEGRITY + "\n",
                QWEN_INTEGRITY.replace("+", "-"), "sha256-" + "A" * 43 + "= ", 5]:
        assert sri_problem(bad) is not None, bad


def test_an_artifact_is_strict() -> None:
    good = {"name": "qwen-code", "kind": "npm", "package": "@qwen-code/qwen-code", "version": "0.24.4",
            "integrity": QWEN_INTEGRITY, "source_commit": "a" * 40}
    AgentArtifact.model_validate(good)
    for key, value in [("kind", "pypi"), ("version", "latest"), ("integrity", "sha1-abc"),
                       ("source_commit", "A" * 40), ("name", "Qwen")]:
        with pytest.raises(ValueError):
            AgentArtifact.model_validate({**good, key: value})


# --- [images.<name>]: the adopter's own Dockerfile images (pipeline/imaging/buildkit.py builds them) ------

IMAGES = NPM + '''[images.coval-api]
dockerfile = "docker/api.Dockerfile"
context = "."
[images.runner2]
dockerfile = "Dockerfile"
'''


def test_the_images_table_declares_dockerfiles_with_a_default_context(tmp_path: Path) -> None:
    path = tmp_path / "benchseal.toml"
    path.write_text(IMAGES)
    images = load_project(path).images
    assert images == {"coval-api": ProjectImage(dockerfile="docker/api.Dockerfile", context="."),
                      "runner2": ProjectImage(dockerfile="Dockerfile")}
    assert images["runner2"].context == "."
    path.write_text(NPM)
    assert load_project(path).images == {}  # optional: a project file without it is what it was


@pytest.mark.parametrize(("edit", "field", "rule"), [
    (lambda t: t.replace("[images.coval-api]", "[images.Coval_API]"), "images.Coval_API.[key]", "should match pattern"),
    (lambda t: t.replace("[images.coval-api]", "[images.coval--api]"), "images.coval--api.[key]", "should match pattern"),
    (lambda t: t.replace("[images.coval-api]", "[images.-api]"), "images.-api.[key]", "should match pattern"),
    (lambda t: t.replace("[images.coval-api]", "[images.api]"), "images.api.[key]", "benchseal's own images"),
    (lambda t: t.replace("[images.coval-api]", "[images.runner]"), "images.runner.[key]", "benchseal's own images"),
    (lambda t: t.replace("[images.coval-api]", "[images.runner-base]"), "images.runner-base.[key]", "benchseal's own"),
    (lambda t: t.replace("[images.coval-api]", f"[images.{'a' * 65}]"), f"images.{'a' * 65}.[key]", "at most 64"),
    (lambda t: t.replace('"docker/api.Dockerfile"', '"../other/Dockerfile"'), "images.coval-api.dockerfile", "without '..'"),
    (lambda t: t.replace('"docker/api.Dockerfile"', '"docker/../../x"'), "images.coval-api.dockerfile", "without '..'"),
    (lambda t: t.replace('"docker/api.Dockerfile"', '"/etc/passwd"'), "images.coval-api.dockerfile", "relative path"),
    (lambda t: t.replace('"docker/api.Dockerfile"', '"docker\\\\api"'), "images.coval-api.dockerfile", "relative path"),
    (lambda t: t.replace('"docker/api.Dockerfile"', '""'), "images.coval-api.dockerfile", "at least 1"),
    (lambda t: t.replace('context = "."', 'context = ".."'), "images.coval-api.context", "without '..'"),
    (lambda t: t.replace('context = "."', 'context = "/"'), "images.coval-api.context", "relative path"),
    (lambda t: t.replace('context = "."', 'context = "."\ntarget = "prod"'), "images.coval-api.target", "Extra inputs"),
    (lambda t: t.replace('context = "."', ''), "images.coval-api.context", None),  # valid: the default
    (lambda t: t.replace('dockerfile = "Dockerfile"', ''), "images.runner2.dockerfile", "Field required"),
    (lambda t: t + "".join(f'[images.i{n}]\ndockerfile = "D"\n' for n in range(15)), "images", "at most 16"),
])
def test_a_bad_images_table_names_the_key_and_the_rule(tmp_path: Path, edit: object, field: str, rule: str | None) -> None:
    path = tmp_path / "benchseal.toml"
    path.write_text(edit(IMAGES))  # type: ignore[operator]
    if rule is None:
        load_project(path)
        return
    with pytest.raises(ValidationError) as caught:
        load_project(path)
    assert caught.value.field == f"benchseal.toml: {field}", caught.value.diagnostics()
    assert rule in caught.value.rule and caught.value.exit_code == 2
    assert "\n" not in caught.value.diagnostics()


def test_the_image_name_rules_agree_with_the_image_names_and_the_digests_file() -> None:
    from pipeline.core.contracts import DigestsFile
    from pipeline.imaging.names import ALL_NAMES

    assert set(RESERVED_IMAGE_NAMES) == set(ALL_NAMES)  # every name benchseal's own images use under the prefix
    key_schema = DigestsFile.model_json_schema()["properties"]["project_images"]
    assert IMAGE_NAME_PATTERN in key_schema["patternProperties"]
