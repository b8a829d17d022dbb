#!/usr/bin/python3
"""PyTorch DDP running one of our job files, written the way a user writes it by
hand: DistributedSampler + DataLoader + DistributedDataParallel, gloo backend.

It is the yardstick our workers are compared with, for numbers (tests/py) and
for speed (bench/). One process per rank, started with env:// variables,
since Debian's torchrun fails on Python 3.11:

    MASTER_ADDR=127.0.0.1 MASTER_PORT=29500 WORLD_SIZE=2 RANK=0 \\
        pytorch_ddp.py --job job.json --metrics /tmp/ref-rank0.jsonl

Same data, same initial weights (built-in models are seeded like ours; a
TorchScript file is loaded as it is), same sampler, same optimizer math.
"""
import argparse
import contextlib
import json
import os
import sys
import time

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook as powersgd
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler

# load_dataset: one copy, shared with the tests that compare with this script.
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "py"))
from harness import load_dataset  # noqa: E402


class Mlp(nn.Module):
    def __init__(self, inputs, classes):
        super().__init__()
        self.fc1 = nn.Linear(inputs, 256)
        self.fc2 = nn.Linear(256, 128)
        self.fc3 = nn.Linear(128, classes)

    def forward(self, x):
        x = x.flatten(1)
        return self.fc3(F.relu(self.fc2(F.relu(self.fc1(x)))))


class Cnn(nn.Module):
    def __init__(self, classes, channels=1):
        super().__init__()
        self.conv1 = nn.Conv2d(channels, 16, 3, padding=1)
        self.conv2 = nn.Conv2d(16, 32, 3, padding=1)
        self.fc1 = nn.Linear(32 * 7 * 7, 128)
        self.fc2 = nn.Linear(128, classes)

    def forward(self, x):
        x = F.max_pool2d(F.relu(self.conv1(x)), 2)
        x = F.max_pool2d(F.relu(self.conv2(x)), 2)
        return self.fc2(F.relu(self.fc1(x.flatten(1))))


class BasicBlock(nn.Module):
    """torchvision's BasicBlock, built in the order worker/model.cc builds it
    (so one seed gives both the same weights)."""

    def __init__(self, inputs, outputs, stride):
        super().__init__()
        self.conv1 = nn.Conv2d(inputs, outputs, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(outputs)
        self.conv2 = nn.Conv2d(outputs, outputs, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(outputs)
        self.downsample = None
        if stride != 1 or inputs != outputs:
            self.downsample = nn.Sequential(nn.Conv2d(inputs, outputs, 1, stride, bias=False),
                                            nn.BatchNorm2d(outputs))

    def forward(self, x):
        y = self.bn2(self.conv2(F.relu(self.bn1(self.conv1(x)))))
        return F.relu(y + (self.downsample(x) if self.downsample is not None else x))


class ResNet18(nn.Module):
    """Our built-in "resnet18": ResNet-18 with a 3x3 stem and no max-pool."""

    def __init__(self, channels, classes):
        super().__init__()
        self.conv1 = nn.Conv2d(channels, 64, 3, 1, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(64)
        self.layer1 = nn.Sequential(BasicBlock(64, 64, 1), BasicBlock(64, 64, 1))
        self.layer2 = nn.Sequential(BasicBlock(64, 128, 2), BasicBlock(128, 128, 1))
        self.layer3 = nn.Sequential(BasicBlock(128, 256, 2), BasicBlock(256, 256, 1))
        self.layer4 = nn.Sequential(BasicBlock(256, 512, 2), BasicBlock(512, 512, 1))
        self.fc = nn.Linear(512, classes)

    def forward(self, x):
        x = F.relu(self.bn1(self.conv1(x)))
        x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
        return self.fc(F.adaptive_avg_pool2d(x, 1).flatten(1))


def make_model(spec, sample_shape, classes, seed):
    kind = spec.get("kind", "cnn")
    if kind == "torchscript":
        return torch.jit.load(spec["path"])
    torch.manual_seed(seed)
    if kind == "mlp":
        inputs = 1
        for d in sample_shape:
            inputs *= d
        return Mlp(inputs, classes)
    if kind == "resnet18":
        return ResNet18(sample_shape[0], classes)
    return Cnn(classes)


def bf16_compress_hook_over_gloo(process_group, bucket):
    """PyTorch's bf16_compress_hook, whose bfloat16 all-reduce Gloo can't run
    ("Invalid scalar type"): the same cast and division in bfloat16, the sum
    carried in float32 and rounded back to bfloat16. For two ranks that is
    one rounding of the exact sum, what a bfloat16 add gives."""
    group = process_group if process_group is not None else dist.group.WORLD
    compressed = bucket.buffer().to(torch.bfloat16).div_(group.size())
    future = dist.all_reduce(compressed.float(), group=group, async_op=True).get_future()

    def decompress(fut):
        out = bucket.buffer()
        out.copy_(fut.value()[0].to(torch.bfloat16))
        return out
    return future.then(decompress)


def one_bucket_at_a_time(hook):
    """`hook`, waited for before backward goes on. PyTorch 1.13's
    powerSGD_hook starts a bucket's all-reduces from the previous bucket's
    callbacks; over Gloo, two ranks can then post them in different orders
    and Gloo aborts ("op.preamble.length <= op.nbytes", seen with ResNet-18 on
    small images). Waiting keeps every rank's collectives in one order and
    changes no number; it costs the overlap between buckets."""
    def serialized(state, bucket):
        future = hook(state, bucket)
        future.wait()
        return future
    return serialized


def register_compression(ddp, job, serialize=False):
    """Our job's `compression`, as the matching PyTorch comm hook (with
    `serialize`, PowerSGD's one bucket at a time)."""
    compression = job.get("compression", "none")
    if compression == "fp16":
        ddp.register_comm_hook(None, default_hooks.fp16_compress_hook)
    elif compression == "bf16":
        ddp.register_comm_hook(None, bf16_compress_hook_over_gloo)
    elif compression == "powersgd":
        state = powersgd.PowerSGDState(
            process_group=None, matrix_approximation_rank=int(job.get("powersgdRank", 1)),
            start_powerSGD_iter=int(job.get("powersgdStartStep", 1000)))
        hook = powersgd.powerSGD_hook
        ddp.register_comm_hook(state, one_bucket_at_a_time(hook) if serialize else hook)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--job", required=True, help="one of our JobSpec JSON files")
    parser.add_argument("--metrics", help="write each step's ddp.v1.StepRecord here, as the "
                        "worker's --metrics_file does (a JSON line; only the fields PyTorch has)")
    parser.add_argument("--output", help="rank 0 saves the trained state dict here")
    parser.add_argument("--threads", type=int, default=1, help="torch.set_num_threads")
    parser.add_argument("--find-unused-parameters", action="store_true")
    parser.add_argument("--device", default="cpu",
                        help="cpu or cuda:N: the model and each batch there, with TF32 off and "
                        "deterministic algorithms (as ddp-worker --deterministic)")
    parser.add_argument("--no-ddp", action="store_true",
                        help="one process, no DistributedDataParallel (the single-GPU ceiling)")
    parser.add_argument("--serialize-hook", action="store_true",
                        help="wait for PowerSGD's hook bucket by bucket (see one_bucket_at_a_time)")
    args = parser.parse_args()
    with open(args.job) as f:
        job = json.load(f)
    torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    if device.type == "cuda":
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
        torch.backends.cudnn.benchmark = False
        torch.use_deterministic_algorithms(True)
        torch.cuda.set_device(device)
    if args.no_ddp:
        rank, world = 0, 1
    else:
        dist.init_process_group("gloo")
        rank, world = dist.get_rank(), dist.get_world_size()

    seed = int(job.get("seed", 0))
    train_x, train_y, test_x, test_y = load_dataset(job.get("dataset", {}), seed)
    classes = int(max(train_y.max(), test_y.max() if test_y is not None else 0)) + 1
    model = make_model(job.get("model", {}), list(train_x.shape[1:]), classes, seed).to(device)
    if args.no_ddp:
        ddp = model
        ddp.no_sync = contextlib.nullcontext
    else:
        ddp = DDP(model, bucket_cap_mb=float(job.get("bucketCapMb", 25)),
                  device_ids=[device.index or 0] if device.type == "cuda" else None,
                  find_unused_parameters=args.find_unused_parameters)
        register_compression(ddp, job, args.serialize_hook)

    shuffle = job.get("shuffle", True)
    drop_last = job.get("dropLast", False)
    dataset = TensorDataset(train_x, train_y)
    sampler = DistributedSampler(dataset, num_replicas=world, rank=rank, shuffle=shuffle,
                                 seed=seed, drop_last=drop_last)
    batch = int(job.get("batchSize", 64))
    loader = DataLoader(dataset, batch_size=batch, sampler=sampler, drop_last=drop_last)

    opt_spec = job.get("optimizer", {})
    if opt_spec.get("kind", "sgd") == "adam":
        optimizer = torch.optim.Adam(
            ddp.parameters(), lr=opt_spec.get("lr", 0.001),
            betas=(opt_spec.get("beta1", 0.9), opt_spec.get("beta2", 0.999)),
            eps=opt_spec.get("eps", 1e-8), weight_decay=opt_spec.get("weightDecay", 0))
    else:
        optimizer = torch.optim.SGD(
            ddp.parameters(), lr=opt_spec.get("lr", 0.01), momentum=opt_spec.get("momentum", 0),
            weight_decay=opt_spec.get("weightDecay", 0), nesterov=opt_spec.get("nesterov", False))
    loss_fn = F.nll_loss if job.get("loss") == "nll" else F.cross_entropy
    k = int(job.get("gradientAccumulationSteps", 1))
    max_steps = int(job.get("maxSteps", 0))

    metrics = open(args.metrics, "w") if args.metrics else None
    step = 0
    for epoch in range(int(job.get("epochs", 1))):
        sampler.set_epoch(epoch)
        iterator = iter(loader)
        micro = len(loader)
        for first in range(0, micro, k):
            t0 = time.perf_counter()
            group = min(k, micro - first)
            optimizer.zero_grad()
            step_loss = 0.0
            n = 0
            for m in range(group):
                x, y = next(iterator)
                x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
                if m < group - 1:
                    with ddp.no_sync():
                        loss = loss_fn(ddp(x), y)
                        (loss / group).backward()
                else:
                    loss = loss_fn(ddp(x), y)
                    (loss / group).backward()
                step_loss += loss.item() / group
                n += x.shape[0]
            optimizer.step()
            step += 1
            if metrics:
                seconds = time.perf_counter() - t0
                metrics.write(json.dumps({"time": time.time(), "rank": rank, "report": {
                    "epoch": epoch, "step": step, "loss": step_loss, "samples": n,
                    "step_seconds": seconds}}) + "\n")
            if step == max_steps:
                break
        if step == max_steps:
            break
    if metrics:
        metrics.close()
    if rank == 0 and args.output:
        torch.save({k: v.detach().cpu() for k, v in model.state_dict().items()}, args.output)
    if not args.no_ddp:
        dist.destroy_process_group()
    if job.get("compression", "none") != "none":
        # PyTorch 1.13 deadlocks at exit with a Python comm hook on Gloo
        # (seen in gdb: the reducer's destructor joins Gloo's worker thread
        # while holding the GIL that thread waits for). Everything is
        # written: leave without the teardown.
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)


if __name__ == "__main__":
    main()
