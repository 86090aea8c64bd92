"""What a new user hit, round two (issue 23, items 1-15), and the one home of the CLI's parallel options
(issue 19). Each test failed before its fix. Commands run in-process (``llmcomm.cli.main``) to stay quick."""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

import pytest

import llmcomm as lc
from llmcomm.cli import main
from llmcomm.errors import ConfigError

ROOT = Path(__file__).resolve().parent.parent
GPT3_OOM = ["gpt3-175b", "--tp", "8", "--pp", "16", "--dp", "12", "--micro-batch", "64", "--global-batch", "1536",
            "--cluster", "a100-80g-hdr200"]
GPT3_FITS = ["gpt3-175b", "--tp", "8", "--pp", "16", "--dp", "12", "--sp", "--recompute", "selective",
             "--global-batch", "1536", "--cluster", "a100-80g-hdr200"]


def run(capsys, *argv: str) -> tuple[int, str, str]:
    rc = main(list(argv))
    out = capsys.readouterr()
    return rc, out.out, out.err


def usage_error(capsys, *argv: str) -> str:
    with pytest.raises(SystemExit) as e:
        main(list(argv))
    assert e.value.code == 2
    return capsys.readouterr().err


def model_yaml(tmp_path: Path, name: str = "gpt3-175b", **changes: object) -> Path:
    import yaml

    d = lc.load_model(name).to_dict()
    d.update(changes)
    p = tmp_path / "m.yaml"
    p.write_text(yaml.safe_dump(d))
    return p


# -- 1: compare takes the framework from the trace -------------------------------------------------------
def test_compare_takes_the_framework_from_the_traces_metadata(capsys) -> None:
    from llmcomm.compare import compare, trace_framework

    rc, out, _ = run(capsys, "compare", "data/traces/gpt_tp2pp2dp2.parquet")
    assert rc == 0 and "framework torch (the trace's metadata)" in out
    assert "calls in the same order on 8 of 8 ranks" in out and "differs" not in out
    rc, out, _ = run(capsys, "compare", "gpt_tp2pp2dp2", "--framework", "megatron", "-q")
    assert rc == 0 and "tp   differs" in out  # the flag still overrides
    t = lc.read_trace(ROOT / "data/traces/gpt_tp2pp2dp2.parquet")
    assert trace_framework(t.meta) == "torch" and compare(t).meta["framework"] == "torch"
    assert trace_framework({"framework": "megatron", "source": "recorded", "run_config": {}}) == "megatron"
    assert trace_framework({"source": "kineto"}) is None


# -- 2: every field of every input file checked ------------------------------------------------------------
@pytest.mark.parametrize(("changes", "words"), [
    ({"gated_mlp": "false"}, ["gated_mlp='false'", "true or false", "got a string"]),
    ({"tied_embeddings": "maybe"}, ["tied_embeddings='maybe'", "true or false"]),
    ({"add_bias_linear": 1}, ["add_bias_linear=1", "true or false"]),
    ({"num_layers": 96.0}, ["num_layers=96.0", "an integer"]),
    ({"normalization": 3}, ["normalization=3", "a string"]),
    ({"seq_length": 4096}, ["seq_length=4096 exceeds max_position_embeddings=2048"]),
    ({"kv_channels": -128}, ["kv_channels=-128", "positive integer or unset"]),
    ({"moe_layer_freq": [1, "x"]}, ["moe_layer_freq"]),
])
def test_model_yaml_fields_are_checked_by_type_range_and_relation(tmp_path, changes, words) -> None:
    with pytest.raises(ConfigError) as e:
        lc.load_model(model_yaml(tmp_path, **changes))
    msg = str(e.value)
    assert "m.yaml" in msg, msg
    for w in words:
        assert w in msg, (w, msg)


def test_gated_mlp_false_as_a_string_no_longer_counts_as_true(tmp_path) -> None:
    with pytest.raises(ConfigError, match="gated_mlp"):
        lc.load_model(model_yaml(tmp_path, gated_mlp="false"))
    assert lc.load_model(model_yaml(tmp_path, gated_mlp=False)).num_parameters() == \
        lc.load_model("gpt3-175b").num_parameters()


@pytest.mark.parametrize(("line", "words"), [
    ("gpus_per_node: '8'", ["gpus_per_node='8'", "an integer"]),
    ("gpus_per_node: 8.5", ["gpus_per_node=8.5", "an integer"]),
    ("intra_node_bandwidth: true", ["intra_node_bandwidth=True", "a number"]),
    ("num_nodes: two", ["num_nodes='two'"]),
])
def test_cluster_yaml_fields_are_checked(tmp_path, line, words) -> None:
    base = {"name": "x", "gpus_per_node": "8", "gpu": "g", "peak_bf16_flops": "312e12", "gpu_memory_bytes": "80e9",
            "intra_node_bandwidth": "300e9", "inter_node_bandwidth": "25e9"}
    key = line.split(":")[0]
    p = tmp_path / "c.yaml"
    p.write_text("".join(f"{k}: {v}\n" for k, v in base.items() if k != key) + line + "\n")
    with pytest.raises(ConfigError) as e:
        lc.load_cluster(p)
    for w in ["c.yaml", *words]:
        assert w in str(e.value), (w, str(e.value))
    p.write_text("".join(f"{k}: {v}\n" for k, v in base.items()))
    assert lc.load_cluster(p).inter_node_bandwidth == 25e9  # 25e9 (a string to PyYAML) is still a number


def test_parallel_dict_and_sequence_beyond_learned_positions_are_refused() -> None:
    with pytest.raises(ConfigError, match="sp='yes' must be true or false"):
        lc.ParallelConfig.from_dict({"tp": 2, "sp": "yes"}, origin="x.yaml")
    with pytest.raises(ConfigError, match="seq_len=4096 exceeds gpt3-175b's max_position_embeddings=2048"):
        lc.validate(lc.load_model("gpt3-175b"), lc.ParallelConfig(tp=8, seq_len=4096))
    lc.validate(lc.load_model("llama2-7b"), lc.ParallelConfig(tp=8, seq_len=8192))  # rope: no such limit


# -- 3: activations counted ------------------------------------------------------------------------------
def test_time_refuses_a_configuration_whose_activations_do_not_fit(capsys) -> None:
    from llmcomm.overhead import iteration_time
    from llmcomm.overhead.capacity import MemoryWarning
    from llmcomm.overhead.memory import memory

    par = lc.ParallelConfig(tp=8, pp=16, dp=12, micro_batch=64, global_batch=1536)
    m = memory(lc.load_model("gpt3-175b"), par)  # the kit's own memory model says how much (448 GB, then 254 GB)
    assert m.total > 3 * 80e9
    rc, out, err = run(capsys, "time", *GPT3_OOM)
    assert rc == 1 and out == ""
    assert f"{m.activations / 1e9:.1f} GB of activations" in err and "hold 80 GB" in err and "--micro-batch" in err
    with pytest.warns(MemoryWarning, match=rf"needs {m.total / 1e9:.1f} GB per GPU"):
        iteration_time(lc.load_model("gpt3-175b"), par, lc.load_cluster("a100-80g-hdr200"))
    rc, out, err = run(capsys, "time", *GPT3_FITS, "-q")
    assert rc == 0 and out.strip().endswith(" s") and "warning" not in err


# -- 4: which data times each regime -----------------------------------------------------------------------
def test_time_with_nccl_tests_says_which_data_times_each_regime(capsys, external) -> None:
    rc, out, err = run(capsys, "time", *GPT3_FITS, "--nccl-tests", str(external("echo/nccl-test-log/nccl_8.log")))
    assert rc == 0, err
    assert "bandwidth: per regime, below" in out and "your nccl-tests logs" not in out.splitlines()[0]
    assert "all_reduce          8 ranks   8/node  your nccl-tests logs: measured" in out
    assert "shipped calibration: your logs hold no inter-node measurements" in out
    assert "not in your nccl-tests logs" in err and "all_reduce over 12 ranks (1/node)" in err


def test_a_log_without_intra_node_rows_leaves_tp_to_the_shipped_calibration(external) -> None:
    import numpy as np

    from llmcomm.overhead import Bandwidth
    from llmcomm.overhead.bandwidth_sources import SHIPPED, USER, SourcedBandwidth

    cluster = lc.load_cluster("a100-80g-hdr200")
    bw = SourcedBandwidth.from_logs([external("echo/nccl-test-log/nccl_16.log")], cluster)
    shipped = Bandwidth.default(cluster)
    for a, b in zip(bw.regime("all_reduce", 8, 8), shipped.regime("all_reduce", 8, 8), strict=True):
        np.testing.assert_array_equal(a, b)  # not the datasheet figures the 16-GPU log used to leave it to
    bw.regime("all_reduce", 16, 8)
    bw.regime("send", 2, 1)
    by = bw.sources().set_index(["op", "group_size", "ranks_per_node"])
    assert by.loc[("all_reduce", 8, 8), "source"] == SHIPPED and by.loc[("all_reduce", 16, 8), "source"] == USER
    assert by.loc[("all_reduce", 16, 8), "detail"] == "measured"
    assert by.loc[("send", 2, 1), "detail"] == "carried from your all_reduce over 16 ranks (8/node)"


# -- 5, 6: work bounded up front --------------------------------------------------------------------------
def test_tune_and_predict_refuse_sizes_they_cannot_handle_at_once(capsys) -> None:
    t0 = time.perf_counter()
    rc, _, err = run(capsys, "tune", "gpt3-175b", "--gpus", "1000000000", "--cluster", "a100-80g-hdr200",
                     "--global-batch", "1536")
    assert rc == 1 and "16,777,216" in err
    rc, _, err = run(capsys, "tune", "gpt3-175b", "--gpus", "1000000", "--cluster", "a100-80g-hdr200",
                     "--global-batch", "1536")
    assert rc == 1 and "no tp·pp·dp split is valid" in err and "884736" in err  # was 2 min 13 s
    rc, _, err = run(capsys, "predict", "gpt3-175b", "--tp", "8", "--pp", "16", "--dp", "1000000000")
    assert rc == 1 and "128,000,000,000 GPUs" in err and "GiB" in err and "unexpected" not in err
    with pytest.raises(ConfigError, match="above the 2,097,152"):
        lc.predict_traffic(lc.load_model("gpt3-175b"), lc.ParallelConfig(tp=8, pp=16, dp=10**9))
    assert time.perf_counter() - t0 < 60


def test_a_search_over_a_second_shows_progress(capsys) -> None:
    from llmcomm.tune.cli import progress_line

    with progress_line("tune: ranking 5 candidates", True, after_s=0.2):
        time.sleep(0.9)
    err = capsys.readouterr().err
    assert "tune: ranking 5 candidates ..." in err and "done in" in err
    with progress_line("quick", True, after_s=0.5):
        pass
    assert capsys.readouterr().err == ""


# -- 7, 10: a notebook's outputs together or not at all ---------------------------------------------------
class FakePapermill:
    """``papermill.execute_notebook`` that writes what a notebook's Outputs writes, then optionally raises."""

    PapermillExecutionError = type("PapermillExecutionError", (Exception,), {})

    def __init__(self, raise_after: int | None = None, exc: type[BaseException] = KeyboardInterrupt) -> None:
        self.raise_after, self.exc, self.kwargs = raise_after, exc, {}

    def execute_notebook(self, src: str, dst: str, parameters: dict, **kw: object) -> None:
        import matplotlib.pyplot as plt

        from llmcomm.reproduce import Outputs

        self.kwargs = kw
        out = Outputs(Path(src).stem, parameters["out_dir"])
        for i in range(3):
            if self.raise_after is not None and i == self.raise_after:
                raise self.exc()
            fig, ax = plt.subplots()
            ax.plot([0, i])
            out.figure(fig, f"f{i}", formats=("png",))
            plt.close(fig)
        out.save()
        Path(dst).write_text("{}")


@pytest.fixture
def fake_pm(monkeypatch):
    import sys

    def install(**kw: object) -> FakePapermill:
        fake = FakePapermill(**kw)
        monkeypatch.setitem(sys.modules, "papermill", fake)
        return fake

    return install


def test_interrupted_notebook_leaves_no_partial_outputs(tmp_path, fake_pm) -> None:
    from llmcomm.reproduce import reproduce

    out = tmp_path / "figs"
    fake_pm(raise_after=2)
    with pytest.raises(KeyboardInterrupt):
        reproduce("quick", only=["08"], out_dir=out, progress=False)
    assert sorted(p.relative_to(out).as_posix() for p in out.rglob("*") if p.is_file()) == []
    fake = fake_pm()
    reproduce("quick", only=["08"], out_dir=out, progress=False)
    files = sorted(p.relative_to(out).as_posix() for p in out.rglob("*") if p.is_file())
    assert files == ["08_config_tuner/f0.png", "08_config_tuner/f1.png", "08_config_tuner/f2.png",
                     "executed/08_config_tuner.ipynb", "results/08_config_tuner.json"]
    assert "--IPKernelApp.log_level=ERROR" in fake.kwargs["extra_arguments"]  # no "TCP without encryption"
    stamp = (out / "08_config_tuner" / "f1.png").stat().st_mtime_ns
    fake_pm(raise_after=1)
    with pytest.raises(KeyboardInterrupt):
        reproduce("quick", only=["08"], out_dir=out, progress=False)
    assert (out / "08_config_tuner" / "f2.png").is_file()  # the previous complete set is untouched
    fake_pm()
    os.utime(out / "08_config_tuner" / "f1.png", ns=(stamp - 10**9, stamp - 10**9))
    reproduce("quick", only=["08"], out_dir=out, progress=False)
    assert (out / "08_config_tuner" / "f1.png").stat().st_mtime_ns == stamp - 10**9  # unchanged bytes: kept
    assert not [p for p in out.iterdir() if p.name.startswith(".staging")]


def test_reproduce_refuses_a_file_as_out_dir_before_running(tmp_path, capsys, fake_pm) -> None:
    from llmcomm.reproduce import default_build_dir

    fake = fake_pm()
    f = tmp_path / "README.md"
    f.write_text("x")
    rc, _, err = run(capsys, "reproduce", "--only", "08", "--out-dir", str(f))
    assert rc == 2 and "is an existing file" in err and fake.kwargs == {}
    rc, _, err = run(capsys, "reproduce", "--only", "08", "--out-dir", str(tmp_path / "no" / "such"))
    assert rc == 2 and "does not exist" in err
    assert default_build_dir("full", tmp_path / "x") == tmp_path / "x" / "executed"  # not build/notebooks
    assert default_build_dir("full", ROOT / "figures") == ROOT / "build" / "notebooks"


def test_empty_and_folder_output_names(tmp_path, capsys, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    assert "an empty name" in run(capsys, "predict", "tiny-gpt", "--out", "")[2]
    _, _, err = run(capsys, "predict", "tiny-gpt", "--out", "missing_dir/")
    assert "names a folder (which does not exist)" in err
    assert list(tmp_path.iterdir()) == []


def test_ingest_with_an_unreachable_scheduler_fails_fast_naming_it(tmp_path, capsys) -> None:
    from test_cli_ux import kineto_file

    f = kineto_file(tmp_path / "r0.json", 0, 1)
    t0 = time.perf_counter()
    rc, _, err = run(capsys, "ingest", str(f), "--out", str(tmp_path / "ds"), "--scheduler", "tcp://127.0.0.1:1")
    assert rc == 1 and "scheduler tcp://127.0.0.1:1: cannot connect" in err and "unexpected" not in err
    assert time.perf_counter() - t0 < 10


# -- 8: compare reads a dataset folder ---------------------------------------------------------------------
def test_compare_reads_an_ingest_dataset_folder(tmp_path) -> None:
    from test_cli_ux import kineto_file

    from llmcomm.compare import load_measured
    from llmcomm.ingest import ingest_to_dataset

    ds = ingest_to_dataset([kineto_file(tmp_path / f"r{r}.json", r, 2) for r in range(2)], tmp_path / "ds")
    t = load_measured(str(ds))
    assert len(t) == 6 and t.world_size == 2


# -- 9: collect checks everything before any worker ------------------------------------------------------------
def test_collect_without_torch_names_the_extra(capsys, monkeypatch, tmp_path) -> None:
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "torch" else real(name, *a))
    rc, _, err = run(capsys, "collect", "--model", "tiny-gpt", "--iters", "1", "--out", str(tmp_path / "t.parquet"))
    assert rc == 2 and "llmcomm[collect]" in err and "ModuleNotFoundError" not in err


@pytest.mark.parametrize(("flag", "value"), [("--lr", "-1"), ("--seed", "-5"), ("--timeout", "0"),
                                             ("--aux-loss-coef", "-0.1"), ("--micro-batch", "0")])
def test_collect_options_are_checked_before_any_worker(capsys, tmp_path, flag, value) -> None:
    err = usage_error(capsys, "collect", "--model", "tiny-gpt", "--iters", "1", "--out", str(tmp_path / "t.parquet"),
                      flag, value)
    assert f"argument {flag}:" in err and "Traceback" not in err


def test_collect_timeout_message_says_what_the_rank_was_doing() -> None:
    from llmcomm.collect.launch import _stage_text

    assert "still starting" in _stage_text(-2) and "set-up" in _stage_text(-1)
    assert _stage_text(3) == "at iteration 3: 3 iteration(s) done"


# -- 11: tune option ranges and the filter that rejected everything -------------------------------------------
@pytest.mark.parametrize(("flag", "value"), [("--memory-fraction", "1.5"), ("--memory-fraction", "0"),
                                             ("--top", "0"), ("--top", "-3"), ("--tp", "0")])
def test_tune_option_ranges(capsys, flag, value) -> None:
    err = usage_error(capsys, "tune", "gpt3-175b", "--gpus", "64", "--cluster", "a100-80g-hdr200",
                      "--global-batch", "64", flag, value)
    assert f"argument {flag}:" in err


def test_tune_names_the_restriction_that_left_nothing(capsys) -> None:
    rc, _, err = run(capsys, "tune", "gpt3-175b", "--gpus", "1024", "--cluster", "a100-80g-hdr200",
                     "--global-batch", "1536", "--tp", "3")
    assert rc == 1 and "no configuration is left by --tp 3 (values that work here: 1, 2, 4, 8" in err, err
    assert "GPU counts that work" not in err


# -- 12: conventions -------------------------------------------------------------------------------------------
def _parsers() -> dict[str, argparse.ArgumentParser]:
    from llmcomm.cli import build_parser

    return build_parser()._subparsers._group_actions[0].choices


@pytest.mark.parametrize("command", ["time", "tune", "compare", "predict", "collect", "ingest"])
def test_every_option_has_help_and_a_default(command) -> None:
    from llmcomm.cli import HelpFormatter

    p = _parsers()[command]
    assert p.description, f"{command} has no description"
    fmt = HelpFormatter(command)
    for a in p._actions:
        if not a.option_strings or a.help == argparse.SUPPRESS or isinstance(a, argparse._HelpAction):
            continue
        assert a.help, f"{command} {a.option_strings[0]} has no help"
        if a.required or isinstance(a, argparse._StoreTrueAction):
            continue
        assert "default" in fmt._get_help_string(a).lower(), f"{command} {a.option_strings[0]}: no default"


def test_quiet_everywhere_and_no_garbled_help(capsys) -> None:
    for name in ("predict", "time", "tune", "compare"):
        assert "--quiet" in _parsers()[name].format_help(), name
    text = " ".join(_parsers()["collect"].format_help().split())
    assert "expert-parallel degree (MoE models;" in text and "expert (MoE" not in text
    rc, out, _ = run(capsys, "predict", "tiny-gpt", "--tp", "2", "-q")
    assert rc == 0 and out == ""


def test_one_home_for_the_parallel_options() -> None:
    """Every subcommand builds its ParallelConfig flags in llmcomm.cli_options, with ParallelConfig's defaults
    (collect's micro-batch was 2)."""
    from llmcomm.cli_options import DEFAULTS

    parsers = _parsers()
    helps = {}
    for name in ("predict", "time", "collect"):
        acts = {a.dest: a for a in parsers[name]._actions}
        assert acts["micro_batch"].default == DEFAULTS["micro_batch"] == 1, name
        assert acts["tp"].default == 1 and acts["schedule"].default == "1f1b"
        helps[name] = acts["tp"].help
    assert len(set(helps.values())) == 1
    acts = {a.dest: a for a in parsers["compare"]._actions}
    assert acts["micro_batch"].default is None and "metadata" in acts["micro_batch"].help


def test_cli_errors_speak_cli_flags() -> None:
    from llmcomm.compare import compare
    from llmcomm.ingest import ingest_trace

    t = lc.predict_traffic(lc.load_model("tiny-gpt"), lc.ParallelConfig(tp=2))
    t.meta.pop("model", None)
    t.meta.pop("model_spec", None)
    with pytest.raises(ConfigError, match="give --model NAME"):
        compare(t)
    from llmcomm import data

    with pytest.raises(lc.TraceFormatError, match="llmcomm ingest --bandwidth"):
        ingest_trace(data.path("echo/nccl-test-log/nccl_2.log"))


# -- 13: TP groups crossing nodes -----------------------------------------------------------------------------
def test_predict_warns_when_tp_groups_cross_node_boundaries(capsys) -> None:
    rc, _, err = run(capsys, "predict", "gpt3-125m", "--tp", "6", "--dp", "4", "--global-batch", "4", "-q")
    assert rc == 0
    assert "tp=6 does not divide the 8 GPUs per node" in err and "2 of 4 TP groups" in err, err
    assert "% of TP wire bytes" in err
    rc, _, err = run(capsys, "predict", "gpt3-125m", "--tp", "4", "--dp", "4", "--global-batch", "4", "-q")
    assert rc == 0 and "warning" not in err


# -- 14: benchmark spread, collect's skipped calls, cluster units ----------------------------------------------
def test_bench_recorder_reports_median_spread_and_cost_per_call() -> None:
    import importlib.util

    spec = importlib.util.spec_from_file_location("bench_recorder", ROOT / "benchmarks" / "bench_recorder.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    off = [[0.02, 0.010, 0.010, 0.010]] * 5
    kernel = [[0.02, 0.011, 0.011, 0.011]] * 4 + [[0.02, 0.02, 0.02, 0.02]]
    lines = mod.report({"off": off, "kernel": kernel, "dispatch": kernel}, {"kernel": 40, "dispatch": 40},
                       steps=4, scale=1, tp=2)
    text = "\n".join(lines)
    assert "5 interleaved rounds" in text and "ratio median 1.100" in text and "range 1.100-2.000" in text
    assert "10 calls per step, 100.0 us per call" in text


def test_collect_says_which_calls_it_skipped(capsys, monkeypatch, tmp_path) -> None:
    import llmcomm.collect.launch as launch

    t = lc.read_trace(ROOT / "data/traces/gpt_tp2pp2dp2.parquet")
    monkeypatch.setattr(launch, "collect", lambda *a, **k: t)
    rc, _, err = run(capsys, "collect", "--model", "tiny-gpt", "--iters", "1", "--out", str(tmp_path / "t.parquet"))
    assert rc == 0 and "not recorded" in err and "13 c10d.scatter_" in err


def test_clusters_print_bandwidth_with_units_and_digits(capsys) -> None:
    rc, out, _ = run(capsys, "clusters")
    row = next(line for line in out.splitlines() if line.startswith("vtrain-a100"))
    assert row.split()[-1] == "12.5" and "inter GB/s" in out
    rc, out, _ = run(capsys, "clusters", "vtrain-a100")
    assert "12.5 GB/s per GPU, one direction" in out


# -- 15: README ------------------------------------------------------------------------------------------------
def test_readme_says_to_point_llmcomm_external_at_the_mirror() -> None:
    text = " ".join((ROOT / "README.md").read_text().split())
    assert "Outside `make`" in text and "export LLMCOMM_EXTERNAL=" in text


@pytest.mark.slow
def test_real_notebook_run_prints_no_kernel_tcp_warning(tmp_path, capfd) -> None:
    from llmcomm.reproduce import reproduce

    reproduce("quick", only=["00"], out_dir=tmp_path / "f", progress=False)
    assert "without encryption" not in capfd.readouterr().err


def test_time_takes_the_cost_models_megatron_flags(capsys) -> None:
    """Issue 20 item 12: `llmcomm time` takes --fp8, --tp-comm-overlap, --overlap-param-gather and
    --attention-backend; each reaches the formulation (FP8 GEMMs make the iteration shorter)."""
    base = ["time", "llama3-70b", "--tp", "4", "--pp", "8", "--dp", "2", "--vpp", "5", "--sp",
            "--distributed-optimizer", "--overlap-grad-reduce", "--global-batch", "128", "--seq-len", "8192",
            "--cluster", "h100-80g-ndr400", "--recompute", "full", "-q"]
    totals = {}
    for name, extra in {"bf16": [], "fp8": ["--tp-comm-overlap", "--overlap-param-gather", "--fp8", "hybrid"],
                        "unfused": ["--attention-backend", "unfused"]}.items():
        rc, out, err = run(capsys, *base, *extra)
        assert rc == 0, err
        totals[name] = float(out.split()[0])
    assert totals["fp8"] < totals["bf16"] < totals["unfused"], totals
