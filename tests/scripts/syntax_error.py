"""Planted: a script that does not even compile."""

def broken(:
    return 1
