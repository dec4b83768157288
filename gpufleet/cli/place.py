"""``gpufleet place JOBS.yaml [--catalog C.yaml]``: where each job should run, what it should cost, and why.

Parse, call :func:`gpufleet.placement.planner.plan`, render. Exit 0 when every job is placed, 1 when
some job is infeasible (the plan is printed either way), 2 on bad input.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.markup import escape

from gpufleet.cli.options import JsonOpt
from gpufleet.cli.render import console, duration, emit_json, money, table
from gpufleet.errors import UsageError

if TYPE_CHECKING:
    from gpufleet.placement.catalog import Catalog
    from gpufleet.placement.planner import Decision, Plan
    from gpufleet.spec import JobSpec

JobsArg = Annotated[
    Path, typer.Argument(help="A JobSpec file, or a batch: a YAML list of JobSpecs (or a mapping with key 'jobs').")
]
CatalogOpt = Annotated[
    Path | None,
    typer.Option(
        "--catalog",
        help="Offer catalogue YAML (format: examples/catalog.yaml); default: the catalogue gpufleet ships, "
        "the same offers as examples/catalog.yaml.",
        show_default=False,
    ),
]
SHIPPED_CATALOG = "default_catalog.yaml"
"""The catalogue in ``gpufleet.placement`` that ``place`` reads when given none (a copy of examples/catalog.yaml)."""

ExplainOpt = Annotated[bool, typer.Option("--explain", help="Show every rejected candidate of every job.")]
BlockOpt = Annotated[
    list[str] | None,
    typer.Option("--block", help="Avoid a provider, provider/region or provider/region/gpu_type (repeatable)."),
]


def _young_daly(d: Decision) -> str:
    c = d.choice
    if c is None or not c.spot:
        return "-"
    if c.advice is None:
        return "no preemptions" if c.interval_source == "young-daly" else "needs save_seconds"
    steps = f" ({c.advice.interval_steps} steps)" if c.advice.interval_steps is not None else ""
    return f"{duration(c.advice.interval_seconds)}{steps}"


def _quota(d: Decision) -> str:
    a = d.admission
    if a is None:
        return "-"
    return f"{a.quota} +{a.borrowed_gpus} borrowed" if a.borrowed_gpus else a.quota


def _placed_row(d: Decision, currency: str) -> list[Any]:
    c = d.choice
    assert c is not None
    gpus = f"{d.gpus}" if c.allocated_gpus == d.gpus else f"{d.gpus} of {c.allocated_gpus}"
    market = "spot" if c.spot else "on-demand"
    cost = money(c.cost.total, currency)
    return [d.job, d.team, c.offer, market, gpus, f"{c.expected_hours:,.1f}", cost, _young_daly(d), _quota(d)]


def _explain(d: Decision, currency: str) -> None:
    c = d.choice
    if c is not None:
        b = c.cost
        parts = [f"compute {money(b.compute, currency)}", f"preemption loss {money(b.preemption_loss, currency)}"]
        parts.append(f"egress {money(b.egress, currency)}")
        interval = f", checkpoint every {duration(c.interval_seconds)} ({c.interval_source})" if c.spot else ""
        detail = f"{c.offer} {'spot' if c.spot else 'on-demand'}: {' + '.join(parts)}{interval}"
        head = f"[bold]{escape(d.job)}[/] -> {escape(detail)}"
    else:
        head = f"[bold]{escape(d.job)}[/] -> infeasible"
    if d.work_assumed:
        head += " [yellow](no placement.gpu_hours: one hour per GPU assumed)[/]"
    console.print(head, soft_wrap=True)
    rows = [
        [
            r.offer,
            "spot" if r.spot else "on-demand",
            r.reason,
            r.detail,
            "" if r.expected_hours is None else f"{r.expected_hours:,.1f}",
            "" if r.expected_cost is None else money(r.expected_cost, currency),
        ]
        for r in d.rejected
    ]
    if rows:
        console.print(table(None, ["  rejected", "market", "reason", "detail", "exp. hours", "exp. cost"], rows))


def render_plan(p: Plan, explain: bool) -> None:
    """The assignments table, then infeasible jobs with reasons, then (``explain``) every decision."""
    cur = p.currency
    head = ["job", "team", "offer", "market", "GPUs", "exp. hours", "exp. cost", "Young/Daly", "quota"]
    rows = [_placed_row(d, cur) for d in p.placed]
    title = f"placement (catalogue of {p.as_of}" + (f", blocked: {', '.join(p.blocked)})" if p.blocked else ")")
    console.print(table(title, head, rows))
    console.print(
        f"expected total: {money(p.total_cost, cur)} for {len(p.placed)} of {len(p.decisions)} jobs", markup=False
    )
    if p.infeasible:
        bad = [[d.job, d.team, "; ".join(d.reasons)] for d in p.infeasible]
        console.print(table("infeasible", ["job", "team", "reasons"], bad))
    if explain:
        for d in sorted(p.decisions, key=lambda d: d.order):
            console.print()
            _explain(d, cur)


def read_jobs(path: Path) -> list[JobSpec]:
    """The jobs of ``path``: one JobSpec (a mapping with its fields), or a batch of them."""
    from gpufleet.placement.catalog import parse_batch
    from gpufleet.spec import parse_spec
    from gpufleet.yamlio import read_yaml

    data = read_yaml(path, what="batch", error=UsageError)
    if isinstance(data, dict) and set(data) != {"jobs"}:
        return [parse_spec(data, source=str(path))]
    return parse_batch(data, source=str(path))


def read_catalog(path: Path | None) -> Catalog:
    """The catalogue at ``path``, or the shipped one."""
    from importlib import resources

    from gpufleet.placement.catalog import load_catalog

    if path is not None:
        return load_catalog(path)
    with resources.as_file(resources.files("gpufleet.placement").joinpath(SHIPPED_CATALOG)) as shipped:
        return load_catalog(shipped)


def place_command(
    jobs: JobsArg,
    catalog: CatalogOpt = None,
    json_out: JsonOpt = False,
    explain: ExplainOpt = False,
    block: BlockOpt = None,
) -> None:
    """Choose a provider, region, GPU type and market for each job at the lowest expected cost."""
    from gpufleet.placement.planner import blocked_by, parse_target, plan

    cat = read_catalog(catalog)
    batch = read_jobs(jobs)
    for target in block or ():
        if not any(blocked_by(o, {parse_target(target)}) for o in cat.offers):
            keys = ", ".join(o.key for o in cat.offers)
            raise UsageError(f"--block {target!r} matches no offer of the catalogue; offers: {keys}")
    result = plan(batch, cat, blocked=block or ())
    if json_out:
        emit_json(result.to_dict(explain=True))
    else:
        render_plan(result, explain)
    if not result.ok:
        raise typer.Exit(1)


__all__ = [
    "BlockOpt",
    "CatalogOpt",
    "ExplainOpt",
    "JobsArg",
    "place_command",
    "read_catalog",
    "read_jobs",
    "render_plan",
]
