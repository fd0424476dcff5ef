import json
import re
from pathlib import Path

import pytest

from agent.core.config import load_config, parse_config
from agent.core.errors import ConfigError

GOOD = {
    "command": "python train.py",
    "editable": ["train.py"],
    "protected": ["prepare.py", "overnight.toml"],
    "metric": "val_bpb",
    "direction": "minimize",
    "budget_s": 300,
    "timeout_s": 900,
}


def test_good_config_round_trips():
    cfg = parse_config(GOOD)
    assert cfg.budget_s == 300 and cfg.editable == ("train.py",)
    assert parse_config(cfg.to_dict()) == cfg
    assert cfg.sandbox == "none" and cfg.pass_env == () and cfg.sandbox_network is False
    guarded = parse_config({**GOOD, "pass_env": ["WANDB_API_KEY"], "sandbox": "bwrap",
                            "sandbox_network": True})
    assert parse_config(guarded.to_dict()) == guarded and guarded.pass_env == ("WANDB_API_KEY",)


@pytest.mark.parametrize(
    "change, key",
    [
        ({"bogus": 1}, "bogus"),
        ({"metric": None}, "metric"),
        ({"command": "  "}, "command"),
        ({"budget_s": 0}, "budget_s"),
        ({"budget_s": -5}, "budget_s"),
        ({"timeout_s": 300}, "timeout_s"),
        ({"editable": []}, "editable"),
        ({"editable": ["../x.py"]}, "editable"),
        ({"protected": ["train.py"]}, "train.py"),
        ({"direction": "up"}, "direction"),
        ({"pass_env": "WANDB_API_KEY"}, "pass_env"),
        ({"pass_env": ["OK", "not a name"]}, "pass_env"),
        ({"sandbox": "docker"}, "sandbox"),
        ({"sandbox_network": "yes"}, "sandbox_network"),
        ({"category_shares": 0.3}, "category_shares"),
        ({"category_shares": {"vibes": 0.3}}, "vibes"),
        ({"category_shares": {"architecture": 1.5}}, "architecture"),
        ({"category_shares": {"architecture": 0}}, "architecture"),
        ({"category_shares": {"optimizer": True}}, "optimizer"),
        ({"workdir": "../up"}, "workdir"),
        ({"assets": ["../data"]}, "assets"),
        ({"assets": ["prepare.py"]}, "assets"),
        ({"progress_regex": "loss ([\\d.]+"}, "progress_regex"),
        ({"progress_regex": "loss ([\\d.]+)"}, "progress_regex"),  # no (?P<loss>...) group
    ],
)
def test_bad_config_names_the_key(change, key):
    data = {**GOOD, **change}
    data = {k: v for k, v in data.items() if v is not None}
    with pytest.raises(ConfigError) as exc:
        parse_config(data)
    assert key in str(exc.value)


def test_category_shares_from_toml_are_canonical_and_round_trip(tmp_path: Path):
    (tmp_path / "overnight.toml").write_text(
        '[target]\ncommand = "python train.py"\neditable = ["train.py"]\nmetric = "val_bpb"\n'
        'budget_s = 60\ncategory_shares = { architecture = 0.3, "data/schedule" = 0.5 }\n')
    cfg = load_config(tmp_path)
    assert dict(cfg.category_shares) == {"architecture": 0.3, "data/schedule": 0.5}
    assert cfg.to_dict()["category_shares"] == {"architecture": 0.3, "data/schedule": 0.5}
    assert hash(cfg) == hash(parse_config(cfg.to_dict()))
    assert parse_config(cfg.to_dict()) == cfg
    assert parse_config(GOOD).category_shares == ()


def test_missing_file_and_bad_toml(tmp_path: Path):
    with pytest.raises(ConfigError, match="not found"):
        load_config(tmp_path)
    (tmp_path / "overnight.toml").write_text("[target\n")
    with pytest.raises(ConfigError, match="invalid TOML"):
        load_config(tmp_path)
    (tmp_path / "overnight.toml").write_text("[other]\nx=1\n")
    with pytest.raises(ConfigError, match="other"):
        load_config(tmp_path)


def test_budget_override_keeps_timeout_above_budget():
    cfg = parse_config(GOOD).with_budget(10)
    assert cfg.budget_s == 10 and cfg.timeout_s > 10
    assert parse_config(GOOD).with_budget(600).timeout_s >= 1200


def test_a_compute_budget_in_place_of_budget_s(tmp_path: Path):
    """`budget = "600 steps"` (or tokens) instead of budget_s: handed to the script by its own
    variable, the hard kill kept, stored and read back, and switched by an override."""
    from agent.core.budget import ComputeBudget

    (tmp_path / "overnight.toml").write_text(
        '[target]\ncommand = "python train.py"\neditable = ["train.py"]\nmetric = "val_bpb"\n'
        'budget = "600 steps"\n')
    steps = load_config(tmp_path)
    assert steps.budget == ComputeBudget(600, "steps") and not steps.time_budget
    assert steps.budget_env() == {"OVERNIGHT_BUDGET_STEPS": "600"}
    assert steps.budget_text == "600 steps" and steps.timeout_s == 900
    assert type(steps).from_dict(steps.to_dict()) == steps == parse_config(steps.to_dict())
    tokens = parse_config({k: v for k, v in GOOD.items() if k not in ("budget_s", "timeout_s")}
                          | {"budget": "2M tokens"})
    assert tokens.budget_env() == {"OVERNIGHT_BUDGET_TOKENS": "2000000"}
    assert tokens.budget_text == "2M tokens" and tokens.timeout_s == 900
    assert parse_config(GOOD).budget_env() == {"OVERNIGHT_BUDGET_S": "300"}
    assert parse_config(GOOD).time_budget and "budget" not in parse_config(GOOD).to_dict()
    # an override switches kinds: seconds drop the compute budget, and the other way round
    assert steps.with_budget(20).budget is None and steps.with_budget(20).budget_s == 20
    to_steps = parse_config(GOOD).with_budget(ComputeBudget(50, "steps"))
    assert to_steps.budget_text == "50 steps" and to_steps.timeout_s == 900


@pytest.mark.parametrize(
    "budget_keys, says",
    [
        ({"budget_s": 300, "budget": "600 steps"}, "budget_s and budget: set one"),
        ({}, "missing required key 'budget_s'"),
        ({"budget": "600"}, "budget: training seconds are budget_s = 600"),
        ({"budget": 600}, "budget: must be a string such as"),
        ({"budget": "600 laps"}, "budget: must be"),
        ({"budget": "0 steps"}, "budget: must be a whole number of steps ≥ 1"),
        ({"budget": "1.5 tokens"}, "budget: must be a whole number of tokens ≥ 1"),
    ],
)
def test_a_budget_is_one_of_the_two_keys(budget_keys, says):
    data = {k: v for k, v in GOOD.items() if k not in ("budget_s", "timeout_s")}
    with pytest.raises(ConfigError, match=re.escape(says)):
        parse_config({**data, **budget_keys})


def test_cli_reports_config_error_without_traceback(tmp_path: Path, target: Path):
    import subprocess
    import sys

    (target / "overnight.toml").write_text(
        '[target]\ncommand=""\neditable=["train.py"]\nmetric="val_bpb"\nbudget_s=1\n'
    )
    overnight = Path(sys.executable).parent / "overnight"
    proc = subprocess.run(
        [str(overnight), "run", "--target", str(target), "--db", str(tmp_path / "x.db")],
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 2
    assert "command" in proc.stderr and "Traceback" not in proc.stderr + proc.stdout


def test_config_knows_the_same_categories_as_proposals():
    from agent.core.config import CATEGORY_NAMES
    from agent.rules.categories import CATEGORY_VALUES

    assert CATEGORY_NAMES == CATEGORY_VALUES


def test_a_sweep_stored_by_the_earlier_keep_rule_still_loads():
    """A database made before the keep rule's rewrite stores every key of its config, the
    replaced rule's defaults too: they are dropped when the sweep is read (its night goes on
    under the new rule); a target file that sets one is still refused by name."""
    from agent.core.config import TargetConfig, parse_config
    from agent.core.errors import ConfigError

    stored = {"command": "python t.py", "editable": ["t.py"], "metric": "m", "budget_s": 10,
              "keep_z": 1.75,
              "discard_z": 0.6, "futility": 0.5, "throughput_tolerance": None,
              "prune_policy": {"checks": [0.3, 0.5, 0.7], "window": 0.05, "z": [5.0, 4.0, 3.5],
                               "min_curves": 3, "floor_rel": 0.01, "speed_tol": 0.15}}
    config = TargetConfig.from_dict(stored)
    # a sweep stored with the [prune] keys since removed: dropped, the checks from max_runs
    assert config.fdr == 0.2 and config.early_stop_policy().checks == (0.25, 0.5, 0.75)
    with pytest.raises(ConfigError, match="keep_z"):
        parse_config(stored)


def test_a_stated_noise_sigma_is_refused_with_why_and_a_stored_one_still_loads():
    """σ is measured from the night's runs: a stated σ that is off voids the FDR the rule holds
    (benchmarks/known_sigma.py), so `noise_sigma` is no longer a setting. A sweep stored with
    it loads, and goes on with σ measured."""
    from agent.core.config import TargetConfig, parse_config
    from agent.core.errors import ConfigError

    stored = {"command": "python t.py", "editable": ["t.py"], "metric": "m", "budget_s": 10,
              "noise_sigma": 0.01}
    assert "noise_sigma" not in TargetConfig.from_dict(stored).model_dump()
    with pytest.raises(ConfigError) as refused:
        parse_config(stored)
    text = str(refused.value)
    assert "noise_sigma: no longer a setting: σ is measured from the night's own runs" in text
    assert "28 %" in text and "OVERNIGHT_SEED" in text
    with pytest.raises(ConfigError) as both:
        parse_config({**stored, "keep_z": 1.75, "futility": 0.5})
    assert "futility, keep_z: no longer settings: the keep rule's level" in str(both.value)
    assert "; noise_sigma: no longer a setting" in str(both.value)


def test_secondary_names_summary_keys_and_round_trips_with_the_sweep():
    cfg = parse_config({**GOOD, "secondary": ["peak_vram_mb", "tokens_per_s"]})
    assert cfg.secondary == ("peak_vram_mb", "tokens_per_s")
    assert cfg.to_dict()["secondary"] == ["peak_vram_mb", "tokens_per_s"]
    assert type(cfg).from_dict(cfg.to_dict()) == cfg
    assert parse_config(GOOD).secondary == ()  # none unless named
    stored = {k: v for k, v in parse_config(GOOD).to_dict().items() if k != "secondary"}
    assert type(cfg).from_dict(stored).secondary == ()  # a sweep stored before the key


@pytest.mark.parametrize("value, says", [
    ("peak_vram_mb", "must be a list of summary-block keys"),
    ([1, "tokens_per_s"], "must be a list of summary-block keys"),
    (["peak vram"], "'peak vram' is not a summary-block key"),
    (["tokens_per_s", "peak_vram_mb", "tokens_per_s"], "tokens_per_s listed more than once"),
    (["val_bpb"], "val_bpb is the metric itself"),
    (["holdout_bpb"], "holdout_bpb is the sealed holdout_metric"),
])
def test_a_bad_secondary_is_refused_naming_the_key(tmp_path: Path, value, says: str):
    data = {**GOOD, "holdout_metric": "holdout_bpb", "secondary": value}
    with pytest.raises(ConfigError, match=r"secondary: ") as exc:
        parse_config(data)
    assert says in str(exc.value), str(exc.value)
    assert data["secondary"] == value  # nothing changed
    # the same from a target's overnight.toml
    (tmp_path / "overnight.toml").write_text(
        "[target]\n" + "".join(f"{k} = {json.dumps(v)}\n" for k, v in data.items()))
    with pytest.raises(ConfigError, match=r"secondary: ") as exc:
        load_config(tmp_path)
    assert says in str(exc.value)
