"""Benchmarks: the ledger beside the tools a user would pick instead.

Run with ``make bench`` (or ``make bench-quick``); see bench/__main__.py.
"""
