"""``gpufleet quality doc``: the technical documentation of a high-risk AI system, from the registry.

Article 11 of the AI Act (Regulation (EU) 2024/1689) requires it before a high-risk system is
placed on the market, with the content of its Annex IV; after Regulation (EU) 2026/1744 the
high-risk obligations apply from **2 December 2027** for the systems of Annex III and from
**2 August 2028** for those of Annex I (AI in products under Union harmonisation legislation).

gpufleet knows part of it for certain, because it wrote it: the versions and their metrics, the
datasets each was trained on with their sha256 digests (the runs' MLflow inputs), the monitoring
and retraining plan (policy thresholds, validation gate, canary guard), and the change history
(the alias history: who promoted or rolled back which version, when and why). The rest (the
provider, risk management, standards, declaration of conformity) is marked for the provider to
complete: an honest gap is better than generated boilerplate. Annex IV's nine points give the
headings, so a reviewer finds each requirement where the regulation puts it.

``collect`` reads the registry (I/O); ``render`` is a pure function of what it collected.
"""

from __future__ import annotations

import json
import platform
from dataclasses import dataclass, field
from datetime import UTC, date, datetime
from importlib import metadata
from typing import Any

from gpufleet.fmt import markdown_table
from gpufleet.quality.registry import AliasEvent, Registry

ANNEX_III_FROM = date(2027, 12, 2)
ANNEX_I_FROM = date(2028, 8, 2)
TODO = "**Provider to complete.**"


@dataclass(frozen=True, slots=True)
class VersionFacts:
    version: str
    created: float
    aliases: tuple[str, ...]
    run_id: str | None
    params: dict[str, str]
    metrics: dict[str, float]
    datasets: list[dict[str, Any]]
    status: str
    """``serving``, ``rolled back: why``, ``rejected: why`` or ``registered``."""
    evaluation: dict[str, str] = field(default_factory=dict)
    """The gate's and the live guard's verdicts, as recorded on the version's tags."""


@dataclass(frozen=True, slots=True)
class DocInputs:
    model: str
    tracking_uri: str
    purpose: str | None
    versions: list[VersionFacts]
    history: list[AliasEvent]
    plan: dict[str, Any] = field(default_factory=dict)
    """Policy, gate and guard as recorded on the registered model's tags."""
    software: dict[str, str] = field(default_factory=dict)
    generated: datetime = field(default_factory=lambda: datetime.now(UTC))


def collect(registry: Registry, model: str, purpose: str | None = None) -> DocInputs:
    """Everything the registry knows about ``model`` (a UsageError when it is not registered)."""
    aliases = registry.aliases(model)
    tags = registry.model_tags(model)
    versions = []
    for v in registry.versions(model):
        run = registry.run(v.run_id) if v.run_id else None
        status = "registered"
        if "gpufleet.rolled_back" in v.tags:
            status = f"rolled back: {v.tags['gpufleet.rolled_back']}"
        elif "gpufleet.rejected" in v.tags:
            status = f"rejected: {v.tags['gpufleet.rejected']}"
        names = tuple(sorted(a for a, ver in aliases.items() if ver == str(v.version)))
        versions.append(
            VersionFacts(
                version=str(v.version),
                created=v.creation_timestamp / 1000,
                aliases=names,
                run_id=v.run_id,
                params=dict(run.data.params) if run else {},
                metrics=dict(run.data.metrics) if run else {},
                datasets=registry.run_inputs(v.run_id) if v.run_id else [],
                status="serving" if "champion" in names else status,
                evaluation={
                    k: v.tags[f"gpufleet.{k}"] for k in ("validation", "live_guard") if f"gpufleet.{k}" in v.tags
                },
            )
        )
    plan = {}
    for key in ("policy", "gate", "guard"):
        raw = tags.get(f"gpufleet.{key}")
        if raw:
            try:
                plan[key] = json.loads(raw)
            except ValueError:
                plan[key] = raw
    software = {"python": platform.python_version()}
    for dist in ("gpufleet", "mlflow", "torch", "numpy", "pandas"):
        try:
            software[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            continue
    events, _ = registry.history(model)
    return DocInputs(
        model=model,
        tracking_uri=registry.uri,
        purpose=purpose or tags.get("gpufleet.intended_purpose"),
        versions=versions,
        history=events,
        plan=plan,
        software=software,
    )


def _duration(seconds: Any) -> str:
    if not isinstance(seconds, (int, float)):
        return "never"
    if seconds >= 86400:
        return f"{seconds / 86400:g} days"
    return f"{seconds / 3600:g} hours" if seconds >= 3600 else f"{seconds:g} s"


def _source(raw: str) -> str:
    """A dataset source as MLflow stores it (JSON with a ``uri``), shown as the URI."""
    try:
        data = json.loads(raw)
    except ValueError:
        return raw
    return str(data.get("uri", raw)) if isinstance(data, dict) else raw


def _day(d: date) -> str:
    return f"{d.day} {d:%B %Y}"


def _when(ts: float) -> str:
    return datetime.fromtimestamp(ts, UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def _cell(value: Any) -> str:
    text = "" if value is None else f"{value:.4g}" if isinstance(value, float) else str(value)
    return text.replace("|", "\\|").replace("\n", " ")


def _table(head: list[str], rows: list[list[Any]]) -> list[str]:
    if not rows:
        return ["_None recorded._", ""]
    return [*markdown_table(head, ([_cell(v) for v in row] for row in rows)), ""]


def _plan_lines(plan: dict[str, Any]) -> list[str]:
    policy, gate, guard = plan.get("policy"), plan.get("gate"), plan.get("guard")
    lines = []
    if isinstance(policy, dict):
        lines += [
            "Retraining policy (`gpufleet.quality.policy`), decided at the close of every monitoring window "
            "and logged with its evidence:",
            "",
            f"- drift: retrain when dataset drift persists over {policy.get('persistence')} consecutive windows; "
            f"alert when {policy.get('alert_share', 0):.0%} or more of the columns drift;",
            f"- performance (once labels arrive): alert on a metric drop over {policy.get('alert_drop')}, "
            f"retrain over {policy.get('retrain_drop')} below the value at validation;",
            f"- calendar: retrain a model older than {_duration(policy.get('max_model_age_s'))};",
            f"- cool-down: no second retrain within {_duration(policy.get('cooldown_s'))} of the last one.",
            "",
        ]
    else:
        lines += [f"Retraining policy: none recorded on the registered model. {TODO}", ""]
    if isinstance(gate, dict):
        lines.append(
            f"Validation gate before any traffic: holdout {gate.get('metric')} at least {gate.get('floor')} and no "
            f"worse than the champion's minus {gate.get('tolerance')}."
        )
    if isinstance(guard, dict):
        lines.append(
            f"Canary guard on live traffic: {guard.get('share', 0):.0%} of requests to the new version; roll back "
            f"when its served accuracy is below {guard.get('floor')} or worse than the current version's by more "
            f"than {guard.get('tolerance')} (one-sided z = {guard.get('z')}, at least {guard.get('min_requests')} "
            "labelled requests per arm)."
        )
    lines += [
        "",
        "Alerts reach the retraining service through an HMAC-SHA256-signed webhook (replay window, idempotency "
        "keys); a retrain is a preemptible, checkpointed job on the GPU fleet; the result is registered as "
        "`@challenger` and only serves after the gate and the guard. A rollback moves `@champion` back to "
        "`@previous` and is recorded in the change history (section 6).",
        "",
    ]
    return lines


def render(doc: DocInputs) -> str:
    """The Markdown document (pure)."""
    champion = next((v for v in doc.versions if "champion" in v.aliases), None)
    out = [
        f"# Technical documentation: `{doc.model}`",
        "",
        "Prepared under Article 11 and Annex IV of Regulation (EU) 2024/1689 (AI Act). After Regulation "
        f"(EU) 2026/1744, the obligations for high-risk AI systems apply from **{_day(ANNEX_III_FROM)}** "
        f"for the systems listed in Annex III and from **{_day(ANNEX_I_FROM)}** for those covered by Annex I.",
        "",
        f"Generated by gpufleet on {doc.generated:%Y-%m-%d %H:%M UTC} from the model registry at "
        f"`{doc.tracking_uri}`. Sections marked {TODO} hold what the registry cannot know.",
        "",
        "## 1. General description of the AI system",
        "",
        f"- **Intended purpose:** {doc.purpose or TODO}",
        f"- **Provider:** {TODO}",
        f"- **Version in service:** {'version ' + champion.version + ' (`@champion`)' if champion else 'none'}",
        f"- **Software versions:** {', '.join(f'{k} {v}' for k, v in doc.software.items())}",
        "- **Form:** an MLflow pyfunc model (weights and JSON, no pickled code), served by loading "
        f"`models:/{doc.model}@champion`.",
        f"- **Hardware, user interface, instructions for use:** {TODO}",
        "",
        "## 2. Elements of the system and its development",
        "",
        "### 2(d) Data: lineage of every version",
        "",
        "Each dataset is identified by the sha256 of its file (MLflow keeps the first 32 hex digits as the "
        "dataset digest); `sha256sum FILE` verifies it.",
        "",
    ]
    rows = [
        [v.version, d["name"], d["context"], d.get("rows"), d["sha256"] or d["digest"], _source(d["source"])]
        for v in doc.versions
        for d in v.datasets
    ]
    out += _table(["version", "dataset", "use", "rows", "sha256", "source"], rows)
    out += ["### 2(a-c, g) Training and validation of every version", ""]
    keys = sorted({k for v in doc.versions for k in v.metrics if k.startswith("holdout_")})
    out += _table(
        ["version", "created", "status", "params", *keys],
        [
            [
                v.version,
                _when(v.created),
                v.status,
                ", ".join(f"{k}={p}" for k, p in sorted(v.params.items())),
                *[v.metrics.get(k) for k in keys],
            ]
            for v in doc.versions
        ],
    )
    out += _table(
        ["version", "offline gate (holdout)", "live guard (shadow or canary)"],
        [
            [v.version, v.evaluation.get("validation", "-"), v.evaluation.get("live_guard", "-")]
            for v in doc.versions
            if v.evaluation
        ],
    )
    out += [f"Human oversight measures (Article 14) and cybersecurity measures: {TODO}", ""]
    out += ["## 3. Monitoring, functioning and control", ""]
    if champion:
        figures = ", ".join(
            f"{k.removeprefix('holdout_')} {v:.4g}"
            for k, v in sorted(champion.metrics.items())
            if k.startswith("holdout_")
        )
        out.append(f"Version {champion.version} measured on its holdout: {figures or 'no metrics recorded'}.")
    out += [
        "",
        "Its accuracy holds for data distributed like its training data: covariate drift is watched column by "
        "column (Wasserstein, Jensen-Shannon, KS, chi-squared, PSI), concept drift through the metric once labels "
        f"arrive. Performance for specific groups of persons and foreseeable misuse: {TODO}",
        "",
        "## 4. Appropriateness of the performance metrics",
        "",
        "AUC judges the ranking of scores, independent of a threshold: it is the offline gate. Accuracy of the "
        "served decision, once labels arrive, judges what users receive: it guards live traffic, because a model "
        "whose scores are shifted keeps its AUC and still decides wrong. Log loss and Brier score measure calibration.",
        "",
        "## 5. Risk management system (Article 9)",
        "",
        f"{TODO} The validation gate, the canary guard and the rollback (sections 6 and 9) are risk controls to cite.",
        "",
        "## 6. Changes through the lifecycle",
        "",
        "Every move of an alias, append-only (a JSONL file beside the registry and MLflow version tags):",
        "",
    ]
    out += _table(
        ["#", "when", "who", "action", "alias", "from", "to", "why"],
        [
            [e.seq, _when(e.when), e.who, e.action, e.alias, e.from_version or "-", e.to_version or "-", e.why]
            for e in doc.history
        ],
    )
    out += [
        "## 7. Harmonised standards applied",
        "",
        TODO,
        "",
        "## 8. EU declaration of conformity (Article 47)",
        "",
        TODO,
        "",
        "## 9. Post-market monitoring plan (Article 72)",
        "",
        *_plan_lines(doc.plan),
    ]
    return "\n".join(out).rstrip() + "\n"


__all__ = ["ANNEX_III_FROM", "ANNEX_I_FROM", "TODO", "DocInputs", "VersionFacts", "collect", "render"]
