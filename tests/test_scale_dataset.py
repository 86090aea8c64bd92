"""Parallel ingest (llmcomm.ingest.parallel) and out-of-core dataset analyses (llmcomm.analysis.dataset):
the same dataset as the serial ingest, the same answers as the in-memory path on read_trace(dataset)."""

from __future__ import annotations

import tarfile
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow.parquet as pq
import pytest
from conftest import TINY

from llmcomm import ParallelConfig, read_trace
from llmcomm.analysis import dataset as ds
from llmcomm.analysis.repeatability import repeatability
from llmcomm.cli import main
from llmcomm.errors import ConfigError, TraceFormatError
from llmcomm.ingest import ingest_to_dataset
from llmcomm.ingest import parallel as par
from llmcomm.predict import predict_traffic
from llmcomm.trace import Trace


@pytest.fixture(scope="module")
def dlrm_dir(tmp_path_factory) -> Path:
    """The 8 real DLRM Kineto rank files, unpacked as plain files."""
    from llmcomm import data

    out = tmp_path_factory.mktemp("dlrm")
    with tarfile.open(data.path("param/dlrm_kineto.tar.gz")) as tf:
        for m in tf.getmembers():
            if m.isfile() and not Path(m.name).name.startswith("."):
                (out / Path(m.name).name).write_bytes(tf.extractfile(m).read())
    return out


@pytest.fixture(scope="module")
def predicted_ds(tmp_path_factory) -> Path:
    """A predicted 16-rank job over three iterations (iteration 2 of ranks 3 and 9 altered), one file per
    rank, as a dataset."""
    t = predict_traffic(TINY, ParallelConfig(tp=2, pp=2, dp=4, seq_len=32, global_batch=8), aggregate=False)
    frames = []
    for it in range(3):
        e = t.events.copy()
        e["iteration"] = it
        e["t_start_ns"] = pd.array(np.arange(len(e)) * 10 + it * 10**6, dtype="Int64")
        e["t_end_ns"] = e["t_start_ns"] + 5
        if it == 2:
            hit = e["rank"].isin([3, 9]) & (e["parallelism"] == "tp")
            e.loc[hit, "bytes"] = e.loc[hit, "bytes"] + 2
        frames.append(e)
    ev = pd.concat(frames, ignore_index=True)
    out = tmp_path_factory.mktemp("pred") / "ds"
    out.mkdir()
    for r, g in ev.groupby("rank"):
        Trace.from_events(g.reset_index(drop=True), {"world_size": 16}).write(out / f"rank-{r:05d}.parquet")
    return out


def _same_dataset(a: Path, b: Path) -> None:
    fa, fb = sorted(p.name for p in a.iterdir()), sorted(p.name for p in b.iterdir())
    assert fa == fb and fa
    for name in fa:
        ta, tb = pq.read_table(a / name), pq.read_table(b / name)
        assert ta.equals(tb)
        assert ta.schema.metadata == tb.schema.metadata


def test_parallel_ingest_writes_the_serial_dataset(dlrm_dir, tmp_path) -> None:
    serial = ingest_to_dataset(dlrm_dir, tmp_path / "serial")
    mapped = par.ingest_to_dataset_parallel(dlrm_dir, tmp_path / "mapped")  # same tasks, no Dask
    _same_dataset(serial, mapped)


@pytest.mark.slow
def test_dask_ingest_and_analyses_equal_serial(dlrm_dir, predicted_ds, tmp_path) -> None:
    assert par.dask_available(), "dask.distributed is missing: `make test` installs the [scale] extra"
    serial = ingest_to_dataset(dlrm_dir, tmp_path / "serial")
    dask_ds = par.ingest_to_dataset_parallel(dlrm_dir, tmp_path / "dask", workers=2)
    _same_dataset(serial, dask_ds)
    t = read_trace(predicted_ds)
    assert ds.dataset_volumes(predicted_ds, ("parallelism", "op"), workers=2).equals(
        t.volumes(("parallelism", "op")))
    m = ds.dataset_matrix(predicted_ds, "ring", workers=2)
    assert (m != t.matrix("ring")).nnz == 0
    # an existing cluster, used as it is, through the command line
    from dask.distributed import LocalCluster

    with LocalCluster(n_workers=1, threads_per_worker=1, processes=True, dashboard_address=":0") as cluster:
        assert main(["ingest", str(dlrm_dir), "--dataset", "--out", str(tmp_path / "sched"),
                     "--scheduler", cluster.scheduler_address]) == 0
        assert ds.dataset_rank_summary(predicted_ds, scheduler=cluster.scheduler_address).equals(
            ds.rank_summary(t.events))
    _same_dataset(serial, tmp_path / "sched")


def test_volumes_equal_in_memory(dlrm_dir, predicted_ds, tmp_path) -> None:
    dl = ingest_to_dataset(dlrm_dir, tmp_path / "dl")
    for d in (dl, predicted_ds):
        t = read_trace(d)
        for by in (("parallelism",), ("op", "phase"), ()):
            for sent_only in (False, True):
                got = ds.dataset_volumes(d, by, sent_only)
                want = t.volumes(by, sent_only=sent_only)
                pd.testing.assert_frame_equal(got, want, check_dtype=False)
                assert got.equals(want.astype(got.dtypes.to_dict())) if by else True


@pytest.mark.parametrize("algorithm", ["ring", "direct"])
def test_matrix_equals_in_memory(dlrm_dir, predicted_ds, tmp_path, algorithm) -> None:
    dl = ingest_to_dataset(dlrm_dir, tmp_path / "dl")
    for d in (dl, predicted_ds):
        t = read_trace(d)
        want = t.matrix(algorithm)
        got = ds.dataset_matrix(d, algorithm)
        want.sort_indices()
        got.sort_indices()
        assert np.array_equal(got.indptr, want.indptr) and np.array_equal(got.indices, want.indices)
        assert np.array_equal(got.data, want.data)  # bit for bit
        node = ds.dataset_matrix(d, algorithm, level="node", gpus_per_node=2)
        assert np.allclose(node.toarray(), t.matrix(algorithm, level="node", gpus_per_node=2).toarray(),
                           rtol=1e-12, atol=0)
        sub = ds.dataset_matrix(d, algorithm, op="all_reduce")
        assert np.array_equal(sub.toarray(), t.matrix(algorithm, op="all_reduce").toarray())


def test_rank_summary_and_repeatability_equal_in_memory(predicted_ds) -> None:
    t = read_trace(predicted_ds)
    pd.testing.assert_frame_equal(ds.dataset_rank_summary(predicted_ds), ds.rank_summary(t.events))
    s = ds.rank_summary(t.events)
    assert (s["iterations"] == 3).all() and s["calls"].sum() == len(t.events)
    got = ds.dataset_repeatability(predicted_ds, reference_iteration=0)
    want = repeatability(t.events, reference_iteration=0).sort_values(["rank", "iteration"], ignore_index=True)
    pd.testing.assert_frame_equal(got, want)
    odd = got[~got["identical"]]
    assert sorted(odd["rank"]) == [3, 9] and (odd["iteration"] == 2).all()  # the alteration is seen


def test_cli_workers_and_refusals(dlrm_dir, tmp_path, capsys) -> None:
    assert main(["ingest", str(dlrm_dir), "--dataset", "--out", str(tmp_path / "w1"), "--workers", "1"]) == 0 \
        if par.dask_available() else True
    assert main(["ingest", str(dlrm_dir), "--out", str(tmp_path / "s")]) == 0
    if par.dask_available():
        _same_dataset(tmp_path / "w1", tmp_path / "s")
    assert main(["ingest", str(dlrm_dir), "--out", str(tmp_path / "one.parquet"), "--workers", "2"]) == 2
    assert "--dataset" in capsys.readouterr().err
    assert not (tmp_path / "one.parquet").exists()
    assert main(["ingest", str(dlrm_dir), "--out", str(tmp_path / "w0"), "--workers", "0"]) == 2
    assert not (tmp_path / "w0").exists()


def test_without_dask_runs_serially(dlrm_dir, tmp_path, monkeypatch) -> None:
    monkeypatch.setattr(par, "dask_available", lambda: False)
    with pytest.warns(UserWarning, match="serially"):
        out = par.ingest_to_dataset_parallel(dlrm_dir, tmp_path / "x", workers=2)
    _same_dataset(out, ingest_to_dataset(dlrm_dir, tmp_path / "y"))
    with pytest.raises(ConfigError, match="scale"):
        par.map_tasks(len, ["a"], scheduler="tcp://127.0.0.1:1")


def test_bad_or_duplicate_file_leaves_nothing(dlrm_dir, tmp_path) -> None:
    src = tmp_path / "in"
    src.mkdir()
    files = sorted(dlrm_dir.iterdir())
    for f in files[:3]:
        (src / f.name).write_bytes(f.read_bytes())
    (src / "zz_broken.json").write_bytes(files[3].read_bytes()[:5000])
    with pytest.raises(TraceFormatError, match="zz_broken"):
        par.ingest_to_dataset_parallel(src, tmp_path / "out")
    assert not (tmp_path / "out").exists() and not list(tmp_path.glob(".out.*"))
    (src / "zz_broken.json").write_bytes(files[0].read_bytes())  # a second file claiming rank 0's rank
    with pytest.raises(TraceFormatError, match="already claimed"):
        par.ingest_to_dataset_parallel(src, tmp_path / "out")
    assert not (tmp_path / "out").exists() and not list(tmp_path.glob(".out.*"))
