#!/usr/bin/python3
"""Two test hosts (network namespaces, each with its own host name), two
workers on each: `backend: auto` sums gradients through shared memory within
each host and over TCP between one leader per host (hierarchical), and
trains to the same per-step losses, within float rounding, as the flat Gloo
ring over the same four ranks. Skipped where namespaces can't be made (CI
runs as root and can)."""
import json
import os
import subprocess
import sys
import tempfile
import unittest

sys.path.insert(0, os.path.dirname(__file__))
import netns  # noqa: E402
from harness import BIN, RunFolder, thread_env, wait_listening  # noqa: E402

PORT = 29400


def run_job(net, backend, folder):
    """The job on a coordinator in host 0, workers w0 w1 in host 1 and w2 w3
    in host 2; each rank's step records, and what each worker's log says of
    its ring."""
    job = {"name": "hier-" + backend, "model": {"kind": "mlp"},
           "dataset": {"kind": "synthetic", "trainSize": 4096, "testSize": 256},
           "optimizer": {"kind": "sgd", "lr": 0.05, "momentum": 0.9}, "batchSize": 32,
           "epochs": 1, "maxSteps": 30, "evaluate": False, "seed": 5, "backend": backend,
           "minWorkers": 4, "bucketCapMb": 0.2}
    job_file = os.path.join(folder, "job.json")
    with open(job_file, "w") as f:
        json.dump(job, f)
    run = RunFolder(folder)
    target = "%s:%d" % (net.hosts[0].ip, PORT)
    procs = []
    with open(os.path.join(folder, "coordinator.log"), "w") as out:
        coordinator = net.popen(0, [os.path.join(BIN, "ddp-coordinator"), "--listen=" + target,
                                    "--job=" + job_file, "--insecure", "--exit_when_done"],
                                stdout=out, stderr=subprocess.STDOUT, env=thread_env())
    try:
        wait_listening(net.hosts[0].ip, PORT, 30, "the coordinator", coordinator)
        for i in range(4):
            host = 1 + i // 2
            name = "w%d" % i
            with open(os.path.join(folder, name + ".log"), "w") as out:
                procs.append(net.popen(host, run.worker_command(
                    target, i % 2, name, net.hosts[host].ip), stdout=out,
                    stderr=subprocess.STDOUT, env=thread_env()))
        coordinator.wait(timeout=240)
        if coordinator.returncode != 0:
            raise AssertionError("the %s job failed: %s" % (backend, run.log("coordinator")[-3000:]))
    finally:
        for p in procs + [coordinator]:
            if p.poll() is None:
                p.kill()
            p.wait()
    rings = [next((line for line in run.log("w%d" % i).splitlines() if "proven" in line), "")
             for i in range(4)]
    return [run.metrics("w%d" % i) for i in range(4)], rings


class HierarchicalTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        ok, why = netns.available()
        if not ok:
            raise unittest.SkipTest(why)

    def test_two_hosts_two_workers_each_train_as_the_flat_ring(self):
        work = tempfile.mkdtemp(prefix="ddp-hier-")
        with netns.Network(["coord", "host-a", "host-b"]) as net:
            hier, hier_rings = run_job(net, "auto", tempfile.mkdtemp(dir=work))
            flat, flat_rings = run_job(net, "gloo", tempfile.mkdtemp(dir=work))
        for ring in hier_rings:
            self.assertIn("hierarchical ring of 4 proven", ring)
        for ring in flat_rings:
            self.assertIn("gloo ring of 4 proven", ring)
        worst = 0.0
        for rank in range(4):
            ours = [r["loss"] for r in hier[rank]]
            reference = [r["loss"] for r in flat[rank]]
            self.assertEqual(len(ours), 30)
            self.assertEqual(len(reference), 30)
            for step, (a, b) in enumerate(zip(ours, reference), start=1):
                self.assertAlmostEqual(a, b, delta=1e-4 * max(1.0, abs(b)),
                                       msg="rank %d step %d" % (rank, step))
                worst = max(worst, abs(a - b))
        self.assertLess(sum(r["loss"] for r in hier[0][-5:]), sum(r["loss"] for r in hier[0][:5]))
        print("hierarchical vs flat: 4 ranks x 30 steps, largest loss difference %.3g" % worst)


if __name__ == "__main__":
    unittest.main(verbosity=2)
