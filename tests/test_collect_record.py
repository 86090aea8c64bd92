"""The recorder on explicit calls in a 2-rank gloo job: op names, bytes (nccl-tests convention), groups,
peers, all_to_all splits, context tags, and events kept only for the first ``record_iters`` iterations."""

from __future__ import annotations

import os
import socket
from pathlib import Path

import pytest
import torch  # the test set-up installs torch; a missing torch must fail, not skip

pytestmark = [pytest.mark.torch, pytest.mark.slow]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _worker(rank: int, port: int, out: str) -> None:
    import torch.distributed as dist
    from torch.distributed import _functional_collectives as fc

    from llmcomm.collect.record import Recorder

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=2)
    rec = Recorder(rank, record_iters=1)
    rec.tag_group([0, 1], "tp")
    with rec:
        rec.step(0)
        with rec.phase("forward"), rec.microbatch(3), rec.layer(2):
            dist.all_reduce(torch.ones(4))  # 16 B
        rec.phase("backward")
        out_t = torch.empty(6)
        dist.all_gather_into_tensor(out_t, torch.ones(3))  # gathered 24 B
        dist.reduce_scatter_tensor(torch.empty(2), torch.ones(4))  # input 16 B
        splits = [1, 3] if rank == 0 else [2, 2]
        recv = [1, 2] if rank == 0 else [3, 2]
        dist.all_to_all_single(torch.empty(sum(recv), 5), torch.ones(4, 5), recv, splits)
        dist.broadcast(torch.ones(2, dtype=torch.bfloat16), src=1)
        if rank == 0:
            dist.send(torch.ones(7), 1)
        else:
            dist.recv(torch.empty(7), 0)
        fc.wait_tensor(fc.all_reduce(torch.ones(8), "sum", dist.group.WORLD))  # functional, 32 B
        # functional, waited through a view of its output (what a reshape after a row-parallel linear does)
        _ = fc.all_reduce(torch.ones(2, 4), "sum", dist.group.WORLD).view(8) + 1  # 32 B
        rec.step(1)
        dist.all_reduce(torch.ones(4))  # not kept: record_iters=1
    rec.write(out)
    dist.destroy_process_group()


def test_recorder_sees_every_call(tmp_path: Path) -> None:
    import torch.multiprocessing as mp

    from llmcomm import read_trace

    mp.spawn(_worker, args=(_free_port(), str(tmp_path)), nprocs=2)
    e0 = read_trace(tmp_path / "rank0.parquet").events
    e1 = read_trace(tmp_path / "rank1.parquet").events
    ops = ["all_reduce", "all_gather", "reduce_scatter", "all_to_all", "broadcast", "send", "all_reduce",
           "all_reduce"]
    assert e0["op"].tolist() == ops
    assert e1["op"].tolist()[5] == "recv"
    assert e0["bytes"].tolist() == [16, 24, 16, 80, 4, 28, 32, 32]
    assert (e0["parallelism"] == "tp").all() and (e0["iteration"] == 0).all()
    assert all(list(g) == [0, 1] for g in e0["group"])
    assert e0.loc[0, ["microbatch", "layer", "phase"]].tolist() == [3, 2, "forward"]
    assert e0.loc[1, ["microbatch", "layer", "phase"]].tolist() == [-1, -1, "backward"]
    assert list(e0.loc[3, "split_bytes"]) == [20, 60]
    assert list(e1.loc[3, "split_bytes"]) == [40, 40]
    assert e0.loc[4, "peer"] == 1 and e0.loc[4, "dtype"] == "bf16"
    assert e0.loc[5, "peer"] == 1 and e1.loc[5, "peer"] == 0
    for e in (e0, e1):  # every call has an end, the view-waited functional one included
        assert e["t_end_ns"].notna().all() and (e["t_end_ns"] >= e["t_start_ns"]).all()


def test_module_level_context_api() -> None:
    """``llmcomm.record.step(i)`` / ``.phase(...)`` act on the innermost open recorder; no-ops outside."""
    import llmcomm

    rec_fn = llmcomm.record
    assert rec_fn.active() is None
    with rec_fn.phase("forward"):  # no recorder: a harmless no-op
        pass
    with rec_fn(rank=0) as rec:
        assert rec_fn.active() is rec
        rec_fn.step(3)
        with rec_fn.phase("backward"), rec_fn.microbatch(2), rec_fn.layer(5):
            assert (rec.iteration, rec._phase, rec.current_microbatch, rec._layer) == (3, "backward", 2, 5)
        assert rec._phase == "setup" and rec.current_microbatch == -1
    assert rec_fn.active() is None
