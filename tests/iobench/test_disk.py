"""``measure_disk`` and ``gpufleet bench disk`` against the real fio, on tiny files (8 MiB, about a second a test)."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest
from conftest import assert_refused, run_cli, service_missing

from gpufleet.cli.bench import default_disk_path
from gpufleet.errors import ParameterError, UsageError
from gpufleet.iobench import measure_disk
from gpufleet.iobench.disk import file_system_type, o_direct_works
from gpufleet.iobench.tools import FIO_HINT

SMALL = 8 << 20


@pytest.fixture(scope="module")
def fio() -> str:
    """The real fio; the tests fail under CI (it must be installed there) and skip elsewhere without it."""
    found = shutil.which("fio")
    if found is None:
        service_missing("fio is not installed: apt-get install fio")
    return found


@pytest.fixture
def target(tmp_path: Path) -> Path:
    folder = tmp_path / "disk"
    folder.mkdir()
    return folder


def test_sequential_write_and_read(fio: str, target: Path) -> None:
    said: list[str] = []
    report = measure_disk(target, size_bytes=SMALL, runtime_s=1.0, which=("seqwrite", "seqread"), progress=said.append)
    assert said == ["fio: seqwrite 1/2 (1 s)", "fio: seqread 2/2 (1 s)"]
    assert [t.name for t in report.tests] == ["seqwrite", "seqread"]
    assert report.fio_version.startswith("fio-")
    assert report.path == str(target) and report.fs_type == file_system_type(target)
    assert report.size_bytes == SMALL and report.runtime_s == 1.0
    for test in report.tests:
        assert test.bytes_per_s > 0 and test.iops > 0 and test.mean_latency_us > 0
        assert test.p99_latency_us is not None and test.p99_latency_us > 0
        assert test.block_bytes == 1 << 20 and test.direct == report.direct
    assert report.seq_write_bytes_per_s == report.tests[0].bytes_per_s
    assert report.seq_read_bytes_per_s == report.tests[1].bytes_per_s
    assert list(target.iterdir()) == []


def test_direct_where_the_file_system_takes_it(fio: str, target: Path) -> None:
    probe = target / "probe"
    probe.mkdir()
    works = o_direct_works(probe)
    probe.rmdir()
    report = measure_disk(target, size_bytes=SMALL, runtime_s=0.5, which=("randread",))
    assert report.direct is works and report.tests[0].direct is works
    assert report.mode == ("direct (O_DIRECT)" if works else f"buffered (O_DIRECT refused by {report.fs_type})")
    assert report.tests[0].block_bytes == 4096
    assert report.ioengine in ("libaio", "psync")
    assert list(target.iterdir()) == []


def test_buffered_when_asked(fio: str, target: Path) -> None:
    report = measure_disk(target, size_bytes=SMALL, runtime_s=0.5, which=("randwrite",), direct=False)
    assert (report.direct, report.mode, report.ioengine) == (False, "buffered (as asked)", "psync")
    test = report.tests[0]
    assert test.direct is False and test.iodepth == 1 and test.bytes_per_s > 0
    assert list(target.iterdir()) == []


def test_interrupted_run_leaves_nothing(fio: str, target: Path) -> None:
    def interrupt(line: str) -> None:
        if "2/2" in line:  # after the first test wrote its file
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        measure_disk(target, size_bytes=SMALL, runtime_s=0.3, which=("seqwrite", "seqread"), progress=interrupt)
    assert list(target.iterdir()) == []


def test_missing_fio_says_how_to_install_it(target: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", str(target))
    with pytest.raises(UsageError) as caught:
        measure_disk(target, size_bytes=SMALL, runtime_s=1.0)
    assert str(caught.value) == FIO_HINT


@pytest.mark.parametrize(
    ("kwargs", "needle"),
    [
        ({"size_bytes": 0}, "size_bytes=0"),
        ({"runtime_s": 0.0}, "runtime_s=0.0"),
        ({"runtime_s": float("nan")}, "runtime_s=nan"),
        ({"size_bytes": 4096}, "smaller than one block"),
        ({"block_rand": 1000}, "block_rand=1000"),
        ({"iodepth": 0}, "iodepth=0"),
        ({"which": ("seqwrite", "seqwrite")}, "at most once"),
        ({"which": ("fsync",)}, "which='fsync'"),
    ],
)
def test_bad_parameters_are_named(target: Path, kwargs: dict[str, object], needle: str) -> None:
    with pytest.raises(ParameterError, match=re.escape(needle)):
        measure_disk(target, **kwargs)  # type: ignore[arg-type]
    assert list(target.iterdir()) == []


def test_more_than_the_free_space_is_refused(fio: str, target: Path) -> None:
    free = shutil.disk_usage(target).free
    with pytest.raises(UsageError, match="free under"):
        measure_disk(target, size_bytes=free + (1 << 30))
    assert list(target.iterdir()) == []


def test_cli_json(
    fio: str, home: Path, target: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    code, out, err = run_cli(
        capsys, monkeypatch, "bench", "disk", str(target), "--size", "8MiB", "--runtime", "0.5", "--json"
    )
    assert code == 0, err
    body = json.loads(out)
    assert [t["name"] for t in body["tests"]] == ["seqwrite", "seqread", "randwrite", "randread"]
    assert body["size_bytes"] == SMALL and body["seq_write_bytes_per_s"] > 0 and body["seq_read_bytes_per_s"] > 0
    assert err == "" and list(target.iterdir()) == [] and not home.exists()


def test_cli_table(
    fio: str, home: Path, target: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("COLUMNS", "200")
    code, out, err = run_cli(capsys, monkeypatch, "bench", "disk", str(target), "--size", "8388608", "--runtime", "0.3")
    assert code == 0, err
    assert "MB/s" in out and "p99 latency" in out and "randread" in out
    assert "fio-" in out and "test file 8 MiB" in out and ("direct (O_DIRECT)" in out or "buffered" in out)
    assert list(target.iterdir()) == []


@pytest.mark.parametrize(
    ("args", "needles"),
    [
        (["--size", "10 potatoes"], ["--size '10 potatoes'", "256MiB"]),
        (["--size", "0"], ["--size '0'", "at least 1 byte"]),
        (["--size", "-1"], ["--size '-1'"]),
        (["--size", "1000TiB"], ["--size", "free under"]),
        (["--runtime", "0"], ["--runtime 0", "0.1 to 3600"]),
        (["--runtime", "nan"], ["--runtime nan"]),
        (["--runtime", "abc"], ["--runtime"]),
    ],
)
def test_cli_bad_options(
    fio: str,
    home: Path,
    target: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    args: list[str],
    needles: list[str],
) -> None:
    code, _, err = run_cli(capsys, monkeypatch, "bench", "disk", str(target), *args)
    assert_refused(code, err, home, *needles)
    assert list(target.iterdir()) == []


def test_cli_bad_paths(
    fio: str, home: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    a_file = tmp_path / "plain"
    a_file.write_text("x")
    for path, needle in (
        (tmp_path / "missing", "does not exist"),
        (a_file, "is not a folder"),
        (Path("/proc/self"), "'/proc/self'"),
        (Path("x" * 300), "shorten it"),
    ):
        code, _, err = run_cli(capsys, monkeypatch, "bench", "disk", str(path), "--size", "8MiB", "--runtime", "0.3")
        assert_refused(code, err, home, needle)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["plain"]


def test_default_path_is_the_home_or_the_folder_it_will_be_in(home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    assert default_disk_path() == home.parent  # the home does not exist yet
    home.mkdir()
    assert default_disk_path() == home
    home.rmdir()
    home.write_text("not a folder")
    with pytest.raises(UsageError, match="GPUFLEET_HOME="):
        default_disk_path()
