"""TransformerEngine's userbuffers (``tp_comm_overlap``) need the TP group on one node (rule
tp-comm-overlap-intra-node, llmcomm.overhead.iteration.USERBUFFERS_RULE): refused by the formulation, kept out
of the tuner's space."""

from __future__ import annotations

import pytest

import llmcomm as lc
from llmcomm.errors import ConfigError
from llmcomm.overhead.iteration import iteration_time, userbuffers_unavailable
from llmcomm.parallel_table import ParallelTable

A100 = lc.load_cluster("a100-80g-hdr200")


def _config(tp: int, order: str | None = None, tpo: bool = True) -> lc.ParallelConfig:
    kw = {"order": order} if order else {}
    return lc.ParallelConfig(tp=tp, pp=1, dp=32 // tp, micro_batch=1, global_batch=64, sp=True,
                             distributed_optimizer=True, tp_comm_overlap=tpo, **kw)


def test_tp_group_across_nodes_refuses_userbuffers() -> None:
    model = lc.load_model("megatron-gpt-39b")  # 64 heads: tp 16 divides them
    cl = A100.for_world(32)
    with pytest.raises(ConfigError, match="tp-comm-overlap-intra-node"):
        iteration_time(model, _config(16), cl)
    assert iteration_time(model, _config(16, tpo=False), cl).total_s > 0  # without userbuffers: timed
    assert iteration_time(model, _config(8), cl).total_s > 0  # TP inside a node
    t = ParallelTable.from_configs([_config(16), _config(8), _config(16, tpo=False), _config(2, order="cp-ep-dp-tp-pp")])
    # tp 2 with DP innermost: the two TP ranks sit 16 ranks apart, on different nodes
    assert userbuffers_unavailable(t, 8).tolist() == [True, False, False, True]


def test_tuner_keeps_userbuffers_inside_a_node() -> None:
    from llmcomm.tune import tune

    r = tune("megatron-gpt-39b", 32, A100, 64)
    table = r.table
    assert not ((table["tp"] > 8) & table["tp_comm_overlap"]).any()
