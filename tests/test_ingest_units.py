"""Unit behaviour of the readers on small synthetic inputs: group tagging, split sizes, peers, nccl-tests
variants, and streaming many rank files with bounded memory."""

from __future__ import annotations

import json
import re
import tracemalloc

import pytest

from llmcomm import Layout, ParallelConfig, read_trace
from llmcomm.errors import TraceFormatError
from llmcomm.ingest import ingest_bandwidth, ingest_to_dataset, ingest_trace
from llmcomm.ingest.common import GroupTagger, parallelism_from_name


@pytest.mark.parametrize(("desc", "tag"), [
    ("TENSOR_MODEL_PARALLEL_GROUP", "tp"), ("PIPELINE_MODEL_PARALLEL_GROUP", "pp"),
    ("DATA_PARALLEL_GROUP_WITH_CP", "dp"), ("CONTEXT_PARALLEL_GROUP", "cp"), ("EXPERT_MODEL_PARALLEL_GROUP", "ep"),
    ("EXPERT_DATA_PARALLEL_GROUP", "dp"), ("mesh_dp_shard", "dp"), ("tp", "tp"), ("CommGroup.ep_group", "ep"),
    ("default_pg", None), ("0", None), ("undefined", None), ("EMBEDDING_GROUP", None),
])
def test_parallelism_from_name(desc: str, tag: str | None) -> None:
    assert parallelism_from_name(desc) == tag


def test_group_tagger_matches_layout_groups() -> None:
    par = ParallelConfig(tp=2, dp=4, pp=2, ep=2)
    lay = Layout(par)
    t = GroupTagger(par)
    for p in ("tp", "pp", "dp"):
        for row in lay.groups(p):
            assert t.tag(None, list(row[::-1]), "all_reduce") == p  # order of ranks does not matter
    for row in lay.groups("ep"):
        assert t.tag("default_pg", list(row), "all_to_all") == "ep"
    assert t.tag(None, [0, 5], "all_reduce") == "other"
    assert t.tag("TENSOR_MODEL_PARALLEL_GROUP", [0, 5], "all_reduce") == "tp"  # a name wins over ranks
    assert GroupTagger(None).tag(None, [0, 1], "all_reduce") == "other"


def kineto(rank: int, world: int, records: list[dict]) -> dict:
    evs = [{"ph": "X", "cat": "cpu_op", "name": "record_param_comms", "pid": 1, "tid": 1, "ts": 10 * i, "dur": 5,
            "args": a} for i, a in enumerate(records)]
    return {"distributedInfo": {"rank": rank, "world_size": world}, "traceEvents": evs}


def rec(name: str, n_in: int, n_out: int, ranks: list[int], **extra: object) -> dict:
    return {"Collective name": name, "In msg nelems": n_in, "Out msg nelems": n_out, "dtype": "BFloat16",
            "Group size": len(ranks), "Process Group Ranks": str(ranks), **extra}


def test_sizes_splits_and_peers(tmp_path) -> None:
    recs = [rec("all_to_allv", 24, 30, [0, 1, 2], **{"In split size": "[1, 2, 3]", "Out split size": "[2, 2, 1]"}),
            rec("all_to_all", 12, 12, [0, 1, 2], **{"In split size": "[]"}),
            rec("_allgather_base", 4, 12, [0, 1, 2]), rec("_reduce_scatter_base", 12, 4, [0, 1, 2]),
            rec("send", 8, 8, [0, 1]), rec("recv", 8, 8, [0, 2], **{"Peer rank": 2}), rec("barrier", 1, 1, [0, 1]),
            rec("gather", 4, 12, [0, 1, 2])]
    p = tmp_path / "r0.json"
    p.write_text(json.dumps(kineto(0, 3, recs)))
    tr = ingest_trace(p)
    ev = tr.events
    assert ev["op"].tolist() == ["all_to_all", "all_to_all", "all_gather", "reduce_scatter", "send", "recv"]
    # bf16 = 2 bytes; splits count rows of dim 0 (24 elements / 6 rows = 4 per row)
    assert ev["bytes"].tolist() == [48, 24, 24, 24, 16, 16]
    assert list(ev["split_bytes"][0]) == [8, 16, 24] and list(ev["split_bytes"][1]) == [8, 8, 8]
    assert ev["peer"].tolist()[4:] == [1, 2]
    assert tr.meta["per_file"][0]["skipped"] == {"barrier": 1, "gather": 1}


def test_nccl_tests_variants(tmp_path) -> None:
    head = ("# nThread 1 nGpus 1 minBytes 8 maxBytes 128 step: 2(factor) warmup iters: 5 iters: 20\n"
            "#  Rank  0 Group  0 Pid   1 on hostA device  0 [0x07] NVIDIA H100\n"
            "#  Rank  1 Group  0 Pid   2 on hostB device  0 [0x07] NVIDIA H100\n"
            "#       size   count   type  redop  root   time  algbw  busbw #wrong   time  algbw  busbw #wrong\n")
    rows = "        1024     256  float   none    -1  10.00   0.10   0.05      0  11.00   0.09   0.05      0\n"
    p = tmp_path / "all_gather_perf.log"
    p.write_text(head + rows)
    bw = ingest_bandwidth(p)
    assert bw["op"].tolist() == ["all_gather"] * 2 and (bw["ranks"] == 2).all() and (bw["nodes"] == 2).all()
    assert bw["time_us"].tolist() == [10.0, 11.0] and (bw["device"] == "NVIDIA H100").all()
    q = tmp_path / "unnamed.log"
    q.write_text(head + rows)  # busbw/algbw = 1/2 = (n-1)/n: all_gather, reduce_scatter or all_to_all
    with pytest.raises(TraceFormatError, match="pass op="):
        ingest_bandwidth(q)
    assert (ingest_bandwidth(q, op="reduce_scatter")["op"] == "reduce_scatter").all()


def _with_rank(raw: bytes, rank: int, world: int) -> bytes:
    """The trace's own bytes (so its layout) with distributedInfo's rank and world size rewritten."""
    def sub(m: re.Match) -> bytes:
        block = re.sub(rb'"rank": \d+', b'"rank": %d' % rank, m.group(0))
        return re.sub(rb'"world_size": \d+', b'"world_size": %d' % world, block)

    return re.sub(rb'"distributedInfo": \{[^}]*\}', sub, raw, count=1)


def _peak(fn) -> int:  # noqa: ANN001
    tracemalloc.start()
    fn()
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    return peak


def test_streaming_many_ranks_bounded_memory(external, tmp_path) -> None:
    import tarfile

    with tarfile.open(external("param/dlrm_kineto.tar.gz")) as tf:
        m = next(m for m in tf.getmembers() if m.isfile())
        raw = tf.extractfile(m).read()
    n = 40
    for d, count in (("one", 1), ("many", n)):
        (tmp_path / d).mkdir()
        for r in range(count):
            (tmp_path / d / f"rank{r}.json").write_bytes(_with_rank(raw, r, n))
    p1 = _peak(lambda: ingest_to_dataset(tmp_path / "one", tmp_path / "ds1"))
    pn = _peak(lambda: ingest_to_dataset(tmp_path / "many", tmp_path / "ds"))
    assert pn < 1.5 * p1 + 2**20, f"memory grows with the number of files: {p1} for 1, {pn} for {n}"
    assert pn < 4 * len(raw), f"peak Python memory {pn} for files of {len(raw)} bytes"
    back = read_trace(tmp_path / "ds")
    assert sorted(back.events["rank"].unique()) == list(range(n)) and len(back) == 8 * n


def test_prose_about_nccl_tests_is_not_taken_for_its_output(tmp_path) -> None:
    p = tmp_path / "notes.md"
    p.write_text("We ran nccl-tests; see the out-of-place busbw column and nThread settings.\n")
    with pytest.raises(TraceFormatError, match="notes.md: unknown format"):
        ingest_bandwidth(p)
