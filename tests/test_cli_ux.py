"""What a newcomer meets at the command line (issue 13): clear one-line errors with the right exit status,
outputs checked before any work and published together, shareable file modes, refusals naming the rule,
CLI conventions (--version, --quiet, --debug, help with defaults, no reST markup) and warnings for legal but
surprising configurations. CLI tests run the real entry point (``python -m llmcomm``) in a subprocess."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
import warnings
from pathlib import Path

import pytest

import llmcomm as lc
from llmcomm.errors import ConfigError, LLMCommError, TraceFormatError, UsageError

ROOT = Path(__file__).resolve().parent.parent
L7B = "aicb/L7B-M1-C04_Llama7B_megatron_tp2_pp1_mbs1.csv"


def llmcomm(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
           "MPLBACKEND": "Agg"}
    return subprocess.run([sys.executable, "-m", "llmcomm", *args], capture_output=True, text=True, cwd=cwd,
                          env=env, timeout=600)


def one_error_line(r: subprocess.CompletedProcess[str], status: int, *words: str) -> str:
    """The run failed with ``status`` and one stderr line (no traceback) holding every word."""
    assert r.returncode == status, (r.returncode, r.stderr)
    assert "Traceback" not in r.stderr, r.stderr
    lines = [x for x in r.stderr.splitlines() if x.strip() and "warning:" not in x]
    assert len(lines) == 1, r.stderr
    for w in words:
        assert w in lines[0], (w, lines[0])
    return lines[0]


def kineto_file(path: Path, rank: int, world: int, collectives: bool = True) -> Path:
    rec = {"Collective name": "allreduce", "In msg nelems": 8, "Out msg nelems": 8, "dtype": "Float",
           "Group size": world, "Process Group Ranks": str(list(range(world)))}
    evs = [{"ph": "X", "cat": "cpu_op", "name": "record_param_comms" if collectives else "aten::mm", "pid": 1,
            "tid": 1, "ts": 10 * i, "dur": 5, "args": rec} for i in range(3)]
    path.write_text(json.dumps({"distributedInfo": {"rank": rank, "world_size": world}, "traceEvents": evs}))
    return path


# -- 1: a broken YAML file ------------------------------------------------------------------------------
def test_broken_yaml_is_a_config_error_naming_file_and_line(tmp_path) -> None:
    bad = tmp_path / "broken.yaml"
    bad.write_text("name: x\nnum_layers: 4\nhidden_size: [64\nffn_hidden_size: 256\n")
    for load in (lc.load_model, lc.load_cluster):
        with pytest.raises(ConfigError, match=r"broken\.yaml line \d+, column \d+: not valid YAML"):
            load(bad)
    one_error_line(llmcomm("models", str(bad)), 1, "broken.yaml", "line")
    one_error_line(llmcomm("clusters", str(bad)), 1, "broken.yaml", "line")


# -- 2, 3: outputs checked first, published together -------------------------------------------------------
@pytest.mark.parametrize(("out_args", "words"), [
    (["--out", "pred.csv"], ["--out pred.csv", ".parquet"]),
    (["--out", "missing/x.parquet"], ["folder missing does not exist"]),
    (["--out", "."], ["is a folder"]),
    (["--out", "x.parquet", "--matrix", "m.txt"], ["--matrix m.txt", ".png"]),
    (["--out", "/proc/x.parquet"], ["cannot write in folder /proc"]),
])
def test_predict_checks_outputs_before_any_work(tmp_path, out_args, words) -> None:
    r = llmcomm("predict", "tiny-gpt", "--tp", "2", *out_args, cwd=tmp_path)
    one_error_line(r, 2, *words)
    assert "TP share" not in r.stdout  # refused before predicting
    assert sorted(p.name for p in tmp_path.iterdir()) == []  # nothing left behind


def test_unwritable_folder_is_refused(tmp_path) -> None:
    """An output whose folder cannot take a new file is refused before any work: a path below a regular file
    (for every user, root included) and a read-only folder (for the users its permissions stop)."""
    blocker = tmp_path / "notes.txt"
    blocker.write_text("a regular file")
    one_error_line(llmcomm("predict", "tiny-gpt", "--out", str(blocker / "x.parquet")), 2, "is not a folder")
    assert blocker.read_text() == "a regular file"
    ro = tmp_path / "ro"
    ro.mkdir()
    ro.chmod(0o555)
    try:
        try:
            (ro / "probe").write_text("x")
            return  # root writes in a read-only folder: the case below a file above is the one that applies
        except OSError:
            pass
        one_error_line(llmcomm("predict", "tiny-gpt", "--out", str(ro / "x.parquet")), 2, "cannot write in folder")
    finally:
        ro.chmod(0o755)


def test_predict_outputs_appear_together_or_not_at_all(tmp_path, monkeypatch, capsys) -> None:
    from llmcomm.cli import main
    from llmcomm.predict import cli as pcli

    ok = llmcomm("predict", "tiny-gpt", "--tp", "2", "--out", "x.parquet", "--matrix", "m.svg", cwd=tmp_path)
    assert ok.returncode == 0, ok.stderr
    assert {p.name for p in tmp_path.iterdir()} == {"x.parquet", "m.svg"}
    fail = tmp_path / "fail"
    fail.mkdir()

    def broken(*a: object, **k: object) -> None:
        raise RuntimeError("disk full")

    monkeypatch.setattr(pcli, "_write_matrix", broken)
    rc = main(["predict", "tiny-gpt", "--tp", "2", "--out", str(fail / "x.parquet"), "--matrix", str(fail / "m.png")])
    err = capsys.readouterr().err
    assert rc == 1 and "disk full" in err and "run with --debug for the traceback" in err
    assert list(fail.iterdir()) == []  # the trace written before the failing figure is gone too


def test_unexpected_error_is_one_line_unless_debug(monkeypatch, capsys) -> None:
    import llmcomm.cli as cli

    def boom(args: object) -> int:
        raise KeyError("surprise")

    monkeypatch.setattr(cli, "cmd_models", boom)
    assert cli.main(["models"]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["llmcomm models: unexpected error: KeyError: 'surprise'", "run with --debug for the traceback"]
    with pytest.raises(KeyError):
        cli.main(["models", "--debug"])
    with pytest.raises(KeyError):
        cli.main(["--debug", "models"])


def test_collect_refuses_zero_iterations_up_front(tmp_path) -> None:
    r = llmcomm("collect", "--model", "tiny-gpt", "--iters", "0", "--out", "t.parquet", cwd=tmp_path)
    assert r.returncode == 2 and "argument --iters: 0 must be a positive integer" in r.stderr, r.stderr
    assert "Traceback" not in r.stderr
    assert list(tmp_path.iterdir()) == []


# -- 4: file modes -------------------------------------------------------------------------------------
def _mode(p: Path) -> int:
    return stat.S_IMODE(p.stat().st_mode)


@pytest.mark.parametrize("umask", [0o022, 0o027])
def test_written_files_get_the_users_default_mode(tmp_path, umask) -> None:
    from llmcomm.atomic import write_bytes
    from llmcomm.ingest import ingest_to_dataset

    old = os.umask(umask)
    try:
        write_bytes(tmp_path / "a.bin", b"x")
        lc.predict_traffic(lc.load_model("tiny-gpt"), lc.ParallelConfig(tp=2)).write(tmp_path / "t.parquet")
        src = kineto_file(tmp_path / "r0.json", 0, 1)
        ds = ingest_to_dataset([src], tmp_path / "ds")
    finally:
        os.umask(old)
    assert _mode(tmp_path / "a.bin") == 0o666 & ~umask
    assert _mode(tmp_path / "t.parquet") == 0o666 & ~umask
    assert _mode(ds) == 0o777 & ~umask
    assert all(_mode(f) == 0o666 & ~umask for f in ds.iterdir())


# -- 5: collect validates before starting workers -------------------------------------------------------
@pytest.mark.parametrize(("args", "words"), [
    (["--model", "tiny-gpt", "--tp", "3"], ["tp=3", "num_attention_heads=4"]),
    (["--model", "gpt3-125m"], ["gpt3-125m", "collect workload"]),
    (["--model", "tiny-gpt", "--pp", "4", "--micro-batch", "2", "--global-batch", "4"],
     ["num_microbatches=2 < pp=4"]),
])
def test_collect_validates_before_starting_workers(tmp_path, args, words) -> None:
    r = llmcomm("collect", *args, "--iters", "1", "--out", "t.parquet", cwd=tmp_path)
    one_error_line(r, 1, *words)  # one line from the parent, not a worker's traceback
    assert list(tmp_path.iterdir()) == []


# -- 6: values refused with the rule named --------------------------------------------------------------
def test_ingest_refuses_a_config_that_contradicts_the_world_size(tmp_path) -> None:
    files = [kineto_file(tmp_path / f"r{r}.json", r, 2) for r in range(2)]
    one_error_line(llmcomm("ingest", *map(str, files), "--tp", "3", "--out", "x.parquet", cwd=tmp_path), 1,
                   "tp*pp*cp=3 does not divide the trace's world size 2")
    one_error_line(llmcomm("ingest", *map(str, files), "--tp", "2", "--dp", "2", "--out", "x.parquet",
                           cwd=tmp_path), 1, "tp*pp*dp*cp=4", "world size is 2")
    one_error_line(llmcomm("ingest", str(files[0]), "--rank", "-1", "--out", "x.parquet", cwd=tmp_path), 2,
                   "--rank -1")
    ok = llmcomm("ingest", *map(str, files), "--tp", "2", "--out", "x.parquet", cwd=tmp_path)
    assert ok.returncode == 0, ok.stderr
    t = lc.read_trace(tmp_path / "x.parquet")
    assert t.meta["parallel"]["tp"] == 2 and t.meta["world_size"] == 2 and set(t.events["parallelism"]) == {"tp"}
    assert not (tmp_path / "y.parquet").exists()


def test_ingest_trace_takes_a_dict_of_dimensions(tmp_path) -> None:
    from llmcomm.ingest import ingest_trace

    files = [kineto_file(tmp_path / f"r{r}.json", r, 4) for r in range(4)]
    t = ingest_trace(files, parallel={"tp": 2})  # dp = 4 / 2 from the world size
    assert (t.meta["parallel"]["tp"], t.meta["parallel"]["dp"]) == (2, 2)
    with pytest.raises(ConfigError, match="unknown dimension"):
        ingest_trace(files, parallel={"tensor": 2})
    with pytest.raises(ConfigError, match="expected a ParallelConfig"):
        ingest_trace(files, parallel=[2, 1])
    with pytest.raises(ConfigError, match="rank=-1"):
        ingest_trace(files[:1], rank=-1)


def test_trace_filters_and_groupings_name_what_exists() -> None:
    t = lc.predict_traffic(lc.load_model("tiny-gpt"), lc.ParallelConfig(tp=2, pp=2, global_batch=4))
    with pytest.raises(ConfigError, match="parallelism='xx' is not one of tp, sp"):
        t.matrix(parallelism="xx")
    with pytest.raises(ConfigError, match="no column 'nonexistent'"):
        t.volumes(by=["nonexistent"])
    assert t.matrix(parallelism="tp").sum() > 0


def test_gpipe_with_virtual_stages_is_refused() -> None:
    with pytest.raises(ConfigError, match="vpp=2 needs schedule='interleaved'"):
        lc.ParallelConfig(pp=2, vpp=2, schedule="gpipe", global_batch=4)
    one_error_line(llmcomm("predict", "tiny-gpt", "--pp", "2", "--vpp", "2", "--schedule", "gpipe",
                           "--global-batch", "4"), 1, "--schedule gpipe --vpp 2", "interleaved")


def test_kineto_trace_without_collectives_warns_with_the_count(tmp_path) -> None:
    from llmcomm.ingest import ingest_trace

    f = kineto_file(tmp_path / "r0.json", 0, 1, collectives=False)
    with pytest.warns(UserWarning, match=r"r0\.json: 0 communication calls"):
        t = ingest_trace(f)
    assert len(t) == 0
    r = llmcomm("ingest", str(f), "--out", "x.parquet", cwd=tmp_path)
    assert r.returncode == 0 and "llmcomm: warning:" in r.stderr and "0 communication calls" in r.stderr


# -- 7: CLI messages speak CLI ----------------------------------------------------------------------------
def test_cli_messages_speak_cli(tmp_path) -> None:
    src = kineto_file(tmp_path / "r0.json", 0, 1)
    (tmp_path / "ds").mkdir()
    one_error_line(llmcomm("ingest", str(src), "--out", "ds", cwd=tmp_path), 2, "pass --force")
    assert "overwrite=True" not in llmcomm("ingest", str(src), "--out", "ds", cwd=tmp_path).stderr
    ok = llmcomm("ingest", str(src), "--out", "ds", "--force", cwd=tmp_path)
    assert ok.returncode == 0, ok.stderr
    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "README.md").write_text("# notes")
    (docs / "LICENSE").write_text("x")
    (docs / ".hidden.json").write_text("{}")
    line = one_error_line(llmcomm("ingest", str(docs), "--out", "y.parquet", cwd=tmp_path), 1, "no trace files")
    for why in ("README.md (documentation or notes)", "LICENSE (documentation or notes)", ".hidden.json (hidden)"):
        assert why in line
    with pytest.raises(TraceFormatError) as e:
        lc.ingest_trace([])
    assert "[" not in str(e.value)


def test_reproduce_with_no_matching_notebook_creates_nothing(tmp_path) -> None:
    build = ROOT / "build"
    before = build.exists() and sorted(p.name for p in build.rglob("*"))
    one_error_line(llmcomm("reproduce", "--only", "99", cwd=tmp_path), 2, "--only 99", "no notebook")
    assert (build.exists() and sorted(p.name for p in build.rglob("*"))) == before
    assert list(tmp_path.iterdir()) == []


# -- 11: conventions ---------------------------------------------------------------------------------------
def test_version_and_clusters() -> None:
    r = llmcomm("--version")
    assert r.returncode == 0 and r.stdout.strip() == f"llmcomm {lc.__version__}"
    r = llmcomm("clusters")
    assert r.returncode == 0
    for name in lc.list_clusters():
        assert name in r.stdout
    r = llmcomm("clusters", "h100-80g-ndr400")
    assert r.returncode == 0 and "gpus_per_node" in r.stdout


def test_usage_errors_exit_2_config_errors_exit_1() -> None:
    assert llmcomm("predict", "tiny-gpt", "--tp", "two").returncode == 2
    assert llmcomm("nonsense").returncode == 2
    one_error_line(llmcomm("predict", "tiny-gpt", "--tp", "3"), 1, "tp=3")


def _subparsers() -> dict:
    from llmcomm.cli import build_parser

    return build_parser()._subparsers._group_actions[0].choices


@pytest.mark.parametrize("command", ["predict", "collect", "ingest"])
def test_every_option_has_help_with_its_default(command) -> None:
    import argparse

    from llmcomm.cli import HelpFormatter

    fmt = HelpFormatter(command)
    for a in _subparsers()[command]._actions:
        if not a.option_strings or a.help == argparse.SUPPRESS or isinstance(a, argparse._HelpAction):
            continue
        assert a.help, f"{command} {a.option_strings[0]} has no help"
        if a.required or isinstance(a, argparse._StoreTrueAction):
            continue
        assert "default" in fmt._get_help_string(a).lower(), f"{command} {a.option_strings[0]}: no default"


def test_help_has_no_restructuredtext_markup() -> None:
    for name in ["", *_subparsers()]:
        r = llmcomm(*([name] if name else []), "--help")
        assert r.returncode == 0
        for mark in ("``", ":func:", ":class:", ":mod:", "::"):
            assert mark not in r.stdout, (name, mark)
    assert "(default: 120.0)" in llmcomm("collect", "--help").stdout


def test_quiet_is_accepted_where_progress_is_printed() -> None:
    for name in ("collect", "ingest", "reproduce"):
        assert "--quiet" in _subparsers()[name].format_help()


def test_ingest_progress_bar_counts_files(tmp_path, capsys) -> None:
    from llmcomm.ingest import ingest_trace

    files = [kineto_file(tmp_path / f"r{r}.json", r, 3) for r in range(3)]
    ingest_trace(files, progress=True)
    assert "ingest" in capsys.readouterr().err
    ingest_trace(files)
    assert capsys.readouterr().err == ""


# -- 12: legal but surprising ------------------------------------------------------------------------------
def test_tp_spanning_nodes_warns() -> None:
    r = llmcomm("predict", "gpt3-175b", "--tp", "16", "--cluster", "h100-80g-ndr400")
    assert r.returncode == 0, r.stderr
    assert "llmcomm: warning: tp=16 spans 2 nodes of h100-80g-ndr400" in r.stderr
    r = llmcomm("predict", "gpt3-175b", "--tp", "8", "--cluster", "h100-80g-ndr400")
    assert r.returncode == 0 and "warning" not in r.stderr


def test_aicb_with_tp_alone_takes_dp_from_the_file(external, tmp_path) -> None:
    from llmcomm.ingest import ingest_trace

    with pytest.warns(UserWarning, match="dp=64 not given; taken from the AICB rows"):
        t = ingest_trace(external(L7B), parallel={"tp": 2})
    assert (t.meta["parallel"]["tp"], t.meta["parallel"]["dp"], t.meta["world_size"]) == (2, 64, 128)
    r = llmcomm("ingest", str(external(L7B)), "--tp", "2", "--out", "l7b.parquet", cwd=tmp_path)
    assert r.returncode == 0 and "dp=64" in r.stderr, r.stderr
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the whole configuration given: nothing to warn about
        ingest_trace(external(L7B), parallel={"tp": 2, "dp": 64})


def test_usage_error_type() -> None:
    assert issubclass(UsageError, LLMCommError)
