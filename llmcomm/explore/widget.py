"""The explorer as ipywidgets: controls on the left, the five panels of :mod:`.panels` on the right.

Every change of a control recomputes the :class:`~llmcomm.explore.view.View` (:func:`.view.compute`). A choice
that breaks a rule shows the package's :class:`~llmcomm.errors.ConfigError` as the CLI prints it
(``llmcomm explore: error: ...``) and keeps the panels of the last valid choice. The DOM carries stable CSS
classes (``llmcomm-control-tp``, ``llmcomm-status``, ``llmcomm-panel-matrix``...) so that a browser test can
find each part.
"""

from __future__ import annotations

import gc
import html
import time
from dataclasses import fields
from typing import Any

import ipywidgets as w

from ..errors import LLMCommError
from ..specs import list_clusters, list_models
from . import panels
from .view import Choice, View, compute

INT_CONTROLS = ("tp", "pp", "dp", "cp", "ep", "vpp", "micro_batch", "global_batch", "rank", "microbatch")
LABELS = {"tp": "TP", "pp": "PP", "dp": "DP", "cp": "CP", "ep": "EP", "vpp": "VPP (chunks)",
          "micro_batch": "micro-batch", "global_batch": "global batch", "rank": "rank shown",
          "microbatch": "micro-batch shown", "sp": "sequence parallel (SP)", "model": "model",
          "model_path": "or a YAML", "cluster": "cluster"}
CSS = """<style>
.llmcomm-explorer .llmcomm-table {font-size: 11px; border-collapse: collapse}
.llmcomm-explorer .llmcomm-table td, .llmcomm-explorer .llmcomm-table th {padding: 1px 6px; text-align: right}
.llmcomm-explorer .llmcomm-ok {color: #1b5e20}
.llmcomm-explorer .llmcomm-error {color: #b71c1c; font-weight: bold}
.llmcomm-explorer .llmcomm-panel {border-top: 1px solid #ccc; margin-top: 4px}
</style>"""


class Explorer:
    """``Explorer(choice)``; ``display(Explorer())`` (or the bare object as a cell's last line) shows it.

    ``choose(**fields)`` sets controls from code (a test, a notebook exercise); ``view`` is the last valid
    :class:`View`, ``error`` the last rule broken (empty when the current choice is valid)."""

    def __init__(self, choice: Choice | None = None) -> None:
        choice = choice or Choice()
        self.view: View | None = None
        self.error = ""
        self.renders = 0
        self.painter = panels.Painter()
        st = {"description_width": "110px"}
        lay = w.Layout(width="260px")
        models = list_models()
        self.controls: dict[str, w.ValueWidget] = {
            "model": w.Dropdown(options=models, value=choice.model if choice.model in models else models[0],
                                description=LABELS["model"], style=st, layout=lay),
            "model_path": w.Text(value="" if choice.model in models else choice.model,
                                 placeholder="path/to/model.yaml", description=LABELS["model_path"],
                                 continuous_update=False, style=st, layout=lay),
            "cluster": w.Dropdown(options=list_clusters(), value=choice.cluster, description=LABELS["cluster"],
                                  style=st, layout=lay),
        }
        for f in INT_CONTROLS:
            self.controls[f] = w.IntText(value=getattr(choice, f), description=LABELS[f], style=st, layout=lay,
                                         continuous_update=False)
        self.controls["sp"] = w.Checkbox(value=choice.sp, description=LABELS["sp"], indent=False)
        for name, c in self.controls.items():
            c.add_class(f"llmcomm-control-{name}")
        self.status = w.HTML().add_class("llmcomm-status")
        natural = {"width": "auto", "height": "auto", "max_width": "100%"}  # a figure at its own size
        self.images = {p: w.Image(format="png", layout=w.Layout(**natural)).add_class("llmcomm-figure")
                       for p in panels.PANELS}
        self.tables = {p: w.HTML() for p in panels.PANELS}
        box = {p: w.VBox([w.HTML(f"<b>{panels.PANEL_TITLES[p]}</b>"), self.images[p], self.tables[p]],
                         layout=w.Layout(align_items="flex-start", margin="0 12px 0 0"))
               .add_class("llmcomm-panel").add_class(f"llmcomm-panel-{p}") for p in panels.PANELS}
        rows = [w.HBox([box[p] for p in row], layout=w.Layout(flex_flow="row wrap", align_items="flex-start"))
                for row in panels.ROWS]
        left = w.VBox([w.HTML("<b>Model and cluster</b>"), *(self.controls[k] for k in ("model", "model_path",
                       "cluster")), w.HTML("<b>Parallel configuration</b>"),
                       *(self.controls[k] for k in ("tp", "pp", "dp", "cp", "ep", "vpp", "sp")),
                       w.HTML("<b>Batch</b>"), self.controls["micro_batch"], self.controls["global_batch"],
                       w.HTML("<b>Call sequence</b>"), self.controls["rank"], self.controls["microbatch"]],
                      layout=w.Layout(min_width="270px"))
        right = w.VBox([self.status, *rows], layout=w.Layout(flex="1"))
        self.widget = w.VBox([w.HTML(CSS), w.HBox([left, right])]).add_class("llmcomm-explorer")
        for c in self.controls.values():
            c.observe(self._changed, names="value")
        self.update()
        _freeze_startup()

    # -- state --------------------------------------------------------------------------------------
    def choice(self) -> Choice:
        """The :class:`Choice` the controls hold now (the YAML path wins over the catalogue entry)."""
        v = {k: c.value for k, c in self.controls.items()}
        model = v.pop("model_path").strip() or v["model"]
        return Choice(**{f.name: v[f.name] for f in fields(Choice) if f.name != "model"}, model=model)

    def choose(self, **values: Any) -> None:
        """Set controls (``tp=16``, ``model="llama3-8b"``) and recompute once."""
        unknown = set(values) - set(self.controls)
        if unknown:
            raise LLMCommError(f"choose: no control {sorted(unknown)[0]!r}; controls: {', '.join(self.controls)}")
        for c in self.controls.values():
            c.unobserve(self._changed, names="value")
        try:
            for k, val in values.items():
                self.controls[k].value = val
        finally:
            for c in self.controls.values():
                c.observe(self._changed, names="value")
        self.update()

    def _changed(self, _change: dict[str, Any]) -> None:
        self.update()

    # -- recompute ----------------------------------------------------------------------------------
    def update(self) -> bool:
        """Recompute for the controls' choice; on a broken rule keep the last view. Returns validity."""
        t0 = time.perf_counter()
        choice = self.choice()
        try:
            view = compute(choice)
            tables = {p: panels.summary_html(view, p) for p in panels.PANELS}
        except LLMCommError as e:
            self.error = f"llmcomm explore: error: {e}"
        except Exception as e:  # an unexpected failure is shown, never a dead widget
            self.error = f"llmcomm explore: unexpected error: {type(e).__name__}: {e}"
        else:
            self.error = ""
            computed = time.perf_counter() - t0
            self.status.value = f"<span class='llmcomm-busy'>{html.escape(choice.label())}: drawing…</span>"
            for p in panels.PANELS:  # each panel appears as soon as it is drawn
                self.images[p].value = self.painter.render(view, p)
                self.tables[p].value = tables[p]
            self.view = view
            self.renders += 1
            self._show_status(choice, computed, time.perf_counter() - t0)
            return True
        self._show_status(choice, 0.0, time.perf_counter() - t0)
        return False

    def _show_status(self, choice: Choice, computed: float, seconds: float) -> None:

        if self.error:
            kept = (f" — showing the last valid configuration, {html.escape(self.view.choice.label())}"
                    if self.view is not None else "")
            self.status.value = f"<span class='llmcomm-error'>{html.escape(self.error)}</span>{kept}"
        else:
            v = self.view
            assert v is not None
            self.status.value = (
                f"<span class='llmcomm-ok'>{html.escape(choice.label())}: {v.world_size:,} GPUs on "
                f"{v.num_nodes:,} node(s) of {v.cluster.gpus_per_node}, {v.parallel.num_microbatches} "
                f"micro-batches; computed in {computed:.2f} s, drawn in {seconds - computed:.2f} s</span> "
                f"<span class='llmcomm-render' data-render='{self.renders}'>(view {self.renders})</span>")

    def _repr_mimebundle_(self, **kw: Any) -> Any:
        return self.widget._repr_mimebundle_(**kw)


_frozen = False


def _freeze_startup() -> None:
    """Once per process, when the first explorer has drawn its first view: collect, then move every object alive
    (the imported modules of numpy, pandas, matplotlib, ipywidgets... and the first view, about 190 k objects)
    out of the cyclic garbage collector's reach (:func:`gc.freeze`). A full collection then scans only what was
    made since (about 0.1 s less each; one comes every few redraws and lands in one of them). The cost: the
    cycles among the first view's objects, if it is ever dropped, are not collected (a few MB, once)."""
    global _frozen
    if not _frozen:
        gc.collect()
        gc.freeze()
        _frozen = True


def explore(choice: Choice | None = None, **values: Any) -> Explorer:
    """An :class:`Explorer` starting from ``choice`` with ``values`` (Choice fields) replaced."""
    return Explorer((choice or Choice()).replace(**values))
