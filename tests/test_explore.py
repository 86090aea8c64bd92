"""The teaching explorer without a browser: its views equal the package's own results, a broken rule shows the
package's message and keeps the last view, large jobs switch to node-level matrices, and the page notebook and
the ``llmcomm explore`` command exist. The browser tests are in ``test_explore_browser.py``."""

from __future__ import annotations

import json

import matplotlib.pyplot as plt
import numpy as np
import pytest

import llmcomm as lc
from llmcomm.cli import build_parser
from llmcomm.errors import ConfigError
from llmcomm.explore import GPU_LEVEL_MAX, Choice, compute, explore
from llmcomm.explore.panels import FIGURES, PANELS, render, summary_html
from llmcomm.explore.serve import descendants, free_port, page_notebook
from llmcomm.overhead.iteration import iteration_time
from llmcomm.predict import predict_traffic

START = Choice(model="gpt3-6.7b", cluster="a100-80g-hdr200", tp=8, pp=4, dp=1, global_batch=32)


@pytest.fixture(scope="module")
def view():
    return compute(START)


def test_view_is_the_packages_own_results(view) -> None:
    model, parallel = lc.load_model("gpt3-6.7b"), START.parallel()
    cluster = lc.load_cluster("a100-80g-hdr200").for_world(32)
    trace = predict_traffic(model, parallel, cluster=cluster)
    for p in ("tp", "pp"):
        for alg, label in (("direct", "logical"), ("ring", "ring")):
            image = view.matrices[f"{p.upper()} {label}"]  # one cell per GPU at 32 GPUs: the exact matrix
            m = trace.matrix(alg, parallelism=p).toarray()
            np.testing.assert_allclose(image, m, rtol=1e-12, atol=0)
            assert ((image > 0) == (m > 0)).all()
    vol = trace.volumes(["parallelism"], sent_only=True).set_index("parallelism")["bytes"]
    assert view.volumes.set_index("parallelism")["bytes"].to_dict() == vol[vol > 0].to_dict()
    assert view.volumes["share"].sum() == pytest.approx(1.0)
    assert view.breakdown == iteration_time(model, parallel, cluster)


def test_layout_panel_says_which_groups_cross_a_node(view) -> None:
    span = view.group_summary.set_index("parallelism")["nodes_per_group"]
    assert span["tp"] == 1 and span["pp"] == 4
    crossed = compute(START.replace(tp=16, pp=2)).group_summary.set_index("parallelism")["nodes_per_group"]
    assert crossed["tp"] == 2
    assert set(view.group_table["node"]) == {0, 1, 2, 3}


def test_call_sequence_is_one_micro_batch_of_one_rank_in_issue_order(view) -> None:
    c = view.calls
    assert len(c) > 0 and list(c["step"]) == list(range(len(c)))
    assert set(c["parallelism"]) >= {"tp", "pp"}
    # forward first: Megatron's 1F1B runs a micro-batch's forward before its backward
    phases = list(c["phase"])
    assert phases.index("backward") > max(i for i, p in enumerate(phases) if p == "forward") - 1
    assert (c["bytes"] > 0).all()
    last = compute(START.replace(rank=31, microbatch=5))  # last stage: receives activations, sends gradients
    pp = last.calls[last.calls.parallelism == "pp"]
    assert set(pp["op"]) == {"recv", "send"} and all("23" in r for r in pp["ranks"])


def test_broken_rule_is_the_packages_message() -> None:
    with pytest.raises(ConfigError, match="tp=3 does not divide num_attention_heads=32"):
        compute(START.replace(tp=3))
    with pytest.raises(ConfigError, match="does not divide global_batch"):
        compute(START.replace(micro_batch=2, global_batch=33))
    with pytest.raises(ConfigError, match="rank=32 is outside"):
        compute(START.replace(rank=32))
    with pytest.raises(ConfigError, match="neither a file nor in the catalogue"):
        compute(START.replace(model="no/such/model.yaml"))


def test_time_panel_says_why_when_the_formulation_does_not_apply() -> None:
    # the model state of GPT-3 175B does not fit 8 A100s (CP, the former example, is in the formulation now)
    v = compute(START.replace(model="gpt3-175b", tp=8, pp=1, dp=1, global_batch=1))
    assert v.breakdown is None and "optimizer state alone" in v.time_error
    assert "optimizer state alone" in summary_html(v, "time")
    assert render(v, "time")[:4] == b"\x89PNG"
    cp = compute(START.replace(cp=2, pp=2, tp=8, global_batch=8))
    assert cp.breakdown is not None and cp.breakdown.cp_comm_s > 0 and "CP logical" in cp.matrices


def test_large_jobs_use_node_level_matrices() -> None:
    big = compute(Choice(model="gpt3-175b", tp=8, pp=16, dp=64, global_batch=1024))  # 8,192 GPUs
    assert big.world_size > GPU_LEVEL_MAX and big.level == "node"
    assert big.unit % big.cluster.gpus_per_node == 0 and big.cells <= 256
    assert all(m.shape == (big.cells, big.cells) for m in big.matrices.values())
    assert big.cells == -(-big.world_size // big.unit)
    small = compute(Choice(model="gpt3-175b", tp=8, pp=16, dp=32, global_batch=1024))
    assert small.level == "gpu" and small.cells == 256 and small.unit == 16


def test_explorer_keeps_the_last_view_on_a_broken_rule() -> None:
    e = explore(START)
    assert e.error == "" and e.renders == 1 and e.view.choice.tp == 8
    before = {p: e.images[p].value for p in PANELS}
    e.choose(tp=3)
    assert e.error == "llmcomm explore: error: tp=3 does not divide num_attention_heads=32"
    assert "tp=3 does not divide" in e.status.value and "last valid configuration" in e.status.value
    assert e.renders == 1 and e.view.choice.tp == 8
    assert all(e.images[p].value == before[p] for p in PANELS)
    e.choose(tp=16, pp=2)
    assert e.error == "" and e.renders == 2 and e.view.parallel.tp == 16
    changed = [p for p in PANELS if e.images[p].value != before[p]]
    assert changed == list(PANELS)
    e.choose(model_path="")  # the YAML box empty: the catalogue entry is the model
    assert e.choice().model == "gpt3-6.7b"
    with pytest.raises(lc.LLMCommError, match="no control 'nope'"):
        e.choose(nope=1)


def test_every_panel_draws(view) -> None:
    assert set(FIGURES) == set(PANELS)
    for p in PANELS:
        assert render(view, p)[:4] == b"\x89PNG"
        summary_html(view, p)


def test_page_notebook_and_command(tmp_path) -> None:
    nb = json.loads(page_notebook(tmp_path / "p.ipynb", START.replace(tp=16)).read_text())
    src = "".join(nb["cells"][0]["source"])
    assert "explore(" in src and "tp=16" in src and len(nb["cells"]) == 1
    args = build_parser().parse_args(["explore", "--port", "0"])
    assert args.func.__module__ == "llmcomm.explore.cli"
    port = free_port()
    assert 0 < port < 65536
    assert descendants(2**22 + 12345) == []


def test_explore_command_rejects_a_bad_start(capsys) -> None:
    from llmcomm.cli import main

    assert main(["explore", "--model", "no-such-model"]) == 1
    assert "llmcomm explore: error: model 'no-such-model'" in capsys.readouterr().err


def test_matrix_cells_follow_comm_matrix_binning(view) -> None:
    assert view.unit == 1 and view.cells == 32
    assert list(view.matrices) == ["TP logical", "TP ring", "PP logical", "PP ring"]


def test_job_is_cached_but_an_edited_yaml_is_read_again(tmp_path) -> None:
    import os

    import yaml

    from llmcomm.paths import data_dir

    a, b = compute(START), compute(START.replace(rank=3))
    assert a.trace is b.trace and list(b.calls["ranks"])[0] != ""  # same job: no second prediction
    f = tmp_path / "m.yaml"
    doc = yaml.safe_load((data_dir() / "models" / "gpt3-6.7b.yaml").read_text())
    f.write_text(yaml.safe_dump(doc))
    first = compute(START.replace(model=str(f)))
    assert first.model.num_layers == 32
    doc["num_layers"] = 16
    f.write_text(yaml.safe_dump(doc))
    os.utime(f, (first.model.num_layers + 1e9, first.model.num_layers + 1e9))  # a new modification time
    assert compute(START.replace(model=str(f))).model.num_layers == 16


def test_time_panel_shows_the_cost_models_interval(view) -> None:
    """Issue 25: the breakdown with the cost model's interval (llmcomm.overhead.interval)."""
    from llmcomm.explore import panels
    from llmcomm.overhead import interval
    lo, hi = interval.apply(np.array([view.breakdown.total_s]))
    text = panels.summary_html(view, "time")
    assert f"90% interval {lo[0]:.3f}–{hi[0]:.3f} s" in text and lo[0] < view.breakdown.total_s < hi[0]


def test_painter_redraws_in_place_what_a_new_figure_shows(view) -> None:
    import io

    import matplotlib.pyplot as plt
    from PIL import Image

    from llmcomm.explore import panels

    other = compute(START.replace(tp=4, pp=8))  # same GPUs, same parallelisms: both figures are kept
    p = panels.Painter()
    for v in (view, other):
        for name in PANELS:
            assert p.render(v, name)[:4] == b"\x89PNG"
    assert p.reused["matrix"] == 1 and p.reused["layout"] == 1 and p.reused["axes"] == 3
    fresh = panels._screen_matrix(other)
    kept = p.matrix
    assert kept is not None and len(kept.ims) == len(fresh.ims)
    for a, b in zip(kept.ims, fresh.ims, strict=True):
        assert np.array_equal(np.ma.filled(a.get_array(), np.nan), np.ma.filled(b.get_array(), np.nan),
                              equal_nan=True)
        assert (a.norm.vmin, a.norm.vmax) == (b.norm.vmin, b.norm.vmax)
    assert kept.colorbar.ax.get_ylabel() == fresh.colorbar.ax.get_ylabel()
    assert kept.fig.get_suptitle() == fresh.fig.get_suptitle()
    new_layout = panels._screen_layout(other)
    for a, b in zip(p.layout[1].axes, new_layout.axes, strict=True):
        assert [t.get_text() for t in a.texts] == [t.get_text() for t in b.texts]
        assert [q.get_facecolor() for q in a.patches] == [q.get_facecolor() for q in b.patches]
        assert a.get_title() == b.get_title()
    assert p.layout[1].get_suptitle() == new_layout.get_suptitle()
    plt.close(fresh.fig)
    plt.close(new_layout)

    def pixels(png: bytes) -> np.ndarray:
        return np.asarray(Image.open(io.BytesIO(png)))

    # another world, other block size, same panels: the kept matrix figure is reshaped; every kept figure
    # draws the same pixels as a new painter's (given the same subplot parameters)
    wide = compute(START.replace(tp=16, pp=32))  # 512 GPUs in blocks of 2, TP and PP as before
    for name in PANELS:
        again = panels.Painter()
        again.pars = dict(p.pars)
        assert np.array_equal(pixels(p.render(wide, name)), pixels(again.render(wide, name))), name
        again.close()
    assert p.reused["matrix"] == 2 and p.matrix.fits(wide.matrices, unit=2, world_size=512, gpus_per_node=8)
    # as many panels of other parallelisms (TP and DP), back to 4 nodes, then the first view again: the kept
    # figures are retitled, their node lines moved, shown or hidden; the pixels are a new painter's
    dp = compute(START.replace(tp=8, pp=1, dp=4))
    assert list(dp.matrices) == ["TP logical", "TP ring", "DP logical", "DP ring"]
    for v in (dp, wide, view):
        for name in PANELS:
            again = panels.Painter()
            again.pars = dict(p.pars)
            assert np.array_equal(pixels(p.render(v, name)), pixels(again.render(v, name))), (v.choice, name)
            again.close()
    assert p.reused["matrix"] == 5 and len(p.matrices) == 1 and len(p.layouts) == 1
    p.close()


def test_cached_text_canvas_draws_the_pixels_of_a_plain_canvas(view) -> None:
    """llmcomm.explore.canvas: a text drawn again at the same place is replayed from the cache, and every
    panel's pixels equal those of matplotlib's own Agg canvas, first drawing and redrawing."""
    import io

    import matplotlib.pyplot as plt
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from PIL import Image

    from llmcomm.explore import canvas, panels

    cache = canvas.TextCache()
    for name in PANELS:
        fig = panels.FIGURES[name](view)
        fig.text(0.5, 0.5, "$x^2$ and r5\ng1", rotation=30)  # math text is drawn by matplotlib, never cached
        FigureCanvasAgg(fig)
        plain = panels.fast_png(fig)
        cached = [panels.fast_png(fig, cache) for _ in range(2)]
        assert isinstance(fig.canvas, canvas.CachedTextCanvas)

        def pixels(png: bytes) -> np.ndarray:
            return np.asarray(Image.open(io.BytesIO(png)))

        assert all(np.array_equal(pixels(plain), pixels(c)) for c in cached), name
        plt.close(fig)
    assert cache.hits > 0 and cache.misses > 0 and 0 < cache.nbytes <= canvas.MAX_BYTES
    small = canvas.TextCache(max_bytes=2000)
    fig = panels.FIGURES["time"](view)
    panels.fast_png(fig, small)
    assert small.nbytes <= 2000 and small.misses > len(small.calls)  # bounded: the oldest dropped
    plt.close(fig)


def test_canvas_cache_is_used_only_on_the_matplotlib_it_follows(view, monkeypatch) -> None:
    """llmcomm.explore.canvas: on this matplotlib (3.11, the one CI installs) the cache is on; on another one
    (SUPPORTED False) attach keeps matplotlib's own Agg canvas and the panel's PNG is the same."""
    import matplotlib
    import matplotlib.pyplot as plt
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    from llmcomm.explore import canvas, panels

    assert canvas.SUPPORTED == matplotlib.__version__.startswith("3.11.")
    fig = panels.FIGURES["layout"](view)
    FigureCanvasAgg(fig)
    with_cache = panels.fast_png(fig, canvas.TextCache()) if canvas.SUPPORTED else None
    monkeypatch.setattr(canvas, "SUPPORTED", False)
    other = plt.figure()
    FigureCanvasAgg(other)
    assert canvas.attach(other, canvas.TextCache()) is other and type(other.canvas) is FigureCanvasAgg
    plt.close(other)
    fresh = panels.FIGURES["layout"](view)
    FigureCanvasAgg(fresh)
    plain = panels.fast_png(fresh, canvas.TextCache())
    assert type(fresh.canvas) is FigureCanvasAgg
    if with_cache is not None:
        assert plain == with_cache
    plt.close(fig)
    plt.close(fresh)


def test_cached_glyphs_and_sizes_at_new_places_draw_the_pixels_of_a_plain_canvas() -> None:
    """llmcomm.explore.canvas: glyph bitmaps, string layouts and string sizes kept by one figure and reused by
    another at other places (other fractions of a pixel, whole pixels away, rotated, other sizes, without
    antialiasing) give the pixels matplotlib draws itself."""
    import io

    import matplotlib.pyplot as plt
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from PIL import Image

    from llmcomm.explore import canvas, panels

    def figure(shift: float) -> plt.Figure:
        fig = plt.figure(figsize=(4, 3), dpi=80)
        rng = np.random.default_rng(7)
        for i in range(60):
            x, y = rng.uniform(0.05, 0.8, 2)
            fig.text(x + shift, y, ["g1", "r12\ng3", "node 0", "1,024", "TP logical"][i % 5],
                     fontsize=[7, 8, 9][i % 3], rotation=[0, 90, 30][i % 3], antialiased=i % 7 != 0)
        fig.text(0.1 + shift, 0.9, "sender rank (bins of 4)", ha="center", va="top")
        return fig

    def pixels(png: bytes) -> np.ndarray:
        return np.asarray(Image.open(io.BytesIO(png)))

    cache = canvas.TextCache()
    for shift in (0.0, 1 / 320, 0.013, 2.0 / 4 / 80 * 3):  # the same texts a whole pixel or a fraction away
        fig = figure(shift)
        FigureCanvasAgg(fig)
        plain = pixels(panels.fast_png(fig))
        new = plt.figure(figsize=(4, 3), dpi=80)  # a new canvas: only the cache is shared
        for t in fig.texts:
            new.text(*t.get_position(), t.get_text(), fontsize=t.get_fontsize(), rotation=t.get_rotation(),
                     antialiased=t.get_antialiased(), ha=t.get_ha(), va=t.get_va())
        assert np.array_equal(pixels(panels.fast_png(new, cache)), plain), shift
        plt.close(fig)
        plt.close(new)
    assert cache.glyph_hits > 0 and cache.sizes and cache.layouts


@pytest.mark.filterwarnings("ignore:Glyph 9 .* missing from font")  # the tab, measured by FreeType as matplotlib does
def test_string_sizes_from_their_layout_are_freetypes() -> None:
    """llmcomm.explore.canvas: a plain string's size taken from its layout and its glyphs measured alone (the last
    glyph's place plus its advance; the lowest and highest glyph edges) equals RendererAgg's (FreeType's set_text
    of the whole string), kerned pairs, spaces, descenders and non-ASCII characters included; a string the rule
    does not cover (a tab) is measured by FreeType; fonts are looked up once per properties only while drawing."""
    import matplotlib.pyplot as plt
    from matplotlib.backends.backend_agg import RendererAgg
    from matplotlib.font_manager import FontProperties

    from llmcomm.explore import canvas

    if not canvas.SUPPORTED:
        pytest.skip("the text cache follows matplotlib 3.11 only")
    strings = ["AV", "To", "Wa", "AVAVA", "node 12", "r12", "g3", "gypsy", "  a ", "1,024 B", "…·–×µ", "x\ty",
               "sender rank (bins of 4)", "TP groups (size 8)", "-", "'", "_"]
    plain = RendererAgg(400, 300, 80)
    for size in (7, 8, 9.5, 12):
        r = canvas.CachedTextRenderer(400, 300, 80, canvas.TextCache())
        for family in ("sans-serif", "monospace"):
            prop = FontProperties(size=size, family=family)
            for s in strings:
                assert r.get_text_width_height_descent(s, prop, False) == \
                    plain.get_text_width_height_descent(s, prop, False), (size, family, s)
        assert any(v is not None for v in r.text_cache.extents.values())  # taken from the layouts
        # kerning lives in the layout: "AV" is narrower than its two glyphs' advances (DejaVu Sans kerns it)
        prop = FontProperties(size=size)
        a, v, av = (r.get_text_width_height_descent(s, prop, False)[0] for s in ("A", "V", "AV"))
        assert av < a + v
    fig = plt.figure(figsize=(2, 1), dpi=80)
    fig.text(0.1, 0.5, "AV node 12")
    canvas.attach(fig, canvas.TextCache())
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()  # type: ignore[attr-defined]
    assert isinstance(renderer, canvas.CachedTextRenderer) and renderer._fonts is None  # only while drawing
    plt.close(fig)


def test_node_boundaries_as_one_collection_draw_the_pixels_of_the_lines() -> None:
    """llmcomm.plots.MatrixImages(node_lines="collection") (the explorer's screen matrix): the same pixels as
    the node boundaries drawn as lines, new and reshaped to other worlds (more, fewer and no boundaries)."""
    from llmcomm.plots import MatrixImages

    rng = np.random.default_rng(3)

    def images(cells: int) -> dict[str, np.ndarray]:
        return {f"{p} {a}": rng.random((cells, cells)) * (rng.random((cells, cells)) > 0.5)
                for p in ("TP", "PP") for a in ("logical", "ring")}

    def pixels(m: MatrixImages) -> np.ndarray:
        m.fig.canvas.draw()
        return np.asarray(m.fig.canvas.buffer_rgba()).copy()

    cases = [(64, 1, 64, 8), (128, 1, 128, 8), (32, 1, 32, 8), (256, 2, 512, 8), (128, 32, 4096, 8), (8, 1, 8, 8)]
    kept: dict[str, MatrixImages] = {}
    for cells, unit, world, gpn in cases:
        ims = images(cells)
        new = {mode: MatrixImages(ims, unit=unit, world_size=world, gpus_per_node=gpn, size=2.4, node_lines=mode)
               for mode in ("lines", "collection")}
        assert not new["collection"].fig.axes[0].lines
        assert np.array_equal(pixels(new["lines"]), pixels(new["collection"])), (cells, world)
        if not kept:
            kept = new
            continue
        for m in kept.values():  # the lines moved, shown and hidden; the collection's segments replaced
            m.reshape(ims, unit=unit, world_size=world, gpus_per_node=gpn)
        assert np.array_equal(pixels(kept["lines"]), pixels(kept["collection"])), ("reshaped", cells, world)
        for m in new.values():
            plt.close(m.fig)
    for m in kept.values():
        plt.close(m.fig)


def test_kept_matrix_figure_takes_a_colour_range_above_the_old_one() -> None:
    """MatrixImages.update to matrices whose smallest cell is above the old largest: the shared norm takes both
    new limits (a colour bar told of the new vmin alone would swap it with the old vmax), as a new figure has."""
    import matplotlib.pyplot as plt

    from llmcomm.explore import panels
    from llmcomm.plots import MatrixImages

    def images(scale: float) -> dict[str, np.ndarray]:
        m = np.arange(1.0, 17.0).reshape(4, 4) * scale
        return {"TP logical": m, "TP ring": m.T}

    kept = MatrixImages(images(1.0), unit=1, world_size=4, gpus_per_node=4)
    kept.update(images(1e6))
    fresh = MatrixImages(images(1e6), unit=1, world_size=4, gpus_per_node=4)
    assert (kept.ims[0].norm.vmin, kept.ims[0].norm.vmax) == (fresh.ims[0].norm.vmin, fresh.ims[0].norm.vmax)
    assert panels.fast_png(kept.fig) == panels.fast_png(fresh.fig)
    plt.close(kept.fig)
    plt.close(fresh.fig)


def test_collector_waits_during_a_change_and_is_restored() -> None:
    """The cyclic collector is off inside one change, on again after it (also when the change raises), and a
    collector the caller turned off stays off."""
    import gc

    from llmcomm.explore.widget import _collector_paused

    assert gc.isenabled()
    with _collector_paused():
        assert not gc.isenabled()
    assert gc.isenabled()
    with pytest.raises(RuntimeError), _collector_paused():
        raise RuntimeError("a change that fails")
    assert gc.isenabled()
    gc.disable()
    try:
        with _collector_paused():
            assert not gc.isenabled()
        assert not gc.isenabled()
    finally:
        gc.enable()


def test_in_view_minor_ticks_draw_the_pixels_of_the_log_scales_own(view) -> None:
    """The call-sequence panel's minor locator (:class:`panels._InViewMinor`) makes only the minor ticks the
    log axis draws: the same ticks drawn, the same labels, the same pixels, fewer ticks made."""
    from llmcomm.explore import panels

    assert len(view.calls) > 0
    figs = [panels.calls_figure(view, tight=False) for _ in range(2)]
    yaxis = figs[1].axes[0].yaxis
    yaxis.set_minor_locator(panels._InViewMinor(yaxis.get_minor_locator()))
    for f in figs:
        f.subplots_adjust(left=0.1, right=0.8, bottom=0.2, top=0.85)
    pngs = [panels.fast_png(f) for f in figs]
    own, in_view = (f.axes[0].yaxis for f in figs)
    assert pngs[0] == pngs[1]
    drawn = [[(t.get_loc(), t.label1.get_text()) for t in a._update_ticks()] for a in (own, in_view)]
    assert drawn[0] == drawn[1] and len(drawn[0]) > 0
    assert len(in_view.get_minorticklocs()) < len(own.get_minorticklocs())
    for f in figs:
        plt.close(f)


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_explore_command_prints_the_url_it_serves_and_stops_on_sigterm(tmp_path) -> None:
    """``llmcomm explore`` (the command itself, not serve.start_page): one line with the 127.0.0.1 URL, a page that
    answers there without the code cell (Voilà), and SIGTERM ends the server with its kernels."""
    import os
    import re
    import signal
    import subprocess
    import sys
    import time
    import urllib.request

    out = tmp_path / "explore.out"
    with open(out, "wb") as fh:
        proc = subprocess.Popen([sys.executable, "-m", "llmcomm", "explore", "--port", "0"], stdout=fh,
                                stderr=subprocess.STDOUT, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    try:
        deadline = time.monotonic() + 150
        url = None
        while url is None and time.monotonic() < deadline and proc.poll() is None:
            m = re.search(r"serving on (http://127\.0\.0\.1:\d+/)", out.read_text(errors="replace"))
            url = m.group(1) if m else None
            time.sleep(0.5)
        assert url, out.read_text(errors="replace")
        kids = descendants(proc.pid)
        with urllib.request.urlopen(url, timeout=60) as r:  # noqa: S310 (our own 127.0.0.1 server)
            page = r.read().decode("utf-8", "replace")
            assert r.status == 200
        assert "from llmcomm.explore import" not in page  # Voilà shows no code
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            proc.kill()
            raise
    assert proc.returncode is not None
    time.sleep(1)
    assert not [p for p in kids if os.path.exists(f"/proc/{p}") and
                open(f"/proc/{p}/stat").read().rsplit(")", 1)[1].split()[0] != "Z"], "a server process outlived it"
