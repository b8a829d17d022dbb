#!/usr/bin/python3
"""Soak: one long job, N random faults, then a summary and the final checks.

Run through tests/chaos/soak.sh (bounded by a timeout; not in CI):

    tests/chaos/soak.sh [N=20] [SEED] [--loopback] [--epochs E] [--kinds k1,k2]

The job is tests/chaos/chaos.py's chaos_job (three workers, min 2) with
enough epochs for the faults and a checkpoint every 50 steps. Faults are
drawn from kill -9 of a worker, SIGSTOP (then SIGCONT), a hung training
thread, a coordinator kill -9 and restart, the whole job killed and resumed
from its checkpoint, and, when this process is root and network namespaces
can be made, a network partition (the whole run then lives in namespaces,
one host per process; --loopback keeps it on loopback without partitions).
After each fault the world is topped up again (tests/chaos/faults.py: killed
workers restarted, stopped ones continued, links back up) before the next.

Prints one line per fault (fault, victim, at step, recovery seconds, steps
lost), then the checks: the job succeeded, every epoch trained each sample
once (padding apart), no fault lost more than the step in flight (the
checkpoint interval for a whole-job kill), no healthy worker was evicted in
a fault's place, final accuracy within a point of
an undisturbed run of the same job and seed, no crash, no process or
/dev/shm segment left behind. Exit status 0 when all hold.
"""
import argparse
import atexit
import os
import random
import shutil
import signal
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))


def snapshot_binaries():
    """A long soak runs its own copy of ddp-coordinator, ddp-worker and the
    coordinator's job check ddp-validate (DDP_BIN, read by
    tests/py/harness.py): a rebuild meanwhile can't mix versions into one
    job."""
    src = os.environ.get("DDP_BIN", os.path.join(HERE, "..", "..", "build", "bin"))
    dst = tempfile.mkdtemp(prefix="ddp-soak-bin-")
    os.chmod(dst, 0o755)  # the job check runs ddp-validate from here as nobody
    for name in ("ddp-coordinator", "ddp-worker", "ddp-validate"):
        shutil.copy2(os.path.join(src, name), os.path.join(dst, name))
    os.environ["DDP_BIN"] = dst
    atexit.register(shutil.rmtree, dst, True)


snapshot_binaries()
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "..", "py"))

import chaos  # noqa: E402
import faults  # noqa: E402
import netns  # noqa: E402

CHECKPOINT_EVERY = 50


def log(*args):
    print(time.strftime("%H:%M:%S"), *args, flush=True)


def run_job(job, net, rng=None, n=0, kinds=(), timeout=900):
    """The job with n random faults (none for the undisturbed run): its
    analysis, with the end-of-run checks."""
    run = chaos.ChaosRun(job, 3, net=net)
    injections = []
    try:
        run.wait_state("JOB_STATE_RUNNING", 60)
        driver = faults.Driver(run, rng, net=net, log=log) if n else None
        for i in range(n):
            kind = rng.choice(kinds)
            inj = driver.inject(kind)
            if inj is None:
                log("the job ended after %d of %d faults" % (i, n))
                break
            injections.append(inj)
            log("fault %d/%d: %s of %s at global step %d%s" % (
                i + 1, n, kind, inj.victim, inj.step, "  ERROR: " + inj.error if inj.error else ""))
        final = run.finish(timeout)
        result = faults.analyze(run, injections, final)
    finally:
        run.close()
    result.update(faults.finish_checks(run))
    return result


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--faults", type=int, default=20)
    p.add_argument("--seed", type=int, default=None)
    p.add_argument("--epochs", type=int, default=None,
                   help="default: enough for the faults (loopback 4 per fault + 8)")
    p.add_argument("--kinds", default=None, help="comma-separated, of " + ", ".join(faults.KINDS))
    p.add_argument("--loopback", action="store_true", help="never namespaces (no partitions)")
    p.add_argument("--timeout", type=float, default=1200, help="for the job to finish, seconds")
    args = p.parse_args()
    seed = args.seed if args.seed is not None else int(time.time())
    rng = random.Random(seed)
    use_netns, why = (False, "--loopback") if args.loopback else netns.available()
    kinds = [k for k in (args.kinds or ",".join(faults.KINDS)).split(",") if k]
    if "partition" in kinds and not use_netns:
        kinds.remove("partition")
        log("no partitions: %s" % why)
    if args.epochs is None:
        # Gloo over TCP between namespaces trains about 3x slower than the
        # shared-memory ring on loopback.
        args.epochs = (2 * args.faults + 6) if use_netns else (4 * args.faults + 8)
    log("soak: %d faults of %s, seed %d (the same seed draws the same faults), %d epochs, %s" % (
        args.faults, ", ".join(kinds), seed, args.epochs,
        "network namespaces" if use_netns else "loopback"))
    folders = [tempfile.mkdtemp(prefix="ddp-soak-ckpt-") for _ in range(2)]
    net = None
    try:
        if use_netns:
            net = netns.Network(4)
        job = chaos.chaos_job("soak", epochs=args.epochs,
                              checkpoint={"dir": folders[0], "everySteps": CHECKPOINT_EVERY, "keep": 2})
        base = run_job(dict(job, name="soak-base", checkpoint=dict(job["checkpoint"], dir=folders[1])),
                       net, timeout=args.timeout)
        log("undisturbed: %s, accuracy %s" % (base["state"], base["test_accuracy"]))
        result = run_job(job, net, rng, args.faults, kinds, timeout=args.timeout)
    finally:
        if net is not None:
            net.close()
        for f in folders:
            shutil.rmtree(f, True)
    ok = report(result, base, seed)
    faults.dump({"seed": seed, "kinds": kinds, "epochs": args.epochs, "netns": use_netns,
                 "result": result, "undisturbed": base}, os.path.join(result["dir"], "soak.json"))
    print("everything measured: %s" % os.path.join(result["dir"], "soak.json"))
    sys.exit(0 if ok else 1)


def report(result, base, seed):
    print()
    print("%-3s %-12s %-11s %8s %10s  %-16s %s" % ("#", "fault", "victim", "at step", "recovery s",
                                                   "steps lost", "notes"))
    failures, wrong = [], []
    for i, r in enumerate(result["injections"], 1):
        notes = []
        if r["kind"] == "coordinator":
            recovery = "-"
            lost = "%d" % r["steps_lost_total"]
            notes.append("%s; %d steps during the %.1fs outage; longest gap %.3fs" % (
                "adopted" if r["adopted"] else "NOT adopted (%s)" % r["causes"],
                r["steps_during_outage"], r["outage_seconds"], r["longest_gap_seconds"]))
            if not r["adopted"] or r["steps_lost_total"]:
                failures.append("fault %d: a coordinator restart stopped training" % i)
        else:
            recovery = "%.2f" % r["recovery_seconds"] if "recovery_seconds" in r else "never"
            if r["kind"] == "whole":
                lost = "%d since ckpt" % r.get("steps_discarded", 0)
            else:
                lost = "%d+%d in flight" % (r.get("steps_lost_reported", 0), r.get("in_flight", 0))
            notes.append(",".join(r.get("causes", [])))
            if r.get("wrongly_evicted"):
                notes.append("also evicted %s" % ",".join(r["wrongly_evicted"]))
                wrong.append("fault %d (%s of %s): evicted %s" % (i, r["kind"], r["victim"],
                                                                 ",".join(r["wrongly_evicted"])))
            if r.get("victim_steps_after_fault"):
                notes.append("fenced %s finished step(s) %s after the fault" % (
                    r["victim"], r["victim_steps_after_fault"]))
            bound = CHECKPOINT_EVERY + 1 if r["kind"] == "whole" else 1
            if r.get("steps_discarded", 0) > bound or r.get("completed_past_resume", 0) > (
                    CHECKPOINT_EVERY if r["kind"] == "whole" else 0):
                failures.append("fault %d (%s): lost more than the step in flight" % (i, r["kind"]))
        if r.get("error"):
            notes.append("ERROR: " + r["error"])
            failures.append("fault %d (%s): %s" % (i, r["kind"], r["error"]))
        print("%-3d %-12s %-11s %8s %10s  %-16s %s" % (i, r["kind"], r["victim"], r["at_step"],
                                                       recovery, lost, "; ".join(n for n in notes if n)))
    s = result["samples"]
    acc, base_acc = result["test_accuracy"], base["test_accuracy"]
    print()
    checks = [
        ("job succeeded", result["state"] == "JOB_STATE_SUCCEEDED",
         "%s: %s" % (result["state"], result["message"])),
        ("every sample once", s["skipped"] == 0 and s["duplicated"] == 0,
         "%d skipped, %d duplicated (padding %d, apart)" % (s["skipped"], s["duplicated"],
                                                            s["padding"])),
        ("accuracy within a point of undisturbed",
         acc is not None and base_acc is not None and abs(acc - base_acc) < 0.01,
         "%s vs %s" % (acc, base_acc)),
        ("faults lost at most the step in flight", not failures, "; ".join(failures) or "yes"),
        ("only the faulty worker evicted", not wrong, "; ".join(wrong) or "yes"),
        ("no crash", not result["crashed"] and not base["crashed"],
         "; ".join(result["crashed"] + base["crashed"]) or "none"),
        ("nothing left behind", not (result["processes_left"] or result["shm_left"] or
                                     base["processes_left"] or base["shm_left"]),
         "processes %s, /dev/shm %s" % (result["processes_left"] + base["processes_left"],
                                       result["shm_left"] + base["shm_left"])),
    ]
    for name, good, detail in checks:
        print("%-4s %-40s %s" % ("ok" if good else "FAIL", name, detail))
    print("\nrun folder %s (seed %d)" % (result["dir"], seed))
    return all(good for _, good, _ in checks)


if __name__ == "__main__":
    # A SIGTERM (soak.sh's timeout) still runs the clean-ups: processes,
    # namespaces, checkpoint folders.
    signal.signal(signal.SIGTERM, lambda *_: (_ for _ in ()).throw(KeyboardInterrupt()))
    main()
