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
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any

from ..errors import TraceFormatError

GZIP_MAGIC = b"\x1f\x8b"
TAR_SUFFIXES = (".tar", ".tar.gz", ".tgz", ".tar.bz2", ".tar.xz")
MAX_MEMBER_BYTES = 8 << 30  # refuse absurd members (a zip bomb would claim more)
# documentation beside data in a folder (skipped when walking folders, never when named explicitly)
DOC_FILE = re.compile(r"^(README|LICEN[CS]E|COPYING|NOTICE|SHA256SUMS)(\.\w+)?$|\.(md|rst|txt|yaml|yml)$|^sources\.json$",
                      re.IGNORECASE)


JSON_HEAD_BYTES = 65536  # how far a reader looks for the keys that name a JSON format
_NOT_PARSED = object()


@dataclass
class Source:
    """One input file: ``name`` (for messages and file-name hints) and its decompressed ``data``."""

    name: str
    data: bytes
    _json: object = field(default=_NOT_PARSED, repr=False, compare=False)

    @property
    def size(self) -> int:
        return len(self.data)

    def text(self) -> str:
        """The data as UTF-8 text (a byte-order mark dropped); :class:`TraceFormatError` naming the file when
        it is not UTF-8."""
        try:
            return self.data.decode("utf-8-sig")
        except UnicodeDecodeError as e:
            raise TraceFormatError(f"{self.name}: not UTF-8 text: {e}") from None

    def is_json(self) -> bool:
        """Whether the data starts like a JSON object or array (the first non-blank byte is ``{`` or ``[``)."""
        return self.data[:JSON_HEAD_BYTES].lstrip()[:1] in (b"{", b"[")

    def head_contains(self, *keys: bytes) -> bool:
        """Whether every one of ``keys`` occurs in the first :data:`JSON_HEAD_BYTES` bytes."""
        head = self.data[:JSON_HEAD_BYTES]
        return all(k in head for k in keys)

    def json(self, *, keep: bool = True) -> object:
        """The parsed JSON document (see :func:`loads_json`). Format detection parses once and keeps the
        outcome, document or error (``keep=True``), so that the next reader asked does not parse again; a
        reader takes it with ``keep=False``, which hands the kept outcome over and forgets it (or parses
        without keeping), so the document is freed with the reader's result."""
        doc = self._json
        if doc is _NOT_PARSED:
            try:
                doc = loads_json(self)
            except TraceFormatError as e:
                doc = e
            if keep:
                self._json = doc
        elif not keep:
            self._json = _NOT_PARSED
        if isinstance(doc, TraceFormatError):
            raise doc
        return doc

    def json_or_none(self) -> object | None:
        """:meth:`json`, or None when the data is not valid JSON (for format detection)."""
        try:
            return self.json()
        except TraceFormatError:
            return None


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
        with tarfile.open(path, "r:*") as archive:
            members = archive.getmembers()
            for member in members:
                check_member(member, str(path))
            for member in sorted((m for m in members if m.isfile()), key=lambda m: m.name):
                base = PurePosixPath(member.name).name
                if base.startswith(".") or base.startswith("._"):
                    continue  # editor / macOS metadata files
                stream = archive.extractfile(member)
                if stream is None:
                    raise TraceFormatError(f"{path}!{member.name}: field 'member': cannot be read")
                name = f"{path}!{member.name}"
                yield Source(name, gunzip(stream.read(), name))
    except (tarfile.TarError, EOFError, OSError, zlib.error) as e:
        raise TraceFormatError(f"{path}: not a readable tar archive: {e}") from None


def read_file(path: Path) -> Source:
    try:
        raw = path.read_bytes()
    except OSError as e:
        raise TraceFormatError(f"{path}: cannot read: {e}") from None
    return Source(str(path), gunzip(raw, str(path)))


def input_files(paths: Iterable[str | os.PathLike[str]]) -> Iterator[Path]:
    """Every input file under ``paths``, lazily: a file as given, a folder walked in name order without hidden
    and documentation files (a folder with nothing else is an error listing what it skipped and why)."""
    for given in paths:
        path = Path(given)
        if not path.exists():
            raise TraceFormatError(f"{path}: no such file or folder")
        if not path.is_dir():
            yield path
            continue
        every = sorted(f for f in path.rglob("*") if f.is_file())
        files = [f for f in every if not f.name.startswith(".") and not DOC_FILE.match(f.name)]
        if not files:  # then every file was skipped
            raise TraceFormatError(f"{path}: folder holds no trace files{skipped_note(every, path)}")
        yield from files


def iter_sources(paths: Iterable[str | os.PathLike[str]]) -> Iterator[Source]:
    """Every file under ``paths`` (files, folders walked in name order, tar archives), one at a time."""
    for file in input_files(paths):
        yield from (iter_tar(file) if is_tar(file) else [read_file(file)])


def json_list(source: Source, key: str, is_document: Callable[[object], bool], what: str) -> tuple[dict, list]:
    """The JSON document of ``source`` (taken from detection, see :meth:`Source.json`) and its list
    ``doc[key]``; a :class:`TraceFormatError` naming the field when ``is_document`` rejects the document
    (it is not ``what``) or the field is not a list."""
    doc: Any = source.json(keep=False)
    if not is_document(doc):
        raise TraceFormatError(f"{source.name}: field {key!r}: missing; not {what}")
    items = doc[key]
    if not isinstance(items, list):
        raise TraceFormatError(f"{source.name}: field {key!r}: expected a list, got {type(items).__name__}")
    return doc, items


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
