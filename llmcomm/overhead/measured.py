"""vTrain's measured iteration times (``vtrain/ground_truth_{single,multi}.csv``) as tidy tables, and the
model and configuration each row describes.

The setup behind the measurements, as vTrain's own validation configurations state it (see
``../shared/external/README.md``): Megatron-DeepSpeed GPT models, A100 GPUs, 8 per node, full activation
recomputation, the 1F1B schedule, no gradient bucketing (the gradient all-reduce runs after the backward pass,
not overlapped). Not stated there, and assumed here (decided before looking at any multi-node error):
GPT-2's vocabulary of 50,257 tokens padded to a multiple of 128·tp, an FFN of 4·h, learned positions, biases,
LayerNorm, tied embeddings (Megatron's GPT), fp16 activations, gradients all-reduced in fp16 (Megatron-DeepSpeed
without ``--accumulate-allreduce-grads-in-fp32``), the standard Adam optimizer (not distributed).

Added after seeing the multi-node validation residuals (mechanism chosen after seeing them; no number fitted
on them): the pipeline runs on DeepSpeed's PipelineEngine, as Megatron-DeepSpeed's ``pretrain_gpt.py`` builds
``GPTModelPipe`` whenever ``--deepspeed`` is on without ``--no-pipeline-parallel`` and ``training.py`` calls
``train_batch``; that engine sends activations and their gradients split over the TP group and all-gathers
them on arrival (``pipe_partitioned``/``grad_partitioned``, both on by default: DeepSpeed
``deepspeed/runtime/pipe/engine.py`` lines 144-145, 719-726, 743-757, 826-848, 1062-1073;
``deepspeed/runtime/config.py`` lines 467-468). Hence ``pipe_partitioned: True``
(:attr:`llmcomm.ParallelConfig.pipe_partitioned`; the predictor issues those calls, :func:`llmcomm.predict.pp.
partitioned_gathers`, and :func:`llmcomm.overhead.iteration.comm_items` times them).
"""

from __future__ import annotations

import pandas as pd

from ..data import path as data_path  # noqa: F401 - re-exported for tests
from ..errors import DataError
from ..specs import ModelSpec

FILES = {"single": "vtrain/ground_truth_single.csv", "multi": "vtrain/ground_truth_multi.csv"}
COLUMNS = {"# GPUs": "gpus", "global batch": "global_batch", "micro batch": "micro_batch",
           "hidden size": "hidden", "attention heads": "heads", "# layers": "layers",
           "sequence length": "seq_len", "tensor parallelism": "tp", "data parallelism": "dp",
           "pipeline parallelism": "pp", "iteration time (ms)": "time_ms", "Parameters (billion)": "params_b"}
VOCAB = 50257
RUN_SETTINGS = {"recompute": "full", "schedule": "1f1b", "act_dtype": "fp16", "grad_reduce_dtype": "fp16",
                "param_dtype": "fp16", "sp": False, "distributed_optimizer": False, "pipe_partitioned": True,
                "attention_backend": "unfused"}


def read(which: str = "single", file: str | None = None) -> pd.DataFrame:
    """One of vTrain's ground-truth files as a table with columns ``gpus, global_batch, micro_batch, hidden,
    heads, layers, seq_len, tp, dp, pp, time_s`` (+ ``params_b`` for the multi-node file) and ``group``
    (the model shape). Raises :class:`DataError` naming the file, column and rule for a missing column,
    a non-positive time, or a row whose ``tp·dp·pp`` differs from its GPU count."""
    if which not in FILES:
        raise DataError(f"which={which!r} is not one of {sorted(FILES)}")
    p = file or data_path(FILES[which])
    try:
        df = pd.read_csv(p, encoding="utf-8-sig")
    except (OSError, ValueError) as e:
        raise DataError(f"{p}: cannot read as CSV: {e}") from None
    missing = [c for c in COLUMNS if c not in df.columns and c != "Parameters (billion)"]
    if missing:
        raise DataError(f"{p}: missing column(s) {missing}")
    df = df.rename(columns=COLUMNS)
    t = pd.to_numeric(df["time_ms"], errors="coerce")
    bad = ~(t > 0)
    if bad.any():
        i = int(bad.to_numpy().argmax())
        raise DataError(f"{p}: row {i}: column 'iteration time (ms)'={df['time_ms'].iloc[i]!r} must be a "
                        "positive number")
    df["time_s"] = t / 1e3
    df = df.drop(columns="time_ms")
    prod = df["tp"] * df["dp"] * df["pp"]
    if (prod != df["gpus"]).any():
        i = int((prod != df["gpus"]).to_numpy().argmax())
        raise DataError(f"{p}: row {i}: tp*dp*pp={prod.iloc[i]} differs from '# GPUs'={df['gpus'].iloc[i]}")
    if which == "multi":
        df["group"] = df["params_b"].map(lambda x: f"{x:g}B")
    else:
        df["group"] = "h" + df["hidden"].astype(str) + "-L" + df["layers"].astype(str)
    return df


def model(hidden: int, heads: int, layers: int, seq_len: int) -> ModelSpec:
    """The Megatron-DeepSpeed GPT of one vTrain row (see the module docstring for what is assumed)."""
    return ModelSpec(name=f"vtrain-gpt-h{hidden}-L{layers}", num_layers=int(layers), hidden_size=int(hidden),
                     ffn_hidden_size=4 * int(hidden), num_attention_heads=int(heads), vocab_size=VOCAB,
                     add_bias_linear=True, tied_embeddings=True, normalization="LayerNorm",
                     position_embedding_type="learned_absolute", max_position_embeddings=int(seq_len),
                     seq_length=int(seq_len), source="vTrain ground truth (VIA-Research/vTrain)")


def candidates(rows: pd.DataFrame) -> pd.DataFrame:
    """The candidate table (:func:`llmcomm.overhead.iteration_times`) of measured rows: their tp, pp, dp,
    micro-batch, global batch, sequence and :data:`RUN_SETTINGS`."""
    out = rows[["tp", "pp", "dp", "micro_batch", "global_batch", "seq_len"]].copy()
    for k, v in RUN_SETTINGS.items():
        out[k] = v
    return out


def by_model(rows: pd.DataFrame) -> list[tuple[ModelSpec, pd.DataFrame]]:
    """Rows grouped by model shape: ``[(ModelSpec, rows)]``."""
    keys = ["hidden", "heads", "layers", "seq_len"]
    return [(model(*k), g) for k, g in rows.groupby(keys, sort=True)]
