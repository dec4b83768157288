"""A training script written the usual way, not with gpufleet's session: it reads the shards the job
staged under $GPUFLEET_DATA_DIR, draws random batches, accumulates gradients over two micro-batches,
and saves and resumes with its own torch.save checkpoint; on SIGTERM it saves and exits 75."""

import hashlib
import os
import signal
import sys
import time
from pathlib import Path

import torch

data = Path(os.environ["GPUFLEET_DATA_DIR"]) / "train"
ckpt = Path(os.environ["GPUFLEET_CKPT_DIR"]) / "mine.pt"
progress = Path(os.environ["GPUFLEET_JOB_DIR"]) / "progress"
steps, pause = int(sys.argv[1]), float(sys.argv[2])

blobs = [p.read_bytes() for p in sorted(data.glob("*.bin"))]
digest = hashlib.sha256(b"".join(blobs)).hexdigest()
raw = torch.frombuffer(bytearray(b"".join(blobs)), dtype=torch.uint8).float() / 255.0
x = raw[: (raw.numel() // 17) * 17].view(-1, 17)
features, target = x[:, :16], x[:, 16:]

torch.manual_seed(0)
model = torch.nn.Linear(16, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.05)
step = 0
if ckpt.exists():
    state = torch.load(ckpt, weights_only=True)
    model.load_state_dict(state["model"])
    opt.load_state_dict(state["opt"])
    step = state["step"]

stop: list[bool] = []
signal.signal(signal.SIGTERM, lambda *_: stop.append(True))


def save() -> None:
    ckpt.parent.mkdir(parents=True, exist_ok=True)
    torch.save({"model": model.state_dict(), "opt": opt.state_dict(), "step": step}, ckpt.with_suffix(".tmp"))
    os.replace(ckpt.with_suffix(".tmp"), ckpt)


while step < steps:
    g = torch.Generator().manual_seed(step)
    for _ in range(2):  # gradient accumulation
        idx = torch.randint(len(features), (32,), generator=g)
        loss = torch.nn.functional.mse_loss(model(features[idx]), target[idx]) / 2
        loss.backward()  # type: ignore[no-untyped-call]
    opt.step()
    opt.zero_grad()
    step += 1
    time.sleep(pause)
    progress.write_text(f"{step} {digest}")
    if stop:
        save()
        sys.exit(75)
    if step % 20 == 0:
        save()
print(f"done {step} {digest}")
