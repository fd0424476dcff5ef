"""The override chain on small fixtures in four config styles: which knobs are live, what wins,
and that the knobs proposer never proposes a dead one."""

from __future__ import annotations

from conftest import FIXTURES

from agent.core.config import TargetConfig, args_words
from agent.core.domain import Sweep, SweepStatus, utcnow
from agent.core.ports import ProposalContext
from agent.proposers.knob_chain import parse_words, resolve
from agent.proposers.knobs import KnobsProposer

CONF = FIXTURES / "configurator_target"
CONF_FILES = {p: (CONF / p).read_text() for p in
              ("train.py", "model.py", "config/train_small.py", "configurator.py")}


def states(files, command, args_file=None):
    return {(s.knob.path, s.knob.name): s for s in resolve(files, command, args_file)}


def test_configurator_style_the_last_setter_wins():
    args = "--batch_size=16\n--learning_rate=0.02  # the peak\n--device=cpu\n"
    files = {**CONF_FILES, "overnight.args": args}
    got = states(files, "python train.py config/train_small.py --n_layer=2", "overnight.args")
    assert got[("train.py", "batch_size")].why.startswith("config/train_small.py:4 sets it")
    assert "overnight.args sets --batch_size=16" in got[("config/train_small.py", "batch_size")].why
    assert got[("overnight.args", "--batch_size")].live
    assert got[("overnight.args", "--learning_rate")].searched
    assert "the command sets --n_layer=2" in got[("config/train_small.py", "n_layer")].why
    assert got[("train.py", "warmup_iters")].why == "set again at train.py:31"
    assert got[("train.py", "dropout")].searched  # nothing sets it again
    assert got[("train.py", "max_iters")].live and not got[("train.py", "max_iters")].searched
    for name in ("n_layer", "dropout", "vocab_size"):  # ToyConfig(n_layer=..., ...) always
        why = got[("model.py", f"ToyConfig.{name}")].why
        assert why.startswith(f"every ToyConfig(...) call passes {name}") or name == "vocab_size"
    assert not got[("model.py", "ToyConfig.vocab_size")].live
    # the globals after the config block (iter_num = 0, seed = 1337) are not knobs
    assert ("train.py", "iter_num") not in got and ("train.py", "seed") not in got


def test_a_dataclass_some_call_builds_from_defaults_stays_live():
    model = ("from dataclasses import dataclass\n@dataclass\nclass C:\n    a: int = 1\n"
             "    b: int = 2\n")
    train = "from model import C\nx = C(a=3)\ny = C(4, b=5)\n"
    got = states({"model.py": model, "train.py": train}, "python train.py")
    assert got[("model.py", "C.a")].why.startswith("every C(...) call passes a")  # 2nd: by position
    assert got[("model.py", "C.b")].live  # C(a=3) uses b's default


def test_argparse_defaults_lose_to_the_command_and_the_args_file():
    script = ("import argparse\np = argparse.ArgumentParser()\n"
              "p.add_argument('--learning-rate', '-l', type=float, default=5e-4)\n"
              "p.add_argument('--n-layer', type=int, default=4)\n"
              "p.add_argument('--batch-size', '-b', type=int, default=32)\n")
    files = {"makemore.py": script, "args.txt": "-l 0.001\n"}
    got = states(files, "python makemore.py --n-layer=2 -b 8", "args.txt")
    assert "args.txt sets -l 0.001" in got[("makemore.py", "learning_rate")].why
    assert "the command sets --n-layer=2" in got[("makemore.py", "n_layer")].why
    assert "the command sets -b 8" in got[("makemore.py", "batch_size")].why
    assert got[("args.txt", "-l")].searched


def test_hf_style_dataclasses_parsed_from_the_command_line():
    script = ("from dataclasses import dataclass, field\n"
              "from transformers import HfArgumentParser\n"
              "@dataclass\nclass DataArguments:\n"
              "    block_size: int = field(default=128, metadata={'help': 'x'})\n"
              "    keep_linebreaks: bool = field(default=True)\n"
              "    validation_split_percentage: int = 5\n"
              "parser = HfArgumentParser((DataArguments,))\n")
    got = states({"run.py": script}, "python run.py --block_size 64 --keep_linebreaks False")
    assert "the command sets --block_size 64" in got[("run.py", "DataArguments.block_size")].why
    assert not got[("run.py", "DataArguments.keep_linebreaks")].live
    assert got[("run.py", "DataArguments.validation_split_percentage")].searched
    got = states({"run.py": script, "args.json": '{"block_size": 32}'}, "python run.py args.json")
    assert got[("run.py", "DataArguments.block_size")].why.startswith("args.json sets block_size")


def test_hydra_style_group_keys_lose_to_overrides():
    script = ('import hydra\n@hydra.main(config_path="../configs", config_name="train.yaml")\n'
              "def main(cfg):\n    pass\n")
    model = "optimizer:\n  lr: 0.001\n  weight_decay: 0.0\nnet:\n  width: 64  # knobs: skip\n"
    glob = "# @package _global_\nseed: 12\nmodel:\n  optimizer:\n    lr: 0.01\n"
    files = {"src/train.py": script, "configs/model/mnist.yaml": model,
             "configs/experiment/fast.yaml": glob, "overnight.args": "model.optimizer.lr=0.002\n"}
    got = states(files, "python src/train.py trainer.max_epochs=3", "overnight.args")
    assert "overnight.args sets model.optimizer.lr=0.002" in got[
        ("configs/model/mnist.yaml", "optimizer.lr")].why
    assert got[("configs/model/mnist.yaml", "optimizer.weight_decay")].searched
    assert ("configs/model/mnist.yaml", "net.width") not in got  # knobs: skip
    assert not got[("configs/experiment/fast.yaml", "model.optimizer.lr")].live  # _global_
    assert got[("overnight.args", "model.optimizer.lr")].searched


def test_words_of_a_command_and_an_args_file():
    line = parse_words(["python", "train.py", "config/a.py", "--x=1", "-l", "0.1", "--flag",
                        "a.b=2"])
    assert line.script == "train.py" and line.positionals == ["config/a.py"]
    assert line.flags == {"x": "--x=1", "l": "-l 0.1", "flag": "--flag", "a.b": "a.b=2"}
    assert args_words("# c\n--a=1  # why\n--b 'two words'\n\n") == ["--a=1", "--b", "two words"]


def test_the_knobs_proposer_never_proposes_a_dead_knob():
    args = "--batch_size=16\n--learning_rate=0.02\n--device=cpu  # knobs: skip\n"
    files = {**CONF_FILES, "overnight.args": args}
    config = TargetConfig(command="python train.py config/train_small.py", metric="val_loss",
                          editable=tuple(files), args_file="overnight.args", budget_s=1,
                          timeout_s=3)
    sweep = Sweep(1, "s", "/t", "overnight/s", SweepStatus.RUNNING, "knobs", config, None,
                  1.0, 1.0, None, None, utcnow())
    live = {(s.knob.path, s.knob.name) for s in resolve(files, config.command, "overnight.args")
            if s.searched}
    proposer = KnobsProposer(seed=3)
    seen = set()
    for _ in range(6):
        proposal = proposer.propose(ProposalContext(sweep, files, []))
        assert proposal is not None
        path = next(line[6:] for line in proposal.diff.splitlines() if line.startswith("+++ b/"))
        seen.add((path, proposal.meta["knob"]))
        proposer.seed += 1
    assert seen and seen <= live, seen - live


def test_knobs_skip_works_in_every_place():
    script = "lr = 0.1  # knobs: skip\nwidth = 8\nprint(lr)\n"
    args = "--lr=0.2  # knobs: skip\n--depth=3\n"
    got = states({"train.py": script, "a.args": args}, "python train.py", "a.args")
    assert set(got) == {("train.py", "width"), ("a.args", "--depth")}
