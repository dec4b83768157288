"""The cached-page renderer writes, byte for byte, what a plain one-line-at-a-time renderer writes."""

from __future__ import annotations

import math
import random
import struct
from collections.abc import Mapping, Sequence

import pytest

from gpufleet.telemetry.dcgm import CATALOGUE, DcgmField, Sample
from gpufleet.telemetry.exporter import DcgmRenderer, format_value, format_values
from gpufleet.telemetry.gpu import derive_seed
from gpufleet.telemetry.synthetic import PATTERNS, SyntheticJobConfig, synthesize


def reference_value(value: float) -> str:
    v = float(value)
    if math.isnan(v):
        return "NaN"
    if math.isinf(v):
        return "+Inf" if v > 0 else "-Inf"
    if v.is_integer() and abs(v) < 2**53:
        return str(int(v))
    return repr(v)


def reference(samples: Sequence[Sample], fields: Mapping[str, DcgmField] = CATALOGUE) -> bytes:
    """The exposition text the straightforward way: each family in one block, each line built alone."""
    families: dict[str, list[str]] = {}
    for s in samples:
        lines = families.get(s.name)
        if lines is None:
            known = fields.get(s.name)
            head = "" if known is None else f"# HELP {s.name} {known.help.replace(chr(92), chr(92) * 2)}\n"
            lines = families[s.name] = [head + ("" if known is None else f"# TYPE {s.name} {known.kind}\n")]
        escaped = (v.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") for v in s.labels.values())
        labels = ",".join(f'{k}="{v}"' for k, v in zip(s.labels, escaped, strict=True))
        lines.append(f"{s.name}{{{labels}}} " if s.labels else f"{s.name} ")
        lines.append(reference_value(s.value) + "\n")
    return "".join("".join(lines) for lines in families.values()).encode("utf-8")


ODD_VALUES = [
    *(math.nan, math.inf, -math.inf, -0.0, 0.0, 5e-324, 1e-7, 0.1, -2.5, 1e15 + 0.5),
    *(
        2.0**53 - 1,
        2.0**53,
        -(2.0**53),
        2.0**53 + 2,
        9_999_999_999_999_998.0,
        1e16,
        1e22,
        -1e300,
        1.7976931348623157e308,
    ),
    *(3, -7, 2**60, 2**53 + 1, True),
]


def fleet_round(nodes: int, gpus: int, index: int) -> list[Sample]:
    """Jobs of every pattern, their series interleaved the way a fleet's scrape concatenates them."""
    jobs = [
        synthesize(
            SyntheticJobConfig(
                pattern=PATTERNS[n % len(PATTERNS)],
                gpus=gpus,
                duration_s=8,
                seed=derive_seed(3, n),
                job=f"job-{n}",
                hostname=f"node-{n}",
            )
        )
        for n in range(nodes)
    ]
    return [s for job in jobs for s in job.samples_at(index)]


def odd_round(values: Sequence[float]) -> list[Sample]:
    quoted = {"gpu": "9", "UUID": 'GPU-"q"\\back\nline', "modelName": "A,B=C {x} % é"}
    return [
        *(Sample("DCGM_FI_DEV_GPU_TEMP", {**quoted, "i": str(i)}, v) for i, v in enumerate(values)),
        Sample("fleet_custom_total", {}, 3.0),
        Sample("DCGM_FI_DEV_FB_USED", {"UUID": "GPU-9", "gpu": "9"}, -0.125),
        Sample("DCGM_FI_DEV_FB_USED", {"gpu": "9", "UUID": "GPU-9"}, 0.125),  # the same labels in another order
    ]


def test_rounds_of_a_fleet_render_as_the_reference_does() -> None:
    renderer = DcgmRenderer()
    full = [fleet_round(9, 4, i) for i in range(6)]
    rounds: list[Sequence[Sample]] = [
        *full[:3],  # cold, then the cached page with new values
        full[3][: len(full[3]) // 2],  # half the series gone (jobs ended)
        full[4],  # back, the page planned again
        list(reversed(full[5])),  # the same series in another order
        odd_round(ODD_VALUES),
        odd_round(list(reversed(ODD_VALUES))),  # special values in a round of the same shape
        [full[0][0]],
        [],
        tuple(full[1]),
        full[2],
    ]
    for i, samples in enumerate(rounds):
        assert renderer.render(samples) == reference(samples), f"round {i}"


def test_changed_labels_are_noticed_on_a_cached_page() -> None:
    renderer = DcgmRenderer()
    samples = fleet_round(2, 2, 0)
    assert renderer.render(samples) == reference(samples)
    samples[5].labels["hpc_job"] = "moved"  # a source reusing its dicts, changed in place
    assert renderer.render(samples) == reference(samples)
    first = samples[0]
    reordered = dict(reversed(list(first.labels.items())))  # equal as a dict, another label order
    samples[0] = Sample(first.name, reordered, first.value)
    assert renderer.render(samples) == reference(samples)
    samples[-1] = Sample("DCGM_FI_DEV_XID_ERRORS", dict(samples[-1].labels), 43.0)  # another family at the end
    assert renderer.render(samples) == reference(samples)


def test_unknown_fields_and_a_custom_catalogue() -> None:
    fields = {"X": DcgmField("X", "counter", "1", "Help with a \\ backslash and 1.0")}
    samples = [Sample("X", {"gpu": str(i % 3)}, float(i)) for i in range(7)] + [Sample("Y", {}, 1.0)]
    renderer = DcgmRenderer(fields)
    for _ in range(2):
        assert renderer.render(samples) == reference(samples, fields)


@pytest.mark.parametrize("seed", [0, 1])
def test_format_values_matches_format_value(seed: int) -> None:
    rng = random.Random(seed)
    bits = [struct.unpack("<d", rng.getrandbits(64).to_bytes(8, "little"))[0] for _ in range(3000)]
    near = [float(rng.randrange(-(2**54), 2**54)) for _ in range(3000)]
    decimals = [round(rng.uniform(-1e6, 1e6), rng.randrange(0, 6)) for _ in range(3000)]
    alone = [[1.5, odd, 2.0] for odd in ODD_VALUES]  # each one in a round of ordinary values
    for values in (bits, near, decimals, ODD_VALUES, [v for v in decimals if v.is_integer()], *alone):
        assert format_values(values) == [format_value(v).encode() for v in values]
        assert [reference_value(v) for v in values] == [format_value(v) for v in values]
    assert format_values([]) == []


def test_a_round_rendered_ahead_is_served_as_is() -> None:
    renderer = DcgmRenderer()
    latest = tuple(fleet_round(2, 2, 1))
    page = renderer.render(latest)  # the sampler thread, when the round arrives
    assert renderer.render(latest) is page  # the scrape
    assert page == reference(latest)
