"""Proposers: where the next one-change experiment comes from."""
