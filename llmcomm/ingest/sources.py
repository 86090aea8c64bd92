"""Where ingest reads from: plain files, gzip files, directories and tar archives, one *source* at a time.

A :class:`Source` is one file's bytes plus the name used in error messages (``archive.tar.gz!member`` for a
tar member). Archives are never extracted to disk: members are checked first — no absolute path, no ``..``,
no link, no device — and then read directly from the tar, one at a time, so memory holds about one file.
"""

from __future__ import annotations

import gzip
import os
import re
import tarfile
import zlib
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from ..errors import TraceFormatError

GZIP_MAGIC = b"\x1f\x8b"
TAR_SUFFIXES = (".tar", ".tar.gz", ".tgz", ".tar.bz2", ".tar.xz")
MAX_MEMBER_BYTES = 8 << 30
# documentation beside data in a folder (skipped when walking folders, never when named explicitly)
DOC_FILE = re.compile(r"^(README|LICEN[CS]E|COPYING|NOTICE|SHA256SUMS)(\.\w+)?$|\.(md|rst|txt|yaml|yml)$|^sources\.json$",
                      re.IGNORECASE)  # refuse absurd members (a zip bomb would claim more)


@dataclass
class Source:
    """One input file: ``name`` (for messages and file-name hints) and its decompressed ``data``."""

    name: str
    data: bytes

    @property
    def size(self) -> int:
        return len(self.data)


def gunzip(data: bytes, name: str) -> bytes:
    """Decompress gzip bytes (possibly several members); a damaged stream is a :class:`TraceFormatError`."""
    if not data.startswith(GZIP_MAGIC):
        return data
    try:
        return gzip.decompress(data)
    except (OSError, EOFError, zlib.error) as e:
        raise TraceFormatError(f"{name}: damaged gzip stream: {e}") from None


def is_tar(path: Path) -> bool:
    return path.name.lower().endswith(TAR_SUFFIXES)


def check_member(member: tarfile.TarInfo, archive: str) -> None:
    """Reject a tar member that could write outside the target or is not a plain file or folder."""
    name = member.name
    where = f"{archive}!{name}"
    p = PurePosixPath(name)
    if p.is_absolute() or name.startswith(("/", "\\")) or (len(name) > 1 and name[1] == ":"):
        raise TraceFormatError(f"{where}: field 'member name': absolute path in archive is not allowed")
    if ".." in p.parts or ".." in PurePosixPath(name.replace("\\", "/")).parts:
        raise TraceFormatError(f"{where}: field 'member name': '..' in an archive path is not allowed")
    if member.issym() or member.islnk():
        raise TraceFormatError(f"{where}: field 'member type': links in archives are not allowed")
    if not (member.isfile() or member.isdir()):
        raise TraceFormatError(f"{where}: field 'member type': only plain files and folders are allowed")
    if member.size > MAX_MEMBER_BYTES:
        raise TraceFormatError(f"{where}: field 'member size': {member.size} bytes is over the limit")


def iter_tar(path: Path) -> Iterator[Source]:
    """Members of a tar archive as sources, in name order, after checking every member."""
    try:
        with tarfile.open(path, "r:*") as tf:
            members = tf.getmembers()
            for m in members:
                check_member(m, str(path))
            for m in sorted((m for m in members if m.isfile()), key=lambda m: m.name):
                base = PurePosixPath(m.name).name
                if base.startswith(".") or base.startswith("._"):
                    continue  # editor / macOS metadata files
                fh = tf.extractfile(m)
                if fh is None:
                    raise TraceFormatError(f"{path}!{m.name}: field 'member': cannot be read")
                name = f"{path}!{m.name}"
                yield Source(name, gunzip(fh.read(), name))
    except (tarfile.TarError, EOFError, OSError, zlib.error) as e:
        raise TraceFormatError(f"{path}: not a readable tar archive: {e}") from None


def read_file(path: Path) -> Source:
    try:
        raw = path.read_bytes()
    except OSError as e:
        raise TraceFormatError(f"{path}: cannot read: {e}") from None
    return Source(str(path), gunzip(raw, str(path)))


def iter_sources(paths: Iterable[str | os.PathLike[str]]) -> Iterator[Source]:
    """Every file under ``paths`` (files, folders walked in name order, tar archives), one at a time."""
    for p in paths:
        p = Path(p)
        if not p.exists():
            raise TraceFormatError(f"{p}: no such file or folder")
        if p.is_dir():
            every = sorted(f for f in p.rglob("*") if f.is_file())
            files = [f for f in every if not f.name.startswith(".") and not DOC_FILE.match(f.name)]
            if not files:
                raise TraceFormatError(f"{p}: folder holds no trace files{skipped_note(every, p)}")
            for f in files:
                yield from (iter_tar(f) if is_tar(f) else [read_file(f)])
        elif is_tar(p):
            yield from iter_tar(p)
        else:
            yield read_file(p)


def skipped_note(skipped: list[Path], root: Path, limit: int = 10) -> str:
    """``"; skipped: README.md (documentation), .x (hidden)"`` for the files a folder walk left out."""
    if not skipped:
        return " (it is empty)"
    parts = [f"{f.relative_to(root)} ({'hidden' if f.name.startswith('.') else 'documentation or notes'})"
             for f in skipped[:limit]]
    more = f" and {len(skipped) - limit} more" if len(skipped) > limit else ""
    return "; skipped: " + ", ".join(parts) + more + " (name a file explicitly to read it anyway)"


def loads_json(src: Source) -> object:
    """Parse JSON bytes with orjson when installed, else the standard library; errors name the file."""
    if not src.data.strip():
        raise TraceFormatError(f"{src.name}: empty file")
    try:
        import orjson

        return orjson.loads(src.data)
    except ImportError:
        pass
    except Exception as e:  # orjson.JSONDecodeError (a ValueError); any other parse failure
        raise TraceFormatError(f"{src.name}: not valid JSON (truncated or damaged?): {e}") from None
    import json

    try:
        return json.loads(src.data)
    except (ValueError, UnicodeDecodeError, RecursionError) as e:
        raise TraceFormatError(f"{src.name}: not valid JSON (truncated or damaged?): {e}") from None
