"""The launcher end to end (tiny, 2 ranks): the CLI's trace + routing + manifest round trip, and failure
handling — a rank that raises or hangs stops the run in bounded time and leaves nothing under the output."""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import pytest
import torch  # noqa: F401  (the test set-up installs torch; a missing torch must fail, not skip)

from llmcomm import ParallelConfig, read_trace

pytestmark = [pytest.mark.torch, pytest.mark.slow]


def _parser() -> argparse.ArgumentParser:
    from llmcomm.collect import cli

    p = argparse.ArgumentParser()
    cli.register(p.add_subparsers(dest="command"))
    return p


def test_cli_writes_trace_routing_and_manifest(tmp_path: Path) -> None:
    out = tmp_path / "moe.parquet"
    args = _parser().parse_args(["collect", "--model", "tiny-moe", "--dp", "2", "--ep", "2", "--iters", "3",
                                 "--routing-iters", "1", "--micro-batch", "1", "--global-batch", "4",
                                 "--seq-len", "32", "--out", str(out)])
    assert args.func(args) == 0
    t = read_trace(out)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["moe.manifest.json", "moe.parquet",
                                                          "moe.routing.parquet"]
    m = t.meta
    assert m["source"] == "recorded" and m["model"] == "tiny-moe" and m["world_size"] == 2
    assert ParallelConfig.from_dict(m["parallel"]) == ParallelConfig(
        dp=2, ep=2, micro_batch=1, global_batch=4, seq_len=32, act_dtype="fp32", param_dtype="fp32")
    assert m["model_spec"]["num_experts"] == 8 and len(m["loss"]) == 3 and m["seed"] == 0
    assert set(t.events["iteration"]) == {0}, "events kept for --routing-iters iterations only"
    r = t.routing
    assert sorted(r["iteration"].unique()) == [0, 1, 2]
    assert set(r["src_rank"]) == {0, 1} and set(r["expert"]) == set(range(8))
    assert (r.groupby(["iteration", "microbatch", "layer", "src_rank"])["tokens"].sum() == 32 * 2).all()
    ep = t.events[t.events["parallelism"] == "ep"]
    assert len(ep) == 2 * 2 * 2 * 5  # ranks x micro-batches x MoE layers x (3 forward + 2 backward)


@pytest.mark.parametrize("mode,timeout", [("raise", 60.0), ("hang", 20.0)])  # 20 s: torch start-up on a busy 2-core machine
def test_failing_rank_stops_the_run_and_leaves_nothing(tmp_path: Path, mode: str, timeout: float) -> None:
    from llmcomm.collect.launch import CollectError, collect

    out = tmp_path / "bad.parquet"
    t0 = time.time()
    with pytest.raises(CollectError) as err:
        collect("tiny-gpt", ParallelConfig(dp=2, micro_batch=1, global_batch=2, seq_len=32), out, iters=3,
                timeout=timeout, fault=f"1:{mode}:1")
    took = time.time() - t0
    msg = str(err.value)
    if mode == "raise":
        assert "rank 1" in msg and "injected fault" in msg
    else:
        assert "no progress" in msg and "iteration 1" in msg
    assert took < 60 + timeout
    assert list(tmp_path.iterdir()) == []


def test_the_rank_that_failed_first_is_named_not_the_peer_that_lost_it(tmp_path: Path) -> None:
    """torch reports whichever process exited first; a peer that only lost its connection must not hide the
    rank that raised (this race once made the 'raise' case above name rank 0)."""
    from llmcomm.collect.launch import _first_failure
    from llmcomm.collect.train import RunConfig, error_path

    cfg = RunConfig(model={}, parallel={}, iters=1, out_dir=str(tmp_path))
    error_path(tmp_path, 1).write_text("RuntimeError: injected fault on rank 1 at iteration 1\n")
    error_path(tmp_path, 0).write_text("RuntimeError: Connection closed by peer\n")
    msg = _first_failure(cfg, [12.5, 12.0], reported=0, reported_error="Connection closed by peer")
    assert msg.startswith("rank 1 failed first") and "injected fault" in msg
    # the reported rank failed first, or no other rank recorded a failure: torch's own message
    assert _first_failure(cfg, [12.0, 12.5], 0, "boom") == "rank 0 failed:\nboom"
    assert _first_failure(cfg, [0.0, 0.0], 1, "boom") == "rank 1 failed:\nboom"
