"""``gpufleet quality demo``: the whole decision chain, from drift to a promoted (or rolled back) model.

On synthetic tabular data (``gpufleet.workloads.tabular.make_dataset``), with real components:

1. a champion is trained on the reference data as a fleet job and registered in MLflow (first
   run only: a store that already has ``@champion`` keeps it);
2. two windows of drifted traffic arrive; each gets a drift report (``gpufleet.quality.drift``)
   and a policy decision (``policy.decide``, logged to ``decisions.jsonl``): labels arrive one
   window late, so the first window can only alert, and the second, drift having persisted and
   the late labels showing the champion's drop, asks for a retrain;
3. the decision is posted as a signed alert to the webhook (a loopback HTTP server); its
   handler submits the retraining JobSpec (preemptible, checkpointed) to the local backend. The
   same request replayed is refused (409) and submits nothing;
4. the job runs on the local fleet (``--preempt`` preempts it once: it saves, is requeued and
   resumes from its checkpoint); its output is logged to MLflow and registered ``@challenger``;
5. the challenger is validated against the champion on a labelled holdout (AUC gate), then
   put to live traffic: a canary (``@champion`` moves provisionally, 20% of requests are served
   by it, the rest by ``@previous``) or a shadow (both score everything, the champion serves);
   the guard on served accuracy promotes it, or rolls it back. ``--worse`` trains the challenger
   on labels broken by a bad join (negatives flipped positive): its ranking survives the AUC
   gate, its decisions do not survive the guard, and the aliases roll back;
6. the alias history (who, when, why, from, to) is printed.

The scheduler runs inside this process on a fresh state folder under ``$GPUFLEET_HOME``, like
``gpufleet demo``: nothing is left running and the user's own jobs are never touched.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from gpufleet.backends.local import LocalBackend, LocalScheduler
from gpufleet.errors import Timeout, UsageError
from gpufleet.jobs.events import EventKind
from gpufleet.jobs.store import Event, latest_step
from gpufleet.paths import job_dir
from gpufleet.quality import deploy
from gpufleet.quality.policy import DecisionLog, Evidence, PolicyConfig, PolicyState, decide, evidence_from_report
from gpufleet.quality.registry import CHAMPION, DatasetRef, Registry
from gpufleet.quality.webhook import (
    AlertPayload,
    AlertReceiver,
    WebhookServer,
    load_secret,
    post_alert,
    send,
    write_secret,
)
from gpufleet.spec import JobSpec, parse_spec

if TYPE_CHECKING:
    import pandas as pd

MODEL = "tabular-demo"
FEATURES = ["x0", "x1", "x2", "x3", "segment"]
WHO = "gpufleet quality demo"
WORSE_FLIP = 0.8
"""``--worse``: the share of negative training labels a broken join turns positive."""
Say = Callable[[str], None]
Describe = Callable[[Event], str | None]


@dataclass(frozen=True, kw_only=True)
class ChainConfig:
    """What the demo varies; the thresholds are the policy's and the deployment's."""

    model: str = MODEL
    mode: Literal["canary", "shadow"] = "canary"
    preempt: bool = False
    worse: bool = False
    steps: int = 300
    reference_rows: int = 4000
    window_rows: int = 2000
    live_rows: int = 3000
    policy: PolicyConfig = field(default_factory=lambda: PolicyConfig(persistence=2, cooldown_s=3600.0))
    gate: deploy.Gate = field(default_factory=deploy.Gate)
    guard: deploy.Guard = field(default_factory=deploy.Guard)


def write_data(folder: Path, cfg: ChainConfig) -> dict[str, Path]:
    """The demo's tables as Parquet: reference, two drifted windows, their union, holdout, live."""
    import pandas as pd

    from gpufleet.workloads.tabular import make_dataset

    folder.mkdir(parents=True, exist_ok=True)
    frames = {
        "reference": make_dataset(cfg.reference_rows, seed=11),
        "window-1": make_dataset(cfg.window_rows, seed=12, drift=1.0),
        "window-2": make_dataset(cfg.window_rows, seed=13, drift=1.0),
        "holdout": make_dataset(cfg.window_rows, seed=14, drift=1.0),
        "live": make_dataset(cfg.live_rows, seed=15, drift=1.0),
    }
    frames["current"] = pd.concat([frames["window-1"], frames["window-2"]], ignore_index=True)
    paths = {}
    for name, frame in frames.items():
        paths[name] = folder / f"{name}.parquet"
        frame.to_parquet(paths[name], index=False)
    return paths


def training_spec(model: str, data: Path, *, steps: int, seed: int, slow: bool, flip: float = 0.0) -> JobSpec:
    """The retraining JobSpec: preemptible (spot, requeued), checkpointed every 50 steps."""
    return parse_spec(
        {
            "name": f"train-{model.lower()}"[:63],
            "team": "quality",
            "entrypoint": "gpufleet.workloads.tabular:train",
            "args": {
                "data": str(data),
                "steps": steps,
                "seed": seed,
                "flip_negatives": flip,
                "step_seconds": 0.02 if slow else 0.0,
            },
            "resources": {"gpu_type": "cpu", "gpus": 1, "cpus": 1},
            "spot": True,
            "checkpoint": {"every_steps": 50, "keep": 2, "grace_seconds": 30},
            "max_restarts": 3,
        },
        source="quality demo",
    )


class Chain:
    """One run of the demo; ``run()`` returns the JSON-ready result."""

    def __init__(self, home: Path, cfg: ChainConfig, say: Say, describe: Describe | None = None) -> None:
        self.home, self.cfg, self.say, self.describe = home, cfg, say, describe
        self.backend = LocalBackend(home, spawn=False)
        self.scheduler = LocalScheduler(home, slots=1, poll_s=0.05)
        self.registry = Registry(home)
        self.data: dict[str, Path] = {}
        self.result: dict[str, Any] = {"home": str(home), "tracking_uri": self.registry.uri, "model": cfg.model}

    def frame(self, name: str) -> pd.DataFrame:
        import pandas as pd

        return pd.read_parquet(self.data[name])

    # ---- the fleet ---------------------------------------------------------------------------
    def follow(self, job_id: int, *, preempt_at: int | None = None) -> str:
        """Tick the scheduler until the job ends; preempt it once at ``preempt_at`` steps."""
        store, seen, preempted = self.backend.store, 0, False
        deadline = time.monotonic() + 600
        while time.monotonic() < deadline:
            self.scheduler.tick()
            events = store.events(job_id)
            for ev in events[seen:]:
                line = self.describe(ev) if self.describe else None
                if line:
                    self.say(f"    job #{job_id}: {line}")
            seen = len(events)
            job = store.job(job_id)
            if job.state in ("completed", "failed", "cancelled"):
                return job.state
            step = latest_step(store, job_id) or 0
            if preempt_at is not None and not preempted and job.state == "running" and step >= preempt_at:
                self.say(f"  [yellow]preempting job #{job_id} at step {step}[/]")
                self.backend.preempt(job_id, grace=30)
                preempted = True
            time.sleep(0.05)
        raise Timeout(f"job #{job_id} did not finish within 600s; see `gpufleet show {job_id}`")

    def submit(self, backend: LocalBackend, data: str, *, seed: int, flip: float = 0.0, slow: bool = False) -> int:
        spec = training_spec(self.cfg.model, self.data[data], steps=self.cfg.steps, seed=seed, slow=slow, flip=flip)
        return backend.submit(spec, env={"GPUFLEET_LOG_EVERY_S": "0.2"})

    def loss_curve(self, job_id: int) -> list[tuple[int, float]]:
        curve = {
            int(e.data["step"]): float(e.data["loss"]) for e in self.backend.store.events(job_id, (EventKind.STEP,))
        }
        return sorted(curve.items())

    def job_summary(self, job_id: int) -> dict[str, Any]:
        store = self.backend.store
        attempts = store.attempts(job_id)
        restores = [
            e.data.get("step") for e in store.events(job_id, (EventKind.RESTORE,)) if e.attempt and e.attempt > 1
        ]
        return {
            "id": job_id,
            "state": store.job(job_id).state,
            "attempts": len(attempts),
            "outcomes": [a.outcome for a in attempts],
            "resumed_from_step": restores[0] if restores else None,
            "folder": str(job_dir(self.home, job_id)),
        }

    # ---- the steps ---------------------------------------------------------------------------
    def champion(self) -> dict[str, Any]:
        reg, model = self.registry, self.cfg.model
        if model in reg.models() and CHAMPION in reg.aliases(model):
            version = reg.aliases(model)[CHAMPION]
            self.say(f"[bold]1. champion[/]: {model} version {version} is already @champion (kept)")
        else:
            self.say("[bold]1. champion[/]: training on the reference data (fleet job)")
            job_id = self.submit(self.backend, "reference", seed=1)
            if self.follow(job_id) != "completed":
                raise UsageError(f"the champion's training job #{job_id} failed: see `gpufleet logs {job_id}`")
            out = job_dir(self.home, job_id) / "output"
            registered = reg.log_training_run(
                model,
                out,
                datasets=[DatasetRef("reference", self.data["reference"], "training")],
                params={"job_id": job_id},
                loss_curve=self.loss_curve(job_id),
                tags={"gpufleet.job": f"job-{job_id}"},
                who=WHO,
                alias=None,
            )
            version = registered.version
            reg.promote(
                model, version, who=WHO, why=f"initial champion, trained on the reference data by job #{job_id}"
            )
            reg.set_model_tags(
                model,
                {
                    "gpufleet.intended_purpose": "Demonstration: scores synthetic applications (x0..x3, segment) "
                    "for a binary outcome; not for decisions about people.",
                    "gpufleet.policy": json.dumps(self.cfg.policy.to_dict(), sort_keys=True),
                    "gpufleet.gate": json.dumps(asdict(self.cfg.gate), sort_keys=True),
                    "gpufleet.guard": json.dumps(asdict(self.cfg.guard), sort_keys=True),
                },
            )
            self.say(f"  registered version {version} as @champion")
        v = reg.version(model, version)
        run = reg.run(v.run_id) if v.run_id else None
        baseline = float(run.data.metrics.get("holdout_auc", "nan")) if run else float("nan")
        return {"version": version, "baseline_auc": baseline, "trained_at": v.creation_timestamp / 1000}

    def windows(self, champion: dict[str, Any]) -> list[dict[str, Any]]:
        from gpufleet.quality.drift import drift_report
        from gpufleet.workloads.tabular import auc

        self.say("[bold]2. drift[/]: two windows of current traffic against the reference")
        reference = self.frame("reference")[FEATURES]
        model = self.registry.load(self.cfg.model, CHAMPION)
        log = DecisionLog(self.home / "quality" / "decisions.jsonl")
        state: PolicyState = log.state()
        out, late_labels = [], None
        for name in ("window-1", "window-2"):
            window = self.frame(name)
            report = drift_report(reference, window[FEATURES])
            ev: Evidence = evidence_from_report(
                report,
                window=name,
                at=time.time(),
                metric_name="auc",
                metric=late_labels,
                baseline_metric=champion["baseline_auc"],
                model_trained_at=champion["trained_at"],
            )
            decision = decide(self.cfg.policy, state, ev)
            log.append(decision)
            state = decision.state
            cols = ", ".join(
                f"{c.column} {c.method}={c.statistic:.3g}" for c in report.columns if c.statistic is not None
            )
            self.say(f"  {name}: {report.verdict}")
            self.say(f"    {cols}")
            self.say(f"    policy: [bold]{decision.action}[/] ({'; '.join(decision.reasons)})")
            out.append({"window": name, "report": report.to_dict(), "decision": decision.to_dict()})
            late_labels = auc(window["label"].to_numpy(), model.predict(window[FEATURES]))  # arrive next window
        return out

    def alert(self, decision: dict[str, Any]) -> dict[str, Any]:
        cfg = self.cfg
        secret_file = self.home / "quality" / "webhook.secret"
        if not secret_file.exists():
            write_secret(secret_file)
        secret = load_secret(secret_file)
        submitted: list[int] = []

        def handler(alert: AlertPayload, key: str) -> dict[str, Any]:
            if alert.model != cfg.model:
                raise UsageError(f"no retraining is configured for model {alert.model!r}")
            if alert.action != "retrain":
                return {"acted": False}
            if alert.dataset not in self.data:
                raise UsageError(f"unknown dataset {alert.dataset!r}")
            # This runs on the server's thread: it gets its own store connection.
            backend = LocalBackend(self.home, spawn=False)
            job_id = self.submit(
                backend, alert.dataset, seed=2, flip=WORSE_FLIP if cfg.worse else 0.0, slow=cfg.preempt
            )
            submitted.append(job_id)
            return {"acted": True, "job_id": job_id}

        self.say("[bold]3. alert[/]: the retrain decision, signed, to the webhook")
        payload = AlertPayload(
            model=cfg.model,
            action=decision["action"],
            window=decision["window"],
            dataset="current",
            reasons=list(decision["reasons"])[:20],
            evidence={k: v for k, v in decision["evidence"].items() if not isinstance(v, dict)},
        )
        receiver = AlertReceiver(secret, handler, journal=self.home / "quality" / "webhook-keys.jsonl")
        key = f"{cfg.model}:{decision['window']}:{int(decision['at'])}"
        with WebhookServer(receiver) as server:
            status, reply, headers = post_alert(server.url, payload, secret, idempotency_key=key)
            self.say(f"  POST {server.url} -> {status} {reply.get('reason')} {reply.get('result', '')}")
            body = json.dumps(payload.model_dump(), sort_keys=True).encode()  # what post_alert signed
            replay_status, replay = send(server.url, body, headers)
            self.say(f"  same request replayed -> {replay_status} {replay.get('reason')}")
            forged = {**headers, "Idempotency-Key": key + "-tampered"}
            forged_status, forged_reply = send(server.url, body.replace(b"retrain", b"alert"), forged)
            self.say(f"  tampered body -> {forged_status} {forged_reply.get('reason')}")
        if status != 202 or len(submitted) != 1:
            raise UsageError(f"the webhook did not accept the alert: {status} {reply.get('reason')}")
        return {
            "url": server.url,
            "idempotency_key": key,
            "accepted": {"status": status, "job_id": submitted[0]},
            "replayed": {"status": replay_status, "reason": replay.get("reason")},
            "tampered": {"status": forged_status, "reason": forged_reply.get("reason")},
            "jobs_submitted": len(submitted),
        }

    def retrain(self, job_id: int, key: str) -> dict[str, Any]:
        cfg = self.cfg
        preempt_at = cfg.steps // 3 if cfg.preempt else None
        self.say(f"[bold]4. retraining[/]: job #{job_id} on the local fleet (preemptible, checkpoint every 50 steps)")
        state = self.follow(job_id, preempt_at=preempt_at)
        summary = self.job_summary(job_id)
        if state != "completed":
            raise UsageError(f"retraining job #{job_id} ended {state}: see `gpufleet logs {job_id}`")
        registered = self.registry.log_training_run(
            cfg.model,
            job_dir(self.home, job_id) / "output",
            datasets=[
                DatasetRef("current", self.data["current"], "training"),
                DatasetRef("reference", self.data["reference"], "reference"),
            ],
            params={"job_id": job_id, "alert_key": key},
            loss_curve=self.loss_curve(job_id),
            tags={"gpufleet.job": f"job-{job_id}", "gpufleet.alert_key": key},
            who=f"{WHO} (job #{job_id})",
            why=f"retrained by job #{job_id} after alert {key}",
        )
        self.say(
            f"  job #{job_id}: {summary['attempts']} attempt(s) {summary['outcomes']}; registered version "
            f"{registered.version} as @challenger (run {registered.run_id[:8]})"
        )
        return {**summary, "version": registered.version, "run_id": registered.run_id}

    def evaluate(self, version: str) -> dict[str, Any]:
        from gpufleet.workloads.tabular import classification_metrics

        cfg, reg = self.cfg, self.registry
        holdout = self.frame("holdout")
        champ = reg.load(cfg.model, CHAMPION).predict(holdout[FEATURES])
        chall = reg.load(cfg.model, deploy.CHALLENGER).predict(holdout[FEATURES])
        m_champ = classification_metrics(holdout["label"].to_numpy(), champ)
        m_chall = classification_metrics(holdout["label"].to_numpy(), chall)
        verdict = deploy.validate(m_chall, m_champ, cfg.gate)
        reg.set_version_tags(cfg.model, version, {"gpufleet.validation": f"{verdict.action}: {verdict.summary}"})
        self.say(f"[bold]5. validation[/] on {len(holdout)} labelled holdout rows: [bold]{verdict.action}[/]")
        self.say(f"  {verdict.summary}")
        return {"champion": m_champ, "challenger": m_chall, "verdict": verdict.to_dict()}

    def live(self, version: str) -> tuple[str, dict[str, Any]]:
        cfg, reg = self.cfg, self.registry
        live = self.frame("live")
        labels = live["label"].to_numpy() >= 0.5
        ids = [f"request-{i}" for i in range(len(live))]
        old_version = reg.aliases(cfg.model)[CHAMPION]
        if cfg.mode == "shadow":
            old_p = reg.load(cfg.model, CHAMPION).predict(live[FEATURES])
            new_p = reg.load(cfg.model, deploy.CHALLENGER).predict(live[FEATURES])
            verdict = deploy.shadow_verdict((new_p >= 0.5) == labels, (old_p >= 0.5) == labels, cfg.guard)
            reg.set_version_tags(
                cfg.model, version, {"gpufleet.live_guard": f"shadow {verdict.action}: {verdict.summary}"}
            )
            self.say(f"[bold]6. shadow[/]: both versions score {len(live)} requests, version {old_version} serves")
            agreement = float(((new_p >= 0.5) == (old_p >= 0.5)).mean())
            self.say(f"  decisions agree on {agreement:.1%}; guard: [bold]{verdict.action}[/] ({verdict.summary})")
            if verdict.action == "promote":
                reg.promote(cfg.model, version, who=WHO, why=f"shadow guard passed: {verdict.summary}")
                return "promoted", {"verdict": verdict.to_dict(), "agreement": agreement}
            reg.reject(cfg.model, version, who=WHO, why=f"shadow guard: {verdict.action}: {verdict.summary}")
            return "rejected", {"verdict": verdict.to_dict(), "agreement": agreement}
        share = cfg.guard.share
        reg.apply(
            cfg.model,
            deploy.plan_promotion(reg.aliases(cfg.model), version),
            action="canary",
            who=WHO,
            why=f"canary rollout: {share:.0%} of requests to version {version}, guard on served accuracy",
        )
        canary = deploy.route(ids, share, salt=f"{cfg.model}:{version}")
        served = live[FEATURES][canary]
        new_p = reg.load(cfg.model, CHAMPION).predict(served)  # what the canary requests received
        old_p = reg.load(cfg.model, deploy.PREVIOUS).predict(served)  # scored, not served: the paired baseline
        y = labels[canary]
        verdict = deploy.canary_verdict((new_p >= 0.5) == y, (old_p >= 0.5) == y, cfg.guard)
        reg.set_version_tags(cfg.model, version, {"gpufleet.live_guard": f"canary {verdict.action}: {verdict.summary}"})
        self.say(
            f"[bold]6. canary[/]: version {version} serves {int(canary.sum())} of {len(live)} requests "
            f"(@champion, provisional), version {old_version} the rest (@previous) and scores the canary's too"
        )
        self.say(f"  guard: [bold]{verdict.action}[/] ({verdict.summary})")
        detail = {
            "verdict": verdict.to_dict(),
            "canary_requests": int(canary.sum()),
            "control_requests": int((~canary).sum()),
        }
        if verdict.action == "promote":
            reg.confirm(cfg.model, version, who=WHO, why=f"canary guard passed: {verdict.summary}")
            return "promoted", detail
        reg.rollback(cfg.model, who=WHO, why=f"canary guard {verdict.action}: {verdict.summary}")
        return "rolled_back", detail

    def deploy(self, version: str) -> str:
        """Validate, then shadow or canary: the outcome (``promoted``, ``rolled_back``, ``rejected``)."""
        res = self.result
        res["validation"] = validation = self.evaluate(version)
        if validation["verdict"]["action"] != "pass":
            why = f"validation failed: {validation['verdict']['summary']}"
            self.registry.reject(self.cfg.model, version, who=WHO, why=why)
            return "rejected"
        outcome, res["live"] = self.live(version)
        return outcome

    def run(self) -> dict[str, Any]:
        cfg, res = self.cfg, self.result
        started = time.monotonic()
        self.data = write_data(self.home / "quality" / "data", cfg)
        try:
            res["champion"] = champion = self.champion()
            res["windows"] = windows = self.windows(champion)
            last = windows[-1]["decision"]
            if last["action"] != "retrain":
                res["outcome"] = "no_retrain"
            else:
                res["webhook"] = hook = self.alert(last)
                res["job"] = job = self.retrain(hook["accepted"]["job_id"], hook["idempotency_key"])
                res["outcome"] = self.deploy(job["version"])
        finally:
            self.scheduler.shutdown()
        events, source = self.registry.history(cfg.model)
        res["aliases"] = self.registry.aliases(cfg.model)
        res["history"] = {"source": source, "events": [e.to_dict() for e in events]}
        expected = ("rolled_back", "rejected") if cfg.worse else ("promoted",)
        job = res.get("job") or {}
        resumed = not cfg.preempt or (job.get("attempts", 0) >= 2 and bool(job.get("resumed_from_step")))
        res["ok"] = res["outcome"] in expected and resumed
        res["seconds"] = round(time.monotonic() - started, 1)
        return res


def run_quality_demo(
    home: Path, cfg: ChainConfig, say: Say | None = None, describe: Describe | None = None
) -> dict[str, Any]:
    """Run the chain in ``home`` (a fresh folder); the result as one JSON-ready mapping."""
    if cfg.steps < 60:
        raise UsageError(f"steps={cfg.steps}: the demo needs at least 60 training steps")
    return Chain(home, cfg, say or (lambda _: None), describe).run()


__all__ = [
    "FEATURES",
    "MODEL",
    "WHO",
    "WORSE_FLIP",
    "Chain",
    "ChainConfig",
    "Describe",
    "Say",
    "run_quality_demo",
    "training_spec",
    "write_data",
]
