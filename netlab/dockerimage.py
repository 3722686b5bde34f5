"""The image of netlab's Docker backend, built on this machine: no image registry is needed.

Two layers, each cached by a content hash:

- **base** (``zeps-netlab-base:<hash>``): Debian bookworm made with ``debootstrap --variant=minbase`` and
  ``docker import``-ed. Its hash covers the suite, the package list and the mirror. Making it takes about a
  minute, so its tarball is also kept in the cache directory (``.cache/netlab/`` in a source checkout, or
  ``$NETLAB_CACHE``): after ``docker image rm`` or on a new engine, importing it again takes seconds.
- **project** (``zeps-netlab:<hash>``): ``docker build`` of a tiny Dockerfile ``FROM`` the base (a local image,
  so the builder pulls nothing) that copies in this project's packages and every distribution they depend on,
  exactly as installed in the running environment. Its hash covers those files, so a changed source rebuilds
  it (a few seconds) and an unchanged one is reused.

Copying the running environment's distributions (rather than ``pip install`` in the image) needs no package
index and gives the containers the very versions the host tests run: pyzmq included, which setup.sh builds
against Debian's libzmq5 (PGM and NORM); the base image has that same libzmq5. Compiled extensions only load
in the same Python minor version, bookworm's 3.11, which is checked.
"""

from __future__ import annotations

import collections
import contextlib
import fcntl
import hashlib
import importlib.metadata
import importlib.util
import io
import json
import logging
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

from netlab.lab import LabError

if TYPE_CHECKING:  # the Docker SDK is optional (the lab extra); only netlab.dockerlab.client() makes clients
    import docker

log = logging.getLogger("netlab")

PROJECT = "zeps-gateway"
IMAGE = "zeps-netlab"
BASE_IMAGE = "zeps-netlab-base"
LABEL_SOURCE = "netlab.source"  # the checkout an image was built from: older images of it are pruned
SUITE = "bookworm"
PYTHON_VERSION = (3, 11)  # bookworm's python3
BASE_PACKAGES = ("python3", "libzmq5", "libnorm1", "iproute2", "iputils-ping", "procps")
MIRROR = os.environ.get("NETLAB_DEBIAN_MIRROR", "http://deb.debian.org/debian")
SITE_DIR = "/usr/local/lib/python3.11/dist-packages"
# Trimmed from the base: package caches and lists (no apt in a test container), documentation, locales.
_TRIM = ("var/cache/apt/archives", "var/lib/apt/lists", "usr/share/doc", "usr/share/man", "usr/share/locale")
_PROGRESS_EVERY = 10.0  # seconds between debootstrap progress lines


class ImageError(LabError):
    """The image could not be built; the message says why and what to do."""


def cache_dir() -> Path:
    """``$NETLAB_CACHE``, else ``.cache/netlab`` of the source checkout netlab runs from, else ``~/.cache/netlab``."""
    if env := os.environ.get("NETLAB_CACHE"):
        return Path(env)
    checkout = Path(__file__).resolve().parents[1]
    if (checkout / "pyproject.toml").is_file():
        return checkout / ".cache" / "netlab"
    return Path.home() / ".cache" / "netlab"


def _digest(*parts: bytes) -> str:
    h = hashlib.sha256()
    for part in parts:
        h.update(len(part).to_bytes(8, "little"))
        h.update(part)
    return h.hexdigest()[:12]


def _has_image(client: docker.DockerClient, tag: str) -> bool:
    import docker.errors

    try:
        client.images.get(tag)
    except docker.errors.ImageNotFound:
        return False
    return True


@contextlib.contextmanager
def _build_lock(directory: Path) -> Iterator[None]:
    """One build at a time per cache directory (parallel test runs would otherwise both debootstrap)."""
    directory.mkdir(parents=True, exist_ok=True)
    with open(directory / "build.lock", "w") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        yield


# --- base: debootstrap + docker import ---------------------------------------------------------------------


def base_tag() -> str:
    """``zeps-netlab-base:<hash of what debootstrap is asked for>``."""
    spec = {"suite": SUITE, "variant": "minbase", "packages": BASE_PACKAGES, "mirror": MIRROR, "trim": _TRIM}
    return f"{BASE_IMAGE}:{_digest(json.dumps(spec, sort_keys=True).encode())}"


def _debootstrap(rootfs: Path) -> None:
    """Run debootstrap into ``rootfs``, logging its progress every few seconds."""
    if shutil.which("debootstrap") is None:
        raise ImageError("debootstrap is not installed: apt-get install debootstrap (or run scripts/setup.sh)")
    argv = ["debootstrap", "--variant=minbase", f"--include={','.join(BASE_PACKAGES)}", SUITE, str(rootfs), MIRROR]
    log.info("building the base image: %s (about a minute)", " ".join(argv))
    start = last = time.monotonic()
    tail: collections.deque[str] = collections.deque(maxlen=20)
    packages = 0
    with subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) as proc:
        assert proc.stdout is not None
        for line in proc.stdout:
            tail.append(line.rstrip())
            packages += line.startswith("I: Retrieving ") and len(line.split()) == 4  # "I: Retrieving NAME VERSION"
            if time.monotonic() - last >= _PROGRESS_EVERY:
                last = time.monotonic()
                log.info("debootstrap: %s (%d packages fetched, %.0f s)", line.strip(), packages, last - start)
    if proc.returncode != 0:
        detail = "\n".join(tail)
        raise ImageError(
            f"debootstrap failed (exit {proc.returncode}); is {MIRROR} reachable? Set NETLAB_DEBIAN_MIRROR to "
            f"another Debian mirror if not. Its last lines:\n{detail}"
        )
    log.info("debootstrap done: %d packages in %.0f s", packages, time.monotonic() - start)


@contextlib.contextmanager
def _scratch(parent: Path) -> Iterator[Path]:
    """A tmpfs to build the rootfs in: dpkg's fsyncs cost nothing there, and removing 10,000 files is instant
    (about 10 s on this machine's disk)."""
    with tempfile.TemporaryDirectory(dir=parent, prefix="rootfs-") as tmp:
        subprocess.run(["mount", "-t", "tmpfs", "-o", "size=2g,mode=0755", "netlab-rootfs", tmp], check=True)
        try:
            yield Path(tmp)
        finally:  # recursive and lazy: a failed debootstrap can leave its /proc and /sys mounted inside
            subprocess.run(["umount", "--recursive", "--lazy", tmp], check=True)


def _base_tarball(cache: Path, tag: str) -> Path:
    """The cached rootfs tarball of ``tag``, made with debootstrap when missing."""
    tarball = cache / f"{tag.replace(':', '-')}.tar"
    if tarball.is_file():
        return tarball
    with _scratch(cache) as scratch:
        rootfs = scratch / "rootfs"
        _debootstrap(rootfs)
        for rel in _TRIM:
            for entry in (rootfs / rel).glob("*"):
                if entry.is_dir() and not entry.is_symlink():
                    shutil.rmtree(entry)
                else:
                    entry.unlink()
        partial = tarball.with_suffix(".tar.partial")
        subprocess.run(["tar", "--numeric-owner", "-C", str(rootfs), "-cf", str(partial), "."], check=True)
        partial.replace(tarball)
    return tarball


def ensure_base(client: docker.DockerClient, cache: Path) -> str:
    """The base image's tag: present, imported from the cached tarball, or built from scratch."""
    tag = base_tag()
    if _has_image(client, tag):
        return tag
    tarball = _base_tarball(cache, tag)
    log.info("importing %s into the Docker engine as %s", tarball, tag)
    repository, _, version = tag.partition(":")
    client.api.import_image_from_file(str(tarball), repository=repository, tag=version)
    if not _has_image(client, tag):
        raise ImageError(f"docker import of {tarball} did not produce {tag}; delete the tarball to rebuild it")
    return tag


# --- project layer: this environment's distributions + docker build --------------------------------------------


def _requirement_closure(name: str, extra: str = "") -> list[importlib.metadata.Distribution]:
    """``name``'s distribution with its ``extra`` and all they require (markers evaluated for this machine)."""
    from packaging.requirements import Requirement

    found: dict[str, importlib.metadata.Distribution] = {}
    todo = [(name, extra)]
    while todo:
        wanted, wanted_extra = todo.pop()
        dist = importlib.metadata.distribution(wanted)
        key = dist.metadata["Name"].lower().replace("_", "-")
        if key in found:
            continue
        found[key] = dist
        for text in dist.requires or []:
            req = Requirement(text)
            if req.marker is None or req.marker.evaluate({"extra": wanted_extra}):
                todo.append((req.name, ""))
    return list(found.values())


def _distribution_files(dist: importlib.metadata.Distribution) -> Iterator[tuple[str, Path]]:
    """(path relative to site-packages, file) of an installed (non-editable) distribution, no bytecode."""
    for rel in dist.files or []:
        text = str(rel)
        if text.startswith("..") or text.endswith(".pyc"):  # scripts in bin/; caches are rebuilt in the image
            continue
        path = Path(str(dist.locate_file(rel)))
        if path.is_file():
            yield text, path


def _package_files(package: str) -> Iterator[tuple[str, Path]]:
    """Files of an importable package's directory (works for editable installs, whose RECORD has no sources)."""
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise ImageError(f"cannot find the package {package!r} of {PROJECT}: is the project installed?")
    root = Path(next(iter(spec.submodule_search_locations)))
    for path in sorted(root.rglob("*")):
        if path.is_file() and "__pycache__" not in path.parts and path.suffix != ".pyc":
            yield f"{package}/{path.relative_to(root)}", path


def _scripts(project: importlib.metadata.Distribution) -> dict[str, bytes]:
    """The project's console scripts, for the image's python3."""
    scripts = {}
    for ep in project.entry_points.select(group="console_scripts"):
        module, _, attr = ep.value.partition(":")
        scripts[ep.name] = f"#!/usr/bin/python3\nimport sys\nfrom {module} import {attr}\nsys.exit({attr}())\n".encode()
    return scripts


def _context_files() -> dict[str, Path | bytes]:
    """What the project layer adds, by path in the build context: ``site/...`` and ``bin/...``."""
    if sys.version_info[:2] != PYTHON_VERSION:
        raise ImageError(
            f"the image runs Debian {SUITE}'s Python {'.'.join(map(str, PYTHON_VERSION))} and gets its packages from "
            f"this environment, but this is Python {sys.version_info.major}.{sys.version_info.minor}: compiled "
            "extensions would not load. Run netlab from a Python 3.11 virtualenv (scripts/setup.sh makes one)."
        )
    project = importlib.metadata.distribution(PROJECT)
    files: dict[str, Path | bytes] = {}
    for dist in _requirement_closure(PROJECT, "lab"):  # netlab, which lab hosts import, needs the lab extra
        if dist.metadata["Name"] != project.metadata["Name"]:
            files.update((f"site/{rel}", path) for rel, path in _distribution_files(dist))
    for package in (project.read_text("top_level.txt") or "").split():
        files.update((f"site/{rel}", path) for rel, path in _package_files(package))
    files.update((f"bin/{name}", text) for name, text in _scripts(project).items())
    return files


def _dockerfile(base: str) -> bytes:
    check = "import zmq, gateway, netlab; assert zmq.has('pgm') and zmq.has('norm'), 'pyzmq lacks pgm/norm'"
    return (
        f"FROM {base}\n"
        f"COPY site/ {SITE_DIR}/\n"
        "COPY bin/ /usr/local/bin/\n"
        f'RUN python3 -m compileall -q -j 0 {SITE_DIR} && python3 -c "{check}"\n'
    ).encode()


def _context(files: dict[str, Path | bytes], dockerfile: bytes) -> io.BytesIO:
    """The build context as an in-memory tar (tens of MB): no temporary tree to copy and clean up."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for name, content in [("Dockerfile", dockerfile), *sorted(files.items())]:
            data = content if isinstance(content, bytes) else content.read_bytes()
            info = tarfile.TarInfo(name)
            info.size = len(data)
            info.mode = 0o755 if name.startswith("bin/") else 0o644
            tar.addfile(info, io.BytesIO(data))
    buf.seek(0)
    return buf


def _project_tag(base: str, files: dict[str, Path | bytes], dockerfile: bytes) -> str:
    parts = [base.encode(), dockerfile]
    for name, content in sorted(files.items()):
        parts += [name.encode(), content if isinstance(content, bytes) else content.read_bytes()]
    return f"{IMAGE}:{_digest(*parts)}"


def _build(client: docker.DockerClient, tag: str, context: io.BytesIO) -> None:
    log.info("building %s (the project layer)", tag)
    source = str(Path(__file__).resolve().parents[1])
    lines: list[str] = []
    stream = client.api.build(
        fileobj=context, custom_context=True, tag=tag, rm=True, forcerm=True, pull=False, decode=True,
        labels={LABEL_SOURCE: source},
    )  # fmt: skip
    for chunk in stream:
        if "error" in chunk:
            detail = "\n".join([*lines[-10:], chunk["error"].strip()])
            raise ImageError(f"docker build of {tag} failed:\n{detail}")
        if text := chunk.get("stream", "").strip():
            lines.append(text)
            if text.startswith("Step "):
                log.info("docker build: %s", text)
    _prune(client, tag, source)


def _prune(client: docker.DockerClient, keep: str, source: str) -> None:
    """Remove older project images built from this checkout (only those no container uses)."""
    import docker.errors

    for image in client.images.list(name=IMAGE, filters={"label": f"{LABEL_SOURCE}={source}"}):
        if keep not in image.tags and image.id is not None:
            with contextlib.suppress(docker.errors.APIError):  # in use by a container: keep it
                client.images.remove(image.id)


def ensure_image(client: docker.DockerClient) -> str:
    """The tag of an image with this project installed, building whatever part is missing or out of date."""
    cache = cache_dir()
    files = _context_files()
    with _build_lock(cache):
        base = ensure_base(client, cache)
        dockerfile = _dockerfile(base)
        tag = _project_tag(base, files, dockerfile)
        if not _has_image(client, tag):
            _build(client, tag, _context(files, dockerfile))
    return tag
