#!/usr/bin/python3
"""The coordinator's live status page, in a real browser: Debian's Chromium,
headless, driven by playwright-core from npm (installed into the build tree
on first use; the browser is never downloaded). A coordinator and two
workers train; the page must load with no console error, show both workers
of the running job, and its loss curves must gain points as the job steps.
A job starved of data (large JPEGs, one loader thread) is said to wait on
it, in words.

Exits 77 (ctest: skipped) with a message when node, npm or chromium is
missing or npm can't install playwright-core."""
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time
import unittest
import urllib.request

sys.path.insert(0, os.path.dirname(__file__))
from cluster import Cluster, synthetic_job  # noqa: E402
from harness import wait_port_file  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
CHECK = os.path.join(HERE, "..", "web", "status_page_check.js")
CHROMIUM = "/usr/bin/chromium"
PLAYWRIGHT = "playwright-core@1.65.1"  # pinned: the same driver on every run
NPM_DIR = os.environ.get("DDP_NPM_DIR", os.path.join(HERE, "../../build/npm"))
SKIP = 77


def skip(why):
    print("SKIPPED: status page browser test: " + why, flush=True)
    sys.exit(SKIP)


def ensure_playwright():
    """playwright-core in NPM_DIR/node_modules, installed there if missing."""
    if os.path.exists(os.path.join(NPM_DIR, "node_modules", "playwright-core", "package.json")):
        return NPM_DIR
    if not shutil.which("npm"):
        skip("npm is not installed (deploy/setup.sh installs it)")
    os.makedirs(NPM_DIR, exist_ok=True)
    try:
        done = subprocess.run(
            ["npm", "install", "--no-save", "--no-audit", "--no-fund", "--prefix", NPM_DIR,
             PLAYWRIGHT], capture_output=True, text=True, timeout=180,
            env=dict(os.environ, PLAYWRIGHT_SKIP_BROWSER_DOWNLOAD="1"))
    except subprocess.TimeoutExpired:
        skip("npm install %s took over 180 s" % PLAYWRIGHT)
    if done.returncode != 0:
        skip("npm install %s failed:\n%s" % (PLAYWRIGHT, done.stderr[-2000:]))
    return NPM_DIR


class StatusPageTest(unittest.TestCase):
    def setUp(self):
        port_file = os.path.join(tempfile.mkdtemp(prefix="ddp-page-"), "http.port")
        # Long enough to be running throughout; the test stops it.
        job = synthetic_job("status-page", 2, epochs=500)
        self.cluster = Cluster(job=job, extra_flags=[
            "--http_listen=127.0.0.1:0", "--http_port_file=" + port_file])
        self.addCleanup(self.cluster.stop)
        self.port = wait_port_file(port_file, 10, "the status page to serve",
                                   self.cluster.coordinator)

    def test_page_shows_workers_and_curves_grow(self):
        c = self.cluster
        port = self.port
        url = "http://127.0.0.1:%d/" % port
        for i in (0, 1):
            c.start_worker(i)
        c.wait_state("JOB_STATE_RUNNING", timeout=30)

        # The JSON endpoint, as a script would read it.
        with urllib.request.urlopen(url + "api/status", timeout=5) as r:
            api = json.load(r)
        self.assertEqual(api["status"]["state"], "JOB_STATE_RUNNING")
        self.assertIn("ranks", api["history"])

        module_dir = NPM_DIR
        shot = os.environ.get("DDP_STATUS_SCREENSHOT", "-")
        started = time.time()
        done = subprocess.run(["node", CHECK, module_dir, url, shot, "40"], capture_output=True,
                              text=True, timeout=90)
        self.assertEqual(done.returncode, 0, done.stderr)
        result = json.loads(done.stdout)
        first, second = result["reads"]
        print("browser: %.1f s; loss points %s -> %s; workers %s" % (
            time.time() - started, first["loss"], second["loss"],
            [w["id"] for w in second["workers"]]), flush=True)

        self.assertEqual(result["errors"], [])
        self.assertEqual(result["foreign"], [], "the page fetched something not its own")
        self.assertEqual(first["state"], "running")
        self.assertEqual(first["banner"], "")
        # Both workers, with their ranks and a training state, in the table.
        rows = {w["id"]: w["cells"] for w in second["workers"]}
        self.assertEqual(sorted(rows), ["w0", "w1"])
        self.assertEqual(sorted(rows[w][0] for w in rows), ["0", "1"])
        for cells in rows.values():
            self.assertIn(cells[4], ("training", "evaluating"))
            self.assertRegex(cells[9], r"^\d+ / [1-9]\d*$")  # buckets reduced / total
        # One curve per rank, and they gained points as the job stepped.
        self.assertEqual(sorted(r["rank"] for r in second["loss"]), ["0", "1"])
        total = lambda read: sum(r["points"] for r in read["loss"])  # noqa: E731
        self.assertGreater(total(first), 0)
        self.assertGreaterEqual(total(second), total(first) + 3, result["reads"])
        self.assertGreater(sum(r["points"] for r in second["rate"]), 0)
        self.assertGreater(second["phases"], 0, "no step-time breakdown drawn")
        self.assertEqual(second["generations"], 1)
        # The pool's jobs: this one, on two workers, with its allocation drawn.
        self.assertEqual([j["id"] for j in second["jobs"]], ["status-page"], second["jobs"])
        job = second["jobs"][0]
        self.assertEqual((job["cells"][1], job["cells"][4], job["cells"][6]), ("running", "2", "2"))
        self.assertEqual(job["allocation"], 1)


class DataWaitPageTest(unittest.TestCase):
    def test_page_says_training_waits_on_data(self):
        root = tempfile.mkdtemp(prefix="ddp-page-data-")
        self.addCleanup(shutil.rmtree, root, True)
        # Noise JPEGs large enough that one loader thread can't keep up
        # with an MLP on 28x28 crops (each decode takes milliseconds).
        from PIL import Image
        rng = random.Random(1)
        for c in range(2):
            os.makedirs(os.path.join(root, "c%d" % c))
            for i in range(40):
                pixels = bytes(rng.getrandbits(8) for _ in range(64 * 64 * 3))
                Image.frombytes("RGB", (64, 64), pixels).resize((640, 640)).save(
                    os.path.join(root, "c%d" % c, "%03d.jpg" % i), quality=95)
        port_file = os.path.join(root, "http.port")
        c = Cluster(extra_flags=["--http_listen=127.0.0.1:0", "--http_port_file=" + port_file])
        self.addCleanup(c.stop)
        port = wait_port_file(port_file, 10, "the status page to serve", c.coordinator)
        for i in (0, 1):
            c.start_worker(i)
        job = synthetic_job("starved", 2, epochs=1000, batchSize=16, dataset={
            "kind": "image-folder", "path": root, "loaderThreads": 1, "prefetchBatches": 1,
            "transforms": [{"kind": "RandomResizedCrop", "size": [28]}]})
        c.client.call("ddp.v1.Coordinator/SubmitJob", '{"spec": %s}' % json.dumps(job))
        c.wait_for(lambda: c.status().get("data_wait_fraction", 0) > 0.1, 60,
                   "the job to wait on data")
        done = subprocess.run(["node", CHECK, NPM_DIR, "http://127.0.0.1:%d/" % port, "-", "40"],
                              capture_output=True, text=True, timeout=90)
        self.assertEqual(done.returncode, 0, done.stderr)
        result = json.loads(done.stdout)
        self.assertEqual(result["errors"], [])
        last = result["reads"][-1]
        self.assertIn("Training waits on data: rank ", last["dataNote"])
        self.assertRegex(last["cards"]["waiting on data"], r"^\d+ % \(rank [01]\)$")


if __name__ == "__main__":
    if not os.path.exists(CHROMIUM):
        skip(CHROMIUM + " is missing (Debian's chromium; deploy/setup.sh installs it)")
    if not shutil.which("node"):
        skip("node is missing (Debian's nodejs; deploy/setup.sh installs it)")
    ensure_playwright()  # before any process starts: a skip leaves nothing behind
    unittest.main()
