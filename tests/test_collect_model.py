"""The collect workloads in one process: parameter counts, corpus, MoE routing, and that training learns."""

from __future__ import annotations

import numpy as np
import pytest
import torch  # the test set-up installs torch; a missing torch must fail, not skip

from llmcomm import load_model

pytestmark = pytest.mark.torch


@pytest.mark.parametrize("name", ["tiny-gpt", "tiny-moe"])
def test_catalogue_count_is_the_torch_models_count(name: str) -> None:
    from llmcomm.collect.model import build_model

    spec = load_model(name)
    model = build_model(spec)
    n = sum(p.numel() for p in model.parameters())
    assert n == spec.num_parameters() == spec.published_parameters


def test_corpus_is_deterministic_bytes() -> None:
    from llmcomm.collect.corpus import batch, load_corpus

    c = load_corpus(1 << 16)
    assert c.dtype == np.uint8 and len(c) == 1 << 16
    x1, y1 = batch(c, 3, 4, 32, seed=1)
    x2, y2 = batch(c, 3, 4, 32, seed=1)
    np.testing.assert_array_equal(x1, x2)
    np.testing.assert_array_equal(x1[:, 1:], y1[:, :-1])
    assert not np.array_equal(batch(c, 4, 4, 32, seed=1)[0], x1)


def test_moe_routes_topk_and_reports_counts() -> None:
    from llmcomm.collect.model import build_model

    spec = load_model("tiny-moe")
    model = build_model(spec)
    seen: list[tuple[int, list[int]]] = []
    from llmcomm.collect.moe import MoE

    moes = [m for m in model.modules() if isinstance(m, MoE)]
    assert [m.layer_id for m in moes] == [i for i, x in enumerate(spec.moe_layer_pattern()) if x]
    for m in moes:
        m.on_route = lambda layer, counts: seen.append((layer, counts))
    x = torch.randint(0, 256, (2, 16))
    model(x).sum().backward()
    assert len(seen) == len(moes)
    for _, counts in seen:
        assert len(counts) == spec.num_experts and sum(counts) == 2 * 16 * spec.moe_router_topk
    # the aux loss reaches the router through the injected gradient
    assert all(m.router.weight.grad is not None and m.router.weight.grad.abs().sum() > 0 for m in moes)


@pytest.mark.parametrize("name", ["tiny-gpt", "tiny-moe"])
def test_loss_falls_in_a_few_steps(name: str) -> None:
    from llmcomm.collect.corpus import batch, load_corpus
    from llmcomm.collect.model import build_model, cross_entropy

    torch.set_num_threads(1)
    spec = load_model(name)
    model = build_model(spec, seed=0)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    corpus = load_corpus()
    losses = []
    for it in range(12):
        x, y = (torch.from_numpy(a) for a in batch(corpus, it, 8, 64))
        loss = cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(float(loss.detach()))
    assert np.mean(losses[-3:]) < losses[0] - 0.5
