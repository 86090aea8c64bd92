"""A predicted timeline of one iteration: when every rank starts and ends every call, and when it computes.

Built only from the public cost-model pieces: the predictor's calls in issue order (a prediction's rows per
rank follow the pipeline schedule, :mod:`llmcomm.predict.program`, and :func:`llmcomm.predict.schedule.schedule`
gives the steps), :meth:`llmcomm.overhead.bandwidth.Bandwidth.time` for each call and
:meth:`llmcomm.overhead.utilization.Utilization.layer_pass` for each layer's compute.

Per pipeline stage (every rank of a stage runs the same program, so one representative rank is simulated and
its times given to the stage's other ranks)::

    step compute   = Σ_{layers ℓ of the step's chunk} f · t_pass(ℓ)   (+ embedding on chunk 0 of stage 0,
                     + output layer and loss on the last chunk of the last stage);  f = 1 forward,
                     2 backward (+1 with full recomputation)
    t_pass(ℓ)      = Utilization.layer_pass(layer_features(b, s, tp, h, a, g, d, f_ℓ, k, peak, hbm, sp·tp))
                     (f_ℓ = ffn_hidden_size, or (top-k + shared)·expert FFN for an MoE layer; k = 3 gated, 2)
    call time      = Bandwidth.time(op, bytes, group size, ranks of the group on the rank's node)

Placement inside a step: a layer's compute is split evenly before each of its calls (attention before the
first TP collective, MLP before the second, as Megatron's blocks issue them); the compute of the step's layers
that issue no call, the embedding and the output layer go before the step's closing send (or at its end).
Ordering across stages: a send occupies its sender for its time; the matching recv (k-th recv from a stage =
k-th send to it) runs from ``max(arrival at the recv, send start)`` to ``max(arrival, send end)``; a
collective whose group spans stages (the embedding group, the world's gradient-norm scalars) starts when the
last member arrives. Megatron's TP collectives block the compute stream; the optimizer's own compute is not
timed.

Overlap (:mod:`llmcomm.overhead.overlap`): a call Megatron issues asynchronously runs on the rank's
communication stream, concurrent with the compute and the calls after it (its interval drawn over theirs),
one such call after another::

    start = max(now on the compute stream, end of the previous asynchronous call)     (the compute goes on)

the DP gradient reductions of the last micro-batch's backward with ``overlap_grad_reduce`` (at the layer the
predictor puts them, where their bucket is ready: :func:`llmcomm.predict.dp.overlapped_grad_sync`;
``finish_grad_sync`` — the stage's first optimizer-phase call — waits for them; that is
``align_grad_reduce=False``'s dispatch: with Megatron's default the formulation delays a later stage's and, in
the interleaved schedule, each chunk's to when stage 0 finishes the chunk, which is not drawn), and the
pipeline sends with
``overlap_p2p_comm`` in the interleaved schedule (the receiver still waits for the tensor). Not drawn:
``tp_comm_overlap`` (inside the GEMMs) and ``moe_a2a_overlap`` (two micro-batches' layers interleaved).

:func:`predicted_timeline` returns the events with ``t_start_ns`` / ``t_end_ns`` filled and the compute
intervals; :func:`on_off` summarises a timed trace (predicted or recorded) per rank: calls in order, share of
time communicating, and the gaps between calls, which :func:`compare_timelines` compares between two traces.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd

from .. import step as step_
from ..errors import ConfigError
from ..layout import Layout
from ..specs import Cluster, ModelSpec, ParallelConfig, load_cluster, load_model
from ..trace import Trace
from . import utilization as U
from .bandwidth import Bandwidth

if TYPE_CHECKING:
    from ..predict.calls import Context

MAX_STAGE_CALLS = 2_000_000  # calls of the simulated ranks (one per stage), stepped through in Python


@dataclass(frozen=True)
class Timeline:
    """``events``: the trace's events with predicted ``t_start_ns``/``t_end_ns``; ``compute``: per stage the
    compute intervals (``stage, phase, microbatch, chunk, t_start_ns, t_end_ns``); ``iteration_s``."""

    events: pd.DataFrame
    compute: pd.DataFrame
    iteration_s: float

    def trace(self, meta: dict | None = None) -> Trace:
        return Trace.from_events(self.events, meta or {})


def layer_pass_times(model: ModelSpec, parallel: ParallelConfig, cluster: Cluster,
                     utilization: U.Utilization | None = None) -> tuple[np.ndarray, float, float]:
    """Seconds of one forward pass of every layer (array over layers), of the embedding and of the output
    layer + loss, on one GPU (the formula in the module doc)."""
    util = utilization or U.Utilization.default()
    m = model
    b = np.array([parallel.micro_batch], dtype=np.float64)
    s = np.array([parallel.seq_len or m.seq_length], dtype=np.float64) / parallel.cp
    tp = np.array([parallel.tp], dtype=np.float64)
    peak, hbm = cluster.peak_bf16_flops, U.hbm_bandwidth(cluster)
    k = 3 if m.gated_mlp else 2
    fw = tp if parallel.sp else np.ones(1)
    dense, _ = U.layer_features(b, s, tp, m.hidden_size, m.num_attention_heads, m.query_groups, m.head_dim,
                                m.ffn_hidden_size, k, peak, hbm, fw, activation=m.activation_kind)
    t_dense = float(util.layer_pass(dense)[0])
    t_moe = t_dense
    if m.is_moe:
        fe = (m.moe_router_topk + m.num_shared_experts) * m.expert_ffn_hidden_size
        moe, _ = U.layer_features(b, s, tp, m.hidden_size, m.num_attention_heads, m.query_groups, m.head_dim, fe,
                                  k, peak, hbm, fw, activation=m.activation_kind)
        moe[:, U.I["gemm"]] += 2.0 * b * s * m.hidden_size * m.num_experts / peak  # router, replicated over TP
        t_moe = float(util.layer_pass(moe)[0])
    pattern = np.array(m.moe_layer_pattern(), dtype=bool)
    per_layer = np.where(pattern, t_moe, t_dense)
    vocab = m.padded_vocab_size(parallel.tp)
    t_emb = float(util.work(U.embedding_features(b, s, m.hidden_size, hbm))[0])
    t_out = float(util.work(U.output_features(b, s, tp, m.hidden_size, np.array([vocab]), peak, hbm))[0])
    return per_layer, t_emb, t_out


def predicted_timeline(trace: Trace, model: ModelSpec | str | None = None, parallel: ParallelConfig | None = None,
                       cluster: Cluster | str = "h100-80g-ndr400", bandwidth: Bandwidth | None = None,
                       utilization: U.Utilization | None = None) -> Timeline:
    """The predicted timeline of a prediction (``predict_traffic(..., aggregate=False)``); see the module doc."""
    from ..predict.calls import Context
    from ..predict.schedule import schedule

    model = load_model(model or trace.meta.get("model", {}).get("name")) if not isinstance(model, ModelSpec) \
        else model
    if parallel is None:
        parallel = ParallelConfig.from_dict(trace.meta["parallel"], "trace meta 'parallel'")
    cluster = load_cluster(cluster) if isinstance(cluster, str) else cluster
    bw = bandwidth or Bandwidth.default(cluster)
    ev = trace.events
    if (ev["count"] != 1).any():
        raise ConfigError("predicted_timeline needs the expanded form: predict_traffic(..., aggregate=False)")
    gpn = int(trace.meta.get("gpus_per_node") or cluster.gpus_per_node)
    lay = Layout(parallel, gpn)
    ctx = Context(model, parallel)
    per_layer, t_emb, t_out = layer_pass_times(model, parallel, cluster, utilization)
    p, v = parallel.pp, parallel.vpp
    rec = 1.0 if parallel.recompute == "full" else 0.0
    stage_of = lay.coords["pp"].to_numpy()
    reps = [lay.rank_of(pp=r) for r in range(p)]
    rows_of = {r: np.nonzero(ev["rank"].to_numpy() == reps[r])[0] for r in range(p)}
    n_calls = sum(len(v) for v in rows_of.values())
    if n_calls > MAX_STAGE_CALLS:
        raise ConfigError(f"predicted_timeline: {n_calls:,} calls on the {p} simulated ranks exceed {MAX_STAGE_CALLS:,}; "
                          "use fewer micro-batches or layers")
    # per stage: items (kind, payload) in order
    items: list[list[tuple]] = []
    for r in range(p):
        rows = rows_of[r]
        e = ev.iloc[rows]
        steps = schedule(parallel.schedule if v == 1 else "interleaved", parallel.num_microbatches, p, r, v)
        items.append(_stage_items(e, rows, steps, ctx, r, per_layer, t_emb, t_out, rec))
    dur = np.zeros(len(ev))
    op, nbytes, groups = ev["op"].to_numpy(), ev["bytes"].to_numpy(), ev["group"].to_numpy()
    for r in range(p):
        for row in rows_of[r]:
            dur[row] = _call_seconds(bw, lay, reps[r], op[row], int(nbytes[row]), np.asarray(groups[row]))
    starts, ends, compute = _simulate(items, ev, stage_of, dur, asynchronous_calls(ev, parallel))
    # every rank of a stage: the representative's times, call by call
    t0 = np.full(len(ev), np.nan)
    t1 = np.full(len(ev), np.nan)
    rank = ev["rank"].to_numpy()
    pos = ev.groupby("rank").cumcount().to_numpy()
    for r in range(p):
        rep = rows_of[r]
        sel = stage_of[rank] == r
        counts = np.bincount(rank[sel])
        counts = counts[counts > 0]
        if len(counts) and (counts != len(rep)).any():
            raise ConfigError(f"stage {r}: ranks issue different numbers of calls; the timeline assumes one "
                              "program per stage")
        t0[sel] = starts[rep][pos[sel]]
        t1[sel] = ends[rep][pos[sel]]
    out = ev.copy()
    out["t_start_ns"] = pd.array(np.round(t0 * 1e9).astype(np.int64), dtype="Int64")
    out["t_end_ns"] = pd.array(np.round(t1 * 1e9).astype(np.int64), dtype="Int64")
    out["source"] = "predicted"
    comp = pd.DataFrame(compute, columns=["stage", "phase", "microbatch", "chunk", "t_start_s", "t_end_s"])
    comp["t_start_ns"] = np.round(comp.pop("t_start_s") * 1e9).astype(np.int64)
    comp["t_end_ns"] = np.round(comp.pop("t_end_s") * 1e9).astype(np.int64)
    total = float(np.nanmax(t1)) if len(t1) else 0.0
    if len(comp):
        total = max(total, comp["t_end_ns"].max() / 1e9)
    return Timeline(out, comp, total)


def asynchronous_calls(ev: pd.DataFrame, parallel: ParallelConfig) -> np.ndarray:
    """Which event rows Megatron issues asynchronously, behind compute (module doc): the DP gradient reductions
    in the backward phase (``overlap_grad_reduce``) and, in the interleaved schedule, the pipeline sends
    (``overlap_p2p_comm``; Megatron turns it off otherwise, arguments.py:1005-1012)."""
    phase, par, op = ev["phase"].to_numpy(), ev["parallelism"].to_numpy(), ev["op"].to_numpy()
    out = np.zeros(len(ev), bool)
    if parallel.overlap_grad_reduce:
        out |= (phase == "backward") & (par == "dp")
    if parallel.overlap_p2p_comm and parallel.vpp > 1:
        out |= op == "send"
    return out


def _call_seconds(bw: Bandwidth, lay: Layout, rank: int, op: str, nbytes: int, group: np.ndarray) -> float:
    n = len(group)
    if n <= 1 or op == "recv":
        return 0.0
    if op == "send":
        n, k = 2, 2 if lay.node_of(int(group[0])) == lay.node_of(int(group[-1])) else 1
    else:
        k = int((np.asarray(group) // lay.gpus_per_node == rank // lay.gpus_per_node).sum())
    return float(bw.time(op, nbytes, n, k))


def _stage_items(e: pd.DataFrame, rows: np.ndarray, steps: list, ctx: Context, r: int, per_layer: np.ndarray,
                 t_emb: float, t_out: float, rec: float) -> list:
    """``("compute", seconds, phase, mb, chunk)`` and ``("call", row)`` items of one stage in order."""
    phase = e["phase"].to_numpy()
    mb = e["microbatch"].to_numpy()
    layer = e["layer"].to_numpy()
    n = len(e)
    out: list[tuple] = []
    i = 0
    L = ctx.model.num_layers
    for st in steps:
        kind = "forward" if st.kind == "F" else "backward"
        layers = list(ctx.chunk_layers(r, st.chunk))
        # recompute_method="block": the chunk's checkpointed share of its layers (llmcomm.step.recomputed_share)
        f = 1.0 if kind == "forward" else 2.0 + rec * step_.recomputed_share(
            len(layers), ctx.parallel.recompute_method, ctx.parallel.recompute_num_layers)
        extra = 0.0
        if ctx.virtual_stage(r, st.chunk) == 0:
            extra += t_emb * (1.0 if kind == "forward" else 2.0)
        if ctx.virtual_stage(r, st.chunk) == ctx.last_virtual:
            extra += t_out * (1.0 if kind == "forward" else 2.0)
        j = i
        while j < n and phase[j] == kind and mb[j] == st.microbatch and not (0 <= layer[j] < L
                                                                            and layer[j] not in layers):
            j += 1
        step = list(range(i, j))
        calls_per_layer: dict[int, int] = {}
        for q in step:
            calls_per_layer[int(layer[q])] = calls_per_layer.get(int(layer[q]), 0) + 1
        silent = sum(per_layer[la] for la in layers if la not in calls_per_layer) * f + extra
        close = step[-1] if step and e["op"].iat[step[-1]] == "send" else None
        for q in step:
            la = int(layer[q])
            if 0 <= la < L and la in layers:
                out.append(("compute", per_layer[la] * f / calls_per_layer[la], kind, st.microbatch, st.chunk))
            if q == close:
                out.append(("compute", silent, kind, st.microbatch, st.chunk))
                silent = 0.0
            out.append(("call", int(rows[q])))
        if silent:
            out.append(("compute", silent, kind, st.microbatch, st.chunk))
        i = j
    for q in range(i, n):  # the optimizer phase (and anything after the steps): calls only
        out.append(("call", int(rows[q])))
    return out


def _simulate(items: list[list[tuple]], ev: pd.DataFrame, stage_of: np.ndarray,
              dur: np.ndarray, asynchronous: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray, list]:
    """Run the stages' item lists against each other (module doc); seconds per event row. ``asynchronous``
    rows run on the rank's communication stream (``comm``), waited for at its first optimizer-phase call."""
    p = len(items)
    n_ev = len(ev)
    starts, ends = np.full(n_ev, np.nan), np.full(n_ev, np.nan)
    op = ev["op"].to_numpy()
    peer = ev["peer"].to_numpy()
    group = ev["group"].to_numpy()
    cursor, clock = [0] * p, [0.0] * p
    comm = [0.0] * p  # end of the rank's last asynchronous call
    is_async = np.zeros(n_ev, bool) if asynchronous is None else asynchronous
    phase = ev["phase"].to_numpy()
    sent: dict[tuple[int, int, int], tuple[float, float]] = {}
    n_send: dict[tuple[int, int], int] = {}
    n_recv: dict[tuple[int, int], int] = {}
    barrier: dict[tuple, dict[int, float]] = {}
    seen_barrier: dict[tuple[int, frozenset], int] = {}
    compute: list = []
    while True:
        progress = False
        for r in range(p):
            while cursor[r] < len(items[r]):
                it = items[r][cursor[r]]
                if it[0] == "compute":
                    if it[1] > 0:
                        compute.append((r, it[2], it[3], it[4], clock[r], clock[r] + it[1]))
                    clock[r] += it[1]
                    cursor[r] += 1
                    progress = True
                    continue
                row = it[1]
                o = op[row]
                members = frozenset(int(x) for x in group[row])
                stages = {int(stage_of[m]) for m in members}
                if phase[row] == "optimizer":  # finish_grad_sync: wait for the asynchronous reductions
                    clock[r] = max(clock[r], comm[r])
                if is_async[row] and (o == "send" or len(stages) == 1):
                    starts[row] = max(clock[r], comm[r])
                    ends[row] = comm[r] = starts[row] + dur[row]
                    if o == "send":
                        dst = int(stage_of[int(peer[row])])
                        k = n_send.get((r, dst), 0)
                        n_send[(r, dst)] = k + 1
                        sent[(r, dst, k)] = (starts[row], ends[row])
                elif o == "send":
                    dst = int(stage_of[int(peer[row])])
                    k = n_send.get((r, dst), 0)
                    n_send[(r, dst)] = k + 1
                    starts[row], ends[row] = clock[r], clock[r] + dur[row]
                    sent[(r, dst, k)] = (starts[row], ends[row])
                    clock[r] = ends[row]
                elif o == "recv":
                    src = int(stage_of[int(peer[row])])
                    k = n_recv.get((src, r), 0)
                    hit = sent.get((src, r, k))
                    if hit is None:
                        break  # wait for the sender
                    n_recv[(src, r)] = k + 1
                    starts[row] = max(clock[r], hit[0])
                    ends[row] = max(clock[r], hit[1])
                    clock[r] = ends[row]
                elif len(stages) > 1:  # a collective across stages: a barrier of the stages it spans
                    occ_key = (r, members)
                    occ = seen_barrier.get(occ_key, 0)
                    key = (members, occ)
                    arrived = barrier.setdefault(key, {})
                    arrived[r] = clock[r]
                    if not stages <= set(arrived):
                        break
                    seen_barrier[occ_key] = occ + 1
                    starts[row] = max(arrived.values())
                    ends[row] = starts[row] + dur[row]
                    clock[r] = ends[row]
                else:
                    starts[row], ends[row] = clock[r], clock[r] + dur[row]
                    clock[r] = ends[row]
                cursor[r] += 1
                progress = True
        if all(cursor[r] >= len(items[r]) for r in range(p)):
            for r in range(p):  # the step ends when the rank's asynchronous calls have
                clock[r] = max(clock[r], comm[r])
            break
        if not progress:
            stuck = {r: items[r][cursor[r]] for r in range(p) if cursor[r] < len(items[r])}
            raise ConfigError(f"predicted_timeline: the stages wait on each other (deadlock) at {stuck}")
    return starts, ends, compute


def on_off(trace: Trace | pd.DataFrame, ranks: list[int] | None = None) -> pd.DataFrame:
    """Per rank of a timed trace, per call in issue order: ``rank, i, phase, parallelism, op, bytes,
    t_start_ns, t_end_ns, busy_ns`` and ``gap_ns`` (idle time since the previous call ended: the *off* period)."""
    ev = trace.events if isinstance(trace, Trace) else trace
    ev = ev[ev["phase"].isin(["forward", "backward", "optimizer"])]
    if ranks is not None:
        ev = ev[ev["rank"].isin(ranks)]
    ev = ev.sort_values(["rank", "t_start_ns"], kind="stable")
    out = ev[["rank", "iteration", "phase", "microbatch", "parallelism", "op", "bytes", "t_start_ns", "t_end_ns"]].copy()
    out["i"] = out.groupby("rank").cumcount()
    s = out["t_start_ns"].astype("float64")
    e = out["t_end_ns"].astype("float64")
    out["busy_ns"] = e - s
    prev_end = e.groupby(out["rank"]).shift(1)
    out["gap_ns"] = (s - prev_end).clip(lower=0)
    return out.reset_index(drop=True)


def compare_timelines(predicted: Trace | pd.DataFrame, recorded: Trace | pd.DataFrame,
                      iteration: int | None = None) -> pd.DataFrame:
    """Per rank: whether the two traces issue the same calls in the same order (phase, op, parallelism, bytes),
    the share of the iteration each spends in calls (*on*), the number of off periods longer than 5% of the
    iteration, and the Spearman correlation of the gaps between consecutive calls (the on-off rhythm, free
    of the absolute speed of either run). ``iteration``: the recorded iteration to use (default its last)."""
    from scipy.stats import spearmanr

    def one_iter(t: Trace | pd.DataFrame, it: int | None) -> pd.DataFrame:
        oo = on_off(t)
        its = sorted(oo["iteration"].unique())
        return oo[oo["iteration"] == (its[-1] if it is None else it)]

    a, b = one_iter(predicted, None), one_iter(recorded, iteration)
    rows = []
    for rank in sorted(set(a["rank"]) & set(b["rank"])):
        x, y = a[a["rank"] == rank], b[b["rank"] == rank]
        key = ["phase", "op", "parallelism", "bytes"]
        same = len(x) == len(y) and (x[key].to_numpy() == y[key].to_numpy()).all()
        row = {"rank": rank, "calls_predicted": len(x), "calls_recorded": len(y), "same_order": bool(same)}
        for side, d in (("predicted", x), ("recorded", y)):
            span = float(d["t_end_ns"].max() - d["t_start_ns"].min())
            row[f"on_share_{side}"] = float(d["busy_ns"].sum()) / span if span > 0 else float("nan")
            row[f"long_gaps_{side}"] = int((d["gap_ns"] > 0.05 * span).sum())
        if same and len(x) > 2:
            rho = spearmanr(x["gap_ns"].to_numpy()[1:], y["gap_ns"].to_numpy()[1:]).statistic
            row["gap_rank_correlation"] = float(rho)
        else:
            row["gap_rank_correlation"] = float("nan")
        rows.append(row)
    return pd.DataFrame(rows)
