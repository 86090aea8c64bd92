"""Third-party data through a checksummed manifest (``data/external.yaml``).

``path(name)`` returns a local copy of a manifest file whose SHA-256 matches the manifest:

1. from the mirror folder named by ``$LLMCOMM_EXTERNAL`` (the Makefile and CI point it at
   ``../shared/external`` when that exists), else
2. from the download cache (``$LLMCOMM_CACHE``, default pooch's per-user cache), fetching the upstream file,
   pinned to its commit, once with pooch. An entry marked ``mirror_only`` (a file derived in the shared folder,
   or an upstream version whose commit is not known) has no download: its ``note`` says why.

A checksum mismatch is a :class:`DataError` naming the file, the expected and the actual hash; it is never
accepted. A file that is neither mirrored nor downloadable is a :class:`DataError` saying how to get it.
Third-party files are never copied into the repository.
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import yaml

from .errors import DataError
from .paths import data_dir

MANIFEST = data_dir() / "external.yaml"
ENV_MIRROR = "LLMCOMM_EXTERNAL"
ENV_CACHE = "LLMCOMM_CACHE"


@dataclass(frozen=True)
class Entry:
    """One manifest row: ``name`` (path relative to the external folder), pinned ``url``, ``sha256``..."""

    name: str
    url: str
    sha256: str
    bytes: int
    license: str
    description: str
    repo: str = ""
    commit: str = ""
    upstream_path: str = ""
    mirror_only: bool = False  # no pinned upstream copy (derived, or an upstream version without a commit)
    note: str = ""


@lru_cache(maxsize=4)
def _load(manifest: Path) -> dict[str, Entry]:
    try:
        doc = yaml.safe_load(manifest.read_text(encoding="utf-8")) or {}
    except (OSError, yaml.YAMLError) as e:
        raise DataError(f"{manifest}: cannot read the data manifest: {e}") from None
    out: dict[str, Entry] = {}
    for i, row in enumerate(doc.get("files") or []):
        try:
            entry = Entry(**row)
        except TypeError as err:
            raise DataError(f"{manifest}: entry {i} is malformed: {err}") from None
        if len(entry.sha256) != 64:
            raise DataError(f"{manifest}: entry {entry.name!r} has no 64-digit sha256")
        if not entry.url and not entry.mirror_only:
            raise DataError(f"{manifest}: entry {entry.name!r} has no url (rule: a pinned url, or mirror_only: true "
                            "with a note saying why there is none)")
        out[entry.name] = entry
    return out


def entries(manifest: Path | None = None) -> dict[str, Entry]:
    """All manifest entries by name."""
    return _load(Path(manifest or MANIFEST))


def entry(name: str) -> Entry:
    """The manifest entry of ``name``; a :class:`DataError` listing the known names if there is none."""
    es = entries()
    if name not in es:
        raise DataError(f"{name!r} is not in the data manifest {MANIFEST}; known: {sorted(es)}")
    return es[name]


def sha256_of(path: Path, chunk: int = 1 << 20) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        while block := fh.read(chunk):
            h.update(block)
    return h.hexdigest()


_VERIFIED: dict[tuple[str, int, int], str] = {}


def verify(path: Path, expected: str, name: str | None = None) -> Path:
    """Check ``path`` against ``expected`` SHA-256; raise :class:`DataError` with both hashes if they differ.
    A file already verified (same path, size and mtime) is not hashed again in this process."""
    st = path.stat()
    key = (str(path.resolve()), st.st_size, st.st_mtime_ns)
    actual = _VERIFIED.get(key) or sha256_of(path)
    if actual != expected:
        raise DataError(f"{name or path.name}: checksum mismatch for {path}: expected sha256 {expected}, "
                        f"got {actual}; the file is corrupt or not the pinned upstream version")
    _VERIFIED[key] = actual
    return path


def mirror_dir() -> Path | None:
    env = os.environ.get(ENV_MIRROR)
    return Path(env) if env else None


def cache_dir() -> Path:
    env = os.environ.get(ENV_CACHE)
    if env:
        return Path(env)
    import pooch

    return Path(pooch.os_cache("llmcomm"))


def path(name: str) -> Path:
    """A verified local copy of manifest file ``name`` (e.g. ``"aicb/A100_example.csv"``)."""
    e = entry(name)
    mirror = mirror_dir()
    if mirror is not None:
        p = mirror / e.name
        if p.is_file():
            return verify(p, e.sha256, e.name)
    cached = cache_dir() / e.name
    if cached.is_file():
        return verify(cached, e.sha256, e.name)
    if e.mirror_only:
        where = f"${ENV_MIRROR}={mirror} does not hold it" if mirror else f"${ENV_MIRROR} is not set"
        raise DataError(f"{e.name}: not available locally ({where}) and it cannot be downloaded: {e.note}. Point "
                        f"${ENV_MIRROR} at a folder holding {e.name} (the shared external folder) or place the "
                        f"file (sha256 {e.sha256}) at {cached}")
    return _download(e, cached, mirror)


def _download(e: Entry, target: Path, mirror: Path | None) -> Path:
    import pooch

    where = f"${ENV_MIRROR}={mirror} does not hold it" if mirror else f"${ENV_MIRROR} is not set"
    try:
        got = pooch.retrieve(e.url, known_hash=None, fname=target.name, path=target.parent, progressbar=False)
    except Exception as err:  # network, HTTP or file-system failure: all mean "not available here"
        raise DataError(
            f"{e.name}: not available locally ({where}) and the download from {e.url} failed: "
            f"{type(err).__name__}: {err}. Point ${ENV_MIRROR} at a folder holding {e.name} "
            f"(e.g. ../shared/external) or connect to the network."
        ) from None
    p = Path(got)
    try:
        return verify(p, e.sha256, e.name)
    except DataError:
        p.unlink(missing_ok=True)  # never keep a wrong file in the cache
        raise


def verify_all(names: list[str] | None = None) -> dict[str, Path]:
    """Resolve and verify every manifest file (or ``names``); the first failure raises."""
    return {n: path(n) for n in (names or sorted(entries()))}
