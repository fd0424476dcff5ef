"""Windows and limits with an injectable clock (pure), and slots run synchronously on real git."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone
from pathlib import Path

import pytest
from service_fixtures import knob_diff, make_counting_target

from agent.core.domain import ExperimentStatus, Finish, Proposal, SweepStatus
from agent.core.errors import ConfigError
from agent.engine.claims import claim_queued
from agent.engine.devices import detect_devices, parse_devices, slot_env
from agent.engine.scheduler import SchedulerSettings, SlotScheduler
from agent.git.repo import GitRepo, init_repo
from agent.ops.sweeps import create_sweep
from agent.rules.gate import GateKind, SweepFacts, gate, in_window, parse_hhmm
from overnight.runtime import Runtime

TZ = timezone(timedelta(hours=2))  # the "server local time" of these tests
NIGHT = {"start": "22:00", "stop": "07:00"}


def at(hh: int, mm: int = 0, day: int = 8) -> datetime:
    return datetime(2026, 3, day, hh, mm, tzinfo=TZ)


class FakeClock:
    def __init__(self, now: datetime) -> None:
        self.t = now

    def now(self) -> datetime:
        return self.t


@pytest.mark.parametrize("hhmm,inside", [
    ((21, 59), False), ((22, 0), True), ((23, 30), True), ((0, 0), True), ((6, 59), True),
    ((7, 0), False), ((12, 0), False),
])
def test_window_wrapping_midnight(hhmm: tuple[int, int], inside: bool) -> None:
    assert in_window(NIGHT, at(*hhmm), TZ) is inside


def test_window_same_day_and_all_day() -> None:
    day = {"start": "09:00", "stop": "17:00"}
    assert in_window(day, at(9), TZ) and not in_window(day, at(17), TZ)
    assert in_window({"start": "00:00", "stop": "00:00"}, at(3), TZ)
    assert in_window(None, at(3), TZ)
    # a UTC instant is judged in the server's zone: 20:30 UTC is 22:30 at UTC+2
    assert in_window(NIGHT, datetime(2026, 3, 8, 20, 30, tzinfo=UTC), TZ)


def test_parse_hhmm_refuses_nonsense() -> None:
    for bad in ("24:00", "7:00", "07:60", "", "noon"):
        with pytest.raises(ValueError):
            parse_hhmm(bad)


def facts(**kw: object) -> SweepFacts:
    base: dict[str, object] = {"status": SweepStatus.RUNNING, "baseline_kept": True}
    base.update(kw)
    return SweepFacts(**base)  # type: ignore[arg-type]


def test_gate_rules() -> None:
    now = at(23)
    assert gate(facts(), now, TZ).kind is GateKind.START
    assert gate(facts(status=SweepStatus.PAUSED), now, TZ).kind is GateKind.WAIT
    assert gate(facts(window=NIGHT), at(12), TZ).kind is GateKind.WAIT
    assert gate(facts(window=NIGHT), now, TZ).kind is GateKind.START
    assert gate(facts(max_experiments=3, used=2), now, TZ).kind is GateKind.START
    done = gate(facts(max_experiments=3, used=3), now, TZ)
    assert done.kind is GateKind.FINISH and "max_experiments" in done.reason
    assert gate(facts(deadline=now), now, TZ).kind is GateKind.FINISH
    assert gate(facts(deadline=now + timedelta(seconds=1)), now, TZ).kind is GateKind.START
    # limits finish a sweep even outside its window; the baseline runs alone
    assert gate(facts(window=NIGHT, used=5, max_experiments=5), at(12), TZ).kind is \
        GateKind.FINISH
    assert gate(facts(baseline_kept=False, running=1), now, TZ).kind is GateKind.WAIT
    assert gate(facts(baseline_kept=False, running=0), now, TZ).kind is GateKind.START
    # the baseline never counts: a sweep of 0 experiments still runs it, then finishes
    zero = facts(max_experiments=0, used=0, baseline_kept=False)
    assert gate(zero, now, TZ).kind is GateKind.START
    assert gate(facts(max_experiments=0, used=0), now, TZ).kind is GateKind.FINISH


def test_slot_env_pins_gpus() -> None:
    devices = ("0", "1", "4")
    assert [slot_env(i, devices) for i in range(4)] == [
        {"CUDA_VISIBLE_DEVICES": d} for d in ("0", "1", "4", "0")]
    assert slot_env(0, ()) == {}


def test_devices_are_parsed_and_detected() -> None:
    assert parse_devices("0, 1,4") == ("0", "1", "4")
    for bad in ("", "a", "0,0", "1,-2"):
        with pytest.raises(ConfigError, match="--devices"):
            parse_devices(bad)
    assert detect_devices({"CUDA_VISIBLE_DEVICES": "2,3"}) == ("2", "3")
    assert detect_devices({"CUDA_VISIBLE_DEVICES": ""}) == ()
    assert detect_devices({"CUDA_VISIBLE_DEVICES": "-1"}) == ()


@pytest.fixture
def setup(tmp_path: Path):  # type: ignore[no-untyped-def]
    target = make_counting_target(tmp_path / "target", n_knobs=10)
    runtime = Runtime(tmp_path / "o.db", work_dir=tmp_path / "work")
    store, repo = runtime.store, runtime.repo_at(target)
    settings = SchedulerSettings(slots=1, tz=TZ, grace_s=0.5)
    clock = FakeClock(at(12))
    factory = runtime.loop_factory(settings)
    return target, store, repo, SlotScheduler(store, settings, factory, clock=clock), clock


def test_window_blocks_then_opens(setup) -> None:  # type: ignore[no-untyped-def]
    target, store, repo, sched, clock = setup
    create_sweep(store, repo, target, name="night", proposer="queue", window=NIGHT)
    assert sched.run_slot(0) == 0  # noon: nothing starts
    assert store.count_experiments(statuses=[ExperimentStatus.QUEUED]) == 1
    clock.t = at(22, 30)
    assert sched.run_slot(0) == 1  # the baseline
    assert store.get_sweep("night").baseline_metric is not None


def test_queue_fifo_within_priority_and_max_experiments(setup) -> None:  # type: ignore
    target, store, repo, sched, clock = setup
    sweep = create_sweep(store, repo, target, name="s", proposer="queue", max_experiments=2)
    ids = []
    for k, prio in ((0, 0), (1, 5), (2, 0)):
        exp = store.add_experiment(sweep.id, Proposal(f"K{k}", knob_diff(target, k, 1)),
                                   priority=prio)
        ids.append(exp.id)
    assert sched.run_slot(0) == 3  # baseline, K1 (priority 5), K0 (FIFO), then the limit
    started = sorted((e for e in store.list_experiments(sweep.id) if e.started_at),
                     key=lambda e: e.started_at)  # type: ignore[arg-type,return-value]
    assert [e.id for e in started] == [1, ids[1], ids[0]]
    assert store.get_sweep("s").status is SweepStatus.DONE
    assert store.get_experiment(ids[2]).status is ExperimentStatus.QUEUED


def test_proposer_sweep_runs_to_done_with_keep_reset(setup) -> None:  # type: ignore
    target, store, repo, sched, clock = setup
    create_sweep(store, repo, target, name="k", proposer="knobs", max_experiments=3)
    assert sched.run_slot(0) == 4
    sweep = store.get_sweep("k")
    assert sweep.status is SweepStatus.DONE
    assert repo.head(sweep.branch) == sweep.best_commit
    kept = store.list_experiments(sweep.id, [ExperimentStatus.KEPT])
    assert kept[-1].commit == sweep.best_commit


def test_pause_and_failed_baseline(setup, tmp_path: Path) -> None:  # type: ignore
    target, store, repo, sched, clock = setup
    create_sweep(store, repo, target, name="p", proposer="queue")
    store.set_sweep_status("p", SweepStatus.PAUSED)
    assert sched.run_slot(0) == 0
    store.set_sweep_status("p", SweepStatus.RUNNING)
    (target / "train.py").write_text("raise SystemExit(3)\n")
    init_repo(target, "broken")
    create_sweep(store, repo, target, name="broken", proposer="knobs")
    store.set_sweep_status("p", SweepStatus.PAUSED)
    sched.run_slot(0)
    assert store.get_sweep("broken").status is SweepStatus.STOPPED


def test_scheduled_start_persists_across_restarts(setup) -> None:  # type: ignore
    target, store, repo, sched, clock = setup
    create_sweep(store, repo, target, name="later", proposer="queue")
    store.set_sweep_status("later", SweepStatus.PAUSED)
    sched.settings.slots = 0
    sched.start()
    when = datetime.now(UTC) + timedelta(hours=3)
    sched.schedule_start("later", when)
    sched.shutdown()
    again = SlotScheduler(store, sched.settings, sched.loop_factory, clock=clock)
    again.start()
    try:
        starts = again.scheduled_starts()
        assert abs((starts["later"] - when).total_seconds()) < 1
        again.start_now("later")
        assert store.get_sweep("later").status is SweepStatus.RUNNING
    finally:
        again.shutdown()


def test_baseline_runs_first_even_behind_higher_priorities(setup) -> None:  # type: ignore
    target, store, repo, sched, clock = setup
    sweep = create_sweep(store, repo, target, name="b", proposer="queue")
    urgent = store.add_experiment(sweep.id, Proposal("K0", knob_diff(target, 0, 1)),
                                  priority=1000)
    picked = sched.pick(0)
    assert picked is not None and picked[1].is_baseline
    assert sched.pick(0) is None  # the baseline runs alone
    sched._execute(0, *picked)
    assert sched.pick(0)[1].id == urgent.id  # type: ignore[index]


def test_sweep_without_a_baseline_is_stopped(setup) -> None:  # type: ignore
    target, store, repo, sched, clock = setup
    sweep = create_sweep(store, repo, target, name="nb", proposer="queue")
    store.add_experiment(sweep.id, Proposal("K0", knob_diff(target, 0, 1)))
    store.claim(1)
    store.finish(1, Finish(ExperimentStatus.CANCELLED))
    assert sched.run_slot(0) == 0
    assert store.get_sweep("nb").status is SweepStatus.STOPPED


def test_a_slow_proposer_blocks_neither_other_slots_nor_sweep_creation(setup) -> None:  # type: ignore
    """A language model thinking for a long time must not stall the rest of the service."""
    import threading

    target, store, repo, sched, clock = setup
    release = threading.Event()
    asked = threading.Event()

    class SlowProposer:
        name = "slow"
        out_of_ideas: str | None = None

        def propose(self, ctx):  # type: ignore[no-untyped-def]
            asked.set()
            assert release.wait(120), "never released"  # thinks until the test says so
            return None

        def repair(self, ctx, failed):  # type: ignore[no-untyped-def]
            return None

    default = sched.loop_factory

    def factory(sweep, slot):  # type: ignore[no-untyped-def]
        loop = default(sweep, slot)
        if sweep.name == "slow":
            loop.proposer = SlowProposer()
        return loop

    sched.loop_factory = factory
    create_sweep(store, repo, target, name="slow", proposer="knobs")
    sched._execute(0, *sched.pick(0))  # type: ignore[misc]  # its baseline
    results: list[object] = []
    t = threading.Thread(target=lambda: results.append(sched.pick(0)))
    t.start()
    assert asked.wait(60)
    others: list[object] = []

    def meanwhile() -> None:
        with sched.claims_paused():  # what POST /sweeps does
            create_sweep(store, repo, target, name="other", proposer="queue")
        others.append(sched.pick(1))  # another slot gets the other sweep's baseline
        others.append(sched.pick(1))  # the slow sweep is being asked by slot 0: not twice

    other = threading.Thread(target=meanwhile)
    other.start()
    other.join(60)  # bounds a hang only: had it waited on the proposer, it could never end
    blocked = other.is_alive()
    release.set()  # only now does the proposer answer
    other.join(60)
    assert not blocked, "sweep creation or another slot waited for a thinking proposer"
    picked = others[0]
    assert picked is not None and picked[0].name == "other" and picked[1].is_baseline
    assert others[1] is None
    t.join(60)
    assert results == [None]
    sched._execute(1, *picked)
    assert store.get_sweep("slow").status is SweepStatus.DONE


def test_a_stale_sweep_read_never_stops_a_sweep_whose_baseline_just_ended(setup) -> None:  # type: ignore
    """A slot that read the sweep while another slot's baseline ran must not take the missing
    queued baseline for a lost one (it was claimed, or kept, meanwhile)."""
    target, store, repo, sched, clock = setup
    sweep = create_sweep(store, repo, target, name="race", proposer="queue")
    queued = store.add_experiment(sweep.id, Proposal("K0", knob_diff(target, 0, 1)))
    stale = store.get_sweep("race")  # read before the baseline is claimed
    store.claim(1)  # another slot took the baseline
    assert claim_queued(store, stale) is None
    assert store.get_sweep("race").status is SweepStatus.RUNNING
    store.finish(1, Finish(ExperimentStatus.KEPT, metric=1.0, best=1.0),
                 keep_commit=repo.head(stale.branch))
    claimed = claim_queued(store, stale)  # the baseline was kept meanwhile
    assert claimed is not None and claimed.id == queued.id
    assert store.get_sweep("race").status is SweepStatus.RUNNING


def _fresh_scheduler(runtime: Runtime) -> SlotScheduler:
    """A scheduler as a restarted service builds it: nothing cached, repos opened on demand."""
    settings = SchedulerSettings(slots=1, tz=TZ, grace_s=0.5)
    return SlotScheduler(runtime.store, settings, runtime.loop_factory(settings),
                         clock=FakeClock(at(12)))


def test_a_vanished_target_pauses_the_sweep_and_leaves_no_row_running(tmp_path: Path) -> None:
    """The loop is built before anything is claimed: a target that cannot be opened leaves the
    baseline queued and the sweep paused (not an experiment `running` forever, not a slot that
    fails on every tick); once the directory is back, resuming runs it."""
    target = make_counting_target(tmp_path / "target", n_knobs=2)
    store = Runtime(tmp_path / "o.db", work_dir=tmp_path / "work").store
    create_sweep(store, GitRepo(target), target, name="gone", proposer="queue")
    moved = target.rename(tmp_path / "moved")
    sched = _fresh_scheduler(Runtime(tmp_path / "o.db", work_dir=tmp_path / "work"))
    assert sched.run_slot(0) == 0
    (base,) = store.list_experiments(store.get_sweep("gone").id)
    assert base.status is ExperimentStatus.QUEUED and base.started_at is None
    assert store.get_sweep("gone").status is SweepStatus.PAUSED
    assert sched.run_slot(0) == 0  # paused: nothing is tried again until a resume
    moved.rename(target)
    store.set_sweep_status("gone", SweepStatus.RUNNING)
    assert sched.run_slot(0) == 1
    assert store.get_experiment(base.id).status is ExperimentStatus.KEPT


def test_an_llm_profile_that_no_longer_loads_pauses_the_sweep(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    target = make_counting_target(tmp_path / "target", n_knobs=2)
    profile = tmp_path / "llm.toml"
    profile.write_text('[profiles.night]\nbackend = "openai"\nbase_url = "http://127.0.0.1:9"\n'
                       'model = "m"\napi_key_env = "NIGHT_KEY"\n')
    monkeypatch.setenv("OVERNIGHT_LLM_CONFIG", str(profile))
    monkeypatch.setenv("NIGHT_KEY", "k" * 20)
    store = Runtime(tmp_path / "o.db", work_dir=tmp_path / "work").store
    create_sweep(store, GitRepo(target), target, name="llm", proposer="llm:night")
    profile.unlink()  # e.g. removed or renamed before a restart
    sched = _fresh_scheduler(Runtime(tmp_path / "o.db", work_dir=tmp_path / "work"))
    assert sched.run_slot(0) == 0
    statuses = [e.status for e in store.list_experiments()]
    assert statuses == [ExperimentStatus.QUEUED]
    assert store.get_sweep("llm").status is SweepStatus.PAUSED


def test_a_target_deleted_mid_sweep_ends_the_claimed_row_and_pauses(setup) -> None:  # type: ignore
    """A repo adapter opened before the directory vanished: the claimed row is finished (never
    left running) and the sweep is paused rather than burning its queue run after run."""
    import shutil

    target, store, repo, sched, clock = setup
    sweep = create_sweep(store, repo, target, name="mid", proposer="queue")
    assert sched.run_slot(0) == 1  # the baseline, with the adapter now cached
    ids = [store.add_experiment(sweep.id, Proposal(f"K{k}", knob_diff(target, k, 1))).id
           for k in range(3)]
    shutil.rmtree(target)
    sched.run_slot(0)
    first = store.get_experiment(ids[0])
    assert first.status is ExperimentStatus.INTERRUPTED, first
    assert str(target) in (first.reason or ""), first.reason
    assert [store.get_experiment(i).status for i in ids[1:]] == [ExperimentStatus.QUEUED] * 2
    assert store.get_sweep("mid").status is SweepStatus.PAUSED
    assert not store.count_experiments(statuses=[ExperimentStatus.RUNNING])


def test_cancel_of_a_claimed_experiment_that_has_not_started(setup) -> None:  # type: ignore
    """Between the claim and the run, a cancel is honoured (it used to answer 409)."""
    from agent.ops.service import Service

    target, store, repo, sched, clock = setup
    sweep = create_sweep(store, repo, target, name="c", proposer="queue")
    assert sched.run_slot(0) == 1  # the baseline
    exp = store.add_experiment(sweep.id, Proposal("K0", knob_diff(target, 0, 1)))
    picked = sched.pick(0)
    assert picked is not None and picked[1].id == exp.id
    assert store.get_experiment(exp.id).status is ExperimentStatus.RUNNING
    service = Service(store, lambda s: repo, stop_running=sched.cancel)  # as the runtime wires it
    _, pending = service.cancel(exp.id)
    assert pending is True
    sched._execute(0, *picked)
    done = store.get_experiment(exp.id)
    assert done.status is ExperimentStatus.CANCELLED
    assert done.reason == "cancelled before it started" and done.log_path is None
    assert sched.busy() == 0


def test_cancel_is_not_claimed_for_a_row_the_scheduler_does_not_run(setup) -> None:  # type: ignore
    target, store, repo, sched, clock = setup
    sweep = create_sweep(store, repo, target, name="q", proposer="queue")
    base = store.list_experiments(sweep.id)[0]
    sched.settings.slots = 0  # no slot job of its own: this test drives the slot
    sched.start()
    try:
        assert sched.cancel(base.id) is False  # queued, not claimed: Services cancels it itself
        assert sched.run_slot(0) == 1
        assert sched.cancel(base.id) is False  # finished
        assert sched.cancel(999) is False  # no such experiment
    finally:
        sched.shutdown()


def test_cancel_while_a_proposer_hands_its_row_over(setup) -> None:  # type: ignore
    """The proposer's experiment is queued while its slot still waits for the pick lock to
    claim it: a cancel then is honoured at once, and the slot does not run it."""
    import threading

    from service_fixtures import wait_for

    from agent.ops.service import Service

    target, store, repo, sched, clock = setup
    asked, go = threading.Event(), threading.Event()
    default = sched.loop_factory

    def factory(sweep, slot):  # type: ignore[no-untyped-def]
        loop = default(sweep, slot)
        inner = loop.proposer.propose

        def propose(ctx):  # type: ignore[no-untyped-def]
            asked.set()
            assert go.wait(120), "never let go"
            return inner(ctx)

        loop.proposer.propose = propose
        return loop

    sched.loop_factory = factory
    sweep = create_sweep(store, repo, target, name="p", proposer="knobs")
    sched.settings.slots = 0  # alive, but the test drives the slot
    sched.start()
    try:
        sched._execute(0, *sched.pick(0))  # type: ignore[misc]  # the baseline only
        picked: list[object] = []
        worker = threading.Thread(target=lambda: picked.append(sched.pick(0)))
        worker.start()
        assert asked.wait(60)
        with sched.claims_paused():  # the slot cannot claim what its proposer queued
            go.set()
            waiting = [ExperimentStatus.QUEUED, ExperimentStatus.RUNNING]
            exp = wait_for(lambda: store.list_experiments(sweep.id, waiting), 60,
                           "the proposal to be queued")[0]
            service = Service(store, lambda s: repo, stop_running=sched.cancel)
            done, pending = service.cancel(exp.id)
            assert pending is False and done.status is ExperimentStatus.CANCELLED
        worker.join(60)
        assert not worker.is_alive()
        assert picked == [None]  # the slot found its proposal gone and ran nothing
        done = store.get_experiment(exp.id)
        assert done.status is ExperimentStatus.CANCELLED and done.run_started_at is None
    finally:
        go.set()
        sched.shutdown()


def test_zero_experiments_still_runs_the_baseline(setup) -> None:  # type: ignore
    target, store, repo, sched, clock = setup
    sweep = create_sweep(store, repo, target, name="zero", proposer="knobs", max_experiments=0)
    assert sched.run_slot(0) == 1
    done = store.get_sweep("zero")
    assert done.baseline_metric is not None and done.status is SweepStatus.DONE
    assert [e.is_baseline for e in store.list_experiments(sweep.id)] == [True]
