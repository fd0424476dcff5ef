"""A sweep through the real loop on a machine whose speed a test sets (tests/scripts/
load_trainer.py): 12 null changes, the machine busy (60 % speed) for the baseline and then
switching every five runs. Used by tests/test_load_blocking.py and the browser tests."""

from __future__ import annotations

import textwrap
from collections.abc import Callable
from pathlib import Path
from typing import Any

from conftest import make_target
from foreground import run_sweep
from null_proposer import Ideas

from agent.core.config import load_config
from agent.core.domain import Experiment, Sweep
from agent.engine.attempt import EventFn
from agent.engine.loop import Loop, LoopSettings
from agent.executors.local import SubprocessRunner
from agent.git.repo import GitRepo
from agent.ops.sweeps import create_sweep
from db.engine import open_database
from db.store import SqlStore

TRAINER = (Path(__file__).parent / "scripts" / "load_trainer.py").read_text()
SPEEDS = (0.6, 1.0)  # busy, quiet
EVERY = 5  # runs per spell


class Machine:
    """Switches the machine's speed every `every` runs (each run announces itself first)."""

    def __init__(self, path: Path, speeds: tuple[float, ...] = SPEEDS,
                 every: int = EVERY) -> None:
        self.path, self.runs, self.speeds, self.every = path, 0, speeds, every
        path.write_text(str(speeds[0]))

    def __call__(self, kind: str, exp: Experiment, data: dict[str, Any]) -> None:
        if kind in ("started", "confirming"):
            self.path.write_text(str(self.speeds[(self.runs // self.every) % len(self.speeds)]))
            self.runs += 1


def load_night(root: Path, proposals: int = 12, gains: dict[int, float] | None = None,
               incumbent_every: int = 8, budget: str = "budget_s  = 0.05",
               machine_speeds: tuple[tuple[float, ...], int] = (SPEEDS, EVERY),
               secondary: tuple[str, ...] = (),
               listen: Callable[[SqlStore, Sweep], EventFn] | None = None,
               ) -> tuple[SqlStore, int, Path]:
    """The sweep "load" run to its end: (its store, sweep id, database file). `gains`: the
    proposals (by number) that really add work, and how much (the rest are null changes).
    `budget`: its overnight.toml line (`budget = "200 steps"`: a compute budget);
    `machine_speeds`: the speeds the machine switches between, and every how many runs;
    `secondary`: its `[target] secondary` keys (the trainer then prints peak_vram_mb,
    tokens_per_s and, on odd seeds, mfu_percent); `listen(store, sweep)`: a listener that hears
    the loop's events as they happen (the console's LineLog, its live view)."""
    machine = root / "machine.txt"
    toml = textwrap.dedent("""\
        [target]
        command   = "python train.py"
        editable  = ["train.py"]
        protected = ["prepare.py", "overnight.toml"]
        metric    = "work"
        direction = "maximize"
        timeout_s = 30
        """) + f"{budget}\nincumbent_every = {incumbent_every}\n" + (
        f"secondary = {list(secondary)!r}\n".replace("'", '"') if secondary else "")
    train = TRAINER.replace('MACHINE = "machine.txt"', f"MACHINE = {str(machine)!r}").replace(
        "GAINS: dict[int, float] = {}", f"GAINS: dict[int, float] = {dict(gains or {})!r}"
    ).replace("SECONDARY = False", f"SECONDARY = {bool(secondary)}")
    target = make_target(root / "target", edits={"train.py": train, "overnight.toml": toml})
    db = root / "overnight.db"
    store = SqlStore(open_database(db))
    sweep = create_sweep(store, GitRepo(target), target, name="load",
                         config=load_config(target), max_experiments=proposals)
    machine_of = Machine(machine, *machine_speeds)
    heard = listen(store, sweep) if listen is not None else None

    def on_event(kind: str, exp: Experiment, data: dict[str, Any]) -> None:
        machine_of(kind, exp, data)
        if heard is not None:
            heard(kind, exp, data)

    loop = Loop(store, GitRepo(target), SubprocessRunner(grace_s=0.5),
                LoopSettings(root / "work", grace_s=0.5), proposer=Ideas(),
                on_event=on_event)
    run_sweep(loop, sweep.name)
    return store, sweep.id, db


