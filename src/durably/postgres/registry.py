"""The agents workers run, by name: the registry, and how agents get into it.

A worker finds the agent of each run it claims by the name the run was submitted
under. Agents register in a :class:`Registry` (the default :data:`registry` through
:func:`register`), from modules named with ``durably worker --import MODULE``
(:func:`import_agents`) or from installed packages' ``durably.agents`` entry points
(:class:`AgentsHook`, :func:`load_entry_points`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from ..frontend import Drivable

__all__ = [
    "AGENTS_ENTRY_POINTS",
    "AgentFactory",
    "AgentsHook",
    "Registration",
    "Registry",
    "import_agents",
    "load_entry_points",
    "register",
    "registry",
]

AgentFactory = Callable[[str], Drivable]
"""Builds the agent for one run, given its ID: a ``durably.Agent``, or a front end's
:class:`~durably.frontend.Drivable` (``durably.pydantic_ai.worker_agent(agent)``). The
agent needs no store (the worker drives it on the handle of the run it claimed); one
it has is not used."""

AGENTS_ENTRY_POINTS = "durably.agents"
"""The entry-point group of packages that register agents with every worker
(see :class:`AgentsHook`); the reference triage agent registers itself this way."""


@dataclass(frozen=True, kw_only=True)
class Registration:
    """An agent workers can run, by name."""

    name: str
    factory: AgentFactory
    task: str | None = None
    """The task submitted runs get when none is given (the triage tasks have one)."""


class Registry:
    """Agents by name, for workers and for :func:`submit`."""

    def __init__(self) -> None:
        self._agents: dict[str, Registration] = {}

    def register(self, name: str, factory: AgentFactory, *, task: str | None = None) -> None:
        """Make ``factory`` the agent workers use for runs submitted as ``name``.

        Args:
            name: the name runs are submitted under, e.g. ``refunds`` or ``triage:m1``.
            factory: ``factory(run_id) -> Agent``; called once per run a worker picks up.
            task: the task a run gets when it is submitted without one.

        Raises:
            ValueError: ``name`` is registered already (with another factory).
        """
        known = self._agents.get(name)
        if known is not None and known.factory is not factory:
            raise ValueError(f"an agent named {name!r} is registered already")
        self._agents[name] = Registration(name=name, factory=factory, task=task)

    def names(self) -> list[str]:
        """Every registered name, sorted."""
        return sorted(self._agents)

    def get(self, name: str) -> Registration | None:
        """The registration of ``name``, or None."""
        return self._agents.get(name)

    def __contains__(self, name: object) -> bool:
        return name in self._agents


registry = Registry()
"""The registry ``durably worker`` serves (with the triage agents added)."""


def register(name: str, factory: AgentFactory, *, task: str | None = None) -> None:
    """Register an agent in the default :data:`registry` (see :meth:`Registry.register`)."""
    registry.register(name, factory, task=task)


class AgentsHook(Protocol):
    """What an entry point of the ``durably.agents`` group names: it registers agents.

    ``durably worker`` calls each installed hook with the registry it serves and its
    ``--state`` directory (where agents that keep files, like the triage demo's
    worlds, put them); ``durably submit`` calls them to learn the agents' default
    tasks. Declare one in ``pyproject.toml``::

        [project.entry-points."durably.agents"]
        myapp = "myapp.agents:register_agents"
    """

    def __call__(self, registry: Registry, *, state_dir: Path) -> None:
        """Register agents in ``registry``; ``state_dir`` is the worker's ``--state``."""
        ...


def load_entry_points(target: Registry, *, state_dir: Path) -> None:
    """Let every installed ``durably.agents`` hook register its agents in ``target``.

    Raises:
        ValueError: a hook cannot be loaded or fails; the message names it.
    """
    from importlib.metadata import entry_points

    for point in entry_points(group=AGENTS_ENTRY_POINTS):
        try:
            hook: AgentsHook = point.load()
            hook(target, state_dir=state_dir)
        except Exception as exc:
            raise ValueError(
                f"the agents of entry point {point.name!r} ({point.value}) could not be "
                f"registered: {type(exc).__name__}: {exc}"
            ) from exc


def import_agents(modules: Iterable[str]) -> None:
    """Import modules that register agents (``durably worker --import MODULE``).

    Raises:
        ValueError: a module cannot be imported.
    """
    import importlib

    for name in modules:
        try:
            importlib.import_module(name)
        except ImportError as exc:
            raise ValueError(f"cannot import {name!r} ({exc}); is it on PYTHONPATH?") from exc
