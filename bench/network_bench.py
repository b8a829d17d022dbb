#!/usr/bin/env python3
"""Training across test hosts on shaped links: ours (compression none, fp16,
bf16) and PyTorch DDP (no hook, fp16_compress_hook), each against the floor a
perfect system could reach.

Two hosts are network namespaces on a bridge (tests/py/netns.py), each with a
host name of its own so that `backend: auto` picks Gloo's TCP ring; the
coordinator sits in a third. Both workers' links are limited with tc's tbf to
the rate in both directions. One worker per host, one thread each.

The floor of a step is max(one rank's compute time for the step alone, the
ring all-reduce of the gradient at the link's rate). A two-rank ring sends
each rank's whole gradient once over its link (half in the reduce-scatter,
half in the all-gather), so that time is gradient bytes x 8 / rate.
Efficiency = floor / actual step time.

Needs root (namespaces, tc). Writes docs/network_benchmarks.json (--out to
change) and, beside it, NETWORK_BENCHMARKS.md. netem is often missing from
the kernel (then no added delay: links are rate-limited only)."""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(REPO, "tests", "py"))
import netns  # noqa: E402
from harness import (BIN, PYTHON, RunFolder, read_step_records, thread_env,  # noqa: E402
                     wait_listening)

REFERENCE = os.path.join(REPO, "bench", "pytorch_ddp.py")
PORT = 29400


def log(*args):
    print(time.strftime("%H:%M:%S"), *args, file=sys.stderr, flush=True)


def write_job(folder, name, model, compression, steps):
    job = {"name": name, "model": {"kind": model}, "dataset": {"kind": "fashion-mnist"},
           "optimizer": {"kind": "sgd", "lr": 0.01, "momentum": 0.9}, "batchSize": 64,
           "epochs": 1, "maxSteps": steps, "evaluate": False, "seed": 1, "backend": "auto",
           "minWorkers": 2, "compression": compression}
    path = os.path.join(folder, name + ".json")
    with open(path, "w") as f:
        json.dump(job, f)
    return path


def step_stats(ranks, skip):
    """Median step seconds after `skip` warm-up steps (slowest rank), and
    samples/s summed over the ranks over those steps."""
    rate, medians = 0.0, []
    for records in ranks:
        steady = records[skip:] or records
        seconds = steady[-1]["time"] - steady[0]["time"] + steady[0]["step_seconds"]
        rate += sum(r["samples"] for r in steady) / seconds
        medians.append(statistics.median(r["step_seconds"] for r in steady))
    return max(medians), rate


def run_ours(net, job_file, folder, workers):
    """The job on a coordinator in host 0 and `workers` workers in hosts 1..;
    each rank's step records."""
    run = RunFolder(folder)
    target = "%s:%d" % (net.hosts[0].ip, PORT)
    env = thread_env()
    procs = []
    with open(os.path.join(folder, "coordinator.log"), "w") as out:
        coordinator = net.popen(0, [os.path.join(BIN, "ddp-coordinator"), "--listen=" + target,
                                    "--job=" + job_file, "--insecure", "--exit_when_done"],
                                stdout=out, stderr=subprocess.STDOUT, env=env)
    try:
        wait_listening(net.hosts[0].ip, PORT, 30, "the coordinator", coordinator)
        for i in range(workers):
            name = "w%d" % i
            with open(os.path.join(folder, name + ".log"), "w") as out:
                procs.append(net.popen(i + 1, run.worker_command(
                    target, 0, name, net.hosts[i + 1].ip), stdout=out, stderr=subprocess.STDOUT,
                    env=env))
        coordinator.wait(timeout=1800)
        if coordinator.returncode != 0:
            raise RuntimeError("the job failed: " + run.log("coordinator")[-2000:])
    finally:
        for p in procs + [coordinator]:
            if p.poll() is None:
                p.kill()
            p.wait()
    return [run.metrics("w%d" % i) for i in range(workers)]


def run_torch(net, job_file, folder, hook):
    """bench/pytorch_ddp.py, rank r in host r + 1, with the job's
    compression as PyTorch's hook; each rank's step records."""
    procs = []
    for rank in range(2):
        # The host name resolves to nothing in a namespace: without the
        # interface, Gloo would fall back to loopback.
        env = thread_env(MASTER_ADDR=net.hosts[1].ip, MASTER_PORT=str(PORT + 1),
                         WORLD_SIZE="2", RANK=str(rank), GLOO_SOCKET_IFNAME="eth0")
        metrics = os.path.join(folder, "reference-%d.jsonl" % rank)
        with open(os.path.join(folder, "reference-%d.log" % rank), "w") as out:
            procs.append(net.popen(rank + 1, [PYTHON, REFERENCE, "--job", job_file, "--threads",
                                              "1", "--metrics", metrics],
                                   stdout=out, stderr=subprocess.STDOUT, env=env))
    try:
        deadline = time.time() + 1800
        while any(p.poll() is None for p in procs):
            if any(p.poll() for p in procs) or time.time() > deadline:
                raise RuntimeError("the PyTorch reference failed (%s)" % folder)
            time.sleep(0.2)
        if any(p.returncode for p in procs):
            raise RuntimeError("the PyTorch reference failed (%s)" % folder)
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    return [read_step_records(os.path.join(folder, "reference-%d.jsonl" % r)) for r in range(2)]


def gradient_bytes(records):
    """fp32 gradient bytes, from what our reduction reports (buckets carry a
    few flag and step words besides)."""
    return records[-1].get("bytes", 0)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rates", default="100mbit,1gbit,10gbit")
    parser.add_argument("--models", default="mlp,cnn")
    parser.add_argument("--systems", default="ours,pytorch")
    parser.add_argument("--compressions", default="none,fp16,bf16")
    parser.add_argument("--steps", type=int, default=150, help="steps per run (the first 20 "
                        "are warm-up)")
    parser.add_argument("--out", default=os.path.join(REPO, "docs", "network_benchmarks.json"))
    parser.add_argument("--from-json", action="store_true",
                        help="rewrite NETWORK_BENCHMARKS.md beside --out from it, running nothing")
    args = parser.parse_args()
    if args.from_json:
        write_markdown(args.out)
        return
    ok, why = netns.available()
    if not ok:
        sys.exit("network namespaces are not available here: " + why)
    work = tempfile.mkdtemp(prefix="ddp-netbench-")
    skip = 20
    results = []
    with netns.Network(["coord", "host-a", "host-b"]) as net:
        for model in args.models.split(","):
            # Compute alone: one worker, world 1, no network in the step.
            folder = tempfile.mkdtemp(prefix="alone-", dir=work)
            job = write_job(folder, "alone-" + model, model, "none", args.steps)
            with open(job) as f:
                spec = json.load(f)
            spec["minWorkers"] = 1
            with open(job, "w") as f:
                json.dump(spec, f)
            compute_s, _ = step_stats(run_ours(net, job, folder, 1), skip)
            log(model, "compute alone: %.2f ms a step" % (compute_s * 1e3))
            for rate in args.rates.split(","):
                for i in (1, 2):
                    net.shape(i, rate=rate)
                bits = netns._bits_per_second(rate)
                row = {"model": model, "rate": rate, "compute_ms": compute_s * 1e3, "runs": {}}
                kinds = args.compressions.split(",")
                systems = args.systems.split(",")
                configs = [("ours", c) for c in kinds if "ours" in systems] + [
                    ("pytorch", c) for c in kinds if "pytorch" in systems and c != "bf16"]
                for system, compression in configs:
                    folder = tempfile.mkdtemp(prefix="%s-%s-%s-%s-" % (
                        system, model, rate, compression), dir=work)
                    job = write_job(folder, "%s-%s" % (model, compression), model, compression,
                                    args.steps)
                    ranks = (run_ours(net, job, folder, 2) if system == "ours"
                             else run_torch(net, job, folder, compression))
                    step_s, samples = step_stats(ranks, skip)
                    if system == "ours" and compression == "none":
                        row["gradient_bytes"] = gradient_bytes(ranks[0])
                    wire = row.get("gradient_bytes", 0) / (2 if compression != "none" else 1)
                    floor_s = max(compute_s, wire * 8 / bits)
                    row["runs"]["%s/%s" % (system, compression)] = {
                        "step_ms": step_s * 1e3, "samples_per_s": samples,
                        "floor_ms": floor_s * 1e3, "efficiency": floor_s / step_s}
                    log(model, rate, system, compression, "%.2f ms a step, %.0f samples/s, "
                        "floor %.2f ms, efficiency %.2f" % (step_s * 1e3, samples,
                                                           floor_s * 1e3, floor_s / step_s))
                results.append(row)
                for i in (1, 2):
                    net.shape(i)
    meta = {"date": time.strftime("%Y-%m-%d"), "steps": args.steps, "warmup": skip}
    with open(args.out, "w") as f:
        json.dump(dict(meta, results=results), f, indent=1)
    write_markdown(args.out)


def write_markdown(json_path):
    with open(json_path) as f:
        data = json.load(f)
    text = markdown(data["results"], data)
    with open(os.path.join(os.path.dirname(json_path), "NETWORK_BENCHMARKS.md"), "w") as f:
        f.write(text)
    print(text)


HEADER = """# Training across hosts on shaped links

Written by `bench/network_bench.py` on %(date)s (%(steps)d steps a run, the first %(warmup)d
not counted). Two test hosts are network namespaces on a bridge, each with a host name of its
own (so `backend: auto` picks Gloo's TCP ring), one worker per host with one thread; both
links limited with tc's `tbf` to the rate, each way. The coordinator is in a third namespace.
PyTorch DDP (gloo) runs `bench/pytorch_ddp.py` on the same job file and the same links, with
`fp16_compress_hook` registered for fp16 (Gloo can't all-reduce bfloat16 in PyTorch 1.13, so
it has no bf16 row). The kernel here has no `netem`: links are rate-limited, with no added
delay.

**Floor** = max(one rank's compute time for the step alone, the all-reduce of its gradient at
the link's rate), where a two-rank ring sends each rank's whole gradient once over its link
(half in the reduce-scatter, half in the all-gather): gradient bytes x 8 / rate, halved by
compression. **Efficiency** = floor / the step time. Read it with two caveats: the compute time
is measured with one worker alone on a core, while in the runs both workers and the kernel's
network path (veth, bridge, tbf: real CPU at 10 Gbit/s) share this machine's 2 cores; and these
models' gradients fit in one bucket, so their all-reduce can't overlap backward, and
compute + all-reduce is what a step without overlap can reach.
"""


def markdown(results, meta):
    lines = [HEADER % meta]
    for row in results:
        runs = row["runs"]
        lines.append("\n## %s, %s link\n" % (row["model"].upper(), row["rate"]))
        lines.append("Compute alone %.2f ms a step; gradient %.2f MB.\n" % (
            row["compute_ms"], row.get("gradient_bytes", 0) / 1e6))
        lines.append("| system | compression | samples/s | step | floor | efficiency |")
        lines.append("| --- | --- | ---: | ---: | ---: | ---: |")
        for key, r in runs.items():
            system, compression = key.split("/")
            lines.append("| %s | %s | %.0f | %.2f ms | %.2f ms | %.0f%% |" % (
                "ours" if system == "ours" else "PyTorch DDP", compression, r["samples_per_s"],
                r["step_ms"], r["floor_ms"], 100 * r["efficiency"]))
        facts = []
        if "ours/none" in runs and "pytorch/none" in runs:
            facts.append("ours %.2fx PyTorch DDP uncompressed" % (
                runs["ours/none"]["samples_per_s"] / runs["pytorch/none"]["samples_per_s"]))
        for kind in ("fp16", "bf16"):
            if "ours/" + kind in runs and "ours/none" in runs:
                facts.append("%s %.2fx our uncompressed" % (
                    kind, runs["ours/" + kind]["samples_per_s"] / runs["ours/none"]["samples_per_s"]))
        if facts:
            lines.append("\n" + "; ".join(facts) + ".")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
