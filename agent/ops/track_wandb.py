"""The W&B tracker: a sweep as a run of job type `sweep`, each experiment a run of job type
`experiment` in the sweep's group, through the wandb package, imported only when a sweep is
mirrored to W&B.

Where: wandb's own settings, $WANDB_MODE (`offline` writes runs under $WANDB_DIR for a later
`wandb sync`), $WANDB_ENTITY, $WANDB_API_KEY, and the project named in [track] (else
$WANDB_PROJECT, else "overnight"). W&B has no nested runs, so the sweep's runs share its group;
params and overnight's tags go in each run's config, status, proposer and crash class also in
its tags, each run's metric is logged against its seed (`define_metric` with step `seed`), the
verdict is the run's summary, the diff and the logs are files of the run. Run ids come from the
sweep's key and the experiment's id, so a call tried again resumes the same run. The service's
console, git and machine are never captured (console off, no code, no system metrics).
"""

from __future__ import annotations

import logging
import os
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from agent.ops.track_record import TAG, ExperimentRecord, SweepRecord, TrackerError

logger = logging.getLogger(__name__)


class WandbTracker:
    def __init__(self, project: str | None = None, timeout_s: float = 10.0) -> None:
        try:
            import wandb  # noqa: F401
        except ImportError:
            raise TrackerError("tracking to W&B needs wandb: pip install 'overnight[wandb]'",
                               retry=False) from None
        self.project = project or os.environ.get("WANDB_PROJECT") or "overnight"
        self.entity = os.environ.get("WANDB_ENTITY") or None
        self.mode = os.environ.get("WANDB_MODE", "online").strip().lower() or "online"
        self.timeout_s = max(timeout_s, 30.0)  # an init starts wandb's service
        place = f" in {os.environ.get('WANDB_DIR') or os.getcwd()}" \
            if self.mode in ("offline", "dryrun") else ""
        owner = f"{self.entity}/" if self.entity else ""
        self.destination = f"wandb {self.mode} {owner}{self.project}{place}"
        self.open: dict[str, Any] = {}  # parent runs kept open through the night

    # --- the Tracker port -----------------------------------------------------------------
    def check(self) -> None:
        if self.mode in ("offline", "dryrun", "disabled"):
            folder = Path(os.environ.get("WANDB_DIR") or os.getcwd())
            if not os.access(folder, os.W_OK):
                raise TrackerError(f"W&B offline: cannot write to {folder}", retry=False)
            return
        import wandb

        with self._errors():
            wandb.Api(timeout=int(self.timeout_s)).viewer  # noqa: B018 - a login that answers

    def open_sweep(self, rec: SweepRecord) -> str:
        if rec.key not in self.open:
            self.open[rec.key] = self._init(
                rec.key, name=rec.name, group=rec.name, job_type="sweep",
                config={**rec.params, **rec.tags}, tags=["sweep"],
                notes=rec.tags.get(f"{TAG}link"))
        return rec.key

    def log_experiment(self, parent: str, rec: ExperimentRecord) -> str:
        run_id = f"{parent}-{rec.experiment_id}"
        labels = [rec.tags[f"{TAG}status"], rec.tags[f"{TAG}proposer"]]
        if f"{TAG}crash_class" in rec.tags:
            labels.append(f"crash:{rec.tags[f'{TAG}crash_class']}")
        run = self._init(run_id, name=rec.name, group=rec.tags[f"{TAG}sweep"],
                         job_type="experiment", config={**rec.params, **rec.tags},
                         tags=[t[:64] for t in labels], notes=rec.tags.get(f"{TAG}link"))
        with self._errors():
            for key in {p.key for p in rec.points}:
                run.define_metric(key, step_metric="seed")
            for p in rec.points:
                run.log({"seed": p.step, p.key: p.value})
            run.summary.update(rec.verdict)
            files = Path(run.dir)
            (files / "change.diff").write_text(rec.diff, encoding="utf-8")
            for log in rec.logs:
                (files / "logs").mkdir(exist_ok=True)
                shutil.copyfile(log, files / "logs" / log.name)
            run.finish(exit_code=0 if rec.end == "FINISHED" else 1)
        return run_id

    def update_verdict(self, parent: str, remote_id: str, experiment_id: int,
                       numbers: dict[str, float]) -> None:
        run = self._init(remote_id)
        with self._errors():
            run.summary.update(numbers)
            run.finish()

    def close_sweep(self, parent: str, rec: SweepRecord) -> None:
        run = self.open.pop(parent, None) or self._init(parent)
        with self._errors():
            run.config.update({f"{TAG}status": rec.tags[f"{TAG}status"]},
                              allow_val_change=True)
            run.summary.update({**rec.summary, f"{TAG}statement": rec.tags[f"{TAG}statement"]})
            run.finish()

    def close(self) -> None:
        for run in self.open.values():
            try:
                run.finish()
            except Exception:  # noqa: BLE001 - closing: the offline files are there already
                logger.warning("W&B: finishing the sweep's run failed", exc_info=True)
        self.open.clear()

    # --- helpers --------------------------------------------------------------------------
    def _init(self, run_id: str, **fields: Any) -> Any:
        import wandb

        settings = wandb.Settings(console="off", silent=True, save_code=False,
                                  disable_code=True, disable_git=True, x_disable_stats=True,
                                  x_disable_meta=True, x_disable_machine_info=True,
                                  init_timeout=self.timeout_s)
        with self._errors():
            return wandb.init(project=self.project, entity=self.entity, id=run_id,
                              resume="allow", reinit="create_new", settings=settings,
                              **fields)

    @contextmanager
    def _errors(self) -> Iterator[None]:
        """wandb's errors as one TrackerError: a usage error is not tried again."""
        import wandb.errors

        try:
            yield
        except TrackerError:
            raise
        except wandb.errors.UsageError as exc:
            raise TrackerError(f"W&B: {exc}"[:300], retry=False) from None
        except Exception as exc:  # noqa: BLE001 - the service, the network, the disk
            raise TrackerError(f"W&B: {type(exc).__name__}: {exc}"[:300]) from None
