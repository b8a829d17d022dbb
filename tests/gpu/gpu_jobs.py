#!/usr/bin/env python3
"""The GPU checks that run the real daemons (device_check.sh's gpu_jobs step):
usage: gpu_jobs.py BUILD_DIR OUT_DIR. Writes OUT_DIR/jobs.json, one entry per
check with what it measured. Each check is bounded; a failure is recorded
and the next one still runs.

- one_worker_on_the_gpu: one ddp-worker --device cuda:0 trains a job alone
  (auto backend: NCCL at world 1), to SUCCEEDED; samples/s as reported.
- kill_one_of_three: three workers on cuda:0 (Gloo: NCCL refuses two ranks
  on one device, so gradients are staged through pinned host memory; each
  worker has its own loopback address, as the coordinator takes one worker
  per host and device); one is killed with SIGKILL mid-training, the
  survivors re-form and the job succeeds.
- parity_with_pytorch_ddp: two workers on cuda:0 (Gloo, staged) against
  PyTorch DDP with two gloo ranks on cuda:0 (bench/pytorch_ddp.py), the CNN,
  100 steps, TF32 off and deterministic algorithms on both sides: every
  step's loss on every rank equal to 1e-5.
- single_gpu_ceiling: one worker (NCCL at world 1) against single-process
  PyTorch on the GPU: losses equal to 1e-5, and samples/s (median step)
  within 5%.
- resnet18_throughput: ResNet-18, batch 128, two ranks on the one GPU, ours
  against PyTorch DDP in the same run (median step time after warm-up).
Each writes what it measured; only the parity and the ceiling's losses are
pass/fail besides the jobs succeeding (a timing is reported, not judged,
except the ceiling's 5%)."""
import json
import os
import signal
import statistics
import sys
import tempfile
import time
import traceback

HERE = os.path.dirname(os.path.abspath(__file__))
os.environ["DDP_BIN"] = os.path.join(os.path.abspath(sys.argv[1]), "bin")
# The PyTorch reference runs on this Python (the GPU machine's has CUDA).
os.environ.setdefault("DDP_PYTHON", sys.executable)
sys.path.insert(0, os.path.join(HERE, "../py"))
from cluster import Cluster, synthetic_job  # noqa: E402
from harness import read_step_records, run_reference, wait_for  # noqa: E402

# DDP_CHECK_DEVICE=cpu:0 runs the same checks on a CPU (how the script itself
# is tried without a GPU).
DEVICE = os.environ.get("DDP_CHECK_DEVICE", "cuda:0")


def gpu_job(name, workers, **overrides):
    job = synthetic_job(name, workers, **overrides)
    job.update({"dataset": {"kind": "synthetic", "trainSize": 65536, "testSize": 1024},
                "batchSize": 256, "epochs": 3})
    job.update(overrides)
    return job


def one_worker_on_the_gpu():
    cluster = Cluster(job=gpu_job("gpu-one", 1, backend="auto"))
    try:
        start = time.time()
        cluster.start_worker(0, extra=["--device=" + DEVICE])
        status = cluster.wait_state(["JOB_STATE_SUCCEEDED", "JOB_STATE_FAILED"], timeout=150)
        seconds = time.time() - start
        assert status["state"] == "JOB_STATE_SUCCEEDED", status
        # Wall time from the worker's start: preparing the job included.
        return {"state": status["state"], "steps": status.get("global_step"),
                "samples_per_second_wall": round(65536 * 3 / seconds),
                "worker_log_tail": cluster.log("w0")[-1500:]}
    finally:
        cluster.stop()


def kill_one_of_three():
    cluster = Cluster(job=gpu_job("gpu-kill", 3, backend="gloo", minWorkers=2, maxWorkers=3,
                                  epochs=6))
    try:
        workers = [cluster.start_worker(i, extra=["--device=" + DEVICE, "--host=127.0.0.%d" % (i + 1)])
                   for i in range(3)]
        wait_for(lambda: int(cluster.status().get("global_step", 0)) > 30, 120,
                 "three workers on cuda:0 to train")
        workers[2].send_signal(signal.SIGKILL)
        killed_at = time.time()
        status = cluster.wait_state(["JOB_STATE_SUCCEEDED", "JOB_STATE_FAILED"], timeout=150)
        assert status["state"] == "JOB_STATE_SUCCEEDED", status
        return {"state": status["state"], "generation": status.get("generation"),
                "seconds_after_the_kill": round(time.time() - killed_at, 1)}
    finally:
        cluster.stop()


def image_data(folder, name, shape, train, test, seed=3):
    """Class prototypes plus noise, saved as the tensors dataset kind reads."""
    import torch
    g = torch.Generator()
    g.manual_seed(seed)
    prototypes = torch.randn(10, *shape, generator=g)
    y = torch.randint(10, (train + test,), generator=g)
    x = prototypes[y] + torch.randn(train + test, *shape, generator=g)
    paths = [os.path.join(folder, "%s-%s.pt" % (name, part)) for part in ("train", "test")]
    torch.save((x[:train].clone(), y[:train].clone()), paths[0])
    torch.save((x[train:].clone(), y[train:].clone()), paths[1])
    return {"kind": "tensors", "path": paths[0], "testPath": paths[1]}


def run_ours(job, workers, extra=()):
    """The job on `workers` ddp-workers on DEVICE (each its own loopback
    address), to SUCCEEDED; each rank's step records."""
    cluster = Cluster(job=job)
    try:
        files = [os.path.join(cluster.dir, "metrics-%d.jsonl" % i) for i in range(workers)]
        for i in range(workers):
            cluster.start_worker(i, extra=["--device=" + DEVICE, "--host=127.0.0.%d" % (i + 1),
                                           "--metrics_file=" + files[i]] + list(extra))
        status = cluster.wait_state(["JOB_STATE_SUCCEEDED", "JOB_STATE_FAILED"], timeout=200)
        assert status["state"] == "JOB_STATE_SUCCEEDED", status
        by_rank = {}
        for f in files:
            for r in read_step_records(f):
                by_rank.setdefault(r["rank"], []).append(r)
        return [by_rank[r] for r in sorted(by_rank)]
    finally:
        cluster.stop()


def run_pytorch(job, ranks, folder, extra=()):
    job_file = os.path.join(folder, job["name"] + ".json")
    with open(job_file, "w") as f:
        json.dump(job, f)
    return run_reference(job_file, ranks, folder, extra=["--device", DEVICE] + list(extra),
                         timeout=200)


def largest_loss_difference(ours, ref, steps):
    worst = 0.0
    for rank, (a, b) in enumerate(zip(ours, ref)):
        assert len(a) == len(b) == steps, "rank %d: %d and %d steps" % (rank, len(a), len(b))
        for step, (x, y) in enumerate(zip(a, b), start=1):
            difference = abs(x["loss"] - y["loss"])
            assert difference <= 1e-5 * max(1.0, abs(y["loss"])), (
                "rank %d step %d: loss %.8g against PyTorch's %.8g" % (rank, step, x["loss"],
                                                                       y["loss"]))
            worst = max(worst, difference)
    return worst


def median_step_seconds(records, skip=5):
    return statistics.median(r["step_seconds"] for r in records[skip:])


def parity_with_pytorch_ddp():
    folder = tempfile.mkdtemp(prefix="ddp-gpu-parity-")
    # 3200 samples, 2 ranks, 32 a batch: 50 steps an epoch, 100 in two.
    job = {"name": "gpu-parity", "model": {"kind": "cnn"},
           "dataset": image_data(folder, "mnistlike", (1, 28, 28), 3200, 256),
           "optimizer": {"kind": "sgd", "lr": 0.05, "momentum": 0.9}, "batchSize": 32,
           "epochs": 2, "seed": 7, "backend": "gloo", "bucketCapMb": 0.1,
           "minWorkers": 2, "maxWorkers": 2, "settleSeconds": 0}
    ours = run_ours(job, 2, extra=["--deterministic"])
    ref = run_pytorch(job, 2, folder)
    return {"steps": 100, "largest_loss_difference": largest_loss_difference(ours, ref, 100)}


def single_gpu_ceiling():
    folder = tempfile.mkdtemp(prefix="ddp-gpu-ceiling-")
    job = {"name": "gpu-ceiling", "model": {"kind": "cnn"},
           "dataset": image_data(folder, "mnistlike", (1, 28, 28), 12800, 256),
           "optimizer": {"kind": "sgd", "lr": 0.05, "momentum": 0.9}, "batchSize": 128,
           "epochs": 1, "seed": 7, "backend": "auto", "minWorkers": 1, "maxWorkers": 1,
           "settleSeconds": 0}
    ours = run_ours(job, 1, extra=["--deterministic"])
    ref = run_pytorch(job, 1, folder, extra=["--no-ddp"])
    worst = largest_loss_difference(ours, ref, 100)
    ours_s, ref_s = median_step_seconds(ours[0]), median_step_seconds(ref[0])
    ratio = ref_s / ours_s
    assert ratio >= 0.95, "ours %.2f ms a step, PyTorch %.2f ms" % (1e3 * ours_s, 1e3 * ref_s)
    return {"largest_loss_difference": worst, "ours_ms_per_step": round(1e3 * ours_s, 3),
            "pytorch_ms_per_step": round(1e3 * ref_s, 3), "speed_vs_pytorch": round(ratio, 3)}


def resnet18_throughput():
    folder = tempfile.mkdtemp(prefix="ddp-gpu-resnet-")
    # 2 ranks x 128 a batch x 20 steps.
    job = {"name": "gpu-resnet18", "model": {"kind": "resnet18"},
           "dataset": image_data(folder, "rgb", (3, 32, 32), 5120, 256),
           "optimizer": {"kind": "sgd", "lr": 0.02, "momentum": 0.9}, "batchSize": 128,
           "epochs": 1, "seed": 11, "backend": "gloo", "minWorkers": 2, "maxWorkers": 2,
           "settleSeconds": 0, "evaluate": False}
    ours = run_ours(job, 2)
    ref = run_pytorch(job, 2, folder)
    ours_s, ref_s = median_step_seconds(ours[0]), median_step_seconds(ref[0])
    samples = 2 * 128
    return {"ours_samples_per_second": round(samples / ours_s),
            "pytorch_samples_per_second": round(samples / ref_s),
            "speed_vs_pytorch": round(ref_s / ours_s, 3)}


def main():
    out = sys.argv[2]
    results = {}
    only = os.environ.get("DDP_CHECKS", "").split(",")
    checks = (one_worker_on_the_gpu, kill_one_of_three, parity_with_pytorch_ddp,
              single_gpu_ceiling, resnet18_throughput)
    for check in checks:
        if only != [""] and check.__name__ not in only:
            continue
        start = time.time()
        try:
            results[check.__name__] = {"ok": True, **check()}
        except Exception:  # noqa: BLE001 - recorded, and the next check runs
            results[check.__name__] = {"ok": False, "error": traceback.format_exc()[-3000:]}
        results[check.__name__]["seconds"] = round(time.time() - start, 1)
        print(check.__name__, json.dumps(results[check.__name__])[:2000], flush=True)
        # After each check: the step's time limit may cut the next one short.
        with open(os.path.join(out, "jobs.json"), "w") as f:
            json.dump(results, f, indent=2)
    sys.exit(0 if all(r["ok"] for r in results.values()) else 1)


if __name__ == "__main__":
    main()
