"""The recorder: every collective and point-to-point call a process issues, as rows of the events table.

Every ``c10d`` op (what ``torch.distributed.all_reduce``, ``isend``/``irecv``, DDP's C++ reducer,
FSDP2/``replicate`` and ``torch.distributed.pipelining`` issue) and every ``_c10d_functional`` op (what
DTensor / tensor parallelism and ``all_to_all_single_autograd`` issue, forward and backward) passes through
the dispatcher, with its tensors and its process group. A :class:`Recorder` intercepts them in one of two
modes (``Recorder(mode=...)``, ``record(mode=...)``, ``llmcomm collect --recorder-mode``):

* ``"kernel"`` (default): while a recorder is entered, a Python kernel is registered (``torch.library``)
  for each of these ops only, at the ``BackendSelect`` dispatch key, and removed on exit. That key is in
  every call's key set (a thread-local default), below Autograd, ADInplaceOrView and Python and above the
  backend kernels; other ops keep what they have there (a fallthrough, or torch's own kernel for factory
  functions), so the model's other aten ops pay nothing; each communication call pays one Python call,
  then is redispatched below ``BackendSelect`` to torch's kernel.
  The registration is process-wide (all threads).
* ``"dispatch"``: the recorder is a ``TorchDispatchMode`` (thread-local, propagated to autograd threads);
  every aten op of the process pays a Python round trip (~8 µs), communication or not.

Both record exactly the same rows on every curated run (``llmcomm.collect.curated``) and in
``tests/test_collect_record_modes.py``; in neither is a communication op issued while another one runs (a
functional collective's inner ``c10d`` op) recorded. One difference: a ``TorchDispatchMode`` is switched off
while it handles an op, so the ``dispatch`` mode does not see the collectives DTensor issues inside its own
dispatch of an aten op (an implicit redistribution, e.g. AdamW's ops on the Partial LayerNorm gradients of
TP+SP without DP); the ``kernel`` mode sees them (see WHAT_TORCH_ISSUES.md).
Calls torch makes outside the dispatcher (a
backend talking to itself, e.g. gloo's own rendezvous, the TCPStore) are not communication calls of the job
and are not seen.

Sizes follow nccl-tests (see ARCHITECTURE.md), ``S`` = elements × element size of the tensor named:

==================================  =========  ============================================================
dispatcher op                       ``op``     ``bytes``
==================================  =========  ============================================================
allreduce_, all_reduce(_)            all_reduce  S(buffer) (summed over a coalesced list)
allgather_, _allgather_base_,        all_gather  S(gathered output) = n · S(input)
all_gather_into_tensor(_out)
reduce_scatter_, _reduce_scatter_    reduce_scatter  S(input before scattering) = n · S(output)
base_, reduce_scatter_tensor(_out)
alltoall_base_, alltoall_,           all_to_all  S(input) = Σ_j split_bytes[j]
all_to_all_single
broadcast_, broadcast(_)             broadcast  S(buffer); ``peer`` = the root's global rank
send / recv_ (and isend / irecv)     send/recv  S(tensor); ``peer`` = the partner's global rank
==================================  =========  ============================================================

Timing: ``t_start_ns`` is ``time.time_ns()`` when the call is issued (one clock for all ranks of a host).
``t_end_ns`` is when the collective completed (the Work's future for ``c10d`` collectives; ``wait_tensor``
for functional ones, matched to its collective by the output's storage, since it is often called on a
view). gloo's send/recv Work has no future, so for send/recv ``t_end_ns`` is when the call returned to the
caller (the transfer itself is asynchronous).

Context: ``iteration``, ``microbatch``, ``layer`` and ``phase`` come from the recorder's current context,
set by the training loop (``rec.step(i)``, ``rec.microbatch(k)``, ``rec.phase("forward")``,
``rec.layer(l)``; each may be used as a plain call, which sets the value, or as a ``with`` block, which
restores the previous value on exit). Calls issued from inside torch's setup helpers (shape exchange of
``pipelining``, ``send_object_list``, DDP's parameter verification and initial broadcast) get
``phase="setup"`` whatever the context says.

``parallelism``: the tag registered for the call's group ranks (``register_mesh`` tags each mesh dimension
with its name); an ``all_to_all`` on a group registered as ``ep`` is ``ep``; with sequence parallelism on,
all-gathers and reduce-scatters of the TP group are ``sp``; groups not registered are ``other``.
"""

from __future__ import annotations

import contextlib
import sys
import threading
import time
import types
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any, NamedTuple

import pandas as pd
import torch
import torch.distributed as dist
from torch.utils._python_dispatch import TorchDispatchMode

from ..errors import ConfigError
from ..vocab import EVENT_COLUMNS, ROUTING_COLUMNS, TIME_COLUMNS, TORCH_DTYPE_NAMES

_SETUP_FRAMES = frozenset({
    "_send_meta", "_recv_meta", "_shape_inference", "send_object_list", "recv_object_list",
    "broadcast_object_list", "all_gather_object", "_verify_param_shape_across_processes",
    "_sync_module_states", "_sync_params_and_buffers", "_broadcast_coalesced",
    "_warmup_forward_vote", "_warmup_backward_result", "_forward_metadata_inference",
    "_backward_metadata_inference",
})
_DTYPE_NAMES = {getattr(torch, name): short for name, short in TORCH_DTYPE_NAMES.items()}

_C10D_OPS = {
    "allreduce_": "all_reduce", "allreduce_coalesced_": "all_reduce",
    "allgather_": "all_gather", "_allgather_base_": "all_gather", "allgather_coalesced_": "all_gather",
    "allgather_into_tensor_coalesced_": "all_gather",
    "reduce_scatter_": "reduce_scatter", "_reduce_scatter_base_": "reduce_scatter",
    "reduce_scatter_tensor_coalesced_": "reduce_scatter",
    "alltoall_base_": "all_to_all", "alltoall_": "all_to_all",
    "broadcast_": "broadcast", "send": "send", "recv_": "recv",
}
_FUNC_OPS = {
    "all_reduce": "all_reduce", "all_reduce_": "all_reduce", "all_reduce_coalesced": "all_reduce",
    "all_reduce_coalesced_": "all_reduce",
    "all_gather_into_tensor": "all_gather", "all_gather_into_tensor_out": "all_gather",
    "all_gather_into_tensor_coalesced": "all_gather",
    "reduce_scatter_tensor": "reduce_scatter", "reduce_scatter_tensor_out": "reduce_scatter",
    "reduce_scatter_tensor_coalesced": "reduce_scatter",
    "all_to_all_single": "all_to_all", "broadcast": "broadcast", "broadcast_": "broadcast",
    "isend": "send", "irecv": "recv",
}


def _comm_ops() -> frozenset[Any]:
    """Every overload of the dispatcher ops the recorder looks at (a set: one hash per dispatched op)."""
    out = set()
    for ns, names in (("c10d", (*_C10D_OPS, "barrier", "gather_", "scatter_", "reduce_", "monitored_barrier_",
                                 "recv_any_source_")),
                      ("_c10d_functional", (*_FUNC_OPS, "wait_tensor", "batch_p2p_ops"))):
        mod = getattr(torch.ops, ns)
        for name in names:
            try:
                packet = getattr(mod, name)
            except (AttributeError, RuntimeError):
                continue
            for ov in packet.overloads():
                out.add(getattr(packet, ov))
    return frozenset(out)


_COMM_OPS = _comm_ops()

MODES = ("kernel", "dispatch")
DEFAULT_MODE = "kernel"

# -- "kernel" mode: Python kernels for the communication ops only, at the BackendSelect key ----------------
# BackendSelect is in every call's dispatch key set (TLS default include) and sits below Autograd,
# ADInplaceOrView and Python and above every backend kernel; registering here leaves every other op as it
# was, so they pay nothing. A kernel there sees each c10d / _c10d_functional call whoever issues it (plain ``dist.*``,
# DDP's C++ reducer, FSDP2, pipelining, DTensor, the autograd backward of functional collectives, calls made
# under ``AutoDispatchBelowAutograd`` or inference mode), records it and redispatches below BackendSelect.
_BELOW_BACKEND_SELECT = torch._C._dispatch_keyset_full_after(torch._C.DispatchKey.BackendSelect)
_KERNEL_RECORDERS: list[Recorder] = []
_KERNEL_LIBS: list[Any] = []


def _make_kernel(func: Any) -> Any:
    redispatch = func._handle.redispatch_boxed  # what OpOverload.redispatch calls, one frame less

    def kernel(keyset: Any, *args: Any, **kwargs: Any) -> Any:
        ks = keyset & _BELOW_BACKEND_SELECT

        def call(*a: Any, **k: Any) -> Any:
            return redispatch(ks, *a, **k)

        if len(_KERNEL_RECORDERS) == 1:
            return _KERNEL_RECORDERS[0]._intercept(func, call, args, kwargs)
        for rec in _KERNEL_RECORDERS:  # the outermost recorder runs the op, the innermost records first
            call = _chain(rec, func, call)
        return call(*args, **kwargs)

    return kernel


def _chain(rec: Recorder, func: Any, inner: Any) -> Any:
    return lambda *a, **k: rec._intercept(func, inner, a, k)


def _kernels_push(rec: Recorder) -> None:
    if not _KERNEL_LIBS:
        libs: dict[str, Any] = {}
        for func in sorted(_COMM_OPS, key=str):
            ns = func.namespace
            if ns not in libs:
                libs[ns] = torch.library.Library(ns, "IMPL")
            libs[ns].impl(func, _make_kernel(func), "BackendSelect", with_keyset=True)
        _KERNEL_LIBS.extend(libs.values())
    _KERNEL_RECORDERS.append(rec)


def _kernels_pop(rec: Recorder) -> None:
    _KERNEL_RECORDERS.remove(rec)
    if not _KERNEL_RECORDERS:
        for lib in _KERNEL_LIBS:
            lib._destroy()
        _KERNEL_LIBS.clear()


def dtype_name(dt: torch.dtype) -> str:
    """``torch.bfloat16`` -> ``"bf16"``; non-float dtypes keep torch's name (``"int64"``)."""
    return _DTYPE_NAMES.get(dt, str(dt).removeprefix("torch."))


def nbytes(t: torch.Tensor) -> int:
    """``numel · element_size`` of a tensor (its local shard for a DTensor)."""
    return int(t.numel()) * int(t.element_size())


def _flat_tensors(x: Any) -> list[torch.Tensor]:
    if isinstance(x, torch.Tensor):
        return [x]
    if isinstance(x, (list, tuple)):
        out: list[torch.Tensor] = []
        for y in x:
            out += _flat_tensors(y)
        return out
    return []


def _in_setup_helper(max_depth: int = 120) -> bool:
    f: types.FrameType | None = sys._getframe(2)
    for _ in range(max_depth):
        if f is None:
            return False
        if f.f_code.co_name in _SETUP_FRAMES:
            return True
        f = f.f_back
    return False


class _Setter:
    """Sets one context field now; as a ``with`` block restores the previous value on exit."""

    def __init__(self, rec: Recorder, name: str, value: Any) -> None:
        self._rec, self._name = rec, name
        self._prev = getattr(rec, "_" + name)
        setattr(rec, "_" + name, value)

    def __enter__(self) -> _Setter:
        return self

    def __exit__(self, *exc: object) -> None:
        setattr(self._rec, "_" + self._name, self._prev)


class Recorder(TorchDispatchMode):
    """Records communication calls of this process (see the module docstring)."""

    def __init__(self, rank: int | None = None, *, record_iters: int | None = None, sp: bool = False,
                 group_tags: dict[tuple[int, ...], str] | None = None, mode: str = DEFAULT_MODE) -> None:
        super().__init__()
        if mode not in MODES:
            raise ConfigError(f"recorder mode {mode!r}: expected one of {MODES}")
        self.mode = mode
        self.rank = rank if rank is not None else (dist.get_rank() if dist.is_initialized() else 0)
        self.record_iters = record_iters
        self.sp = sp
        self.group_tags: dict[tuple[int, ...], str] = {}
        self.ep_groups: set[tuple[int, ...]] = set()
        for g, t in (group_tags or {}).items():
            self.tag_group(g, t)
        self.rows: list[dict[str, Any]] = []
        self.routing_rows: list[tuple[int, int, int, int, int, int]] = []
        self.skipped: dict[str, int] = {}
        self._iteration, self._microbatch, self._layer, self._phase = 0, -1, -1, "setup"
        self._enabled = True
        self._pending: dict[int, dict[str, Any]] = {}
        self._lock = threading.Lock()
        self._local = threading.local()  # .busy: inside a recorded op (its inner ops are not recorded)
        self._group_cache: dict[Any, tuple[int, ...]] = {}
        # id(tensor) -> (microbatch, phase) for p2p tensors labelled by the pipeline instrumentation
        self.p2p_context: dict[int, tuple[int, str]] = {}

    # -- context API -----------------------------------------------------------------------------
    def step(self, iteration: int) -> _Setter:
        """Start iteration ``iteration`` (events are kept while ``iteration < record_iters``)."""
        self._enabled = self.record_iters is None or iteration < self.record_iters
        return _Setter(self, "iteration", int(iteration))

    def phase(self, name: str) -> _Setter:
        return _Setter(self, "phase", name)

    def microbatch(self, k: int) -> _Setter:
        return _Setter(self, "microbatch", int(k))

    def layer(self, layer: int) -> _Setter:
        return _Setter(self, "layer", int(layer))

    @property
    def iteration(self) -> int:
        return self._iteration

    @property
    def current_microbatch(self) -> int:
        return self._microbatch

    # -- groups ----------------------------------------------------------------------------------
    def tag_group(self, ranks: Sequence[int], tag: str) -> None:
        """Calls on the group with these global ranks get ``parallelism=tag``. An ``ep`` tag applies to the
        group's all_to_all calls only, so a group that is both the EP and the DP group keeps both tags."""
        key = tuple(int(r) for r in ranks)
        if tag == "ep":
            self.ep_groups.add(key)
        else:
            self.group_tags[key] = tag

    def register_mesh(self, mesh: Any, names: Sequence[str] = ()) -> None:
        """Tag the group of each named dimension of a DeviceMesh (and of the flattened dimensions in
        ``names``, e.g. ``"dp"``) with the dimension's name; ``edp`` counts as ``dp``."""
        for name in (*(mesh.mesh_dim_names or ()), *names):
            sub = mesh[name]
            if sub.size() > 1:
                ranks = dist.get_process_group_ranks(sub.get_group())
                self.tag_group(ranks, "dp" if name in ("edp", "dp_shard") else name)

    def _ranks_of(self, pg: Any) -> tuple[int, ...]:
        if isinstance(pg, torch.ScriptObject):  # a fresh wrapper per call: key the cache by group name
            pg = torch._C._distributed_c10d.ProcessGroup.unbox(pg)
        key = pg if isinstance(pg, str) else pg.group_name
        hit = self._group_cache.get(key)
        if hit is not None:
            return hit
        if isinstance(pg, str):
            from torch.distributed.distributed_c10d import _resolve_process_group

            pg = _resolve_process_group(pg)  # type: ignore[arg-type]  # a group name, as torch passes it
        ranks = tuple(int(r) for r in dist.get_process_group_ranks(pg))
        self._group_cache[key] = ranks
        return ranks

    def _tag(self, op: str, group: tuple[int, ...]) -> str:
        if op == "all_to_all" and group in self.ep_groups:
            return "ep"
        tag = self.group_tags.get(group, "other")
        if tag == "tp" and self.sp and op in ("all_gather", "reduce_scatter"):
            return "sp"
        return tag

    # -- routing ---------------------------------------------------------------------------------
    def routing(self, layer: int, counts: Sequence[int]) -> None:
        """Tokens this rank routed to each expert in MoE layer ``layer`` (recorded for every iteration)."""
        it, mb = self._iteration, self._microbatch
        for e, c in enumerate(counts):
            self.routing_rows.append((it, mb, int(layer), self.rank, e, int(c)))

    # -- interception ----------------------------------------------------------------------------
    def __enter__(self) -> Recorder:
        if self.mode == "dispatch":
            super().__enter__()
        else:
            _kernels_push(self)
        return self

    def __exit__(self, *exc: object) -> None:
        if self.mode == "dispatch":
            super().__exit__(*exc)
        else:
            _kernels_pop(self)

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        if func not in _COMM_OPS or not self._enabled:  # the fast path every other aten op takes
            return func(*args, **kwargs) if kwargs else func(*args)
        return self._intercept(func, func, args, kwargs or {})

    def _intercept(self, func: Any, call: Any, args: tuple, kwargs: dict) -> Any:
        """Record one communication op ``func`` (``call`` runs it) and return its result. Ops that run inside
        it (a functional collective's ``c10d`` op) are not recorded: the dispatch mode is off while it
        handles an op, and the kernel mode does the same."""
        local = self._local
        if not self._enabled or getattr(local, "busy", False):
            return call(*args, **kwargs)
        local.busy = True
        try:
            return self._record(func, call, args, kwargs)
        finally:
            local.busy = False

    def _record(self, func: Any, call: Any, args: tuple, kwargs: dict) -> Any:
        ns = func.namespace
        name = func._opname
        if ns == "_c10d_functional" and name == "wait_tensor":
            out = call(*args, **kwargs)
            row = self._pending.pop(_storage_key(args[0]), None)
            if row is not None:
                row["t_end_ns"] = time.time_ns()
            return out
        op = (_C10D_OPS if ns == "c10d" else _FUNC_OPS).get(name)
        if op is None:
            self.skipped[f"{ns}.{name}"] = self.skipped.get(f"{ns}.{name}", 0) + 1
            return call(*args, **kwargs)
        t0 = time.time_ns()
        row = self._describe(ns, name, op, args, kwargs)
        out = call(*args, **kwargs)
        row["t_start_ns"] = t0
        if ns == "c10d":
            self._attach_end(row, out)
        elif isinstance(out, torch.Tensor):
            self._pending[_storage_key(out)] = row
        else:
            row["t_end_ns"] = time.time_ns()
        self.rows.append(row)
        return out

    def _attach_end(self, row: dict[str, Any], out: Any) -> None:
        work = out[-1] if isinstance(out, tuple) else out
        try:
            w = torch._C._distributed_c10d.Work.unbox(work)
            fut = w.get_future()
        except (RuntimeError, AttributeError, TypeError):
            row["t_end_ns"] = time.time_ns()
            return

        def done(_: Any) -> None:
            row["t_end_ns"] = time.time_ns()

        fut.add_done_callback(done)

    def _describe(self, ns: str, name: str, op: str, args: tuple, kwargs: dict) -> dict[str, Any]:
        """The events-table row of one call (times are filled in by the caller)."""
        if ns == "c10d":
            group = self._ranks_of(next(a for a in args if isinstance(a, torch.ScriptObject)))
            call = _c10d_call(name, args, group)
        else:
            group_name = kwargs.get("group_name", args[-1] if name not in ("isend", "irecv") else args[3])
            group = self._ranks_of(group_name)
            call = _functional_call(op, args, group)
        phase, mb = ("setup" if _in_setup_helper() else self._phase), self._microbatch
        if op in ("send", "recv") and call.tensors and phase != "setup":
            mb, phase = self.p2p_context.pop(id(call.tensors[0]), (mb, phase))
        return {
            "rank": self.rank, "iteration": self._iteration, "microbatch": mb,
            "layer": self._layer, "phase": phase, "parallelism": self._tag(op, group), "op": op,
            "group": list(group), "peer": call.peer, "bytes": int(call.size),
            "dtype": dtype_name(call.tensors[0].dtype) if call.tensors else "", "split_bytes": call.split,
            "t_start_ns": None, "t_end_ns": None,
        }

    # -- output ----------------------------------------------------------------------------------
    def events(self) -> pd.DataFrame:
        """The recorded calls as an events DataFrame (``source="recorded"``)."""
        df = pd.DataFrame.from_records(self.rows, columns=list(EVENT_COLUMNS[:EVENT_COLUMNS.index("source")]))
        df["source"] = "recorded"
        df["count"] = 1
        for c in TIME_COLUMNS:
            df[c] = df[c].astype("Int64")
        return df

    def routing_table(self) -> pd.DataFrame | None:
        if not self.routing_rows:
            return None
        return pd.DataFrame(self.routing_rows, columns=list(ROUTING_COLUMNS))

    def write(self, out_dir: str | Path) -> Path:
        """Write ``rank{r}.parquet`` (events) and ``rank{r}.routing.parquet`` (if any) under ``out_dir``."""
        from ..trace import Trace

        out = Path(out_dir) / f"rank{self.rank}.parquet"
        meta = {"rank": self.rank, "skipped_ops": dict(self.skipped)}
        return Trace.from_events(self.events(), meta, self.routing_table()).write(out)


class _CallSize(NamedTuple):
    """What a call moves: its tensors, ``bytes`` (nccl-tests convention), peer and all-to-all splits."""

    tensors: list[torch.Tensor]
    size: int
    peer: int = -1
    split: list[int] | None = None


def _c10d_call(name: str, args: tuple, group: tuple[int, ...]) -> _CallSize:
    """Size of a ``c10d`` op from its arguments (the module docstring's table)."""
    n = len(group)
    if name in ("allreduce_", "allreduce_coalesced_", "broadcast_"):
        ts = _flat_tensors(args[0])
        return _CallSize(ts, _total_bytes(ts), group[int(args[2])] if name == "broadcast_" else -1)
    if name in ("allgather_", "allgather_coalesced_", "allgather_into_tensor_coalesced_"):
        ts = _flat_tensors(args[1])
        return _CallSize(ts, n * _total_bytes(ts))
    if name == "_allgather_base_":
        return _CallSize([args[0]], nbytes(args[0]))
    if name == "reduce_scatter_":
        ts = _flat_tensors(args[0])
        return _CallSize(ts, n * _total_bytes(ts))
    if name in ("_reduce_scatter_base_", "reduce_scatter_tensor_coalesced_"):
        ts = _flat_tensors(args[1])
        return _CallSize(ts, _total_bytes(ts))
    if name == "alltoall_base_":
        return _CallSize([args[1]], nbytes(args[1]), split=_split_bytes(args[1], list(args[4]), n))
    if name == "alltoall_":
        ts = _flat_tensors(args[1])
        split = [nbytes(t) for t in ts]
        return _CallSize(ts, sum(split), split=split)
    ts = _flat_tensors(args[0])  # send / recv_
    return _CallSize(ts, _total_bytes(ts), group[int(args[2])])


def _functional_call(op: str, args: tuple, group: tuple[int, ...]) -> _CallSize:
    """Size of a ``_c10d_functional`` op: its first argument, gathered for all_gather."""
    n = len(group)
    ts = _flat_tensors(args[0])
    size = _total_bytes(ts)
    if op == "all_gather":
        return _CallSize(ts, size * n)
    if op == "all_to_all":
        return _CallSize(ts, size, split=_split_bytes(args[0], list(args[2]), n))
    if op == "broadcast":
        return _CallSize(ts, size, int(args[1]))
    if op in ("send", "recv"):
        return _CallSize(ts, size, group[int(args[1])])
    return _CallSize(ts, size)


def _total_bytes(tensors: Sequence[torch.Tensor]) -> int:
    return sum(nbytes(t) for t in tensors)


def _storage_key(t: Any) -> int:
    """Key of a functional collective's pending output: its storage (as torch's own work registry keys it).
    ``wait_tensor`` is often called on a view of the output, not the output itself (an
    ``AsyncCollectiveTensor`` re-wraps the result of a view op, e.g. Megatron-style reshapes after a
    row-parallel linear), so the tensor's ``id`` would miss it; the storage is shared by every view."""
    t = getattr(t, "elem", t)  # an AsyncCollectiveTensor handed over unwrapped
    return int(t.untyped_storage()._cdata)


def _split_bytes(inp: torch.Tensor, input_split_sizes: list[int], n: int) -> list[int]:
    """Per-destination bytes of an ``all_to_all_single``: rows × (bytes per row along dim 0);
    an empty split list means an even split."""
    rows = int(inp.shape[0]) if inp.dim() else 1
    row_bytes = nbytes(inp) // rows if rows else 0
    sizes = [int(s) for s in input_split_sizes] if input_split_sizes else [rows // n] * n
    return [s * row_bytes for s in sizes]


@contextlib.contextmanager
def record(out_dir: str | Path | None = None, *, rank: int | None = None, mesh: Any = None,
           record_iters: int | None = None, sp: bool = False,
           group_tags: dict[tuple[int, ...], str] | None = None,
           mode: str = DEFAULT_MODE) -> Iterator[Recorder]:
    """Record every communication call inside the block; on a clean exit write this rank's events to
    ``out_dir/rank{r}.parquet`` (when ``out_dir`` is given).

    ``mesh``: a DeviceMesh whose dimension names tag the groups (``tp``, ``dp``, ``pp``, ``ep``...).
    ``record_iters``: keep events only for iterations ``< record_iters`` (routing counts are always kept).
    ``mode``: how calls are intercepted, ``"kernel"`` (default) or ``"dispatch"`` (module docstring).
    """
    rec = Recorder(rank, record_iters=record_iters, sp=sp, group_tags=group_tags, mode=mode)
    if mesh is not None:
        rec.register_mesh(mesh)
    _ACTIVE.append(rec)
    try:
        with rec:
            yield rec
    finally:
        _ACTIVE.remove(rec)
    if out_dir is not None:
        rec.write(out_dir)


# -- module-level context API: ``llmcomm.record.step(i)`` acts on the innermost active recorder --------
_ACTIVE: list[Recorder] = []


def active() -> Recorder | None:
    """The innermost recorder of an open ``record(...)`` block, or None."""
    return _ACTIVE[-1] if _ACTIVE else None


def _delegate(name: str) -> Any:
    def call(value: Any) -> Any:
        rec = active()
        return getattr(rec, name)(value) if rec is not None else contextlib.nullcontext()

    call.__name__ = name
    call.__doc__ = (f"``Recorder.{name}`` on the active recorder (a no-op outside a ``record`` block, so a "
                    "training loop runs unchanged without recording).")
    return call


step = _delegate("step")
phase = _delegate("phase")
microbatch = _delegate("microbatch")
layer = _delegate("layer")
for _f in (step, phase, microbatch, layer, active):
    setattr(record, _f.__name__, _f)
