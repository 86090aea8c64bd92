"""The reader registry: every built-in format is a registered reader with one protocol, and a reader for a new
format, written outside the package, plugs into detection and dispatch without editing the package."""

from __future__ import annotations

from collections.abc import Iterator

import pandas as pd
import pytest

from llmcomm import ParallelConfig, read_trace
from llmcomm.errors import ConfigError, TraceFormatError
from llmcomm.ingest import (
    FunctionReader,
    ReadContext,
    Reader,
    Source,
    TraceTable,
    detect_format,
    ingest_bandwidth,
    ingest_to_dataset,
    ingest_trace,
    register_reader,
    registered_readers,
    unregister_reader,
)
from llmcomm.trace import events_to_table

# ---------------------------------------------------------------- a made-up format, as a user would write it
MAGIC = "#commlog v1"


def commlog_looks_like(source: Source) -> bool:
    return source.data.startswith(MAGIC.encode())


def commlog_read(source: Source, context: ReadContext) -> TraceTable:
    """``rank op bytes group t_start_ns t_end_ns`` per line; the rank of the file from its first line."""
    rows = []
    for number, line in enumerate(source.text().splitlines()[1:], start=2):
        fields = line.split()
        if len(fields) != 6:
            raise TraceFormatError(f"{source.name} line {number}: field 'line': 6 fields expected")
        rank, op, nbytes, group, t0, t1 = fields
        members = [int(g) for g in group.split(",")]
        tagged = context.tagger.tag(None, members, op)  # the context's configuration tags groups by ranks
        rows.append({"rank": int(rank), "op": op, "bytes": int(nbytes), "group": members, "phase": "forward",
                     "parallelism": tagged,
                     "t_start_ns": int(t0), "t_end_ns": int(t1), "source": "commlog"})
    table = events_to_table(pd.DataFrame(rows), source.name)
    return TraceTable(table, {"rank": rows[0]["rank"] if rows else None, "world_size": 4})


COMMLOG = FunctionReader("commlog", "trace", commlog_looks_like, commlog_read)


@pytest.fixture
def commlog() -> Iterator[Reader]:
    register_reader(COMMLOG)
    yield COMMLOG
    unregister_reader("commlog")


def _write(path, rank: int) -> str:  # noqa: ANN001
    dp_group = f"{rank},{rank + 2}"  # tp2 dp2: TP groups {0,1} {2,3}, DP groups {0,2} {1,3}
    path.write_text(f"{MAGIC}\n{rank} all_reduce 4096 0,1 100 250\n{rank} all_reduce 8192 {dp_group} 300 500\n")
    return path


# ------------------------------------------------------------------------------------------------- tests
def test_builtin_readers_share_one_protocol() -> None:
    names = {(r.name, r.kind) for r in registered_readers()}
    assert names >= {("kineto", "trace"), ("exec_trace", "trace"), ("aicb", "trace"), ("aicb", "bandwidth"),
                     ("nccl_tests", "bandwidth"), ("vtrain_lut", "bandwidth")}
    assert all(isinstance(r, Reader) for r in registered_readers())


def test_a_reader_registered_from_outside_reads_its_format(commlog: Reader, tmp_path) -> None:
    files = [_write(tmp_path / f"r{rank}.commlog", rank) for rank in (1, 0)]
    assert detect_format(Source(str(files[0]), files[0].read_bytes())) == "commlog"
    trace = ingest_trace(files, ParallelConfig(tp=2, dp=2))
    ev = trace.events.sort_values(["rank", "t_start_ns"], ignore_index=True)
    assert ev["rank"].tolist() == [0, 0, 1, 1] and ev["bytes"].tolist() == [4096, 8192] * 2
    assert ev["parallelism"].tolist() == ["tp", "dp"] * 2  # tagged by ranks, through the context
    assert trace.meta["formats"] == ["commlog"] and trace.meta["ranks"] == [0, 1]
    back = read_trace(ingest_to_dataset(files, tmp_path / "ds"))
    assert sorted(back.events["bytes"].tolist()) == [4096, 4096, 8192, 8192]


def test_unregistered_format_is_unknown_again(commlog: Reader, tmp_path) -> None:
    path = _write(tmp_path / "r0.commlog", 0)
    unregister_reader("commlog")
    with pytest.raises(TraceFormatError, match=r"r0\.commlog: unknown format"):
        ingest_trace(path)


def test_registration_rules() -> None:
    with pytest.raises(ConfigError, match="lacks"):
        register_reader(object())  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="kind"):
        register_reader(FunctionReader("x", "matrix", commlog_looks_like, commlog_read))
    with pytest.raises(ConfigError, match="before="):
        register_reader(COMMLOG, before="no-such-reader")
    try:  # asked before a built-in one; registering the same name and kind again replaces it
        register_reader(COMMLOG, before="kineto")
        register_reader(COMMLOG, before="vtrain_lut")
        names = [r.name for r in registered_readers()]
        assert names.count("commlog") == 1 and names.index("commlog") == 0
    finally:
        unregister_reader("commlog")
    assert "commlog" not in [r.name for r in registered_readers()]


def test_a_file_of_the_other_kind_is_refused_by_name(tmp_path) -> None:
    lut = tmp_path / "AR_GPU2_LUT"
    lut.write_text("size(B),count,type,time(ns),busbw(GB/s),time(ns),busbw(GB/s)\n1024,256,float,10,1,10,1\n")
    with pytest.raises(TraceFormatError, match="a vtrain_lut bandwidth measurement, not a trace"):
        ingest_trace(lut)
    assert ingest_bandwidth(lut)["format"].tolist() == ["vtrain_lut", "vtrain_lut"]


def test_source_text_names_the_file() -> None:
    assert Source("a.csv", b"\xef\xbb\xbfsize\n").text() == "size\n"
    with pytest.raises(TraceFormatError, match=r"b\.csv: not UTF-8 text"):
        Source("b.csv", b"\xff\xfe\x00bad").text()


def test_json_is_parsed_once_for_detection_and_reading(tmp_path, monkeypatch) -> None:
    from llmcomm.ingest import sources

    calls = []
    real = sources.loads_json
    monkeypatch.setattr(sources, "loads_json", lambda src: calls.append(src.name) or real(src))
    doc = b'{"schema": "1.0.1", "pid": 1, "time": "x", "start_ts": 0, "nodes": []}'
    src = Source("et.json", b'{"pad": "' + b" " * 70000 + b'", ' + doc[1:])  # keys beyond the sniffed head
    assert detect_format(src) == "exec_trace"
    from llmcomm.ingest import exec_trace

    assert exec_trace.parse(src, None, 0).meta["calls"] == 0
    assert calls == ["et.json"]


def test_a_reader_returning_the_wrong_shape_is_named(tmp_path) -> None:
    path = _write(tmp_path / "r0.commlog", 0)
    bad_events = FunctionReader("commlog", "trace", commlog_looks_like,
                                lambda source, context: TraceTable(pd.DataFrame({"rank": [0]}), {"rank": 0}))
    register_reader(bad_events)
    try:
        with pytest.raises(TraceFormatError, match=r"r0\.commlog: reader 'commlog' returned events .* EVENTS_SCHEMA"):
            ingest_trace(path)
        register_reader(FunctionReader("commlog", "trace", commlog_looks_like, lambda source, context: None))
        with pytest.raises(TraceFormatError, match="returned NoneType"):
            ingest_trace(path)
    finally:
        unregister_reader("commlog")
