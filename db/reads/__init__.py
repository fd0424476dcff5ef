"""The dashboard's and the CLI's reads: page-shaped queries beside the Store, not on its port.

The engine and the use cases talk to the database through the Store port (agent.core.ports);
what only a page or a command prints — neighbours and retries of an experiment, a sweep's plot
marks and version, counts per sweep, loss curves, the trackers' progress — is read here.
`Reads(store)` runs inside the store's sessions, so `with store.reading():` covers its reads
too.
"""

from __future__ import annotations

from db.reads.experiments import ExperimentViews
from db.reads.sweeps import SweepViews
from db.reads.track import TrackViews


class Reads(ExperimentViews, SweepViews, TrackViews):
    """Every read model over one SqlStore."""


__all__ = ["Reads"]
