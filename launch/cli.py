"""``mesh-launch``: start one role of the mesh (or, with ``--role all``, a whole mesh).

The options are declared once, by role, in :mod:`launch.options`; this module turns them into
click options, ``--help`` grouped by role, and runs the role. ``docs/config.md`` is the
reference of every setting.
"""

from __future__ import annotations

import logging
import sys
from pathlib import Path
from typing import Any

import click
import zmq
from click.core import ParameterSource

from launch import config_file
from launch.children import RoleFailed, die_with_parent_from_env
from launch.ingress_role import run_ingress_role
from launch.options import GROUPS, ROLES, Declared, LaunchArgs, declared, ingress_procs
from launch.roles import liveness_of, run_broker, run_worker, security_of
from launch.supervisor import run_all, run_ingress_group
from mesh.transport import InsecureBindError

HELP = """Run one role of an embedmesh mesh: an ingress (HTTP), the broker, a worker, or with
--role all (the default) a whole mesh on this host, on the embedded all-MiniLM-L6-v2 unless
--model says otherwise.

\b
Every flag has an environment variable: EMBEDMESH_ and its name in capitals (--http-port:
EMBEDMESH_HTTP_PORT). Expert settings, left out of this list, go in a TOML file named by
--config (or EMBEDMESH_CONFIG): --print-config prints every key with its variable and default
(reference: docs/config.md). A flag wins over its variable, the variable over the file, the
file over the default. A flag that does not apply to the role is refused."""

# One line on stderr at start when --api-key was typed on the command line.
API_KEY_IN_ARGV = (
    "embedmesh: warning: --api-key on the command line is visible to every user of this host "
    "(ps, /proc/PID/cmdline); give it with --api-key-file FILE or the EMBEDMESH_API_KEY "
    "variable instead"
)


class GroupedOption(click.Option):
    """A click option that knows its help group."""

    def __init__(self, *decls: str, group: str = "", **kwargs: Any) -> None:
        super().__init__(decls, **kwargs)
        self.group = group


class RoleCommand(click.Command):
    """``--help`` in one short section per role instead of one flat list."""

    def format_options(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        by_group: dict[str, list[tuple[str, str]]] = {}
        for param in self.get_params(ctx):
            record = param.get_help_record(ctx)
            if record is not None:
                by_group.setdefault(getattr(param, "group", ""), []).append(record)
        with formatter.section("Options"):
            formatter.write_dl(by_group.pop("", []))
        for group, title in GROUPS.items():
            if group in by_group:
                with formatter.section(title):
                    formatter.write_dl(by_group[group])


def _from_file(ctx: click.Context, role: str, path: Path | None) -> dict[str, Any]:
    """The ``--config`` file's values for ``role``, for the options that neither a flag nor a
    variable set (the file is below both); with the expert knobs' values."""
    from_file = config_file.load(path, role) if path is not None else {}
    values = {
        name: value
        for name, value in from_file.items()
        if name in ctx.params and ctx.get_parameter_source(name) is ParameterSource.DEFAULT
    }
    return {**values, **config_file.resolve_knobs(from_file)}


def _click_option(option: Declared) -> click.Option:
    spec = option.spec
    kwargs: dict[str, Any] = {
        "help": spec.help,
        "hidden": spec.expert or spec.internal,
        "envvar": option.env,
        "group": spec.group,
    }
    if spec.type is None:
        kwargs.update(is_flag=True, default=option.default)
    else:
        kwargs.update(type=spec.type, default=option.default, multiple=spec.multiple)
    if spec.default_text:
        kwargs["show_default"] = spec.default_text
    elif option.default in ("", ()):
        kwargs["show_default"] = False
    return GroupedOption(option.flag, option.name, **kwargs)


def _top_options() -> list[click.Parameter]:
    return [
        click.Option(
            ["--role"],
            type=click.Choice(ROLES),
            default="all",
            envvar="EMBEDMESH_ROLE",
            help="Which part of the mesh this process runs (all: a whole mesh on this host).",
        ),
        click.Option(
            ["--config"],
            type=click.Path(exists=True, dir_okay=False, path_type=Path),
            envvar="EMBEDMESH_CONFIG",
            help="TOML file of settings (one table per role, keys as the options are named).",
        ),
        click.Option(
            ["--print-config"],
            is_flag=True,
            envvar="EMBEDMESH_PRINT_CONFIG",
            help="Print the effective settings as a --config file (every key, its variable "
            "and default) and exit.",
        ),
        click.Option(
            ["--gen-keys"],
            type=click.Path(file_okay=False, path_type=Path),
            envvar="EMBEDMESH_GEN_KEYS",
            help="Create CurveZMQ key pairs (broker, ingress, worker) in DIR and exit; copy "
            "DIR to every host and pass it as --curve-dir.",
        ),
    ]


def launch_args(ctx: click.Context) -> LaunchArgs:
    """The options object of a parsed command line: flags, variables, config file, defaults.
    A flag given to a role it does not apply to is a usage error."""
    role = str(ctx.params["role"])
    for option in declared():
        foreign = option.spec.flag and not option.spec.applies_to(role)
        if foreign and ctx.get_parameter_source(option.name) is ParameterSource.COMMANDLINE:
            roles = ", ".join(r for r in ROLES if option.spec.applies_to(r))
            raise click.UsageError(
                f"{option.flag} does not apply to --role {role}; it is an option of --role {roles}",
                ctx,
            )
    values = {**ctx.params, **_from_file(ctx, role, ctx.params["config"])}
    args = LaunchArgs.from_values(values)
    if args.worker.no_compile and args.worker.kernels not in (None, "torch"):
        raise click.UsageError(
            f"--no-compile means --kernels torch, not --kernels {args.worker.kernels}", ctx
        )
    return args


def parse(argv: list[str]) -> tuple[str, LaunchArgs]:
    """(role, options) of a ``mesh-launch`` command line, without running it."""
    ctx = main.make_context("mesh-launch", list(argv))
    return str(ctx.params["role"]), launch_args(ctx)


def _run(role: str, args: LaunchArgs) -> int:
    """Run ``role`` until it stops; its exit status."""
    liveness, security = liveness_of(args.link), security_of(args.link)
    if role == "broker":
        run_broker(args.broker, liveness, security)
    elif role == "worker":
        run_worker(args.worker, args.link.broker_endpoints, liveness, security)
    elif role == "ingress" and ingress_procs(args) > 1:
        return run_ingress_group(args)
    elif role == "ingress":
        return run_ingress_role(args, liveness, security)
    else:
        return run_all(args)
    return 0


@click.pass_context
def _main(
    ctx: click.Context, role: str, print_config: bool, gen_keys: Path | None, **_: Any
) -> None:
    die_with_parent_from_env()  # a role started by `--role all`: first, before any slow start
    args = launch_args(ctx)
    if ctx.get_parameter_source("api_key") is ParameterSource.COMMANDLINE:
        click.echo(API_KEY_IN_ARGV, err=True)
    if print_config:
        click.echo(config_file.render(args), nl=False)
        return
    logging.basicConfig(
        level=args.link.log_level,
        format=f"%(asctime)s {role} %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    if gen_keys is not None:
        from mesh.transport import generate_keys

        where = generate_keys(gen_keys)
        click.echo(f"CurveZMQ keys in {where}: pass --curve-dir {where} to every role")
        return
    try:
        code = _run(role, args)
    except KeyboardInterrupt:
        code = 0
    except (RoleFailed, InsecureBindError, zmq.ZMQError, OSError, ValueError) as exc:
        # Start-up failures a user can fix: one readable line, not a traceback.
        raise click.ClickException(f"{role}: {exc}") from exc
    if code:
        sys.exit(code)


main = RoleCommand(
    "mesh-launch",
    callback=_main,
    params=[*_top_options(), *(_click_option(o) for o in declared() if o.spec.flag)],
    help=HELP,
    context_settings={"show_default": True, "max_content_width": 100},
)


if __name__ == "__main__":
    main()
