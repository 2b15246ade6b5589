"""Options shared by every `memx` command group, and the one error handler (docs/architecture.md §CLI).

Every command raises `MemxError` subclasses for bad input (exit 2), no feasible plan (3) and a failed
check (4); `MemxGroup.invoke` turns them into one `error: …` line on stderr and the exit code, and
Ctrl-C into exit code 130. No command catches them itself; sub-groups (`sub_app`) are plain typer
groups mounted on the root, so every error passes through this one handler.
"""

from __future__ import annotations

import copy
import shlex
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Optional, get_args

import typer
import typer.core
from typer._click import exceptions as click_errors  # typer vendors click: its own exception classes

from memx.cli.coercion import install, install_param
from memx.domain import spec_cache
from memx.domain.errors import InputError, MemxError
from memx.domain.home import telemetry_off

if TYPE_CHECKING:
    from memx.domain.specs import Cluster, ModelArch, SearchSpace

DEFAULT_CLUSTER = "three-vendor-20"
DEFAULT_MODEL = "llama2-7b"
DEFAULT_SEARCH = "default"
INTERRUPTED_EXIT = 130  # the shell's code for SIGINT (128 + 2)


class MemxGroup(typer.core.TyperGroup):
    """The root command group: the single place where errors become messages and exit codes."""

    def invoke(self, ctx):  # noqa: D401 - click API
        telemetry_off()  # this process and every process it starts (memx.domain.home.TELEMETRY_OFF)
        done = False
        try:
            result, done = super().invoke(ctx), True
        except MemxError as exc:
            typer.echo(f"error: {exc}", err=True)
            raise typer.Exit(exc.exit_code) from None
        except KeyboardInterrupt:
            raise typer.Exit(INTERRUPTED_EXIT) from None
        finally:  # the catalog entries this command validated are cached once it succeeded: bad input writes nothing
            if done:
                spec_cache.flush()
            else:
                spec_cache.discard()
        return result

    def get_help_option(self, ctx):  # noqa: D401 - click API
        opt = super().get_help_option(ctx)
        if opt is not None:
            install_param(opt)
        return opt

    def resolve_command(self, ctx, args):  # noqa: D401 - click API
        """The sub-command to run; its values (and this group's) are converted without pydantic where that is
        certain (memx.cli.coercion)."""
        name, cmd, rest = super().resolve_command(ctx, args)
        if cmd is not None:
            install(cmd)
            if "help_option_names" not in (cmd.context_settings or {}):  # its --help, as its own context makes it
                opt = cmd.get_help_option(ctx)
                if opt is not None:
                    install_param(opt)
        return name, cmd, rest

    def main(self, *args, standalone_mode: bool = True, **kwargs):  # noqa: D401 - click API
        """Usage errors (an unknown option, a missing or malformed value) as one `error: …` line and exit 2,
        like every other bad input, instead of typer's boxed usage panel; `memx` alone still shows the help.
        """
        if not standalone_mode:
            return super().main(*args, standalone_mode=False, **kwargs)
        try:
            _one_conf(list(kwargs.get("args") or (args[0] if args else None) or sys.argv[1:]))
            code = super().main(*args, standalone_mode=False, **kwargs)
        except InputError as exc:
            typer.echo(f"error: {exc}", err=True)
            sys.exit(exc.exit_code)
        except click_errors.NoArgsIsHelpError as exc:
            exc.show()
            sys.exit(exc.exit_code)
        except click_errors.ClickException as exc:
            ctx = getattr(exc, "ctx", None)
            where = f"{ctx.command_path}: " if ctx is not None else ""
            hint = f" (see {ctx.command_path} --help)" if isinstance(exc, click_errors.UsageError) and ctx else ""
            typer.echo(f"error: {where}{' '.join(exc.format_message().split())}{hint}", err=True)
            sys.exit(exc.exit_code)
        except typer.Abort:
            typer.echo("Aborted!", err=True)
            sys.exit(1)
        sys.exit(code if isinstance(code, int) else 0)


def _one_conf(argv: list[str]) -> None:
    """`--conf` at most once: one folder is layered over $MEMX_HOME/conf and the packaged conf/
    (memx.domain.catalog.catalog_roots); a second one would silently replace the first."""
    words = argv[:argv.index("--")] if "--" in argv else argv
    given = [w.partition("=")[2] or (words[i + 1] if i + 1 < len(words) else "")
             for i, w in enumerate(words) if w == "--conf" or w.startswith("--conf=")]
    if len(given) > 1:
        raise InputError(f"--conf given {len(given)} times ({', '.join(given)}); give one catalog folder (it is "
                         "layered over $MEMX_HOME/conf and the packaged conf/; put your entries in one folder)")


def new_app(help_text: str) -> typer.Typer:
    """The root command group (with the error handler); sub-groups are `sub_app`s mounted on it. Its callback
    (which does nothing) keeps it a group when one command is mounted (memx.cli.app: `memx plan …`); typer
    would otherwise run that command as the root."""
    root = typer.Typer(cls=MemxGroup, add_completion=False, no_args_is_help=True, help=help_text)
    root.callback()(_root)
    return root


def _root() -> None:
    """The root group's callback: nothing to do before a command."""


def sub_app(help_text: str) -> typer.Typer:
    """A command group mounted on the root with `app.add_typer(sub, name=...)`; errors reach the root's handler."""
    return typer.Typer(add_completion=False, no_args_is_help=True, help=help_text)


def in_panel(option: Any, panel: str) -> Any:
    """The same `Annotated[type, typer.Option(...)]` listed under `panel` in `--help`."""
    base, info = get_args(option)
    info = copy.copy(info)
    info.rich_help_panel = panel
    return Annotated[base, info]


ConfOpt = Annotated[Optional[Path], typer.Option("--conf", help="Your catalog folder (gpus/, clusters/, models/, search/); default: $MEMX_CONF, else the packaged conf/.")]
ClusterOpt = Annotated[str, typer.Option("--cluster", help="Cluster name or YAML path.")]
ModelOpt = Annotated[str, typer.Option("--model", help="Model name or YAML path.")]
SearchOpt = Annotated[str, typer.Option("--search", help="Search space name or YAML path.")]
StoreOpt = Annotated[Optional[str], typer.Option("--store", help="Artifact store: a folder or s3://bucket/prefix (default: $MEMX_STORE, else $MEMX_HOME/artifacts).")]
SeedOpt = Annotated[int, typer.Option("--seed", help="Seed for profiling, sampling, splitting, tuning and boosting (same seed, same result).")]
WeightsOpt = Annotated[Optional[str], typer.Option("--weights", help="auto | default | safety | throughput | 'wT,wM,wV' (default: the search YAML's).")]
CommandOpt = Annotated[Optional[str], typer.Option("--command", help="--backend command: the launcher per profile point, with {placeholders} (docs/profiling.md).")]
RecordsOpt = Annotated[Optional[Path], typer.Option("--records", help="--backend records: measurements to import (CSV, Parquet, JSONL; a file or folder).")]
JobsOpt = Annotated[int, typer.Option("--jobs", min=1, help="--backend command: points measured in parallel.")]


def load_specs(cluster: str, model: str, search: str, conf: Path | None) -> tuple[Cluster, ModelArch, SearchSpace]:
    """The three catalog entries a command works on (InputError names the file and field)."""
    from memx.domain.catalog import load_cluster, load_model, load_search  # YAML + pydantic: not for `--help`

    return load_cluster(cluster, conf), load_model(model, conf), load_search(search, conf)


def split_command(command: str | None) -> list[str] | None:
    """`--command 'PROGRAM ARGS {tp} ...'` as argv (shell quoting); unbalanced quotes are bad input."""
    if not command:
        return None
    try:
        return shlex.split(command)
    except ValueError as exc:
        raise InputError(f"--command {command!r}: {exc}") from exc


def check_out_dir(folder: Path, option: str) -> None:
    """A folder to write into must be a folder or creatable (no file on its path): checked before any
    work, InputError (exit 2) naming the option."""
    for parent in (folder, *folder.parents):
        if parent.exists():
            if not parent.is_dir():
                raise InputError(f"{option} {folder}: {parent} exists and is not a folder")
            return


def measured_needs_analytic(measured: Path | None, predictor: str) -> None:
    """`--measured` (memx plan, memx inspect) calibrates the closed form only: InputError (exit 2) with another
    predictor, naming where that one is calibrated."""
    if measured is not None and predictor != "analytic":
        raise InputError(f"--measured calibrates the closed form (--predictor analytic), not --predictor {predictor}; "
                         "for the registered predictor calibrate it with `memx train --measured`")


def analytic_predictor(cl: Cluster, mo: ModelArch, sp: SearchSpace, measured: Path | None) -> tuple[Any, str]:
    """The closed form and its name in the output (`memx plan`, `memx inspect`); with `measured` (`--measured`
    config_runs) calibrated on those plans first (memx.learn.calibration.fit_from_config_runs, guarded, in the
    search's 1F1B assembly), the summary on stderr. `memx plan` does not cache a calibrated closed form's tables
    (memx.planner.table_cache keys the uncalibrated one)."""
    from memx.planner.cost import AnalyticStageModel

    pred = AnalyticStageModel(gpus={g.name: g for g in cl.gpu_types})
    if measured is None:
        return pred, "analytic"
    from memx.learn.calibration import fit_from_config_runs
    from memx.report.evaluate import read_config_runs

    cal = fit_from_config_runs(read_config_runs(measured), cl, mo, pred, pipeline_assembly=sp.pipeline_assembly)
    typer.echo(f"plan calibration: {cal.summary()}", err=True)
    return cal.wrap(pred), f"analytic, {cal.headline()}"
