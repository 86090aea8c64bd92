"""Which transformer layers each pipeline stage and model chunk holds, as Megatron-LM assigns them: the one home of
the split, below :mod:`llmcomm.specs` (``ParallelConfig.virtual_stage_layers``) and :mod:`llmcomm.step` (the step
description), which both read it. Pure integers: no spec, no numpy."""

from __future__ import annotations

from functools import lru_cache


@lru_cache(maxsize=4096)
def pipeline_split(num_layers: int, pp: int, vpp: int, first: int | None = None, last: int | None = None,
                   embedding: bool = False, loss: bool = False) -> tuple[tuple[tuple[int, int], ...], ...]:
    """``split[stage][chunk] = (first layer, layer count)`` as Megatron-LM assigns them
    (``megatron/core/transformer/transformer_block.py:76`` ``get_num_layers_to_build`` and
    ``transformer_layer.py:65`` ``get_transformer_layer_offset``):

    * even: ``N = L + [embedding] + [loss]`` (``account_for_embedding/loss_in_pipeline_split``: the embedding and
      the loss count as one layer each), ``n = N/pp`` per stage, ``n/v`` per chunk; virtual stage ``vs = c·pp + r``
      starts at layer ``vs·n/v``, minus 1 after the first virtual stage when the embedding is counted; the first
      (last) virtual stage builds one layer fewer for the embedding (loss);
    * uneven (``num_layers_in_first/last_pipeline_stage``, Megatron's ``--decoder-first/last-pipeline-num-layers``, ``F``, ``La``): the first (last) stage holds ``F`` (``La``)
      layers, ``F/v`` per chunk; the ``M`` middle stages share the rest equally, ``(L − F − La)/M``; chunk ``c``
      starts at ``c·(F/v + (L − F − La)/v + La/v)`` plus, past stage 0, ``F/v + (middle rank)·(per-middle/v)``.

    Arguments are assumed valid (:mod:`llmcomm.rules`); with the defaults this is ``vs·L/(pp·v)`` onward."""
    if first is None and last is None:
        n_total = num_layers + int(embedding) + int(loss)
        per_chunk = n_total // pp // vpp
        out = []
        for r in range(pp):
            row = []
            for c in range(vpp):
                vs = c * pp + r
                start = vs * per_chunk - (1 if embedding and vs > 0 else 0)
                count = per_chunk - (1 if embedding and vs == 0 else 0) - (1 if loss and vs == pp * vpp - 1 else 0)
                row.append((start, count))
            out.append(tuple(row))
        return tuple(out)
    f, la = first or 0, last or 0
    middle_stages = pp - (first is not None) - (last is not None)
    middle = num_layers - f - la
    per_middle = middle // middle_stages if middle_stages > 0 else 0
    fc, lc, mc = f // vpp, la // vpp, middle // vpp
    total = fc + mc + lc
    out = []
    for r in range(pp):
        if r == 0 and first is not None:
            count = f
        elif r == pp - 1 and last is not None:
            count = la
        else:
            count = per_middle
        mid_rank = r - (first is not None)
        row = []
        for c in range(vpp):
            start = c * total if r == 0 else c * total + fc + mid_rank * (mc // middle_stages if middle_stages else 0)
            row.append((start, count // vpp))
        out.append(tuple(row))
    return tuple(out)
