"""A target's [prune] table: the early stop's policy per target, validated by PrunePolicy, each
bad value refused with the key and the problem (and no sweep made); the engine, the doctor's
check and the dashboard use the target's policy."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
from test_early_stop import knob_diff, make_target

from agent.core.config import PruneTable, load_config, parse_config
from agent.core.domain import Proposal
from agent.core.errors import ConfigError
from agent.core.prune_policy import PrunePolicy
from agent.engine.scheduler import SchedulerSettings, SlotScheduler
from agent.ops.sweeps import create_sweep
from agent.rules.contract import check_early_stop
from overnight.runtime import Runtime

# far behind at every check, whatever the timing of its lines (A_SHIFT 0.3 sits near the
# margin of a single 50 % check on 3 curves)
LOSING = ("A_SHIFT", "1.0", "a much worse loss everywhere")

TARGET = ('[target]\ncommand = "python x.py"\neditable = ["x.py"]\nmetric = "m"\n'
          'budget_s = 10\nprune = "auto"\n')


def write(tmp: Path, prune: str | None) -> Path:
    (tmp / "overnight.toml").write_text(TARGET + ("" if prune is None else f"\n[prune]\n{prune}\n"))
    return tmp


def test_a_prune_table_sets_the_policy_and_round_trips(tmp_path: Path) -> None:
    cfg = load_config(write(tmp_path, 'exempt = ["data/schedule", "optimizer"]'))
    policy = cfg.early_stop_policy()
    assert policy == PrunePolicy(exempt=frozenset({"data/schedule", "optimizer"}))
    assert parse_config(cfg.to_dict()) == cfg and hash(cfg)
    assert load_config(write(tmp_path, None)).early_stop_policy() == PrunePolicy()
    assert load_config(write(tmp_path, "")).prune_policy == PruneTable()
    assert load_config(write(tmp_path, "exempt = []")).early_stop_policy() == \
        PrunePolicy(exempt=frozenset())


def test_the_checks_are_the_keep_rules_looks(tmp_path: Path) -> None:
    """No [prune] number: `max_runs` cuts the budget into its parts, as it makes the looks."""
    (tmp_path / "overnight.toml").write_text(TARGET + "max_runs = 5\n")
    assert load_config(tmp_path).early_stop_policy().checks == (0.2, 0.4, 0.6, 0.8)
    assert load_config(write(tmp_path, None)).early_stop_policy().checks == (0.25, 0.5, 0.75)


@pytest.mark.parametrize("body, says", [
    ("checks = [0.3, 0.5, 0.7]", "[prune]: checks: no longer settings: the early stop is the "
                                 "keep rule's own test, taken at the end of each of `max_runs` "
                                 "equal parts of the budget but the last on the loss over that "
                                 "part"),
    ("window = 0.05", "[prune]: window: no longer settings"),
    ("z = [5, 4, 3]", "[prune]: z: no longer settings: the early stop is the keep rule's own"),
    ("min_curves = 3\nfloor_rel = 0.1", "min_curves: no longer settings"),
    ('exempt = ["schedule"]', "[prune] exempt: must be a list of categories"),
    ("pool_earlier = 3", "pool_earlier: no longer settings: the early stop is the keep rule's own "
                         "test"),
    ("speed = 0.2", "[prune] speed: Extra inputs are not permitted"),
])
def test_a_bad_prune_value_names_the_key_and_changes_nothing(tmp_path: Path, body: str,
                                                             says: str) -> None:
    target = make_target(tmp_path / "target", "auto")
    toml = target / "overnight.toml"
    toml.write_text(toml.read_text() + f"\n[prune]\n{body}\n")
    runtime = Runtime(tmp_path / "o.db")
    with pytest.raises(ConfigError) as err:
        create_sweep(runtime.store, runtime.repo_at(target), target, name="n",
                     proposer="queue", allow_dirty=True)
    assert says in str(err.value)
    assert runtime.store.list_sweeps() == []  # nothing made


def test_the_table_is_its_own_not_a_key_of_target(tmp_path: Path) -> None:
    (tmp_path / "overnight.toml").write_text(TARGET + "prune_policy = {}\n")
    with pytest.raises(ConfigError, match="prune_policy is set as a \\[prune\\] table"):
        load_config(tmp_path)
    (tmp_path / "overnight.toml").write_text("prune = 3\n" + TARGET)
    with pytest.raises(ConfigError, match="prune must be a \\[prune\\] table"):
        load_config(tmp_path)
    (tmp_path / "overnight.toml").write_text(TARGET + "\n[pruning]\nchecks = [0.5]\n")
    with pytest.raises(ConfigError, match="unknown table\\(s\\) pruning"):
        load_config(tmp_path)


def test_the_doctor_check_reads_the_target_policy(tmp_path: Path) -> None:
    (tmp_path / "overnight.toml").write_text(TARGET + "max_runs = 10\n")
    cfg = load_config(tmp_path)
    got = check_early_stop(cfg, 9, 9.5)  # a line every 11 % of the budget: a part without one
    assert got.status == "warn" and "the checks at 10%, 20%, 30%" in got.detail
    assert "a line at least every 10% of it (≥ 10)" in got.detail
    assert check_early_stop(cfg, 10, 9.5).status == "ok"
    default = load_config(write(tmp_path, None))
    assert check_early_stop(default, 3, 9.5).status == "warn"
    assert check_early_stop(default, 4, 9.5).status == "ok"


def test_the_engine_stops_at_the_checks_of_the_targets_max_runs(tmp_path: Path) -> None:
    target = make_target(tmp_path / "target", "auto")
    toml = target / "overnight.toml"
    toml.write_text(toml.read_text().replace("[target]\n", "[target]\nmax_runs = 2\n"))
    subprocess.run(["git", "commit", "-qam", "max_runs 2"], cwd=target, check=True)
    runtime = Runtime(tmp_path / "o.db")
    sweep = create_sweep(runtime.store, runtime.repo_at(target), target, name="n",
                         proposer="queue")
    assert sweep.config.early_stop_policy().checks == (0.5,)
    name, value, what = LOSING
    losing_id = runtime.store.add_experiment(
        sweep.id, Proposal(f"{name} = {value}: {what}", knob_diff(target, name, value))).id
    settings = SchedulerSettings(slots=1, grace_s=1.0, poll_interval_s=0.1)
    SlotScheduler(runtime.store, settings, runtime.loop_factory(settings)).run_burst(["n"])
    losing = runtime.store.get_experiment(losing_id)
    assert losing.reason is not None and losing.reason.startswith("stopped at 50 % "), losing


def test_the_prune_table_is_documented_with_the_policy_defaults() -> None:
    import tomllib

    import docs_check as dc

    rows = dc.table(dc.ROOT / "docs" / "target.md", "`[prune]` key")
    keys = [dc.code_of(r[0]) for r in rows]
    assert sorted(k for k in keys if k) == sorted(PruneTable.model_fields)
    default = PrunePolicy()
    for key, row in zip(keys, rows, strict=True):
        literal = dc.code_of(row[1])
        assert key is not None and literal is not None, row
        value = tomllib.loads(f"v = {literal}")["v"]
        want = getattr(default, key)
        assert (sorted(want) if key == "exempt" else list(want) if isinstance(want, tuple)
                else want) == value, key
