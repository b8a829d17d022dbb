#!/usr/bin/env python3
"""Training across test hosts on shaped links: ours (compression none, fp16,
bf16, and powersgd with --compressions) and PyTorch DDP (no hook,
fp16_compress_hook, powerSGD_hook), each against the floor a perfect system
could reach.

Two (or, with --hosts 4, four) hosts are network namespaces on a bridge
(tests/py/netns.py), each with a host name of its own so that `backend: auto`
picks Gloo's TCP ring; the coordinator sits in another. Every worker's link is
limited with tc's tbf to the rate in both directions. One worker per host,
one thread each.

Models: the MLP and CNN on Fashion-MNIST, and ResNet-18 (the built-in
"resnet18", 44.7 MB of gradients) on synthetic 3x32x32 images.

The floor of a step is max(one rank's compute time for the step alone, the
ring all-reduce of the gradient at the link's rate). An n-rank ring sends
2 (n - 1) / n of each rank's gradient over its link (half in the
reduce-scatter, half in the all-gather): for two ranks, the gradient once.
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


# Per model: batch per rank, steps a run and warm-up steps not counted (a
# ResNet-18 step takes ~0.6 s of compute on one core here).
MODELS = {"mlp": (64, 150, 20), "cnn": (64, 150, 20), "resnet18": (16, 30, 5)}


def write_rgb_dataset(folder):
    """1024 synthetic 3x32x32 images of 10 noisy prototypes, as a `tensors`
    dataset file both systems read."""
    import torch
    g = torch.Generator()
    g.manual_seed(0)
    y = torch.randint(10, (1024,), generator=g)
    x = torch.randn(10, 3, 32, 32, generator=g)[y] + torch.randn(1024, 3, 32, 32, generator=g)
    path = os.path.join(folder, "rgb32.pt")
    torch.save((x, y), path)
    os.chmod(folder, 0o755)
    os.chmod(path, 0o644)
    return path


# PowerSGD's rank in the "powersgd" runs (PyTorch's matrix_approximation_rank).
POWERSGD_RANK = 4


def write_job(folder, name, model, compression, steps, workers, rgb, backend="auto",
              bucket_cap_mb=None):
    batch = MODELS[model][0]
    dataset = ({"kind": "tensors", "path": rgb} if model == "resnet18"
               else {"kind": "fashion-mnist"})
    job = {"name": name, "model": {"kind": model}, "dataset": dataset,
           "optimizer": {"kind": "sgd", "lr": 0.01, "momentum": 0.9}, "batchSize": batch,
           "epochs": 100, "maxSteps": steps, "evaluate": False, "seed": 1, "backend": backend,
           "minWorkers": workers, "compression": compression}
    if compression == "powersgd":
        # Compressed from the third step on (PyTorch's least start with
        # error feedback is 2), well inside the warm-up steps not counted.
        job.update(powersgdRank=POWERSGD_RANK, powersgdStartStep=2)
    if bucket_cap_mb is not None:
        job["bucketCapMb"] = bucket_cap_mb
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


def median_run(runs):
    """The (step seconds, records) of the median run by step time (the
    lower middle one of an even count)."""
    ordered_runs = sorted(runs, key=lambda r: r[0])
    return ordered_runs[(len(ordered_runs) - 1) // 2]


def breakdown(records, skip):
    """Median milliseconds of a rank's step parts (the worker's own timers),
    and, from its buckets' timeline, of when the first all-reduce started
    (from the start of backward), how long the link sat idle between
    buckets because the next one wasn't ready, and when the last ended."""
    steady = records[skip:] or records
    parts = {}
    for name in ("forward_ms", "backward_ms", "allreduce_wait_ms", "optimizer_ms"):
        parts[name] = statistics.median(r.get(name, 0) for r in steady)
    timelines = [link_timeline(r["buckets"]) for r in steady
                 if len(r.get("buckets", [])) and "started_ms" in r["buckets"][0]]
    for i, name in enumerate(("first_start_ms", "idle_between_ms", "last_end_ms")):
        if timelines:
            parts[name] = statistics.median(t[i] for t in timelines)
    return parts


def link_timeline(buckets):
    """(first start, idle between buckets, last end) of one step's buckets,
    in milliseconds from the start of backward; buckets run one at a time."""
    idle, end = 0.0, None
    for b in buckets:
        start = b.get("started_ms", 0)
        if end is not None:
            idle += max(0.0, start - end)
        end = start + b.get("allreduce_ms", 0)
    return buckets[0].get("started_ms", 0), idle, end


# --pin: each rank's process on one core of its own (rank modulo the cores).
PIN = False


def pinned(rank, argv):
    """argv, run on core `rank` modulo the cores with --pin: a host of one
    core, whose compute shares that core with its own network work only,
    as on separate machines; else wherever the scheduler puts it."""
    if not PIN:
        return argv
    return ["taskset", "-c", str(rank % os.cpu_count())] + argv


def run_ours(net, job_file, folder, workers, data_root, per_host=1):
    """The job on a coordinator in host 0 and `workers` workers in hosts 1..,
    `per_host` to a host; each rank's step records."""
    run = RunFolder(folder)
    target = "%s:%d" % (net.hosts[0].ip, PORT)
    env = thread_env()
    procs = []
    with open(os.path.join(folder, "coordinator.log"), "w") as out:
        coordinator = net.popen(0, [os.path.join(BIN, "ddp-coordinator"), "--listen=" + target,
                                    "--job=" + job_file, "--insecure", "--exit_when_done",
                                    "--data_root=/usr/share/datasets," + data_root],
                                stdout=out, stderr=subprocess.STDOUT, env=env)
    try:
        wait_listening(net.hosts[0].ip, PORT, 30, "the coordinator", coordinator)
        for i in range(workers):
            name = "w%d" % i
            host = 1 + i // per_host
            with open(os.path.join(folder, name + ".log"), "w") as out:
                procs.append(net.popen(host, pinned(i, run.worker_command(
                    target, i % per_host, name, net.hosts[host].ip)), stdout=out,
                    stderr=subprocess.STDOUT, env=env))
        coordinator.wait(timeout=1800)
        if coordinator.returncode != 0:
            raise RuntimeError("the job failed: " + run.log("coordinator")[-2000:])
    finally:
        for p in procs + [coordinator]:
            if p.poll() is None:
                p.kill()
            p.wait()
    return [run.metrics("w%d" % i) for i in range(workers)]


def run_torch(net, job_file, folder, workers, per_host=1):
    """bench/pytorch_ddp.py, rank r in host 1 + r // per_host, with the job's
    compression as PyTorch's hook; each rank's step records."""
    procs = []
    for rank in range(workers):
        # The host name resolves to nothing in a namespace: without the
        # interface, Gloo would fall back to loopback.
        env = thread_env(MASTER_ADDR=net.hosts[1].ip, MASTER_PORT=str(PORT + 1),
                         WORLD_SIZE=str(workers), RANK=str(rank), GLOO_SOCKET_IFNAME="eth0")
        metrics = os.path.join(folder, "reference-%d.jsonl" % rank)
        with open(os.path.join(folder, "reference-%d.log" % rank), "w") as out:
            procs.append(net.popen(1 + rank // per_host, pinned(rank, [
                PYTHON, REFERENCE, "--job", job_file, "--threads", "1", "--metrics", metrics]),
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
    return [read_step_records(os.path.join(folder, "reference-%d.jsonl" % r))
            for r in range(workers)]


def gradient_bytes(records):
    """fp32 gradient bytes, from what our reduction reports (buckets carry a
    few flag and step words besides)."""
    return records[-1].get("bytes", 0)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rates", default="100mbit,1gbit,10gbit")
    parser.add_argument("--models", default="mlp,cnn,resnet18")
    parser.add_argument("--systems", default="ours,pytorch")
    parser.add_argument("--compressions", default="none,fp16,bf16")
    parser.add_argument("--hosts", type=int, default=2, help="worker hosts (2 or 4)")
    parser.add_argument("--per-host", type=int, default=1,
                        help="workers per host; with more than one, \"auto\" is hierarchical "
                        "and the flat Gloo ring runs too (system \"flat\")")
    parser.add_argument("--steps", type=int, help="steps per run (default per model: %s)" %
                        ", ".join("%s %d" % (m, v[1]) for m, v in MODELS.items()))
    parser.add_argument("--repeat", type=int, default=1,
                        help="runs of each configuration (and of compute alone), in rounds; "
                        "the median run is reported")
    parser.add_argument("--pin", action="store_true",
                        help="each rank's process (ours and PyTorch's) on a core of its own")
    parser.add_argument("--bucket-cap-mb", type=float,
                        help="the job's bucket_cap_mb for both systems (default: theirs, 25)")
    parser.add_argument("--out", default=os.path.join(REPO, "docs", "network_benchmarks.json"))
    parser.add_argument("--append", action="store_true",
                        help="add these runs to --out's (replacing the same runs of the same "
                        "model, link and hosts, keeping the rest) instead of starting afresh")
    parser.add_argument("--from-json", action="store_true",
                        help="rewrite NETWORK_BENCHMARKS.md beside --out from it, running nothing")
    args = parser.parse_args()
    global PIN
    PIN = args.pin
    if args.from_json:
        write_markdown(args.out)
        return
    ok, why = netns.available()
    if not ok:
        sys.exit("network namespaces are not available here: " + why)
    kept = []
    if args.append and os.path.exists(args.out):
        with open(args.out) as f:
            kept = json.load(f)["results"]

    def key(r):
        return r["model"], r["rate"], r.get("hosts", 2), r.get("per_host", 1)
    work = tempfile.mkdtemp(prefix="ddp-netbench-")
    rgb = write_rgb_dataset(work) if "resnet18" in args.models.split(",") else ""
    results = []
    hosts = ["coord"] + ["host-%s" % chr(ord("a") + i) for i in range(args.hosts)]
    with netns.Network(hosts) as net:
        for model in args.models.split(","):
            steps = args.steps or MODELS[model][1]
            skip = min(MODELS[model][2], steps // 4)
            # Compute alone: one worker, world 1, no network in the step;
            # the median of --repeat runs.
            alones = []
            for _ in range(args.repeat):
                folder = tempfile.mkdtemp(prefix="alone-", dir=work)
                job = write_job(folder, "alone-" + model, model, "none", steps, 1, rgb)
                alone = run_ours(net, job, folder, 1, work)
                alones.append((step_stats(alone, skip)[0], alone))
            compute_s, alone = median_run(alones)
            workers = args.hosts * args.per_host
            log(model, "compute alone: %.2f ms a step" % (compute_s * 1e3))
            for rate in args.rates.split(","):
                for i in range(1, args.hosts + 1):
                    net.shape(i, rate=rate)
                bits = netns._bits_per_second(rate)
                row = {"model": model, "rate": rate, "hosts": args.hosts,
                       "per_host": args.per_host,
                       "compute_ms": compute_s * 1e3, "steps": steps, "warmup": skip,
                       "runs": {},
                       "alone_breakdown": breakdown(alone[0], skip)}
                # A rerun of compressed runs alone still knows the gradient.
                before = next((r for r in kept if key(r) == key(row)), {})
                for kept_field in ("gradient_bytes", "powersgd_bytes"):
                    if kept_field in before:
                        row[kept_field] = before[kept_field]
                kinds = args.compressions.split(",")
                systems = args.systems.split(",")
                configs = [("ours", c) for c in kinds if "ours" in systems] + [
                    ("flat", c) for c in kinds if "flat" in systems or (
                        args.per_host > 1 and "ours" in systems)] + [
                    ("pytorch", c) for c in kinds if "pytorch" in systems and c != "bf16"]
                # --repeat rounds over the configurations, so that a slow
                # spell of this shared machine doesn't land on one of them.
                measured = {c: [] for c in configs}
                for _ in range(args.repeat):
                    for system, compression in configs:
                        folder = tempfile.mkdtemp(prefix="%s-%s-%s-%s-" % (
                            system, model, rate, compression), dir=work)
                        job = write_job(folder, "%s-%s" % (model, compression), model,
                                        compression, steps, workers, rgb,
                                        backend="gloo" if system == "flat" else "auto",
                                        bucket_cap_mb=args.bucket_cap_mb)
                        ranks = (run_torch(net, job, folder, workers, args.per_host)
                                 if system == "pytorch"
                                 else run_ours(net, job, folder, workers, work, args.per_host))
                        measured[(system, compression)].append(
                            (step_stats(ranks, skip)[0], ranks))
                for system, compression in configs:
                    runs = measured[(system, compression)]
                    step_s, ranks = median_run(runs)
                    _, samples = step_stats(ranks, skip)
                    if system == "ours" and compression == "none":
                        row["gradient_bytes"] = gradient_bytes(ranks[0])
                        row["breakdown"] = breakdown(ranks[0], skip)
                    if system == "ours" and compression == "powersgd":
                        row["powersgd_bytes"] = gradient_bytes(ranks[0])
                    wire = row.get("gradient_bytes", 0) / (2 if compression != "none" else 1)
                    if compression == "powersgd":
                        # What our run sent: the factors and what stays whole.
                        wire = row.get("powersgd_bytes", wire)
                    # What each host's link must carry at best: its share of a
                    # ring among the hosts (the hierarchical all-reduce's).
                    ring = 2 * (args.hosts - 1) / args.hosts
                    floor_s = max(compute_s, wire * ring * 8 / bits)
                    row["runs"]["%s/%s" % (system, compression)] = {
                        "step_ms": step_s * 1e3, "samples_per_s": samples,
                        "floor_ms": floor_s * 1e3, "efficiency": floor_s / step_s,
                        "step_ms_each_run": [r[0] * 1e3 for r in runs]}
                    log(model, rate, system, compression, "%.2f ms a step, %.0f samples/s, "
                        "floor %.2f ms, efficiency %.2f" % (step_s * 1e3, samples,
                                                           floor_s * 1e3, floor_s / step_s))
                results.append(row)
                for i in range(1, args.hosts + 1):
                    net.shape(i)
    if kept:
        merged = {key(r): r for r in kept}
        for r in results:
            if key(r) in merged:
                old = merged[key(r)]
                # The row's compute alone and breakdowns are those of its
                # uncompressed run of ours; other runs keep their own floor.
                fields = r if "ours/none" in r["runs"] else {
                    k: v for k, v in r.items() if k not in old}
                r = dict(old, **{k: v for k, v in fields.items() if k != "runs"},
                         runs=dict(old["runs"], **r["runs"]))
            merged[key(r)] = r
        results = list(merged.values())
    meta = {"date": time.strftime("%Y-%m-%d")}
    with open(args.out, "w") as f:
        json.dump(dict(meta, results=results), f, indent=1)
    write_markdown(args.out)


def plot(results, path):
    """Step time against link rate, one panel per model and host count."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        log("no matplotlib: no plot (apt-get install python3-matplotlib)")
        return
    panels = []
    for row in ordered(results):
        key = (row["model"], layout(row))
        if key not in panels:
            panels.append(key)
    columns = min(4, len(panels))
    grid_rows = (len(panels) + columns - 1) // columns
    fig, axes = plt.subplots(grid_rows, columns, figsize=(4.2 * columns, 3.8 * grid_rows),
                             squeeze=False)
    for ax in axes.flat[len(panels):]:
        ax.axis("off")
    for ax, (model, where) in zip(axes.flat, panels):
        rows = [r for r in ordered(results) if (r["model"], layout(r)) == (model, where)]
        rates = [netns._bits_per_second(r["rate"]) / 1e9 for r in rows]
        for key in ("ours/none", "ours/fp16", "ours/bf16", "ours/powersgd", "flat/none",
                    "pytorch/none", "pytorch/fp16", "pytorch/powersgd"):
            points = [(x, r["runs"][key]["step_ms"]) for x, r in zip(rates, rows) if key in r["runs"]]
            if points:
                system, compression = key.split("/")
                ax.plot(*zip(*points), marker="o", linestyle="--" if system == "pytorch" else "-",
                        color=COLORS[key], label="%s %s" % (SYSTEM_NAMES[system], compression))
        ax.plot(rates, [r["runs"]["ours/none"]["floor_ms"] if "ours/none" in r["runs"] else None
                        for r in rows], color="black", linewidth=0.8, label="floor (none)")
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("link rate (Gbit/s)")
        ax.set_ylabel("step time (ms)")
        ax.set_title("%s, %s" % (model, where))
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=6)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def write_markdown(json_path):
    with open(json_path) as f:
        data = json.load(f)
    plot(data["results"], os.path.join(os.path.dirname(json_path), "network_step_time.png"))
    text = markdown(data["results"], data)
    with open(os.path.join(os.path.dirname(json_path), "NETWORK_BENCHMARKS.md"), "w") as f:
        f.write(text)
    print(text)


HEADER = """# Training across hosts on shaped links

Written by `bench/network_bench.py` on %(date)s. Two (or four) test hosts are network
namespaces on a bridge, each with a host name of its own (so `backend: auto` picks Gloo's TCP
ring), one worker per host with one thread (two in the "2 hosts x 2 workers" tables, where
`auto` is the hierarchical all-reduce: shared memory within a host, Gloo between one leader per
host; "ours, flat ring" is the same job with `backend: gloo`); every host's link limited with
tc's `tbf` to the rate, each way. The coordinator is in another namespace. Models: the MLP and CNN on
Fashion-MNIST (batch 64 a rank), and ResNet-18 (the built-in `resnet18`: 11.2 M parameters,
44.7 MB of fp32 gradients) on synthetic 3x32x32 images (batch 16 a rank).
PyTorch DDP (gloo) runs `bench/pytorch_ddp.py` on the same job file and the same links, with
`fp16_compress_hook` registered for fp16 (Gloo can't all-reduce bfloat16 in PyTorch 1.13, so
it has no bf16 row) and `powerSGD_hook` for powersgd (rank %(powersgd_rank)d, from the third
step; its floor counts the bytes our run sent). The kernel here has no `netem`: links are rate-limited, with no added
delay.

**Floor** = max(one rank's compute time for the step alone, the all-reduce of its gradient at
the link's rate), where an n-rank ring sends 2 (n - 1) / n of each rank's gradient over its
link (half in the reduce-scatter, half in the all-gather; for two ranks the whole gradient
once): gradient bytes x 2 (n - 1) / n x 8 / rate, halved by compression, with n the hosts
(with two workers a host, what the hierarchical all-reduce's leaders send). **Efficiency** = floor / the step time. Read it with two caveats: the compute time
is measured with one worker alone on a core, while in the runs both workers and the kernel's
network path (veth, bridge, tbf: real CPU at 10 Gbit/s) share this machine's 2 cores (four
workers: two to a core, so compute alone is no longer reachable); and the MLP's and CNN's
gradients fit in one bucket, so their all-reduce can't overlap backward, and compute +
all-reduce is what a step without overlap can reach. ResNet-18's gradients fill eight buckets
(1 MiB, then 25 MiB caps, the last split again into 1 MiB pieces), which overlap backward.

Where ResNet-18 falls short of the floor on 1 Gbit/s (the "Where our uncompressed step goes"
and "The link" lines; the second comes from each step's bucket timeline, `ready_ms` and
`started_ms` in the worker's step records): the link carries gradients from ~25 ms into
backward until about when backward ends, so what is missing is CPU, not bandwidth. Our
all-reduce of the 44.7 MB with nothing else running (`ddp_allreduce_bench --host` across the
same shaped link) costs 38 ms of CPU a rank, as much as a raw TCP exchange of the same bytes
(kernel TCP, veth, bridge, tbf); run beside backward on the same core, backward takes 80-90 ms
longer than alone (that CPU, the sums, and what the copies do to the compute's caches). With
`--pin` (each rank on a core of its own, a one-core host) ours measured 84-85%% and PyTorch DDP
73-79%%: ~555 ms of compute a step (with the other rank running) plus ~85 ms of communication
on the same core caps a step near 85%% of a floor measured alone. Separate hosts would run their
network stack beside the compute, on other cores; this machine's 2 cores can't. The last bucket
goes in 1 MiB pieces, so the first layers' gradients don't wait for backward's end in one
8.7 MB block (PyTorch DDP still has that). With `--bucket-cap-mb 8` the link no longer waits
~27 ms for the second bucket to fill (3 ms), a step ~1%% shorter.

![Step time against link rate](network_step_time.png)
"""


COLORS = {"ours/none": "C0", "ours/fp16": "C1", "ours/bf16": "C2", "flat/none": "C5",
          "pytorch/none": "C3", "pytorch/fp16": "C4", "ours/powersgd": "C6",
          "pytorch/powersgd": "C7"}
SYSTEM_NAMES = {"ours": "ours", "flat": "ours, flat ring", "pytorch": "PyTorch DDP"}


def layout(row):
    hosts, per_host = row.get("hosts", 2), row.get("per_host", 1)
    return "%d hosts" % hosts + (" x %d workers" % per_host if per_host > 1 else "")


def ordered(results):
    models = list(MODELS)
    return sorted(results, key=lambda r: (r.get("hosts", 2), r.get("per_host", 1),
                                          models.index(r["model"]),
                                          netns._bits_per_second(r["rate"])))


def markdown(results, meta):
    lines = [HEADER % dict(meta, powersgd_rank=POWERSGD_RANK)]
    for row in ordered(results):
        runs = row["runs"]
        lines.append("\n## %s, %s link, %s\n" % (row["model"].upper(), row["rate"], layout(row)))
        lines.append("Compute alone %.2f ms a step; gradient %.2f MB; %d steps a run, the first "
                     "%d not counted; with several runs, the median one; each floor from the "
                     "compute alone measured with its run.\n" % (
                         row["compute_ms"], row.get("gradient_bytes", 0) / 1e6,
                         row.get("steps", 150), row.get("warmup", 20)))
        lines.append("| system | compression | samples/s | step | floor | efficiency | runs |")
        lines.append("| --- | --- | ---: | ---: | ---: | ---: | ---: |")
        for key, r in runs.items():
            system, compression = key.split("/")
            lines.append("| %s | %s | %.0f | %.2f ms | %.2f ms | %.0f%% | %d |" % (
                SYSTEM_NAMES[system], compression, r["samples_per_s"],
                r["step_ms"], r["floor_ms"], 100 * r["efficiency"],
                len(r.get("step_ms_each_run", [None]))))
        facts = []
        if "ours/none" in runs and "pytorch/none" in runs:
            facts.append("ours %.2fx PyTorch DDP uncompressed" % (
                runs["ours/none"]["samples_per_s"] / runs["pytorch/none"]["samples_per_s"]))
        for kind in ("fp16", "bf16", "powersgd"):
            if "ours/" + kind in runs and "ours/none" in runs:
                facts.append("%s %.2fx our uncompressed" % (
                    kind, runs["ours/" + kind]["samples_per_s"] / runs["ours/none"]["samples_per_s"]))
        if "breakdown" in row and "alone_breakdown" in row:
            b, a = row["breakdown"], row["alone_breakdown"]
            lines.append("\nWhere our uncompressed step goes (rank 0, medians): forward %.1f ms, "
                         "backward %.1f ms, all-reduce wait after backward %.1f ms, optimizer %.1f "
                         "ms; one rank alone: forward %.1f, backward %.1f ms." % (
                             b["forward_ms"], b["backward_ms"], b["allreduce_wait_ms"],
                             b["optimizer_ms"], a["forward_ms"], a["backward_ms"]))
            if "last_end_ms" in b:
                lines.append("The link: the first bucket's all-reduce started %.1f ms into "
                             "backward, the link waited %.1f ms between buckets for the next to "
                             "be ready, and the last ended %.1f ms into backward." % (
                                 b["first_start_ms"], b["idle_between_ms"], b["last_end_ms"]))
        if "ours/none" in runs and "flat/none" in runs:
            facts.append("hierarchical %.2fx the flat ring" % (
                runs["ours/none"]["samples_per_s"] / runs["flat/none"]["samples_per_s"]))
        if facts:
            lines.append("\n" + "; ".join(facts) + ".")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
