"""Knob discovery: constants, argparse defaults, dataclass fields, YAML/TOML/JSON keys."""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import FIXTURES
from foreground import run_sweep

from agent.core.config import load_config
from agent.core.domain import ExperimentStatus, SweepStatus
from agent.git.repo import GitRepo, init_repo
from agent.ops.sweeps import create_sweep
from agent.proposers.knob_sources import find_knobs
from agent.proposers.knobs import KnobsProposer

WORDLM = (FIXTURES / "wordlm_target" / "main.py").read_text()


def by_name(path: str, text: str):
    return {k.name: k for k in find_knobs(path, text)}


def test_argparse_defaults_are_typed_knobs_that_rewrite_their_own_literal():
    knobs = by_name("main.py", WORDLM)
    assert set(knobs) == {"model", "emsize", "lr", "dropout", "epochs", "seed"}  # not data/tied
    assert knobs["lr"].value == 20 and knobs["dropout"].value == 0.2
    assert knobs["emsize"].kind == "argparse" and knobs["emsize"].flag == "--emsize"
    assert knobs["model"].choices == ('"RNN_TANH"', '"LSTM"', '"GRU"')
    line = WORDLM.splitlines()[knobs["model"].line_no]
    assert knobs["model"].rewrite(line, '"GRU"') == line.replace('default="LSTM"', 'default="GRU"')
    line = WORDLM.splitlines()[knobs["emsize"].line_no]
    new = knobs["emsize"].rewrite(line, "400")
    assert new == line.replace("default=200", "default=400")  # "size" and help text untouched


def test_constants_dataclass_fields_and_skip_comments():
    text = (
        "from dataclasses import dataclass, field\n"
        "LR = 3e-4\n"
        "SEED = 7  # knobs: skip\n"
        "@dataclass\n"
        "class Config:\n"
        "    width: int = 64\n"
        "    use_bias: bool = False\n"
        "    name: str = 'x'\n"
        "    layers: list = field(default_factory=list)\n"
        "    depth: int = -2\n"
    )
    knobs = by_name("train.py", text)
    assert set(knobs) == {"LR", "Config.width", "Config.use_bias", "Config.depth"}
    assert knobs["Config.depth"].value == -2 and knobs["Config.use_bias"].value is False
    line = text.splitlines()[knobs["Config.width"].line_no]
    assert knobs["Config.width"].rewrite(line, "128") == "    width: int = 128"


@pytest.mark.parametrize("path,text,name,line_after", [
    ("conf.yaml", "model:\n  lr: 0.001  # base\n  shuffle: true\nname: run\n", "model.lr",
     "  lr: 0.002  # base"),
    ("conf.toml", "[optim]\nlr = 0.001\nwarmup = true\n", "optim.lr", "lr = 0.002"),
    ("conf.json", '{\n  "lr": 0.001,\n  "amp": true\n}\n', "lr", '  "lr": 0.002,'),
])
def test_config_file_keys(path, text, name, line_after):
    knobs = by_name(path, text)
    assert len(knobs) == 2 and knobs[name].value == 0.001
    line = text.splitlines()[knobs[name].line_no]
    assert knobs[name].rewrite(line, "0.002") == line_after
    flag = next(k for k in knobs.values() if isinstance(k.value, bool))
    flag_line = text.splitlines()[flag.line_no]
    assert "false" in flag.rewrite(flag_line, "False")  # the file's own boolean spelling


def test_a_knobs_sweep_on_a_target_without_knobs_ends_with_the_reason(store, make_loop,
                                                                     tmp_path: Path):
    target = tmp_path / "t"
    target.mkdir()
    (target / "train.py").write_text("import os\nprint('---')\nprint('val_bpb: 1.0')\n")
    (target / "overnight.toml").write_text(
        '[target]\ncommand = "python train.py"\neditable = ["train.py"]\nmetric = "val_bpb"\n'
        "budget_s = 1\n")
    init_repo(target)
    sweep = create_sweep(store, GitRepo(target), target, name="s1", config=load_config(target))
    done = run_sweep(make_loop(target, KnobsProposer()), sweep.name)
    assert done.status is SweepStatus.DONE
    base, note = store.list_experiments(sweep.id)
    assert base.status is ExperimentStatus.KEPT
    assert note.status is ExperimentStatus.REJECTED
    assert note.reason.startswith("no knobs found in train.py: ")
    assert "see docs/adopt.md 'Knobs'" in note.reason
