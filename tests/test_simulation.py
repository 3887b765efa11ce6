"""The deterministic simulation (``manage.py simulate``), run as a user runs
it: its default run holds every invariant and reaches every legal move and
every fault kind, and so do this commit's own seeds; a seed replays the same
history in another process, and over several; the seeds that found holes
stay green; each hole the ledger once had, put back, is found within a
bounded number of seeds; and a run reports every failing seed, each with a
replay line that runs the very history that failed.

Each run is a process of its own with databases of its own (temporary
SQLite files, or ``ledgerdash_sim_<pid>_…`` on the PostgreSQL server the
suite uses), so nothing here touches the test database.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
from collections import Counter
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import pytest
from django.conf import settings
from django.core.management import CommandError, call_command

from ledgerdash.ledger.simulation import runner
from ledgerdash.ledger.simulation.database import TEMPLATES_ENV, code_digest
from ledgerdash.ledger.simulation.invariants import Violation
from tests import sim_seeds
from tests.live import PYTHON, ROOT

#: The runs here make SQLite databases of their own: the PostgreSQL pass runs only its own test.
ON_SQLITE_PASS = pytest.mark.skipif(
    "postgresql" in str(settings.DATABASES["default"]["ENGINE"]),
    reason="runs in the SQLite pass (it makes databases of its own, whatever the suite's)",
)

#: Seeds that once broke an invariant, and the hole each showed (the simulation has grown since:
#: the same seed runs another history now, and must hold too).
FOUND: dict[str, list[str]] = {
    "a retry of a reworded call approved on its never-sent parent": [
        "--seed=12",
        "--steps=153",
        "--faults=crash,lost_answer,pause,policy,refuse,repeat,reword",
    ],
    "a late receipt refused, a later refusal taken for an earlier dispatch's": ["--seed=27"],
    "a late report sent twice recorded twice": ["--seed=39"],
    "a late refusal settling an attempt its dispatcher's SDK sent again": ["--seed=58"],
    "a 'not found' after the key's retention taken for proof": ["--seed=126"],
    "a repeated 'unknown' recorded again after recovery looked": ["--seed=144"],
    "a proof over a dispatcher's late send": ["--seed=186"],
}
#: The same, found on PostgreSQL (where the archive job runs): the PostgreSQL run takes them in.
FOUND_ON_POSTGRESQL: dict[str, int] = {
    "a refusal of its SDK's resend taken for the fate of a request its dispatcher could not tell of": 200710,
    "a report sent again after the event that applied it was archived, recorded again": 200759,
}

#: Each hole put back (tests/sim_holes.py), the invariants that may catch it, and the first seed
#: that finds it: a run from seed 1 that stops at the first failure (docs/protocol.md, "It can
#: fail"). The test runs that seed alone; when the simulation's generators change, the table is
#: measured again with ``python -m tests.sim_holes HOLE --seeds 150 --no-shrink --stop-on-failure``.
HOLES: dict[str, tuple[set[str], int]] = {
    "landing": ({"I1", "I4"}, 66),
    "late_report": ({"I12"}, 13),
    "approval_condition": ({"I11"}, 1),
    "gateway_timeout": ({"I1", "I4"}, 8),
    "chain_standing": ({"I1", "I4"}, 4),
    "past_retention": ({"I1", "I4"}, 72),
    "lookup_lag": ({"I1", "I4"}, 10),
    "send_gate": ({"I1"}, 47),
    "approval_binding": ({"I11"}, 9),
    "provider_id": ({"I5"}, 64),
    "clock": ({"I1", "I4"}, 5),
}
#: No hole may need more seeds than this to be found.
HOLE_FOUND_WITHIN = 150


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}
    env.pop("DATABASE_URL", None)  # the simulation makes databases of its own
    env.update({"DJANGO_SETTINGS_MODULE": "tests.settings", "PYTHONPATH": str(ROOT)})
    # The runs here migrate the same code: each copies the migrated database the first one kept.
    env.setdefault(TEMPLATES_ENV, str(ROOT / "var" / "sim-templates"))
    return env


def simulate(
    tmp_path: Path, *args: str, hole: str = "", env: dict[str, str] | None = None
) -> tuple[int, dict[str, Any], str]:
    """Run the simulation (with ``hole`` put back, when named); its exit code, JSON report and output."""
    out = tmp_path / f"simulation-{len(list(tmp_path.iterdir()))}.json"
    command = [PYTHON, "-m", "tests.sim_holes", hole] if hole else [PYTHON, "manage.py", "simulate"]
    result = subprocess.run(
        [*command, *args, "--json-out", str(out)],
        cwd=ROOT,
        env=env or _env(),
        capture_output=True,
        text=True,
        timeout=2300,
        check=False,
    )
    report = json.loads(out.read_text()) if out.exists() else {}
    return result.returncode, report, result.stdout + result.stderr


def _postgres_url() -> str:
    """The server the suite was given, as its superuser: the simulation makes databases of its own,
    which the role the app's tests connect as may not."""
    from tests.database_roles import admin_url

    return admin_url("postgres")


@pytest.mark.slow
@pytest.mark.timeout(1200)
@ON_SQLITE_PASS
def test_the_default_runs_covering_and_hole_seeds_hold_every_invariant_and_reach_every_move_and_fault(
    tmp_path: Path,
) -> None:
    """The few of the default run's seeds that reach every move and fault kind (``make simulate``
    runs all 200), which the default run then reaches as well, since each seed's history is its own;
    and the seeds at which a hole put back is found, which must hold with the hole mended."""
    seeds = sorted(set(sim_seeds.COVERING) | {seed for _, seed in HOLES.values()})
    code, report, output = simulate(tmp_path, f"--seed-list={','.join(map(str, seeds))}", "--reach-all", "--jobs=2")
    measure = "measure the covering seeds again: python manage.py simulate --jobs 2 (tests/sim_seeds.py)"
    assert code == 0, f"{measure}\n{output[-4000:]}"
    assert report["failures"] == []
    assert report["seeds"] == seeds
    assert report["unreached_moves"] == [], measure
    assert report["faults_not_injected"] == [], measure
    assert max(seeds) <= 200, "the covering and hole seeds come from the default run's"


@ON_SQLITE_PASS
def test_a_run_told_to_reach_everything_fails_when_it_does_not(tmp_path: Path) -> None:
    code, report, output = simulate(tmp_path, "--seed-list=3,5", "--faults=crash", "--steps=40", "--reach-all")
    assert code == 1, output[-3000:]
    assert report["failures"] == []
    assert report["seeds"] == [3, 5]
    assert "pause" in report["faults_not_injected"]
    assert "the run did not reach everything it must (--reach-all)" in output


@pytest.mark.parametrize(
    ("given", "said"),
    [
        ("7,x", "--seed-list takes seeds separated by commas, e.g. 7,23,45 (not '7,x')"),
        (",", "--seed-list names no seed"),
        ("7,7", "--seed-list names a seed twice"),
    ],
)
def test_a_seed_list_it_cannot_read_is_refused_with_what_it_takes(given: str, said: str) -> None:
    # Refused before the run touches anything: no database, no signal handler, no log level.
    with pytest.raises(CommandError) as refused:
        call_command("simulate", f"--seed-list={given}")
    assert str(refused.value) == said


def test_the_covering_seeds_are_the_fewest_the_greedy_choice_finds() -> None:
    def outcome(seed: int, moves: list[tuple[str, str, str]], faults: list[str]) -> runner.Outcome:
        return runner.Outcome(seed, 10, (), [], [], "", 0.0, 10, moves=Counter(moves), injected=Counter(faults))

    legal = runner.legal_moves()
    a, b, c = legal[:3]
    outcomes = [
        outcome(1, [a], ["crash"]),
        outcome(2, [a, b], []),
        outcome(3, [b], ["crash"]),
        outcome(4, [c], ["pause"]),
        outcome(5, [("NOT", "A", "move")], ["pause"]),
    ]
    # 2 adds the most, then 4 (c and pause), then 1 and 3 tie on crash (the lower wins); 5's move is no legal one.
    assert runner.covering(outcomes) == [1, 2, 4]
    assert runner.covering([]) == []


@pytest.mark.slow
@pytest.mark.longest
@pytest.mark.timeout(1800)
@pytest.mark.postgres
def test_a_run_on_postgresql_holds_every_invariant(tmp_path: Path) -> None:
    """Fifteen seeds, and those that once found a hole on PostgreSQL."""
    seeds = [*range(1, 16), *FOUND_ON_POSTGRESQL.values()]
    code, report, output = simulate(
        tmp_path, f"--seed-list={','.join(map(str, seeds))}", f"--database={_postgres_url()}"
    )
    assert code == 0, output[-4000:]
    assert report["seeds"] == seeds
    assert report["failures"] == []
    assert report["faults_not_injected"] == []  # the archive job's included
    assert report["faults"]["archive"] > 0


def _commit_block(tmp_path: Path, count: int, *args: str) -> None:
    """This commit's own seeds (tests/sim_seeds.py): ``count`` of them, all holding; a failure says how to
    replay each failing seed."""
    seeds = sim_seeds.for_this_commit()
    print(seeds.line())
    code, report, output = simulate(tmp_path, f"--seeds={count}", f"--first-seed={seeds.first}", *args)
    replays = "\n".join(f"  {failed['replay']}" for failed in report.get("failures", []))
    assert code == 0, (
        f"{seeds.line()}\nseeds {report.get('failed_seeds')} failed; replay each with:\n{replays}\n{output[-4000:]}"
    )
    # A block that ran fewer seeds (or none) does not pass.
    assert report["seeds"] == list(range(seeds.first, seeds.last(count) + 1)), output[-3000:]


@pytest.mark.slow
@pytest.mark.longest
@pytest.mark.timeout(2400)
@ON_SQLITE_PASS
def test_this_commits_own_seeds_hold_every_invariant(tmp_path: Path) -> None:
    _commit_block(tmp_path, sim_seeds.ON_SQLITE, "--jobs=2")


@pytest.mark.slow
@pytest.mark.timeout(1800)
@pytest.mark.postgres
def test_this_commits_own_seeds_hold_every_invariant_on_postgresql(tmp_path: Path) -> None:
    _commit_block(tmp_path, sim_seeds.ON_POSTGRESQL, f"--database={_postgres_url()}")


def _git(repo: Path, *args: str) -> str:
    command = ["git", "-c", "user.name=Sim", "-c", "user.email=sim@example.com", *args]
    return subprocess.run(command, cwd=repo, check=True, capture_output=True, text=True).stdout.strip()


@ON_SQLITE_PASS
def test_each_commit_gets_its_own_seeds_far_from_the_fixed_ones(tmp_path: Path) -> None:
    _git(tmp_path, "init", "-q")
    found = []
    for message in ("one", "two"):
        _git(tmp_path, "commit", "-q", "--allow-empty", "-m", message)
        seeds = sim_seeds.for_this_commit(tmp_path)
        assert sim_seeds.for_this_commit(tmp_path) == seeds
        assert 1_000_000 <= seeds.first < 901_000_000
        assert _git(tmp_path, "rev-parse", "--short=12", "HEAD") in seeds.line()
        found.append(seeds.first)
    assert found[0] != found[1]


@ON_SQLITE_PASS
def test_outside_a_git_checkout_the_commit_seeds_start_at_a_fixed_seed_and_say_so(tmp_path: Path) -> None:
    seeds = sim_seeds.for_this_commit(tmp_path)
    assert seeds.first == sim_seeds.FALLBACK
    assert f"not a git checkout: the fixed first seed {sim_seeds.FALLBACK}" in seeds.line()


@ON_SQLITE_PASS
def test_make_test_prints_this_commits_seeds_at_its_start() -> None:
    script = (ROOT / "scripts" / "test.sh").read_text()
    assert script.index("python -m tests.sim_seeds") < script.index("$BIN/pytest")
    said = subprocess.run(
        [PYTHON, "-m", "tests.sim_seeds"], cwd=ROOT, env=_env(), capture_output=True, text=True, check=True
    ).stdout
    assert sim_seeds.for_this_commit().line() in said


@pytest.mark.slow
@ON_SQLITE_PASS
def test_a_seed_replays_the_same_history_in_another_process(tmp_path: Path) -> None:
    """In another process, with other hash seeds, from the migrated database a process before kept or
    from one it migrated itself."""
    kept = tmp_path / "kept"
    code, batch, output = simulate(tmp_path, "--seeds=3", "--first-seed=41", env={**_env(), TEMPLATES_ENV: str(kept)})
    assert code == 0, output[-3000:]
    assert [path.name for path in kept.glob("migrated-*")] == [f"migrated-{code_digest()}.sqlite3"]
    digests = []
    for hash_seed, templates in (("1", str(kept)), ("2", "")):
        env = {**_env(), "PYTHONHASHSEED": hash_seed, TEMPLATES_ENV: templates}
        code, alone, output = simulate(tmp_path, "--seed=42", env=env)
        assert code == 0, output[-3000:]
        digests.append(alone["digests"]["42"])
    assert digests == [batch["digests"]["42"]] * 2


@pytest.mark.slow
@ON_SQLITE_PASS
@pytest.mark.parametrize("found", list(FOUND), ids=list(range(len(FOUND))))
def test_a_seed_that_found_a_hole_holds_now(tmp_path: Path, found: str) -> None:
    code, report, output = simulate(tmp_path, *FOUND[found])
    assert code == 0, f"{found}: {output[-4000:]}"
    assert report["failures"] == []


@pytest.mark.slow
@ON_SQLITE_PASS
@pytest.mark.parametrize("hole", list(HOLES))
def test_the_simulation_finds_a_hole_put_back(tmp_path: Path, hole: str) -> None:
    invariants, seed = HOLES[hole]
    assert 1 <= seed <= HOLE_FOUND_WITHIN
    code, report, output = simulate(tmp_path, f"--first-seed={seed}", "--seeds=1", "--no-shrink", hole=hole)
    remeasure = (
        f"measure again: python -m tests.sim_holes {hole} --seeds {HOLE_FOUND_WITHIN} --no-shrink --stop-on-failure"
    )
    assert code == 1, f"seed {seed} no longer finds {hole}; {remeasure}\n{output[-3000:]}"
    [failed] = report["failures"]
    assert {v["invariant"] for v in failed["violations"]} & invariants, output[-3000:]


@ON_SQLITE_PASS
def test_the_protocol_page_lists_each_hole_at_the_seed_the_test_runs() -> None:
    page = (ROOT / "docs" / "protocol.md").read_text()
    rows = re.findall(r"^\|.*\(`(\w+)`\) \| seed (\d+) \| (I\d+) \|$", page, flags=re.MULTILINE)
    assert {hole: int(seed) for hole, seed, _invariant in rows} == {hole: seed for hole, (_, seed) in HOLES.items()}
    for hole, _seed, invariant in rows:
        assert invariant in HOLES[hole][0], f"{hole}: the page names {invariant}"
    assert f"found each within {HOLE_FOUND_WITHIN} seeds" in page


def _printed_replay(output: str) -> list[list[str]]:
    """Every ``replay:`` line the run printed, as arguments to ``manage.py simulate``."""
    prefix = "replay: python manage.py simulate "
    return [line.removeprefix(prefix).split() for line in output.splitlines() if line.startswith(prefix)]


#: A hole put back, and a seed it makes fail with faults on; and one that fails after faults
#: stopped (with --steps short, most of its history is the settling phase).
FAILING = {
    "with_faults_on": ("chain_standing", ["--first-seed=4"], False),
    "after_faults_stopped": ("lookup_lag", ["--first-seed=1", "--steps=40"], True),
}


@pytest.mark.slow
@pytest.mark.timeout(1800)
@ON_SQLITE_PASS
@pytest.mark.parametrize("case", list(FAILING))
def test_a_failing_seeds_printed_replay_runs_the_history_that_failed(tmp_path: Path, case: str) -> None:
    hole, args, after_faults_stopped = FAILING[case]
    code, report, output = simulate(tmp_path, "--seeds=1", *args, hole=hole)
    assert code == 1, output[-3000:]
    [failed] = report["failures"]
    assert failed["after_faults_stopped"] is after_faults_stopped, f"{case} fails elsewhere now: {failed}"
    assert "shortest reproduction found" in output
    assert "its history's last steps" in output
    [printed] = _printed_replay(output)
    steps = int(printed[printed.index("--steps") + 1])
    # More steps with faults on than the failing run had would be another history.
    assert steps <= failed["steps"]
    code, replayed, _output = simulate(tmp_path, *printed, hole=hole)
    assert code == 1
    [again] = replayed["failures"]
    assert failed["violations"][0]["invariant"] in {v["invariant"] for v in again["violations"]}
    assert again["digest"] == failed["reproduction"]["digest"]
    # Without the hole, the same reproduction holds.
    code, _fixed, output = simulate(tmp_path, *printed)
    assert code == 0, output[-3000:]


History = Callable[[int, tuple[str, ...]], runner.Outcome]


def _outcome(
    steps: int, faults: tuple[str, ...], broken: str = "", step: int = 0, *, settling: bool = False, seed: int = 7
) -> runner.Outcome:
    """How a run of ``seed`` ended: ``broken`` at ``step``, or holding."""
    return runner.Outcome(
        seed=seed,
        steps=steps,
        faults=faults,
        violations=[Violation(broken, step, f"seed {seed} broke it")] if broken else [],
        trace=[f"seed {seed}'s step {n}" for n in range(1, (step or steps) + 1)],
        digest=f"{seed}/{steps}/{','.join(faults)}",
        seconds=0.0,
        steps_run=step or steps,
        settling=settling,
    )


def _shrunk(
    monkeypatch: pytest.MonkeyPatch, history: History, steps: int, faults: tuple[str, ...]
) -> tuple[runner.Reproduction, list[tuple[int, tuple[str, ...]]]]:
    """The run ``history(steps, faults)`` shrunk, every run it asks for answered by ``history``; and those runs."""
    runs: list[tuple[int, tuple[str, ...]]] = []

    def run_seed(databases: Any, seed: int, *, steps: int, faults: Iterable[str]) -> runner.Outcome:
        runs.append((steps, tuple(faults)))
        return history(steps, tuple(faults))

    monkeypatch.setattr(runner, "run_seed", run_seed)
    return runner.shrink(None, history(steps, faults)), runs  # type: ignore[arg-type]  # no database: no run


def test_a_failure_after_faults_stopped_is_shrunk_without_more_steps_with_faults(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def history(steps: int, faults: tuple[str, ...]) -> runner.Outcome:
        # it fails once faults stop, 20 steps later, as long as crashes were on
        if "crash" in faults:
            return _outcome(steps, faults, "I2", steps + 20, settling=True)
        return _outcome(steps, faults)

    reproduction, runs = _shrunk(monkeypatch, history, 300, ("crash", "pause"))
    assert (reproduction.steps, reproduction.faults) == (300, ("crash",))
    assert reproduction.digest == history(300, ("crash",)).digest
    assert all(steps == 300 for steps, _faults in runs)


def test_a_shrunk_reproduction_is_one_that_was_run_and_failed(monkeypatch: pytest.MonkeyPatch) -> None:
    fails_at = {("crash", "pause"): 100, ("crash",): 80}

    def history(steps: int, faults: tuple[str, ...]) -> runner.Outcome:
        at = fails_at.get(faults)
        return _outcome(steps, faults, "I4", at) if at is not None and steps >= at else _outcome(steps, faults)

    reproduction, runs = _shrunk(monkeypatch, history, 300, ("crash", "pause"))
    assert (reproduction.steps, reproduction.faults) == (80, ("crash",))
    assert (80, ("crash",)) in runs
    assert reproduction.invariant == "I4"
    assert len(runs) == reproduction.tries


#: A hole put back, and four seeds of which it makes more than one fail (10 and 12).
OFTEN_FROM = 10
FAILING_OFTEN = ("lookup_lag", [f"--first-seed={OFTEN_FROM}", "--seeds=4"])
#: The two tests that read the run of those seeds in one process share it, on one worker.
FAILING_OFTEN_GROUP = pytest.mark.xdist_group("failing-often")


@pytest.fixture(scope="module")
def failing_often(tmp_path_factory: pytest.TempPathFactory) -> tuple[int, dict[str, Any], str]:
    """The run of :data:`FAILING_OFTEN` in one process, the first failure shrunk: exit code, report, output."""
    hole, args = FAILING_OFTEN
    return simulate(tmp_path_factory.mktemp("often"), *args, "--shrink-first=1", hole=hole)


@pytest.mark.slow
@pytest.mark.timeout(1800)
@FAILING_OFTEN_GROUP
@ON_SQLITE_PASS
def test_a_run_goes_on_past_a_failing_seed_and_reports_every_one(
    tmp_path: Path, failing_often: tuple[int, dict[str, Any], str]
) -> None:
    hole, args = FAILING_OFTEN
    code, report, output = failing_often
    assert code == 1
    failures = report["failures"]
    assert len(failures) >= 2, f"the seeds no longer fail more than once: {output[-3000:]}"
    assert report["seeds"] == list(range(OFTEN_FROM, OFTEN_FROM + 4))
    assert report["failed_seeds"] == [f["seed"] for f in failures]
    assert output.count("its history's last steps:") == len(failures)
    for failed in failures:
        assert f"seed {failed['seed']} FAILED (history digest {failed['digest']}):" in output
        assert failed["violations"][0]["detail"] in output
        assert f"replay: {failed['replay']}" in output
    # The first is shrunk; the rest keep the seed as it ran, and the run says so.
    first, *rest = failures
    assert first["reproduction"] is not None
    assert all(f["reproduction"] is None for f in rest)
    assert rest[0]["replay"] == (
        f"python manage.py simulate --seed {rest[0]['seed']} --steps 300 --faults {','.join(rest[0]['faults'])}"
    )
    assert f"shrink one: --first-seed {rest[0]['seed']} --seeds 1" in output
    assert f"{len(failures)} seed(s) broke an invariant" in output

    code, stopped, _output = simulate(tmp_path, *args, "--no-shrink", "--stop-on-failure", hole=hole)
    assert code == 1
    assert stopped["seeds"] == list(range(OFTEN_FROM, first["seed"] + 1))
    assert [f["seed"] for f in stopped["failures"]] == [first["seed"]]


@pytest.mark.slow
@ON_SQLITE_PASS
def test_seeds_spread_over_processes_run_the_same_histories(tmp_path: Path) -> None:
    args = ["--seeds=4", "--first-seed=41", "--steps=120"]
    code, one, output = simulate(tmp_path, *args)
    assert code == 0, output[-3000:]
    code, two, output = simulate(tmp_path, *args, "--jobs=2")
    assert code == 0, output[-3000:]
    assert "4 seed(s) from 41, 120 steps each" in output
    assert "on SQLite, 2 processes" in output
    assert two["jobs"] == 2
    assert two["digests"] == one["digests"]
    assert two["seeds"] == one["seeds"]
    # What each process covered is added up.
    assert (two["moves"], two["faults"], two["steps"]) == (one["moves"], one["faults"], one["steps"])


def _failure_reports(output: str) -> list[str]:
    """The failures as the run tells them at its end (what comes before holds timings)."""
    lines = output.splitlines()
    starts = [n for n, line in enumerate(lines) if re.match(r"seed \d+ FAILED", line)]
    assert starts, output[-3000:]
    return lines[starts[0] :]


@pytest.mark.slow
@pytest.mark.timeout(1800)
@FAILING_OFTEN_GROUP
@ON_SQLITE_PASS
def test_failures_found_by_several_processes_are_reported_as_by_one(
    tmp_path: Path, failing_often: tuple[int, dict[str, Any], str]
) -> None:
    hole, args = FAILING_OFTEN
    code, one, one_said = failing_often
    assert code == 1
    code, two, two_said = simulate(tmp_path, *args, "--shrink-first=1", "--jobs=2", hole=hole)
    assert code == 1
    assert two["failures"] == one["failures"]
    assert two["digests"] == one["digests"]
    assert _failure_reports(two_said) == _failure_reports(one_said)
    code, stopped, _output = simulate(tmp_path, *args, "--no-shrink", "--stop-on-failure", "--jobs=2", hole=hole)
    assert code == 1
    first = one["failures"][0]["seed"]
    assert stopped["seeds"] == list(range(OFTEN_FROM, first + 1))
    assert [f["seed"] for f in stopped["failures"]] == [first]


def test_bad_arguments_are_refused_with_a_clear_error() -> None:
    # Refused before the run touches anything, as a seed list it cannot read is.
    with pytest.raises(CommandError, match=r"unknown fault kind\(s\) meteor"):
        call_command("simulate", "--faults=crash,meteor")
    with pytest.raises(CommandError, match="archive: injected on PostgreSQL only"):
        call_command("simulate", "--faults=crash,archive")


@pytest.mark.usefixtures("_unblocked")
@ON_SQLITE_PASS
def test_a_few_seeds_in_this_process_hold_and_replay(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The quick pass, in the test process itself (what the subprocess runs above is not measured by coverage):
    a few seeds hold, and one of them run again alone replays the same history."""
    from django.core.management import call_command

    out = tmp_path / "few.json"
    call_command("simulate", seeds=3, first_seed=5, steps=120, json_out=out)
    batch = json.loads(out.read_text())
    assert batch["failures"] == []
    assert len(batch["seeds"]) == 3
    call_command("simulate", seed=6, steps=120, json_out=out)
    assert json.loads(out.read_text())["digests"]["6"] == batch["digests"]["6"]
    assert "history digest" in capsys.readouterr().out


#: Under pytest-xdist the test process has threads of its own (execnet's); the workers forked from it
#: run only the simulation, which takes none of their locks.
FORKED_FROM_A_THREADED_PROCESS = pytest.mark.filterwarnings("ignore:This process .* is multi-threaded")


@pytest.mark.usefixtures("_unblocked")
@ON_SQLITE_PASS
@pytest.mark.parametrize("jobs", [1, pytest.param(2, marks=FORKED_FROM_A_THREADED_PROCESS)])
def test_a_run_reports_every_failing_seed_and_shrinks_the_first_few(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, jobs: int
) -> None:
    """In the test process (what the subprocesses above run is not measured by coverage), with made-up
    histories: odd seeds break I6 once faults stop, as long as crashes are on."""
    from django.core.management import call_command
    from django.core.management.base import CommandError

    def run_seed(databases: Any, seed: int, *, steps: int, faults: Iterable[str]) -> runner.Outcome:
        faults = tuple(sorted(faults))
        if seed % 2 and "crash" in faults:
            return _outcome(steps, faults, "I6", steps + 10, settling=True, seed=seed)
        return _outcome(steps, faults, seed=seed)

    monkeypatch.setattr(runner, "run_seed", run_seed)  # (a worker is a fork: it runs these too)
    out = tmp_path / "failures.json"
    with pytest.raises(CommandError, match=r"3 seed\(s\) broke an invariant: 5, 7, 9"):
        call_command("simulate", seeds=6, first_seed=4, steps=50, shrink_first=2, jobs=jobs, json_out=out)
    report = json.loads(out.read_text())
    said = capsys.readouterr()
    assert report["seeds"] == [4, 5, 6, 7, 8, 9]
    assert report["failed_seeds"] == [5, 7, 9]
    five, seven, nine = report["failures"]
    assert five["after_faults_stopped"] is True
    assert five["violations"] == [{"invariant": "I6", "step": 60, "detail": "seed 5 broke it"}]
    # The first two are shrunk to crashes alone, keeping their 50 steps; the third is replayed as it ran.
    assert five["replay"] == "python manage.py simulate --seed 5 --steps 50 --faults crash"
    # (a failure once faults stopped keeps its steps: one try leaving out each kind of fault)
    on_sqlite = runner.faults_for("sqlite")
    tries = len(on_sqlite)
    assert seven["reproduction"] == {"steps": 50, "faults": ["crash"], "tries": tries, "digest": "7/50/crash"}
    assert nine["reproduction"] is None
    assert nine["replay"] == f"python manage.py simulate --seed 9 --steps 50 --faults {','.join(sorted(on_sqlite))}"
    for failed in report["failures"]:
        assert f"seed {failed['seed']} FAILED (history digest {failed['digest']}):" in said.err
        assert f"replay: {failed['replay']}" in said.err
        assert f"seed {failed['seed']}'s step 60" in said.err
    assert "shrunk: the lowest 2 failing seed(s) only (5, 7)" in said.err
    assert "seed 5 failed: I6 at step 60, after faults stopped (reported at the end)" in said.out


@pytest.fixture
def _unblocked(django_db_blocker: Any) -> Any:
    """The simulation makes databases of its own; the test database stays untouched."""
    with django_db_blocker.unblock():
        yield


@pytest.mark.slow
@pytest.mark.postgres
@pytest.mark.parametrize("jobs", [1, 2])
def test_a_run_stopped_with_sigterm_removes_its_scratch_databases(jobs: int) -> None:
    """A run killed midway leaves no ledgerdash_sim_<pid>_* database behind on a shared server, nor
    do its workers (theirs carry its pid too)."""
    import signal
    import time

    from tests.database_roles import admin_connect, admin_url
    from tests.live import PYTHON, ROOT

    url = admin_url("postgres")
    env = {k: v for k, v in os.environ.items() if k not in ("DJANGO_SETTINGS_MODULE", "DATABASE_URL")} | {
        "DEBUG": "true"
    }
    proc = subprocess.Popen(
        [PYTHON, "manage.py", "simulate", "--seeds", "500", "--jobs", str(jobs), "--database", url],
        cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    prefix = f"ledgerdash_sim_{proc.pid}_"

    def scratch() -> list[str]:
        with admin_connect("postgres") as admin:
            rows = admin.execute("SELECT datname FROM pg_database WHERE datname LIKE %s", [prefix + "%"]).fetchall()
        return [row[0] for row in rows]

    try:
        # Each process's template and the copy of its first seed: runs are under way.
        for _ in range(900):
            if len(scratch()) >= 2 * jobs or proc.poll() is not None:
                break
            time.sleep(0.2)
        assert len(scratch()) >= 2 * jobs, f"the run made no databases: {scratch()}"
        proc.send_signal(signal.SIGTERM)
        code = proc.wait(timeout=120)
        said = proc.stderr.read() if proc.stderr else ""
        assert code != 0, said
        assert scratch() == [], said
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


# --- the preset providers' modes -----------------------------------------------------------


def test_a_preset_providers_effect_changed_or_out_of_reach_is_answered_as_the_presets_answer() -> None:
    """What the replicas' modes do (docs/providers.md), modelled in the simulation's preset providers:
    read by the recorded id an effect is the call's whatever befell it; otherwise a changed effect of
    the window clouds the lookup (ambiguous) and one out of reach blinds it (not evidence), unless the
    ledger recorded it on another side effect."""
    from datetime import timedelta

    from ledgerdash.ledger.providers.base import Sought
    from ledgerdash.ledger.simulation.provider import Effect, Faults, Provider
    from ledgerdash.ledger.simulation.scenario import PROVIDERS
    from ledgerdash.ledger.simulation.world import EPOCH, World

    world = World(1)
    slack = Provider("sim.slack", PROVIDERS["sim.slack"], world, Faults(world, frozenset()))
    assert PROVIDERS["sim.slack"].changes > 0
    assert PROVIDERS["sim.github"].vanishes > 0
    assert PROVIDERS["sim.stripe"].changes == PROVIDERS["sim.stripe"].vanishes == 0
    effect = Effect(1, "sim.slack", "k1", "h1", "sim.slack-1", EPOCH, 1, 1, fate="changed", fate_at=EPOCH)
    slack.effects.append(effect)
    world.now = EPOCH + timedelta(seconds=5)

    def sought(**given: Any) -> Sought:
        return Sought(key="k2", args_hash="h2", sent_after=EPOCH - timedelta(seconds=1), **given)

    assert slack.receipt("sim.slack-1") is effect
    assert slack.found("k1") is effect  # by key as stored; look_up leaves out what befell it
    assert slack.clouded(sought()) == "changed"
    assert slack.clouded(sought(elsewhere={"sim.slack-1"}.__contains__)) == ""
    assert slack.clouded(Sought(key="k2", args_hash="h2", sent_after=EPOCH + timedelta(seconds=1))) == ""
    effect.fate = "vanished"
    assert slack.clouded(sought()) == "vanished"
    effect.fate_at = EPOCH + timedelta(seconds=10)  # not yet
    assert slack.clouded(sought()) == ""
    assert slack.alike("h1", None) == [effect]


#: Seeds whose preset providers' effects were changed (1) and taken out of reach (3) after they were
#: made, and seed 3's reconciler met the second: measured again when the generators change.
PRESET_SEEDS = "1,3"


@ON_SQLITE_PASS
def test_the_preset_providers_modes_befall_effects_in_a_run(tmp_path: Path) -> None:
    code, report, output = simulate(tmp_path, "--seed-list", PRESET_SEEDS)
    assert code == 0, output[-3000:]
    assert report["afterwards"].get("changed", 0) > 0, report["afterwards"]
    assert report["afterwards"].get("vanished", 0) > 0, report["afterwards"]
    code, _, history = simulate(tmp_path, "--seed", "3")
    assert code == 0, history[-3000:]
    assert "the provider's lookup could not have seen this call: an effect of the window is out of" in history
