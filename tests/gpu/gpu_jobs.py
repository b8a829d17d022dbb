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
Not here yet (issue 22, item 5): parity against PyTorch DDP on the GPU, and
the ResNet-18 and single-GPU throughput comparisons."""
import json
import os
import signal
import sys
import time
import traceback

HERE = os.path.dirname(os.path.abspath(__file__))
os.environ["DDP_BIN"] = os.path.join(os.path.abspath(sys.argv[1]), "bin")
sys.path.insert(0, os.path.join(HERE, "../py"))
from cluster import Cluster, synthetic_job  # noqa: E402
from harness import wait_for  # noqa: E402

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


def main():
    out = sys.argv[2]
    results = {}
    for check in (one_worker_on_the_gpu, kill_one_of_three):
        start = time.time()
        try:
            results[check.__name__] = {"ok": True, **check()}
        except Exception:  # noqa: BLE001 - recorded, and the next check runs
            results[check.__name__] = {"ok": False, "error": traceback.format_exc()[-3000:]}
        results[check.__name__]["seconds"] = round(time.time() - start, 1)
        print(check.__name__, json.dumps(results[check.__name__])[:2000], flush=True)
    with open(os.path.join(out, "jobs.json"), "w") as f:
        json.dump(results, f, indent=2)
    sys.exit(0 if all(r["ok"] for r in results.values()) else 1)


if __name__ == "__main__":
    main()
