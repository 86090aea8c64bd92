"""GEMM efficiency from measured kernels: the XLA table parser, the tile/wave model, its ceiling and its fit."""

from __future__ import annotations

import json

import numpy as np
import pytest

from llmcomm.errors import ConfigError, DataError, TraceFormatError
from llmcomm.overhead import gemm as G
from llmcomm.overhead import xla_tables as X
from llmcomm.specs import data_dir, load_cluster

HEADER = 'constexpr char kDefaultMatmulPTable[] = R"pb(\n{body}\n)pb";\n'
ENTRY = ('entries {{ b: {b} m: {m} n: {n} k: {k} flops {{ key: "bf16xbf16->bf16" value: {v} }} '
         'flops {{ key: "f32xf32->f32" value: {v} }} }}')


def _header(tmp_path, body: str):
    p = tmp_path / "t.h"
    p.write_text("// licence\n" + HEADER.format(body=body))
    return p


def test_parse_pbtext_nested_and_repeated() -> None:
    d = X.parse_pbtext('a: 1 b { c: "x" c: "y" d: 2.5e3 } b { e: F32 }')
    assert d["a"] == [1] and d["b"][0]["c"] == ["x", "y"] and d["b"][0]["d"] == [2500.0]
    assert d["b"][1]["e"] == ["F32"]


@pytest.mark.parametrize("text, rule", [
    ("a { b: 1", "not closed"),
    ("a: 1 }", "expected a field name"),
    ("a: 1\nb: {", "line 2"),
    ("a: @", "unexpected character"),
    ("a { b: 1 >", "other bracket"),
])
def test_parse_pbtext_errors_name_file_and_line(text: str, rule: str) -> None:
    with pytest.raises(TraceFormatError, match=rule) as ei:
        X.parse_pbtext(text, "f.h")
    assert "f.h: line" in str(ei.value)


def test_matmul_table_hand_worked(tmp_path) -> None:
    body = 'entries { key: "sm_90" value { ' + ENTRY.format(b=2, m=256, n=512, k=1024, v=int(1e14)) + " } }"
    t = X.matmul_table(_header(tmp_path, body))
    assert len(t) == 2 and set(t["dtype_key"]) == {"bf16xbf16->bf16", "f32xf32->f32"}
    assert t["time_s"].iloc[0] == pytest.approx(2 * 2 * 256 * 512 * 1024 / 1e14)


@pytest.mark.parametrize("body, rule", [
    ('entries { key: "sm_90" value { entries { b: 1 m: 2 n: 2 flops { key: "x" value: 1 } } } }', "'k' must occur"),
    ('entries { key: "sm_90" value { entries { b: 1 m: 2 n: 2 k: 2 } } }', "no 'flops"),
    ('entries { key: "sm_90" value { entries { b: 1 m: 2 n: 2 k: 2 flops { key: "x" value: 0 } } } }', "> 0"),
    ('entries { key: "sm_90" value { entries { b: 0 m: 2 n: 2 k: 2 flops { key: "x" value: 1 } } } }', ">= 1"),
])
def test_matmul_table_rejects_malformed_entries(tmp_path, body: str, rule: str) -> None:
    with pytest.raises(TraceFormatError, match=rule) as ei:
        X.matmul_table(_header(tmp_path, body))
    assert "t.h" in str(ei.value)


def test_header_without_raw_string(tmp_path) -> None:
    p = tmp_path / "x.h"
    p.write_text("int x;\n")
    with pytest.raises(TraceFormatError, match="no raw protobuf string"):
        X.matmul_table(p)
    p.write_text('R"pb( entries { key: "sm_90" }\n')
    with pytest.raises(TraceFormatError, match="never closed"):
        X.matmul_table(p)


def test_real_matmul_table(external) -> None:
    t = X.matmul_table(external(G.TABLE))
    bf = t[t["dtype_key"] == "bf16xbf16->bf16"]
    assert len(bf) == 375 and set(bf["gpu"]) == {"sm_90"}
    assert set(bf["m"]) == set(bf["n"]) == set(bf["k"]) == {256, 512, 1024, 2048, 4096} and set(bf["b"]) == {1, 2, 4}
    best = bf.loc[bf["flops"].idxmax()]
    assert best["flops"] == pytest.approx(808.7e12, rel=1e-4)
    assert (best["b"], best["m"], best["n"], best["k"]) == (4, 4096, 2048, 4096)


def test_collective_table_bytes_follow_nccl_tests(external) -> None:
    t = X.collective_table(external("xla/collective_interpolator_data_sm90.h"))
    g8 = t[t["group_size"] == 8]
    assert set(g8["op"]) == {"all_reduce", "all_gather", "reduce_scatter"}
    assert g8.groupby("op").size().to_dict() == {"all_gather": 22, "all_reduce": 22, "reduce_scatter": 22}
    rs = g8[g8["op"] == "reduce_scatter"]
    assert (rs["bytes"] == rs["elements"] * 4 * 8).all()  # the input before scattering: 8 x the output shape
    ar = g8[g8["op"] == "all_reduce"]
    assert (ar["bytes"] == ar["elements"] * 4).all()


# ------------------------------------------------------------------------------------------------- the model
@pytest.fixture(scope="module")
def h100() -> G.GemmModel:
    m = G.load_gemm_model("H100")
    assert isinstance(m, G.GemmModel)
    return m


def test_tile_time_hand_worked() -> None:
    """One 128x128 tile on a 1-SM GPU, no split worth it, compute bound: t = t0 + 2·128·128·(k + k0)/(η·P)."""
    th = (0.5, 100.0, 1e-6, 1e15)
    t = G.tile_time(th, np.array([1.0]), np.array([128.0]), np.array([128.0]), np.array([1024.0]), sms=1,
                    peak=1e12, hbm=1e18, e_in=2, e_out=2)
    assert t[0] == pytest.approx(1e-6 + 2 * 128 * 128 * 1124 / 0.5e12)
    # a second tile on one SM is a second wave: twice the tile time
    t2 = G.tile_time(th, np.array([1.0]), np.array([256.0]), np.array([128.0]), np.array([1024.0]), sms=1,
                     peak=1e12, hbm=1e18, e_in=2, e_out=2)
    assert t2[0] - 1e-6 == pytest.approx(2 * (t[0] - 1e-6))


def test_thin_shape_is_hbm_bound() -> None:
    """m = n = 8, k = 2^20 on a GPU whose tensor cores are never the limit: the time is reading A and B."""
    th = (0.9, 0.0, 0.0, 1e18)
    b, m, n, k = (np.array([x], float) for x in (1, 8, 8, 1 << 20))
    t = G.tile_time(th, b, m, n, k, sms=132, peak=1e18, hbm=1e12, e_in=2, e_out=2)
    assert t[0] == pytest.approx((2 * (8 * 2**20 + 2**20 * 8) + 2 * 64) / 1e12)


def test_no_shape_faster_than_the_measured_ceiling(h100) -> None:
    """The rule of the issue: over measured and far larger shapes, bf16 never above 808.7 TFLOP/s on H100
    (and H200, the same silicon); FP8 never above the bf16 ceiling fraction of its peak."""
    dims = np.array([1, 7, 64, 256, 1000, 4096, 8192, 12288, 16384, 53248, 131072], float)
    m, n, k = np.meshgrid(dims, dims, dims, indexing="ij")
    for gpu in ("H100", "H200"):
        g = G.load_gemm_model(gpu)
        for b in (1, 4):
            fl = g.flops(m, n, k, b) / g.time(m, n, k, b)
            assert fl.max() <= 808.7e12 * (1 + 1e-6)
            assert g.efficiency(m, n, k, b).max() <= 808.7e12 / 989.4e12 + 1e-9
        fp8 = g.flops(m, n, k) / g.time(m, n, k, dtype="fp8")
        assert fp8.max() <= 808.7e12 / 989.4e12 * 1978.9e12 * (1 + 1e-6)
    big = h100.efficiency(16384, 16384, 16384)
    assert float(big) == pytest.approx(808.7e12 / 989.4e12, rel=1e-3)  # large shapes sit at the ceiling


def test_model_reproduces_the_measured_table(h100, external) -> None:
    rows = G.measured_rows(X.matmul_table(external(G.TABLE)))
    bf = rows[rows["dtype"] == "bf16"]
    pred = h100.time(bf["m"], bf["n"], bf["k"], bf["b"])
    rel = np.abs(pred / bf["time_s"].to_numpy() - 1)
    assert rel.mean() < 0.05 and np.median(rel) < 0.04 and rel.max() < 0.35


def test_shipped_fit_reports_cross_validation() -> None:
    doc = json.loads((data_dir() / G.CALIBRATION).read_text())
    f = doc["gpus"]["H100"]["fits"]["bf16"]["metrics"]
    assert f["cv_leave_one_shape_out"]["folds"] == 125 and f["cv_leave_one_shape_out"]["mape"] < 0.05
    assert f["extrapolation_2048_to_4096"]["mape"] < 0.06
    assert "375 measured" in f["fitted_on"] and f["params_at_bound"] == []


def test_refit_equals_the_shipped_fit(h100) -> None:
    rows = G.measured_rows()
    f = G.fit_dtype(rows, "bf16", G.GPUS["H100"], cv=False)
    assert np.allclose(f.params, h100.fits["bf16"].params, rtol=1e-4)


def test_efficiency_grows_with_size_and_waves_quantize(h100) -> None:
    e = h100.efficiency([256, 1024, 4096], 4096, 4096)
    assert e[0] < e[1] < e[2]
    # 132 tiles of 128x256 fill one wave exactly; 133 need a second: a step down in efficiency
    full = h100.efficiency(128 * 132, 256, 4096)
    over = h100.efficiency(128 * 133, 256, 4096)
    assert over < full


def test_vectorized_broadcasting(h100) -> None:
    t = h100.time(np.array([[1024], [2048]]), np.array([1024, 2048, 4096]), 4096)
    assert t.shape == (2, 3) and (np.diff(t, axis=1) > 0).all()


def test_bad_inputs(h100) -> None:
    with pytest.raises(ConfigError, match="positive integers"):
        h100.time(0, 10, 10)
    with pytest.raises(ConfigError, match="positive integers"):
        h100.time(1.5, 10, 10)
    with pytest.raises(ConfigError, match="dtype"):
        h100.time(10, 10, 10, dtype="int4")
    with pytest.raises(DataError, match="no measured GEMM table"):
        G.load_gemm_model("B200")


def test_a100_is_the_utilization_fit() -> None:
    a = G.load_gemm_model(load_cluster("vtrain-a100"))
    assert isinstance(a, G.UtilizationGemm)
    # with the element-wise bytes counted kernel by kernel (llmcomm.step.ACTIVATION_BYTES, SCORE_BYTES) the vTrain
    # single-node fit no longer sits on its bound 1.0: matmuls at 1/θ_gemm of peak, below 100 %
    assert not a.at_bound and 1.0 < a.theta_gemm < 1.25
    assert float(a.efficiency(4096, 4096, 4096)) == pytest.approx(1.0 / a.theta_gemm)


def test_scalar_vector_and_deduplicated_paths_agree(h100):
    rng = np.random.default_rng(0)
    m, n, k = (rng.integers(1, 70000, 300) for _ in range(3))
    b = rng.integers(1, 5, 300)
    th = h100.fits["bf16"].params
    vec = G.tile_time(th, b, m, n, k, sms=132, peak=989.4e12, hbm=3.35e12, e_in=2, e_out=2)
    one = [G.tile_time_scalar(th, *map(float, x), 132, 989.4e12, 3.35e12, 2, 2) for x in zip(b, m, n, k, strict=True)]
    np.testing.assert_allclose(vec, one, rtol=1e-12)
    many = h100.time(np.tile(m[:40], 10), np.tile(n[:40], 10), np.tile(k[:40], 10))  # repeated shapes: deduplicated
    few = np.concatenate([h100.time(m[i:i + 8], n[i:i + 8], k[i:i + 8]) for i in range(0, 40, 8)])  # scalar path
    np.testing.assert_allclose(many, np.tile(few, 10), rtol=1e-12)
