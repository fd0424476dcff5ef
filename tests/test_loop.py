"""The loop on a real git repo with the fake trainer: keep/reset, refs, crashes, repairs."""

from __future__ import annotations

from pathlib import Path

import git
from conftest import commit_all, make_target
from foreground import run_sweep

from agent.analysis.trials import crash_class
from agent.core.config import load_config
from agent.core.domain import CrashKind, ExperimentStatus, Proposal, SweepStatus
from agent.git.repo import GitRepo
from agent.ops.sweeps import create_sweep
from agent.proposers.knobs import KnobsProposer, make_diff
from db.reads import Reads


def edit(target: Path, old: str, new: str, path: str = "train.py") -> str:
    text = (target / path).read_text()
    assert old in text
    return make_diff(path, text, text.replace(old, new, 1))


class Scripted:
    """A proposer that plays back proposals, and fixes for repairs."""

    name = "scripted"
    out_of_ideas: str | None = None

    def __init__(self, proposals, fixes=()):
        self.proposals, self.fixes = list(proposals), list(fixes)
        self.repairs_asked = []

    def propose(self, ctx):
        if not self.proposals:
            return None
        item = self.proposals.pop(0)
        if isinstance(item, tuple):  # (description, old, new): a diff against the current head
            desc, old, new = item
            text = ctx.files["train.py"]
            return Proposal(desc, make_diff("train.py", text, text.replace(old, new, 1)), self.name)
        return item

    def repair(self, ctx, failed):
        self.repairs_asked.append(failed.id)
        return self.fixes.pop(0) if self.fixes else None


def start(store, target, name="s1", **kw):
    return create_sweep(store, GitRepo(target), target, name=name, config=load_config(target), **kw)


def test_keep_and_reset_move_only_the_sweep_branch(store, target, make_loop, tmp_path):
    user = git.Repo(target)
    user_head = user.head.commit.hexsha
    props = [
        ("lr 0.02", "LR = 0.01", "LR = 0.02"),  # better
        ("width 32", "WIDTH = 64", "WIDTH = 32"),  # worse
        ("width 128", "WIDTH = 64", "WIDTH = 128"),  # better
        ("trick", "USE_TRICK = False", "USE_TRICK = True"),  # better
    ]
    sweep = start(store, target)
    done = run_sweep(make_loop(target, Scripted(props)), sweep.name)
    assert done.status is SweepStatus.DONE

    exps = store.list_experiments(sweep.id)
    assert [e.status for e in exps] == [
        ExperimentStatus.KEPT,
        ExperimentStatus.KEPT,
        ExperimentStatus.DISCARDED,
        ExperimentStatus.KEPT,
        ExperimentStatus.KEPT,
    ]
    assert exps[0].is_baseline and exps[0].metric == 1.3
    # the branch log is baseline + kept only, newest first
    log = GitRepo(target).log(sweep.branch)
    assert [s for _, s in log] == ["trick", "width 128", "lr 0.02", "overnight: initial target"]
    assert done.best_metric == exps[-1].metric and done.best_commit == exps[-1].commit
    assert done.baseline_metric == 1.3
    # the discarded commit survives under a hidden ref and is not on the branch
    discarded = exps[2]
    assert discarded.ref == f"refs/overnight/s1/{discarded.id}"
    assert user.git.rev_parse(discarded.ref) == discarded.commit
    assert not user.is_ancestor(discarded.commit, user.git.rev_parse(sweep.branch))
    assert "WIDTH = 32" in user.git.show(f"{discarded.commit}:train.py")
    # the user's checkout and branch never moved; no worktrees left behind
    assert user.head.commit.hexsha == user_head and not user.is_dirty(untracked_files=True)
    assert len(user.git.worktree("list").splitlines()) == 1
    assert not any((tmp_path / "work" / "worktrees" / "s1").iterdir())
    # deltas are against the best at the time; loss curve stored
    assert abs(discarded.delta - (discarded.metric - discarded.best_before)) < 1e-12
    assert discarded.best_before == exps[1].metric
    assert [p.step for p in Reads(store).loss_points(exps[1].id)] == [1, 2, 3]
    assert Path(exps[1].log_path).read_text().count("step ") == 3


def test_crash_classes_and_trivial_repair(store, target, make_loop):
    typo = edit(target, "budget = float(", "budget = flaot(")
    fixed = edit(target, "LR = 0.01", "LR = 0.02")
    oom = edit(target, "value = score(", "raise MemoryError()\nvalue = score(")
    hang = edit(target, "value = score(", "time.sleep(60)\nvalue = score(")
    nan = edit(target, "value = score(LR, WIDTH, USE_TRICK)", "value = float('nan')")
    proposer = Scripted(
        [
            Proposal("typo", typo, "scripted"),
            Proposal("oom", oom, "scripted"),
            Proposal("late typo", edit(target, "score(LR,", "score(LRR,"), "scripted"),
            Proposal("hang", hang, "scripted"),
            Proposal("nan", nan, "scripted"),
        ],
        fixes=[Proposal("typo, fixed", fixed, "scripted")],
    )
    (target / "overnight.toml").write_text(
        (target / "overnight.toml").read_text().replace("timeout_s = 20", "timeout_s = 2")
    )
    commit_all(target, "short timeout")
    sweep = start(store, target)
    run_sweep(make_loop(target, proposer), sweep.name)
    by_desc = {e.description: e for e in store.list_experiments(sweep.id)}

    typo_exp = by_desc["typo"]
    assert typo_exp.status is ExperimentStatus.CRASHED
    assert typo_exp.crash_kind is CrashKind.TRIVIAL and "NameError" in typo_exp.reason
    late_typo = by_desc["late typo"]  # the same error class after training started
    assert late_typo.crash_kind is CrashKind.FUNDAMENTAL and "after training" in late_typo.reason
    child = by_desc["typo, fixed"]
    assert child.parent_id == typo_exp.id and child.attempt == 1
    assert child.status is ExperimentStatus.KEPT
    assert proposer.repairs_asked == [typo_exp.id]  # fundamental/timeout are not repaired

    assert by_desc["oom"].crash_kind is CrashKind.FUNDAMENTAL
    assert "memory" in by_desc["oom"].reason
    assert by_desc["hang"].status is ExperimentStatus.TIMEOUT
    assert by_desc["hang"].crash_kind is CrashKind.TIMEOUT
    assert by_desc["nan"].status is ExperimentStatus.CRASHED
    assert "FAIL" in by_desc["nan"].reason
    assert all(e.log_tail for e in by_desc.values() if not e.is_baseline)
    # the fine cause is recorded once, at classification, and read back from the database
    assert {d: by_desc[d].crash_cause for d in ("typo", "oom", "hang", "nan")} == {
        "typo": "undefined name", "oom": "CPU out of memory", "hang": "timeout",
        "nan": "NaN/inf loss"}
    assert by_desc["typo, fixed"].crash_cause is None and by_desc["baseline"].crash_cause is None
    assert crash_class(by_desc["oom"]) == "oom" and crash_class(by_desc["nan"]) == "nan"
    # crashes never move the branch: the target's two commits + the repaired keep only
    assert [s for _, s in GitRepo(target).log(sweep.branch)][0] == "typo, fixed"
    assert len(GitRepo(target).log(sweep.branch)) == 3


def test_repair_attempts_are_bounded(store, target, make_loop):
    typo = edit(target, "budget = float(", "budget = flaot(")
    typo2 = edit(target, "budget = float(", "budget = floaat(")
    typo3 = edit(target, "budget = float(", "budget = floaaat(")
    proposer = Scripted(
        [Proposal("typo", typo, "scripted")],
        fixes=[
            Proposal("fix 1", typo2, "scripted"),
            Proposal("fix 2", typo3, "scripted"),
            Proposal("fix 3", edit(target, "LR = 0.01", "LR = 0.02"), "scripted"),
        ],
    )
    sweep = start(store, target)
    run_sweep(make_loop(target, proposer), sweep.name)
    exps = store.list_experiments(sweep.id)
    assert [e.attempt for e in exps[1:]] == [0, 1, 2]
    assert all(e.status is ExperimentStatus.CRASHED for e in exps[1:])
    assert len(proposer.repairs_asked) == 2


def test_run_that_rewrites_a_protected_file_is_not_kept(store, target, make_loop):
    tamper = edit(
        target,
        "value = score(LR, WIDTH, USE_TRICK)",
        "open('prepare.py', 'a').write('# x')\nvalue = 0.1",
    )
    sweep = start(store, target)
    run_sweep(make_loop(target, Scripted([Proposal("cheat", tamper, "scripted")])), sweep.name)
    cheat = store.list_experiments(sweep.id)[-1]
    assert cheat.status is ExperimentStatus.CRASHED and "prepare.py" in cheat.reason
    assert store.get_sweep(sweep.name).best_metric == 1.3


def test_failed_baseline_stops_the_sweep(tmp_path, store, make_loop):
    broken = make_target(tmp_path / "broken")
    (broken / "train.py").write_text("import nope\n")
    commit_all(broken, "break")
    sweep = start(store, broken)
    done = run_sweep(make_loop(broken, KnobsProposer()), sweep.name)
    assert done.status is SweepStatus.STOPPED
    assert [e.status for e in store.list_experiments(sweep.id)] == [ExperimentStatus.CRASHED]


def test_knobs_sweep_respects_limit_and_improves(store, target, make_loop):
    sweep = start(store, target, max_experiments=6)
    done = run_sweep(make_loop(target, KnobsProposer(seed=1)), sweep.name)
    exps = store.list_experiments(sweep.id)
    assert len(exps) == 7 and done.status is SweepStatus.DONE
    assert done.best_metric < done.baseline_metric
    diffs = [e.diff for e in exps]
    assert len(set(diffs)) == len(diffs)  # never repeats a change
    assert all(e.status in (ExperimentStatus.KEPT, ExperimentStatus.DISCARDED) for e in exps)


def test_diff_queued_against_an_old_head_is_rejected_if_it_conflicts(store, target, make_loop):
    from agent.ops.admission import admit, queue

    sweep = start(store, target)
    repo = GitRepo(target)
    a = queue(store, admit(store, repo, sweep,
                           Proposal("lr .02", edit(target, "LR = 0.01", "LR = 0.02"))))
    b = queue(store, admit(store, repo, sweep,
                           Proposal("lr .03", edit(target, "LR = 0.01", "LR = 0.03"))))
    run_sweep(make_loop(target), sweep.name)
    assert store.get_experiment(a.id).status is ExperimentStatus.KEPT
    late = store.get_experiment(b.id)
    assert late.status is ExperimentStatus.REJECTED and "no longer applies" in late.reason


def _noisy_target(tmp_path: Path, confirm_runs: int) -> Path:
    """The strict rule (autoresearch's, with the optional confirmation runs) on seeded noise."""
    fixture = Path(__file__).parent / "fixtures" / "fake_target"
    train = (fixture / "train.py").read_text().replace("NOISE = 0.0", "NOISE = 0.1")
    toml = (fixture / "overnight.toml").read_text() + (
        f'confirm_runs = {confirm_runs}\ndecision = "strict"\n'
    )
    return make_target(tmp_path / f"noisy{confirm_runs}", edits={"train.py": train,
                                                                  "overnight.toml": toml})


def test_confirm_runs_keep_real_gains_and_drop_lucky_seeds(tmp_path, store, make_loop):
    """With confirm_runs, a would-be keep is re-run with other seeds and judged on the mean."""
    target = _noisy_target(tmp_path, confirm_runs=2)
    proposer = Scripted([
        ("width 60 (slightly worse, lucky first seed)", "WIDTH = 64", "WIDTH = 60"),
        ("lr 0.02 (really better)", "LR = 0.01", "LR = 0.02"),
    ])
    sweep = start(store, target, name="noisy")
    run_sweep(make_loop(target, proposer), sweep.name)
    base, lucky, real = store.list_experiments(sweep.id)
    # seeds 42, 43, 44 add -0.1, +0.1, +0.1: the baseline is the mean of three runs
    assert base.status is ExperimentStatus.KEPT
    assert abs(base.metric - (1.3 + 0.1 / 3)) < 1e-6 and "mean of 3 runs" in base.reason
    # its first run (1.2047) beat the baseline; the mean of three (1.338) does not
    assert lucky.status is ExperimentStatus.DISCARDED and lucky.metric > base.metric
    assert f"mean {lucky.metric:.6f} of 3 runs" in lucky.reason
    assert real.status is ExperimentStatus.KEPT and abs(real.metric - (1.2 + 0.1 / 3)) < 1e-6
    assert store.get_sweep("noisy").best_metric == real.metric
    logs = sorted(p.name for p in (tmp_path / "work" / "logs" / "noisy").iterdir())
    assert f"{real.id}.run3.log" in logs
    # every run is its own record: seed base+k, its own log and process group
    runs = store.list_runs(experiment_id=real.id)
    assert [(r.seed, r.role.value, r.status.value) for r in runs] == [
        (42, "screen", "ok"), (43, "confirm", "ok"), (44, "confirm", "ok")]
    assert all(r.pgid and Path(r.log_path).is_file() for r in runs)
    assert [round(r.metric, 6) for r in runs] == [1.1, 1.3, 1.3]


def test_without_confirmation_the_lucky_seed_is_kept(tmp_path, store, make_loop):
    target = _noisy_target(tmp_path, confirm_runs=0)
    fixture_lr = ("lr 0.011 (a hair better)", "LR = 0.01", "LR = 0.011")
    sweep = start(store, target, name="plain")
    run_sweep(make_loop(target, Scripted([fixture_lr])), sweep.name)
    base, exp = store.list_experiments(sweep.id)
    assert base.metric == 1.2  # one run, seed 42
    assert exp.status is ExperimentStatus.KEPT and exp.reason.startswith("better (strict)")


def test_a_keep_measured_on_a_stale_head_is_rerun_on_the_new_head(tmp_path, store, make_loop):
    """Two slots, one sweep: B beats the best, but ran without A's change kept meanwhile.
    The combination never ran, so B is not kept; it is re-queued on the new head."""
    import threading

    from service_fixtures import wait_for

    fixture = Path(__file__).parent / "fixtures" / "fake_target"
    text = (fixture / "train.py").read_text()
    spaced = text.replace("WIDTH = 64", "#\n" * 8 + "WIDTH = 64")  # A's and B's hunks apart
    target = make_target(tmp_path / "t2", edits={"train.py": spaced})
    sweep = start(store, target, name="two")
    gate = tmp_path / "b-may-finish"
    loop = make_loop(target, env={"B_GATE": str(gate)})
    loop.execute(sweep, store.claim_next(sweep.id))  # the baseline: 1.3
    repo = GitRepo(target)
    head_text = repo.read_file(repo.head(sweep.branch), "train.py")

    def diff(*pairs):
        new = head_text
        for old, rep in pairs:
            new = new.replace(old, rep, 1)
        return make_diff("train.py", head_text, new)

    from agent.ops.admission import admit, queue

    # A: 0.1 better. B: 0.15 better alone, 0.25 better together with A; B's run waits for the
    # gate file, which appears only once A is kept (state, not a head start in seconds).
    a = queue(store, admit(store, repo, sweep,
                           Proposal("A: lr 0.02", diff(("LR = 0.01", "LR = 0.02")))))
    hold = "SLEEP_S = 0.0\nwhile not os.path.exists(os.environ['B_GATE']):\n    time.sleep(0.02)\n#"
    b = queue(store, admit(store, repo, sweep, Proposal("B: width 256 + trick", diff(
        ("WIDTH = 64", "WIDTH = 256"), ("USE_TRICK = False", "USE_TRICK = True"),
        ("SLEEP_S = 0.0", hold)))))
    b_thread = threading.Thread(target=loop.execute, args=(sweep, store.claim(b.id)))
    b_thread.start()
    wait_for(lambda: store.get_experiment(b.id).run_started_at, 60, "B's run to start")
    loop.execute(sweep, store.claim(a.id))  # A runs and is kept while B is still running
    assert store.get_experiment(b.id).status is ExperimentStatus.RUNNING
    gate.touch()
    b_thread.join(60)
    assert not b_thread.is_alive()
    a_done, b_done = store.get_experiment(a.id), store.get_experiment(b.id)
    assert a_done.status is ExperimentStatus.KEPT and abs(a_done.metric - 1.2) < 1e-9
    assert b_done.status is ExperimentStatus.DISCARDED and abs(b_done.metric - 1.15) < 1e-9
    assert "re-queued on the new head" in b_done.reason
    rerun = store.claim_next(sweep.id)
    assert rerun.parent_id == b.id and rerun.meta["rerun_of"] == b.id
    assert rerun.base_commit == a_done.commit
    done = loop.execute(store.get_sweep("two"), rerun)
    assert done.status is ExperimentStatus.KEPT and abs(done.metric - 1.05) < 1e-9
    assert [s for _, s in repo.log(sweep.branch)][:2] == ["B: width 256 + trick", "A: lr 0.02"]
    assert store.get_sweep("two").best_commit == repo.head(sweep.branch) == done.commit


def test_a_sweep_at_its_max_still_runs_a_change_re_queued_on_its_new_head(store, target,
                                                                          make_loop):
    """A re-queued change (or a repair) continues one already counted: a sweep at its
    max_experiments runs it before it ends, asks for nothing new, and leaves a late ordinary
    proposal queued. (On two slots under load, a keep elsewhere re-queued a change just as the
    sweep reached its max; the sweep ended with the re-run queued and never judged.)"""
    from agent.core.domain import CONTINUATION_PRIORITY

    sweep = start(store, target, name="cap", max_experiments=1)
    loop = make_loop(target)
    loop.execute(sweep, store.claim_next(sweep.id))  # the baseline
    a = store.add_experiment(sweep.id, Proposal("A: lr 0.02", edit(target, "LR = 0.01",
                                                                   "LR = 0.02")))
    assert loop.execute(store.get_sweep("cap"), store.claim(a.id)).status is \
        ExperimentStatus.KEPT  # one used: the sweep is at its max
    repo = GitRepo(target)
    head = repo.read_file(repo.head(sweep.branch), "train.py")
    wider = make_diff("train.py", head, head.replace("WIDTH = 64", "WIDTH = 256", 1))
    rerun = store.add_experiment(  # as the loop re-queues a keep measured on a stale head
        sweep.id, Proposal("B: width 256", wider, "scripted", a.id, {"rerun_of": a.id}),
        priority=CONTINUATION_PRIORITY)
    late = store.add_experiment(sweep.id, Proposal("C: trick", make_diff(
        "train.py", head, head.replace("USE_TRICK = False", "USE_TRICK = True", 1))))
    asked = Scripted([("D: width 32", "WIDTH = 64", "WIDTH = 32")])
    done = run_sweep(make_loop(target, asked), "cap")
    assert done.status is SweepStatus.DONE
    assert store.get_experiment(rerun.id).status is ExperimentStatus.KEPT
    assert store.get_experiment(late.id).status is ExperimentStatus.QUEUED  # beyond the max
    assert len(asked.proposals) == 1  # nothing new was asked for


def test_protected_file_changed_on_the_sweep_branch_rejects_the_run(store, target, make_loop):
    """Someone committed to prepare.py on the sweep branch: nothing runs on a changed metric."""
    sweep = start(store, target)
    loop = make_loop(target)
    loop.execute(sweep, store.claim_next(sweep.id))  # the baseline, hashes recorded at creation
    repo = GitRepo(target)
    head = repo.head(sweep.branch)
    tampered = repo.commit_proposal(head, edit(target, "1.0\n", "0.5\n", "prepare.py"), "easier")[0]
    repo.set_ref(f"refs/heads/{sweep.branch}", tampered)
    exp = store.add_experiment(sweep.id, Proposal("lr", edit(target, "LR = 0.01", "LR = 0.02")))
    done = loop.execute(store.get_sweep("s1"), store.claim(exp.id))
    assert done.status is ExperimentStatus.REJECTED
    assert done.reason == "protected file(s) changed on the sweep branch: prepare.py"
    assert done.log_path is None and done.run_started_at is None  # it never ran
    assert repo.head(sweep.branch) == tampered  # not moved by the loop
    assert store.get_sweep("s1").best_metric == 1.3  # the baseline is still the best


def test_a_stale_keep_that_conflicts_with_the_new_head_is_discarded_not_requeued(
    tmp_path, store, make_loop
):
    """B beat the best on the old head but edits the same line A changed and kept meanwhile:
    it cannot be re-run on the new head, so it is discarded with that reason, nothing queued."""
    import threading

    from service_fixtures import wait_for

    from agent.ops.admission import admit, queue

    target = make_target(tmp_path / "t3")
    sweep = start(store, target, name="clash")
    gate = tmp_path / "b-may-finish"
    loop = make_loop(target, env={"B_GATE": str(gate)})
    loop.execute(sweep, store.claim_next(sweep.id))  # the baseline: 1.3
    repo = GitRepo(target)
    a = queue(store, admit(store, repo, sweep,
                           Proposal("A: lr 0.02", edit(target, "LR = 0.01", "LR = 0.02"))))
    text = (target / "train.py").read_text()
    hold = "SLEEP_S = 0.0\nwhile not os.path.exists(os.environ['B_GATE']):\n    time.sleep(0.02)\n#"
    b_diff = make_diff("train.py", text,
                       text.replace("LR = 0.01", "LR = 0.04").replace("SLEEP_S = 0.0", hold))
    b = queue(store, admit(store, repo, sweep, Proposal("B: lr 0.04", b_diff)))
    b_thread = threading.Thread(target=loop.execute, args=(sweep, store.claim(b.id)))
    b_thread.start()
    wait_for(lambda: store.get_experiment(b.id).run_started_at, 60, "B's run to start")
    a_done = loop.execute(sweep, store.claim(a.id))
    assert a_done.status is ExperimentStatus.KEPT
    gate.touch()
    b_thread.join(60)
    assert not b_thread.is_alive()
    b_done = store.get_experiment(b.id)
    assert b_done.status is ExperimentStatus.DISCARDED and abs(b_done.metric - 1.1) < 1e-9
    assert b_done.reason.startswith("promising, but conflicts with the change kept meanwhile")
    assert store.count_experiments(sweep.id, [ExperimentStatus.QUEUED]) == 0
    assert store.claim_next(sweep.id) is None
    assert repo.head(sweep.branch) == a_done.commit == store.get_sweep("clash").best_commit


def test_five_rejected_proposals_in_a_row_end_the_sweep(store, target, make_loop):
    bad = [Proposal(f"edit the metric {i}", edit(target, "1.0\n", f"0.{i}\n", "prepare.py"),
                    "scripted") for i in range(1, 7)]
    proposer = Scripted(bad)
    sweep = start(store, target)
    done = run_sweep(make_loop(target, proposer), sweep.name)
    assert done.status is SweepStatus.DONE
    exps = store.list_experiments(sweep.id)
    assert [e.status for e in exps] == [ExperimentStatus.KEPT] + [ExperimentStatus.REJECTED] * 6
    assert all("prepare.py" in (e.reason or "") for e in exps[1:6])
    assert len(proposer.proposals) == 1  # asked five times, not a sixth
    # and the last row says what ended the sweep
    assert exps[-1].reason == ("5 proposals in a row were refused: the proposer counts as out "
                               "of ideas") and exps[-1].proposer == "scripted"


def test_a_discard_the_rule_gives_no_value_is_recorded_without_one(store, target, make_loop,
                                                                   monkeypatch):
    """A change none of whose runs was placed in a machine condition (the machine moved under
    every pair: made here by the rule's own unjudged verdict, as a busy machine makes it) has no
    value on any screen: not the last run's printed metric."""
    from dataclasses import replace

    import agent.engine.loop as loop_module
    from agent.core.record import Ending, Measured
    from agent.rules.decide import decide

    def unsteady(ev, rule):  # type: ignore[no-untyped-def]
        v = decide(ev, rule)
        if ev.is_baseline or v.status is None:
            return v
        return replace(v, status=ExperimentStatus.DISCARDED, keep=False, change=Measured(),
                       set_aside=tuple(r.run_id for r in ev.runs), p_value=None,
                       ending=Ending.NOT_JUDGED, compared_with=None, difference=None,
                       reason="not judged: the machine's speed kept changing around its runs")

    monkeypatch.setattr(loop_module, "decide", unsteady)
    sweep = start(store, target)
    run_sweep(make_loop(target, Scripted([("lr 0.02", "LR = 0.01", "LR = 0.02")])), sweep.name)
    change = store.list_experiments(sweep.id)[-1]
    assert change.status is ExperimentStatus.DISCARDED and change.reason.startswith("not judged")
    assert change.metric is None and change.delta is None
