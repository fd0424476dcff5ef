"""Where a run executes: a local subprocess or a Ray task on a cluster."""
