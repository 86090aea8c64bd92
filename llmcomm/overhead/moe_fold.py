"""Megatron-Core's MoE parallel folding in the formulation: the attention part of a layer on ``tp · cp · dp``, the
expert part on ``etp · ep · edp`` (the same ``pp``), expert TP ``etp`` free of the attention TP ``tp``.

Megatron-LM (NVIDIA/Megatron-LM ``d98e8a6``) builds two rank grids in ``parallel_state.initialize_model_parallel``:
the decoder grid ``tp · cp · dp · pp`` and the expert grid ``etp · ep · edp · pp`` with ``cp`` folded away
(``megatron/core/parallel_state.py:871-895``: ``expert_tensor_parallel_size`` defaults to ``tp``,
``edp = world / (etp · ep · pp)``, ``world % (etp · ep · pp) == 0`` or a ``RuntimeError``; the pipeline groups of the
two grids must be equal, :904). The expert groups come from that second grid: EP (:1357), expert TP (:1373),
``tp-ep`` (:1388), ``tp-ep-pp`` (:1403), expert DP (:1457). So an EP group may span attention-TP, CP and DP ranks
(NVIDIA's Qwen3-235B-A22B recipe: tp 2, ep 32, etp 1 on 256 GPUs, dp 16).

What crosses the boundary where ``tp != etp``: nothing but the tokens each rank already holds. With sequence
parallelism (required for MoE with ``tp > 1``, ``moe_layer.py:636``) a rank enters the MoE layer with its
``T/tp`` tokens of ``[s/tp, b, h]`` (``T = b·s/cp``); the router runs there; the alltoall dispatcher takes its
groups from the expert grid — ``self.tp_group = pg_collection.expt_tp``, ``self.ep_group = pg_collection.ep``,
``self.tp_ep_group = pg_collection.tp_ep`` (``megatron/core/transformer/moe/token_dispatcher.py:84-89``); the
attention TP group is only the layer's ``attn_tp_group`` (``moe_layer.py:181``). Per MoE layer and micro-batch,
with ``L = T/tp`` tokens per rank (``llmcomm.predict.ep`` writes every call; here they are in closed form):

    tp_ep all-gather of the token counts   etp·ep·E·8 bytes over etp·ep          (token_dispatcher.py:557-574)
    all-to-all dispatch over EP            L·k·h·act (+ probabilities L·k·p)     (:705-722)
    expert-TP all-gather of what arrived   etp·L·k·h·act (+ etp·L·k·p) over etp  (:741-751, only etp > 1)
    experts: E/ep local experts, each m = etp·L·k·ep/E rows, n = f_e/etp           (experts.py, TEGroupedMLP)
    expert-TP reduce-scatter of the output etp·L·k·h·p over etp                   (:824-833)
    all-to-all combine over EP             L·k·h·act                              (:864)

and the transposes in the backward. The expert GEMMs are split by ``etp``, not ``tp``; their FLOPs per rank,
``L·k·(2·k_m·h·f_e)``, do not depend on ``etp`` (each rank computes ``1/(etp·ep)`` of the experts' work on
``etp·ep`` ranks' tokens), their shape does (:func:`expert_rows`). The expert weights are sharded by ``etp · ep``
(:meth:`llmcomm.specs.ModelSpec.layer_parameter_split`), their gradients reduced over the expert-data-parallel
group of ``edp`` ranks (:func:`expert_dp`), in buffers of their own whenever ``ep > 1`` or ``etp != tp``
(:func:`experts_in_own_buffer`, the predictor's rule).
"""

from __future__ import annotations

from typing import Any

import numpy as np


def expert_dp(c: dict[str, np.ndarray]) -> np.ndarray:
    """``edp = world / (etp · ep · pp) = tp · dp · cp / (etp · ep)`` per row (parallel_state.py:880)."""
    return c["tp"] * c["dp"] * c["cp"] // (c["etp"] * c["ep"])


def experts_in_own_buffer(model: Any, c: dict[str, np.ndarray]) -> np.ndarray:
    """Where the routed experts' gradients live in DDP's expert buffers (reduced over ``edp``, stepped by the expert
    optimizer): ``ep > 1`` or ``etp != tp`` (:func:`llmcomm.predict.dp.experts_in_own_buffer`, vectorized)."""
    n = len(c["tp"])
    if not model.is_moe:
        return np.zeros(n, bool)
    return (c["ep"] > 1) | (c["etp"] != c["tp"])


def expert_rows(T: np.ndarray, tp: np.ndarray, etp: np.ndarray, ep: np.ndarray, topk: int, E: int) -> np.ndarray:
    """Rows of each local expert's GEMM under balanced routing: ``T·k·ep·etp / (tp·E)`` (``T = b·s/cp``; the
    ``T/tp`` tokens of each of the ``ep`` ranks, ``k`` copies spread over ``E`` experts, gathered over ``etp``).
    At ``etp = tp`` it is ``T·k·ep/E`` (the step description's form before folding)."""
    return T * topk * ep * etp // (tp * E)


def expert_tp_items(c: dict[str, np.ndarray], local: np.ndarray, k: int, h: int, act: np.ndarray,
                    nm: np.ndarray, mf: np.ndarray) -> list[Any]:
    """The alltoall dispatcher's expert-TP calls of a stage class per micro-batch, as
    :class:`~llmcomm.overhead.iteration.CommItem` rows (term ``tp``, parallelism ``sp``, as the predictor labels
    them): forward all-gather of the ``etp·L·k`` received tokens and of their probabilities, reduce-scatter of the
    expert output; backward all-gather of the output's gradient, reduce-scatter of the tokens' and the
    probabilities', plus the forward's calls of the ``mf`` MoE layers whose forward is replayed in the backward
    phase (full or block recomputation, or recompute ``moe``; ``nm`` MoE layers in all), as the predictor's program
    writes them. On the expert-TP group (``etp`` ranks, its ranks per node ``k_etp``); where ``etp = tp`` that is
    the TP group itself (``k_tp``). None where ``etp = 1``.

    The probabilities and the output reduction are in the activation dtype here (``moe_router_dtype`` unset:
    rule ``cost-unmodelled`` refuses it in the formulation)."""
    from .iteration import CommItem  # iteration imports this module

    tp, etp = c["tp"], c["etp"]
    rpn = np.where(etp == tp, c["k_tp"], c.get("k_etp", c["k_tp"]))
    on = (etp > 1).astype(np.int64)
    rows = local * etp * k
    tok, prb = rows * h * act, rows * act
    out = []
    for op, phase, nbytes, count in (("all_gather", "forward", tok, nm), ("all_gather", "forward", prb, nm),
                                     ("reduce_scatter", "forward", tok, nm), ("all_gather", "backward", tok, nm + mf),
                                     ("all_gather", "backward", prb, mf),
                                     ("reduce_scatter", "backward", tok, nm + mf),
                                     ("reduce_scatter", "backward", prb, nm)):
        out.append(CommItem("tp", "sp", op, phase, nbytes, count * on, etp, rpn, "microbatch"))
    return out
