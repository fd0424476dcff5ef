"""Sweep routes: create, list, read, pause/resume/stop, best, results.tsv, insights."""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Annotated

from fastapi import APIRouter, Query, status
from fastapi.responses import PlainTextResponse

from agent.analysis.insights import render
from agent.analysis.insights_fold import digest
from agent.analysis.projection import LLMSpend
from agent.core.config import load_config
from agent.core.domain import ExperimentStatus, Sweep, SweepStatus
from agent.core.errors import ConfigError, ConflictError
from agent.ops.sweeps import check_sweep_name, create_sweep
from api.deps import ReadAuth, Services, ServicesDep, WriteAuth
from api.docs import COMMON, READ, WRITE, errors, text_body
from api.schemas import BestPublic, InsightsPublic, KeptChange, Page, SweepCreate, SweepPublic

router = APIRouter(prefix="/sweeps", tags=["sweeps"], responses=COMMON)


def target_dir(raw: str) -> Path:
    """The target folder named by a client; any problem with the path is a ConfigError
    naming the field (a path the OS refuses is the client's mistake, not a server error)."""
    if "\x00" in raw:
        raise ConfigError("target: the path contains a NUL character")
    try:
        path = Path(raw).expanduser()
        if not path.is_dir():
            raise ConfigError(f"target: {raw!r} is not a folder on the server")
        return path.resolve(strict=True)
    except RuntimeError as exc:  # expanduser of ~nosuchuser
        raise ConfigError(f"target: cannot expand {raw!r}: {exc}") from None
    except OSError as exc:  # ENAMETOOLONG, ELOOP, EACCES...
        raise ConfigError(f"target: {raw!r}: {exc.strerror or exc}") from None


def _public(services: Services, sweep: Sweep) -> SweepPublic:
    starts = services.scheduler.scheduled_starts() if services.scheduler else {}
    return SweepPublic.of(sweep, services.reads.status_counts(sweep.id),
                          scheduled_start=starts.get(sweep.name),
                          llm=LLMSpend.of(sweep.llm_spend))


def _all_public(services: Services, sweeps: list[Sweep]) -> list[SweepPublic]:
    """Every sweep with its counts, scheduled start and LLM spend: two reads for the list
    (the spend comes with the sweeps), not two per sweep (a year of nights is hundreds of
    sweeps)."""
    starts = services.scheduler.scheduled_starts() if services.scheduler else {}
    counted = services.reads.status_counts_by_sweep()
    return [SweepPublic.of(s, counted.get(s.id, {}), scheduled_start=starts.get(s.name),
                           llm=LLMSpend.of(s.llm_spend))
            for s in sweeps]


@router.post("", status_code=status.HTTP_201_CREATED, response_model=SweepPublic,
             responses={**WRITE, **errors(409)})
def create(body: SweepCreate, services: ServicesDep, _auth: WriteAuth) -> SweepPublic:
    """Create a sweep on branch `overnight/<name>` and queue its baseline."""
    check_sweep_name(body.name)
    services.runtime.make_proposer(body.proposer, 0)  # unknown: refused before anything
    target = target_dir(body.target)
    config = load_config(target).with_budget(body.run_budget(), body.timeout_s)
    sched = services.scheduler
    if body.start_at is not None and sched is None:
        raise ConflictError("start_at needs the scheduler, which is not running in this server")
    claims_paused = sched.claims_paused() if sched else contextlib.nullcontext()
    with claims_paused:  # a sweep created paused must not have its baseline picked in between
        sweep = create_sweep(
            services.store, services.runtime.repo_at(target), target, name=body.name,
            proposer=body.proposer, config=config, max_experiments=body.max_experiments,
            deadline=body.deadline,
            window=body.window.model_dump() if body.window else None,
            allow_dirty=body.allow_dirty,
        )
        if body.paused or body.start_at is not None:
            sweep = services.store.set_sweep_status(sweep.name, SweepStatus.PAUSED)
    if body.start_at is not None and sched is not None:
        sched.schedule_start(sweep.name, body.start_at)
    return _public(services, sweep)


@router.get("", response_model=Page[SweepPublic], responses=READ)
def list_sweeps(services: ServicesDep, _auth: ReadAuth) -> Page[SweepPublic]:
    with services.store.reading():  # the sweeps and their counts: one transaction
        sweeps = services.store.list_sweeps()
        data = _all_public(services, sweeps)
    return Page(data=data, count=len(sweeps), next_cursor=None)


@router.get("/{name}", response_model=SweepPublic, responses={**READ, **errors(404)})
def get_sweep(name: str, services: ServicesDep, _auth: ReadAuth) -> SweepPublic:
    with services.store.reading():  # the sweep and its counts: one transaction
        return _public(services, services.store.get_sweep(name))


def _set_status(services: Services, name: str, new: SweepStatus) -> SweepPublic:
    return _public(services, services.service.set_status(name, new))


@router.post("/{name}/pause", response_model=SweepPublic,
             responses={**errors(401, 404, 409)})
def pause(name: str, services: ServicesDep, _auth: WriteAuth) -> SweepPublic:
    """Nothing new starts; a run in flight finishes."""
    return _set_status(services, name, SweepStatus.PAUSED)


@router.post("/{name}/resume", response_model=SweepPublic,
             responses={**errors(401, 404, 409)})
def resume(name: str, services: ServicesDep, _auth: WriteAuth) -> SweepPublic:
    return _set_status(services, name, SweepStatus.RUNNING)


@router.post("/{name}/stop", response_model=SweepPublic,
             responses={**errors(401, 404, 409)})
def stop(name: str, services: ServicesDep, _auth: WriteAuth) -> SweepPublic:
    """Final: nothing new starts (a run in flight finishes); queued experiments stay queued."""
    return _set_status(services, name, SweepStatus.STOPPED)


@router.get("/{name}/best", response_model=BestPublic, responses={**READ, **errors(404)})
def best(name: str, services: ServicesDep, _auth: ReadAuth) -> BestPublic:
    """The best metric and commit, each editable file at that commit, the kept diffs."""
    sweep = services.store.get_sweep(name)
    _, files = services.service.best_files(sweep, sweep.best_commit)
    kept = [KeptChange(id=e.id, description=e.description, metric=e.metric,
                       n=e.record.n if e.record is not None else 0, delta=e.delta,
                       delta_se=e.record.se if e.record is not None else None,
                       commit=e.commit, diff=e.diff)
            for e in services.store.list_experiments(sweep.id, [ExperimentStatus.KEPT])
            if not e.is_baseline]
    return BestPublic(sweep=sweep.name, metric_name=sweep.metric, metric=sweep.best_metric,
                      baseline_metric=sweep.baseline_metric, commit=sweep.best_commit,
                      experiment_id=sweep.best_experiment_id, files=files, kept=kept)


@router.get("/{name}/results.tsv", response_class=PlainTextResponse,
            responses={**text_body("text/tab-separated-values", "autoresearch's results.tsv"),
                       **READ, **errors(404)})
def results(name: str, services: ServicesDep, _auth: ReadAuth) -> PlainTextResponse:
    """autoresearch's results.tsv: commit, metric, memory_gb, status, description."""
    text = services.service.results_tsv(services.store.get_sweep(name))
    return PlainTextResponse(text, media_type="text/tab-separated-values; charset=utf-8")


@router.get("/{name}/insights", response_model=InsightsPublic,
            responses={**READ, **errors(404)})
def insights(name: str, services: ServicesDep, _auth: ReadAuth,
             max_chars: Annotated[int, Query(ge=500, le=50_000)] = 6000) -> InsightsPublic:
    """What the sweep has learned: effects per knob, near-misses, crash lessons, plateau,
    categories (the digest the LLM proposer and the MCP tool get_insights see)."""
    sweep = services.store.get_sweep(name)
    found = digest(sweep, services.store.list_experiments(sweep.id))
    return InsightsPublic(sweep=sweep.name, text=render(found, max_chars), data=found.to_dict())
