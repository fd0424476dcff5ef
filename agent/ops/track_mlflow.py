"""The MLflow tracker: a sweep as a parent run, each experiment a nested child run, through
MLflow's client (MlflowClient), imported only when a sweep is mirrored to MLflow.

Where: MLflow's own settings, $MLFLOW_TRACKING_URI above all (a server, a sqlite:/// file),
and the experiment named in [track] (else $MLFLOW_EXPERIMENT_NAME, else "overnight"). The
mirror retries itself, so MLflow's client is told not to (MLFLOW_HTTP_REQUEST_MAX_RETRIES=0)
and to give up on a request after the mirror's timeout, unless those variables are set; it
does not print run links, and MLflow's usage telemetry is off (MLFLOW_DISABLE_TELEMETRY) unless
set. A run is found again by its tags (the sweep's key, the experiment's id), so a call tried
again after a failure never makes a second run; a child left half-written (still RUNNING: its
last call, the end, never went through) is deleted and written again.
"""

from __future__ import annotations

import logging
import os
import re
import shutil
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import datetime
from functools import partial
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import urlsplit, urlunsplit

from agent.ops.track_record import TAG, ExperimentRecord, SweepRecord, TrackerError

logger = logging.getLogger(__name__)
T = TypeVar("T")
ROLE = f"{TAG}role"
PARENT = "mlflow.parentRunId"
# What MLflow answers for a request it will refuse again: not worth a retry.
# A transport's failure inside MLflow's long message: its cause in a few words.
TRANSPORT = re.compile(r"\[Errno -?\d+\][^'\")\]]*|Read timed out|timed out|"
                       r"Name or service not known|Connection reset by peer")
REFUSALS = {"INVALID_PARAMETER_VALUE", "BAD_REQUEST", "PERMISSION_DENIED", "UNAUTHENTICATED",
            "RESOURCE_DOES_NOT_EXIST", "INVALID_STATE", "FEATURE_DISABLED"}


def where(uri: str) -> str:
    """A tracking URI as it may be shown: no user, password, query or fragment."""
    parts = urlsplit(uri)
    if parts.scheme in ("http", "https"):
        host = parts.hostname or "?"
        port = f":{parts.port}" if parts.port else ""
        return urlunsplit((parts.scheme, f"{host}{port}", parts.path.rstrip("/"), "", ""))
    return uri


def _ms(when: datetime | None) -> int | None:
    return None if when is None else int(when.timestamp() * 1000)


class MlflowTracker:
    def __init__(self, experiment: str | None = None, timeout_s: float = 10.0) -> None:
        os.environ.setdefault("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
        os.environ.setdefault("MLFLOW_HTTP_REQUEST_TIMEOUT", str(max(1, round(timeout_s))))
        os.environ.setdefault("MLFLOW_SUPPRESS_PRINTING_URL_TO_STDOUT", "true")
        os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")  # before its first import
        try:
            import mlflow
            from mlflow import MlflowClient
        except ImportError:
            raise TrackerError("tracking to MLflow needs MLflow: pip install "
                               "'overnight[mlflow]'", retry=False) from None
        self.uri = str(mlflow.get_tracking_uri())
        self.experiment = experiment or os.environ.get("MLFLOW_EXPERIMENT_NAME") or "overnight"
        self.client = MlflowClient(self.uri)
        self.destination = f"mlflow {where(self.uri)} experiment {self.experiment}"
        self._experiment_id: str | None = None

    # --- the Tracker port -----------------------------------------------------------------
    def check(self) -> None:
        self._do(lambda: self.client.search_experiments(max_results=1))

    def open_sweep(self, rec: SweepRecord) -> str:
        found = self._find(f"tags.`{TAG}sweep_key` = '{rec.key}' and tags.`{ROLE}` = 'sweep'")
        if found is not None:
            if found.info.status != "RUNNING":
                self._do(lambda: self.client.update_run(found.info.run_id, status="RUNNING"))
            return str(found.info.run_id)
        run = self._do(lambda: self.client.create_run(
            self._experiment(), start_time=_ms(rec.started_at), run_name=rec.name,
            tags={**rec.tags, ROLE: "sweep"}))
        run_id = str(run.info.run_id)
        self._batch(run_id, params=rec.params)
        return run_id

    def log_experiment(self, parent: str, rec: ExperimentRecord) -> str:
        key = rec.tags[f"{TAG}sweep_key"]
        found = self._find(f"tags.`{TAG}sweep_key` = '{key}' and "
                           f"tags.`{TAG}experiment` = '{rec.experiment_id}'")
        if found is not None:
            if found.info.status != "RUNNING":  # ended: its last call went through
                return str(found.info.run_id)
            self._do(lambda: self.client.delete_run(found.info.run_id))
        run = self._do(lambda: self.client.create_run(
            self._experiment(), start_time=_ms(rec.started_at), run_name=rec.name,
            tags={**rec.tags, ROLE: "experiment", PARENT: parent}))
        run_id = str(run.info.run_id)
        self._batch(run_id, params=rec.params, metrics=[
            *((p.key, p.value, p.step, _ms(p.at)) for p in rec.points),
            *((k, v, 0, None) for k, v in rec.verdict.items())])
        with tempfile.TemporaryDirectory() as folder:  # one upload call for the diff and logs
            (Path(folder) / "change.diff").write_text(rec.diff, encoding="utf-8")
            if rec.logs:
                (Path(folder) / "logs").mkdir()
            for log in rec.logs:
                shutil.copyfile(log, Path(folder) / "logs" / log.name)
            self._do(partial(self.client.log_artifacts, run_id, folder))
        self._do(lambda: self.client.set_terminated(run_id, rec.end,
                                                    end_time=_ms(rec.finished_at)))
        return run_id

    def update_verdict(self, parent: str, remote_id: str, experiment_id: int,
                       numbers: dict[str, float]) -> None:
        self._batch(remote_id, metrics=[(k, v, 0, None) for k, v in numbers.items()])

    def close_sweep(self, parent: str, rec: SweepRecord) -> None:
        self._batch(parent, tags=rec.tags,
                    metrics=[(k, v, 0, None) for k, v in rec.summary.items()])
        end = "FINISHED" if rec.tags.get(f"{TAG}status") == "done" else "KILLED"
        self._do(lambda: self.client.set_terminated(parent, end))

    def close(self) -> None:
        """Nothing stays open between calls."""

    # --- helpers --------------------------------------------------------------------------
    def _experiment(self) -> str:
        if self._experiment_id is None:
            found = self._do(lambda: self.client.get_experiment_by_name(self.experiment))
            if found is None:
                try:
                    self._experiment_id = str(self.client.create_experiment(self.experiment))
                except Exception:  # noqa: BLE001 - made meanwhile by another process?
                    found = self._do(lambda: self.client.get_experiment_by_name(
                        self.experiment))
                    if found is None:
                        raise
            if found is not None:
                self._experiment_id = str(found.experiment_id)
        assert self._experiment_id is not None
        return self._experiment_id

    def _find(self, where_tags: str) -> Any:
        runs = self._do(lambda: self.client.search_runs(
            [self._experiment()], filter_string=where_tags, max_results=1))
        return runs[0] if runs else None

    def _batch(self, run_id: str, *, params: dict[str, str] | None = None,
               tags: dict[str, str] | None = None,
               metrics: list[tuple[str, float, int, int | None]] | None = None) -> None:
        from mlflow.entities import Metric, Param, RunTag

        now = int(time.time() * 1000)
        ms = [Metric(k, v, at or now, step) for k, v, step, at in metrics or []]
        ps = [Param(k, v) for k, v in (params or {}).items()]
        ts = [RunTag(k, v) for k, v in (tags or {}).items()]
        for i in range(0, max(len(ms), len(ps), len(ts), 1), 100):  # MLflow's batch limits
            self._do(partial(self.client.log_batch, run_id, metrics=ms[i:i + 100],
                             params=ps[i:i + 100], tags=ts[i:i + 100]))

    def _do(self, fn: Callable[[], T]) -> T:
        with self._errors():
            return fn()

    @contextmanager
    def _errors(self) -> Iterator[None]:
        """MLflow's and the transport's errors as one TrackerError, the URI redacted."""
        from mlflow.exceptions import MlflowException

        try:
            yield
        except MlflowException as exc:
            code = str(getattr(exc, "error_code", ""))
            raise TrackerError(self._scrub(f"MLflow: {exc.message}"),
                               retry=code not in REFUSALS) from None
        except TrackerError:
            raise
        except Exception as exc:  # noqa: BLE001 - the transport's (requests, OSError)
            raise TrackerError(self._scrub(f"MLflow: {type(exc).__name__}: {exc}")) from None

    def _scrub(self, text: str) -> str:
        """One short line: a transport failure's own words ("[Errno 111] Connection refused",
        "Read timed out"), else the message's first line; the URI without its secrets."""
        cause = TRANSPORT.search(text)
        if cause is not None:
            return f"MLflow at {where(self.uri)}: {cause.group(0).strip()}"
        line = text.strip().splitlines()[0] if text.strip() else text
        return line.replace(self.uri, where(self.uri))[:300]
