"""Attribute-style configs as knobs: minGPT's CfgNode shape (defaults in a library's
`get_default_config`, the script's own config over them, `--section.key=value` flags over
both), yacs, ml_collections and OmegaConf; which knobs are live, what wins, and a `knobs`
proposal that changes one applies with git."""

from __future__ import annotations

import ast
import subprocess
from pathlib import Path

from conftest import FIXTURES

from agent.core.config import TargetConfig
from agent.core.domain import Sweep, SweepStatus, utcnow
from agent.core.ports import ProposalContext
from agent.git.repo import init_repo
from agent.proposers.knob_chain import parse_words, resolve
from agent.proposers.knobs import KnobsProposer

CFG = FIXTURES / "cfgnode_target"
SCRIPT = "projects/charlm/charlm.py"
FILES = {p: (CFG / p).read_text() for p in
         (SCRIPT, "toylib/model.py", "toylib/trainer.py", "toylib/utils.py")}
ARGS = "--trainer.batch_size=16\n--trainer.learning_rate=0.01\n"


def states(files, command, args_file=None):
    return {(s.knob.path, s.knob.name): s for s in resolve(files, command, args_file)}


def line_of(path: str, text: str) -> int:
    return next(i for i, line in enumerate(FILES[path].splitlines(), 1) if text in line)


def test_defaults_of_a_library_lose_to_the_script_s_config_and_its_flags():
    got = states({**FILES, "overnight.args": ARGS}, "python -m projects.charlm.charlm",
                 "overnight.args")
    lr_line = line_of(SCRIPT, "C.trainer.learning_rate = 5e-4")
    assert got[("toylib/trainer.py", "trainer.learning_rate")].why == (
        f"set again at {SCRIPT}:{lr_line}: trainer.learning_rate = 5e-4")
    assert got[(SCRIPT, "trainer.learning_rate")].why.startswith(
        "overnight.args sets --trainer.learning_rate=0.01 (that line is the knob)")
    assert "overnight.args sets --trainer.batch_size=16" in got[
        ("toylib/trainer.py", "trainer.batch_size")].why
    searched = {name for (_, name), s in got.items() if s.searched}
    assert searched == {"trainer.betas[0]", "trainer.betas[1]", "trainer.weight_decay",
                        "model.width", "model.dropout", "model.n_layer", "data.block_size",
                        "--trainer.batch_size", "--trainer.learning_rate"}
    assert got[(SCRIPT, "system.seed")].live and not got[(SCRIPT, "system.seed")].searched
    assert got[("toylib/trainer.py", "trainer.num_workers")].plumbing
    # ToyModel.from_pretrained builds a config of its own, and nothing the script runs calls it
    assert got[("toylib/model.py", "block_size")].why == (
        "ToyModel.from_pretrained sets it, and nothing the script runs reaches "
        "ToyModel.from_pretrained")
    assert got[(SCRIPT, "model.n_layer")].knob.kind == "attr"
    # the same knob run as a file, with a flag in the command itself: that flag wins for good
    got = states(FILES, f"python {SCRIPT} --model.n_layer=3")
    assert "the command sets --model.n_layer=3" in got[(SCRIPT, "model.n_layer")].why
    assert got[(SCRIPT, "trainer.learning_rate")].searched


def test_a_module_command_names_its_script():
    line = parse_words(["python", "-m", "projects.charlm.charlm", "--trainer.batch_size=8"])
    assert line.script == "projects/charlm/charlm.py"
    assert line.flags == {"trainer.batch_size": "--trainer.batch_size=8"}
    line = parse_words(["python", "src/train.py", "-m", "lr=0.1,0.2"])  # hydra's multirun
    assert line.script == "src/train.py"


YACS = {"defaults.py": """from yacs.config import CfgNode as CN
_C = CN()
_C.SYSTEM = CN()
_C.SYSTEM.NUM_WORKERS = 8
_C.TRAIN = CN()
_C.TRAIN.BASE_LR = 0.1
_C.TRAIN.SCALES = (2, 4, 8)
def get_cfg_defaults():
    return _C.clone()
""", "train.py": """import sys
from defaults import get_cfg_defaults
if __name__ == "__main__":
    cfg = get_cfg_defaults()
    cfg.TRAIN.BASE_LR = 0.05
    cfg.merge_from_list(sys.argv[1:])
    cfg.TRAIN.WARMUP = 3
""", "a.args": "--TRAIN.WARMUP=5\n--TRAIN.BASE_LR=0.02\n"}


def test_yacs_module_defaults_handed_out_by_a_getter():
    got = states(YACS, "python train.py", "a.args")
    assert got[("defaults.py", "TRAIN.BASE_LR")].why == (
        "set again at train.py:5: TRAIN.BASE_LR = 0.05")
    assert got[("train.py", "TRAIN.BASE_LR")].why.startswith("a.args sets --TRAIN.BASE_LR=0.02")
    assert got[("defaults.py", "TRAIN.SCALES[2]")].searched
    assert got[("defaults.py", "SYSTEM.NUM_WORKERS")].plumbing
    # set by the script after the flags are merged: the flag never reaches the run
    assert got[("a.args", "--TRAIN.WARMUP")].why == (
        "train.py:7 sets TRAIN.WARMUP after the flags are merged")
    assert got[("train.py", "TRAIN.WARMUP")].live and got[("a.args", "--TRAIN.BASE_LR")].live


def test_ml_collections_and_omegaconf_shapes():
    config = """import ml_collections
def get_config():
    config = ml_collections.ConfigDict()
    config.learning_rate = 0.1
    config.model = ml_collections.ConfigDict()
    config.model.depth = 4
    if config.learning_rate > 1:
        config.model.depth = 8
    return config
"""
    main = "from ml_collections import config_flags\nconfig_flags.DEFINE_config_file('config')\n"
    got = states({"configs/default.py": config, "main.py": main},
                 "python main.py --config=configs/default.py --config.learning_rate=0.2")
    assert "the command sets --config.learning_rate=0.2" in got[
        ("configs/default.py", "learning_rate")].why
    assert got[("configs/default.py", "model.depth")].searched  # the `if` may not happen
    omega = """from omegaconf import OmegaConf
def main():
    cfg = OmegaConf.create({'optim': {}})
    cfg.optim.lr = 0.01
    cfg.optim.wd = 0.1
    cfg = OmegaConf.merge(cfg, OmegaConf.from_cli())
    cfg.optim.wd = 0.0
main()
"""
    got = resolve({"train.py": omega}, "python train.py optim.lr=0.3")
    assert [(s.knob.name, s.why) for s in got] == [
        ("optim.lr", "the command sets optim.lr=0.3: a change here cannot reach the run (move "
                     "that flag into args_file to search it)"),
        ("optim.wd", "set again at train.py:7: optim.wd = 0.0"), ("optim.wd", "")]


def test_self_attributes_and_plain_objects_are_not_knobs():
    text = ("class T:\n    def __init__(self):\n        self.iter_num = 0\n        self.lr = 0.1\n"
            "def f(args):\n    args.lr = 0.3\n    model = make()\n    model.scale = 2.0\n")
    assert states({"t.py": text}, "python t.py") == {}


def test_the_knobs_proposer_changes_an_attribute_knob_and_git_applies_it(tmp_path: Path):
    files = {**FILES, "overnight.args": ARGS}
    config = TargetConfig(command="python -m projects.charlm.charlm", metric="test_acc",
                          editable=tuple(files), args_file="overnight.args", budget_s=1,
                          timeout_s=3)
    sweep = Sweep(1, "s", "/t", "overnight/s", SweepStatus.RUNNING, "knobs", config, None,
                  1.0, 1.0, None, None, utcnow())
    live = {s.knob.name for s in resolve(files, config.command, "overnight.args") if s.searched}
    root = tmp_path / "repo"
    for path, text in files.items():
        (root / path).parent.mkdir(parents=True, exist_ok=True)
        (root / path).write_text(text)
    init_repo(root)
    proposer = KnobsProposer(seed=1)
    attr = None
    for _ in range(12):
        proposal = proposer.propose(ProposalContext(sweep, files, []))
        assert proposal is not None and proposal.meta["knob"] in live, proposal
        if "[" in proposal.meta["knob"] or proposal.meta["knob"].startswith(("model.", "data.")):
            attr = proposal
            break
        proposer.seed += 1
    assert attr is not None
    subprocess.run(["git", "apply", "-"], input=attr.diff, text=True, cwd=root, check=True)
    changed = subprocess.run(["git", "diff", "--name-only"], cwd=root, capture_output=True,
                             text=True, check=True).stdout.split()
    assert len(changed) == 1 and changed[0] in FILES
    ast.parse((root / changed[0]).read_text())  # still Python
    after = {s.knob.name: s.knob.raw for s in resolve(
        {**files, changed[0]: (root / changed[0]).read_text()}, config.command,
        "overnight.args")}
    assert after[attr.meta["knob"]] == attr.meta["new"]
