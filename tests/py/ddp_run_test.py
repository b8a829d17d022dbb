#!/usr/bin/python3
"""ddp-run, as a user runs it: the default job trains a CNN on Fashion-MNIST to
at least 0.88 test accuracy with a progress line every few seconds; Ctrl-C,
SIGTERM, or the launcher's own death leave nothing running."""
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
import unittest

sys.path.insert(0, os.path.dirname(__file__))
from cluster import children_of, synthetic_job  # noqa: E402
from harness import BIN, wait_for  # noqa: E402

DDP_RUN = os.path.join(BIN, "ddp-run")


def alive(pid):
    try:
        with open("/proc/%d/stat" % pid) as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


class DefaultJobTest(unittest.TestCase):
    def test_default_job_reaches_088_with_steady_progress(self):
        logs = tempfile.mkdtemp(prefix="ddp-run-default-")
        start = time.time()
        run = subprocess.run([DDP_RUN, "--nproc", "2", "--log_dir", logs],
                             capture_output=True, text=True, timeout=900)
        print(run.stdout[-1500:])
        self.assertEqual(run.returncode, 0, run.stdout[-3000:] + run.stderr[-3000:])
        with open(os.path.join(logs, "final-status.json")) as f:
            final = json.load(f)
        self.assertEqual(final["state"], "JOB_STATE_SUCCEEDED")
        self.assertGreaterEqual(final["testAccuracy"], 0.88)
        self.assertRegex(run.stdout, r"test accuracy: 0\.(8[89]|9)\d*")
        # The status page on a free loopback port, announced at start.
        self.assertRegex(run.stdout, r"status page at http://127\.0\.0\.1:\d+/")
        # Progress lines: epoch, step of steps, loss, samples/s, ETA, and never
        # more than a few seconds apart.
        progress = re.findall(r"\[\s*([\d.]+)s\] epoch \d+/3  step \d+/\d+ \([\d.]+%\)  "
                              r"loss [\d.]+  \d+ samples/s(  ETA \S+)?", run.stdout)
        self.assertGreater(len(progress), 5, run.stdout)
        stamps = [float(t) for t in re.findall(r"^\[\s*([\d.]+)s\]", run.stdout, re.M)]
        gaps = [b - a for a, b in zip(stamps, stamps[1:])]
        self.assertLess(max(gaps), 5.0, stamps)
        print("default job: %.0fs, test accuracy %.4f" % (time.time() - start,
                                                           final["testAccuracy"]))


class FlagsTest(unittest.TestCase):
    def test_help_says_the_name_once_and_names_no_build_path(self):
        source = os.path.abspath(os.path.join(os.path.dirname(__file__), "../.."))
        for name, first in (("ddp-run", "trains a job on this machine"),
                            ("ddp-worker", "trains what the coordinator assigns"),
                            ("ddp-coordinator", "assigns ranks to ddp-worker daemons"),
                            ("ddp-pack", "writes record shards and manifests")):
            with self.subTest(name=name):
                # Help asked for is not an error (absl's own exits 1).
                run = subprocess.run([os.path.join(BIN, name), "--help"],
                                     capture_output=True, text=True, timeout=30)
                self.assertEqual(run.returncode, 0, run.stderr)
                text = run.stdout + run.stderr
                self.assertTrue(text.startswith("%s: %s" % (name, first)), text[:200])
                self.assertNotIn("%s: %s:" % (name, name), text)
                self.assertIn("Flags from %s:" % name, text)
                self.assertNotIn(source, text)
                self.assertNotIn("main.cc", text)
        run = subprocess.run([DDP_RUN, "--help"], capture_output=True, text=True, timeout=30)
        self.assertIn("--min_nproc", run.stdout + run.stderr)
        pack = subprocess.run([os.path.join(BIN, "ddp-pack"), "--help"], capture_output=True,
                              text=True, timeout=30)
        self.assertIn("ddp-pack images ROOT OUT_DIR", pack.stdout)
        self.assertNotIn("No flags matched", pack.stdout)

    def test_min_nproc_becomes_the_jobs_min_workers(self):
        # A --log_dir whose parents do not exist yet is made, parents too.
        logs = os.path.join(tempfile.mkdtemp(prefix="ddp-run-min-"), "not", "yet")
        # The copies leave at once: only the job ddp-run wrote matters here.
        run = subprocess.run([DDP_RUN, "--nproc=3", "--min_nproc=2", "--log_dir=" + logs, "--",
                              "true"], capture_output=True, text=True, timeout=60)
        with open(os.path.join(logs, "job.json")) as f:
            job = json.load(f)
        self.assertEqual((job["minWorkers"], job["maxWorkers"]), (2, 3), run.stderr)
        # Copies started together form together, not the first two alone.
        self.assertGreater(job["settleSeconds"], 0)
        bad = subprocess.run([DDP_RUN, "--nproc=2", "--min_nproc=3", "--", "true"],
                             capture_output=True, text=True, timeout=30)
        self.assertEqual(bad.returncode, 2)
        self.assertIn("--min_nproc must be between 1 and --nproc (2)", bad.stderr)


class SignalTest(unittest.TestCase):
    def start(self):
        job = os.path.join(tempfile.mkdtemp(prefix="ddp-run-signal-"), "job.json")
        with open(job, "w") as f:
            json.dump(synthetic_job("long", 2, epochs=10000), f)
        p = subprocess.Popen([DDP_RUN, "--nproc", "2", "--job", job],
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        # Wait for training to start: the generation line.
        for line in p.stdout:
            if "formed with 2 worker(s)" in line:
                break
        kids = children_of(p.pid)
        self.assertEqual(len(kids), 3, "coordinator and two workers")
        self.proc = p
        return p, kids

    def assertAllGone(self, kids):
        self.proc.stdout.close()
        wait_for(lambda: not any(alive(k) for k in kids), 15, "every child to exit")

    def test_sigterm_stops_everything(self):
        p, kids = self.start()
        p.send_signal(signal.SIGTERM)
        self.assertEqual(p.wait(timeout=20), 128 + signal.SIGTERM)
        self.assertAllGone(kids)

    def test_ctrl_c_stops_everything(self):
        p, kids = self.start()
        p.send_signal(signal.SIGINT)
        self.assertEqual(p.wait(timeout=20), 128 + signal.SIGINT)
        self.assertAllGone(kids)

    def test_launcher_killed_children_die_too(self):
        p, kids = self.start()
        p.kill()
        p.wait(timeout=10)
        self.assertAllGone(kids)


if __name__ == "__main__":
    unittest.main(verbosity=2)
