"""Champion and challenger: the offline gate, shadow and canary verdicts, and the alias moves.

Three stages, each a pure function over numbers the caller measured:

1. **validate** (offline): the challenger's holdout metric must clear an absolute ``floor`` and be
   no worse than the champion's minus ``tolerance``. It judges ranking (AUC by default).
2. **shadow** (both predict every live request, only the champion serves) or **canary** (a
   sticky ``share`` of requests is served by the new version, the rest by the old one): the
   guard judges the *served decision* (accuracy at the threshold, once labels arrive), which an
   AUC gate cannot see: a model whose scores are shifted keeps its ranking and decides wrong.
   The guard is a non-inferiority test on a rate: with ``d`` the difference new - old and ``se``
   its standard error (paired: the old version also scores the requests the new one serves),
   promote when ``d - z*se > -tolerance``, roll back (reject, in shadow) when
   ``d + z*se < -tolerance`` or the new rate is under ``floor``, and extend the stage otherwise.
3. **promote** moves ``@champion`` to the new version and ``@previous`` to the old champion;
   **rollback** moves ``@champion`` back to ``@previous`` and drops ``@previous`` (a second
   rollback would otherwise swap back to the version just rolled back). A canary runs as a
   provisional promotion, as blue/green deployments with canary traffic shifting do: the router
   serves ``@champion`` to the canary share and ``@previous`` to the rest, and a failed guard
   is a real rollback of the aliases.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

import numpy as np
from numpy.typing import NDArray

from gpufleet.errors import Conflict, UsageError

CHAMPION, CHALLENGER, PREVIOUS = "champion", "challenger", "previous"
Action = Literal["pass", "reject", "promote", "rollback", "extend"]


@dataclass(frozen=True, kw_only=True, slots=True)
class Gate:
    """Offline thresholds on one holdout metric."""

    metric: str = "auc"
    tolerance: float = 0.01
    """The challenger may be this much worse than the champion (holdout noise)."""
    floor: float = 0.7
    """Absolute minimum, whatever the champion scores."""
    higher_is_better: bool = True

    def __post_init__(self) -> None:
        if self.tolerance < 0 or not math.isfinite(self.floor):
            raise UsageError(f"gate {self.metric}: tolerance must be >= 0 and floor finite")


@dataclass(frozen=True, kw_only=True, slots=True)
class Guard:
    """Online thresholds on the accuracy of served decisions."""

    tolerance: float = 0.02
    """Non-inferiority margin: the new version may be this much less accurate."""
    floor: float = 0.6
    z: float = 1.645
    """One-sided 95% by default; 0 compares point estimates."""
    min_requests: int = 200
    """Labelled requests each arm needs before any verdict."""
    share: float = 0.2
    """Canary: the share of requests the new version serves."""

    def __post_init__(self) -> None:
        if not 0 < self.share < 1 or self.tolerance < 0 or self.z < 0 or self.min_requests < 1:
            raise UsageError("guard: give 0 < share < 1, tolerance >= 0, z >= 0, min_requests >= 1")


@dataclass(frozen=True, slots=True)
class Check:
    name: str
    passed: bool
    value: float | None
    threshold: float | None
    detail: str


@dataclass(frozen=True, slots=True)
class Verdict:
    stage: Literal["validate", "shadow", "canary"]
    action: Action
    checks: tuple[Check, ...]
    numbers: dict[str, float | None] = field(default_factory=dict)

    @property
    def summary(self) -> str:
        failed = [c.detail for c in self.checks if not c.passed]
        return "; ".join(failed) if failed else "; ".join(c.detail for c in self.checks)

    def to_dict(self) -> dict[str, Any]:
        return {
            "stage": self.stage,
            "action": self.action,
            "summary": self.summary,
            "checks": [asdict(c) for c in self.checks],
            "numbers": self.numbers,
        }


def _bar(name: str, metric: str, value: float, bar: float, sign: float, what: str) -> Check:
    ok = math.isfinite(value) and sign * value >= sign * bar
    word = ("at least" if sign > 0 else "at most") if ok else ("below" if sign > 0 else "above")
    return Check(name, ok, value, bar, f"{metric} {value:.4g} is {word} {what} {bar:.4g}")


def validate(challenger: Mapping[str, float], champion: Mapping[str, float] | None, gate: Gate) -> Verdict:
    """``pass`` when the challenger clears the floor and is no worse than champion - tolerance."""
    if gate.metric not in challenger:
        raise UsageError(f"the challenger has no {gate.metric!r} metric; it has {', '.join(sorted(challenger))}")
    sign = 1.0 if gate.higher_is_better else -1.0
    value = float(challenger[gate.metric])
    checks = [_bar("floor", gate.metric, value, gate.floor, sign, "the floor")]
    numbers: dict[str, float | None] = {"challenger": value, "champion": None}
    if champion is not None and gate.metric in champion:
        base = float(champion[gate.metric])
        what = f"the champion's {base:.4g} {'-' if sign > 0 else '+'} tolerance {gate.tolerance:g} ="
        checks.append(_bar("vs_champion", gate.metric, value, base - sign * gate.tolerance, sign, what))
        numbers["champion"] = base
    return Verdict("validate", "pass" if all(c.passed for c in checks) else "reject", tuple(checks), numbers)


def route(request_ids: Sequence[str], share: float, salt: str) -> NDArray[np.bool_]:
    """Sticky canary routing: a request goes to the new version when ``sha256(salt:id) < share``.

    The same id always lands on the same side for a given salt (a user does not flip between
    models), and the split is independent of the request order.
    """
    if not 0 <= share <= 1:
        raise UsageError(f"canary share {share} must be in [0, 1]")
    cut = share * 2**64
    return np.array(
        [int.from_bytes(hashlib.sha256(f"{salt}:{rid}".encode()).digest()[:8], "big") < cut for rid in request_ids],
        dtype=bool,
    )


def _guard(
    stage: Literal["shadow", "canary"],
    new_rate: float,
    diff: float,
    se: float,
    n_new: int,
    n_old: int,
    guard: Guard,
    fail: Action,
) -> Verdict:
    low, high = diff - guard.z * se, diff + guard.z * se
    numbers: dict[str, float | None] = {
        "new_accuracy": new_rate,
        "old_accuracy": new_rate - diff,
        "diff": diff,
        "se": se,
        "low": low,
    }
    numbers |= {"high": high, "n_new": float(n_new), "n_old": float(n_old)}
    enough = Check(
        "requests",
        min(n_new, n_old) >= guard.min_requests,
        float(min(n_new, n_old)),
        float(guard.min_requests),
        f"{n_new} new / {n_old} old labelled requests (need {guard.min_requests} each)",
    )
    floor = Check(
        "floor", new_rate >= guard.floor, new_rate, guard.floor, f"accuracy {new_rate:.3f} vs floor {guard.floor}"
    )
    margin = Check(
        "non_inferior",
        low > -guard.tolerance,
        diff,
        -guard.tolerance,
        f"accuracy new - old = {diff:+.3f} (z-interval {low:+.3f}..{high:+.3f}) vs margin {-guard.tolerance:+.3f}",
    )
    checks = (enough, floor, margin)
    if not enough.passed:
        action: Action = "extend"
    elif not floor.passed or high < -guard.tolerance:
        action = fail
    elif margin.passed:
        action = "promote"
    else:
        action = "extend"
    return Verdict(stage, action, checks, numbers)


def _paired(new_correct: NDArray[np.bool_], old_correct: NDArray[np.bool_], stage: str) -> tuple[float, float, int]:
    """Mean and standard error of new - old over the same requests: the request mix cancels out."""
    if new_correct.shape != old_correct.shape:
        raise UsageError(f"{stage}: a paired guard needs both versions' verdicts on the same requests")
    n = int(new_correct.size)
    d = new_correct.astype(np.float64) - old_correct.astype(np.float64)
    se = float(d.std(ddof=1) / math.sqrt(n)) if n > 1 else math.inf
    return (float(d.mean()) if n else 0.0), se, n


def canary_verdict(
    new_correct: NDArray[np.bool_], old_correct: NDArray[np.bool_], guard: Guard, *, paired: bool = True
) -> Verdict:
    """Guard on the canary requests, served by the new version.

    ``paired`` (the default): ``old_correct`` holds the old version's verdicts on the *same*
    requests, scored but not served, and the difference is paired. Otherwise ``old_correct``
    is the control arm (other requests, served by the old version): a binomial difference of
    two independent rates, which an unlucky split of the traffic can bias by several points.
    """
    n1, n0 = int(new_correct.size), int(old_correct.size)
    p1 = float(new_correct.mean()) if n1 else 0.0
    if paired:
        diff, se, _ = _paired(new_correct, old_correct, "canary")
        return _guard("canary", p1, diff, se, n1, n0, guard, "rollback")
    p0 = float(old_correct.mean()) if n0 else 0.0
    se = math.sqrt(p1 * (1 - p1) / max(n1, 1) + p0 * (1 - p0) / max(n0, 1))
    return _guard("canary", p1, p1 - p0, se, n1, n0, guard, "rollback")


def shadow_verdict(new_correct: NDArray[np.bool_], old_correct: NDArray[np.bool_], guard: Guard) -> Verdict:
    """Guard on every live request scored by both versions, the old one serving (always paired)."""
    diff, se, n = _paired(new_correct, old_correct, "shadow")
    return _guard("shadow", float(new_correct.mean()) if n else 0.0, diff, se, n, n, guard, "reject")


# ---- alias moves -------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class AliasMove:
    """Point ``alias`` at ``to_version`` (``None``: delete it); ``from_version`` is where it pointed."""

    alias: str
    from_version: str | None
    to_version: str | None


def plan_promotion(aliases: Mapping[str, str], version: str) -> list[AliasMove]:
    """``@champion`` to ``version``, ``@previous`` to the old champion, ``@challenger`` dropped if it was this."""
    old = aliases.get(CHAMPION)
    if old == version:
        raise Conflict(f"version {version} is already @champion: nothing to promote")
    moves = [AliasMove(CHAMPION, old, version)]
    if old is not None:
        moves.append(AliasMove(PREVIOUS, aliases.get(PREVIOUS), old))
    if aliases.get(CHALLENGER) == version:
        moves.append(AliasMove(CHALLENGER, version, None))
    return moves


def plan_rollback(aliases: Mapping[str, str], model: str = "the model") -> list[AliasMove]:
    """``@champion`` back to ``@previous``, then ``@previous`` dropped."""
    previous = aliases.get(PREVIOUS)
    if previous is None:
        raise Conflict(
            f"{model} has no @previous version: nothing to roll back to (use `gpufleet registry promote` instead)"
        )
    if aliases.get(CHAMPION) == previous:
        raise Conflict(f"{model}: @champion is already @previous (version {previous})")
    return [AliasMove(CHAMPION, aliases.get(CHAMPION), previous), AliasMove(PREVIOUS, previous, None)]


def plan_rejection(aliases: Mapping[str, str], version: str) -> list[AliasMove]:
    """Drop ``@challenger`` when it points at the rejected version."""
    return [AliasMove(CHALLENGER, version, None)] if aliases.get(CHALLENGER) == version else []


__all__ = [
    "Action",
    "AliasMove",
    "Check",
    "Gate",
    "Guard",
    "Verdict",
    "canary_verdict",
    "plan_promotion",
    "plan_rejection",
    "plan_rollback",
    "route",
    "shadow_verdict",
    "validate",
]
