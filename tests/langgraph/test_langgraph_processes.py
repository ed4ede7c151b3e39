"""DurablySaver across real processes: one writer per thread, and SIGKILL anywhere loses nothing."""

from __future__ import annotations

import random
import shutil
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from _lg_server import Server

ROUNDS = 2


def test_a_second_process_writing_the_thread_is_refused_at_once(
    lg_server: Server, tmp_path: Path
) -> None:
    """While one process writes a thread, another process's write gets ThreadLocked at once."""
    directory = str(tmp_path / "threads")
    held = lg_server.ask(cmd="hold", dir=directory, thread="shared", rounds=1)
    assert held["ready"] == "ready"
    second = lg_server.ask(cmd="run", dir=directory, thread="shared", rounds=1)
    result = second["result"]
    assert result["error"] == "ThreadLocked", result
    assert "'shared' is being written by another process" in result["message"]
    assert "fork its checkpoint chain" in result["message"]
    assert result["seconds"] < 5, "refused at once, not after waiting"
    other = lg_server.ask(cmd="run", dir=directory, thread="another", rounds=1)
    assert "error" not in other["result"], "other threads stay free"
    lg_server.ask(cmd="kill", pid=held["pid"])
    after = lg_server.ask(cmd="resume", dir=directory, thread="shared", rounds=1)
    assert "error" not in after["result"], after["result"]
    assert after["result"]["how"] == "finished", "the holder's run was complete"


def _crash_then_resume(
    server: Server, directory: Path, effects: Path, **crash: Any
) -> tuple[dict[str, Any], dict[str, Any]]:
    common = {"dir": str(directory), "thread": "t", "rounds": ROUNDS, "effects": str(effects)}
    crashed = server.ask(cmd="run", **common, **crash)
    resumed = server.ask(cmd="resume", **common)
    return crashed, resumed["result"]


@pytest.mark.slow
def test_sigkill_at_every_crash_point_and_at_random_instants_then_resume(
    lg_server: Server, tmp_path: Path
) -> None:
    """Killed at any crash point of the saver or at any instant, a resumed run ends the same."""
    reference = lg_server.ask(
        cmd="run", dir=str(tmp_path / "ref"), thread="t", rounds=ROUNDS, effects=""
    )["result"]
    assert "error" not in reference, reference
    points = reference["reached"]
    labels = Counter(points)
    assert {"store.append.written", "store.append.synced", "langgraph.put.saved"} <= set(labels)
    assert {"langgraph.writes.saved", "store.save.renamed", "langgraph.rewrite.done"} <= set(labels)

    created = points.index("store.save.renamed") + 1  # the thread's header is in place
    outcomes: Counter[str] = Counter()
    rerun_tools = 0
    for at in range(1, len(points) + 1):
        where = tmp_path / f"at-{at}"
        where.mkdir()
        crashed, resumed = _crash_then_resume(lg_server, where / "threads", where / "fx", at=at)
        assert crashed["killed"], f"crash point {at} ({points[at - 1]}) was not reached"
        assert "error" not in resumed, resumed
        assert resumed["summary"] == reference["summary"], f"after a kill at {points[at - 1]}"
        assert resumed["next"] == []
        outcomes[resumed["how"]] += 1
        if at >= created:
            assert resumed["how"] != "started", f"saved checkpoints lost at {points[at - 1]}"
        lookups = (where / "fx").read_text().split()
        assert sorted(set(lookups)) == [str(n) for n in range(ROUNDS)]
        assert len(lookups) - ROUNDS <= 1, "at most the interrupted tool runs again"
        rerun_tools += len(lookups) - ROUNDS

    # Random instants: the run's length varies with the machine's load, so draw
    # instants until `instants` of them landed inside a run (a kill after the run
    # ended proves nothing), with a bound on the draws.
    rng = random.Random(20)
    instants = 12
    killed_at_random = draws = 0
    while killed_at_random < instants and draws < 4 * instants:
        where = tmp_path / f"random-{draws}"
        draws += 1
        where.mkdir()
        delay = rng.uniform(0, reference["seconds"])
        crashed, resumed = _crash_then_resume(
            lg_server, where / "threads", where / "fx", kill_after=delay
        )
        killed_at_random += crashed["killed"]
        assert "error" not in resumed, resumed
        lookups = (where / "fx").read_text().split()
        assert len(lookups) - ROUNDS <= 1, "at most the interrupted tool runs again"
        rerun_tools += len(lookups) - ROUNDS
        assert resumed["summary"] == reference["summary"], f"after a kill at {delay:.4f} s"
        outcomes[resumed["how"]] += 1

    print(
        f"\n{len(points)} crash points ({dict(labels)}), {instants} random instants "
        f"({killed_at_random} of {draws} draws killed mid-run): "
        "every resumed run ended as the uncrashed one; "
        f"resumes {dict(outcomes)}; tool calls run again by LangGraph: {rerun_tools}"
    )
    assert killed_at_random >= instants // 2, (
        f"only {killed_at_random} of {draws} draws landed mid-run"
    )


@pytest.mark.slow
def test_a_resume_killed_at_any_of_its_crash_points_resumes_again_to_the_same_end(
    lg_server: Server, tmp_path: Path
) -> None:
    """Killed again at any crash point of its resume, a run resumed once more ends the same."""
    reference = lg_server.ask(
        cmd="run", dir=str(tmp_path / "ref"), thread="t", rounds=ROUNDS, effects=""
    )["result"]
    points = reference["reached"]
    firsts = [
        points.index("langgraph.rewrite.log_synced") + 1,  # the thread's log made, no header yet
        points.index("langgraph.writes.saved") + 1,  # the first task's writes saved
        len(points) - points[::-1].index("store.append.written"),  # the last put written
    ]
    second_kills = 0
    for first in firsts:
        template = tmp_path / f"first-{first}"
        template.mkdir()
        crashed = lg_server.ask(
            cmd="run",
            dir=str(template / "threads"),
            thread="t",
            rounds=ROUNDS,
            effects="",
            at=first,
        )
        assert crashed["killed"]
        for second in range(1, 200):
            where = tmp_path / f"first-{first}-second-{second}"
            shutil.copytree(template, where)
            common = {"dir": str(where / "threads"), "thread": "t", "rounds": ROUNDS}
            effects = str(where / "fx")
            again = lg_server.ask(cmd="resume", **common, effects=effects, at=second)
            if not again["killed"]:
                assert again["result"]["summary"] == reference["summary"]
                break
            second_kills += 1
            final = lg_server.ask(cmd="resume", **common, effects=effects)["result"]
            assert "error" not in final, final
            assert final["summary"] == reference["summary"], f"first kill {first}, then {second}"
            assert final["next"] == []
            if (where / "fx").exists():
                runs = (where / "fx").read_text().split()
                assert len(runs) <= ROUNDS + 1, "two kills re-run at most two tool calls"
        else:
            pytest.fail("the resume never finished")
    print(
        f"\n{len(firsts)} first kills, {second_kills} second kills in the resume: all ended alike"
    )
    assert second_kills >= 20
