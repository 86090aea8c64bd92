"""Properties of predicted traffic over random valid configurations (hypothesis)."""

from __future__ import annotations

import numpy as np
from conftest import TINY
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from llmcomm import Layout, ParallelConfig
from llmcomm.predict import predict_traffic

SETTINGS = settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@st.composite
def configs(draw, m: int | None = None) -> ParallelConfig:
    tp = draw(st.sampled_from([1, 2, 4]))
    pp = draw(st.sampled_from([1, 2, 4]))
    dp = draw(st.sampled_from([1, 2]))
    vpp = draw(st.sampled_from([1, 2])) if pp == 2 else 1
    mb = m or draw(st.sampled_from([1, 2, 4])) * (pp if vpp > 1 else 1)
    return ParallelConfig(tp=tp, pp=pp, dp=dp, vpp=vpp, cp=draw(st.sampled_from([1, 1, 2])), sp=draw(st.booleans()) and tp > 1, seq_len=32,
                          global_batch=mb * dp, distributed_optimizer=draw(st.booleans()),
                          order=draw(st.sampled_from(["tp-cp-ep-dp-pp", "tp-pp-dp"])),
                          schedule=draw(st.sampled_from(["1f1b", "gpipe"])) if vpp == 1 else "interleaved")


@given(configs())
@SETTINGS
def test_every_send_has_its_recv(p):
    ev = predict_traffic(TINY, p).events
    s = ev[ev["op"] == "send"].groupby(["rank", "peer", "bytes"]).size()
    r = ev[ev["op"] == "recv"].groupby(["peer", "rank", "bytes"]).size()
    r.index = r.index.set_names(["rank", "peer", "bytes"])
    assert s.sort_index().equals(r.sort_index())


@given(configs())
@SETTINGS
def test_flows_conserve_bytes(p):
    t = predict_traffic(TINY, p)
    ev = t.events
    n = ev["group"].map(len).to_numpy()
    b = ev["bytes"].to_numpy() * ev["count"].to_numpy()
    op = ev["op"].to_numpy()
    wire = np.where(op == "all_reduce", 2 * (n - 1) / np.maximum(n, 1) * b,
                    np.where(np.isin(op, ["all_gather", "reduce_scatter", "broadcast"]),
                             (n - 1) / np.maximum(n, 1) * b,
                             np.where(op == "send", b, 0.0)))
    for alg in ("ring", "direct"):
        assert np.isclose(t.matrix(alg).sum(), wire.sum(), rtol=1e-12)


@given(configs(), st.sampled_from([1, 2, 3]))
@SETTINGS
def test_tp_pp_linear_in_microbatches_dp_constant(p, k):
    import dataclasses

    if p.vpp > 1:
        k = 2  # keep m divisible by pp
    one = predict_traffic(TINY, p).volumes()
    more = predict_traffic(TINY, dataclasses.replace(p, global_batch=p.global_batch * k)).volumes()
    a, b = one.set_index("parallelism")["bytes"], more.set_index("parallelism")["bytes"]
    if "tp" in a:
        # tp minus the once-per-iteration SP norm all-reduce
        assert b["tp"] - k * a["tp"] == (1 - k) * _iteration_tp(TINY, p)
    if "pp" in a:
        emb = _tied(TINY, p)
        assert b["pp"] - emb == k * (a["pp"] - emb)
    if "sp" in a:
        assert b["sp"] == k * a["sp"]
    if "dp" in a:
        assert b["dp"] == a["dp"]


def _iteration_tp(model, p) -> int:
    t = predict_traffic(model, p)
    return int(t.select(parallelism="tp", phase="optimizer").events["bytes"].sum())


def _tied(model, p) -> int:
    t = predict_traffic(model, p)
    return int(t.select(parallelism="pp", op="all_reduce").events["bytes"].sum())


@given(configs())
@SETTINGS
def test_support_is_the_union_of_layout_groups(p):
    from llmcomm.analysis.api import support_violations

    t = predict_traffic(TINY, p)
    assert support_violations(t).empty
    lay = Layout(p)
    for par, kinds in (("tp", ["tp"]), ("sp", ["tp"]), ("cp", ["cp"]), ("dp", ["dpcp"]), ("pp", ["pp"])):
        m = t.matrix("direct", world_size=p.world_size, parallelism=par).tocoo()
        allowed = np.zeros((p.world_size, p.world_size), dtype=bool)
        for k in kinds:
            for g in lay.groups(k):
                allowed[np.ix_(g, g)] = True
        np.fill_diagonal(allowed, False)
        got = np.zeros_like(allowed)
        got[m.row, m.col] = m.data > 0
        assert not (got & ~allowed).any()
        if par == "tp" and p.tp > 1 or par == "dp" and p.dp * p.cp > 1 or par == "sp" and p.sp:
            assert (got == allowed).all()  # every pair of every group talks
