#!/usr/bin/python3
"""Runs every benchmark on this machine and writes docs/BENCHMARKS.md and its
plots. Every speed is a ratio against PyTorch DDP (Debian's python3-torch, the
same LibTorch build) measured here, in the same run, alternating with ours.

    bench/run.sh            # builds first; or, with build/ ready:
    bench/run_benchmarks.py [--quick]
"""
import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))
sys.path.insert(0, os.path.join(REPO, "tests", "py"))
# One core per worker for both systems: --threads=1 (LibTorch's intra-op
# pool) and thread_env() (OpenMP, OpenBLAS, MKL) in every process.
from harness import (BIN, PYTHON, free_port, read_step_records, run_ddp_run,  # noqa: E402
                     run_program, run_reference, samples_per_second, thread_env,
                     wait_port_file)

DOCS = os.path.join(REPO, "docs")
WORK = tempfile.mkdtemp(prefix="ddp-bench-")


def log(*args):
    print(time.strftime("%H:%M:%S"), *args, flush=True)


def median(xs):
    return statistics.median(xs) if xs else float("nan")


def write_job(name, job):
    path = os.path.join(WORK, name + ".json")
    with open(path, "w") as f:
        json.dump(job, f)
    return path


# ---------------------------------------------------------------- runners


def run_ours(job_file, nproc, worker_args=""):
    """ddp-run with one thread per worker. Returns samples/s over the training
    loop (all ranks), per-step medians, and rank 0's losses."""
    ranks = run_ddp_run(job_file, nproc, tempfile.mkdtemp(prefix="ours-", dir=WORK), worker_args,
                        timeout=1800)
    steps = ranks[0][5:] or ranks[0]
    keys = ["data_ms", "forward_ms", "backward_ms", "wait_ms", "optimizer_ms", "allreduce_ms"]
    breakdown = {k: median([x[k] for x in steps]) for k in keys}
    breakdown["step_ms"] = median([x["step_seconds"] * 1000 for x in steps])
    breakdown["buckets"] = steps[0]["buckets_total"]
    return {"rate": samples_per_second(ranks), "breakdown": breakdown,
            "losses": [x["loss"] for x in ranks[0]]}


def run_library(nproc):
    """The mlp job as a user's own loop on the ddp library
    (bench/library_mlp.cc) under ddp-run."""
    folder = tempfile.mkdtemp(prefix="library-", dir=WORK)
    prefix = os.path.join(folder, "steps")
    run_program([os.path.join(BIN, "ddp_bench_library_mlp"), prefix], nproc, folder, timeout=1800)
    ranks = [read_step_records("%s-%d.jsonl" % (prefix, r)) for r in range(nproc)]
    return {"rate": samples_per_second(ranks), "losses": [x["loss"] for x in ranks[0]]}


def run_torch(job_file, nproc):
    """The PyTorch reference on the same job file."""
    ranks = run_reference(job_file, nproc, tempfile.mkdtemp(prefix="torch-", dir=WORK),
                          timeout=1800)
    return {"rate": samples_per_second(ranks), "losses": [x["loss"] for x in ranks[0]]}


# ---------------------------------------------------------------- benchmarks


def machine():
    lscpu = subprocess.run(["lscpu"], capture_output=True, text=True).stdout
    model = next((l.split(":", 1)[1].strip() for l in lscpu.splitlines()
                  if l.startswith("Model name")), platform.processor())
    with open("/proc/meminfo") as f:
        mem_gib = int(f.readline().split()[1]) / 2**20
    import torch
    memcpy = json.loads(subprocess.run([os.path.join(BIN, "ddp_allreduce_bench"), "--memcpy"],
                                       capture_output=True, text=True,
                                       check=True).stdout)["memcpy_gb_per_s"]
    return {"cpu": model, "cores": os.cpu_count(), "memory_gib": round(mem_gib, 1),
            "kernel": platform.release(), "torch": torch.__version__, "memcpy_gb_per_s": memcpy,
            "date": time.strftime("%Y-%m-%d")}


def throughput(models, repeats):
    """Samples/s of one epoch of Fashion-MNIST, batch 64 per worker."""
    results = {}
    for model, reps in models:
        base = {"name": "bench-" + model, "model": {"kind": model},
                "dataset": {"kind": "fashion-mnist"},
                "optimizer": {"kind": "sgd", "lr": 0.01, "momentum": 0.9},
                "batchSize": 64, "epochs": 1, "evaluate": False, "seed": 1}
        auto = write_job(model + "-auto", dict(base, backend="auto"))
        gloo = write_job(model + "-gloo", dict(base, backend="gloo"))
        configs = [
            ("ours, 2 workers (shm)", lambda: run_ours(auto, 2)),
            ("ours, 2 workers (gloo)", lambda: run_ours(gloo, 2)),
            ("PyTorch DDP, 2 ranks", lambda: run_torch(gloo, 2)),
        ] + ([("ours, library loop, 2 ranks (shm)", lambda: run_library(2))]
             if model == "mlp" else []) + [
            ("ours, 1 worker", lambda: run_ours(auto, 1)),
            ("PyTorch DDP, 1 rank", lambda: run_torch(gloo, 1)),
        ]
        runs = {name: [] for name, _ in configs}
        for rep in range(min(reps, repeats)):
            # Alternate: each repetition starts with another configuration.
            order = configs[rep % len(configs):] + configs[:rep % len(configs)]
            for name, fn in order:
                log("throughput", model, "run", rep + 1, name)
                runs[name].append(fn())
        results[model] = runs
    return results


def allreduce(worlds, quick):
    sizes = "4096,65536,1048576,4194304,16777216,67108864"
    seconds = "0.3" if quick else "1.0"
    rows = []
    for world in worlds:
        for impl in ("shm", "gloo", "pytorch"):
            log("all-reduce", impl, "on", world, "ranks")
            if impl == "pytorch":
                port = str(free_port())
                procs = [subprocess.Popen(
                    [PYTHON, os.path.join(REPO, "bench/torch_allreduce.py"), "--sizes", sizes,
                     "--seconds", seconds],
                    env=thread_env(MASTER_ADDR="127.0.0.1", MASTER_PORT=port,
                                   WORLD_SIZE=str(world), RANK=str(r)),
                    stdout=subprocess.PIPE if r == 0 else subprocess.DEVNULL, text=True)
                    for r in range(world)]
            else:
                store = tempfile.mkdtemp(prefix="ar-", dir=WORK)
                procs = [subprocess.Popen(
                    [os.path.join(BIN, "ddp_allreduce_bench"), "--impl", impl, "--rank", str(r),
                     "--world", str(world), "--store", store, "--sizes", sizes,
                     "--seconds", seconds],
                    env=thread_env(), stdout=subprocess.PIPE if r == 0 else subprocess.DEVNULL,
                    text=True)
                    for r in range(world)]
            out = procs[0].communicate(timeout=900)[0]
            for p in procs[1:]:
                p.wait(timeout=900)
            rows += [json.loads(line) for line in out.splitlines() if line.startswith("{")]
    return rows


def wide_mlp():
    """A 7.4 MB TorchScript MLP: enough parameters for several buckets."""
    import torch
    import torch.nn as nn

    class Wide(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc1 = nn.Linear(784, 1024)
            self.fc2 = nn.Linear(1024, 1024)
            self.fc3 = nn.Linear(1024, 10)

        def forward(self, x):
            x = torch.relu(self.fc1(x.flatten(1)))
            return self.fc3(torch.relu(self.fc2(x)))

    torch.manual_seed(0)
    path = os.path.join(WORK, "wide.pt")
    torch.jit.script(Wide()).save(path)
    return path


def overlap(steps):
    """How much of the all-reduce time backward hides, per bucket size."""
    models = [("mlp", {"kind": "mlp"}), ("cnn", {"kind": "cnn"}),
              ("wide-mlp", {"kind": "torchscript", "path": wide_mlp()})]
    rows = []
    for name, model in models:
        for backend in ("gloo", "shm"):
            for cap in (1, 5, 25):
                log("overlap", name, backend, "bucket", cap, "MB")
                job = write_job("overlap-%s-%s-%d" % (name, backend, cap), {
                    "name": "overlap", "model": model, "dataset": {"kind": "fashion-mnist"},
                    "batchSize": 64, "epochs": 1, "maxSteps": steps, "evaluate": False,
                    "backend": backend, "bucketCapMb": cap})
                b = run_ours(job, 2)["breakdown"]
                hidden = max(0.0, 1 - b["wait_ms"] / b["allreduce_ms"]) if b["allreduce_ms"] else 0
                rows.append({"model": name, "backend": backend, "cap_mb": cap,
                             "buckets": b["buckets"], "allreduce_ms": b["allreduce_ms"],
                             "wait_ms": b["wait_ms"], "backward_ms": b["backward_ms"],
                             "hidden": hidden})
    return rows


def overhead(repeats):
    """Step time with reports to the coordinator on and off."""
    job = write_job("overhead", {"name": "overhead", "model": {"kind": "mlp"},
                                 "dataset": {"kind": "fashion-mnist"}, "batchSize": 64,
                                 "epochs": 1, "evaluate": False, "backend": "auto"})
    runs = {"on": [], "off": []}
    for rep in range(repeats):
        for mode in (("on", "off") if rep % 2 == 0 else ("off", "on")):
            log("overhead: reports", mode, "run", rep + 1)
            r = run_ours(job, 2, "" if mode == "on" else "--send_reports=false")
            # Wall time of the whole loop per step: a report is made after a
            # step's own timer stops, so per-step timers would not see it.
            runs[mode].append(2 * 64 * 1000 / r["rate"])
    return runs


LOAD_SIZES = [100, 1000, 4096, 8192]


def coordinator_load(sizes, seconds):
    rows = []
    for n in sizes:
        log("coordinator under", n, "simulated workers")
        port_file = os.path.join(WORK, "load-%d.port" % n)
        coordinator = subprocess.Popen(
            # The simulated workers and operator carry no token: anyone local.
            [os.path.join(BIN, "ddp-coordinator"), "--listen=127.0.0.1:0",
             "--port_file=" + port_file, "--allow_anonymous_loopback", "--metrics_listen=",
             "--http_listen="], env=thread_env(), stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL)
        port = str(wait_port_file(port_file, 30, "the coordinator to serve", coordinator))
        start_cpu, start = cpu_seconds(coordinator.pid), time.time()
        out = subprocess.run([os.path.join(BIN, "ddp_load_generator"),
                              "--coordinator=127.0.0.1:" + port, "--workers=%d" % n,
                              "--loaded=%ds" % seconds], env=thread_env(), capture_output=True,
                             text=True, timeout=900)
        cpu = (cpu_seconds(coordinator.pid) - start_cpu) / (time.time() - start)
        with open("/proc/%d/status" % coordinator.pid) as f:
            rss = next(int(l.split()[1]) for l in f if l.startswith("VmHWM")) / 1024
        coordinator.terminate()
        coordinator.wait(timeout=30)
        row = json.loads(out.stdout.strip().splitlines()[-1])
        row.update({"coordinator_cpu_cores": cpu, "coordinator_peak_rss_mib": rss})
        rows.append(row)
    return rows


def cpu_seconds(pid):
    with open("/proc/%d/stat" % pid) as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


# ---------------------------------------------------------------- report


def plots(tp):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 1 + len(tp), figsize=(6 + 5 * len(tp), 4.5))
    bars = ["ours, 2 workers (shm)", "ours, 2 workers (gloo)", "PyTorch DDP, 2 ranks"]
    colors = ["#1b7837", "#7fbf7b", "#762a83"]
    ax = axes[0]
    width = 0.26
    for i, name in enumerate(bars):
        values, lows, highs = [], [], []
        for model in tp:
            rates = [r["rate"] for r in tp[model][name]]
            m = median(rates)
            values.append(m)
            lows.append(m - min(rates))
            highs.append(max(rates) - m)
        xs = [j + (i - 1) * width for j in range(len(tp))]
        ax.bar(xs, values, width, yerr=[lows, highs], label=name, color=colors[i], capsize=3)
    ax.set_xticks(range(len(tp)))
    ax.set_xticklabels(list(tp))
    ax.set_ylabel("samples/s, 2 workers (median, min-max)")
    ax.set_title("Training throughput, Fashion-MNIST, batch 64/worker")
    ax.legend(fontsize=8)
    for ax, model in zip(axes[1:], tp):
        ours = tp[model]["ours, 2 workers (shm)"][0]["losses"]
        ref = tp[model]["PyTorch DDP, 2 ranks"][0]["losses"]
        ax.plot(range(1, len(ref) + 1), ref, color=colors[2], label="PyTorch DDP", linewidth=2.5,
                alpha=0.6)
        ax.plot(range(1, len(ours) + 1), ours, color=colors[0], label="ours", linewidth=0.8)
        ax.set_title("%s: training loss, rank 0, same run" % model)
        ax.set_xlabel("step")
        ax.set_ylabel("loss")
        ax.legend()
    fig.tight_layout()
    fig.savefig(os.path.join(DOCS, "benchmark-throughput.png"), dpi=110)


def plot_allreduce(rows, memcpy):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    worlds = sorted({r["world"] for r in rows})
    fig, axes = plt.subplots(1, len(worlds), figsize=(6 * len(worlds), 4.2))
    for ax, world in zip(axes, worlds):
        for impl, color in (("ours-shm", "#1b7837"), ("ours-gloo", "#7fbf7b"),
                            ("pytorch", "#762a83")):
            pts = [r for r in rows if r["world"] == world and r["impl"] == impl]
            ax.plot([r["bytes"] for r in pts], [busbw(r) for r in pts], "o-", color=color,
                    label=impl)
        ax.axhline(memcpy, color="grey", linestyle="--", label="memcpy (1 thread)")
        ax.set_xscale("log")
        ax.set_xlabel("bytes")
        ax.set_ylabel("bus bandwidth, GB/s")
        ax.set_title("all-reduce, %d ranks" % world)
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(os.path.join(DOCS, "benchmark-allreduce.png"), dpi=110)


def busbw(row):
    n = row["world"]
    return row["bytes"] / (row["p50_us"] * 1e-6) * 2 * (n - 1) / n / 1e9


def fmt_size(n):
    for unit, div in (("MB", 2**20), ("KB", 2**10)):
        if n >= div:
            return "%d %s" % (n // div, unit)
    return "%d B" % n


def network_section(w):
    """The targets of training across shaped links, from what
    bench/network_bench.py last wrote (docs/network_benchmarks.json)."""
    path = os.path.join(DOCS, "network_benchmarks.json")
    if not os.path.exists(path):
        return
    with open(path) as f:
        rows = json.load(f)["results"]

    def row(model, rate, hosts=2, per_host=1):
        return next((r for r in rows if (r["model"], r["rate"], r.get("hosts", 2),
                                         r.get("per_host", 1)) == (model, rate, hosts, per_host)),
                    None)
    w("## 6. Across hosts, on shaped links")
    w("")
    w("`bench/network_bench.py` (run by `bench/run.sh` as root) trains across test hosts that are")
    w("network namespaces, their links limited with tc's tbf; every table, with the floor a perfect")
    w("system could reach, is in [NETWORK_BENCHMARKS.md](NETWORK_BENCHMARKS.md), and step time")
    w("against link rate in [network_step_time.png](network_step_time.png). The targets:")
    w("")
    r = row("resnet18", "1gbit")
    if r and "ours/none" in r["runs"] and "pytorch/none" in r["runs"]:
        ours, torch_ = r["runs"]["ours/none"], r["runs"]["pytorch/none"]
        w("- ResNet-18 on 1 Gbit/s, uncompressed: %.0f%% of the floor (target >= 90%%: %s), %.2fx "
          "PyTorch DDP (target: ahead: %s)." % (
              100 * ours["efficiency"], "met" if ours["efficiency"] >= 0.9 else "**missed**",
              ours["samples_per_s"] / torch_["samples_per_s"],
              "met" if ours["samples_per_s"] > torch_["samples_per_s"] else "**missed**"))
        if ours["efficiency"] < 0.9:
            w("  Why: each host here is a core that runs both its compute and its network stack;")
            w("  a step needs ~555 ms of compute plus ~85 ms of communication CPU on it, near 85% of")
            w("  a floor measured alone (NETWORK_BENCHMARKS.md has the accounting).")
    r = row("resnet18", "100mbit")
    if r and "ours/bf16" in r["runs"] and "ours/none" in r["runs"]:
        ratio = r["runs"]["ours/bf16"]["samples_per_s"] / r["runs"]["ours/none"]["samples_per_s"]
        w("- ResNet-18 on 100 Mbit/s: bf16 compression %.2fx our uncompressed throughput (target "
          ">= 1.7x: %s)." % (ratio, "met" if ratio >= 1.7 else "**missed**"))
    if r and "ours/powersgd" in r["runs"] and "ours/none" in r["runs"]:
        runs = r["runs"]
        line = ("- ResNet-18 on 100 Mbit/s: PowerSGD %.2fx our uncompressed throughput" %
                (runs["ours/powersgd"]["samples_per_s"] / runs["ours/none"]["samples_per_s"]))
        if "pytorch/powersgd" in runs:
            line += ", %.2fx PyTorch DDP with powerSGD_hook" % (
                runs["ours/powersgd"]["samples_per_s"] / runs["pytorch/powersgd"]["samples_per_s"])
        w(line + ".")
    for rate in ("100mbit", "1gbit"):
        r = row("mlp", rate, 2, 2)
        if r and "ours/none" in r["runs"] and "flat/none" in r["runs"]:
            w("- MLP, 2 hosts x 2 workers, %s: the hierarchical all-reduce %.2fx the flat ring." % (
                rate, r["runs"]["ours/none"]["samples_per_s"] /
                r["runs"]["flat/none"]["samples_per_s"]))
    w("")


def report(args, m, tp, ar, ov, oh, load, command, elapsed):
    L = []
    w = L.append
    w("# Benchmarks")
    w("")
    w("Written by `%s` on %s in %.0f minutes. Every speed is a ratio against PyTorch DDP" %
      (command, m["date"], elapsed / 60))
    w("(Debian's `python3-torch` %s, the same LibTorch build ours links; gloo backend;" % m["torch"])
    w("`DistributedSampler` + `DataLoader` + `DistributedDataParallel`, ranks started by hand with")
    w("env:// variables: `bench/pytorch_ddp.py` runs the very job files ours runs), measured on the")
    w("same machine in the same run, alternating. These are measurements, not tests: CI never fails")
    w("on a number.")
    w("")
    w("**Machine:** %s, %d cores, %.0f GiB, Linux %s; one-thread memcpy %.1f GB/s." %
      (m["cpu"], m["cores"], m["memory_gib"], m["kernel"], m["memcpy_gb_per_s"]))
    w("")
    w("**Threads:** one core per worker for both systems: `--threads=1` for our workers")
    w("(LibTorch intra-op and OpenBLAS pools), `torch.set_num_threads(1)` for PyTorch's ranks, and")
    w("`OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 MKL_NUM_THREADS=1` in every process's environment.")
    w("")
    w("## 1. Training throughput")
    w("")
    w("Fashion-MNIST, one epoch (60,000 samples), batch 64 per worker, SGD with momentum, no")
    w("evaluation. samples/s over the training loop, summed over ranks. Ours runs with the default")
    w("backend (`auto`: shared memory, as all ranks are on one machine) and with `gloo` (TCP, what")
    w("PyTorch uses). Runs alternate between configurations; median, with min–max.")
    w("")
    targets = {"mlp": 1.8, "cnn": 1.2}
    for model, runs in tp.items():
        n = len(runs["ours, 1 worker"])
        w("### %s (%d runs each)" % (model, n))
        w("")
        w("| configuration | samples/s (median) | min – max | vs PyTorch DDP |")
        w("| --- | ---: | ---: | ---: |")
        torch2 = median([r["rate"] for r in runs["PyTorch DDP, 2 ranks"]])
        for name, rs in runs.items():
            rates = [r["rate"] for r in rs]
            ratio = median(rates) / torch2 if "2" in name else float("nan")
            w("| %s | %.0f | %.0f – %.0f | %s |" % (name, median(rates), min(rates), max(rates),
                                                   "%.2f×" % ratio if ratio == ratio else "—"))
        ours2 = median([r["rate"] for r in runs["ours, 2 workers (shm)"]])
        ours2g = median([r["rate"] for r in runs["ours, 2 workers (gloo)"]])
        ours1 = median([r["rate"] for r in runs["ours, 1 worker"]])
        torch1 = median([r["rate"] for r in runs["PyTorch DDP, 1 rank"]])
        w("")
        ratio = ours2 / torch2
        target = targets.get(model)
        w("- **Ours vs PyTorch DDP, 2 workers: %.2f×** (gloo backend: %.2f×)%s" % (
            ratio, ours2g / torch2,
            "; target %.1f×: %s" % (target, "met" if ratio >= target else "**missed**")
            if target else ""))
        if "ours, library loop, 2 ranks (shm)" in runs:
            lib = median([r["rate"] for r in runs["ours, library loop, 2 ranks (shm)"]])
            w("- **The same job as your own loop on the library** (`bench/library_mlp.cc`, "
              "`ddp-run -- PROGRAM`, torch::data with whole-batch `index_select`): %.2f× the "
              "daemon on the same transport (shm), %.2f× PyTorch DDP" % (lib / ours2,
                                                                        lib / torch2))
        eff = ours2 / (2 * ours1)
        w("- Scaling efficiency (2-worker samples/s ÷ 2 × single): ours %.0f%% (gloo %.0f%%), "
          "PyTorch %.0f%%%s" % (100 * eff, 100 * ours2g / (2 * ours1), 100 * torch2 / (2 * torch1),
                                "; target 80%%: %s" % ("met" if eff >= 0.8 else "**missed**")
                                if model == "mlp" else ""))
        two = lambda k: median([r["breakdown"][k] for r in runs["ours, 2 workers (shm)"]])
        one = lambda k: median([r["breakdown"][k] for r in runs["ours, 1 worker"]])
        compute2 = two("forward_ms") + two("backward_ms")
        compute1 = one("forward_ms") + one("backward_ms")
        torch_step = 2 * 64 * 1000 / torch2
        if target and ratio < target:
            w("- Where the time goes (target missed): forward and backward are %.0f%% of our %.1f ms "
              "step; they are LibTorch's kernels, the very ones PyTorch calls, so only PyTorch's "
              "overhead around them is ours to win: its step takes %.1f ms against our %.1f ms, "
              "and our communication costs %.2f ms a step (all-reduce wait after backward)." % (
                  100 * compute2 / two("step_ms"), two("step_ms"), torch_step, two("step_ms"),
                  two("wait_ms")))
        if model == "mlp" and eff < 0.8:
            w("- Where the efficiency goes (target missed): with two workers computing at once, "
              "forward + backward take %.2f ms a step against %.2f ms for one worker alone "
              "(+%.0f%%): the two processes contend for this 2-vCPU machine's caches and memory "
              "bandwidth, and PyTorch loses as much (%.0f%%). Communication itself costs %.2f ms a "
              "step after backward; the optimizer %.2f ms against %.2f ms alone." % (
                  compute2, compute1, 100 * (compute2 / compute1 - 1),
                  100 * torch2 / (2 * torch1), two("wait_ms"), two("optimizer_ms"),
                  one("optimizer_ms")))
        w("")
        w("Where a step's time goes in ours (2 workers, median of per-step timers, ms):")
        w("")
        w("| backend | step | data wait | forward | backward | all-reduce wait | optimizer | "
          "all-reduce (comm thread) | buckets |")
        w("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
        for name in ("ours, 2 workers (shm)", "ours, 2 workers (gloo)", "ours, 1 worker"):
            bs = [r["breakdown"] for r in runs[name]]
            get = lambda k: median([b[k] for b in bs])
            w("| %s | %.2f | %.2f | %.2f | %.2f | %.2f | %.2f | %.2f | %d |" % (
                name.replace("ours, ", ""), get("step_ms"), get("data_ms"), get("forward_ms"),
                get("backward_ms"), get("wait_ms"), get("optimizer_ms"), get("allreduce_ms"),
                bs[0]["buckets"]))
        w("")
    w("![throughput and loss curves](benchmark-throughput.png)")
    w("")
    w("The loss curves are rank 0's per-step training loss in the first measured run of each")
    w("system: the same model, initial weights, data order and optimizer, so they lie on each")
    w("other (tests/py/ddp_parity_test.py holds them to 1e-8 for a TorchScript model).")
    w("")
    w("## 2. All-reduce")
    w("")
    w("float32 buffers, one process per rank on loopback; p50 latency over repeated calls; bus")
    w("bandwidth = algbw × 2(n−1)/n. `ours-shm` is our shared-memory communicator (ranks on one")
    w("machine), `ours-gloo` our ring all-reduce on Gloo's TCP transport (abortable), `pytorch` is")
    w("`torch.distributed.all_reduce` on gloo. Ceiling: one thread's memcpy, %.1f GB/s. With 4 ranks"
      % m["memcpy_gb_per_s"])
    w("on this machine's %d cores, ranks share cores." % m["cores"])
    w("")
    w("| size | ranks | ours-shm p50 | ours-gloo p50 | pytorch p50 | ours-shm busbw | "
      "ours-gloo busbw | pytorch busbw | shm vs pytorch |")
    w("| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for world in sorted({r["world"] for r in ar}):
        for size in sorted({r["bytes"] for r in ar}):
            get = {r["impl"]: r for r in ar if r["world"] == world and r["bytes"] == size}
            if len(get) < 3:
                continue
            w("| %s | %d | %.0f µs | %.0f µs | %.0f µs | %.2f GB/s | %.2f GB/s | %.2f GB/s | %.1f× |" %
              (fmt_size(size), world, get["ours-shm"]["p50_us"], get["ours-gloo"]["p50_us"],
               get["pytorch"]["p50_us"], busbw(get["ours-shm"]), busbw(get["ours-gloo"]),
               busbw(get["pytorch"]), get["pytorch"]["p50_us"] / get["ours-shm"]["p50_us"]))
    w("")
    w("![all-reduce bus bandwidth](benchmark-allreduce.png)")
    w("")
    w("## 3. Overlap")
    w("")
    w("How much of the all-reduce is hidden behind backward: 1 − (time the trainer waits after")
    w("backward) ÷ (time the communication thread spends in all-reduce), medians over %d steps of 2"
      % args.overlap_steps)
    w("workers. `wide-mlp` is a 784-1024-1024-10 TorchScript MLP (7.4 MB of gradients); mlp and")
    w("cnn hold under 1 MB, which DDP's 1 MB first bucket takes whole, so they have nothing to")
    w("overlap whatever the cap: their single bucket is launched by the last gradient, and what")
    w("looks hidden there is the peer's skew (the communication thread's time includes waiting")
    w("for the other rank to arrive), which makes those rows noisy. On one machine a")
    w("communication thread competes with backward for the same core, so overlap can hide waiting")
    w("for peers, not the copying itself.")
    w("")
    w("| model | backend | bucket cap | buckets | all-reduce ms | wait after backward ms | "
      "backward ms | hidden |")
    w("| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: |")
    for r in ov:
        w("| %s | %s | %d MB | %d | %.2f | %.2f | %.2f | %.0f%% |" % (
            r["model"], r["backend"], r["cap_mb"], r["buckets"], r["allreduce_ms"], r["wait_ms"],
            r["backward_ms"], 100 * r["hidden"]))
    w("")
    w("## 4. Per-step overhead of the service")
    w("")
    on, off = oh["on"], oh["off"]
    spread = max(statistics.pstdev(on), statistics.pstdev(off))
    diff = median(on) - median(off)
    w("mlp, 2 workers, one epoch each, alternating; time per step (the training loop's wall time,")
    w("reports included, divided by its steps) with every step's report going to the coordinator")
    w("(bounded queue, background thread, batches) and with reports off (`--send_reports=false`):")
    w("")
    w("| reports | runs | median step (ms) | runs' step times (ms) |")
    w("| --- | ---: | ---: | --- |")
    w("| on | %d | %.3f | %s |" % (len(on), median(on), ", ".join("%.3f" % x for x in on)))
    w("| off | %d | %.3f | %s |" % (len(off), median(off), ", ".join("%.3f" % x for x in off)))
    w("")
    w("Difference %+.3f ms (%+.1f%%) against a run-to-run spread (std. dev.) of %.3f ms: %s." % (
        diff, 100 * diff / median(off), spread,
        "within noise" if abs(diff) <= 2 * spread else "**larger than noise**"))
    w("")
    w("## 5. The coordinator under load")
    w("")
    w("`bench/load_generator.cc` speaks the real protocol over loopback as N workers: one Attach")
    w("stream each (registration, heartbeats every second, state changes), rendezvous store traffic")
    w("(each sets its address and waits for its ring neighbour's), and 10 step reports per worker")
    w("per second in 100 ms batches, for %d s, while an operator calls GetStatus every 20 ms. The" %
      args.load_seconds)
    w("load generator shares the machine's %d cores with the coordinator." % m["cores"])
    w("")
    w("| workers | last registration → every assignment | rendezvous (2 store ops each) | "
      "heartbeats/s | reports/s | lost | GetStatus p50 | p99 | coordinator CPU | peak RSS |")
    w("| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for r in load:
        w("| %d | %.1f ms | %.2f s | %.0f | %.0f | %d | %.1f ms | %.1f ms | %.0f%% of a core | "
          "%.0f MiB |" % (r["workers"], 1000 * r["register_to_all_assigned_s"], r["rendezvous_s"],
                          r["heartbeats_per_s"], r["reports_per_s"], r["lost"],
                          r["get_status_p50_ms"], r["get_status_p99_ms"],
                          100 * r["coordinator_cpu_cores"], r["coordinator_peak_rss_mib"]))
    w("")
    w("GetStatus answers the job, a summary of every worker and at most 100 of them in full")
    w("(`--status_workers`); ListWorkers pages through the rest. Answer size at the largest load: "
      "%s." % ("%.1f KiB" % (load[-1]["get_status_bytes"] / 1024)
                if "get_status_bytes" in load[-1] else "not measured"))
    w("")
    big = next((r for r in load if r["workers"] == 4096), None)
    if big:
        w("Target at 4,096 workers reporting 10 steps/s each: every worker assigned and none lost "
          "(%s), GetStatus p99 %.1f ms (target < 20 ms: %s)." % (
              "met" if big["lost"] == 0 else "**missed**: %d lost" % big["lost"],
              big["get_status_p99_ms"],
              "met" if big["get_status_p99_ms"] < 20 else "**missed**"))
        w("")
    huge = next((r for r in load if r["workers"] == 8192), None)
    if huge:
        w("At 8,192 the load generator, on the same %d cores, sends %.0f of the %d reports/s it "
          "is asked for; every worker is assigned and %d lost; GetStatus p99 %.1f ms." % (
              m["cores"], huge["reports_per_s"], 10 * huge["workers"], huge["lost"],
              huge["get_status_p99_ms"]))
        w("")
    k = next((r for r in load if r["workers"] == 1000), None)
    if k:
        w("Targets at 1000 workers: generation formed in %.1f ms (target < 1 s: %s); GetStatus "
          "p99 %.1f ms (target < 20 ms: %s)." % (
              1000 * k["register_to_all_assigned_s"],
              "met" if k["register_to_all_assigned_s"] < 1 else "**missed**",
              k["get_status_p99_ms"], "met" if k["get_status_p99_ms"] < 20 else "**missed**"))
        w("")
    network_section(w)
    w("## How to run")
    w("")
    w("```sh")
    w("%s" % command)
    w("```")
    w("")
    w("Raw results: `docs/benchmarks.json`.")
    return "\n".join(L) + "\n"


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="fewer repetitions, for a smoke run")
    parser.add_argument("--only-load", action="store_true",
                        help="rerun only the coordinator-under-load section; keep the rest of "
                        "docs/benchmarks.json")
    parser.add_argument("--from-json", action="store_true",
                        help="rewrite docs/BENCHMARKS.md from docs/benchmarks.json, running nothing")
    args = parser.parse_args()
    args.repeats = 2 if args.quick else 5
    args.overlap_steps = 100 if args.quick else 200
    args.load_seconds = 5 if args.quick else 10
    start = time.time()
    os.makedirs(DOCS, exist_ok=True)
    if args.from_json or args.only_load:
        with open(os.path.join(DOCS, "benchmarks.json")) as f:
            saved = json.load(f)
        if args.only_load:
            saved["load"] = coordinator_load(LOAD_SIZES, args.load_seconds)
            with open(os.path.join(DOCS, "benchmarks.json"), "w") as f:
                json.dump(saved, f, indent=1)
        args.quick = saved.get("quick", False)
        with open(os.path.join(DOCS, "BENCHMARKS.md"), "w") as f:
            f.write(report(args, saved["machine"], saved["throughput"], saved["allreduce"],
                           saved["overlap"], saved["overhead"], saved["load"],
                           "bench/run.sh" + (" --quick" if args.quick else ""),
                           saved.get("seconds", 0)))
        return
    m = machine()
    log("machine:", m)
    tp = throughput([("mlp", 5), ("cnn", 3)], args.repeats)
    ar = allreduce([2, 4], args.quick)
    ov = overlap(args.overlap_steps)
    oh = overhead(args.repeats)
    load = coordinator_load(LOAD_SIZES, args.load_seconds)
    with open(os.path.join(DOCS, "benchmarks.json"), "w") as f:
        json.dump({"machine": m, "throughput": {
            model: {name: [{"rate": r["rate"], "breakdown": r.get("breakdown")} for r in rs]
                    for name, rs in runs.items()} for model, runs in tp.items()},
            "allreduce": ar, "overlap": ov, "overhead": oh, "load": load,
            "quick": args.quick, "seconds": time.time() - start}, f, indent=1)
    plots(tp)
    plot_allreduce(ar, m["memcpy_gb_per_s"])
    command = "bench/run.sh" + (" --quick" if args.quick else "")
    with open(os.path.join(DOCS, "BENCHMARKS.md"), "w") as f:
        f.write(report(args, m, tp, ar, ov, oh, load, command, time.time() - start))
    log("wrote docs/BENCHMARKS.md in %.0f s" % (time.time() - start))


if __name__ == "__main__":
    sys.exit(main())
