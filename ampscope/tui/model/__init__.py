"""The dashboard's model: what it knows about runs, with no Textual in it.

A run's state as events arrive (``run_state``, ``figures``), where its events come from (``source``:
a live engine, a followed record, a replay), the engine process the dashboard starts
(``engine_process``) and the run manager that ties them together (``run_manager``). Screens and widgets
draw from these; an import-linter contract keeps Textual out, so each can be tested without an app.
"""
