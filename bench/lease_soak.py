#!/usr/bin/python3
"""Does the coordinator leader keep its lease when the machine is loaded and
when etcd's own raft leader is lost, with etcd at its default timings (as
README's example starts it) or tuned ones (tests/py/etcd_cluster.py)?

Two coordinators (--lease_ttl 2s) on a 3-member etcd, two workers training
a long job. Phase "load": N busy processes (load average about N + what
runs) for --minutes; phase "raft": etcd's raft leader killed -9 --kills
times (restarted after each, 10 s apart). Counted from the coordinators'
logs: leaderships lost ("no longer the leader"), pauses (a lease
unconfirmed for a moment: the leader stopped acting and went on), and
leader changes. Writes docs/lease_soak.json; docs/RESILIENCE.md's section
on leases quotes it. A measurement, not a test: nothing fails on a number.

    /usr/bin/python3 bench/lease_soak.py --timings default --minutes 30 --busy 20
    /usr/bin/python3 bench/lease_soak.py --timings default --phase raft --kills 10
"""
import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests", "py"))
sys.path.insert(0, os.path.join(HERE, "..", "tests", "chaos"))
sys.path.insert(0, HERE)
from etcd_cluster import EtcdCluster  # noqa: E402
from failover_faults import raft_leader  # noqa: E402
from harness import BIN, free_port, thread_env, wait_for  # noqa: E402


def count(logs, text):
    return sum(log.count(text) for log in logs)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--timings", choices=("default", "tuned"), default="default")
    p.add_argument("--phase", choices=("load", "raft"), default="load")
    p.add_argument("--minutes", type=float, default=30)
    p.add_argument("--busy", type=int, default=20, help="busy processes in the load phase")
    p.add_argument("--kills", type=int, default=10, help="raft leader kills in the raft phase")
    p.add_argument("--out", default=os.path.join(HERE, "..", "docs", "lease_soak.json"))
    args = p.parse_args()
    work = tempfile.mkdtemp(prefix="ddp-lease-soak-")
    etcd = EtcdCluster(3, timings=args.timings)
    procs, busy = [], []
    addresses = ["127.0.0.1:%d" % free_port() for _ in range(2)]
    job = os.path.join(work, "job.json")
    with open(job, "w") as f:
        json.dump({"name": "soak", "model": {"kind": "mlp"},
                   "dataset": {"kind": "synthetic", "trainSize": 4096, "testSize": 256},
                   "epochs": 100000, "batchSize": 32, "backend": "gloo", "evaluate": False,
                   "minWorkers": 2, "maxWorkers": 2}, f)
    logs = []
    try:
        for i, address in enumerate(addresses):
            log = os.path.join(work, "c%d.log" % i)
            logs.append(log)
            procs.append(subprocess.Popen(
                [os.path.join(BIN, "ddp-coordinator"), "--listen=" + address, "--job=" + job,
                 "--etcd_endpoints=" + ",".join(etcd.endpoints), "--etcd_prefix=/ddp/soak",
                 "--lease_ttl=2s", "--allow_anonymous_loopback", "--metrics_listen=",
                 "--http_listen="], stdout=open(log, "w"), stderr=subprocess.STDOUT,
                env=thread_env(), start_new_session=True))
        for d in range(2):
            procs.append(subprocess.Popen(
                [os.path.join(BIN, "ddp-worker"), "--coordinator=" + ",".join(addresses),
                 "--device=cpu:%d" % d, "--threads=1", "--metrics_listen="],
                stdout=open(os.path.join(work, "w%d.log" % d), "w"), stderr=subprocess.STDOUT,
                env=thread_env(), start_new_session=True))
        wait_for(lambda: any("generation 1 formed" in open(l).read() for l in logs), 120,
                 "the job to train")
        start = time.time()
        result = {"timings": args.timings, "phase": args.phase, "lease_ttl_s": 2}
        if args.phase == "load":
            for _ in range(args.busy):
                busy.append(subprocess.Popen([sys.executable, "-c", "while True: pass"]))
            loads = []
            while time.time() - start < 60 * args.minutes:
                time.sleep(10)
                loads.append(os.getloadavg()[0])
            result.update(minutes=args.minutes, busy=args.busy,
                          load_average_median=sorted(loads)[len(loads) // 2] if loads else 0)
        else:
            killed = 0
            for _ in range(args.kills):
                m = raft_leader(etcd.endpoints)
                if m is None:
                    time.sleep(2)
                    continue
                etcd.kill(m)
                time.sleep(5)
                etcd.restart(m)
                killed += 1
                time.sleep(5)
            result.update(raft_leader_kills=killed)
        text = [open(l).read() for l in logs]
        result.update(
            seconds=time.time() - start,
            leaderships_lost=count(text, "no longer the leader"),
            pauses=count(text, "leadership unconfirmed"),
            leader_changes=sum(t.count("(this coordinator)") for t in text) - 1)
        print(json.dumps(result), flush=True)
        saved = {}
        if os.path.exists(args.out):
            with open(args.out) as f:
                saved = json.load(f)
        saved["%s/%s" % (args.timings, args.phase)] = result
        with open(args.out, "w") as f:
            json.dump(saved, f, indent=1)
    finally:
        for b in busy:
            b.kill()
        for proc in procs:
            try:
                os.killpg(proc.pid, signal.SIGTERM)
                proc.wait(timeout=10)
            except (ProcessLookupError, subprocess.TimeoutExpired):
                os.killpg(proc.pid, signal.SIGKILL)
        etcd.close()


if __name__ == "__main__":
    main()
