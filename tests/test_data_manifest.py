"""The data manifest: every entry pinned and checksummed; path() verifies and never accepts a mismatch."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import pytest

from llmcomm import data
from llmcomm.errors import DataError

ROOT = Path(__file__).resolve().parent.parent


def test_manifest_entries_are_pinned() -> None:
    es = data.entries()
    assert len(es) >= 30
    for e in es.values():
        assert e.license in ("MIT", "Apache-2.0") and e.description and len(e.sha256) == 64
        if e.mirror_only:  # no pinned upstream copy: says why, and offers no url
            assert e.url == "" and e.note
            continue
        assert e.url == f"https://raw.githubusercontent.com/{e.repo}/{e.commit}/{e.upstream_path}"
        assert len(e.commit) == 40


def test_manifest_matches_the_shared_sources_json(external) -> None:
    """Independent check: the shared folder's sources.json and SHA256SUMS agree with the manifest."""
    mirror = data.mirror_dir()
    assert mirror is not None, "LLMCOMM_EXTERNAL must point at the shared external folder for the tests"
    sources = {s["path"]: s for s in json.loads((mirror / "sources.json").read_text())}
    sums = dict(reversed(line.split()) for line in (mirror / "SHA256SUMS").read_text().splitlines() if line)
    es = data.entries()
    assert set(sources) == set(es)
    for name, e in es.items():
        assert e.sha256 == sources[name]["sha256"] == sums[name]
        assert e.commit == sources[name]["commit"]


def test_every_file_resolves_and_verifies(external) -> None:
    for name, e in data.entries().items():
        p = external(name)
        assert p.is_file() and p.stat().st_size == e.bytes
        assert hashlib.sha256(p.read_bytes()).hexdigest() == e.sha256


def test_no_third_party_file_in_the_repo() -> None:
    names = {Path(n).name for n in data.entries() if not Path(n).name.startswith(("LICENSE", "README"))}
    found = [p for p in ROOT.rglob("*") if p.name in names and ".venv" not in p.parts and "build" not in p.parts]
    assert not found, f"third-party files copied into the repository: {found}"


def test_checksum_mismatch_is_an_error(tmp_path, monkeypatch) -> None:
    name = "vtrain/README.md"
    bad = tmp_path / name
    bad.parent.mkdir(parents=True)
    bad.write_text("not the upstream file\n")
    monkeypatch.setenv(data.ENV_MIRROR, str(tmp_path))
    with pytest.raises(DataError) as ei:
        data.path(name)
    msg = str(ei.value)
    assert name in msg and data.entry(name).sha256 in msg
    assert hashlib.sha256(bad.read_bytes()).hexdigest() in msg


def test_missing_file_without_network_names_the_file(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv(data.ENV_MIRROR, str(tmp_path / "empty"))
    monkeypatch.setenv(data.ENV_CACHE, str(tmp_path / "cache"))
    e = data.entry("echo/nccl-test-log/nccl_8.log")
    # an unreachable URL stands in for "no network" (no request leaves this machine)
    monkeypatch.setattr(data, "entry", lambda name: data.Entry(**{**e.__dict__, "url": "http://127.0.0.1:9/x"}))
    with pytest.raises(DataError) as ei:
        data.path("echo/nccl-test-log/nccl_8.log")
    msg = str(ei.value)
    assert "echo/nccl-test-log/nccl_8.log" in msg and data.ENV_MIRROR in msg
    assert not any((tmp_path / "cache").rglob("nccl_8.log"))


def test_mirror_only_file_missing_says_why(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv(data.ENV_MIRROR, str(tmp_path / "empty"))
    monkeypatch.setenv(data.ENV_CACHE, str(tmp_path / "cache"))
    with pytest.raises(DataError) as ei:
        data.path("nemo/h100_pretraining.csv")
    msg = str(ei.value)
    assert "cannot be downloaded" in msg and data.ENV_MIRROR in msg and "nemo/h100_pretraining.csv" in msg


def test_entry_without_url_must_be_mirror_only(tmp_path) -> None:
    m = tmp_path / "external.yaml"
    m.write_text("files:\n  - {name: a.csv, url: '', sha256: '" + "0" * 64 + "', bytes: 1, license: MIT, "
                 "description: x}\n")
    with pytest.raises(DataError, match="mirror_only"):
        data.entries(m)


def test_unknown_name_is_an_error() -> None:
    with pytest.raises(DataError, match="not in the data manifest"):
        data.path("nope/missing.csv")


def test_cache_is_used_when_no_mirror(tmp_path, monkeypatch) -> None:
    name = "vtrain/README.md"
    src = data.path(name)
    cache = tmp_path / "cache"
    (cache / name).parent.mkdir(parents=True)
    (cache / name).write_bytes(src.read_bytes())
    monkeypatch.delenv(data.ENV_MIRROR, raising=False)
    monkeypatch.setenv(data.ENV_CACHE, str(cache))
    assert data.path(name) == cache / name
    assert os.environ.get(data.ENV_MIRROR) is None
