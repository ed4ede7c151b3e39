"""The console's run list of a Postgres fleet: queued runs, owners, leases (issue 38, item 1)."""

from __future__ import annotations

from datetime import timedelta

from durably.console.pages import Page, runs_page, runs_version
from durably.listing import RunSummary
from durably.state import utcnow

PAGE = Page(store="postgresql://db:5432/runs", root="/t/x/", read_only=True)


def fleet() -> list[RunSummary]:
    """A queued run, one a live lease holds, one whose lease expired, and a parked one."""
    now = utcnow()

    def run(run_id: str, phase: str, **fields: object) -> RunSummary:
        return RunSummary(
            run_id=run_id,
            phase=phase,
            turns=0,
            dollars=0.0,
            resumes=0,
            created_at=now - timedelta(minutes=5),
            saved_at=None,
            agent="ledger",
            **fields,  # type: ignore[arg-type]
        )

    return [
        run("q1", "queued"),
        run("c1", "model", owner="host:1:aa", lease_left=12.0),
        run("x1", "tools", owner="host:2:bb", lease_left=-3.0),
        run("p1", "queued", owner="host:1:aa", parked="the model key is missing"),
    ]


def test_the_run_list_shows_each_run_s_agent_owner_and_lease() -> None:
    """Every run is listed, queued ones too, with who holds its lease and until when."""
    page = runs_page(PAGE, fleet(), [], None)
    for header in ("<th>agent</th>", "<th>owner</th>", "<th>lease</th>"):
        assert header in page
    assert "<td>host:1:aa</td><td>expires in 12s</td>" in page
    assert "<td>host:2:bb</td><td>expired 3s ago</td>" in page
    assert "queued, parked" in page
    for name in ("queued", "claimed", "parked"):
        assert f'href="/t/x/?phase={name}"' in page


def test_the_run_list_picks_queued_claimed_and_parked_runs() -> None:
    """``?phase=queued|claimed|parked`` keep those runs only."""

    def listed(phase: str) -> list[str]:
        page = runs_page(PAGE, fleet(), [], phase)
        return [r for r in ("q1", "c1", "x1", "p1") if f'runs/{r}"' in page]

    assert listed("queued") == ["q1", "p1"]
    assert listed("claimed") == ["c1"]
    assert listed("parked") == ["p1"]


def test_a_claim_changes_the_run_list_s_version() -> None:
    """A worker claiming a run saves nothing; the page's poll must still see it."""
    import msgspec

    before = fleet()
    after = [*before[:-1], msgspec.structs.replace(before[-1], lease_left=30.0)]
    assert runs_version(before, [], None) != runs_version(after, [], None)
