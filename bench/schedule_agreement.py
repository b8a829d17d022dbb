#!/usr/bin/python3
"""Does the simulator predict what the real coordinator does? Writes
docs/SCHEDULING_REAL.md.

Six short jobs are submitted at fixed offsets to a real ddp-coordinator with
four real ddp-worker processes on this machine (MLPs on synthetic data, of
three priorities, two of them elastic, three with checkpoints), chosen so
that the pool shrinks a job for one of its priority, preempts two through
their checkpoints, queues and resumes them, and grows jobs back. Each job's
path is read from the coordinator (its generation changes: how it started,
shrank, grew, was preempted and resumed, on how many workers each time).

Then the same six jobs, as a trace for build/bin/ddp_schedule_sim (which
drives the coordinator's own DecideSchedule, coordinator/schedule_policy.cc),
with each job's real submission time, its work in samples, the samples/s its
ranks reported at each world size (fitted as T(n) = t1 n / (1 + a (n - 1))),
the measured re-formation pause and the jobs' reformMinIntervalSeconds; and
the two are compared job by job: the sequence of allocations, the order the
jobs finished in, and each job's completion time.

    cd build && /usr/bin/python3 ../bench/schedule_agreement.py   # about a minute

Needs the built binaries (DDP_BIN, else build/bin); stdlib only.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, os.path.join(ROOT, "tests", "py"))
from cluster import Cluster, synthetic_job  # noqa: E402
from harness import BIN  # noqa: E402

C = "ddp.v1.Coordinator/"
WORKERS = 4
TRAIN = 8192
INTERVAL_S = 1.0  # every job's reformMinIntervalSeconds

# (offset in seconds, name, priority, min, max, epochs, checkpoints)
JOBS = (
    (0.0, "a", 0, 2, 4, 40, True),   # alone: all four; gives two to b, then preempted for c
    (2.0, "b", 0, 2, 2, 15, False),  # a's priority: takes what a holds above its min
    (4.0, "c", 5, 1, 2, 20, True),   # preempts a (b has no checkpoint); preempted for e
    (6.0, "d", 0, 1, 1, 6, False),   # waits behind a for the pool
    (8.0, "e", 10, 2, 2, 10, False),  # preempts c
    (10.0, "f", 0, 1, 2, 6, False),  # the last in the queue
)


def spec(folder, name, priority, lo, hi, epochs, checkpoints):
    s = synthetic_job(name, lo, maxWorkers=hi, priority=priority, epochs=epochs,
                      dataset={"kind": "synthetic", "trainSize": TRAIN, "testSize": 256},
                      evaluate=False, settleSeconds=0, reformMinIntervalSeconds=INTERVAL_S,
                      rejoinTimeoutSeconds=2, hangTimeoutSeconds=30)
    if checkpoints:
        s["checkpoint"] = {"dir": os.path.join(folder, name + "-ckpt"), "everySteps": 1000000}
    return s


def real_run():
    """Runs the six jobs; returns {name: {...}} with what each went through."""
    cluster = Cluster()
    try:
        for i in range(WORKERS):
            cluster.start_worker(i)
        cluster.wait_for(lambda: len(cluster.client.call(C + "ListWorkers").get("workers", []))
                         == WORKERS, 60, "the workers to attach")
        t0 = time.time()
        submitted, ended = {}, {}

        def poll():
            for j in cluster.client.call(C + "ListJobs").get("jobs", []):
                if j["state"] in ("JOB_STATE_SUCCEEDED", "JOB_STATE_FAILED", "JOB_STATE_CANCELLED"):
                    ended.setdefault(j["job_id"], time.time() - t0)

        for offset, name, priority, lo, hi, epochs, ckpt in JOBS:
            while time.time() < t0 + offset:
                poll()
                time.sleep(min(0.1, max(0.0, t0 + offset - time.time())))
            cluster.client.call(C + "SubmitJob", '{"spec": %s}' % json.dumps(
                spec(cluster.dir, name, priority, lo, hi, epochs, ckpt)))
            # Accepted now (the coordinator checks a job before it answers).
            submitted[name] = time.time() - t0
        # Until every job ended, noting when each did.
        deadline = time.time() + 600
        while len(ended) < len(JOBS):
            if time.time() > deadline:
                sys.exit("jobs still running after 600 s: %s" % sorted(set(submitted) - set(ended)))
            poll()
            time.sleep(0.1)
        out = {}
        for offset, name, priority, lo, hi, epochs, ckpt in JOBS:
            status = cluster.client.call(C + "GetStatus", '{"job_id": "%s"}' % name)
            job = cluster.client.call(C + "GetJob", '{"job_id": "%s"}' % name)
            out[name] = {
                "state": status["state"],
                "submit_s": submitted[name],
                "end_s": ended[name],
                "changes": status.get("generation_changes", []),
                "rates": {int(k): v for k, v in
                          job.get("samples_per_sec_by_world_size", {}).items()},
                "work": TRAIN * epochs,
                "t0": t0,
            }
        return out
    finally:
        cluster.stop()


def real_path(changes):
    """"start 4, shrink 2, preempted, resume 2, grow 3" from generation changes."""
    steps = []
    for c in changes:
        n = int(c.get("world_size", 0))
        cause = c["cause"]
        if cause == "CHANGE_CAUSE_START":
            steps.append("start %d" % n)
        elif cause == "CHANGE_CAUSE_PREEMPTED":
            steps += ["preempted", "resume %d" % n]
        elif cause == "CHANGE_CAUSE_SHRUNK":
            steps.append("shrink %d" % n)
        elif cause == "CHANGE_CAUSE_JOINED":
            steps.append("grow %d" % n)
        else:
            steps.append("%s %d" % (cause.replace("CHANGE_CAUSE_", "").lower(), n))
    return steps


def sim_path(job):
    """The same words from the simulator's segments (workers held over time)."""
    steps, held, last_to = [], 0, None
    for seg in job["segments"]:
        n = len(seg["workers"])
        gap = last_to is not None and seg["from_s"] > last_to + 1e-6
        if held == 0 and not steps:
            steps.append("start %d" % n)
        elif gap:
            steps += ["preempted", "resume %d" % n]
        elif n < held:
            steps.append("shrink %d" % n)
        elif n > held:
            steps.append("grow %d" % n)
        held, last_to = n, seg["to_s"]
    hidden = job["preemptions"] - steps.count("preempted")
    if hidden > 0:  # restarted at once: no gap in its segments
        steps.append("%d more preemption(s)" % hidden)
    return steps


def merged(path):
    """The path with each run of grows as one (to the size it ended at): how a
    growth splits depends on how far apart the workers freed up."""
    out = []
    for step in path:
        if step.startswith("grow") and out and out[-1].startswith("grow"):
            out[-1] = step
        else:
            out.append(step)
    return out


def scaling(rates):
    """a of T(n) = t1 n / (1 + a (n - 1)) closest to the measured rates (least
    squares over a grid of a, t1 free); 0 with fewer than two sizes."""
    if len(rates) < 2:
        return 0.0
    best = None
    for i in range(1001):
        a = i / 1000.0
        shape = {n: n / (1 + a * (n - 1)) for n in rates}
        t1 = sum(rates[n] * shape[n] for n in rates) / sum(shape[n] ** 2 for n in rates)
        err = sum((rates[n] - t1 * shape[n]) ** 2 for n in rates)
        if best is None or err < best[0]:
            best = (err, a)
    return best[1]


def calibrated_t1(job, a):
    """t1 such that T(n) over the world sizes the job really trained at, for as
    long as it did, processes its work: the rate it really had, sharing the
    machine's cores with whatever ran beside it. (A few steps' samples/s, which
    the coordinator measures, swing with what else runs; this does not.)"""
    changes = job["changes"]
    end = job["t0"] + job["end_s"]
    scaled_seconds = 0.0
    for k, c in enumerate(changes):
        n = int(c.get("world_size", 0))
        start = float(c["at_unix_seconds"]) + float(c.get("pause_seconds", 0))
        stop = float(changes[k + 1]["at_unix_seconds"]) if k + 1 < len(changes) else end
        scaled_seconds += max(0.0, stop - start) * n / (1 + a * (n - 1))
    return job["work"] / scaled_seconds if scaled_seconds > 0 else 1000.0


def simulate(real, binary):
    # A start's pause (rendezvous, communicator, state) stands for every
    # re-formation's; a preemption's pause also spans its time in the queue.
    pauses = [float(c.get("pause_seconds", 0)) for j in real.values() for c in j["changes"]
              if c["cause"] in ("CHANGE_CAUSE_START", "CHANGE_CAUSE_SHRUNK",
                                "CHANGE_CAUSE_JOINED")]
    pause = round(statistics.median(pauses or [1.0]), 3)
    trace = {"workers": WORKERS, "reform_pause_s": pause, "checkpoint_pause_s": 0.1,
             "restart_pause_s": pause, "reform_min_interval_s": INTERVAL_S, "jobs": []}
    for offset, name, priority, lo, hi, epochs, ckpt in JOBS:
        a = scaling(real[name]["rates"])
        t1 = calibrated_t1(real[name], a)
        trace["jobs"].append({"id": name, "owner": "", "priority": priority,
                              "submit_s": round(real[name]["submit_s"], 3),
                              "work": real[name]["work"], "t1": round(t1, 3), "a": a,
                              "min_workers": lo, "max_workers": hi, "preemptible": ckpt})
    proc = subprocess.run([binary, "--policy", "elastic", "--segments"],
                          input=json.dumps(trace), capture_output=True, text=True, timeout=120)
    if proc.returncode != 0:
        sys.exit("ddp_schedule_sim failed (%d): %s" % (proc.returncode, proc.stderr.strip()))
    return trace, {j["id"]: j for j in json.loads(proc.stdout)["jobs"]}


def write_doc(path, real, trace, sim):
    out = []
    w = out.append
    w("# The simulator against the real coordinator\n")
    w("Written by `bench/schedule_agreement.py` (do not edit by hand): six short jobs on "
      "%d real `ddp-worker` processes on this machine, then the same jobs through "
      "`build/bin/ddp_schedule_sim`, which drives the coordinator's own `DecideSchedule`. "
      "The trace takes each job's real submission time and work; its scaling a of "
      "T(n) = t1 n / (1 + a (n - 1)) fitted to the samples/s its ranks reported at each "
      "world size, and t1 such that T over the world sizes it really trained at, for as long "
      "as it did, processes its work (jobs here share two cores, so a few steps' rate swings "
      "with what runs beside them); and "
      "the median pause of a start, shrink or grow the coordinator measured (%.2f s) for "
      "every re-formation and a preempted job's restart. Every job's "
      "`reformMinIntervalSeconds` is %g s.\n" % (WORKERS, trace["reform_pause_s"], INTERVAL_S))
    w("| job | priority | min-max | checkpoints | submitted | real: path | simulated: path | "
      "same | real JCT | simulated JCT |")
    w("| --- | ---: | --- | --- | ---: | --- | --- | --- | ---: | ---: |")
    agree = agree_merged = 0
    for offset, name, priority, lo, hi, epochs, ckpt in JOBS:
        r, s = real[name], sim[name]
        rp, sp = real_path(r["changes"]), sim_path(s)
        same = rp == sp
        same_merged = merged(rp) == merged(sp)
        agree += same
        agree_merged += same_merged
        w("| %s | %d | %d-%d | %s | %.1f s | %s | %s | %s | %.1f s | %.1f s |" %
          (name, priority, lo, hi, "yes" if ckpt else "no", r["submit_s"], ", ".join(rp),
           ", ".join(sp), "yes" if same else ("as a whole" if same_merged else "**no**"),
           r["end_s"] - r["submit_s"], s["jct_s"]))
    real_order = sorted(real, key=lambda n: real[n]["end_s"])
    sim_order = sorted(sim, key=lambda n: sim[n]["end_s"])
    w("")
    w("**%d of %d jobs took the same path** (the same start size, shrinks, grows and "
      "preemptions, in the same order); %d of %d when a run of grows counts as one "
      "(\"as a whole\": how a growth splits depends on how far apart the workers freed "
      "up). Finishing order: real %s, simulated %s%s." %
      (agree, len(JOBS), agree_merged, len(JOBS), " ".join(real_order), " ".join(sim_order),
       " (the same)" if real_order == sim_order else ""))
    w("")
    w("Where they part, it is timing, not the policy: the coordinator calls the same "
      "function at every tick, so a difference comes from inputs the simulator models "
      "coarsely (jobs sharing two cores slow each other, which a per-job T(n) does not say; "
      "a real re-formation's pause varies around its median; a measurement is a few steps' "
      "rate, the simulator's is exact).\n")
    w("The trace (the `ddp_schedule_sim` input):\n")
    w("```json\n%s\n```\n" % json.dumps(trace, indent=1, sort_keys=True))
    with open(path, "w") as f:
        f.write("\n".join(out))
    return agree, agree_merged


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--sim", default=os.path.join(BIN, "ddp_schedule_sim"))
    ap.add_argument("--out", default=os.path.join(ROOT, "docs", "SCHEDULING_REAL.md"))
    ap.add_argument("--json", help="also write the real run and the simulation here")
    args = ap.parse_args()
    real = real_run()
    failed = {n: j["state"] for n, j in real.items() if j["state"] != "JOB_STATE_SUCCEEDED"}
    if failed:
        sys.exit("jobs did not succeed: %s" % failed)
    trace, sim = simulate(real, args.sim)
    agree, agree_merged = write_doc(args.out, real, trace, sim)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"real": real, "trace": trace, "sim": sim}, f, indent=1)
    for offset, name, *_ in JOBS:
        print("%s: real %s | sim %s" % (name, real_path(real[name]["changes"]),
                                         sim_path(sim[name])))
    print("%d of %d jobs took the same path (%d counting a run of grows as one); wrote %s" %
          (agree, len(JOBS), agree_merged, args.out))


if __name__ == "__main__":
    main()
