"""The shared vocabularies: values equal the strings files hold, every module uses the one definition, and the
one writer of trace metadata round-trips."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import llmcomm as lc
from llmcomm import vocab
from llmcomm.errors import ConfigError


def test_enum_values_are_the_strings_in_files() -> None:
    assert vocab.OPS == ("all_reduce", "all_gather", "reduce_scatter", "all_to_all", "send", "recv", "broadcast")
    assert vocab.PHASES == ("forward", "backward", "optimizer", "setup")
    assert vocab.PARALLELISM_TAGS == ("tp", "sp", "cp", "pp", "dp", "ep", "other")
    assert vocab.RECOMPUTE_MODES == ("none", "selective", "full")
    assert vocab.PIPELINE_SCHEDULES == ("1f1b", "gpipe", "interleaved")
    assert vocab.NORMALIZATIONS == ("LayerNorm", "RMSNorm")
    assert vocab.ACTIVATIONS == ("gelu", "swiglu", "squared_relu")
    assert vocab.POSITION_EMBEDDINGS == ("rope", "learned_absolute", "none", "yarn")
    assert vocab.Op.ALL_TO_ALL == "all_to_all" and vocab.Phase.BACKWARD == "backward"
    assert all(type(v) is str for v in vocab.OPS + vocab.PHASES + vocab.CALL_GROUP_KINDS)
    assert set(vocab.CALL_GROUP_KINDS) <= {str(k) for k in vocab.GroupKind}
    assert set(vocab.LAYOUT_GROUP_KINDS) | set(vocab.PAIR_GROUP_KINDS) == {str(k) for k in vocab.GroupKind}
    assert set(vocab.COLLECTIVES) | set(vocab.POINT_TO_POINT) == set(vocab.OPS)


def test_literal_types_spell_out_their_enums() -> None:
    from typing import get_args

    assert len(vocab.LITERALS) == 13
    for literal, enum in vocab.LITERALS.items():
        assert get_args(literal) == tuple(str(m.value) for m in enum), enum.__name__


def test_modules_share_the_one_definition() -> None:
    import llmcomm.collect.record as record
    from llmcomm import specs, trace

    assert trace.EVENTS_SCHEMA is vocab.EVENTS_SCHEMA and trace.ROUTING_SCHEMA is vocab.ROUTING_SCHEMA
    # the 0.1 aliases are gone: a vocabulary is imported from llmcomm.vocab, not from a module that uses it
    for module, name in [(specs, "DTYPE_BYTES"), (trace, "DEFAULTS"), (trace, "ROUTING_KEY")]:
        assert not hasattr(module, name), name
    assert record.dtype_name(__import__("torch").bfloat16) == "bf16"
    assert specs.data_dir() == lc.paths.data_dir()


def test_dtypes() -> None:
    assert vocab.dtype_bytes("bf16") == 2 and vocab.dtype_bytes(vocab.Dtype.FP32) == 4
    with pytest.raises(ConfigError, match="dtype='int4' is not one of"):
        vocab.dtype_bytes("int4")
    # every reader alias names a short dtype whose element size is the one the events table uses
    for alias, (short, size) in vocab.DTYPES.items():
        assert vocab.ELEMENT_BYTES[short] == size, alias
    assert vocab.DTYPES["c10::bfloat16"] == ("bf16", 2) and vocab.DTYPES["double"] == ("fp64", 8)


def test_config_accepts_enum_members() -> None:
    p = lc.ParallelConfig(recompute=vocab.Recompute.FULL, schedule=vocab.PipelineSchedule.GPIPE, pp=2,
                          act_dtype=vocab.Dtype.FP16)
    assert p.recompute == "full" and p.schedule == "gpipe" and p.act_dtype == "fp16"


def test_schemas() -> None:
    assert vocab.EVENT_COLUMNS[:4] == ("rank", "iteration", "microbatch", "layer")
    assert set(vocab.EVENT_DEFAULTS) <= set(vocab.EVENT_COLUMNS)
    assert vocab.ROUTING_COLUMNS == ("iteration", "microbatch", "layer", "src_rank", "expert", "tokens")
    assert vocab.ROUTING_KEY == vocab.ROUTING_COLUMNS[:-1]


def test_trace_metadata_one_writer(tmp_path: Path) -> None:
    from llmcomm.trace import (
        META_KEY,
        decode_meta,
        encode_meta,
        read_trace,
        trace_metadata,
        write_events_table,
    )

    meta = {"model": lc.load_model("tiny-gpt"), "n": np.int64(3), "x": np.float32(0.5), "s": (1, 2)}
    raw = encode_meta(meta)
    assert decode_meta({META_KEY: raw}) == {"model": lc.load_model("tiny-gpt").to_dict(), "n": 3, "x": 0.5,
                                            "s": [1, 2]}
    assert decode_meta(None) == {}
    assert trace_metadata({"a": 1})[b"llmcomm.schema_version"] == b"1"
    with pytest.raises(TypeError, match="cannot store object"):
        encode_meta({"bad": object()})
    t = lc.Trace.from_records([{"rank": 0, "phase": "forward", "parallelism": "tp", "op": "all_reduce",
                                "group": [0, 1], "bytes": 8, "source": "predicted"}], meta={"k": "v"})
    p = write_events_table(t.to_table(), tmp_path / "t.parquet", {"k": "v"})
    q = t.write(tmp_path / "u.parquet")
    assert pq.read_schema(p).metadata == pq.read_schema(q).metadata
    assert read_trace(p).meta == {"k": "v"}
    assert not list(tmp_path.glob(".*.tmp"))


def test_layout_group_rows_match_groups() -> None:
    lay = lc.Layout(lc.ParallelConfig(tp=2, pp=4, dp=2))
    ranks = np.arange(lay.world_size)
    for kind in ("tp", "dp", "pp", "dpcp"):
        rows = lay.group_rows(kind, ranks)
        assert all(r in row for r, row in zip(ranks.tolist(), rows.tolist(), strict=True))
        assert {tuple(r) for r in rows.tolist()} == {tuple(g) for g in lay.groups(kind).tolist()}
    emb = lay.groups("emb")
    assert emb.tolist() == [[0, 12], [1, 13], [2, 14], [3, 15]]  # first and last stage of each PP group
    assert lay.group_rows("emb", np.array([13, 5])).tolist() == [[1, 13], [0, 12]]  # a middle stage: row 0
    assert lay.group_rows("tp", [3]) is not lay.group_rows("tp", [3])  # fresh arrays, shared cache
    assert len(lay._group_lookup) == 5
    with pytest.raises(ConfigError, match="is not one of"):
        lay.groups("bogus")


def test_events_table_rejects_unknown_vocabulary() -> None:
    from llmcomm.errors import TraceFormatError

    with pytest.raises(TraceFormatError, match="'allreduce' is not one of"):
        lc.Trace.from_records([{"rank": 0, "phase": "forward", "parallelism": "tp", "op": "allreduce",
                                "group": [0], "bytes": 8, "source": "x"}])
    assert pa.types.is_list(vocab.EVENTS_SCHEMA.field("group").type)
