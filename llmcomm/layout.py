"""Rank layout: global rank <-> parallel coordinates, process groups, and node placement.

Megatron-LM numbers ranks with the order string ``tp-cp-ep-dp-pp``, fastest-varying first::

    rank = tp_i + tp · (cp_i + cp · (dp_i + dp · pp_i))

Expert parallelism does not add a dimension to the world: the expert layers see the ``cp·dp`` ranks of one
(tp, pp) position as ``ep × expert_dp`` with ``ep`` fastest, so an EP group is ``ep`` consecutive members of
the combined cp/dp index. Other orders (``tp-pp-dp``, ``tp-dp-pp``...) are accepted: any permutation of
``tp``, ``cp``, ``dp`` and ``pp``; ``ep`` may be written (immediately before ``dp``) but is implied anyway.

With an expert tensor-parallel size ``etp`` different from ``tp``, the expert layers have a grid of their own
(Megatron-LM ``parallel_state.initialize_model_parallel``, ``expert_decoder_rank_generator``): the same order
string with ``cp`` dropped, ``tp`` read as ``etp`` and ``dp`` as ``ep`` (fastest) × ``edp``, so with the default
order ``rank = etp_i + etp · (ep_i + ep · (edp_i + edp · pp_i))``.

Groups beyond the parallelisms: ``dpcp`` (data parallel with CP folded in), ``mp`` (model parallel: the
``tp × pp`` ranks sharing cp and dp, Megatron's ``get_model_parallel_group``), ``tpcp`` (``tp × cp``, the
router's aux-loss group), ``etp`` (expert tensor parallel), ``tpep`` (``etp × ep``, Megatron's
``get_expert_tensor_and_model_parallel_group``) and ``world``.

A node holds ``gpus_per_node`` consecutive global ranks: ``node = rank // gpus_per_node``.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

import numpy as np
import pandas as pd

from .errors import ConfigError
from .specs import ParallelConfig
from .vocab import GROUP_PARALLELISMS, LAYOUT_GROUP_KINDS, RANK_DIMS, parse_order


@dataclass(frozen=True)
class Layout:
    """All ranks of a job with their coordinates and groups. Everything is a numpy array; nothing loops
    over ranks, so a 16,384-GPU layout builds in milliseconds."""

    parallel: ParallelConfig
    gpus_per_node: int = 8

    @cached_property
    def order(self) -> tuple[str, ...]:
        return parse_order(self.parallel.order)

    @property
    def world_size(self) -> int:
        return self.parallel.world_size

    def size(self, dim: str) -> int:
        """Group size of a dimension or parallelism: ``tp``, ``cp``, ``dp``, ``pp``, ``ep``, ``edp`` (expert
        data parallel, ``cp·dp/ep``) or ``dpcp`` (data parallel with CP folded in, ``cp·dp``); the group
        kinds are :class:`llmcomm.vocab.GroupKind`."""
        if dim == "dpcp":
            return self.parallel.cp * self.parallel.dp
        if dim == "etp":
            return self.parallel.expert_tp
        return int(self.parallel.expert_dp if dim == "edp" else getattr(self.parallel, dim))

    @cached_property
    def _grid(self) -> np.ndarray:
        """Ranks in an array whose axes are the order's dimensions, slowest first."""
        shape = tuple(self.size(d) for d in reversed(self.order))
        return np.arange(self.world_size, dtype=np.int64).reshape(shape)

    def _axis(self, dim: str) -> int:
        return list(reversed(self.order)).index(dim)

    @cached_property
    def coords(self) -> pd.DataFrame:
        """One row per rank: ``rank, tp, cp, dp, pp, ep, edp, node`` (``ep``/``edp``: expert layout)."""
        ranks = np.arange(self.world_size, dtype=np.int64)
        out = {"rank": ranks}
        stride = 1
        for d in self.order:
            out[d] = (ranks // stride) % self.size(d)
            stride *= self.size(d)
        if self._expert_grid_differs:
            out["ep"], out["edp"] = self._expert_coord("ep"), self._expert_coord("edp")
        else:
            data_idx = self._data_index(out)
            out["ep"] = data_idx % self.parallel.ep
            out["edp"] = data_idx // self.parallel.ep
        out["node"] = ranks // self.gpus_per_node
        return pd.DataFrame(out)[["rank", "tp", "cp", "dp", "pp", "ep", "edp", "node"]]

    @property
    def _expert_grid_differs(self) -> bool:
        return self.parallel.expert_tp != self.parallel.tp

    @cached_property
    def _expert_dims(self) -> tuple[tuple[str, int], ...]:
        """Expert grid dimensions with sizes, fastest first (``cp`` dropped, ``tp`` -> ``etp``,
        ``dp`` -> ``ep``, ``edp``)."""
        p = self.parallel
        out: list[tuple[str, int]] = []
        for d in self.order:
            if d == "tp":
                out.append(("etp", p.expert_tp))
            elif d == "dp":
                out += [("ep", p.ep), ("edp", p.expert_dp)]
            elif d == "pp":
                out.append(("pp", p.pp))
        return tuple(out)

    def _expert_coord(self, dim: str) -> np.ndarray:
        ranks = np.arange(self.world_size, dtype=np.int64)
        stride = 1
        for d, n in self._expert_dims:
            if d == dim:
                return (ranks // stride) % n
            stride *= n
        raise ConfigError(f"{dim!r} is not an expert grid dimension")

    def _expert_groups(self, dims: tuple[str, ...]) -> np.ndarray:
        """Groups spanning expert-grid dimensions ``dims`` (members in rank order)."""
        names = [d for d, _ in self._expert_dims]
        grid = np.arange(self.world_size, dtype=np.int64).reshape([n for _, n in reversed(self._expert_dims)])
        return _span(grid, [len(names) - 1 - names.index(d) for d in dims])

    def _data_index(self, c: dict[str, np.ndarray]) -> np.ndarray:
        """Combined cp/dp index, in the order's own nesting of the two."""
        if self.order.index("cp") < self.order.index("dp"):
            return c["cp"] + self.size("cp") * c["dp"]
        return c["dp"] + self.size("dp") * c["cp"]

    def groups(self, parallelism: str) -> np.ndarray:
        """The process groups of one parallelism as an ``(n_groups, group_size)`` array of global ranks.

        Row order follows the lowest rank of each group; within a row, ranks follow the coordinate
        (so for PP, the stage order; for TP, the shard order). Besides the parallelisms, ``edp``, ``dpcp``
        (see :meth:`size`) and ``emb`` (first and last stage of each PP group; the PP group itself when
        ``pp == 1``).
        """
        if parallelism in RANK_DIMS:
            g = np.moveaxis(self._grid, self._axis(parallelism), -1).reshape(-1, self.size(parallelism))
        elif parallelism in ("ep", "edp") and self._expert_grid_differs:
            g = self._expert_groups((parallelism,))
        elif parallelism in ("ep", "edp"):
            ax_c, ax_d = self._axis("cp"), self._axis("dp")
            # put the data axes last, in their nesting order (slow first), flatten them, split ep fastest
            slow, fast = (ax_d, ax_c) if self.order.index("cp") < self.order.index("dp") else (ax_c, ax_d)
            rest = [a for a in range(self._grid.ndim) if a not in (slow, fast)]
            arr = np.transpose(self._grid, rest + [slow, fast])
            arr = arr.reshape((*arr.shape[: len(rest)], -1))
            ep = self.parallel.ep
            arr = arr.reshape(arr.shape[:-1] + (arr.shape[-1] // ep, ep))
            if parallelism == "edp":
                arr = np.swapaxes(arr, -1, -2)
            g = arr.reshape(-1, arr.shape[-1])
        elif parallelism == "dpcp":  # data parallel with CP folded in: ranks sharing tp and pp, by rank
            g = np.sort(self._grid_group(("cp", "dp")), axis=1)
        elif parallelism == "emb":  # Megatron's embedding group: the first and last stage of each PP group
            pp_groups = self.groups("pp")
            g = pp_groups[:, [0, -1]] if pp_groups.shape[1] > 1 else pp_groups
        elif parallelism == "mp":  # Megatron's model-parallel group: tp x pp
            g = self._grid_group(("tp", "pp"))
        elif parallelism == "tpcp":
            g = self._grid_group(("tp", "cp"))
        elif parallelism == "etp":
            g = self._expert_groups(("etp",)) if self._expert_grid_differs else self.groups("tp")
        elif parallelism == "tpep":
            g = self._expert_groups(("etp", "ep"))
        elif parallelism == "tpeppp":  # Megatron's expert 'tp-ep-pp' group (expert optimizer's grad statistics)
            g = self._expert_groups(("etp", "ep", "pp"))
        elif parallelism == "tpdpcp":  # Megatron's tp x dp x cp group (global aux loss, expert-bias update)
            g = self._grid_group(("tp", "cp", "dp"))
        elif parallelism == "world":
            g = np.arange(self.world_size, dtype=np.int64)[None, :]
        else:
            raise ConfigError(f"parallelism={parallelism!r} is not one of {LAYOUT_GROUP_KINDS}")
        return g[np.argsort(g.min(axis=1), kind="stable")]

    def _grid_group(self, dims: tuple[str, ...]) -> np.ndarray:
        return _span(self._grid, [self._axis(d) for d in dims])

    def group_of(self, rank: int, parallelism: str) -> list[int]:
        """The group of ``parallelism`` that holds ``rank``."""
        g = self.groups(parallelism)
        row = np.nonzero((g == rank).any(axis=1))[0]
        if len(row) != 1:
            raise ConfigError(f"rank={rank} is outside the world of {self.world_size} ranks")
        return [int(x) for x in g[row[0]]]

    @cached_property
    def _group_lookup(self) -> dict[str, tuple[np.ndarray, np.ndarray]]:
        """Per group kind, built on first use: (:meth:`groups`, the row of each rank)."""
        return {}

    def group_lookup(self, kind: str) -> tuple[np.ndarray, np.ndarray]:
        """``(groups, row_of_rank)`` of ``kind`` (any of :meth:`groups`' kinds): the group table and, for every
        rank, the row holding it (0 for a rank in no group of that kind). Built once per layout and kind."""
        hit = self._group_lookup.get(kind)
        if hit is None:
            g = self.groups(kind)
            hit = self._group_lookup[kind] = (g, row_index(g, self.world_size))
        return hit

    def group_rows(self, kind: str, ranks: np.ndarray) -> np.ndarray:
        """The group of ``kind`` (any of :meth:`groups`' kinds) holding each rank of ``ranks``, as an array of
        shape ``(len(ranks), group size)``; a rank in no group of that kind (a middle stage for ``emb``) gets
        the first group (see :meth:`group_lookup`)."""
        g, row_of_rank = self.group_lookup(kind)
        return g[row_of_rank[np.asarray(ranks)]]

    def group_index(self, parallelism: str) -> np.ndarray:
        """For every rank, the row of :meth:`groups` that holds it (length ``world_size``)."""
        return row_index(self.groups(parallelism), self.world_size)

    def node_of(self, ranks: np.ndarray | int) -> np.ndarray | int:
        return ranks // self.gpus_per_node if isinstance(ranks, int) else np.asarray(ranks) // self.gpus_per_node

    def pp_stage(self, rank: int) -> int:
        return int(self.coords["pp"].iat[rank])

    def rank_of(self, tp: int = 0, cp: int = 0, dp: int = 0, pp: int = 0) -> int:
        """The global rank at a coordinate."""
        c = {"tp": tp, "cp": cp, "dp": dp, "pp": pp}
        rank, stride = 0, 1
        for d in self.order:
            if not 0 <= c[d] < self.size(d):
                raise ConfigError(f"{d}={c[d]} is outside 0..{self.size(d) - 1}")
            rank += c[d] * stride
            stride *= self.size(d)
        return rank

    def group_table(self) -> pd.DataFrame:
        """:attr:`coords` plus, per parallelism, the id of the group each rank belongs to (``tp_group``...)."""
        out = self.coords.copy()
        for p in GROUP_PARALLELISMS:
            out[f"{p}_group"] = self.group_index(p)
        return out

    def membership(self) -> pd.DataFrame:
        """Long table ``rank, parallelism, group_id, position`` for every parallelism with size > 1."""
        frames = []
        for p in GROUP_PARALLELISMS:
            if self.size(p) == 1:
                continue
            g = self.groups(p)
            frames.append(pd.DataFrame({
                "rank": g.ravel(),
                "parallelism": p,
                "group_id": np.repeat(np.arange(g.shape[0]), g.shape[1]),
                "position": np.tile(np.arange(g.shape[1]), g.shape[0]),
            }))
        if not frames:
            return pd.DataFrame(columns=["rank", "parallelism", "group_id", "position"])
        return pd.concat(frames, ignore_index=True).sort_values(["parallelism", "rank"], ignore_index=True)


def _span(grid: np.ndarray, axes: list[int]) -> np.ndarray:
    """The groups spanning ``axes`` of a rank grid: one row per index of the other axes, members with the
    spanned axes kept in their own fastest-last order."""
    inner = sorted(axes)
    rest = [a for a in range(grid.ndim) if a not in inner]
    return np.transpose(grid, rest + inner).reshape(-1, int(np.prod([grid.shape[a] for a in inner])))


def row_index(groups: np.ndarray, world_size: int) -> np.ndarray:
    """For every rank ``< world_size``, the row of ``groups`` (an ``(n_groups, size)`` rank array) that holds
    it; ranks in no row get 0."""
    idx = np.zeros(world_size, dtype=np.int64)
    idx[groups.ravel()] = np.repeat(np.arange(groups.shape[0]), groups.shape[1])
    return idx
