"""The options of typer, click, fire and jsonargparse CLIs as knobs, read from the source only
(fire and jsonargparse need not be installed): which flags exist, what they are named, which
are dead, and that a change rewrites exactly the default's literal."""

from __future__ import annotations

import pytest

from agent.proposers.knob_chain import resolve
from agent.proposers.knob_sources import find_knobs


def states(text: str, command: str = "python train.py", args: str | None = None):
    files = {"train.py": text, **({"overnight.args": args} if args is not None else {})}
    found = resolve(files, command, "overnight.args" if args is not None else None)
    return {s.knob.name: s for s in found if s.knob.path == "train.py"}


TYPER = '''from typing import Annotated, Optional
import typer

app = typer.Typer()

@app.command()
def train(
    data: str = typer.Argument("data/"),
    steps: Annotated[int, typer.Argument()] = 5,
    lr: float = typer.Option(3e-4, help="learning rate"),
    weight_decay: Annotated[float, typer.Option(help="L2")] = 0.01,
    batch_size: int = typer.Option(32, "--bs", "-b"),
    warmup: Annotated[int, typer.Option("--warmup-steps")] = 100,
    amp: bool = False,
    depth: int = 4,
    name: str = "run",
    clip: Optional[float] = None,
):
    depth = 6  # pinned
    print(lr, weight_decay, batch_size, warmup, amp, depth, name, clip, data, steps)

@app.command()
def evaluate(checkpoint: str = "ckpt.pt", temperature: float = 1.0):
    pass
'''


def test_typer_parameters_are_flags_named_as_typer_names_them():
    found = states(TYPER)
    assert set(found) == {"lr", "weight_decay", "batch_size", "warmup", "amp", "depth",
                          "temperature"}  # no Argument, no free text, no None
    assert {n: s.knob.flags for n, s in found.items()} == {
        "lr": ("--lr",), "weight_decay": ("--weight-decay",), "batch_size": ("--bs", "-b"),
        "warmup": ("--warmup-steps",), "amp": ("--amp", "--no-amp"), "depth": ("--depth",),
        "temperature": ("--temperature",)}
    assert {s.knob.kind for s in found.values()} == {"typer"}
    assert found["weight_decay"].knob.value == 0.01 and found["lr"].knob.raw == "3e-4"
    assert not found["depth"].live and "set again at train.py:19" in found["depth"].why
    assert all(s.live for n, s in found.items() if n != "depth")


def test_typer_defaults_set_by_the_command_or_the_args_file_are_dead():
    found = states(TYPER, "python train.py train --weight-decay 0.1 -b 64",
                   args="--warmup-steps 10\n")
    assert "the command sets --weight-decay 0.1" in found["weight_decay"].why
    assert "the command sets -b 64" in found["batch_size"].why
    assert "overnight.args sets --warmup-steps 10" in found["warmup"].why
    assert found["lr"].live and found["lr"].searched


def test_typer_run_and_the_rewrite_of_a_default():
    text = "import typer\n\ndef main(lr: float = 0.1, epochs: int = 3):\n    pass\n\n" \
           "typer.run(main)\n"
    (lr, epochs) = find_knobs("train.py", text)
    assert (lr.name, lr.flag, epochs.name) == ("lr", "--lr", "epochs")
    line = text.splitlines()[lr.line_no]
    assert lr.rewrite(line, "0.2") == "def main(lr: float = 0.2, epochs: int = 3):"


def test_without_an_import_of_typer_a_decorated_function_has_no_options():
    text = "import other\n\n@cli.command()\ndef train(lr: float = 0.1):\n    pass\n"
    assert find_knobs("train.py", text) == []


CLICK = '''import click

@click.group()
def cli():
    pass

@cli.command()
@click.option("--lr", default=0.1, type=float, show_default=True)
@click.option("-w", "--weight-decay", "wd", default=0.0)
@click.option("--n-layers", default=2)
@click.option("--optimizer", type=click.Choice(["sgd", "adam"]), default="adam")
@click.option("--amp/--no-amp", default=False)
@click.option("--out", default="out/")
@click.argument("data")
def train(data, lr, wd, n_layers, optimizer, amp, out, untyped=3):
    lr = lr * 2  # reads it: not set again
    print(data, lr, wd, n_layers, optimizer, amp, out, untyped)
'''


def test_click_options_are_named_as_click_names_them():
    found = states(CLICK, "python train.py train d --n-layers 4")
    assert set(found) == {"lr", "wd", "n_layers", "optimizer", "amp"}  # not `untyped`
    assert found["wd"].knob.flags == ("-w", "--weight-decay") and found["wd"].knob.flag == \
        "--weight-decay"
    assert found["amp"].knob.flags == ("--amp", "--no-amp")
    assert found["optimizer"].knob.choices == ('"sgd"', '"adam"')
    assert {s.knob.kind for s in found.values()} == {"click"}
    assert not found["n_layers"].live and "--n-layers 4" in found["n_layers"].why
    assert found["lr"].live and found["wd"].searched


FIRE = '''import fire

class Trainer:
    def __init__(self, lr=0.01, weight_decay=0.0, *, layers=2):
        self.lr = lr

    def fit(self, epochs=3):
        pass

def sample(temperature=0.8, top_k=50):
    pass

if __name__ == "__main__":
    fire.Fire({"train": Trainer, "sample": sample})
'''


def test_fire_reads_the_keyword_parameters_of_what_it_is_given():
    found = states(FIRE, "python train.py train --weight-decay=0.1")
    assert set(found) == {"lr", "weight_decay", "layers", "temperature", "top_k"}
    assert found["weight_decay"].knob.flags == ("--weight_decay", "--weight-decay")
    assert {s.knob.kind for s in found.values()} == {"fire"}
    assert not found["weight_decay"].live and found["lr"].searched
    plain = "from fire import Fire\n\ndef main(lr=0.1, seed=0):\n    pass\n\nFire(main)\n"
    assert [k.name for k in find_knobs("train.py", plain)] == ["lr", "seed"]


JSONARGPARSE = '''from jsonargparse import ArgumentParser, CLI


class Model:
    def __init__(self, hidden: int = 64, dropout: float = 0.1):
        pass


def optimizer(lr: float = 1e-3, betas_1: float = 0.9):
    pass


def fit(max_epochs: int = 10, accumulate: int = 1):
    pass


def main():
    parser = ArgumentParser()
    parser.add_class_arguments(Model, "model")
    parser.add_function_arguments(optimizer, nested_key="optim")
    parser.add_argument("--clip", type=float, default=1.0)
    return parser.parse_args()


if __name__ == "__main__":
    CLI(fit)
'''


def test_jsonargparse_cli_and_the_parser_s_function_and_class_arguments():
    found = states(JSONARGPARSE, "python train.py --model.hidden=128 --clip 0.5")
    assert set(found) == {"model.hidden", "model.dropout", "optim.lr", "optim.betas_1",
                          "max_epochs", "accumulate", "clip"}
    assert found["optim.lr"].knob.flag == "--optim.lr" and found["clip"].knob.kind == "argparse"
    assert found["model.hidden"].knob.kind == "jsonargparse"
    assert not found["model.hidden"].live and not found["clip"].live
    assert found["optim.lr"].searched and found["model.dropout"].searched
    assert found["max_epochs"].live and not found["max_epochs"].searched  # bookkeeping


@pytest.mark.parametrize("call", ["CLI([fit, optimizer])", "auto_cli(fit)"])
def test_jsonargparse_lists_of_functions(call: str):
    text = JSONARGPARSE.replace("CLI(fit)", call).replace(
        "from jsonargparse import ArgumentParser, CLI", "from jsonargparse import *")
    names = {k.name for k in find_knobs("train.py", text)}
    assert {"max_epochs", "accumulate"} <= names


def test_a_dataclass_given_to_jsonargparse_is_read_from_its_flags():
    text = ("from dataclasses import dataclass\nfrom jsonargparse import CLI\n\n@dataclass\n"
            "class Config:\n    lr: float = 0.1\n\nCLI(Config)\n")
    found = resolve({"train.py": text}, "python train.py --lr 0.2")
    assert [(s.knob.name, s.live) for s in found] == [("Config.lr", False)]
