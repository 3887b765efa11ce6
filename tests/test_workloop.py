"""The workers' loop after the database went away: it backs off, but asks
the database every second whether it answers and takes writes, and goes
back to work as soon as it does, not a back-off later (after a failover the
notifier waited out a 30-second back-off with the new primary up)."""

from __future__ import annotations

import pytest

from ledgerdash import workloop


class Stop:
    """A stop event that never blocks: it records how long the loop waited."""

    def __init__(self) -> None:
        self.waited: list[float] = []
        self.stopped = False

    def is_set(self) -> bool:
        return self.stopped

    def wait(self, timeout: float | None = None) -> bool:
        self.waited.append(float(timeout or 0))
        return self.stopped


def answering_after(questions: int) -> tuple[list[int], object]:
    asked = [0]

    def answers() -> bool:
        asked[0] += 1
        return asked[0] >= questions

    return asked, answers


def test_the_back_off_ends_at_the_first_answer() -> None:
    stop = Stop()
    asked, answers = answering_after(3)

    assert workloop.wait_for_database(stop, 30.0, answers, every=1.0) is True  # type: ignore[arg-type]

    assert stop.waited == [1.0, 1.0, 1.0]
    assert asked == [3]


def test_a_database_still_away_waits_the_whole_back_off_asking_each_second() -> None:
    stop = Stop()
    asked, answers = answering_after(1000)

    assert workloop.wait_for_database(stop, 4.5, answers, every=1.0) is False  # type: ignore[arg-type]

    assert stop.waited == [1.0, 1.0, 1.0, 1.0, 0.5]
    assert asked == [5]


def test_a_stop_ends_the_wait_without_asking_again() -> None:
    stop = Stop()
    asked, answers = answering_after(1000)

    def stopping() -> bool:
        stop.stopped = True
        return bool(answers())  # type: ignore[operator]

    assert workloop.wait_for_database(stop, 30.0, stopping, every=1.0) is False

    assert asked == [1]


@pytest.mark.django_db(transaction=True)  # it closes the connection: no test transaction around it
def test_the_question_is_readyz_s_own() -> None:
    assert workloop.database_answers() is True
