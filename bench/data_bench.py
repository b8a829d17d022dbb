#!/usr/bin/python3
"""Image folders, ours against PyTorch's, on the same files and cores: writes
docs/DATA.md. Three parts (issue 25), each can run alone (--only):

loader: the image-folder loader against torchvision's. Makes two image
  folders of JPEGs from Fashion-MNIST (RGB, upscaled to 64x64 and to 224x224,
  quality 90), then reads every image once with a training pipeline
  (RandomResizedCrop to 56 or 224, RandomHorizontalFlip, ToTensor,
  Normalize), batches of 64:
    - build/bin/ddp_image_loader_bench: the worker's batch reader (what its
      BatchLoader calls) on 1 and 2 threads;
    - torchvision's ImageFolder + DataLoader(num_workers=1 and 2), each
      worker process at one intra-op thread.
  Images/s are best of three runs each, measured in the same run.

training: training samples/s on an image folder (the 64x64 JPEGs), our job
  (ddp-run --nproc 2, dataset "image-folder", backend gloo) against PyTorch
  DDP started by hand (2 processes, gloo on 127.0.0.1, DistributedSampler
  with set_epoch, ImageFolder + the same transforms + DataLoader(num_workers=1)),
  the same model (the Python definitions of bench/pytorch_ddp.py, which the
  parity tests hold equal to worker/model.cc), batch, steps and cores. Also
  the share of step time each side waits for data: ours from the workers'
  step records (timings.data_ms), theirs the time blocked in next() on the
  DataLoader's iterator.

rss: peak RSS of the workers against dataset size: one job (2 workers, one
  epoch) over a folder of 512x512 noise JPEGs grown in size on disk, the
  workers inside a memory cgroup (v1) whose limit is below the largest
  folder, so the dataset can't sit in memory; the files are dropped from the
  page cache before each run. Needs root and a writable cgroup v1 memory
  controller (/sys/fs/cgroup/memory).

Threads first: OMP, OpenBLAS and LibTorch each at one thread per process
(worker or rank), loaders at one thread or process per rank in `training`.

    /usr/bin/python3 bench/data_bench.py                 # about 5 minutes
    /usr/bin/python3 bench/data_bench.py --only training # one part; the other
                                                         # parts' sections of
                                                         # docs/DATA.md are kept
    /usr/bin/python3 bench/data_bench.py --quick         # a smoke run: small
                                                         # sizes, prints only
                                                         # (unless --out)
"""
import argparse
import glob
import gzip
import io
import json
import os
import platform
import pwd
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time

import numpy as np
from PIL import Image

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, os.path.join(ROOT, "tests", "py"))
from harness import free_port, read_step_records, thread_env  # noqa: E402

DATA = "/usr/share/datasets/fashion-mnist/"
MEAN, STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)
CGROUP_V1 = "/sys/fs/cgroup/memory"
PARTS = ("loader", "training", "rss")


def log(*args):
    print(time.strftime("%H:%M:%S"), *args, flush=True)


def make_folder(root, count, side):
    with gzip.open(DATA + "train-images-idx3-ubyte.gz") as f:
        f.read(16)
        x = np.frombuffer(f.read(count * 784), np.uint8).reshape(count, 28, 28)
    with gzip.open(DATA + "train-labels-idx1-ubyte.gz") as f:
        f.read(8)
        y = np.frombuffer(f.read(count), np.uint8)
    for c in range(10):
        os.makedirs(os.path.join(root, "c%d" % c), exist_ok=True)
    for i in range(count):
        g = Image.fromarray(x[i], "L")
        rgb = Image.merge("RGB", (g, g.point(lambda v: 255 - v), g.point(lambda v: v // 2)))
        rgb.resize((side, side), Image.BILINEAR).save(
            os.path.join(root, "c%d" % y[i], "%05d.jpg" % i), quality=90)


class Processes:
    """Every process this script starts, each in a session of its own, so
    that it and whatever it started can be killed by its process group at
    the end (and on any error or timeout)."""

    def __init__(self):
        self.procs = []

    def start(self, args, **kwargs):
        p = subprocess.Popen(args, start_new_session=True, **kwargs)
        self.procs.append(p)
        return p

    def wait(self, p, timeout, what):
        try:
            return p.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.kill(p)
            raise RuntimeError("%s did not finish within %ds" % (what, timeout)) from None

    @staticmethod
    def kill(p):
        try:
            os.killpg(p.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        try:
            p.wait(timeout=10)
        except subprocess.TimeoutExpired:
            pass

    def kill_all(self):
        for p in self.procs:
            # The group too: a process that exited may have left children.
            try:
                os.killpg(p.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
            if p.poll() is None:
                self.kill(p)
        self.procs = []


PROCS = Processes()


def tail(path, limit=2000):
    try:
        with open(path, errors="replace") as f:
            return f.read()[-limit:]
    except OSError:
        return ""


# ---------------------------------------------------------------- loader


def ours_loader(binary, root, threads, size):
    env = dict(os.environ, OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1")
    out = subprocess.run([binary, root, str(threads), str(size)], capture_output=True, text=True,
                         env=env, timeout=600, check=True)
    return json.loads(out.stdout)["images_per_sec"]


TORCHVISION = r"""
import sys, time, torch
from torchvision import datasets, transforms
torch.set_num_threads(1)
root, workers, size = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
t = transforms.Compose([transforms.RandomResizedCrop(size), transforms.RandomHorizontalFlip(),
                        transforms.ToTensor(),
                        transforms.Normalize((0.485, 0.456, 0.406), (0.229, 0.224, 0.225))])
data = datasets.ImageFolder(root, t)
loader = torch.utils.data.DataLoader(data, batch_size=64, num_workers=workers,
                                     worker_init_fn=lambda _: torch.set_num_threads(1))
start = time.time()
n = 0
for x, y in loader:
    n += x.shape[0]
print(n / (time.time() - start))
"""


def torchvision_loader(root, workers, size):
    env = dict(os.environ, OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1")
    out = subprocess.run([sys.executable, "-c", TORCHVISION, root, str(workers), str(size)],
                         capture_output=True, text=True, env=env, timeout=600, check=True)
    return float(out.stdout.strip())


def part_loader(args, work):
    rows = []
    for side, crop in ((64, 56), (224, 224)):
        root = os.path.join(work, "loader%d" % side)
        make_folder(root, args.images, side)
        for threads in (1, 2):
            a = max(ours_loader(os.path.join(args.bin, "ddp_image_loader_bench"), root, threads,
                                crop) for _ in range(args.repeats))
            b = max(torchvision_loader(root, threads, crop) for _ in range(args.repeats))
            rows.append((side, crop, threads, a, b))
            log("%dx%d JPEG -> %d, %d thread(s)/worker(s): ours %.0f images/s, torchvision "
                "%.0f (%.2fx)" % (side, side, crop, threads, a, b, a / b))
        shutil.rmtree(root, ignore_errors=True)
    out = ["## The loader alone: images/s against torchvision's", "",
           "%d JPEGs (Fashion-MNIST in colour, upscaled, quality 90) read once each, in batches "
           "of 64, through a training pipeline (RandomResizedCrop, RandomHorizontalFlip, "
           "ToTensor, Normalize); ours is `ddp_image_loader_bench`, the worker's batch reader "
           "(what its BatchLoader calls) on N threads, "
           "torchvision's is `ImageFolder` + `DataLoader(num_workers=N)`, each at one intra-op "
           "thread. Best of %d runs each." % (args.images, args.repeats), "",
           "| images | crop | threads / workers | ours (images/s) | torchvision (images/s) | "
           "ours / torchvision |",
           "| --- | ---: | ---: | ---: | ---: | ---: |"]
    for side, crop, threads, a, b in rows:
        out.append("| %dx%d JPEG | %d | %d | %.0f | %.0f | %.2fx |" % (side, side, crop, threads,
                                                                    a, b, a / b))
    small = [a / b for side, _, _, a, b in rows if side == 64]
    large = [a / b for side, _, _, a, b in rows if side == 224]
    out += ["",
            "Per core, ours reads in threads of one process and fills the batch in place; "
            "torchvision's DataLoader runs each worker as a process of its own and sends each "
            "batch back through shared memory. Both decode with libjpeg-turbo and resize with "
            "Pillow's algorithm (ours reimplements it, to the bit).",
            "",
            "The target (at least 2x torchvision's images/s per core) %s for 64x64 images "
            "(%.1f-%.1fx) and %s for 224x224 (%.2f-%.2fx), where JPEG decoding (libjpeg-turbo "
            "on both sides, with the accurate IDCT and smooth upsampling that equal PIL's "
            "pixels) is about half of ours' time per image: the resize runs as SSE2 integer "
            "sums equal to Pillow's and the last resize writes the normalized tensor itself." % (
                "holds" if min(small) >= 2 else "does not hold", min(small), max(small),
                "holds" if min(large) >= 2 else "does not hold", min(large), max(large)), ""]
    one = {(side, side2): a for side, side2, threads, a, _ in rows if threads == 1}
    flat = [side for side, crop, threads, a, _ in rows
            if threads == 2 and a < 1.3 * one[(side, crop)]]
    if flat:
        out[-1:-1] = ["",
                      "The 2-thread rows need both cores: ours gained little or nothing from "
                      "the second thread here (%s), where other work held a core during this "
                      "run; read those rows with care." % ", ".join(
                          "%dx%d" % (side, side) for side in flat)]
    return out


# ---------------------------------------------------------------- training

# PyTorch DDP as a user writes it by hand for an image folder: one process
# per rank (env:// variables), gloo, DistributedSampler with set_epoch,
# torchvision's ImageFolder and DataLoader(num_workers=1). The model comes
# from bench/pytorch_ddp.py (the definitions the parity tests hold equal to
# worker/model.cc). Writes one JSON line per step: its end (time), its wall
# time (from before next() to after optimizer.step()) and the time blocked in
# next() on the DataLoader's iterator.
TORCH_DDP = r"""
import json, os, sys, time, torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader
from torch.utils.data.distributed import DistributedSampler
from torchvision import datasets, transforms
bench, root, model_json, crop, batch, steps, seed, out = sys.argv[1:9]
crop, batch, steps, seed = int(crop), int(batch), int(steps), int(seed)
sys.path.insert(0, bench)
from pytorch_ddp import make_model
torch.set_num_threads(1)
dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
t = transforms.Compose([transforms.RandomResizedCrop(crop), transforms.RandomHorizontalFlip(),
                        transforms.ToTensor(),
                        transforms.Normalize((0.485, 0.456, 0.406), (0.229, 0.224, 0.225))])
data = datasets.ImageFolder(root, t)
sampler = DistributedSampler(data, num_replicas=world, rank=rank, shuffle=True, seed=seed)
loader = DataLoader(data, batch_size=batch, sampler=sampler, num_workers=1,
                    worker_init_fn=lambda _: torch.set_num_threads(1))
model = make_model(json.loads(model_json), [3, crop, crop], len(data.classes), seed)
ddp = DDP(model, bucket_cap_mb=25)
opt = torch.optim.SGD(ddp.parameters(), lr=0.01, momentum=0.9)
records, step, epoch = [], 0, 0
while step < steps:
    sampler.set_epoch(epoch)
    it = iter(loader)
    while step < steps:
        t0 = time.perf_counter()
        try:
            x, y = next(it)
        except StopIteration:
            break
        t1 = time.perf_counter()
        opt.zero_grad()
        loss = F.cross_entropy(ddp(x), y)
        loss.backward()
        opt.step()
        loss = loss.item()
        t2 = time.perf_counter()
        step += 1
        records.append({"time": time.time(), "rank": rank, "step": step,
                        "samples": int(x.shape[0]), "step_seconds": t2 - t0,
                        "data_ms": (t1 - t0) * 1000.0, "loss": loss})
    epoch += 1
with open(out, "w") as f:
    for r in records:
        f.write(json.dumps(r) + "\n")
dist.destroy_process_group()
"""

# The Cnn of bench/pytorch_ddp.py (and worker/model.cc) takes 1x28x28 only;
# for RGB image folders, the same layers with 3 input channels and fc1 sized
# for 56x56, saved as TorchScript: both sides run this one file.
CNN_RGB = r"""
import sys, torch
import torch.nn as nn
import torch.nn.functional as F
class Cnn3(nn.Module):
    def __init__(self, side, classes):
        super().__init__()
        self.conv1 = nn.Conv2d(3, 16, 3, padding=1)
        self.conv2 = nn.Conv2d(16, 32, 3, padding=1)
        self.fc1 = nn.Linear(32 * (side // 4) * (side // 4), 128)
        self.fc2 = nn.Linear(128, classes)
    def forward(self, x):
        x = F.max_pool2d(F.relu(self.conv1(x)), 2)
        x = F.max_pool2d(F.relu(self.conv2(x)), 2)
        return self.fc2(F.relu(self.fc1(x.flatten(1))))
torch.manual_seed(1)
side = int(sys.argv[2])
torch.jit.save(torch.jit.trace(Cnn3(side, 10), torch.zeros(2, 3, side, side)), sys.argv[1])
"""


def window_stats(ranks, warmup):
    """Samples/s summed over ranks and the share of step time spent waiting
    for data, over each rank's steps after the first `warmup`: a rank's
    samples over the wall time from the start of its first counted step
    (its end minus its wall time) to the end of its last. The same rule for
    both sides."""
    rate, data, total, steps = 0.0, 0.0, 0.0, 0
    for records in ranks:
        counted = records[warmup:]
        if not counted:
            raise RuntimeError("no step after the %d warm-up step(s)" % warmup)
        seconds = counted[-1]["time"] - counted[0]["time"] + counted[0]["step_seconds"]
        rate += sum(r["samples"] for r in counted) / seconds
        data += sum(r["data_ms"] for r in counted)
        total += sum(r["step_seconds"] * 1000.0 for r in counted)
        steps = len(counted)
    return {"rate": rate, "data_share": data / total,
            "step_ms": total / len(ranks) / steps, "data_ms": data / len(ranks) / steps}


def ours_training(args, work, name, model, root, crop, batch, steps):
    job = {"name": name, "model": model,
           "dataset": {"kind": "image-folder", "path": root, "loaderThreads": 1,
                       "transforms": [{"kind": "RandomResizedCrop", "size": [crop]},
                                      {"kind": "RandomHorizontalFlip"}],
                       "normalize": {"mean": list(MEAN), "std": list(STD)}},
           "optimizer": {"kind": "sgd", "lr": 0.01, "momentum": 0.9},
           "batchSize": batch, "epochs": 1000, "maxSteps": steps, "evaluate": False,
           "seed": 1, "threadsPerWorker": 1, "backend": "gloo"}
    folder = tempfile.mkdtemp(prefix="ours-%s-" % name, dir=work)
    job_file = os.path.join(folder, "job.json")
    with open(job_file, "w") as f:
        json.dump(job, f)
    logs = os.path.join(folder, "logs")
    with open(os.path.join(folder, "ddp-run.out"), "w") as out:
        p = PROCS.start([os.path.join(args.bin, "ddp-run"), "--nproc=2", "--threads=1",
                         "--job=" + job_file, "--log_dir=" + logs, "--status_page=false",
                         "--max_restarts=0"],
                        env=thread_env(XDG_RUNTIME_DIR=args.runtime_dir), stdout=out,
                        stderr=subprocess.STDOUT)
        code = PROCS.wait(p, args.timeout, "ddp-run (%s)" % name)
    if code != 0:
        raise RuntimeError("ddp-run (%s) exited with %d:\n%s" % (
            name, code, tail(os.path.join(folder, "ddp-run.out"))))
    ranks = [read_step_records(os.path.join(logs, "metrics-w%d.jsonl" % r)) for r in range(2)]
    if len({r["generation"] for records in ranks for r in records}) != 1:
        raise RuntimeError("%s: the job re-formed during the measurement" % name)
    return ranks


def torch_training(args, work, name, model, root, crop, batch, steps):
    folder = tempfile.mkdtemp(prefix="torch-%s-" % name, dir=work)
    port = str(free_port())
    procs = []
    for rank in range(2):
        env = thread_env(MASTER_ADDR="127.0.0.1", MASTER_PORT=port, WORLD_SIZE="2",
                         RANK=str(rank))
        with open(os.path.join(folder, "rank%d.log" % rank), "w") as out:
            procs.append(PROCS.start(
                [sys.executable, "-c", TORCH_DDP, HERE, root, json.dumps(model), str(crop),
                 str(batch), str(steps), "1", os.path.join(folder, "rank%d.jsonl" % rank)],
                env=env, stdout=out, stderr=subprocess.STDOUT))
    deadline = time.time() + args.timeout
    try:
        while any(p.poll() is None for p in procs):
            for rank, p in enumerate(procs):
                if p.poll() not in (None, 0):
                    raise RuntimeError("PyTorch DDP rank %d (%s) exited with %d:\n%s" % (
                        rank, name, p.returncode, tail(os.path.join(folder, "rank%d.log" % rank))))
            if time.time() > deadline:
                raise RuntimeError("PyTorch DDP (%s) did not finish within %ds" % (
                    name, args.timeout))
            time.sleep(0.1)
        for rank, p in enumerate(procs):
            if p.returncode != 0:
                raise RuntimeError("PyTorch DDP rank %d (%s) exited with %d:\n%s" % (
                    rank, name, p.returncode, tail(os.path.join(folder, "rank%d.log" % rank))))
    finally:
        for p in procs:
            PROCS.kill(p)
    ranks = []
    for rank in range(2):
        with open(os.path.join(folder, "rank%d.jsonl" % rank)) as f:
            ranks.append([json.loads(line) for line in f if line.strip()])
    return ranks


def part_training(args, work):
    root = os.path.join(work, "train64")
    make_folder(root, args.train_images, 64)
    cnn_file = os.path.join(work, "cnn3.pt")
    subprocess.run([sys.executable, "-c", CNN_RGB, cnn_file, "56"], check=True, timeout=300,
                   env=thread_env())
    q = args.quick
    # (label, job model, crop, batch, warm-up steps, counted steps, repeats)
    configs = [
        ("mlp", {"kind": "mlp"}, 56, 64, 5, 10 if q else 40, 1 if q else 2),
        ("cnn (TorchScript, RGB)", {"kind": "torchscript", "path": cnn_file}, 56, 64, 5,
         10 if q else 40, 1 if q else 2),
        ("resnet18", {"kind": "resnet18"}, 32, 32, 2, 2 if q else 8, 1 if q else 2),
    ]
    rows = []
    for label, model, crop, batch, warmup, steps, repeats in configs:
        name = re.sub(r"[^a-z0-9]+", "-", label.lower()).strip("-")
        best = {}
        for rep in range(repeats):
            # Alternate which side goes first.
            sides = [("ours", ours_training), ("torch", torch_training)]
            for side, run in (sides if rep % 2 == 0 else sides[::-1]):
                start = time.time()
                stats = window_stats(run(args, work, name, model, root, crop, batch,
                                         warmup + steps), warmup)
                log("%s, %s: %.0f samples/s, %.0f ms/step, %.0f%% of it waiting for data "
                    "(%.0fs)" % (label, side, stats["rate"], stats["step_ms"],
                                 100 * stats["data_share"], time.time() - start))
                if side not in best or stats["rate"] > best[side]["rate"]:
                    best[side] = stats
        rows.append((label, crop, batch, warmup, steps, repeats, best["ours"], best["torch"]))
        log("%s: ours / PyTorch DDP = %.2fx" % (label, best["ours"]["rate"] /
                                               best["torch"]["rate"]))
    shutil.rmtree(root, ignore_errors=True)
    out = ["## Training on an image folder: samples/s against PyTorch DDP", "",
           "Both sides train the same model on the same %d JPEGs (Fashion-MNIST in colour, "
           "64x64, quality 90) with RandomResizedCrop, RandomHorizontalFlip and Normalize, "
           "2 ranks on the 2 cores, SGD (lr 0.01, momentum 0.9), gloo on loopback for the "
           "gradients. **Ours**: `ddp-run --nproc 2 --threads 1`, dataset `image-folder` with "
           "`loaderThreads: 1` (`prefetchBatches` default, 4), `threadsPerWorker: 1`, "
           "`backend: gloo` (PyTorch's transport; ours' default on one machine, shared memory, "
           "is faster still). **PyTorch DDP** by hand: 2 processes (env:// on 127.0.0.1), "
           "`DistributedSampler` with `set_epoch`, torchvision's `ImageFolder` + "
           "`DataLoader(num_workers=1)` (default `prefetch_factor`, 2). So each rank has one "
           "compute thread and one loader (a thread for ours, a process for theirs): 4 busy "
           "threads on 2 cores on both sides. `OMP_NUM_THREADS=1`, `OPENBLAS_NUM_THREADS=1` "
           "and one intra-op thread (`torch.set_num_threads(1)`, `--threads 1`) in every "
           "process, the DataLoader's worker too." % args.train_images, "",
           "Models: `mlp` and `resnet18` are the built-in ones (the Python definitions of "
           "`bench/pytorch_ddp.py` on PyTorch's side, which the parity tests hold equal to "
           "`worker/model.cc`). The built-in `cnn` takes 1x28x28 samples only and an image "
           "folder's are RGB, so a job refuses it; in its place, the same layers with 3 input "
           "channels and `fc1` sized for 56x56, saved once as TorchScript and run by both "
           "sides from that file (`model.kind: torchscript`; `torch.jit.load` + DDP).", "",
           "Samples/s are summed over the 2 ranks over the counted steps (after the warm-up "
           "steps, which hold start-up); best of the repeats, the two sides alternating. "
           "*Data wait*: the share of step time spent waiting for the next batch (ours: the "
           "workers' `timings.data_ms` in their step records; theirs: time blocked in "
           "`next()` on the DataLoader's iterator).", "",
           "| model | crop | batch / rank | steps counted (warm-up) | runs | ours (samples/s) | "
           "PyTorch DDP (samples/s) | ours / PyTorch | ours: ms/step, data wait | "
           "PyTorch: ms/step, data wait |",
           "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for label, crop, batch, warm, steps, repeats, a, b in rows:
        out.append("| %s | %d | %d | %d (%d) | %d | %.0f | %.0f | %.2fx | %.0f ms, %.0f%% | "
                   "%.0f ms, %.0f%% |" % (
                       label, crop, batch, steps, warm, repeats, a["rate"], b["rate"],
                       a["rate"] / b["rate"], a["step_ms"], 100 * a["data_share"],
                       b["step_ms"], 100 * b["data_share"]))
    out += [""] + summary_training(rows) + [""]
    return out


def summary_training(rows):
    """One or two plain sentences of what the table shows."""
    light = [r for r in rows if r[0] != "resnet18"]
    heavy = [r for r in rows if r[0] == "resnet18"]
    text = []
    if light:
        # The part of the step that is not waiting for data.
        rest = lambda s: s["step_ms"] * (1 - s["data_share"])  # noqa: E731
        longer = all(rest(r[7]) > rest(r[6]) for r in light)
        text.append(
            "With the small models (%s) PyTorch's ranks wait %s of each step for their "
            "DataLoader process, ours %s for their loader thread; the rest of the step takes "
            "%s ms on PyTorch's side against %s ms on ours%s." % (
                ", ".join("%s %.2fx" % (r[0], r[6]["rate"] / r[7]["rate"]) for r in light),
                "/".join("%.0f%%" % (100 * r[7]["data_share"]) for r in light),
                "/".join("%.0f%%" % (100 * r[6]["data_share"]) for r in light),
                "/".join("%.0f" % rest(r[7]) for r in light),
                "/".join("%.0f" % rest(r[6]) for r in light),
                " (a DataLoader process takes more of the two cores per image than our loader "
                "thread, see the first table, leaving less to training; and with data in memory "
                "ours' step is faster too, docs/BENCHMARKS.md)" if longer else ""))
    if heavy:
        a, b = heavy[0][6], heavy[0][7]
        text.append(
            "ResNet-18 is compute-bound on both sides (data wait %.0f%% ours, %.0f%% "
            "PyTorch's): the loader hides behind a %.1f s step, and the ratio, %.2fx, is that "
            "of the training step itself, not of the data path." % (
                100 * a["data_share"], 100 * b["data_share"], a["step_ms"] / 1000,
                a["rate"] / b["rate"]))
    return [" ".join(text)]


# ---------------------------------------------------------------- rss


def noise_jpegs(count, side, seed=0):
    """`count` distinct noise-ish JPEGs (gradients plus noise, quality 90)."""
    rng = np.random.default_rng(seed)
    yy, xx = np.mgrid[0:side, 0:side]
    blobs = []
    for i in range(count):
        base = np.stack([(xx * (i + 1)) % 256, (yy * (i + 2)) % 256,
                         ((xx + yy) * (i + 3)) % 256], -1)
        pixels = np.clip(base + rng.integers(-128, 128, (side, side, 3)), 0, 255)
        buf = io.BytesIO()
        Image.fromarray(pixels.astype(np.uint8)).save(buf, "JPEG", quality=90)
        blobs.append(buf.getvalue())
    return blobs


def grow_folder(root, blobs, files, nbytes, target):
    """Adds files to `root` (ROOT/CLASS/IMAGE, `files` of them there now,
    `nbytes` in all) until it holds `target` bytes: each a file of its own
    (distinct files can't share page cache) with the bytes of one of
    `blobs` (identical bytes are fine for a memory measurement). Returns
    (files, nbytes); synced, so that the page cache can drop them."""
    for c in range(10):
        os.makedirs(os.path.join(root, "c%d" % c), exist_ok=True)
    while nbytes < target:
        blob = blobs[files % len(blobs)]
        with open(os.path.join(root, "c%d" % (files % 10), "%06d.jpg" % files), "wb") as f:
            f.write(blob)
        files += 1
        nbytes += len(blob)
    os.sync()
    return files, nbytes


def drop_cache(root):
    """Drops the folder's files from the page cache (they were synced)."""
    for path in glob.glob(os.path.join(root, "*", "*")):
        fd = os.open(path, os.O_RDONLY)
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def read_cgroup(cg, name):
    with open(os.path.join(cg, name)) as f:
        return f.read()


def proc_status(pid):
    """{field: kB} of /proc/PID/status' Vm* and Rss* lines, or None when gone."""
    try:
        with open("/proc/%d/status" % pid) as f:
            lines = f.read().splitlines()
    except OSError:
        return None
    out = {}
    for line in lines:
        key, _, value = line.partition(":")
        if key.startswith(("Vm", "Rss")) and value.strip().endswith("kB"):
            out[key] = int(value.split()[0])
    return out


def rss_run(args, work, gb, root, files, nbytes, limit):
    """One epoch over `root` on a coordinator (outside the cgroup) and 2
    workers (inside a new memory cgroup limited to `limit` bytes). Returns
    what was measured."""
    folder = tempfile.mkdtemp(prefix="rss-%gGB-" % gb, dir=work)
    job = {"name": "rss", "model": {"kind": "mlp"},
           "dataset": {"kind": "image-folder", "path": root,
                       "transforms": [{"kind": "RandomResizedCrop", "size": [64]},
                                      {"kind": "RandomHorizontalFlip"}],
                       "normalize": {"mean": list(MEAN), "std": list(STD)}},
           "optimizer": {"kind": "sgd", "lr": 0.01, "momentum": 0.9},
           "batchSize": 64, "epochs": 1, "evaluate": False, "seed": 1,
           "threadsPerWorker": 1, "minWorkers": 2, "maxWorkers": 2}
    job_file = os.path.join(folder, "job.json")
    with open(job_file, "w") as f:
        json.dump(job, f)
    env = thread_env(XDG_RUNTIME_DIR=args.runtime_dir)
    port_file = os.path.join(folder, "port")
    status_file = os.path.join(folder, "final-status.json")
    drop_cache(root)
    cg = os.path.join(CGROUP_V1, "ddp-databench-%d-%s" % (
        os.getpid(), ("%g" % gb).replace(".", "_")))
    os.mkdir(cg)
    try:
        with open(os.path.join(cg, "memory.limit_in_bytes"), "w") as f:
            f.write(str(limit))
        with open(os.path.join(folder, "coordinator.log"), "w") as out:
            coordinator = PROCS.start(
                [os.path.join(args.bin, "ddp-coordinator"), "--listen=127.0.0.1:0",
                 "--port_file=" + port_file, "--job=" + job_file, "--exit_when_done",
                 "--status_file=" + status_file, "--data_root=" + work,
                 "--output_root=" + work, "--validate_user=" + pwd.getpwuid(os.geteuid()).pw_name,
                 "--metrics_listen=", "--http_listen="],
                env=env, stdout=out, stderr=subprocess.STDOUT)
        deadline = time.time() + 60
        port = None
        while port is None:
            try:
                with open(port_file) as f:
                    port = int(f.read().strip() or 0) or None
            except (OSError, ValueError):
                pass
            if coordinator.poll() is not None:
                raise RuntimeError("the coordinator exited with %d:\n%s" % (
                    coordinator.returncode, tail(os.path.join(folder, "coordinator.log"))))
            if time.time() > deadline:
                raise RuntimeError("the coordinator did not serve within 60s")
            time.sleep(0.05)
        workers = []
        for i in range(2):
            # The shell joins the cgroup, then becomes the worker: every byte
            # the worker touches (its page cache too) is charged there.
            cmd = ["/bin/sh", "-c", 'echo $$ > "$0" && exec "$@"', os.path.join(cg, "cgroup.procs"),
                   os.path.join(args.bin, "ddp-worker"), "--coordinator=127.0.0.1:%d" % port,
                   "--device=cpu:%d" % i, "--host=127.0.0.1", "--name=w%d" % i, "--threads=1",
                   "--metrics_file=" + os.path.join(folder, "w%d.jsonl" % i), "--metrics_listen="]
            with open(os.path.join(folder, "w%d.log" % i), "w") as out:
                workers.append(PROCS.start(cmd, env=env, stdout=out, stderr=subprocess.STDOUT))
        hwm = [0, 0]
        anon = [0, 0]
        cg_rss = 0
        start = time.time()
        deadline = start + args.timeout
        died = None
        while coordinator.poll() is None:
            for i, w in enumerate(workers):
                s = proc_status(w.pid)
                if s and w.poll() is None:
                    hwm[i] = max(hwm[i], s.get("VmHWM", 0))
                    anon[i] = max(anon[i], s.get("RssAnon", 0))
            stat = dict(line.split() for line in read_cgroup(cg, "memory.stat").splitlines())
            cg_rss = max(cg_rss, int(stat.get("total_rss", 0)))
            # A worker that died (the OOM killer, say) before the job ended:
            # nobody restarts it here, so the job would wait for it to
            # rejoin. Give the coordinator a few seconds to end, then stop.
            if died is None and any(w.poll() is not None for w in workers):
                died = time.time()
            if died is not None and time.time() > died + 5:
                break
            if time.time() > deadline:
                raise RuntimeError("the %g GB job did not end within %ds" % (gb, args.timeout))
            time.sleep(0.1)
        seconds = time.time() - start
        if coordinator.poll() is None:
            coordinator.send_signal(signal.SIGTERM)  # it writes --status_file on exit
            try:
                coordinator.wait(timeout=15)
            except subprocess.TimeoutExpired:
                PROCS.kill(coordinator)
        worker_codes = []
        for i, w in enumerate(workers):
            try:
                worker_codes.append(w.wait(timeout=30))
            except subprocess.TimeoutExpired:
                PROCS.kill(w)
                worker_codes.append("still running")
        oom = read_cgroup(cg, "memory.oom_control")
        oom_kills = int(re.search(r"oom_kill (\d+)", oom).group(1)) if "oom_kill" in oom else 0
        max_usage = int(read_cgroup(cg, "memory.max_usage_in_bytes"))
        failcnt = int(read_cgroup(cg, "memory.failcnt"))
        try:
            with open(status_file) as f:
                final = json.load(f)
        except (OSError, ValueError):
            final = {}
        records = [read_step_records(os.path.join(folder, "w%d.jsonl" % i)) for i in range(2)]
        try:
            rate = window_stats(records, 1)["rate"]
        except (RuntimeError, IndexError, KeyError):
            rate = float("nan")
        logs = "".join(tail(os.path.join(folder, "w%d.log" % i), 600) for i in range(2))
        state = final.get("state", "unknown")
        if died is not None and state != "JOB_STATE_SUCCEEDED":
            state = "incomplete: a worker died (%s)" % (
                "OOM-killed" if oom_kills else "exit codes %s" % worker_codes)
        return {"gb": gb, "bytes": nbytes, "files": files, "hwm_kb": hwm, "anon_kb": anon,
                "cgroup_max": max_usage, "cgroup_rss": cg_rss, "failcnt": failcnt,
                "oom_kills": oom_kills, "state": state,
                "message": final.get("message", ""), "coordinator_code": coordinator.returncode,
                "worker_codes": worker_codes, "rate": rate, "seconds": seconds,
                "worker_logs": logs}
    finally:
        PROCS.kill_all()
        for _ in range(100):
            try:
                os.rmdir(cg)
                break
            except OSError:
                time.sleep(0.1)
        else:
            log("could not remove the cgroup", cg)


def part_rss(args, work):
    if not os.access(CGROUP_V1, os.W_OK):
        raise RuntimeError("the rss part needs a writable cgroup v1 memory controller at " +
                           CGROUP_V1)
    sizes = [0.05, 0.1, 0.2] if args.quick and not args.rss_sizes else (
        args.rss_sizes or [0.25, 0.5, 1.0, 2.0])
    limit = args.rss_limit_mb << 20
    blobs = noise_jpegs(64, args.rss_side)
    root = os.path.join(work, "rss-data")
    files, nbytes = 0, 0
    rows = []
    # One folder, grown from one size to the next (fewer files to write and
    # remove: on a slow disk that is most of the part's time).
    for gb in sorted(sizes):
        start = time.time()
        files, nbytes = grow_folder(root, blobs, files, nbytes, gb * 1e9)
        log("%.2f GB in %d %dx%d JPEGs (written in %.0fs)" % (
            nbytes / 1e9, files, args.rss_side, args.rss_side, time.time() - start))
        r = rss_run(args, work, gb, root, files, nbytes, limit)
        rows.append(r)
        log("%g GB: %s in %.0fs, worker peak RSS %s MiB (anon %s MiB), cgroup max "
            "usage %.0f MiB (rss %.0f MiB), OOM kills %d, %.0f images/s" % (
                gb, r["state"], r["seconds"], "/".join("%.0f" % (k / 1024) for k in
                                                       r["hwm_kb"]),
                "/".join("%.0f" % (k / 1024) for k in r["anon_kb"]),
                r["cgroup_max"] / 2**20, r["cgroup_rss"] / 2**20, r["oom_kills"], r["rate"]))
        if r["state"] != "JOB_STATE_SUCCEEDED":
            log("job message:", r["message"], "\n", r["worker_logs"])
    start = time.time()
    shutil.rmtree(root, ignore_errors=True)
    log("removed the folder in %.0fs" % (time.time() - start))
    mib = lambda b: b / 2**20  # noqa: E731
    out = ["## Peak RSS against dataset size, under a memory cgroup", "",
           "One job (2 workers, `mlp`, one epoch, batch 64 per worker, `RandomResizedCrop` 64 "
           "+ flip + Normalize, `loaderThreads` and `prefetchBatches` at their defaults, 2 and "
           "4, one intra-op thread) over a folder of %dx%d noise JPEGs (about %.0f KB each; "
           "each a file of its own, identical bytes repeated), grown from one size to the "
           "next between runs. Both workers run "
           "in one cgroup v1 memory group limited to %d MiB, smaller than the largest folder, "
           "so the dataset can't stay in memory; the files are dropped from the page cache "
           "before each run, and the coordinator runs outside the group. Peak RSS is each "
           "worker's `VmHWM` (file-backed pages such as LibTorch's code included; *anon* is the "
           "largest `RssAnon` sampled every 0.1 s); the group's maximum usage counts the page "
           "cache its workers filled too." % (
               args.rss_side, args.rss_side,
               rows[0]["bytes"] / rows[0]["files"] / 1e3 if rows else 0, args.rss_limit_mb), "",
           "| dataset on disk | files | job | peak RSS w0 / w1 (MiB) | peak anon w0 / w1 (MiB) | "
           "group's max usage, with page cache (MiB) | group's peak RSS (MiB) | OOM kills | "
           "training images/s |",
           "| ---: | ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for r in rows:
        state = r["state"].replace("JOB_STATE_", "").lower()
        out.append("| %.2f GB | %d | %s | %.0f / %.0f | %.0f / %.0f | %.0f | %.0f | %d | %.0f |" % (
            r["bytes"] / 1e9, r["files"], state, r["hwm_kb"][0] / 1024, r["hwm_kb"][1] / 1024,
            r["anon_kb"][0] / 1024, r["anon_kb"][1] / 1024, mib(r["cgroup_max"]),
            mib(r["cgroup_rss"]), r["oom_kills"], r["rate"]))
    out += [""] + summary_rss(rows, args.rss_limit_mb) + [""]
    return out


def summary_rss(rows, limit_mb):
    if not rows:
        return []
    ok = all(r["state"] == "JOB_STATE_SUCCEEDED" and r["oom_kills"] == 0 for r in rows)
    peaks = [max(r["hwm_kb"]) / 1024 for r in rows]
    grow = peaks[-1] - peaks[0]
    text = ("From %.2f to %.2f GB on disk the largest worker peak RSS goes from %.0f to %.0f "
            "MiB (%+.0f MiB): %s. " % (
                rows[0]["bytes"] / 1e9, rows[-1]["bytes"] / 1e9, peaks[0], peaks[-1], grow,
                "flat, memory holds a few batches and not the dataset"
                if abs(grow) < 0.1 * peaks[0] + 20 else "it grows with the dataset"))
    if ok:
        text += ("Every job completed under the %d MiB limit with no OOM kill; the group's "
                 "usage stops at the limit only because the page cache fills it and is "
                 "reclaimed." % limit_mb
                 if any(r["cgroup_max"] > 0.9 * (limit_mb << 20) for r in rows)
                 else "Every job completed under the %d MiB limit with no OOM kill." % limit_mb)
    else:
        bad = ["%.2f GB: %s, %d OOM kill(s), worker exit codes %s%s" % (
            r["bytes"] / 1e9, r["state"], r["oom_kills"], r["worker_codes"],
            (" (%s)" % r["message"][:200]) if r["message"] else "")
            for r in rows if r["state"] != "JOB_STATE_SUCCEEDED" or r["oom_kills"]]
        text += "Not every job completed under the %d MiB limit: %s." % (limit_mb,
                                                                          "; ".join(bad))
    return [text]


# ---------------------------------------------------------------- the page


def previous_sections(path):
    """{part: lines} of the sections an earlier run wrote (between the
    <!-- data_bench:PART --> markers), kept when this run skips a part."""
    try:
        with open(path) as f:
            text = f.read()
    except OSError:
        return {}
    out = {}
    for m in re.finditer(r"<!-- data_bench:(\w+) -->\n(.*?)<!-- /data_bench:\1 -->", text, re.S):
        out[m.group(1)] = m.group(2).rstrip("\n").split("\n")
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--bin", default=os.path.join(ROOT, "build", "bin"),
                    help="folder of ddp-run, ddp-coordinator, ddp-worker and "
                    "ddp_image_loader_bench")
    ap.add_argument("--out", help="the page to write (default docs/DATA.md; with --quick, "
                    "none unless given)")
    ap.add_argument("--only", action="append", choices=PARTS,
                    help="run this part only (repeatable); the page keeps the other parts' "
                    "sections from its last full run")
    ap.add_argument("--quick", action="store_true", help="small sizes and few steps: a smoke "
                    "run of every part in about two minutes")
    ap.add_argument("--images", type=int, help="loader: JPEGs per folder (2000)")
    ap.add_argument("--repeats", type=int, help="loader: runs of each, best taken (3)")
    ap.add_argument("--train-images", type=int,
                    help="training: JPEGs in the folder (6000: one epoch holds every step)")
    ap.add_argument("--rss-sizes", type=float, nargs="+",
                    help="rss: dataset sizes in GB (0.25 0.5 1 2)")
    ap.add_argument("--rss-limit-mb", type=int, default=768,
                    help="rss: the workers' cgroup memory limit in MiB (768)")
    ap.add_argument("--rss-side", type=int, default=512,
                    help="rss: the JPEGs' width and height (512: about 240 KB each)")
    ap.add_argument("--timeout", type=int, default=600, help="seconds any one run may take")
    args = ap.parse_args()
    args.bin = os.path.abspath(args.bin)
    args.images = args.images or (500 if args.quick else 2000)
    args.repeats = args.repeats or (1 if args.quick else 3)
    args.train_images = args.train_images or (2000 if args.quick else 6000)
    out_path = args.out or (None if args.quick else os.path.join(ROOT, "docs", "DATA.md"))
    parts = args.only or list(PARTS)

    work = tempfile.mkdtemp(prefix="ddp-databench-")
    # The coordinators' token files go here, not to /tmp/ddp-UID.
    args.runtime_dir = os.path.join(work, "run")
    os.mkdir(args.runtime_dir, 0o700)
    sections = {}
    started = time.time()
    try:
        for part in PARTS:
            if part in parts:
                log("--- %s" % part)
                sections[part] = {"loader": part_loader, "training": part_training,
                                  "rss": part_rss}[part](args, work)
    finally:
        PROCS.kill_all()
        shutil.rmtree(work, ignore_errors=True)
    log("done in %.0fs" % (time.time() - started))
    if out_path is None:
        print("\n".join(line for part in PARTS for line in sections.get(part, [])))
        return
    kept = previous_sections(out_path)
    page = ["# Image folders: ours against PyTorch's", "",
            "Written by `bench/data_bench.py` (do not edit by hand; `--only PART` reruns one "
            "section and keeps the others). Each section's numbers come from one run on this "
            "machine (%d cores, %s; Python %s, torch %s), ours and PyTorch's in the same run, "
            "while other work (builds) shared the CPU at times: absolute numbers move from run "
            "to run, the ratios are what matter." % (
                os.cpu_count(), platform.machine(), platform.python_version(), torch_version()),
            ""]
    for part in PARTS:
        lines = sections.get(part) or kept.get(part) or [
            "## %s" % part, "", "Not measured yet (`bench/data_bench.py --only %s`)." % part, ""]
        page += ["<!-- data_bench:%s -->" % part] + lines + ["<!-- /data_bench:%s -->" % part,
                                                             ""]
    with open(out_path, "w") as f:
        f.write("\n".join(page))
    log("wrote", out_path)


def torch_version():
    try:
        out = subprocess.run([sys.executable, "-c", "import torch; print(torch.__version__)"],
                             capture_output=True, text=True, timeout=120)
        return out.stdout.strip() or "?"
    except (OSError, subprocess.TimeoutExpired):
        return "?"


if __name__ == "__main__":
    main()
