"""`python -m bench.profile` as a smoke test: it runs end to end and splits a
call's time into parts that add up. A module of its own, so that the test
run's workers run it beside the quick benchmark (tests/test_bench_smoke.py).
"""

from __future__ import annotations

import re

import pytest

from tests.bench_runs import run_bench

pytestmark = [pytest.mark.postgres, pytest.mark.bench, pytest.mark.slow, pytest.mark.timeout(900)]


def test_the_profile_splits_a_call_beside_the_minimal_peer_and_through_the_api() -> None:
    result = run_bench(["bench.profile", "--calls", "20"], timeout=600)
    assert "one call sends 3 statements" in result.stdout
    for who in ("ledgerdash", "the minimal peer"):
        pattern = rf"  {who}: ([\d.]+) ms a call, ([\d.]+) ms in its statements, ([\d.]+) ms outside"
        split = re.search(pattern, result.stdout)
        assert split, result.stdout[-3000:]
        total, inside, outside = (float(x) for x in split.groups())
        assert 0 < inside < total
        assert outside > 0
    assert len(re.findall(r"round \d: ledgerdash p50 [\d.]+ ms, the minimal peer [\d.]+ ms", result.stdout)) == 3
    assert len(re.findall(r"round \d: the API p50 [\d.]+ ms, in process [\d.]+ ms", result.stdout)) == 3
    pattern = (
        r"the API: ([\d.]+) ms a call, ([\d.]+) ms in its statements, ([\d.]+) ms in the connection's health"
        r" checks \((\d+) SELECT 1 in (\d+) requests\), (-?[\d.]+) ms in Django"
    )
    split = re.search(pattern, result.stdout)
    assert split, result.stdout[-3000:]
    total, statements, checks, sent, requests, rest = (float(x) for x in split.groups())
    assert 0 < statements < total
    assert 0 < checks < total
    # Three requests a call on a kept connection, each checked (CONN_HEALTH_CHECKS) before its first statement.
    assert requests > 0
    assert 0 < sent <= requests  # a connection older than CONN_MAX_AGE is replaced instead of checked
    assert rest > 0
