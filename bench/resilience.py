#!/usr/bin/python3
"""What a fault costs a job, measured: writes docs/RESILIENCE.md and
docs/resilience.json.

For each kind of fault (kill -9 of a worker, SIGSTOP of a worker, a hung
training thread, a network partition, a coordinator kill -9 and restart, the
whole job killed and resumed from its checkpoint) it runs one job on three
workers (tests/chaos/chaos.py's ChaosRun: real processes on loopback, or in
network namespaces for the partition), causes the fault --injections times
(10), each once the previous recovery has finished and the world is back to
full size (killed workers restarted, stopped ones continued, links back up),
lets the job finish, and reads what each fault cost from the run's own
records (tests/chaos/faults.py): the time from the fault to the first
completed step of the next generation, steps lost, samples trained twice or
never (tests/chaos/coverage.py over the index logs, DistributedSampler's
padding counted apart), and the final test accuracy against an undisturbed
run of the same job and seed.

    /usr/bin/python3 bench/resilience.py            # about 30 minutes
    /usr/bin/python3 bench/resilience.py --quick    # a smoke run (2 each)
    /usr/bin/python3 bench/resilience.py --kinds kill9,hang --injections 5

Coordinators that fail over through etcd have kinds of their own
(bench/failover_faults.py: leader_kill9, leader_stop, leader_partition,
etcd_member, etcd_down, and leader_kill9, leader_stop and etcd_member again
with etcd at README's settings (etcd's default timings) as *_readme_etcd;
and etcd_load, etcd's writes at 1,000 simulated
workers), in a section of their own. A run that names only those keeps
everything else docs/resilience.json holds: `--kinds etcd_down` measures
that row again and leaves every other row as it was measured. A run that
names any of the kinds above writes their rows afresh, as it always did,
and keeps the failover section.

Needs build/bin (ddp-coordinator, ddp-worker); the partition row needs root
and network namespaces (else the row says why it was skipped). These are
measurements on a small shared machine, not tests: nothing fails on a
number.
"""
import argparse
import atexit
import datetime
import json
import os
import platform
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def snapshot_binaries():
    """Copies build/bin's ddp-coordinator and ddp-worker to a folder of this
    run's own (DDP_BIN, which tests/py/harness.py reads), so a rebuild in the
    shared tree mid-run can't mix versions; what was measured is recorded."""
    import hashlib
    src = os.environ.get("DDP_BIN", os.path.join(ROOT, "build", "bin"))
    dst = tempfile.mkdtemp(prefix="ddp-resilience-bin-")
    os.chmod(dst, 0o755)  # the job check runs ddp-validate from here as nobody
    info = {"from": src}
    shutil.copy2(os.path.join(src, "ddp-validate"), os.path.join(dst, "ddp-validate"))
    for name in ("ddp-coordinator", "ddp-worker"):
        shutil.copy2(os.path.join(src, name), os.path.join(dst, name))
        with open(os.path.join(dst, name), "rb") as f:
            digest = hashlib.sha256(f.read()).hexdigest()[:16]
        built = datetime.datetime.utcfromtimestamp(os.path.getmtime(os.path.join(src, name)))
        info[name] = {"sha256": digest, "built": built.strftime("%Y-%m-%d %H:%M:%S UTC")}
    git = lambda *a: subprocess.run(["git", "-C", ROOT] + list(a), capture_output=True,
                                    text=True).stdout.strip()
    info["head"] = git("log", "-1", "--format=%h %cd %s", "--date=format:%Y-%m-%d %H:%M:%S")
    info["uncommitted"] = [l[3:] for l in git("status", "--porcelain").splitlines()
                           if l[3:].endswith((".cc", ".h", ".proto", "CMakeLists.txt"))]
    os.environ["DDP_BIN"] = dst
    atexit.register(shutil.rmtree, dst, True)
    return info


BINARIES = snapshot_binaries()
sys.path.insert(0, os.path.join(ROOT, "tests", "chaos"))
sys.path.insert(0, os.path.join(ROOT, "tests", "py"))

import chaos  # noqa: E402
import failover_faults  # noqa: E402
import faults  # noqa: E402
import netns  # noqa: E402

ALL_KINDS = faults.KINDS + failover_faults.KINDS + ("etcd_load",)

CHECKPOINT_EVERY = 50

TORCHRUN = {
    "kill9": "The agent sees the process exit, tears down every worker and restarts them all "
             "[agent]: every step since the user's last checkpoint is lost [train_script], plus "
             "process start-up, rendezvous and checkpoint load.",
    "sigstop": "No process exits, so the agent sees no failure (its watchdog is opt-in, armed by "
               "the training script [agent][timer]); peers wait in the collective until the process "
               "group timeout (default 10 min NCCL, 30 min Gloo [pg-timeout]), then as kill -9: all "
               "restart from the last checkpoint.",
    "hang": "As SIGSTOP: nothing exits; the collective timeout (10-30 min) ends it, then every "
            "worker restarts from the last checkpoint. Only a script that arms the agent's "
            "expiration timers [timer] is reaped sooner.",
    "partition": "As SIGSTOP: peers block in the collective until its timeout, then a full restart "
                 "from the last checkpoint (rendezvous waits for the node or scales down "
                 "[quickstart]).",
    "coordinator": "The c10d rendezvous store is hosted by one node's agent [quickstart]; its docs "
                   "describe no restart of it in place: losing that node is a failure, i.e. a full "
                   "restart from the last checkpoint.",
    "whole": "The same: restart every worker from the user's last checkpoint [train_script]; every "
             "step since it is lost, plus start-up and rendezvous.",
    "coordinator_stop": "The rendezvous store lives in one node's agent [quickstart]; its docs "
                        "describe no case of that host pausing.",
    "join_kill": "As kill -9: every worker restarts from the last checkpoint, whether or not a "
                 "rendezvous for a new member was under way [agent][train_script].",
}
HOROVOD = {
    "kill9": "Survivors get HorovodInternalError, restore the last state.commit() (steps since it "
             "are redone), re-rendezvous and broadcast state from the new rank 0; the failed host is "
             "blacklisted [horovod].",
    "sigstop": "Its docs name no heartbeat or hang detection: survivors only notice when a "
               "collective fails (Gloo/NCCL timeout), then roll back to the last commit [horovod].",
    "hang": "As SIGSTOP: no documented hang detection; rollback to the last commit once a "
            "collective fails [horovod].",
    "partition": "As SIGSTOP: rollback to the last commit once the collective fails; new rendezvous "
                 "without the host [horovod].",
    "coordinator": "The driver (horovodrun) runs rendezvous and host discovery [horovod]; its docs "
                   "describe no recovery from losing it.",
    "whole": "Elastic state lives in memory only (commit() is an in-memory copy [horovod]): a whole-"
             "job loss restarts from the user's own checkpoint, if any.",
    "coordinator_stop": "The driver (horovodrun) runs rendezvous and host discovery [horovod]; its "
                        "docs describe no case of it pausing.",
    "join_kill": "As kill -9: survivors restore the last commit and rendezvous again [horovod].",
}
SOURCES = {
    "train_script": "https://docs.pytorch.org/docs/stable/elastic/train_script.html",
    "agent": "https://docs.pytorch.org/docs/stable/elastic/agent.html",
    "quickstart": "https://docs.pytorch.org/docs/stable/elastic/quickstart.html",
    "timer": "https://docs.pytorch.org/docs/stable/elastic/timer.html",
    "pg-timeout": "https://github.com/pytorch/pytorch/pull/110947 (ProcessGroupNCCL default timeout "
                  "10 min; other backends keep 30 min)",
    "horovod": "https://horovod.readthedocs.io/en/v0.22.1/elastic.html (source: "
               "https://github.com/horovod/horovod/blob/master/docs/elastic.rst)",
}


def log(*args):
    print(time.strftime("%H:%M:%S"), *args, flush=True)


def machine():
    model = "unknown"
    with open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    mem = 0
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemTotal:"):
                mem = int(line.split()[1]) // (1024 * 1024)
    nproc = subprocess.run(["nproc"], capture_output=True, text=True).stdout.strip()
    return {"nproc": int(nproc), "cpu": model, "memory_gib": mem, "kernel": platform.release(),
            "loadavg_start": os.getloadavg()}


def job_for(kind, epochs, folder):
    return chaos.chaos_job("resilience-" + kind.replace("_", "-"), epochs=epochs,
                           checkpoint={"dir": folder, "everySteps": CHECKPOINT_EVERY, "keep": 2})


def one_run(kind, job, n, rng, net, args):
    """One job with up to n faults of `kind`; its analysis."""
    run = chaos.ChaosRun(job, 3, net=net)
    injections = []
    try:
        run.wait_state("JOB_STATE_RUNNING", 60)
        driver = faults.Driver(run, rng, net=net, outage=args.outage, log=log)
        while len(injections) < n:
            inj = driver.inject(kind)
            if inj is None:
                log("  the job ended after %d %s faults" % (len(injections), kind))
                break
            injections.append(inj)
            log("  %s #%d: %s at step %d%s" % (kind, len(injections), inj.victim, inj.step,
                                               " ERROR " + inj.error if inj.error else ""))
        final = run.finish(args.job_timeout)
        result = faults.analyze(run, injections, final)
    finally:
        run.close()
    result.update(faults.finish_checks(run))
    for r in result["injections"]:
        if r["kind"] in ("coordinator", "coordinator_stop"):
            log("  %s: %d steps during the %.1fs outage, longest gap %.3fs, adopted %s" % (
                kind, r["steps_during_outage"], r["outage_seconds"], r["longest_gap_seconds"],
                r["adopted"]))
        else:
            log("  %s %s at step %s: first new step after %.3fs, lost %s (+%s in flight), %s" % (
                kind, r["victim"], r["at_step"], r.get("recovery_seconds", float("nan")),
                r.get("steps_lost_reported"), r.get("in_flight"), r.get("causes")))
    log("  run %s: %s, accuracy %s, samples %s" % (
        kind, result["state"], result["test_accuracy"],
        {k: result["samples"][k] for k in ("skipped", "duplicated", "padding")}))
    return result


def measure_kind(kind, args, rng, baselines, started):
    row = {"kind": kind, "description": faults.DESCRIPTION[kind], "runs": [], "skipped": ""}
    net = None
    if kind == "partition":
        ok, why = netns.available()
        if not ok:
            row["skipped"] = "network namespaces can't be made here: " + why
            log("skip partition:", row["skipped"])
            return row
    key = "netns" if kind == "partition" else "loopback"
    epochs = args.netns_epochs if kind == "partition" else args.epochs
    while sum(len(r["injections"]) for r in row["runs"]) < args.injections:
        if len(row["runs"]) >= 3:
            break
        if time.time() - started > args.budget_minutes * 60:
            row["skipped"] = "time budget (%d min) spent" % args.budget_minutes
            break
        folder = tempfile.mkdtemp(prefix="ddp-resilience-ckpt-")
        try:
            if kind == "partition":
                net = netns.Network(4)
            if key not in baselines:
                base_folder = tempfile.mkdtemp(prefix="ddp-resilience-ckpt-")
                base_net = net
                run = chaos.ChaosRun(dict(job_for("base-" + key, epochs, base_folder)), 3, net=base_net)
                try:
                    final = run.finish(args.job_timeout)
                    base = faults.analyze(run, [], final)
                finally:
                    run.close()
                    shutil.rmtree(base_folder, True)
                base.update(faults.finish_checks(run))
                baselines[key] = base
                log("undisturbed (%s, %d epochs): %s, accuracy %s in %.0fs, median step %.4fs" % (
                    key, epochs, base["state"], base["test_accuracy"],
                    float(base["elapsed_seconds"] or 0), base["median_step_seconds"]))
            left = args.injections - sum(len(r["injections"]) for r in row["runs"])
            log("%s: a run of %d epochs for %d faults" % (kind, epochs, left))
            result = one_run(kind, job_for(kind, epochs, folder), left, rng, net, args)
            result["baseline"] = key
            row["runs"].append(result)
        finally:
            if net is not None:
                net.close()
                net = None
            shutil.rmtree(folder, True)
    return row


# ---- evaluations -------------------------------------------------------------

def evaluation_job(name, epochs):
    """tests/chaos's evaluation job: a CNN on a synthetic problem whose
    20,000-sample test set takes every rank seconds to evaluate its share of,
    while a step takes milliseconds; hang timeout 1 s."""
    return chaos.chaos_job(name, model={"kind": "cnn"},
                           dataset={"kind": "synthetic", "trainSize": 12000, "testSize": 20000},
                           epochs=epochs, minWorkers=2, maxWorkers=3, hangTimeoutSeconds=1)


def evaluation_gaps(records):
    """Seconds between an epoch's last step and the next epoch's first, per
    epoch end: the evaluation (every rank evaluates its share then)."""
    return [b["time"] - a["time"] for a, b in zip(records, records[1:])
            if b["epoch"] == a["epoch"] + 1 and b["generation"] == a["generation"]]


def measure_evaluations(args):
    """An evaluation longer than the hang threshold at every epoch's end, and
    rank 0 killed after the job's last step, before its evaluation reached
    the coordinator."""
    out = {}
    run = chaos.ChaosRun(evaluation_job("resilience-eval", args.eval_epochs), 3)
    try:
        final = run.finish(args.job_timeout)
        gaps = evaluation_gaps(run.metrics("w0"))
        changes = final.get("generation_changes", [])
        out["slow"] = {
            "state": final.get("state"), "epochs": args.eval_epochs,
            "evaluated": sorted(int(e.get("epoch", 0)) for e in final.get("epoch_results", [])),
            "gaps": gaps, "reformations": len(changes) - 1,
            "causes": [c.get("cause", "").replace("CHANGE_CAUSE_", "") for c in changes[1:]],
            "median_step_seconds": faults.median_step_seconds(faults.Records(run, 3)),
            "dir": run.dir}
    finally:
        run.close()
    log("slow evaluations: %s, %d re-formations, evaluations %s s" % (
        out["slow"]["state"], out["slow"]["reformations"], ["%.2f" % g for g in out["slow"]["gaps"]]))
    lost = []
    for i in range(args.eval_runs):
        run = chaos.ChaosRun(evaluation_job("resilience-eval-last-%d" % i, 2), 3)
        try:
            run.wait_state("JOB_STATE_RUNNING", 60)
            total = chaos.wait_for(lambda: int(run.status().get("total_steps", 0)), 30, "total steps")
            chaos.wait_for(lambda: run.step() >= total, args.job_timeout, "the last step",
                           interval=0.02)
            killed_generation = run.generation()
            t_kill = time.time()
            run.kill("w0")
            final = run.finish(args.job_timeout)
            t_end = time.time()  # finish() polls every 0.1 s
            results = final.get("epoch_results", [])
            last = results[-1] if results else {}
            lost.append({
                "state": final.get("state"), "killed_generation": killed_generation,
                "evaluated": sorted(int(e.get("epoch", 0)) for e in results),
                "last_generation": int(last.get("generation", 0)),
                "reevaluated": int(last.get("generation", 0)) > killed_generation,
                "final_is_last_epoch": final.get("test_accuracy") == last.get("test_accuracy"),
                "end_after_kill_seconds": t_end - t_kill,
                "dir": run.dir})
        finally:
            run.close()
        log("rank 0 killed after the last step: %s" % lost[-1])
    out["last"] = lost
    return out


def evaluation_markdown(ev):
    L = ["## Evaluations", "",
         "Two cases with a job of their own: a CNN on a synthetic problem with a 20,000-sample test "
         "set (`tests/chaos/chaos_loopback_test.py`'s `EvaluationChaosTest`), 12,000 training "
         "samples, three workers, `hangTimeoutSeconds` 1. Every rank evaluates its share of the test "
         "set after each epoch, under a bound of the phase's own (`evalTimeoutSeconds`, else 10 × "
         "its share at the forward speed measured in training), which its heartbeats carry.", "",
         "| case | n | what happened | target | met? |", "| --- | ---: | --- | --- | --- |"]
    s = ev.get("slow")
    if s:
        gaps = s["gaps"]
        threshold = max(1.0, 10 * s["median_step_seconds"])
        ok = (s["state"] == "JOB_STATE_SUCCEEDED" and s["reformations"] == 0 and
              s["evaluated"] == list(range(s["epochs"])))
        L.append("| an evaluation longer than the hang threshold, at every epoch's end | %d | "
                 "evaluations took %s s median, %s s max, against a hang threshold of %.1f s "
                 "(max of `hangTimeoutSeconds` and 10 median steps of %.4f s); %d re-formation(s)%s; "
                 "epochs evaluated %s of %d | no re-formation, every epoch evaluated | %s |" % (
                     len(gaps), fmt(statistics.median(gaps) if gaps else None),
                     fmt(max(gaps) if gaps else None), threshold, s["median_step_seconds"],
                     s["reformations"], (" (%s)" % ", ".join(s["causes"])) if s["causes"] else "",
                     len(s["evaluated"]), s["epochs"], "**met**" if ok else "**missed**"))
    last = ev.get("last") or []
    if last:
        re_ = sum(1 for r in last if r["reevaluated"])
        ok = all(r["state"] == "JOB_STATE_SUCCEEDED" and r["final_is_last_epoch"] and
                 r["evaluated"] == [0, 1] for r in last)
        ends = [r["end_after_kill_seconds"] for r in last if r["end_after_kill_seconds"]]
        L.append("| rank 0 kill -9 after the job's last step, during the final evaluation | %d | "
                 "the final model's evaluation re-run by the next generation in %d of %d (in the "
                 "rest the kill came after its result had reached the coordinator); the job's "
                 "accuracy is the last epoch's in %d of %d; the job ended %s s after the kill "
                 "(median) | the final accuracy is the final model's | %s |" % (
                     len(last), re_, len(last), sum(1 for r in last if r["final_is_last_epoch"]),
                     len(last), fmt(statistics.median(ends) if ends else None),
                     "**met**" if ok else "**missed**"))
    L.append("")
    return L


# ---- summaries ---------------------------------------------------------------

def fmt(x, digits=2):
    return "—" if x is None else ("%.*f" % (digits, x))


def summarize_row(row, baselines, hb, hang_timeout):
    injections = [i for r in row["runs"] for i in r["injections"]]
    kind = row["kind"]
    s = {"n": len(injections), "errors": [i["error"] for i in injections if i.get("error")]}
    if kind in ("coordinator", "coordinator_stop"):
        s["steps_during_outage"] = faults.summarize([i["steps_during_outage"] for i in injections])
        s["outage_seconds"] = faults.summarize([i["outage_seconds"] for i in injections])
        s["longest_gap"] = faults.summarize([i["longest_gap_seconds"] for i in injections])
        s["adopted"] = sum(1 for i in injections if i["adopted"])
        s["adopted_after"] = faults.summarize([i["adopted_after_seconds"] for i in injections])
        s["steps_lost_max"] = max((i["steps_lost_total"] for i in injections), default=0)
    else:
        s["recovery"] = faults.summarize([i.get("recovery_seconds") for i in injections])
        s["steps_lost_max"] = max((i.get("steps_lost_total", 0) for i in injections), default=0)
        s["steps_lost_reported_max"] = max((i.get("steps_lost_reported", 0) for i in injections),
                                           default=0)
        s["in_flight_max"] = max((i.get("in_flight", 0) for i in injections), default=0)
        s["completed_past_resume_max"] = max((i.get("completed_past_resume", 0)
                                              for i in injections), default=0)
        s["wrongly_evicted"] = [(i["victim"], i["wrongly_evicted"], i["reasons"][:1])
                                for i in injections if i.get("wrongly_evicted")]
        s["extra_generations"] = sum(i.get("generations_between", 0) for i in injections)
        s["victim_steps_after_fault"] = [(i["victim"], i["at_step"], i["victim_steps_detail"])
                                         for i in injections if i.get("victim_steps_after_fault")]
        s["steps_discarded_max"] = max((i.get("steps_discarded", 0) for i in injections), default=0)
        phase_names = []
        for i in injections:
            for k in (i.get("phases") or {}):
                if k not in phase_names and isinstance(i["phases"][k], (int, float)):
                    phase_names.append(k)
        s["phases"] = {k: faults.summarize([i["phases"].get(k) for i in injections
                                            if isinstance(i.get("phases", {}).get(k), (int, float))])
                       for k in phase_names}
    s["duplicated"] = sum(r["samples"]["duplicated"] for r in row["runs"])
    s["skipped"] = sum(r["samples"]["skipped"] for r in row["runs"])
    s["padding"] = sum(r["samples"]["padding"] for r in row["runs"])
    s["accuracy"] = [(r["test_accuracy"], baselines[r["baseline"]]["test_accuracy"])
                     for r in row["runs"]]
    s["states"] = [r["state"] for r in row["runs"]]
    s["crashed"] = [c for r in row["runs"] for c in r["crashed"]]
    s["left_behind"] = [(r["processes_left"], r["shm_left"]) for r in row["runs"]
                        if r["processes_left"] or r["shm_left"]]
    s["rejoin_pause"] = faults.summarize([p for r in row["runs"] for p in r["rejoins"]["pause_seconds"]])
    s["rejoin_setup"] = faults.summarize([d["joiner_join_to_ring"] for r in row["runs"]
                                          for d in r["rejoins"].get("detail", [])])
    s["first_world"] = [i.get("world_size_new") for i in injections if kind == "whole"]
    # Targets.
    target = {"kill9": 2.0, "join_kill": 2.0, "sigstop": hb + 2, "partition": hb + 2,
              "hang": hang_timeout + 2}.get(kind)
    s["target_seconds"] = target
    missed = []
    if s["errors"]:
        missed.append("%d recoveries never came" % len(s["errors"]))
    if target is not None and s["recovery"].get("n") and s["recovery"]["max"] > target:
        missed.append("time (max %.2f s > %.1f s; %d of %d over)" % (
            s["recovery"]["max"], target,
            sum(1 for i in injections if i.get("recovery_seconds", 0) > target), s["n"]))
    if kind in ("coordinator", "coordinator_stop"):
        threshold = coordinator_gap_threshold(row, baselines)
        s["gap_threshold"] = threshold
        paused = [i for i in injections if i["longest_gap_seconds"] > threshold]
        if paused or s["adopted"] < s["n"] or s["steps_lost_max"] > 0:
            missed.append("pause (%d of %d outages with a gap over %.3f s; %d adopted)" % (
                len(paused), s["n"], threshold, s["adopted"]))
    elif kind == "whole":
        if s["steps_discarded_max"] > CHECKPOINT_EVERY + 1:
            missed.append("lost %d steps > checkpoint interval %d + 1" % (s["steps_discarded_max"],
                                                                         CHECKPOINT_EVERY))
    else:
        if s["steps_lost_max"] > 1 or s["completed_past_resume_max"] > 0:
            missed.append("steps lost (max %d per fault, committed steps redone %d)" % (
                s["steps_lost_max"], s["completed_past_resume_max"]))
        if s["wrongly_evicted"]:
            missed.append("%d faults evicted a healthy worker" % len(s["wrongly_evicted"]))
    if s["duplicated"] or s["skipped"]:
        missed.append("samples (%d duplicated, %d skipped)" % (s["duplicated"], s["skipped"]))
    if any(abs(a - b) >= 0.01 for a, b in s["accuracy"] if a is not None and b is not None):
        worst = max((a - b for a, b in s["accuracy"] if a is not None and b is not None), key=abs)
        tail = []
        for r in row["runs"]:
            tail = baselines[r["baseline"]].get("epoch_accuracy", [])[-5:]
        missed.append("accuracy off by a point or more (%+.2f pt, %s than undisturbed, whose own "
                      "last five epochs span %.4f-%.4f)" % (
                          100 * worst, "higher" if worst > 0 else "lower",
                          min(tail or [0]), max(tail or [0])))
    if any(st != "JOB_STATE_SUCCEEDED" for st in s["states"]):
        missed.append("job did not succeed: %s" % s["states"])
    if s["crashed"] or s["left_behind"]:
        missed.append("crashes or leftovers")
    s["missed"] = missed
    return s


def coordinator_gap_threshold(row, baselines):
    """A pause is a gap between steps longer than 10 median steps (the
    coordinator's own hang rule) and longer than the undisturbed run's own
    longest gap (this shared machine's hiccups)."""
    base = baselines.get("loopback", {})
    median = base.get("median_step_seconds") or statistics.median(
        [r["median_step_seconds"] for r in row["runs"]] or [0.005])
    return max(10 * median, base.get("longest_gap_within_generation", 0.0))


def table_row(kind, s, row):
    acc = "; ".join("%.4f vs %.4f (%+.2f pt)" % (a, b, 100 * (a - b))
                    for a, b in s["accuracy"] if a is not None and b is not None) or "—"
    samples = "%d / %d (padding %d, apart)" % (s["duplicated"], s["skipped"], s["padding"])
    verdict = "**met**" if not s["missed"] else "**missed**: " + "; ".join(s["missed"])
    if kind == "coordinator":
        time_cell = ("no new generation: %s of %d adopted (every member back %s s median, %s s "
                     "max after the kill; a worker retries the coordinator with a backoff doubling from 100 ms "
                     "to 5 s, jittered, worker/agent.cc); median %d steps "
                     "(min %d) completed during the %.1f s outage; longest gap between steps %s s "
                     "(median step %s s; pause threshold %s s)" % (
                         s["adopted"], s["n"], fmt(s["adopted_after"].get("median"), 1),
                         fmt(s["adopted_after"].get("max"), 1),
                         s["steps_during_outage"].get("median", 0),
                         s["steps_during_outage"].get("min", 0),
                         s["outage_seconds"].get("median", 0), fmt(s["longest_gap"].get("max"), 3),
                         fmt(row["runs"][0]["median_step_seconds"] if row["runs"] else None, 4),
                         fmt(s.get("gap_threshold"), 3)))
        target = "0 steps paused"
        lost = "%d" % s["steps_lost_max"]
    elif kind == "coordinator_stop":
        time_cell = ("no new generation: %s of %d kept training in their generation, nobody counted "
                     "lost; median %d steps (min %d) completed during the %.1f s stop; longest gap "
                     "between steps %s s (median step %s s; pause threshold %s s)" % (
                         s["adopted"], s["n"], s["steps_during_outage"].get("median", 0),
                         s["steps_during_outage"].get("min", 0),
                         s["outage_seconds"].get("median", 0), fmt(s["longest_gap"].get("max"), 3),
                         fmt(row["runs"][0]["median_step_seconds"] if row["runs"] else None, 4),
                         fmt(s.get("gap_threshold"), 3)))
        target = "0 re-formations, 0 steps paused"
        lost = "%d" % s["steps_lost_max"]
    else:
        time_cell = "%s / %s" % (fmt(s["recovery"].get("median")), fmt(s["recovery"].get("max")))
        target = ("≤ %.1f s" % s["target_seconds"]) if s["target_seconds"] else \
            "none (≤ %d steps lost)" % CHECKPOINT_EVERY
        if kind == "whole":
            lost = ("%d: every step started after the checkpoint (every %d steps) is redone; "
                    "GetStatus's steps_lost said at most %d" % (
                        s["steps_discarded_max"], CHECKPOINT_EVERY, s["steps_lost_reported_max"]))
        else:
            lost = "%d (reported %d + in flight %d)" % (
                s["steps_lost_max"], s["steps_lost_reported_max"], s["in_flight_max"])
    return "| %s | %d | %s | %s | %s | %s | %s | %s |" % (
        faults.DESCRIPTION[kind], s["n"], time_cell, target, lost, samples, acc, verdict)


def write_markdown(path, data):
    m = data["machine"]
    L = []
    L.append("# Resilience: what a fault costs a job")
    L.append("")
    L.append("Written by `bench/resilience.py` on %s in %.0f minutes; do not edit by hand. Re-run "
             "with `/usr/bin/python3 bench/resilience.py` (about 15 minutes for these rows, 15 more "
             "for the failover rows below; `--quick` for a smoke run of 2 faults each; `--kinds "
             "kill9,hang --injections N` for some rows). Raw numbers: "
             "`docs/resilience.json`. These are measurements, not tests: nothing fails on a number.%s" % (
                 data["date"], data["minutes"],
                 (" Analysis redone from the same runs' records on %s (`--reanalyze`)." %
                  data["reanalyzed"]) if data.get("reanalyzed") else ""))
    L.append("")
    L.append("**Machine:** %s, `nproc` %d, %d GiB, Linux %s. Load average %.2f at the start, %.2f at "
             "the end: this machine is shared (another engineer's builds and tests may run beside "
             "it), so times include whatever else ran." % (
                 m["cpu"], m["nproc"], m["memory_gib"], m["kernel"], m["loadavg_start"][0],
                 m["loadavg_end"][0]))
    L.append("")
    job = data["job"]
    bi = data["binaries"]
    L.append("**Measured:** `ddp-coordinator` (sha256 %s…, built %s) and `ddp-worker` (sha256 %s…, "
             "built %s), copied from `build/bin` when the run started; the tree's HEAD was %s%s." % (
                 bi["ddp-coordinator"]["sha256"], bi["ddp-coordinator"]["built"],
                 bi["ddp-worker"]["sha256"], bi["ddp-worker"]["built"], bi["head"],
                 (", with uncommitted changes to %s (the binaries may include them)" %
                  ", ".join("`%s`" % f for f in bi["uncommitted"])) if bi["uncommitted"] else ""))
    L.append("")
    L.append("**Job:** `tests/chaos/chaos.py`'s `chaos_job` (MLP on Fashion-MNIST, 60,000 samples, "
             "batch 64 per worker, SGD lr 0.05 momentum 0.9, seed %s, backend auto), with %d epochs "
             "(%d in network namespaces, where Gloo over TCP is slower), min 2 / max 3 workers, "
             "`hangTimeoutSeconds` %s, `reformMinIntervalSeconds` %s, `rejoinTimeoutSeconds` %s, "
             "checkpoint every %d steps (keep 2). Three workers, each `--threads=1`, "
             "`OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 MKL_NUM_THREADS=1`, on loopback "
             "(shared-memory ring), except "
             "the partition row: coordinator and workers each in a network namespace of their own "
             "(`tests/py/netns.py`, Gloo over TCP)." % (
                 job["seed"], data["epochs"], data["netns_epochs"], job["hangTimeoutSeconds"],
                 job["reformMinIntervalSeconds"], job["rejoinTimeoutSeconds"], CHECKPOINT_EVERY))
    L.append("")
    L.append("**Flags:** `ddp-coordinator %s`; `ddp-worker %s`. The heartbeat timeout is **%s s**, "
             "the one `tests/chaos/chaos.py` uses (the daemon's default is 5 s)." % (
                 " ".join(data["coordinator_flags"]), " ".join(data["worker_flags"]), data["hb"]))
    L.append("")
    L.append("**How:** for each fault kind, one job (a second or third if the first ended first) "
             "with the fault caused %d times, each once the world was back to three workers and had "
             "trained a second and 20-80 more steps; killed workers are restarted, stopped ones "
             "continued (SIGCONT) once training went on without them, a hang file is removed and a "
             "cut link brought up (%.1f s after the cut, longer than the heartbeat timeout). The "
             "coordinator is down %.1f s per restart. Fault time: when this script sent the signal "
             "(made the file, cut the link). First new step: the latest member's first metrics line "
             "(`--metrics_file`, the unix time a step completed) of the next generation that "
             "trained. Steps lost: `generation_changes[].steps_lost` plus the steps in flight (steps "
             "some rank had started, per its `--index_log`, past the new generation's resume step). "
             "Samples: `tests/chaos/coverage.py` over all index logs, per epoch; DistributedSampler's "
             "wrap-around padding (< world size per epoch) is counted apart. Accuracy: the job's "
             "final test accuracy against an undisturbed run of the same job and seed on the same "
             "transport. Targets (issue 7): a kill -9 within 2 s; a stall or partition within the "
             "heartbeat timeout + 2 s = %.0f s; a hung thread is found by the job's hang timeout, not "
             "heartbeats, so its row's target is hang timeout + 2 s = %.0f s (%.0f s if read as "
             "heartbeat timeout + 2 s); nothing lost beyond the step in flight; no sample duplicated "
             "or skipped; a coordinator restart pauses training for zero steps. Times are judged on "
             "the maximum, not the median." % (
                 data["injections"], data["partition_hold"], data["outage"], data["hb"] + 2,
                 data["hang_timeout"] + 2, data["hb"] + 2))
    L.append("")
    L.append("## Results")
    L.append("")
    L.append("| fault | n | time to first new step, median / max (s) | target | steps lost per fault, "
             "max | samples duplicated / skipped | accuracy vs undisturbed | met? |")
    L.append("| --- | ---: | --- | --- | --- | --- | --- | --- |")
    for kind in data["kinds"]:
        row = data["rows"][kind]
        if row["skipped"] and not row["runs"]:
            L.append("| %s | 0 | skipped: %s | | | | | |" % (faults.DESCRIPTION[kind], row["skipped"]))
            continue
        L.append(table_row(kind, row["summary"], row))
    L.append("")
    b = data["baselines"]
    L.append("Undisturbed: %s. A final accuracy is one noisy sample: an undisturbed run's test "
             "accuracy moves by most of a point from one epoch to the next, and a disturbed run "
             "trains some steps at world size 2 (a smaller global batch), so it ends on a different "
             "point of that noise." % "; ".join(
        "%s %.4f (%d steps in %.0f s, median step %.4f s; its last five epochs %s)" % (
            k, v["test_accuracy"], v["global_step"], float(v["elapsed_seconds"] or 0),
            v["median_step_seconds"], ", ".join("%.4f" % a for a in v.get("epoch_accuracy", [])[-5:]))
        for k, v in b.items()))
    L.append("")
    rejoin = [(k, data["rows"][k]["summary"]["rejoin_pause"]) for k in data["kinds"]
              if data["rows"][k].get("summary", {}).get("rejoin_pause", {}).get("n")]
    if rejoin:
        L.append("Putting the world back (not part of the fault's row): a returning worker is admitted "
                 "at a step boundary (`CHANGE_CAUSE_JOINED`, nothing lost), which pauses training "
                 "for its rendezvous and state broadcast: %s. In brackets, the joiner's own time "
                 "from \"joined generation\" to its ring proven, which the members spend waiting at "
                 "the rendezvous: a restarted process (kill -9, whole job) builds its training state "
                 "(model, dataset) before it is admitted (the coordinator asks it to prepare), a "
                 "worker that only left (SIGSTOP, hang, partition) already has it." % "; ".join(
                     "%s median %.2f s, max %.2f s (n=%d) [%s s]" % (
                         k, r["median"], r["max"], r["n"],
                         fmt(data["rows"][k]["summary"]["rejoin_setup"].get("median")))
                     for k, r in rejoin))
        L.append("")
    L.append("Each fault, in order (seconds to the first new step; for the coordinator, steps "
             "completed during the outage and the longest gap between steps):")
    L.append("")
    for kind in data["kinds"]:
        runs = data["rows"][kind]["runs"]
        items = []
        for r in runs:
            for i in r["injections"]:
                if kind in ("coordinator", "coordinator_stop"):
                    items.append("%d steps/%.3f s" % (i["steps_during_outage"], i["longest_gap_seconds"]))
                else:
                    items.append(fmt(i.get("recovery_seconds")) + ("*" if i.get("wrongly_evicted") else ""))
        if items:
            L.append("- %s: %s" % (kind, ", ".join(items)))
    if any(data["rows"][k].get("summary", {}).get("wrongly_evicted") for k in data["kinds"]):
        L.append("")
        L.append("\\* a healthy worker was evicted first (see below).")
    L.append("")
    if data.get("evaluations"):
        L.extend(evaluation_markdown(data["evaluations"]))
    L.append("## Beside each row: torchrun and Horovod elastic, from their documentation")
    L.append("")
    L.append("| fault | ours (measured above) | torchrun | Horovod elastic |")
    L.append("| --- | --- | --- | --- |")
    for kind in data["kinds"]:
        s = data["rows"][kind].get("summary")
        if not s:
            ours = "not measured"
        elif kind in ("coordinator", "coordinator_stop"):
            ours = "training goes on; %d steps lost" % s["steps_lost_max"]
        elif kind == "whole":
            ours = "back in %s s median, ≤ %d steps lost (since the checkpoint)" % (
                fmt(s["recovery"].get("median")), s["steps_lost_max"])
        else:
            ours = "survivors go on in %s s median; ≤ %d step(s) lost" % (
                fmt(s["recovery"].get("median")), s["steps_lost_max"])
        L.append("| %s | %s | %s | %s |" % (faults.DESCRIPTION[kind], ours, TORCHRUN[kind], HOROVOD[kind]))
    L.append("")
    L.append("## Where the time goes")
    L.append("")
    L.append("Median (max) seconds of each phase, each from the previous milestone, read from the "
             "coordinator's and the surviving workers' logs (millisecond timestamps) and the metrics "
             "lines: detection (the coordinator's fault line naming the victim), abort (the last "
             "survivor left the old generation), re-form (the last member joined the new one), "
             "rendezvous (its ring proven), state broadcast (training resumed from the step), first "
             "step (completed on every member).")
    L.append("")
    order = ["restart (script)", "coordinator up", "generation formed", "detection",
             "abort (left old generation)", "re-form (joined new generation)",
             "rendezvous (ring proven)", "state broadcast (training from step)", "first step"]
    present = set()
    for kind in data["kinds"]:
        present.update(data["rows"][kind].get("summary", {}).get("phases", {}))
    names = [k for k in order if k in present]
    if names:
        L.append("| fault | " + " | ".join(names) + " |")
        L.append("| --- |" + " ---: |" * len(names))
        for kind in data["kinds"]:
            ph = data["rows"][kind].get("summary", {}).get("phases")
            if not ph:
                continue
            cells = []
            for k in names:
                v = ph.get(k, {})
                cells.append("%s (%s)" % (fmt(v.get("median"), 3), fmt(v.get("max"), 3))
                             if v.get("n") else "")
            L.append("| %s | %s |" % (faults.DESCRIPTION[kind], " | ".join(cells)))
        L.append("")
    L.append("## Targets missed, and where the time went")
    L.append("")
    any_missed = False
    for kind in data["kinds"]:
        s = data["rows"][kind].get("summary")
        if not s or not s["missed"]:
            continue
        any_missed = True
        L.append("- **%s**: %s." % (faults.DESCRIPTION[kind], "; ".join(s["missed"])))
        for line in data["rows"][kind].get("analysis", []):
            L.append("  " + line)
    if not any_missed:
        L.append("None.")
    L.append("")
    obs = []
    for kind in data["kinds"]:
        for r in data["rows"][kind]["runs"]:
            base = data["baselines"].get(r.get("baseline"), {})
            if r.get("epoch_accuracy") and r["epoch_accuracy"] == base.get("epoch_accuracy"):
                obs.append("%s: every epoch's test accuracy (%d epochs) equals the undisturbed run's, "
                           "to the last digit: the job trained exactly as if nothing had happened." % (
                               kind, len(r["epoch_accuracy"])))
    for kind in data["kinds"]:
        s_ = data["rows"][kind].get("summary") or {}
        fenced = s_.get("victim_steps_after_fault", [])
        if fenced:
            ex = fenced[0]
            obs.append("%s: in %d of %d faults the evicted worker, once it ran again, completed "
                       "step(s) past the resume step in the generation its peers had already aborted "
                       "and left (a metrics line of the old generation after the fault), e.g. %s at "
                       "step %s completed step %s %.2f s after the fault with an all-reduce wait of "
                       "%.0f ms. The job was unharmed (it rejoined as new, behind the survivors, and "
                       "took a peer's state), but a fenced rank finished a collective its peers had "
                       "abandoned and trained a step outside any live generation." % (
                           kind, len(fenced), s_["n"], ex[0], ex[1], ex[2][0]["step"],
                           ex[2][0]["after_fault_seconds"], ex[2][0]["wait_ms"] or 0))
        if kind == "whole" and s_.get("first_world") and all(w == 2 for w in s_["first_world"] if w):
            obs.append("whole-job kill: the restarted coordinator formed the resumed generation with "
                       "the first two workers to attach (min_workers; `settleSeconds` applies only "
                       "at the job's first start), although all three were started together; the "
                       "third, a fraction of a second behind, waited out `reformMinIntervalSeconds` "
                       "and was admitted with another pause (the whole row's rejoin pause above): "
                       "two re-forms where one would do.")
        if kind == "whole" and s_.get("n"):
            obs.append("whole-job kill: GetStatus's `steps_lost` said at most %d while up to %d steps "
                       "started after the checkpoint were redone: the restarted coordinator knows only "
                       "the step it last saved, not the last one trained." % (
                           s_["steps_lost_reported_max"], s_["steps_discarded_max"]))
    if obs:
        L.append("## Other observations")
        L.append("")
        for o in obs:
            L.append("- " + o)
        L.append("")
    skipped = [(k, data["rows"][k]["skipped"]) for k in data["kinds"] if data["rows"][k]["skipped"]]
    if skipped:
        L.append("Rows cut short or skipped: %s." % "; ".join("%s: %s" % x for x in skipped))
        L.append("")
    if data.get("failover"):
        L.extend(failover_faults.markdown(data["failover"], data["baselines"].get("loopback")))
    L.append("## Sources")
    L.append("")
    sources = dict(SOURCES)
    if data.get("failover"):
        sources.update(failover_faults.SOURCES)
    for key, url in sources.items():
        L.append("- [%s] %s" % (key, url))
    L.append("")
    with open(path, "w") as f:
        f.write("\n".join(L))


def explain(kind, row, data):
    """Where the time went for a missed target, in words, from the numbers."""
    s = row["summary"]
    injections = [i for r in row["runs"] for i in r["injections"]]
    out = []
    if kind in ("coordinator", "coordinator_stop"):
        for i in injections:
            if i["longest_gap_seconds"] > s["gap_threshold"] or not i["adopted"]:
                det = i.get("longest_gap_detail") or {}
                ranks = det.get("ranks", {})
                slow = max(ranks, key=lambda n: sum((ranks[n].get(k) or 0) for k in
                                                    ("data_ms", "forward_ms", "backward_ms",
                                                     "optimizer_ms")), default=None)
                out.append("Outage at step %s: %d steps completed while the coordinator was down, "
                           "members adopted %s s after the kill; the longest gap, %.3f s, began "
                           "%.2f s after the kill (%s); in the step that ended it %s" % (
                               i["at_step"], i["steps_during_outage"], fmt(i["adopted_after_seconds"]),
                               i["longest_gap_seconds"], det.get("began_after_fault_seconds", 0),
                               "the restarted coordinator serving" if det.get("coordinator_serving")
                               else "no coordinator running",
                               "; ".join("%s data %.1f / forward %.1f / backward %.1f / all-reduce "
                                         "wait %.1f / optimizer %.1f ms" % (
                                             n, r.get("data_ms") or 0, r.get("forward_ms") or 0,
                                             r.get("backward_ms") or 0, r.get("wait_ms") or 0,
                                             r.get("optimizer_ms") or 0)
                                         for n, r in sorted(ranks.items()))))
                if slow:
                    out.append("So the gap is %s's own compute in that step (the others' time is "
                               "all-reduce wait for it), not a wait on the coordinator; whether the "
                               "process was descheduled (three single-threaded workers on %d cores) "
                               "or its reconnect attempt (about 1 s into the outage) competed for "
                               "the CPU, these logs can't tell. The undisturbed run's longest gap "
                               "was %.3f s; an epoch-end evaluation takes about 0.06 s." % (
                                   slow, data["machine"]["nproc"],
                                   data["baselines"].get("loopback", {}).get(
                                       "longest_gap_within_generation", 0)))
        return out
    ph = s.get("phases", {})
    target = s.get("target_seconds")
    time_missed = target and s["recovery"].get("n") and s["recovery"]["max"] > target
    if ph and time_missed:
        parts = ["%s %s s" % (k, fmt(v.get("median"), 3)) for k, v in ph.items()
                 if v.get("n") and not k.startswith("coordinator formed")]
        out.append("Median phases: " + ", ".join(parts) + ".")
    slow = sorted((i for i in injections if target and i.get("recovery_seconds", 0) > target),
                  key=lambda i: -i["recovery_seconds"])
    for i in slow[:4]:
        p = i.get("phases", {})
        out.append("%s at step %s took %.2f s: %s; generation changes %s%s." % (
            i["victim"], i["at_step"], i["recovery_seconds"],
            ", ".join("%s %s" % (k, fmt(v, 3)) for k, v in p.items() if isinstance(v, (int, float))),
            i.get("causes"),
            ("; first fault line: \"%s\"" % p["first detection line"]) if p.get("first detection line") else ""))
    if s.get("wrongly_evicted"):
        out.append("%d of %d faults evicted a worker other than the one at fault first, e.g. victim "
                   "%s, evicted %s: \"%s\"." % (len(s["wrongly_evicted"]), s["n"],
                                                 s["wrongly_evicted"][0][0], s["wrongly_evicted"][0][1],
                                                 (s["wrongly_evicted"][0][2] or [""])[0][:300]))
    for e in s["errors"][:3]:
        out.append("Recovery never came: " + e)
    return out


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--injections", type=int, default=10)
    p.add_argument("--epochs", type=int, default=60, help="epochs of the loopback job")
    p.add_argument("--netns-epochs", type=int, default=25, help="epochs of the partition job")
    p.add_argument("--kinds", default=",".join(ALL_KINDS),
                   help="of %s" % ", ".join(ALL_KINDS))
    p.add_argument("--seed", type=int, default=1, help="picks victims and spacing")
    p.add_argument("--outage", type=float, default=1.5, help="seconds the coordinator is down")
    p.add_argument("--budget-minutes", type=float, default=30)
    p.add_argument("--job-timeout", type=float, default=600)
    p.add_argument("--quick", action="store_true", help="2 faults each, short jobs")
    p.add_argument("--eval-epochs", type=int, default=6,
                   help="epochs of the slow-evaluation job (0: no evaluation rows)")
    p.add_argument("--eval-runs", type=int, default=3,
                   help="jobs whose rank 0 is killed after the last step")
    p.add_argument("--out", default=os.path.join(ROOT, "docs"))
    p.add_argument("--failover-ttl", type=int, default=2,
                   help="the coordinators' --lease_ttl in the failover rows (seconds)")
    p.add_argument("--failover-epochs", type=int, default=0,
                   help="epochs of each failover job (0: sized to the faults)")
    p.add_argument("--history-seconds", type=float, default=10,
                   help="how long etcdctl watch --rev=1 may replay a prefix's history")
    p.add_argument("--load-workers", type=int, default=1000, help="etcd_load's simulated workers")
    p.add_argument("--load-seconds", type=int, default=40, help="etcd_load's loaded phase")
    p.add_argument("--reanalyze", metavar="JSON",
                   help="no runs: read a resilience.json this script wrote and the run folders it "
                        "names (still in /tmp), analyze again and rewrite the two files")
    p.add_argument("--render", metavar="JSON",
                   help="no runs, no analysis: write the two files again from a resilience.json "
                        "this script wrote (after a change to the text)")
    args = p.parse_args()
    args.kinds_given = any(a == "--kinds" or a.startswith("--kinds=") for a in sys.argv[1:])
    if args.render:
        with open(args.render) as f:
            data = json.load(f)
        render(data, args)
        return
    if args.reanalyze:
        with open(args.reanalyze) as f:
            data = json.load(f)
        reanalyze(data, [k for k in args.kinds.split(",") if k] if args.kinds_given else None)
        render(data, args)
        return
    if args.quick:
        args.injections, args.epochs, args.netns_epochs = 2, 12, 6
        args.eval_epochs, args.eval_runs = min(args.eval_epochs, 2), min(args.eval_runs, 1)
        args.load_seconds = min(args.load_seconds, 15)
    kinds = [k for k in args.kinds.split(",") if k]
    for k in kinds:
        if k not in ALL_KINDS:
            p.error("unknown kind %r (of %s)" % (k, ", ".join(ALL_KINDS)))
    # What is already there stays unless measured again.
    earlier = None
    earlier_path = os.path.join(args.out, "resilience.json")
    if os.path.exists(earlier_path):
        with open(earlier_path) as f:
            earlier = json.load(f)
    base_kinds = [k for k in kinds if k in faults.KINDS]
    failover_kinds = [k for k in kinds if k in failover_faults.KINDS]
    started = time.time()
    rng = random.Random(args.seed)
    if base_kinds:
        data = measure_base(base_kinds, args, rng, started)
    elif earlier is not None:
        data = earlier
    else:
        p.error("%s holds no earlier rows to add these to: run the other kinds too" % earlier_path)
    if failover_kinds or "etcd_load" in kinds:
        data["failover"] = measure_failover(failover_kinds, "etcd_load" in kinds, args, rng,
                                            (earlier or {}).get("failover"))
    elif earlier is not None and earlier.get("failover") and "failover" not in data:
        data["failover"] = earlier["failover"]
    render(data, args)


def measure_failover(kinds, load, args, rng, earlier):
    """The failover rows of `kinds` (and the etcd load), merged into the
    failover section measured before (rows of other kinds kept)."""
    started = time.time()
    fo = earlier or {"rows": {}, "invocations": []}
    fo.update({"ttl": args.failover_ttl, "targets": [2.5, 3.5], "injections": args.injections})
    run = {"date": datetime.date.today().isoformat(), "kinds": list(kinds) +
           (["etcd_load"] if load else []), "binaries": BINARIES, "machine": machine()}
    out = subprocess.run(["etcd", "--version"], capture_output=True, text=True)
    fo["etcd_version"] = (out.stdout.splitlines() or ["?"])[0].replace("etcd Version: ", "")
    log("failover: %s, %d faults each, lease TTL %d s" % (", ".join(run["kinds"]),
                                                         args.injections, args.failover_ttl))
    for kind in kinds:
        row = failover_faults.measure_kind(kind, args, rng, time.time(), log)
        row["measured"] = {"date": run["date"], "coordinator": BINARIES["ddp-coordinator"]["sha256"]}
        fo["rows"][kind] = row
    if load:
        fo["etcd_load"] = failover_faults.measure_etcd_load(
            args, os.environ["DDP_BIN"], os.path.join(BINARIES["from"], "ddp_load_generator"), log)
        fo["etcd_load"]["date"] = run["date"]
    run["machine"]["loadavg_end"] = os.getloadavg()
    run["minutes"] = (time.time() - started) / 60
    fo["invocations"].append(run)
    fo["machine"] = run["machine"]
    fo["kinds"] = [k for k in failover_faults.KINDS if k in fo["rows"]]
    # What was measured, safe before anything is written from it.
    raw = tempfile.mkstemp(prefix="resilience-failover-", suffix=".json")[1]
    faults.dump(fo, raw)
    log("measured failover data kept in %s" % raw)
    return fo


def measure_base(kinds, args, rng, started):
    """The rows of the single coordinator's kinds (and the evaluations)."""
    data = {"machine": machine(), "date": datetime.date.today().isoformat(), "binaries": BINARIES,
            "injections": args.injections, "epochs": args.epochs, "netns_epochs": args.netns_epochs,
            "kinds": kinds, "seed": args.seed, "outage": args.outage, "rows": {}, "baselines": {},
            "sources": SOURCES}
    probe = chaos.chaos_job("probe")
    data["job"] = job_for("<kind>", args.epochs, "<tmp>")
    data["hb"] = 2.0
    data["hang_timeout"] = float(probe["hangTimeoutSeconds"])
    data["partition_hold"] = data["hb"] + 1.5
    data["coordinator_flags"] = ["--listen=HOST:PORT", "--job=JOB.json", "--state_dir=DIR",
                                 "--heartbeat_interval=0.5s", "--heartbeat_timeout=2s",
                                 "--adopt_grace=10s"]
    data["worker_flags"] = ["--coordinator=HOST:PORT", "--device=cpu:I", "--host=HOST", "--name=wI",
                            "--threads=1", "--metrics_file=F", "--index_log=F",
                            "--debug_hang_file=F"]
    log("resilience: %s, %d faults each, seed %d" % (", ".join(kinds), args.injections, args.seed))
    baselines = data["baselines"]
    for kind in kinds:
        row = measure_kind(kind, args, rng, baselines, started)
        data["rows"][kind] = row
    if args.eval_epochs > 0:
        data["evaluations"] = measure_evaluations(args)
    data["machine"]["loadavg_end"] = os.getloadavg()
    data["minutes"] = (time.time() - started) / 60
    return data


def reanalyze(data, kinds=None):
    """Analysis again from the run folders (after a change to the analysis):
    of every row, or of `kinds`' rows only (--kinds with --reanalyze)."""
    def again(r):
        run = chaos.RunFiles(r["dir"], r["job"])
        res = faults.analyze(run, [faults.injection_from(d) for d in r["raw_injections"]],
                             r["final"])
        for k in ("crashed", "processes_left", "shm_left", "baseline"):
            if k in r:
                res[k] = r[k]
        return res
    if kinds is None:
        data["baselines"] = {k: again(v) for k, v in data["baselines"].items()}
    for kind, row in data["rows"].items():
        if kinds is None or kind in kinds:
            row["runs"] = [again(r) for r in row["runs"]]
    if data.get("failover"):
        failover_faults.reanalyze(data["failover"], kinds)
    if kinds is None or any(k in data["rows"] for k in kinds):
        data["reanalyzed"] = datetime.date.today().isoformat()


def render(data, args):
    kinds = data["kinds"]
    baselines = data["baselines"]
    for kind in kinds:
        row = data["rows"][kind]
        if row["runs"]:
            row["summary"] = summarize_row(row, baselines, data["hb"], data["hang_timeout"])
            row["analysis"] = explain(kind, row, data) if row["summary"]["missed"] else []
    if data.get("failover"):
        failover_faults.render_prepare(data["failover"])
    os.makedirs(args.out, exist_ok=True)
    faults.dump(data, os.path.join(args.out, "resilience.json"))
    write_markdown(os.path.join(args.out, "RESILIENCE.md"), data)
    log("wrote %s and %s in %.1f minutes" % (os.path.join(args.out, "RESILIENCE.md"),
                                             os.path.join(args.out, "resilience.json"),
                                             data["minutes"]))
    rows = [(k, data["rows"][k]) for k in kinds]
    rows += list((data.get("failover") or {}).get("rows", {}).items())
    for kind, row in rows:
        s = row.get("summary")
        log("%-16s %s" % (kind, "skipped: " + row["skipped"] if not s else
                          ("met" if not s["missed"] else "missed: " + "; ".join(s["missed"]))))


if __name__ == "__main__":
    main()
