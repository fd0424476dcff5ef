"""adopt's pure rules on the shapes of scripts in the wild: metrics as printed, the README's
command split into command + args file, hydra's selected configs, progress formats, the budget
and summary lines for a training loop, a Hugging Face Trainer and Lightning."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from agent.core.config import parse_config
from agent.core.errors import ConfigError
from agent.git.repo import init_repo
from agent.ops.adopt import (
    hydra_files,
    pick_command,
    readme_commands,
    split_command,
    untracked_data,
)
from agent.ops.adopt_contract import (
    PROGRESS_FORMATS,
    find_metrics,
    lightning_todos,
    loop_todos,
    trainer_todos,
)


@pytest.mark.parametrize("line,name,expr", [
    ("print(f'step {it}: train loss {l[0]:.4f}, val loss {l[1]:.4f}')", "val_loss", "l[1]"),
    ("print(f'val_loss: {vl}')", "val_loss", "vl"),
    ("print(f'epoch {e} valid_acc={acc:.3f}')", "valid_acc", "acc"),
    ("metrics = {'eval_loss': loss}", "eval_loss", ""),
    ("self.log('val/acc', self.acc, prog_bar=True)", "val_acc", ""),
    ("print(f'test perplexity {ppl}')", "test_perplexity", "ppl"),
])
def test_metrics_as_scripts_print_them(line: str, name: str, expr: str):
    (metric,) = find_metrics(line + "\n")[:1]
    assert (metric.name, metric.expr) == (name, expr)


def test_a_printed_value_comes_before_a_bare_name():
    text = "wandb.log({'val/loss': 1})\nprint(f'val loss {v:.3f}')\n"
    assert find_metrics(text)[0].expr == "v"


def test_the_readme_command_a_cpu_machine_runs(tmp_path: Path):
    (tmp_path / "README.md").write_text(
        "```\n$ python train.py config/a.py\n```\nOn a laptop:\n"
        "```sh\npython train.py config/a.py --device=cpu --n_layer=4\npython sample.py\n```\n")
    found = readme_commands(tmp_path, "train.py")
    assert found == ["python train.py config/a.py",
                     "python train.py config/a.py --device=cpu --n_layer=4"]
    assert pick_command(found, has_gpu=False) == found[1]
    assert pick_command(found, has_gpu=True) == found[0] and pick_command([], False) is None


def test_the_command_keeps_its_files_and_its_flags_go_to_the_args_file():
    base, lines = split_command("python train.py config/a.py --device=cpu --lr 0.1 --amp "
                                "--overrides n_embd=10,bias=false -b 8 model.lr=0.2 -m")
    assert base == "python train.py config/a.py"
    assert lines == ["--device=cpu  # knobs: skip", "--lr 0.1", "--amp",
                     "--overrides n_embd=10,bias=false", "-b 8", "model.lr=0.2", "-m"]
    base, lines = split_command("python train.py --config conf/a.yaml --lr 0.1")
    assert base == "python train.py --config conf/a.yaml" and lines == ["--lr 0.1"]


def test_hydra_defaults_select_the_group_files(tmp_path: Path):
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "train.py").write_text(
        '@hydra.main(version_base="1.3", config_path="../configs", config_name="train.yaml")\n')
    for path in ("model/mnist.yaml", "model/big.yaml", "data/mnist.yaml", "paths/default.yaml",
                 "trainer/default.yaml", "trainer/cpu.yaml"):
        (tmp_path / "configs" / path).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / "configs" / path).write_text("x: 1\n")
    (tmp_path / "configs" / "train.yaml").write_text(
        "defaults:\n  - _self_\n  - data: mnist\n  - model: mnist\n  - logger: null\n"
        "  - trainer: default\n  - paths: default\n")
    assert hydra_files(tmp_path, "src/train.py", ["trainer=cpu", "model.lr=1"]) == [
        "configs/data/mnist.yaml", "configs/model/mnist.yaml", "configs/trainer/cpu.yaml"]


@pytest.mark.parametrize("line,step,loss", [
    ("iter 10: loss 4.4800, time 9.70ms, mfu 0.01%", "10", "4.4800"),  # nanoGPT
    ("{'loss': '2.31', 'grad_norm': '1.1', 'learning_rate': '4e-05', 'epoch': '0.1'}", None,
     "2.31"),  # Hugging Face Trainer
    ("Epoch 0:  45%|████▌     | 194/430 [00:02<00:03, 75.1it/s, v_num=0, train/loss=0.512]",
     "194", "0.512"),  # Lightning's tqdm bar
    ("Epoch 0/99 ━━━━ 131/430 0:00:11 • 13.68it/s val/loss: 0.035 train/loss: 0.61", "131",
     "0.61"),  # Lightning's rich bar (the validation loss is not the training loss)
    ("100%|██████████| 30/30 [01:35<00:00, 3.18s/it, loss=3.2]", "30", "3.2"),  # tqdm
])
def test_progress_formats_of_well_known_scripts(line: str, step: str | None, loss: str):
    matches = [re.search(rx, line) for _, rx in PROGRESS_FORMATS]
    m = next(m for m in matches if m)
    assert m.group("loss") == loss and m.groupdict().get("step") == step


LOOP = """import os, time
t0 = time.time()
overnight_t0 = 0
def evaluate():
    return 1.0
for step in range(10**9):
    optimizer.step()
    if step % 100 == 0:
        val = evaluate()
        print(f"step {step} val_loss={val:.3f}")
    t0 = time.time()
print('done')
"""


def test_budget_and_summary_lines_for_a_loop_do_not_collide_with_the_script():
    (metric,) = find_metrics(LOOP)
    todos = loop_todos(LOOP, metric, "overnight_t0_2", "overnight_budget_s")
    text = "\n".join(line for t in todos for line in t.lines)
    assert "overnight_t0_2 = time.time()" in text and "if time.time() - overnight_t0_2" in text
    assert todos[0].where == "before line 6, `for step in range(10**9):`"
    assert todos[1].where == "after line 11" and todos[1].lines[0].startswith("    if ")
    final = next(t for t in todos if t.what.startswith("the final evaluation"))
    assert "under `if step % 100 == 0`" in final.what and final.lines == ["val = evaluate()"]
    assert "print(f'val_loss: {val:.6f}')" in text and "num_steps: {step}" in text


def test_trainer_and_lightning_scripts_are_told_their_own_way():
    hf = ("trainer = Trainer(\n    model=model,\n)\ntrain_result = trainer.train()\n"
          "metrics = trainer.evaluate()\n")
    imports, stop, block = trainer_todos(hf, None, "t0", "b")
    assert imports.lines == ["import os, time"] and imports.where == "before line 1"
    (imports, _, _) = trainer_todos("import os\n" + hf, None, "t0", "b")
    assert imports.lines == ["import time"]  # at module level: never inside the function
    assert stop.where.startswith("after line 3") and "TrainerCallback" in "\n".join(stop.lines)
    assert block.where.startswith("after line 5") and any(
        "train_result.metrics['train_runtime']" in line for line in block.lines)
    pl = ("def train(cfg):\n    trainer = make()\n    trainer.fit(model=m,\n"
          "                datamodule=d)\n")
    imports, budget, timing, summary = lightning_todos(pl, None, "t0", hydra=True)
    assert imports.lines == ["import time"]
    assert budget.lines[0].startswith("++trainer.max_time=") and "++trainer.min_epochs=0" in \
        budget.lines
    assert timing.where.startswith("before line 3") and timing.lines[-1] == "    t0 = time.time()"
    assert summary.where.startswith("after line 4") and "trainer.callback_metrics['val/loss']" in \
        summary.lines[2]


def test_git_ignored_data_inside_a_tracked_folder_is_an_asset(tmp_path: Path):
    (tmp_path / "data" / "tiny").mkdir(parents=True)
    (tmp_path / "data" / "tiny" / "prepare.py").write_text("print(1)\n")
    (tmp_path / "tokenizer").mkdir()
    (tmp_path / ".gitignore").write_text("*.bin\ntokenizer/\nout/\n__pycache__/\n")
    init_repo(tmp_path)
    (tmp_path / "data" / "tiny" / "train.bin").write_text("x")
    (tmp_path / "tokenizer" / "vocab.json").write_text("{}")
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "ckpt.pt").write_text("x")
    assert untracked_data(tmp_path, "--tokenizer_name tokenizer --output_dir out") == [
        "data/tiny/train.bin", "tokenizer"]


def test_an_args_file_must_be_editable():
    with pytest.raises(ConfigError, match="args_file: a.args must also be listed in editable"):
        parse_config({"command": "python t.py", "editable": ["t.py"], "metric": "m",
                      "budget_s": 1, "args_file": "a.args"})


def test_a_package_overnight_python_lacks_is_named(tmp_path: Path):
    from agent.ops.adopt import missing_imports

    (tmp_path / "helpers.py").write_text("x = 1\n")
    text = "import os, json\nimport helpers\nfrom no_such_package_here.sub import x\n"
    (tmp_path / "train.py").write_text(text)
    assert missing_imports(tmp_path, tmp_path / "train.py", text) == ["no_such_package_here"]


@pytest.mark.parametrize("metric,way,word", [
    ("test_acc", "maximize", "acc"), ("val_loss", "minimize", "loss"),
    ("eval/bleu", "maximize", "bleu"), ("val_ppl", "minimize", "ppl"),
    ("mean_reward", "maximize", "reward"), ("top1_error", "minimize", "error"),
    ("val_bpb", "minimize", "bpb"), ("f1", "maximize", "f1"), ("val_auc", "maximize", "auc"),
])
def test_the_direction_comes_from_the_metric_s_name_and_says_which_word(metric, way, word):
    from agent.ops.adopt import direction_for

    got, why = direction_for(metric)
    assert got == way and f"`{word}` in `{metric}`" in why
    assert direction_for("val_thing") == ("minimize", "nothing in `val_thing` says which way is "
                                          "better: minimize assumed (pass --direction maximize "
                                          "if higher is better)")


def test_accuracy_spelled_out_is_maximized_and_decides_over_an_earlier_word():
    from agent.ops.adopt import direction_for

    assert direction_for("val_accuracy") == (
        "maximize", "`accuracy` in `val_accuracy`: higher is better")
    # the last word that says which way decides: `accuracy`, not `top1` before it
    assert direction_for("top1_accuracy") == (
        "maximize", "`accuracy` in `top1_accuracy`: higher is better")
    assert direction_for("val_loss") == ("minimize", "`loss` in `val_loss`: lower is better")


def test_a_progress_regex_is_made_only_from_lines_the_script_printed():
    from agent.ops.adopt_contract import fit_progress

    lines = ["trainer:", "    learning_rate: 0.0005", "iter_dt 0.00ms; iter 0: train loss 4.49",
             "iter_dt 52.1ms; iter 10: train loss 3.71", "iter 10: test acc 0.25",
             "iter_dt 49.9ms; iter 20: train loss 3.12"]
    fit = fit_progress(lines)
    assert (fit.matched, fit.lines) == (3, 3) and fit.regex is not None
    m = re.search(fit.regex, lines[3])
    assert m and (m.group("step"), m.group("loss")) == ("10", "3.71")
    assert fit_progress(["step 1 | loss 3.2 | elapsed 1.0s"] * 3).default  # needs no regex
    nano = ["iter 0: loss 4.4800, time 9.70ms, mfu 0.01%"] * 2
    assert fit_progress(nano).regex == PROGRESS_FORMATS[0][1]  # a known format first
    nothing = fit_progress(["epoch 1 done", "accuracy 0.41", "---", "train_loss: 2.0"])
    assert (nothing.regex, nothing.default, nothing.lines) == (None, False, 0)
