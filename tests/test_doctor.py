"""`overnight doctor` and the baseline's hints on real git targets with small fake trainers."""

from __future__ import annotations

import re
from pathlib import Path

from test_cli import run

from agent.git.repo import init_repo

PREPARE = "def score(lr):\n    return 1.0 + abs(lr - 0.04)\n"
TOML = """[target]
command   = "python train.py"
editable  = ["train.py"]
protected = ["prepare.py", "overnight.toml"]
metric    = "val_loss"
budget_s  = 300
{extra}
"""
HEAD = "import os, time\nfrom prepare import score\nLR = 0.01\n"
SEEDED = "seed = int(os.environ['OVERNIGHT_SEED'])\n"
BUDGET = "budget = float(os.environ['OVERNIGHT_BUDGET_S'])\n"
PROGRESS = "for i in range(1, 4):\n    print(f'| epoch 1 | {i}/3 batches | loss {5 / i:.2f} |')\n"
BLOCK = "print('---')\nprint(f'val_loss: {score(LR):.6f}')\nprint(f'training_seconds: {trained}')\n"
STEPS = "print('num_steps: 3')\n"

GOOD = HEAD + SEEDED + BUDGET + PROGRESS + "trained = budget\n" + BLOCK.replace(
    "score(LR)", "score(LR) + seed * 1e-4") + STEPS
IGNORES_BUDGET = HEAD + "start = time.time()\ntime.sleep(3)\n" + PROGRESS + (
    "trained = round(time.time() - start, 2)\n") + BLOCK
NO_SUMMARY = HEAD + BUDGET + PROGRESS + "print('done, val_loss', score(LR))\n"
PROGRESS_REGEX = r"""progress_regex = '(?P<step>\d+)/\d+ batches \| loss (?P<loss>[\d.]+)'"""


def target(tmp_path: Path, train: str, extra: str = PROGRESS_REGEX) -> Path:
    root = tmp_path / "t"
    root.mkdir()
    (root / "train.py").write_text(train)
    (root / "prepare.py").write_text(PREPARE)
    (root / "overnight.toml").write_text(TOML.format(extra=extra))
    init_repo(root)
    return root


def doctor(root: Path, *extra: str):
    return run("doctor", "--target", str(root), "--budget", "1", "--timeout", "30", *extra,
               check=False)


def lines_with(out: str, mark: str) -> list[str]:
    return [line for line in out.splitlines() if line.startswith(mark)]


def test_a_good_script_passes_every_check(tmp_path: Path):
    proc = doctor(target(tmp_path, GOOD))
    out = proc.stdout
    assert proc.returncode == 0, out + proc.stderr
    assert lines_with(out, "✗") == [] and lines_with(out, "!") == [], out
    for name in ("summary block", "metric: val_loss = 1.03", "budget honoured: trained 1 s of 1 s",
                 "progress lines: 3 parsed", "metric safe from proposals", "knobs: 1 searched",
                 "knob: LR = 0.01 (train.py:3): searched",
                 "seed used: val_loss 1.0342 (seed 42), 1.0343 (seed 43)", "noise",
                 "load check: throughput from summary: num_steps", "start-up overhead",
                 "checkout committed"):
        assert name in out, name
    assert "0 failed, 0 warning(s)" in out


def test_a_script_that_ignores_the_budget_is_told_to_read_it(tmp_path: Path):
    proc = doctor(target(tmp_path, IGNORES_BUDGET))
    assert proc.returncode == 1
    failed = lines_with(proc.stdout, "✗")
    assert len(failed) == 1 and failed[0].startswith("✗ budget honoured: trained 3")
    assert "OVERNIGHT_BUDGET_S" in proc.stdout.split(failed[0])[1].splitlines()[1]


def test_a_script_without_a_summary_block_is_told_how_to_print_one(tmp_path: Path):
    proc = doctor(target(tmp_path, NO_SUMMARY, extra=""))
    assert proc.returncode == 1
    out = proc.stdout
    failed = lines_with(out, "✗")
    assert [f.split(":")[0] for f in failed] == ["✗ summary block", "✗ budget honoured"]
    assert "`val_loss: <value>`" in out and "`---`" in out
    warned = lines_with(out, "!")
    assert [w.split(":")[0] for w in warned] == ["! progress lines"]  # no progress_regex given
    assert "progress_regex" in out


def test_a_command_flag_that_overrides_an_editable_default_is_warned(tmp_path: Path):
    train = GOOD.replace("LR = 0.01\n", "import argparse\np = argparse.ArgumentParser()\n"
                         "p.add_argument('--lr', type=float, default=0.01)\n"
                         "LR = p.parse_args().lr\n")
    root = target(tmp_path, train, extra=PROGRESS_REGEX)
    toml = (root / "overnight.toml").read_text().replace("python train.py",
                                                          "python train.py --lr 0.02")
    (root / "overnight.toml").write_text(toml)
    init_repo(root, "flag in the command")
    proc = doctor(root, "--runs", "1")
    warned = lines_with(proc.stdout, "! command flags")
    assert len(warned) == 1 and "--lr" in warned[0], proc.stdout


def test_run_says_what_failed_on_the_baseline(tmp_path: Path):
    root = target(tmp_path, NO_SUMMARY, extra="")
    proc = run("run", "--target", str(root), "--budget", "1", "--experiments", "1",
               "--db", str(tmp_path / "o.db"), check=False)
    out = proc.stdout
    assert "the baseline and the script contract" in out, out + proc.stderr
    assert "✗ summary block: none in the log" in out and "overnight doctor" in out


def test_a_script_that_ignores_the_seed_and_reports_no_speed_is_told_both(tmp_path: Path):
    train = HEAD + BUDGET + "trained = budget\n" + BLOCK  # no seed, no steps, no progress
    proc = doctor(target(tmp_path, train, extra=""))
    out = proc.stdout
    (seed,) = lines_with(out, "! seed used")
    assert "seeds 42, 43" in seed and "OVERNIGHT_SEED" in seed, out
    assert "OVERNIGHT_SEED', 1337" in out.split(seed)[1].splitlines()[1]  # the line to add
    (load,) = lines_with(out, "! load check")
    assert "cannot be checked" in load and "num_steps" in out.split(load)[1].splitlines()[1]


def test_runs_at_very_different_speeds_blame_the_machine():
    from agent.rules.contract import check_speed
    from agent.rules.placement import Sample

    steady = [Sample(1.0, 100.0, source="summary: num_steps"), Sample(1.1, 95.0)]
    assert check_speed(steady).status == "ok"
    check = check_speed([Sample(1.0, 281.0, source="progress: elapsed"), Sample(1.0, 120.0)])
    assert check.status == "warn" and "281/s then 120/s" in check.detail
    assert "progress: elapsed" in check.detail and "load" in check.detail


def test_run_says_at_the_baseline_when_the_seed_is_ignored_and_the_load_unchecked(tmp_path):
    train = HEAD + BUDGET + "trained = budget\n" + BLOCK  # no seed, no steps, no progress
    root = target(tmp_path, train, extra="")
    proc = run("run", "--target", str(root), "--budget", "1", "--experiments", "1",
               "--db", str(tmp_path / "o.db"), check=False)
    out = proc.stdout
    assert "the baseline and the script contract" in out, out + proc.stderr
    (seed,) = lines_with(out, "! seed used")
    assert "seeds 42, 43, 44, 45, 46" in seed and "ignores OVERNIGHT_SEED" in seed
    assert "each change runs once" in seed
    assert "OVERNIGHT_SEED', 1337" in out  # the line to add
    (load,) = lines_with(out, "! load check")
    assert "cannot be checked" in load


def test_a_missing_git_ignored_file_is_an_asset_and_its_knock_on_failures_fold_under_it(
        tmp_path: Path):
    train = GOOD.replace("budget = float", "open('data/tokens.bin').read()\nbudget = float")
    root = target(tmp_path, train)
    (root / ".gitignore").write_text("*.bin\n")
    (root / "data").mkdir()
    (root / "data" / "tokens.bin").write_text("0123")  # in the checkout, not in git
    init_repo(root, "ignore the data")
    proc = doctor(root, "--runs", "1")
    out = proc.stdout
    failed = lines_with(out, "✗")
    assert [f.split(":")[0] for f in failed] == ["✗ runs"], out  # one failure, not three
    after = out.split(failed[0])[1].splitlines()[1:]
    assert after[0].strip().startswith("so: summary block") and "so: budget honoured" in after[1]
    assert "fix: data/tokens.bin is git-ignored" in after[2] and 'assets = ["data/tokens.bin"]' \
        in after[2]


def test_a_value_the_run_prints_differently_is_overridden_somewhere(tmp_path: Path):
    train = GOOD.replace("LR = 0.01\n", "LR = 0.01\nLR_SEEN = 0.5 if os.environ.get('X') is None "
                         "else LR\nprint(f'config: LR = {LR_SEEN}')\n")
    proc = doctor(target(tmp_path, train), "--runs", "1")
    warned = lines_with(proc.stdout, "! effective config")
    assert len(warned) == 1 and "LR (train.py:3 says 0.01, the run printed 0.5)" in warned[0]


def test_the_baseline_overhead_is_one_runs_not_the_span_of_all_its_runs(tmp_path: Path):
    from datetime import UTC, datetime, timedelta

    from test_store_contract import spec

    from agent.core.domain import (
        ExperimentStatus,
        Finish,
        Proposal,
        RunEnd,
        RunRole,
        RunSpec,
        RunStatus,
    )
    from db.engine import open_database
    from db.models import RunRow
    from db.reads import Reads
    from db.store import SqlStore
    from overnight.cli_setup import baseline_checks

    store = SqlStore(open_database(tmp_path / "o.db"))
    sweep = store.create_sweep(spec())
    base = store.add_experiment(sweep.id, Proposal("baseline", ""), is_baseline=True)
    store.claim(base.id)
    summary = {"val_bpb": 1.0, "training_seconds": 9.0}
    t0 = datetime(2026, 12, 1, 22, tzinfo=UTC)
    for i, wall in enumerate((19.0, 20.0, 21.0, 20.0, 20.0)):  # a minute apart, 9 s training
        run = store.start_run(RunSpec(sweep.id, base.id, "c0", 42 + i, RunRole.BASELINE))
        store.end_run(run.id, RunEnd(RunStatus.OK, metric=1.0, summary=summary, training_s=9.0))
        with store.session("dating a run") as s:
            row = s.get(RunRow, run.id)
            assert row is not None
            row.started_at = t0 + timedelta(minutes=i)
            row.ended_at = row.started_at + timedelta(seconds=wall)
    store.finish(base.id, Finish(ExperimentStatus.KEPT, metric=1.0, summary=summary,
                                 run_started_at=t0, run_ended_at=t0 + timedelta(seconds=260)))
    (overhead,) = [c for c in baseline_checks(Reads(store), store.get_sweep_by_id(sweep.id))
                   if c.name == "start-up overhead"]
    assert overhead.detail == "55% of 20.0 s wall time is not training"  # not 97% of 260 s


def test_a_module_the_interpreter_lacks_gets_the_pip_line_for_that_interpreter(tmp_path: Path):
    import sys

    train = "import overnight_absent_dependency\n" + GOOD  # e.g. tensorboard, not installed
    out = " ".join(doctor(target(tmp_path, train), "--runs", "1").stdout.split())
    assert ("✗ runs: the run failed: ModuleNotFoundError: No module named "
            "'overnight_absent_dependency'") in out, out
    assert (f"fix: overnight_absent_dependency is not installed for the interpreter the command "
            f"runs with ({sys.executable}): install it there, e.g. `{sys.executable} -m pip "
            "install overnight_absent_dependency`") in out, out
    assert "run the command by hand" not in out


def test_the_pip_line_names_the_distribution_and_a_wrapper_gets_no_pip_line(tmp_path: Path):
    from agent.core.config import TargetConfig
    from agent.ops.doctor import missing_dependency

    error = "ModuleNotFoundError: No module named 'cv2'"
    config = TargetConfig(command="/opt/env/bin/python3 train.py", editable=("train.py",),
                          metric="val_loss")
    assert "`/opt/env/bin/python3 -m pip install opencv-python`" in str(
        missing_dependency(config, error, tmp_path))
    wrapped = missing_dependency(TargetConfig(command="bash run.sh", editable=("train.py",),
                                              metric="val_loss"), error, tmp_path)
    assert wrapped is not None and "pip install" not in wrapped and "`bash run.sh`" in wrapped
    assert missing_dependency(config, "NameError: name 'x' is not defined", tmp_path) is None
    (tmp_path / "src" / "cv2").mkdir(parents=True)  # the repository's own: not a pip install
    assert missing_dependency(config, error, tmp_path) is None


def test_run_gives_the_same_pip_line_when_the_baseline_lacks_a_module(tmp_path: Path):
    import sys

    root = target(tmp_path, "import overnight_absent_dependency\n" + GOOD)
    proc = run("run", "--target", str(root), "--budget", "1", "--experiments", "1",
               "--db", str(tmp_path / "o.db"), check=False)
    out = " ".join(proc.stdout.split())
    assert "✗ runs: the run failed: missing import before training: ModuleNotFoundError" in out
    assert f"`{sys.executable} -m pip install overnight_absent_dependency`" in out, out
    assert out.endswith("nothing compared: the baseline has no value"), out  # not "…the noise"


def test_a_script_that_reads_the_budget_but_times_out_is_told_where_the_time_went(
        tmp_path: Path):
    """nanoGPT-style: the loop evaluates from step 0, and on this machine that outlasts the
    timeout; "read the budget" would be the wrong fix, the script does."""
    train = HEAD + BUDGET + (
        "class Opt:\n    def step(self):\n        pass\n"
        "def estimate_loss():\n    time.sleep(30)\n"
        "opt = Opt()\nstart = time.time()\n"
        "for step in range(1000):\n"
        "    if step % 500 == 0:\n        print('evaluating', flush=True)\n"
        "        estimate_loss()\n"
        "    opt.step()\n"
        "    if time.time() - start > budget:\n        break\n"
        "trained = time.time() - start\n") + BLOCK
    root = target(tmp_path, train)
    proc = run("doctor", "--target", str(root), "--budget", "1", "--timeout", "3", "--runs",
               "1", check=False)
    out = " ".join(proc.stdout.split())
    assert "✗ budget honoured: killed at the 3 s timeout with a 1 s budget" in out, out
    line = train.splitlines().index("    if step % 500 == 0:") + 1
    assert ("fix: the script reads OVERNIGHT_BUDGET_S, so the time went elsewhere: its last "
            f"line was `evaluating`; the training loop evaluates at train.py:{line} (`if step "
            "% 500 == 0:`), which counts as training") in out, out
    assert "fix: read the budget" not in out


def test_work_after_the_summary_block_is_named_as_the_overhead(tmp_path: Path):
    """ng-video-lecture samples 500 tokens after its last print: "raise budget_s" would not
    help; skipping that work under overnight does."""
    train = GOOD + "time.sleep(10)  # sampling from the model, after the summary\n"
    proc = run("doctor", "--target", str(target(tmp_path, train)), "--budget", "1",
               "--timeout", "60", "--runs", "1", check=False)
    out = " ".join(proc.stdout.split())
    m = re.search(r"! start-up overhead: \d+% of ([\d.]+) s wall time is not training, "
                  r"([\d.]+) s of it after the summary block", out)
    assert m, out
    # the 10 s sleep, less however late a loaded machine saw the summary line: most of it
    wall, after = float(m.group(1)), float(m.group(2))
    assert 5.0 <= after <= wall, out
    assert ("fix: a run ends when the script exits, and nothing after the summary block is "
            "read: skip that work") in out and "raise budget_s" not in out, out


def test_a_run_past_its_budget_is_told_what_the_loop_tells_each_run():
    """makemore at a 20 s budget trained 23.8 s in 3.97 s steps: its last step ran past the
    budget, so one step more or less is a fifth of the run. Doctor says what every run of the
    night will say (contract_warnings), in the same words, and at the same threshold."""
    from agent.core.config import parse_config
    from agent.rules.contract import RunFacts, check_budget, contract_warnings

    config = parse_config({"command": "python x.py", "editable": ["x.py"], "metric": "m",
                           "budget_s": 20})

    def told(summary: dict[str, float], status: str) -> str:
        call = check_budget(config, RunFacts(False, 0, 60.0, summary, 0))
        assert call.status == status, call
        assert contract_warnings(summary, 20) == ([] if status == "ok" else [call.detail])
        return call.detail

    one_step = told({"training_seconds": 23.8, "num_steps": 6}, "warn")
    assert one_step == (
        "trained 23.8 s for a 20 s budget (19% over): its last step ran past it (3.97 s a step, "
        "and the loop reads the clock between steps), so runs train a whole number of steps and "
        "one more or less is 20% of the budget")
    assert told({"training_seconds": 23.8, "num_steps": 60}, "warn") == (
        "trained 23.8 s for a 20 s budget (19% over): runs are not comparable; does the script "
        "stop at OVERNIGHT_BUDGET_S?")
    assert told({"training_seconds": 20.9, "num_steps": 60}, "ok") == "trained 20.9 s of 20 s"
    assert told({"training_seconds": 19.5, "num_steps": 6}, "ok") == "trained 19.5 s of 20 s"
    assert told({"training_seconds": 9.0}, "warn") == (
        "trained only 9 s of a 20 s budget: something ends training first, a step or epoch cap "
        "or a loop that does not read OVERNIGHT_BUDGET_S")
    assert told({"training_seconds": 40.0}, "fail").endswith("stop at OVERNIGHT_BUDGET_S?")
    # two 20 s steps: far past the budget, but its last step explains it: raise the budget
    assert told({"training_seconds": 40.0, "num_steps": 2}, "warn").endswith(
        "one more or less is 100% of the budget")
