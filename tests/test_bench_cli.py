"""`python -m zipccl_jax bench ...`: parsing, progress, tables, JSON and plots."""

import io
import json
import re

import pytest

from zipccl_jax import __main__ as cli
from zipccl_jax.bench import collectives, lm, report
from zipccl_jax.bench import train as trainbench

from conftest import cpu_devices

PNG = b"\x89PNG\r\n\x1a\n"


def test_parsing_of_net_options_and_model_overrides():
    args = cli.parser().parse_args(["bench", "net", "--procs", "3", "--rate", "1gbit, 200mbit", "--d-model", "64",
                                    "--steps", "4", "--json", "out.json"])
    assert (args.what, args.procs, args.rate, args.steps, args.json) == ("net", 3, ["1gbit", "200mbit"], 4, "out.json")
    assert trainbench.config_from_args(args) == lm.Config(d_model=64)


def test_unknown_benchmark_is_an_argparse_error(capsys):
    with pytest.raises(SystemExit):
        cli.parser().parse_args(["bench", "tpu"])
    assert "invalid choice: 'tpu'" in capsys.readouterr().err


def test_progress_lines_count_and_time_each_item():
    out = io.StringIO()
    progress = report.Progress(2, out)
    progress.start("collectives psum 16 MB")
    progress.finish("wire 1.515x")
    progress.start("collectives ppermute 16 MB")
    progress.finish()
    assert re.fullmatch(r"\[1/2\] collectives psum 16 MB \.\.\. \d+\.\d s \(wire 1\.515x\)\n"
                        r"\[2/2\] collectives ppermute 16 MB \.\.\. \d+\.\d s\n", out.getvalue())


def test_table_formats_numbers_and_flags():
    rows = [{"sync": "zip_psum", "bytes": 1234567, "ms": 9.33512, "big ms": 123.456, "same": True}]
    assert report.table(rows) == ("| sync | bytes | ms | big ms | same |\n|---|---|---|---|---|\n"
                                  "| zip_psum | 1,234,567 | 9.335 | 123.5 | True |")
    assert report.table([]) == "(no results)"


def test_bench_collectives_progress_table_json_and_plot(tmp_path, capsys):
    cpu_devices()
    out_json, out_png = tmp_path / "c.json", tmp_path / "c.png"
    collectives.run_collectives([4096, 65536], 1, "gaussian", ["ppermute"], out_json, out_png, platform="cpu")
    captured = capsys.readouterr()
    assert re.search(r"\[1/2\] collectives ppermute 4 KB \.\.\. .*\n\[2/2\] collectives ppermute 64 KB", captured.err)
    rows = json.loads(out_json.read_text())["rows"]
    assert [r["bytes/device"] for r in rows] == [4096, 65536]
    assert all(r["raw wire B"] == r["bytes/device"] and r["wire ratio"] > 1.3 for r in rows)
    assert "| ppermute | 65,536 | 65,536 |" in captured.out
    assert out_png.read_bytes().startswith(PNG)


def test_bench_train_on_local_devices(tmp_path, capsys):
    cpu_devices()
    out_json, out_png = tmp_path / "t.json", tmp_path / "t.png"
    args = cli.parser().parse_args(["bench", "train", "--steps", "2", "--warmup", "1", "--repeat", "2",
                                    "--d-model", "32", "--n-layers", "1", "--n-heads", "2", "--seq-len", "32",
                                    "--batch-per-device", "2", "--json", str(out_json), "--plot", str(out_png),
                                    "--platform", "cpu"])
    rows = trainbench.run(args)
    captured = capsys.readouterr()
    assert [r["sync"] for r in rows] == list(trainbench.SYNCS)
    assert rows[1]["losses = compress=False"] is True
    assert rows[1]["plan"] == "raw all_reduce" and rows[3]["plan"] == "compressed reduce_scatter+all_gather"  # CPU default
    assert rows[2]["plan"] == "raw all_reduce" and rows[1]["in situ ms"] == "-"  # not autotuned
    result = json.loads(out_json.read_text())["result"]
    zipped = result["syncs"][trainbench.COMPRESSED]
    assert trainbench.losses_identical(result["syncs"]["zip_psum"]["losses"],
                                       result["syncs"]["zip_psum compress=False"]["losses"])
    assert zipped["raw_bytes"] / zipped["wire_bytes"] > 1.2
    assert "[4/4] train zip_psum strategy=compressed" in captured.err
    assert "| zip_psum | " in captured.out and "zipccl wire bytes per device per step" in captured.out
    assert out_png.read_bytes().startswith(PNG)


def test_bench_codec_against_another_build(tmp_path, capsys, monkeypatch):
    """`bench codec --against PATH` loads another build's _zipccl_cpu beside this one (here a copy of
    this build: the same ratios) and times both on the same bytes; a missing module is named."""
    import shutil

    from zipccl_jax import _zipccl_cpu
    from zipccl_jax.bench import codec

    other = tmp_path / "other" / "_zipccl_cpu.so"
    other.parent.mkdir()
    shutil.copy(_zipccl_cpu.__file__, other)
    monkeypatch.setattr(codec, "model_datasets", lambda: [])  # Gaussians only: seconds
    codec.run_against(str(other), 4096, 1, None, 2, tmp_path / "a.json")
    rows = json.loads((tmp_path / "a.json").read_text())["builds"]
    assert [r["data"] for r in rows] == ["gaussian bfloat16", "gaussian float16", "gaussian float32"]
    assert all(r["this ratio"] == r["base ratio"] and float(r["compress this/base"]) > 0 for r in rows)
    assert all(float(r["reduce this/base"]) > 0 for r in rows)  # both builds have the reduce step: timed, sums checked
    assert f"## This build against {other}" in capsys.readouterr().out
    with pytest.raises(SystemExit, match="no module at"):
        codec.run_against(str(tmp_path / "missing.so"), 4096, 1, None, 1)
