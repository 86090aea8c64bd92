"""Bad input: every malformed file is a TraceFormatError naming file and field, and nothing is written
under the output name. Fuzzing: any input either raises the library's own error or parses into what the
reader promises (an events table that passes the trace checks, or a bandwidth table of sane numbers)."""

from __future__ import annotations

import gzip
import io
import json
import tarfile
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from llmcomm.cli import main
from llmcomm.errors import LLMCommError, TraceFormatError
from llmcomm.events import validate_events
from llmcomm.ingest import (
    aicb,
    exec_trace,
    ingest_bandwidth,
    ingest_to_dataset,
    ingest_trace,
    kineto,
    nccl_tests,
    vtrain_lut,
)
from llmcomm.ingest.nccl_tests import BANDWIDTH_COLUMNS
from llmcomm.ingest.readers import TraceTable
from llmcomm.ingest.sources import Source
from llmcomm.trace_io import encode_meta
from llmcomm.vocab import EVENTS_SCHEMA


def kineto_doc(rank: int = 0, world: int = 2, nelems: object = 1024, ranks: str = "[0, 1]") -> dict:
    return {
        "distributedInfo": {"rank": rank, "world_size": world},
        "traceEvents": [
            {"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#3", "pid": 1, "tid": 1, "ts": 0, "dur": 100},
            {"ph": "X", "cat": "cpu_op", "name": "record_param_comms", "pid": 1, "tid": 1, "ts": 10, "dur": 5,
             "args": {"Collective name": "allreduce", "In msg nelems": nelems, "Out msg nelems": nelems,
                      "dtype": "Float", "Group size": world, "Process Group Ranks": ranks,
                      "Process Group Description": "TENSOR_MODEL_PARALLEL_GROUP", "In split size": "[]",
                      "Out split size": "[]"}},
        ],
    }


def write(path: Path, doc: object) -> Path:
    path.write_text(json.dumps(doc))
    return path


def test_synthetic_kineto_parses(tmp_path) -> None:
    tr = ingest_trace(write(tmp_path / "r0.json", kineto_doc()))
    ev = tr.events
    assert ev["op"].tolist() == ["all_reduce"] and ev["bytes"].tolist() == [4096]
    assert ev["parallelism"].tolist() == ["tp"] and ev["iteration"].tolist() == [3]


def test_truncated_json(tmp_path) -> None:
    p = tmp_path / "r0.json"
    p.write_text(json.dumps(kineto_doc())[:-40])
    with pytest.raises(TraceFormatError, match=r"r0\.json.*not valid JSON"):
        ingest_trace(p)


def test_truncated_gzip(tmp_path) -> None:
    p = tmp_path / "r0.json.gz"
    p.write_bytes(gzip.compress(json.dumps(kineto_doc()).encode())[:-30])
    with pytest.raises(TraceFormatError, match=r"r0\.json\.gz"):
        ingest_trace(p)


def test_empty_file(tmp_path) -> None:
    p = tmp_path / "empty.json"
    p.write_text("")
    with pytest.raises(TraceFormatError, match=r"empty\.json: empty file"):
        ingest_trace(p)


@pytest.mark.parametrize(("nelems", "field"), [("many", "In msg nelems"), (-5, "In msg nelems"),
                                               (True, "In msg nelems"), (1.5, "In msg nelems")])
def test_wrong_types(tmp_path, nelems: object, field: str) -> None:
    with pytest.raises(TraceFormatError, match=rf"r0\.json.*{field}"):
        ingest_trace(write(tmp_path / "r0.json", kineto_doc(nelems=nelems)))


def test_wrong_type_of_events_and_groups(tmp_path) -> None:
    with pytest.raises(TraceFormatError, match="traceEvents"):
        ingest_trace(write(tmp_path / "a.json", {"traceEvents": {"not": "a list"}, "distributedInfo": {"rank": 0}}))
    with pytest.raises(TraceFormatError, match="Process Group Ranks"):
        ingest_trace(write(tmp_path / "b.json", kineto_doc(ranks="[2, 3]", world=4)))


def test_missing_rank_metadata(tmp_path) -> None:
    doc = kineto_doc()
    del doc["distributedInfo"]
    with pytest.raises(TraceFormatError, match=r"r0\.json: field 'distributedInfo\.rank'"):
        ingest_trace(write(tmp_path / "r0.json", doc))


def test_missing_collective_metadata(tmp_path) -> None:
    doc = kineto_doc()
    doc["traceEvents"][1]["args"] = {"Input Dims": [[4]]}
    doc["traceEvents"].append({"ph": "X", "cat": "kernel", "name": "ncclKernel_AllReduce", "pid": 0, "tid": 7,
                               "ts": 12, "dur": 3, "args": {"correlation": 5}})
    with pytest.raises(TraceFormatError, match=r"r0\.json: field 'record_param_comms': missing metadata"):
        ingest_trace(write(tmp_path / "r0.json", doc))


def test_two_files_claim_the_same_rank(tmp_path) -> None:
    a = write(tmp_path / "a.json", kineto_doc(rank=1))
    b = write(tmp_path / "b.json", kineto_doc(rank=1))
    with pytest.raises(TraceFormatError, match=r"b\.json: field 'rank': rank 1 is already claimed by .*a\.json"):
        ingest_trace([a, b])
    out = tmp_path / "ds"
    with pytest.raises(TraceFormatError):
        ingest_to_dataset([a, b], out)
    assert not out.exists() and not any(p.name.startswith(".ds") for p in tmp_path.iterdir())


def _tar_with(tmp_path: Path, name: str, kind: bytes = tarfile.REGTYPE, link: str = "") -> Path:
    p = tmp_path / "bad.tar.gz"
    data = json.dumps(kineto_doc()).encode()
    with tarfile.open(p, "w:gz") as tf:
        ti = tarfile.TarInfo(name)
        ti.type = kind
        if kind == tarfile.REGTYPE:
            ti.size = len(data)
            tf.addfile(ti, io.BytesIO(data))
        else:
            ti.linkname = link
            tf.addfile(ti)
    return p


@pytest.mark.parametrize(("name", "kind", "link", "what"), [
    ("../escape.json", tarfile.REGTYPE, "", r"'\.\.'"),
    ("ok/../../escape.json", tarfile.REGTYPE, "", r"'\.\.'"),
    ("/etc/abs.json", tarfile.REGTYPE, "", "absolute path"),
    ("link.json", tarfile.SYMTYPE, "/etc/passwd", "links"),
    ("hard.json", tarfile.LNKTYPE, "other.json", "links"),
    ("dev", tarfile.CHRTYPE, "", "only plain files"),
])
def test_unsafe_tar_members(tmp_path, name: str, kind: bytes, link: str, what: str) -> None:
    p = _tar_with(tmp_path, name, kind, link)
    with pytest.raises(TraceFormatError, match=rf"bad\.tar\.gz!.*{what}"):
        ingest_trace(p)
    assert not (tmp_path / "escape.json").exists() and not (tmp_path.parent / "escape.json").exists()


def test_cli_writes_nothing_on_failure(tmp_path, capsys) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text('{"traceEvents": [')
    for out in (tmp_path / "t.parquet", tmp_path / "dataset"):
        assert main(["ingest", str(bad), "--out", str(out)]) == 1  # a data error (2 is for usage errors)
        assert not out.exists()
        assert "bad.json" in capsys.readouterr().err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bad.json"]


def test_cli_success(tmp_path) -> None:
    good = write(tmp_path / "r0.json", kineto_doc())
    out = tmp_path / "t.parquet"
    assert main(["ingest", str(good), "--out", str(out), "--tp", "2"]) == 0
    from llmcomm import read_trace

    assert len(read_trace(out)) == 1


def test_bad_text_formats(tmp_path) -> None:
    p = tmp_path / "AR_GPU4_LUT"
    p.write_text("size(B),count,type,time(ns),busbw(GB/s),time(ns),busbw(GB/s)\n1048576,x,float,1,2,3,4\n")
    with pytest.raises(TraceFormatError, match=r"AR_GPU4_LUT line 2: field"):
        ingest_bandwidth(p)
    q = tmp_path / "nccl.log"
    q.write_text("# nThread 1 nGpus 1\n#  size count type redop time algbw busbw error time algbw busbw error\n"
                 "  1024 256 float sum 3.1 0.1\n")
    with pytest.raises(TraceFormatError, match=r"nccl\.log: field 'row'"):
        ingest_bandwidth(q)
    r = tmp_path / "w.csv"
    r.write_text("comm_type,comm_group,comm_group_size,msg_size,stage\nCommType.all_reduce,CommGroup.tp_group,2,"
                 "lots,forward\n")
    with pytest.raises(TraceFormatError, match=r"w\.csv line 2: field 'msg_size'"):
        ingest_trace(r)


# -------------------------------------------------------------------------------------------- fuzzing
READERS = {
    "kineto": lambda s: kineto.parse(s, None, 0),
    "exec_trace": lambda s: exec_trace.parse(s, None, 0),
    "aicb": lambda s: aicb.parse(s),
    "nccl_tests": lambda s: nccl_tests.parse(s),
    "vtrain_lut": lambda s: vtrain_lut.parse(s),
}
json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-10, 2**40) | st.floats(allow_nan=False) | st.text(max_size=8),
    lambda ch: st.lists(ch, max_size=4) | st.dictionaries(st.text(max_size=12), ch, max_size=4),
    max_leaves=20,
)
ARG_KEYS = ["Collective name", "In msg nelems", "Out msg nelems", "dtype", "Group size", "Process Group Ranks",
            "In split size", "Global rank start", "Input Dims", "Input type", "correlation"]


@st.composite
def kineto_like(draw: st.DrawFn) -> bytes:
    evs = []
    for _ in range(draw(st.integers(0, 4))):
        args = {k: draw(json_values) for k in draw(st.lists(st.sampled_from(ARG_KEYS), max_size=6))}
        if draw(st.booleans()):
            args["Collective name"] = draw(st.sampled_from(["allreduce", "all_to_all", "send", "wait", "x"]))
        evs.append({"ph": draw(st.sampled_from(["X", "i", 3])),
                    "cat": draw(st.sampled_from(["cpu_op", "kernel", "cuda_runtime", "user_annotation"])),
                    "name": draw(st.sampled_from(["record_param_comms", "nccl:all_reduce", "ProfilerStep#1",
                                                  "ncclKernel_x", "cudaLaunchKernel", "Optimizer.step"])),
                    "tid": draw(st.integers(0, 2)), "ts": draw(json_values), "dur": draw(json_values), "args": args})
    doc = {"traceEvents": evs, "distributedInfo": draw(st.dictionaries(
        st.sampled_from(["rank", "world_size", "pg_config"]), json_values, max_size=3))}
    return json.dumps(doc).encode()


def _check_parsed(result: object, src: Source) -> None:
    """What a successful parse must return: a trace reader's ``TraceTable`` whose events are in
    ``EVENTS_SCHEMA`` and pass :func:`llmcomm.events.validate_events`, with JSON-storable metadata; a bandwidth
    reader's table with exactly the bandwidth columns, sizes and counts >= 0, times and bandwidths finite and
    >= 0, at least one rank."""
    if isinstance(result, pd.DataFrame):
        assert list(result.columns) == list(BANDWIDTH_COLUMNS)
        for col in ("bytes", "count"):
            assert (result[col].to_numpy(np.int64) >= 0).all(), col
        for col in ("time_us", "time_s", "algbw", "busbw"):
            v = result[col].to_numpy(np.float64)
            assert (np.isfinite(v) & (v >= 0)).all(), col
        ranks = result["ranks"].dropna().to_numpy(np.float64)
        assert (ranks >= 1).all()
        return
    assert isinstance(result, TraceTable), type(result)
    assert result.events.schema.equals(EVENTS_SCHEMA)
    validate_events(result.events, src.name)  # raises TraceFormatError: a parse that let bad rows through
    assert isinstance(result.meta, dict)
    encode_meta(result.meta)


def _parses_or_own_error(fn, src: Source) -> None:  # noqa: ANN001
    try:
        result = fn(src)
    except LLMCommError:
        return
    _check_parsed(result, src)


def test_the_fuzz_check_accepts_good_and_rejects_bad_parses() -> None:
    good = Source("rank0.json", json.dumps(kineto_doc()).encode())
    _check_parsed(kineto.parse(good, None, 0), good)
    text = Source("AR_GPU2_LUT", b"size(B),count,type,time(ns),busbw(GB/s),time(ns),busbw(GB/s)\n1024,256,float,5,1,6,1\n")
    table = vtrain_lut.parse(text)
    _check_parsed(table, text)
    with pytest.raises(AssertionError, match="busbw"):
        _check_parsed(table.assign(busbw=-1.0), text)
    events = kineto.parse(good, None, 0)
    schema = events.events.schema
    bad = events.events.set_column(schema.get_field_index("bytes"), schema.field("bytes"),
                                   pa.array([-1] * events.events.num_rows, pa.int64()))
    with pytest.raises(TraceFormatError, match="bytes"):
        _check_parsed(TraceTable(bad, events.meta), good)


FUZZ = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@FUZZ
@given(data=st.binary(max_size=300), reader=st.sampled_from(sorted(READERS)))
def test_fuzz_bytes(data: bytes, reader: str) -> None:
    _parses_or_own_error(READERS[reader], Source("fuzz.bin", data))


@FUZZ
@given(doc=json_values, reader=st.sampled_from(["kineto", "exec_trace"]))
def test_fuzz_json(doc: object, reader: str) -> None:
    _parses_or_own_error(READERS[reader], Source("fuzz.json", json.dumps(doc).encode()))


@FUZZ
@given(data=kineto_like())
def test_fuzz_kineto_structure(data: bytes) -> None:
    _parses_or_own_error(READERS["kineto"], Source("fuzz.json", data))


@FUZZ
@given(lines=st.lists(st.text(alphabet="0123456789.,- abcsizeNAfloat#\t", max_size=40), max_size=6),
       reader=st.sampled_from(["aicb", "nccl_tests", "vtrain_lut"]))
def test_fuzz_text(lines: list[str], reader: str) -> None:
    heads = {"aicb": "comm_type,comm_group,comm_group_size,msg_size,stage,_elapsed_time",
             "nccl_tests": "# size count type redop time algbw busbw error time algbw busbw error",
             "vtrain_lut": "size(B),count,type,time(ns),busbw(GB/s),time(ns),busbw(GB/s)"}
    text = "\n".join([heads[reader], *lines]).encode()
    _parses_or_own_error(READERS[reader], Source("AR_GPU2_fuzz", text))


@pytest.fixture(scope="module")
def real_rank_file(external) -> bytes:
    with tarfile.open(external("param/dlrm_kineto.tar.gz")) as tf:
        m = next(m for m in tf.getmembers() if m.isfile())
        return tf.extractfile(m).read()


@FUZZ
@given(cut=st.floats(0, 1), pos=st.floats(0, 1), junk=st.binary(min_size=1, max_size=8))
def test_fuzz_real_layout_mutations(real_rank_file: bytes, cut: float, pos: float, junk: bytes) -> None:
    """Damage a real trace in the profiler's layout (the fast path's input): a cut or a few bytes replaced."""
    data = real_rank_file
    i = int(pos * (len(data) - 8))
    mutated = data[:i] + junk + data[i + len(junk):]
    truncated = data[: int(cut * len(data))]
    for blob in (mutated, truncated):
        _parses_or_own_error(READERS["kineto"], Source("rank0.json", blob))
    with pytest.raises(TraceFormatError):
        kineto.parse(Source("rank0.json", truncated[: len(data) - 5]), None, 0)
