"""The sweep's configurations: how a scenario's world behaves, and the harness's baselines."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Literal

from ..state import Effect
from ..tools import Found, Lookup, Tool, ToolContext

__all__ = ["CONFIGS", "Config", "check_knobs"]


@dataclass(frozen=True, kw_only=True)
class Config:
    """How the world behaves and how the harness treats in-doubt calls.

    A configuration is a small object: add your own by making one.
    """

    name: str
    honour_keys: bool = True
    """The services deduplicate on idempotency keys."""
    lookups: bool = True
    """Tools keep their lookups (without, an in-doubt write goes to a person)."""
    fickle: bool = False
    """The model answers differently when asked again for a reply it gave."""
    knobs: frozenset[str] = frozenset()
    """Switches of the job's own world, by name, turned on in this configuration.

    The job owns them: it lists the ones it knows in its ``knobs`` attribute
    (a mapping of name to meaning) and reads them from ``world.config``; the
    sweep refuses a configuration whose knob the job does not know. The triage
    demo's ``"no refile guard"`` takes away its tracker's refusal of a second
    filing.
    """
    baseline: Literal["naive-retry", "at-most-once"] | None = None
    """A deliberately broken policy that the sweep must show failing."""

    @property
    def protected(self) -> bool:
        """True for configurations durably promises to keep correct."""
        return self.baseline is None

    def adapt(self, tools: Sequence[Tool]) -> list[Tool]:
        """The tools as this configuration's harness declares them."""
        if self.baseline == "naive-retry":
            # No markers worth the name: every unanswered call is simply run again.
            return [replace(t, effect=Effect.IDEMPOTENT, key_ttl=None, lookup=None) for t in tools]
        if self.baseline == "at-most-once":
            # Never run an unanswered effect again: assume it happened.
            return [
                t
                if t.effect is Effect.READ
                else replace(t, effect=Effect.WRITE, key_ttl=None, lookup=_assume_done)
                for t in tools
            ]
        if not self.lookups:
            return [replace(t, lookup=None) if t.effect is Effect.WRITE else t for t in tools]
        return list(tools)


async def _assume_done(ctx: ToolContext, **arguments: object) -> Lookup:
    return Found("assumed done (at-most-once baseline)")


CONFIGS: tuple[Config, ...] = (
    Config(name="keys honoured"),
    Config(name="keys ignored", honour_keys=False),
    Config(name="fickle model", fickle=True),
    Config(name="lookups off", honour_keys=False, lookups=False),
    Config(name="no refile guard", honour_keys=False, knobs=frozenset({"no refile guard"})),
    Config(name="naive retry", honour_keys=False, baseline="naive-retry"),
    Config(name="at-most-once", honour_keys=False, baseline="at-most-once"),
)
"""The default configurations: five protected worlds, two baselines.

"lookups off" sends every in-doubt write to a person (ladder step 3); "no refile
guard" turns on the triage job's knob of that name, which takes away the
tracker's own refusal of a second filing (it would otherwise hide a write run
twice).
"""


def check_knobs(job: object, configs: Sequence[Config]) -> None:
    """Refuse a configuration that turns on a knob ``job`` does not list in its ``knobs``."""
    known = getattr(job, "knobs", {})
    for config in configs:
        unknown = sorted(config.knobs - set(known))
        if unknown:
            name = getattr(job, "name", type(job).__name__)
            offer = ", ".join(repr(k) for k in sorted(known)) or "none"
            raise ValueError(
                f"configuration {config.name!r} turns on the knob(s) "
                f"{', '.join(repr(k) for k in unknown)}, which the job {name!r} does not know "
                f"(it knows: {offer}); a job lists its knobs in its `knobs` attribute"
            )
