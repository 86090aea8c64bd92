"""Many :class:`~llmcomm.specs.ParallelConfig` s as one struct-of-arrays table: one numpy array per field.

The one mapping between a table of configurations (a DataFrame whose columns are named as ``ParallelConfig``
fields, as the tuner's space and a user's candidate list are) and ``ParallelConfig``: columns a frame lacks take
``ParallelConfig``'s own defaults (or ``fixed=``), ``global_batch`` missing or NaN means ``micro_batch · dp`` and
``seq_len`` missing means the model's ``seq_length``, as in ``ParallelConfig``. The vectorized cost model
(:mod:`llmcomm.overhead.iteration`), the memory model, the tuner and the validity rules (:mod:`llmcomm.rules`)
read it; :meth:`ParallelTable.row` gives row ``i`` back as a validated ``ParallelConfig``.

Derived sizes have ``ParallelConfig``'s names and formulas (``num_microbatches``, ``world_size``,
``expert_tp``, ``expert_dp``, ``vp_group_size``), so one rule written over attributes runs on a
``ParallelConfig`` (scalars) and on a table (arrays) alike.
"""

from __future__ import annotations

import dataclasses
import operator
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from .errors import ConfigError
from .specs import ModelSpec, ParallelConfig
from .vocab import ATTENTION_BACKENDS, DTYPE_BYTES, FUSED_ATTENTION_BACKENDS, RECOMPUTE_CODE

FIELDS: tuple[str, ...] = tuple(f.name for f in dataclasses.fields(ParallelConfig))
DEFAULTS: dict[str, Any] = {f.name: f.default for f in dataclasses.fields(ParallelConfig)}
INT_FIELDS = ("tp", "pp", "dp", "ep", "cp", "vpp", "micro_batch", "global_batch", "seq_len",
              "num_distributed_optimizer_instances")
OPTIONAL_INT_FIELDS: tuple[str, ...] = ("etp", "bucket_size", "microbatch_group_size_per_vp_stage", "num_layers_in_first_pipeline_stage",
                       "num_layers_in_last_pipeline_stage", "ddp_num_buckets")  # None -> -1 in the arrays
BOOL_FIELDS: tuple[str, ...] = ("sp", "distributed_optimizer", "fsdp", "overlap_grad_reduce", "create_attention_mask_in_dataloader",
               "pipe_partitioned", "account_for_embedding_in_pipeline_split", "account_for_loss_in_pipeline_split",
               "moe_router_enable_expert_bias", "cross_entropy_loss_fusion", "calculate_per_token_loss",
               "overlap_param_gather", "tp_comm_overlap", "fp8_param_gather")
FLOAT_FIELDS = ("moe_aux_loss_coeff",)
STR_FIELDS = ("act_dtype", "grad_reduce_dtype", "param_dtype", "recompute", "schedule", "order",
              "moe_token_dispatcher_type", "attention_backend", "rerun_mode", "fp8_recipe",
              "cp_comm_type")
OBJECT_FIELDS: tuple[str, ...] = ("moe_router_dtype", "moe_router_load_balancing_type", "fp8")  # None or a string, a string or a tuple
BOOL_FIELDS += ("fsdp_reshard_after_forward",)  # FSDP (issue 20)
OBJECT_FIELDS += ("recompute_modules",)  # None or a tuple of Megatron-LM's --recompute-modules names
BOOL_FIELDS += ("overlap_p2p_comm", "moe_a2a_overlap", "align_grad_reduce")  # issue 20: pipeline and MoE overlap
OBJECT_FIELDS += ("moe_flex_dispatcher_backend",)  # None or a string
OBJECT_FIELDS += ("recompute_method",)  # None, "uniform" or "block" (--recompute-method)
OPTIONAL_INT_FIELDS += ("recompute_num_layers",)  # --recompute-num-layers (None -> -1)
OBJECT_FIELDS += ("tp_comm_overlap_fp8_buf",)  # a tuple of userbuffers layer names (llmcomm.predict.fp8_wire)
NAN_IS_NONE = ("recompute_method",)  # object fields whose NaN in a DataFrame (a row without the value) is None
assert set(FIELDS) == set(INT_FIELDS + OPTIONAL_INT_FIELDS + BOOL_FIELDS + FLOAT_FIELDS + STR_FIELDS
                          + OBJECT_FIELDS), sorted(set(FIELDS) ^ set(INT_FIELDS + OPTIONAL_INT_FIELDS + BOOL_FIELDS
                                                                   + FLOAT_FIELDS + STR_FIELDS + OBJECT_FIELDS))


_ALL_FIELDS = operator.attrgetter(*FIELDS)  # a ParallelConfig's field values as one tuple (ParallelTable.from_configs)
_FIELD_KINDS: dict[str, tuple[str, ...]] = {
    kind: tuple(f for f in FIELDS if (
        "optional" if f in OPTIONAL_INT_FIELDS or f == "seq_len" else "int" if f in INT_FIELDS else "bool"
        if f in BOOL_FIELDS else "float" if f in FLOAT_FIELDS else "object" if f in OBJECT_FIELDS else "str") == kind)
    for kind in ("optional", "int", "bool", "float", "object", "str")}
_KIND_DTYPE: dict[str, Any] = {"optional": np.int64, "int": np.int64, "bool": bool, "float": np.float64,
                               "str": object}


_FINISHED = ("global_batch", "schedule", "seq_len")  # the columns ParallelTable._finish may replace
_FUSED = {b: b in FUSED_ATTENTION_BACKENDS for b in ATTENTION_BACKENDS}  # ParallelTable.fused_attention's codes
_LAST_ONE: list[tuple[ParallelConfig, ModelSpec | None, ParallelTable]] = []  # ParallelTable.from_parallel's last


def _objects(values: Any, n: int) -> np.ndarray:
    """An object array of ``n`` values (a value repeated when not a sequence of n), without numpy turning tuples
    into a second axis."""
    out = np.empty(n, dtype=object)
    if isinstance(values, (list, np.ndarray, pd.Series)) and len(values) == n:
        if isinstance(values, np.ndarray) and values.dtype == object and values.ndim == 1 and _hashable(values):
            out[:] = values  # no list among them (a list is not hashable): the same objects, element for element
            return out
        for i, v in enumerate(values):
            out[i] = tuple(v) if isinstance(v, list) else v
    else:
        out.fill(values)  # the same object in every row, as the element-wise assignment put it
    return out


def _hashable(values: np.ndarray) -> bool:
    """Whether every element hashes (so none is a list), through pandas' hash table (no Python loop)."""
    try:
        pd.factorize(values)
    except TypeError:
        return False
    return True


def _codes(values: np.ndarray, table: Mapping[str, Any], field: str) -> np.ndarray:
    """``table[v]`` for each string ``v`` of ``values``, through the distinct values (fast for long columns of
    few strings); a value outside ``table`` is a :class:`ConfigError` naming the field."""
    if len(values) == 1 or (len(values) and (values == values[0]).all()):
        u = str(values[0])
        if u not in table:
            raise ConfigError(f"candidates: column {field!r} holds {u!r}, not one of {sorted(table)}")
        return np.array([table[u]]) if len(values) == 1 else np.full(len(values), table[u])  # np.full's dtype
    codes, uniq = pd.factorize(values)  # hashed, no sort (a Categorical sorts its categories)
    bad = sorted(str(u) for u in uniq if str(u) not in table)
    if bad or np.count_nonzero(codes < 0):
        raise ConfigError(f"candidates: column {field!r} holds values outside {sorted(table)}: {bad or ['NaN']}")
    lut = np.array([table[str(u)] for u in uniq])
    return lut[codes]


@dataclass(frozen=True, eq=False)
class ParallelTable:
    """One array per :class:`ParallelConfig` field, all of one length (see the module docstring). Optional
    integers (``etp``, ``bucket_size``, ``microbatch_group_size_per_vp_stage``) hold ``-1`` for ``None``."""

    columns: dict[str, np.ndarray]

    def __len__(self) -> int:
        return len(self.columns["tp"])

    def __getattr__(self, name: str) -> np.ndarray:
        cols = self.__dict__.get("columns")
        if cols is not None and name in cols:
            return cols[name]
        raise AttributeError(name)

    # -- building ------------------------------------------------------------------------------------
    @classmethod
    def from_frame(cls, df: pd.DataFrame, model: ModelSpec | None = None, *, required: Sequence[str] = ("tp", "pp", "dp"),
                   **fixed: Any) -> ParallelTable:
        """A table from a DataFrame with columns named as ``ParallelConfig`` fields (others are ignored);
        ``fixed`` supplies absent columns, ``ParallelConfig``'s defaults the rest. ``model`` fills
        ``seq_len`` (its ``seq_length``) where it is absent or missing. Raises :class:`ConfigError` for a missing
        ``required`` column, a missing value, or a string outside its vocabulary."""
        unknown = sorted(set(fixed) - set(FIELDS))
        if unknown:
            raise ConfigError(f"candidates: unknown ParallelConfig field(s) {unknown}")
        for c in required:
            if c not in df.columns and c not in fixed:
                raise ConfigError(f"candidates: missing column {c!r} (need {', '.join(required)}; optional: every "
                                  f"other ParallelConfig field, {sorted(set(FIELDS) - set(required))})")
        n = len(df)
        cols: dict[str, np.ndarray] = {}

        def raw(name: str) -> tuple[np.ndarray | None, Any]:
            if name in df.columns:
                return df[name].to_numpy(), None
            return None, fixed.get(name, DEFAULTS[name])

        for f in FIELDS:
            v, const = raw(f)
            if f in ("global_batch", "seq_len") or f in OPTIONAL_INT_FIELDS:
                if v is None:
                    cols[f] = np.full(n, -1 if const is None else int(const), np.int64)
                else:
                    s = pd.Series(v)
                    cols[f] = s.fillna(-1).to_numpy(np.int64) if s.isna().any() else s.to_numpy(np.int64)
            elif f in INT_FIELDS:
                if v is None:
                    cols[f] = np.full(n, int(const), np.int64)
                else:
                    missing = pd.isna(v)
                    if missing.any() and f in required:
                        raise ConfigError(f"candidates: column {f!r} has missing values")
                    if missing.any():  # a missing value takes the default, as an absent column does
                        v = np.where(missing, fixed.get(f, DEFAULTS[f]), v)
                    cols[f] = v.astype(np.int64)
            elif f in BOOL_FIELDS:
                if v is None:
                    cols[f] = np.full(n, bool(const))
                else:
                    s = pd.Series(v)
                    cols[f] = s.fillna(DEFAULTS[f]).to_numpy(bool) if s.isna().any() else s.to_numpy(bool)
            elif f in FLOAT_FIELDS:
                cols[f] = np.full(n, float(const)) if v is None else pd.Series(v).fillna(DEFAULTS[f]).to_numpy(np.float64)
            elif f in OBJECT_FIELDS:
                # an object column as it is (no Python loop where no element is a list: _objects' fast path)
                vals = const if v is None else v if (v.dtype == object and f not in NAN_IS_NONE) else list(v)
                if f in NAN_IS_NONE and v is not None:  # a frame's missing value (NaN) is the field's None
                    vals = [None if isinstance(x, float) and x != x else x for x in vals]
                cols[f] = _objects(vals, n)
            else:
                if v is not None and isinstance(df[f].dtype, pd.StringDtype) and not pd.isna(v).any():
                    cols[f] = v.astype(object)  # already strings, none missing: what the line below gives
                    continue
                cols[f] = (_objects(const, n) if v is None  # fill: np.full copies object by object, 10x slower
                           else pd.Series(v).fillna(DEFAULTS[f]).astype(str).to_numpy(dtype=object))
        return cls._finish(cols, model)

    @classmethod
    def from_columns(cls, n: int, model: ModelSpec | None = None, **columns: Any) -> ParallelTable:
        """A table of ``n`` rows from arrays (or scalars, repeated) named as ``ParallelConfig`` fields, the rest
        at their defaults; no pandas, no missing values (the fast path of the tuner's space)."""
        unknown = sorted(set(columns) - set(FIELDS))
        if unknown:
            raise ConfigError(f"unknown ParallelConfig field(s) {unknown}")
        cols: dict[str, np.ndarray] = {}
        for f in FIELDS:
            v = columns.get(f, DEFAULTS[f])
            if f in OBJECT_FIELDS:
                cols[f] = _objects(v if np.ndim(v) == 0 or isinstance(v, tuple) or (
                    isinstance(v, np.ndarray) and v.dtype == object) else list(v), n)
                continue
            if v is None:
                v = -1
            dtype = (np.int64 if f in INT_FIELDS or f in OPTIONAL_INT_FIELDS else bool if f in BOOL_FIELDS
                     else np.float64 if f in FLOAT_FIELDS else object)
            # a repeated scalar as one read-only element seen n times (np.broadcast_to: no n-element fill)
            cols[f] = np.broadcast_to(np.array(v, dtype=dtype), (n,)) if np.ndim(v) == 0 else np.asarray(v).astype(dtype)
        return cls._finish(cols, model)

    @classmethod
    def from_configs(cls, configs: Sequence[ParallelConfig], model: ModelSpec | None = None, *,
                     read_only: bool = False) -> ParallelTable:
        """A table of already validated configurations (no pandas: the fast path of one configuration);
        ``read_only``: every column read-only."""
        # the fields' values row by row (one attrgetter call per configuration), then one 2-D array per kind of
        # field whose rows are the columns: a handful of numpy calls instead of one per field (one configuration
        # is the single-configuration path of iteration_time and memory)
        by_field = dict(zip(FIELDS, zip(*(_ALL_FIELDS(p) for p in configs), strict=True), strict=True))
        cols: dict[str, np.ndarray] = {}
        for kind, fields in _FIELD_KINDS.items():
            if kind == "object":
                cols.update({f: _objects(list(by_field[f]), len(configs)) for f in fields})
                continue
            vals: list[Any] = [by_field[f] for f in fields]
            if kind == "optional":
                vals = [[-1 if x is None else x for x in v] for v in vals]
            block = np.array(vals, dtype=_KIND_DTYPE[kind]).reshape(len(fields), len(configs))
            if read_only:
                block.setflags(write=False)  # its rows, the columns, are read-only views
            cols.update(zip(fields, block, strict=True))
        t = cls._finish({f: cols[f] for f in FIELDS}, model)
        if read_only:  # the object columns and those _finish may replace
            for f in (*_FIELD_KINDS["object"], *_FINISHED):
                t.columns[f].setflags(write=False)
        return t

    @classmethod
    def from_parallel(cls, parallel: ParallelConfig, model: ModelSpec | None = None) -> ParallelTable:
        """The one-row table of ``parallel``. The most recent one is kept, its columns read-only, and given back
        while the same configuration and model objects are asked for (``iteration_time`` asks twice per call:
        for its stage description and for its memory check)."""
        last = _LAST_ONE[0] if _LAST_ONE else None
        if last is not None and last[0] is parallel and last[1] is model and cls is ParallelTable:
            return last[2]
        t = cls.from_configs([parallel], model, read_only=True)
        _LAST_ONE[:] = [(parallel, model, t)]
        return t

    @classmethod
    def _finish(cls, cols: dict[str, np.ndarray], model: ModelSpec | None) -> ParallelTable:
        """``ParallelConfig.__post_init__``'s defaults, vectorized: ``global_batch`` unset -> ``micro_batch·dp``;
        ``vpp > 1`` with ``1f1b`` -> ``interleaved``; ``seq_len`` unset -> the model's."""
        gb = cols["global_batch"]
        if np.count_nonzero(gb < 0):
            cols["global_batch"] = np.where(gb < 0, cols["micro_batch"] * cols["dp"], gb)
        sched = cols["schedule"]
        to_inter = (cols["vpp"] > 1) & (sched == "1f1b")
        if np.count_nonzero(to_inter):
            cols["schedule"] = np.where(to_inter, "interleaved", sched).astype(object)
        if model is not None and np.count_nonzero(cols["seq_len"] < 0):
            cols["seq_len"] = np.where(cols["seq_len"] < 0, model.seq_length, cols["seq_len"])
        return cls(cols)

    def slice(self, start: int, stop: int) -> ParallelTable:
        """Rows ``start .. stop - 1`` (views of this table's columns: no copy)."""
        return ParallelTable({k: v[start:stop] for k, v in self.columns.items()})

    def take(self, rows: np.ndarray) -> ParallelTable:
        return ParallelTable({k: v[rows] for k, v in self.columns.items()})

    def tile(self, k: int) -> ParallelTable:
        """The table repeated ``k`` times (rows ``i``, ``n + i``, ... are row ``i``)."""
        return ParallelTable({key: np.concatenate([v] * k) for key, v in self.columns.items()})

    # -- back to configurations ----------------------------------------------------------------------
    def row(self, i: int) -> ParallelConfig:
        """Row ``i`` as a validated :class:`ParallelConfig`."""
        d: dict[str, Any] = {}
        for f in FIELDS:
            v = self.columns[f][i]
            v = v.item() if hasattr(v, "item") else v
            if f in OPTIONAL_INT_FIELDS or f == "seq_len":
                v = None if v < 0 else int(v)
            d[f] = v
        return ParallelConfig(**d)

    def to_frame(self) -> pd.DataFrame:
        """The table as a DataFrame of ``ParallelConfig`` fields (``None`` for unset optional integers)."""
        out = pd.DataFrame({f: self.columns[f] for f in FIELDS})
        for f in (*OPTIONAL_INT_FIELDS, "seq_len"):
            out[f] = pd.Series(self.columns[f]).where(self.columns[f] >= 0, None)
        return out

    # -- derived sizes (ParallelConfig's names) ---------------------------------------------------------
    @property
    def world_size(self) -> np.ndarray:
        return self.tp * self.cp * self.dp * self.pp

    @property
    def num_microbatches(self) -> np.ndarray:
        return self.global_batch // np.maximum(self.micro_batch * self.dp, 1)

    @property
    def expert_tp(self) -> np.ndarray:
        return np.where(self.etp < 0, self.tp, self.etp)

    @property
    def expert_dp(self) -> np.ndarray:
        return self.world_size // np.maximum(self.expert_tp * self.ep * self.pp, 1)

    @property
    def vp_group_size(self) -> np.ndarray:
        g = self.microbatch_group_size_per_vp_stage
        return np.where(g < 0, self.pp, g)

    def sequence_length(self, model: ModelSpec | None = None) -> np.ndarray:
        if np.count_nonzero(self.seq_len < 0):
            if model is None:
                raise ConfigError("seq_len is unset and no model was given to take seq_length from")
            return np.where(self.seq_len < 0, model.seq_length, self.seq_len)
        return self.seq_len

    # -- codes the cost model computes with ------------------------------------------------------------
    def dtype_bytes(self, field: str) -> np.ndarray:
        """Bytes per element of a dtype column (``act_dtype``, ``grad_reduce_dtype``, ``param_dtype``)."""
        return _codes(self.columns[field], DTYPE_BYTES, field).astype(np.int64)

    @property
    def fused_attention(self) -> np.ndarray:
        """Rows whose attention runs as one fused kernel (:data:`llmcomm.vocab.FUSED_ATTENTION_BACKENDS`)."""
        return _codes(self.attention_backend, _FUSED, "attention_backend").astype(bool)

    @property
    def recompute_code(self) -> np.ndarray:
        """:data:`llmcomm.vocab.RECOMPUTE_CODE` of each row (none 0 < selective 1 < full 2)."""
        return _codes(self.recompute, RECOMPUTE_CODE, "recompute").astype(np.int64)


def _column(name: str) -> property:
    """``table.<name>``: the column ``name`` (read through ``columns`` at each access, so a column replaced in
    ``columns`` is the one read)."""
    return property(lambda self: self.columns[name], doc=f"The {name!r} column.")


for _f in FIELDS:  # a property per field: found on the class, without the failed instance lookup __getattr__ follows
    setattr(ParallelTable, _f, _column(_f))
del _f
