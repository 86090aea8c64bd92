"""The two recorder modes record the same events: ``kernel`` (the default: Python kernels for the
communication ops at the BackendSelect key) and ``dispatch`` (a ``TorchDispatchMode``).

One 4-rank gloo job runs, in the same processes, TP+PP and TP+SP+PP tiny-gpt and a TP+DP+EP tiny-moe training
(``llmcomm.collect.train``: DTensor forward and backward, pipelining send/recv and its setup, ``replicate``
all-reduces, ``all_to_all_single_autograd`` forward and backward), plus plain ``dist.*`` calls, functional
collectives and DDP's C++ reducer, once per mode; every rank's rows (op, bytes, group, peer, parallelism,
phase, microbatch, layer, iteration, splits, dtype, in order), routing counts and skipped ops must match,
except for the calls DTensor issues inside its own dispatch of an op, which only the kernel mode sees (TP+SP
without DP: the optimizer's all-reduces of Partial LayerNorm gradients). Every curated run (TP+PP+DP,
TP+SP+PP+DP, EP...) records exactly the same events in both modes.
"""

from __future__ import annotations

import os
import socket
from pathlib import Path

import pytest
import torch  # the test set-up installs torch; a missing torch must fail, not skip

pytestmark = [pytest.mark.torch, pytest.mark.slow]

KEY = ["rank", "iteration", "microbatch", "layer", "phase", "parallelism", "op", "group", "peer", "bytes",
       "dtype", "split_bytes"]
MODES = ("kernel", "dispatch")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _plain_calls(rank: int, mode: str, out: Path) -> None:
    """dist.* collectives and p2p, functional collectives (autograd all_to_all backward), DDP's reducer."""
    import torch.distributed as dist
    from torch.distributed import _functional_collectives as fc

    from llmcomm.collect.record import Recorder

    torch.manual_seed(0)
    ddp = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(8, 8))
    rec = Recorder(rank, mode=mode)
    rec.tag_group(list(range(dist.get_world_size())), "dp")
    with rec:
        rec.step(0)
        with rec.phase("forward"), rec.layer(1):
            dist.all_reduce(torch.ones(4))
            dist.broadcast(torch.ones(3), src=1)
            out_t = torch.empty(4 * 2)
            dist.all_gather_into_tensor(out_t, torch.ones(2))
            dist.reduce_scatter_tensor(torch.empty(2), torch.ones(8))
            peer = rank ^ 1
            ops = [dist.P2POp(dist.isend, torch.ones(5), peer), dist.P2POp(dist.irecv, torch.empty(5), peer)]
            for w in dist.batch_isend_irecv(ops):
                w.wait()
            x = torch.ones(8, 3, requires_grad=True)
            y = fc.all_to_all_single_autograd(x, None, None, dist.group.WORLD)
            y = fc.wait_tensor(fc.all_reduce(y, "sum", dist.group.WORLD))
        with rec.phase("backward"):
            y.sum().backward()
            ddp(torch.ones(2, 8)).sum().backward()  # the C++ reducer's bucket all-reduce
    rec.write(out)


def _worker(rank: int, port: int, root: str) -> None:
    import torch.distributed as dist

    from llmcomm import ParallelConfig, load_model
    from llmcomm.collect.train import RunConfig, _train

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=4)
    torch.set_num_threads(1)
    runs = {
        "gpt_tp2pp2": ("tiny-gpt", ParallelConfig(tp=2, pp=2, micro_batch=1, global_batch=2, seq_len=32)),
        "gpt_tp2sp_pp2": ("tiny-gpt", ParallelConfig(tp=2, sp=True, pp=2, micro_batch=1, global_batch=2,
                                                     seq_len=32)),
        "moe_tp2dp2ep2": ("tiny-moe", ParallelConfig(tp=2, dp=2, ep=2, micro_batch=1, global_batch=2,
                                                     seq_len=32)),
    }
    beats = [0.0] * 4
    for mode in MODES:
        for name, (model, par) in runs.items():
            out = Path(root) / mode / name
            out.mkdir(parents=True, exist_ok=True)
            cfg = RunConfig(model=load_model(model).to_dict(), parallel=par.to_dict(), iters=2, out_dir=str(out),
                            recorder_mode=mode)
            _train(rank, cfg, beats, list(beats))
        out = Path(root) / mode / "plain"
        out.mkdir(parents=True, exist_ok=True)
        _plain_calls(rank, mode, out)
    dist.destroy_process_group()


def _rows(path: Path) -> list[tuple]:
    from llmcomm import read_trace

    ev = read_trace(path).events
    out = []
    for r in ev[KEY].itertuples(index=False):
        d = r._asdict()
        d["group"] = tuple(int(g) for g in d["group"])
        sb = d["split_bytes"]
        d["split_bytes"] = None if sb is None or not hasattr(sb, "__len__") else tuple(int(b) for b in sb)
        out.append(tuple(d.values()))
    return out


def test_kernel_mode_records_what_dispatch_mode_records(tmp_path: Path) -> None:
    import json

    import torch.multiprocessing as mp

    from llmcomm import read_trace

    mp.spawn(_worker, args=(_free_port(), str(tmp_path)), nprocs=4)
    for name in ("gpt_tp2pp2", "moe_tp2dp2ep2", "plain", "gpt_tp2sp_pp2"):
        for rank in range(4):
            a, b = (tmp_path / m / name / f"rank{rank}.parquet" for m in MODES)
            ra, rb = _rows(a), _rows(b)
            assert ra and rb, f"{name} rank {rank}: nothing recorded"
            if name == "gpt_tp2sp_pp2":
                # the one difference known: with SP and no DP the LayerNorm gradients stay Partial DTensors
                # and AdamW's ops on them make DTensor all-reduce them (3 per parameter) inside its own
                # dispatch of those ops, where a TorchDispatchMode is switched off; the kernel sees them
                extra = [r for r in ra if r[4] == "optimizer"]
                assert extra and all(r[5:8] == ("tp", "all_reduce", (0, 1) if rank < 2 else (2, 3))
                                     for r in extra)
                ra = [r for r in ra if r[4] != "optimizer"]
                assert not [r for r in rb if r[4] == "optimizer"]
            assert ra == rb, f"{name} rank {rank}: the modes differ"
            ta, tb = read_trace(a), read_trace(b)
            if ta.routing is not None or tb.routing is not None:
                assert ta.routing.equals(tb.routing), f"{name} rank {rank}: routing differs"
            if name != "plain":
                ja, jb = (json.loads((tmp_path / m / name / f"rank{rank}.json").read_text()) for m in MODES)
                assert ja["skipped_ops"] == jb["skipped_ops"]
    plain = _rows(tmp_path / "kernel" / "plain" / "rank0.parquet")
    ops = [r[6] for r in plain]
    assert ops[:6] == ["all_reduce", "broadcast", "all_gather", "reduce_scatter", "send", "recv"]
    assert ops.count("all_to_all") == 2, "forward and autograd-backward all_to_all_single"
    assert ops[-1] == "all_reduce" and plain[-1][4] == "backward", "DDP's reducer all-reduce"
    phases = {r[4] for r in _rows(tmp_path / "kernel" / "gpt_tp2pp2" / "rank0.parquet")}
    assert {"setup", "forward", "backward"} <= phases
