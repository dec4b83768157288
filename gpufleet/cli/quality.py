"""``gpufleet drift REF CUR``, ``gpufleet quality demo|doc|monitor`` and the quality labs: parse, call, render.

pandas, numpy, scipy, MLflow and matplotlib are imported inside the commands so ``gpufleet --help``
stays fast."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.markup import escape
from rich.text import Text

from gpufleet.cli.options import JsonOpt, check_path_name
from gpufleet.cli.registry import print_alias_history, require_registered
from gpufleet.cli.render import console, duration, emit_json, err_console, styled, table
from gpufleet.errors import UsageError, parameters_as_flags
from gpufleet.outfiles import check_output_file, check_plot_file
from gpufleet.paths import gpufleet_home

if TYPE_CHECKING:
    from gpufleet.quality.drift import ColumnDrift, DriftReport
    from gpufleet.quality.registry import AliasEvent


quality_app = typer.Typer(
    help="The model-quality loop: drift, retraining, champion and challenger.", no_args_is_help=True
)


ModelArg = Annotated[str, typer.Argument(metavar="MODEL", help="Registered model name.")]


@quality_app.command("demo")
def demo_command(
    preempt: Annotated[
        bool, typer.Option("--preempt", help="Preempt the retraining job once to show it resume.")
    ] = False,
    worse: Annotated[
        bool, typer.Option("--worse", help="Train a worse challenger (broken labels) to show the rollback path.")
    ] = False,
    mode: Annotated[str, typer.Option("--mode", help="Live evaluation: canary or shadow.")] = "canary",
    json_out: JsonOpt = False,
) -> None:
    """The whole chain on synthetic data: drift, policy, signed alert, retraining job, registry, canary."""
    from gpufleet.cli.watch import describe
    from gpufleet.demos.quality_chain import ChainConfig, run_quality_demo
    from gpufleet.quality.registry import mlflow_errors, mlflow_module, tracking_uri

    mlflow_module()  # before anything is written: a missing [quality] extra is one line
    if mode not in ("canary", "shadow"):
        raise UsageError(f"--mode {mode!r}: use canary or shadow")
    stamp = datetime.now(UTC).strftime("%Y%m%d-%H%M%S")
    home = gpufleet_home() / "quality-demo" / stamp
    home.mkdir(parents=True, exist_ok=True)

    def say(text: str) -> None:
        if not json_out:
            console.print(text, highlight=False)

    say(f"[bold]gpufleet quality demo[/]  state: {escape(str(home))}")
    cfg = ChainConfig(mode="shadow" if mode == "shadow" else "canary", preempt=preempt, worse=worse)
    with mlflow_errors(tracking_uri(home)):
        result = run_quality_demo(home, cfg, say, describe)
    if json_out:
        emit_json(result)
    else:
        print_alias_history([_event(e) for e in result["history"]["events"]], f"alias history of {result['model']}")
        verdict = {"promoted": "[green]promoted[/]", "rolled_back": "[yellow]rolled back[/]"}
        console.print(
            f"outcome: {verdict.get(result['outcome'], result['outcome'])}; aliases now "
            + ", ".join(f"@{a}=v{v}" for a, v in sorted(result["aliases"].items()))
            + f". Took {result['seconds']:.0f}s."
        )
        console.print(
            f"explore it:  export GPUFLEET_HOME={home}; gpufleet registry history {result['model']}; "
            f"gpufleet quality doc {result['model']}; mlflow ui --backend-store-uri {result['tracking_uri']}",
            highlight=False,
            soft_wrap=True,
            markup=False,
        )
        if not result["ok"]:
            console.print("[red]the chain did not end as expected: see the steps above[/]")
    if not result["ok"]:
        raise typer.Exit(1)


def _event(data: dict[str, Any]) -> AliasEvent:
    from gpufleet.quality.registry import AliasEvent

    return AliasEvent.from_dict(data)


@quality_app.command("doc")
def doc_command(
    model: ModelArg,
    out: Annotated[Path | None, typer.Option("--out", help="Write the Markdown here (default: stdout).")] = None,
    purpose: Annotated[
        str | None, typer.Option("--purpose", help="Intended purpose (default: the model's recorded one).")
    ] = None,
    json_out: JsonOpt = False,
) -> None:
    """Technical documentation for a high-risk AI system (AI Act, Annex IV) from the registry."""
    from gpufleet.quality.aidoc import collect, render
    from gpufleet.quality.registry import Registry, mlflow_errors, tracking_uri

    if out is not None:
        check_output_file(check_path_name(out, "--out"), "--out")
    require_registered(model)
    with mlflow_errors(tracking_uri()):
        text = render(collect(Registry(), model, purpose))
    if out is not None:
        if out.is_dir():
            raise UsageError(f"--out {str(out)!r} is a directory: give a file name, e.g. {out / (model + '.md')}")
        try:
            out.parent.mkdir(parents=True, exist_ok=True)
            out.write_text(text, encoding="utf-8")
        except OSError as err:
            raise UsageError(f"cannot write {str(out)!r}: {err.strerror}") from None
    if json_out:
        emit_json({"model": model, "path": str(out) if out else None, "markdown": text})
    elif out is not None:
        console.print(f"wrote {out} ({len(text.splitlines())} lines)", markup=False)
    else:
        typer.echo(text, nl=False)


RefArg = Annotated[Path, typer.Argument(help="Reference data: a CSV or Parquet file.")]
CurArg = Annotated[Path, typer.Argument(help="Current data: a CSV or Parquet file.")]
ColumnsOpt = Annotated[
    list[str] | None, typer.Option("--columns", help="Columns to compare, comma-separated (default: all).")
]
MethodOpt = Annotated[
    list[str] | None,
    typer.Option(
        "--method",
        help="A method for every column (ks, chi2, z, psi, wasserstein, wasserstein_raw, jensenshannon, mmd), "
        "or COLUMN=METHOD; repeatable. Default: Evidently's automatic choice.",
    ),
]
ThresholdOpt = Annotated[
    list[str] | None,
    typer.Option("--threshold", help="A threshold for every column, or COLUMN=VALUE; repeatable."),
]

HtmlOpt = Annotated[Path | None, typer.Option("--html", help="Write a self-contained HTML report here.")]
FailOpt = Annotated[
    bool,
    typer.Option(
        "--fail-on-drift",
        help="Exit 1 unless the data is cleared: on dataset drift, when a column is untestable or over "
        "--max-non-finite, or when no column could be tested.",
    ),
]
MaxNonFiniteOpt = Annotated[
    float,
    typer.Option(
        "--max-non-finite",
        metavar="SHARE",
        help="Alert on a column with more than this share of non-finite values (NaN, missing, +-inf) on "
        "either side; 1 turns the alert off.",
    ),
]
CorrectionOpt = Annotated[
    str, typer.Option("--correction", help="Multiple-testing correction over the p-values: none or bh.")
]


def split_columns(values: list[str] | None) -> list[str] | None:
    """``["a,b", "c"]`` -> ``["a", "b", "c"]``; ``None`` when no column was named."""
    if not values:
        return None
    names = [n.strip() for v in values for n in v.split(",") if n.strip()]
    if not names:
        raise UsageError("--columns is empty: name at least one column, e.g. --columns age,income")
    return names


def split_assignments(values: list[str] | None, flag: str) -> tuple[str | None, dict[str, str]]:
    """``["psi", "age=ks"]`` -> (``"psi"``, ``{"age": "ks"}``): one global value, the rest per column."""
    default: str | None = None
    per_column: dict[str, str] = {}
    for raw in values or []:
        name, sep, value = raw.rpartition("=")
        if not sep:
            if default is not None:
                raise UsageError(f"{flag} given twice for every column ({default!r}, {raw!r}): keep one")
            default = raw.strip()
        elif not name.strip() or not value.strip():
            raise UsageError(f"{flag} {raw!r}: write VALUE or COLUMN=VALUE")
        else:
            per_column[name.strip()] = value.strip()
    return default, per_column


def _number(text: str, flag: str) -> float:
    try:
        return float(text)
    except ValueError:
        raise UsageError(f"{flag} {text!r} is not a number: write e.g. {flag} 0.1 or {flag} age=0.05") from None


def _per_column(default: Any, per_column: dict[str, Any], names: list[str], flag: str) -> dict[str, Any] | Any:
    """One value for every column when no column was named, else a mapping over ``names``."""
    unknown = [c for c in per_column if c not in names]
    if unknown:
        raise UsageError(f"{flag} names column {unknown[0]!r}, which is not compared: columns are {', '.join(names)}")
    if not per_column:
        return default
    return {n: per_column.get(n, default) for n in names if per_column.get(n, default) is not None}


def _non_finite_cell(c: ColumnDrift) -> str | Text:
    """``"0% / 50%"`` (reference / current; ``-`` for a side without the column), red when it alerts."""

    def share(side: str) -> str:
        tally = c.non_finite.get(side)
        if tally is None:
            return "-"
        return "0%" if tally.share == 0 else f"{tally.share:.1%}"

    text = f"{share('reference')} / {share('current')}"
    return styled(f"[red]{text}[/]") if c.alert else text


def _print_report(report: DriftReport) -> None:
    drift_cell = {True: "[red]drift[/]", False: "no"}
    status_cell = {"skipped": "[yellow]skipped[/]", "untestable": "[red]untestable[/]"}
    rows = [
        [
            c.column,
            c.kind,
            c.method,
            c.statistic,
            c.p_value,
            c.threshold if c.status == "ok" else None,
            styled(drift_cell[c.drift] if c.drift is not None else status_cell.get(c.status, escape(c.status))),
            _non_finite_cell(c),
        ]
        for c in report.columns
    ]
    head = ["column", "kind", "method", "statistic", "p-value", "threshold", "drift", "non-finite ref/cur"]
    console.print(table("drift per column", head, rows))
    for c in report.columns:
        if c.reason:
            label = status_cell.get(c.status, escape(c.status))
            console.print(f"{label} {escape(c.column)}: {escape(c.reason)}", highlight=False, soft_wrap=True)
        if c.alert:
            console.print(f"[red]alert[/] {escape(c.column)}: {escape(c.alert)}", highlight=False, soft_wrap=True)
    colour = {"drift": "red", "no_drift": "green"}.get(report.status, "yellow")
    console.print(f"[{colour}]{escape(report.verdict)}[/]", highlight=False, soft_wrap=True)


@parameters_as_flags(
    {
        "columns": "--columns",
        "method": "--method",
        "threshold": "--threshold",
        "correction": "--correction",
        "max_non_finite": "--max-non-finite",
    }
)
def drift_command(
    reference: RefArg,
    current: CurArg,
    columns: ColumnsOpt = None,
    method: MethodOpt = None,
    threshold: ThresholdOpt = None,
    json_out: JsonOpt = False,
    html: HtmlOpt = None,
    fail_on_drift: FailOpt = False,
    correction: CorrectionOpt = "none",
    max_non_finite: MaxNonFiniteOpt = 0.05,
) -> None:
    """Compare current data with a reference, column by column (KS, chi-squared, PSI, Wasserstein, JS, MMD).

    A column that cannot be measured is "untestable", never "no drift"; non-finite values are counted
    and alert above --max-non-finite; either leaves the verdict "incomplete".
    """
    from gpufleet.fmt import finite_json
    from gpufleet.quality.drift import drift_report
    from gpufleet.tables import read_table

    if correction not in ("none", "bh"):
        raise UsageError(f"--correction {correction!r}: use none or bh")
    if html is not None:
        check_output_file(check_path_name(html, "--html"), "--html")
    ref, cur = read_table(reference), read_table(current)
    names = split_columns(columns) or [*map(str, ref.columns), *(str(c) for c in cur.columns if c not in ref.columns)]
    m_default, m_cols = split_assignments(method, "--method")
    t_default, t_cols = split_assignments(threshold, "--threshold")
    t_default_num = None if t_default is None else _number(t_default, "--threshold")
    t_cols_num = {k: _number(v, "--threshold") for k, v in t_cols.items()}
    report = drift_report(
        ref,
        cur,
        columns=names,
        method=_per_column(m_default, m_cols, names, "--method"),
        threshold=_per_column(t_default_num, t_cols_num, names, "--threshold"),
        correction="bh" if correction == "bh" else "none",
        max_non_finite=max_non_finite,
    )
    if html is not None:
        from gpufleet.quality.html import render_html

        title = f"Drift: {current.name} against {reference.name}"
        try:
            html.write_text(render_html(report, ref, cur, title=title), encoding="utf-8")
        except OSError as err:
            raise UsageError(f"--html {html}: cannot write it ({err.strerror}); pick a writable path") from err
    if json_out:
        emit_json(
            finite_json({"reference": str(reference), "current": str(current), **report.to_dict(), "html": _path(html)})
        )
    else:
        _print_report(report)
        if html is not None:
            console.print(f"HTML report: {html}", highlight=False, soft_wrap=True, markup=False)
    if fail_on_drift and report.status != "no_drift":
        if report.status == "untestable":
            err_console.print("no column could be tested: failing as --fail-on-drift asks", highlight=False)
        elif report.status == "incomplete":
            err_console.print(
                f"{report.untestable} column(s) untestable, {report.alerted} over the non-finite share: "
                "drift is not ruled out, failing as --fail-on-drift asks",
                highlight=False,
            )
        raise typer.Exit(1)


def _path(path: Path | None) -> str | None:
    return None if path is None else str(path)


def split_scores(values: list[str] | None) -> str | list[str] | dict[str, str] | None:
    """``--score``: one column (binary), columns in the sorted order of the classes, or ``CLASS=COLUMN`` pairs."""
    items = [v.strip() for raw in values or [] for v in raw.split(",") if v.strip()]
    if not items:
        return None
    pairs = [item.partition("=") for item in items]
    named = [sep for _, sep, _ in pairs if sep]
    if named and len(named) != len(items):
        raise UsageError(f"--score {','.join(items)}: name every class (CLASS=COLUMN) or none of them")
    if named:
        if any(not c.strip() or not col.strip() for c, _, col in pairs):
            raise UsageError(f"--score {','.join(items)}: write CLASS=COLUMN, e.g. --score cat=p_cat,dog=p_dog")
        return {c.strip(): col.strip() for c, _, col in pairs}
    return items[0] if len(items) == 1 else items


def _print_estimate(est: Any) -> None:
    def cell(value: float | None) -> str:
        return "" if value is None or value != value else f"{value:.4f}"

    rows = [
        [
            f"{c.start:,}-{c.end:,}",
            cell(c.estimated),
            f"{cell(c.lower)} - {cell(c.upper)}",
            cell(c.realised),
            styled("[red]alert[/]" if c.alert else "."),
        ]
        for c in est.chunks
    ]
    title = f"estimated {est.metric} per chunk of {est.chunk_size:,} rows"
    console.print(table(title, ["rows", "estimated", "sampling band", "realised", "alert"], rows))
    worse = "below" if est.kind == "classification" else "above"
    realised = "" if est.realised is None else f"; realised {cell(est.realised)}"
    calibrated = "" if est.calibrated is None else f"; scores {'calibrated' if est.calibrated else 'used as given'}"
    console.print(
        f"whole window: estimated {cell(est.estimated)} ({cell(est.lower)} - {cell(est.upper)}){realised}; "
        f"reference {cell(est.reference)}; alert {worse} {cell(est.threshold)}{calibrated}",
        highlight=False,
        soft_wrap=True,
        markup=False,
    )
    colour, verdict = ("red", "performance alert") if est.alert else ("green", "no alert")
    console.print(f"[{colour}]{verdict}[/]", highlight=False)


@quality_app.command("estimate")
@parameters_as_flags(
    {
        "target": "--target",
        "metric": "--metric",
        "score": "--score",
        "prediction": "--prediction",
        "chunk_size": "--chunk-size",
        "features": "--features",
    }
)
def estimate_command(
    reference: RefArg,
    current: CurArg,
    target: Annotated[
        str,
        typer.Option(
            "--target",
            help="Label column: every reference row has one; current's, where given, give the realised values.",
        ),
    ],
    metric: Annotated[
        str,
        typer.Option(
            "--metric", help="roc_auc, f1, precision, recall or accuracy (classifier); mae, mse or rmse (regressor)."
        ),
    ],
    score: Annotated[
        list[str] | None,
        typer.Option(
            "--score",
            help="Classifier probabilities: the column of class 1 (labels 0/1), or one column per class, in the "
            "sorted order of the labels (--score p_a,p_b,p_c), or named (--score a=p_a,b=p_b,c=p_c); repeatable.",
        ),
    ] = None,
    prediction: Annotated[
        str | None,
        typer.Option(
            "--prediction", help="Predicted class (default: score >= 0.5, or the largest), or the regressor's output."
        ),
    ] = None,
    features: Annotated[
        list[str] | None,
        typer.Option(
            "--features",
            help="Regressor: columns the loss model learns from, comma-separated (default: "
            "every shared column but target and prediction; leave out ids and timestamps).",
        ),
    ] = None,
    chunk_size: Annotated[
        int | None, typer.Option("--chunk-size", help="Rows per chunk (default: a tenth of the current data).")
    ] = None,
    out: Annotated[Path | None, typer.Option("--out", help="Write a plot per chunk here (.png, .svg or .pdf).")] = None,
    fail_on_alert: Annotated[
        bool, typer.Option("--fail-on-alert", help="Exit 1 when the estimate crosses the threshold.")
    ] = False,
    json_out: JsonOpt = False,
) -> None:
    """Estimate a model's performance on CURRENT without its labels (CBPE for classifiers, DLE for regressors).

    Fitted on REFERENCE, which has the labels; assumes only the inputs shifted, not what they mean.
    """
    from gpufleet.quality.estimate import estimate_performance, plot_performance
    from gpufleet.tables import read_table

    if out is not None:
        check_plot_file(check_path_name(out, "--out"), "--out")
    ref, cur = read_table(reference), read_table(current)
    est = estimate_performance(
        ref,
        cur,
        target=target,
        metric=metric,
        score=split_scores(score),
        prediction=prediction,
        chunk_size=chunk_size,
        features=split_columns(features),
    )
    if out is not None:
        plot_performance(est, out, title=f"{est.metric}: {current.name} against {reference.name}")
    if json_out:
        emit_json({**est.to_dict(), "reference_file": str(reference), "current_file": str(current), "plot": _path(out)})
    else:
        _print_estimate(est)
        if out is not None:
            console.print(f"plot: {out}", highlight=False, soft_wrap=True, markup=False)
    if fail_on_alert and est.alert:
        raise typer.Exit(1)


OutOpt = Annotated[Path | None, typer.Option("--out", help="Write a PNG of both monitors' scores here.")]
SeedOpt = Annotated[int, typer.Option("--seed", help="Seed of the synthetic data.")]


@quality_app.command("lab-seasonal")
def seasonal_lab_command(json_out: JsonOpt = False, out: OutOpt = None, seed: SeedOpt = 0) -> None:
    """Lab: a weekly cycle fools a yesterday-vs-today monitor; season-matched references and a placebo band do not."""
    from gpufleet.demos.quality_labs import plot_seasonal_lab, seasonal_lab

    if out is not None:
        check_plot_file(check_path_name(out, "--out"), "--out")
    lab = seasonal_lab(seed)
    if out is not None:
        try:
            plot_seasonal_lab(lab, out)
        except OSError as err:
            raise UsageError(f"--out {out}: cannot write it ({err.strerror}); pick a writable path") from err
    if json_out:
        emit_json({**lab.to_dict(), "seed": seed, "png": _path(out)})
        return

    def cell(verdict: dict[str, Any]) -> Text:
        mark = "[red]ALARM[/]" if verdict["alarm"] else "."
        return styled(f"{mark} {verdict['score']:.2f}")

    rows = [
        [
            d["label"],
            "yes" if d["shifted"] else "",
            cell(d["naive"]),
            cell(d["seasonal"]),
            ", ".join(d["seasonal"]["flagged"]),
        ]
        for d in lab.days
    ]
    head = ["day", "real shift", "naive (score)", "seasonal (score)", "seasonal flagged"]
    console.print(table("alarms per day (score > 1: a column crossed its line)", head, rows))
    fa, det = lab.false_alarms, lab.detected
    console.print(
        f"false alarms before the shift: naive {fa['naive']}, seasonal {fa['seasonal']}; "
        f"shift detected on its first day: naive {'yes' if det['naive'] else 'no'}, "
        f"seasonal {'yes' if det['seasonal'] else 'no'}; shifted days alarmed: naive "
        f"{lab.shifted_days_alarmed['naive']}, seasonal {lab.shifted_days_alarmed['seasonal']} "
        f"of {sum(d['shifted'] for d in lab.days)}",
        highlight=False,
        soft_wrap=True,
    )
    if out is not None:
        console.print(f"plot: {out}", highlight=False, soft_wrap=True, markup=False)


@quality_app.command("lab-embeddings")
def embedding_lab_command(json_out: JsonOpt = False, seed: SeedOpt = 0) -> None:
    """Lab: MMD on all-MiniLM-L6-v2 embeddings of a query stream: a topic shift alarms, a resample does not."""
    from gpufleet.demos.quality_labs import embedding_lab
    from gpufleet.quality.embeddings import load_encoder

    lab = embedding_lab(load_encoder(), seed=seed)
    if json_out:
        emit_json({**lab.to_dict(), "seed": seed})
        return
    rows = []
    for name, res in (("same distribution", lab.same), ("topic shift", lab.shift)):
        retrieval = f"{res.retrieval_reference:.3f} -> {res.retrieval_current:.3f}" if res.retrieval_current else ""
        verdict = styled("[red]drift[/]" if res.drift else "no drift")
        rows.append([name, res.mmd2, res.p_value, res.mean_shift, retrieval, verdict])
    head = ["comparison", "MMD^2", "p-value", "mean shift", "retrieval", "verdict"]
    title = f"{lab.queries_per_side} queries a side, {lab.documents} documents, {lab.shift.estimator} MMD"
    console.print(table(title, head, rows))
    for kind, texts in lab.examples.items():
        console.print(f"{kind}: " + " | ".join(texts), highlight=False, soft_wrap=True, markup=False)


@quality_app.command("lab-policy")
def policy_lab_command(
    json_out: JsonOpt = False,
    seed: SeedOpt = 0,
    label_delay: Annotated[
        int, typer.Option("--label-delay", min=1, max=20, help="Windows before a window's labels arrive.")
    ] = 3,
) -> None:
    """Lab: retrains and realised AUC of a drift-only policy against one deciding on estimated performance."""
    from gpufleet.demos.policy_lab import policy_lab
    from gpufleet.fmt import finite_json

    lab = policy_lab(seed, label_delay=label_delay).to_dict()
    if json_out:
        emit_json(finite_json({**lab, "seed": seed}))
        return
    rows = []
    for name, stream in lab["streams"].items():
        for mode, run in stream["policies"].items():
            after = ", ".join(stream["windows"][i] for i in run["retrained_after"])
            rows.append(
                [name, mode, run["retrains"], run["alerts"], run["realised_mean"], run["realised_min"], after or "-"]
            )
    head = ["stream", "policy", "retrains", "alerts", "realised AUC mean", "min", "retrained after"]
    console.print(table(f"drift-only against performance policy (labels {label_delay} windows late)", head, rows))


monitor_app = typer.Typer(
    help="The standing monitor: each new window's drift, the policy's decision, the retraining job.",
    no_args_is_help=True,
)
quality_app.add_typer(monitor_app, name="monitor")
ConfigArg = Annotated[
    Path, typer.Argument(metavar="CONFIG", help="Monitor file (YAML): the models, their data and policy.")
]
SAMPLE_WINDOWS = (("window-1.csv", 12, 0.0), ("window-2.csv", 13, 1.0), ("window-3.csv", 14, 1.0))
"""The sample windows: (file, seed, drift): one like the reference, then two shifted ones."""


@monitor_app.command("run")
def monitor_run_command(
    config: ConfigArg,
    once: Annotated[
        bool, typer.Option("--once", help="Run one round, print what it checked, exit (1 if a check failed).")
    ] = False,
    json_out: Annotated[
        bool, typer.Option("--json", help='Print {"rounds": [...]}: once, or one such line per round.')
    ] = False,
) -> None:
    """Check every new window of the models in CONFIG: drift, decision, retraining job; a round every `every`.

    Without --once it runs until Ctrl-C (or SIGTERM), which lets the round in progress finish.
    """
    import signal
    import threading

    from gpufleet.quality.standing import StandingMonitor, load_monitor_config

    monitor = StandingMonitor(load_monitor_config(check_path_name(config, "CONFIG")), gpufleet_home())
    if once:
        checks = monitor.run_round()
        sent = monitor.deliver()
        if json_out:
            emit_json({"rounds": [_round(checks)]} | ({"webhook": sent.to_dict()} if sent is not None else {}))
        else:
            _print_checks(checks, len(monitor.config.models))
            if sent is not None and (sent.sent or sent.busy):
                console.print(_delivery_line(sent), highlight=False, markup=False)
        if any(c["error"] for c in checks):
            raise typer.Exit(1)
        return
    stop = threading.Event()

    def on_round(checks: list[dict[str, Any]]) -> None:
        if json_out:
            _json_line({"rounds": [_round(checks)]})
        elif checks:
            _print_checks(checks, len(monitor.config.models))

    previous = {sig: signal.signal(sig, lambda *_: stop.set()) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        if not json_out:
            every = duration(monitor.config.every)
            console.print(f"monitoring {len(monitor.config.models)} model(s), a round every {every}; Ctrl-C stops")
        monitor.run_forever(stop, on_round)
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    if not json_out:
        console.print("stopped")


def _round(checks: list[dict[str, Any]]) -> dict[str, Any]:
    import time

    return {"at": time.time(), "checks": checks}


def _json_line(obj: Any) -> None:
    """``obj`` as one line of JSON: the rounds of a monitor that keeps running are JSON Lines."""
    import json
    import sys

    from gpufleet.fmt import finite_json

    sys.stdout.write(json.dumps(finite_json(obj), allow_nan=False, default=str) + "\n")
    sys.stdout.flush()


def _print_checks(checks: list[dict[str, Any]], models: int) -> None:
    if not checks:
        console.print(f"nothing new: no window to check for {models} model(s)")
        return
    action_cell = {"pass": "[green]pass[/]", "alert": "[yellow]alert[/]", "retrain": "[red]retrain[/]"}
    rows = []
    for c in checks:
        job = c["retrain_job"]
        job_cell = "" if job is None else f"#{job}" + ("" if c["retrain_submitted"] else " (already submitted)")
        reasons = "; ".join(c["reasons"]) + (f"{'; ' if c['reasons'] else ''}{c['error']}" if c["error"] else "")
        action = action_cell.get(c["action"] or "", "[red]error[/]")
        rows.append([c["model"], c["window"] or "-", styled(action), reasons, job_cell])
    console.print(table(None, ["model", "window", "action", "reasons", "retrain job"], rows))


@monitor_app.command("history")
def monitor_history_command(json_out: JsonOpt = False) -> None:
    """What the standing monitor recorded in $GPUFLEET_HOME: each window's drift and decision, the retraining jobs."""
    from gpufleet.quality.standing import read_history

    home = gpufleet_home()
    history = read_history(home)
    if json_out:
        emit_json({"home": str(home), "models": history})
        return
    if not history:
        console.print(f"no standing monitor has checked a window in {home}", highlight=False, markup=False)
        return
    for model, h in history.items():
        decided = {(d["window"], d["at"]): d for d in h["decisions"]}
        jobs = {r.get("key"): r.get("job_id") for r in h["retrains"] if r.get("job_id") is not None}
        rows = []
        for line in h["drift"]:
            window, at = str(line.get("window")), line.get("at")
            decision = decided.get((window, at)) if isinstance(at, int | float) else None
            drifted = line.get("dataset_drift")
            drift = "error" if line.get("error") else "yes" if drifted is True else "no" if drifted is False else "?"
            why = line.get("error") or ("; ".join(decision["reasons"]) if decision else "")
            job = jobs.get(f"{model}:{window}")
            rows.append(
                [
                    window,
                    _when(at),
                    drift,
                    line.get("share"),
                    decision["action"] if decision else "",
                    why,
                    f"#{job}" if job is not None else "",
                ]
            )
        head = ["window", "checked (UTC)", "drift", "share", "action", "reasons", "retrain job"]
        console.print(table(f"monitor history of {model}", head, rows))
        if h.get("performance"):
            perf = [
                [p["window"], p["estimated"], p["lower"], p["upper"], p["threshold"], p["realised"], p["error"] or ""]
                for p in h["performance"]
            ]
            head = ["window", "estimated", "band low", "band high", "threshold", "realised", "error"]
            console.print(table(f"{h['performance'][-1]['metric']} of {model}, estimated and realised", head, perf))
        for r in h["retrains"]:
            if r.get("job_id") is None:
                console.print(f"retrain for key {r.get('key')!r} failed: {r.get('error')}", markup=False)


def _when(at: Any) -> str:
    if not isinstance(at, int | float) or isinstance(at, bool):
        return "?"
    try:
        return datetime.fromtimestamp(at, UTC).strftime("%Y-%m-%d %H:%M:%S")
    except (OverflowError, OSError, ValueError):
        return "?"


@monitor_app.command("sample-data")
def monitor_sample_data_command(
    folder: Annotated[Path, typer.Argument(metavar="DIR", help="Folder to write the tables into.")],
) -> None:
    """Write synthetic tables for examples/monitor.yaml: DIR/reference.csv and three windows in DIR/windows/.

    The first window is drawn like the reference; the next two are shifted (x0's mean, x1's spread, the
    segment mix), so with persistence 2 the third asks for a retrain.
    """
    from gpufleet.workloads.tabular import make_dataset

    check_path_name(folder, "DIR")
    targets = [folder / "reference.csv", *(folder / "windows" / name for name, _, _ in SAMPLE_WINDOWS)]
    there = [t for t in targets if t.exists()]
    if there:
        raise UsageError(f"{there[0]} exists: give a new folder (a window rewritten would be checked again)")
    try:
        (folder / "windows").mkdir(parents=True, exist_ok=True)
        make_dataset(4000, seed=11).to_csv(targets[0], index=False)
        for target, (_, seed, drift) in zip(targets[1:], SAMPLE_WINDOWS, strict=True):
            make_dataset(1000, seed=seed, drift=drift).to_csv(target, index=False)
    except OSError as err:
        raise UsageError(f"cannot write {folder}: {err.strerror}") from None
    console.print(f"wrote {targets[0]} and {len(SAMPLE_WINDOWS)} windows in {folder / 'windows'}", markup=False)


webhook_app = typer.Typer(
    help="The webhook outbox: each alert the monitor sent, its attempts; send it, or send it again.",
    no_args_is_help=True,
)
quality_app.add_typer(webhook_app, name="webhook")


def _outbox(**options: Any) -> Any:
    from gpufleet.quality.outbox import Outbox, outbox_dir

    return Outbox(outbox_dir(gpufleet_home()), **options)


@webhook_app.command("log")
def webhook_log_command(
    limit: Annotated[int, typer.Option("--limit", help="Show the N events queued last.", min=1)] = 50,
    json_out: JsonOpt = False,
) -> None:
    """Each event in the outbox: key, model, action, state (pending, delivered, failed), attempts, answer, next try."""
    outbox = _outbox()
    events = outbox.events()
    counts = {state: sum(e.state == state for e in events) for state in ("pending", "delivered", "failed")}
    shown = events[-limit:]
    if json_out:
        emit_json({"outbox": str(outbox.path), "counts": counts, "events": [e.to_dict() for e in shown]})
        return
    if not events:
        console.print(f"the outbox {outbox.path} is empty", highlight=False, markup=False)
        return
    rows = [_outbox_row(e.to_dict()) for e in shown]
    title = ", ".join(f"{n} {state}" for state, n in counts.items()) + f" ({outbox.path})"
    console.print(table(title, ["key", "model", "action", "state", "attempts", "last answer", "next try (UTC)"], rows))


def _outbox_row(d: dict[str, Any]) -> list[Any]:
    state = {"pending": "[yellow]pending[/]", "delivered": "[green]delivered[/]", "failed": "[red]failed[/]"}
    answer = " ".join(str(x) for x in (d["last_status"], d["last_error"]) if x is not None)
    next_try = "" if d["next_at"] is None else _when(d["next_at"])
    return [d["key"], d["model"], d["action"], styled(state[d["state"]]), d["attempts"], answer, next_try]


@webhook_app.command("replay")
def webhook_replay_command(
    key: Annotated[str | None, typer.Argument(metavar="[KEY]", help="The event's key (see `webhook log`).")] = None,
    failed: Annotated[bool, typer.Option("--failed", help="Queue every event that failed for good.")] = False,
    json_out: JsonOpt = False,
) -> None:
    """Queue an event again, due now, its backoff restarted; it keeps its key, so a receiver acts on it once."""
    if (key is None) == (not failed):
        raise UsageError("give one event's KEY or --failed (every failed event), not both and not neither")
    outbox = _outbox()
    keys = outbox.replay_failed() if failed else [outbox.replay(key or "").key]
    if json_out:
        emit_json({"replayed": keys})
    else:
        console.print(f"queued {len(keys)} event(s) again: {', '.join(keys) or 'none failed'}", markup=False)


@webhook_app.command("send")
def webhook_send_command(
    forever: Annotated[
        bool, typer.Option("--forever", help="Keep sending as events fall due, until Ctrl-C or SIGTERM.")
    ] = False,
    base: Annotated[float, typer.Option("--backoff-base", help="Seconds after the first failed attempt.")] = 2.0,
    cap: Annotated[float, typer.Option("--backoff-cap", help="Longest wait between two attempts, in seconds.")] = 600.0,
    attempts: Annotated[int, typer.Option("--max-attempts", help="Attempts before an event fails.")] = 30,
    json_out: Annotated[
        bool, typer.Option("--json", help="Print what the pass did; with --forever, one such line per pass.")
    ] = False,
) -> None:
    """Send the outbox's due events (signed, retried with backoff); exit 1 if one failed for good in this pass."""
    import signal
    import threading

    from gpufleet.quality.outbox import RetryPolicy

    outbox = _outbox(policy=RetryPolicy(base_s=base, cap_s=cap, max_attempts=attempts))
    if not forever:
        report = outbox.deliver_due(block=True)
        if json_out:
            emit_json(report.to_dict())
        else:
            console.print(_delivery_line(report), highlight=False, markup=False)
        if report.failed:
            raise typer.Exit(1)
        return
    stop = threading.Event()

    def on_pass(report: Any) -> None:
        if json_out:
            _json_line(report.to_dict())
        else:
            console.print(_delivery_line(report), highlight=False, markup=False)

    previous = {sig: signal.signal(sig, lambda *_: stop.set()) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        outbox.run_forever(stop, on_pass=on_pass)
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def _delivery_line(report: Any) -> str:
    if report.busy:
        return "webhook: another sender is delivering the outbox now"
    parts = [f"sent {report.sent}", f"delivered {len(report.delivered)}", f"retrying {len(report.retrying)}"]
    failed = f"failed {len(report.failed)}" + (f" ({', '.join(report.failed[:5])})" if report.failed else "")
    return "webhook: " + ", ".join([*parts, failed])


__all__ = [
    "ColumnsOpt",
    "ConfigArg",
    "CorrectionOpt",
    "CurArg",
    "FailOpt",
    "HtmlOpt",
    "MaxNonFiniteOpt",
    "MethodOpt",
    "ModelArg",
    "OutOpt",
    "RefArg",
    "SeedOpt",
    "ThresholdOpt",
    "demo_command",
    "doc_command",
    "drift_command",
    "embedding_lab_command",
    "estimate_command",
    "monitor_app",
    "monitor_history_command",
    "monitor_run_command",
    "monitor_sample_data_command",
    "quality_app",
    "seasonal_lab_command",
    "split_assignments",
    "split_columns",
    "webhook_app",
    "webhook_log_command",
    "webhook_replay_command",
    "webhook_send_command",
]
