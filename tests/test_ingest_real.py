"""Readers against the real third-party files. Expected values come from an independent, simpler pass over
the same file inside each test (regex / csv / json), never from the reader under test."""

from __future__ import annotations

import csv
import gzip
import json
import re
import tarfile

import numpy as np
import pytest

from llmcomm import ParallelConfig, read_trace
from llmcomm.ingest import ingest_bandwidth, ingest_to_dataset, ingest_trace

ELEM = {"Float": 4, "Long": 8, "float": 4, "long int": 8, "int": 4}


# ------------------------------------------------------------------------------------------------ HTA
def test_hta_kineto_all_reduce_and_broadcast(external) -> None:
    path = external("hta/nccl_data.json.gz")
    text = gzip.decompress(path.read_bytes()).decode()
    # independent: every record_param_comms event's args, straight from the JSON
    recs = [e["args"] for e in json.loads(text)["traceEvents"] if e.get("name") == "record_param_comms"]
    want = [(r["Collective name"], r["In msg nelems"] * ELEM[r["dtype"]]) for r in recs
            if r["Collective name"] in ("allreduce", "broadcast")]
    assert len(want) == 21  # 15 all_reduce + 6 broadcast; 6 "wait" records are not communication
    tr = ingest_trace(path, ParallelConfig(dp=2))
    ev = tr.events
    got = sorted(zip(ev["op"].str.replace("all_reduce", "allreduce"), ev["bytes"], strict=True))
    assert got == sorted(want)
    assert (ev["op"] == "all_reduce").sum() == 15 and (ev["op"] == "broadcast").sum() == 6
    assert set(ev.loc[ev["op"] == "broadcast", "bytes"]) == {53120 * 4, 53 * 8}
    assert ev["group"].map(lambda g: list(g) == [0, 1]).all()
    assert (ev["parallelism"] == "dp").all()  # "default_pg" names nothing; ranks match the DP group
    assert sorted(ev["iteration"].unique()) == [4, 5, 6]  # ProfilerStep#4..6
    # every call got its NCCL kernel: 21 kernels in the file, durations positive
    n_kernels = sum(1 for e in json.loads(text)["traceEvents"]
                    if e.get("cat") == "kernel" and e["name"].startswith("ncclKernel"))
    assert n_kernels == 21 and tr.meta["per_file"][0]["kernels_matched"] == 21
    assert ((ev["t_end_ns"] - ev["t_start_ns"]) > 0).all()
    assert set(ev.loc[ev["op"] == "all_reduce", "phase"]) == {"backward"}
    assert set(ev.loc[ev["op"] == "broadcast", "phase"]) == {"forward"}


def test_hta_kernel_times_match_the_file(external) -> None:
    path = external("hta/nccl_data.json.gz")
    doc = json.loads(gzip.decompress(path.read_bytes()))
    base = doc["baseTimeNanoseconds"]
    ks = sorted(e["ts"] for e in doc["traceEvents"] if e.get("cat") == "kernel" and e["name"].startswith("nccl"))
    ev = ingest_trace(path).events
    got = sorted(ev["t_start_ns"].astype("int64").tolist())
    assert np.allclose(np.array(got) - base, np.array(ks) * 1000, atol=2)


# ----------------------------------------------------------------------------------------------- DLRM
def _dlrm_independent(path) -> dict[int, list[tuple[str, int, int | None]]]:
    """rank -> [(op, bytes sent, bytes received)] from nccl:* annotations and c10d::alltoall_base_ ops."""
    out = {}
    with tarfile.open(path) as tf:
        for m in tf.getmembers():
            if not m.isfile():
                continue
            doc = json.load(tf.extractfile(m))
            evs = sorted((e for e in doc["traceEvents"] if e.get("ph") == "X"), key=lambda e: e["ts"])
            ann = [e for e in evs if e["name"].startswith("nccl:") and e["cat"] == "user_annotation"]
            a2a = [e for e in evs if e["name"] == "c10d::alltoall_base_"]
            rows = []
            for e in ann:
                n = int(np.prod(e["args"]["Input Dims"][0])) * ELEM[e["args"]["Input type"][0]]
                recv = None
                if e["name"] == "nccl:all_to_all":
                    outer = next(o for o in a2a if o["ts"] <= e["ts"] <= o["ts"] + o["dur"])
                    recv = outer["args"]["Input Dims"][0][0] * ELEM[outer["args"]["Input type"][0]]
                rows.append((e["name"][5:], n, recv))
            out[doc["distributedInfo"]["rank"]] = rows
    return out


def test_dlrm_eight_ranks(external) -> None:
    path = external("param/dlrm_kineto.tar.gz")
    want = _dlrm_independent(path)
    assert sorted(want) == list(range(8))
    tr = ingest_trace(path)
    assert tr.world_size == 8
    for r, rows in want.items():
        ev = tr.events[tr.events["rank"] == r].sort_values("t_start_ns")
        assert list(zip(ev["op"], ev["bytes"], strict=True)) == [(o, b) for o, b, _ in rows]
        assert (ev["op"] == "all_to_all").sum() == 5 and (ev["op"] == "all_reduce").sum() == 3
        assert ev["group"].map(len).eq(8).all()
        recv = tr.meta["per_file"][r]["a2a_recv_bytes"]
        assert recv == [x for o, _, x in rows if o == "all_to_all"]
    # what all ranks send in one all-to-all, all ranks receive: column sums equal row sums per call
    sent = np.array([[b for o, b, _ in want[r] if o == "all_to_all"] for r in range(8)]).sum(axis=0)
    recv = np.array([[x for o, _, x in want[r] if o == "all_to_all"] for r in range(8)]).sum(axis=0)
    assert (sent == recv).all()
    # the uneven split: rank 3 receives far more in the 4th all-to-all (13312 ints) than rank 0 (768)
    assert want[3][3][2] == 13312 * 4 and want[0][3][2] == 768 * 4


def test_dlrm_matrix_margins(external) -> None:
    from llmcomm.analysis.api import a2a_matrix_estimate

    path = external("param/dlrm_kineto.tar.gz")
    want = _dlrm_independent(path)
    mat, margins = a2a_matrix_estimate(ingest_trace(path))
    sent = [sum(b for o, b, _ in want[r] if o == "all_to_all") for r in range(8)]
    recv = [sum(x for o, _, x in want[r] if o == "all_to_all") for r in range(8)]
    assert np.allclose(mat.sum(axis=1), sent) and np.allclose(mat.sum(axis=0), recv)
    assert margins["sent"].tolist() == sent


def test_dlrm_dataset_round_trip(external, tmp_path) -> None:
    path = external("param/dlrm_kineto.tar.gz")
    out = ingest_to_dataset(path, tmp_path / "dlrm")
    assert sorted(p.name for p in out.iterdir()) == [f"rank-{r:05d}.parquet" for r in range(8)]
    back = read_trace(out)
    direct = ingest_trace(path)
    cols = ["rank", "op", "bytes", "t_start_ns"]
    a = back.events[cols].sort_values(cols, ignore_index=True)
    b = direct.events[cols].sort_values(cols, ignore_index=True)
    assert a.equals(b)


# ------------------------------------------------------------------------------------ execution trace
def test_resnet_execution_trace(external) -> None:
    path = external("param/resnet_2gpu_et.json.gz")
    doc = json.loads(gzip.decompress(path.read_bytes()))
    want = []
    for n in doc["nodes"]:
        if n["name"] == "record_param_comms":
            a = {x["name"]: x["value"] for x in n["attrs"]}
            if a["collective_name"] != "wait":
                want.append((a["collective_name"], a["in_msg_nelems"] * ELEM[a["dtype"]]))
    tr = ingest_trace(path, ParallelConfig(dp=2))
    ev = tr.events
    assert len(ev) == len(want) == 21
    assert sorted(zip(ev["op"].str.replace("all_reduce", "allreduce"), ev["bytes"], strict=True)) == sorted(want)
    assert (ev["rank"] == 1).all() and tr.meta["per_file"][0]["rank_from"] == "device index"
    assert ev["group"].map(lambda g: list(g) == [0, 1]).all() and (ev["parallelism"] == "dp").all()
    assert sorted(ev["iteration"].unique()) == [4, 5, 6]
    assert set(ev.loc[ev["op"] == "all_reduce", "phase"]) == {"backward"}
    assert ev["t_start_ns"].isna().all()


def test_resnet_and_hta_are_the_same_job(external) -> None:
    """The PARAM ResNet execution trace and HTA's Kineto trace record the same DDP bucket sizes."""
    et = ingest_trace(external("param/resnet_2gpu_et.json.gz"), rank=1).events
    k = ingest_trace(external("hta/nccl_data.json.gz")).events
    assert sorted(et["bytes"]) == sorted(k["bytes"])


# --------------------------------------------------------------------------------------------- Echo
ECHO = [1, 2, 4, 8, 16, 32, 64, 128]


@pytest.mark.parametrize("n", ECHO)
def test_echo_logs(external, n: int) -> None:
    path = external(f"echo/nccl-test-log/nccl_{n}.log")
    text = re.sub(r"\[\d+,\d+\]<stdout>:", "", path.read_text())
    rows = re.findall(r"^\s+(\d+)\s+(\d+)\s+float\s+sum\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)\s+\S+\s+([\d.]+)\s+"
                      r"([\d.]+)\s+([\d.]+)", text, flags=re.M)
    hosts = re.findall(r"Rank\s+\d+ Pid\s+\d+ on (\S+)", text)
    bw = ingest_bandwidth(path)
    assert len(bw) == 2 * len(rows) > 0
    assert (bw["ranks"] == n).all() and (bw["nodes"] == len(set(hosts))).all()
    assert (bw["nodes"] == max(1, n // 8)).all()
    assert (bw["op"] == "all_reduce").all()
    oop = bw[bw["placement"] == "out-of-place"].reset_index(drop=True)
    inp = bw[bw["placement"] == "in-place"].reset_index(drop=True)
    for i, r in enumerate(rows):
        assert oop.at[i, "bytes"] == int(r[0]) and oop.at[i, "count"] == int(r[1])
        assert oop.at[i, "time_us"] == float(r[2]) and oop.at[i, "busbw"] == float(r[4])
        assert inp.at[i, "time_us"] == float(r[5]) and inp.at[i, "busbw"] == float(r[7])


# ------------------------------------------------------------------------------------------- vTrain
LUTS = [f"vtrain/allreduce_lut/{g}/AR_GPU{n}_1M_1024M_LUT" for g in ("a100", "v100") for n in range(2, 9)]


@pytest.mark.parametrize("name", LUTS)
def test_vtrain_luts(external, name: str) -> None:
    path = external(name)
    with open(path, encoding="utf-8-sig", newline="") as fh:
        rows = list(csv.reader(fh))[1:]
    bw = ingest_bandwidth(path)
    n = int(re.search(r"GPU(\d)", name).group(1))
    assert len(bw) == 2 * len(rows) == 2 * 1024
    assert (bw["ranks"] == n).all() and (bw["nodes"] == 1).all() and (bw["device"] == name.split("/")[2]).all()
    oop = bw[bw["placement"] == "out-of-place"].reset_index(drop=True)
    inp = bw[bw["placement"] == "in-place"].reset_index(drop=True)
    for i in (0, 1, 511, 1023):  # first, second, middle and last line of the file
        size, _count, _t, t1, b1, t2, b2 = rows[i]
        assert oop.at[i, "bytes"] == int(size) == (i + 1) * 2**20
        assert oop.at[i, "time_us"] == pytest.approx(float(t1) / 1e3) and oop.at[i, "busbw"] == float(b1)
        assert inp.at[i, "time_us"] == pytest.approx(float(t2) / 1e3) and inp.at[i, "busbw"] == float(b2)
        # nccl-tests: busbw = algbw * 2(n-1)/n, algbw = bytes / time
        assert oop.at[i, "algbw"] * 2 * (n - 1) / n == pytest.approx(float(b1), rel=0.02)


# --------------------------------------------------------------------------------------------- AICB
def test_aicb_a100_moe_replay(external) -> None:
    path = external("aicb/A100_example.csv")
    with open(path, newline="") as fh:
        rows = list(csv.DictReader(fh))
    comm = [r for r in rows if r["comm_type"] != "CommType.epoch_end"]
    tr = ingest_trace(path)
    ev = tr.events
    assert len(ev) == len(comm) == 8527  # every row but the 11 epoch_end markers
    assert ev["bytes"].tolist() == [int(r["msg_size"]) for r in comm]
    durs = ((ev["t_end_ns"] - ev["t_start_ns"]) / 1e6).astype(float).to_numpy()
    assert np.allclose(durs, [float(r["_elapsed_time"]) for r in comm], atol=1e-6)
    assert tr.meta["parallel"]["tp"] == 2 and tr.meta["parallel"]["dp"] == 4 and tr.world_size == 8
    # the expert-parallel all_to_all: 32 MiB, 128 per iteration, over 10 iterations
    ep = ev[(ev["parallelism"] == "ep")]
    n_ep = sum(1 for r in comm if r["comm_group"] == "CommGroup.ep_group")
    assert len(ep) == n_ep == 1280 and (ep["op"] == "all_to_all").all() and (ep["bytes"] == 32 * 2**20).all()
    assert ep.groupby("iteration").size().eq(128).all()
    assert ep["split_bytes"].map(list).map(sum).eq(32 * 2**20).all()
    assert sorted(ev["iteration"].unique()) == list(range(11))  # 0 = setup, then 10 iterations
    assert set(ev.loc[ev["iteration"] == 0, "phase"]) == {"setup"}
    tp = ev[ev["parallelism"] == "tp"]
    assert tp["group"].map(lambda g: list(g) == [0, 1]).all()


def test_aicb_generated_llama7b(external) -> None:
    path = external("aicb/L7B-M1-C04_Llama7B_megatron_tp2_pp1_mbs1.csv")
    lines = path.read_text().splitlines()
    assert lines[0] == "[rank0 ~ rank127]"
    rows = [r for r in csv.DictReader(lines[1:]) if r["comm_type"] != "CommType.epoch_end"]
    tr = ingest_trace(path)
    ev = tr.events
    assert len(ev) == len(rows) and tr.world_size == 128
    assert ev["bytes"].tolist() == [int(r["msg_size"]) for r in rows]
    assert ev["t_start_ns"].isna().all()
    tp_ar = ev[(ev["parallelism"] == "tp") & (ev["op"] == "all_reduce") & (ev["bytes"] == 16 * 2**20)]
    want = sum(1 for r in rows if r["comm_group"] == "CommGroup.tp_group" and r["msg_size"] == str(16 * 2**20))
    assert len(tp_ar) == want == 130  # 2 per layer x 32 layers, forward and backward, + embedding
    dp = ev[ev["parallelism"] == "dp"]
    assert dp["group"].map(len).eq(64).all()


def test_aicb_timings_as_bandwidth(external) -> None:
    path = external("aicb/A100_example.csv")
    bw = ingest_bandwidth(path)
    with open(path, newline="") as fh:
        rows = [r for r in csv.DictReader(fh) if r["comm_type"] != "CommType.epoch_end"
                and float(r["_elapsed_time"]) > 0]
    assert len(bw) == len(rows)
    # AICB's algbw column = msg_size / time; ours must agree (to its 2-decimal rounding)
    algbw = np.array([float(r["algbw"]) for r in rows])
    assert np.allclose(bw["algbw"].to_numpy(), algbw, atol=0.006, rtol=1e-3)


def test_kineto_fast_path_equals_full_parse(external) -> None:
    """The layout-aware fast path reads exactly what the full JSON parse reads, on every real trace."""
    from llmcomm.ingest import kineto
    from llmcomm.ingest.common import GroupTagger
    from llmcomm.ingest.sources import iter_sources

    srcs = list(iter_sources([external("hta/nccl_data.json.gz"), external("param/dlrm_kineto.tar.gz")]))
    assert len(srcs) == 9
    for src in srcs:
        assert kineto._split_kineto_layout(src) is not None  # the real files have the profiler's layout
        fast, mf = kineto.parse(src, GroupTagger(), fast=True)
        full, mb = kineto.parse(src, GroupTagger(), fast=False)
        assert fast.equals(full) and mf == mb


def test_truncated_real_trace_is_an_error(external, tmp_path) -> None:
    data = gzip.decompress(external("hta/nccl_data.json.gz").read_bytes())
    for cut in (len(data) // 2, len(data) - 10):
        p = tmp_path / f"cut{cut}.json"
        p.write_bytes(data[:cut])
        with pytest.raises(Exception) as ei:
            ingest_trace(p)
        assert ei.type.__name__ == "TraceFormatError" and p.name in str(ei.value)


def test_aicb_busbw_column_uses_world_size(external) -> None:
    """AICB's own busbw column scales a 2-rank TP all_gather by 7/8 (world of 8), not nccl-tests' (n-1)/n =
    1/2; ingest_bandwidth recomputes it from the group size."""
    path = external("aicb/A100_example.csv")
    with open(path, newline="") as fh:
        rows = [r for r in csv.DictReader(fh) if r["comm_type"] == "CommType.all_gather"
                and r["comm_group"] == "CommGroup.tp_group" and float(r["algbw"]) > 50]
    ratios = np.array([float(r["busbw"]) / float(r["algbw"]) for r in rows])
    assert np.allclose(ratios, 7 / 8, atol=0.002)
    bw = ingest_bandwidth(path)
    ag = bw[(bw["op"] == "all_gather") & (bw["ranks"] == 2)]
    assert np.allclose(ag["busbw"] / ag["algbw"], 0.5)
