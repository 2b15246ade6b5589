"""The `memx` command line (typer): the root group and where every command is mounted.

Exit codes: 0 ok, 2 bad input, 3 no feasible plan, 4 check failed, 5 nothing usable, 130 interrupted — all set by the
root group's one error handler (`memx.cli.options.MemxGroup`, docs/architecture.md §CLI). Each module
in memx/cli/ exposes plain command functions and typer sub-groups; this module mounts them all.
"""

from __future__ import annotations

from memx.cli.artifacts import artifacts_app
from memx.cli.catalog import catalog_cmd, cluster_app
from memx.cli.experiments import experiments_cmd
from memx.cli.inspect import inspect_cmd, rank_cmd
from memx.cli.learn import evaluate_cmd, models_app, train_cmd
from memx.cli.options import new_app
from memx.cli.plan import plan_cmd
from memx.cli.profile import ingest_app, profile_cmd
from memx.cli.simulate import simulate_app
from memx.cli.ui import ui_cmd

app = new_app("MemX: memory-aware parallel plans for mixed GPU clusters.")

app.command("plan")(plan_cmd)
app.command("catalog")(catalog_cmd)
app.command("train")(train_cmd)
app.command("evaluate")(evaluate_cmd)
app.command("profile")(profile_cmd)
app.command("experiments")(experiments_cmd)
app.command("ui")(ui_cmd)
app.command("inspect")(inspect_cmd)
app.command("rank")(rank_cmd)
app.add_typer(cluster_app, name="cluster")
app.add_typer(simulate_app, name="simulate")
app.add_typer(artifacts_app, name="artifacts")
app.add_typer(models_app, name="models")
app.add_typer(ingest_app, name="ingest")


def main() -> None:
    """The console script `memx` (pyproject [project.scripts])."""
    app()


if __name__ == "__main__":  # pragma: no cover
    main()
