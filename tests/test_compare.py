"""llmcomm.compare: a measured trace against its prediction — constructed differences with known answers,
real traces, bad input, and the `llmcomm compare` command."""

from __future__ import annotations

import subprocess
import sys

import pandas as pd
import pytest

import llmcomm as lc
from llmcomm.compare import compare, load_measured
from llmcomm.errors import ConfigError, DataError
from llmcomm.predict import predict_traffic

TINY = lc.load_model("tiny-gpt")
PAR = lc.ParallelConfig(tp=2, pp=2, micro_batch=2, global_batch=8)


def _predicted() -> lc.Trace:
    t = predict_traffic(TINY, PAR, aggregate=False)
    t.meta.update(model_spec=TINY.to_dict(), parallel=PAR.to_dict(), world_size=PAR.world_size)
    return t


def test_prediction_against_itself_is_exact() -> None:
    t = _predicted()
    c = compare(t, t)
    assert c.exact and c.ordered_ranks == 4
    assert set(c.verdicts["verdict"]) == {"exact"}
    assert (c.by_kind["bytes_measured"] == c.by_kind["bytes_predicted"]).all()
    assert (c.pairs["diff"] == 0).all()


def test_constructed_differences_are_found_and_described() -> None:
    pred = _predicted()
    ev = pred.events
    tp0 = ev.index[(ev["rank"] == 0) & (ev["parallelism"] == "tp")][0]
    extra = ev.loc[[tp0]].assign(op="broadcast", bytes=40)
    measured = lc.Trace.from_events(pd.concat([ev.drop(index=tp0), extra], ignore_index=True), pred.meta)
    c = compare(measured, pred)
    assert not c.exact
    one = c.one_sided.set_index("side")
    assert one.loc["measured", "op"] == "broadcast" and one.loc["measured", "bytes"] == 40
    assert one.loc["predicted", "op"] == ev.loc[tp0, "op"] and one.loc["predicted", "calls"] == 1
    assert one.loc["measured", "ranks"] == (0,)
    assert "measured has tp broadcast of 40 B over 2 ranks" in one.loc["measured", "what"]
    v = c.verdicts.set_index("parallelism")["verdict"]
    want = 100 * (40 - int(ev.loc[tp0, "bytes"])) / int(c.by_kind.query("parallelism == 'tp'")["bytes_predicted"].sum())
    assert v["tp"] == f"differs by {want:+.1f}%"
    assert v["pp"] == "exact"
    assert c.ordered_ranks == 3  # ranks 1-3 untouched


def test_same_bytes_different_calls() -> None:
    pred = _predicted()
    ev = pred.events
    i = ev.index[(ev["rank"] == 1) & (ev["parallelism"] == "tp")][0]
    half = ev.loc[[i, i]].assign(bytes=int(ev.loc[i, "bytes"]) // 2)
    measured = lc.Trace.from_events(pd.concat([ev.drop(index=i), half], ignore_index=True), pred.meta)
    c = compare(measured, pred)
    assert c.verdicts.set_index("parallelism").loc["tp", "verdict"] == "same bytes, different calls"


def test_curated_trace_in_megatron_terms_lists_torch_differences() -> None:
    """The collector uses torch's APIs: against Megatron-LM's program the DP sync and the TP embedding calls
    differ while the PP sends match — each listed, none hidden."""
    c = compare(load_measured("gpt_tp2pp2dp2"), framework="megatron")
    v = c.verdicts.set_index("parallelism")["verdict"]
    assert v["pp"] == "exact"
    # DDP-style per-bucket all-reduces vs one per iteration: the same gradient bytes; Megatron-LM adds the
    # train_step loss report ([loss, tokens], 8 B over DP) on the 4 last-stage ranks
    dp = c.verdicts.set_index("parallelism").loc["dp"]
    assert dp["bytes_predicted"] - dp["bytes_measured"] == 4 * 8
    loss = c.one_sided.query("side == 'predicted' and parallelism == 'dp' and bytes == 8")
    assert len(loss) == 1 and loss["phase"].iat[0] == "optimizer"
    assert not c.one_sided.empty and c.one_sided["what"].str.len().gt(20).all()


def test_aicb_moe_replay_against_mixtral(external) -> None:  # noqa: ANN001
    c = compare(load_measured("aicb/A100_example.csv"), model="mixtral-8x7b",
                parallel=dict(tp=2, dp=4, ep=4, sp=True, distributed_optimizer=True, global_batch=8, seq_len=2048))
    assert c.ranks == (0,)
    sides = set(c.one_sided["side"])
    assert sides == {"measured", "predicted"}, "AICB both adds and omits calls relative to Megatron-LM"
    ep = c.by_kind[c.by_kind["parallelism"] == "ep"]
    # AICB labels all four token all-to-alls of an MoE layer 'forward': same bytes, different phases; it
    # omits Megatron-LM's routing-probability all-to-alls (T·k bf16 = 4 KiB, forward and backward, 32 MoE
    # layers x 2 micro-batches) and the token-count all-gather over tp_ep (etp·ep·E·8 = 512 B)
    probs = 2 * 64 * (2048 // 2) * 2 * 2
    counts = 64 * 2 * 4 * 8 * 8
    assert ep["bytes_measured"].sum() == ep["bytes_predicted"].sum() - probs - counts


@pytest.mark.parametrize("kwargs, rule", [
    (dict(parallel=dict(tp=2, pp=1, micro_batch=2, global_batch=8)), "world size 4 but the configuration"),
    (dict(parallel=dict(tp=3, pp=2, micro_batch=2, global_batch=8)), "tp=3 does not divide"),
    (dict(iteration=99), "iteration=99 is not in the trace"),
])
def test_bad_input_names_the_rule(kwargs, rule) -> None:  # noqa: ANN001
    with pytest.raises(ConfigError, match=rule):
        compare(_predicted(), **kwargs)


def test_no_model_and_no_iterations() -> None:
    t = _predicted()
    bare = lc.Trace(t.events, {})
    with pytest.raises(ConfigError, match="names no model"):
        compare(bare)
    setup_only = lc.Trace(t.events.assign(phase="setup"), t.meta)
    with pytest.raises(DataError, match="marks no training iteration"):
        compare(setup_only)
    with pytest.raises(ConfigError, match="neither a curated trace"):
        load_measured("no/such/trace.parquet")


def test_cli(tmp_path) -> None:  # noqa: ANN001
    r = subprocess.run([sys.executable, "-m", "llmcomm", "compare", "gpt_tp4", "--framework", "torch",
                        "--out", str(tmp_path / "r.html")], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert "tp   exact" in r.stdout and "4 of 4 ranks" in r.stdout
    assert "<h1>gpt_tp4 against its prediction</h1>" in (tmp_path / "r.html").read_text()
    bad = subprocess.run([sys.executable, "-m", "llmcomm", "compare", "gpt_tp4", "--out", str(tmp_path / "r.txt")],
                         capture_output=True, text=True)
    assert bad.returncode == 2 and ".md or .html" in bad.stderr  # a usage error, refused before any work
    assert not (tmp_path / "r.txt").exists()


def test_public_entry_point() -> None:
    assert lc.compare.compare(load_measured("gpt_tp4"), framework="torch").exact
