"""The reference triage agent and its world.

The world is what the agent acts on: a small bundled to-do library with planted
bugs (``sample/``, package data, never imported as part of durably), batches of
crash reports with their ground truth (``tasks/<name>/``), an issue tracker with
its own SQLite database (:mod:`durably.triage.tracker`), and a fast in-process
runner for the sample's tests (:mod:`durably.triage.runner`).
:mod:`durably.triage.world` ties them together for one run.
"""
