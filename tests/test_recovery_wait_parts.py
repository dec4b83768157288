"""The parts of ``distributed.recovery: wait`` that make it fast, each without a job.

- the rank supervisor publishes a generation at once when its replacement was forked warm, and waits
  for a cold one to be ready; a replacement still starting is never ended for its silence;
- the warm rank server forks a rank of its own world size (torch already imported) and refuses another;
- a rank's sockets close on ``exec``: a process it started does not keep its connections open, so
  when it is killed the other ranks' collectives fail at once instead of waiting out the timeout;
- under ``GPUFLEET_RECOVERY=wait`` the lost-rank error and the stall report say the group re-forms.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest

from gpufleet.backends.group_launch.supervisor import (
    RankSupervisor,
    free_port,
    rank_environment,
    restore_tier,
    shared_environment,
)
from gpufleet.backends.group_launch.warm_ranks import RankServer
from gpufleet.backends.local.warm import WarmProcess
from gpufleet.runtime.group import (
    PeerLost,
    _collective,
    close_sockets_on_exec,
    read_rendezvous,
    ready_marker,
    reform_request,
)
from gpufleet.runtime.watchdog import RankInfo, RankWatch


class Alive:
    """A rank process that runs on (the supervisor only polls it and signals it by PID)."""

    def __init__(self, pid: int) -> None:
        self.pid, self.returncode = pid, None

    def poll(self) -> int | None:
        return None

    def wait(self, timeout: float | None = None) -> int:
        raise AssertionError("not waited on here")


def supervisor(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, *, warm: bool) -> tuple[RankSupervisor, list[Any]]:
    """A supervisor of 2 ranks whose processes are :class:`Alive` and whose replacements start warm or cold."""
    sup = RankSupervisor(2, [sys.executable, "-c", "pass"], job_dir=tmp_path, events=None, attempt=1)
    sent: list[Any] = []
    sup.procs = {0: Alive(100), 1: Alive(101)}

    def spawn(rank: int, *, warm_: bool = True) -> bool:
        sup.procs[rank] = Alive(200 + rank)
        return warm

    monkeypatch.setattr(sup, "spawn", lambda rank, warm=True: spawn(rank, warm_=warm))
    monkeypatch.setattr(sup, "send", lambda ranks, signum: sent.append((list(ranks), signum)))
    return sup, sent


def test_a_warm_replacement_s_generation_is_published_at_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    sup, _ = supervisor(tmp_path, monkeypatch, warm=True)
    sup._replace([1])
    assert read_rendezvous(sup.rdzv) == (1, sup.port)


def test_a_cold_replacement_s_generation_waits_until_it_is_ready(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    sup, _ = supervisor(tmp_path, monkeypatch, warm=False)
    sup._replace([1])
    assert read_rendezvous(sup.rdzv) is None
    marker = ready_marker(tmp_path, 1, 1, 1)
    marker.parent.mkdir(parents=True, exist_ok=True)
    marker.write_text("ready\n")
    sup._publish()
    assert read_rendezvous(sup.rdzv) == (1, sup.port)


def test_a_replacement_still_starting_is_not_ended_for_its_silence(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Rank 0 asks for a new generation while rank 1's replacement starts: rank 1 is ended only once ready."""
    sup, sent = supervisor(tmp_path, monkeypatch, warm=False)
    sup.silence_s = 0.0
    sup._replace([1])
    asked = reform_request(tmp_path, 1, 1, 0)
    asked.parent.mkdir(parents=True, exist_ok=True)
    asked.write_text("asked\n")
    sup._check_requests()
    sup._check_requests()
    assert sent == [] and sup.generation == 1
    ready_marker(tmp_path, 1, 1, 1).write_text("ready\n")
    sup._publish()
    sup._check_requests()
    assert sent == [([1], signal.SIGKILL)]  # ready, and silent while rank 0 asked: stuck


def test_the_restore_tier_is_the_event_s_or_disk_and_none_when_nothing_was_restored() -> None:
    assert restore_tier({"kind": "restore", "step": 9, "tier": "peer"}) == "peer"
    assert restore_tier({"kind": "restore", "step": 9}) == "disk"
    assert restore_tier({"kind": "restore", "step": None}) is None


def test_the_shared_environment_is_a_rank_s_less_what_differs_between_ranks(tmp_path: Path) -> None:
    shared = shared_environment(2, "run", tmp_path / "r.json")
    rank = rank_environment(1, 2, 1234, 3, "run", tmp_path / "r.json")
    assert shared["WORLD_SIZE"] == "2" and shared["TORCHELASTIC_RUN_ID"] == "run"
    assert {k: v for k, v in rank.items() if k in shared} == shared
    assert not {"RANK", "LOCAL_RANK", "MASTER_PORT", "GPUFLEET_GENERATION"} & set(shared)


RANK_SCRIPT = textwrap.dedent(
    """
    import os, sys
    print(os.environ["RANK"], os.environ["WORLD_SIZE"], "torch" in sys.modules, os.getppid(), flush=True)
    """
)


@pytest.mark.timeout(300)
def test_the_warm_rank_server_forks_a_rank_of_its_world_size_and_refuses_another(tmp_path: Path) -> None:
    script = tmp_path / "rank.py"
    script.write_text(RANK_SCRIPT)
    env = {**os.environ, **shared_environment(2, "run", tmp_path / "r.json")}
    server = RankServer.start(env)
    try:
        assert server.wait_ready(240), "the warm rank server did not finish its imports"
        argv = [sys.executable, "-u", str(script)]
        log_path = tmp_path / "rank.log"
        with log_path.open("wb") as log:
            child = server.spawn(
                argv,
                env={**env, **rank_environment(1, 2, 1, 1, "run", tmp_path / "r.json")},
                cwd=str(tmp_path),
                log=log,
                death_signal=signal.SIGKILL,
            )
            other = server.spawn(argv, env={**env, "WORLD_SIZE": "3"}, cwd=str(tmp_path), log=log, death_signal=9)
        assert isinstance(child, WarmProcess), child
        assert child.wait(120) == 0
        assert log_path.read_text().split() == ["1", "2", "True", str(server.pid)]  # torch came with the fork
        assert other == "WORLD_SIZE '3' is not the warm rank server's '2', which the runtime read at import"
    finally:
        server.close()


PEER_SCRIPT = textwrap.dedent(
    """
    import os, signal, sys, time
    import torch, torch.distributed as dist
    from gpufleet.runtime.group import current_group
    group = current_group()
    group.agree([1.0])
    if group.rank == 1:
        # a long-lived process started without closing descriptors (as the memory keeper is)
        pid = os.posix_spawn("/bin/sleep", ["sleep", "300"], dict(os.environ))
        open(sys.argv[1], "w").write(str(pid))
        group.agree([1.0])
        os.kill(os.getpid(), signal.SIGKILL)
    group.agree([1.0])
    try:
        while True:
            group.agree([1.0])
    except Exception as err:
        print("ERROR", err, flush=True)
    """
)


@pytest.mark.timeout(300)
def test_a_killed_rank_fails_its_peer_s_collective_with_a_closed_connection_not_a_timeout(tmp_path: Path) -> None:
    """Rank 1 started a process that outlives it, then is killed: rank 0's collective fails because the
    connection closed, which it only does when that process did not inherit rank 1's connections."""
    script, spawned = tmp_path / "peer.py", tmp_path / "spawned.pid"
    script.write_text(PEER_SCRIPT)
    port = free_port()
    procs = []
    for rank in (0, 1):
        env = {
            **os.environ,
            "RANK": str(rank),
            "WORLD_SIZE": "2",
            "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": str(port),
            "GPUFLEET_DIST_TIMEOUT_S": "60",
        }
        stdout = subprocess.PIPE if rank == 0 else subprocess.DEVNULL
        procs.append(subprocess.Popen([sys.executable, str(script), str(spawned)], env=env, stdout=stdout))
    try:
        out, _ = procs[0].communicate(timeout=240)
        procs[1].wait(timeout=60)
    finally:
        for proc in procs:
            proc.kill()
        if spawned.exists():  # rank 1's child, not ours to reap
            os.kill(int(spawned.read_text()), signal.SIGKILL)
    text = out.decode()
    assert "ERROR" in text, text
    assert "closed" in text.lower() or "reset" in text.lower(), text  # not "Timed out waiting 60000ms"


def test_sockets_close_on_exec_and_other_descriptors_are_left_as_they_are() -> None:
    sock = socket.socket()
    read, write = os.pipe()
    try:
        sock.set_inheritable(True)
        os.set_inheritable(read, True)
        close_sockets_on_exec()
        assert not sock.get_inheritable() and os.get_inheritable(read)
    finally:
        sock.close()
        os.close(read)
        os.close(write)


def test_under_wait_a_lost_peer_says_the_group_re_forms(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv("GPUFLEET_JOB_DIR", raising=False)
    monkeypatch.setenv("GPUFLEET_RECOVERY", "wait")
    with pytest.raises(PeerLost, match="the group re-forms") as err, _collective(1):
        raise RuntimeError("Connection closed by peer")
    assert "requeued" not in str(err.value)
    monkeypatch.setenv("GPUFLEET_RECOVERY", "requeue")
    with pytest.raises(PeerLost, match="the attempt is requeued"), _collective(1):
        raise RuntimeError("Connection closed by peer")


def test_under_wait_the_stall_report_says_the_group_re_forms(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    import gpufleet.runtime.watchdog as wd

    monkeypatch.setenv("GPUFLEET_RECOVERY", "wait")
    monkeypatch.setattr(wd, "where", lambda frame: (True, "distributed_c10d.py:1 in all_reduce"))
    ranks = [RankInfo(0, "node-a", 10), RankInfo(1, "node-b", 11)]
    watch = RankWatch(
        rank=0, ranks=ranks, folder=tmp_path, stall_s=2.0, timeout_s=8.0, emit=lambda kind, **data: None, poll_s=0.5
    )
    watch.progress(7)
    start = time.monotonic()
    for at in (2.5, 3.5, 4.0):
        watch.check(start + at)
    said = capsys.readouterr().err
    assert "rank 1 on node-b" in said and "the group re-forms" in said and "requeued" not in said


@pytest.mark.timeout(120)
def test_a_rank_told_to_stop_while_its_group_broke_leaves_instead_of_waiting_for_a_new_generation(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """The supervisor's SIGTERM can land while the rank's session is in a collective that then fails: the
    session ends on the broken group and drops its flag, but the rank must not wait for a generation
    that will never come (the recovery timeout, or the supervisor's SIGKILL after the grace)."""
    from gpufleet.runtime import launch
    from gpufleet.runtime.components import guard as guard_module
    from gpufleet.runtime.components.guard import PreemptionGuard

    rdzv = tmp_path / "rendezvous.json"
    rdzv.write_text('{"generation": 0, "master_port": 29500}\n')
    monkeypatch.setenv("GPUFLEET_RDZV_FILE", str(rdzv))
    monkeypatch.setenv("GPUFLEET_RECOVERY_TIMEOUT_S", "3600")  # only the stop can end the wait in time
    monkeypatch.setattr(guard_module, "_told_to_stop", [None])
    PreemptionGuard(handle_signals=False).on_signal(int(signal.SIGTERM), None)
    assert guard_module.told_to_stop() == signal.SIGTERM
    assert launch.rejoin() is False
