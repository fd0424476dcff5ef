"""Planted: imports a module that does not exist."""

import overnight_no_such_module  # noqa: F401

print("unreachable")
